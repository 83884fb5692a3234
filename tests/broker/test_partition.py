"""A partition leader's replication rules on a real log: high watermark over the ISR,
acks=-1 waits and their errors, ISR shrink and expansion proposals, leader epoch checks, and
the follower's truncation rule against the leader's epoch answers."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.topic_config import LogConfig
from directlog.topics import TopicPartition
from services.broker.cluster_metadata import PartitionInfo
from services.broker.partition import Partition
from services.broker.replica_fetcher import FollowState, ReplicaFetcher
from services.broker.storage import OffsetOutOfRangeError, PartitionLog
from tests.storage.helpers import batch, read_all

TP = TopicPartition("orders", 0)
LAG_MS = 1000


class Harness:
    """A leader partition on broker 1 with followers 2 and 3; ISR proposals recorded."""

    def __init__(self, directory: Path, min_insync: int = 1) -> None:
        config = LogConfig(min_insync_replicas=min_insync)
        self.log = PartitionLog.open(directory, config)
        self.proposals: list[tuple[int, ...]] = []
        self.notified = 0
        self.partition = Partition(
            TP, uuid.uuid4(), self.log, 1, self._notify, lambda p, isr: self.proposals.append(isr)
        )

    def _notify(self) -> None:
        self.notified += 1

    def lead(self, isr: tuple[int, ...] = (1, 2, 3), epoch: int = 0, version: int = 0) -> None:
        info = PartitionInfo(0, (1, 2, 3), 1, epoch, isr, version)
        self.partition.become_leader(info, now_ms=0)


@pytest.fixture
def leader(tmp_path: Path) -> Harness:
    harness = Harness(tmp_path / "orders-0")
    harness.lead()
    return harness


def test_high_watermark_is_the_smallest_end_over_the_isr(leader: Harness) -> None:
    p = leader.partition
    p.append_as_leader(batch([b"a", b"b", b"c"]), acks=-1)
    assert leader.log.log_end_offset == 3
    assert leader.log.high_watermark == 0
    p.follower_fetched(2, 3, now_ms=10)
    assert leader.log.high_watermark == 0  # follower 3 has not fetched yet
    p.follower_fetched(3, 2, now_ms=10)
    assert leader.log.high_watermark == 2
    p.follower_fetched(3, 3, now_ms=20)
    assert leader.log.high_watermark == 3


def test_acks_all_waits_for_the_isr_then_succeeds(leader: Harness) -> None:
    async def scenario() -> None:
        p = leader.partition
        appended = p.append_as_leader(batch([b"x"]), acks=-1)
        waiting = asyncio.ensure_future(p.wait_replicated(appended.last_offset, timeout=5))
        await asyncio.sleep(0)
        assert not waiting.done()
        p.follower_fetched(2, 1, now_ms=5)
        await asyncio.sleep(0)
        assert not waiting.done()
        p.follower_fetched(3, 1, now_ms=5)
        await asyncio.wait_for(waiting, 1)

    asyncio.run(scenario())


def test_acks_all_times_out_with_request_timed_out(leader: Harness) -> None:
    async def scenario() -> None:
        appended = leader.partition.append_as_leader(batch([b"x"]), acks=-1)
        with pytest.raises(KafkaError) as caught:
            await leader.partition.wait_replicated(appended.last_offset, timeout=0.05)
        assert caught.value.code == ErrorCode.REQUEST_TIMED_OUT

    asyncio.run(scenario())


@pytest.mark.timeout(10)
def test_an_acks_all_wait_begun_after_leadership_moved_fails_at_once(leader: Harness) -> None:
    """A produce's wait for the ISR starts a loop turn after its append (asyncio.gather
    starts tasks later); if the partition became a follower in between, the wait must fail
    with NOT_LEADER_OR_FOLLOWER at once, not sit until the request timeout (seen in CI: a
    producer's message timed out) nor succeed on the follower's high watermark."""

    async def scenario() -> None:
        p = leader.partition
        appended = p.append_as_leader(batch([b"x"]), acks=-1)
        p.become_follower(PartitionInfo(0, (1, 2, 3), 2, 1, (1, 2, 3), 1))
        with pytest.raises(KafkaError) as caught:
            await asyncio.wait_for(p.wait_replicated(appended.last_offset, timeout=30), 2)
        assert caught.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        leader.log.update_high_watermark(1)  # a follower learns the new leader's
        with pytest.raises(KafkaError) as caught:
            p.replicated(appended.last_offset)
        assert caught.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER

    asyncio.run(scenario())


def test_delete_records_waits_for_the_isr_log_starts(leader: Harness) -> None:
    """DeleteRecords is answered once every ISR follower's fetch says its log start reached
    the offset, or once the ISR loses the one that did not; -1 means the high watermark."""

    async def scenario() -> None:
        p = leader.partition
        p.append_as_leader(batch([b"r%d" % i for i in range(10)]), acks=1)
        for follower in (2, 3):
            p.follower_fetched(follower, 10, now_ms=5, log_start_offset=0)
        assert leader.log.high_watermark == 10
        with pytest.raises(OffsetOutOfRangeError):  # answered as OFFSET_OUT_OF_RANGE
            await p.delete_records(11, timeout=1)
        waiting = asyncio.ensure_future(p.delete_records(4, timeout=5))
        await asyncio.sleep(0)
        assert leader.log.log_start_offset == 4 and p.low_watermark() == 0
        p.follower_fetched(2, 10, now_ms=6, log_start_offset=4)
        await asyncio.sleep(0)
        assert not waiting.done()
        p.follower_fetched(3, 10, now_ms=6, log_start_offset=4)
        assert await asyncio.wait_for(waiting, 1) == 4

        waiting = asyncio.ensure_future(p.delete_records(-1, timeout=5))
        await asyncio.sleep(0)
        p.follower_fetched(2, 10, now_ms=7, log_start_offset=10)
        await asyncio.sleep(0)
        assert not waiting.done()  # follower 3 is still at 4
        p.isr_change_settled(PartitionInfo(0, (1, 2, 3), 1, 0, (1, 2), 1))
        assert await asyncio.wait_for(waiting, 1) == 10

        assert await p.delete_records(10, timeout=0.05) == 10  # already there: at once

    asyncio.run(scenario())


def test_delete_records_times_out_or_fails_when_leadership_moves(leader: Harness) -> None:
    async def scenario() -> None:
        p = leader.partition
        p.append_as_leader(batch([b"a", b"b"]), acks=1)
        for follower in (2, 3):
            p.follower_fetched(follower, 2, now_ms=5, log_start_offset=0)
        with pytest.raises(KafkaError) as caught:
            await p.delete_records(1, timeout=0.05)
        assert caught.value.code == ErrorCode.REQUEST_TIMED_OUT
        assert leader.log.log_start_offset == 1  # deleted here, the ISR had not caught up
        waiting = asyncio.ensure_future(p.delete_records(2, timeout=5))
        await asyncio.sleep(0)
        p.become_follower(PartitionInfo(0, (1, 2, 3), 2, 1, (1, 2, 3), 1))
        with pytest.raises(KafkaError) as caught:
            await asyncio.wait_for(waiting, 1)
        assert caught.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER

    asyncio.run(scenario())


def test_too_small_isr_refuses_acks_all_without_appending(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "orders-0", min_insync=2)
    harness.lead(isr=(1,))
    with pytest.raises(KafkaError) as caught:
        harness.partition.append_as_leader(batch([b"x"]), acks=-1)
    assert caught.value.code == ErrorCode.NOT_ENOUGH_REPLICAS
    assert harness.log.log_end_offset == 0
    harness.partition.append_as_leader(batch([b"y"]), acks=1)  # acks=1 does not need the ISR
    assert [r.value for r in read_all(harness.log)] == [b"y"]


def test_isr_shrinking_below_min_after_append(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "orders-0", min_insync=2)
    harness.lead(isr=(1, 2))

    async def scenario() -> None:
        p = harness.partition
        appended = p.append_as_leader(batch([b"x"]), acks=-1)
        waiting = asyncio.ensure_future(p.wait_replicated(appended.last_offset, timeout=5))
        await asyncio.sleep(0)
        p.isr_change_settled(PartitionInfo(0, (1, 2, 3), 1, 0, (1,), 1))
        with pytest.raises(KafkaError) as caught:
            await asyncio.wait_for(waiting, 1)
        assert caught.value.code == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND

    asyncio.run(scenario())


def test_a_lagging_follower_is_proposed_out_and_the_watermark_waits_for_the_commit(
    leader: Harness,
) -> None:
    p = leader.partition
    p.append_as_leader(batch([b"a", b"b"]), acks=1)
    p.follower_fetched(3, 0, now_ms=100)  # never catches up
    p.follower_fetched(2, 2, now_ms=100 + LAG_MS)
    p.maybe_shrink_isr(now_ms=100 + LAG_MS + 1, lag_ms=LAG_MS)
    assert leader.proposals == [(1, 2)]
    assert leader.log.high_watermark == 0  # the old ISR still counts while the change is out
    p.isr_change_settled(PartitionInfo(0, (1, 2, 3), 1, 0, (1, 2), 1))
    assert leader.log.high_watermark == 2


def test_a_follower_that_catches_up_is_proposed_back_in(tmp_path: Path) -> None:
    harness = Harness(tmp_path / "orders-0")
    harness.lead(isr=(1, 2))
    p = harness.partition
    p.append_as_leader(batch([b"a", b"b"]), acks=1)
    p.follower_fetched(2, 2, now_ms=1)
    assert harness.log.high_watermark == 2
    p.follower_fetched(3, 1, now_ms=1)
    assert harness.proposals == []  # below the high watermark: not yet
    p.follower_fetched(3, 2, now_ms=2)
    assert harness.proposals == [(1, 2, 3)]


def test_leader_epoch_checks_and_follower_role(leader: Harness) -> None:
    p = leader.partition
    for epoch, code in ((-1, None), (0, None), (1, ErrorCode.UNKNOWN_LEADER_EPOCH)):
        if code is None:
            p.check_leader(epoch)
        else:
            with pytest.raises(KafkaError) as caught:
                p.check_leader(epoch)
            assert caught.value.code == code
    leader.lead(epoch=2, version=1)
    with pytest.raises(KafkaError) as stale:
        p.check_leader(1)
    assert stale.value.code == ErrorCode.FENCED_LEADER_EPOCH

    async def scenario() -> None:
        appended = p.append_as_leader(batch([b"x"]), acks=-1)
        waiting = asyncio.ensure_future(p.wait_replicated(appended.last_offset, timeout=5))
        await asyncio.sleep(0)
        p.become_follower(PartitionInfo(0, (1, 2, 3), 2, 3, (2, 3), 2))
        with pytest.raises(KafkaError) as moved:
            await asyncio.wait_for(waiting, 1)
        assert moved.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER

    asyncio.run(scenario())
    with pytest.raises(KafkaError) as not_leader:
        p.check_leader()
    assert not_leader.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_leader_epochs_are_recorded_where_each_leadership_starts(leader: Harness) -> None:
    p = leader.partition
    p.append_as_leader(batch([b"a", b"b"]), acks=1)
    leader.lead(epoch=3, version=1)
    p.append_as_leader(batch([b"c"]), acks=1)
    assert leader.log.end_offset_for_epoch(0) == (0, 2)
    assert leader.log.end_offset_for_epoch(2) == (0, 2)
    assert leader.log.end_offset_for_epoch(3) == (3, 3)


def _follower(directory: Path, epochs: list[tuple[int, list[bytes]]]) -> FollowState:
    """A follower's log written by leaders of the given epochs."""
    log = PartitionLog.open(directory, LogConfig())
    for epoch, values in epochs:
        log.append(batch(values), leader_epoch=epoch)
    partition = Partition(TP, uuid.uuid4(), log, 2, lambda: None, lambda p, isr: None)
    return FollowState(partition, leader_epoch=5)


def test_follower_cuts_the_tail_its_leader_never_had(tmp_path: Path) -> None:
    # Follower: epoch 0 offsets 0-1, epoch 1 offsets 2-3. The new leader only had epoch 0
    # up to offset 3 (its epoch 0 ended there) and never saw epoch 1.
    state = _follower(tmp_path / "f", [(0, [b"a", b"b"]), (1, [b"c", b"d"])])
    ReplicaFetcher._apply_epoch_end(state, leader_epoch=0, end_offset=3)
    assert state.truncating is False
    assert state.partition.log.log_end_offset == 2  # epoch 0 ends at 2 in our own log


def test_follower_asks_again_about_an_older_epoch(tmp_path: Path) -> None:
    # The leader knows epochs 0 and 2; asked about our epoch 1 it answers epoch 0, which we
    # know: cut where our epoch 0 ends, then ask again.
    state = _follower(tmp_path / "f", [(0, [b"a"]), (1, [b"b", b"c"])])
    ReplicaFetcher._apply_epoch_end(state, leader_epoch=0, end_offset=5)
    assert state.partition.log.log_end_offset == 1
    assert state.truncating is False


def test_follower_keeps_a_log_that_matches(tmp_path: Path) -> None:
    state = _follower(tmp_path / "f", [(0, [b"a", b"b"])])
    ReplicaFetcher._apply_epoch_end(state, leader_epoch=0, end_offset=10)
    assert state.partition.log.log_end_offset == 2
    assert state.truncating is False


def test_a_refused_isr_change_naming_another_leader_leaves_leadership_to_the_image(
    leader: Harness,
) -> None:
    p = leader.partition
    p.maybe_shrink_isr(now_ms=10_000, lag_ms=LAG_MS)
    assert leader.proposals == [(1,)]
    # The controller answers with the state in force: broker 2 leads in epoch 1 now.
    p.isr_change_settled(PartitionInfo(0, (1, 2, 3), 2, 1, (2, 3), 4))
    assert p.info.leader == 1 and p.info.isr == (1, 2, 3)
    assert p.pending_isr is None
