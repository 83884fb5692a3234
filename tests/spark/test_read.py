"""Batch reads of the `directlog` data source return exactly what confluent-kafka produced:
every column of every record (keys and values null, empty, binary; headers with repeated
names, null and empty values; timestamps to the millisecond; the timestamp type), in offset
order per partition, from uncompressed and gzip, lz4, zstd and snappy batches alike.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from tests.e2e.records import recent_base_timestamp, varied_keys_and_values
from tests.spark.frames import (
    SCHEMA,
    SCHEMA_WITH_HEADERS,
    Header,
    Record,
    from_message,
    load,
    read_all,
    read_cases,
    slice_of,
)

pytestmark = pytest.mark.timeout(180)

CODECS = ["none", "gzip", "lz4", "zstd", "snappy"]
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PARTITIONS = 3
PER_CODEC = 600

# A record produced without headers reads, with includeHeaders, as null (Spark's Kafka
# connector's rule; frames._record checks it is null, not an empty array).
NO_HEADERS: tuple[Header, ...] = ()


def headers_of(i: int, rng: random.Random) -> list[Header] | None:
    """No headers for every 7th record; otherwise repeated names, null, empty, binary and
    non-ASCII ones."""
    if i % 7 == 0:
        return None
    headers: list[Header] = [("seq", str(i).encode()), ("parity", b"odd" if i % 2 else b"even")]
    if i % 5 == 0:
        headers.append(("seq", b"repeated name"))
    if i % 11 == 0:
        headers.append(("null-value", None))
    if i % 13 == 0:
        headers.append(("empty", b""))
    if i % 17 == 0:
        headers.append(("bin\u00e4r-\u043a\u043b\u044e\u0447", rng.randbytes(24)))
    return headers


def produced(
    topic: str, count: int, seed: int, base_timestamp: int
) -> tuple[list[dict[str, Any]], list[Record]]:
    """Producer.produce kwargs of `count` records spread over the partitions round-robin,
    and the records a read must return (offsets dense from 0 in each partition)."""
    rng = random.Random(seed)
    kwargs: list[dict[str, Any]] = []
    want: list[Record] = []
    next_offset = [0] * PARTITIONS
    for i, (key, value) in enumerate(varied_keys_and_values(count, seed, topic)):
        partition = i % PARTITIONS
        timestamp = base_timestamp + 3 * i
        headers = headers_of(i, rng)
        record: dict[str, Any] = {
            "key": key,
            "value": value,
            "partition": partition,
            "timestamp": timestamp,
        }
        if headers is not None:
            record["headers"] = headers
        kwargs.append(record)
        want.append(
            Record(
                topic,
                partition,
                next_offset[partition],
                key,
                value,
                timestamp,
                0,
                tuple(headers) if headers else NO_HEADERS,
            )
        )
        next_offset[partition] += 1
    want.sort(key=lambda r: (r.topic, r.partition, r.offset))
    return kwargs, want


def inside_batches(batches: list[tuple[int, int]]) -> tuple[int, int]:
    """Offsets in the middle of the first and of the last batch of several records, from
    the (codec, record count) of a partition's stored batches."""
    bounds = []
    offset = 0
    for _, count in batches:
        if count > 1:
            bounds.append(offset + count // 2)
        offset += count
    assert len(bounds) >= 2, f"too few batches of several records: {batches}"
    return bounds[0], bounds[-1]


def test_read_equals_what_confluent_kafka_produced(spark, module_broker, clients, topic_name):
    bootstrap = module_broker.bootstrap
    topics = {codec: topic_name(codec) for codec in CODECS}
    base = recent_base_timestamp()
    want: list[Record] = []
    for seed, (codec, topic) in enumerate(topics.items()):
        clients.create_topic(bootstrap, topic, PARTITIONS)
        kwargs, expected = produced(topic, PER_CODEC, seed, base)
        producer = clients.producer(
            bootstrap,
            {"compression.type": codec, "linger.ms": 50, "batch.num.messages": 100, "acks": "all"},
        )
        reports = clients.produce_all(producer, topic, kwargs)
        assert [e for e, _ in reports if e is not None] == []
        delivered = sorted((m.partition(), m.offset(), m.key(), m.value()) for _, m in reports)
        assert delivered == [(r.partition, r.offset, r.key, r.value) for r in expected]
        want += expected
        # The producer really compressed (librdkafka sends a batch that would not shrink,
        # such as a straggler of one record, uncompressed).
        stored = [b for p in range(PARTITIONS) for b in module_broker.stored_batches(topic, p)]
        assert sum(count for _, count in stored) == PER_CODEC
        in_codec = sum(count for c, count in stored if c == CODEC_IDS[codec])
        assert in_codec > PER_CODEC // 2, f"{codec}: stored batches (codec, count) {stored}"
        assert {c for c, _ in stored} <= {0, CODEC_IDS[codec]}
    want.sort(key=lambda r: (r.topic, r.partition, r.offset))

    options = {"subscribe": ",".join(topics.values()), "includeHeaders": "true"}
    assert load(spark, bootstrap, options).schema.simpleString() == SCHEMA_WITH_HEADERS
    assert load(spark, bootstrap, {"subscribe": topics["none"]}).schema.simpleString() == SCHEMA
    # And a slice of each partition starting and ending inside (compressed) batches.
    cuts = {
        (topic, p): inside_batches(module_broker.stored_batches(topic, p))
        for topic in topics.values()
        for p in range(PARTITIONS)
    }
    starts: dict[str, dict[str, int]] = {}
    ends: dict[str, dict[str, int]] = {}
    for (topic, p), (start, end) in cuts.items():
        starts.setdefault(topic, {})[str(p)] = start
        ends.setdefault(topic, {})[str(p)] = end
    middle = {**options, "startingOffsets": json.dumps(starts), "endingOffsets": json.dumps(ends)}

    read = read_cases(spark, bootstrap, {"all": options, "middle": middle})

    got = read["all"]
    assert len(got) == len(want) == PER_CODEC * len(CODECS)
    for codec, topic in topics.items():
        mine = [r for r in got if r.topic == topic]
        expected = [r for r in want if r.topic == topic]
        for index, (g, w) in enumerate(zip(mine, expected, strict=True)):
            assert g == w, f"{codec}: record {index} differs"
    assert got == want
    assert read["middle"] == slice_of(want, cuts)
    assert any(r.key is None for r in got) and any(r.value is None for r in got)
    assert any(r.value == b"" for r in got) and any(r.headers == NO_HEADERS for r in got)


def test_log_append_time_topic_reads_timestamp_type_1(spark, module_broker, clients, topic_name):
    """The broker's append time replaces the producer's timestamps: the read gives
    timestampType 1 and the times a consumer sees, not the ones produced."""
    bootstrap = module_broker.bootstrap
    topic = topic_name("append-time")
    clients.create_topic(bootstrap, topic, 2, config={"message.timestamp.type": "LogAppendTime"})
    created = recent_base_timestamp()
    records = [
        {"key": b"k%d" % i, "value": b"v%d" % i, "partition": i % 2, "timestamp": created + i}
        for i in range(120)
    ]
    before = int(time.time() * 1000)
    producer = clients.producer(bootstrap, {"linger.ms": 20, "compression.type": "lz4"})
    reports = clients.produce_all(producer, topic, records)
    after = int(time.time() * 1000)
    assert [e for e, _ in reports if e is not None] == []

    consumer = clients.consumer(bootstrap)
    clients.assign_from(consumer, topic, [0, 1])
    consumed = sorted(
        (from_message(m) for m in clients.consume(consumer, len(records))),
        key=lambda r: (r.partition, r.offset),
    )
    want = [r._replace(headers=None) for r in consumed]

    got = read_all(spark, bootstrap, {"subscribe": topic})

    assert got == want
    assert {r.timestamp_type for r in got} == {1}
    assert all(before <= r.timestamp_ms <= after for r in got), (before, after)
    assert [(r.partition, r.offset, r.key) for r in got] == sorted(
        (i % 2, i // 2, b"k%d" % i) for i in range(120)
    )
