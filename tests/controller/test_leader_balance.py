"""Automatic preferred leader election (Kafka's auto.leader.rebalance.enable): partitions go
back to their preferred replica (the first of their replicas) for every broker whose share
of partitions it should lead but does not exceeds leader.imbalance.per.broker.percentage.

``ClusterState`` plans it (``imbalanced_brokers``, then ``elect_preferred`` in chunks until
None); the term runs it every check interval under its epoch (the last tests, with a
store that records commits).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import cast

import pytest
from pydantic import ValidationError

from services.controller import layout
from services.controller.cluster import ClusterState, Delta, IsrChange
from services.controller.controller import LeaderBalance, Term
from services.controller.layout import ControllerRecord, SetData, StoreOp
from services.controller.metrics import ControllerMetrics
from services.controller.model import PartitionState
from services.controller.settings import ControllerSettings
from services.controller.store import Store, Won
from tests.controller.clusters import TIMEOUT, commit, fence, register, with_topic

NOW = 101.0  # after ``back`` has fenced a broker at 100 and registered it again


def back(state: ClusterState, topic_id: bytes, broker_id: int, now: float = NOW) -> None:
    """Fence the broker (its leaderships move), register it again and let every leader add
    it back to its ISR: a broker that was SIGKILLed, restarted and caught up."""
    fence(state, broker_id)
    register(state, broker_id, now=now)
    changes = []
    for index, p in enumerate(state.topics[topic_id].partitions):
        if broker_id in p.replicas and broker_id not in p.isr:
            leader = state.brokers[p.leader]
            isr = (*p.isr, broker_id)
            change = IsrChange(topic_id, index, p.leader_epoch, p.partition_epoch, isr)
            changes.append((leader, change))
    for leader, change in changes:
        results, planned = state.alter_partition(leader.broker_id, leader.broker_epoch, [change])
        assert results[0].state is not None and results[0].state.isr == change.new_isr
        commit(state, planned, now)


def rebalance(state: ClusterState, percentage: int = 10, *, limit: int = 500) -> int:
    """What the term does at each check: the moves, committed in chunks. Returns them."""
    brokers = state.imbalanced_brokers(percentage)
    moved = 0
    while (change := state.elect_preferred(brokers, NOW, limit)) is not None:
        commit(state, change, NOW)
        moved += change.preferred_elections
    return moved


def set_partitions(
    state: ClusterState, topic_id: bytes, partitions: tuple[PartitionState, ...]
) -> None:
    """Replace the topic's partition states, as if loaded so by a new controller."""
    state.topics[topic_id] = replace(state.topics[topic_id], partitions=partitions)


def leaders(state: ClusterState, topic_id: bytes) -> list[int]:
    return [p.leader for p in state.topics[topic_id].partitions]


def test_a_returning_broker_leads_its_preferred_partitions_again() -> None:
    state, topic_id = with_topic([(1, 2, 3), (2, 3, 1), (3, 1, 2), (1, 3, 2)])
    back(state, topic_id, 1)
    assert leaders(state, topic_id) == [2, 2, 3, 3]
    assert state.leader_imbalance() == {1: (2, 2), 2: (0, 1), 3: (0, 1)}
    before = list(state.topics[topic_id].partitions)
    brokers = state.imbalanced_brokers(10)
    assert brokers == {1}

    change = state.elect_preferred(brokers, NOW)
    assert change is not None
    assert change.delta == Delta({topic_id: frozenset({0, 3})})
    assert (change.leader_elections, change.preferred_elections) == (2, 2)
    assert (change.unclean_elections, change.isr_changes) == (0, 0)
    commit(state, change, NOW)

    after = state.topics[topic_id].partitions
    for index in (0, 3):
        old, new = before[index], after[index]
        assert new == PartitionState(
            old.replicas, 1, old.leader_epoch + 1, old.isr, old.partition_epoch + 1
        )
        assert change.ops[(0, 3).index(index)] == SetData(
            state.paths.partition(topic_id, index),
            layout.encode_partition(new),
            version=old.partition_epoch - 1,
        )
    assert after[1:3] == tuple(before[1:3])  # led by their preferred replica already
    assert state.leader_imbalance()[1] == (0, 2)
    assert state.elect_preferred(brokers, NOW) is None


@pytest.mark.parametrize(
    ("not_led", "percentage", "imbalanced"),
    [
        (0, 10, False),
        (1, 10, False),  # 10 % is not above 10 %
        (2, 10, True),
        (1, 0, True),  # 0: any partition led elsewhere
        (10, 99, True),
        (10, 100, False),  # 100: never
    ],
)
def test_the_imbalance_ratio_must_exceed_the_percentage(
    not_led: int, percentage: int, imbalanced: bool
) -> None:
    # Broker 1 should lead 10 partitions; `not_led` of them are led by broker 2.
    replicas: list[tuple[int, ...]] = [(1, 2, 3)] * 10
    state, topic_id = with_topic(replicas)
    partitions = tuple(
        PartitionState(r, 2 if i < not_led else 1, 1, r, 1) for i, r in enumerate(replicas)
    )
    set_partitions(state, topic_id, partitions)
    for b in (1, 2, 3):
        state.heartbeat(b, b, NOW)
    assert state.leader_imbalance()[1] == (not_led, 10)
    assert (1 in state.imbalanced_brokers(percentage)) is imbalanced
    assert rebalance(state, percentage) == (not_led if imbalanced else 0)


def test_once_over_the_threshold_every_partition_moves_not_just_enough() -> None:
    # Broker 1: 3 of 20 led elsewhere (15 %). In chunks of 1, the second chunk would see
    # 10 %, under the threshold: the brokers are decided once, before the first chunk.
    replicas: list[tuple[int, ...]] = [(1, 2, 3)] * 20
    state, topic_id = with_topic(replicas)
    partitions = tuple(
        PartitionState(r, 2 if i < 3 else 1, 1, r, 1) for i, r in enumerate(replicas)
    )
    set_partitions(state, topic_id, partitions)
    for b in (1, 2, 3):
        state.heartbeat(b, b, NOW)
    sizes = []
    brokers = state.imbalanced_brokers(10)
    while (change := state.elect_preferred(brokers, NOW, limit=1)) is not None:
        sizes.append(len(change.ops))
        commit(state, change, NOW)
    assert sizes == [1, 1, 1]
    assert leaders(state, topic_id) == [1] * 20


def test_large_moves_come_in_bounded_chunks_until_a_fixed_point() -> None:
    state, topic_id = with_topic([(1, 2, 3), (1, 3, 2)] * 6)
    back(state, topic_id, 1)
    assert set(leaders(state, topic_id)) == {2, 3}
    brokers = state.imbalanced_brokers(10)
    sizes = []
    while (change := state.elect_preferred(brokers, NOW, limit=5)) is not None:
        sizes.append(len(change.ops))
        assert change.preferred_elections == len(change.ops)
        commit(state, change, NOW)
    assert sizes == [5, 5, 2]
    assert leaders(state, topic_id) == [1] * 12


def test_nothing_to_do_when_every_preferred_replica_leads() -> None:
    state, _ = with_topic([(1, 2, 3), (2, 3, 1), (3, 1, 2)])
    for b in (1, 2, 3, 4):
        state.heartbeat(b, b, NOW)
    assert state.leader_imbalance() == {1: (0, 1), 2: (0, 1), 3: (0, 1)}
    assert state.imbalanced_brokers(0) == frozenset()
    assert state.elect_preferred({1, 2, 3, 4}, NOW) is None


def test_a_preferred_replica_out_of_the_isr_is_skipped() -> None:
    state, topic_id = with_topic([(1, 2, 3), (1, 3, 2)])
    fence(state, 1)
    register(state, 1, now=NOW)  # back, but not caught up: in neither ISR
    assert state.imbalanced_brokers(10) == {1}
    assert state.elect_preferred({1}, NOW) is None
    leader = state.brokers[2]
    p = state.topics[topic_id].partitions[0]
    _, change = state.alter_partition(
        2,
        leader.broker_epoch,
        [IsrChange(topic_id, 0, p.leader_epoch, p.partition_epoch, (*p.isr, 1))],
    )
    commit(state, change, NOW)
    assert rebalance(state) == 1  # only the partition whose ISR it joined
    assert leaders(state, topic_id) == [1, 3]


def test_a_fenced_preferred_replica_is_skipped() -> None:
    state, topic_id = with_topic([(1, 2, 3), (1, 3, 2)], isr=[(2, 1), (3, 1)])
    topic = state.topics[topic_id]
    partitions = tuple(PartitionState(p.replicas, p.isr[0], 1, p.isr, 1) for p in topic.partitions)
    set_partitions(state, topic_id, partitions)
    for b in (2, 3, 4):
        state.heartbeat(b, b, NOW)
    later = NOW + TIMEOUT / 2
    state.heartbeat(1, 1, later - TIMEOUT - 1)
    # Fenced, and ``elect`` not run yet: still in the ISRs.
    assert state.fence_expired(later) == [1]
    assert state.imbalanced_brokers(10) == {1}
    assert state.elect_preferred({1}, later) is None


def test_a_preferred_replica_whose_session_ended_is_skipped() -> None:
    state, topic_id = with_topic([(1, 2, 3)])
    back(state, topic_id, 1)
    later = NOW + TIMEOUT + 1  # no heartbeat since: not yet fenced, but not alive
    for b in (2, 3):
        state.heartbeat(b, b, later)
    assert state.elect_preferred({1}, later) is None


def test_a_shutting_down_preferred_replica_is_skipped() -> None:
    state, topic_id = with_topic([(1, 2, 3)])
    back(state, topic_id, 1)
    # Its ISR membership stays until ``elect`` runs; the mark alone keeps it from leading.
    assert state.begin_controlled_shutdown(1, state.brokers[1].broker_epoch)
    assert 1 in state.topics[topic_id].partitions[0].isr
    assert state.elect_preferred({1}, NOW) is None


def test_an_unregistered_preferred_replica_is_skipped() -> None:
    # Broker 5 is named in the replicas but has no registration (brokers 1..4 do).
    state, topic_id = with_topic([(5, 1, 2)], isr=[(1, 5, 2)])
    topic = state.topics[topic_id]
    p = topic.partitions[0]
    moved = (PartitionState(p.replicas, 1, 1, p.isr, 1),)
    set_partitions(state, topic_id, moved)
    assert state.imbalanced_brokers(10) == {5}
    assert state.elect_preferred({5}, NOW) is None


def test_a_broker_not_heard_from_since_the_takeover_is_skipped() -> None:
    # A new controller presumes every registration alive for one session; one that has
    # not heartbeated to it yet may be dead, so it is handed nothing.
    state, topic_id = with_topic([(1, 2, 3)], isr=[(2, 1, 3)])
    topic = state.topics[topic_id]
    p = topic.partitions[0]
    moved = (PartitionState(p.replicas, 2, 1, p.isr, 1),)
    set_partitions(state, topic_id, moved)
    assert state.alive(1, 1.0) and not state.can_take_leadership(1, 1.0)
    assert state.elect_preferred({1}, 1.0) is None
    state.heartbeat(1, 1, 1.0)
    assert state.can_take_leadership(1, 1.0)
    change = state.elect_preferred({1}, 1.0)
    assert change is not None and change.preferred_elections == 1


def test_only_the_given_brokers_get_their_partitions_back() -> None:
    state, topic_id = with_topic([(1, 2, 3), (2, 1, 3)])
    partitions = (
        PartitionState((1, 2, 3), 2, 1, (1, 2, 3), 1),
        PartitionState((2, 1, 3), 1, 1, (1, 2, 3), 1),
    )
    set_partitions(state, topic_id, partitions)
    for b in (1, 2, 3):
        state.heartbeat(b, b, NOW)
    change = state.elect_preferred({2}, NOW)
    assert change is not None and change.delta == Delta({topic_id: frozenset({1})})


def test_preferred_elections_are_counted_as_clean_elections_too() -> None:
    state, topic_id = with_topic([(1, 2, 3), (1, 3, 2)])
    back(state, topic_id, 1)
    metrics = ControllerMetrics()
    change = state.elect_preferred({1}, NOW)
    assert change is not None
    metrics.committed(change)
    sample = metrics.registry.get_sample_value
    assert sample("directlog_controller_preferred_leader_elections_total") == 2
    assert sample("directlog_controller_leader_elections_total", {"kind": "clean"}) == 2
    assert sample("directlog_controller_leader_elections_total", {"kind": "unclean"}) == 0


# Settings -------------------------------------------------------------------------------


def test_settings_default_to_kafkas() -> None:
    settings = ControllerSettings.load()
    assert settings.auto_leader_rebalance is True
    assert settings.leader_imbalance_check_interval_ms == 300_000
    assert settings.leader_imbalance_per_broker_percentage == 10
    assert LeaderBalance.from_settings(settings) == LeaderBalance(300.0, 10)


def test_the_setting_disables_it() -> None:
    settings = ControllerSettings.load(auto_leader_rebalance=False)
    assert LeaderBalance.from_settings(settings) is None


@pytest.mark.parametrize(
    "bad",
    [
        {"leader_imbalance_per_broker_percentage": -1},
        {"leader_imbalance_per_broker_percentage": 101},
        {"leader_imbalance_check_interval_ms": 0},
    ],
)
def test_bad_settings_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        ControllerSettings.load(None, **bad)


# The term -------------------------------------------------------------------------------


class RecordingStore:
    """Commits everything, remembering the ops and the epoch version they were fenced by."""

    def __init__(self) -> None:
        self.commits: list[tuple[tuple[StoreOp, ...], int]] = []

    async def commit(self, ops: tuple[StoreOp, ...], epoch_version: int) -> None:
        self.commits.append((ops, epoch_version))


EPOCH_VERSION = 4


def start_term(
    state: ClusterState, store: RecordingStore, balance: LeaderBalance | None
) -> tuple[Term, list[str]]:
    failures: list[str] = []
    term = Term(
        Won(ControllerRecord(1, "127.0.0.1:9190", 5), EPOCH_VERSION),
        state,
        cast(Store, store),
        ControllerMetrics(),
        clock=lambda: NOW,
        queue_limit=100,
        on_failure=failures.append,
        leader_balance=balance,
    )
    return term, failures


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_the_term_checks_every_interval_and_commits_under_its_epoch() -> None:
    async def run() -> None:
        state, topic_id = with_topic([(1, 2, 3), (2, 3, 1), (1, 3, 2)])
        back(state, topic_id, 1)
        store = RecordingStore()
        term, failures = start_term(state, store, LeaderBalance(0.01, 10))
        try:
            await wait_until(lambda: leaders(state, topic_id) == [1, 2, 1], "rebalance")
            assert store.commits and all(v == EPOCH_VERSION for _, v in store.commits)
            sample = term._metrics.registry.get_sample_value
            assert sample("directlog_controller_preferred_leader_elections_total") == 2
            # Imbalanced again (as if broker 1 had gone and come back once more): the next
            # check moves it back without anything kicking the term.
            set_partitions(
                state,
                topic_id,
                tuple(
                    replace(p, leader=3, leader_epoch=p.leader_epoch + 1) if p.leader == 1 else p
                    for p in state.topics[topic_id].partitions
                ),
            )
            await wait_until(lambda: leaders(state, topic_id) == [1, 2, 1], "second rebalance")
            assert sample("directlog_controller_preferred_leader_elections_total") == 4
            assert not failures
        finally:
            term.end()
        await asyncio.wait(term._tasks, timeout=5)
        assert all(task.done() for task in term._tasks)  # ending the term stopped it

    asyncio.run(run())


def test_a_disabled_balance_never_moves_leaders() -> None:
    async def run() -> None:
        state, topic_id = with_topic([(1, 2, 3), (1, 3, 2)])
        back(state, topic_id, 1)
        store = RecordingStore()
        term, failures = start_term(state, store, None)
        try:
            assert len(term._tasks) == 1  # the reconciler alone
            term.kick()
            await asyncio.sleep(0.2)
            assert store.commits == [] and leaders(state, topic_id) == [2, 3]
        finally:
            term.end()
        assert not failures

    asyncio.run(run())


def test_an_ended_term_stops_checking() -> None:
    async def run() -> None:
        state, topic_id = with_topic([(1, 2, 3)])
        back(state, topic_id, 1)
        store = RecordingStore()
        term, _ = start_term(state, store, LeaderBalance(0.01, 10))
        term.end()
        await asyncio.wait(term._tasks, timeout=5)
        assert all(task.done() for task in term._tasks)
        await asyncio.sleep(0.1)
        assert store.commits == [] and leaders(state, topic_id) == [2]

    asyncio.run(run())
