"""What the Spark tests compare: rows of the directlog data source and messages of
confluent-kafka as the same plain `Record` tuples, reads of several option sets in one Spark
job, and the check that a refused read or write fails while Spark plans it.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import pytest
from confluent_kafka import Message
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

Header = tuple[str, bytes | None]

COLUMNS = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
    "timestamp:timestamp,timestampType:int"
)
SCHEMA = COLUMNS + ">"  # Spark's Kafka connector's schema, as simpleString() writes it
SCHEMA_WITH_HEADERS = COLUMNS + ",headers:array<struct<key:string,value:binary>>>"


class Record(NamedTuple):
    """One record: a row the data source read, a message confluent-kafka consumed, or what
    a test expects. `headers` is None for a read without includeHeaders."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    timestamp_type: int
    headers: tuple[Header, ...] | None = None


def load(spark: SparkSession, bootstrap: str, options: dict[str, str]) -> DataFrame:
    return (
        spark.read.format("directlog")
        .option("kafka.bootstrap.servers", bootstrap)
        .options(**options)
        .load()
    )


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _record(row: Row, with_headers: bool) -> Record:
    micros = row["timestamp_us"]
    assert micros % 1000 == 0, f"{micros} us: Kafka timestamps are whole milliseconds"
    headers = None
    if with_headers:
        # Spark's Kafka connector: a record without headers has null headers.
        assert row["headers"] is None or row["headers"], "no headers read as null, not []"
        headers = tuple((h["key"], _bytes(h["value"])) for h in row["headers"] or ())
    return Record(
        row["topic"],
        row["partition"],
        row["offset"],
        _bytes(row["key"]),
        _bytes(row["value"]),
        micros // 1000,
        row["timestampType"],
        headers,
    )


def read_cases(
    spark: SparkSession, bootstrap: str, cases: dict[str, dict[str, str]]
) -> dict[str, list[Record]]:
    """Each case's read (its options), all in one Spark job (a union tagged by case): the
    records of each, sorted by topic, partition and offset, checked to have come in offset
    order within each partition."""
    frames = [
        load(spark, bootstrap, options).withColumn("case", F.lit(name))
        for name, options in cases.items()
    ]
    kinds = {"headers" in frame.columns for frame in frames}
    assert len(kinds) == 1, "the cases of one union all read with headers or all without"
    with_headers = kinds.pop()
    union = functools.reduce(DataFrame.unionByName, frames)
    rows = union.withColumn("timestamp_us", F.unix_micros("timestamp")).collect()
    found: dict[str, list[Record]] = {name: [] for name in cases}
    for row in rows:
        found[row["case"]].append(_record(row, with_headers))
    for name, records in found.items():
        _check_offset_order(name, records)
        records.sort(key=lambda r: (r.topic, r.partition, r.offset))
    return found


def read_all(spark: SparkSession, bootstrap: str, options: dict[str, str]) -> list[Record]:
    return read_cases(spark, bootstrap, {"read": options})["read"]


def _check_offset_order(name: str, records: list[Record]) -> None:
    last: dict[tuple[str, int], int] = {}
    for record in records:
        tp = (record.topic, record.partition)
        assert record.offset > last.get(tp, -1), f"{name}: {tp} out of offset order"
        last[tp] = record.offset


def from_message(message: Message) -> Record:
    """A consumed message as a Record (headers as Spark gives them: () when none)."""
    kind, timestamp = message.timestamp()
    return Record(
        message.topic(),
        message.partition(),
        message.offset(),
        message.key(),
        message.value(),
        timestamp,
        kind - 1,  # confluent-kafka: 1 create time, 2 log append time; Spark: 0 and 1
        tuple(message.headers() or ()),
    )


def slice_of(
    records: Iterable[Record], ranges: dict[tuple[str, int], tuple[int, int]]
) -> list[Record]:
    """The records of each topic-partition in ranges, from its start up to its end
    (exclusive), sorted as read_cases sorts."""
    chosen = [
        r
        for r in records
        if (r.topic, r.partition) in ranges
        and ranges[(r.topic, r.partition)][0] <= r.offset < ranges[(r.topic, r.partition)][1]
    ]
    return sorted(chosen, key=lambda r: (r.topic, r.partition, r.offset))


def refused(spark: SparkSession, action: Callable[[], object]) -> str:
    """The OptionError message with which `action` (a read or write) fails while Spark
    plans it: no Spark job ran."""
    context = spark.sparkContext
    group = f"refused-{uuid.uuid4().hex}"
    context.setJobGroup(group, "a read or write the data source must refuse")
    try:
        with pytest.raises(AnalysisException) as caught:
            action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert caught.value.getCondition() == "PYTHON_DATA_SOURCE_ERROR", str(caught.value)
    assert list(context.statusTracker().getJobIdsForGroup(group)) == []
    found = re.search(r"directlog\.spark\.options\.OptionError: (.*)", str(caught.value))
    assert found is not None, f"not an OptionError: {caught.value}"
    return found.group(1)
