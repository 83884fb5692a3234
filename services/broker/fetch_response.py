"""Fetch responses written by hand, so record data can go from segment files to the socket
with sendfile instead of through Python.

The response is a list of parts: byte strings (header, metadata), FileSlices (records) and
DownConversions (records for old consumers, converted as they are sent).
Layout per version follows Kafka's FetchResponse schema: throttle time from v1, top-level
error and session id from v7, last stable offset and aborted transactions from v4, log
start offset from v5, preferred read replica from v11, flexible encoding (compact arrays,
tagged fields) from v12, topic ids instead of names from v13.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from directlog.protocol.wire import Writer
from services.broker.down_conversion import DownConversion
from services.broker.storage import FileSlice

# Bytes and views, file slices for sendfile, and conversions to run while sending; a view of
# records read from the remote store is a part of its own, sent as it is (no copy into the
# header's buffer).
Part = bytes | memoryview | FileSlice | DownConversion
Records = FileSlice | bytes | memoryview | DownConversion


def part_size(part: Part) -> int:
    return len(part) if isinstance(part, bytes | memoryview) else part.size


@dataclass(slots=True)
class PartitionData:
    index: int
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: Records | None = None
    offsets: int = 0  # records the slice spans, for metrics
    preferred_read_replica: int = -1  # KIP-392: read from this follower instead (v11+)
    # read_committed (v4+): (producer id, first offset) of the aborted transactions the
    # records may hold; None under read_uncommitted.
    aborted: list[tuple[int, int]] | None = None

    @property
    def records_size(self) -> int:
        return 0 if self.records is None else part_size(self.records)


@dataclass(slots=True)
class TopicData:
    name: str
    topic_id: uuid.UUID
    partitions: list[PartitionData]


class _PartsWriter(Writer):
    """A Writer that leaves record data as file slices between its byte parts."""

    def __init__(self, flexible: bool) -> None:
        super().__init__(flexible)
        self.parts: list[Part] = []

    def records(self, records: Records | None, size: int) -> None:
        self.length(None if records is None else size)
        if isinstance(records, FileSlice | memoryview | DownConversion):
            if size:
                self.parts.append(bytes(self.buffer))
                self.buffer = bytearray()
                self.parts.append(records)
        elif records:
            self.buffer += records

    def finish(self) -> list[Part]:
        if self.buffer:
            self.parts.append(bytes(self.buffer))
        return self.parts


def encode_fetch_response(
    version: int, error_code: int, topics: list[TopicData], throttle_ms: int = 0
) -> list[Part]:
    """The body of a FetchResponse (no header), as bytes and file slices to send in order."""
    w = _PartsWriter(flexible=version >= 12)
    if version >= 1:
        w.int32(throttle_ms)
    if version >= 7:
        w.int16(error_code)
        w.int32(0)  # session id 0: no incremental fetch session (KIP-227 allows refusing)
    w.length(len(topics))
    for topic in topics:
        if version >= 13:
            w.buffer += topic.topic_id.bytes
        else:
            w.string(topic.name)
        w.length(len(topic.partitions))
        for p in topic.partitions:
            w.int32(p.index)
            w.int16(p.error_code)
            w.int64(p.high_watermark)
            if version >= 4:
                w.int64(p.last_stable_offset)
            if version >= 5:
                w.int64(p.log_start_offset)
            if version >= 4:
                w.length(None if p.aborted is None else len(p.aborted))
                for producer_id, first_offset in p.aborted or ():
                    w.int64(producer_id)
                    w.int64(first_offset)
                    w.tags()
            if version >= 11:
                w.int32(p.preferred_read_replica)
            w.records(p.records, p.records_size)
            w.tags()
        w.tags()
    w.tags()
    return w.finish()
