"""Lazy down-conversion (KIP-283) of v2 batches for old consumers, read back with
kafka-python's own legacy decoder: exactly S_pre bytes, whole messages equal to the
records, a prefix of whole batches that always holds the first one, the padding ignored."""

from __future__ import annotations

import asyncio
import struct
import warnings

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from directlog.records._scan import legacy_size
from directlog.records.batch import (
    HEADER_SIZE,
    Header,
    Record,
    TimestampType,
    build_batch,
    iter_batches,
)
from directlog.records.compression import Compression
from services.broker.down_conversion import (
    DownConversion,
    convert_in_c,
    convert_in_python,
    holds_zstd,
    overflow,
)
from services.broker.metrics import BrokerMetrics
from services.broker.storage.log_file import FileSlice, LogFile

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record import MemoryRecords

CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4]
BASE_TIMESTAMP = 1_700_000_000_000


@st.composite
def batches(draw: st.DrawFn) -> tuple[bytes, list[list[Record]], list[TimestampType]]:
    """Consecutive v2 batches of varied shapes: tiny records (which grow when converted),
    records with headers (which shrink), null and empty keys and values, both timestamp
    types, every legacy codec."""
    blobs = st.none() | st.binary(max_size=12) | st.binary(min_size=200, max_size=600)
    headers = st.lists(
        st.builds(Header, st.text(max_size=20), st.binary(max_size=300)), max_size=3
    ).map(tuple)
    offset = draw(st.integers(0, 10_000))
    data = []
    groups = []
    types = []
    for _ in range(draw(st.integers(1, 8))):
        records = []
        for _ in range(draw(st.integers(1, 12))):
            timestamp = BASE_TIMESTAMP + draw(st.integers(0, 10_000))
            records.append(Record(offset, timestamp, draw(blobs), draw(blobs), draw(headers)))
            offset += 1
        timestamp_type = draw(st.sampled_from(TimestampType))
        codec = draw(st.sampled_from(CODECS))
        data.append(build_batch(records, compression=codec, timestamp_type=timestamp_type))
        groups.append(records)
        types.append(timestamp_type)
    return b"".join(data), groups, types


def expected(records: list[Record], timestamp_type: TimestampType, magic: int) -> list[tuple]:
    """(offset, timestamp, key, value) as an old consumer reads them."""
    if magic == 0:
        return [(r.offset, None, r.key, r.value) for r in records]
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        top = max(r.timestamp for r in records)
        return [(r.offset, top, r.key, r.value) for r in records]
    return [(r.offset, r.timestamp, r.key, r.value) for r in records]


def read_back(data: bytes) -> list[tuple]:
    """Every whole message, through kafka-python's decoder; what follows them must be the
    cut-off message (a size past the end)."""
    records = MemoryRecords(data)
    got = []
    while records.has_next():
        batch = records.next_batch()
        assert batch is not None
        for record in batch:
            got.append((record.offset, record.timestamp, record.key, record.value))
            assert record.headers == []
    tail = len(data) - records.valid_bytes()
    if tail >= 12:
        offset, size = struct.unpack_from(">qi", data, records.valid_bytes())
        assert (offset, size) == (-1, 0x7FFFFFFF)
    assert data[records.valid_bytes() + 12 :] == bytes(max(tail - 12, 0))
    return got


def convert(source: bytes | FileSlice, magic: int, chunk_bytes: int) -> tuple[int, bytes]:
    metrics = BrokerMetrics()
    view = source if isinstance(source, FileSlice) else memoryview(source)
    conversion = DownConversion.plan(view, magic, chunk_bytes, "t", metrics)
    gauge = metrics.temporary_memory.labels("fetch")

    async def collect() -> bytes:
        out = []
        async for chunk in conversion.chunks():
            assert gauge._value.get() <= 4 * max(chunk_bytes, 64 * 1024)
            out.append(chunk)
        return b"".join(out)

    data = asyncio.run(collect())
    assert gauge._value.get() == 0
    assert conversion.eager() == data  # the eager path answers the same bytes
    return conversion.size, data


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    shapes=batches(),
    magic=st.sampled_from([0, 1]),
    chunk_bytes=st.sampled_from([1, 300, 4096, 128 * 1024]),
)
def test_a_conversion_sends_s_pre_bytes_of_whole_batches_then_padding(shapes, magic, chunk_bytes):
    data, groups, types = shapes
    size, out = convert(data, magic, chunk_bytes)
    assert len(out) == size >= len(data)
    got = read_back(out)
    wanted = [expected(g, t, magic) for g, t in zip(groups, types, strict=True)]
    # A prefix of whole batches, at least the first: the next fetch asks for the offset
    # after the last message read, so nothing is skipped or repeated.
    whole = 0
    flat: list[tuple] = []
    while len(flat) < len(got):
        flat += wanted[whole]
        whole += 1
    assert whole >= 1 and got == flat
    event("batches cut: longer after conversion" if whole < len(groups) else "every batch")
    event("padded" if MemoryRecords(out).valid_bytes() < len(out) else "exactly S_pre")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=batches(), magic=st.sampled_from([0, 1]))
def test_the_c_encoder_writes_what_the_python_one_does(shapes, magic):
    data, _, _ = shapes
    for position, header in iter_batches(data):
        fast = convert_in_c(data, position, header, magic)
        assert fast is not None
        assert fast == convert_in_python(data, position, header, magic)
        if header.compression is Compression.NONE:  # sized without converting
            area = (position + HEADER_SIZE, position + header.size)
            assert legacy_size(data, *area, header.records_count, magic) == len(fast)


def test_longer_after_conversion_sends_the_batches_that_fit():
    """Tiny records grow by the legacy per-message overhead: the first batch always goes,
    the rest only while they fit in S_pre."""
    groups = [[Record(b * 10 + i, BASE_TIMESTAMP, None, b"x") for i in range(10)] for b in range(5)]
    data = b"".join(build_batch(g) for g in groups)
    size, out = convert(data, 1, 128 * 1024)
    assert size == len(data) and len(out) == size
    got = read_back(out)
    assert len(got) in (10, 20, 30, 40)  # whole batches only, not all of them
    assert got == [(o, BASE_TIMESTAMP, None, b"x") for o in range(len(got))]


def test_a_first_batch_longer_after_conversion_sets_s_pre():
    records = [Record(o, BASE_TIMESTAMP, None, b"") for o in range(50)]
    data = build_batch(records)
    size, out = convert(data, 1, 128 * 1024)
    assert size > len(data)
    assert [r[0] for r in read_back(out)] == list(range(50))


def test_shorter_after_conversion_is_padded_with_a_cut_off_message():
    """Headers do not exist before v2: dropping them leaves room, filled with a message
    header whose size runs past the end."""
    heavy = (Header("trace", bytes(500)),)
    records = [Record(o, BASE_TIMESTAMP + o, b"k", b"v", heavy) for o in range(20)]
    data = build_batch(records)
    size, out = convert(data, 0, 128 * 1024)
    assert size == len(data)
    got = read_back(out)
    assert got == [(o, None, b"k", b"v") for o in range(20)]
    assert len(out) - MemoryRecords(out).valid_bytes() > 12


@pytest.mark.parametrize("codec", CODECS[1:])
def test_compressed_batches_stay_compressed_with_their_codec(codec):
    records = [Record(o, BASE_TIMESTAMP + o, b"key", bytes(100)) for o in range(30)]
    data = build_batch(records, compression=codec)
    _, out = convert(data, 1, 128 * 1024)
    wrapper = MemoryRecords(out).next_batch()
    assert wrapper.compression_type == int(codec)
    assert [r[0] for r in read_back(out)] == list(range(30))


def test_a_file_slice_converts_as_memory_does(tmp_path):
    groups = [
        [Record(o * 5 + i, BASE_TIMESTAMP, b"k%d" % i, bytes(300)) for i in range(5)]
        for o in range(40)
    ]
    data = b"".join(build_batch(g, compression=Compression.GZIP) for g in groups)
    log = LogFile(tmp_path / "00.log", create=True)
    log.append([b"junk before", data])
    slice_ = FileSlice(log, len(b"junk before"), len(data))
    assert convert(slice_, 1, 4096) == convert(data, 1, 4096)


def test_control_batches_are_never_handed_over():
    """A control batch converts to nothing; what follows it, even in a later chunk,
    still goes."""
    marker = build_batch(
        [Record(1, BASE_TIMESTAMP, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00")],
        control=True,
        transactional=True,
        producer_id=7,
        producer_epoch=0,
    )
    data = (
        build_batch([Record(0, BASE_TIMESTAMP, b"a", bytes(200))])
        + marker
        + build_batch([Record(2, BASE_TIMESTAMP, b"b", bytes(200))])
    )
    _, out = convert(data, 1, 1)  # a chunk per batch
    assert read_back(out) == [
        (0, BASE_TIMESTAMP, b"a", bytes(200)),
        (2, BASE_TIMESTAMP, b"b", bytes(200)),
    ]


def test_zstd_batches_are_found_from_their_headers():
    plain = build_batch([Record(0, BASE_TIMESTAMP, None, b"a")], compression=Compression.GZIP)
    zstd = build_batch([Record(1, BASE_TIMESTAMP, None, b"b")], compression=Compression.ZSTD)
    assert not holds_zstd(memoryview(plain))
    assert holds_zstd(memoryview(plain + zstd))


@pytest.mark.parametrize("size", [0, 5, 12, 61, 1000])
def test_the_padding_is_a_message_that_never_fits(size):
    pad = overflow(size)
    assert len(pad) == size
    records = MemoryRecords(pad)
    assert not records.has_next() and records.valid_bytes() == 0
