"""Helpers of the replication tests: a topic with RF=3 and min.insync.replicas=2 on a
three-broker cluster, a producer thread that records every acknowledged send, reading
partitions back, and the checks that nothing acknowledged was lost and that all replicas
hold the same bytes."""

from __future__ import annotations

import struct
import threading
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.cluster import Cluster, wait_for

TOPIC = "replicated"
PARTITIONS = 3
TIMEOUT = 60


def create_topic(cluster: Cluster) -> None:
    """TOPIC with RF=3 and min.insync.replicas=2, its ISRs complete."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = NewTopic(
        TOPIC,
        num_partitions=PARTITIONS,
        replication_factor=3,
        config={"min.insync.replicas": "2"},
    )
    admin.create_topics([topic])[TOPIC].result(timeout=TIMEOUT)
    wait_for(lambda: all_in_sync(cluster), TIMEOUT, "the new topic's ISRs")


def partitions(bootstrap: str) -> dict[int, Any]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return dict(admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions)


def all_in_sync(cluster: Cluster) -> bool:
    """Every running broker's own metadata shows every replica in sync (a broker that was
    cut off may still hold an old image, so each is asked)."""
    for broker in cluster.brokers.values():
        if broker.running:
            found = partitions(broker.bootstrap)
            if len(found) != PARTITIONS or not all(
                p.leader >= 0 and sorted(p.isrs) == sorted(p.replicas) for p in found.values()
            ):
                return False
    return True


class Load:
    """A producer thread sending numbered values (acks=all, retries on) until stopped, and
    the outcome of every send."""

    def __init__(self, bootstrap: str, *, idempotent: bool = False) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": idempotent,
                # Retries keep send order: by sequence numbers with idempotence, else by
                # sending one request at a time.
                "max.in.flight.requests.per.connection": 5 if idempotent else 1,
                "linger.ms": 5,
                "message.timeout.ms": 30000,
                "retry.backoff.ms": 100,
                "topic.metadata.refresh.interval.ms": 500,
            }
        )
        self.acked: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
        self.failures: list[str] = []  # why each failed send failed, for the assertion message
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
            self.failures.append(f"partition {message.partition()} {message.value()!r}: {error}")

    @property
    def failed(self) -> int:
        return len(self.failures)

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
    """Every record of every partition, up to the high watermarks, once every broker's
    image agrees that all replicas are in sync (a broker that was cut off may still call
    itself leader, with a high watermark of before)."""
    wait_for(lambda: all_in_sync(cluster), TIMEOUT, "every replica back in the ISR")
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
    return int(partitions(cluster.bootstrap)[partition].leader)
