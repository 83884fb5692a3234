"""Record batch v2: exact layout, round trips, kafka-python interop, hostile bytes, and the C
framing scanner.

The known-answer batch is assembled here with struct and crc32c straight from Kafka's
documented layout, independently of the encoder under test.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import tempfile
import warnings

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from directlog.records.batch import (
    HEADER_SIZE,
    MIN_BATCH_LENGTH,
    BatchHeader,
    Header,
    Record,
    TimestampType,
    build_batch,
    compute_crc,
    decode_area,
    decode_area_in_python,
    decode_records,
    iter_batches,
    read_header,
    records_area,
    rewrite_header,
    scan_records,
    stamp_offset_and_epoch,
    verify_crc,
)

with warnings.catch_warnings():
    # kafka-python's package import loads protocol schemas through deprecated importlib APIs.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import codec as kafka_codec
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords
from directlog.records.compression import Compression
from directlog.records.errors import (
    CorruptRecordError,
    InvalidRecordError,
    UnsupportedCompressionError,
    UnsupportedMagicError,
)
from directlog.records.varint import decode_varint, encode_varint

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
LOG_APPEND_TIME_FLAG = 0x08
FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies -------------------------------------------------------------------------

blobs = st.none() | st.binary(max_size=200)
header_lists = st.lists(
    st.builds(Header, st.text(max_size=12), st.none() | st.binary(max_size=30)), max_size=3
)
first_timestamps = st.one_of(
    st.integers(1_500_000_000_000, 1_900_000_000_000),  # realistic epoch milliseconds
    st.integers(-1, 1 << 62),
)
timestamp_deltas = st.one_of(st.integers(-5_000, 5_000), st.integers(-(1 << 61), 1 << 61))


@st.composite
def record_lists(draw: st.DrawFn, *, max_size: int = 6) -> list[Record]:
    """Records at consecutive offsets from a random base, with random timestamps."""
    count = draw(st.integers(1, max_size))
    base = draw(st.integers(0, 1 << 62))
    first = draw(first_timestamps)
    deltas = [0] + [draw(timestamp_deltas) for _ in range(count - 1)]
    return [
        Record(base + i, first + delta, draw(blobs), draw(blobs), tuple(draw(header_lists)))
        for i, delta in enumerate(deltas)
    ]


# --- helpers ----------------------------------------------------------------------------


def zigzag1(value: int) -> bytes:
    """One-byte zig-zag varint, written out so the known-answer test needs no encoder."""
    encoded = (value << 1) ^ (value >> 63)
    assert 0 <= encoded < 0x80
    return bytes([encoded])


def batch_of(records: list[Record], **kwargs: object) -> tuple[bytes, BatchHeader]:
    raw = build_batch(records, **kwargs)  # type: ignore[arg-type]
    return raw, read_header(raw)


def header_bytes(**fields: int) -> bytes:
    """A 61-byte header with the given fields (batch_length defaults to an empty body)."""
    values = {
        "base_offset": 0,
        "batch_length": MIN_BATCH_LENGTH,
        "partition_leader_epoch": -1,
        "magic": 2,
        "crc": 0,
        "attributes": 0,
        "last_offset_delta": 0,
        "base_timestamp": 0,
        "max_timestamp": 0,
        "producer_id": -1,
        "producer_epoch": -1,
        "base_sequence": -1,
        "records_count": 1,
    }
    values.update(fields)
    return struct.pack(">qiibIhiqqqhii", *values.values())


HEADER_FIELDS = (
    "base_offset",
    "batch_length",
    "partition_leader_epoch",
    "magic",
    "crc",
    "attributes",
    "last_offset_delta",
    "base_timestamp",
    "max_timestamp",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "records_count",
)


def with_fields(header: BatchHeader, **changes: int) -> BatchHeader:
    """A copy of `header` with some fields changed (whatever class BatchHeader is)."""
    return BatchHeader(**{name: changes.get(name, getattr(header, name)) for name in HEADER_FIELDS})


def with_records_area(template: bytes, area: bytes, count: int | None = None) -> bytearray:
    """An uncompressed batch holding `area` as its records, with the template's header."""
    buf = bytearray(template[:HEADER_SIZE]) + area
    struct.pack_into(">i", buf, 8, MIN_BATCH_LENGTH + len(area))
    if count is not None:
        struct.pack_into(">i", buf, 57, count)
    return buf


def kafka_codecs() -> list[Compression]:
    """Codecs kafka-python can actually encode and decode in this environment."""
    usable = {
        Compression.NONE: True,
        Compression.GZIP: kafka_codec.has_gzip(),
        Compression.SNAPPY: kafka_codec.has_snappy(),
        Compression.LZ4: kafka_codec.has_lz4(),
        Compression.ZSTD: kafka_codec.has_zstd(),
    }
    return [codec for codec, ok in usable.items() if ok]


KAFKA_CODECS = kafka_codecs()


def test_kafka_python_covers_at_least_none_gzip_and_lz4() -> None:
    assert {Compression.NONE, Compression.GZIP, Compression.LZ4} <= set(KAFKA_CODECS)


def kafka_build(records: list[Record], codec: Compression) -> bytearray:
    """A batch written by kafka-python's producer-side builder (base offset 0)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    for record in records:
        meta = builder.append(
            record.offset,
            record.timestamp,
            record.key,
            record.value,
            [(h.key, h.value) for h in record.headers],
        )
        assert meta is not None
    return builder.build()


def as_kafka_tuples(records: list[Record]) -> list[tuple[object, ...]]:
    return [
        (r.offset, r.timestamp, r.key, r.value, [(h.key, h.value) for h in r.headers])
        for r in records
    ]


def kafka_read(batch: DefaultRecordBatch) -> list[tuple[object, ...]]:
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]


# --- known answer -----------------------------------------------------------------------


def test_known_answer_batch_matches_kafka_layout_byte_for_byte() -> None:
    base_ts = 1_700_000_000_000
    records = [
        Record(100, base_ts, b"k0", b"hello", (Header("h1", b"v"), Header("h2", None))),
        Record(101, base_ts + 300, None, b"world"),
    ]
    # Record 0: attributes, timestampDelta 0, offsetDelta 0, key "k0", value "hello",
    # two headers ("h1" -> "v", "h2" -> null).
    body0 = (
        b"\x00"
        + zigzag1(0)
        + zigzag1(0)
        + zigzag1(2)
        + b"k0"
        + zigzag1(5)
        + b"hello"
        + zigzag1(2)
        + zigzag1(2)
        + b"h1"
        + zigzag1(1)
        + b"v"
        + zigzag1(2)
        + b"h2"
        + zigzag1(-1)
    )
    # Record 1: timestampDelta 300 is zig-zag 600 = 0x258 -> two bytes d8 04.
    body1 = (
        b"\x00"
        + bytes.fromhex("d804")
        + zigzag1(1)
        + zigzag1(-1)
        + zigzag1(5)
        + b"world"
        + zigzag1(0)
    )
    records_bytes = zigzag1(len(body0)) + body0 + zigzag1(len(body1)) + body1
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            0,  # attributes: no codec, CreateTime, not transactional, not control
            1,  # lastOffsetDelta
            base_ts,  # baseTimestamp
            base_ts + 300,  # maxTimestamp
            4242,  # producerId
            3,  # producerEpoch
            17,  # baseSequence
            2,  # recordsCount
        )
        + records_bytes
    )
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch + magic + crc + the rest
    expected = (
        struct.pack(">qiib", 100, batch_length, 9, 2)
        + struct.pack(">I", crc32c(after_crc))
        + after_crc
    )

    built = build_batch(
        records,
        producer_id=4242,
        producer_epoch=3,
        base_sequence=17,
        partition_leader_epoch=9,
    )
    assert built.hex() == expected.hex()
    assert len(built) == 12 + batch_length

    header = read_header(built)
    assert header == BatchHeader(
        base_offset=100,
        batch_length=batch_length,
        partition_leader_epoch=9,
        magic=2,
        crc=crc32c(after_crc),
        attributes=0,
        last_offset_delta=1,
        base_timestamp=base_ts,
        max_timestamp=base_ts + 300,
        producer_id=4242,
        producer_epoch=3,
        base_sequence=17,
        records_count=2,
    )
    assert (header.size, header.last_offset, header.next_offset) == (len(built), 101, 102)
    assert header.compression is Compression.NONE
    assert header.timestamp_type is TimestampType.CREATE_TIME
    assert not header.is_transactional
    assert not header.is_control
    assert compute_crc(built, 0, header) == header.crc
    verify_crc(built, 0, header)
    assert decode_records(built, 0, header) == records
    area = records_area(built, 0, header, 1 << 20)
    assert bytes(area) == records_bytes
    assert scan_records(area, 0, len(area), 2, True) == (0, 300)


def test_attribute_bits_for_flags_and_codecs() -> None:
    records = [Record(0, 5, None, b"x" * 100)]
    for codec in Compression:
        raw, header = batch_of(
            records,
            compression=codec,
            timestamp_type=TimestampType.LOG_APPEND_TIME,
            transactional=True,
            control=True,
        )
        assert struct.unpack_from(">h", raw, 21)[0] == int(codec) | 0x08 | 0x10 | 0x20
        assert header.compression is codec
        assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
        assert header.is_transactional
        assert header.is_control


def test_build_refuses_an_empty_batch() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        build_batch([])


# --- round trips ------------------------------------------------------------------------


@given(record_lists(), st.sampled_from(list(Compression)), st.integers(-1, (1 << 31) - 1))
@FAST
def test_round_trip_every_codec(records: list[Record], codec: Compression, epoch: int) -> None:
    raw, header = batch_of(records, compression=codec, partition_leader_epoch=epoch)
    first, last = records[0], records[-1]
    assert header.base_offset == first.offset
    assert header.partition_leader_epoch == epoch
    assert header.records_count == len(records)
    assert header.last_offset_delta == len(records) - 1
    assert header.last_offset == last.offset
    assert header.base_timestamp == first.timestamp
    assert header.max_timestamp == max(r.timestamp for r in records)
    assert header.compression is codec
    assert header.size == len(raw)
    verify_crc(raw, 0, header)
    assert decode_records(raw, 0, header) == records
    area = records_area(raw, 0, header, 1 << 24)
    deltas = [r.timestamp - first.timestamp for r in records]
    assert scan_records(area, 0, len(area), len(records), True) == (min(deltas), max(deltas))
    assert scan_records(area, 0, len(area), len(records), False) == (min(deltas), max(deltas))


@given(record_lists(), st.integers(0, 1 << 40), st.integers(1, 1000))
@FAST
def test_explicit_base_offset_with_gaps(records: list[Record], base: int, gap: int) -> None:
    spaced = [r._replace(offset=base + gap * i) for i, r in enumerate(records)]
    raw, header = batch_of(spaced, base_offset=base)
    assert header.base_offset == base
    assert header.last_offset_delta == gap * (len(spaced) - 1)
    assert decode_records(raw, 0, header) == spaced
    area = records_area(raw, 0, header, 1 << 24)
    _, max_delta = scan_records(area, 0, len(area), len(spaced), False)
    assert max_delta == max(r.timestamp for r in spaced) - spaced[0].timestamp
    if gap > 1 and len(spaced) > 1:
        with pytest.raises(InvalidRecordError, match="record 1: offset delta"):
            scan_records(area, 0, len(area), len(spaced), True)


def test_decode_is_bounded_by_max_decompressed() -> None:
    records = [Record(0, 0, None, b"z" * 10_000)]
    raw, header = batch_of(records, compression=Compression.GZIP)
    assert decode_records(raw, 0, header, max_decompressed=20_000) == records
    with pytest.raises(CorruptRecordError, match="more than 1000 bytes"):
        decode_records(raw, 0, header, max_decompressed=1000)


# --- kafka-python interop ---------------------------------------------------------------


@st.composite
def kafka_record_lists(draw: st.DrawFn) -> list[Record]:
    """Records as kafka-python's producer writes them: offsets 0..n-1, a compressible first
    record so that kafka-python keeps the requested codec."""
    records = draw(record_lists(max_size=5))
    first = records[0]._replace(value=b"compressible " * 200)
    return [r._replace(offset=i) for i, r in enumerate([first, *records[1:]])]


@pytest.mark.parametrize("codec", KAFKA_CODECS, ids=lambda c: c.name)
@given(records=kafka_record_lists(), base=st.integers(0, 1 << 50), epoch=st.integers(0, 1 << 20))
@FAST
def test_kafka_python_batches_decode_here(
    codec: Compression, records: list[Record], base: int, epoch: int
) -> None:
    raw = kafka_build(records, codec)
    header = read_header(raw)
    assert header.compression is codec
    assert header.base_offset == 0
    verify_crc(raw, 0, header)
    assert decode_records(raw, 0, header) == records
    area = records_area(raw, 0, header, 1 << 24)
    deltas = [r.timestamp - records[0].timestamp for r in records]
    assert scan_records(area, 0, len(area), len(records), True) == (min(deltas), max(deltas))

    # What a broker does on append: stamp offset and epoch, CRC untouched and still valid.
    stamp_offset_and_epoch(raw, 0, base, epoch)
    stamped = read_header(raw)
    assert (stamped.base_offset, stamped.partition_leader_epoch) == (base, epoch)
    assert stamped.crc == header.crc
    verify_crc(raw, 0, stamped)
    assert [r.offset for r in decode_records(raw, 0, stamped)] == [
        base + i for i in range(len(records))
    ]


@pytest.mark.parametrize("codec", KAFKA_CODECS, ids=lambda c: c.name)
@given(records=record_lists(), epoch=st.integers(-1, 1 << 20))
@FAST
def test_our_batches_decode_in_kafka_python(
    codec: Compression, records: list[Record], epoch: int
) -> None:
    raw = build_batch(records, compression=codec, partition_leader_epoch=epoch)
    batch = DefaultRecordBatch(raw)
    assert batch.validate_crc()
    assert batch.magic == 2
    assert batch.compression_type == int(codec)
    assert batch.base_offset == records[0].offset
    assert batch.leader_epoch == epoch
    assert batch.records_count == len(records)
    assert batch.last_offset_delta == len(records) - 1
    assert batch.first_timestamp == records[0].timestamp
    assert batch.max_timestamp == max(r.timestamp for r in records)
    assert kafka_read(batch) == as_kafka_tuples(records)


@pytest.mark.parametrize("codec", KAFKA_CODECS, ids=lambda c: c.name)
def test_kafka_python_sees_a_crc_we_broke(codec: Compression) -> None:
    raw = bytearray(build_batch([Record(0, 0, b"k", b"v" * 50)], compression=codec))
    raw[-1] ^= 0x01
    assert not DefaultRecordBatch(raw).validate_crc()
    with pytest.raises(CorruptRecordError, match="CRC32C"):
        verify_crc(raw, 0, read_header(raw))


def test_kafka_python_walks_our_concatenated_batches() -> None:
    batches = [
        [Record(10, 1000, b"a", b"1"), Record(11, 1001, None, None)],
        [Record(12, 2000, b"b", b"2" * 300, (Header("trace", b"x"),))],
        [Record(13, 3000, None, b"3"), Record(14, 2999, b"c", b""), Record(15, 3001, b"", None)],
    ]
    codecs = [c for c in (Compression.GZIP, Compression.LZ4, Compression.NONE)]
    buf = b"".join(build_batch(b, compression=c) for b, c in zip(batches, codecs, strict=True))
    walked = MemoryRecords(buf + buf[:30])  # a partial trailing batch, as a fetch may end
    seen = []
    while walked.has_next():
        batch = walked.next_batch()
        assert batch.validate_crc()
        seen.append(kafka_read(batch))
    assert seen == [as_kafka_tuples(b) for b in batches]
    assert [h.base_offset for _, h in iter_batches(buf + buf[:30])] == [10, 12, 13]


def test_log_append_time_in_kafka_python_and_here() -> None:
    records = [Record(0, 100, b"a", b"1"), Record(1, 50, b"b", b"2"), Record(2, 75, None, b"3")]
    raw = build_batch(records, timestamp_type=TimestampType.LOG_APPEND_TIME)
    batch = DefaultRecordBatch(raw)
    assert batch.validate_crc()
    assert [(r.timestamp, r.timestamp_type) for r in batch] == [(100, 1)] * 3
    assert [r.timestamp for r in decode_records(raw, 0, read_header(raw))] == [100] * 3


# --- LogAppendTime ----------------------------------------------------------------------


@given(record_lists(), st.sampled_from(list(Compression)), st.integers(0, 1 << 50))
@FAST
def test_log_append_time_gives_every_record_the_max_timestamp(
    records: list[Record], codec: Compression, append_time: int
) -> None:
    raw, header = batch_of(records, compression=codec)
    assert [r.timestamp for r in decode_records(raw, 0, header)] == [r.timestamp for r in records]
    # The broker switches the batch to LogAppendTime and sets maxTimestamp to its clock.
    new_header = rewrite_header(
        raw,
        0,
        header,
        base_offset=header.base_offset,
        leader_epoch=header.partition_leader_epoch,
        attributes=header.attributes | LOG_APPEND_TIME_FLAG,
        max_timestamp=append_time,
    )
    rewritten = new_header + raw[HEADER_SIZE:]
    parsed = read_header(rewritten)
    assert parsed.timestamp_type is TimestampType.LOG_APPEND_TIME
    verify_crc(rewritten, 0, parsed)
    decoded = decode_records(rewritten, 0, parsed)
    assert [r.timestamp for r in decoded] == [append_time] * len(records)
    assert [(r.offset, r.key, r.value, r.headers) for r in decoded] == [
        (r.offset, r.key, r.value, r.headers) for r in records
    ]


# --- stamping and header rewrite --------------------------------------------------------


@given(
    record_lists(max_size=3),
    st.sampled_from(list(Compression)),
    st.binary(max_size=20),
    st.integers(INT64_MIN, INT64_MAX),
    st.integers(-(1 << 31), (1 << 31) - 1),
)
@FAST
def test_stamp_changes_only_offset_and_epoch(
    records: list[Record], codec: Compression, prefix: bytes, base: int, epoch: int
) -> None:
    raw = build_batch(records, compression=codec)
    buf = bytearray(prefix + raw + b"\xee" * 3)
    before = bytes(buf)
    pos = len(prefix)
    stamp_offset_and_epoch(memoryview(buf), pos, base, epoch)
    changed = {i - pos for i in range(len(buf)) if buf[i] != before[i]}
    assert changed <= set(range(8)) | set(range(12, 16))
    assert buf[pos : pos + 8] == struct.pack(">q", base)
    assert buf[pos + 12 : pos + 16] == struct.pack(">i", epoch)
    header = read_header(buf, pos, pos + len(raw))
    assert (header.base_offset, header.partition_leader_epoch) == (base, epoch)
    assert header.batch_length == len(raw) - 12
    verify_crc(buf, pos, header)


@given(
    record_lists(max_size=4),
    st.sampled_from(list(Compression)),
    st.integers(0, 1 << 62),
    st.integers(-1, (1 << 31) - 1),
    st.sampled_from([0, 0x08, 0x10, 0x18]),
    st.integers(-1, 1 << 50),
)
@FAST
def test_rewrite_header_crc_covers_unchanged_records(
    records: list[Record],
    codec: Compression,
    base: int,
    epoch: int,
    flags: int,
    max_timestamp: int,
) -> None:
    raw, header = batch_of(records, compression=codec)
    buf = b"\x00" * 7 + raw
    new = rewrite_header(
        buf,
        7,
        header,
        base_offset=base,
        leader_epoch=epoch,
        attributes=int(codec) | flags,
        max_timestamp=max_timestamp,
    )
    assert len(new) == HEADER_SIZE
    rebuilt = new + raw[HEADER_SIZE:]
    parsed = read_header(rebuilt)
    assert parsed == with_fields(
        header,
        base_offset=base,
        partition_leader_epoch=epoch,
        attributes=int(codec) | flags,
        max_timestamp=max_timestamp,
        crc=crc32c(rebuilt[21:]),
    )
    verify_crc(rebuilt, 0, parsed)
    assert DefaultRecordBatch(rebuilt).validate_crc()
    assert [r.offset for r in decode_records(rebuilt, 0, parsed)] == [
        base + i for i in range(len(records))
    ]


# --- bad input --------------------------------------------------------------------------

GOOD_RECORDS = [Record(7, 1000, b"key", b"value", (Header("h", b"v"),)), Record(8, 1001, None, b"")]
GOOD = build_batch(GOOD_RECORDS)


def patched(fmt: str, at: int, value: int) -> bytearray:
    buf = bytearray(GOOD)
    struct.pack_into(fmt, buf, at, value)
    return buf


def test_good_batch_is_good() -> None:
    header = read_header(GOOD)
    verify_crc(GOOD, 0, header)
    assert decode_records(GOOD, 0, header) == GOOD_RECORDS


@pytest.mark.parametrize("at", [21, 40, 60, HEADER_SIZE, len(GOOD) - 1])
def test_wrong_crc_names_both_values(at: int) -> None:
    buf = bytearray(GOOD)
    buf[at] ^= 0x40
    header = read_header(buf)
    computed = crc32c(bytes(buf[21:]))
    assert computed != header.crc
    with pytest.raises(CorruptRecordError) as info:
        verify_crc(buf, 0, header)
    assert f"{computed:#010x}" in str(info.value)
    assert f"{header.crc:#010x}" in str(info.value)
    assert "base offset 7" in str(info.value)


def test_wrong_stored_crc() -> None:
    stored = (read_header(GOOD).crc + 1) & 0xFFFFFFFF
    buf = patched(">I", 17, stored)
    with pytest.raises(CorruptRecordError, match=f"header says {stored:#010x}"):
        verify_crc(buf, 0, read_header(buf))


def test_crc_excludes_offset_length_epoch_but_covers_magic_free_header() -> None:
    # Offset and epoch are outside the CRC; everything from attributes on is inside.
    verify_crc(patched(">q", 0, 123456), 0, read_header(patched(">q", 0, 123456)))
    verify_crc(patched(">i", 12, 99), 0, read_header(patched(">i", 12, 99)))
    for at, fmt, value in [(23, ">i", 0), (27, ">q", 5), (43, ">q", 77), (57, ">i", 3)]:
        buf = patched(fmt, at, value)
        header = read_header(buf)
        with pytest.raises(CorruptRecordError, match="CRC32C"):
            verify_crc(buf, 0, header)


@pytest.mark.parametrize("extra", [1, 2, 1000, (1 << 31) - 1 - (len(GOOD) - 12)])
def test_batch_length_beyond_buffer(extra: int) -> None:
    buf = patched(">i", 8, len(GOOD) - 12 + extra)
    with pytest.raises(CorruptRecordError, match="beyond its buffer"):
        read_header(buf)


def test_batch_length_beyond_explicit_limit() -> None:
    with pytest.raises(CorruptRecordError, match="1 bytes beyond"):
        read_header(GOOD, 0, len(GOOD) - 1)
    # A caller with only the header bytes passes the file's end as the limit.
    assert read_header(GOOD[:HEADER_SIZE], 0, len(GOOD)).records_count == 2


@pytest.mark.parametrize("length", [MIN_BATCH_LENGTH - 1, 0, -1, -(1 << 31)])
def test_batch_length_below_minimum(length: int) -> None:
    with pytest.raises(CorruptRecordError, match="below minimum 49"):
        read_header(patched(">i", 8, length))


def test_minimum_batch_length_is_accepted_by_read_header() -> None:
    buf = header_bytes(batch_length=MIN_BATCH_LENGTH)
    assert read_header(buf).size == HEADER_SIZE


@pytest.mark.parametrize("magic", [0, 1, 3, -1])
def test_unsupported_magic(magic: int) -> None:
    with pytest.raises(UnsupportedMagicError, match=f"magic {magic & 0xFF}|magic {magic}"):
        read_header(patched(">b", 16, magic))


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_unsupported_magic_in_a_short_buffer(magic: int) -> None:
    buf = patched(">b", 16, magic)[:30]
    with pytest.raises(UnsupportedMagicError, match=f"magic {magic}"):
        read_header(buf)


@pytest.mark.parametrize("count", [-1, -(1 << 31)])
def test_negative_records_count(count: int) -> None:
    with pytest.raises(InvalidRecordError, match=f"negative record count {count}"):
        read_header(patched(">i", 57, count))


@pytest.mark.parametrize("delta", [-1, -(1 << 31)])
def test_negative_last_offset_delta(delta: int) -> None:
    with pytest.raises(InvalidRecordError, match=f"negative last offset delta {delta}"):
        read_header(patched(">i", 23, delta))


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_ids(codec_id: int) -> None:
    with pytest.raises(UnsupportedCompressionError, match=f"codec id {codec_id}"):
        read_header(patched(">h", 21, codec_id | 0x08))


@pytest.mark.parametrize("size", range(HEADER_SIZE))
def test_fewer_than_61_bytes(size: int) -> None:
    with pytest.raises(CorruptRecordError) as info:
        read_header(GOOD[:size])
    assert type(info.value) is CorruptRecordError
    assert f"{size} bytes left, a header needs 61" in str(info.value)


def test_header_at_an_offset_in_a_larger_buffer() -> None:
    buf = b"\xff" * 13 + GOOD + b"\xff" * 5
    header = read_header(buf, 13, 13 + len(GOOD))
    verify_crc(buf, 13, header)
    assert decode_records(buf, 13, header) == GOOD_RECORDS
    with pytest.raises(CorruptRecordError, match="at byte 13: 40 bytes left"):
        read_header(buf, 13, 13 + 40)


def test_record_count_disagreeing_with_records_is_corrupt() -> None:
    for count in (1, 3):
        buf = patched(">i", 57, count)
        header = read_header(buf)
        with pytest.raises(CorruptRecordError):
            decode_records(buf, 0, header)
        area = records_area(buf, 0, header, 1 << 20)
        with pytest.raises(CorruptRecordError):
            scan_records(area, 0, len(area), count, True)


# --- the C scanner ----------------------------------------------------------------------


def test_scan_dense_rejects_gaps_that_sparse_accepts() -> None:
    records = [Record(0, 10, b"a", b"x"), Record(2, 12, b"b", b"y"), Record(3, 9, None, b"z")]
    raw, header = batch_of(records, base_offset=0)
    assert header.last_offset_delta == 3
    area = records_area(raw, 0, header, 1 << 20)
    with pytest.raises(InvalidRecordError, match="record 1: offset delta 2 out of sequence"):
        scan_records(area, 0, len(area), 3, True)
    assert scan_records(area, 0, len(area), 3, False) == (-1, 2)
    assert decode_records(raw, 0, header) == records


@pytest.mark.parametrize(
    "offsets", [[0, 0], [0, 2, 1], [1, 0], [0, 5, 5]], ids=lambda o: "-".join(map(str, o))
)
def test_scan_sparse_rejects_deltas_that_do_not_increase(offsets: list[int]) -> None:
    records = [Record(o, 0, None, b"v") for o in offsets]
    raw, header = batch_of(records, base_offset=0)
    area = records_area(raw, 0, header, 1 << 20)
    with pytest.raises(InvalidRecordError, match="out of sequence"):
        scan_records(area, 0, len(area), len(records), False)
    with pytest.raises(InvalidRecordError, match="out of sequence"):
        scan_records(area, 0, len(area), len(records), True)


def test_scan_rejects_a_negative_first_offset_delta() -> None:
    raw, header = batch_of([Record(4, 0, None, b"v"), Record(6, 0, None, b"w")], base_offset=5)
    assert header.last_offset_delta == 1
    area = records_area(raw, 0, header, 1 << 20)
    with pytest.raises(InvalidRecordError, match="record 0: offset delta -1"):
        scan_records(area, 0, len(area), 2, False)


@given(
    st.lists(
        st.one_of(st.integers(-3, 8), st.integers(-(1 << 31), (1 << 31) - 1)),
        min_size=1,
        max_size=6,
    )
)
@FAST
def test_scan_offset_delta_rules(deltas: list[int]) -> None:
    records = [Record(d, 0, None, b"v") for d in deltas]
    area = build_batch(records, base_offset=0)[HEADER_SIZE:]
    increasing = all(a < b for a, b in zip([-1, *deltas], deltas, strict=False))
    for dense, ok in ((False, increasing), (True, deltas == list(range(len(deltas))))):
        if ok:
            assert scan_records(area, 0, len(area), len(deltas), dense) == (0, 0)
        else:
            with pytest.raises(InvalidRecordError, match="out of sequence"):
                scan_records(area, 0, len(area), len(deltas), dense)
    # The Python decoder reports deltas as they are; ordering is the scanner's job.
    batch = with_records_area(header_bytes(), area, len(deltas))
    assert [r.offset for r in decode_records(batch, 0, read_header(batch))] == deltas


def test_scan_works_on_every_buffer_type() -> None:
    raw, header = batch_of(GOOD_RECORDS)
    size = header.size
    expected = (0, 1)
    assert scan_records(raw, HEADER_SIZE, size, 2, True) == expected
    assert scan_records(bytearray(raw), HEADER_SIZE, size, 2, True) == expected
    assert scan_records(memoryview(raw), HEADER_SIZE, size, 2, True) == expected
    padded = memoryview(b"\x01\x02\x03" + raw)[3:]
    assert scan_records(padded, HEADER_SIZE, size, 2, True) == expected
    with tempfile.TemporaryFile() as file:
        file.write(b"\x00" * 5 + raw)
        file.flush()
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            assert scan_records(mapped, 5 + HEADER_SIZE, 5 + size, 2, True) == expected
            header_in_map = read_header(mapped, 5)
            verify_crc(mapped, 5, header_in_map)
            area = records_area(mapped, 5, header_in_map, 1 << 20)
            assert scan_records(area, 0, len(area), 2, True) == expected
            del area


@pytest.mark.parametrize(
    ("pos", "end", "count"),
    [
        (-1, 10, 1),
        (10, 9, 1),
        (0, len(GOOD) + 1, 1),
        (len(GOOD) + 1, len(GOOD) + 1, 0),
        (0, len(GOOD), -1),
    ],
)
def test_scan_bounds_outside_the_buffer(pos: int, end: int, count: int) -> None:
    with pytest.raises(ValueError, match="bounds outside the buffer"):
        scan_records(GOOD, pos, end, count, True)


def test_scan_of_no_records() -> None:
    assert scan_records(b"", 0, 0, 0, True) == (INT64_MAX, INT64_MIN)
    with pytest.raises(CorruptRecordError, match="1 bytes after the last of 0 records"):
        scan_records(b"\x00", 0, 1, 0, True)


def test_scan_reports_trailing_bytes_and_short_length() -> None:
    raw, header = batch_of(GOOD_RECORDS)
    area = bytes(records_area(raw, 0, header, 1 << 20))
    with pytest.raises(CorruptRecordError, match="2 bytes after the last of 2 records"):
        scan_records(area + b"\x00\x00", 0, len(area) + 2, 2, True)
    with pytest.raises(CorruptRecordError, match="does not fit its batch"):
        scan_records(b"\x0a" + b"\x00" * 4, 0, 5, 1, True)  # length 5, below the minimum 6


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(1, 255)),
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.sampled_from([1, 2, 4, 0x80])),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 16), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 16), st.integers(0, 255)),
)


def mutate(area: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(area)
    for kind, where, byte in ops:
        at = where % (len(buf) + 1)
        if kind == "flip" and buf:
            buf[at % len(buf)] ^= byte
        elif kind == "truncate":
            del buf[at:]
        elif kind == "insert":
            buf.insert(at, byte)
    return bytes(buf)


@given(
    record_lists(max_size=4),
    st.lists(mutation, min_size=1, max_size=3),
    st.sampled_from([0, 0, 0, 0, -1, 1]),
)
@settings(max_examples=400, deadline=None)
def test_scan_fuzz_agrees_with_the_python_decoder(
    records: list[Record], ops: list[tuple[str, int, int]], count_shift: int
) -> None:
    raw, header = batch_of(records)
    area = mutate(bytes(raw[HEADER_SIZE:]), ops)
    count = max(0, len(records) + count_shift)

    scanned = {}
    for dense in (True, False):
        try:
            scanned[dense] = scan_records(area, 0, len(area), count, dense)
        except (CorruptRecordError, InvalidRecordError) as exc:
            scanned[dense] = exc

    batch = with_records_area(raw, area, count)
    mutated_header = read_header(batch)
    try:
        decoded = decode_records(batch, 0, mutated_header)
    except CorruptRecordError as exc:
        event("decoder refused")
        # The scanner may still accept bytes the decoder refuses only for a non-UTF-8
        # header key, which it does not inspect.
        if not isinstance(scanned[False], Exception):
            assert "not UTF-8" in str(exc)
        return

    deltas = [r.offset - header.base_offset for r in decoded]
    ts_deltas = [r.timestamp - mutated_header.base_timestamp for r in decoded]
    increasing = all(a < b for a, b in zip([-1, *deltas], deltas, strict=False))
    event("decoder accepted")
    if not increasing:
        event("offset deltas out of order")
        assert isinstance(scanned[False], InvalidRecordError)
        assert isinstance(scanned[True], InvalidRecordError)
        return
    assert not isinstance(scanned[False], Exception), scanned[False]
    if all(INT64_MIN <= d <= INT64_MAX for d in ts_deltas):
        expected = (min(ts_deltas), max(ts_deltas)) if ts_deltas else (INT64_MAX, INT64_MIN)
        assert scanned[False] == expected
    if deltas == list(range(count)):
        assert scanned[True] == scanned[False]
    else:
        assert isinstance(scanned[True], InvalidRecordError)


@given(
    record_lists(max_size=4),
    st.lists(mutation, max_size=3),
    st.sampled_from([0, 0, 0, 0, -1, 1]),
    st.booleans(),
)
@settings(max_examples=400, deadline=None)
def test_c_decoder_agrees_with_the_python_decoder(
    records: list[Record], ops: list[tuple[str, int, int]], count_shift: int, log_append: bool
) -> None:
    """decode_area (C) returns what decode_area_in_python returns, or declines (None) where
    Python refuses the bytes, on intact and mutated records areas."""
    raw, header = batch_of(records)
    area = mutate(bytes(raw[HEADER_SIZE:]), ops)
    count = max(0, len(records) + count_shift)
    header = header._replace(records_count=count)
    if log_append:
        header = header._replace(attributes=header.attributes | LOG_APPEND_TIME_FLAG)
    fixed = header.max_timestamp if log_append else None
    args = (header.base_offset, header.base_timestamp, fixed, Record, Header)
    decoded = decode_area(area, 0, len(area), count, *args)
    try:
        expected = decode_area_in_python(area, header)
    except CorruptRecordError:
        event("python refused")
        assert decoded is None
        return
    event("python accepted")
    if not ops and not count_shift:
        assert decoded is not None  # an intact batch never falls back to Python
    assert decoded is None or decoded == expected
    if decoded is not None:
        assert all(type(r) is Record and all(type(h) is Header for h in r.headers) for r in decoded)


@given(record_lists(max_size=4), st.binary(min_size=1, max_size=64))
@settings(max_examples=200, deadline=None)
def test_scan_survives_garbage(records: list[Record], garbage: bytes) -> None:
    area = build_batch(records)[HEADER_SIZE:]
    for data in (garbage, area[: len(area) // 2] + garbage, garbage + area):
        for count in (0, 1, len(records), 1 << 40):
            for dense in (True, False):
                with contextlib.suppress(CorruptRecordError, InvalidRecordError):
                    scan_records(data, 0, len(data), count, dense)


# --- iter_batches -----------------------------------------------------------------------

THREE = [
    build_batch([Record(0, 1, b"a", b"1")]),
    build_batch(
        [Record(1, 2, None, b"2" * 200), Record(2, 3, b"b", None)], compression=Compression.GZIP
    ),
    build_batch([Record(3, 4, b"c", b"3", (Header("k", None),))], compression=Compression.LZ4),
]
THREE_BUF = b"".join(THREE)
THREE_POS = [0, len(THREE[0]), len(THREE[0]) + len(THREE[1])]


def test_iter_batches_yields_positions_and_headers() -> None:
    walked = list(iter_batches(THREE_BUF))
    assert [pos for pos, _ in walked] == THREE_POS
    assert [h.base_offset for _, h in walked] == [0, 1, 3]
    assert [h.size for _, h in walked] == [len(b) for b in THREE]
    assert [h.compression for _, h in walked] == [
        Compression.NONE,
        Compression.GZIP,
        Compression.LZ4,
    ]
    for pos, h in walked:
        verify_crc(THREE_BUF, pos, h)
    records = [r for pos, h in walked for r in decode_records(THREE_BUF, pos, h)]
    assert [r.offset for r in records] == [0, 1, 2, 3]


def test_iter_batches_every_prefix_yields_the_whole_batches() -> None:
    view = memoryview(THREE_BUF)
    for size in range(len(THREE_BUF) + 1):
        got = [pos for pos, _ in iter_batches(view[:size])]
        want = [p for p, b in zip(THREE_POS, THREE, strict=True) if p + len(b) <= size]
        assert got == want, size
        # The same through `limit` instead of slicing.
        assert [pos for pos, _ in iter_batches(THREE_BUF, 0, size)] == want, size


def test_iter_batches_from_a_position() -> None:
    walked = list(iter_batches(THREE_BUF, THREE_POS[1]))
    assert [pos for pos, _ in walked] == THREE_POS[1:]


def test_iter_batches_raises_on_a_corrupt_whole_batch() -> None:
    buf = bytearray(THREE_BUF)
    buf[THREE_POS[1] + 16] = 1  # magic of the second batch
    walk = iter_batches(buf)
    assert next(walk)[0] == 0
    with pytest.raises(UnsupportedMagicError):
        next(walk)


@pytest.mark.parametrize(
    ("field", "encoded"),
    [("timestamp delta", b"\xff" * 9 + b"\x7f"), ("offset delta", b"\xfe\xff\xff\xff\x1f")],
)
def test_scanner_and_decoder_refuse_overflowing_varints(field, encoded):
    body = b"\x00" + (encoded if field == "timestamp delta" else b"\x00")
    body += b"\x00" if field == "timestamp delta" else encoded
    body += b"\x01\x02" + b"\x00"  # null key, empty value, no headers
    record = encode_varint(len(body)) + body
    with pytest.raises(CorruptRecordError):
        scan_records(record, 0, len(record), 1, False)
    with pytest.raises(CorruptRecordError):
        decode_varint(encoded, 0, len(encoded), 10 if field == "timestamp delta" else 5)
