"""The controller's decisions without a store: registration, liveness and fencing, leader
election, AlterPartition validation, topic admin, and the store ops and deltas they make.

Changes are applied the way the controller applies them after a commit
(``ClusterState.apply``); time is a plain number.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.topics import NO_LEADER
from services.controller import layout
from services.controller.cluster import ClusterState, Delta, Image, IsrChange
from services.controller.layout import Create, Delete, SetData
from services.controller.model import Listener, PartitionState
from tests.controller.clusters import (
    LISTENERS,
    PATHS,
    TIMEOUT,
    commit,
    empty_state,
    fence,
    partition,
    register,
    with_topic,
)


def code(error: pytest.ExceptionInfo[KafkaError]) -> ErrorCode:
    return ErrorCode(error.value.code)


# Registration and liveness --------------------------------------------------------------


def test_broker_epochs_grow_across_every_registration() -> None:
    state = empty_state()
    epochs = [register(state, 1), register(state, 2), register(state, 1)]
    assert epochs == [1, 2, 3]
    change = state.register_broker(3, "x", LISTENERS, "rack-a", 0.0)
    assert change.ops == (
        SetData("/directlog/broker_epoch", b'{"last":4}'),
        Create("/directlog/brokers/3", layout.encode_broker(change.brokers[0])),
    )
    commit(state, change)
    assert state.brokers[3].rack == "rack-a"
    again = state.register_broker(3, "x", LISTENERS, None, 0.0)
    assert isinstance(again.ops[1], SetData)  # the znode exists now


def test_another_incarnation_waits_for_the_old_session_to_end() -> None:
    state = empty_state()
    register(state, 1, now=0.0)
    with pytest.raises(KafkaError) as refused:
        state.register_broker(1, "restarted", LISTENERS, None, TIMEOUT / 2)
    assert code(refused) is ErrorCode.DUPLICATE_BROKER_REGISTRATION
    # The same incarnation (a controller failover) is welcome at any time.
    state.register_broker(1, "incarnation-1", LISTENERS, None, TIMEOUT / 2)
    # Once the old session has expired, the new incarnation takes the id.
    change = state.register_broker(1, "restarted", LISTENERS, None, TIMEOUT + 1)
    commit(state, change, TIMEOUT + 1)
    assert state.brokers[1].incarnation_id == "restarted"


@pytest.mark.parametrize(
    ("broker_id", "incarnation", "listeners"),
    [
        (-1, "x", LISTENERS),
        (1, "", LISTENERS),
        (1, "x", ()),
        (1, "x", (Listener("PLAINTEXT", "h", 0),)),
    ],
)
def test_bad_registrations(broker_id: int, incarnation: str, listeners: tuple[Listener]) -> None:
    with pytest.raises(KafkaError) as refused:
        empty_state().register_broker(broker_id, incarnation, listeners, None, 0.0)
    assert code(refused) is ErrorCode.INVALID_REQUEST


def test_heartbeat_answers() -> None:
    state = empty_state()
    epoch = register(state, 1)
    assert state.heartbeat(1, epoch, 1.0) is ErrorCode.NONE
    assert state.heartbeat(1, epoch - 1, 1.0) is ErrorCode.STALE_BROKER_EPOCH
    assert state.heartbeat(2, epoch, 1.0) is ErrorCode.BROKER_ID_NOT_REGISTERED
    assert state.fence_expired(1.0 + TIMEOUT + 1) == [1]
    # Fenced: its session is over, it must register again.
    assert state.heartbeat(1, epoch, 30.0) is ErrorCode.STALE_BROKER_EPOCH
    register(state, 1, now=30.0)
    assert not state.fenced


def test_heartbeats_keep_a_broker_unfenced() -> None:
    state = empty_state()
    epoch = register(state, 1)
    for now in range(1, 60, 5):
        assert state.heartbeat(1, epoch, float(now)) is ErrorCode.NONE
        assert state.fence_expired(float(now)) == []
    assert state.next_expiry() == 56.0 + TIMEOUT


def test_a_new_controller_gives_every_registration_one_session() -> None:
    state, _ = with_topic([(1, 2)], brokers=2)  # loaded at time 0
    assert state.fence_expired(TIMEOUT) == []
    assert state.fence_expired(TIMEOUT + 0.1) == [1, 2]


# Fencing and leader election ------------------------------------------------------------


def test_fenced_leader_gives_way_to_the_first_isr_replica_in_replica_order() -> None:
    state, topic_id = with_topic([(1, 2, 3)], isr=[(1, 3, 2)])
    (change,) = fence(state, 1)
    new = PartitionState((1, 2, 3), 2, 1, (3, 2), 1)
    assert partition(state, topic_id) == new
    assert change.leader_elections == 1 and change.unclean_elections == 0
    assert change.isr_changes == 1
    assert change.delta == Delta({topic_id: frozenset({0})})
    # First change of the partition: its state znode is created.
    assert change.ops == (Create(PATHS.partition(topic_id, 0), layout.encode_partition(new)),)


def test_fenced_follower_only_leaves_the_isr() -> None:
    state, topic_id = with_topic([(1, 2, 3)])
    fence(state, 3)
    assert partition(state, topic_id) == PartitionState((1, 2, 3), 1, 0, (1, 2), 1)


def test_the_last_isr_member_stays_and_leads_again_when_it_returns() -> None:
    state, topic_id = with_topic([(1, 2)], brokers=2, isr=[(1,)])
    fence(state, 1)
    assert partition(state, topic_id) == PartitionState((1, 2), NO_LEADER, 1, (1,), 1)
    assert state.offline_count == 1
    assert state.elect() is None  # broker 2 is alive but out of sync: no clean leader
    register(state, 1, now=200.0)
    (change,) = [commit(state, c, 200.0) for c in iter(state.elect, None)]
    back = PartitionState((1, 2), 1, 2, (1,), 2)
    assert partition(state, topic_id) == back
    assert state.offline_count == 0
    # The second change of the partition: a setData at the znode's version.
    data = layout.encode_partition(back)
    assert change.ops == (SetData(PATHS.partition(topic_id, 0), data, version=0),)


def test_when_the_whole_isr_goes_at_once_the_leader_is_kept_in_it() -> None:
    state, topic_id = with_topic([(1, 2, 3)], isr=[(2, 1)])
    fence(state, 1, 2)
    assert partition(state, topic_id) == PartitionState((1, 2, 3), NO_LEADER, 1, (1,), 1)


def test_unclean_election_takes_the_first_live_replica() -> None:
    configs = {"unclean.leader.election.enable": "true"}
    state, topic_id = with_topic([(1, 2, 3)], configs=configs, isr=[(1,)])
    (change,) = fence(state, 1)
    assert partition(state, topic_id) == PartitionState((1, 2, 3), 2, 1, (2,), 1)
    assert change.unclean_elections == 1


def test_enabling_unclean_election_later_elects_an_offline_partition() -> None:
    state, topic_id = with_topic([(1, 2)], brokers=2, isr=[(1,)])
    fence(state, 1)
    commit(state, state.alter_configs("t", {"unclean.leader.election.enable": "true"}, []))
    change = state.elect()
    assert change is not None
    commit(state, change)
    assert partition(state, topic_id).leader == 2


def test_election_comes_in_bounded_chunks_until_a_fixed_point() -> None:
    state, topic_id = with_topic([(1, 2)] * 7, brokers=2)
    state.heartbeat(2, 2, 100.0)
    state.fence_expired(100.5)
    sizes = []
    while (change := state.elect(limit=3)) is not None:
        sizes.append(len(change.ops))
        commit(state, change)
    assert sizes == [3, 3, 1]
    assert all(p.leader == 2 and p.isr == (2,) for p in state.topics[topic_id].partitions)


# AlterPartition -------------------------------------------------------------------------


def isr_change(
    topic_id: bytes, new_isr: tuple[int, ...], leader_epoch: int = 0, partition_epoch: int = 0
) -> IsrChange:
    return IsrChange(topic_id, 0, leader_epoch, partition_epoch, new_isr)


def test_alter_partition_shrinks_and_expands_the_isr() -> None:
    state, topic_id = with_topic([(1, 2, 3)])
    (result,), change = state.alter_partition(1, 1, [isr_change(topic_id, (1, 2))])
    assert result.error is ErrorCode.NONE
    assert result.state == PartitionState((1, 2, 3), 1, 0, (1, 2), 1)
    commit(state, change)
    (result,), change = state.alter_partition(1, 1, [isr_change(topic_id, (1, 2, 3), 0, 1)])
    expanded = PartitionState((1, 2, 3), 1, 0, (1, 2, 3), 2)
    assert result.state == expanded
    data = layout.encode_partition(expanded)
    assert change.ops == (SetData(PATHS.partition(topic_id, 0), data, version=0),)


def test_alter_partition_with_the_same_isr_writes_nothing() -> None:
    state, topic_id = with_topic([(1, 2, 3)])
    (result,), change = state.alter_partition(1, 1, [isr_change(topic_id, (1, 2, 3))])
    assert result.error is ErrorCode.NONE and result.state == partition(state, topic_id)
    assert change.ops == ()


@pytest.mark.parametrize(
    ("broker", "leader_epoch", "partition_epoch", "new_isr", "error"),
    [
        (2, 0, 0, (1, 2), ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (1, 1, 0, (1, 2), ErrorCode.FENCED_LEADER_EPOCH),
        (1, 0, 3, (1, 2), ErrorCode.INVALID_UPDATE_VERSION),
        (1, 0, 0, (2, 3), ErrorCode.INELIGIBLE_REPLICA),  # without the leader
        (1, 0, 0, (1, 4), ErrorCode.INELIGIBLE_REPLICA),  # not a replica
        (1, 0, 0, (1, 3), ErrorCode.INELIGIBLE_REPLICA),  # fenced
        (1, 0, 0, (1, 1), ErrorCode.INVALID_REQUEST),
    ],
)
def test_alter_partition_refusals(
    broker: int, leader_epoch: int, partition_epoch: int, new_isr: tuple[int, ...], error: int
) -> None:
    state, topic_id = with_topic([(1, 2, 3)], brokers=4)
    state.fenced.add(3)  # fenced without an election, to test the ISR check alone
    before = partition(state, topic_id)
    request = isr_change(topic_id, new_isr, leader_epoch, partition_epoch)
    (result,), change = state.alter_partition(broker, broker, [request])
    assert result.error == error
    assert result.state == before  # the state in force comes back
    assert change.ops == ()


def test_alter_partition_unknown_topic_or_partition() -> None:
    state, topic_id = with_topic([(1, 2)])
    changes = [
        IsrChange(b"\x01" * 16, 0, 0, 0, (1,)),
        IsrChange(topic_id, 5, 0, 0, (1,)),
    ]
    results, _ = state.alter_partition(1, 1, changes)
    assert [(r.error, r.state) for r in results] == [
        (ErrorCode.UNKNOWN_TOPIC_ID, None),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None),
    ]


def test_alter_partition_from_a_stale_or_fenced_broker_is_refused_whole() -> None:
    state, topic_id = with_topic([(1, 2)])
    for broker, epoch in [(1, 99), (9, 9)]:
        with pytest.raises(KafkaError) as refused:
            state.alter_partition(broker, epoch, [isr_change(topic_id, (1,))])
        assert code(refused) is ErrorCode.STALE_BROKER_EPOCH
    state.fenced.add(1)
    with pytest.raises(KafkaError):
        state.alter_partition(1, 1, [isr_change(topic_id, (1,))])


def test_two_changes_of_one_partition_in_a_request_see_each_other() -> None:
    state, topic_id = with_topic([(1, 2, 3)])
    results, change = state.alter_partition(
        1, 1, [isr_change(topic_id, (1, 2)), isr_change(topic_id, (1,))]
    )
    assert [r.error for r in results] == [ErrorCode.NONE, ErrorCode.INVALID_UPDATE_VERSION]
    assert len(change.ops) == 1


# Topics ---------------------------------------------------------------------------------


def test_create_topic_plans_one_znode_and_initial_states() -> None:
    state = empty_state()
    for broker, rack in [(1, "a"), (2, "a"), (3, "b"), (4, "b")]:
        register(state, broker, rack)
    change = state.create_topic("orders", 8, 2, {"retention.ms": "1000"})
    (topic,) = change.topics
    replicas = [p.replicas for p in topic.partitions]
    data = layout.encode_topic("orders", {"retention.ms": "1000"}, replicas)
    assert change.ops == (Create(PATHS.topic(topic.topic_id), data),)
    assert change.delta == Delta({topic.topic_id: None})
    assert len(topic.topic_id) == 16 and topic.configs == {"retention.ms": "1000"}
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    for p in topic.partitions:
        assert p.leader == p.replicas[0] and p.isr == p.replicas
        assert p.leader_epoch == p.partition_epoch == 0
        assert {racks[b] for b in p.replicas} == {"a", "b"}
    assert sorted(p.leader for p in topic.partitions) == [1, 1, 2, 2, 3, 3, 4, 4]
    commit(state, change)
    assert state.find_topic("orders") == topic and state.partition_count == 8


def test_create_topic_defaults() -> None:
    state = ClusterState(
        Image("c", {}, {}, 0, 0),
        PATHS,
        now=0.0,
        session_timeout=TIMEOUT,
        default_partitions=3,
        default_replication_factor=2,
    )
    register(state, 1)
    register(state, 2)
    (topic,) = state.create_topic("t", -1, -1, {}).topics
    assert len(topic.partitions) == 3 and topic.replication_factor == 2


@pytest.mark.parametrize(
    ("name", "partitions", "replication_factor", "configs", "error"),
    [
        ("bad name", 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("", 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("..", 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("x" * 250, 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("taken", 1, 1, {}, ErrorCode.TOPIC_ALREADY_EXISTS),
        ("t", 0, 1, {}, ErrorCode.INVALID_PARTITIONS),
        ("t", 10_001, 1, {}, ErrorCode.INVALID_PARTITIONS),
        ("t", 1, 3, {}, ErrorCode.INVALID_REPLICATION_FACTOR),
        ("t", 1, 0, {}, ErrorCode.INVALID_REPLICATION_FACTOR),
        ("t", 1, 1, {"retention.ms": "soon"}, ErrorCode.INVALID_CONFIG),
        ("t", 1, 1, {"no.such.config": "1"}, ErrorCode.INVALID_CONFIG),
    ],
)
def test_create_topic_refusals(
    name: str, partitions: int, replication_factor: int, configs: dict[str, str], error: int
) -> None:
    state = empty_state()
    register(state, 1)
    register(state, 2)
    commit(state, state.create_topic("taken", 1, 1, {}))
    with pytest.raises(KafkaError) as refused:
        state.create_topic(name, partitions, replication_factor, configs)
    assert refused.value.code == error


def test_fenced_brokers_get_no_new_replicas() -> None:
    state = empty_state()
    for broker in (1, 2, 3):
        register(state, broker)
    state.heartbeat(1, 1, 100.0)
    state.heartbeat(2, 2, 100.0)
    state.fence_expired(100.5)
    with pytest.raises(KafkaError):
        state.create_topic("t", 1, 3, {})
    (topic,) = state.create_topic("t", 6, 2, {}).topics
    assert all(3 not in p.replicas for p in topic.partitions)


def test_delete_topic_removes_its_changed_partition_znodes_then_itself() -> None:
    state, topic_id = with_topic([(1, 2), (2, 1), (1, 2)], brokers=2)
    fence(state, 2)  # partitions 0, 1 and 2 change
    register(state, 2, now=101.0)
    (result,), change = state.alter_partition(1, 1, [isr_change(topic_id, (1, 2), 0, 1)])
    assert result.error is ErrorCode.NONE
    commit(state, change)
    change = state.delete_topic(name="t")
    assert change.ops == (
        Delete(PATHS.partition(topic_id, 0), version=1),
        Delete(PATHS.partition(topic_id, 1), version=0),
        Delete(PATHS.partition(topic_id, 2), version=0),
        Delete(PATHS.topic(topic_id)),
    )
    assert change.delta == Delta(deleted_topic_ids=(topic_id,))
    commit(state, change)
    assert state.topics == {} and state.partition_count == 0 and state.offline_count == 0
    with pytest.raises(KafkaError) as unknown:
        state.delete_topic(name="t")
    assert code(unknown) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(KafkaError) as unknown:
        state.delete_topic(topic_id=topic_id)
    assert code(unknown) is ErrorCode.UNKNOWN_TOPIC_ID


def test_create_partitions_appends_to_the_topic() -> None:
    state, topic_id = with_topic([(1, 2), (2, 3)], brokers=3)
    change = state.create_partitions("t", 5)
    assert change.delta == Delta({topic_id: frozenset({2, 3, 4})})
    commit(state, change)
    topic = state.topics[topic_id]
    data = layout.encode_topic("t", {}, [p.replicas for p in topic.partitions])
    assert change.ops == (SetData(PATHS.topic(topic_id), data),)
    assert topic.partitions[:2] == (
        PartitionState.initial((1, 2)),
        PartitionState.initial((2, 3)),
    )
    assert all(len(p.replicas) == 2 for p in topic.partitions)
    for count, error in [(5, ErrorCode.INVALID_PARTITIONS), (10_001, ErrorCode.INVALID_PARTITIONS)]:
        with pytest.raises(KafkaError) as refused:
            state.create_partitions("t", count)
        assert code(refused) is error
    with pytest.raises(KafkaError) as unknown:
        state.create_partitions("nope", 9)
    assert code(unknown) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_alter_configs_sets_and_deletes_overrides() -> None:
    state, topic_id = with_topic([(1,)], configs={"retention.ms": "5", "segment.ms": "9"})
    change = state.alter_configs("t", {"min.insync.replicas": "2"}, ["segment.ms", "flush.ms"])
    assert change.delta == Delta({topic_id: frozenset()})
    commit(state, change)
    assert state.topics[topic_id].configs == {"retention.ms": "5", "min.insync.replicas": "2"}
    assert state.alter_configs("t", {"retention.ms": "5"}, []).ops == ()
    for set_configs, delete in [({"min.insync.replicas": "0"}, []), ({"a": "1"}, ["a"])]:
        with pytest.raises(KafkaError):
            state.alter_configs("t", set_configs, delete)


def test_alter_configs_replacing_leaves_only_the_named_overrides() -> None:
    state, topic_id = with_topic([(1,)], configs={"retention.ms": "5", "segment.ms": "9"})
    commit(state, state.alter_configs("t", {"flush.ms": "7"}, [], replace_all=True))
    assert state.topics[topic_id].configs == {"flush.ms": "7"}
    commit(state, state.alter_configs("t", {}, [], replace_all=True))
    assert state.topics[topic_id].configs == {}
    for set_configs, delete in [({"retention.ms": "x"}, []), ({}, ["flush.ms"])]:
        with pytest.raises(KafkaError) as refused:
            state.alter_configs("t", set_configs, delete, replace_all=True)
        assert refused.value.code in (ErrorCode.INVALID_CONFIG, ErrorCode.INVALID_REQUEST)
    assert state.topics[topic_id].configs == {}


# Reassignments (KIP-455) and ElectLeaders (KIP-460) ---------------------------------------


def test_a_reassignment_adds_first_and_removes_once_the_target_is_in_sync() -> None:
    state, topic_id = with_topic([(1, 2)])
    (result,), change = state.reassign([("t", 0, (3, 2))])
    assert result.error is ErrorCode.NONE
    commit(state, change)
    moving = state.topics[topic_id].partitions[0]
    assert (moving.replicas, moving.adding, moving.removing) == ((3, 2, 1), (3,), (1,))
    assert (moving.leader, moving.isr) == (1, (1, 2))  # the old leader leads until the end
    assert state.complete_reassignments() is None  # 3 has not caught up
    _, change = state.alter_partition(1, 1, [isr_change(topic_id, (1, 2, 3), 0, 1)])
    commit(state, change)
    done = state.complete_reassignments()
    assert done is not None
    commit(state, done)
    assert state.topics[topic_id].partitions[0] == PartitionState((3, 2), 3, 1, (2, 3), 3)
    assert state.complete_reassignments() is None


def test_a_target_already_in_sync_finishes_at_once_and_a_cancel_goes_back() -> None:
    state, topic_id = with_topic([(1, 2, 3)])
    _, change = state.reassign([("t", 0, (2, 1))])  # a replica fewer: 2 and 1 are in sync
    commit(state, change)
    assert state.topics[topic_id].partitions[0] == PartitionState((2, 1), 1, 0, (1, 2), 1)

    _, change = state.reassign([("t", 0, (2, 4))])
    commit(state, change)
    assert state.topics[topic_id].partitions[0].adding == (4,)
    (result,), change = state.reassign([("t", 0, None)])
    assert result.error is ErrorCode.NONE
    commit(state, change)
    back = state.topics[topic_id].partitions[0]
    assert (back.replicas, back.isr, back.adding, back.removing) == ((2, 1), (1, 2), (), ())


def test_bad_reassignments_are_refused_and_write_nothing() -> None:
    state, _ = with_topic([(1, 2)])
    results, change = state.reassign(
        [
            ("t", 0, (1, 9)),
            ("t", 0, (1, 1)),
            ("t", 0, ()),
            ("t", 3, (1, 2)),
            ("nope", 0, (1, 2)),
            ("t", 0, None),
        ]
    )
    assert [r.error for r in results] == [
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
    ]
    assert "not registered: [9]" in (results[0].message or "")
    assert change.ops == ()


def test_elect_leaders_preferred_and_unclean() -> None:
    state, topic_id = with_topic([(1, 2), (2, 1)], isr=[(1, 2), (2,)])
    state.last_seen = dict.fromkeys(state.brokers, 1.0)  # heard from since the takeover
    state.topics[topic_id] = replace(
        state.topics[topic_id],
        partitions=(
            replace(state.topics[topic_id].partitions[0], leader=2),
            replace(state.topics[topic_id].partitions[1], leader=NO_LEADER, isr=()),
        ),
    )
    results, change = state.elect_leaders(0, [("t", 0), ("t", 1), ("x", 0)], now=1.0)
    assert [(r.partition, r.error) for r in results] == [
        (0, ErrorCode.NONE),
        (1, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE),
        (0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    commit(state, change)
    assert state.topics[topic_id].partitions[0].leader == 1
    results, change = state.elect_leaders(0, None, now=1.0)  # all: only changes reported
    assert results == [] and change.ops == ()
    results, change = state.elect_leaders(1, [("t", 0), ("t", 1)], now=1.0)
    assert [r.error for r in results] == [ErrorCode.ELECTION_NOT_NEEDED, ErrorCode.NONE]
    commit(state, change)
    unclean = state.topics[topic_id].partitions[1]
    assert (unclean.leader, unclean.isr) == (2, (2,))
    with pytest.raises(KafkaError):
        state.elect_leaders(5, None, now=1.0)
