"""Log compaction, Kafka's cleanup.policy=compact: of every key only its latest record stays.

One pass cleans one log and starts no thread (LogManager.clean_compacted drives it from the
broker's housekeeping, on a worker thread):

1. `find_cleanable`: the cleanable segments run from the log start up to the first
   uncleanable offset, the base of the first segment that is the head, holds offsets at or
   above the high watermark, or holds records younger than min.compaction.lag.ms. The dirty
   part starts at the cleaner checkpoint (`cleaner-offset-checkpoint`, see docs/formats.md).
   A log is due when dirty bytes / cleanable bytes reach min.cleanable.dirty.ratio, or when
   its oldest dirty segment began longer than max.compaction.lag.ms ago.
2. `clean` maps key -> offset of its latest record over the dirty part, at most `max_keys`
   keys (each stands as a 128-bit BLAKE2b digest; a full map ends at a batch boundary and
   the next pass goes on from there), then rewrites the cleanable segments below where the
   map ends, in groups that fit one segment, and swaps each group in
   (PartitionLog.replace_segments) in offset order. The checkpoint moves once all are in.

What a rewritten batch keeps, as Kafka's cleaner does:
- a keyed record unless a later record has the same key; records without a key are dropped
  (a produce to a compacted topic must refuse them: see validator.py);
- a tombstone (null value) until its batch's max timestamp is delete.retention.ms old
  (Kafka counts from when its segment was first cleaned; batch time is simpler);
- a control batch whole.
Retained records keep their offsets and their bytes. A batch that lost records is rebuilt
with its header fields (base offset, lastOffsetDelta, partition leader epoch, attributes,
base timestamp, producer id, epoch and base sequence), its retained records compressed
again with its own codec, and count, max timestamp (under CreateTime) and CRC recomputed:
offsets become sparse but each batch still ends where it did, so the log end, log start and
leader epochs never change. A batch left without records is dropped unless it is the last
data batch of its producer id below the high watermark: that one stays, empty (no codec,
both timestamps its max timestamp, like Kafka's), so the producer's sequence state
survives restarts. The first segment always stays, empty if need be, so the log start does
not move; any other group left empty is dropped rather than swapped.

A tombstone goes only in the same swap as every older record of its key, or after them
(swaps run in offset order and a pass that meets a changed log stops), so a crash between
swaps never brings a deleted key back.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
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
    raw_records,
    read_header,
    records_area,
    rewrite_header,
)
from directlog.records.compression import Compression, compress
from directlog.records.varint import Buffer
from directlog.topic_config import LogConfig
from services.broker.storage.log import PartitionLog
from services.broker.storage.segment import CLEANED_SUFFIX, LogSegment
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
    end: int  # the first uncleanable offset
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
    start, log_end = log.log_start_offset, log.log_end_offset
    young = now_ms - config.min_compaction_lag_ms
    count = 0
    for segment in segments[:-1]:
        if segment.next_offset > high_watermark or log.layout.in_memory(segment):
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
    try:
        offsets, map_end = _map_keys(cleanable, max_keys, stop)
        todo = [(s, size) for s, size in cleanable.segments if s.base_offset < map_end]
        last_batches = _last_data_batches(
            [s for s, _ in cleanable.segments] + cleanable.later, cleanable.high_watermark
        )
        rules = _Rules(offsets, map_end, now_ms - config.delete_retention_ms, last_batches)
        for index, group in enumerate(_groups(todo, config)):
            # Only the log's first segment stays when empty, so the log start cannot move.
            cleaned = _write_group(
                log.directory, group, rules, config, now_ms, result, stop, keep_empty=index == 0
            )
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
    cleanable: Cleanable, max_keys: int, stop: Callable[[], bool]
) -> tuple[dict[bytes, int], int]:
    """Key digest -> offset of its latest record in the dirty part, and the offset the
    map covers up to: the first uncleanable offset, or the batch where the map filled up."""
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
            if header.is_control:
                continue
            _, records = _read_records(segment, position, header)
            for record in records:
                if record.key is not None:
                    offsets[_digest(record.key)] = header.base_offset + record.offset_delta
    return offsets, cleanable.end


def _last_data_batches(segments: list[LogSegment], high_watermark: int) -> dict[int, int]:
    """Producer id -> base offset of its last data batch below the high watermark (above
    it, a batch may still be truncated away)."""
    last: dict[int, int] = {}
    for segment in segments:
        for _, header in segment.headers_from(0):
            if header.next_offset > high_watermark:
                return last
            if header.producer_id >= 0 and not header.is_control:
                last[header.producer_id] = header.base_offset
    return last


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


# Rewriting -------------------------------------------------------------------------------


class _Rules(NamedTuple):
    offsets: dict[bytes, int]
    map_end: int
    delete_horizon: int  # tombstones in batches older than this go
    last_batches: dict[int, int]

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
        return header.producer_id >= 0 and self.last_batches.get(header.producer_id) == (
            header.base_offset
        )


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
        return segment.log.read(position, header.size), header
    data, records = _read_records(segment, position, header)
    kept = [record for record in records if rules.keeps(header, record)]
    result.records_removed += len(records) - len(kept)
    if not kept and not rules.is_last_of_producer(header):
        return None
    if len(kept) == len(records):
        return segment.log.read(position, header.size), header
    rebuilt = _rebuild(header, data, kept)
    return rebuilt, read_header(rebuilt)


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


# The produce path ------------------------------------------------------------------------


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
