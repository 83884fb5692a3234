"""The broker's side of proto/controller.proto: find the active controller, register,
heartbeat, follow the metadata stream, and pass ISR changes and topic admin on.

Any controller address may be a standby: it answers FAILED_PRECONDITION and names the
active one, which the link tries next. A lost stream or controller is retried with a short
back-off; while no controller answers, the broker keeps serving with the image it has
(leaders stay leaders until the controller says otherwise, as in Kafka).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.rpc import controller_pb2_grpc as rpc
from directlog.security.grpc_tls import Channels
from directlog.security.tls import TlsFiles

log = logging.getLogger(__name__)

ACTIVE_CONTROLLER = "active-controller"
RETRY_SECONDS = 0.2
CALL_TIMEOUT = 10.0
HEARTBEAT_TIMEOUT_FLOOR = 1.0
MAX_IMAGE_BYTES = 256 * 1024 * 1024  # a full image of a large cluster is one message
Reply = TypeVar("Reply")


class ControllerUnavailableError(KafkaError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.REQUEST_TIMED_OUT, message)


class ControllerLink:
    def __init__(
        self,
        addresses: list[str],
        broker_id: int,
        listeners: list[pb.Listener],
        rack: str | None,
        heartbeat_seconds: float,
        on_update: Callable[[pb.MetadataUpdate], None],
        tls: TlsFiles | None = None,
    ) -> None:
        """``tls``: the broker's controller_tls, for mutual TLS to the controllers."""
        self.addresses = list(addresses)
        self.broker_id = broker_id
        self.incarnation = uuid.uuid4().hex
        self.listeners = listeners
        self.rack = rack or ""
        self.heartbeat_seconds = heartbeat_seconds
        self.on_update = on_update
        self.broker_epoch = -1
        self.registered = asyncio.Event()
        self.first_image = asyncio.Event()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._tls = Channels(tls, peer="controller", setting="controller_tls")
        self._active = self.addresses[0]
        self._tasks: list[asyncio.Task[None]] = []
        self._stream: grpc.aio.UnaryStreamCall[Any, pb.MetadataUpdate] | None = None
        self._stopping = False

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._stay_registered()), loop.create_task(self._watch())]

    def stopping(self) -> None:
        """The broker stops: from now on it never registers again."""
        self._stopping = True

    async def close(self, *, fence: bool = False) -> None:
        """Stop heartbeats and the metadata watch. ``fence``: the broker stops after its
        controlled shutdown, and a last heartbeat says so, so the controller fences it now
        rather than when its session runs out (best effort: the session still ends it)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if fence and self.broker_epoch >= 0:
            request = pb.HeartbeatRequest(
                broker_id=self.broker_id, broker_epoch=self.broker_epoch, stopping=True
            )
            try:
                await self.call(lambda s: s.Heartbeat, request, timeout=HEARTBEAT_TIMEOUT_FLOOR)
            except ControllerUnavailableError as error:
                log.info("no controller heard that this broker stops: %s", error)
        for channel in self._channels.values():
            await channel.close()

    # Calls -------------------------------------------------------------------------------

    def _stub(self, address: str) -> rpc.ControllerStub:
        channel = self._channels.get(address)
        if channel is None or self._tls.outdated(channel):  # renewed certificates: reconnect
            self._forget(address)
            channel = self._channels[address] = self._tls.open(
                address, options=[("grpc.max_receive_message_length", MAX_IMAGE_BYTES)]
            )
        return rpc.ControllerStub(channel)  # type: ignore[no-untyped-call]  # generated code

    async def call(
        self,
        method: Callable[[rpc.ControllerStub], Callable[..., Awaitable[Reply]]],
        request: Any,
        timeout: float = CALL_TIMEOUT,
    ) -> Reply:
        """One unary call on the active controller, found by following standbys' hints and
        trying each address in turn; raises ControllerUnavailableError when none answers."""
        tried: set[str] = set()
        address = self._active
        while True:
            tried.add(address)
            try:
                reply = await method(self._stub(address))(request, timeout=timeout)
                self._active = address
                return reply
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    # The connection may be dead silent (a partition drops packets, no
                    # reset): the next call gets a new one rather than queueing on it.
                    self._forget(address)
                hint = _active_hint(error)
                if hint and hint not in tried:
                    address = hint
                    continue
                remaining = [a for a in self.addresses if a not in tried]
                if not remaining:
                    raise ControllerUnavailableError(
                        f"no active controller among {self.addresses}: {error.details()}"
                    ) from error
                address = remaining[0]

    def _forget(self, address: str) -> None:
        channel = self._channels.pop(address, None)
        if channel is not None:
            asyncio.get_running_loop().create_task(channel.close())

    # Registration and heartbeats -----------------------------------------------------------

    async def _stay_registered(self) -> None:
        """Register, then heartbeat under that epoch for as long as a controller accepts it.

        While no controller answers (an election between controllers, a partition) the
        broker keeps its epoch and heartbeats on: the next active controller loads the
        registration and knows the epoch, as a KRaft broker's session outlives a controller
        failover. Only a refused heartbeat (the session ended, the broker was fenced) makes
        it register again, under a new epoch and with a full image — unless the broker is
        stopping: a stopping broker fenced meanwhile (its session ran out while it shut down)
        would otherwise come back, and be given new partitions, moments before it exits."""
        while True:
            await self._register()
            while await self._heartbeat():
                await asyncio.sleep(self.heartbeat_seconds)
            self.registered.clear()
            if self._stopping:
                log.info("fenced while stopping: not registering again")
                return

    async def _heartbeat(self) -> bool:
        """False when the controller refused this epoch; True when it was accepted or no
        controller answered."""
        request = pb.HeartbeatRequest(broker_id=self.broker_id, broker_epoch=self.broker_epoch)
        try:
            reply = await self.call(
                lambda s: s.Heartbeat,
                request,
                timeout=max(HEARTBEAT_TIMEOUT_FLOOR, 3 * self.heartbeat_seconds),
            )
        except ControllerUnavailableError as error:
            log.warning("heartbeat of epoch %d not heard: %s", self.broker_epoch, error)
            return True
        if reply.error_code != ErrorCode.NONE:
            log.warning(
                "heartbeat refused (%s: %s); registering again",
                ErrorCode(reply.error_code).name,
                reply.error_message,
            )
            return False
        return True

    async def _register(self) -> None:
        request = pb.RegisterBrokerRequest(
            broker_id=self.broker_id,
            incarnation_id=self.incarnation,
            listeners=self.listeners,
            rack=self.rack,
        )
        while True:
            try:
                reply = await self.call(lambda s: s.RegisterBroker, request)
            except ControllerUnavailableError as error:
                log.warning("%s", error)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if reply.error_code == ErrorCode.NONE:
                self.broker_epoch = reply.broker_epoch
                self.registered.set()
                if self._stream is not None:
                    self._stream.cancel()  # watch again under the new epoch: a full image
                log.info("registered as broker %d, epoch %d", self.broker_id, self.broker_epoch)
                return
            log.info("registration refused, retrying: %s", reply.error_message)
            await asyncio.sleep(RETRY_SECONDS * 5)

    # Metadata stream ----------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await self.registered.wait()
            address = self._active
            try:
                stream = self._stream = self._stub(address).WatchMetadata(
                    pb.WatchMetadataRequest(
                        broker_id=self.broker_id, broker_epoch=self.broker_epoch
                    )
                )
                async for update in stream:
                    self.on_update(update)
                    self.first_image.set()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the link is closing
                # The call was cancelled: replaced after registering again, or its channel
                # dropped after a silent connection.
                log.info("metadata stream from %s cancelled; watching again", address)
            except grpc.aio.AioRpcError as error:
                hint = _active_hint(error)
                if hint:
                    self._active = hint
                elif error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    self._rotate(address)
                log.info("metadata stream from %s ended: %s", address, error.details())
            await asyncio.sleep(RETRY_SECONDS)

    def _rotate(self, failed: str) -> None:
        if self._active == failed and len(self.addresses) > 1:
            index = self.addresses.index(failed) if failed in self.addresses else -1
            self._active = self.addresses[(index + 1) % len(self.addresses)]

    # Requests for the active controller ------------------------------------------------------

    async def alter_partition(self, changes: list[pb.PartitionChange]) -> pb.AlterPartitionReply:
        return await self.call(
            lambda s: s.AlterPartition,
            pb.AlterPartitionRequest(
                broker_id=self.broker_id, broker_epoch=self.broker_epoch, changes=changes
            ),
        )

    async def controlled_shutdown(self) -> int:
        """Ask the active controller to move this broker's leaderships and ISR memberships
        to other brokers before it stops. Returns how many partitions it still leads because
        no other ISR member could take them; raises ControllerUnavailableError when no
        controller answers, KafkaError when the controller refuses (this broker is not
        registered under its current epoch)."""
        reply = await self.call(
            lambda s: s.ControlledShutdown,
            pb.ControlledShutdownRequest(broker_id=self.broker_id, broker_epoch=self.broker_epoch),
        )
        if reply.error_code != ErrorCode.NONE:
            raise KafkaError(ErrorCode(reply.error_code), reply.error_message)
        return int(reply.remaining_leaderships)

    # Security metadata: Kafka's admin requests, carried out by the active controller; each
    # raises ControllerUnavailableError when no controller answers. The changes reach this
    # broker's image through the metadata stream, after the reply.

    async def alter_user_scram_credentials(
        self, upsertions: Sequence[pb.ScramCredential], deletions: Sequence[pb.ScramDeletion]
    ) -> list[pb.UserResult]:
        """One result per user named, in the order first named."""
        reply = await self.call(
            lambda s: s.AlterUserScramCredentials,
            pb.AlterUserScramCredentialsRequest(upsertions=upsertions, deletions=deletions),
        )
        return list(reply.results)

    async def create_acls(self, bindings: Sequence[pb.AclBinding]) -> list[pb.AclResult]:
        """One result per binding, in order."""
        reply = await self.call(lambda s: s.CreateAcls, pb.CreateAclsRequest(creations=bindings))
        return list(reply.results)

    async def delete_acls(
        self, filters: Sequence[pb.AclBindingFilter]
    ) -> list[pb.DeleteAclsFilterResult]:
        """One result per filter, in order, with the bindings it deleted."""
        reply = await self.call(lambda s: s.DeleteAcls, pb.DeleteAclsRequest(filters=filters))
        return list(reply.results)

    async def alter_client_quotas(
        self, alterations: Sequence[pb.QuotaAlteration], validate_only: bool
    ) -> list[pb.QuotaResult]:
        """One result per alteration, in order."""
        reply = await self.call(
            lambda s: s.AlterClientQuotas,
            pb.AlterClientQuotasRequest(alterations=alterations, validate_only=validate_only),
        )
        return list(reply.results)


def _active_hint(error: grpc.aio.AioRpcError) -> str | None:
    if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    for key, value in error.trailing_metadata() or ():
        if key == ACTIVE_CONTROLLER and value:
            return str(value)
    return None
