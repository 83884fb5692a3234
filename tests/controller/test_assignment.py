"""Replica placement: Kafka's own expected assignments, then properties over random
clusters (leaders spread evenly, replicas spread over racks)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.controller.assignment import assign_replicas, rack_alternated


def test_rack_unaware_matches_kafka() -> None:
    # AdminZkClientTest.testReplicaAssignment: 5 brokers, 10 partitions, RF 3, start 0.
    brokers = dict.fromkeys(range(5))
    assert assign_replicas(brokers, 10, 3, start_index=0, replica_shift=0) == [
        (0, 1, 2),
        (1, 2, 3),
        (2, 3, 4),
        (3, 4, 0),
        (4, 0, 1),
        (0, 2, 3),
        (1, 3, 4),
        (2, 4, 0),
        (3, 0, 1),
        (4, 1, 2),
    ]


def test_rack_alternated_list_matches_kafka() -> None:
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assert rack_alternated(racks) == [0, 3, 1, 5, 4, 2]
    assert rack_alternated({b: r for b, r in racks.items() if b != 5}) == [0, 3, 1, 4, 2]


def test_rack_aware_matches_kafka() -> None:
    # AdminRackAwareTest.testGetRackAlternatedBrokerListAndAssignReplicasToBrokers.
    racks: dict[int, str | None] = {
        0: "rack1",
        1: "rack3",
        2: "rack3",
        3: "rack2",
        4: "rack2",
        5: "rack1",
    }
    assert assign_replicas(racks, 7, 3, start_index=0, replica_shift=0) == [
        (0, 3, 1),
        (3, 1, 5),
        (1, 5, 4),
        (5, 4, 2),
        (4, 2, 0),
        (2, 0, 3),
        (0, 4, 2),
    ]


def test_brokers_without_racks_disable_rack_awareness() -> None:
    mixed: dict[int, str | None] = {0: "a", 1: "a", 2: None, 3: "b"}
    assert assign_replicas(mixed, 4, 2, start_index=0, replica_shift=0) == assign_replicas(
        dict.fromkeys(mixed), 4, 2, start_index=0, replica_shift=0
    )


def test_replication_factor_above_broker_count_is_refused() -> None:
    with pytest.raises(ValueError):
        assign_replicas(dict.fromkeys(range(2)), 1, 3, start_index=0, replica_shift=0)


clusters = st.integers(1, 9).flatmap(
    lambda count: st.tuples(
        st.lists(st.sampled_from("abc"), min_size=count, max_size=count),
        st.integers(1, count),
        st.integers(1, 40),
        st.integers(0, 100),
        st.integers(0, 100),
    )
)


@given(clusters)
def test_placement_properties(cluster: tuple[list[str], int, int, int, int]) -> None:
    rack_list, replication_factor, partitions, start, shift = cluster
    racks: dict[int, str | None] = {10 + i: rack for i, rack in enumerate(rack_list)}
    assignment = assign_replicas(
        racks, partitions, replication_factor, start_index=start, replica_shift=shift
    )
    assert len(assignment) == partitions
    rack_count = len(set(rack_list))
    for replicas in assignment:
        assert len(replicas) == replication_factor
        assert len(set(replicas)) == replication_factor
        assert set(replicas) <= set(racks)
        # As many racks as the replication factor allows.
        assert len({racks[b] for b in replicas}) == min(replication_factor, rack_count)
    # Leaders round-robin over the brokers: no broker leads two more than another.
    leaders = Counter(replicas[0] for replicas in assignment)
    counts = [leaders.get(b, 0) for b in racks]
    assert max(counts) - min(counts) <= 1


@given(st.integers(1, 8), st.integers(1, 60), st.integers(0, 50))
def test_rack_unaware_spreads_every_replica(brokers: int, partitions: int, start: int) -> None:
    replication_factor = min(brokers, 3)
    assignment = assign_replicas(
        dict.fromkeys(range(brokers)),
        partitions,
        replication_factor,
        start_index=start,
        replica_shift=start,
    )
    load = Counter(b for replicas in assignment for b in replicas)
    counts = [load.get(b, 0) for b in range(brokers)]
    # Followers shift once per round of brokers: every replica count within the
    # replication factor of the others.
    assert max(counts) - min(counts) <= replication_factor
