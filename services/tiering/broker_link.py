"""The tiering service's side of proto/tiering.proto: calls on its broker's BrokerTiering
service (localhost in a pod), each bounded by a deadline, plain or with mutual TLS (a new
channel once the TLS files are renewed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from directlog.protocol.errors import ErrorCode
from directlog.rpc import controller_pb2 as pb
from directlog.rpc import tiering_pb2 as tpb
from directlog.rpc import tiering_pb2_grpc
from directlog.security.grpc_tls import Channels
from directlog.security.tls import TlsFiles

CALL_TIMEOUT = 15.0  # a forwarded call waits for the controller too
Stub = tiering_pb2_grpc.BrokerTieringStub


class BrokerUnavailableError(Exception):
    """The broker (or, for a forwarded call, the controller) did not answer."""


class RefusedError(Exception):
    """The broker or the controller refused a change, with a Kafka error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{_name(code)}: {message}")
        self.code = code


class BrokerLink:
    def __init__(
        self, address: str, tls: TlsFiles | None = None, server_name: str | None = None
    ) -> None:
        """``tls``, ``server_name``: the settings broker_tls and broker_tls_server_name."""
        self.address = address
        self._tls = Channels(tls, peer="broker", setting="broker_tls", server_name=server_name)
        self._channel = self._tls.open(address)
        self._stub = tiering_pb2_grpc.BrokerTieringStub(self._channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self._channel.close()

    async def _renew_channel(self) -> None:
        """After the TLS files changed, calls go on a new channel, so its handshake presents
        the new certificate (a call still on the old one is cut: the manager retries)."""
        if self._tls.outdated(self._channel):
            old, self._channel = self._channel, self._tls.open(self.address)
            self._stub = tiering_pb2_grpc.BrokerTieringStub(self._channel)  # type: ignore[no-untyped-call]
            await old.close()

    async def partitions(self) -> tpb.ListPartitionsReply:
        reply: tpb.ListPartitionsReply = await self._call(
            lambda s: s.ListPartitions, tpb.ListPartitionsRequest()
        )
        return reply

    async def remote_segments(
        self, wanted: list[pb.PartitionVersion]
    ) -> list[pb.RemoteLogPartition]:
        reply = await self._call(
            lambda s: s.ListRemoteLogSegments, pb.ListRemoteLogSegmentsRequest(partitions=wanted)
        )
        return list(reply.partitions)

    async def update_segment(
        self, topic_id: bytes, partition: int, leader_epoch: int, segment: pb.RemoteLogSegment
    ) -> pb.UpdateRemoteLogSegmentReply:
        """Move a remote log record to `segment.state`; RefusedError if not allowed."""
        reply: pb.UpdateRemoteLogSegmentReply = await self._call(
            lambda s: s.UpdateRemoteLogSegment,
            pb.UpdateRemoteLogSegmentRequest(
                topic_id=topic_id,
                partition=partition,
                leader_epoch=leader_epoch,
                segment=segment,
            ),
        )
        if reply.error_code != ErrorCode.NONE:
            raise RefusedError(reply.error_code, reply.error_message)
        return reply

    async def deletions(self) -> list[pb.RemoteLogDeletion]:
        reply = await self._call(
            lambda s: s.ListRemoteLogDeletions, pb.ListRemoteLogDeletionsRequest()
        )
        return list(reply.topics)

    async def finish_deletion(self, topic_id: bytes) -> None:
        reply = await self._call(
            lambda s: s.FinishRemoteLogDeletion,
            pb.FinishRemoteLogDeletionRequest(topic_id=topic_id),
        )
        if reply.error_code not in (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_ID):
            raise RefusedError(reply.error_code, reply.error_message)

    async def remote_log_changed(self, topic: str, partition: int, log_start: int = -1) -> None:
        reply = await self._call(
            lambda s: s.RemoteLogChanged,
            tpb.RemoteLogChangedRequest(
                topic=topic, partition=partition, log_start_offset=log_start
            ),
        )
        if reply.error_code != ErrorCode.NONE:
            raise RefusedError(reply.error_code, reply.error_message)

    async def _call(self, method: Callable[[Stub], Any], request: object) -> Any:
        await self._renew_channel()
        try:
            return await method(self._stub)(request, timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as error:
            raise BrokerUnavailableError(
                f"broker {self.address}: {error.code().name} {error.details()}"
            ) from error


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
