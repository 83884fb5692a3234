"""How a transaction's markers reach its partitions: this broker writes those it leads
straight into their logs; the others get a WriteTxnMarkers request to their leader, who
writes them the same way (`write_local`). Either way a marker counts once the partition's
ISR has it (acks=all), as in Kafka.

Writing our own partitions directly spares a connection to ourselves; the request is what
Kafka's brokers send each other, so a marker for a partition on another broker costs one
round trip per leader and call.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Callable
from typing import Any

from directlog.protocol.client import ClientSecurity, KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.topics import TopicPartition
from services.broker.cluster_metadata import ClusterImage
from services.broker.error_codes import error_code_for
from services.broker.groups.offsets_topic import OFFSETS_TOPIC
from services.broker.replica_manager import ReplicaManager

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.producer import WriteTxnMarkersRequest, WriteTxnMarkersResponse

log = logging.getLogger(__name__)

WRITE_TXN_MARKERS_VERSION = 1  # Kafka 3.7 sends v1
CONNECT_TIMEOUT = 5.0
Partitions = set[tuple[str, int]]


class MarkerWriter:
    def __init__(
        self,
        node_id: int,
        replicas: ReplicaManager,
        image: ClusterImage,
        security: ClientSecurity | None,
        timeout_ms: int,
        offsets_marked: Callable[[int, int, bool], None],
    ) -> None:
        """`offsets_marked(partition, producer id, commit)`: a marker is in the ISR of a
        `__consumer_offsets` partition (the group coordinator applies the transaction's
        offset commits)."""
        self.node_id = node_id
        self.replicas = replicas
        self.image = image
        self.security = security
        self.timeout_ms = timeout_ms
        self.offsets_marked = offsets_marked

    async def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: Partitions,
    ) -> dict[tuple[str, int], ErrorCode]:
        """One attempt at a marker in each partition: the code of each (NONE: in its ISR)."""
        results: dict[tuple[str, int], ErrorCode] = {}
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for tp in partitions:
            info = self.image.partition(TopicPartition(*tp))
            if info is None:
                results[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif info.leader < 0:
                results[tp] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                by_leader.setdefault(info.leader, []).append(tp)
        local = by_leader.pop(self.node_id, [])
        marker = (producer_id, producer_epoch, commit, coordinator_epoch)
        local_codes, remote_codes = await asyncio.gather(
            asyncio.gather(*(self.write_local(tp, *marker) for tp in local)),
            asyncio.gather(
                *(self._send(leader, tps, *marker) for leader, tps in by_leader.items())
            ),
        )
        results.update(zip(local, local_codes, strict=True))
        for answered in remote_codes:
            results.update(answered)
        return results

    async def write_local(
        self,
        tp: tuple[str, int],
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> ErrorCode:
        """Append the marker as the partition's leader and wait for its ISR."""
        try:
            partition = self.replicas.leader_partition(*tp)
            partition.check_appendable(-1)
            appended = partition.log.append_marker(
                producer_id, producer_epoch, commit, coordinator_epoch, partition.leader_epoch
            )
            partition.appended()
            await partition.wait_replicated(appended.last_offset, self.timeout_ms / 1000)
        except Exception as error:
            code = error_code_for(error)
            if code is ErrorCode.UNKNOWN_SERVER_ERROR:
                log.exception("marker for producer id %d in %s-%d failed", producer_id, *tp)
            return code
        if tp[0] == OFFSETS_TOPIC:
            self.offsets_marked(tp[1], producer_id, commit)
        return ErrorCode.NONE

    async def _send(
        self,
        leader: int,
        partitions: list[tuple[str, int]],
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> dict[tuple[str, int], ErrorCode]:
        """WriteTxnMarkers to another broker; every partition gets the failure's code when
        the broker cannot be asked."""
        broker = self.image.brokers.get(leader)
        if broker is None or broker.port <= 0:
            return dict.fromkeys(partitions, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        topics: dict[str, list[int]] = {}
        for topic, index in partitions:
            topics.setdefault(topic, []).append(index)
        request_type: Any = WriteTxnMarkersRequest
        marker_type = request_type.WritableTxnMarker
        topic_type = marker_type.WritableTxnMarkerTopic
        request = request_type(
            version=WRITE_TXN_MARKERS_VERSION,
            markers=[
                marker_type(
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    transaction_result=commit,
                    topics=[topic_type(name=t, partition_indexes=p) for t, p in topics.items()],
                    coordinator_epoch=coordinator_epoch,
                )
            ],
        )
        try:
            connection = await KafkaConnection.connect(
                broker.host, broker.port, CONNECT_TIMEOUT, self.security
            )
            try:
                response = await asyncio.wait_for(
                    connection.request(request, WriteTxnMarkersResponse, "txn-coordinator"),
                    self.timeout_ms / 1000 + CONNECT_TIMEOUT,
                )
            finally:
                await connection.close()
        except (OSError, TimeoutError, ConnectionError) as error:
            log.info("WriteTxnMarkers to broker %d failed: %s", leader, error)
            return dict.fromkeys(partitions, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        results = dict.fromkeys(partitions, ErrorCode.UNKNOWN_SERVER_ERROR)
        for answered in response.markers:
            for topic in answered.topics:
                for p in topic.partitions:
                    if (topic.name, p.partition_index) in results:
                        results[(topic.name, p.partition_index)] = ErrorCode(p.error_code)
        return results
