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

from crc32c import crc32c

from directlog.records.batch import (
    ATTRIBUTES_AT,
    COMPRESSION_MASK,
    CONTROL_FLAG,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_FLAG,
    TimestampType,
    read_header,
    records_area,
    rewrite_header,
    scan_records,
    verify_crc,
)
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
    size: int
    records: int
    max_timestamp: int
    stamp: bool  # False for replicated batches, written exactly as the leader has them
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    # Replicated batches only: (partition leader epoch, base offset) of each batch whose
    # epoch is above every earlier one in the buffer, for the leader epoch cache.
    epoch_starts: list[tuple[int, int]]

    @property
    def first_offset(self) -> int:
        return self.batches[0].base_offset

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset


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
        header = read_header(view, position, end)
        size = header.batch_length + LOG_OVERHEAD
        if assign_offsets and size > config.max_message_bytes:
            raise MessageTooLargeError(
                f"batch of {size} bytes exceeds max.message.bytes {config.max_message_bytes}"
            )
        if crc32c(view[position + ATTRIBUTES_AT : position + size]) != header.crc:
            verify_crc(view, position, header)  # raises, naming both values
        count = header.records_count
        if assign_offsets:
            if count == 0:
                raise InvalidRecordError("batch has no records")
            if header.attributes & CONTROL_FLAG:
                raise InvalidRecordError("producers may not write control batches")
            if header.last_offset_delta != count - 1:
                raise InvalidRecordError(
                    f"last offset delta {header.last_offset_delta} disagrees with {count} records"
                )
        if header.attributes & COMPRESSION_MASK:
            data = records_area(view, position, header, MAX_DECOMPRESSED)
            min_delta, max_delta = scan_records(data, 0, len(data), count, assign_offsets)
        else:
            min_delta, max_delta = scan_records(
                view, position + HEADER_SIZE, position + size, count, assign_offsets
            )
        if not assign_offsets:
            if header.base_offset < next_offset:
                raise InvalidRecordError(
                    f"replicated batch at offset {header.base_offset} is below {next_offset}"
                )
            if header.partition_leader_epoch > epoch:
                epoch = header.partition_leader_epoch
                epoch_starts.append((epoch, header.base_offset))
            plan = BatchPlan(
                position,
                size,
                header.base_offset,
                header.last_offset,
                count,
                header.max_timestamp,
                None,
            )
        else:
            if log_append:
                attributes = header.attributes | TIMESTAMP_TYPE_FLAG
                max_timestamp = now_ms
            else:
                _check_timestamps(
                    header.base_timestamp + min_delta,
                    header.base_timestamp + max_delta,
                    now_ms,
                    config,
                )
                attributes = header.attributes & ~TIMESTAMP_TYPE_FLAG
                max_timestamp = header.base_timestamp + max_delta
            new_header = None
            if attributes != header.attributes or max_timestamp != header.max_timestamp:
                new_header = rewrite_header(
                    view,
                    position,
                    header,
                    base_offset=next_offset,
                    leader_epoch=leader_epoch,
                    attributes=attributes,
                    max_timestamp=max_timestamp,
                )
            plan = BatchPlan(
                position,
                size,
                next_offset,
                next_offset + count - 1,
                count,
                max_timestamp,
                new_header,
            )
        batches.append(plan)
        records += count
        if plan.max_timestamp > largest_timestamp:
            largest_timestamp = plan.max_timestamp
        next_offset = plan.last_offset + 1
        position += size
    append_time = now_ms if log_append and assign_offsets else -1
    return AppendPlan(
        batches, position, records, largest_timestamp, assign_offsets, append_time, epoch_starts
    )


def _check_timestamps(smallest: int, largest: int, now_ms: int, config: LogConfig) -> None:
    if now_ms - smallest > config.message_timestamp_before_max_ms:
        raise InvalidTimestampError(
            f"timestamp {smallest} is more than message.timestamp.before.max.ms "
            f"({config.message_timestamp_before_max_ms}) before the broker's time {now_ms}"
        )
    if largest - now_ms > config.message_timestamp_after_max_ms:
        raise InvalidTimestampError(
            f"timestamp {largest} is more than message.timestamp.after.max.ms "
            f"({config.message_timestamp_after_max_ms}) after the broker's time {now_ms}"
        )
