"""The `directlog` data source: Spark DataFrames from and to Directlog topics, with the
schema and options of Spark's Kafka connector, in Python (no jar)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from directlog.client import Producer
from directlog.spark.fetch import range_reads, read_range
from directlog.spark.offsets import Brokers, batch_ranges, split
from directlog.spark.options import (
    OptionError,
    ReadOptions,
    WriteOptions,
    include_headers,
    read_options,
    write_options,
)
from directlog.spark.stream import StreamReader

COLUMNS = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS = "headers array<struct<key: string, value: binary>>"
HEADER_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


class DirectlogSource(DataSource):
    """Register with `spark.dataSource.register(DirectlogSource)`, then
    `spark.read.format("directlog").option("kafka.bootstrap.servers", ...)`."""

    @classmethod
    def name(cls) -> str:
        return "directlog"

    def schema(self) -> str:
        return f"{COLUMNS}, {HEADERS}" if include_headers(self.options) else COLUMNS

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        _refuse_overwrite(overwrite)
        return BatchWriter(write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        _refuse_overwrite(overwrite)
        return StreamWriter(write_options(self.options), schema)


class BatchReader(DataSourceReader):
    """A batch read: its offset ranges are resolved here, on the driver, so a bad option
    or an offset the logs do not hold fails before any task runs."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        with Brokers(options.client) as brokers:
            partitions = brokers.partitions(options.subscription)
            ranges = batch_ranges(
                brokers,
                partitions,
                options.starting,
                options.ending,
                options.starting_by_timestamp_strategy,
                options.fail_on_data_loss,
            )
        self.ranges = split(ranges, options.min_partitions, options.max_records_per_partition)

    def partitions(self) -> list[InputPartition]:
        reads = range_reads(self.options, self.ranges)
        # Spark wants a partition even when nothing is to be read.
        return [InputPartition(r) for r in reads] or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition.value is not None:
            yield from read_range(partition.value)


@dataclass
class Written(WriterCommitMessage):
    records: int


class BatchWriter(DataSourceArrowWriter):
    """Rows to records through confluent-kafka's idempotent producer, as Spark's Kafka
    writer does: `value` (binary or string) and optional `key`, `topic` (or the `topic`
    option, which wins), `partition` and `headers` columns."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        _check_write_schema(schema, options.topic)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return Written(produce(self.options, iterator))


class StreamWriter(DataSourceStreamArrowWriter):
    """A streaming query's micro-batches, written as BatchWriter writes."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        _check_write_schema(schema, options.topic)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return Written(produce(self.options, iterator))


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:  # as Spark's Kafka writer: a log is only appended to
        raise OptionError("a topic cannot be overwritten: write with mode 'append'")


# One producer per Python worker and client configuration, as Spark's Kafka writer caches
# its producers: a new idempotent producer waits for its producer id (librdkafka's ~0.5 s)
# before its first record, which every task would pay.
_producers: dict[tuple[tuple[str, str], ...], Producer] = {}


def _producer(client: dict[str, str]) -> Producer:
    """The worker's producer for `client`. Keyed rows go to the partitions the Java producer
    (so Spark's Kafka writer) picks; directlog.client's Producer is confluent-kafka's, plus
    the RDMA datapath when the rdma.produce option asks for it (a flush and the worker's
    exit end it cleanly)."""
    config = {"partitioner": "murmur2_random", **client, "enable.idempotence": "true"}
    key = tuple(sorted(config.items()))
    producer = _producers.get(key)
    if producer is None:
        producer = _producers[key] = Producer(config)
    return producer


def produce(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> int:
    """Send every row of `batches`; returns how many, once all are acknowledged. A failed
    send fails the task (Spark retries it; the idempotent producer keeps one task's
    retries from duplicating what it sent)."""
    producer = _producer(options.client)
    failures: list[KafkaError] = []

    def delivered(error: KafkaError | None, _: Any) -> None:
        if error is not None:
            failures.append(error)

    sent = 0
    for batch in batches:
        columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        topics = columns.get("topic")
        for i, value in enumerate(columns["value"]):
            topic = options.topic or (topics[i] if topics else None)
            if not topic:
                raise ValueError(f"row {sent + i} has no topic (a null 'topic' column value)")
            extra: dict[str, Any] = {}
            if columns.get("partition") is not None and columns["partition"][i] is not None:
                extra["partition"] = columns["partition"][i]
            if columns.get("headers") and columns["headers"][i]:
                extra["headers"] = [(h["key"], h["value"]) for h in columns["headers"][i]]
            key = columns["key"][i] if "key" in columns else None
            producer.produce(topic, _bytes(value), _bytes(key), on_delivery=delivered, **extra)
            producer.poll(0)
        sent += batch.num_rows
        if failures:
            break
    producer.flush()
    if failures:
        raise RuntimeError(f"{len(failures)} records were not written: {failures[0]}")
    return sent


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


_WRITE_COLUMNS: dict[str, tuple[DataType, ...]] = {
    "key": (BinaryType(), StringType()),
    "value": (BinaryType(), StringType()),
    "topic": (StringType(),),
    "partition": (IntegerType(),),
    "headers": (HEADER_TYPE,),
}


def _check_write_schema(schema: StructType, topic_option: str | None) -> None:
    """The columns a write takes, checked before any task runs, as Spark's Kafka writer
    checks them."""
    names = {f.name: f for f in schema.fields}
    if "value" not in names:
        raise OptionError("a DataFrame written to directlog needs a 'value' column")
    if topic_option is None and "topic" not in names:
        raise OptionError("give the 'topic' option or a 'topic' column")
    for name, field in names.items():
        allowed = _WRITE_COLUMNS.get(name)
        if allowed is None:
            continue  # Spark's Kafka writer ignores other columns too
        if not any(_same_type(field.dataType, a) for a in allowed):
            kinds = " or ".join(a.simpleString() for a in allowed)
            raise OptionError(
                f"column {name!r} is {field.dataType.simpleString()}; it must be {kinds}"
            )


def _same_type(found: DataType, wanted: DataType) -> bool:
    if isinstance(wanted, ArrayType):
        return isinstance(found, ArrayType) and _same_type(found.elementType, wanted.elementType)
    if isinstance(wanted, StructType):
        return isinstance(found, StructType) and [
            (f.name, f.dataType.simpleString()) for f in found.fields
        ] == [(f.name, f.dataType.simpleString()) for f in wanted.fields]
    return type(found) is type(wanted)
