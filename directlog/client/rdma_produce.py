"""An RDMA producer for one partition (KafkaDirect §4.2.2; docs/broker.md "RDMA produce").

It asks the partition's leader for access over the Kafka protocol (RdmaAccess), connects
a queue pair with the verbs API and writes whole v2 record batches into the granted part
of the head segment with WRITE_WITH_IMM (immediate = file id << 16 | order). The broker
commits them in order and writes a 16-byte reply per write into this producer's reply
region.

Exclusive mode: the producer places its writes back to back and counts orders itself;
when a batch does not fit in what is left, it lets the grant go and asks for a new one.
Shared mode: each write is reserved first with FETCH_AND_ADD on the grant's word, which
answers its order and offset; a reservation past the region's end is sent as an empty
write (so no hole is left) and the producer asks for the next grant. A write the broker
aborted for another writer's fault (REQUEST_TIMED_OUT) is written again on a new grant:
the error reply comes after the replies to every write committed before it, so nothing
is written twice.

Any other failure (RDMA unavailable, a refused grant, a write the provider or the broker
refused) raises RdmaProduceError and closes the producer.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.protocol.rdma_access import (
    EXCLUSIVE,
    MAX_IN_FLIGHT,
    SHARED,
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

REPLY = struct.Struct(">Hhiq")  # order, error code, records, base offset (docs/formats.md)
REPLY_SIZE = REPLY.size
NATIVE_WORD = struct.Struct("=Q")  # what an atomic leaves in the local buffer
ORDERS = 1 << 16
ORDER_ONE = 1 << 48
OFFSET_MASK = ORDER_ONE - 1
FILE_ID_SHIFT = 16
SPIN_SECONDS = 0.0005  # a commit reply usually comes this soon: poll before parking a thread
REGRANT_BACKOFF = 0.02  # while the broker notices that the previous grant was released
MODES = {"exclusive": EXCLUSIVE, "shared": SHARED}
RESERVE_ID = 1 << 63  # wr_id of a FETCH_AND_ADD (writes use their batch index)
MARKER = -1  # in-flight entry of an overflowed reservation's empty write


class RdmaProduceError(Exception):
    """RDMA produce failed; ``code`` is the broker's Kafka error code when it gave one.
    Raised by ``send``, ``produced`` holds, per batch, where it landed when the broker's
    answer came, or None: a batch without an answer may or may not be in the log."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.produced: list[Produced | None] = []


@dataclass(frozen=True, slots=True)
class Produced:
    """Where a batch landed: its first offset and record count."""

    base_offset: int
    records: int


class RdmaProducer:
    """Writes record batches to ``topic``-``partition`` through its leader at
    ``leader`` ("host:port"). ``mode``: "exclusive" or "shared"; ``acks``: 1 (a batch is
    answered once the leader committed it) or -1 (once the in-sync replicas have it);
    ``window``: writes in flight at once; ``staging_bytes``: the registered buffer batches
    are copied into before they are written (at least the largest batch)."""

    def __init__(
        self,
        leader: str,
        topic: str,
        partition: int,
        *,
        mode: str = "exclusive",
        acks: int = 1,
        provider: str = "auto",
        window: int = 16,
        staging_bytes: int = 4 << 20,
        timeout: float = 10.0,
        client_id: str = "directlog-rdma-producer",
    ) -> None:
        if not 1 <= window <= MAX_IN_FLIGHT:
            raise ValueError(f"window must be 1..{MAX_IN_FLIGHT}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)}")
        if acks not in (1, -1):
            raise ValueError("acks must be 1 or -1")
        self.acks = acks
        host, _, port = leader.rpartition(":")
        self._host, self._port = host, int(port)
        self.topic, self.partition = topic, partition
        self.mode = mode
        self._provider = provider
        self._window = window
        self._staging_bytes = staging_bytes
        self._timeout = timeout
        self._client_id = client_id
        self._context: Context | None = None
        self._staging: MemoryRegion | None = None
        self._replies: MemoryRegion | None = None
        self._word: MemoryRegion | None = None  # where a reservation's old value lands
        self._connection: KafkaConnection | None = None
        self._qp: QueuePair | None = None
        self._grant: RdmaAccessResponse | None = None
        self._written = 0  # exclusive: bytes placed in the grant so far
        self._order = 0  # exclusive: the next write's order
        self._in_flight: deque[int] = deque()  # batch index (or MARKER) per unanswered write
        self._sends = 0  # send work requests whose completion is not polled yet
        self._stage_head = 0  # where the next batch goes in staging
        self._replied = 0  # replies read on this queue pair
        self._reserved: int | None = None  # the old word of the last reservation
        self._ended = False  # the current grant answered that it is over
        self._closed = False

    async def start(self) -> None:
        """Open the provider and take the first grant."""
        try:
            self._context = open_context(self._provider)
            pd = self._context.alloc_pd()
            self._pd = pd
            self._cq = self._context.create_cq(self._window * 2 + 1)
            self._staging = pd.allocate(self._staging_bytes, Access.LOCAL_WRITE)
            self._replies = pd.allocate(
                self._window * REPLY_SIZE, Access.LOCAL_WRITE | Access.REMOTE_WRITE
            )
            self._word = pd.allocate(NATIVE_WORD.size, Access.LOCAL_WRITE)
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
        for batch in batches:
            if not 0 < len(batch) <= self._staging_bytes:
                raise RdmaProduceError(
                    f"batch of {len(batch)} bytes; staging holds {self._staging_bytes}"
                )
        results: list[Produced | None] = [None] * len(batches)
        deadline = time.monotonic() + self._timeout
        try:
            while (
                first := next((i for i, r in enumerate(results) if r is None), None)
            ) is not None:
                if await self._send_from(batches, first, results, deadline):
                    await self._drain(results, deadline)  # replies to what is still in flight
                    first = next((i for i, r in enumerate(results) if r is None), first)
                    await self._regrant(len(batches[first]))
        except RdmaProduceError as error:
            error.produced = results
            raise
        return [result for result in results if result is not None]

    async def _send_from(
        self,
        batches: Sequence[bytes],
        first: int,
        results: list[Produced | None],
        deadline: float,
    ) -> bool:
        """Post batches from ``first`` on, up to ``window`` unanswered and as far as the
        staging ring has room, collecting replies meanwhile; True when the grant ended and
        must be renewed first."""
        for index in range(first, len(batches)):
            size = len(batches[index])
            while len(self._in_flight) == self._window or (staged := self._stage(size)) < 0:
                if self._ended:
                    return True
                await self._poll(results, deadline)
            if self._ended:
                return True
            grant = self._grant
            assert grant is not None and self._staging is not None and self._qp is not None
            if size > grant.length:
                await self.close()
                raise RdmaProduceError(f"batch of {size} bytes; the grant holds {grant.length}")
            if self.mode == "shared":
                reserved = await self._reserve(size, results, deadline)
                if reserved is None:
                    return True
                order, offset = reserved
                if offset + size > grant.length:
                    # An empty write in its place, so no hole is left (to the word: the
                    # region may be deregistered already).
                    self._post(MARKER, 0, 0, grant.word_addr, grant.word_rkey, order)
                    return True
            else:
                if self._written + size > grant.length:
                    return True
                order, offset = self._order, self._written
                self._order = (order + 1) % ORDERS
                self._written += size
            self._staging.buf[staged : staged + size] = batches[index]
            self._post(index, staged, size, grant.addr + offset, grant.rkey, order)
            self._stage_head = staged + size
        await self._drain(results, deadline)
        return self._ended

    def _stage(self, size: int) -> int:
        """Where in staging a batch of ``size`` bytes goes now, or -1 to wait. Staging is
        filled front to back and starts over once every send completed (the provider
        has read all it holds: at once on shm, soon on tcp and an RNIC), so the window,
        not the staging, paces the writes."""
        if self._stage_head + size <= self._staging_bytes:
            return self._stage_head
        if self._sends == 0:
            self._stage_head = 0
            return 0
        return -1

    def _post(self, index: int, staged: int, size: int, remote: int, rkey: int, order: int) -> None:
        assert self._qp is not None and self._staging is not None and self._grant is not None
        try:
            self._qp.post_write_with_imm(
                index if index >= 0 else RESERVE_ID - 1,
                self._staging.sge(staged, size),
                remote,
                rkey,
                self._grant.file_id << FILE_ID_SHIFT | order,
            )
        except RdmaError as error:
            raise RdmaProduceError(f"write not posted: {error}") from error
        self._sends += 1
        self._in_flight.append(index)

    async def _reserve(
        self, size: int, results: list[Produced | None], deadline: float
    ) -> tuple[int, int] | None:
        """FETCH_AND_ADD one order and ``size`` bytes on the grant's word: the order and
        region offset this write got (None if the grant was aborted meanwhile)."""
        grant = self._grant
        assert grant is not None and self._qp is not None and self._word is not None
        self._reserved = None
        try:
            self._qp.post_fetch_and_add(
                RESERVE_ID, self._word.sge(), grant.word_addr, grant.word_rkey, ORDER_ONE | size
            )
        except RdmaError as error:
            raise RdmaProduceError(f"reservation not posted: {error}") from error
        self._sends += 1
        while (reserved := self._reservation()) is None:
            if self._ended:
                return None
            await self._poll(results, deadline)
        return reserved >> 48, reserved & OFFSET_MASK

    def _reservation(self) -> int | None:
        """The old word once the FETCH_AND_ADD completed (set by ``_handle``)."""
        return self._reserved

    async def _drain(self, results: list[Produced | None], deadline: float) -> None:
        """Wait until every posted write was answered and every send completed."""
        while self._in_flight or self._sends:
            await self._poll(results, deadline)

    async def _poll(self, results: list[Produced | None], deadline: float) -> None:
        completions = self._cq.poll(2 * self._window, timeout=0)
        spin_until = time.perf_counter() + SPIN_SECONDS
        while not completions and time.perf_counter() < spin_until:
            completions = self._cq.poll(2 * self._window, timeout=0)
        if not completions:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                await self.close()
                raise RdmaProduceError("no commit reply from the broker in time")
            completions = await self._cq.poll_async(2 * self._window, min(remaining, 1.0))
        for completion in completions:
            await self._handle(completion, results)

    async def _handle(self, wc: WorkCompletion, results: list[Produced | None]) -> None:
        assert self._qp is not None
        if wc.qp_num != self._qp.qp_num:
            return  # flushed from the queue pair of a grant we let go
        if not wc.ok:
            if self._ended:
                return  # flushed after an abort: those writes go again
            await self.close()
            raise RdmaProduceError(f"RDMA {wc.opcode.name} failed: {wc.status.name}")
        if wc.opcode is not Opcode.RECV_RDMA_WITH_IMM:
            self._sends -= 1
            if wc.opcode is Opcode.FETCH_AND_ADD:
                assert self._word is not None
                (self._reserved,) = NATIVE_WORD.unpack_from(self._word.buf)
            return
        assert self._replies is not None
        slot = self._replied % self._window * REPLY_SIZE
        self._replied += 1
        order, code, records, base_offset = REPLY.unpack_from(self._replies.buf, slot)
        index = self._in_flight.popleft() if self._in_flight else MARKER
        if code == ErrorCode.REQUEST_TIMED_OUT:
            # Aborted for another writer's fault: this and every later write of ours were
            # not committed. The broker drops the queue pair: regrant, write them again.
            self._in_flight.clear()
            self._sends = 0
            self._ended = True
            return
        if code != ErrorCode.NONE:
            await self.close()
            raise RdmaProduceError(f"broker refused write {order}: error code {code}", code)
        self._qp.post_recv(wc.wr_id)
        if index == MARKER:
            self._ended = True  # the grant is sealed
        else:
            results[index] = Produced(base_offset, records)

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
                QpCaps(max_send_wr=self._window + 1, max_recv_wr=self._window),
                timeout=self._timeout,
            )
            for slot in range(self._window):
                qp.post_recv(slot)
        except (RdmaError, ValueError) as error:
            await self.close()
            raise RdmaProduceError(f"RDMA connect failed: {error}") from error
        self._qp, self._grant = qp, grant
        self._written, self._order = 0, 0
        self._in_flight.clear()
        self._sends, self._replied, self._ended = 0, 0, False
        self._stage_head = 0  # the old queue pair is closed: nothing reads staging

    async def _request_access(self, min_free: int) -> RdmaAccessResponse:
        assert self._connection is not None and self._replies is not None
        assert self._context is not None
        request = RdmaAccessRequest(
            self.topic,
            self.partition,
            MODES[self.mode],
            min_free,
            tuple(resolve_provider(self._provider).split("+")),
            self._replies.addr,
            self._replies.rkey,
            self._replies.length,
            self.acks,
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
