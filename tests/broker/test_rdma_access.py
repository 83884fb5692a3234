"""The RdmaAccess codec (docs/formats.md "RDMA access"): the bytes are the documented
ones and frames pass the broker's header parser (round trips and garbage: the strategies
here, the properties in test_rdma_codecs.py)."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from directlog.protocol.api import APIS, ApiKey, parse_request_header
from directlog.protocol.rdma_access import (
    API_KEY,
    RdmaAccessRequest,
    RdmaAccessResponse,
    decode_request,
    decode_response_frame,
    request_frame,
)
from directlog.protocol.rdma_codec import MAX_PROVIDERS
from directlog.records.errors import CorruptRecordError

pytestmark = pytest.mark.timeout(60)

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40)
u16, u32, u64 = (st.integers(0, (1 << bits) - 1) for bits in (16, 32, 64))
i32, i64 = st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-(1 << 63), (1 << 63) - 1)

requests = st.builds(
    RdmaAccessRequest,
    topic=names,
    partition=i32,
    mode=st.integers(-128, 127),
    min_free=i32,
    providers=st.lists(names.filter(lambda n: len(n.encode()) <= 32), max_size=MAX_PROVIDERS).map(
        tuple
    ),
    reply_addr=u64,
    reply_rkey=u32,
    reply_length=u32,
    acks=st.integers(-128, 127),
)
responses = st.builds(
    RdmaAccessResponse,
    error_code=st.integers(-(1 << 15), (1 << 15) - 1),
    error_message=st.none() | names,
    conn_info=names,
    file_id=u16,
    addr=u64,
    rkey=u32,
    length=u32,
    base_offset=i64,
    position=i32,
    word_addr=u64,
    word_rkey=u32,
)


def test_documented_request_bytes() -> None:
    request = RdmaAccessRequest("t", 3, 1, 512, ("shm",), 0x1000, 7, 64)
    assert request.encode() == (
        b"\x00\x01t"  # topic
        + b"\x00\x00\x00\x03"  # partition
        + b"\x01"  # mode: exclusive
        + b"\x01"  # acks
        + b"\x00\x00\x02\x00"  # min_free
        + b"\x00\x00\x00\x00\x00\x00\x10\x00"  # reply addr
        + b"\x00\x00\x00\x07"  # reply rkey
        + b"\x00\x00\x00\x40"  # reply length
        + b"\x00\x01\x00\x03shm"  # providers
    )


def test_documented_response_bytes() -> None:
    response = RdmaAccessResponse(0, None, "{}", 5, 0x2000, 9, 4096, 100, 64, 0x3000, 11)
    assert response.encode() == (
        b"\x00\x00"  # error code
        + b"\xff\xff"  # error message: null
        + b"\x00\x02{}"  # conn info
        + b"\x00\x05"  # file id
        + b"\x00\x00\x00\x00\x00\x00\x20\x00"  # addr
        + b"\x00\x00\x00\x09"  # rkey
        + b"\x00\x00\x10\x00"  # length
        + b"\x00\x00\x00\x00\x00\x00\x00\x64"  # base offset
        + b"\x00\x00\x00\x40"  # position
        + b"\x00\x00\x00\x00\x00\x00\x30\x00"  # word addr
        + b"\x00\x00\x00\x0b"  # word rkey
    )


def test_frame_goes_through_the_broker_header_parser() -> None:
    request = RdmaAccessRequest("t", 0, 1, 1, ("tcp",), 0, 0, 16)
    frame = request_frame(request, 42, "me")
    header = parse_request_header(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id) == (API_KEY, 0, 42)
    assert APIS[ApiKey.RDMA_ACCESS].decode(memoryview(frame[4:])[header.size :], 0) == request
    response = RdmaAccessResponse(0, None, "{}", 5, 1, 2, 3, 4, 5)
    assert decode_response_frame((42).to_bytes(4, "big") + response.encode(), 42) == response
    with pytest.raises(CorruptRecordError):
        decode_response_frame((41).to_bytes(4, "big") + response.encode(), 42)


def test_unknown_version_and_too_many_providers_are_refused() -> None:
    with pytest.raises(CorruptRecordError):
        decode_request(RdmaAccessRequest("t", 0, 1, 1, (), 0, 0, 16).encode(), 1)
    encoded = bytearray(RdmaAccessRequest("t", 0, 1, 1, (), 0, 0, 16).encode())
    encoded[-2:] = (MAX_PROVIDERS + 1).to_bytes(2, "big")
    with pytest.raises(CorruptRecordError):
        decode_request(bytes(encoded), 0)
