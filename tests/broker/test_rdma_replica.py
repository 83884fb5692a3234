"""RDMA push replication without I/O: the RdmaReplica codec (docs/formats.md "RDMA
replication") has the documented bytes (round trips and garbage: test_rdma_codecs.py);
immediates pack and unpack; the leader's coalescing (plan_push) and
credits (Credits) keep their rules; and a follower's in-place commit
(PartitionLog.commit_replicated) takes the leader's bytes as a pulled fetch would and
leaves the log unchanged when they are bad; the fetcher stops pulling a pushed partition.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.protocol.api import APIS, ApiKey, parse_request_header
from directlog.protocol.rdma_replica import (
    API_KEY,
    HIGH_WATERMARK,
    KIND_HIGH_WATERMARK,
    KIND_RECORDS,
    MAX_CHANNELS,
    RdmaReplicaRequest,
    RdmaReplicaResponse,
    decode_request,
    decode_response_frame,
    immediate,
    parse_immediate,
    request_frame,
)
from directlog.records.batch import Record, build_batch
from directlog.records.errors import CorruptRecordError, RecordError
from directlog.topic_config import LogConfig
from directlog.topics import TopicPartition
from services.broker.partition import Partition
from services.broker.rdma.replica_leader import HIGH_WATERMARK_PUSH, Credits, plan_push
from services.broker.replica_fetcher import FetchSettings, FollowState, ReplicaFetcher
from services.broker.storage import PartitionLog
from services.broker.storage.errors import ReservationStateError

pytestmark = pytest.mark.timeout(60)

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
u16, u32, u64 = (st.integers(0, (1 << bits) - 1) for bits in (16, 32, 64))
i32, i64 = st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-(1 << 63), (1 << 63) - 1)

requests = st.builds(
    RdmaReplicaRequest,
    topic=names,
    partition=i32,
    leader_id=i32,
    leader_epoch=i32,
    channel_id=u16,
    log_end_offset=i64,
    min_free=i32,
    reply_addr=u64,
    reply_rkey=u32,
    reply_length=u32,
    providers=st.lists(names.filter(lambda n: len(n.encode()) <= 32), max_size=8).map(tuple),
)
responses = st.builds(
    RdmaReplicaResponse,
    error_code=st.integers(-(1 << 15), (1 << 15) - 1),
    error_message=st.none() | names,
    conn_info=names,
    channel_id=u16,
    credits=u16,
    log_end_offset=i64,
    last_epoch=i32,
    addr=u64,
    rkey=u32,
    length=u32,
    base_offset=i64,
    position=i32,
    hw_addr=u64,
    hw_rkey=u32,
)


# The codec -------------------------------------------------------------------------------


def test_documented_request_bytes() -> None:
    request = RdmaReplicaRequest("t", 3, 1, 7, 0, -1, 512, 0x1000, 9, 48, ("shm",))
    assert request.encode() == (
        b"\x00\x01t"  # topic
        + b"\x00\x00\x00\x03"  # partition
        + b"\x00\x00\x00\x01"  # leader id
        + b"\x00\x00\x00\x07"  # leader epoch
        + b"\x00\x00"  # channel id: open
        + b"\xff" * 8  # log end offset: -1 when opening
        + b"\x00\x00\x02\x00"  # min free
        + b"\x00\x00\x00\x00\x00\x00\x10\x00"  # reply addr
        + b"\x00\x00\x00\x09"  # reply rkey
        + b"\x00\x00\x00\x30"  # reply length
        + b"\x00\x01\x00\x03shm"  # providers
    )


def test_documented_response_bytes() -> None:
    response = RdmaReplicaResponse(
        0, None, "{}", 5, 8, 100, 2, 0x2000, 9, 4096, 64, 1234, 0x3000, 11
    )
    assert response.encode() == (
        b"\x00\x00"  # error code
        + b"\xff\xff"  # error message: null
        + b"\x00\x02{}"  # conn info
        + b"\x00\x05"  # channel id
        + b"\x00\x08"  # credits
        + b"\x00\x00\x00\x00\x00\x00\x00\x64"  # log end offset
        + b"\x00\x00\x00\x02"  # last epoch
        + b"\x00\x00\x00\x00\x00\x00\x20\x00"  # addr
        + b"\x00\x00\x00\x09"  # rkey
        + b"\x00\x00\x10\x00"  # length
        + b"\x00\x00\x00\x00\x00\x00\x00\x40"  # base offset
        + b"\x00\x00\x04\xd2"  # position
        + b"\x00\x00\x00\x00\x00\x00\x30\x00"  # hw addr
        + b"\x00\x00\x00\x0b"  # hw rkey
    )


def test_frame_goes_through_the_broker_header_parser() -> None:
    request = RdmaReplicaRequest("t", 0, 1, 0, 4, 10, 1, 0, 0, 12, ("tcp",))
    frame = request_frame(request, 42, "me")
    header = parse_request_header(frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id) == (API_KEY, 0, 42)
    assert APIS[ApiKey.RDMA_REPLICA].decode(memoryview(frame[4:])[header.size :], 0) == request
    response = RdmaReplicaResponse(0, None, "{}", 5)
    assert decode_response_frame((42).to_bytes(4, "big") + response.encode(), 42) == response
    with pytest.raises(CorruptRecordError):
        decode_response_frame((41).to_bytes(4, "big") + response.encode(), 42)
    with pytest.raises(CorruptRecordError):
        decode_request(request.encode(), 1)


@given(st.sampled_from([KIND_RECORDS, KIND_HIGH_WATERMARK]), st.integers(1, MAX_CHANNELS - 1), u16)
def test_immediates_round_trip(kind: int, channel_id: int, order: int) -> None:
    imm = immediate(kind, channel_id, order)
    assert 0 <= imm < 1 << 32
    assert parse_immediate(imm) == (kind, channel_id, order)


def test_channel_zero_and_unknown_kinds_make_no_immediate() -> None:
    for kind, channel_id in ((KIND_RECORDS, 0), (2, 1), (KIND_RECORDS, MAX_CHANNELS)):
        with pytest.raises(ValueError):
            immediate(kind, channel_id, 0)


# Coalescing ------------------------------------------------------------------------------


def batches(*sizes: int, first: int = 0) -> tuple[bytes, list[int]]:
    """Batches of one record whose value makes each ``size`` bytes or so, offsets from
    ``first``; (their bytes, each one's length)."""
    out = bytearray()
    lengths = []
    for n, size in enumerate(sizes):
        batch = build_batch([Record(first + n, 0, None, b"x" * size)])
        out += batch
        lengths.append(len(batch))
    return bytes(out), lengths


def test_contiguous_batches_coalesce_up_to_the_batch_bytes() -> None:
    data, lengths = batches(100, 100, 100, 100)
    plan = plan_push(memoryview(data), 0, len(data), sum(lengths[:2]) + 10, 1 << 20)
    assert plan is not None
    assert (plan.length, plan.batches, plan.next_offset) == (sum(lengths[:2]), 2, 2)
    rest = plan_push(memoryview(data), plan.length, len(data), 1 << 20, 1 << 20)
    assert rest is not None and (rest.batches, rest.next_offset) == (2, 4)


def test_a_batch_larger_than_the_batch_bytes_goes_alone() -> None:
    data, lengths = batches(2000, 10)
    plan = plan_push(memoryview(data), 0, len(data), 1024, 1 << 20)
    assert plan is not None and (plan.length, plan.batches) == (lengths[0], 1)


def test_a_partial_batch_at_the_end_waits() -> None:
    data, lengths = batches(10, 10)
    assert plan_push(memoryview(data), 0, len(data) - 1, 1 << 20, 1 << 20) == plan_push(
        memoryview(data), 0, lengths[0], 1 << 20, 1 << 20
    )
    assert plan_push(memoryview(data), 0, lengths[0] - 1, 1 << 20, 1 << 20) is None
    assert plan_push(memoryview(bytes(200)), 0, 200, 1024, 1024) is None  # zeroed, no batch


def test_what_does_not_fit_the_grant_waits_for_the_next() -> None:
    data, lengths = batches(10, 10, 10)
    plan = plan_push(memoryview(data), 0, len(data), 1 << 20, lengths[0] + lengths[1] + 5)
    assert plan is not None and plan.batches == 2 and not plan.needs_grant
    full = plan_push(memoryview(data), 0, len(data), 1 << 20, lengths[0] - 1)
    assert full is not None and full.needs_grant and full.length == lengths[0]


# Credits ---------------------------------------------------------------------------------


def test_credits_bound_unanswered_pushes_and_answers_come_in_order() -> None:
    credits = Credits(2)
    first = credits.take(10, 1.0)
    second = credits.take(HIGH_WATERMARK_PUSH, 2.0)
    assert not credits.available and credits.oldest() == 1.0
    with pytest.raises(ValueError):
        credits.answer(second, 10)  # out of order
    with pytest.raises(ValueError):
        credits.answer(first, 9)  # not what the push made the log end
    credits.answer(first, 10)
    assert credits.available
    credits.answer(second, 12345)  # a high watermark write: any log end
    assert credits.oldest() is None
    with pytest.raises(ValueError):
        credits.answer(credits.next_order, 10)  # nothing posted


def test_orders_wrap_at_16_bits() -> None:
    credits = Credits(1, next_order=(1 << 16) - 1)
    order = credits.take(1, 0.0)
    credits.answer(order, 1)
    assert credits.take(2, 0.0) == 0


# The follower's commit in place ----------------------------------------------------------


def follower_log(tmp_path: Path, segment_bytes: int = 4096) -> PartitionLog:
    config = LogConfig(preallocate=True, segment_bytes=segment_bytes)
    return PartitionLog.open(tmp_path / "topic-0", config)


def leader_bytes(first: int, count: int, epoch: int = 3) -> bytes:
    return b"".join(
        build_batch([Record(n, 1_700_000_000_000, None, b"v%d" % n)], partition_leader_epoch=epoch)
        for n in range(first, first + count)
    )


def place(plog: PartitionLog, data: bytes) -> tuple[int, int]:
    """Write ``data`` after the log end of the head, as the leader's push would."""
    head = plog.segments[-1]
    view = head.log.region(head.size, len(data))
    view[:] = data
    view.release()
    return head.size, len(data)


def test_a_push_commits_as_a_pulled_append_would(tmp_path: Path) -> None:
    pushed = follower_log(tmp_path / "pushed")
    pulled = follower_log(tmp_path / "pulled")
    data = leader_bytes(0, 5)
    position, length = place(pushed, data)
    result = pushed.commit_replicated(pushed.segments[-1], position, length)
    pulled.append(data, assign_offsets=False)
    assert (result.first_offset, result.last_offset) == (0, 4)
    assert pushed.log_end_offset == pulled.log_end_offset == 5
    assert pushed.leader_epochs.latest_epoch == pulled.leader_epochs.latest_epoch == 3
    assert pushed.read(0, 1 << 20).records.read() == data
    assert pushed.segments[-1].locate(3) == pulled.segments[-1].locate(3)


@pytest.mark.parametrize("fault", ["crc", "gap", "overrun", "not-at-end"])
def test_a_bad_push_leaves_the_log_unchanged(tmp_path: Path, fault: str) -> None:
    plog = follower_log(tmp_path)
    plog.append(leader_bytes(0, 2), assign_offsets=False)
    head = plog.segments[-1]
    data = bytearray(leader_bytes(2 if fault != "gap" else 3, 2))
    if fault == "crc":
        data[-1] ^= 0xFF
    position, length = place(plog, bytes(data))
    if fault == "overrun":
        length = 4096 - position + 1
    if fault == "not-at-end":
        position += 1
    with pytest.raises((RecordError, ReservationStateError)):
        plog.commit_replicated(head, position, length)
    assert plog.log_end_offset == 2 and head.size == position - (fault == "not-at-end")
    assert plog.read(0, 1 << 20).records.read() == leader_bytes(0, 2)


def test_a_push_into_a_segment_that_is_no_longer_the_head_is_refused(tmp_path: Path) -> None:
    plog = follower_log(tmp_path)
    plog.append(leader_bytes(0, 1), assign_offsets=False)
    old = plog.segments[-1]
    plog.roll()
    with pytest.raises(ReservationStateError):
        plog.commit_replicated(old, old.size, 10)


def test_high_watermark_word_is_big_endian() -> None:
    assert HIGH_WATERMARK.pack(258) == b"\x00" * 6 + b"\x01\x02"


# The fetcher's hand-over -----------------------------------------------------------------


def test_a_pushed_partition_is_not_pulled_until_its_push_ends() -> None:
    async def run() -> None:
        fetcher = ReplicaFetcher(1, lambda _: None, FetchSettings(0, 100, 1 << 20, 100))
        tp = TopicPartition("t", 0)
        state = FollowState(cast(Partition, object()), leader_epoch=4)
        fetcher.partitions[tp] = state
        assert fetcher.start_push(tp, 4) is None  # still truncating
        state.truncating = False
        assert fetcher.start_push(tp, 3) is None  # another epoch
        assert fetcher.start_push(tp, 4) is state
        assert fetcher.start_push(tp, 4) is None  # already pushed
        assert fetcher._ready(truncating=False) == []
        fetcher.end_push(state)
        assert fetcher._ready(truncating=False) == [state]

    asyncio.run(run())
