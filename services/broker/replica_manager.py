"""The partitions this broker hosts, kept in line with the cluster image: logs created for
new replicas and deleted for ones moved away or deleted, each replica made leader or
follower as the controller says, follower fetchers per leader, and ISR changes sent to the
controller.

On the first (full) image after start, logs of partitions the image does not give this
broker — or that belong to an older topic of the same name — are deleted: the controller's
image is the truth about what exists.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.topics import NO_LEADER, TopicPartition
from services.broker.cluster_metadata import (
    ClusterImage,
    ImageChange,
    PartitionInfo,
    TopicInfo,
)
from services.broker.controller_link import ControllerLink, ControllerUnavailableError
from services.broker.metrics import BrokerMetrics
from services.broker.partition import Partition
from services.broker.replica_fetcher import FetchSettings, ReplicaFetcher
from services.broker.replication_quota import ReplicationQuotas
from services.broker.storage.log_manager import LogManager
from services.broker.tiered.remote_state import RemoteLogState

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        logs: LogManager,
        image: ClusterImage,
        fetch_settings: FetchSettings,
        notify: Callable[[], None],
        metrics: BrokerMetrics,
    ) -> None:
        self.broker_id = broker_id
        self.logs = logs
        self.image = image
        self.fetch_settings = fetch_settings
        self.partitions: dict[TopicPartition, Partition] = {}
        self.fetchers: dict[int, ReplicaFetcher] = {}
        # The replication throttles (leader side in the fetch handler, follower side in the
        # fetchers), at the rates the image gives this broker.
        self.quotas = ReplicationQuotas(broker_id, lambda: image.configs_in_effect(broker_id))
        self.link: ControllerLink | None = None
        self._notify = notify
        self.metrics = metrics
        self._isr_tasks: set[asyncio.Task[None]] = set()
        # Tiered storage: where followers find the state to restart from (None: off).
        self.remote_state: RemoteLogState | None = None
        # Told whenever a hosted partition becomes leader or follower or goes away (the group
        # coordinator follows the __consumer_offsets partitions this way).
        self.leadership_listeners: list[Callable[[Partition], None]] = []

    # Looking partitions up -------------------------------------------------------------------

    def leader_partition(
        self, topic: str, partition: int, current_leader_epoch: int = -1
    ) -> Partition:
        """The partition, if this broker leads it; raises with the code clients expect."""
        found = self._hosted(topic, partition)
        found.check_leader(current_leader_epoch)
        return found

    def readable_partition(
        self, topic: str, partition: int, current_leader_epoch: int = -1
    ) -> Partition:
        """The partition, if this broker holds a replica a consumer may read (KIP-392)."""
        found = self._hosted(topic, partition)
        found.check_readable(current_leader_epoch)
        return found

    def _hosted(self, topic: str, partition: int) -> Partition:
        found = self.partitions.get(TopicPartition(topic, partition))
        if found is None:
            info = self.image.partition(TopicPartition(topic, partition))
            if info is None:
                raise KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"no partition {partition} of topic {topic!r}",
                )
            raise KafkaError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"broker {self.broker_id} holds no replica of {topic}-{partition}",
            )
        return found

    # Following the image ---------------------------------------------------------------------

    def apply(self, change: ImageChange) -> None:
        for topic in change.deleted:
            for index in list(topic.partitions):
                self._drop(TopicPartition(topic.name, index), "its topic was deleted")
        for topic in change.reconfigured:
            config = self.image.config_for(topic.name)
            for index in topic.partitions:
                hosted = self.partitions.get(TopicPartition(topic.name, index))
                if hosted is not None:
                    hosted.log.configure(config)
        moved: list[TopicPartition] = []
        for topic, info in change.partitions:
            tp = TopicPartition(topic.name, info.partition)
            if self.broker_id in info.replicas:
                self._host(topic, tp, info)
            elif tp in self.partitions:
                self._drop(tp, "it was moved to other brokers")
                moved.append(tp)
        if change.full:
            self._delete_strays()
        self._forget_metrics(change, moved)

    def _forget_metrics(self, change: ImageChange, moved: list[TopicPartition]) -> None:
        """Series go with what they describe: a topic's when it is deleted or created (what an
        older topic of its name counted is not the new one's), or when this broker hosts no
        replica of it any more, as Kafka's ReplicaManager.maybeRemoveTopicMetrics does; a
        replica's when it moves away."""
        gone = {topic.name for topic in (*change.deleted, *change.created)}
        if moved:
            hosted = {tp.topic for tp in self.partitions}
            gone.update(tp.topic for tp in moved if tp.topic not in hosted)
        if gone or moved:
            self.metrics.forget(gone, moved)

    def _host(self, topic: TopicInfo, tp: TopicPartition, info: PartitionInfo) -> None:
        partition = self.partitions.get(tp)
        if partition is None or partition.topic_id != topic.topic_id:
            if partition is not None:
                self._drop(tp, "its topic was created again")
            partition_log = self.logs.get(tp)
            if partition_log is not None and partition_log.topic_id not in (None, topic.topic_id):
                log.info("%s: deleting the log of an older topic of that name", tp)
                self.logs.delete(tp)
                partition_log = None
            if partition_log is None:
                partition_log = self.logs.create(
                    tp, self.image.config_for(topic.name), topic_id=topic.topic_id
                )
            else:
                partition_log.configure(self.image.config_for(topic.name))
                partition_log.set_topic_id(topic.topic_id)
            partition = Partition(
                tp, topic.topic_id, partition_log, self.broker_id, self._notify, self._propose_isr
            )
            self.partitions[tp] = partition
        if info.leader == self.broker_id:
            self._stop_following(tp)
            if not partition.is_leader or partition.leader_epoch != info.leader_epoch:
                self.metrics.leader_elections.inc()
            partition.become_leader(info, now_ms())
        else:
            partition.become_follower(info)
            self._stop_following(tp)
            if info.leader != NO_LEADER:
                self._fetcher(info.leader).follow(partition)
        self._leadership_changed(partition)

    def _leadership_changed(self, partition: Partition) -> None:
        for listener in self.leadership_listeners:
            listener(partition)

    def _drop(self, tp: TopicPartition, why: str) -> None:
        partition = self.partitions.pop(tp, None)
        self._stop_following(tp)
        if partition is not None:
            partition.stop()
            self._leadership_changed(partition)
        if self.logs.get(tp) is not None:
            log.info("%s: deleting the local replica: %s", tp, why)
            self.logs.delete(tp)

    def _delete_strays(self) -> None:
        for tp in list(self.logs.logs):
            if tp not in self.partitions:
                self._drop(tp, "the cluster image gives this broker no such replica")

    def _stop_following(self, tp: TopicPartition) -> None:
        for fetcher in self.fetchers.values():
            fetcher.forget(tp)

    def _fetcher(self, leader: int) -> ReplicaFetcher:
        fetcher = self.fetchers.get(leader)
        if fetcher is None:
            fetcher = self.fetchers[leader] = ReplicaFetcher(
                leader, self._address, self.fetch_settings
            )
            fetcher.pulled = self.metrics.pulled
            fetcher.remote_state = self.remote_state
            fetcher.quotas = self.quotas
        return fetcher

    def _address(self, broker_id: int) -> tuple[str, int] | None:
        broker = self.image.brokers.get(broker_id)
        return (broker.host, broker.port) if broker is not None and broker.port > 0 else None

    # ISR -----------------------------------------------------------------------------------

    def shrink_isrs(self, lag_ms: int) -> None:
        now = now_ms()
        for partition in self.partitions.values():
            partition.maybe_shrink_isr(now, lag_ms)

    def _propose_isr(self, partition: Partition, isr: tuple[int, ...]) -> None:
        task = asyncio.get_running_loop().create_task(self._alter_partition(partition, isr))
        self._isr_tasks.add(task)
        task.add_done_callback(self._isr_tasks.discard)

    async def _alter_partition(self, partition: Partition, isr: tuple[int, ...]) -> None:
        settled: PartitionInfo | None = None
        try:
            if self.link is None:
                raise ControllerUnavailableError("no controller link yet")
            reply = await self.link.alter_partition(
                [
                    pb.PartitionChange(
                        topic_id=partition.topic_id.bytes,
                        partition=partition.tp.partition,
                        leader_epoch=partition.info.leader_epoch,
                        partition_epoch=partition.info.partition_epoch,
                        new_isr=isr,
                    )
                ]
            )
            result = reply.results[0] if reply.results else None
            code = reply.error_code or (result.error_code if result else ErrorCode.NONE)
            if result is not None and result.HasField("state"):
                settled = PartitionInfo.from_proto(result.state)
            if code != ErrorCode.NONE:
                log.info(
                    "%s: ISR change to %s refused: %s",
                    partition.tp,
                    list(isr),
                    ErrorCode(code).name,
                )
            else:
                log.info("%s: ISR now %s", partition.tp, list(isr))
                grew = len(isr) > len(partition.info.isr)
                (self.metrics.isr_expands if grew else self.metrics.isr_shrinks).inc()
        except KafkaError as error:
            log.warning("%s: ISR change to %s not sent: %s", partition.tp, list(isr), error)
            await asyncio.sleep(self.fetch_settings.backoff_ms / 1000)
        finally:
            partition.isr_change_settled(settled)

    # Lifecycle -------------------------------------------------------------------------------

    async def close(self) -> None:
        for task in list(self._isr_tasks):
            task.cancel()
        for fetcher in self.fetchers.values():
            await fetcher.close()
        for partition in self.partitions.values():
            partition.stop()

    def under_replicated(self) -> int:
        return sum(
            1
            for p in self.partitions.values()
            if p.is_leader and len(p.info.isr) < len(p.info.replicas)
        )
