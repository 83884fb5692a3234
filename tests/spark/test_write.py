"""Writes to the `directlog` data source, read back with confluent-kafka: string and
binary keys and values (null ones too), the `partition` and `headers` columns, the `topic`
column and the `topic` option (which wins over the column), keyed rows placed by murmur2
as the Java producer (so Spark's Kafka writer) places them, and a streaming query's
micro-batches, resumed from its checkpoint.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from kafka.partitioner.default import murmur2
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.e2e.conftest import Clients
from tests.spark.frames import Header, Record, from_message

pytestmark = pytest.mark.timeout(120)

HEADERS = "array<struct<key:string,value:binary>>"


def save(frame: DataFrame, bootstrap: str, options: dict[str, str] | None = None) -> None:
    (
        frame.write.format("directlog")
        .option("kafka.bootstrap.servers", bootstrap)
        .options(**(options or {}))
        .mode("append")
        .save()
    )


def read_back(clients: Clients, bootstrap: str, partitions: dict[str, int]) -> list[Record]:
    """Every record of the topics' partitions (topic: partition count), checked to be all
    there is (the high watermarks), sorted by topic, partition and offset."""
    total = 0
    consumer = clients.consumer(bootstrap)
    assigned = [TopicPartition(t, p, -2) for t, count in partitions.items() for p in range(count)]
    for tp in assigned:
        low, high = consumer.get_watermark_offsets(tp, timeout=10)
        assert low == 0
        total += high
    consumer.assign(assigned)
    got = [from_message(m) for m in clients.consume(consumer, total)] if total else []
    return sorted(got, key=lambda r: (r.topic, r.partition, r.offset))


def unstamped(records: list[Record], before: int, after: int) -> list[Record]:
    """The records with their timestamps checked (create time, taken while writing) and
    zeroed, to compare with what was written."""
    for record in records:
        assert record.timestamp_type == 0
        assert before <= record.timestamp_ms <= after, (before, record, after)
    return [r._replace(timestamp_ms=0) for r in records]


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def test_write_strings_with_partition_and_headers_columns(
    spark, module_broker, clients, topic_name
):
    """One task (coalesce(1)), so each partition holds its rows in DataFrame order."""
    bootstrap = module_broker.bootstrap
    topic = topic_name("strings")
    clients.create_topic(bootstrap, topic, 3)
    rows: list[tuple[Any, ...]] = []
    for i in range(45):
        headers: list[Header] | None
        if i % 5 == 0:
            headers = None
        elif i % 5 == 1:
            headers = []
        else:
            headers = [("i", str(i).encode())]
            if i % 4 == 0:
                headers.append(("null", None))
            if i % 6 == 0:
                headers += [("dup", b"x"), ("dup", b""), ("\u00fc", b"\xff\x00")]
        key = None if i % 9 == 4 else f"key-{i}"
        rows.append((key, f"value {i} \u00e9\u4e2d", i % 3, headers))
    frame = spark.createDataFrame(
        rows, f"key string, value string, partition int, headers {HEADERS}"
    ).coalesce(1)

    before = int(time.time() * 1000)
    save(frame, bootstrap, {"topic": topic})
    after = int(time.time() * 1000)

    want: list[Record] = []
    for partition in range(3):
        mine = [r for r in rows if r[2] == partition]
        want += [
            Record(topic, partition, offset, _bytes(k), _bytes(v), 0, 0, tuple(h or ()))
            for offset, (k, v, _, h) in enumerate(mine)
        ]
    assert unstamped(read_back(clients, bootstrap, {topic: 3}), before, after) == want


def test_write_binary_topic_column_and_topic_option(spark, module_broker, clients, topic_name):
    """Two tasks write, so only the content is compared, not the order; the topic option
    sends every row to its topic, whatever the topic column says."""
    bootstrap = module_broker.bootstrap
    a, b, c = topic_name("column-a"), topic_name("column-b"), topic_name("option-c")
    for topic in (a, b, c):
        clients.create_topic(bootstrap, topic, 1)
    rng = random.Random(7)
    rows = [
        (
            None if i % 7 == 2 else rng.randbytes(rng.randint(0, 40)),
            None if i % 10 == 3 else b"v%d:" % i + rng.randbytes(rng.randint(0, 300)),
            a if i % 2 else b,
        )
        for i in range(60)
    ]
    frame = spark.createDataFrame(rows, "key binary, value binary, topic string").repartition(2)

    before = int(time.time() * 1000)
    save(frame, bootstrap)
    save(frame, bootstrap, {"topic": c})
    after = int(time.time() * 1000)

    got = unstamped(read_back(clients, bootstrap, {a: 1, b: 1, c: 1}), before, after)

    def content(topic: str, records: list[Record]) -> list[tuple[Any, ...]]:
        pairs = [(r.key, r.value) for r in records if r.topic == topic]
        assert [r.offset for r in records if r.topic == topic] == list(range(len(pairs)))
        assert {r.headers for r in records if r.topic == topic} <= {()}
        return sorted(pairs, key=repr)

    assert content(a, got) == sorted(((k, v) for k, v, t in rows if t == a), key=repr)
    assert content(b, got) == sorted(((k, v) for k, v, t in rows if t == b), key=repr)
    assert content(c, got) == sorted(((k, v) for k, v, _ in rows), key=repr)
    assert len(got) == 2 * len(rows)


def test_keyed_rows_go_to_the_java_clients_partition(spark, module_broker, clients, topic_name):
    bootstrap = module_broker.bootstrap
    topic = topic_name("keyed")
    clients.create_topic(bootstrap, topic, 4)
    rows = [(f"key{i}", f"value{i}") for i in range(40)]
    save(spark.createDataFrame(rows, "key string, value string"), bootstrap, {"topic": topic})

    got = read_back(clients, bootstrap, {topic: 4})

    assert sorted((r.key, r.value) for r in got) == sorted(
        (k.encode(), v.encode()) for k, v in rows
    )
    placed = {r.key: r.partition for r in got}
    java = {k.encode(): (murmur2(k.encode()) & 0x7FFFFFFF) % 4 for k, _ in rows}
    assert placed == java


def _add_file(directory: Path, name: str, lines: list[str], mtime: float) -> None:
    path = directory / name
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    os.utime(path, (mtime, mtime))  # the file source takes the oldest first


def _run_available_now(
    spark: SparkSession, source: Path, checkpoint: Path, bootstrap: str, topic: str, how: str
) -> int:
    """One availableNow run of the text files in `source` into `topic`; how many non-empty
    micro-batches it ran. Its checkpoint: with how="option", `checkpoint`, given as the
    writeStream option; with "query-name", `checkpoint` as the query's name under the
    session's spark.sql.streaming.checkpointLocation; with "session-conf", a directory of
    its own (a new one each run) under that setting."""
    lines = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(source))
    writer = (
        lines.select(F.concat(F.lit("k:"), "value").alias("key"), "value")
        .writeStream.format("directlog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .trigger(availableNow=True)
    )
    if how == "option":
        query = writer.option("checkpointLocation", str(checkpoint)).start()
    else:
        spark.conf.set("spark.sql.streaming.checkpointLocation", str(checkpoint.parent))
        try:
            query = (writer.queryName(checkpoint.name) if how == "query-name" else writer).start()
        finally:
            spark.conf.unset("spark.sql.streaming.checkpointLocation")
    try:
        assert query.awaitTermination(60), "the availableNow query did not finish in 60 s"
    finally:
        query.stop()
    assert query.exception() is None
    return sum(1 for p in query.recentProgress if p["numInputRows"] > 0)


def _lines(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    """Two text files (older first) in a new directory; a third to add later."""
    source = tmp_path / "in"
    source.mkdir()
    files = {
        "1.txt": [f"one {i}" for i in range(5)],
        "2.txt": [f"two {i} \u00e9" for i in range(4)],
        "3.txt": ["three 0", "", "three 2"],
    }
    now = time.time()
    _add_file(source, "1.txt", files["1.txt"], now - 30)
    _add_file(source, "2.txt", files["2.txt"], now - 20)
    return source, files


def _written(topic: str, lines: list[str]) -> list[Record]:
    return [
        Record(topic, 0, offset, f"k:{line}".encode(), line.encode(), 0, 0, ())
        for offset, line in enumerate(lines)
    ]


@pytest.mark.parametrize("how", ["option", "query-name"])
def test_streaming_write_resumes_from_its_checkpoint(
    spark, module_broker, clients, topic_name, tmp_path, how
):
    bootstrap = module_broker.bootstrap
    topic = topic_name("stream")
    clients.create_topic(bootstrap, topic, 1)
    source, files = _lines(tmp_path)
    checkpoint = tmp_path / "checkpoints" / "stream_query"

    assert _run_available_now(spark, source, checkpoint, bootstrap, topic, how) == 2
    _add_file(source, "3.txt", files["3.txt"], time.time() - 10)
    # Restarted from the checkpoint: only the new file is written.
    assert _run_available_now(spark, source, checkpoint, bootstrap, topic, how) == 1

    lines = [line for name in ("1.txt", "2.txt", "3.txt") for line in files[name]]
    got = read_back(clients, bootstrap, {topic: 1})
    assert [r._replace(timestamp_ms=0) for r in got] == _written(topic, lines)


def test_streaming_write(spark, module_broker, clients, topic_name, tmp_path):
    """Two micro-batches (a file each), checkpointed where the session's setting says."""
    bootstrap = module_broker.bootstrap
    topic = topic_name("stream")
    clients.create_topic(bootstrap, topic, 1)
    source, files = _lines(tmp_path)
    checkpoint = tmp_path / "checkpoints" / "unused"

    assert _run_available_now(spark, source, checkpoint, bootstrap, topic, "session-conf") == 2

    lines = files["1.txt"] + files["2.txt"]
    got = read_back(clients, bootstrap, {topic: 1})
    assert [r._replace(timestamp_ms=0) for r in got] == _written(topic, lines)
    assert {r.timestamp_type for r in got} == {0}
