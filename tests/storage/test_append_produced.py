"""Appends of several produce requests at once (PartitionLog.append_produced): every buffer
is answered exactly as appending them one by one would answer it, and the log's files end
up byte-for-byte the same, whatever mix of good, bad and idempotent batches, rolls and
leader epochs the group holds."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from directlog.records.batch import Record, build_batch
from directlog.records.errors import InvalidRecordError
from services.broker.storage import AppendResult, LogConfig, PartitionLog
from services.broker.storage.errors import OutOfOrderSequenceError
from tests.storage.helpers import T0, ManualClock, batch, read_all, tree_digest


def idempotent(producer_id: int, sequence: int, count: int, ts: int) -> bytes:
    records = [
        Record(i, ts + i, None, b"p%d-%d" % (producer_id, sequence + i)) for i in range(count)
    ]
    return build_batch(records, producer_id=producer_id, producer_epoch=0, base_sequence=sequence)


# Record times around segment.ms (60 s in half the examples) from the first batch's.
times = st.sampled_from([0, 1, 30_000, 59_999, 60_000, 61_000, 120_000])


def corrupt(buf: bytes) -> bytes:
    return buf[:30] + bytes([buf[30] ^ 0xFF]) + buf[31:]


plain = st.builds(
    lambda n, size, ts: batch([b"v" * size] * n, ts=T0 + ts),
    st.integers(1, 3),
    st.integers(0, 100),
    times,
)
buffers = st.one_of(
    plain,
    plain,
    st.builds(
        lambda pid, seq, n, ts: idempotent(pid, seq, n, T0 + ts),
        st.integers(1, 2),
        st.integers(0, 6),
        st.integers(1, 2),
        times,
    ),
    st.builds(lambda ts: corrupt(batch([b"bad"], ts=T0 + ts)), times),
    st.just(b""),
)


def answer(outcome: AppendResult | Exception) -> object:
    return (type(outcome).__name__, str(outcome)) if isinstance(outcome, Exception) else outcome


def one_by_one(log: PartitionLog, bufs: list[bytes], epoch: int) -> list[object]:
    answers: list[object] = []
    for buf in bufs:
        try:
            answers.append(log.append(buf, leader_epoch=epoch))
        except Exception as error:
            answers.append(answer(error))
    return answers


@settings(max_examples=150, deadline=None)
@example(  # the second batch is a minute younger than the one that starts the segment
    bufs=[batch([b"a"], ts=T0), batch([b"b"], ts=T0 + 61_000)],
    cuts=[],
    segment_bytes=4000,
    segment_ms=60_000,
    index_interval=4096,
    index_entries=1 << 20,
)
@example(  # every batch takes an index entry; the index holds four
    bufs=[batch([b"%d" % i], ts=T0 + i) for i in range(10)],
    cuts=[],
    segment_bytes=4000,
    segment_ms=60_000,
    index_interval=1,
    index_entries=4,
)
@given(
    bufs=st.lists(buffers, min_size=1, max_size=25),
    cuts=st.lists(st.integers(1, 25), max_size=2),
    segment_bytes=st.integers(300, 4000),
    segment_ms=st.sampled_from([60_000, 7 * 86_400_000]),
    index_interval=st.sampled_from([1, 200, 4096]),
    index_entries=st.sampled_from([4, 1 << 20]),
)
def test_a_group_answers_and_writes_as_appends_one_by_one_would(
    bufs, cuts, segment_bytes, segment_ms, index_interval, index_entries
):
    config = LogConfig(
        segment_bytes=segment_bytes,
        segment_ms=segment_ms,
        index_interval_bytes=index_interval,
        segment_index_bytes=8 * index_entries,
    )
    with tempfile.TemporaryDirectory() as alone_dir, tempfile.TemporaryDirectory() as group_dir:
        alone = PartitionLog.open(Path(alone_dir), config, clock=ManualClock(T0 + 100_000))
        grouped = PartitionLog.open(Path(group_dir), config, clock=ManualClock(T0 + 100_000))
        try:
            expected = one_by_one(alone, bufs, epoch=4)
            got: list[object] = []
            start = 0
            for cut in [*sorted(set(cuts)), len(bufs)]:  # the requests of several reads
                got += [answer(o) for o in grouped.append_produced(bufs[start:cut], 4)]
                start = max(start, cut)
            assert got == expected
            assert tree_digest(Path(group_dir)) == tree_digest(Path(alone_dir))
            assert grouped.log_end_offset == alone.log_end_offset
            assert grouped.producers.entries() == alone.producers.entries()
            bases = [s.base_offset for s in alone.segments]
            assert [s.base_offset for s in grouped.segments] == bases
            assert read_all(grouped) == read_all(alone)
        finally:
            alone.close()
            grouped.close()


def test_a_thousand_requests_land_in_order_with_their_own_offsets(open_log):
    """More buffers than one pwritev takes (IOV_MAX 1024, two per batch)."""
    log = open_log()
    bufs = [batch([b"r%d" % i, b"s%d" % i], ts=T0 + i) for i in range(1500)]
    results = log.append_produced(bufs, 2)
    assert [(r.first_offset, r.last_offset) for r in results] == [
        (2 * i, 2 * i + 1) for i in range(1500)
    ]
    values = [r.value for r in read_all(log)]
    assert values == [v for i in range(1500) for v in (b"r%d" % i, b"s%d" % i)]
    assert log.leader_epochs.latest_epoch == 2


def test_a_bad_request_in_a_group_fails_alone(open_log):
    log = open_log()
    bufs = [batch([b"a"]), corrupt(batch([b"b"])), batch([b"c"]), b"", batch([b"d"])]
    outcomes = log.append_produced(bufs, 0)
    assert [type(o) for o in outcomes] == [
        AppendResult,
        type(outcomes[1]),
        AppendResult,
        InvalidRecordError,
        AppendResult,
    ]
    assert isinstance(outcomes[1], Exception) and "CRC" in str(outcomes[1]).upper()
    assert [o.first_offset for o in outcomes if isinstance(o, AppendResult)] == [0, 1, 2]
    assert [r.value for r in read_all(log)] == [b"a", b"c", b"d"]


def test_an_idempotent_producers_pipelined_batches_see_each_other(open_log):
    log = open_log()
    bufs = [idempotent(7, 0, 2, T0), idempotent(7, 2, 1, T0), idempotent(7, 2, 1, T0)]
    bufs += [batch([b"plain"]), idempotent(7, 5, 1, T0), idempotent(7, 3, 1, T0)]
    first, second, retry, plain, gap, third = log.append_produced(bufs, 0)
    assert (first.first_offset, second.first_offset, plain.first_offset) == (0, 2, 3)
    assert retry == (2, 2, 0, 0, -1, True)  # the retry answers the original's offsets
    assert isinstance(gap, OutOfOrderSequenceError)
    assert (third.first_offset, third.duplicate) == (4, False)
    assert [r.offset for r in read_all(log)] == [0, 1, 2, 3, 4]
