"""The tcp transport's codec: every frame round-trips, and no input makes the decoder do
anything but return a valid header or raise FramingError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.rdma.tcp_framing import (
    ATOMIC_LENGTH,
    HEADER,
    HELLO,
    OPERANDS,
    FramingError,
    Header,
    Hello,
    Kind,
    decode_header,
    decode_hello,
    decode_operands,
    encode_atomic,
    encode_header,
    encode_hello,
    encode_request,
    encode_response,
)
from directlog.rdma.verbs import WcStatus

pytestmark = pytest.mark.timeout(60)

MAX_MESSAGE = 1 << 20
u32 = st.integers(0, (1 << 32) - 1)
u64 = st.integers(0, (1 << 64) - 1)
lengths = st.integers(0, MAX_MESSAGE)


@st.composite
def requests(draw: st.DrawFn) -> Header:
    kind = draw(st.sampled_from([Kind.WRITE, Kind.WRITE_IMM, Kind.READ, Kind.FETCH_ADD,
                                 Kind.CMP_SWAP]))  # fmt: skip
    length = ATOMIC_LENGTH if kind in (Kind.FETCH_ADD, Kind.CMP_SWAP) else draw(lengths)
    imm = draw(u32) if kind is Kind.WRITE_IMM else 0
    return Header(kind, draw(u32), length, WcStatus.SUCCESS, draw(u32), draw(u64), imm)


@st.composite
def responses(draw: st.DrawFn) -> Header:
    status = draw(st.sampled_from(list(WcStatus)))
    length = draw(lengths) if status is WcStatus.SUCCESS else 0
    return Header(Kind.RESPONSE, draw(u32), length, status)


@given(st.one_of(requests(), responses()))
def test_headers_round_trip(header: Header) -> None:
    encoded = encode_header(header)
    assert len(encoded) == HEADER.size == 32
    assert decode_header(encoded, MAX_MESSAGE) == header


@given(requests())
def test_trailing_bytes_follow_the_kind(header: Header) -> None:
    trailing = header.trailing()
    if header.kind in (Kind.WRITE, Kind.WRITE_IMM):
        assert trailing == header.length
    elif header.kind is Kind.READ:
        assert trailing == 0
    else:
        assert trailing == OPERANDS.size


@given(u32, u32, u64, u64, u64, st.sampled_from([Kind.FETCH_ADD, Kind.CMP_SWAP]))
def test_atomic_requests_round_trip(
    psn: int, rkey: int, addr: int, compare_add: int, swap: int, kind: Kind
) -> None:
    frame = encode_atomic(kind, psn, rkey, addr, compare_add, swap)
    header = decode_header(frame, MAX_MESSAGE)
    assert (header.kind, header.psn, header.rkey, header.addr) == (kind, psn, rkey, addr)
    assert decode_operands(frame[HEADER.size :]) == (compare_add, swap)


@given(st.binary(min_size=0, max_size=64), st.integers(1, MAX_MESSAGE))
def test_arbitrary_bytes_decode_or_raise_framing_error(data: bytes, max_message: int) -> None:
    try:
        header = decode_header(data, max_message)
    except FramingError:
        return
    assert header.length <= max_message
    assert encode_header(header) == bytes(data[: HEADER.size])


@given(requests(), st.integers(0, HEADER.size - 1))
def test_truncated_headers_are_refused(header: Header, keep: int) -> None:
    with pytest.raises(FramingError):
        decode_header(encode_header(header)[:keep], MAX_MESSAGE)


@given(st.integers(MAX_MESSAGE + 1, (1 << 32) - 1), u32)
def test_lengths_over_the_agreed_maximum_are_refused(length: int, psn: int) -> None:
    with pytest.raises(FramingError, match="over the agreed maximum"):
        decode_header(encode_request(Kind.WRITE, psn, 1, 0, length), MAX_MESSAGE)


@pytest.mark.parametrize(
    "frame",
    [
        bytes([9]) + bytes(31),  # unknown kind
        encode_request(Kind.READ, 1, 1, 0, 8, imm=5),  # immediate on a READ
        encode_request(Kind.FETCH_ADD, 1, 1, 0, 16),  # atomics are 8 bytes
        encode_response(1, WcStatus.SUCCESS, 8)[:2] + b"\x00\x01" + bytes(28),  # reserved
        bytes([128, 99]) + bytes(30),  # unknown status
        bytes([128, 10]) + bytes(10) + b"\x00\x00\x00\x08" + bytes(16),  # error with payload
        bytes([1, 10]) + bytes(30),  # a request with a status
    ],
)
def test_malformed_headers_are_refused(frame: bytes) -> None:
    with pytest.raises(FramingError):
        decode_header(frame, MAX_MESSAGE)


@given(u32, st.integers(1, 1 << 16), st.integers(1, 1 << 16), st.integers(1, (1 << 31) - 1), u32)
def test_hello_round_trip(qp_num: int, send: int, recv: int, max_message: int, rnr: int) -> None:
    hello = Hello(qp_num, send, recv, max_message, rnr)
    encoded = encode_hello(hello)
    assert len(encoded) == HELLO.size == 32
    assert decode_hello(encoded) == hello


@given(st.binary(max_size=40))
def test_arbitrary_hellos_decode_or_raise_framing_error(data: bytes) -> None:
    try:
        hello = decode_hello(data)
    except FramingError:
        return
    assert encode_hello(hello) == data[: HELLO.size]
