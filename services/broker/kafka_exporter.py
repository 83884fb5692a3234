"""The Kafka Exporter's series (danielqsj/kafka_exporter), served by the brokers themselves:
consumer group offsets and lag, partition offsets and replication state, brokers. Grafana's
"Kafka Exporter Overview" dashboard (7589) and alerts written for the exporter work against a
Directlog cluster with no exporter process.

Who exports what. Prometheus scrapes every broker, and a series two brokers export is counted
twice by sum(), so each comes from exactly one:

- group series (``kafka_consumergroup_*``): the group's coordinator, the leader of its
  ``__consumer_offsets`` partition, once it has loaded that partition. A broker that stops
  leading the partition drops the groups at once (GroupCoordinator._unload), and their series
  with them; the new coordinator exports them from its first scrape after the load.
- a partition's series (``kafka_topic_partition_*``): its leader, from its own log (high
  watermark, log start offset) and partition state (replicas, ISR).
- cluster series (``kafka_brokers``, ``kafka_broker_info``, ``kafka_topic_partitions``) and,
  for partitions without a leader, those that need no log (replicas, ISR, preferred leader,
  under-replicated): the designated broker, the live (unfenced) one with the lowest node id.

Each broker decides from its own cluster image; while images differ (a broker just fenced or
back, a leadership moving) a series can come from two brokers or from none for a moment.

Values are the exporter's (kafka_exporter.go, with its default ``offset.show-all``):

- a partition's current offset is its high watermark (ListOffsets latest, read_uncommitted),
  its oldest the log start offset; there is no leader, current or oldest offset without a
  leader.
- a group shows the topics (existing ones) it committed an offset to, each with all its
  partitions: current_offset is the committed offset, -1 without one; lag is the high
  watermark minus the committed offset, -1 without one, and absent for that scrape when the
  high watermark could not be read. lag_sum adds the lags of committed partitions,
  current_offset_sum adds every current_offset, the -1s too, as the exporter does.
- members: every group ListGroups lists (all states but Dead), with its member count.

End offsets of partitions led by other brokers are read when Prometheus scrapes: one
ListOffsets per leader (all its partitions in one request), to all leaders at once, over a
connection kept per leader, within END_OFFSETS_TIMEOUT; a leader that does not answer in time
leaves its partitions' lag out of that scrape. All reading and I/O runs on the event loop;
the scrape thread waits for it at most COLLECT_TIMEOUT, so a scrape neither blocks the loop
nor reads state the loop is changing.

The dashboard's panels select one ``instance``; to see the whole cluster there, give these
series one instance value in the scrape config (no two brokers export the same one, so they
do not collide; the per-broker ``kafka_server_*`` and the like keep theirs)::

    metric_relabel_configs:
      - source_labels: [__name__]
        regex: kafka_(brokers|broker_info|topic_.+|consumergroup_.+)
        target_label: instance
        replacement: directlog
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from directlog.protocol.client import ClientSecurity, KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.topics import NO_LEADER, TopicPartition
from directlog.waits import within
from services.broker.cluster_metadata import BrokerInfo, ClusterImage
from services.broker.groups.coordinator import GroupCoordinator
from services.broker.groups.group import Group, GroupState
from services.broker.replica_manager import ReplicaManager

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

log = logging.getLogger(__name__)

END_OFFSETS_TIMEOUT = 3.0  # seconds for the leaders' ListOffsets answers
COLLECT_TIMEOUT = 6.0  # seconds a scrape waits for the event loop (Prometheus allows 10)
LIST_OFFSETS_VERSION = 7  # Kafka 2.8's; any from 2 (isolation level) answers the same
LATEST = -1  # ListOffsets' timestamp for the high watermark
CONSUMER = -1  # ListOffsets' replica id of a client: high watermark, not log end
NO_OFFSET = -1  # the exporter's current offset and lag of a partition without a commit


# What a scrape reads -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupOffsets:
    group_id: str
    members: int
    committed: dict[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class PartitionState:
    tp: TopicPartition
    leader: int  # NO_LEADER when it has none
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offsets: tuple[int, int] | None  # (log start, high watermark) when led here


@dataclass(frozen=True, slots=True)
class Scrape:
    """Everything one broker exports in one scrape; `exporter_families` turns it into
    series. `brokers` and `topic_sizes` are None on all but the designated broker."""

    groups: list[GroupOffsets]
    partitions: list[PartitionState]
    topics: dict[str, tuple[int, ...]]  # every topic's partition indexes (group series)
    brokers: list[BrokerInfo] | None
    topic_sizes: dict[str, int] | None


def exporter_families(scrape: Scrape, ends: Mapping[TopicPartition, int]) -> list[Metric]:
    """The series of `scrape`, with the lag of each committed partition whose high watermark
    `ends` holds."""
    by_partition = ["topic", "partition"]
    by_group_partition = ["consumergroup", "topic", "partition"]
    by_group_topic = ["consumergroup", "topic"]
    brokers = GaugeMetricFamily("kafka_brokers", "Number of Brokers in the Kafka Cluster.")
    broker_info = GaugeMetricFamily(
        "kafka_broker_info", "Information about the Kafka Broker.", labels=["id", "address"]
    )
    topic_partitions = GaugeMetricFamily(
        "kafka_topic_partitions", "Number of partitions for this Topic", labels=["topic"]
    )
    current = GaugeMetricFamily(
        "kafka_topic_partition_current_offset",
        "Current Offset of a Broker at Topic/Partition",
        labels=by_partition,
    )
    oldest = GaugeMetricFamily(
        "kafka_topic_partition_oldest_offset",
        "Oldest Offset of a Broker at Topic/Partition",
        labels=by_partition,
    )
    leader = GaugeMetricFamily(
        "kafka_topic_partition_leader",
        "Leader Broker ID of this Topic/Partition",
        labels=by_partition,
    )
    replicas = GaugeMetricFamily(
        "kafka_topic_partition_replicas",
        "Number of Replicas for this Topic/Partition",
        labels=by_partition,
    )
    in_sync = GaugeMetricFamily(
        "kafka_topic_partition_in_sync_replica",
        "Number of In-Sync Replicas for this Topic/Partition",
        labels=by_partition,
    )
    preferred = GaugeMetricFamily(
        "kafka_topic_partition_leader_is_preferred",
        "1 if Topic/Partition is using the Preferred Broker",
        labels=by_partition,
    )
    under_replicated = GaugeMetricFamily(
        "kafka_topic_partition_under_replicated_partition",
        "1 if Topic/Partition is under Replicated",
        labels=by_partition,
    )
    group_current = GaugeMetricFamily(
        "kafka_consumergroup_current_offset",
        "Current Offset of a ConsumerGroup at Topic/Partition",
        labels=by_group_partition,
    )
    group_current_sum = GaugeMetricFamily(
        "kafka_consumergroup_current_offset_sum",
        "Current Offset of a ConsumerGroup at Topic for all partitions",
        labels=by_group_topic,
    )
    lag = GaugeMetricFamily(
        "kafka_consumergroup_lag",
        "Current Approximate Lag of a ConsumerGroup at Topic/Partition",
        labels=by_group_partition,
    )
    lag_sum = GaugeMetricFamily(
        "kafka_consumergroup_lag_sum",
        "Current Approximate Lag of a ConsumerGroup at Topic for all partitions",
        labels=by_group_topic,
    )
    members = GaugeMetricFamily(
        "kafka_consumergroup_members",
        "Amount of members in a consumer group",
        labels=["consumergroup"],
    )

    if scrape.brokers is not None:
        brokers.add_metric([], len(scrape.brokers))
        for broker in scrape.brokers:
            broker_info.add_metric([str(broker.broker_id), f"{broker.host}:{broker.port}"], 1)
    if scrape.topic_sizes is not None:
        for name, size in sorted(scrape.topic_sizes.items()):
            topic_partitions.add_metric([name], size)
    for state in scrape.partitions:
        key = [state.tp.topic, str(state.tp.partition)]
        if state.leader != NO_LEADER:
            leader.add_metric(key, state.leader)
        if state.offsets is not None:
            oldest.add_metric(key, state.offsets[0])
            current.add_metric(key, state.offsets[1])
        replicas.add_metric(key, len(state.replicas))
        in_sync.add_metric(key, len(state.isr))
        is_preferred = state.leader != NO_LEADER and state.replicas[:1] == (state.leader,)
        preferred.add_metric(key, 1 if is_preferred else 0)
        under_replicated.add_metric(key, 1 if len(state.isr) < len(state.replicas) else 0)

    for group in scrape.groups:
        members.add_metric([group.group_id], group.members)
        consumed = sorted(
            {
                tp.topic
                for tp, offset in group.committed.items()
                if offset != NO_OFFSET and tp.topic in scrape.topics
            }
        )
        for topic in consumed:
            offset_total = lag_total = 0
            for index in scrape.topics[topic]:
                tp = TopicPartition(topic, index)
                key = [group.group_id, topic, str(index)]
                offset = group.committed.get(tp, NO_OFFSET)
                offset_total += offset
                group_current.add_metric(key, offset)
                if offset == NO_OFFSET:
                    lag.add_metric(key, NO_OFFSET)
                elif tp in ends:
                    lag.add_metric(key, ends[tp] - offset)
                    lag_total += ends[tp] - offset
            group_current_sum.add_metric([group.group_id, topic], offset_total)
            lag_sum.add_metric([group.group_id, topic], lag_total)
    return [
        brokers,
        broker_info,
        topic_partitions,
        current,
        oldest,
        leader,
        replicas,
        in_sync,
        preferred,
        under_replicated,
        group_current,
        group_current_sum,
        lag,
        lag_sum,
        members,
    ]


# End offsets of partitions led elsewhere ------------------------------------------------------


class LeaderEndOffsets:
    """High watermarks of partitions other brokers lead, asked of the leaders: one
    ListOffsets per leader, all leaders at once, over a connection kept per leader (a kept
    one that fails is replaced once within the same call)."""

    def __init__(
        self,
        node_id: int,
        address: Callable[[int], tuple[str, int] | None],
        timeout: float = END_OFFSETS_TIMEOUT,
        security: ClientSecurity | None = None,
    ) -> None:
        self._client_id = f"directlog-exporter-{node_id}"
        self._address = address
        self._security = security
        self._timeout = timeout
        self._connections: dict[int, tuple[tuple[str, int], KafkaConnection]] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._failing: set[int] = set()  # leaders whose last answer failed (logged once)

    async def latest(
        self, by_leader: Mapping[int, list[TopicPartition]]
    ) -> dict[TopicPartition, int]:
        """The high watermark of each partition whose leader answered for it in time."""
        for gone in [b for b in self._connections if self._address(b) is None]:
            await self._drop(gone)  # left the cluster
        leaders = list(by_leader)
        answers = await asyncio.gather(
            *(self._ask_leader(leader, by_leader[leader]) for leader in leaders),
            return_exceptions=True,
        )
        found: dict[TopicPartition, int] = {}
        for leader, answer in zip(leaders, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer  # cancelled: the scrape gave up
                if leader not in self._failing:
                    self._failing.add(leader)
                    log.warning(
                        "lag metrics: broker %d's end offsets unavailable: %s",
                        leader,
                        str(answer) or type(answer).__name__,
                    )
                continue
            if leader in self._failing:
                self._failing.discard(leader)
                log.info("lag metrics: broker %d answers end offsets again", leader)
            found.update(answer)
        return found

    async def _ask_leader(
        self, leader: int, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, int]:
        address = self._address(leader)
        if address is None:
            raise ConnectionError(f"no address for broker {leader}")
        topic_type = ListOffsetsRequest.ListOffsetsTopic
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = ListOffsetsRequest(
            version=LIST_OFFSETS_VERSION,
            replica_id=CONSUMER,
            isolation_level=0,
            topics=[
                topic_type(
                    name=topic,
                    partitions=[
                        topic_type.ListOffsetsPartition(
                            partition_index=index, current_leader_epoch=-1, timestamp=LATEST
                        )
                        for index in indexes
                    ],
                )
                for topic, indexes in by_topic.items()
            ],
        )
        response = await within(self._exchange(leader, address, request), self._timeout)
        found: dict[TopicPartition, int] = {}
        for topic in response.topics:
            for answer in topic.partitions:
                if answer.error_code == ErrorCode.NONE and answer.offset >= 0:
                    found[TopicPartition(topic.name, answer.partition_index)] = answer.offset
        return found

    async def _exchange(self, leader: int, address: tuple[str, int], request: Any) -> Any:
        async with self._locks.setdefault(leader, asyncio.Lock()):
            kept = self._connections.get(leader)
            if kept is not None and kept[0] != address:
                await self._drop(leader)
                kept = None
            if kept is not None:
                try:
                    return await kept[1].request(request, ListOffsetsResponse, self._client_id)
                except OSError:  # closed since its last use (the leader restarted): again
                    await self._drop(leader)
                except BaseException:  # a half-read answer leaves the stream unusable
                    await self._drop(leader)
                    raise
            connection = await KafkaConnection.connect(
                *address, timeout=self._timeout, security=self._security
            )
            self._connections[leader] = (address, connection)
            try:
                return await connection.request(request, ListOffsetsResponse, self._client_id)
            except BaseException:
                await self._drop(leader)
                raise

    async def _drop(self, leader: int) -> None:
        kept = self._connections.pop(leader, None)
        if kept is not None:
            await kept[1].close()

    async def close(self) -> None:
        for leader in list(self._connections):
            await self._drop(leader)


# The collector -----------------------------------------------------------------------------


class KafkaExporterMetrics(Collector):
    """Registered in the broker's registry; `collect` runs on the metrics server's thread and
    has the event loop compute the series (see the module docstring)."""

    def __init__(
        self,
        node_id: int,
        image: ClusterImage,
        replicas: ReplicaManager,
        coordinator: GroupCoordinator,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._node_id = node_id
        self._image = image
        self._replicas = replicas
        self._coordinator = coordinator
        self._loop = loop
        self.leaders = LeaderEndOffsets(
            node_id, self._broker_address, security=replicas.fetch_settings.security
        )

    def collect(self) -> list[Metric]:
        try:
            if asyncio.get_running_loop() is self._loop:
                return []  # called on the loop itself, which must not wait for itself
        except RuntimeError:
            pass  # the metrics server's thread: no loop of its own
        try:
            future = asyncio.run_coroutine_threadsafe(self.families(), self._loop)
        except RuntimeError:  # the loop is closed: the broker is stopping
            return []
        try:
            return future.result(COLLECT_TIMEOUT)
        except TimeoutError:
            future.cancel()
            log.warning("lag metrics: not computed within %.0f s; left out", COLLECT_TIMEOUT)
        except Exception:
            log.exception("lag metrics: not computed")
        return []

    async def families(self) -> list[Metric]:
        """This broker's series now (on the event loop). Committed offsets are read before
        the high watermarks, as the exporter reads them, so a commit of what a consumer read
        (never past the high watermark) cannot make a lag negative."""
        groups = self._coordinator.listed_groups()
        committed = {
            g.group_id: {TopicPartition(t, p): o.offset for (t, p), o in g.offsets.items()}
            for g in groups
        }
        remote: dict[int, list[TopicPartition]] = {}
        for tp in {tp for offsets in committed.values() for tp in offsets}:
            leader = self._remote_leader(tp)
            if leader is not None:
                remote.setdefault(leader, []).append(tp)
        ends = await self.leaders.latest(remote)

        led = {tp: p for tp, p in self._replicas.partitions.items() if p.is_leader}
        for offsets in committed.values():
            for tp in offsets:
                if tp in led:
                    ends[tp] = led[tp].log.high_watermark
        partitions = [
            PartitionState(
                tp,
                self._node_id,
                p.info.replicas,
                p.info.isr,
                (p.log.log_start_offset, p.log.high_watermark),
            )
            for tp, p in led.items()
        ]
        topics = self._image.topics
        live = self._image.live_brokers()
        designated = bool(live) and live[0].broker_id == self._node_id
        if designated:
            partitions += [
                PartitionState(TopicPartition(name, i), NO_LEADER, p.replicas, p.isr, None)
                for name, topic in topics.items()
                for i, p in topic.partitions.items()
                if p.leader == NO_LEADER
            ]
        scrape = Scrape(
            groups=[
                GroupOffsets(g.group_id, len(g.members), committed[g.group_id])
                for g in groups
                if self._still_coordinated(g)  # not deleted or moved away while asking
            ],
            partitions=sorted(partitions, key=lambda s: s.tp),
            topics={name: tuple(sorted(t.partitions)) for name, t in topics.items()},
            brokers=live if designated else None,
            topic_sizes={n: len(t.partitions) for n, t in topics.items()} if designated else None,
        )
        return exporter_families(scrape, ends)

    def _remote_leader(self, tp: TopicPartition) -> int | None:
        """The broker to ask for `tp`'s high watermark: None when the partition is gone or
        led here or by no one."""
        info = self._image.partition(tp)
        if info is None or info.leader in (NO_LEADER, self._node_id):
            return None
        return info.leader

    def _still_coordinated(self, group: Group) -> bool:
        return (
            self._coordinator.groups.get(group.group_id) is group
            and group.state is not GroupState.DEAD
            and self._coordinator.partition_of(group.group_id) in self._coordinator.owned
        )

    def _broker_address(self, broker_id: int) -> tuple[str, int] | None:
        broker = self._image.brokers.get(broker_id)
        return (broker.host, broker.port) if broker is not None and broker.port > 0 else None

    async def close(self) -> None:
        await self.leaders.close()
