"""Produce requests and responses, versions 0 to 10, written by hand.

kafka-python's generated codec copies every records field and builds an object per
partition; a produce is the broker's hottest request, so here the records stay views into
the received frame and the response is written straight into one buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

from directlog.protocol.wire import Reader, Writer

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


@dataclass(slots=True)
class PartitionResult:
    index: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


def decode_produce_request(body: memoryview, version: int) -> ProduceRequest:
    reader = Reader(body, flexible=version >= 9)
    transactional_id = reader.string() if version >= 3 else None
    acks = reader.int16()
    timeout_ms = reader.int32()
    topics = []
    for _ in range(max(reader.array_length(MAX_ITEMS), 0)):
        name = reader.string() or ""
        partitions = []
        for _ in range(max(reader.array_length(MAX_ITEMS), 0)):
            index = reader.int32()
            partitions.append(PartitionData(index, reader.bytes_view()))
            reader.tags()
        reader.tags()
        topics.append(TopicData(name, partitions))
    reader.tags()
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)


def encode_produce_response(
    version: int, results: list[tuple[str, list[PartitionResult]]]
) -> bytes:
    writer = Writer(flexible=version >= 9)
    writer.length(len(results))
    for name, partitions in results:
        writer.string(name)
        writer.length(len(partitions))
        for p in partitions:
            writer.int32(p.index)
            writer.int16(p.error_code)
            writer.int64(p.base_offset)
            if version >= 2:
                writer.int64(p.log_append_time_ms)
            if version >= 5:
                writer.int64(p.log_start_offset)
            if version >= 8:
                writer.length(0)  # record errors: none singled out
                writer.string(p.error_message)
            writer.tags()
        writer.tags()
    if version >= 1:
        writer.int32(0)  # throttle time
    writer.tags()
    return bytes(writer.buffer)
