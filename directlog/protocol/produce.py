"""Produce requests and responses, versions 0 to 10, written by hand.

kafka-python's generated codec copies every records field and builds an object per
partition; a produce is the broker's hottest request, so here the records stay views into
the received frame and the response is written straight into one buffer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from directlog.protocol.wire import Writer, read_uvarint, skip_tagged_fields
from directlog.records.errors import CorruptRecordError

MAX_ITEMS = 100_000  # topics, or partitions per topic, one request may name


@dataclass(slots=True)
class PartitionData:
    index: int
    records: memoryview | None


@dataclass(slots=True)
class TopicData:
    name: str
    partition_data: list[PartitionData]


@dataclass(slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicData]
    size: int = 0  # bytes of the body, for quotas (Kafka charges a produce's whole size)


@dataclass(slots=True)
class PartitionResult:
    index: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    # KIP-467 (v8+): the records a rule refused, by their index in the batch, and why.
    record_errors: tuple[tuple[int, str], ...] = ()


def decode_produce_request(body: memoryview, version: int) -> ProduceRequest:
    """Decode a Produce request body; records stay views into `body`. Straight-line code
    (no per-field calls): this runs once per produce request. Every length is bounded."""
    flexible = version >= 9
    end = len(body)
    try:
        position = 0
        transactional_id = None
        if version >= 3:
            transactional_id, position = _string(body, position, flexible)
        acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(body, position)
        position += _ACKS_TIMEOUT.size
        count, position = _length(body, position, flexible)
        _bound(count, end - position)
        topics = []
        for _ in range(count):
            name, position = _string(body, position, flexible)
            partitions_count, position = _length(body, position, flexible)
            _bound(partitions_count, end - position)
            partitions = []
            for _ in range(partitions_count):
                (index,) = _INT32.unpack_from(body, position)
                size, position = _length(body, position + 4, flexible)
                records = None
                if size >= 0:
                    if position + size > end:
                        raise CorruptRecordError(f"records of {size} bytes run past the request")
                    records = body[position : position + size]
                    position += size
                if flexible:
                    position = skip_tagged_fields(body, position)
                partitions.append(PartitionData(index, records))
            if flexible:
                position = skip_tagged_fields(body, position)
            topics.append(TopicData(name or "", partitions))
        if flexible:
            skip_tagged_fields(body, position)
    except (struct.error, IndexError) as exc:
        raise CorruptRecordError(f"produce request v{version} is truncated") from exc
    return ProduceRequest(transactional_id, acks, timeout_ms, topics, end)


_ACKS_TIMEOUT = struct.Struct(">hi")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


def _bound(count: int, remaining: int) -> None:
    if count > remaining or count > MAX_ITEMS:
        raise CorruptRecordError(f"array of {count} elements cannot fit the request")


def _length(body: memoryview, position: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        byte = body[position]
        if byte < 0x80:
            return byte - 1, position + 1
        value, position = read_uvarint(body, position)
        return value - 1, position
    return _INT32.unpack_from(body, position)[0], position + 4


def _string(body: memoryview, position: int, flexible: bool) -> tuple[str | None, int]:
    if flexible:
        size, position = _length(body, position, True)
    else:
        size, position = _INT16.unpack_from(body, position)[0], position + 2
    if size < 0:
        return None, position
    if position + size > len(body):
        raise CorruptRecordError(f"string of {size} bytes runs past the request")
    try:
        return bytes(body[position : position + size]).decode(), position + size
    except UnicodeDecodeError as exc:
        raise CorruptRecordError("string is not UTF-8") from exc


def encode_produce_response(
    version: int, results: list[tuple[str, list[PartitionResult]]], throttle_ms: int = 0
) -> bytes:
    """Every produce request is answered through here: one pack per partition.
    ``throttle_ms``: how long a client over its quota is throttled (from v1)."""
    flexible = version >= 9
    writer = Writer(flexible)
    buffer = writer.buffer
    writer.length(len(results))
    no_record_errors = _NO_RECORD_ERRORS_FLEXIBLE if flexible else _NO_RECORD_ERRORS
    for name, partitions in results:
        writer.string(name)
        writer.length(len(partitions))
        for p in partitions:
            if version >= 5:
                buffer += _PARTITION_V5.pack(
                    p.index, p.error_code, p.base_offset, p.log_append_time_ms, p.log_start_offset
                )
            elif version >= 2:
                buffer += _PARTITION_V2.pack(
                    p.index, p.error_code, p.base_offset, p.log_append_time_ms
                )
            else:
                buffer += _PARTITION_V0.pack(p.index, p.error_code, p.base_offset)
            if version >= 8:
                if p.error_message is None:
                    buffer += no_record_errors
                else:
                    writer.length(len(p.record_errors))
                    for batch_index, message in p.record_errors:
                        writer.int32(batch_index)
                        writer.string(message)
                        writer.tags()
                    writer.string(p.error_message)
            writer.tags()
        writer.tags()
    if version >= 1:
        writer.int32(throttle_ms)
    writer.tags()
    return bytes(buffer)


# index, error code, base offset (v0); log append time (v2); log start offset (v5)
_PARTITION_V0 = struct.Struct(">ihq")
_PARTITION_V2 = struct.Struct(">ihqq")
_PARTITION_V5 = struct.Struct(">ihqqq")
# v8 and later: an empty record errors array, then a null error message
_NO_RECORD_ERRORS = b"\x00\x00\x00\x00\xff\xff"
_NO_RECORD_ERRORS_FLEXIBLE = b"\x01\x00"
