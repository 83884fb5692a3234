"""Fetch answers for consumers older than the v2 record format: Fetch v0-1 read magic 0
message sets, v2-3 magic 1. The log holds v2 batches, so these answers are converted, and
lazily (KIP-283): while the response is written, one chunk of whole batches at a time, so a
conversion holds about two chunks of memory however large the fetch.

A response's size goes out before its records, so each partition commits to
S_pre = max(its size before conversion, its first batch's size after) and sends exactly
that. What converts longer is cut after the last whole batch that fits (the first always
fits: KIP-74's progress rule); what converts shorter ends with a message header claiming
more bytes than are left, which clients drop as a message cut off by the fetch limit.

Each v2 batch becomes legacy messages of its own: an uncompressed batch one message per
record, a compressed one a wrapper message with the same codec (gzip, snappy, lz4; the old
formats have no zstd). Keys, values and timestamps (magic 1) carry over, with the batch's
timestamp type; headers do not exist before v2 and are dropped; control batches are never
handed over, and neither are the batches of aborted transactions: an old consumer cannot
tell them apart, so it reads as a read_committed one does (up to the last stable offset,
the aborted transactions the read names dropped here as Kafka's consumers drop them).
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass

from directlog.records._scan import legacy_area, legacy_size
from directlog.records.batch import (
    ATTRIBUTES_AT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    TimestampType,
    decode_records,
    iter_batches,
    peek_offset_and_size,
    records_area,
)
from directlog.records.compression import Compression
from directlog.records.legacy import (
    LOG_APPEND_TIME_BIT,
    LegacyMessage,
    encode_message_set,
    wrap,
)
from directlog.records.markers import AbortedFilter
from services.broker.metrics import BrokerMetrics
from services.broker.storage import FileSlice

# The trailing partial message: offset -1 and the largest size a message may claim, then
# zeros up to the committed size (cut short when fewer than its 12 header bytes are left).
_OVERFLOW_HEADER = struct.Struct(">qi").pack(-1, 0x7FFFFFFF)
_ATTRIBUTES = struct.Struct(">h")
_HEAD = ATTRIBUTES_AT + _ATTRIBUTES.size  # bytes of a batch up to its attributes
MAX_DECOMPRESSED = 64 << 20  # one batch's records, inflated, at most

Source = FileSlice | memoryview


def legacy_magic(fetch_version: int) -> int:
    """The message format a Fetch version reads: magic 0 for v0-1, magic 1 for v2-3."""
    return 0 if fetch_version < 2 else 1


def overflow(size: int) -> bytes:
    """`size` bytes that old clients read as a message cut off at the end of a response."""
    if size <= len(_OVERFLOW_HEADER):
        return _OVERFLOW_HEADER[:size]
    return _OVERFLOW_HEADER + bytes(size - len(_OVERFLOW_HEADER))


def holds_zstd(source: Source) -> bool:
    """Whether a batch in `source` is zstd-compressed, which only Fetch v10+ may carry; only
    the batch headers are read."""
    size = _size(source)
    position = 0
    while size - position >= _HEAD:
        head = _read(source, position, _HEAD)
        (attributes,) = _ATTRIBUTES.unpack_from(head, ATTRIBUTES_AT)
        if attributes & 0x07 == Compression.ZSTD:
            return True
        peek = peek_offset_and_size(head)
        assert peek is not None
        position += max(peek[1], HEADER_SIZE)
    return False


def convert_batches(
    data: bytes | memoryview, magic: int, aborted: AbortedFilter | None = None
) -> Iterator[tuple[bytes, int]]:
    """(legacy message set, records in it) for each whole batch of `data` holding records;
    nothing for a control batch or one `aborted` drops."""
    for position, header in iter_batches(data):
        if aborted is not None and aborted.drops(data, position, header):
            continue
        if header.is_control or not header.records_count:
            continue
        converted = convert_in_c(data, position, header, magic)
        if converted is None:  # what the C encoder declines, the Python one explains
            converted = convert_in_python(data, position, header, magic)
        yield converted, header.records_count


def convert_in_c(
    data: bytes | memoryview, position: int, header: BatchHeader, magic: int
) -> bytes | None:
    """One batch through the C encoder (directlog/records/_scan.c); None when it declines
    records that do not decode."""
    codec = header.compression
    log_append = header.timestamp_type is TimestampType.LOG_APPEND_TIME
    area = records_area(data, position, header, MAX_DECOMPRESSED)
    done = legacy_area(
        area,
        0,
        len(area),
        header.records_count,
        header.base_offset,
        header.base_timestamp,
        header.max_timestamp if log_append else None,
        magic,
        LOG_APPEND_TIME_BIT if magic == 1 and log_append else 0,
        magic == 1 and codec is not Compression.NONE,  # a magic 1 wrapper's relative offsets
    )
    if done is None:
        return None
    entries, last_offset, max_timestamp = done
    if codec is Compression.NONE:
        return entries
    return wrap(entries, last_offset, magic, codec, max_timestamp, int(log_append))


def convert_in_python(
    data: bytes | memoryview, position: int, header: BatchHeader, magic: int
) -> bytes:
    """One batch through Record objects and the legacy encoder: slower, and precise about
    what does not decode."""
    log_append = int(header.timestamp_type is TimestampType.LOG_APPEND_TIME)
    messages = [
        LegacyMessage(r.offset, r.timestamp if magic else None, r.key, r.value, log_append)
        for r in decode_records(data, position, header)
    ]
    return encode_message_set(messages, magic=magic, compression=header.compression)


@dataclass(slots=True, eq=False)
class DownConversion:
    """One partition's records of a Fetch below v4, converted when the response is sent:
    `size` bytes (S_pre) come out of `chunks`, a chunk of `chunk_bytes` of source batches
    at a time."""

    source: Source
    magic: int
    size: int
    chunk_bytes: int
    topic: str
    metrics: BrokerMetrics
    aborted: AbortedFilter | None = None

    @classmethod
    def plan(
        cls,
        source: Source,
        magic: int,
        chunk_bytes: int,
        topic: str,
        metrics: BrokerMetrics,
        aborted: list[tuple[int, int]] | None = None,
    ) -> DownConversion:
        """Commit to S_pre for `source` (whole v2 batches); `aborted`: the aborted
        transactions the read names, whose batches are left out."""
        first_size = _first_converted_size(source, magic)
        size = max(_size(source), first_size)
        drop = None if aborted is None else AbortedFilter(aborted)
        return cls(source, magic, size, chunk_bytes, topic, metrics, drop)

    def eager(self) -> bytes:
        """All `size` bytes at once: how brokers converted before KIP-283 (the whole
        answer in memory until it is sent)."""
        started = time.perf_counter()
        _, out, records, _ = _step(
            self.source, 0, _size(self.source), self.magic, self.size, self.aborted
        )
        self._account(records, time.perf_counter() - started)
        return out + overflow(self.size - len(out))

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """The converted bytes, chunk by chunk, each read and converted once the previous
        one has been sent; exactly `size` bytes in all. A chunk converts in well under a
        millisecond (the C encoder), less than a hop to a worker thread costs, so it runs
        here, between the sends, as Kafka's network threads convert."""
        gauge = self.metrics.temporary_memory.labels("fetch")
        room = self.size
        seconds = 0.0
        converted = 0
        position = 0
        held = 0  # bytes of source and converted data the chunk in flight holds
        try:
            while room > 0:
                started = time.perf_counter()
                consumed, out, records, full = _step(
                    self.source, position, self.chunk_bytes, self.magic, room, self.aborted
                )
                seconds += time.perf_counter() - started
                converted += records
                if not consumed:
                    break  # the source's end
                position += consumed
                if out:  # (control and aborted batches convert to nothing)
                    held = consumed + len(out)
                    gauge.inc(held)
                    room -= len(out)
                    yield out
                    del out
                    gauge.dec(held)
                    held = 0
                if full:
                    break
            if room:
                yield overflow(room)
        finally:
            gauge.dec(held)
            self._account(converted, seconds)

    def _account(self, records: int, seconds: float) -> None:
        self.metrics.converted(self.topic, records, seconds)


def _first_converted_size(source: Source, magic: int) -> int:
    """The converted size of `source`'s first batch: counted from its records when it is
    uncompressed, else converted (and dropped): a compressed size is known once compressed."""
    first = _whole_batches(source, 0, 0)
    for position, header in iter_batches(first):
        if header.compression is Compression.NONE and not header.is_control:
            area = (position + HEADER_SIZE, position + header.size)
            size = legacy_size(first, *area, header.records_count, magic)
            if size is not None:
                return size
    return sum(len(converted) for converted, _ in convert_batches(first, magic))


def _step(
    source: Source,
    position: int,
    max_bytes: int,
    magic: int,
    room: int,
    aborted: AbortedFilter | None,
) -> tuple[int, bytes, int, bool]:
    """Read the whole batches of `source` from `position` within `max_bytes` (at least
    one) and convert as many as fit in `room` bytes: (source bytes read, converted bytes,
    records, whether a batch did not fit)."""
    data = _whole_batches(source, position, max_bytes)
    out: list[bytes] = []
    used = 0
    records = 0
    for converted, count in convert_batches(data, magic, aborted):
        if used + len(converted) > room:
            return len(data), b"".join(out), records, True
        out.append(converted)
        used += len(converted)
        records += count
    return len(data), b"".join(out), records, False


def _whole_batches(source: Source, start: int, max_bytes: int) -> bytes | memoryview:
    """The whole batches of `source` from `start` within `max_bytes`, at least one (none
    when the source does not go on with a whole batch there)."""
    available = _size(source) - start
    data = _read(source, start, min(max(max_bytes, LOG_OVERHEAD), available))
    end = _whole_end(data)
    if end == 0:  # the first batch alone is larger than max_bytes
        peek = peek_offset_and_size(data)
        if peek is None or not HEADER_SIZE <= peek[1] <= available:
            return b""
        data = _read(source, start, peek[1])
        end = len(data)
    return memoryview(data)[:end] if end < len(data) else data


def _whole_end(data: bytes | memoryview) -> int:
    """Where the last whole batch of `data` ends."""
    end = 0
    while True:
        peek = peek_offset_and_size(data, end)
        if peek is None or peek[1] < HEADER_SIZE or end + peek[1] > len(data):
            return end
        end += peek[1]


def _size(source: Source) -> int:
    return source.size if isinstance(source, FileSlice) else len(source)


def _read(source: Source, start: int, size: int) -> bytes | memoryview:
    if isinstance(source, FileSlice):
        if source.file is None:
            return b""
        return os.pread(source.fileno(), size, source.position + start)
    return source[start : start + size]
