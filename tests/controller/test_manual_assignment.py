"""Kafka's manual replica assignments (CreateTopics ``assignments``, CreatePartitions
``assignments``): honoured exactly, the first replica leading, or refused as Kafka 3.7's
ReplicationControlManager refuses them, with its error codes and words, nothing changed."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from services.controller import layout
from services.controller.cluster import ClusterState
from services.controller.layout import Create, SetData
from services.controller.model import PartitionState
from tests.controller.clusters import PATHS, commit, empty_state, register, with_topic


def brokers(*ids: int) -> ClusterState:
    state = empty_state()
    for broker in ids:
        register(state, broker)
    return state


def refusal(call: object, *args: object) -> tuple[ErrorCode, str]:
    assert callable(call)
    with pytest.raises(KafkaError) as refused:
        call(*args)
    return ErrorCode(refused.value.code), str(refused.value)


def test_create_topic_takes_the_replicas_as_given() -> None:
    state = brokers(0, 1, 2)
    manual = [(1, [0, 1, 2]), (0, [2, 0, 1]), (2, [1, 2, 0])]  # in any order
    change = state.create_topic("t", -1, -1, {"retention.ms": "5"}, manual)
    (topic,) = change.topics
    assert [p.replicas for p in topic.partitions] == [(2, 0, 1), (0, 1, 2), (1, 2, 0)]
    assert [(p.leader, p.isr) for p in topic.partitions] == [
        (2, (2, 0, 1)),
        (0, (0, 1, 2)),
        (1, (1, 2, 0)),
    ]
    data = layout.encode_topic("t", {"retention.ms": "5"}, [(2, 0, 1), (0, 1, 2), (1, 2, 0)])
    assert change.ops == (Create(PATHS.topic(topic.topic_id), data),)
    commit(state, change)
    assert state.topics[topic.topic_id].replication_factor == 3
    # One replica each is a replication factor of one, on brokers the placement never picks.
    (single,) = state.create_topic("one", -1, -1, {}, [(0, [2]), (1, [2])]).topics
    assert [p.replicas for p in single.partitions] == [(2,), (2,)]


@pytest.mark.parametrize(
    ("partitions", "replication_factor", "manual", "code", "message"),
    [
        (
            -1,
            3,
            [(0, [0, 1, 2])],
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but replication factor was not "
            "set to -1.",
        ),
        (
            1,
            -1,
            [(0, [0, 1, 2])],
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but numPartitions was not set to -1.",
        ),
        (
            -1,
            -1,
            [(0, [0, 1]), (0, [1, 2])],
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "Found multiple manual partition assignments for partition 0",
        ),
        (
            -1,
            -1,
            [(0, [])],
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes an empty replica list.",
        ),
        (
            -1,
            -1,
            [(0, [0, 7])],
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes broker 7, but no such broker is registered.",
        ),
        (
            -1,
            -1,
            [(0, [1, 0, 1])],
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes the broker 1 more than once.",
        ),
        (
            -1,
            -1,
            [(0, [0, 1]), (1, [0, 1, 2])],
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes a partition with 3 replica(s), but "
            "this is not consistent with previous partitions, which have 2 replica(s).",
        ),
        (
            -1,
            -1,
            [(0, [0]), (2, [1])],
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "partitions should be a consecutive 0-based integer sequence",
        ),
        (
            -1,
            -1,
            [(1, [0]), (2, [1])],
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "partitions should be a consecutive 0-based integer sequence",
        ),
    ],
)
def test_create_topic_refuses_bad_assignments(
    partitions: int,
    replication_factor: int,
    manual: list[tuple[int, Sequence[int]]],
    code: ErrorCode,
    message: str,
) -> None:
    state = brokers(0, 1, 2)
    got = refusal(state.create_topic, "t", partitions, replication_factor, {}, manual)
    assert got == (code, message)
    assert state.topics == {}


def test_create_topic_checks_the_configs_of_a_manual_assignment_too() -> None:
    state = brokers(0, 1)
    code, _ = refusal(state.create_topic, "t", -1, -1, {"retention.ms": "x"}, [(0, [0, 1])])
    assert code is ErrorCode.INVALID_CONFIG


def test_fenced_replicas_are_allowed_while_one_may_lead() -> None:
    """Kafka takes a fenced or shutting-down broker into a manual assignment, outside the
    ISR; a partition none of whose replicas could lead is refused."""
    state = brokers(0, 1, 2)
    for broker in (0, 1):
        state.heartbeat(broker, broker + 1, 100.0)
    assert state.fence_expired(100.5) == [2]
    assert state.begin_controlled_shutdown(1, 2)
    assert refusal(state.create_topic, "t", -1, -1, {}, [(0, [0, 1]), (1, [2, 1])]) == (
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        "All brokers specified in the manual partition assignment for partition 1 are "
        "fenced or in controlled shutdown.",
    )
    (topic,) = commit(state, state.create_topic("t", -1, -1, {}, [(0, [2, 1, 0])])).topics
    assert topic.partitions[0] == PartitionState.initial((2, 1, 0))
    # The controller then elects (Term.elect): the live replica leads, alone in sync.
    while (change := state.elect()) is not None:
        commit(state, change)
    state_now = state.topics[topic.topic_id].partitions[0]
    assert (state_now.replicas, state_now.leader, state_now.isr) == ((2, 1, 0), 0, (0,))


def test_create_partitions_takes_the_replicas_as_given() -> None:
    state, topic_id = with_topic([(1, 2, 3)], brokers=3)
    change = state.create_partitions("t", 3, [[3, 1, 2], [1, 2, 3]])
    commit(state, change)
    topic = state.topics[topic_id]
    assert [p.replicas for p in topic.partitions] == [(1, 2, 3), (3, 1, 2), (1, 2, 3)]
    assert [p.leader for p in topic.partitions] == [1, 3, 1]
    data = layout.encode_topic("t", {}, [(1, 2, 3), (3, 1, 2), (1, 2, 3)])
    assert change.ops == (SetData(PATHS.topic(topic_id), data),)
    # None: placed as before; an empty list given for no new partition is a wrong count.
    assert len(state.create_partitions("t", 4, None).topics[0].partitions) == 4


@pytest.mark.parametrize(
    ("count", "manual", "message"),
    [
        (
            3,
            [[3, 1, 2]],
            "Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified.",
        ),
        (
            2,
            [[3, 1, 2], [1, 2, 3]],
            "Attempted to add 1 additional partition(s), but only 2 assignment(s) were specified.",
        ),
        (
            2,
            [],
            "Attempted to add 1 additional partition(s), but only 0 assignment(s) were specified.",
        ),
        (
            2,
            [[3, 1]],
            "The manual partition assignment includes a partition with 2 replica(s), but "
            "this is not consistent with previous partitions, which have 3 replica(s).",
        ),
        (
            2,
            [[3, 1, 9]],
            "The manual partition assignment includes broker 9, but no such broker is registered.",
        ),
        (
            2,
            [[3, 3, 1]],
            "The manual partition assignment includes the broker 3 more than once.",
        ),
        (2, [[]], "The manual partition assignment includes an empty replica list."),
    ],
)
def test_create_partitions_refuses_bad_assignments(
    count: int, manual: list[list[int]], message: str
) -> None:
    state, topic_id = with_topic([(1, 2, 3)], brokers=3)
    got = refusal(state.create_partitions, "t", count, manual)
    assert got == (ErrorCode.INVALID_REPLICA_ASSIGNMENT, message)
    assert len(state.topics[topic_id].partitions) == 1


def test_create_partitions_still_refuses_what_is_no_increase_first() -> None:
    state, _ = with_topic([(1, 2, 3)], brokers=3)
    code, _ = refusal(state.create_partitions, "t", 1, [[1, 2, 3]])
    assert code is ErrorCode.INVALID_PARTITIONS
