"""Reads with the `rdma.consume` option: the tasks read the leader's segments with
one-sided RDMA reads (the shm provider, as on this machine) and send no Fetch, yet return
exactly what a TCP read returns; a streaming query's next micro-batch goes on with the
consumer the last one left in its Python worker; where the broker offers no RDMA consume
the same read goes over TCP; a bad rdma.* value fails before any task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.spark.frames import load, read_cases, refused
from tests.spark.test_stream_reads import produce as produce_numbers
from tests.spark.test_stream_reads import run

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 3
# RDMA consume registers the head segment ahead of its data: preallocated topics only.
# Small segments, so that a read crosses from sealed segments into the head.
PREALLOCATED = {"preallocate": "true", "segment.bytes": str(64 << 10)}
RDMA = {"rdma.consume": "true", "rdma.provider": "shm"}
FETCHES = "directlog_broker_requests_total"
SLOT_WRITES = "directlog_broker_rdma_consume_slot_writes_total"


def produce(clients, bootstrap: str, topic: str, count: int) -> None:
    """`count` records round-robin over the partitions: gzip and plain batches, headers on
    some."""
    for codec in ("gzip", "none"):
        producer = clients.producer(
            bootstrap,
            {"compression.type": codec, "linger.ms": 5, "batch.size": 16000, "acks": "all"},
        )
        records = [
            {
                "key": b"k%d" % i,
                "value": b"%s-%d-" % (codec.encode(), i) + bytes(200),
                "partition": i % PARTITIONS,
                "headers": [("n", b"%d" % i)] if i % 3 == 0 else None,
            }
            for i in range(count // 2)
        ]
        reports = clients.produce_all(producer, topic, records)
        assert [e for e, _ in reports if e is not None] == []


def test_rdma_reads_equal_tcp_reads_and_send_no_fetch(spark, rdma_broker, clients, topic_name):
    bootstrap = rdma_broker.bootstrap
    topic = topic_name("rdma-read")
    clients.create_topic(bootstrap, topic, PARTITIONS, config=PREALLOCATED)
    produce(clients, bootstrap, topic, 3000)
    options = {"subscribe": topic, "includeHeaders": "true"}

    before = rdma_broker.total(FETCHES, api="fetch")
    tcp = read_cases(spark, bootstrap, {"tcp": options})["tcp"]
    fetches = rdma_broker.total(FETCHES, api="fetch")
    assert fetches > before  # the TCP read's fetches are counted
    slot_writes = rdma_broker.total(SLOT_WRITES, topic=topic)
    middle = {
        **options,
        **RDMA,
        "startingOffsets": json.dumps({topic: {"0": 17, "1": 0, "2": 400}}),
        "endingOffsets": json.dumps({topic: {"0": 900, "1": 1, "2": -1}}),
        "minPartitions": "6",
    }
    rdma = read_cases(spark, bootstrap, {"all": {**options, **RDMA}, "middle": middle})

    assert len(tcp) == 3000
    assert rdma["all"] == tcp
    ranges = {0: (17, 900), 1: (0, 1), 2: (400, 1000)}
    assert rdma["middle"] == [
        r for r in tcp if ranges[r.partition][0] <= r.offset < ranges[r.partition][1]
    ]
    # No Fetch reached the broker: the records came over RDMA (slot writes: its consumers).
    assert rdma_broker.total(FETCHES, api="fetch") == fetches
    assert rdma_broker.total(SLOT_WRITES, topic=topic) >= slot_writes


def test_streaming_micro_batches_read_over_rdma(
    spark, rdma_broker, clients, topic_name, tmp_path: Path
):
    bootstrap = rdma_broker.bootstrap
    topic = topic_name("rdma-stream")
    clients.create_topic(bootstrap, topic, PARTITIONS, config=PREALLOCATED)
    produce_numbers(bootstrap, topic, range(600), PARTITIONS)
    checkpoint = tmp_path / "checkpoint"
    fetches = rdma_broker.total(FETCHES, api="fetch")

    first = run(
        spark,
        bootstrap,
        topic,
        checkpoint,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="300",
        **RDMA,
    )
    produce_numbers(bootstrap, topic, range(600, 900), PARTITIONS)
    second = run(spark, bootstrap, topic, checkpoint, maxOffsetsPerTrigger="300", **RDMA)

    assert [len(b) for b in first] == [300, 300]
    assert [len(b) for b in second] == [300]
    assert sorted(v for batch in first + second for v in batch) == list(range(900))
    assert rdma_broker.total(FETCHES, api="fetch") == fetches


def test_a_broker_without_rdma_consume_is_read_over_tcp(spark, module_broker, clients, topic_name):
    bootstrap = module_broker.bootstrap
    topic = topic_name("no-rdma")
    clients.create_topic(bootstrap, topic, PARTITIONS, config=PREALLOCATED)
    produce(clients, bootstrap, topic, 400)
    options = {"subscribe": topic, "includeHeaders": "true"}

    found = read_cases(spark, bootstrap, {"tcp": options, "rdma": {**options, **RDMA}})

    assert len(found["tcp"]) == 400
    assert found["rdma"] == found["tcp"]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("rdma.consume", "sometimes", "rdma.consume must be true or false"),
        ("rdma.provider", "carrier-pigeon", "rdma.provider must be one of"),
        ("rdma.read.size", "lots", "rdma.read.size must be a number of bytes"),
        ("rdma.read.size", "16", "rdma.read.size must be at least 64 bytes"),
        ("rdma.produce", "exclusive", "unknown option 'rdma.produce'"),
    ],
)
def test_a_bad_rdma_option_fails_before_any_task(
    spark, module_broker, topic_name, key, value, message
):
    frame = load(spark, module_broker.bootstrap, {"subscribe": topic_name("never"), key: value})
    assert message in refused(spark, frame.collect)
