"""kafka-python producers and consumers against a real broker process.

Producers send synchronously enough to check every offset (`send(...).get(timeout)`);
consumers assign partitions and seek (no group: the broker does not serve consumer groups
yet). Every test checks the exact content and order of the records read back.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.records import recent_base_timestamp, varied_keys_and_values

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import OffsetOutOfRangeError

pytestmark = pytest.mark.timeout(60)

CODEC_IDS = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
# kafka-python compresses snappy through python-snappy, a test dependency.
CODECS: list[str | None] = [None, "gzip", "snappy", "lz4", "zstd"]
N = 2000
TIMEOUT = 15  # seconds, for each future and request


def make_records(count: int, seed: int, *, headers: bool = True) -> list[dict[str, Any]]:
    """KafkaProducer.send kwargs: varied keys and values (some null, some empty), recent
    explicit timestamps, and headers (a repeated name; some records without any)."""
    base_timestamp = recent_base_timestamp()
    records = []
    for i, (key, value) in enumerate(varied_keys_and_values(count, seed, "kafka-python")):
        record: dict[str, Any] = {
            "key": key,
            "value": value,
            "partition": 0,
            "timestamp_ms": base_timestamp + i,
        }
        if headers and i % 50 != 0:
            record["headers"] = [("seq", str(i).encode()), ("parity", bytes([i % 2]))]
            if i % 7 == 0:
                record["headers"].append(("seq", b"again"))
        records.append(record)
    return records


def expected(records: list[dict[str, Any]], first_offset: int = 0) -> list[tuple[Any, ...]]:
    return [
        (first_offset + i, r["key"], r["value"], r.get("headers") or [], r["timestamp_ms"], 0)
        for i, r in enumerate(records)
    ]


def received(records: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (r.offset, r.key, r.value, list(r.headers), r.timestamp, r.timestamp_type) for r in records
    ]


def assert_same(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"record {index} differs"


def send_all(producer: KafkaProducer, topic: str, records: list[dict[str, Any]]) -> list[int]:
    """The first few records one at a time (each send waits for its offset), the rest
    pipelined so the producer batches (and compresses) them; every offset, in send order."""
    offsets = [producer.send(topic, **r).get(timeout=TIMEOUT).offset for r in records[:10]]
    futures = [producer.send(topic, **r) for r in records[10:]]
    producer.flush(timeout=TIMEOUT * 2)
    offsets += [f.get(timeout=TIMEOUT).offset for f in futures]
    return offsets


def consume(consumer: KafkaConsumer, count: int, timeout: float = 30.0) -> list[Any]:
    records: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(records) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"received {len(records)} of {count} records in {timeout} s")
        for batch in consumer.poll(timeout_ms=500, max_records=500).values():
            records.extend(batch)
    return records


@pytest.fixture
def kafka_clients(module_broker) -> Iterator[dict[str, list[Any]]]:
    """Lists the test appends its clients to; they are closed at the end."""
    made: dict[str, list[Any]] = {"producers": [], "consumers": []}
    try:
        yield made
    finally:
        for producer in made["producers"]:
            producer.close(timeout=5)
        for consumer in made["consumers"]:
            consumer.close(autocommit=False)


def new_producer(broker: Any, made: dict[str, list[Any]], **config: Any) -> KafkaProducer:
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        enable_idempotence=False,  # the broker does not serve InitProducerId yet
        request_timeout_ms=TIMEOUT * 1000,
        **config,
    )
    made["producers"].append(producer)
    return producer


def new_consumer(
    broker: Any, made: dict[str, list[Any]], topic: str, partitions: list[int], **config: Any
) -> KafkaConsumer:
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        request_timeout_ms=TIMEOUT * 1000,
        **config,
    )
    made["consumers"].append(consumer)
    consumer.assign([TopicPartition(topic, p) for p in partitions])
    return consumer


def test_infers_broker_version_3_7(module_broker, kafka_clients):
    producer = new_producer(module_broker, kafka_clients)
    consumer = KafkaConsumer(bootstrap_servers=module_broker.bootstrap, group_id=None)
    kafka_clients["consumers"].append(consumer)
    assert producer.config["api_version"] == (3, 7)
    assert consumer.config["api_version"] == (3, 7)
    # And straight from an ApiVersions exchange with broker node 0.
    assert consumer._client.check_version(node_id=0, timeout_ms=TIMEOUT * 1000) == (3, 7)


@pytest.mark.parametrize("compression", CODECS, ids=lambda c: c or "none")
def test_round_trip(module_broker, kafka_clients, topic_name, compression):
    topic = topic_name(f"kp-{compression or 'none'}")
    records = make_records(N, seed=CODECS.index(compression))
    producer = new_producer(
        module_broker, kafka_clients, compression_type=compression, acks="all", linger_ms=10
    )
    assert send_all(producer, topic, records) == list(range(N))

    consumer = new_consumer(module_broker, kafka_clients, topic, [0])
    consumer.seek_to_beginning()
    assert_same(received(consume(consumer, N)), expected(records))
    tp = TopicPartition(topic, 0)
    assert consumer.end_offsets([tp], timeout_ms=TIMEOUT * 1000) == {tp: N}
    assert consumer.beginning_offsets([tp], timeout_ms=TIMEOUT * 1000) == {tp: 0}

    # The producer really compressed: the broker keeps batches as the producer sent them.
    # kafka-python sends a batch uncompressed when compressing would not shrink it (as for
    # the single-record batches of the synchronous sends), so most records, not all.
    batches = module_broker.stored_batches(topic)
    assert sum(count for _, count in batches) == N
    assert len(batches) < N / 10, "the producer hardly batched"
    codec_id = CODEC_IDS[compression]
    assert {c for c, _ in batches} <= {0, codec_id}
    compressed = sum(count for c, count in batches if c == codec_id)
    assert compressed >= 0.9 * N, f"only {compressed} of {N} records stored as {compression}"


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_acks(module_broker, kafka_clients, topic_name, acks):
    topic = topic_name(f"kp-acks{acks}")
    count = 300
    records = make_records(count, seed=50)
    producer = new_producer(module_broker, kafka_clients, acks=acks, linger_ms=5)
    offsets = send_all(producer, topic, records)
    if acks != 0:  # with acks=0 no response comes back: kafka-python makes offsets up
        assert offsets == list(range(count))

    consumer = new_consumer(module_broker, kafka_clients, topic, [0])
    consumer.seek_to_beginning()
    assert_same(received(consume(consumer, count)), expected(records))


def test_seek_to_the_middle(module_broker, kafka_clients, topic_name):
    topic = topic_name("kp-middle")
    records = make_records(1000, seed=60)
    producer = new_producer(
        module_broker, kafka_clients, compression_type="gzip", linger_ms=20, batch_size=16384
    )
    assert send_all(producer, topic, records) == list(range(1000))

    consumer = new_consumer(module_broker, kafka_clients, topic, [0])
    consumer.seek(TopicPartition(topic, 0), 500)
    assert_same(received(consume(consumer, 500)), expected(records[500:], first_offset=500))
    assert consumer.poll(timeout_ms=300) == {}


def test_seek_past_the_end(module_broker, kafka_clients, topic_name):
    topic = topic_name("kp-end")
    records = make_records(100, seed=65)
    assert send_all(new_producer(module_broker, kafka_clients), topic, records) == list(range(100))
    tp = TopicPartition(topic, 0)
    consumer = new_consumer(module_broker, kafka_clients, topic, [0], fetch_max_wait_ms=200)
    # At the log end: nothing to read, and no error.
    consumer.seek(tp, 100)
    assert consumer.poll(timeout_ms=600) == {}
    # Past it: OFFSET_OUT_OF_RANGE (auto_offset_reset is "none", so it reaches us).
    consumer.seek(tp, 150)
    deadline = time.monotonic() + TIMEOUT
    with pytest.raises(OffsetOutOfRangeError):
        while time.monotonic() < deadline:
            assert consumer.poll(timeout_ms=200) == {}
    # A record appended later is read from the end offset.
    later = make_records(1, seed=66)
    assert send_all(new_producer(module_broker, kafka_clients), topic, later) == [100]
    consumer.seek(tp, 100)
    assert_same(received(consume(consumer, 1)), expected(later, first_offset=100))


def test_legacy_message_format(module_broker, kafka_clients, topic_name):
    """A client that believes the broker is 0.10.1 produces magic-1 message sets (Produce
    v2) and fetches with Fetch v3, which the broker answers by converting; no headers."""
    topic = topic_name("kp-legacy")
    records = make_records(500, seed=70, headers=False)
    old = {"api_version": (0, 10, 1)}
    producer = new_producer(
        module_broker, kafka_clients, compression_type="gzip", linger_ms=10, **old
    )
    assert send_all(producer, topic, records) == list(range(500))

    consumer = new_consumer(module_broker, kafka_clients, topic, [0], **old)
    consumer.seek_to_beginning()
    assert_same(received(consume(consumer, 500)), expected(records))
    # The old versions were the ones used.
    requests = "directlog_broker_requests_total"
    assert module_broker.total(requests, api="produce", version="2") >= 1
    assert module_broker.total(requests, api="fetch", version="3") >= 1
