"""An RDMA consumer of one partition (KafkaDirect §4.4.2; docs/broker.md "RDMA consume").

It asks the partition's leader for the segment holding its offset (RdmaConsume ACCESS over
the Kafka protocol), connects a queue pair, names its consumer id once (WRITE_WITH_IMM into
the broker's bind word) and from then on reads with one-sided READs only: its metadata slot
(one READ) to learn how far the segment is readable, then the segment in reads of
``read_size`` bytes, larger when a batch header says the batch is larger, never past the
readable end. Only whole, CRC-checked batches are decoded; a partial batch stays in the
read buffer until its last byte is read. When a sealed segment is read to its end the
consumer asks for the next one and releases the finished one.

A read_committed consumer (``isolation_level="read_committed"``, Kafka's
``isolation.level``) is granted only what lies below the last stable offset, where every
transaction is decided, and decides each transactional batch itself, one-sidedly as the
rest: it holds a producer's transactional records until it reads that producer's next
control batch, then returns them (COMMIT) or drops them (ABORT); records after a held one
wait behind it, so records come out in offset order, and control batches never do. A marker
always follows a transactional batch below the last stable offset (the cleaner keeps a
marker while any batch of its transaction remains), though it may lie above it while an
older transaction is still open: the held records then wait for that one to be decided.
What is held is at most the log between a transaction's first batch and its marker.

A consumer made with ``batches=True`` hands out those batches as they are stored
(``poll_batches``) instead of decoding them: a reader that turns record bytes into columns
itself (directlog.spark) makes no Python object per record.

A READ the provider refuses (a segment revoked under it, as happens when the head rolls
between the slot READ and a data READ) ends the queue pair, and a slot that stops reading
whole (64 checksum failures in a row: not a torn read) is as good as lost; either way the
consumer connects a new queue pair and asks again from the next offset it has not
returned, so records are returned exactly once and in order. Other failures raise
RdmaConsumeError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType
from typing import Self, TypeVar

from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.protocol.rdma_consume import (
    ACCESS,
    NEW_CONSUMER,
    NO_SLOT,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RELEASE,
    SLOT_SIZE,
    RdmaConsumeRequest,
    RdmaConsumeResponse,
    Slot,
    decode_response_frame,
    read_slot,
    request_frame,
)
from directlog.rdma import (
    Access,
    CompletionQueue,
    Context,
    MemoryRegion,
    ProtectionDomain,
    QpCaps,
    QueuePair,
    RdmaError,
    Sge,
    WorkCompletion,
    open_context,
    resolve_provider,
)
from directlog.records.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    Record,
    decode_records,
    peek_offset_and_size,
    read_header,
    verify_crc,
)
from directlog.records.errors import RecordError
from directlog.records.markers import ABORT, COMMIT, control_type

SPIN_SECONDS = 0.0005  # a READ usually completes this soon: poll before parking a thread
IDLE_SECONDS = 0.001  # between slot READs while nothing new is readable
TORN_RETRIES = 64  # slot READs that overlapped the broker's update, in a row, at most
MAX_RECONNECTS = 8  # queue pairs lost in a row without a record returned in between
BIND_WR, SLOT_WR, DATA_WR = 1, 2, 3
T = TypeVar("T", list[Record], bytes | bytearray)
ISOLATION_LEVELS = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}
DECIDED = -1  # the producer id of held records whose fate is known


# The leader moved (or is moving): another broker serves the partition now.
LEADER_MOVED = frozenset(
    {
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
    }
)


class RdmaConsumeError(Exception):
    """RDMA consume failed; ``code`` is the broker's Kafka error code when it gave one.
    ``retriable``: the leader moved or could not be reached, so reading again from the
    partition's (new) leader may work; otherwise the data or this host is at fault."""

    def __init__(
        self, message: str, code: int | None = None, *, retriable: bool | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.retriable = code in LEADER_MOVED if retriable is None else retriable


class _LostQueuePair(Exception):
    """A READ failed, or the slot stopped reading whole: the consumer reconnects."""


class RdmaConsumer:
    """Reads ``topic``-``partition`` from ``offset`` on through its leader at ``leader``
    ("host:port"). ``poll`` returns records (absolute offsets) in order, each once; with
    ``batches=True``, ``poll_batches`` returns the record batches holding them instead.
    ``max_poll_bytes`` bounds the bytes one poll reads. ``isolation_level``:
    read_uncommitted (every record below the high watermark) or read_committed (only
    committed and non-transactional records, below the last stable offset; not with
    ``batches=True``, which hands out batches as stored)."""

    def __init__(
        self,
        leader: str,
        topic: str,
        partition: int,
        offset: int,
        *,
        provider: str = "auto",
        read_size: int = 2048,
        max_poll_bytes: int = 1 << 20,
        timeout: float = 10.0,
        client_id: str = "directlog-rdma-consumer",
        batches: bool = False,
        isolation_level: str = "read_uncommitted",
    ) -> None:
        if read_size < LOG_OVERHEAD or max_poll_bytes < read_size:
            raise ValueError("read_size must be >= 12 and max_poll_bytes >= read_size")
        isolation = ISOLATION_LEVELS.get(isolation_level)
        if isolation is None:
            raise ValueError(f"isolation_level must be one of {', '.join(ISOLATION_LEVELS)}")
        if batches and isolation == READ_COMMITTED:
            raise ValueError("batches=True hands out stored batches: it reads uncommitted")
        self._isolation = isolation
        # read_committed: records decoded behind an undecided transactional batch, in
        # offset order, each run as (producer id, or DECIDED; first offset; records), and
        # the producers whose held records wait for their marker.
        self._held: list[tuple[int, int, list[Record]]] = []
        self._undecided: set[int] = set()
        host, _, port = leader.rpartition(":")
        self._host, self._port = host, int(port)
        self.topic, self.partition = topic, partition
        self._decoded = offset  # the offset after the last record decoded
        self._ready: list[Record] = []  # decoded, not yet returned (a failed poll keeps them)
        self._batches = batches
        # With batches=True: whole checked batches not yet handed out in full, back to back,
        # with each one's (base offset, next offset, position in _stored); and the first
        # offset not handed out.
        self._stored = bytearray()
        self._stored_batches: list[tuple[int, int, int]] = []
        self._handed = offset
        self._provider = provider
        self._read_size = read_size
        self._max_poll_bytes = max_poll_bytes
        self._timeout = timeout
        self._client_id = client_id
        self._context: Context | None = None
        self._connection: KafkaConnection | None = None
        self._qp: QueuePair | None = None
        self._consumer_id = NEW_CONSUMER
        self._grant = RdmaConsumeResponse(ErrorCode.NONE)
        self._addr = self._rkey = self._length = 0
        self._read_position = 0  # file position of the next byte to READ
        self._readable_end = 0
        self._mutable = False
        self._filled = 0  # bytes in the buffer not yet decoded (the start of a batch)
        self._reconnects = 0
        self._closed = False

    async def start(self) -> None:
        """Open the provider, take the first segment and connect."""
        try:
            self._context = open_context(self._provider)
            self._pd: ProtectionDomain = self._context.alloc_pd()
            self._cq: CompletionQueue = self._context.create_cq(8)
            self._slot = self._pd.allocate(SLOT_SIZE, Access.LOCAL_WRITE)
            self._buffer: MemoryRegion = self._pd.allocate(
                max(4 * self._read_size, 64 << 10), Access.LOCAL_WRITE
            )
        except (RdmaError, ValueError) as error:
            await self.close()
            raise RdmaConsumeError(f"RDMA is unavailable here: {error}") from error
        try:
            self._connection = await KafkaConnection.connect(self._host, self._port, self._timeout)
        except OSError as error:
            await self.close()
            message = f"leader {self._host}:{self._port}: {error}"
            raise RdmaConsumeError(message, retriable=True) from error
        await self._connect()

    @property
    def base_offset(self) -> int:
        """Base offset of the segment being read."""
        return self._grant.base_offset

    @property
    def position(self) -> int:
        """The offset of the next record ``poll`` returns (with batches=True: the first
        offset ``poll_batches`` has not handed out). A consumer started there reads on
        exactly where this one would (read_committed: from the first record held)."""
        if self._batches:
            return self._handed
        if self._ready:
            return self._ready[0].offset
        return self._held[0][1] if self._held else self._decoded

    @property
    def readable_end(self) -> int:
        """How far the current segment is readable, as the broker last said."""
        return self._readable_end

    async def poll(self, timeout: float = 0.0) -> list[Record]:
        """The records readable now, in order (waiting up to ``timeout`` seconds for some);
        an empty list when none came."""
        if self._batches:
            raise RdmaConsumeError("this consumer hands out batches: use poll_batches")
        return await self._poll(timeout, self._take_ready)

    async def poll_batches(self, end: int, timeout: float = 0.0) -> bytes | bytearray:
        """The whole record batches (CRC-checked, as stored) that hold offsets from
        ``position`` up to ``end`` (exclusive) readable now, back to back, waiting up to
        ``timeout`` seconds for some; b"" when none came. The first batch may start before
        ``position`` and the last may reach past ``end``: such a batch is handed out again
        by the next call, whose range it also holds."""
        if not self._batches:
            raise RdmaConsumeError("this consumer hands out records: use poll")
        return await self._poll(timeout, lambda: self._take_stored(end))

    async def _poll(self, timeout: float, take: Callable[[], T]) -> T:
        """What ``take`` finds ready, reading on until it finds some or ``timeout`` ends
        (then what it found: empty)."""
        if self._closed or self._qp is None:
            raise RdmaConsumeError("consumer is not started, or closed")
        deadline = time.monotonic() + timeout
        while True:
            found = take()
            if found:
                self._reconnects = 0
                return found
            try:
                await self._read_available()
            except RdmaConsumeError:
                await self.close()
                raise
            except _LostQueuePair as lost:
                self._reconnects += 1
                if self._reconnects > MAX_RECONNECTS:
                    await self.close()
                    message = f"RDMA reads keep failing: {lost}"
                    raise RdmaConsumeError(message, retriable=True) from None
                await self._connect()
                continue
            found = take()
            if found:
                self._reconnects = 0
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return found
            await asyncio.sleep(min(IDLE_SECONDS, remaining))

    # Reading -------------------------------------------------------------------------

    async def _read_available(self) -> None:
        if self._grant.slot_index != NO_SLOT:
            slot = await self._read_slot()
            if slot.revoked or slot.base_offset != self._grant.base_offset:
                await self._switch(self._decoded)
                return
            self._addr, self._rkey, self._length = slot.addr, slot.rkey, slot.length
            self._readable_end, self._mutable = slot.readable_end, slot.mutable
        budget = self._max_poll_bytes
        while self._read_position < self._readable_end and budget > 0:
            size = min(self._next_read_size(), self._readable_end - self._read_position)
            self._reserve(size)
            await self._read(
                DATA_WR,
                self._buffer.sge(self._filled, size),
                self._addr + self._read_position,
                self._rkey,
            )
            self._filled += size
            self._read_position += size
            budget -= size
            self._take_batches()
        if not self._mutable and self._read_position >= self._readable_end:
            if self._filled:
                raise await self._fail(
                    f"segment {self._grant.base_offset} ends inside a batch "
                    f"({self._filled} bytes left over)"
                )
            await self._switch(self._decoded)

    def _take_ready(self) -> list[Record]:
        records, self._ready = self._ready, []
        return records

    def _take_stored(self, end: int) -> bytes | bytearray:
        """The stored batches holding offsets from ``_handed`` below ``end``, handed out as
        they were stored (no copy when they are all there is); keeps the one reaching past
        ``end``, and those after it."""
        batches = self._stored_batches
        count = sum(1 for b in batches if b[0] < end)  # a prefix: batches are in order
        if not count:
            return b""
        self._handed = min(end, batches[count - 1][1])
        stored = self._stored
        taken = stored if count == len(batches) else stored[: batches[count][2]]
        kept = [b for b in batches if b[1] > self._handed]
        start = kept[0][2] if kept else len(stored)
        self._stored = stored[start:]
        self._stored_batches = [(base, after, at - start) for base, after, at in kept]
        return taken

    def _next_read_size(self) -> int:
        """``read_size``, or what completes the batch whose header is in the buffer."""
        peek = peek_offset_and_size(self._buffer.buf[: self._filled])
        if peek is None:
            return self._read_size
        return max(self._read_size, peek[1] - self._filled)

    def _reserve(self, size: int) -> None:
        """Room for ``size`` more bytes after the buffered ones (a bigger buffer if needed)."""
        needed = self._filled + size
        if needed <= self._buffer.length:
            return
        if needed > self._length:
            raise RdmaConsumeError(f"a read of {needed} bytes; the segment has {self._length}")
        grown = self._pd.allocate(max(needed, 2 * self._buffer.length), Access.LOCAL_WRITE)
        grown.buf[: self._filled] = self._buffer.buf[: self._filled]
        self._buffer.deregister()
        self._buffer = grown

    def _take_batches(self) -> None:
        """Take the whole batches at the buffer's start (decoded, or as they are with
        batches=True) and keep the partial one."""
        view = self._buffer.buf
        position = 0
        while self._filled - position >= LOG_OVERHEAD:
            peek = peek_offset_and_size(view, position)
            assert peek is not None
            size = peek[1]
            if not HEADER_SIZE <= size <= self._length:
                raise RdmaConsumeError(
                    f"a batch of {size} bytes in segment {self._grant.base_offset}"
                )
            if position + size > self._filled:
                break
            try:
                header = read_header(view, position, position + size)
                verify_crc(view, position, header)
                if self._batches:
                    if header.next_offset > self._decoded:
                        batch_at = (header.base_offset, header.next_offset, len(self._stored))
                        self._stored_batches.append(batch_at)
                        self._stored += view[position : position + size]
                elif header.next_offset > self._decoded:
                    if self._isolation == READ_COMMITTED:
                        self._take_committed(view, position, header)
                    elif not header.is_control:
                        batch = decode_records(view, position, header)
                        self._ready += (r for r in batch if r.offset >= self._decoded)
            except RecordError as error:
                raise RdmaConsumeError(f"corrupt batch read over RDMA: {error}") from error
            self._decoded = max(self._decoded, header.next_offset)
            position += size
        if position:
            left = self._filled - position
            view[:left] = view[position : self._filled]
            self._filled = left

    def _take_committed(self, view: memoryview, position: int, header: BatchHeader) -> None:
        """read_committed: return the batch's records, hold them behind what is held or
        until their transaction is decided, or, for a marker, decide its producer's."""
        producer_id = header.producer_id
        if header.is_control:
            if producer_id not in self._undecided:
                return  # its transaction began before this consumer's start: nothing held
            records = decode_records(view, position, header)
            kind = control_type(records[0].key if records else None)
            if kind not in (ABORT, COMMIT):
                return  # as Kafka's consumer, a control type it does not know decides nothing
            self._undecided.discard(producer_id)
            self._held = [
                (DECIDED, first, records) if held == producer_id else (held, first, records)
                for held, first, records in self._held
                if held != producer_id or kind == COMMIT
            ]
            decided = 0
            for held, _, records in self._held:
                if held != DECIDED:
                    break
                self._ready += records
                decided += 1
            del self._held[:decided]
            return
        records = [r for r in decode_records(view, position, header) if r.offset >= self._decoded]
        if header.is_transactional:
            self._undecided.add(producer_id)
            self._held.append((producer_id, max(header.base_offset, self._decoded), records))
        elif self._held:
            self._held.append((DECIDED, max(header.base_offset, self._decoded), records))
        else:
            self._ready += records

    async def _read_slot(self) -> Slot:
        grant = self._grant
        for _ in range(TORN_RETRIES):
            await self._read(
                SLOT_WR,
                self._slot.sge(0, SLOT_SIZE),
                grant.slot_addr + grant.slot_index * SLOT_SIZE,
                grant.slot_rkey,
            )
            slot = read_slot(self._slot.buf)
            if slot is not None:
                return slot
        # Not torn: the slot no longer holds what the grant said (freed under us). Start
        # over from the position as after a lost queue pair; nothing is lost or repeated.
        raise _LostQueuePair("the metadata slot never read whole")

    async def _read(self, wr_id: int, local: Sge, remote_addr: int, rkey: int) -> None:
        assert self._qp is not None
        try:
            self._qp.post_read(wr_id, local, remote_addr, rkey)
        except RdmaError as error:
            raise _LostQueuePair(f"READ not posted: {error}") from None
        completion = self._completed() or await self._completion()
        if not completion.ok:
            raise _LostQueuePair(f"READ failed: {completion.status.name}")

    def _completed(self) -> WorkCompletion | None:
        """The current queue pair's completion if it is there already (shm completes a
        READ before post returns), skipping a lost queue pair's leftovers; else None."""
        assert self._qp is not None
        while completions := self._cq.poll(1, timeout=0):
            if completions[0].qp_num == self._qp.qp_num:
                return completions[0]
        return None

    async def _completion(self) -> WorkCompletion:
        """The next completion of the current queue pair (one op is out at a time)."""
        assert self._qp is not None
        deadline = time.monotonic() + self._timeout
        spin_until = time.perf_counter() + SPIN_SECONDS
        while True:
            if time.perf_counter() < spin_until:
                found = self._completed()
                if found is not None:
                    return found
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _LostQueuePair("no completion in time")
            completions = await self._cq.poll_async(1, min(remaining, 0.5))
            for completion in completions:
                if completion.qp_num == self._qp.qp_num:
                    return completion

    # Segments ------------------------------------------------------------------------

    async def _connect(self) -> None:
        """A new queue pair, a new consumer id and the segment holding ``position``."""
        if self._qp is not None:
            self._qp.close()
            self._qp = None
        self._consumer_id = NEW_CONSUMER
        grant = await self._access(self._decoded)
        try:
            qp = self._pd.connect(
                grant.conn_info, self._cq, QpCaps(max_send_wr=2, max_recv_wr=1), timeout=5.0
            )
        except (RdmaError, ValueError) as error:
            await self.close()
            raise RdmaConsumeError(f"RDMA connect failed: {error}", retriable=True) from error
        self._qp = qp
        self._slot.buf[:8] = self._consumer_id.to_bytes(8, "little")
        try:
            qp.post_write_with_imm(
                BIND_WR, self._slot.sge(0, 8), grant.bind_addr, grant.bind_rkey, self._consumer_id
            )
            completion = self._completed() or await self._completion()
        except (RdmaError, _LostQueuePair) as error:
            raise await self._fail(f"bind failed: {error}", retriable=True) from None
        if not completion.ok:
            raise await self._fail(f"bind refused: {completion.status.name}", retriable=True)
        self._take(grant)

    async def _switch(self, offset: int) -> None:
        """Move to the segment holding ``offset`` and release the one left."""
        left = self._grant.base_offset
        grant = await self._access(offset)
        if grant.base_offset != left:
            await self._release(left)
        self._take(grant)

    def _take(self, grant: RdmaConsumeResponse) -> None:
        self._grant = grant
        self._addr, self._rkey, self._length = grant.addr, grant.rkey, grant.length
        self._read_position = grant.position
        self._readable_end, self._mutable = grant.readable_end, grant.mutable
        self._filled = 0

    async def _access(self, offset: int) -> RdmaConsumeResponse:
        grant = await self._exchange(
            RdmaConsumeRequest(
                self.topic,
                self.partition,
                ACCESS,
                self._consumer_id,
                offset,
                tuple(resolve_provider(self._provider).split("+")),
                self._isolation,
            )
        )
        if grant.error_code != ErrorCode.NONE:
            raise await self._fail(
                f"RDMA read access to {self.topic}-{self.partition} at offset {offset} "
                f"refused: {grant.error_message}",
                grant.error_code,
            )
        self._consumer_id = grant.consumer_id
        return grant

    async def _release(self, base_offset: int) -> None:
        answer = await self._exchange(
            RdmaConsumeRequest(self.topic, self.partition, RELEASE, self._consumer_id, base_offset)
        )
        if answer.error_code != ErrorCode.NONE:
            raise await self._fail(
                f"release of segment {base_offset} refused: {answer.error_message}",
                answer.error_code,
            )

    async def _exchange(self, request: RdmaConsumeRequest) -> RdmaConsumeResponse:
        assert self._connection is not None
        correlation_id = self._connection.next_correlation_id()
        try:
            frame = await asyncio.wait_for(
                self._connection.exchange(request_frame(request, correlation_id, self._client_id)),
                self._timeout,
            )
            return decode_response_frame(frame, correlation_id)
        except (OSError, TimeoutError, RecordError) as error:
            message = f"RdmaConsume request failed: {error!r}"
            raise await self._fail(message, retriable=True) from error

    async def _fail(
        self, message: str, code: int | None = None, *, retriable: bool | None = None
    ) -> RdmaConsumeError:
        await self.close()
        return RdmaConsumeError(message, code, retriable=retriable)

    async def close(self) -> None:
        """Let everything go (the broker releases what this consumer held when its queue
        pair disconnects); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._connection is not None:
            await self._connection.close()
        if self._context is not None:
            self._context.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
