"""Fetching from the closest replica (KIP-392) across three brokers in three racks.

With `replica_selector_class` set to Kafka's rack-aware selector, a confluent-kafka consumer
with `client.rack` set reads from the follower in its rack: the leader answers its Fetch with
the preferred read replica and no records, so the record bytes sent to consumers (Kafka's
BytesOutPerSec, counted per broker) come from that follower alone. When the follower dies it
leaves the ISR, the consumer goes back to the leader, and the leader keeps it (an out-of-sync
replica is never preferred). Every record is read once, in order, throughout.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from directlog.protocol.errors import ErrorCode
from services.broker.replica_selector import RACK_AWARE_SELECTOR
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.records import fetch_partition

TOPIC = "by-zone"
RACKS = {0: "zone-a", 1: "zone-b", 2: "zone-c"}
BYTES_OUT = "kafka_server_brokertopicmetrics_bytesout_total"
TIMEOUT = 60.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    settings = {"replica_selector_class": RACK_AWARE_SELECTOR, "replica_lag_time_max_ms": 3000}
    with Cluster(tmp_path, brokers=3, racks=RACKS, broker_settings=settings) as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        # Broker 0 leads; 1 (zone-b) and 2 (zone-c) follow.
        topic = NewTopic(TOPIC, num_partitions=1, replica_assignment=[[0, 1, 2]])
        admin.create_topics([topic])[TOPIC].result(timeout=TIMEOUT)
        wait_for(lambda: isr(running) == [0, 1, 2], TIMEOUT, "the topic's ISR")
        yield running


def isr(cluster: Cluster) -> list[int]:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    metadata = admin.list_topics(TOPIC, timeout=10).topics[TOPIC]
    return sorted(metadata.partitions[0].isrs) if metadata.partitions else []


def produce(cluster: Cluster, first: int, count: int) -> list[bytes]:
    values = [f"record-{i:05d}".encode() * 20 for i in range(first, first + count)]
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for value in values:
        producer.produce(TOPIC, value, partition=0)
    assert producer.flush(TIMEOUT) == 0
    return values


def consumer(cluster: Cluster, rack: str | None) -> Consumer:
    config = {
        "bootstrap.servers": cluster.bootstrap,
        "group.id": f"reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
        **({"client.rack": rack} if rack else {}),
    }
    reader = Consumer(config)
    reader.assign([TopicPartition(TOPIC, 0, 0)])
    return reader


def read(reader: Consumer, count: int) -> list[bytes]:
    values: list[bytes] = []

    def more() -> bool:
        message = reader.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            values.append(message.value())
        return len(values) >= count

    wait_for(more, TIMEOUT, f"{count} records")
    return values


def bytes_out(cluster: Cluster) -> dict[int, float]:
    return {n: b.total(BYTES_OUT, topic=TOPIC) for n, b in cluster.brokers.items() if b.running}


@pytest.mark.timeout(240)
def test_a_consumer_reads_its_racks_follower_and_falls_back_to_the_leader(
    cluster: Cluster,
) -> None:
    first = produce(cluster, 0, 200)
    size = sum(len(v) for v in first)
    reader = consumer(cluster, "zone-b")
    try:
        assert read(reader, len(first)) == first
        served = bytes_out(cluster)
        assert served[1] >= size, served  # the zone-b follower served the records
        assert served[0] == served[2] == 0, served

        cluster.brokers[1].kill()
        wait_for(lambda: isr(cluster) == [0, 2], TIMEOUT, "broker 1 out of the ISR")
        second = produce(cluster, 200, 100)
        assert read(reader, len(second)) == second
        after = bytes_out(cluster)
        assert after[0] >= sum(len(v) for v in second), after  # back on the leader
        assert after[2] == 0, after
    finally:
        reader.close()


@pytest.mark.timeout(120)
def test_consumers_without_a_rack_or_in_the_leaders_rack_read_the_leader(
    cluster: Cluster,
) -> None:
    values = produce(cluster, 0, 50)
    for rack in (None, "zone-a", "zone-x"):  # no rack, the leader's, a rack no replica has
        before = bytes_out(cluster)
        reader = consumer(cluster, rack)
        try:
            assert read(reader, len(values)) == values
        finally:
            reader.close()
        after = bytes_out(cluster)
        assert after[0] - before[0] >= sum(len(v) for v in values), (rack, after)
        assert after[1] == before[1] and after[2] == before[2], (rack, after)


def fetch(broker: str, offset: int, **fields: Any) -> Any:
    return fetch_partition(broker, TOPIC, offset, **fields)


@pytest.mark.timeout(120)
def test_what_leader_and_followers_answer_a_consumers_fetch(cluster: Cluster) -> None:
    values = produce(cluster, 0, 10)
    leader, follower = cluster.brokers[0].bootstrap, cluster.brokers[2].bootstrap
    wait_for(lambda: fetch(follower, 0).high_watermark == 10, TIMEOUT, "the follower's HW")
    # The leader sends a zone-c consumer to broker 2, with no records.
    sent = fetch(leader, 0, rack="zone-c")
    assert (sent.error_code, sent.preferred_read_replica, sent.high_watermark) == (0, 2, 10)
    assert not sent.records
    # Broker 2 serves any Fetch v11+ consumer, rack or none, up to its high watermark.
    served = fetch(follower, 0)
    assert served.error_code == 0 and served.preferred_read_replica == -1
    assert all(v in bytes(served.records) for v in values)
    # Before v11 a consumer reads the leader only.
    assert fetch(follower, 0, version=10).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    # Past the follower's end: with the leader epoch, out of range (the client asks the
    # leader); without, no records (it may be here on stale metadata).
    beyond = fetch(follower, 50)
    assert beyond.error_code == 0 and not beyond.records
    epoch = 0  # the new topic's first leader's
    assert fetch(follower, 50, epoch=epoch).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert fetch(follower, 0, epoch=epoch + 1).error_code == ErrorCode.UNKNOWN_LEADER_EPOCH
