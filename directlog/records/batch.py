"""Kafka record batch v2 (magic 2): the one format Directlog stores, sends and replicates.

A batch is a 61-byte header followed by records (compressed as a block when the codec is not
NONE). The CRC32C in the header covers the bytes from `attributes` to the end, so the broker
can stamp `base_offset` and `partition_leader_epoch` in place without recomputing it.
Every length read from a buffer is checked against the buffer before it is used.

`scan_records` (C, in _scan.c) checks the framing of every record on the append path, and
`check_batch` (C too) everything read_header, verify_crc and scan_records check for one
uncompressed batch; `decode_records` decodes for readers, in C (`decode_area`) with the
Python loop here for what C declines: it names the fault, and is the reference in tests.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from enum import IntEnum
from typing import NamedTuple

from crc32c import crc32c

from directlog.records._scan import check_batch as check_batch
from directlog.records._scan import decode_area
from directlog.records._scan import scan_records as scan_records
from directlog.records.compression import Compression, compress, decompress
from directlog.records.errors import (
    CorruptRecordError,
    InvalidRecordError,
    UnsupportedMagicError,
)
from directlog.records.varint import (
    MAX_VARINT_BYTES,
    Buffer,
    decode_varint,
    encode_varint,
)

MAGIC = 2
LOG_OVERHEAD = 12  # base_offset int64 + batch_length int32: the bytes outside batch_length
HEADER_SIZE = 61
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD

# Byte positions of header fields, from the start of the batch.
BATCH_LENGTH_AT = 8
MAGIC_AT = 16
CRC_AT = 17
ATTRIBUTES_AT = 21  # CRC coverage starts here

_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_OFFSET_LENGTH_EPOCH = struct.Struct(">qii")
assert _HEADER.size == HEADER_SIZE

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_FLAG = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20

NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1

# What check_batch returns for a batch it accepts: size, base_offset, partition_leader_epoch,
# attributes, last_offset_delta, base_timestamp, max_timestamp, records_count, and the
# smallest and largest record timestamp deltas.
CheckedBatch = tuple[int, int, int, int, int, int, int, int, int, int]


class TimestampType(IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class BatchHeader(NamedTuple):
    """The fixed 61-byte header of one record batch (a tuple: it is built on every append)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies in a log or a buffer."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    def checked(self, count: int, min_delta: int, max_delta: int) -> CheckedBatch:
        """What check_batch returns for this batch, given its record count (inflated
        records for a compressed batch) and smallest and largest timestamp deltas."""
        return (
            self.size,
            self.base_offset,
            self.partition_leader_epoch,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            count,
            min_delta,
            max_delta,
        )

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression.from_attributes(self.attributes)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType((self.attributes & TIMESTAMP_TYPE_FLAG) >> 3)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)


class Header(NamedTuple):
    key: str
    value: bytes | None


class Record(NamedTuple):
    """One record with its absolute offset and timestamp (a tuple: readers make one per
    record, and a frozen dataclass costs several times more to make)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


def peek_offset_and_size(buf: Buffer, pos: int = 0) -> tuple[int, int] | None:
    """(base_offset, total size) of the batch at buf[pos], or None if fewer than 12 bytes
    remain. The size is not yet bounded; read_header does that."""
    if len(buf) - pos < LOG_OVERHEAD:
        return None
    base_offset, batch_length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)
    return base_offset, LOG_OVERHEAD + batch_length


def read_header(buf: Buffer, pos: int = 0, limit: int | None = None) -> BatchHeader:
    """Parse and bound the header of the batch at buf[pos]; the batch must end by `limit`
    (default: the buffer's end; a caller holding only the header bytes of a file passes the
    file's end, which may lie beyond the buffer).

    Checks sizes, magic, the codec id and counts, not the CRC (see verify_crc)."""
    end = len(buf) if limit is None else limit
    available = min(len(buf), end) - pos
    if available < HEADER_SIZE:
        if available > MAGIC_AT and buf[pos + MAGIC_AT] != MAGIC:
            raise UnsupportedMagicError(f"magic {buf[pos + MAGIC_AT]} at byte {pos}, expected 2")
        raise CorruptRecordError(
            f"batch at byte {pos}: {available} bytes left, a header needs {HEADER_SIZE}"
        )
    header = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC:
        raise UnsupportedMagicError(f"magic {header.magic} at byte {pos}, expected 2")
    if header.batch_length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batch at byte {pos}: length {header.batch_length} below minimum {MIN_BATCH_LENGTH}"
        )
    if pos + header.size > end:
        raise CorruptRecordError(
            f"batch at byte {pos}: length {header.batch_length} runs {pos + header.size - end}"
            f" bytes beyond its buffer"
        )
    if header.records_count < 0:
        raise InvalidRecordError(
            f"batch at byte {pos}: negative record count {header.records_count}"
        )
    if header.last_offset_delta < 0:
        raise InvalidRecordError(
            f"batch at byte {pos}: negative last offset delta {header.last_offset_delta}"
        )
    if header.attributes & COMPRESSION_MASK > Compression.ZSTD:
        Compression.from_attributes(header.attributes)  # raises, naming the codec id
    return header


def compute_crc(buf: Buffer, pos: int, header: BatchHeader) -> int:
    with memoryview(buf) as view:
        return int(crc32c(view[pos + ATTRIBUTES_AT : pos + header.size]))


def verify_crc(buf: Buffer, pos: int, header: BatchHeader) -> None:
    computed = compute_crc(buf, pos, header)
    if computed != header.crc:
        raise CorruptRecordError(
            f"batch at byte {pos} (base offset {header.base_offset}): CRC32C is "
            f"{computed:#010x}, header says {header.crc:#010x}"
        )


def iter_batches(
    buf: Buffer, pos: int = 0, limit: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each whole batch; a trailing partial batch (what a fetch
    response may end with) ends the walk silently. Headers are bounded but CRCs not checked."""
    end = len(buf) if limit is None else limit
    while end - pos >= LOG_OVERHEAD:
        peek = peek_offset_and_size(buf, pos)
        assert peek is not None
        if peek[1] > end - pos and peek[1] >= HEADER_SIZE:
            return
        header = read_header(buf, pos, end)
        yield pos, header
        pos += header.size


def records_area(buf: Buffer, pos: int, header: BatchHeader, max_decompressed: int) -> Buffer:
    """The records bytes of a batch, decompressed if needed (bounded by max_decompressed)."""
    start, end = pos + HEADER_SIZE, pos + header.size
    codec = header.compression
    view = memoryview(buf)[start:end]
    if codec is Compression.NONE:
        return view
    return decompress(codec, view, max_size=max_decompressed, magic=MAGIC)


def decode_records(
    buf: Buffer, pos: int, header: BatchHeader, max_decompressed: int = 64 << 20
) -> list[Record]:
    """Decode every record of the batch at buf[pos] with absolute offsets and timestamps.

    Under LogAppendTime every record takes the batch's max timestamp, as Kafka defines."""
    data = records_area(buf, pos, header, max_decompressed)
    log_append = header.timestamp_type is TimestampType.LOG_APPEND_TIME
    fields = (header.records_count, header.base_offset, header.base_timestamp)
    fixed_timestamp = header.max_timestamp if log_append else None
    decoded = decode_area(data, 0, len(data), *fields, fixed_timestamp, Record, Header)
    return decoded if decoded is not None else decode_area_in_python(data, header)


def decode_area_in_python(data: Buffer, header: BatchHeader) -> list[Record]:
    """The records of ``header``'s batch, whose (decompressed) records area is ``data``:
    what decode_area declines, decoded here to name the fault (or, with timestamps past 64
    bits, to return them as Python ints), and its reference in tests."""
    end = len(data)
    log_append = header.timestamp_type is TimestampType.LOG_APPEND_TIME
    records: list[Record] = []
    at = 0
    for index in range(header.records_count):
        length, at = decode_varint(data, at, end, MAX_VARINT_BYTES)
        record_end = at + length
        if length < 6 or record_end > end:
            raise CorruptRecordError(f"record {index}: length {length} does not fit its batch")
        at += 1
        ts_delta, at = decode_varint(data, at, record_end)
        offset_delta, at = decode_varint(data, at, record_end, MAX_VARINT_BYTES)
        key, at = _read_bytes(data, at, record_end, index)
        value, at = _read_bytes(data, at, record_end, index)
        count, at = decode_varint(data, at, record_end, MAX_VARINT_BYTES)
        if count < 0:
            raise CorruptRecordError(f"record {index}: negative header count {count}")
        headers = []
        for _ in range(count):
            raw_key, at = _read_bytes(data, at, record_end, index)
            if raw_key is None:
                raise CorruptRecordError(f"record {index}: null header key")
            header_value, at = _read_bytes(data, at, record_end, index)
            try:
                headers.append(Header(raw_key.decode(), header_value))
            except UnicodeDecodeError as exc:
                raise CorruptRecordError(f"record {index}: header key is not UTF-8") from exc
        if at != record_end:
            raise CorruptRecordError(f"record {index}: fields do not fill its {length} bytes")
        timestamp = header.max_timestamp if log_append else header.base_timestamp + ts_delta
        records.append(
            Record(header.base_offset + offset_delta, timestamp, key, value, tuple(headers))
        )
    if at != end:
        raise CorruptRecordError(
            f"{end - at} bytes after the last of {header.records_count} records"
        )
    return records


def _read_bytes(data: Buffer, pos: int, limit: int, index: int) -> tuple[bytes | None, int]:
    length, pos = decode_varint(data, pos, limit, MAX_VARINT_BYTES)
    if length < 0:
        if length != -1:
            raise CorruptRecordError(f"record {index}: length {length}")
        return None, pos
    if pos + length > limit:
        raise CorruptRecordError(f"record {index}: field of {length} bytes runs past the record")
    return bytes(data[pos : pos + length]), pos + length


def encode_record(offset_delta: int, timestamp_delta: int, record: Record) -> bytes:
    body = bytearray(b"\x00")
    body += encode_varint(timestamp_delta)
    body += encode_varint(offset_delta)
    for blob in (record.key, record.value):
        if blob is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(blob)) + blob
    body += encode_varint(len(record.headers))
    for header in record.headers:
        raw_key = header.key.encode()
        body += encode_varint(len(raw_key)) + raw_key
        if header.value is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(header.value)) + header.value
    return encode_varint(len(body)) + bytes(body)


def build_batch(
    records: Sequence[Record],
    *,
    base_offset: int | None = None,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """Encode records as one batch; offset deltas come from each record's offset minus
    base_offset (the first record's offset unless given)."""
    if not records:
        raise ValueError("a batch needs at least one record")
    base = records[0].offset if base_offset is None else base_offset
    base_timestamp = records[0].timestamp
    last_delta = records[-1].offset - base
    body = b"".join(
        encode_record(record.offset - base, record.timestamp - base_timestamp, record)
        for record in records
    )
    if compression is not Compression.NONE:
        body = compress(compression, body, magic=MAGIC)
    attributes = int(compression) | (timestamp_type << 3)
    if transactional:
        attributes |= TRANSACTIONAL_FLAG
    if control:
        attributes |= CONTROL_FLAG
    header = bytearray(
        _HEADER.pack(
            base,
            HEADER_SIZE - LOG_OVERHEAD + len(body),
            partition_leader_epoch,
            MAGIC,
            0,
            attributes,
            last_delta,
            base_timestamp,
            max(record.timestamp for record in records),
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
    )
    crc = crc32c(body, crc32c(memoryview(header)[ATTRIBUTES_AT:]))
    struct.pack_into(">I", header, CRC_AT, crc)
    return bytes(header) + body


def stamp_offset_and_epoch(
    buf: bytearray | memoryview, pos: int, base_offset: int, leader_epoch: int
) -> None:
    """Write base_offset and partition_leader_epoch in place; both lie outside the CRC."""
    length = struct.unpack_from(">i", buf, pos + BATCH_LENGTH_AT)[0]
    _OFFSET_LENGTH_EPOCH.pack_into(buf, pos, base_offset, length, leader_epoch)


def rewrite_header(
    buf: Buffer,
    pos: int,
    header: BatchHeader,
    *,
    base_offset: int,
    leader_epoch: int,
    attributes: int,
    max_timestamp: int,
) -> bytes:
    """A new 61-byte header for the batch at buf[pos] with the given offset, epoch,
    attributes and max timestamp, and the CRC recomputed over the new header and the
    unchanged records."""
    fields = bytearray(
        _HEADER.pack(
            base_offset,
            header.batch_length,
            leader_epoch,
            MAGIC,
            0,
            attributes,
            header.last_offset_delta,
            header.base_timestamp,
            max_timestamp,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.records_count,
        )
    )
    with memoryview(buf) as view:
        crc = crc32c(
            view[pos + HEADER_SIZE : pos + header.size], crc32c(memoryview(fields)[ATTRIBUTES_AT:])
        )
    struct.pack_into(">I", fields, CRC_AT, crc)
    return bytes(fields)


def recompress_batch(
    buf: Buffer, pos: int, header: BatchHeader, codec: Compression, max_decompressed: int
) -> bytes:
    """The batch at buf[pos] with its records area in ``codec``: every header field kept but
    the codec bits, the length and the CRC (Kafka's broker-side compression.type). The
    records are inflated (bounded by max_decompressed) and deflated again, never decoded;
    the caller checks the CRC first, or a corrupt batch would come out with a valid one."""
    body = bytes(records_area(buf, pos, header, max_decompressed))
    if codec is not Compression.NONE:
        body = compress(codec, body, magic=MAGIC)
    fields = bytearray(
        _HEADER.pack(
            header.base_offset,
            HEADER_SIZE - LOG_OVERHEAD + len(body),
            header.partition_leader_epoch,
            MAGIC,
            0,
            (header.attributes & ~COMPRESSION_MASK) | int(codec),
            header.last_offset_delta,
            header.base_timestamp,
            header.max_timestamp,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.records_count,
        )
    )
    crc = crc32c(body, crc32c(memoryview(fields)[ATTRIBUTES_AT:]))
    struct.pack_into(">I", fields, CRC_AT, crc)
    return bytes(fields) + body


class RawRecord(NamedTuple):
    """One record of a batch's (inflated) records area, by position, not decoded further."""

    start: int
    end: int
    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    tombstone: bool


def raw_records(data: Buffer, count: int) -> list[RawRecord]:
    """Where each of `count` records lies in a records area, with its offset and timestamp
    deltas, key and whether its value is null. Every length is bounded by its record."""
    end = len(data)
    records = []
    at = 0
    for index in range(count):
        length, body = decode_varint(data, at, end, MAX_VARINT_BYTES)
        record_end = body + length
        if length < 6 or record_end > end:
            raise CorruptRecordError(f"record {index}: length {length} does not fit its batch")
        timestamp_delta, pos = decode_varint(data, body + 1, record_end)
        offset_delta, pos = decode_varint(data, pos, record_end, MAX_VARINT_BYTES)
        key_length, pos = decode_varint(data, pos, record_end, MAX_VARINT_BYTES)
        key = None
        if key_length >= 0:
            if pos + key_length > record_end:
                raise CorruptRecordError(f"record {index}: key runs past the record")
            key = bytes(data[pos : pos + key_length])
            pos += key_length
        value_length, _ = decode_varint(data, pos, record_end, MAX_VARINT_BYTES)
        records.append(
            RawRecord(at, record_end, offset_delta, timestamp_delta, key, value_length < 0)
        )
        at = record_end
    if at != end:
        raise CorruptRecordError(f"{end - at} bytes after the last of {count} records")
    return records
