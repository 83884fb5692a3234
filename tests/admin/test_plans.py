"""The admin CLI's pure planning: drain and balance plans, plan files and their checks."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from directlog.admin.plans import (
    Assignment,
    Broker,
    Partition,
    PlanError,
    balance_plan,
    check_plan,
    drain_plan,
    parse_plan,
    plan_document,
    plan_json,
    throttled_replicas,
)


def P(topic: str, partition: int) -> Partition:
    return Partition(topic, partition)


def brokers(*ids: int, racks: Mapping[int, str] | None = None) -> list[Broker]:
    return [Broker(i, (racks or {}).get(i)) for i in ids]


def applied(current: Assignment, plan: Assignment) -> Assignment:
    return {**current, **plan}


def loads(assignment: Mapping[Partition, Sequence[int]]) -> Counter[int]:
    return Counter(b for replicas in assignment.values() for b in replicas)


def leader_counts(assignment: Mapping[Partition, Sequence[int]]) -> Counter[int]:
    return Counter(r[0] for r in assignment.values() if r)


def assert_well_formed(current: Assignment, after: Assignment) -> None:
    assert after.keys() == current.keys()
    for partition, replicas in after.items():
        assert len(replicas) == len(current[partition]), partition  # replica count kept
        assert len(set(replicas)) == len(replicas), partition  # no duplicates


# Drain ----------------------------------------------------------------------------------


def test_drain_moves_every_replica_off_the_broker_onto_the_least_loaded():
    current = {
        P("a", 0): (0, 1),
        P("a", 1): (1, 2),
        P("a", 2): (2, 0),
        P("b", 0): (0, 2),
        P("b", 1): (1, 3),
    }
    plan = drain_plan(current, 0, brokers(0, 1, 2, 3))
    assert set(plan) == {P("a", 0), P("a", 2), P("b", 0)}  # only partitions on broker 0
    after = applied(current, plan)
    assert_well_formed(current, after)
    assert all(0 not in r for r in after.values())
    # Broker 3 held one replica, the others two: it is filled first.
    assert plan[P("a", 0)] == (3, 1)  # the new replica takes the drained one's place
    assert loads(after)[3] >= 2


def test_drain_keeps_the_rack_spread_over_a_less_loaded_broker():
    racks = {0: "a", 1: "a", 2: "b", 3: "b"}
    current = {P("t", 0): (0, 2), P("t", 1): (1, 2), P("t", 2): (1, 3), P("t", 3): (1, 2)}
    # Broker 3 is the least loaded, but it would put both replicas of t-0 in rack b.
    plan = drain_plan(current, 0, brokers(0, 1, 2, 3, racks=racks))
    assert plan == {P("t", 0): (1, 2)}


def test_drain_uses_another_rack_when_the_rack_has_no_broker_left():
    racks = {0: "a", 1: "b", 2: "c"}
    plan = drain_plan({P("t", 0): (0, 1)}, 0, brokers(0, 1, 2, racks=racks))
    assert plan == {P("t", 0): (2, 1)}


def test_drain_refused_when_a_partition_would_be_short_names_the_partitions():
    current = {P("wide", 0): (0, 1, 2), P("wide", 1): (1, 2, 0), P("narrow", 0): (0, 1)}
    with pytest.raises(PlanError) as raised:
        drain_plan(current, 0, brokers(0, 1, 2))
    message = str(raised.value)
    assert "wide-0" in message and "wide-1" in message
    assert "narrow-0" not in message  # it could move: only the short ones are named
    assert "2 other live broker" in message


def test_drain_of_a_dead_broker_moves_its_replicas_to_live_ones():
    current = {P("t", 0): (5, 1), P("t", 1): (1, 2)}
    plan = drain_plan(current, 5, brokers(1, 2))
    assert plan == {P("t", 0): (2, 1)}


def test_drain_of_a_broker_without_replicas_is_an_empty_plan():
    assert drain_plan({P("t", 0): (1, 2)}, 0, brokers(0, 1, 2)) == {}


# Balance --------------------------------------------------------------------------------


def test_balance_fills_a_broker_just_added():
    current = {P("t", p): ((p % 3), (p + 1) % 3) for p in range(6)}  # 4 replicas each
    plan = balance_plan(current, brokers(0, 1, 2, 3))
    after = applied(current, plan)
    assert_well_formed(current, after)
    assert sorted(loads(after).values()) == [3, 3, 3, 3]
    moved = sum(len(set(after[p]) - set(current[p])) for p in current)
    assert moved == 3  # exactly what broker 3 needs, nothing shuffled among the others
    counts = leader_counts(after)
    assert max(counts.values()) - min(counts[b] for b in range(4)) <= 1


def test_balance_moves_replicas_off_brokers_not_named():
    current = {P("t", 0): (0, 1), P("t", 1): (1, 2), P("t", 2): (2, 0)}
    plan = balance_plan(current, brokers(0, 1))
    after = applied(current, plan)
    assert_well_formed(current, after)
    assert all(set(r) == {0, 1} for r in after.values())


def test_balance_evens_out_preferred_leaders_by_reordering_only():
    current = {P("t", p): (0, 1, 2) for p in range(6)}
    plan = balance_plan(current, brokers(0, 1, 2))
    after = applied(current, plan)
    assert all(sorted(r) == [0, 1, 2] for r in after.values())  # no data moves
    assert sorted(leader_counts(after).values()) == [2, 2, 2]


def test_balance_refuses_more_replicas_than_brokers():
    with pytest.raises(PlanError, match="t-0"):
        balance_plan({P("t", 0): (0, 1, 2)}, brokers(0, 1))


def test_balance_does_not_narrow_the_rack_spread():
    racks = {0: "a", 1: "b", 2: "a", 3: "b"}
    # Broker 2 is empty, broker 0 full; moving 0's replica of t-p to 2 would put both
    # replicas of a partition (0->2, with 1 in rack b: fine) -- but never two in one rack.
    current = {P("t", p): (0, 1) for p in range(4)} | {P("u", 0): (0, 3)}
    after = applied(current, balance_plan(current, brokers(0, 1, 2, 3, racks=racks)))
    for replicas in after.values():
        assert len({racks[b] for b in replicas}) == 2


def test_an_empty_cluster_gets_an_empty_plan():
    assert balance_plan({}, brokers(0, 1)) == {}
    with pytest.raises(PlanError):
        balance_plan({P("t", 0): (0,)}, [])


# Properties -----------------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn, racks: bool = True) -> tuple[Assignment, list[Broker]]:
    count = draw(st.integers(1, 7))
    rack_names = draw(st.sampled_from([None, ["a", "b"], ["a", "b", "c"]])) if racks else None
    live = [
        Broker(i, draw(st.sampled_from(rack_names)) if rack_names else None) for i in range(count)
    ]
    ids = list(range(count))
    current: Assignment = {}
    for topic in draw(st.lists(st.sampled_from("xyz"), min_size=1, max_size=3, unique=True)):
        rf = draw(st.integers(1, min(3, count)))
        for number in range(draw(st.integers(1, 6))):
            current[P(topic, number)] = tuple(
                draw(st.permutations(ids))[:rf]  # type: ignore[arg-type]
            )
    return current, live


@given(clusters(), st.data())
def test_drain_plans_keep_counts_and_leave_the_broker_empty(cluster, data):
    current, live = cluster
    drained = data.draw(st.sampled_from([b.id for b in live]))
    others = len(live) - 1
    short = [p for p, r in current.items() if drained in r and len(r) > others]
    if short:
        with pytest.raises(PlanError) as raised:
            drain_plan(current, drained, live)
        assert all(str(p) in str(raised.value) for p in short)
        return
    plan = drain_plan(current, drained, live)
    after = applied(current, plan)
    assert_well_formed(current, after)
    assert all(drained not in r for r in after.values())
    live_ids = {b.id for b in live}
    assert all(set(r) <= live_ids for r in after.values())
    for partition, replicas in plan.items():
        before = current[partition]
        assert drained in before
        changed = [i for i, (a, b) in enumerate(zip(before, replicas, strict=True)) if a != b]
        assert changed == [before.index(drained)]  # one replica moves, in its place
    assert all(p in plan for p, r in current.items() if drained in r)


@given(clusters())
def test_balance_plans_keep_counts_and_stay_on_the_brokers(cluster):
    current, live = cluster
    plan = balance_plan(current, live)
    after = applied(current, plan)
    assert_well_formed(current, after)
    ids = {b.id for b in live}
    assert all(set(r) <= ids for r in after.values())
    assert all(plan[p] != current[p] for p in plan)  # only changes are listed


@given(clusters(racks=False))
def test_balance_plans_even_out_replicas_with_the_fewest_moves(cluster):
    current, live = cluster
    after = applied(current, balance_plan(current, live))
    before, now = loads(current), loads(after)
    ids = [b.id for b in live]
    assert max(now[b] for b in ids) - min(now[b] for b in ids) <= 1
    total = sum(before.values())
    ceiling, floor = -(-total // len(ids)), total // len(ids)
    fewest = max(
        sum(max(0, before[b] - ceiling) for b in ids),
        sum(max(0, floor - before[b]) for b in ids),
    )
    moved = sum(len(set(after[p]) - set(current[p])) for p in current)
    assert moved == fewest


@given(clusters())
def test_an_already_balanced_cluster_gets_an_empty_plan(cluster):
    current, live = cluster
    balanced = applied(current, balance_plan(current, live))
    assert balance_plan(balanced, live) == {}


@given(clusters(), st.integers(0, 8))
def test_a_drained_cluster_rebalanced_onto_the_others_moves_nothing_more(cluster, extra):
    """Draining then rebalancing onto the remaining brokers never moves a replica back."""
    current, live = cluster
    assume(len(live) > 1)
    drained = live[extra % len(live)].id
    assume(all(len(r) < len(live) for r in current.values()))
    after = applied(current, drain_plan(current, drained, live))
    rest = [b for b in live if b.id != drained]
    rebalanced = applied(after, balance_plan(after, rest))
    assert all(drained not in r for r in rebalanced.values())


# Plan files -----------------------------------------------------------------------------


def test_plan_files_round_trip_in_kafkas_format():
    plan = {P("b", 1): (2, 0), P("a", 0): (0, 1, 2)}
    document = json.loads(plan_json(plan))
    assert document == {
        "version": 1,
        "partitions": [
            {"topic": "a", "partition": 0, "replicas": [0, 1, 2]},
            {"topic": "b", "partition": 1, "replicas": [2, 0]},
        ],
    }
    assert parse_plan(plan_json(plan)) == plan
    assert plan_document({}) == {"version": 1, "partitions": []}
    # Kafka's tool also writes log_dirs; "any" is what it writes when none is chosen.
    with_dirs = json.dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": "a", "partition": 0, "replicas": [1, 2], "log_dirs": ["any"] * 2}
            ],
        }
    )
    assert parse_plan(with_dirs) == {P("a", 0): (1, 2)}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"version":1,"partitions":[', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"version":1}', 'must have a "partitions" list'),
        ('{"version":1,"partitions":[]}', "is empty"),
        ('{"version":2,"partitions":[{"topic":"a","partition":0,"replicas":[1]}]}', "version 2"),
        ('{"partitions":[{"topic":"a","partition":-1,"replicas":[1]}]}', "integer >= 0"),
        ('{"partitions":[{"topic":"a","partition":true,"replicas":[1]}]}', "integer >= 0"),
        ('{"partitions":[{"topic":"a","partition":"0","replicas":[1]}]}', "integer >= 0"),
        ('{"partitions":[{"topic":"","partition":0,"replicas":[1]}]}', "non-empty string"),
        ('{"partitions":[{"topic":"a","partition":0,"replicas":[]}]}', "replica list is empty"),
        ('{"partitions":[{"topic":"a","partition":0,"replicas":[1,2,1]}]}', "more than once"),
        ('{"partitions":[{"topic":"a","partition":0,"replicas":[-1]}]}', "broker ids >= 0"),
        ('{"partitions":[{"topic":"a","partition":0,"replicas":"1,2"}]}', "broker ids >= 0"),
        ('{"partitions":[{"topic":"a","partition":0}]}', "broker ids >= 0"),
        ('{"partitions":[3]}', "is not an object"),
        (
            '{"partitions":[{"topic":"a","partition":0,"replicas":[1]},'
            '{"topic":"a","partition":0,"replicas":[2]}]}',
            "a-0 is listed more than once",
        ),
        (
            '{"partitions":[{"topic":"a","partition":0,"replicas":[1],"log_dirs":["/data"]}]}',
            "log_dirs",
        ),
    ],
)
def test_malformed_plans_are_refused_with_the_reason(text, problem):
    with pytest.raises(PlanError) as raised:
        parse_plan(text, source="plan.json")
    assert problem in str(raised.value)


def test_every_problem_of_a_plan_is_reported_at_once():
    text = json.dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": "a", "partition": -1, "replicas": [1]},
                {"topic": "a", "partition": 1, "replicas": []},
                {"topic": "a", "partition": 2, "replicas": [3, 3]},
            ],
        }
    )
    with pytest.raises(PlanError) as raised:
        parse_plan(text)
    assert len(raised.value.problems) == 3


def test_plans_are_checked_against_the_cluster():
    counts = {"a": 2}
    check_plan({P("a", 1): (0, 1)}, counts, [0, 1, 2])  # fine
    with pytest.raises(PlanError) as raised:
        check_plan(
            {P("a", 2): (0,), P("nope", 0): (0,), P("a", 0): (0, 7), P("a", 1): (1, 1)},
            counts,
            [0, 1, 2],
        )
    problems = "\n".join(raised.value.problems)
    assert "a-2: topic 'a' has 2 partition(s)" in problems
    assert "no topic 'nope'" in problems
    assert "broker(s) [7] are not live" in problems
    assert "appears more than once" in problems


def test_throttled_replicas_as_kafka_reassign_partitions_sets_them():
    current = {P("a", 0): (1, 2), P("a", 1): (2, 3), P("b", 0): (1, 2)}
    plan = {P("a", 0): (1, 4), P("a", 1): (2, 3), P("b", 0): (3, 1)}
    assert throttled_replicas(current, plan) == {
        "a": ("0:1,0:2", "0:4"),  # a-1 does not move
        "b": ("0:1,0:2", "0:3"),
    }
