"""TxnOffsetCommit at the group coordinator over a real `__consumer_offsets` log: offsets
written in a transaction count from its COMMIT marker on, never after an ABORT, each losing
to a commit of the partition written later in the log (Kafka's `olderThan`); a stable
OffsetFetch (KIP-447) answers UNSTABLE_OFFSET_COMMIT while a commit is not settled;
OffsetDelete and DeleteGroups cancel what is pending; and a successor loading the partition
ends exactly where the leader was, holding the still open transactions back."""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from directlog.protocol.errors import ErrorCode
from services.broker.groups.coordinator import Commit, GroupCoordinator, Read
from services.broker.groups.group import CommittedOffset
from services.broker.partition import Partition
from tests.broker.test_coordinator import RETAINING, SETTINGS, Clock, leading, loaded, until

pytestmark = pytest.mark.timeout(120)
GROUP = "etl"
TP0, TP1 = ("t", 0), ("t", 1)
UNSTABLE = ErrorCode.UNSTABLE_OFFSET_COMMIT


def offsets(coordinator: GroupCoordinator, group: str = GROUP) -> dict[tuple[str, int], int]:
    found = coordinator.fetch_offsets(group, None)
    return {tp: o.offset for tp, o in found.items() if isinstance(o, CommittedOffset)}


def unstable(coordinator: GroupCoordinator, *tps: tuple[str, int]) -> set[tuple[str, int]]:
    """Which of the partitions a stable OffsetFetch answers UNSTABLE_OFFSET_COMMIT."""
    found = coordinator.fetch_offsets(GROUP, [(t, [p]) for t, p in tps], True)
    return {tp for tp, o in found.items() if o is UNSTABLE}


async def txn(
    coordinator: GroupCoordinator, producer_id: int, tp: tuple[str, int], offset: int
) -> None:
    codes = await coordinator.txn_commit(
        GROUP, producer_id, 0, "", -1, [Commit(tp[0], tp[1], offset, -1, "m")]
    )
    assert codes == [ErrorCode.NONE]


async def plain(coordinator: GroupCoordinator, tp: tuple[str, int], offset: int) -> None:
    codes = await coordinator.commit(GROUP, "", None, -1, [Commit(tp[0], tp[1], offset, -1, "")])
    assert codes == [ErrorCode.NONE]


def marker(
    coordinator: GroupCoordinator, partition: Partition, producer_id: int, commit: bool
) -> None:
    """What the marker writer does: the marker in the log, then the coordinator told."""
    partition.log.append_marker(producer_id, 0, commit, 0, partition.leader_epoch)
    coordinator.transaction_ended(0, producer_id, commit)


async def successor_of(
    coordinator: GroupCoordinator, partition: Partition, directory: Path, clock: Clock, epoch: int
) -> tuple[GroupCoordinator, Partition]:
    await coordinator.close()
    partition.log.close()
    successor_partition = leading(directory, epoch=epoch)
    return await loaded(successor_partition, clock), successor_partition


def test_transactional_offsets_follow_their_markers_across_a_reload(tmp_path: Path) -> None:
    async def run() -> None:
        clock = Clock()
        partition = leading(tmp_path)
        first = await loaded(partition, clock)

        await txn(first, 7, TP0, 10)
        assert offsets(first) == {}  # not before the marker
        assert unstable(first, TP0, TP1) == {TP0}
        marker(first, partition, 7, True)
        assert offsets(first) == {TP0: 10}
        assert unstable(first, TP0, TP1) == set()
        await txn(first, 8, TP1, 20)
        marker(first, partition, 8, False)
        await txn(first, 9, ("t", 2), 30)  # left open
        assert offsets(first) == {TP0: 10}
        # A member id the group does not have, or a generation it is not in, is refused.
        assert await first.txn_commit(GROUP, 9, 0, "ghost", -1, [Commit("t", 0, 1, -1, "")]) == [
            ErrorCode.UNKNOWN_MEMBER_ID
        ]
        assert await first.txn_commit(GROUP, 9, 0, "", 4, [Commit("t", 0, 1, -1, "")]) == [
            ErrorCode.ILLEGAL_GENERATION
        ]
        successor, successor_partition = await successor_of(first, partition, tmp_path, clock, 1)
        assert offsets(successor) == {TP0: 10}
        assert unstable(successor, TP0, TP1, ("t", 2)) == {("t", 2)}
        marker(successor, successor_partition, 9, True)
        assert offsets(successor) == {TP0: 10, ("t", 2): 30}
        await successor.close()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_the_commit_written_later_wins_whichever_completes_first(tmp_path: Path) -> None:
    """A plain OffsetCommit written after a pending TxnOffsetCommit of the partition wins
    when the transaction commits; one written before loses. A stable fetch of every
    partition (topics null) marks the committed partitions that have one pending."""

    async def run() -> None:
        clock = Clock()
        partition = leading(tmp_path)
        first = await loaded(partition, clock)
        await txn(first, 7, TP0, 10)
        await plain(first, TP0, 20)  # written after the transactional one
        await plain(first, TP1, 5)
        await txn(first, 8, TP1, 15)  # written after the plain one
        assert offsets(first) == {TP0: 20, TP1: 5}  # a plain commit counts at once
        every = first.fetch_offsets(GROUP, None, True)
        assert every == {TP0: UNSTABLE, TP1: UNSTABLE}
        marker(first, partition, 7, True)
        marker(first, partition, 8, True)
        assert offsets(first) == {TP0: 20, TP1: 15}
        successor, _ = await successor_of(first, partition, tmp_path, clock, 1)
        assert offsets(successor) == {TP0: 20, TP1: 15}
        assert successor.fetch_offsets(GROUP, None, True) == {
            tp: o for tp, o in successor.fetch_offsets(GROUP, None).items()
        }
        await successor.close()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_commits_in_flight_are_unstable_and_offset_delete_cancels_them(tmp_path: Path) -> None:
    """Until the ISR has a commit's records the partition is unstable; an OffsetDelete in
    that time cancels the commit (Kafka's pendingOffsetCommits), live and after a reload."""

    async def run() -> None:
        clock = Clock()
        partition = leading(tmp_path, replicas=(1, 2))
        first = await loaded(partition, clock)
        writing = asyncio.create_task(plain(first, TP0, 3))
        await until(lambda: partition.log.log_end_offset == 1)
        assert unstable(first, TP0, TP1) == {TP0}
        assert offsets(first) == {}
        deleting = asyncio.create_task(first.delete_offsets(GROUP, [TP0], set()))
        await until(lambda: partition.log.log_end_offset == 2)  # its tombstone
        partition.follower_fetched(2, 2, clock.now)
        await writing
        assert await deleting == (ErrorCode.NONE, {TP0: ErrorCode.NONE})
        assert offsets(first) == {}
        assert unstable(first, TP0) == set()
        # A transactional commit is pending from its append on, before the ISR has it.
        committing = asyncio.create_task(txn(first, 7, TP1, 9))
        await until(lambda: partition.log.log_end_offset == 3)
        assert unstable(first, TP0, TP1) == {TP1}
        partition.follower_fetched(2, 3, clock.now)
        await committing
        assert unstable(first, TP1) == {TP1}
        await first.close()
        partition.log.close()

        successor = await loaded(leading(tmp_path, epoch=1), clock)
        assert offsets(successor) == {}
        assert unstable(successor, TP0, TP1) == {TP1}
        await successor.close()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_delete_groups_drops_pending_offsets_and_expiry_keeps_their_group(tmp_path: Path) -> None:
    """DeleteGroups takes the pending transactional offsets with the group: its COMMIT
    marker brings neither back. Offset expiry leaves a group whose only offsets wait for a
    transaction, and they count when it commits. A successor agrees on both."""

    async def run() -> None:
        clock = Clock()
        partition = leading(tmp_path)
        first = await loaded(partition, clock, RETAINING)
        await plain(first, TP1, 4)
        await txn(first, 7, TP0, 10)
        assert await first.delete_group(GROUP) is ErrorCode.NONE
        marker(first, partition, 7, True)
        assert first.lookup(GROUP) is None
        assert offsets(first) == {}

        await txn(first, 8, TP0, 11)  # a new group, with only a pending offset
        clock.now += RETAINING.retention_ms
        first.tick()
        await asyncio.sleep(0.05)
        assert first.lookup(GROUP) is not None
        marker(first, partition, 8, True)
        assert offsets(first) == {TP0: 11}

        successor, _ = await successor_of(first, partition, tmp_path, clock, 1)
        assert offsets(successor) == {TP0: 11}
        await successor.close()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_marker_written_while_the_partition_loads_is_applied_after_the_load(
    tmp_path: Path,
) -> None:
    """The marker writer may finish a marker after the load read the log: the coordinator
    applies it once the load is done instead of losing it."""

    async def run() -> None:
        clock = Clock()
        partition = leading(tmp_path)
        first = await loaded(partition, clock)
        await txn(first, 7, TP0, 10)
        await first.close()
        partition.log.close()

        successor_partition = leading(tmp_path, epoch=1)
        successor = GroupCoordinator(SETTINGS, lambda: 1, clock)
        read = successor._read

        def read_then_mark(partition: Partition) -> list[Read]:
            found = read(partition)  # the log as the load sees it: the transaction open
            partition.log.append_marker(7, 0, True, 0, partition.leader_epoch)
            successor.transaction_ended(0, 7, True)  # nothing else runs meanwhile
            return found

        successor._read = read_then_mark  # type: ignore[method-assign]
        successor.leadership_changed(successor_partition)
        await until(lambda: successor.owned[0].loaded)
        assert offsets(successor) == {TP0: 10}
        assert unstable(successor, TP0) == set()
        await successor.close()

    asyncio.run(asyncio.wait_for(run(), 60))


# A history of commits against Kafka's rules, live and replayed ---------------------------


@dataclass
class Model:
    """Kafka's GroupMetadata for one group, with log positions: what must come out."""

    position: int = 0
    exists: bool = False
    offsets: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    pending: dict[int, dict[tuple[str, int], tuple[int, int]]] = field(default_factory=dict)
    open_producers: set[int] = field(default_factory=set)

    def write(self) -> int:
        self.position += 1
        return self.position

    def committed(self) -> dict[tuple[str, int], int]:
        return {tp: value for tp, (value, _) in self.offsets.items()}

    def unstable(self) -> set[tuple[str, int]]:
        return {tp for p in self.pending.values() for tp in p}


TPS = st.sampled_from([TP0, TP1])
PRODUCERS = st.sampled_from([7, 8])
OPERATION = st.one_of(
    st.tuples(st.just("plain"), TPS, st.integers(0, 1000)),
    st.tuples(st.just("txn"), PRODUCERS, TPS, st.integers(0, 1000)),
    st.tuples(st.just("end"), PRODUCERS, st.booleans()),
    st.tuples(st.just("delete"), TPS),
    st.tuples(st.just("delete_group")),
)


async def play(operations: list[tuple[object, ...]], directory: Path) -> None:
    clock = Clock()
    partition = leading(directory)
    coordinator = await loaded(partition, clock)
    model = Model()
    for operation in operations:
        kind = operation[0]
        if kind == "plain":
            _, tp, value = operation
            assert isinstance(tp, tuple) and isinstance(value, int)
            await plain(coordinator, tp, value)
            model.offsets[tp] = (value, model.write())
            model.exists = True
        elif kind == "txn":
            _, producer_id, tp, value = operation
            assert isinstance(producer_id, int) and isinstance(tp, tuple)
            assert isinstance(value, int)
            await txn(coordinator, producer_id, tp, value)
            model.pending.setdefault(producer_id, {})[tp] = (value, model.write())
            model.open_producers.add(producer_id)
            model.exists = True
        elif kind == "end":
            _, producer_id, commit = operation
            assert isinstance(producer_id, int) and isinstance(commit, bool)
            if producer_id not in model.open_producers:
                continue
            marker(coordinator, partition, producer_id, commit)
            model.open_producers.discard(producer_id)
            for tp, (value, position) in model.pending.pop(producer_id, {}).items():
                current = model.offsets.get(tp)
                if commit and (current is None or current[1] < position):
                    model.offsets[tp] = (value, position)
        elif kind == "delete":
            tp = operation[1]
            assert isinstance(tp, tuple)
            code, _ = await coordinator.delete_offsets(GROUP, [tp], set())
            assert code is (ErrorCode.NONE if model.exists else ErrorCode.GROUP_ID_NOT_FOUND)
            model.offsets.pop(tp, None)
            for producer_id in list(model.pending):
                model.pending[producer_id].pop(tp, None)
                if not model.pending[producer_id]:
                    del model.pending[producer_id]
        else:
            expected = ErrorCode.NONE if model.exists else ErrorCode.GROUP_ID_NOT_FOUND
            assert await coordinator.delete_group(GROUP) is expected
            model.exists = False
            model.offsets.clear()
            model.pending.clear()
        assert offsets(coordinator) == model.committed(), operation
        assert unstable(coordinator, TP0, TP1) == model.unstable(), operation
    successor, _ = await successor_of(coordinator, partition, directory, clock, 1)
    assert offsets(successor) == model.committed()
    assert unstable(successor, TP0, TP1) == model.unstable()
    await successor.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPERATION, max_size=14))
def test_any_history_ends_as_kafka_says_live_and_after_a_reload(
    operations: list[tuple[object, ...]],
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(asyncio.wait_for(play(operations, Path(directory)), 60))
