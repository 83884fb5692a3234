"""Fetch v12 as a follower broker sends and reads it, by hand.

Replication moves every record batch through this path, so it is written out, as Produce
and the broker's Fetch response are: the request is a few struct packs, and the response
is read in place — each partition's records stay a memoryview into the received frame, to
be appended without a copy. v12 is the first flexible Fetch with current_leader_epoch and
last_fetched_epoch, and the last that names topics (v13 uses ids).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from directlog.protocol.api import ApiKey
from directlog.protocol.wire import Writer, read_uvarint, skip_tagged_fields
from directlog.records.errors import CorruptRecordError

VERSION = 12
_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">ihqqq")  # index, error, high watermark, LSO, log start
_ABORTED = 16  # producer id, first offset


@dataclass(frozen=True, slots=True)
class FetchPosition:
    topic: str
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    log_start_offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    topic: str
    partition: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: memoryview  # empty when the leader had none (or answered null)


def encode_request(
    correlation_id: int,
    client_id: str,
    replica_id: int,
    max_wait_ms: int,
    max_bytes: int,
    positions: list[FetchPosition],
) -> bytes:
    """A size-prefixed Fetch v12 request (header v2) for `positions`, min_bytes 1."""
    w = Writer(flexible=True)
    w.int16(ApiKey.FETCH)
    w.int16(VERSION)
    w.int32(correlation_id)
    raw_id = client_id.encode()
    w.int16(len(raw_id))  # the header's client id keeps its classic encoding
    w.buffer += raw_id
    w.tags()
    w.int32(replica_id)
    w.int32(max_wait_ms)
    w.int32(1)  # min_bytes
    w.int32(max_bytes)
    w.buffer.append(0)  # isolation level: read_uncommitted
    w.int32(0)  # session id: no fetch session
    w.int32(-1)  # session epoch: full requests
    topics: dict[str, list[FetchPosition]] = {}
    for position in positions:
        topics.setdefault(position.topic, []).append(position)
    w.length(len(topics))
    for topic, wanted in topics.items():
        w.string(topic)
        w.length(len(wanted))
        for p in wanted:
            w.int32(p.partition)
            w.int32(p.current_leader_epoch)
            w.int64(p.fetch_offset)
            w.int32(-1)  # last fetched epoch: truncation goes through OffsetForLeaderEpoch
            w.int64(p.log_start_offset)
            w.int32(p.max_bytes)
            w.tags()
        w.tags()
    w.length(0)  # forgotten topics
    w.string("")  # rack id
    w.tags()
    return _I32.pack(len(w.buffer)) + bytes(w.buffer)


def decode_response(frame: memoryview) -> tuple[int, int, list[FetchedPartition]]:
    """(correlation id, top-level error code, partitions) of a Fetch v12 response frame
    (header v1 included, size prefix not). Raises CorruptRecordError on malformed bytes."""
    try:
        return _decode(frame)
    except (struct.error, IndexError, UnicodeDecodeError) as error:
        raise CorruptRecordError(f"malformed fetch response: {error}") from error


def _decode(frame: memoryview) -> tuple[int, int, list[FetchedPartition]]:
    (correlation_id,) = _I32.unpack_from(frame, 0)
    position = skip_tagged_fields(frame, 4)
    position += 4  # throttle time
    (error_code,) = _I16.unpack_from(frame, position)
    position += 2 + 4  # error, session id
    out: list[FetchedPartition] = []
    topics, position = _count(frame, position)
    for _ in range(topics):
        topic, position = _string(frame, position)
        partitions, position = _count(frame, position)
        for _ in range(partitions):
            index, code, high_watermark, _, log_start = _PARTITION_HEAD.unpack_from(frame, position)
            position += _PARTITION_HEAD.size
            aborted, position = _count(frame, position)
            for _ in range(aborted):
                position = skip_tagged_fields(frame, position + _ABORTED)
            position += 4  # preferred read replica
            size, position = read_uvarint(frame, position)
            records = frame[position : position + max(size - 1, 0)]
            if len(records) != max(size - 1, 0):
                raise CorruptRecordError("records run past the fetch response")
            position = skip_tagged_fields(frame, position + len(records))
            out.append(FetchedPartition(topic, index, code, high_watermark, log_start, records))
        position = skip_tagged_fields(frame, position)
    return correlation_id, error_code, out


def _count(frame: memoryview, position: int) -> tuple[int, int]:
    """A compact array's length (null counts as empty)."""
    raw, position = read_uvarint(frame, position)
    count = max(raw - 1, 0)
    if count > len(frame) - position:
        raise CorruptRecordError(f"array of {count} entries in {len(frame) - position} bytes")
    return count, position


def _string(frame: memoryview, position: int) -> tuple[str, int]:
    size, position = read_uvarint(frame, position)
    end = position + max(size - 1, 0)
    if end > len(frame):
        raise CorruptRecordError("string runs past the fetch response")
    return str(frame[position:end], "utf-8"), end
