"""Reads of a tiered log's remote records for fetches and offset lookups (KIP-405).

A fetch below a partition's local log start is answered from the remote store: the remote
indexes (PartitionLog.remote) say which byte ranges of which objects hold the offsets, the
ranges are read through pyarrow.fs on a bounded pool of threads (Kafka's
remote.log.reader.threads and remote.log.reader.max.pending.tasks), and every batch is
checked before it is served: its CRC, and that the batches are exactly the ones the index
entry promises. The answer is the bytes a local read of the same log would give: whole
batches from the one holding the offset, at most max bytes but at least one.

A fetch waits for its read at most remote.fetch.max.wait.ms, then answers without it; the
read goes on, and the client's next fetch of that offset takes its result. A read covers
whole index entries within the fetch's max bytes (the first at least), so where it ends is
known from the remote index alone: after each read the next READ_AHEAD_RANGES ranges are
read ahead, several in flight, so a consumer catching up finds them waiting and the store
is never idle between two fetches. Reads never run on the event loop, so other consumers
are not held up by one in progress.

Each read also answers the aborted transactions with records in what it read, for
read_committed consumers (KIP-98; Kafka's remote fetch reads the copies' transaction
indexes): those of the `.txnindex` object shipped with each copy it spans, read once and
kept in a bounded cache (copies never change), with those of the partition's local index
(which answers for a copy made before copies shipped one, as far as it still reaches).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.records.batch import decode_records, iter_batches, verify_crc
from directlog.records.errors import CorruptRecordError, RecordError
from directlog.remote import layout
from directlog.remote.index import CorruptIndexError, IndexEntry
from directlog.remote.store import RemoteObjectMissingError, RemoteStore
from directlog.remote.txn_index import AbortedTxn, decode_aborted, overlapping
from directlog.topics import TopicPartition
from services.broker.metrics import BrokerMetrics
from services.broker.storage import PartitionLog
from services.broker.storage.validator import MAX_DECOMPRESSED

log = logging.getLogger(__name__)

T = TypeVar("T")
STALE_SECONDS = 30.0  # a finished read no fetch took is dropped after this long
READ_AHEAD_MAX_BYTES = 8 << 20
READ_AHEAD_RANGES = 2  # ranges read ahead of a catching-up consumer, each its next fetch's
TXN_INDEXES_CACHED = 4096  # copies' aborted transactions kept (most copies have none)


class RemoteDataCorruptError(CorruptRecordError):
    """Remote bytes that are not the batches their index entry promises. CORRUPT_MESSAGE."""


@dataclass(frozen=True, slots=True)
class RemoteRead:
    records: memoryview  # whole batches, from the one holding the offset asked for
    first_offset: int  # base offset of the first batch
    next_offset: int  # the offset after the last batch
    # Aborted transactions with records from the offset asked for to the end of what was
    # read (a trimmed answer keeps them all: a consumer ignores those starting past it);
    # None when a copy's `.txnindex` failed its checks: only read_uncommitted may take it.
    aborted: tuple[AbortedTxn, ...] | None = ()

    @property
    def offsets(self) -> int:
        return max(self.next_offset - self.first_offset, 0)


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[RemoteRead]
    started: float
    max_bytes: int


class RemoteReader:
    def __init__(
        self, store: RemoteStore, threads: int, max_pending: int, metrics: BrokerMetrics
    ) -> None:
        self.store = store
        self.metrics = metrics
        self._max_pending = max_pending
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="remote-read")
        self._pending: OrderedDict[tuple[TopicPartition, int], _Pending] = OrderedDict()
        self._reported: set[tuple[TopicPartition, str]] = set()
        # `.txnindex` object key -> its entries (None: a copy that shipped none), least
        # recently used first; the reader threads share it.
        self._txn_indexes: OrderedDict[str, tuple[AbortedTxn, ...] | None] = OrderedDict()
        self._txn_lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # Fetches ---------------------------------------------------------------------------------

    async def read(
        self,
        tp: TopicPartition,
        partition_log: PartitionLog,
        offset: int,
        max_bytes: int,
        *,
        min_one_batch: bool,
        wait: float,
    ) -> RemoteRead | None:
        """Remote records from `offset`; None when they are not read within `wait` seconds
        (the read goes on for the next fetch). Raises KafkaError KAFKA_STORAGE_ERROR when
        the store fails or the remote indexes cannot be trusted (retriable) and
        CORRUPT_MESSAGE for remote data that fails its checks: logged once, never served."""
        self._drop_stale()
        key = (tp, offset)
        pending = self._pending.get(key)
        if pending is None or (pending.future.done() and pending.max_bytes < max_bytes):
            pending = self._start(tp, partition_log, offset, max_bytes)
        try:
            result = await asyncio.wait_for(asyncio.shield(pending.future), wait)
        except TimeoutError:
            return None
        except KafkaError:
            self._pending.pop(key, None)
            raise
        self._pending.pop(key, None)
        result = _trimmed(result, max_bytes, min_one_batch)
        if result.records:
            self._read_ahead(tp, partition_log, result.next_offset, max_bytes)
        return result

    def _start(
        self, tp: TopicPartition, partition_log: PartitionLog, offset: int, max_bytes: int
    ) -> _Pending:
        if len(self._pending) >= self._max_pending:
            raise KafkaError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"{self._max_pending} remote reads already pending; {tp} must wait",
            )
        future = self._in_pool(tp, self._read_blocking, tp, partition_log, offset, max_bytes)
        pending = _Pending(future, time.monotonic(), max_bytes)
        self._pending[(tp, offset)] = pending
        return pending

    def _in_pool(self, tp: TopicPartition, work: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`work` on the reader threads; a failure comes out as the KafkaError a client gets
        (`_failed`). A result no fetch takes (a fetch that stopped waiting) is fine."""

        def guarded() -> T:
            try:
                return work(*args)
            except Exception as error:
                raise self._failed(tp, error) from error

        future = asyncio.get_running_loop().run_in_executor(self._pool, guarded)
        future.add_done_callback(_retrieved)
        return future

    def _read_ahead(
        self, tp: TopicPartition, partition_log: PartitionLog, offset: int, max_bytes: int
    ) -> None:
        """Start reading the next READ_AHEAD_RANGES ranges from `offset` that are remote
        too, while the pool has room."""
        max_bytes = min(max_bytes, READ_AHEAD_MAX_BYTES)
        for _ in range(READ_AHEAD_RANGES):
            if (
                offset >= partition_log.local_log_start_offset
                or len(self._pending) >= self._max_pending // 2
            ):
                return
            if (tp, offset) not in self._pending:
                self._start(tp, partition_log, offset, max_bytes)
            try:
                offset = _entries(partition_log, offset, max_bytes)[-1].last_offset + 1
            except KafkaError:  # not in the remote indexes (yet): its fetch will say so
                return

    def _drop_stale(self) -> None:
        now = time.monotonic()
        while self._pending:
            key, oldest = next(iter(self._pending.items()))
            if now - oldest.started < STALE_SECONDS or not oldest.future.done():
                break
            del self._pending[key]

    def _failed(self, tp: TopicPartition, error: BaseException) -> KafkaError:
        """The error a fetch gets, logged once per partition and kind of fault (called on a
        reader thread)."""
        self.metrics.remote_fetch_errors.labels(tp.topic).inc()
        if isinstance(error, KafkaError):
            code = error.code
        elif isinstance(error, CorruptRecordError):
            code = ErrorCode.CORRUPT_MESSAGE
        else:
            code = ErrorCode.KAFKA_STORAGE_ERROR
        if (tp, code.name) not in self._reported:
            self._reported.add((tp, code.name))
            log.warning("%s: remote read failed (%s): %s", tp, code.name, error)
        return KafkaError(code, f"{tp}: remote read failed: {error}")

    def _read_blocking(
        self, tp: TopicPartition, partition_log: PartitionLog, offset: int, max_bytes: int
    ) -> RemoteRead:
        started = time.perf_counter()
        entries = _entries(partition_log, offset, max_bytes)
        data = self.read_entries(entries)
        aborted: tuple[AbortedTxn, ...] | None
        try:
            aborted = self.aborted_transactions(partition_log, entries, offset)
        except CorruptIndexError as error:
            self._failed(tp, error)  # counted and logged; read_committed fetches get it
            aborted = None
        result = _select(data, offset, entries[-1].last_offset + 1, aborted)
        self.metrics.remote_read_latency.observe(time.perf_counter() - started)
        self.metrics.remote_fetch_requests.labels(tp.topic).inc()
        self.metrics.remote_fetch_bytes.labels(tp.topic).inc(len(result.records))
        self._reported.discard((tp, ErrorCode.KAFKA_STORAGE_ERROR.name))
        return result

    # Aborted transactions ----------------------------------------------------------------------

    def aborted_transactions(
        self, partition_log: PartitionLog, entries: Sequence[IndexEntry], offset: int
    ) -> tuple[AbortedTxn, ...]:
        """The aborted transactions with records among the offsets of `entries` from
        `offset` on, by first offset: from the `.txnindex` of each copy they span and the
        partition's local index (blocking: on a reader thread)."""
        end = entries[-1].last_offset + 1
        found = {
            (t.producer_id, t.first_offset): t
            for t in partition_log.aborted_transactions(offset, end)
        }
        for uri in dict.fromkeys(entry.rdi.uri for entry in entries):
            for txn in overlapping(self._copy_txn_index(uri) or (), offset, end - 1):
                found.setdefault((txn.producer_id, txn.first_offset), txn)
        return tuple(sorted(found.values(), key=lambda t: (t.first_offset, t.producer_id)))

    def _copy_txn_index(self, log_uri: str) -> tuple[AbortedTxn, ...] | None:
        """The entries shipped with the copy whose `.log` is at `log_uri`, cached; None for
        a copy that shipped none. A corrupt object raises CorruptIndexError."""
        key = layout.sibling_key(self.store.key_of(log_uri), layout.TXN_INDEX)
        with self._txn_lock:
            if key in self._txn_indexes:
                self._txn_indexes.move_to_end(key)
                return self._txn_indexes[key]
        entries: tuple[AbortedTxn, ...] | None
        try:
            entries = tuple(decode_aborted(self.store.read_all(key)))
        except RemoteObjectMissingError:
            entries = None
        except CorruptIndexError as error:
            raise CorruptIndexError(f"{key}: {error}") from error
        with self._txn_lock:
            self._txn_indexes[key] = entries
            while len(self._txn_indexes) > TXN_INDEXES_CACHED:
                self._txn_indexes.popitem(last=False)
        return entries

    # Offsets by time ---------------------------------------------------------------------------

    async def offset_for_timestamp(
        self, tp: TopicPartition, partition_log: PartitionLog, timestamp: int, timeout: float
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first remote record at or after `timestamp` from the log
        start on; None when no remote record is that late."""
        work = self._in_pool(tp, self._offset_for_timestamp, partition_log, timestamp)
        try:
            return await asyncio.wait_for(work, timeout)
        except TimeoutError:
            raise KafkaError(
                ErrorCode.REQUEST_TIMED_OUT, f"{tp}: remote offset lookup took over {timeout} s"
            ) from None

    def _offset_for_timestamp(
        self, partition_log: PartitionLog, timestamp: int
    ) -> tuple[int, int] | None:
        remote = partition_log.remote
        if remote is None:
            return None
        start = partition_log.log_start_offset
        entry = remote.entry_for_timestamp(timestamp)
        while entry is not None:
            if entry.last_offset >= start:
                found = _first_at_or_after(self.read_entries([entry]), timestamp, start)
                if found is not None:
                    return found
            following = remote.entries_from(entry.last_offset + 1, 1)
            entry = next((e for e in following if e.last_timestamp >= timestamp), None)
        return None

    # Store reads -------------------------------------------------------------------------------

    def read_entries(self, entries: Sequence[IndexEntry]) -> memoryview:
        """The data of consecutive entries, one ranged read per run of adjoining ranges of
        one object (the usual case is one run: no copy), each entry's batches checked
        against it (RemoteDataCorruptError)."""
        runs: list[list[IndexEntry]] = []
        for entry in entries:
            last = runs[-1][-1] if runs else None
            if last is None or entry.rdi.uri != last.rdi.uri or entry.rdi.position != last.rdi.end:
                runs.append([])
            runs[-1].append(entry)
        data = [self._read_run(run) for run in runs]
        return data[0] if len(data) == 1 else memoryview(b"".join(data))

    def _read_run(self, run: list[IndexEntry]) -> memoryview:
        first = run[0].rdi
        key = self.store.key_of(first.uri)  # OutsideStoreError for an RDI elsewhere
        data = self.store.read(key, first.position, run[-1].rdi.end - first.position)
        position = 0
        for entry in run:
            _check(entry, data, position)
            position += entry.data_length
        return data


def _entries(partition_log: PartitionLog, offset: int, max_bytes: int) -> list[IndexEntry]:
    remote = partition_log.remote
    if remote is None:
        raise KafkaError(
            ErrorCode.KAFKA_STORAGE_ERROR,
            f"{partition_log.directory.name}: no remote indexes to read offset {offset} from",
        )
    entries = remote.entries_from(offset, max_bytes)
    if not entries or entries[0].first_offset > offset:
        # Offsets below the local log start must all be remote: the remote indexes of this
        # replica are behind (its tiering service is still building them). Retriable.
        raise KafkaError(
            ErrorCode.KAFKA_STORAGE_ERROR,
            f"{partition_log.directory.name}: offset {offset} is not in the remote indexes yet",
        )
    # Whole entries within max_bytes (the first in any case): an answer then ends where an
    # entry does, and the next fetch starts a read of its own rather than reading that
    # entry's end again.
    covered = entries[0].data_length
    for count, entry in enumerate(entries[1:], 1):
        covered += entry.data_length
        if covered > max_bytes:
            return entries[:count]
    return entries


def _check(entry: IndexEntry, data: memoryview, position: int) -> None:
    """The entry's range must be whole, CRC-checked batches from its first offset to its
    last, nothing else."""
    end = position + entry.data_length
    first = last = -1
    try:
        walked = position
        for at, header in iter_batches(data, position, end):
            verify_crc(data, at, header)
            if first < 0:
                first = header.base_offset
            last = header.last_offset
            walked = at + header.size
    except (RecordError, CorruptIndexError) as exc:
        raise RemoteDataCorruptError(f"{entry.rdi.uri}: {exc}") from exc
    if walked != end or first != entry.first_offset or last != entry.last_offset:
        raise RemoteDataCorruptError(
            f"{entry.rdi.uri} at {entry.rdi.position}: batches of offsets {first}-{last} in "
            f"{walked - position} bytes, the index says {entry.first_offset}-"
            f"{entry.last_offset} in {entry.data_length}"
        )


def _select(
    data: memoryview, offset: int, end_offset: int, aborted: tuple[AbortedTxn, ...] | None = ()
) -> RemoteRead:
    """The batches from the one holding `offset` on, up to `end_offset` (the offset after
    the last entry's records); all checked already, so only the first entry's batches are
    walked."""
    for at, header in iter_batches(data):
        if header.last_offset >= offset:
            return RemoteRead(data[at:], header.base_offset, end_offset, aborted)
    return RemoteRead(memoryview(b""), -1, -1)


def _trimmed(read: RemoteRead, max_bytes: int, min_one_batch: bool) -> RemoteRead:
    """Whole batches within `max_bytes` (at least one with `min_one_batch`), as a local
    read cuts them."""
    if len(read.records) <= max_bytes:
        return read
    end = 0
    next_offset = read.first_offset
    for at, header in iter_batches(read.records):
        if at + header.size > max_bytes and (end > 0 or not min_one_batch):
            break
        end = at + header.size
        next_offset = header.next_offset
    if end == 0:
        return RemoteRead(memoryview(b""), -1, -1)
    return RemoteRead(read.records[:end], read.first_offset, next_offset, read.aborted)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _first_at_or_after(data: memoryview, timestamp: int, start: int) -> tuple[int, int] | None:
    for at, header in iter_batches(data):
        if header.max_timestamp < timestamp or header.last_offset < start:
            continue
        for record in decode_records(data, at, header, MAX_DECOMPRESSED):
            if record.timestamp >= timestamp and record.offset >= start:
                return record.offset, record.timestamp
    return None
