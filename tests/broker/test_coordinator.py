"""The group coordinator's runtime over a real `__consumer_offsets` partition log, without a
network: what it writes is what a successor loads, commits race safely, and a partition it
stops leading takes its groups with it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

from directlog.protocol.errors import ErrorCode
from directlog.topic_config import LogConfig
from directlog.topics import TopicPartition
from services.broker.cluster_metadata import PartitionInfo
from services.broker.groups.coordinator import Commit, CoordinatorSettings, GroupCoordinator
from services.broker.groups.group import GroupLimits, GroupState, JoinReply, JoinRequest
from services.broker.groups.offsets_topic import OFFSETS_TOPIC
from services.broker.partition import Partition
from services.broker.storage import PartitionLog

GROUP = "orders"
SETTINGS = CoordinatorSettings(GroupLimits(initial_rebalance_delay_ms=0))


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def leading(directory: Path, epoch: int = 0, replicas: tuple[int, ...] = (1,)) -> Partition:
    """Partition 0 of a one-partition offsets topic, led here (broker 1) in `epoch`, every
    replica in the ISR."""
    log = PartitionLog.open(directory, LogConfig(cleanup_policy="compact"))
    partition = Partition(
        TopicPartition(OFFSETS_TOPIC, 0), uuid.uuid4(), log, 1, lambda: None, lambda p, i: None
    )
    partition.become_leader(PartitionInfo(0, replicas, 1, epoch, replicas, 0), 0)
    return partition


async def loaded(
    partition: Partition, clock: Clock, settings: CoordinatorSettings = SETTINGS
) -> GroupCoordinator:
    coordinator = GroupCoordinator(settings, lambda: 1, clock)
    coordinator.leadership_changed(partition)
    for _ in range(200):
        if coordinator.owned[0].loaded:
            return coordinator
        await asyncio.sleep(0.01)
    raise AssertionError("the partition did not load")


def join_request(member_id: str = "") -> JoinRequest:
    return JoinRequest(
        member_id, None, "client", "/127.0.0.1", 10_000, 20_000, "consumer", [("range", b"s")], True
    )


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


async def second_join(coordinator: GroupCoordinator, group: str, member_id: str) -> JoinReply:
    """The second half of a two-phase join, for a member alone in its group: the tick
    completes the join at once (no initial rebalance delay)."""
    joining = asyncio.ensure_future(coordinator.join(group, join_request(member_id)))
    await asyncio.sleep(0)
    coordinator.tick()
    return await joining


async def stable_member(coordinator: GroupCoordinator) -> tuple[str, int]:
    first = await coordinator.join(GROUP, join_request())
    assert first.error is ErrorCode.MEMBER_ID_REQUIRED
    joined = await second_join(coordinator, GROUP, first.member_id)
    assert isinstance(joined, JoinReply) and joined.error is ErrorCode.NONE
    synced = await coordinator.sync(
        GROUP, joined.member_id, None, joined.generation, None, None, {joined.member_id: b"P0"}
    )
    assert synced.error is ErrorCode.NONE and synced.assignment == b"P0"
    return joined.member_id, joined.generation


def test_a_successor_loads_every_commit_and_the_stable_group(tmp_path: Path) -> None:
    async def run() -> None:
        clock = Clock()
        partition = leading(tmp_path)
        first = await loaded(partition, clock)
        member, generation = await stable_member(first)
        codes = await first.commit(
            GROUP,
            member,
            None,
            generation,
            [Commit("t", 0, 10, 3, "m"), Commit("t", 1, 20, -1, None)],
        )
        assert codes == [ErrorCode.NONE, ErrorCode.NONE]
        assert await first.commit(GROUP, member, None, generation, [Commit("t", 0, 11, 3, "")]) == [
            ErrorCode.NONE
        ]
        await first.close()
        partition.log.close()

        successor = await loaded(leading(tmp_path, epoch=1), clock)
        offsets = successor.fetch_offsets(GROUP, None)
        assert {tp: (o.offset, o.leader_epoch, o.metadata) for tp, o in offsets.items() if o} == {
            ("t", 0): (11, 3, ""),
            ("t", 1): (20, -1, ""),
        }
        group = successor.lookup(GROUP)
        assert group is not None and group.state is GroupState.STABLE
        assert group.generation == generation and list(group.members) == [member]
        assert group.members[member].assignment == b"P0"
        # The member carries on against the successor without rejoining.
        assert successor.heartbeat(GROUP, member, None, generation) is ErrorCode.NONE
        await successor.close()

    asyncio.run(asyncio.wait_for(run(), 20))


def test_deleted_groups_and_offsets_stay_deleted_after_a_load(tmp_path: Path) -> None:
    async def run() -> None:
        clock = Clock()
        partition = leading(tmp_path)
        coordinator = await loaded(partition, clock)
        commits = [Commit("t", p, p + 1, -1, None) for p in range(3)]
        assert await coordinator.commit("simple", "", None, -1, commits) == [ErrorCode.NONE] * 3
        assert await coordinator.commit("gone", "", None, -1, commits[:1]) == [ErrorCode.NONE]
        code, results = await coordinator.delete_offsets("simple", [("t", 1)], set())
        assert code is ErrorCode.NONE and results == {("t", 1): ErrorCode.NONE}
        assert await coordinator.delete_group("gone") is ErrorCode.NONE
        assert await coordinator.delete_group("gone") is ErrorCode.GROUP_ID_NOT_FOUND
        await coordinator.close()
        partition.log.close()

        successor = await loaded(leading(tmp_path, epoch=1), clock)
        offsets = successor.fetch_offsets("simple", None)
        assert {tp: o.offset for tp, o in offsets.items() if o} == {("t", 0): 1, ("t", 2): 3}
        assert successor.lookup("gone") is None
        assert [g.group_id for g in successor.listed_groups()] == ["simple"]
        await successor.close()

    asyncio.run(asyncio.wait_for(run(), 20))


def test_stale_members_cannot_commit_and_nothing_is_written_for_them(tmp_path: Path) -> None:
    async def run() -> None:
        partition = leading(tmp_path)
        coordinator = await loaded(partition, Clock())
        member, generation = await stable_member(coordinator)
        end = partition.log.log_end_offset
        refused = await coordinator.commit(
            GROUP, member, None, generation + 1, [Commit("t", 0, 5, -1, None)]
        )
        assert refused == [ErrorCode.ILLEGAL_GENERATION]
        ghost = await coordinator.commit(
            GROUP, "ghost", None, generation, [Commit("t", 0, 5, -1, None)]
        )
        assert ghost == [ErrorCode.UNKNOWN_MEMBER_ID]
        too_big = Commit("t", 0, 5, -1, "x" * 5000)
        assert await coordinator.commit(GROUP, member, None, generation, [too_big]) == [
            ErrorCode.OFFSET_METADATA_TOO_LARGE
        ]
        assert partition.log.log_end_offset == end  # nothing reached the log
        assert await coordinator.commit("absent", "m", None, 3, [Commit("t", 0, 1, -1, None)]) == [
            ErrorCode.ILLEGAL_GENERATION
        ]
        await coordinator.close()

    asyncio.run(asyncio.wait_for(run(), 20))


def test_losing_the_partition_answers_waiting_joins_not_coordinator(tmp_path: Path) -> None:
    async def run() -> None:
        partition = leading(tmp_path)
        coordinator = await loaded(partition, Clock())
        first = await coordinator.join(GROUP, join_request())
        waiting = asyncio.ensure_future(coordinator.join(GROUP, join_request(first.member_id)))
        await asyncio.sleep(0)
        partition.become_follower(PartitionInfo(0, (1, 2), 2, 1, (1, 2), 1))
        coordinator.leadership_changed(partition)
        reply = await waiting
        assert reply.error is ErrorCode.NOT_COORDINATOR
        assert coordinator.heartbeat(GROUP, first.member_id, None, 1) is ErrorCode.NOT_COORDINATOR
        await coordinator.close()

    asyncio.run(asyncio.wait_for(run(), 20))


# offsets.retention.ms shorter than the members' 10 s session, so an offset can expire while
# a member id handed out is still waiting for its second join.
RETAINING = CoordinatorSettings(GroupLimits(initial_rebalance_delay_ms=0), retention_ms=5_000)


def test_offset_expiry_forgets_abandoned_groups_but_not_one_being_joined(tmp_path: Path) -> None:
    async def run() -> None:
        clock = Clock()
        partition = leading(tmp_path)
        coordinator = await loaded(partition, clock, RETAINING)
        first = await coordinator.join(GROUP, join_request())
        assert first.error is ErrorCode.MEMBER_ID_REQUIRED
        assert await coordinator.commit("idle", "", None, -1, [Commit("t", 0, 7, -1, None)]) == [
            ErrorCode.NONE
        ]
        clock.now += RETAINING.retention_ms
        coordinator.tick()  # the first tick runs the retention check: GROUP first, then "idle"
        await until(lambda: coordinator.lookup("idle") is None)
        assert coordinator.lookup(GROUP) is not None
        joined = await second_join(coordinator, GROUP, first.member_id)
        assert joined.error is ErrorCode.NONE and joined.member_id == first.member_id
        await coordinator.close()
        partition.log.close()

        successor = await loaded(leading(tmp_path, epoch=1), clock, RETAINING)
        assert successor.lookup("idle") is None
        assert successor.fetch_offsets("idle", None) == {}
        await successor.close()

    asyncio.run(asyncio.wait_for(run(), 20))


def test_a_join_while_the_group_tombstone_replicates_keeps_the_group(tmp_path: Path) -> None:
    """The retention check appends an abandoned group's tombstone and waits for the ISR; a
    join in that wait makes the group live again, and it must stay."""

    async def run() -> None:
        clock = Clock()
        partition = leading(tmp_path, replicas=(1, 2))
        coordinator = await loaded(partition, clock)
        for group in (GROUP, "later"):  # member ids that are never used: abandoned groups
            assert (await coordinator.join(group, join_request())).error is (
                ErrorCode.MEMBER_ID_REQUIRED
            )
        clock.now += 10_000
        coordinator.tick()
        await until(lambda: partition.log.log_end_offset == 1)  # GROUP's tombstone, waiting
        first = await coordinator.join(GROUP, join_request())
        assert first.error is ErrorCode.MEMBER_ID_REQUIRED
        partition.follower_fetched(2, 1, clock.now)
        await until(lambda: partition.log.log_end_offset == 2)  # on to "later"
        partition.follower_fetched(2, 2, clock.now)
        await until(lambda: coordinator.lookup("later") is None)
        assert coordinator.lookup(GROUP) is not None
        joined = await second_join(coordinator, GROUP, first.member_id)
        assert joined.error is ErrorCode.NONE and joined.member_id == first.member_id
        await coordinator.close()

    asyncio.run(asyncio.wait_for(run(), 20))
