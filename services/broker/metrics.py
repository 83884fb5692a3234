"""Prometheus metrics of a broker, served at http://<host>:<metrics port>/metrics.

Counters and histograms are updated on the request path; per-partition offsets and sizes
are read from the logs when Prometheus scrapes, so appends pay nothing for them.

Beside the directlog_broker_* series, the broker exports the series Kafka's JMX MBeans become
under Strimzi's JMX exporter rules (examples/metrics/kafka-metrics.yaml), with what they
count in Kafka, so the Strimzi Kafka dashboard and its alerts work unchanged
(docs/metrics.md lists them). Where both names count the same thing, one number feeds both:
the per-topic produce and fetch counts are plain integers bumped on the event loop and read
by one collector, which exposes the directlog_broker_* and kafka_server_brokertopicmetrics_*
families from them.

A topic's series live as long as the topic does here (`BrokerMetrics.forget`): they are
exported only while the broker's cluster image has the topic, and dropped when it is deleted,
when a topic of its name is created (it starts from zero, as in Kafka), and when this broker
no longer hosts a replica of it (Kafka's ReplicaManager.maybeRemoveTopicMetrics); a replica's
own series go with the replica. The all-topics series keep counting what dropped topics had
counted, so they never go down.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from directlog.metrics import LATENCY_BUCKETS, Readiness, serve
from directlog.protocol.errors import ErrorCode
from directlog.topics import TopicPartition
from services.broker.storage.log_manager import LogManager

if TYPE_CHECKING:
    from directlog.protocol.produce import PartitionResult
    from services.broker.cluster_metadata import ClusterImage
    from services.broker.fetch_response import PartitionData
    from services.broker.groups.coordinator import GroupCoordinator
    from services.broker.replica_manager import ReplicaManager

# Client quota throttles run from a few ms to the quota's whole window and beyond.
_THROTTLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# The one listener and the one event loop, named as Kafka's socket-server-metrics name them.
LISTENER = "PLAINTEXT"
NETWORK_PROCESSOR = "0"

# Items of a request Kafka answers before its ReplicaManager sees them (a topic or partition
# the metadata does not know, bad acks): counted in no BrokerTopicMetrics series, so a client
# asking for made-up topics cannot make a series per name.
_NOT_COUNTED = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.INVALID_REQUIRED_ACKS,
    }
)
# Errors Kafka's ReplicaManager expects (appendToLocalLog, readFromLog): not counted as failed
# produce or fetch requests, which are meant to show unexpected failures. Anything else is
# (NOT_ENOUGH_REPLICAS, INVALID_RECORD, OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_SERVER_ERROR...).
_EXPECTED_PRODUCE_ERRORS = frozenset(
    {
        ErrorCode.NONE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.RECORD_LIST_TOO_LARGE,
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.INVALID_TOPIC_EXCEPTION,
    }
)
_EXPECTED_FETCH_ERRORS = frozenset(
    {
        ErrorCode.NONE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.OFFSET_OUT_OF_RANGE,
        ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE,
    }
)


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # Series of topics and replicas (see forget): labelled ones, the image saying which
        # topics exist (None until watch_replicas: all of them), and what dropped topics had
        # counted, which the all-topics series keep. The lock keeps a scrape from reading a
        # dropped topic's counts twice or not at all while forget moves them.
        self._series: list[TopicSeries] = []
        self._image: ClusterImage | None = None
        self._retired = TopicStats()
        self._lifetime = threading.Lock()
        self.requests = Counter(
            "directlog_broker_requests",
            "Requests handled, by API and version",
            ["api", "version"],
            registry=r,
        )
        self.latency = Histogram(
            "directlog_broker_request_latency_seconds",
            "Time from a whole request frame to its response sent, by API",
            ["api"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "directlog_broker_request_errors",
            "Error codes answered, by API and Kafka error name",
            ["api", "code"],
            registry=r,
        )
        # RDMA produce (services/broker/rdma/produce.py).
        self.rdma_writes = self._by_topic(
            Counter(
                "directlog_broker_rdma_produce_writes",
                "RDMA produce writes committed (each one or more record batches)",
                ["topic"],
                registry=None,
            )
        )
        # Read from RdmaProduce's grants when scraped (set_function).
        self.rdma_grants = Gauge(
            "directlog_broker_rdma_produce_grants",
            "Head segments granted to RDMA producers and not yet sealed or revoked, by mode",
            ["mode"],
            registry=r,
        )
        self.rdma_writers = Gauge(
            "directlog_broker_rdma_produce_writers",
            "RDMA producers (writers) connected to this broker's grants",
            registry=r,
        )
        self.rdma_revocations = Counter(
            "directlog_broker_rdma_produce_revocations",
            "RDMA produce grants revoked for a fault (a hole, a bad write, a dead writer)",
            registry=r,
        )
        # RDMA consume (services/broker/rdma/consume.py); the gauges read its state when
        # scraped (set_function).
        self.rdma_consumers = Gauge(
            "directlog_broker_rdma_consumers", "RDMA consumers known to this broker", registry=r
        )
        self.rdma_consume_registrations = Gauge(
            "directlog_broker_rdma_consume_registrations",
            "Segments registered for RDMA consumers' one-sided reads",
            registry=r,
        )
        self.rdma_slot_writes = self._by_topic(
            Counter(
                "directlog_broker_rdma_consume_slot_writes",
                "Metadata slot rewrites for RDMA consumers (high watermark moves, seals, "
                "revocations)",
                ["topic"],
                registry=None,
            )
        )
        self.rdma_consume_revocations = Counter(
            "directlog_broker_rdma_consume_revocations",
            "Segment registrations revoked under RDMA consumers (leadership moves, retention, "
            "truncation, stopping)",
            registry=r,
        )
        self.isr_shrinks = Counter(
            "directlog_broker_isr_shrinks", "ISR shrinks the controller accepted", registry=r
        )
        self.isr_expands = Counter(
            "directlog_broker_isr_expands", "ISR expansions the controller accepted", registry=r
        )
        self.leader_elections = Counter(
            "directlog_broker_leader_elections",
            "Partitions this broker became leader of (a new leader epoch)",
            registry=r,
        )
        self.closed_for_bad_input = Counter(
            "directlog_broker_connections_closed_for_bad_input",
            "Connections closed because their bytes could not be read as Kafka requests",
            registry=r,
        )
        self.closed_for_authentication = Counter(
            "directlog_broker_connections_closed_for_authentication",
            "Connections closed by SASL: a failed login, a request before authenticating, "
            "an expired session",
            registry=r,
        )

        # RDMA push replication (services/broker/rdma/replica_leader.py) and its fallback.
        self.replication_pushed_bytes = self._by_topic(
            Counter(
                "directlog_broker_replication_pushed_bytes",
                "Record bytes a leader pushed to followers with RDMA writes",
                ["topic"],
                registry=None,
            )
        )
        self.replication_pushes = self._by_topic(
            Counter(
                "directlog_broker_replication_pushes",
                "RDMA writes of record batches a leader pushed to followers",
                ["topic"],
                registry=None,
            )
        )
        self.replication_channels = self._by_topic(
            Gauge(
                "directlog_broker_replication_push_channels",
                "Push channels a leader has open to followers, by topic",
                ["topic"],
                registry=None,
            )
        )
        self.replica_pulled_bytes = self._by_topic(
            Counter(
                "directlog_broker_replica_pulled_bytes",
                "Record bytes a follower appended from its pull fetches, by partition",
                ["topic", "partition"],
                registry=None,
            )
        )

        # Tiered storage (services/broker/tiered/): reads from the remote store.
        self.remote_fetch_bytes = self._by_topic(
            Counter(
                "directlog_broker_remote_fetch_bytes",
                "Record bytes read from the remote store for fetches, by topic",
                ["topic"],
                registry=None,
            )
        )
        self.remote_fetch_requests = self._by_topic(
            Counter(
                "directlog_broker_remote_fetch_requests",
                "Reads from the remote store for fetches and offset lookups, by topic",
                ["topic"],
                registry=None,
            )
        )
        self.remote_fetch_errors = self._by_topic(
            Counter(
                "directlog_broker_remote_fetch_errors",
                "Reads from the remote store that failed (unreachable, corrupt), by topic",
                ["topic"],
                registry=None,
            )
        )
        self.remote_read_latency = Histogram(
            "directlog_broker_remote_read_latency_seconds",
            "Time to read and check one range of remote log data",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

        # Fetches of old consumers (services/broker/down_conversion.py), meaning what Kafka's
        # FetchMessageConversionsPerSec, MessageConversionsTimeMs and TemporaryMemoryBytes do.
        self.message_conversions = self._by_topic(
            Counter(
                "directlog_broker_fetch_message_conversions",
                "Records converted to an older message format for old consumers, by topic",
                ["topic"],
                registry=None,
            )
        )
        self.conversion_time = Histogram(
            "directlog_broker_message_conversion_seconds",
            "Time spent converting one partition's records of an answer to an older format",
            ["request"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.temporary_memory = Gauge(
            "directlog_broker_temporary_memory_bytes",
            "Bytes conversions in flight hold (source chunks and their converted forms)",
            ["request"],
            registry=r,
        )

        # Client quotas (services/broker/quotas.py): Kafka's per-client throttle-time
        # sensors of its Produce, Fetch and Request quota managers, summed over clients.
        self.quota_throttle_time = Histogram(
            "directlog_broker_quota_throttle_time_seconds",
            "Throttle times given to clients over a client quota, by quota kind "
            "(produce, fetch, request)",
            ["kind"],
            buckets=_THROTTLE_BUCKETS,
            registry=r,
        )

        # Labelled children looked up once: labels() costs more than the increment itself.
        self._request_children: dict[tuple[str, int], tuple[Any, Any]] = {}
        # Produce and fetch counts by topic, bumped on the event loop only.
        self._topics: dict[str, TopicStats] = {}
        self._connections_opened = 0
        self._connections_closed = 0
        self._loop_load: LoopLoad | None = None
        r.register(_TopicCollector(self))
        for series in self._series:
            r.register(series)
        r.register(_ServerCollector(self))
        r.register(_DiskCollector())

    def _by_topic(self, metric: Counter | Gauge) -> TopicSeries:
        series = TopicSeries(metric, self.exported)
        self._series.append(series)
        return series

    def request(self, api: str, version: int, seconds: float, count: int = 1) -> None:
        """`count` requests of one API version answered, each `seconds` after it began."""
        children = self._request_children.get((api, version))
        if children is None:
            children = (self.requests.labels(api, str(version)), self.latency.labels(api))
            self._request_children[(api, version)] = children
        children[0].inc(count)
        for _ in range(count):
            children[1].observe(seconds)

    def watch_logs(self, logs: LogManager) -> None:
        self.registry.register(_LogCollector(lambda: logs))

    def watch_replicas(self, replicas: ReplicaManager) -> None:
        self._image = replicas.image
        self.registry.register(_ReplicaCollector(replicas, self))

    def watch_groups(self, coordinator: GroupCoordinator) -> None:
        self.registry.register(_GroupCollector(coordinator))

    def watch_event_loop(self) -> None:
        """Measure the calling thread (the event loop's) from now on: the idle ratios Kafka
        reports for its network and request handler threads (LoopLoad). Call on the loop."""
        cpu = thread_cpu_clock(threading.get_ident())
        if cpu is not None and self._loop_load is None:
            self._loop_load = LoopLoad(cpu)

    def exported(self, topic: str) -> bool:
        """Whether a topic's series are exported: while the cluster image has the topic. Work
        under way when it was deleted (a remote read, a conversion) may still count for it;
        that is not shown, and goes at the next forget."""
        image = self._image
        return image is None or topic in image.topics

    def forget(
        self, topics: Collection[str] = (), replicas: Collection[TopicPartition] = ()
    ) -> None:
        """Drop the series of `topics` and of the replicas `replicas`, and of any topic the
        cluster image no longer has. For a topic deleted, created (whatever an older topic of
        its name left: the new one starts from zero) or no longer hosted here; for a replica
        this broker stopped hosting. The all-topics series keep what the dropped ones counted.
        Children of labelled series that callers keep stay usable (TopicSeries). Call on the
        event loop."""
        gone = {(tp.topic, str(tp.partition)) for tp in replicas}

        def doomed(labels: tuple[str, ...]) -> bool:
            topic = labels[0]
            return topic in topics or labels[:2] in gone or not self.exported(topic)

        with self._lifetime:
            for topic in list(self._topics):
                if doomed((topic,)):
                    stats = self._topics.pop(topic, None)
                    if stats is not None:
                        self._retired.add(stats)
            for series in self._series:
                series.drop(doomed)

    def topic_stats(self, topic: str) -> TopicStats:
        stats = self._topics.get(topic)
        if stats is None:
            stats = self._topics[topic] = TopicStats()
        return stats

    def produced(self, topic: str, records: int, size: int) -> None:
        """Records a producer had appended to a partition led here (not counting retried
        batches already in the log): Kafka's MessagesInPerSec and BytesInPerSec."""
        stats = self.topic_stats(topic)
        stats.messages_in += records
        stats.bytes_in += size

    def produce_answered(self, topic: str, partitions: Sequence[PartitionResult]) -> None:
        """One produce request's partitions of `topic`, appended or refused (before waiting
        for replication): Kafka's TotalProduceRequestsPerSec and FailedProduceRequestsPerSec,
        which count partitions of requests, not requests."""
        stats: TopicStats | None = None
        for partition in partitions:
            code = partition.error_code
            if code in _NOT_COUNTED:
                continue
            if stats is None:
                stats = self.topic_stats(topic)
            stats.produce_requests += 1
            if code not in _EXPECTED_PRODUCE_ERRORS:
                stats.failed_produce_requests += 1

    def fetch_answered(
        self, topic: str, partitions: Sequence[PartitionData], follower: bool
    ) -> None:
        """One fetch request's partitions of `topic` as answered. Record bytes sent to a
        follower are replication (Kafka's ReplicationBytesOutPerSec), not BytesOutPerSec;
        TotalFetchRequestsPerSec counts consumers' and followers' partitions alike."""
        stats: TopicStats | None = None
        for partition in partitions:
            code = partition.error_code
            if code in _NOT_COUNTED:
                continue
            if stats is None:
                stats = self.topic_stats(topic)
            stats.fetch_requests += 1
            if code not in _EXPECTED_FETCH_ERRORS:
                stats.failed_fetch_requests += 1
            size = partition.records_size
            if size:
                if follower:
                    stats.replication_bytes_out += size
                    stats.replication_records_out += partition.offsets
                else:
                    stats.bytes_out += size
                    stats.records_out += partition.offsets

    def connection_opened(self) -> None:
        self._connections_opened += 1

    def connection_closed(self) -> None:
        self._connections_closed += 1

    def converted(self, topic: str, records: int, seconds: float) -> None:
        """One partition's answer to an old consumer converted: `records` in `seconds`."""
        self.message_conversions.labels(topic).inc(records)
        self.conversion_time.labels("fetch").observe(seconds)

    def pulled(self, tp: TopicPartition, size: int) -> None:
        self.replica_pulled_bytes.labels(tp.topic, str(tp.partition)).inc(size)

    def quota_throttled(self, kind: str, throttle_ms: int) -> None:
        """A client over its ``kind`` quota throttled for ``throttle_ms``."""
        self.quota_throttle_time.labels(kind).observe(throttle_ms / 1000)

    def request_error(self, api: str, code: ErrorCode) -> None:
        self.errors.labels(api, code.name).inc()

    def serve(self, host: str, port: int, ready: Readiness | None = None) -> int:
        return serve(self.registry, host, port, ready)


class TopicStats:
    """What a broker counts per topic on the request path. Plain integers: bumped on the event
    loop only, read by the scrape thread (a read sees one value or the next)."""

    __slots__ = (
        "bytes_in",
        "bytes_out",
        "failed_fetch_requests",
        "failed_produce_requests",
        "fetch_requests",
        "messages_in",
        "produce_requests",
        "records_out",
        "replication_bytes_out",
        "replication_records_out",
    )

    def __init__(self) -> None:
        self.messages_in = 0  # records appended from producers
        self.bytes_in = 0  # their batch bytes
        self.produce_requests = 0  # partitions of produce requests
        self.failed_produce_requests = 0  # of those, refused for an unexpected error
        self.fetch_requests = 0  # partitions of fetch requests, consumers' and followers'
        self.failed_fetch_requests = 0  # of those, answered with an unexpected error
        self.bytes_out = 0  # record bytes sent to consumers
        self.records_out = 0  # offsets those bytes span
        self.replication_bytes_out = 0  # record bytes sent to followers
        self.replication_records_out = 0  # offsets those bytes span

    def add(self, other: TopicStats) -> None:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def copy(self) -> TopicStats:
        copied = TopicStats()
        copied.add(self)
        return copied


class TopicSeries(Collector):
    """A labelled Counter or Gauge whose first label is the topic (a second may be the
    partition), exported only for topics `exported` says exist, and whose children can be
    dropped with their topic (`drop`).

    `labels()` hands out a TopicChild, which callers may keep (RDMA consume keeps one per
    topic): it looks its metric's child up again after every drop, so what it counts after its
    topic was dropped lands in a new child that is exported, from zero, rather than in the
    removed one."""

    def __init__(self, metric: Counter | Gauge, exported: Callable[[str], bool]) -> None:
        self.metric = metric
        self.generation = 0  # drops so far
        self.retired = 0.0  # what the dropped children of a counter had counted
        self._exported = exported
        self._children: dict[tuple[str, ...], TopicChild] = {}

    def labels(self, *values: str) -> TopicChild:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = TopicChild(self, values)
        return child

    def by_topic(self) -> dict[str, float]:
        """Every child's value summed by topic, exported or not."""
        totals: dict[str, float] = {}
        for labels, value in self._values():
            totals[labels[0]] = totals.get(labels[0], 0.0) + value
        return totals

    def drop(self, doomed: Callable[[tuple[str, ...]], bool]) -> None:
        """Remove the children whose label values `doomed` names; a counter's `retired` keeps
        their sum. The children are removed before `generation` moves: a TopicChild that sees
        the new generation makes a child that stays."""
        removed = [(labels, value) for labels, value in self._values() if doomed(labels)]
        for labels, _ in removed:
            self.metric.remove(*labels)
        for values in list(self._children):
            if doomed(values):
                self._children.pop(values, None)
        self.retired += sum(value for _, value in removed)
        self.generation += 1

    def _values(self) -> list[tuple[tuple[str, ...], float]]:
        """(label values, value) of every child: a counter's total, a gauge's value."""
        found = []
        for family in self.metric.collect():
            for sample in family.samples:
                if not sample.name.endswith("_created"):
                    found.append((tuple(sample.labels.values()), sample.value))
        return found

    def describe(self) -> Iterator[Metric]:
        yield from self.metric.describe()

    def collect(self) -> Iterator[Metric]:
        for family in self.metric.collect():
            family.samples = [s for s in family.samples if self._exported(s.labels["topic"])]
            yield family


class TopicChild:
    """One child of a TopicSeries, as the request path increments it."""

    __slots__ = ("_child", "_generation", "_series", "_values")

    def __init__(self, series: TopicSeries, values: tuple[str, ...]) -> None:
        self._series = series
        self._values = values
        self._generation = -1
        self._child: Any = None

    def _current(self) -> Any:
        series = self._series
        generation = series.generation
        if self._generation != generation:
            self._child = series.metric.labels(*self._values)
            self._generation = generation
        return self._child

    def inc(self, amount: float = 1) -> None:
        self._current().inc(amount)

    def dec(self, amount: float = 1) -> None:
        """A gauge's."""
        self._current().dec(amount)


# Idle time of the event loop --------------------------------------------------------------------


def thread_cpu_clock(thread_id: int) -> Callable[[], float] | None:
    """A clock of the CPU seconds thread `thread_id` has used, readable from any thread; None
    where the platform has none (then the idle ratios are not exported)."""
    try:
        clock = time.pthread_getcpuclockid(thread_id)
        time.clock_gettime(clock)
    except (AttributeError, OSError):
        return None
    return lambda: time.clock_gettime(clock)


@dataclass(frozen=True, slots=True)
class LoopReading:
    wall: float  # monotonic seconds
    cpu: float  # CPU seconds the loop thread had used


class LoopLoad:
    """How idle the broker's one event loop thread is, from the CPU time it uses: idle is the
    part of wall time the thread was not running. The loop thread does what Kafka's network
    threads and request handler threads do (and runs the replica fetchers and the group
    coordinator too), so both of Kafka's idle ratios come from it:

    - `recent_idle`: over the last WINDOW seconds at least (or since the reading before, when
      Prometheus scrapes less often), as NetworkProcessorAvgIdlePercent is over Kafka's last
      samples of io-wait-ratio;
    - `mean_idle`: since the loop started, as Strimzi takes RequestHandlerAvgIdlePercent's
      MeanRate.

    Time the thread is blocked in a system call (a sendfile from a segment not in the page
    cache, a page fault), waits for the GIL, or waits for a CPU counts as idle here. Reading
    costs the request path nothing: it happens when Prometheus scrapes.
    """

    WINDOW = 30.0  # Kafka's metrics.sample.window.ms
    STEP = 5.0  # readings kept at least this far apart: at most WINDOW / STEP + 2 of them

    def __init__(
        self, cpu: Callable[[], float], wall: Callable[[], float] = time.monotonic
    ) -> None:
        self._cpu = cpu
        self._wall = wall
        self.started = LoopReading(wall(), cpu())
        self._readings: deque[LoopReading] = deque([self.started])
        self._lock = threading.Lock()  # scrapes may run at the same time

    def read(self) -> tuple[LoopReading, float, float]:
        """(the reading now, mean_idle, recent_idle)."""
        with self._lock:
            now = LoopReading(self._wall(), self._cpu())
            readings = self._readings
            if now.wall - readings[-1].wall >= self.STEP:
                readings.append(now)
            while len(readings) > 1 and now.wall - readings[1].wall >= self.WINDOW:
                readings.popleft()
            return now, _idle(self.started, now), _idle(readings[0], now)


def _idle(before: LoopReading, after: LoopReading) -> float:
    elapsed = after.wall - before.wall
    if elapsed <= 0:
        return 1.0
    return min(max(1.0 - (after.cpu - before.cpu) / elapsed, 0.0), 1.0)


# Collectors ---------------------------------------------------------------------------------------


def _total(counter: Counter) -> float:
    """An unlabelled counter's value."""
    return sum(
        sample.value
        for family in counter.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def _topic_counter(
    name: str, documentation: str, by_topic: dict[str, float], all_topics: float
) -> CounterMetricFamily:
    """A BrokerTopicMetrics meter: a series per topic, and Kafka's all-topics meter as the
    series without a topic label: their sum, with what dropped topics had counted. Dashboards
    that add series up select topic!="" (Strimzi's do)."""
    family = CounterMetricFamily(name, documentation, labels=["topic"])
    family.samples.append(Sample(f"{name}_total", {}, all_topics))
    for topic, value in sorted(by_topic.items()):
        family.add_metric([topic], value)
    return family


class _TopicCollector(Collector):
    """directlog_broker_{bytes,records}_{in,out} and Kafka's BrokerTopicMetrics from the same
    per-topic counts (and the remote read counters of services/broker/tiered/)."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        labelled = (
            metrics.replication_pushed_bytes,
            metrics.replica_pulled_bytes,
            metrics.remote_fetch_requests,
            metrics.remote_fetch_errors,
            metrics.remote_fetch_bytes,
        )
        with metrics._lifetime:  # counts and what dropped topics counted, read together
            topics = list(metrics._topics.items())
            retired = metrics._retired.copy()
            pushed, pulled, read, failed, read_bytes = (
                (series.by_topic(), series.retired) for series in labelled
            )
        exported = metrics.exported
        shown = [(topic, stats) for topic, stats in topics if exported(topic)]

        def per_topic(value: Callable[[TopicStats], int]) -> dict[str, float]:
            return {topic: float(value(stats)) for topic, stats in shown}

        def all_topics(value: Callable[[TopicStats], int]) -> float:
            return float(sum(value(stats) for _, stats in topics) + value(retired))

        def kafka(name: str, documentation: str, value: Callable[[TopicStats], int]) -> Metric:
            return _topic_counter(name, documentation, per_topic(value), all_topics(value))

        def directlog(name: str, documentation: str, by_topic: dict[str, float]) -> Metric:
            family = CounterMetricFamily(name, documentation, labels=["topic"])
            for topic, value in sorted(by_topic.items()):
                family.add_metric([topic], value)
            return family

        yield directlog(
            "directlog_broker_bytes_in", "Record bytes appended", per_topic(lambda s: s.bytes_in)
        )
        yield directlog(
            "directlog_broker_records_in", "Records appended", per_topic(lambda s: s.messages_in)
        )
        yield directlog(
            "directlog_broker_bytes_out",
            "Record bytes sent to fetchers",
            per_topic(lambda s: s.bytes_out + s.replication_bytes_out),
        )
        yield directlog(
            "directlog_broker_records_out",
            "Records sent to fetchers",
            per_topic(lambda s: s.records_out + s.replication_records_out),
        )

        prefix = "kafka_server_brokertopicmetrics_"
        yield kafka(
            prefix + "messagesin",
            "MessagesInPerSec: records producers appended to partitions led here",
            lambda s: s.messages_in,
        )
        yield kafka(
            prefix + "bytesin",
            "BytesInPerSec: record batch bytes producers appended to partitions led here "
            "(replication is ReplicationBytesInPerSec)",
            lambda s: s.bytes_in,
        )
        yield kafka(
            prefix + "bytesout",
            "BytesOutPerSec: record bytes sent to consumers (to followers: "
            "ReplicationBytesOutPerSec)",
            lambda s: s.bytes_out,
        )
        yield kafka(
            prefix + "totalproducerequests",
            "TotalProduceRequestsPerSec: partitions of produce requests for partitions led here",
            lambda s: s.produce_requests,
        )
        yield kafka(
            prefix + "failedproducerequests",
            "FailedProduceRequestsPerSec: of those, refused for an unexpected error (not "
            "NOT_LEADER_OR_FOLLOWER, MESSAGE_TOO_LARGE, CORRUPT_MESSAGE and the like)",
            lambda s: s.failed_produce_requests,
        )
        yield kafka(
            prefix + "totalfetchrequests",
            "TotalFetchRequestsPerSec: partitions of fetch requests (consumers' and followers')",
            lambda s: s.fetch_requests,
        )
        yield kafka(
            prefix + "failedfetchrequests",
            "FailedFetchRequestsPerSec: of those, answered with an unexpected error (not "
            "NOT_LEADER_OR_FOLLOWER, OFFSET_OUT_OF_RANGE, a leader epoch error and the like)",
            lambda s: s.failed_fetch_requests,
        )
        replication_out = CounterMetricFamily(
            prefix + "replicationbytesout",
            "ReplicationBytesOutPerSec: record bytes sent to followers (fetches and RDMA "
            "pushes); Kafka has it for all topics only",
        )
        replication_out.add_metric([], all_topics(lambda s: s.replication_bytes_out) + _sum(pushed))
        yield replication_out
        replication_in = CounterMetricFamily(
            prefix + "replicationbytesin",
            "ReplicationBytesInPerSec: record bytes this broker's followers appended from "
            "their fetches; Kafka has it for all topics only",
        )
        replication_in.add_metric([], _sum(pulled))
        yield replication_in

        # KIP-405 reads (services/broker/tiered/remote_reads.py).
        remote_topics = {  # 0, not absent, for these
            t for t in read[0].keys() | failed[0].keys() | read_bytes[0].keys() if exported(t)
        }

        def remote_counter(
            name: str, documentation: str, *counted: tuple[dict[str, float], float]
        ) -> Metric:
            by_topic = {t: sum(c[0].get(t, 0.0) for c in counted) for t in remote_topics}
            return _topic_counter(name, documentation, by_topic, sum(map(_sum, counted)))

        yield remote_counter(
            prefix + "remotefetchbytes",
            "RemoteFetchBytesPerSec: record bytes read from the remote store for fetches",
            read_bytes,
        )
        yield remote_counter(
            prefix + "remotefetchrequests",
            "RemoteFetchRequestsPerSec: reads from the remote store for fetches, done or failed "
            "(failed offset lookups included)",
            read,
            failed,
        )
        yield remote_counter(
            prefix + "remotefetcherrors",
            "RemoteFetchErrorsPerSec: reads from the remote store that failed",
            failed,
        )


def _sum(counted: tuple[dict[str, float], float]) -> float:
    """A TopicSeries' total over every topic, the dropped ones' included."""
    by_topic, retired = counted
    return sum(by_topic.values()) + retired


class _ServerCollector(Collector):
    """Connections and how idle the event loop is, under Directlog's and Kafka's names."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        opened, closed = metrics._connections_opened, metrics._connections_closed
        yield GaugeMetricFamily(
            "directlog_broker_open_connections", "Client connections open", value=opened - closed
        )
        labels = ["listener", "networkProcessor"]
        key = [LISTENER, NETWORK_PROCESSOR]
        prefix = "kafka_server_socket_server_metrics_"
        count = GaugeMetricFamily(
            prefix + "connection_count", "connection-count: connections open", labels=labels
        )
        count.add_metric(key, opened - closed)
        created = CounterMetricFamily(
            prefix + "connection_creation",
            "connection-creation-total: connections accepted",
            labels=labels,
        )
        created.add_metric(key, opened)
        ended = CounterMetricFamily(
            prefix + "connection_close", "connection-close-total: connections closed", labels=labels
        )
        ended.add_metric(key, closed)
        yield from (count, created, ended)

        load = metrics._loop_load
        if load is None:
            return
        now, mean_idle, recent_idle = load.read()
        cpu = CounterMetricFamily(
            "directlog_broker_event_loop_cpu_seconds",
            "CPU seconds the event loop thread used since it started; 1 - rate() of it is the "
            "loop's idle fraction over any window",
        )
        cpu.add_metric([], now.cpu - load.started.cpu)
        yield cpu
        yield GaugeMetricFamily(
            "kafka_network_socketserver_networkprocessoravgidle_percent",
            "NetworkProcessorAvgIdlePercent: fraction (0-1) of the last 30 s or more the event "
            "loop thread was idle (not on a CPU)",
            value=recent_idle,
        )
        processor = GaugeMetricFamily(
            "kafka_network_processor_idle_percent",
            "IdlePercent of the one network processor, the event loop: as "
            "NetworkProcessorAvgIdlePercent",
            labels=["networkProcessor"],
        )
        processor.add_metric([NETWORK_PROCESSOR], recent_idle)
        yield processor
        yield GaugeMetricFamily(
            "kafka_server_kafkarequesthandlerpool_requesthandleravgidle_percent",
            "RequestHandlerAvgIdlePercent (MeanRate): fraction (0-1) of the time since start "
            "the event loop thread, which also handles the requests, was idle",
            value=mean_idle,
        )


class _DiskCollector(Collector):
    """Kafka's linux-disk-read-bytes and linux-disk-write-bytes (LinuxIoMetricsCollector): the
    bytes this process made the kernel read from and write to storage, from /proc/self/io
    (page cache hits and writes not yet written back are not in them). Absent where that
    file cannot be read, as in Kafka."""

    PATH = "/proc/self/io"

    def collect(self) -> Iterator[Metric]:
        try:
            with open(self.PATH, encoding="ascii") as file:
                fields = dict(line.split(": ", 1) for line in file.read().splitlines())
            read, written = int(fields["read_bytes"]), int(fields["write_bytes"])
        except (OSError, ValueError, KeyError):
            return
        prefix = "kafka_server_kafkaserver_linux_disk_"
        yield GaugeMetricFamily(
            prefix + "read_bytes", "linux-disk-read-bytes: bytes read from storage", value=read
        )
        yield GaugeMetricFamily(
            prefix + "write_bytes",
            "linux-disk-write-bytes: bytes written to storage",
            value=written,
        )


class _LogCollector(Collector):
    def __init__(self, logs: Callable[[], LogManager]) -> None:
        self._logs = logs

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["topic", "partition"]
        end = GaugeMetricFamily(
            "directlog_broker_log_end_offset", "Next offset to be appended", labels=labels
        )
        start = GaugeMetricFamily(
            "directlog_broker_log_start_offset", "First readable offset", labels=labels
        )
        hw = GaugeMetricFamily(
            "directlog_broker_high_watermark",
            "Offset below which records are readable",
            labels=labels,
        )
        size = GaugeMetricFamily(
            "directlog_broker_log_size_bytes", "Bytes in the partition's segments", labels=labels
        )
        local_start = GaugeMetricFamily(
            "directlog_broker_local_log_start_offset",
            "First offset in a local segment (below it, a tiered log's records are remote)",
            labels=labels,
        )
        # Kafka's kafka.log:type=Log gauges, for every replica hosted here.
        kafka_size = GaugeMetricFamily(
            "kafka_log_log_size",
            "Size: bytes of the partition's local segments (a tiered log's remote part not "
            "included)",
            labels=labels,
        )
        kafka_start = GaugeMetricFamily(
            "kafka_log_log_logstartoffset", "LogStartOffset: first readable offset", labels=labels
        )
        kafka_end = GaugeMetricFamily(
            "kafka_log_log_logendoffset", "LogEndOffset: next offset to be appended", labels=labels
        )
        kafka_segments = GaugeMetricFamily(
            "kafka_log_log_numlogsegments", "NumLogSegments: local segments", labels=labels
        )
        for tp, log in list(self._logs().logs.items()):
            key = [tp.topic, str(tp.partition)]
            # Offsets from this copy of the segments, not from the log's own list: deleting
            # the log (its topic deleted) empties that list while this thread reads it.
            segments = log.segments
            if not segments:
                continue  # deleted since the dict was copied
            size_bytes = sum(segment.size for segment in segments)
            log_end, log_start = segments[-1].next_offset, log.log_start_offset
            end.add_metric(key, log_end)
            start.add_metric(key, log_start)
            hw.add_metric(key, log.high_watermark)
            size.add_metric(key, size_bytes)
            local_start.add_metric(key, max(log_start, segments[0].base_offset))
            kafka_size.add_metric(key, size_bytes)
            kafka_start.add_metric(key, log_start)
            kafka_end.add_metric(key, log_end)
            kafka_segments.add_metric(key, len(segments))
        yield from (end, start, hw, size, local_start)
        yield from (kafka_size, kafka_start, kafka_end, kafka_segments)


class _ReplicaCollector(Collector):
    def __init__(self, replicas: ReplicaManager, metrics: BrokerMetrics) -> None:
        self._replicas = replicas
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        under = GaugeMetricFamily(
            "directlog_broker_under_replicated_partitions",
            "Partitions this broker leads whose ISR lacks some of their replicas",
        )
        leading = GaugeMetricFamily(
            "directlog_broker_leader_partitions", "Partitions this broker leads"
        )
        isr = GaugeMetricFamily(
            "directlog_broker_isr_size", "In-sync replicas of partitions led here", labels=labels
        )
        lag = GaugeMetricFamily(
            "directlog_broker_replica_lag_offsets",
            "Offsets a followed partition's log trails its leader's high watermark",
            labels=labels,
        )
        # Kafka's kafka.cluster:type=Partition gauges: one series per replica hosted here,
        # 0 unless this broker leads the partition (as in Kafka, so sums count each once).
        p_under = GaugeMetricFamily(
            "kafka_cluster_partition_underreplicated",
            "UnderReplicated: 1 if led here and the ISR lacks some replica",
            labels=labels,
        )
        p_isr = GaugeMetricFamily(
            "kafka_cluster_partition_insyncreplicascount",
            "InSyncReplicasCount: ISR size if led here, else 0",
            labels=labels,
        )
        p_replicas = GaugeMetricFamily(
            "kafka_cluster_partition_replicascount",
            "ReplicasCount: replication factor if led here, else 0",
            labels=labels,
        )
        p_under_min = GaugeMetricFamily(
            "kafka_cluster_partition_underminisr",
            "UnderMinIsr: 1 if led here and the ISR is smaller than min.insync.replicas (at "
            "most the replication factor)",
            labels=labels,
        )
        p_at_min = GaugeMetricFamily(
            "kafka_cluster_partition_atminisr",
            "AtMinIsr: 1 if led here and the ISR is exactly min.insync.replicas (at most the "
            "replication factor)",
            labels=labels,
        )
        hosted = list(self._replicas.partitions.values())
        led = under_count = under_min_count = at_min_count = 0
        for p in hosted:
            key = [p.tp.topic, str(p.tp.partition)]
            info = p.info
            if p.is_leader:
                replicas, in_sync = len(info.replicas), len(info.isr)
                min_isr = min(p.config.min_insync_replicas, replicas)
                flags = (in_sync < replicas, in_sync < min_isr, in_sync == min_isr)
                led += 1
                under_count += flags[0]
                under_min_count += flags[1]
                at_min_count += flags[2]
                isr.add_metric(key, in_sync)
            else:
                replicas = in_sync = 0
                flags = (False, False, False)
            p_under.add_metric(key, flags[0])
            p_isr.add_metric(key, in_sync)
            p_replicas.add_metric(key, replicas)
            p_under_min.add_metric(key, flags[1])
            p_at_min.add_metric(key, flags[2])
        under.add_metric([], under_count)
        leading.add_metric([], led)
        for fetcher in list(self._replicas.fetchers.values()):
            for tp, state in list(fetcher.partitions.items()):
                lag.add_metric([tp.topic, str(tp.partition)], state.lag)
        yield from (under, leading, isr, lag)
        yield from (p_under, p_isr, p_replicas, p_under_min, p_at_min)

        # Kafka's kafka.server:type=ReplicaManager gauges and meters.
        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"kafka_server_replicamanager_{name}", documentation, value)

        yield gauge("leadercount", "LeaderCount: partitions led here", led)
        yield gauge("partitioncount", "PartitionCount: replicas hosted here", len(hosted))
        yield gauge(
            "underreplicatedpartitions",
            "UnderReplicatedPartitions: partitions led here whose ISR lacks some replica",
            under_count,
        )
        yield gauge(
            "underminisrpartitioncount",
            "UnderMinIsrPartitionCount: partitions led here with an ISR below min.insync.replicas",
            under_min_count,
        )
        yield gauge(
            "atminisrpartitioncount",
            "AtMinIsrPartitionCount: partitions led here with an ISR of min.insync.replicas",
            at_min_count,
        )
        for name, counter, documentation in (
            ("isrshrinks", self._metrics.isr_shrinks, "IsrShrinksPerSec: ISR shrinks accepted"),
            ("isrexpands", self._metrics.isr_expands, "IsrExpandsPerSec: ISR expansions accepted"),
        ):
            family = CounterMetricFamily(f"kafka_server_replicamanager_{name}", documentation)
            family.add_metric([], _total(counter))
            yield family


class _GroupCollector(Collector):
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    def collect(self) -> Iterator[GaugeMetricFamily]:
        groups = GaugeMetricFamily(
            "directlog_broker_groups",
            "Consumer groups this broker coordinates, by state",
            labels=["state"],
        )
        members = GaugeMetricFamily(
            "directlog_broker_group_members", "Members of the groups this broker coordinates"
        )
        by_state: dict[str, int] = {}
        count = 0
        for group in self._coordinator.listed_groups():
            by_state[group.state.value] = by_state.get(group.state.value, 0) + 1
            count += len(group.members)
        for state, n in sorted(by_state.items()):
            groups.add_metric([state], n)
        members.add_metric([], count)
        yield from (groups, members)
