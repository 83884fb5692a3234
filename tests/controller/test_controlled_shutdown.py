"""Controlled shutdown, planned by ``ClusterState``: a broker about to stop hands its
leaderships to the first other eligible ISR member in replica order and leaves every ISR
it does not hold alone; from then on it is never elected nor added back to an ISR, and a
new incarnation of its id registers at once.

The controller marks the broker (``begin_controlled_shutdown``), then commits ``elect`` in
chunks until nothing is left, as its reconciler does after fencing; ``shut_down`` here does
the same with plain values.
"""

from __future__ import annotations

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.topics import NO_LEADER
from services.controller import layout
from services.controller.cluster import ClusterState, Delta, IsrChange
from services.controller.layout import Create
from services.controller.model import PartitionState
from tests.controller.clusters import (
    LISTENERS,
    PATHS,
    TIMEOUT,
    commit,
    fence,
    partition,
    register,
    with_topic,
)


def shut_down(state: ClusterState, broker_id: int, *, limit: int = 500) -> tuple[bool, int]:
    """What the ControlledShutdown RPC does: (first call?, leaderships kept)."""
    first = state.begin_controlled_shutdown(broker_id, state.brokers[broker_id].broker_epoch)
    while (change := state.elect(limit)) is not None:
        commit(state, change)
    return first, state.leaderships(broker_id)


def states(state: ClusterState, topic_id: bytes) -> list[PartitionState]:
    return list(state.topics[topic_id].partitions)


def test_leaders_move_to_the_first_other_isr_member_in_replica_order() -> None:
    state, topic_id = with_topic(
        [(1, 2, 3), (1, 3, 2), (2, 1, 3), (3, 2, 1), (1, 2, 3)],
        isr=[(1, 2, 3), (1, 2, 3), (2, 1, 3), (3, 2, 1), (3, 1)],
    )
    first = state.begin_controlled_shutdown(1, 1)
    change = state.elect()
    assert first and change is not None
    assert change.delta == Delta({topic_id: frozenset(range(5))})
    assert change.leader_elections == 3 and change.unclean_elections == 0
    assert change.isr_changes == 5
    commit(state, change)
    assert state.elect() is None
    assert states(state, topic_id) == [
        PartitionState((1, 2, 3), 2, 1, (2, 3), 1),  # led: 2 comes first in replica order
        PartitionState((1, 3, 2), 3, 1, (2, 3), 1),  # the ISR keeps its order
        PartitionState((2, 1, 3), 2, 0, (2, 3), 1),  # followed: only leaves the ISR
        PartitionState((3, 2, 1), 3, 0, (3, 2), 1),
        PartitionState((1, 2, 3), 3, 1, (3,), 1),  # 2 is out of sync: 3 takes it
    ]
    assert state.leaderships(1) == 0
    new = partition(state, topic_id)
    assert change.ops[0] == Create(PATHS.partition(topic_id, 0), layout.encode_partition(new))


def test_a_fenced_isr_member_is_passed_over() -> None:
    state, topic_id = with_topic([(1, 2, 3, 4)], brokers=4)
    state.fenced.add(2)  # fenced a moment ago, its election not yet run
    assert shut_down(state, 1) == (True, 0)
    assert partition(state, topic_id) == PartitionState((1, 2, 3, 4), 3, 1, (3, 4), 1)


def test_a_sole_isr_member_stays_keeps_leading_and_is_counted() -> None:
    state, topic_id = with_topic([(1, 2), (1, 2), (2, 1)], brokers=2, isr=[(1,), (1, 2), (2,)])
    assert shut_down(state, 1) == (True, 1)
    assert states(state, topic_id) == [
        PartitionState((1, 2), 1, 0, (1,), 0),  # nothing else could take it: untouched
        PartitionState((1, 2), 2, 1, (2,), 1),
        PartitionState((2, 1), 2, 0, (2,), 0),
    ]
    assert state.offline_count == 0


def test_calling_again_changes_nothing_and_answers_the_same() -> None:
    state, topic_id = with_topic([(1, 2), (1, 2)], brokers=2, isr=[(1,), (1, 2)])
    assert shut_down(state, 1) == (True, 1)
    before = states(state, topic_id)
    assert shut_down(state, 1) == (False, 1)
    assert states(state, topic_id) == before


def test_many_partitions_move_in_bounded_chunks() -> None:
    state, topic_id = with_topic([(1, 2)] * 7, brokers=2)
    state.begin_controlled_shutdown(1, 1)
    sizes = []
    while (change := state.elect(limit=3)) is not None:
        sizes.append(len(change.ops))
        commit(state, change)
    assert sizes == [3, 3, 1]
    assert all(p.leader == 2 and p.isr == (2,) for p in states(state, topic_id))


@pytest.mark.parametrize(
    ("broker_id", "epoch", "error"),
    [
        (1, 99, ErrorCode.STALE_BROKER_EPOCH),
        (9, 9, ErrorCode.BROKER_ID_NOT_REGISTERED),
    ],
)
def test_only_a_current_registration_may_shut_down(
    broker_id: int, epoch: int, error: ErrorCode
) -> None:
    state, _ = with_topic([(1, 2)], brokers=2)
    with pytest.raises(KafkaError) as refused:
        state.begin_controlled_shutdown(broker_id, epoch)
    assert refused.value.code == error
    assert not state.shutting_down


def test_a_fenced_broker_has_nothing_to_hand_over() -> None:
    state, _ = with_topic([(1, 2)], brokers=2)
    fence(state, 1)
    with pytest.raises(KafkaError) as refused:
        state.begin_controlled_shutdown(1, 1)
    assert refused.value.code == ErrorCode.STALE_BROKER_EPOCH


def test_a_shutting_down_broker_is_never_elected() -> None:
    configs = {"unclean.leader.election.enable": "true"}
    state, topic_id = with_topic([(1, 2, 3)], configs=configs, isr=[(1, 2)])
    shut_down(state, 1)
    assert partition(state, topic_id) == PartitionState((1, 2, 3), 2, 1, (2,), 1)
    # The new leader dies: 1 is alive and was in sync, but it is going; unclean election
    # skips it too and takes 3.
    fence(state, 2)
    assert partition(state, topic_id) == PartitionState((1, 2, 3), 3, 2, (3,), 2)
    assert 1 in state.shutting_down and state.leaderships(1) == 0


def test_a_shutting_down_broker_is_not_elected_for_an_offline_partition() -> None:
    state, topic_id = with_topic([(1, 2)], brokers=2, isr=[(1, 2)])
    shut_down(state, 1)
    fence(state, 2)  # the ISR is [2] again, and 2 is gone
    assert partition(state, topic_id) == PartitionState((1, 2), NO_LEADER, 2, (2,), 2)
    assert state.elect() is None


def test_a_shutting_down_broker_gets_no_new_replicas() -> None:
    state, _ = with_topic([(1, 2)], brokers=3)
    shut_down(state, 1)
    (topic,) = state.create_topic("more", 6, 2, {}).topics
    assert all(1 not in p.replicas for p in topic.partitions)


def test_a_shutting_down_broker_cannot_be_added_back_to_an_isr() -> None:
    state, topic_id = with_topic([(1, 2, 3)])
    shut_down(state, 1)
    moved = partition(state, topic_id)
    assert (moved.leader, moved.isr) == (2, (2, 3))
    (result,), change = state.alter_partition(
        2, 2, [IsrChange(topic_id, 0, moved.leader_epoch, moved.partition_epoch, (2, 3, 1))]
    )
    assert result.error is ErrorCode.INELIGIBLE_REPLICA and result.state == moved
    assert change.ops == ()


def test_a_sole_isr_leader_that_lets_a_follower_in_hands_over_to_it() -> None:
    state, topic_id = with_topic([(1, 2)], brokers=2, isr=[(1,)])
    assert shut_down(state, 1) == (True, 1)
    # Still its leader, it may expand the ISR (the follower caught up); then the
    # partition moves like the others.
    (result,), change = state.alter_partition(1, 1, [IsrChange(topic_id, 0, 0, 0, (1, 2))])
    assert result.error is ErrorCode.NONE
    commit(state, change)
    assert shut_down(state, 1) == (False, 0)
    assert partition(state, topic_id) == PartitionState((1, 2), 2, 1, (2,), 2)


def test_its_heartbeats_are_accepted_and_its_session_end_changes_nothing_more() -> None:
    state, topic_id = with_topic([(1, 2), (2, 1)], brokers=2, isr=[(1,), (2, 1)])
    shut_down(state, 1)
    assert state.heartbeat(1, 1, 5.0) is ErrorCode.NONE
    after = states(state, topic_id)
    state.heartbeat(2, 2, 100.0)
    assert state.fence_expired(100.0) == [1]
    assert not state.shutting_down
    changes = [commit(state, c) for c in iter(state.elect, None)]
    # Only the partition it still led alone goes offline, as after any fencing.
    assert [c.delta for c in changes] == [Delta({topic_id: frozenset({0})})]
    assert states(state, topic_id) == [
        PartitionState((1, 2), NO_LEADER, 1, (1,), 1),
        after[1],
    ]


def test_a_new_incarnation_registers_at_once() -> None:
    state, topic_id = with_topic([(1, 2)], brokers=2, isr=[(1, 2)])
    shut_down(state, 1)
    # Its session has most of its time left: without the shutdown this would be
    # DUPLICATE_BROKER_REGISTRATION.
    change = state.register_broker(1, "restarted", LISTENERS, None, 1.0)
    commit(state, change, 1.0)
    epoch = state.brokers[1].broker_epoch
    assert state.brokers[1].incarnation_id == "restarted" and epoch == 3
    assert not state.shutting_down
    # The old incarnation's epoch is over; the new one may join the ISR again.
    assert state.heartbeat(1, 1, 1.5) is ErrorCode.STALE_BROKER_EPOCH
    moved = partition(state, topic_id)
    (result,), _ = state.alter_partition(
        2, 2, [IsrChange(topic_id, 0, moved.leader_epoch, moved.partition_epoch, (2, 1))]
    )
    assert result.error is ErrorCode.NONE


def test_without_a_shutdown_the_new_incarnation_still_waits() -> None:
    state, _ = with_topic([(1, 2)], brokers=2)
    with pytest.raises(KafkaError) as refused:
        state.register_broker(1, "restarted", LISTENERS, None, TIMEOUT / 2)
    assert refused.value.code == ErrorCode.DUPLICATE_BROKER_REGISTRATION


def test_a_registration_ends_the_shutdown() -> None:
    state, _ = with_topic([(1, 2)], brokers=2)
    shut_down(state, 1)
    register(state, 1, now=1.0)  # the same incarnation, on a new session
    assert not state.shutting_down
    assert 1 in state.unfenced()


def test_a_broker_that_says_it_stops_is_fenced_at_once() -> None:
    """Its controlled shutdown done, a broker's last heartbeat says it stops: fenced now,
    not when its session runs out; what it still led alone goes offline, as it would then.
    A stale incarnation saying so changes nothing."""
    state, topic_id = with_topic([(1, 2), (2, 1)], isr=[(1, 2), (2,)])
    shut_down(state, 2)
    assert not state.fence_stopped(2, state.brokers[2].broker_epoch + 1)
    assert 2 not in state.fenced
    assert state.fence_stopped(2, state.brokers[2].broker_epoch)
    assert 2 in state.fenced and 2 not in state.shutting_down
    while (change := state.elect()) is not None:
        commit(state, change)
    first, second = states(state, topic_id)
    assert (first.leader, first.isr) == (1, (1,))
    assert (second.leader, second.isr) == (NO_LEADER, (2,))
    assert not state.fence_stopped(2, state.brokers[2].broker_epoch)  # fenced already
