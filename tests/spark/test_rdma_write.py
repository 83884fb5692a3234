"""Writes with the `rdma.produce` option: the executors' producers write over RDMA (the shm
provider, as on this machine) where the broker grants it, read back with confluent-kafka,
keyed rows where the Java producer puts them; a bad rdma.* value fails before any task."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.spark.frames import refused

pytestmark = pytest.mark.timeout(180)

PREALLOCATED = {"preallocate": "true", "segment.bytes": str(1 << 20)}


def test_rows_written_over_rdma_read_back_with_confluent_kafka(
    spark, rdma_broker, clients, topic_name
):
    bootstrap = rdma_broker.bootstrap
    topic, reference = topic_name("rdma-write"), topic_name("rdma-reference")
    for name in (topic, reference):
        clients.create_topic(bootstrap, name, partitions=3, config=PREALLOCATED)
    rows = [(f"key{i % 23}", f"value{i}") for i in range(300)]
    (
        spark.createDataFrame(rows, "key string, value string")
        .coalesce(1)  # one task, so each partition's order is the rows' order
        .write.format("directlog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("rdma.produce", "exclusive")
        .option("rdma.provider", "shm")
        .mode("append")
        .save()
    )
    writes = rdma_broker.sample("directlog_broker_rdma_produce_writes_total", topic=topic)
    assert writes is not None and writes >= 3  # RDMA carried them, one writer a partition

    # The same rows through the Java client's partitioner (librdkafka's murmur2_random).
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    for key, value in rows:
        producer.produce(reference, value.encode(), key.encode())
    assert producer.flush(30) == 0
    assert read_all(bootstrap, topic) == read_all(bootstrap, reference)


def test_a_bad_rdma_value_fails_before_any_task(spark, rdma_broker, topic_name):
    writer = (
        spark.createDataFrame([("v",)], "value string")
        .write.format("directlog")
        .option("kafka.bootstrap.servers", rdma_broker.bootstrap)
        .option("topic", topic_name("never"))
        .option("rdma.produce", "sometimes")
        .mode("append")
    )
    assert "rdma.produce must be off, exclusive or shared" in refused(spark, writer.save)


def read_all(bootstrap: str, topic: str) -> dict[int, list[tuple[bytes, bytes]]]:
    """(key, value) of every record, per partition, in offset order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "read-all"})
    try:
        out = {}
        for partition in range(3):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            consumer.assign([TopicPartition(topic, partition, 0)])
            got: list[tuple[bytes, bytes]] = []
            while len(got) < high:
                for message in consumer.consume(500, timeout=5):
                    assert message.error() is None, message.error()
                    got.append((message.key(), message.value()))
            out[partition] = got
        return out
    finally:
        consumer.close()
