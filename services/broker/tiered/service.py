"""The BrokerTiering gRPC service (proto/tiering.proto): what a broker tells its tiering
service, and the controller calls it makes on the tiering service's behalf.

The tiering service polls ListPartitions for the partitions of tiered topics this broker
hosts, reads their closed segments from the log volume both share, and records each copy
through UpdateRemoteLogSegment, which the broker passes to the controller with its own id
and broker epoch once it has checked that it still leads the partition in the leader epoch
the copy was made under. RemoteLogChanged makes the broker read the partition's remote
indexes again (and, from the leader's tiering service, move the log start up after remote
segments below it were deleted).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.rpc import controller_pb2_grpc as rpc
from directlog.rpc import tiering_pb2 as tpb
from directlog.rpc import tiering_pb2_grpc
from directlog.security import grpc_tls
from directlog.security.tls import TlsFiles
from directlog.topics import TopicPartition
from services.broker.controller_link import ControllerLink
from services.broker.partition import Partition
from services.broker.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
Reply = TypeVar("Reply")


class TieringService(tiering_pb2_grpc.BrokerTieringServicer):
    def __init__(self, replicas: ReplicaManager, link: ControllerLink) -> None:
        self._replicas = replicas
        self._link = link

    async def ListPartitions(
        self, request: tpb.ListPartitionsRequest, context: Context
    ) -> tpb.ListPartitionsReply:
        reply = tpb.ListPartitionsReply(broker_id=self._replicas.broker_id)
        for tp, partition in list(self._replicas.partitions.items()):
            config = partition.config
            if config.remote_storage_enable or config.remote_log_delete_on_disable:
                reply.partitions.append(_hosted(tp, partition))
        return reply

    async def ListRemoteLogSegments(
        self, request: pb.ListRemoteLogSegmentsRequest, context: Context
    ) -> pb.ListRemoteLogSegmentsReply:
        return await self._forward(lambda s: s.ListRemoteLogSegments, request, context)

    async def UpdateRemoteLogSegment(
        self, request: pb.UpdateRemoteLogSegmentRequest, context: Context
    ) -> pb.UpdateRemoteLogSegmentReply:
        image_topic = self._replicas.image.topic_by_id(_uuid(request.topic_id))
        partition = (
            self._replicas.partitions.get(TopicPartition(image_topic.name, request.partition))
            if image_topic is not None
            else None
        )
        try:
            if partition is None:
                raise KafkaError(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER, "this broker hosts no such partition"
                )
            partition.check_leader(request.leader_epoch)
        except KafkaError as error:
            return pb.UpdateRemoteLogSegmentReply(error_code=error.code, error_message=str(error))
        request.broker_id = self._link.broker_id
        request.broker_epoch = self._link.broker_epoch
        try:
            reply: pb.UpdateRemoteLogSegmentReply = await self._link.call(
                lambda s: s.UpdateRemoteLogSegment, request
            )
        except KafkaError as error:
            return pb.UpdateRemoteLogSegmentReply(error_code=error.code, error_message=str(error))
        return reply

    async def ListRemoteLogDeletions(
        self, request: pb.ListRemoteLogDeletionsRequest, context: Context
    ) -> pb.ListRemoteLogDeletionsReply:
        return await self._forward(lambda s: s.ListRemoteLogDeletions, request, context)

    async def FinishRemoteLogDeletion(
        self, request: pb.FinishRemoteLogDeletionRequest, context: Context
    ) -> pb.FinishRemoteLogDeletionReply:
        return await self._forward(lambda s: s.FinishRemoteLogDeletion, request, context)

    async def RemoteLogChanged(
        self, request: tpb.RemoteLogChangedRequest, context: Context
    ) -> tpb.RemoteLogChangedReply:
        tp = TopicPartition(request.topic, request.partition)
        partition = self._replicas.partitions.get(tp)
        if partition is None:
            return tpb.RemoteLogChangedReply(
                error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                error_message=f"this broker hosts no {tp}",
            )
        partition_log = partition.log
        if not await asyncio.to_thread(partition_log.refresh_remote):
            return tpb.RemoteLogChangedReply(
                error_code=ErrorCode.KAFKA_STORAGE_ERROR,
                error_message=f"the remote indexes of {tp} cannot be read",
            )
        if request.log_start_offset >= 0 and partition.is_leader:
            target = min(request.log_start_offset, partition_log.high_watermark)
            if partition_log.advance_log_start(target):
                log.info("%s: log start moved to %d (remote segments deleted)", tp, target)
        return tpb.RemoteLogChangedReply()

    async def _forward(
        self,
        method: Callable[[rpc.ControllerStub], Callable[..., Awaitable[Reply]]],
        request: Any,
        context: Context,
    ) -> Reply:
        """A call the active controller answers; UNAVAILABLE while none does."""
        try:
            return await self._link.call(method, request)
        except KafkaError as error:
            await _abort(context, error)


async def _abort(context: Context, error: KafkaError) -> NoReturn:
    await context.abort(grpc.StatusCode.UNAVAILABLE, f"{error.code.name}: {error}")
    raise AssertionError("abort returns only by raising")


def _hosted(tp: TopicPartition, partition: Partition) -> tpb.HostedPartition:
    partition_log = partition.log
    segments = partition_log.segments
    return tpb.HostedPartition(
        topic=tp.topic,
        topic_id=partition.topic_id.bytes,
        partition=tp.partition,
        directory=str(partition_log.directory.resolve()),
        leader=partition.is_leader,
        leader_epoch=partition.leader_epoch,
        configs=partition.config.to_properties(),
        log_start_offset=partition_log.log_start_offset,
        local_log_start_offset=partition_log.local_log_start_offset,
        # The last stable offset, as Kafka's copies stop there (KIP-405 with KIP-98): an open
        # transaction's records are not copied until it is decided.
        high_watermark=partition_log.last_stable_offset,
        log_end_offset=partition_log.log_end_offset,
        segments=[
            tpb.LocalSegment(
                base_offset=segment.base_offset,
                next_offset=segment.next_offset,
                size_bytes=segment.size,
                max_timestamp=segment.max_timestamp,
                # A sealed segment still in the head directory is not in `directory` yet:
                # the tiering service copies it once it is written back.
                active=segment is segments[-1] or partition_log.layout.in_memory(segment),
            )
            for segment in segments
        ],
    )


def _uuid(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=raw) if len(raw) == 16 else uuid.UUID(int=0)


async def serve(
    service: TieringService, host: str, port: int, tls: TlsFiles | None = None
) -> tuple[grpc.aio.Server, int]:
    """Start the gRPC server for the tiering service, with mutual TLS when ``tls`` (the
    broker's tiering_tls) is set; returns it and the port it bound."""
    server = grpc.aio.server()
    tiering_pb2_grpc.add_BrokerTieringServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    bound = grpc_tls.add_port(server, f"{host}:{port}", tls)
    if bound == 0:
        raise OSError(f"cannot bind the tiering service's gRPC port {host}:{port}")
    await server.start()
    return server, bound
