"""Consumer lag without an exporter: the brokers of a three-broker cluster export the Kafka
Exporter's series (services/broker/kafka_exporter.py), and Prometheus, scraping every broker,
must see each series exactly once and with the exporter's values.

A topic gets a known number of records per partition and a group commits part of them; then
every broker's /metrics is scraped and parsed with Prometheus' own text parser. The group's
series come from its coordinator only, its lag is what was produced minus what it
committed, the topic's from each partition's leader. The coordinator is killed, and its
successor exports the group; restarted, it leads the group's `__consumer_offsets`
partition again and the broker that stood in stops exporting it. A deleted group and a
deleted topic leave no series behind, and a group id with a quote, a newline and non-ASCII
characters comes out as it went in.

Every check is an outcome awaited with a generous deadline (brokers learn of leadership
changes at their own pace); nothing asserts on durations.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from directlog.protocol.errors import ErrorCode
from tests.e2e.cluster import Cluster, eventually, wait_for
from tests.e2e.conftest import Clients
from tests.e2e.records import raw_request

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.metadata import FindCoordinatorRequest

OFFSETS_TOPIC = "__consumer_offsets"
PARTITIONS = 6
PRODUCED = {p: 10 + 3 * p for p in range(PARTITIONS)}  # records per partition
COMMITTED = {0: 4, 1: 0, 2: PRODUCED[2], 3: 7, 4: 1}  # partition 5: never committed
DEADLINE = 90.0  # seconds for the cluster to show an outcome (the machine may be loaded)
# The Kafka Exporter's series (brokers export other kafka_* names too, Strimzi's, per broker).
EXPORTER = frozenset(
    {
        "kafka_brokers",
        "kafka_broker_info",
        "kafka_topic_partitions",
        "kafka_topic_partition_current_offset",
        "kafka_topic_partition_oldest_offset",
        "kafka_topic_partition_leader",
        "kafka_topic_partition_replicas",
        "kafka_topic_partition_in_sync_replica",
        "kafka_topic_partition_leader_is_preferred",
        "kafka_topic_partition_under_replicated_partition",
        "kafka_consumergroup_current_offset",
        "kafka_consumergroup_current_offset_sum",
        "kafka_consumergroup_lag",
        "kafka_consumergroup_lag_sum",
        "kafka_consumergroup_members",
    }
)
Series = dict[tuple[str, frozenset[tuple[str, str]]], list[tuple[int, float]]]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(
        tmp_path,
        brokers=3,
        broker_settings={"group_initial_rebalance_delay_ms": 500},
        # A restarted broker soon leads its preferred partitions again (Kafka: 300 s).
        controller_settings={"leader_imbalance_check_interval_ms": 500},
    ) as running:
        yield running


# Scraping ------------------------------------------------------------------------------------


def scrape(cluster: Cluster) -> Series:
    """Every Kafka Exporter sample of every running broker:
    (name, labels) -> [(broker, value)]."""
    series: Series = {}
    for node_id, broker in cluster.brokers.items():
        if not broker.running:
            continue
        for family in broker.scrape():
            for sample in family.samples:
                if sample.name in EXPORTER:
                    key = (sample.name, frozenset(sample.labels.items()))
                    series.setdefault(key, []).append((node_id, sample.value))
    return series


def exported_once(series: Series) -> None:
    twice = {key: where for key, where in series.items() if len(where) > 1}
    assert not twice, f"series exported by more than one broker: {twice}"


def select(series: Series, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], int]:
    """The `name` samples whose labels include `labels`: labels -> value (each exported
    once: checked by `exported_once`)."""
    return {
        key: int(where[0][1])
        for (found, key), where in series.items()
        if found == name and all((k, v) in key for k, v in labels.items())
    }


def by_partition(series: Series, name: str, **labels: str) -> dict[int, int]:
    return {
        int(dict(key)["partition"]): value for key, value in select(series, name, **labels).items()
    }


def exporters(series: Series, prefix: str = "kafka_", **labels: str) -> set[int]:
    """The brokers exporting any series whose name starts with `prefix` and whose labels
    include `labels`."""
    return {
        broker
        for (name, key), where in series.items()
        if name.startswith(prefix) and all((k, v) in key for k, v in labels.items())
        for broker, _ in where
    }


# The cluster ---------------------------------------------------------------------------------


def coordinator(cluster: Cluster, group: str) -> int:
    """FindCoordinator, asked of a running broker; -1 while there is none."""
    bootstrap = cluster.bootstrap.split(",")[0]
    answer = raw_request(bootstrap, FindCoordinatorRequest(version=3, key=group))
    return int(answer.node_id) if answer.error_code == ErrorCode.NONE else -1


def leaders(cluster: Cluster, topic: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    found = admin.list_topics(topic, timeout=10).topics[topic].partitions
    return {p: int(info.leader) for p, info in found.items()}


def fully_replicated(cluster: Cluster, topic: str) -> bool:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    found = admin.list_topics(topic, timeout=10).topics[topic].partitions
    return bool(found) and all(
        p.leader >= 0 and len(p.replicas) == 3 and sorted(p.isrs) == sorted(p.replicas)
        for p in found.values()
    )


def create_topic(cluster: Cluster, clients: Clients, name: str, partitions: int) -> None:
    admin = clients.admin(cluster.bootstrap)
    admin.create_topics([NewTopic(name, partitions, replication_factor=3)])[name].result(30)
    wait_for(lambda: fully_replicated(cluster, name), DEADLINE, f"{name} in sync")


def produce(cluster: Cluster, clients: Clients, topic: str, counts: dict[int, int]) -> None:
    producer = clients.producer(cluster.bootstrap, {"acks": "all"})
    records = [
        {"partition": p, "key": f"{p}-{i}", "value": f"record {i} of partition {p}"}
        for p, count in counts.items()
        for i in range(count)
    ]
    reports = Clients.produce_all(producer, topic, records)
    assert [error for error, _ in reports if error is not None] == []


def commit_in_group(
    cluster: Cluster, clients: Clients, group: str, topic: str, offsets: dict[int, int]
) -> Consumer:
    """A subscribed member of `group` (it gets all partitions) that commits `offsets`;
    returned open, so the group has one member."""
    consumer = clients.consumer(
        cluster.bootstrap,
        {"group.id": group, "auto.offset.reset": "earliest", "max.poll.interval.ms": 600000},
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + DEADLINE
    while len(consumer.assignment()) < PARTITIONS:
        assert time.monotonic() < deadline, "the member never got every partition"
        consumer.poll(0.2)
    wanted = [CTopicPartition(topic, p, o) for p, o in offsets.items()]
    while True:
        try:
            consumer.commit(offsets=wanted, asynchronous=False)
            return consumer
        except KafkaException:
            assert time.monotonic() < deadline, "the commit never succeeded"
            consumer.poll(0.2)


def commit_as_admin(
    clients: Clients, bootstrap: str, group: str, offsets: dict[tuple[str, int], int]
) -> None:
    """Offsets committed for a group without members (as an admin tool resets them)."""
    admin = clients.admin(bootstrap)
    wanted = [CTopicPartition(t, p, o) for (t, p), o in offsets.items()]
    futures = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, wanted)])
    for tp in futures[group].result(timeout=30).topic_partitions:
        assert tp.error is None, tp


# What the group's series must say ------------------------------------------------------------


def check_group(
    series: Series, group: str, topic: str, committed: dict[int, int], produced: dict[int, int]
) -> None:
    """The exporter's values: every partition of a topic the group committed to, -1 where it
    did not; lag = high watermark - committed; lag_sum over committed partitions only,
    current_offset_sum over every current_offset (the -1s too)."""
    labels = {"consumergroup": group, "topic": topic}
    expected_offsets = {p: committed.get(p, -1) for p in produced}
    expected_lag = {p: produced[p] - o if o >= 0 else -1 for p, o in expected_offsets.items()}
    assert by_partition(series, "kafka_consumergroup_current_offset", **labels) == (
        expected_offsets
    )
    assert by_partition(series, "kafka_consumergroup_lag", **labels) == expected_lag
    (offset_sum,) = select(series, "kafka_consumergroup_current_offset_sum", **labels).values()
    assert offset_sum == sum(expected_offsets.values())
    (lag_sum,) = select(series, "kafka_consumergroup_lag_sum", **labels).values()
    assert lag_sum == sum(lag for p, lag in expected_lag.items() if p in committed)


def check_topic(
    cluster: Cluster, series: Series, topic: str, produced: dict[int, int], in_sync: int = 3
) -> None:
    """Offsets and replication of each partition (three replicas, `in_sync` of them in
    sync), from its leader."""
    assert by_partition(series, "kafka_topic_partition_current_offset", topic=topic) == produced
    assert by_partition(
        series, "kafka_topic_partition_oldest_offset", topic=topic
    ) == dict.fromkeys(produced, 0)
    for name, value in (
        ("kafka_topic_partition_replicas", 3),
        ("kafka_topic_partition_in_sync_replica", in_sync),
        ("kafka_topic_partition_under_replicated_partition", 1 if in_sync < 3 else 0),
    ):
        assert by_partition(series, name, topic=topic) == dict.fromkeys(produced, value), name
    led = leaders(cluster, topic)
    assert by_partition(series, "kafka_topic_partition_leader", topic=topic) == led
    for partition, leader in led.items():
        found = exporters(series, "kafka_topic_", topic=topic, partition=str(partition))
        assert found == {leader}, f"partition {partition} led by {leader}, exported by {found}"
    assert select(series, "kafka_topic_partitions", topic=topic) == {
        frozenset({("topic", topic)}): len(produced)
    }


# Tests ---------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_each_series_once_with_the_exporters_values_until_deleted(
    cluster: Cluster, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    topic, doomed = topic_name("lag"), topic_name("doomed")
    create_topic(cluster, clients, topic, PARTITIONS)
    create_topic(cluster, clients, doomed, 2)
    produce(cluster, clients, topic, PRODUCED)
    produce(cluster, clients, doomed, {0: 5, 1: 5})
    group = f"lag-{uuid.uuid4().hex[:8]}"
    member = commit_in_group(cluster, clients, group, topic, COMMITTED)
    odd = f'odd "quoted"\nsecond line, grüße ✓ 日本 {uuid.uuid4().hex[:8]}'
    commit_as_admin(clients, cluster.bootstrap, odd, {(topic, 0): 2, (doomed, 1): 4})

    def everything_right() -> None:
        series = scrape(cluster)
        exported_once(series)
        assert [v for (n, _), w in series.items() if n == "kafka_brokers" for _, v in w] == [3]
        broker_ids = {dict(key)["id"] for key in select(series, "kafka_broker_info")}
        assert broker_ids == {"0", "1", "2"}
        check_topic(cluster, series, topic, PRODUCED)
        check_group(series, group, topic, COMMITTED, PRODUCED)
        assert select(series, "kafka_consumergroup_members", consumergroup=group) == {
            frozenset({("consumergroup", group)}): 1
        }
        assert exporters(series, consumergroup=group) == {coordinator(cluster, group)}
        # The odd group id comes back exactly as it went in (parsed from the exposition).
        check_group(series, odd, topic, {0: 2}, PRODUCED)
        check_group(series, odd, doomed, {1: 4}, {0: 5, 1: 5})
        assert select(series, "kafka_consumergroup_members", consumergroup=odd) == {
            frozenset({("consumergroup", odd)}): 0
        }
        assert exporters(series, consumergroup=odd) == {coordinator(cluster, odd)}

    eventually(everything_right, "every series once, with the exporter's values", DEADLINE)

    # A deleted topic: its series go, from the topic and from the groups that consumed it.
    admin = clients.admin(cluster.bootstrap)
    admin.delete_topics([doomed], operation_timeout=30)[doomed].result(timeout=60)

    def topic_gone() -> None:
        series = scrape(cluster)
        exported_once(series)
        assert exporters(series, topic=doomed) == set()  # the topic's series and the groups'
        check_group(series, odd, topic, {0: 2}, PRODUCED)

    eventually(topic_gone, f"no series of the deleted topic {doomed}", DEADLINE)

    # A deleted group: once its member left, DeleteGroups removes it, and its series.
    member.close()

    def delete_group() -> None:
        future = admin.delete_consumer_groups([group], request_timeout=30)[group]
        try:
            future.result(timeout=60)
        except KafkaException as error:
            raise AssertionError(f"DeleteGroups: {error}") from error

    eventually(delete_group, f"group {group} deleted", DEADLINE)

    def group_gone() -> None:
        series = scrape(cluster)
        exported_once(series)
        assert exporters(series, consumergroup=group) == set()
        check_group(series, odd, topic, {0: 2}, PRODUCED)
        check_topic(cluster, series, topic, PRODUCED)

    eventually(group_gone, f"no series of the deleted group {group}", DEADLINE)


@pytest.mark.timeout(300)
def test_lag_follows_the_coordinator_when_it_moves(
    cluster: Cluster, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    topic = topic_name("moving")
    create_topic(cluster, clients, topic, PARTITIONS)
    produce(cluster, clients, topic, PRODUCED)
    group = f"moving-{uuid.uuid4().hex[:8]}"
    member = commit_in_group(cluster, clients, group, topic, COMMITTED)

    def exported_by(broker: int, in_sync: int = 3) -> None:
        series = scrape(cluster)
        exported_once(series)
        assert coordinator(cluster, group) == broker
        assert exporters(series, consumergroup=group) == {broker}
        check_group(series, group, topic, COMMITTED, PRODUCED)
        assert select(series, "kafka_consumergroup_members", consumergroup=group) == {
            frozenset({("consumergroup", group)}): 1
        }
        check_topic(cluster, series, topic, PRODUCED, in_sync)

    first = coordinator(cluster, group)
    assert first in cluster.brokers
    eventually(lambda: exported_by(first), f"group {group} exported by broker {first}", DEADLINE)
    # Every replica holds the commits before the coordinator goes.
    wait_for(lambda: fully_replicated(cluster, OFFSETS_TOPIC), DEADLINE, "offsets in sync")

    cluster.brokers[first].kill()

    def moved() -> int:
        # Whichever broker exports the group exports its commits, from its first scrape.
        offsets = select(scrape(cluster), "kafka_consumergroup_current_offset", consumergroup=group)
        if offsets and {int(dict(k)["partition"]): v for k, v in offsets.items()} != {
            p: COMMITTED.get(p, -1) for p in PRODUCED
        }:
            pytest.fail(f"wrong committed offsets exported after the move: {offsets}")
        successor = coordinator(cluster, group)
        assert successor not in (first, -1), f"coordinator {successor}"
        exported_by(successor, in_sync=2)  # the killed broker is out of every ISR
        return successor

    successor = eventually(moved, f"group {group} exported by the successor of {first}", DEADLINE)

    # Back, the killed broker leads its preferred partitions again, __consumer_offsets' too:
    # it exports the group, and the broker that stood in (still running) no longer does.
    cluster.brokers[first].start()
    eventually(
        lambda: exported_by(first), f"group {group} exported by broker {first} again", DEADLINE
    )
    assert cluster.brokers[successor].running
    member.close()
