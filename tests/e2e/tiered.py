"""Helpers of the tiered storage tests: a cluster whose brokers each have a tiering service
and a remote store (a directory or the S3 server), topics that tier small segments, and
reading partitions back from offset 0 with real clients."""

from __future__ import annotations

import itertools
import random
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import grpc
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from directlog.rpc import controller_pb2 as pb
from directlog.rpc import controller_pb2_grpc
from services.broker.storage.log import read_partition_metadata
from tests.e2e.cluster import Cluster, wait_for
from tests.s3_server import S3Server

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

TIMEOUT = 90
SEGMENT_BYTES = 64 * 1024
TIERING = {"interval_ms": 200, "follower_sync_interval_ms": 300, "deletion_check_interval_ms": 500}


def tiering_settings(
    kind: str, work_dir: Path, s3: S3Server | None, **extra: Any
) -> dict[str, Any]:
    """TieringSettings for a store of `kind` ("file" or "s3"), under a prefix of its own."""
    if kind == "file":
        return {**TIERING, "remote": f"file://{work_dir}/remote", **extra}
    assert s3 is not None
    prefix = f"s3://{s3.bucket}/{work_dir.name}"
    return {**TIERING, "remote": prefix, **s3.settings, **extra}


def values(count: int, seed: int) -> list[bytes]:
    """Random values of 100-900 bytes."""
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(100, 900)) for _ in range(count)]


def create_tiered_topic(cluster: Cluster, name: str, *, replicas: int = 1, **configs: str) -> None:
    """A topic that copies 64 KiB segments and keeps none of them locally once copied."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    settings = {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": "0",
        "retention.ms": "-1",
        **configs,
    }
    admin.create_topics([NewTopic(name, 1, replicas, config=settings)])[name].result(TIMEOUT)


def produce(bootstrap: str, topic: str, values: list[bytes], base_timestamp: int) -> None:
    """`values` to partition 0 in order (acks=all), record i stamped base_timestamp + i."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 16384, "acks": "all"}
    )
    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    for i, value in enumerate(values):
        producer.produce(
            topic,
            value,
            key=b"k%d" % i,
            partition=0,
            timestamp=base_timestamp + i,
            on_delivery=delivered,
        )
        if i % 200 == 199:
            producer.poll(0)
    assert producer.flush(TIMEOUT) == 0 and not failures, failures


def local_log_start(cluster: Cluster, node_id: int, topic: str) -> float | None:
    return cluster.brokers[node_id].sample(
        "directlog_broker_local_log_start_offset", topic=topic, partition="0"
    )


def wait_tiered(cluster: Cluster, node_id: int, topic: str, at_least: int) -> None:
    """Until broker `node_id` keeps only offsets from `at_least` on locally: the rest went
    to the remote store and local retention deleted it."""
    wait_for(
        lambda: (local_log_start(cluster, node_id, topic) or 0) >= at_least,
        TIMEOUT,
        f"{topic} on broker {node_id} tiered up to offset {at_least}\n{cluster.logs(20)}",
    )


def read_confluent(
    bootstrap: str, topic: str, count: int, start: int = 0
) -> list[tuple[int, bytes, int]]:
    """(offset, value, timestamp) of `count` records of partition 0 from `start`."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([CTopicPartition(topic, 0, start)])
    got: list[tuple[int, bytes, int]] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while len(got) < count and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=1):
                assert message.error() is None, message.error()
                got.append((message.offset(), message.value(), message.timestamp()[1]))
    finally:
        consumer.close()
    return got


def read_kafka_python(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes, int]]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=TIMEOUT * 1000
    )
    tp = KTopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    got: list[tuple[int, bytes, int]] = []
    try:
        for message in consumer:
            got.append((message.offset, message.value, message.timestamp))
            if len(got) >= count:
                break
    finally:
        consumer.close()
    return got


def topic_id_of(cluster: Cluster, topic: str) -> uuid.UUID:
    """The topic's id, as a replica's partition.metadata records it."""
    for broker in cluster.brokers.values():
        found = read_partition_metadata(broker.data_dir / f"{topic}-0")
        if found is not None:
            return found
    raise AssertionError(f"no replica of {topic}-0 records its topic id")


def remote_records(cluster: Cluster, topic: str) -> list[pb.RemoteLogSegment]:
    """The controller's remote log records of partition 0 of `topic`, by start offset."""
    wanted = pb.PartitionVersion(
        topic_id=topic_id_of(cluster, topic).bytes, partition=0, known_version=-1
    )
    for controller in cluster.controllers:
        with grpc.insecure_channel(controller.address) as channel:
            stub = controller_pb2_grpc.ControllerStub(channel)  # type: ignore[no-untyped-call]
            try:
                reply = stub.ListRemoteLogSegments(
                    pb.ListRemoteLogSegmentsRequest(partitions=[wanted]), timeout=10
                )
            except grpc.RpcError:
                continue  # a standby
            return sorted(reply.partitions[0].segments, key=lambda s: s.start_offset)
    raise AssertionError("no active controller")


def finished_ranges(cluster: Cluster, topic: str) -> list[tuple[int, int]]:
    """(start, end) offsets of the finished remote copies, in order."""
    return [
        (s.start_offset, s.end_offset)
        for s in remote_records(cluster, topic)
        if s.state == pb.COPY_FINISHED
    ]


def contiguous(ranges: list[tuple[int, int]]) -> bool:
    """No gap and no offset held twice."""
    return all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))


def leader_of(cluster: Cluster, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    return int(admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader)
