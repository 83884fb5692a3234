"""A group coordinator killed in the middle of a rebalance, on a three-broker cluster whose
`__consumer_offsets` has three replicas.

The group commits what it read, a new member joins, and while the group is still
rebalancing the broker that coordinates it is SIGKILLed. Another replica of the group's
`__consumer_offsets` partition takes over: the group must come back there with every
partition assigned, every offset committed before the kill must still be there, and
consumption must go on from exactly those offsets, nothing lost and nothing read twice.
"""

from __future__ import annotations

import struct
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient, NewTopic

from directlog.protocol.errors import ErrorCode
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.conftest import Clients
from tests.e2e.group_member import (
    TIMEOUT,
    InProcessGroup,
    Topic,
    check_read_once_in_order,
    first_offsets,
    group_name,
)
from tests.e2e.records import raw_request

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.admin import DescribeGroupsRequest
    from kafka.protocol.consumer import HeartbeatRequest, OffsetFetchRequest
    from kafka.protocol.metadata import FindCoordinatorRequest

OFFSETS_TOPIC = "__consumer_offsets"
PARTITIONS = 6
FAILOVER_S = 60  # the controller fences the dead broker, a replica loads the group


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(
        tmp_path,
        brokers=3,
        broker_settings={"group_initial_rebalance_delay_ms": 1000},
        # A restarted broker soon leads its preferred partitions again (Kafka: 300 s).
        controller_settings={"leader_imbalance_check_interval_ms": 500},
    ) as running:
        yield running


def coordinator(cluster: Cluster, group: str) -> int:
    """FindCoordinator, asked of a running broker; -1 while there is none."""
    answer = raw_request(
        cluster.bootstrap.split(",")[0], FindCoordinatorRequest(version=3, key=group)
    )
    return int(answer.node_id) if answer.error_code == ErrorCode.NONE else -1


def group_state(bootstrap: str, group: str) -> str:
    # DescribeGroups v2: the newest without authorized operations.
    (described,) = raw_request(bootstrap, DescribeGroupsRequest(version=2, groups=[group])).groups
    assert described.error_code == ErrorCode.NONE, described
    return str(described.group_state)


def fully_replicated(cluster: Cluster, topic: str, partitions: int) -> bool:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    found = admin.list_topics(topic, timeout=10).topics[topic].partitions
    return len(found) == partitions and all(
        p.leader >= 0 and len(p.replicas) == 3 and sorted(p.isrs) == sorted(p.replicas)
        for p in found.values()
    )


def create_replicated_topic(cluster: Cluster, clients: Clients, name: str) -> Topic:
    admin = clients.admin(cluster.bootstrap)
    new = NewTopic(name, PARTITIONS, replication_factor=3, config={"min.insync.replicas": "2"})
    admin.create_topics([new])[name].result(timeout=TIMEOUT)
    wait_for(lambda: fully_replicated(cluster, name, PARTITIONS), TIMEOUT, f"{name} in sync")
    return Topic(clients, cluster.bootstrap, name, PARTITIONS, create=False)


def stored_offsets(admin: AdminClient, group: str) -> dict[int, int]:
    """The group's committed offsets, by partition (OffsetFetch at its coordinator)."""
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
    return {tp.partition: tp.offset for tp in future.result(timeout=TIMEOUT).topic_partitions}


def offsets_partition(group: str, partitions: int = 10) -> int:
    """Kafka's placement of a group: abs(Java String.hashCode(group)) % partitions."""
    units = group.encode("utf-16-be")
    h = 0
    for (unit,) in struct.iter_unpack(">H", units):
        h = (31 * h + unit) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if h == -(1 << 31) else abs(h)) % partitions


@pytest.mark.timeout(120)
def test_coordinator_killed_mid_rebalance_keeps_offsets_and_the_group(
    cluster: Cluster, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    """a and b commit all they read; c joins, and while the group waits for a and b to
    rejoin, its coordinator is SIGKILLed. The group forms again on another broker with all
    three members, and reading resumes exactly at the commits made before the kill."""
    topic = create_replicated_topic(cluster, clients, topic_name("failover"))
    name = group_name("failover")
    group = InProcessGroup(clients, topic, name, {"topic.metadata.refresh.interval.ms": 1000})
    group.join("a")
    group.join("b")
    group.wait_split(FAILOVER_S)
    first = topic.produce(20)
    group.poll_until(lambda: group.read_count() >= len(first), TIMEOUT, "the first batch")
    group.keep_polling(0.5)
    committed = group.committed()
    assert committed == topic.ends()

    # Every replica of __consumer_offsets in sync, so the commits are on all three.
    wait_for(lambda: fully_replicated(cluster, OFFSETS_TOPIC, 10), TIMEOUT, "offsets in sync")
    victim = coordinator(cluster, name)
    assert victim in cluster.brokers
    # Brokers that do not coordinate the group say so.
    for node_id, broker in cluster.brokers.items():
        if node_id != victim:
            answer = raw_request(broker.bootstrap, OffsetFetchRequest(version=7, group_id=name))
            assert answer.error_code == ErrorCode.NOT_COORDINATOR, (node_id, answer)
            beat = HeartbeatRequest(
                version=4, group_id=name, generation_id=1, member_id="a", group_instance_id=None
            )
            assert raw_request(broker.bootstrap, beat).error_code == ErrorCode.NOT_COORDINATOR
    coordinator_address = cluster.brokers[victim].bootstrap

    # c joins; a and b are not polled, so they cannot rejoin and the rebalance stays open.
    c = group.join("c")
    deadline = time.monotonic() + TIMEOUT
    while group_state(coordinator_address, name) != "PreparingRebalance":
        assert time.monotonic() < deadline, "the group never began to rebalance"
        c.consumer.consume(10, 0.1)
    cluster.brokers[victim].kill()
    killed_at = time.monotonic()

    # The group comes back on another broker, all three members sharing the partitions.
    group.wait_split(FAILOVER_S)
    recovered_after = time.monotonic() - killed_at
    new_coordinator = coordinator(cluster, name)
    assert new_coordinator not in (victim, -1)
    assert group_state(cluster.brokers[new_coordinator].bootstrap, name) == "Stable"
    admin = clients.admin(cluster.bootstrap)
    assert stored_offsets(admin, name) == committed, "commits were lost"

    # Consumption resumes exactly at the committed offsets.
    reads_before = {n: len(m.reads) for n, m in group.members.items()}
    second = topic.produce(20)
    group.poll_until(
        lambda: group.read_count() >= len(first) + len(second), TIMEOUT, "the second batch"
    )
    group.keep_polling(1.0)
    check_read_once_in_order(group.reads(), first + second)
    later = [r for n, m in group.members.items() for r in m.reads[reads_before[n] :]]
    assert first_offsets(later) == committed
    assert group.committed() == topic.ends()
    print(f"coordinator {victim} -> {new_coordinator}; group back after {recovered_after:.1f} s")


@pytest.mark.timeout(120)
def test_coordinator_killed_while_stable_and_back_again_loses_no_commit(
    cluster: Cluster, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    """The coordinator of a Stable group dies: the members carry on without rejoining,
    committing to its successor. Restarted, it catches up, the controller hands it back its
    preferred partitions, and it coordinates the group again from its own copy of
    __consumer_offsets, which must hold the commits made while it was away."""
    topic = create_replicated_topic(cluster, clients, topic_name("stable"))
    name = group_name("stable")
    group = InProcessGroup(
        clients,
        topic,
        name,
        {"session.timeout.ms": 10000, "topic.metadata.refresh.interval.ms": 1000},
    )
    group.join("a")
    group.join("b")
    before = group.wait_split(FAILOVER_S)
    first = topic.produce(10)
    group.poll_until(lambda: group.read_count() >= len(first), TIMEOUT, "the first batch")
    wait_for(lambda: fully_replicated(cluster, OFFSETS_TOPIC, 10), TIMEOUT, "offsets in sync")
    victim = coordinator(cluster, name)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    index = offsets_partition(name)
    placement = admin.list_topics(OFFSETS_TOPIC, timeout=10).topics[OFFSETS_TOPIC]
    assert placement.partitions[index].replicas[0] == victim, "led by its preferred replica"
    seen = {n: len(m.callbacks) for n, m in group.members.items()}

    cluster.brokers[victim].kill()
    second = topic.produce(10)
    group.poll_until(
        lambda: group.read_count() >= len(first) + len(second), FAILOVER_S, "the second batch"
    )
    group.poll_until(lambda: group.committed() == topic.ends(), FAILOVER_S, "commits")
    successor = coordinator(cluster, name)
    assert successor not in (victim, -1)
    # Members of a Stable group need not rejoin when its coordinator moves.
    assert group.assignments() == before
    for member_name, member in group.members.items():
        assert member.callbacks[seen[member_name] :] == [], f"{member_name} was rebalanced"

    cluster.brokers[victim].start()
    group.poll_until(
        lambda: coordinator(cluster, name) == victim, FAILOVER_S, "the coordinator to return"
    )
    # Its own copy holds what was committed while it was away...
    assert stored_offsets(admin, name) == topic.ends()
    # ...and members that start afresh resume from there.
    group.close_all()
    again = InProcessGroup(clients, topic, name)
    again.join("a2")
    again.join("b2")
    again.wait_split(FAILOVER_S)
    third = topic.produce(10)
    again.poll_until(lambda: again.read_count() >= len(third), FAILOVER_S, "the third batch")
    again.keep_polling(0.5)
    later = [r for m in again.members.values() for r in m.reads]
    assert first_offsets(later) == dict.fromkeys(range(PARTITIONS), 20)
    check_read_once_in_order({**group.reads(), **again.reads()}, first + second + third)
    assert stored_offsets(admin, name) == topic.ends()
    again.close_all()
