"""`python -m pipelines.traffic`: the sensors and the job together, then the delays.

    python -m pipelines.traffic --bootstrap 127.0.0.1:9092 --rate 400 --seconds 60
    python -m pipelines.traffic --workload burst --burst-every 10 --seconds 60
    python -m pipelines.traffic --rdma-consume --rdma-produce exclusive

Against a running cluster (`make run`): makes the four topics if they are missing
(`--partitions`, `--replication`), starts the job (job.py) on a local SparkSession from
the topics' current ends, so it reads this run's events only, waits until the query
waits for data, publishes the plan (sensors.py), waits until the job has processed
everything (processAllAvailable), stops it, reads this run's records of the delays topic
back and prints their percentiles, with one JSON line of every figure at the end.

The delays include the job's first micro-batches, when Spark starts its Python workers.
Windows whose end the watermark has not passed when the run stops are not written (the
next run's events would close them, were they in the same event time).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from pipelines.traffic.delays import Delay, summary
from pipelines.traffic.events import Plan
from pipelines.traffic.job import JobSettings, add_job_arguments, session, settings_from, start
from pipelines.traffic.sensors import (
    EventProducer,
    Published,
    add_plan_arguments,
    close_producer,
    make_producer,
    plan_from,
    publish,
    wall_ms,
)
from pipelines.traffic.topics import end_offsets, ensure_topics, read_since

READY_TIMEOUT = 120.0  # for the query to start and find no data yet


@dataclass(frozen=True, slots=True)
class RunResult:
    published: Published
    delays: list[Delay]  # this run's delay records, one per event the job read
    aggregates: int  # this run's records in the aggregates topic
    micro_batches: int


class Interrupted(Exception):
    """The run was asked to stop before the job had processed everything."""


def run(
    spark: SparkSession,
    settings: JobSettings,
    plan: Plan,
    producer: EventProducer,
    stopping: threading.Event | None = None,
) -> RunResult:
    """One run: the job started from the topics' ends, the plan published, the job
    stopped once it has processed all of it (and, through the no-data micro-batch after
    the last, closed the windows the final watermark passed). A failed query raises;
    `stopping`, once set, ends the run early with Interrupted."""
    topics = [
        settings.counts_topic,
        settings.speeds_topic,
        settings.aggregates_topic,
        settings.delays_topic,
    ]
    ends = end_offsets(settings.bootstrap, topics)
    settings = replace(
        settings,
        starting_offsets={t: ends[t] for t in (settings.counts_topic, settings.speeds_topic)},
    )
    stopping = stopping or threading.Event()
    query = start(spark, settings)
    try:
        _await_ready(query, stopping)
        published = publish(
            plan, producer, settings.counts_topic, settings.speeds_topic, stopping=stopping
        )
        _await_processed(query, stopping)
        progress = query.lastProgress
    finally:
        query.stop()
    failure = query.exception()
    if failure is not None:
        raise RuntimeError(f"the traffic job failed: {failure}")
    delays = [
        Delay.decode(v)
        for v in read_since(settings.bootstrap, settings.delays_topic, ends[settings.delays_topic])
    ]
    totals = read_since(
        settings.bootstrap, settings.aggregates_topic, ends[settings.aggregates_topic]
    )
    batches = int(progress["batchId"]) + 1 if progress else 0
    return RunResult(published, delays, len(totals), batches)


def _await_ready(query: StreamingQuery, stopping: threading.Event) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while query.status["message"] != "Waiting for data to arrive":
        if not query.isActive:
            raise RuntimeError(f"the traffic job stopped while starting: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the traffic job did not start within {READY_TIMEOUT} s")
        if stopping.wait(0.1):
            raise Interrupted


def _await_processed(query: StreamingQuery, stopping: threading.Event) -> None:
    """processAllAvailable, on a thread of its own so that `stopping` can end the wait
    (the caller then stops the query, which ends the call)."""
    failures: list[BaseException] = []

    def wait() -> None:
        try:
            query.processAllAvailable()
        except BaseException as error:  # handed to the caller's thread
            failures.append(error)

    waiter = threading.Thread(target=wait, name="traffic-process-all", daemon=True)
    waiter.start()
    while waiter.is_alive():
        if stopping.is_set():
            raise Interrupted
        waiter.join(0.2)
    if failures:
        raise failures[0]
    if stopping.is_set():
        raise Interrupted


def report(result: RunResult, plan: Plan) -> dict[str, Any]:
    """Print the run's figures; returns them."""
    done = result.published
    print(
        f"published {done.events} events in {done.seconds:.1f} s ({plan.workload}, "
        f"{plan.rate:g}/s, at worst {done.behind_ms:.0f} ms behind schedule)"
    )
    print(
        f"job: {result.micro_batches} micro-batches, {len(result.delays)} events read, "
        f"{result.aggregates} window aggregates written"
    )
    figures = summary(result.delays)
    if figures["count"]:
        print(
            "delay from creation to the job's read, ms: "
            + "  ".join(f"{k} {v:.0f}" for k, v in figures.items() if k != "count")
        )
    if len(result.delays) != done.events:
        print(f"warning: the job read {len(result.delays)} of {done.events} events")
    return {
        "workload": str(plan.workload),
        "rate": plan.rate,
        "events": done.events,
        "publish_seconds": round(done.seconds, 3),
        "behind_ms": round(done.behind_ms, 1),
        "micro_batches": result.micro_batches,
        "aggregates": result.aggregates,
        "delay_ms": figures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.traffic")
    add_plan_arguments(parser)
    add_job_arguments(parser)
    parser.add_argument("--partitions", type=int, default=2, help="of topics made here")
    parser.add_argument("--replication", type=int, default=1, help="of topics made here")
    parser.add_argument("--checkpoint", help="the query's checkpoint (default: a temporary one)")
    args = parser.parse_args(argv)
    try:
        plan_from(args, 0)  # the plan's arguments, checked before anything starts
    except ValueError as error:
        parser.error(str(error))
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="traffic-checkpoint-")
    settings = settings_from(args, checkpoint)
    # RDMA produce writes into preallocated head segments, and RDMA consume reads the head
    # only where it is preallocated: topics made here for either get them.
    rdma = args.rdma_produce != "off" or args.rdma_consume
    config = {"preallocate": "true"} if rdma else {}
    made = ensure_topics(
        args.bootstrap,
        [args.counts_topic, args.speeds_topic, args.aggregates_topic, args.delays_topic],
        args.partitions,
        args.replication,
        config,
    )
    if made:
        print(f"created topics {', '.join(made)}")
    spark = session(args.master, args.shuffle_partitions)
    # Ctrl-C sets a flag the run looks at; PySpark's own SIGINT handler would call into
    # the JVM from inside a call into the JVM.
    stopping = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stopping.set())
    producer = make_producer(args.bootstrap, args.rdma_produce)
    try:
        plan = plan_from(args, wall_ms())
        result = run(spark, settings, plan, producer, stopping)
    except Interrupted:
        print("interrupted: the job is stopped")
        return 130
    finally:
        close_producer(producer)
        spark.stop()
        if not args.checkpoint:
            shutil.rmtree(checkpoint, ignore_errors=True)
    print(json.dumps(report(result, plan)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
