"""confluent-kafka (librdkafka) producers and consumers against a real broker process.

Every test checks the exact content and order of what comes back (offset, key, value,
headers, timestamp of each record) against what was sent, and that delivery reports carry
the offsets 0..N-1 in order. Consumers use assign() with explicit offsets and no commits:
the broker does not serve consumer groups yet.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import ConfigResource, ResourceType

from tests.e2e.records import recent_base_timestamp, varied_keys_and_values

pytestmark = pytest.mark.timeout(60)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
N = 2000


def make_records(
    count: int, seed: int, *, partition: int | None = 0, headers: bool = True
) -> list[dict[str, Any]]:
    """Producer.produce kwargs: varied keys and values (some null, some empty, some random
    bytes, some repetitive text), explicit timestamps, and headers (repeated names, a null
    value, and some records without any)."""
    rng = random.Random(seed)
    base_timestamp = recent_base_timestamp()
    records = []
    for i, (key, value) in enumerate(varied_keys_and_values(count, seed, "value")):
        record: dict[str, Any] = {"key": key, "value": value, "timestamp": base_timestamp + i}
        if partition is not None:
            record["partition"] = partition
        if headers and i % 50 != 0:
            record_headers: list[tuple[str, bytes | None]] = [
                ("seq", str(i).encode()),
                ("parity", b"odd" if i % 2 else b"even"),
            ]
            if i % 5 == 0:
                record_headers.append(("seq", b"repeated name"))
            if i % 77 == 0:
                record_headers.append(("null-value", None))
            if i % 11 == 0:
                record_headers.append(("binary", rng.randbytes(16)))
            record["headers"] = record_headers
        records.append(record)
    return records


def expected(records: list[dict[str, Any]], first_offset: int = 0) -> list[tuple[Any, ...]]:
    return [
        (
            first_offset + i,
            r["key"],
            r["value"],
            r.get("headers") or None,
            (TIMESTAMP_CREATE_TIME, r["timestamp"]),
        )
        for i, r in enumerate(records)
    ]


def received(messages: list[Message]) -> list[tuple[Any, ...]]:
    return [(m.offset(), m.key(), m.value(), m.headers(), m.timestamp()) for m in messages]


def assert_delivered(reports: list[tuple[Any, Message]], topic: str, count: int) -> None:
    errors = [(e, m.offset()) for e, m in reports if e is not None]
    assert errors == []
    assert len(reports) == count
    assert [m.topic() for _, m in reports] == [topic] * count
    assert [m.offset() for _, m in reports] == list(range(count))


def assert_same(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"record {index} differs"


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_round_trips_exactly(module_broker, clients, topic_name, codec):
    topic = topic_name(codec)
    records = make_records(N, seed=CODECS.index(codec))
    producer = clients.producer(
        module_broker.bootstrap,
        {"compression.type": codec, "linger.ms": 20, "batch.num.messages": 400, "acks": "all"},
    )
    reports = clients.produce_all(producer, topic, records)
    assert_delivered(reports, topic, N)
    assert [(m.key(), m.value()) for _, m in reports] == [(r["key"], r["value"]) for r in records]

    consumer = clients.consumer(module_broker.bootstrap)
    clients.assign_from(consumer, topic, [0])
    assert_same(received(clients.consume(consumer, N)), expected(records))
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, N)

    batches = module_broker.stored_batches(topic)
    assert sum(count for _, count in batches) == N
    # The producer really compressed: the broker keeps batches as the producer sent them.
    # (librdkafka silently sends uncompressed batches when it thinks the broker cannot take
    # the codec, which would leave the codec untested. It also sends a batch uncompressed
    # when compressing would not make it smaller, as for a straggler of one record, so a
    # few uncompressed batches beside the compressed ones are normal.)
    codecs = sorted({c for c, _ in batches})
    compressed = sum(count for c, count in batches if c == CODEC_IDS[codec])
    assert set(codecs) <= {0, CODEC_IDS[codec]}, f"stored batches have codec ids {codecs}"
    assert compressed > N // 2, (
        f"only {compressed} of {N} records in {codec} ({CODEC_IDS[codec]}) batches: {batches}"
    )
    if codec != "none":
        assert len(batches) < N, "the producer never batched: compression was not exercised"


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks(module_broker, clients, topic_name, acks):
    topic = topic_name(f"acks{acks}")
    count = 500
    records = make_records(count, seed=100 + ["0", "1", "all"].index(acks))
    producer = clients.producer(module_broker.bootstrap, {"acks": acks, "linger.ms": 10})
    reports = clients.produce_all(producer, topic, records)
    assert [e for e, _ in reports if e is not None] == []
    assert len(reports) == count
    if acks == "0":
        # No response from the broker, so no offsets in the reports.
        assert {m.offset() for _, m in reports} == {None}
    else:
        assert_delivered(reports, topic, count)

    consumer = clients.consumer(module_broker.bootstrap)
    clients.assign_from(consumer, topic, [0])
    assert_same(received(clients.consume(consumer, count)), expected(records))
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, count)


def test_three_partitions_keep_per_partition_order(module_broker, clients, topic_name):
    topic = topic_name("parts")
    clients.create_topic(module_broker.bootstrap, topic, partitions=3)
    admin = clients.admin(module_broker.bootstrap)
    metadata = admin.list_topics(topic, timeout=10)
    assert sorted(metadata.topics[topic].partitions) == [0, 1, 2]

    per_partition = 400
    by_partition = {p: make_records(per_partition, seed=200 + p, partition=p) for p in range(3)}
    # Interleave the partitions so each produce request carries all three.
    interleaved = [by_partition[i % 3][i // 3] for i in range(3 * per_partition)]
    producer = clients.producer(
        module_broker.bootstrap, {"compression.type": "zstd", "linger.ms": 10}
    )
    reports = clients.produce_all(producer, topic, interleaved)
    assert [e for e, _ in reports if e is not None] == []
    for p in range(3):
        offsets = [m.offset() for _, m in reports if m.partition() == p]
        assert offsets == list(range(per_partition)), f"partition {p}"

    consumer = clients.consumer(module_broker.bootstrap)
    clients.assign_from(consumer, topic, [0, 1, 2])
    messages = clients.consume(consumer, 3 * per_partition)
    for p in range(3):
        got = [m for m in messages if m.partition() == p]
        assert_same(received(got), expected(by_partition[p]))
        low_high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        assert low_high == (0, per_partition)


def test_waiting_consumer_gets_records_produced_later(module_broker, clients, topic_name):
    topic = topic_name("later")
    clients.create_topic(module_broker.bootstrap, topic)
    consumer = clients.consumer(module_broker.bootstrap, {"fetch.wait.max.ms": 5000})
    clients.assign_from(consumer, topic, [0])
    assert consumer.consume(10, 1.0) == []
    # Nothing there yet: each fetch waits on the broker (up to fetch.wait.max.ms) rather
    # than coming back empty at once, so an idle consumer sends hardly any.
    fetches_before = module_broker.total("directlog_broker_requests_total", api="fetch")
    assert consumer.consume(10, 2.0) == []
    fetches = module_broker.total("directlog_broker_requests_total", api="fetch") - fetches_before
    assert fetches <= 2, f"{fetches} fetches in 2 s: the broker did not hold empty fetches"

    count = 300
    records = make_records(count, seed=300)
    sent_at: list[float] = []
    reports: list[tuple[Any, Message]] = []

    def produce_later() -> None:
        producer = clients.producer(module_broker.bootstrap, {"linger.ms": 0})
        sent_at.append(time.monotonic())
        reports.extend(clients.produce_all(producer, topic, records))

    producer_thread = threading.Timer(0.5, produce_later)
    producer_thread.start()
    try:
        first = clients.consume(consumer, 1, timeout=20)
        first_at = time.monotonic()
        rest = clients.consume(consumer, count - 1, timeout=20)
    finally:
        producer_thread.join(30)
    assert_delivered(reports, topic, count)
    assert_same(received(first + rest), expected(records))
    # The broker answered the waiting fetch when the data arrived, not at fetch.wait.max.ms.
    assert first_at - sent_at[0] < 2.5, f"first record took {first_at - sent_at[0]:.2f} s"


def test_consume_from_the_middle(module_broker, clients, topic_name):
    topic = topic_name("middle")
    count, start = 1000, 500
    records = make_records(count, seed=400)
    # gzip batches of up to 64 records: offset 500 lies inside a batch, not at its start.
    producer = clients.producer(
        module_broker.bootstrap,
        {"compression.type": "gzip", "linger.ms": 50, "batch.num.messages": 64},
    )
    assert_delivered(clients.produce_all(producer, topic, records), topic, count)

    consumer = clients.consumer(module_broker.bootstrap)
    clients.assign_from(consumer, topic, [0], offset=start)
    got = received(clients.consume(consumer, count - start))
    assert_same(got, expected(records[start:], first_offset=start))

    for offset in (1, 499, 999):
        consumer.assign([TopicPartition(topic, 0, offset)])
        got = received(clients.consume(consumer, 1))
        assert got == expected(records[offset : offset + 1], first_offset=offset)


def test_tiny_fetch_sizes(module_broker, clients, topic_name):
    """Fetches far smaller than the data: many round trips, each ending on a batch boundary."""
    topic = topic_name("tiny")
    count = 1500
    records = make_records(count, seed=450)
    producer = clients.producer(
        module_broker.bootstrap,
        {"compression.type": "snappy", "linger.ms": 20, "batch.num.messages": 50},
    )
    assert_delivered(clients.produce_all(producer, topic, records), topic, count)

    fetches_before = module_broker.total("directlog_broker_requests_total", api="fetch")
    consumer = clients.consumer(
        module_broker.bootstrap,
        {"fetch.max.bytes": 4096, "max.partition.fetch.bytes": 2048, "message.max.bytes": 4096},
    )
    clients.assign_from(consumer, topic, [0])
    assert_same(received(clients.consume(consumer, count)), expected(records))
    fetches = module_broker.total("directlog_broker_requests_total", api="fetch") - fetches_before
    assert fetches >= 10, f"only {fetches} fetches: the limits were not applied"


def test_records_larger_than_the_fetch_limit(module_broker, clients, topic_name):
    """Records of 300 kB: a fetch returns the first batch whole even when it is larger than
    max.partition.fetch.bytes (KIP-74), so the consumer makes progress."""
    topic = topic_name("large")
    rng = random.Random(460)
    base_timestamp = int(time.time() * 1000)
    records = [
        {
            "key": f"big-{i}".encode(),
            "value": rng.randbytes(300_000) if i % 2 else bytes([i]) * 300_000,
            "timestamp": base_timestamp + i,
            "partition": 0,
            "headers": [("i", str(i).encode())],
        }
        for i in range(8)
    ]
    producer = clients.producer(
        module_broker.bootstrap, {"compression.type": "zstd", "linger.ms": 0}
    )
    assert_delivered(clients.produce_all(producer, topic, records), topic, len(records))

    consumer = clients.consumer(
        module_broker.bootstrap,
        {
            "max.partition.fetch.bytes": 65536,
            "fetch.max.bytes": 65536,
            "message.max.bytes": 65536,
        },
    )
    clients.assign_from(consumer, topic, [0])
    assert_same(received(clients.consume(consumer, len(records))), expected(records))


def test_concurrent_producers_to_one_partition(module_broker, clients, topic_name):
    topic = topic_name("shared")
    clients.create_topic(module_broker.bootstrap, topic)
    per_producer, producers = 500, 3
    records = [make_records(per_producer, seed=470 + n) for n in range(producers)]
    for n, batch in enumerate(records):
        for record in batch:
            record["headers"] = [("producer", bytes([n]))]
    reports: list[list[tuple[Any, Message]]] = [[] for _ in range(producers)]

    def run(n: int) -> None:
        producer = clients.producer(module_broker.bootstrap, {"linger.ms": 2})
        reports[n] = clients.produce_all(producer, topic, records[n])

    threads = [threading.Thread(target=run, args=(n,)) for n in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    assert not any(thread.is_alive() for thread in threads)

    offsets = []
    for n in range(producers):
        assert [e for e, _ in reports[n] if e is not None] == []
        mine = [m.offset() for _, m in reports[n]]
        assert mine == sorted(mine), f"producer {n}'s records out of order"
        offsets += mine
    assert sorted(offsets) == list(range(producers * per_producer))

    consumer = clients.consumer(module_broker.bootstrap)
    clients.assign_from(consumer, topic, [0])
    messages = clients.consume(consumer, producers * per_producer)
    assert [m.offset() for m in messages] == list(range(producers * per_producer))
    for n in range(producers):
        theirs = [m for m in messages if m.headers() == [("producer", bytes([n]))]]
        assert [m.offset() for m in theirs] == [m.offset() for _, m in reports[n]]
        want = [(r["key"], r["value"], (TIMESTAMP_CREATE_TIME, r["timestamp"])) for r in records[n]]
        assert [(m.key(), m.value(), m.timestamp()) for m in theirs] == want


@pytest.mark.timeout(90)
def test_records_and_topics_survive_restart(broker, clients, topic_name):
    topics = [topic_name("restart-plain"), topic_name("restart-zstd")]
    records = {t: make_records(N, seed=500 + i) for i, t in enumerate(topics)}
    for topic, codec in zip(topics, ["none", "zstd"], strict=True):
        producer = clients.producer(broker.bootstrap, {"compression.type": codec})
        assert_delivered(clients.produce_all(producer, topic, records[topic]), topic, N)
    wide = topic_name("restart-wide")
    clients.create_topic(broker.bootstrap, wide, partitions=3, config={"retention.ms": "7200000"})
    wide_records = {p: make_records(50, seed=510 + p, partition=p) for p in range(3)}
    producer = clients.producer(broker.bootstrap)
    reports = clients.produce_all(producer, wide, [r for p in range(3) for r in wide_records[p]])
    assert [e for e, _ in reports if e is not None] == []

    broker.restart()
    assert "unclean" not in broker.stderr_text().split("----- broker start 2")[1]

    consumer = clients.consumer(broker.bootstrap)
    for topic in topics:
        clients.assign_from(consumer, topic, [0])
        assert_same(received(clients.consume(consumer, N)), expected(records[topic]))
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, N)
        assert broker.sample("directlog_broker_log_end_offset", topic=topic, partition="0") == N

    # The topic's partitions and config overrides are kept too.
    admin = clients.admin(broker.bootstrap)
    assert sorted(admin.list_topics(wide, timeout=10).topics[wide].partitions) == [0, 1, 2]
    resource = ConfigResource(ResourceType.TOPIC, wide)
    (future,) = admin.describe_configs([resource], request_timeout=10).values()
    entry = future.result(timeout=15)["retention.ms"]
    assert (entry.value, entry.is_default) == ("7200000", False)
    clients.assign_from(consumer, wide, [0, 1, 2])
    messages = clients.consume(consumer, 150)
    for p in range(3):
        got = [m for m in messages if m.partition() == p]
        assert_same(received(got), expected(wide_records[p]))

    # Appends go on from where the log ended before the restart.
    more = make_records(100, seed=600)
    producer = clients.producer(broker.bootstrap)
    reports = clients.produce_all(producer, topics[0], more)
    assert [e for e, _ in reports if e is not None] == []
    assert [m.offset() for _, m in reports] == list(range(N, N + 100))
    clients.assign_from(consumer, topics[0], [0], offset=N)
    assert_same(received(clients.consume(consumer, 100)), expected(more, first_offset=N))
