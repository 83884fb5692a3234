"""An exclusive RDMA producer for one partition (KafkaDirect §4.2.2; docs/broker.md
"RDMA produce").

It asks the partition's leader for access over the Kafka protocol (RdmaAccess), connects
a queue pair with the verbs API and writes whole v2 record batches into the granted part
of the head segment with WRITE_WITH_IMM (immediate = file id << 16 | order). The broker
commits them in order and writes a 16-byte reply per batch into this producer's reply
region. When a batch does not fit in what is left of the grant, the producer finishes its
writes, lets the grant go and asks for a new one (the broker rolls the segment if needed).

Any failure (RDMA unavailable, a refused grant, a write the provider or the broker refused)
raises RdmaProduceError; after a failed write the producer is closed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.protocol.rdma_access import (
    EXCLUSIVE,
    MAX_IN_FLIGHT,
    RdmaAccessRequest,
    RdmaAccessResponse,
    decode_response_frame,
    request_frame,
)
from directlog.rdma import (
    Access,
    Context,
    MemoryRegion,
    Opcode,
    QpCaps,
    QueuePair,
    RdmaError,
    WorkCompletion,
    open_context,
    resolve_provider,
)
from directlog.records.errors import CorruptRecordError

REPLY_SIZE = 16  # order u16, error i16, records i32, base offset i64 (docs/formats.md)
ORDERS = 1 << 16
FILE_ID_SHIFT = 16
SPIN_SECONDS = 0.0005  # a commit reply usually comes this soon: poll before parking a thread
REGRANT_BACKOFF = 0.02  # while the broker notices that the previous grant was released


class RdmaProduceError(Exception):
    """RDMA produce failed; ``code`` is the broker's Kafka error code when it gave one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Produced:
    """Where a batch landed: its first offset and record count."""

    base_offset: int
    records: int


class RdmaProducer:
    """Writes record batches to ``topic``-``partition`` through its leader at
    ``leader`` ("host:port"). ``window``: batches in flight at once; ``staging_bytes``:
    the registered buffer batches are copied into before they are written (at least the
    largest batch)."""

    def __init__(
        self,
        leader: str,
        topic: str,
        partition: int,
        *,
        provider: str = "auto",
        window: int = 16,
        staging_bytes: int = 4 << 20,
        timeout: float = 10.0,
        client_id: str = "directlog-rdma-producer",
    ) -> None:
        if not 1 <= window <= MAX_IN_FLIGHT:
            raise ValueError(f"window must be 1..{MAX_IN_FLIGHT}")
        host, _, port = leader.rpartition(":")
        self._host, self._port = host, int(port)
        self.topic, self.partition = topic, partition
        self._provider = provider
        self._window = window
        self._staging_bytes = staging_bytes
        self._timeout = timeout
        self._client_id = client_id
        self._context: Context | None = None
        self._staging: MemoryRegion | None = None
        self._replies: MemoryRegion | None = None
        self._connection: KafkaConnection | None = None
        self._qp: QueuePair | None = None
        self._grant: RdmaAccessResponse | None = None
        self._written = 0
        self._order = 0
        self._closed = False

    async def start(self) -> None:
        """Open the provider and take the first grant."""
        try:
            self._context = open_context(self._provider)
            pd = self._context.alloc_pd()
            self._pd = pd
            self._cq = self._context.create_cq(self._window * 2)
            self._staging = pd.allocate(self._staging_bytes, Access.LOCAL_WRITE)
            self._replies = pd.allocate(
                self._window * REPLY_SIZE, Access.LOCAL_WRITE | Access.REMOTE_WRITE
            )
        except (RdmaError, ValueError) as error:
            await self.close()
            raise RdmaProduceError(f"RDMA is unavailable here: {error}") from error
        try:
            self._connection = await KafkaConnection.connect(self._host, self._port, self._timeout)
        except OSError as error:
            await self.close()
            raise RdmaProduceError(f"leader {self._host}:{self._port}: {error}") from error
        await self._take_grant(1)

    @property
    def base_offset(self) -> int:
        """Base offset of the segment the current grant is in."""
        assert self._grant is not None
        return self._grant.base_offset

    async def send(self, batches: Sequence[bytes]) -> list[Produced]:
        """Write ``batches`` (v2 record batches, in order) and wait until the broker
        committed every one; their offsets, in order."""
        if self._closed or self._staging is None:
            raise RdmaProduceError("producer is closed")
        results: list[Produced] = []
        staged = 0
        pending = 0
        for batch in batches:
            size = len(batch)
            if not 0 < size <= self._staging_bytes:
                raise RdmaProduceError(
                    f"batch of {size} bytes; staging holds {self._staging_bytes}"
                )
            grant = self._grant
            assert grant is not None
            if self._written + size > grant.length:
                results += await self._drain(pending)
                pending, staged = 0, 0
                await self._regrant(size)
                grant = self._grant
                assert grant is not None
                if size > grant.length:
                    await self.close()
                    raise RdmaProduceError(f"batch of {size} bytes; the grant holds {grant.length}")
            if pending == self._window or staged + size > self._staging_bytes:
                results += await self._drain(pending)
                pending, staged = 0, 0
            self._staging.buf[staged : staged + size] = batch
            assert self._qp is not None
            imm = grant.file_id << FILE_ID_SHIFT | self._order
            try:
                self._qp.post_write_with_imm(
                    self._order,
                    self._staging.sge(staged, size),
                    grant.addr + self._written,
                    grant.rkey,
                    imm,
                )
            except RdmaError as error:
                await self.close()
                raise RdmaProduceError(f"write not posted: {error}") from error
            self._written += size
            self._order = (self._order + 1) % ORDERS
            staged += size
            pending += 1
        results += await self._drain(pending)
        return results

    async def _drain(self, pending: int) -> list[Produced]:
        """Wait for ``pending`` writes' completions and the broker's replies to them."""
        results: list[Produced] = []
        writes = pending
        deadline = time.monotonic() + self._timeout
        while writes or len(results) < pending:
            completions = self._cq.poll(2 * self._window, timeout=0)
            spin_until = time.perf_counter() + SPIN_SECONDS
            while not completions and time.perf_counter() < spin_until:
                completions = self._cq.poll(2 * self._window, timeout=0)
            if not completions:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    await self.close()
                    raise RdmaProduceError("no commit reply from the broker in time")
                completions = await asyncio.to_thread(self._cq.poll, 1, min(remaining, 1.0))
            assert self._qp is not None
            for completion in completions:
                if completion.qp_num != self._qp.qp_num:
                    continue  # flushed from the queue pair of a grant we let go
                if completion.opcode is Opcode.RECV_RDMA_WITH_IMM:
                    results.append(await self._replied(completion))
                else:
                    await self._check(completion, "write")
                    writes -= 1
        return results

    async def _replied(self, completion: WorkCompletion) -> Produced:
        await self._check(completion, "reply")
        assert self._replies is not None and self._qp is not None
        slot = (completion.imm_data or 0) % self._window * REPLY_SIZE
        reply = bytes(self._replies.buf[slot : slot + REPLY_SIZE])
        order = int.from_bytes(reply[0:2], "big")
        code = int.from_bytes(reply[2:4], "big", signed=True)
        records = int.from_bytes(reply[4:8], "big", signed=True)
        base_offset = int.from_bytes(reply[8:16], "big", signed=True)
        if code != ErrorCode.NONE:
            await self.close()
            raise RdmaProduceError(f"broker refused write {order}: error code {code}", code)
        self._qp.post_recv(completion.wr_id)
        return Produced(base_offset, records)

    async def _check(self, completion: WorkCompletion, what: str) -> None:
        if not completion.ok:
            await self.close()
            raise RdmaProduceError(f"RDMA {what} failed: {completion.status.name}")

    async def _regrant(self, min_free: int) -> None:
        """Let the current grant go (disconnect) and take the next one."""
        if self._qp is not None:
            self._qp.close()
            self._qp = None
        await self._take_grant(min_free)

    async def _take_grant(self, min_free: int) -> None:
        assert self._context is not None and self._replies is not None
        deadline = time.monotonic() + self._timeout
        while True:
            grant = await self._request_access(min_free)
            if grant.error_code == ErrorCode.NONE:
                break
            # Our own previous grant may still be held until the broker sees us go.
            if grant.error_code != ErrorCode.POLICY_VIOLATION or time.monotonic() > deadline:
                await self.close()
                raise RdmaProduceError(
                    f"RDMA access to {self.topic}-{self.partition} refused: {grant.error_message}",
                    grant.error_code,
                )
            await asyncio.sleep(REGRANT_BACKOFF)
        try:
            qp = self._pd.connect(
                grant.conn_info,
                self._cq,
                QpCaps(max_send_wr=self._window, max_recv_wr=self._window),
                timeout=self._timeout,
            )
            for slot in range(self._window):
                qp.post_recv(slot)
        except (RdmaError, ValueError) as error:
            await self.close()
            raise RdmaProduceError(f"RDMA connect failed: {error}") from error
        self._qp, self._grant = qp, grant
        self._written, self._order = 0, 0

    async def _request_access(self, min_free: int) -> RdmaAccessResponse:
        assert self._connection is not None and self._replies is not None
        assert self._context is not None
        request = RdmaAccessRequest(
            self.topic,
            self.partition,
            EXCLUSIVE,
            min_free,
            tuple(resolve_provider(self._provider).split("+")),
            self._replies.addr,
            self._replies.rkey,
            self._replies.length,
        )
        correlation_id = self._connection.next_correlation_id()
        frame = await self._connection.exchange(
            request_frame(request, correlation_id, self._client_id)
        )
        try:
            return decode_response_frame(frame, correlation_id)
        except CorruptRecordError as error:
            await self.close()
            raise RdmaProduceError(f"bad RdmaAccess answer: {error}") from error

    async def close(self) -> None:
        """Let the grant go and release every resource; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._connection is not None:
            await self._connection.close()
        if self._context is not None:
            self._context.close()  # closes the queue pair: the broker revokes the grant
