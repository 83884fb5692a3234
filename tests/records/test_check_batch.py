"""check_batch (C): the whole format check of one uncompressed batch in a single call.

It must accept exactly what the Python sequence read_header, verify_crc and scan_records
accepts, returning the same fields, and decline (None) everything else, including every
compressed batch. The fuzz tests mutate headers and records, and often recompute the CRC
afterwards so that the checks behind it are reached too.
"""

from __future__ import annotations

import mmap
import struct
import tempfile

import pytest
from crc32c import crc32c
from hypothesis import event, given, settings
from hypothesis import strategies as st

from directlog.records.batch import (
    ATTRIBUTES_AT,
    CRC_AT,
    HEADER_SIZE,
    CheckedBatch,
    Header,
    Record,
    TimestampType,
    build_batch,
    check_batch,
    read_header,
    scan_records,
    verify_crc,
)
from directlog.records.compression import Compression
from directlog.records.errors import RecordError

_HEADER = struct.Struct(">qiibIhiqqqhii")
# (name, byte position, struct format) of each header field, from Kafka's documented layout.
LAYOUT = [
    ("base_offset", 0, ">q"),
    ("batch_length", 8, ">i"),
    ("partition_leader_epoch", 12, ">i"),
    ("magic", 16, ">b"),
    ("crc", 17, ">I"),
    ("attributes", 21, ">h"),
    ("last_offset_delta", 23, ">i"),
    ("base_timestamp", 27, ">q"),
    ("max_timestamp", 35, ">q"),
    ("producer_id", 43, ">q"),
    ("producer_epoch", 51, ">h"),
    ("base_sequence", 53, ">i"),
    ("records_count", 57, ">i"),
]
FIELDS = tuple(name for name, _, _ in LAYOUT)
FIELD_AT = {name: at for name, at, _ in LAYOUT}
FIELD_FORMAT = {name: fmt for name, _, fmt in LAYOUT}


def reference(buf: bytes | bytearray, pos: int, end: int, dense: bool) -> CheckedBatch | None:
    """What check_batch must return, from the Python checks of the append path."""
    try:
        header = read_header(buf, pos, end)
        verify_crc(buf, pos, header)
        if header.compression is not Compression.NONE:
            return None
        stop = pos + header.size
        min_delta, max_delta = scan_records(
            buf, pos + HEADER_SIZE, stop, header.records_count, dense
        )
    except RecordError:
        return None
    return header.checked(header.records_count, min_delta, max_delta)


def fix_crc(buf: bytearray, pos: int = 0) -> None:
    """Recompute the CRC of the batch at `pos` as far as its claimed length allows."""
    if len(buf) - pos < HEADER_SIZE:
        return
    length = struct.unpack_from(">i", buf, pos + 8)[0]
    stop = min(len(buf), max(pos + ATTRIBUTES_AT, pos + 12 + length))
    struct.pack_into(">I", buf, pos + CRC_AT, crc32c(buf[pos + ATTRIBUTES_AT : stop]))


# --- known answers ----------------------------------------------------------------------


def test_accepts_a_sound_batch_with_its_fields() -> None:
    records = [Record(100 + i, 5_000 + 7 * i, b"k", b"v" * i) for i in range(4)]
    raw = build_batch(records, producer_id=7, partition_leader_epoch=3)
    header = read_header(raw)
    expected = (len(raw), 100, 3, 0, 3, 5_000, 5_021, 4, 0, 21)
    assert check_batch(raw, 0, len(raw), True) == expected
    assert check_batch(raw, 0, len(raw), False) == expected
    assert reference(raw, 0, len(raw), True) == expected
    assert header.size == len(raw)


def test_keeps_signed_fields_and_flags() -> None:
    records = [Record(0, -1, None, None), Record(1, -9, None, b"")]
    raw = build_batch(
        records,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
        transactional=True,
        control=True,
        producer_epoch=-1,
    )
    checked = check_batch(raw, 0, len(raw), True)
    assert checked is not None
    assert checked == reference(raw, 0, len(raw), True)
    assert checked[3] == 0x08 | 0x10 | 0x20
    assert (checked[5], checked[6], checked[8], checked[9]) == (-1, -1, -8, 0)


@pytest.mark.parametrize("codec", [c for c in Compression if c is not Compression.NONE])
def test_declines_every_compressed_batch(codec: Compression) -> None:
    raw = build_batch([Record(0, 1, None, b"x" * 300)], compression=codec)
    assert reference(raw, 0, len(raw), True) is None
    assert check_batch(raw, 0, len(raw), True) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("magic", 1),
        ("magic", 3),
        ("batch_length", 48),
        ("batch_length", -1),
        ("batch_length", (1 << 31) - 1),
        ("records_count", -1),
        ("records_count", 3),
        ("records_count", 0),
        ("last_offset_delta", -1),
        ("attributes", 5),
        ("attributes", 7),
        ("attributes", -1),
    ],
)
def test_declines_a_bad_header_field_even_with_a_valid_crc(field: str, value: int) -> None:
    raw = bytearray(build_batch([Record(0, 1, None, b"a"), Record(1, 2, None, b"b")]))
    struct.pack_into(FIELD_FORMAT[field], raw, FIELD_AT[field], value)
    fix_crc(raw)
    assert reference(raw, 0, len(raw), True) is None
    assert check_batch(raw, 0, len(raw), True) is None


def test_declines_a_crc_mismatch() -> None:
    raw = bytearray(build_batch([Record(0, 1, None, b"abc")]))
    raw[-1] ^= 0x40
    assert check_batch(raw, 0, len(raw), True) is None
    fix_crc(raw)
    assert check_batch(raw, 0, len(raw), True) == reference(raw, 0, len(raw), True)


def test_dense_declines_gaps_that_sparse_accepts() -> None:
    raw = build_batch([Record(0, 1, None, b"a"), Record(2, 2, None, b"b")])
    assert check_batch(raw, 0, len(raw), True) is None
    assert check_batch(raw, 0, len(raw), False) == reference(raw, 0, len(raw), False)
    assert check_batch(raw, 0, len(raw), False) is not None


def test_the_batch_must_end_by_end() -> None:
    raw = build_batch([Record(0, 1, None, b"abc")])
    padded = b"\x00" * 9 + raw + b"\xff" * 5
    assert check_batch(padded, 9, 9 + len(raw), True) == reference(raw, 0, len(raw), True)
    assert check_batch(padded, 9, len(padded), True) is not None
    assert check_batch(padded, 9, 8 + len(raw), True) is None
    assert check_batch(padded, 9, 9 + HEADER_SIZE - 1, True) is None
    assert check_batch(padded, 9, 9, True) is None


@pytest.mark.parametrize(("pos", "end"), [(-1, 10), (5, 4), (0, 10_000)])
def test_bounds_outside_the_buffer_are_a_caller_error(pos: int, end: int) -> None:
    raw = build_batch([Record(0, 1, None, b"abc")])
    with pytest.raises(ValueError, match="bounds outside the buffer"):
        check_batch(raw, pos, end, True)


def test_works_on_every_buffer_type() -> None:
    raw = build_batch([Record(0, 1, b"k", b"abc"), Record(1, 3, None, None)])
    expected = reference(raw, 0, len(raw), True)
    assert expected is not None
    assert check_batch(bytearray(raw), 0, len(raw), True) == expected
    assert check_batch(memoryview(raw), 0, len(raw), True) == expected
    with tempfile.TemporaryFile() as file:
        file.write(b"\x00" * 3 + raw)
        file.flush()
        with mmap.mmap(file.fileno(), 0) as mapped:
            assert check_batch(mapped, 3, 3 + len(raw), True) == expected
    with pytest.raises(TypeError):
        check_batch("not bytes", 0, 0, True)  # type: ignore[arg-type]


# --- fuzzing against the Python checks ---------------------------------------------------

records_strategy = st.lists(
    st.tuples(
        st.integers(-(1 << 40), 1 << 40),
        st.none() | st.binary(max_size=40),
        st.none() | st.binary(max_size=60),
        st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=8)), max_size=2),
    ),
    min_size=1,
    max_size=5,
)


def make_batch(data: st.DataObject) -> bytes:
    spec = data.draw(records_strategy)
    base = data.draw(st.integers(-(1 << 40), 1 << 62))
    gap = data.draw(st.sampled_from([1, 1, 1, 2, 1000]))
    records = [
        Record(base + gap * i, ts, key, value, tuple(Header(k, v) for k, v in headers))
        for i, (ts, key, value, headers) in enumerate(spec)
    ]
    codec = data.draw(st.sampled_from([Compression.NONE] * 4 + [Compression.GZIP]))
    return build_batch(
        records,
        compression=codec,
        partition_leader_epoch=data.draw(st.integers(-(1 << 31), (1 << 31) - 1)),
        producer_id=data.draw(st.integers(-1, 1 << 62)),
        timestamp_type=data.draw(st.sampled_from(list(TimestampType))),
    )


mutations = st.lists(
    st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 1 << 12), st.integers(1, 255)),
        st.tuples(st.just("header"), st.integers(0, HEADER_SIZE - 1), st.integers(1, 255)),
        st.tuples(st.just("truncate"), st.integers(0, 1 << 12), st.just(0)),
        st.tuples(st.just("insert"), st.integers(0, 1 << 12), st.integers(0, 255)),
        st.tuples(
            st.just("field"),
            st.sampled_from([f for f in FIELDS if f != "crc"]),
            st.integers(-(1 << 63), (1 << 63) - 1),
        ),
    ),
    max_size=3,
)


def mutate(buf: bytearray, pos: int, ops: list[tuple[str, object, int]]) -> None:
    for kind, where, value in ops:
        if kind == "field":
            assert isinstance(where, str)
            fmt = FIELD_FORMAT[where]
            bits = struct.calcsize(fmt) * 8
            value = (value + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))
            if where == "magic" and value == 2:
                continue
            if len(buf) >= pos + HEADER_SIZE:
                struct.pack_into(fmt, buf, pos + FIELD_AT[where], value)
            continue
        assert isinstance(where, int)
        at = pos + where if kind == "header" else where % (len(buf) + 1)
        if kind in ("flip", "header") and at < len(buf):
            buf[at] ^= value
        elif kind == "truncate":
            del buf[at:]
        elif kind == "insert":
            buf.insert(at, value)


@given(st.data())
@settings(max_examples=600, deadline=None)
def test_fuzz_agrees_with_the_python_checks(data: st.DataObject) -> None:
    raw = make_batch(data)
    prefix = data.draw(st.binary(max_size=8))
    suffix = data.draw(st.binary(max_size=8))
    buf = bytearray(prefix + raw + suffix)
    pos = len(prefix)
    mutate(buf, pos, data.draw(mutations))
    if data.draw(st.booleans()):
        fix_crc(buf, pos)
    pos = min(pos, len(buf))
    end = data.draw(st.sampled_from([len(buf), min(len(buf), pos + len(raw)), pos]))
    if data.draw(st.integers(0, 9)) == 0:
        end = data.draw(st.integers(pos, len(buf)))
    dense = data.draw(st.booleans())
    expected = reference(buf, pos, end, dense)
    event("accepted" if expected is not None else "declined")
    assert check_batch(buf, pos, end, dense) == expected
    assert check_batch(bytes(buf), pos, end, dense) == expected


@given(st.data(), st.sampled_from([f for f in FIELDS if f != "crc"]), st.booleans())
@settings(max_examples=600, deadline=None)
def test_fuzz_one_header_field_behind_a_valid_crc(
    data: st.DataObject, field: str, dense: bool
) -> None:
    buf = bytearray(make_batch(data))
    bits = struct.calcsize(FIELD_FORMAT[field]) * 8
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    current = struct.unpack_from(FIELD_FORMAT[field], buf, FIELD_AT[field])[0]
    value = data.draw(
        st.one_of(
            st.sampled_from([low, -1, 0, 1, 2, high]),
            st.integers(current - 3, current + 3).filter(lambda v: low <= v <= high),
            st.integers(low, high),
        )
    )
    struct.pack_into(FIELD_FORMAT[field], buf, FIELD_AT[field], value)
    fix_crc(buf)
    expected = reference(buf, 0, len(buf), dense)
    event("accepted" if expected is not None else "declined")
    assert check_batch(buf, 0, len(buf), dense) == expected


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_a_sound_uncompressed_batch_is_always_accepted(data: st.DataObject) -> None:
    raw = make_batch(data)
    header = read_header(raw)
    dense = header.last_offset_delta == header.records_count - 1
    expected = reference(raw, 0, len(raw), dense)
    if header.compression is Compression.NONE:
        assert expected is not None
        assert expected[:8] == (
            len(raw),
            header.base_offset,
            header.partition_leader_epoch,
            header.attributes,
            header.last_offset_delta,
            header.base_timestamp,
            header.max_timestamp,
            header.records_count,
        )
    assert check_batch(raw, 0, len(raw), dense) == expected


def test_header_layout_matches_the_struct() -> None:
    raw = build_batch([Record(0, 1, None, b"x")])
    values = _HEADER.unpack_from(raw)
    for name, value in zip(FIELDS, values, strict=True):
        assert struct.unpack_from(FIELD_FORMAT[name], raw, FIELD_AT[name])[0] == value
