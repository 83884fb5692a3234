"""The RdmaConsume codec and metadata slots (docs/formats.md "RDMA consume"): slots
survive a round trip, the bytes are the documented ones, v1 carries the isolation level
(v0 reads uncommitted), and a torn slot never passes its check (the codec's v0 round trips
and garbage: the strategies here, the properties in test_rdma_codecs.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.protocol.api import APIS, ApiKey, parse_request_header
from directlog.protocol.rdma_codec import MAX_PROVIDERS
from directlog.protocol.rdma_consume import (
    ACCESS,
    API_KEY,
    MAX_VERSION,
    MUTABLE,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RELEASE,
    REVOKED,
    SLOT_SIZE,
    RdmaConsumeRequest,
    RdmaConsumeResponse,
    Slot,
    decode_request,
    decode_response,
    decode_response_frame,
    read_slot,
    request_frame,
    write_slot,
)
from directlog.records.errors import CorruptRecordError

pytestmark = pytest.mark.timeout(60)

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40)
u32, u64 = (st.integers(0, (1 << bits) - 1) for bits in (32, 64))
i32, i64 = st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-(1 << 63), (1 << 63) - 1)

requests = st.builds(
    RdmaConsumeRequest,
    topic=names,
    partition=i32,
    op=st.integers(-128, 127),
    consumer_id=i32,
    offset=i64,
    providers=st.lists(names.filter(lambda n: len(n.encode()) <= 32), max_size=MAX_PROVIDERS).map(
        tuple
    ),
)
responses = st.builds(
    RdmaConsumeResponse,
    error_code=st.integers(-(1 << 15), (1 << 15) - 1),
    error_message=st.none() | names,
    conn_info=names,
    consumer_id=i32,
    base_offset=i64,
    addr=u64,
    rkey=u32,
    length=u32,
    position=u32,
    readable_end=u32,
    mutable=st.booleans(),
    slot_addr=u64,
    slot_rkey=u32,
    slot_length=u32,
    slot_index=i32,
    bind_addr=u64,
    bind_rkey=u32,
)
slots = st.builds(
    Slot,
    version=u32,
    flags=st.sampled_from([0, MUTABLE, REVOKED]),
    base_offset=i64,
    readable_end=u64,
    addr=u64,
    rkey=u32,
    length=u32,
)


def test_a_mutable_flag_other_than_0_or_1_is_refused() -> None:
    encoded = bytearray(RdmaConsumeResponse(0, None, "").encode())
    mutable_at = 2 + 2 + 2 + 4 + 8 + 8 + 4 + 4 + 4 + 4  # see test_documented_response_bytes
    assert encoded[mutable_at] == 0
    encoded[mutable_at] = 2
    with pytest.raises(CorruptRecordError):
        decode_response(bytes(encoded))


def test_documented_request_bytes() -> None:
    request = RdmaConsumeRequest("t", 3, ACCESS, 0x01020304, 100, ("shm",))
    assert request.encode() == (
        b"\x00\x01t"  # topic
        + b"\x00\x00\x00\x03"  # partition
        + b"\x01"  # op: access
        + b"\x01\x02\x03\x04"  # consumer id
        + b"\x00\x00\x00\x00\x00\x00\x00\x64"  # offset
        + b"\x00\x01\x00\x03shm"  # providers
    )
    release = RdmaConsumeRequest("t", 3, RELEASE, 7, 50)
    assert release.encode()[7:8] == b"\x02"


def test_documented_response_bytes() -> None:
    response = RdmaConsumeResponse(
        0, None, "{}", 7, 100, 0x2000, 9, 4096, 64, 128, True, 0x3000, 11, 3072, 2, 0x4000, 13
    )
    assert response.encode() == (
        b"\x00\x00"  # error code
        + b"\xff\xff"  # error message: null
        + b"\x00\x02{}"  # conn info
        + b"\x00\x00\x00\x07"  # consumer id
        + b"\x00\x00\x00\x00\x00\x00\x00\x64"  # base offset
        + b"\x00\x00\x00\x00\x00\x00\x20\x00"  # addr
        + b"\x00\x00\x00\x09"  # rkey
        + b"\x00\x00\x10\x00"  # length
        + b"\x00\x00\x00\x40"  # position
        + b"\x00\x00\x00\x80"  # readable end
        + b"\x01"  # mutable
        + b"\x00\x00\x00\x00\x00\x00\x30\x00"  # slot region addr
        + b"\x00\x00\x00\x0b"  # slot region rkey
        + b"\x00\x00\x0c\x00"  # slot region length
        + b"\x00\x00\x00\x02"  # slot index
        + b"\x00\x00\x00\x00\x00\x00\x40\x00"  # bind addr
        + b"\x00\x00\x00\x0d"  # bind rkey
    )


def test_frame_goes_through_the_broker_header_parser() -> None:
    request = RdmaConsumeRequest("t", 0, ACCESS, 0, 5, ("tcp",))
    frame = request_frame(request, 42, "me")
    header = parse_request_header(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id) == (API_KEY, 0, 42)
    assert APIS[ApiKey.RDMA_CONSUME].decode(memoryview(frame[4:])[header.size :], 0) == request
    response = RdmaConsumeResponse(0, None, "{}", 5, 1, 2, 3, 4, 5)
    assert decode_response_frame((42).to_bytes(4, "big") + response.encode(), 42) == response
    with pytest.raises(CorruptRecordError):
        decode_response_frame((41).to_bytes(4, "big") + response.encode(), 42)


def test_unknown_version_and_too_many_providers_are_refused() -> None:
    with pytest.raises(CorruptRecordError):
        decode_request(RdmaConsumeRequest("t", 0, ACCESS, 0, 0).encode(1), 2)
    with pytest.raises(CorruptRecordError):
        decode_request(RdmaConsumeRequest("t", 0, ACCESS, 0, 0).encode(1), -1)
    encoded = bytearray(RdmaConsumeRequest("t", 0, ACCESS, 0, 0).encode())
    encoded[-2:] = (MAX_PROVIDERS + 1).to_bytes(2, "big")
    with pytest.raises(CorruptRecordError):
        decode_request(bytes(encoded), 0)


@given(slots, st.integers(0, 3))
def test_slot_round_trips_at_any_index(slot: Slot, index: int) -> None:
    region = memoryview(bytearray(4 * SLOT_SIZE))
    write_slot(region, index * SLOT_SIZE, slot)
    assert read_slot(region, index * SLOT_SIZE) == slot


def test_documented_slot_bytes() -> None:
    region = memoryview(bytearray(SLOT_SIZE))
    write_slot(region, 0, Slot(3, MUTABLE, 100, 4096, 0x2000, 9, 8192))
    assert bytes(region[:40]) == (
        b"\x03\x00\x00\x00"  # version
        + b"\x01\x00\x00\x00"  # flags: mutable
        + b"\x64\x00\x00\x00\x00\x00\x00\x00"  # base offset
        + b"\x00\x10\x00\x00\x00\x00\x00\x00"  # readable end
        + b"\x00\x20\x00\x00\x00\x00\x00\x00"  # addr
        + b"\x09\x00\x00\x00"  # rkey
        + b"\x00\x20\x00\x00"  # length
    )
    assert bytes(region[44:48]) == bytes(4)


@given(slots, slots, st.integers(1, SLOT_SIZE - 1))
def test_a_torn_slot_fails_its_check(old: Slot, new: Slot, split: int) -> None:
    """A READ that copied part of the old slot and part of the new never passes as a slot
    (unless the mix happens to equal one of them)."""
    before, after = memoryview(bytearray(SLOT_SIZE)), memoryview(bytearray(SLOT_SIZE))
    write_slot(before, 0, old)
    write_slot(after, 0, new)
    torn = bytes(before[:split]) + bytes(after[split:])
    assert read_slot(torn) in (None, old, new)
    assert read_slot(bytes(SLOT_SIZE)) is None  # a free slot


def test_slot_outside_the_buffer_is_refused() -> None:
    with pytest.raises(CorruptRecordError):
        read_slot(bytes(SLOT_SIZE), 1)


# Version 1: the isolation level ----------------------------------------------------------

isolated_requests = st.builds(dataclasses.replace, requests, isolation_level=st.integers(-128, 127))


@given(isolated_requests)
def test_v1_round_trips_with_any_isolation_byte(request: RdmaConsumeRequest) -> None:
    """Any byte decodes as it was sent: the broker, not the codec, refuses a level it does
    not know, so the client gets INVALID_REQUEST rather than a closed connection."""
    encoded = request.encode(1)
    assert decode_request(memoryview(encoded), 1) == request
    with pytest.raises(CorruptRecordError):
        decode_request(encoded[:-1], 1)
    with pytest.raises(CorruptRecordError):
        decode_request(encoded + b"\x00", 1)


@given(requests)
def test_v0_is_read_uncommitted_and_v1_adds_one_byte(request: RdmaConsumeRequest) -> None:
    assert request.isolation_level == READ_UNCOMMITTED and request.version == 0
    assert request.encode() == request.encode(0)
    assert request.encode(1) == request.encode(0) + b"\x00"
    assert decode_request(request.encode(0), 0).isolation_level == READ_UNCOMMITTED


def test_documented_v1_request_bytes() -> None:
    request = RdmaConsumeRequest("t", 3, ACCESS, 0x01020304, 100, ("shm",), READ_COMMITTED)
    assert request.version == 1
    assert request.encode() == (
        b"\x00\x01t"  # topic
        + b"\x00\x00\x00\x03"  # partition
        + b"\x01"  # op: access
        + b"\x01\x02\x03\x04"  # consumer id
        + b"\x00\x00\x00\x00\x00\x00\x00\x64"  # offset
        + b"\x00\x01\x00\x03shm"  # providers
        + b"\x01"  # isolation level: read_committed
    )


def test_read_committed_cannot_be_said_in_v0() -> None:
    request = RdmaConsumeRequest("t", 0, ACCESS, 0, 0, (), READ_COMMITTED)
    with pytest.raises(ValueError):
        request.encode(0)
    with pytest.raises(ValueError):
        request.encode(MAX_VERSION + 1)


def test_v1_frame_goes_through_the_broker_header_parser() -> None:
    """A read_committed request is framed as v1, which the broker serves and decodes; a
    read_uncommitted one stays v0, so it works with a broker that serves only v0."""
    api = APIS[ApiKey.RDMA_CONSUME]
    assert (api.min_version, api.max_version) == (0, MAX_VERSION) == (0, 1)
    committed = RdmaConsumeRequest("t", 0, ACCESS, 0, 5, ("tcp",), READ_COMMITTED)
    frame = request_frame(committed, 42, "me")
    header = parse_request_header(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id) == (API_KEY, 1, 42)
    assert api.decode(memoryview(frame[4:])[header.size :], 1) == committed
    plain = request_frame(RdmaConsumeRequest("t", 0, ACCESS, 0, 5, ("tcp",)), 43, "me")
    assert parse_request_header(plain[4:]).api_version == 0
