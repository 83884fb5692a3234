"""The streaming job: counts and speeds joined per lane and measurement time, totalled per
location over event-time windows, and every event's delay, all through directlog.spark.

    python -m pipelines.traffic.job --bootstrap 127.0.0.1:9092 --checkpoint /tmp/traffic

One Structured Streaming query (append mode) over two `directlog` sources:

1. Each topic's JSON values are parsed (events.py); events whose location, lane, time or
   measure is missing or malformed are left out of the join.
2. Counts and speeds, both with a watermark `watermark` behind their event time, are
   joined (inner, stream-stream) on location, lane and event time: one row per
   measurement that has both its events.
3. The joined rows are grouped per location and tumbling `window` of event time, and each
   window, once the watermark has passed its end, becomes one JSON record in the
   aggregates topic, keyed by location:

       {"location":"loc-003","window_start":1700000000000,"window_end":1700000010000,
        "measurements":200,"cars":3021,"avg_speed":86.93}

   `measurements` counts the joined lane measurements, `cars` sums their counts and
   `avg_speed` is the cars' mean speed: sum(cars * speed) / sum(cars) as a double
   (null when no car passed). Times are epoch ms, `window_end` exclusive.
4. Every event read, count or speed, becomes one JSON record in the delays topic:

       {"topic":"traffic-counts","partition":1,"offset":4711,"created":1700000000213,
        "read":1700000000391,"delay_ms":178}

   `read` is the wall clock when the task that read the event had its row: taken per row
   in the JVM (java_method System.currentTimeMillis, which Spark evaluates row by row, not
   once per micro-batch as current_timestamp()), right after the source's reader handed
   the row over. So `delay_ms` = read - created is the paper's delay from the sensor to
   the processing engine, at millisecond resolution, and it includes how the records
   were read: over TCP fetches, or over RDMA with `rdma_consume` (--rdma-consume).

The two outputs leave through one directlog streaming writer: the rows of both carry
their `topic` column. Each source is therefore scanned twice per micro-batch (once for
the join, once for the delays; same offsets, same batch time). The output is coalesced
to one writer task per micro-batch: directlog.spark's writer starts an idempotent
producer in each task, and librdkafka takes about 0.5 s to get its producer id.

The watermark delay has to cover how far apart in event time two partitions of one topic
can be where a micro-batch cuts them: events older than the watermark are dropped by the
join. (The two topics may be cut apart freely: the query's watermark is the minimum over
its sources.) Each partition is in event-time order, but with the burst workload a whole
burst (`burst_every` of event time) can be in one partition and not yet in another, hence
the default of 15 s against the default 10 s bursts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from directlog.spark import DirectlogSource
from pipelines.traffic.events import AGGREGATES_TOPIC, COUNTS_TOPIC, DELAYS_TOPIC, SPEEDS_TOPIC

# What the job reads of each event; anything else in the JSON is ignored.
COUNT_SCHEMA = "location STRING, lane INT, time LONG, cars INT, created LONG"
SPEED_SCHEMA = "location STRING, lane INT, time LONG, speed INT, created LONG"

# The wall clock in ms, evaluated row by row where the rows are (non-deterministic).
READ_CLOCK = "cast(java_method('java.lang.System', 'currentTimeMillis') as long)"

# Per topic: "earliest", "latest", or the offset of every partition.
StartingOffsets = str | Mapping[str, Mapping[int, int]]


@dataclass(frozen=True, slots=True)
class JobSettings:
    bootstrap: str
    checkpoint: str
    counts_topic: str = COUNTS_TOPIC
    speeds_topic: str = SPEEDS_TOPIC
    aggregates_topic: str = AGGREGATES_TOPIC
    delays_topic: str = DELAYS_TOPIC
    window: str = "10 seconds"
    watermark: str = "15 seconds"
    starting_offsets: StartingOffsets = "latest"
    rdma_consume: bool = False  # the sources read over RDMA (directlog.spark's rdma.consume)

    def starting_for(self, topic: str) -> str:
        """The startingOffsets option of one source (it names only that topic)."""
        if isinstance(self.starting_offsets, str):
            return self.starting_offsets
        offsets = self.starting_offsets[topic]
        return json.dumps({topic: {str(p): o for p, o in sorted(offsets.items())}})


def session(master: str = "local[*]", shuffle_partitions: int = 2) -> SparkSession:
    """A SparkSession for the job, with DirectlogSource registered. Spark's Python workers
    run this interpreter (PYSPARK_PYTHON, unless set), which has directlog."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName("directlog-traffic")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # The join's and the windows' state is per shuffle partition: few, for latency.
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.adaptive.enabled", "false")  # not for stateful streaming anyway
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(DirectlogSource)
    return spark


def events(spark: SparkSession, settings: JobSettings, topic: str, schema: str) -> DataFrame:
    """One topic's events, parsed: its record's topic, partition and offset, the JSON's
    fields, and `read`, the epoch ms at which the job had the row."""
    reader = (
        spark.readStream.format("directlog")
        .option("kafka.bootstrap.servers", settings.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", settings.starting_for(topic))
        .option("rdma.consume", str(settings.rdma_consume).lower())
    )
    return reader.load().select(
        "topic",
        "partition",
        "offset",
        F.from_json(F.col("value").cast("string"), schema).alias("event"),
        F.expr(READ_CLOCK).alias("read"),
    )


def measures(frame: DataFrame, measure: str, watermark: str) -> DataFrame:
    """The well-formed events of one topic, keyed for the join, with their watermark."""
    return (
        frame.where(
            F.col("event.location").isNotNull()
            & F.col("event.lane").isNotNull()
            & F.col("event.time").isNotNull()
            & F.col(f"event.{measure}").isNotNull()
        )
        .select(
            F.col("event.location").alias("location"),
            F.col("event.lane").alias("lane"),
            F.timestamp_millis(F.col("event.time")).alias("event_time"),
            F.col(f"event.{measure}").alias(measure),
        )
        .withWatermark("event_time", watermark)
    )


def aggregates(counts: DataFrame, speeds: DataFrame, settings: JobSettings) -> DataFrame:
    """Per location and window: the joined measurements, their cars, the cars' mean speed."""
    c = measures(counts, "cars", settings.watermark).alias("c")
    s = measures(speeds, "speed", settings.watermark).alias("s")
    joined = c.join(
        s,
        (F.col("c.location") == F.col("s.location"))
        & (F.col("c.lane") == F.col("s.lane"))
        & (F.col("c.event_time") == F.col("s.event_time")),
        "inner",
    ).select(
        F.col("c.location").alias("location"),
        F.col("c.event_time").alias("event_time"),
        F.col("c.cars").alias("cars"),
        F.col("s.speed").alias("speed"),
    )
    return (
        joined.groupBy(F.window("event_time", settings.window).alias("window"), "location")
        .agg(
            F.count(F.lit(1)).alias("measurements"),
            F.sum("cars").alias("cars"),
            F.sum(F.col("cars").cast("long") * F.col("speed")).alias("car_speed"),
        )
        .select(
            "location",
            F.unix_millis(F.col("window.start")).alias("window_start"),
            F.unix_millis(F.col("window.end")).alias("window_end"),
            "measurements",
            "cars",
            # Exact integers to doubles, one correctly rounded division; null for no cars.
            F.try_divide(F.col("car_speed").cast("double"), F.col("cars").cast("double")).alias(
                "avg_speed"
            ),
        )
    )


def delays(counts: DataFrame, speeds: DataFrame) -> DataFrame:
    """One row per event read (both topics): where it was, when it was created and read."""
    columns: list[Column | str] = [
        "topic",
        "partition",
        "offset",
        F.col("event.created").alias("created"),
        "read",
    ]
    return (
        counts.select(*columns)
        .unionByName(speeds.select(*columns))
        .where(F.col("created").isNotNull())
        .withColumn("delay_ms", F.col("read") - F.col("created"))
    )


def _as_json(*columns: str | Column) -> Column:
    return F.to_json(F.struct(*columns), {"ignoreNullFields": "false"})


def output(spark: SparkSession, settings: JobSettings) -> DataFrame:
    """The job's output rows (topic, key, value), both kinds, for the directlog writer."""
    counts = events(spark, settings, settings.counts_topic, COUNT_SCHEMA)
    speeds = events(spark, settings, settings.speeds_topic, SPEED_SCHEMA)
    totals = aggregates(counts, speeds, settings)
    per_event = delays(counts, speeds)
    both = totals.select(
        F.lit(settings.aggregates_topic).alias("topic"),
        F.col("location").alias("key"),
        _as_json(*totals.columns).alias("value"),
    ).unionByName(
        per_event.select(
            F.lit(settings.delays_topic).alias("topic"),
            F.lit(None).cast("string").alias("key"),
            _as_json(*per_event.columns).alias("value"),
        )
    )
    # One writer task a micro-batch: directlog.spark's writer starts an idempotent
    # producer in every task, and librdkafka takes about 0.5 s to get its producer id.
    return both.coalesce(1)


def start(spark: SparkSession, settings: JobSettings) -> StreamingQuery:
    """Start the job, its micro-batches back to back (Spark's default trigger)."""
    return (
        output(spark, settings)
        .writeStream.format("directlog")
        .queryName("traffic")
        .option("kafka.bootstrap.servers", settings.bootstrap)
        .option("checkpointLocation", settings.checkpoint)
        .outputMode("append")
        .start()
    )


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The job's options, shared with `python -m pipelines.traffic`."""
    parser.add_argument("--aggregates-topic", default=AGGREGATES_TOPIC)
    parser.add_argument("--delays-topic", default=DELAYS_TOPIC)
    parser.add_argument("--window", default="10 seconds", help="tumbling event-time window")
    parser.add_argument(
        "--watermark", default="15 seconds", help="how late (event time) an event may come"
    )
    parser.add_argument("--master", default="local[*]", help="Spark master")
    parser.add_argument("--shuffle-partitions", type=int, default=2)
    parser.add_argument(
        "--rdma-consume",
        action="store_true",
        help="read the topics over the brokers' RDMA consume datapath (rdma.consume)",
    )


def settings_from(args: argparse.Namespace, checkpoint: str) -> JobSettings:
    """JobSettings from the parsed options (add_job_arguments' and the topics')."""
    return JobSettings(
        bootstrap=args.bootstrap,
        checkpoint=checkpoint,
        counts_topic=args.counts_topic,
        speeds_topic=args.speeds_topic,
        aggregates_topic=args.aggregates_topic,
        delays_topic=args.delays_topic,
        window=args.window,
        watermark=args.watermark,
        starting_offsets=getattr(args, "starting_offsets", "latest"),
        rdma_consume=args.rdma_consume,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.traffic.job")
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    parser.add_argument("--counts-topic", default=COUNTS_TOPIC)
    parser.add_argument("--speeds-topic", default=SPEEDS_TOPIC)
    parser.add_argument(
        "--starting-offsets",
        choices=["earliest", "latest"],
        default="latest",
        help="where a new query starts (a checkpointed one goes on where it stopped)",
    )
    add_job_arguments(parser)
    args = parser.parse_args(argv)
    settings = settings_from(args, args.checkpoint)
    spark = session(args.master, args.shuffle_partitions)
    # PySpark's own SIGINT handler calls into the JVM from inside a call into the JVM
    # (awaitTermination): a flag, checked every second, stops the query instead.
    stopping = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stopping.set())
    try:
        query = start(spark, settings)
        print(f"traffic job running (checkpoint {settings.checkpoint}); Ctrl-C stops it")
        while not stopping.is_set() and not query.awaitTermination(1):
            pass
        query.stop()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
