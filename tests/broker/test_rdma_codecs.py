"""What every Directlog codec (RdmaAccess, RdmaConsume, RdmaReplica) must do: requests and
responses survive a round trip, garbage never decodes into anything but
CorruptRecordError, and a body cut short or with a byte too many is refused. The
strategies live beside each codec's own tests."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.protocol import rdma_access, rdma_consume, rdma_replica
from directlog.records.errors import CorruptRecordError
from tests.broker import test_rdma_access, test_rdma_consume_codec, test_rdma_replica

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Codec:
    name: str
    requests: st.SearchStrategy[Any]
    responses: st.SearchStrategy[Any]
    decode_request: Callable[[Any, int], Any]
    decode_response: Callable[[Any], Any]


CODECS = [
    Codec(
        "access",
        test_rdma_access.requests,
        test_rdma_access.responses,
        rdma_access.decode_request,
        rdma_access.decode_response,
    ),
    Codec(
        "consume",
        test_rdma_consume_codec.requests,
        test_rdma_consume_codec.responses,
        rdma_consume.decode_request,
        rdma_consume.decode_response,
    ),
    Codec(
        "replica",
        test_rdma_replica.requests,
        test_rdma_replica.responses,
        rdma_replica.decode_request,
        rdma_replica.decode_response,
    ),
]
each_codec = pytest.mark.parametrize("codec", CODECS, ids=[c.name for c in CODECS])


@each_codec
@given(data=st.data())
def test_round_trips(codec: Codec, data: st.DataObject) -> None:
    request = data.draw(codec.requests)
    assert codec.decode_request(memoryview(request.encode()), 0) == request
    response = data.draw(codec.responses)
    assert codec.decode_response(response.encode()) == response


@each_codec
@given(garbage=st.binary(max_size=300))
def test_garbage_never_decodes_into_anything_but_corrupt(codec: Codec, garbage: bytes) -> None:
    with contextlib.suppress(CorruptRecordError):
        codec.decode_request(garbage, 0)
    with contextlib.suppress(CorruptRecordError):
        codec.decode_response(garbage)


@each_codec
@given(data=st.data())
def test_cut_or_extended_bodies_are_refused(codec: Codec, data: st.DataObject) -> None:
    for encoded, decode in (
        (data.draw(codec.requests).encode(), lambda b: codec.decode_request(b, 0)),
        (data.draw(codec.responses).encode(), codec.decode_response),
    ):
        cut = data.draw(st.integers(0, len(encoded) - 1))
        with pytest.raises(CorruptRecordError):
            decode(encoded[:cut])
        with pytest.raises(CorruptRecordError):
            decode(encoded + b"\x00")
