"""Zig-zag varints: known encodings, round trips, and refusal of truncated or overlong input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from directlog.records.errors import CorruptRecordError
from directlog.records.varint import (
    MAX_VARINT_BYTES,
    MAX_VARLONG_BYTES,
    decode_varint,
    encode_varint,
    varint_size,
)

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
int64s = st.integers(INT64_MIN, INT64_MAX)


class TouchRecorder:
    """A buffer that records every index read from it."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.touched: list[int] = []

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> int:
        self.touched.append(index)
        return self.data[index]


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (-1, "01"),
        (1, "02"),
        (-2, "03"),
        (63, "7e"),
        (-64, "7f"),
        (64, "8001"),
        (-65, "8101"),
        (300, "d804"),
        (8191, "fe7f"),
        (8192, "808001"),
        ((1 << 31) - 1, "feffffff0f"),
        (-(1 << 31), "ffffffff0f"),
        (INT64_MAX, "feffffffffffffffff01"),
        (INT64_MIN, "ffffffffffffffffff01"),
    ],
)
def test_known_encodings(value: int, encoded: str) -> None:
    raw = bytes.fromhex(encoded)
    assert encode_varint(value) == raw
    assert varint_size(value) == len(raw)
    assert decode_varint(raw, 0, len(raw)) == (value, len(raw))


@pytest.mark.parametrize("value", [INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1])
def test_int64_extremes_round_trip_in_ten_bytes(value: int) -> None:
    raw = encode_varint(value)
    assert len(raw) == MAX_VARLONG_BYTES
    assert decode_varint(raw, 0, len(raw), MAX_VARLONG_BYTES) == (value, MAX_VARLONG_BYTES)


@pytest.mark.parametrize("value", [INT64_MIN - 1, INT64_MAX + 1, 1 << 70, -(1 << 70)])
def test_encode_refuses_values_outside_int64(value: int) -> None:
    with pytest.raises(ValueError, match="outside int64"):
        encode_varint(value)


@given(int64s, st.binary(max_size=8), st.binary(max_size=8))
@settings(max_examples=300)
def test_round_trip_over_int64(value: int, before: bytes, after: bytes) -> None:
    raw = encode_varint(value)
    assert len(raw) == varint_size(value)
    assert all(byte & 0x80 for byte in raw[:-1])
    assert not raw[-1] & 0x80
    buf = before + raw + after
    assert decode_varint(buf, len(before), len(buf)) == (value, len(before) + len(raw))


@given(st.integers(-(1 << 31), (1 << 31) - 1))
@settings(max_examples=100)
def test_int32_values_fit_the_int32_limit(value: int) -> None:
    raw = encode_varint(value)
    assert len(raw) <= MAX_VARINT_BYTES
    assert decode_varint(raw, 0, len(raw), MAX_VARINT_BYTES) == (value, len(raw))


@given(int64s)
@settings(max_examples=100)
def test_every_truncation_is_refused(value: int) -> None:
    raw = encode_varint(value)
    for cut in range(len(raw)):
        with pytest.raises(CorruptRecordError, match="runs past"):
            decode_varint(raw[:cut], 0, cut)


def test_empty_input_is_refused() -> None:
    with pytest.raises(CorruptRecordError, match="byte 3 runs past"):
        decode_varint(b"\x00\x00\x00", 3, 3)


@pytest.mark.parametrize("max_bytes", [1, 2, 5, 10])
def test_encodings_longer_than_max_bytes_are_refused(max_bytes: int) -> None:
    # max_bytes continuation bytes, then a terminator the decoder must never reach.
    raw = b"\x80" * max_bytes + b"\x00"
    with pytest.raises(CorruptRecordError, match=f"longer than {max_bytes} bytes"):
        decode_varint(raw, 0, len(raw), max_bytes)
    # Exactly max_bytes bytes is still fine while the value fits its type (a tenth byte may
    # only carry bit 63).
    last = 0x01 if max_bytes == 10 else 0x02
    exact = b"\x80" * (max_bytes - 1) + bytes([last])
    unsigned = last << (7 * (max_bytes - 1))
    assert decode_varint(exact, 0, len(exact), max_bytes) == (unsigned >> 1, max_bytes)


def test_int32_limit_refuses_a_six_byte_encoding_of_a_small_value() -> None:
    # 0 padded with redundant continuation bytes: valid protobuf, too long for a varint field.
    raw = bytes.fromhex("808080808000")
    with pytest.raises(CorruptRecordError, match="longer than 5 bytes"):
        decode_varint(raw, 0, len(raw), MAX_VARINT_BYTES)
    assert decode_varint(raw, 0, len(raw), MAX_VARLONG_BYTES) == (0, 6)


def test_long_run_of_continuation_bytes_stops_at_the_limit() -> None:
    raw = b"\xff" * 1000
    with pytest.raises(CorruptRecordError, match="longer than 10 bytes"):
        decode_varint(raw, 0, len(raw))


@given(int64s, st.binary(min_size=1, max_size=4))
@settings(max_examples=200)
def test_never_reads_past_limit(value: int, tail: bytes) -> None:
    raw = encode_varint(value)
    # The bytes after `limit` would complete the varint; the decoder must not look at them.
    for limit in range(len(raw)):
        buf = TouchRecorder(raw + tail)
        with pytest.raises(CorruptRecordError):
            decode_varint(buf, 0, limit)
        assert all(0 <= index < limit for index in buf.touched)
    buf = TouchRecorder(raw + tail)
    assert decode_varint(buf, 0, len(raw)) == (value, len(raw))
    assert buf.touched == list(range(len(raw)))


def test_limit_inside_buffer_refuses_varint_that_continues_past_it() -> None:
    buf = TouchRecorder(bytes.fromhex("800100"))
    with pytest.raises(CorruptRecordError, match="runs past"):
        decode_varint(buf, 0, 1)
    assert buf.touched == [0]


def test_varlong_that_overflows_int64_is_refused():
    with pytest.raises(CorruptRecordError, match="overflows"):
        decode_varint(b"\xff" * 9 + b"\x7f", 0, 10)
    assert decode_varint(b"\xff" * 9 + b"\x01", 0, 10) == (-(1 << 63), 10)


def test_varint_that_overflows_int32_is_refused():
    with pytest.raises(CorruptRecordError, match="overflows"):
        decode_varint(b"\xfe\xff\xff\xff\x1f", 0, 5, MAX_VARINT_BYTES)
    assert decode_varint(b"\xfe\xff\xff\xff\x0f", 0, 5, MAX_VARINT_BYTES) == ((1 << 31) - 1, 5)
