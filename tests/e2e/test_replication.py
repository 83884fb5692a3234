"""Replication across three real brokers under failures, with confluent-kafka producing
acks=all to a topic with RF=3 and min.insync.replicas=2.

Every test records each acknowledged send, then reads the partitions back: every
acknowledged record must be there, in send order per partition (duplicates only from
retried sends, counted), and all replicas must hold byte-identical batches up to the high
watermark. Waits are bounded; nothing asserts on durations.
"""

from __future__ import annotations

import signal
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from directlog.protocol.client import KafkaConnection
from tests.e2e.cluster import Cluster, wait_for

TOPIC = "replicated"
PARTITIONS = 3
TIMEOUT = 60


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, brokers=3, controllers=2) as running:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        topic = NewTopic(
            TOPIC,
            num_partitions=PARTITIONS,
            replication_factor=3,
            config={"min.insync.replicas": "2"},
        )
        admin.create_topics([topic])[TOPIC].result(timeout=TIMEOUT)
        wait_for(lambda: all_in_sync(running), TIMEOUT, "the new topic's ISRs")
        yield running


def partitions(cluster: Cluster) -> dict[int, Any]:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    return dict(admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions)


def all_in_sync(cluster: Cluster) -> bool:
    found = partitions(cluster)
    return len(found) == PARTITIONS and all(
        p.leader >= 0 and sorted(p.isrs) == sorted(p.replicas) for p in found.values()
    )


class Load:
    """A producer thread sending numbered values (acks=all, retries on) until stopped, and
    the outcome of every send."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "max.in.flight.requests.per.connection": 1,  # retries keep send order
                "linger.ms": 5,
                "message.timeout.ms": 30000,
                "retry.backoff.ms": 100,
                "topic.metadata.refresh.interval.ms": 500,
            }
        )
        self.acked: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
        self.failed = 0
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            value = b"%08d" % self.sent
            self.producer.produce(
                TOPIC, value=value, partition=self.sent % PARTITIONS, on_delivery=self._delivered
            )
            self.sent += 1
            self.producer.poll(0.002)

    def _delivered(self, error: Any, message: Any) -> None:
        if error is None:
            self.acked[message.partition()].append((message.offset(), message.value()))
        else:
            self.failed += 1

    def wait_acked(self, more: int, timeout: float = TIMEOUT) -> None:
        target = self.count() + more
        wait_for(lambda: self.count() >= target, timeout, f"{more} more acknowledged sends")

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(10)
            self.producer.flush(60)


def read_back(cluster: Cluster) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of every partition, up to the high watermarks."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "read-back",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(CTopicPartition(TOPIC, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
        consumer.assign([CTopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
        deadline = time.monotonic() + TIMEOUT
        while any(out[p][-1][0] + 1 < ends[p] if out[p] else ends[p] > 0 for p in out):
            assert time.monotonic() < deadline, f"read back stalled: {ends}"
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            out[message.partition()].append((message.offset(), message.value()))
        return out
    finally:
        consumer.close()


def check_no_acknowledged_record_lost(
    load: Load, stored: dict[int, list[tuple[int, bytes]]]
) -> int:
    """Every acknowledged send is stored at its acknowledged offset, in send order per
    partition; returns how many stored records are duplicates (of retried sends)."""
    duplicates = 0
    for partition, acked in load.acked.items():
        by_offset = dict(stored[partition])
        for offset, value in acked:
            assert by_offset.get(offset) == value, (
                f"acknowledged {value!r} at {partition}/{offset}, stored {by_offset.get(offset)!r}"
            )
        values = [v for _, v in stored[partition]]
        duplicates += len(values) - len(set(values))
        first_seen = sorted(
            {v: o for o, v in reversed(stored[partition])}.items(), key=lambda item: item[1]
        )
        numbers = [int(v) for v, _ in first_seen]
        assert numbers == sorted(numbers), f"partition {partition} out of send order"
    return duplicates


def replica_batches(cluster: Cluster, partition: int, upto: int) -> dict[int, bytes]:
    """Per broker, the bytes of the partition's record batches below offset `upto`."""
    out = {}
    for node_id, broker in cluster.brokers.items():
        data = bytearray()
        for segment in sorted((broker.data_dir / f"{TOPIC}-{partition}").glob("*.log")):
            raw = segment.read_bytes()
            position = 0
            while position + 61 <= len(raw):
                base, length = struct.unpack_from(">qi", raw, position)
                if length <= 0:
                    break
                (last_delta,) = struct.unpack_from(">i", raw, position + 23)
                if base + last_delta >= upto:
                    break
                data += raw[position : position + 12 + length]
                position += 12 + length
        out[node_id] = bytes(data)
    return out


def check_replicas_identical(cluster: Cluster, stored: dict[int, list[tuple[int, bytes]]]) -> None:
    wait_for(lambda: all_in_sync(cluster), TIMEOUT, "every replica back in the ISR")
    for partition, records in stored.items():
        upto = records[-1][0] + 1 if records else 0
        copies = replica_batches(cluster, partition, upto)
        assert len(set(copies.values())) == 1, (
            f"partition {partition}: replicas differ below {upto}: "
            f"{ {n: len(b) for n, b in copies.items()} }"
        )
        assert upto == 0 or copies[0], "nothing stored"


def leader_of(cluster: Cluster, partition: int) -> int:
    return int(partitions(cluster)[partition].leader)


@pytest.mark.timeout(240)
def test_leader_killed_and_restarted_under_load_loses_nothing(cluster: Cluster) -> None:
    with Load(cluster.bootstrap) as load:
        load.wait_acked(300)
        victim = leader_of(cluster, 0)
        cluster.brokers[victim].kill(signal.SIGKILL)
        wait_for(lambda: leader_of(cluster, 0) not in (victim, -1), TIMEOUT, "a new leader")
        load.wait_acked(300)
        cluster.brokers[victim].start()
        load.wait_acked(300)
    stored = read_back(cluster)
    duplicates = check_no_acknowledged_record_lost(load, stored)
    check_replicas_identical(cluster, stored)
    assert load.count() >= 900
    print(f"acknowledged {load.count()}, failed {load.failed}, duplicates {duplicates}")


@pytest.mark.timeout(240)
def test_active_controller_killed_under_load_loses_nothing(cluster: Cluster) -> None:
    active = next(c for c in cluster.controllers if c.sample("directlog_controller_active") == 1)
    with Load(cluster.bootstrap) as load:
        load.wait_acked(300)
        active.kill()
        load.wait_acked(300)
        # Leadership still moves: the standby took over.
        victim = leader_of(cluster, 1)
        cluster.brokers[victim].kill(signal.SIGKILL)
        wait_for(lambda: leader_of(cluster, 1) not in (victim, -1), TIMEOUT, "a new leader")
        load.wait_acked(300)
        cluster.brokers[victim].start()
    stored = read_back(cluster)
    check_no_acknowledged_record_lost(load, stored)
    check_replicas_identical(cluster, stored)


@pytest.mark.timeout(240)
def test_broker_with_an_empty_data_dir_rebuilds_from_its_peers(cluster: Cluster) -> None:
    with Load(cluster.bootstrap) as load:
        load.wait_acked(500)
        victim = 2
        cluster.brokers[victim].stop()
        for path in sorted(cluster.brokers[victim].data_dir.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        load.wait_acked(200)
        cluster.brokers[victim].start()
        load.wait_acked(200)
    stored = read_back(cluster)
    check_no_acknowledged_record_lost(load, stored)
    check_replicas_identical(cluster, stored)


@pytest.mark.timeout(240)
def test_a_fenced_leader_cannot_acknowledge_writes(cluster: Cluster) -> None:
    """SIGSTOP the leader of partition 0 past its session: the controller fences it and
    elects another. Resumed, the old leader must not acknowledge an acks=all produce."""
    import asyncio
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.protocol.producer import ProduceRequest, ProduceResponse

    from directlog.records.batch import Record, build_batch

    with Load(cluster.bootstrap) as load:
        load.wait_acked(200)
        victim = leader_of(cluster, 0)
        stale = cluster.brokers[victim]
        stale.kill(signal.SIGSTOP)
        try:
            others = [b for n, b in cluster.brokers.items() if n != victim]
            wait_for(
                lambda: _leader_seen_by(others[0].bootstrap, 0) not in (victim, -1),
                TIMEOUT,
                "the controller to move leadership away from the stopped broker",
            )
        finally:
            stale.kill(signal.SIGCONT)

        async def produce_to_stale() -> int:
            host, port = stale.bootstrap.split(":")
            connection = await KafkaConnection.connect(host, int(port), timeout=10)
            try:
                batch = build_batch([Record(0, int(time.time() * 1000), None, b"split-brain")])
                request = ProduceRequest(
                    version=9,
                    transactional_id=None,
                    acks=-1,
                    timeout_ms=3000,
                    topic_data=[
                        ProduceRequest.TopicProduceData(
                            name=TOPIC,
                            partition_data=[
                                ProduceRequest.TopicProduceData.PartitionProduceData(
                                    index=0, records=batch
                                )
                            ],
                        )
                    ],
                )
                response = await connection.request(request, ProduceResponse, "stale-test")
                return int(response.responses[0].partition_responses[0].error_code)
            finally:
                await connection.close()

        code = asyncio.run(produce_to_stale())
        assert code != 0, "a fenced leader acknowledged an acks=all write"
        load.wait_acked(200)
    stored = read_back(cluster)
    assert all(v != b"split-brain" for _, v in stored[0])
    check_no_acknowledged_record_lost(load, stored)
    check_replicas_identical(cluster, stored)


def _leader_seen_by(bootstrap: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return int(admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions[partition].leader)
