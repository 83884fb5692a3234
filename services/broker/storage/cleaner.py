"""Log compaction, Kafka's cleanup.policy=compact: of every key only its latest record stays.

One pass cleans one log and starts no thread (LogManager.clean_compacted drives it from the
broker's housekeeping, on a worker thread):

1. `find_cleanable`: the cleanable segments run from the log start up to the first
   uncleanable offset, the base of the first segment that is the head, holds offsets at or
   above the last stable offset (so an open or unreplicated transaction is never cleaned,
   and everything cleaned is decided), or holds records younger than min.compaction.lag.ms.
   The dirty part starts at the cleaner checkpoint (`cleaner-offset-checkpoint`, see
   docs/formats.md). A log is due when dirty bytes / cleanable bytes reach
   min.cleanable.dirty.ratio, or when its oldest dirty segment began longer than
   max.compaction.lag.ms ago.
2. `clean` maps key -> offset of its latest committed record over the dirty part, at most
   `max_keys` keys (each stands as a 128-bit BLAKE2b digest; a full map ends at a batch
   boundary and the next pass goes on from there), then rewrites the cleanable segments
   below where the map ends, in groups that fit one segment, and swaps each group in
   (PartitionLog.replace_segments) in offset order. The checkpoint moves once all are in.

Transactions (KIP-98): a data batch of an aborted transaction (the log's aborted-transaction
index says which: producer id, first offset, ABORT marker offset) never enters the key map,
so an aborted write cannot shadow an older committed value of its key (in
`__consumer_offsets` too, where aborted TxnOffsetCommits are offset commits), and none of its
records is kept.

What a rewritten batch keeps, as Kafka's cleaner does:
- a keyed record unless a later committed record has the same key; records without a key
  are dropped (a produce to a compacted topic must refuse them: see validator.py);
- a tombstone (null value) until its batch's max timestamp is delete.retention.ms old
  (Kafka counts from when its segment was first cleaned; batch time is simpler);
- a transaction marker until its batch is delete.retention.ms old and no batch of its
  transaction is left: a COMMIT marker goes in a pass that kept no batch of its
  transaction, an ABORT marker in a pass that kept none and found none in the marker's own
  group (its index entry is dropped first, see below); a producer's last marker stays when
  it carries a newer producer epoch than the producer's last data batch (a fencing abort's
  bumped epoch, which later appends are checked against); any other control batch whole.
Retained records keep their offsets and their bytes. A batch that lost records is rebuilt
with its header fields (base offset, lastOffsetDelta, partition leader epoch, attributes,
base timestamp, producer id, epoch and base sequence), its retained records compressed
again with its own codec, and count, max timestamp (under CreateTime) and CRC recomputed:
offsets become sparse but each batch still ends where it did, so the log end, log start and
leader epochs never change. A batch left without records (an aborted one always is) is
dropped unless it is the last data batch of its producer id below the high watermark: that
one stays, empty (no codec, both timestamps its max timestamp, like Kafka's), so the
producer's sequence state survives restarts, and it keeps its transaction's marker. The
first segment always stays, empty if need be, so the log start does not move; any other
group left empty is dropped rather than swapped.

A crash between swaps leaves the log partly cleaned, never wrong:
- a tombstone goes only in the same swap as every older record of its key, or after them
  (swaps run in offset order and a pass that meets a changed log stops), so a deleted key
  never comes back;
- a marker goes only in the swap of the group holding it, after every batch of its
  transaction went in an earlier swap or the same one, so no transaction is left without
  its end (the replayed producer state would hold it open);
- an ABORT marker's index entry is dropped durably before the swap that removes the
  marker, and only once no batch of the transaction is left on disk: a crash in between
  (or a swap that finds the log changed) leaves a marker without an entry, which consumers
  pass over, never aborted records without their entry (read_committed consumers would see
  them) nor an entry without its marker (they would skip the producer's later transactions
  up to its next ABORT).
"""

from __future__ import annotations

import bisect
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from directlog.durable_files import write_atomically
from directlog.records.batch import (
    COMPRESSION_MASK,
    HEADER_SIZE,
    MIN_BATCH_LENGTH,
    NO_TIMESTAMP,
    BatchHeader,
    RawRecord,
    TimestampType,
    decode_records,
    raw_records,
    read_header,
    records_area,
    rewrite_header,
)
from directlog.records.compression import Compression, compress
from directlog.records.markers import ABORT, COMMIT, control_type
from directlog.records.varint import Buffer
from directlog.topic_config import LogConfig
from services.broker.storage.log import PartitionLog
from services.broker.storage.segment import CLEANED_SUFFIX, LogSegment
from services.broker.storage.txn_index import AbortedTxn
from services.broker.storage.validator import MAX_DECOMPRESSED

log = logging.getLogger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
# Keys mapped per pass: about 30 MiB of Python dict (Kafka's 128 MiB dedupe buffer holds ~5M).
DEFAULT_MAX_KEYS = 1 << 18
_CHECKPOINT_VERSION = "0"
_INT32_MAX = (1 << 31) - 1

Segments = list[tuple[LogSegment, int]]  # segments with the sizes a pass reads of them


class Cleanable(NamedTuple):
    """What a pass over a log may clean, found by `find_cleanable`."""

    segments: Segments  # from the log's first segment, never the head
    later: list[LogSegment]  # the rest of the log, read only for producers' last batches
    high_watermark: int
    first_dirty: int  # the cleaner checkpoint, kept within the log
    end: int  # the first uncleanable offset, at or below the last stable offset
    dirty_bytes: int
    total_bytes: int
    overdue: bool  # dirty data older than max.compaction.lag.ms
    min_dirty_ratio: float

    @property
    def dirty_ratio(self) -> float:
        return self.dirty_bytes / self.total_bytes

    @property
    def due(self) -> bool:
        return self.overdue or self.dirty_ratio >= self.min_dirty_ratio


@dataclass(slots=True)
class CleanResult:
    """What a pass did, for the log line and the tests."""

    complete: bool  # False: the log changed under the pass, or it was stopped; swaps stand
    cleaned_to: int  # the checkpoint the pass moved to (when complete)
    bytes_before: int = 0  # of the segments rewritten
    bytes_after: int = 0
    records_removed: int = 0


class _Stopped(Exception):
    """The caller asked a pass to stop (the log manager closes or deletes logs)."""


def find_cleanable(log: PartitionLog, now_ms: int) -> Cleanable | None:
    """What a pass over `log` may clean now; None unless it is compacted and something
    cleanable is dirty. A Cleanable that is not `due` waits for more dirty data."""
    config = log.config
    if not config.compact:
        return None
    segments = log.segments
    high_watermark = log.high_watermark
    stable = log.last_stable_offset  # at or below the high watermark
    start, log_end = log.log_start_offset, log.log_end_offset
    young = now_ms - config.min_compaction_lag_ms
    count = 0
    for segment in segments[:-1]:
        if segment.next_offset > stable or log.layout.in_memory(segment):
            break  # (a segment still in the head directory is cleaned once written back)
        lag_applies = config.min_compaction_lag_ms > 0 and not segment.is_empty()
        if lag_applies and segment.largest_timestamp() > young:
            break
        count += 1
    if count == 0:
        return None
    cleanable = [(segment, segment.size) for segment in segments[:count]]
    first_dirty = read_checkpoint(log.directory)
    if first_dirty > log_end:  # the log was cut or restarted below it
        first_dirty = start
    first_dirty = max(first_dirty, start)
    dirty = [segment for segment, _ in cleanable if segment.next_offset > first_dirty]
    dirty_bytes = sum(segment.size for segment in dirty)
    if dirty_bytes == 0:
        return None
    began = dirty[0].first_batch_timestamp
    if began == NO_TIMESTAMP:
        began = dirty[0].largest_timestamp()
    return Cleanable(
        cleanable,
        segments[count:],
        high_watermark,
        first_dirty,
        segments[count].base_offset,
        dirty_bytes,
        sum(size for _, size in cleanable),
        now_ms - began > config.max_compaction_lag_ms,
        config.min_cleanable_dirty_ratio,
    )


def clean(
    log: PartitionLog,
    cleanable: Cleanable,
    now_ms: int,
    *,
    max_keys: int = DEFAULT_MAX_KEYS,
    stop: Callable[[], bool] = lambda: False,
) -> CleanResult:
    """One pass over `log` (see the module docstring). Blocking and long: run it off the
    event loop. `stop` is polled between batches; when it answers True the pass ends,
    keeping the swaps already made. Read errors (a corrupt batch) raise."""
    assert max_keys > 0
    config = log.config
    result = CleanResult(False, cleanable.first_dirty)
    start = cleanable.segments[0][0].base_offset
    aborted = _AbortedRanges(log.aborted_transactions(start, cleanable.end))
    try:
        offsets, map_end = _map_keys(cleanable, aborted, max_keys, stop)
        todo = [(s, size) for s, size in cleanable.segments if s.base_offset < map_end]
        last_data, last_markers = _last_batches(
            [s for s, _ in cleanable.segments] + cleanable.later, cleanable.high_watermark
        )
        rules = _Rules(
            offsets,
            map_end,
            now_ms - config.delete_retention_ms,
            last_data,
            last_markers,
            aborted,
        )
        for index, group in enumerate(_groups(todo, config)):
            # Only the log's first segment stays when empty, so the log start cannot move.
            cleaned = _write_group(
                log.directory, group, rules, config, now_ms, result, stop, keep_empty=index == 0
            )
            if rules.forget:  # before the swap: see the module docstring
                log.forget_aborted(rules.forget)
                rules.forget = []
            if not log.replace_segments(
                [s for s, _ in group], [size for _, size in group], cleaned
            ):
                return result
            result.bytes_after += 0 if cleaned is None else cleaned.size
    except _Stopped:
        return result
    write_checkpoint(log.directory, map_end)
    result.complete, result.cleaned_to = True, map_end
    return result


# Mapping keys ----------------------------------------------------------------------------


def _map_keys(
    cleanable: Cleanable, aborted: _AbortedRanges, max_keys: int, stop: Callable[[], bool]
) -> tuple[dict[bytes, int], int]:
    """Key digest -> offset of its latest committed record in the dirty part, and the
    offset the map covers up to: the first uncleanable offset, or the batch where the map
    filled up."""
    offsets: dict[bytes, int] = {}
    first_dirty = cleanable.first_dirty
    for segment, size in cleanable.segments:
        if segment.next_offset <= first_dirty:
            continue
        for position, header in segment.headers_from(0, size):
            if header.next_offset <= first_dirty:
                continue
            if offsets and len(offsets) + header.records_count > max_keys:
                return offsets, header.base_offset
            if stop():
                raise _Stopped
            if header.is_control or aborted.holds(header):
                continue
            _, records = _read_records(segment, position, header)
            for record in records:
                if record.key is not None:
                    offsets[_digest(record.key)] = header.base_offset + record.offset_delta
    return offsets, cleanable.end


def _last_batches(
    segments: list[LogSegment], high_watermark: int
) -> tuple[dict[int, int], dict[int, int]]:
    """Producer id -> base offset of its last data batch below the high watermark (above
    it, a batch may still be truncated away), and producer id -> base offset of its last
    marker there when that comes after its last data batch with a newer producer epoch
    (or the producer has no data batch): the batches that hold its sequence and epoch."""
    data: dict[int, int] = {}
    data_epochs: dict[int, int] = {}
    markers: dict[int, int] = {}
    for segment in segments:
        for _, header in segment.headers_from(0):
            if header.next_offset > high_watermark:
                return data, markers
            producer_id = header.producer_id
            if producer_id < 0:
                continue
            if not header.is_control:
                data[producer_id] = header.base_offset
                data_epochs[producer_id] = header.producer_epoch
                markers.pop(producer_id, None)
            elif header.producer_epoch > data_epochs.get(producer_id, -1):
                markers[producer_id] = header.base_offset
            else:
                markers.pop(producer_id, None)
    return data, markers


class _AbortedRanges:
    """The aborted transactions of the range a pass cleans, as producer id -> the offsets
    [first batch, ABORT marker] of each of its aborted transactions, in offset order (a
    producer has one transaction open at a time, so its ranges never overlap)."""

    def __init__(self, entries: list[AbortedTxn]) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        for entry in entries:
            self._ranges.setdefault(entry.producer_id, []).append(
                (entry.first_offset, entry.last_offset)
            )
        for ranges in self._ranges.values():
            ranges.sort()

    def holds(self, header: BatchHeader) -> bool:
        """Whether a data batch belongs to an aborted transaction."""
        if not header.is_transactional or header.is_control:
            return False
        ranges = self._ranges.get(header.producer_id)
        if not ranges:
            return False
        at = bisect.bisect_right(ranges, header.base_offset, key=lambda r: r[0]) - 1
        return at >= 0 and header.base_offset <= ranges[at][1]


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


# Rewriting -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Rules:
    """What a pass keeps, and the transactions it has met so far (batches are fed to it
    in offset order)."""

    offsets: dict[bytes, int]
    map_end: int
    delete_horizon: int  # tombstones and markers in batches older than this may go
    last_data: dict[int, int]  # see _last_batches
    last_markers: dict[int, int]
    aborted: _AbortedRanges
    # Producer ids whose current transaction had a batch kept by this pass, or read in
    # the group being written (its swap has not happened yet).
    kept_txn: set[int] = field(default_factory=set)
    txn_in_group: set[int] = field(default_factory=set)
    # ABORT markers the group being written drops: their index entries go before its swap.
    forget: list[int] = field(default_factory=list)

    def keeps(self, header: BatchHeader, record: RawRecord) -> bool:
        if record.key is None:
            return False
        offset = header.base_offset + record.offset_delta
        latest = self.offsets.get(_digest(record.key))
        if latest is not None and latest > offset:
            return False
        # Past the map's end a record's key may have later records the map has not seen.
        return not (
            record.tombstone
            and offset < self.map_end
            and header.max_timestamp < self.delete_horizon
        )

    def is_last_of_producer(self, header: BatchHeader) -> bool:
        return header.producer_id >= 0 and self.last_data.get(header.producer_id) == (
            header.base_offset
        )

    def data_batch(self, header: BatchHeader, kept: bool) -> None:
        if header.is_transactional:
            self.txn_in_group.add(header.producer_id)
            if kept:
                self.kept_txn.add(header.producer_id)

    def keeps_control(self, header: BatchHeader, kind: int | None) -> bool:
        """Whether the control batch stays (`kind`: its ControlRecordType, None without a
        record); a dropped ABORT marker is added to `forget`."""
        producer_id = header.producer_id
        kept_txn = producer_id in self.kept_txn
        in_group = producer_id in self.txn_in_group
        self.kept_txn.discard(producer_id)
        self.txn_in_group.discard(producer_id)
        if (
            kind not in (ABORT, COMMIT)
            or kept_txn
            or (kind == ABORT and in_group)
            or header.max_timestamp >= self.delete_horizon
            or self.last_markers.get(producer_id) == header.base_offset
        ):
            return True
        if kind == ABORT:
            self.forget.append(header.base_offset)
        return False


def _groups(segments: Segments, config: LogConfig) -> list[Segments]:
    """Consecutive segments grouped so that each group's cleaned segment fits segment.bytes
    and segment.index.bytes even if nothing is removed, and its offsets fit the index's
    32-bit relative offsets."""
    groups: list[Segments] = []
    for segment, size in segments:
        if groups:
            group = groups[-1]
            if (
                sum(n for _, n in group) + size <= config.segment_bytes
                and sum(s.offset_index.size_bytes for s, _ in group)
                + segment.offset_index.size_bytes
                <= config.segment_index_bytes
                and segment.next_offset - 1 - group[0][0].base_offset <= _INT32_MAX
            ):
                group.append((segment, size))
                continue
        groups.append([(segment, size)])
    return groups


def _write_group(
    directory: Path,
    group: Segments,
    rules: _Rules,
    config: LogConfig,
    now_ms: int,
    result: CleanResult,
    stop: Callable[[], bool],
    *,
    keep_empty: bool,
) -> LogSegment | None:
    """The cleaned segment for `group`, flushed, still under its `.cleaned` names; None if
    it would be empty and not `keep_empty`."""
    cleaned = LogSegment.create(
        directory,
        group[0][0].base_offset,
        index_interval=config.index_interval_bytes,
        now_ms=now_ms,
        capacity=None,
        suffix=CLEANED_SUFFIX,
    )
    rules.txn_in_group.clear()
    try:
        for segment, size in group:
            result.bytes_before += size
            for position, header in segment.headers_from(0, size):
                if stop():
                    raise _Stopped
                kept = _clean_batch(segment, position, header, rules, result)
                if kept is not None:
                    cleaned.append_batch(*kept)
        if cleaned.is_empty() and not keep_empty:
            cleaned.delete()
            return None
        cleaned.on_inactive()
        cleaned.flush()
    except BaseException:
        cleaned.delete()
        raise
    return cleaned


def _clean_batch(
    segment: LogSegment, position: int, header: BatchHeader, rules: _Rules, result: CleanResult
) -> tuple[bytes, BatchHeader] | None:
    """The batch as it goes into the cleaned segment (itself, rebuilt, or empty), or None."""
    if header.is_control:
        raw = segment.log.read(position, header.size)
        if rules.keeps_control(header, _control_kind(raw, header)):
            return raw, header
        result.records_removed += header.records_count
        return None
    data: Buffer = b""
    kept: list[RawRecord] = []
    if rules.aborted.holds(header):
        count = header.records_count  # no record of it is read: none stays
    else:
        data, records = _read_records(segment, position, header)
        kept = [record for record in records if rules.keeps(header, record)]
        count = len(records)
    result.records_removed += count - len(kept)
    if not kept and not rules.is_last_of_producer(header):
        rules.data_batch(header, kept=False)
        return None
    rules.data_batch(header, kept=True)
    if len(kept) == count:
        return segment.log.read(position, header.size), header
    rebuilt = _rebuild(header, data, kept)
    return rebuilt, read_header(rebuilt)


def _control_kind(raw: bytes, header: BatchHeader) -> int | None:
    """The ControlRecordType of the control batch `raw`; None when it has no record."""
    for record in decode_records(raw, 0, header):
        return control_type(record.key)
    return None


def _read_records(
    segment: LogSegment, position: int, header: BatchHeader
) -> tuple[Buffer, list[RawRecord]]:
    area = records_area(segment.log.read(position, header.size), 0, header, MAX_DECOMPRESSED)
    return area, raw_records(area, header.records_count)


def _rebuild(header: BatchHeader, data: Buffer, kept: list[RawRecord]) -> bytes:
    """The batch of `header` holding only `kept` (records of its records area `data`),
    every other header field as it was (see the module docstring)."""
    if kept:
        body = b"".join(data[r.start : r.end] for r in kept)
        codec = header.compression
        payload = body if codec is Compression.NONE else compress(codec, body)
        attributes = header.attributes
        base_timestamp = header.base_timestamp
        max_timestamp = header.max_timestamp
        if header.timestamp_type is TimestampType.CREATE_TIME:
            max_timestamp = base_timestamp + max(r.timestamp_delta for r in kept)
    else:
        payload = b""
        attributes = header.attributes & ~COMPRESSION_MASK
        base_timestamp = max_timestamp = header.max_timestamp
    resized = header._replace(
        batch_length=MIN_BATCH_LENGTH + len(payload),
        base_timestamp=base_timestamp,
        records_count=len(kept),
    )
    fields = rewrite_header(
        bytes(HEADER_SIZE) + payload,
        0,
        resized,
        base_offset=header.base_offset,
        leader_epoch=header.partition_leader_epoch,
        attributes=attributes,
        max_timestamp=max_timestamp,
    )
    return fields + payload


# The checkpoint --------------------------------------------------------------------------


def read_checkpoint(directory: Path) -> int:
    """The offset below which the log has been cleaned at least once: 0 if the file is
    missing or malformed (cleaning from the log start again is always safe)."""
    path = directory / CLEANER_CHECKPOINT
    try:
        fields = path.read_text(encoding="ascii").split("\n")
        if len(fields) == 3 and fields[0] == _CHECKPOINT_VERSION and not fields[2]:
            return int(fields[1])
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return 0
    log.warning("ignoring malformed %s", path)
    return 0


def write_checkpoint(directory: Path, offset: int) -> None:
    write_atomically(
        directory / CLEANER_CHECKPOINT, f"{_CHECKPOINT_VERSION}\n{offset}\n".encode("ascii")
    )
