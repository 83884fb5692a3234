"""Streaming reads of the `directlog` data source: micro-batches bounded by
maxOffsetsPerTrigger under Trigger.AvailableNow, a query restarted from its checkpoint
neither losing nor repeating a record, a partition added while the query runs, the default
start at the latest offsets, and failOnDataLoss when DeleteRecords removed unread offsets.
Each query collects its micro-batches on the driver (foreachBatch). And what an idle
query's polls cost the broker, counted by its request metrics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.datasource import ReadAllAvailable

from directlog.spark.options import read_options
from directlog.spark.stream import StreamReader

pytestmark = pytest.mark.timeout(240)
TIMEOUT = 120


def produce(bootstrap: str, topic: str, numbers: range, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in numbers:
        producer.produce(topic, b"%d" % n, partition=n % partitions)
    assert producer.flush(30) == 0


def run(spark: Any, bootstrap: str, topic: str, checkpoint: Path, **options: str) -> list[list]:
    """One Trigger.AvailableNow run of a query over `topic` from `checkpoint`: the values
    of each micro-batch, in order."""
    batches: dict[int, list[int]] = {}

    def collect(frame: Any, batch_id: int) -> None:
        batches[batch_id] = sorted(int(r.value) for r in frame.collect())

    reader = (
        spark.readStream.format("directlog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .options(**options)
        .load()
    )
    query = (
        reader.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(TIMEOUT), "the query did not end"
    finally:
        query.stop()
    return [batches[b] for b in sorted(batches)]


def test_rate_limited_batches_resume_and_take_new_partitions(
    spark, module_broker, clients, topic_name, tmp_path
):
    bootstrap = module_broker.bootstrap
    topic = topic_name("stream")
    clients.create_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, range(100), 2)
    checkpoint = tmp_path / "checkpoint"
    limited = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": "30"}

    first = run(spark, bootstrap, topic, checkpoint, **limited)
    assert all(0 < len(b) <= 30 for b in first) and len(first) >= 4, first
    assert sorted(n for b in first for n in b) == list(range(100))

    produce(bootstrap, topic, range(100, 150), 2)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    deadline = time.monotonic() + 30
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) < 3:
        assert time.monotonic() < deadline, "the new partition never showed"
        time.sleep(0.2)
    produce(bootstrap, topic, range(150, 180), 3)

    second = run(spark, bootstrap, topic, checkpoint, **limited)
    assert all(0 < len(b) <= 30 for b in second), second
    # Nothing lost, nothing read twice, the new partition's records included.
    assert sorted(n for b in first + second for n in b) == list(range(180))


def test_a_new_query_starts_at_the_latest_offsets(
    spark, module_broker, clients, topic_name, tmp_path
):
    bootstrap = module_broker.bootstrap
    topic = topic_name("latest")
    clients.create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, range(10), 1)
    checkpoint = tmp_path / "checkpoint"
    assert not any(run(spark, bootstrap, topic, checkpoint))  # (Spark may run an empty one)
    produce(bootstrap, topic, range(10, 15), 1)
    assert [b for b in run(spark, bootstrap, topic, checkpoint) if b] == [[10, 11, 12, 13, 14]]


def test_deleted_unread_offsets_fail_the_query_or_are_skipped(
    spark, module_broker, clients, topic_name, tmp_path
):
    bootstrap = module_broker.bootstrap
    topic = topic_name("lost")
    clients.create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, range(20), 1)
    checkpoint = tmp_path / "checkpoint"
    assert run(spark, bootstrap, topic, checkpoint, startingOffsets="earliest") == [list(range(20))]
    produce(bootstrap, topic, range(20, 40), 1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 30)]).values():
        future.result(30)

    with pytest.raises(StreamingQueryException, match="were deleted"):
        run(spark, bootstrap, topic, checkpoint)
    assert run(spark, bootstrap, topic, checkpoint, failOnDataLoss="false") == [list(range(30, 40))]


def test_a_poll_asks_for_all_partitions_in_one_request(module_broker, clients, topic_name):
    """Spark asks an idle query for new offsets every 10 ms or so: each ask costs one
    Metadata and one ListOffsets request for all the partitions, as in Spark's connector."""
    bootstrap = module_broker.bootstrap
    topic = topic_name("polls")
    clients.create_topic(bootstrap, topic, 4)
    produce(bootstrap, topic, range(8), 4)
    polls = 5
    reader = StreamReader(
        read_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic}, streaming=True)
    )
    try:
        start = reader.initialOffset()
        assert start == {topic: {str(p): 2 for p in range(4)}}
        reader.latestOffset(start, ReadAllAvailable())  # the client's connections made
        before = {api: _requests(module_broker, api) for api in ("metadata", "list_offsets")}
        for _ in range(polls):
            assert reader.latestOffset(start, ReadAllAvailable()) == start
        after = {api: _requests(module_broker, api) for api in before}
    finally:
        reader.stop()
    assert {api: after[api] - before[api] for api in after} == {
        "metadata": polls,
        "list_offsets": polls,
    }


def _requests(broker: Any, api: str) -> float:
    return float(broker.total("directlog_broker_requests_total", api=api))
