"""Validation and offset assignment for appends, without I/O.

Both append paths run through `plan_append`: a TCP produce validates the request buffer,
an RDMA-style producer's bytes are validated where they already lie in the mapped head
segment. The plan says, per batch, the offsets it takes and whether its header must be
rewritten (LogAppendTime, or a max timestamp that disagrees with the records); the log
then writes or stamps accordingly. Nothing here touches the log, so a rejected buffer leaves
it byte-for-byte unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

from directlog.records.batch import (
    CONTROL_FLAG,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_FLAG,
    CheckedBatch,
    TimestampType,
    check_batch,
    raw_records,
    read_header,
    recompress_batch,
    records_area,
    rewrite_header,
    scan_records,
    verify_crc,
)
from directlog.records.compression import Compression
from directlog.records.errors import InvalidRecordError
from directlog.records.varint import Buffer
from directlog.topic_config import LogConfig
from services.broker.storage.errors import InvalidTimestampError, MessageTooLargeError

MAX_DECOMPRESSED = 64 << 20  # bound on the inflated records of one compressed batch


class BatchPlan(NamedTuple):
    position: int  # in the validated buffer
    size: int
    base_offset: int
    last_offset: int
    records: int
    max_timestamp: int
    header: bytes | None  # a rewritten 61-byte header, or None: stamp offset and epoch only


class AppendPlan(NamedTuple):
    batches: list[BatchPlan]
    first_offset: int  # base offset of the first batch
    last_offset: int  # last offset of the last batch
    size: int
    records: int
    max_timestamp: int
    stamp: bool  # False for replicated batches, written exactly as the leader has them
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    # Replicated batches only: (partition leader epoch, base offset) of each batch whose
    # epoch is above every earlier one in the buffer, for the leader epoch cache.
    epoch_starts: list[tuple[int, int]]


def plan_append(
    buf: Buffer,
    *,
    next_offset: int,
    leader_epoch: int,
    config: LogConfig,
    now_ms: int,
    assign_offsets: bool,
) -> AppendPlan:
    """Validate every batch in `buf` and plan the offsets they take.

    With `assign_offsets` (a producer's data) batches get consecutive offsets from
    `next_offset` and must follow the producer rules; without it (a follower copying its
    leader) batches keep their offsets, which must not go backwards, and the plan lists
    where their partition leader epochs rise (`epoch_starts`)."""
    view = memoryview(buf)
    end = len(view)
    if end == 0:
        raise InvalidRecordError("append carries no record batches")
    log_append = config.message_timestamp_type is TimestampType.LOG_APPEND_TIME
    batches: list[BatchPlan] = []
    epoch_starts: list[tuple[int, int]] = []
    epoch = -1
    records = 0
    largest_timestamp = NO_TIMESTAMP
    position = 0
    while position < end:
        # One C call checks an uncompressed batch; what it declines is checked again in
        # Python, which inflates compressed records and raises naming the fault.
        checked = check_batch(view, position, end, assign_offsets) or _check_in_python(
            view, position, end, config, assign_offsets
        )
        (
            size,
            base_offset,
            batch_epoch,
            attributes,
            last_offset_delta,
            base_timestamp,
            header_max_timestamp,
            count,
            min_delta,
            max_delta,
        ) = checked
        if not assign_offsets:
            if base_offset < next_offset:
                raise InvalidRecordError(
                    f"replicated batch at offset {base_offset} is below {next_offset}"
                )
            if batch_epoch > epoch:
                epoch = batch_epoch
                epoch_starts.append((epoch, base_offset))
            max_timestamp = header_max_timestamp
            new_header = None
        else:
            if (
                size > config.max_message_bytes
                or count == 0
                or attributes & CONTROL_FLAG
                or last_offset_delta != count - 1
            ):
                _check_size(size, config)  # raise naming the rule broken
                _check_producer_rules(count, attributes, last_offset_delta)
            if config.compact:
                _check_keys(view, position, end)
            if log_append:
                new_attributes = attributes | TIMESTAMP_TYPE_FLAG
                max_timestamp = now_ms
            else:
                smallest, largest = base_timestamp + min_delta, base_timestamp + max_delta
                if largest != NO_TIMESTAMP:  # records without a timestamp are not checked
                    if smallest == NO_TIMESTAMP:
                        smallest = _smallest_timestamp(view, position, end)
                    _check_timestamps(smallest, largest, now_ms, config, view, position, end)
                new_attributes = attributes & ~TIMESTAMP_TYPE_FLAG
                max_timestamp = base_timestamp + max_delta
            new_header = None
            if new_attributes != attributes or max_timestamp != header_max_timestamp:
                new_header = rewrite_header(
                    view,
                    position,
                    read_header(view, position, end),
                    base_offset=next_offset,
                    leader_epoch=leader_epoch,
                    attributes=new_attributes,
                    max_timestamp=max_timestamp,
                )
            base_offset = next_offset
        last_offset = base_offset + last_offset_delta
        batches.append(
            BatchPlan(position, size, base_offset, last_offset, count, max_timestamp, new_header)
        )
        records += count
        if max_timestamp > largest_timestamp:
            largest_timestamp = max_timestamp
        next_offset = last_offset + 1
        position += size
    append_time = now_ms if log_append and assign_offsets else -1
    return AppendPlan(
        batches,
        batches[0].base_offset,
        next_offset - 1,
        position,
        records,
        largest_timestamp,
        assign_offsets,
        append_time,
        epoch_starts,
    )


def recompressed(buf: Buffer, config: LogConfig) -> Buffer:
    """A producer's batches in the topic's compression.type, as Kafka's LogValidator
    rebuilds them when the codec differs: `buf` itself when it is "producer" or every batch
    is in that codec already. A batch is checked as it came (size against max.message.bytes,
    CRC) before it is rebuilt; `plan_append` then validates what is stored."""
    codec = config.target_compression
    if codec is None:
        return buf
    view = memoryview(buf)
    end = len(view)
    batches: list[Buffer] = []
    changed = False
    position = 0
    while position < end:
        header = read_header(view, position, end)
        size = header.size
        batch = view[position : position + size]
        if Compression.from_attributes(header.attributes) is not codec:
            _check_size(size, config)
            verify_crc(view, position, header)
            batch = memoryview(recompress_batch(view, position, header, codec, MAX_DECOMPRESSED))
            changed = True
        batches.append(batch)
        position += size
    return b"".join(batches) if changed else buf


def _check_in_python(
    view: memoryview, position: int, end: int, config: LogConfig, assign_offsets: bool
) -> CheckedBatch:
    """For a batch check_batch declined: its checks and the producer rules in Python, in the
    order they have always run, raising naming what is wrong; or, for a sound compressed
    batch, what check_batch returns (records inflated, bounded by MAX_DECOMPRESSED)."""
    header = read_header(view, position, end)
    size = header.size
    if assign_offsets:
        _check_size(size, config)
    verify_crc(view, position, header)
    count = header.records_count
    if assign_offsets:
        _check_producer_rules(count, header.attributes, header.last_offset_delta)
    data = records_area(view, position, header, MAX_DECOMPRESSED)
    min_delta, max_delta = scan_records(data, 0, len(data), count, assign_offsets)
    return header.checked(count, min_delta, max_delta)


def _check_keys(view: memoryview, position: int, end: int) -> None:
    """A compacted topic keeps the latest record per key, so (as Kafka) it refuses records
    without one: compaction would have to drop them. Each is named (KIP-467)."""
    header = read_header(view, position, end)
    data = records_area(view, position, header, MAX_DECOMPRESSED)
    keyless = [
        (index, "Compacted topic cannot accept message without key")
        for index, record in enumerate(raw_records(data, header.records_count))
        if record.key is None
    ]
    if keyless:
        raise InvalidRecordError(
            f"records {[index for index, _ in keyless]} have no key; a compacted topic "
            "accepts keyed records only",
            keyless,
        )


def _check_size(size: int, config: LogConfig) -> None:
    if size > config.max_message_bytes:
        raise MessageTooLargeError(
            f"batch of {size} bytes exceeds max.message.bytes {config.max_message_bytes}"
        )


def _check_producer_rules(count: int, attributes: int, last_offset_delta: int) -> None:
    if count == 0:
        raise InvalidRecordError("batch has no records")
    if attributes & CONTROL_FLAG:
        raise InvalidRecordError("producers may not write control batches")
    if last_offset_delta != count - 1:
        raise InvalidRecordError(
            f"last offset delta {last_offset_delta} disagrees with {count} records"
        )


def _smallest_timestamp(view: Buffer, position: int, end: int) -> int:
    """The smallest timestamp of a batch's records other than NO_TIMESTAMP (-1): old
    producers' messages up-converted beside stamped ones (Kafka checks only the latter)."""
    header = read_header(view, position, end)
    data = records_area(view, position, header, MAX_DECOMPRESSED)
    stamped = (
        header.base_timestamp + r.timestamp_delta for r in raw_records(data, header.records_count)
    )
    return min(t for t in stamped if t != NO_TIMESTAMP)


def _check_timestamps(
    smallest: int,
    largest: int,
    now_ms: int,
    config: LogConfig,
    view: Buffer,
    position: int,
    end: int,
) -> None:
    """The batch's stamped records within the topic's window; when not, each record
    outside it is named (KIP-467), found by a scan only then."""
    before, after = config.timestamp_before_max_ms, config.timestamp_after_max_ms
    if now_ms - smallest <= before and largest - now_ms <= after:
        return
    header = read_header(view, position, end)
    data = records_area(view, position, header, MAX_DECOMPRESSED)
    faults = []
    for index, record in enumerate(raw_records(data, header.records_count)):
        stamp = header.base_timestamp + record.timestamp_delta
        if stamp != NO_TIMESTAMP and now_ms - stamp > before:
            faults.append(
                (
                    index,
                    f"timestamp {stamp} is more than message.timestamp.before.max.ms "
                    f"({before}) before the broker's time {now_ms}",
                )
            )
        elif stamp != NO_TIMESTAMP and stamp - now_ms > after:
            faults.append(
                (
                    index,
                    f"timestamp {stamp} is more than message.timestamp.after.max.ms "
                    f"({after}) after the broker's time {now_ms}",
                )
            )
    more = f" (and {len(faults) - 1} more records)" if len(faults) > 1 else ""
    raise InvalidTimestampError(f"record {faults[0][0]}: {faults[0][1]}{more}", faults)
