"""Fetch responses written by hand, so record data can go from segment files to the socket
with sendfile instead of through Python.

The response is a list of parts: byte strings (header, metadata) and FileSlices (records).
Layout per version follows Kafka's FetchResponse schema: throttle time from v1, top-level
error and session id from v7, last stable offset and aborted transactions from v4, log
start offset from v5, preferred read replica from v11, flexible encoding (compact arrays,
tagged fields) from v12, topic ids instead of names from v13.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from services.broker.storage import FileSlice

Part = bytes | FileSlice


@dataclass(slots=True)
class PartitionData:
    index: int
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: FileSlice | bytes | None = None
    offsets: int = 0  # records the slice spans, for metrics

    @property
    def records_size(self) -> int:
        return (
            0
            if self.records is None
            else (self.records.size if isinstance(self.records, FileSlice) else len(self.records))
        )


@dataclass(slots=True)
class TopicData:
    name: str
    topic_id: uuid.UUID
    partitions: list[PartitionData]


class _Writer:
    def __init__(self, flexible: bool) -> None:
        self.flexible = flexible
        self.parts: list[Part] = []
        self.buffer = bytearray()

    def int8(self, value: int) -> None:
        self.buffer += struct.pack(">b", value)

    def int16(self, value: int) -> None:
        self.buffer += struct.pack(">h", value)

    def int32(self, value: int) -> None:
        self.buffer += struct.pack(">i", value)

    def int64(self, value: int) -> None:
        self.buffer += struct.pack(">q", value)

    def uvarint(self, value: int) -> None:
        while value >= 0x80:
            self.buffer.append((value & 0x7F) | 0x80)
            value >>= 7
        self.buffer.append(value)

    def length(self, count: int | None) -> None:
        """An array or bytes length: int32 (-1 null), or compact uvarint of length + 1."""
        if self.flexible:
            self.uvarint(0 if count is None else count + 1)
        else:
            self.int32(-1 if count is None else count)

    def string(self, value: str) -> None:
        raw = value.encode()
        if self.flexible:
            self.uvarint(len(raw) + 1)
        else:
            self.int16(len(raw))
        self.buffer += raw

    def tags(self) -> None:
        if self.flexible:
            self.uvarint(0)

    def records(self, records: FileSlice | bytes | None, size: int) -> None:
        self.length(None if records is None else size)
        if isinstance(records, FileSlice):
            if records.size:
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
    w = _Writer(flexible=version >= 12)
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
                w.length(None)  # aborted transactions: none under read_uncommitted
            if version >= 11:
                w.int32(-1)  # preferred read replica: none
            w.records(p.records, p.records_size)
            w.tags()
        w.tags()
    w.tags()
    return w.finish()
