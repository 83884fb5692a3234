"""A batch read through directlog.spark against a plain confluent-kafka consumer loop.

    python -m bench.spark [--quick] [--rounds N]

Issue 24's first benchmark (the second, the traffic pipeline's event delay over TCP and
RDMA consume, is bench/traffic_delays.py). One topic of 6 million 100-byte records (1 million with
--quick) over 4 partitions, no key, uncompressed, written once by confluent-kafka with the
Java producer's 16 KiB batches, on a one-broker Directlog cluster (tests/e2e/cluster.py: a
consensus member, the controller and the broker as subprocesses on free loopback ports),
read from start to end by

* spark: `spark.read.format("directlog")` (directlog.spark) on a `local[2]` SparkSession,
  `select(count(1), sum(length(value)))`: every row leaves a Python worker's reader as
  Arrow, crosses to the JVM and has its value's length taken there, while one row comes
  back to the driver, so Python's collect bounds nothing. A fresh DataFrame each pass:
  the offsets are resolved (in a Python planning worker) inside the timed part.
* spark_count: `df.count()` on a fresh DataFrame, a pass of its own. A Python data source
  gets neither column pruning nor count push-down, so count() too reads every row through
  the readers and into the JVM; checked, not assumed: the broker's records-sent counter
  (directlog_broker_records_out_total) must grow by the topic's records in every pass of
  every side, and the Python workers' CPU is reported beside it.
* confluent: a confluent-kafka Consumer (librdkafka; assign() at the beginning, no group
  coordination, `fetch.queue.backoff.ms` 5 as in bench.broker, otherwise its defaults) in
  a Python loop of `consume(num_messages=10000)` calls taking `len(message.value())` of
  every message, until it has the topic's records; timed from the Consumer's creation.

Each pass's count and value bytes must equal what was produced. The three run in rounds
(5; 3 with --quick), the order alternating (spark, spark_count, confluent; then the
reverse), so all share the machine's noise; the figures are medians of the rounds and the
ratio spark/confluent is also given round by round. Goal: spark at least 1.0x confluent in
records/s.

Not timed: the SparkSession's start-up (one session for the run; its time is reported)
and a first read on each side, which checks content: per partition the count, the first
and last offset and the sum of the values' CRC-32s (Spark's crc32(), zlib's here) against
the producer's. Then 4 untimed Spark passes (sum, count, sum, count) warm the JVM's JIT
and start the Python workers Spark keeps (`spark.python.worker.reuse`); each one's time
and JIT compiler cores are reported. Also reported, outside the goal: a Spark read of 1000
records a partition (what any read costs: planning, job, tasks; a pass's figure includes
it once), and directlog.spark's reader alone in this process (read_range over every
partition in turn, no Spark: what one Python worker's reader does with a core of its own).
glibc keeps freed memory for reuse (bench.processes.keep_freed_heap) in this process and,
through MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_, in Spark's JVM and workers.

What bounds a figure: for each pass, the cores each process group kept busy (utime+stime
from /proc; a dead child's time counts in its parent's cutime+cstime): this process (the
driver, or the confluent loop and librdkafka's threads), Spark's JVM, Spark's Python
workers (every process under the JVM), the broker and the rest of the cluster; the
machine's busy cores (/proc/stat) and `outside`, the busy cores none of ours took (other
work on the machine: a figure with much of it is noise, and a warning says so); this
process's main thread and the busiest Python worker; the JVM's JIT compiler threads and
busiest thread groups. `bound` names what ran out: the machine's cores (the broker, the
JVM and two Python workers share them), one thread's core, or neither. On 2 cores
(profiled with py-spy and JFR while this was written) a warm Spark pass keeps both busy:
about half in the JVM (every Arrow row copied into an UnsafeRow, all seven columns, as no
column is pruned, with Arrow's bounds checks and DSv2 metrics per row), most of the rest
in the Python workers (directlog.spark's fetch and record_columns, Arrow IPC to the JVM,
Spark's gc.collect() after each task), a little in the broker. The confluent loop is one
Python thread near its core, and leaves the other core mostly idle.

The output closes with one JSON line holding every figure and the goal; the same JSON is
written to bench/results/spark.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.down_conversion import broker_source
from bench.processes import CLOCK_TICKS, keep_freed_heap, print_goals, save_results
from directlog.spark import DirectlogSource
from directlog.spark.fetch import RangeRead, read_range
from tests.e2e.cluster import Cluster, wait_for

TOPIC = "reads"
PARTITIONS = 4
VALUE_BYTES = 100
CONSUME_CALL = 10_000  # messages asked of one Consumer.consume call
SMALL_READ = 1000  # records a partition, for the fixed cost of a Spark read
PRODUCER = {
    "acks": 1,
    "linger.ms": 5,
    "batch.size": 16384,  # the Java producer's default
    "compression.type": "none",
    "queue.buffering.max.kbytes": 64 * 1024,
}
SPARK = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
}
MALLOC_ENVIRONMENT = {  # bench.processes.keep_freed_heap's mallopt() values
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
}
TIMEOUT = 600.0
GOAL_RATIO = 1.0
JVM_THREAD_GROUPS = 6  # the busiest, reported for each pass
WARM_PASSES = 4  # untimed Spark passes before the rounds: sum, count, sum, count
OUTSIDE_WARNING_CORES = 0.25


class BenchError(Exception):
    pass


@dataclass(frozen=True)
class Sizes:
    records: int  # in all, over the partitions
    rounds: int


FULL = Sizes(records=6_000_000, rounds=5)
QUICK = Sizes(records=1_000_000, rounds=3)


# Data --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contents:
    """What a partition holds: records, first and last offset, the sum of the values'
    CRC-32s."""

    records: int
    first: int
    last: int
    crc_sum: int


def value_of(index: int, pad: bytes) -> bytes:
    """A distinct 100-byte value: its index, then the run's random pad."""
    return index.to_bytes(8, "big") + pad


def create(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = {"retention.ms": "-1", "retention.bytes": "-1"}
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, config=configs)])[TOPIC].result(60)

    def led() -> bool:
        found = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions.values()
        return sum(1 for p in found if p.leader >= 0 and p.error is None) == PARTITIONS

    wait_for(led, 60, f"{TOPIC}'s leaders")


def produce(bootstrap: str, records: int) -> tuple[dict[int, Contents], float]:
    """`records` distinct values round robin over the partitions, every one acknowledged;
    returns what each partition then holds and the records/s of the writing."""
    pad = os.urandom(VALUE_BYTES - 8)
    acked = [0] * PARTITIONS
    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))
        else:
            acked[message.partition()] += 1

    client = Producer({"bootstrap.servers": bootstrap, **PRODUCER, "on_delivery": delivered})
    crc_sums = [0] * PARTITIONS
    started = time.perf_counter()
    for i in range(records):
        value = value_of(i, pad)
        partition = i % PARTITIONS
        crc_sums[partition] += zlib.crc32(value)
        while True:
            try:
                client.produce(TOPIC, value, partition=partition)
                break
            except BufferError:
                client.poll(0.005)
        if i % 1000 == 0:
            client.poll(0)
    if client.flush(TIMEOUT):
        raise BenchError("sends left unacknowledged")
    seconds = time.perf_counter() - started
    expected = [records // PARTITIONS + (p < records % PARTITIONS) for p in range(PARTITIONS)]
    if failures or acked != expected:
        raise BenchError(f"{acked} acknowledged of {expected}, {failures[:1]}")
    contents = {
        p: Contents(expected[p], 0, expected[p] - 1, crc_sums[p]) for p in range(PARTITIONS)
    }
    return contents, records / seconds


# CPU accounting ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """CPU seconds so far by process group, by JVM thread group, of single threads (this
    process's main thread, each Python worker's own), and the machine's busy CPU seconds,
    at `at` (perf_counter)."""

    at: float
    groups: dict[str, float]
    jvm_threads: dict[str, float]
    singles: dict[str, float]
    machine: float


def _stat(path: str) -> tuple[str, list[str]] | None:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    head, _, tail = text.rpartition(")")
    return head.partition("(")[2], tail.split()


def _thread_group(name: str) -> str:
    """A JVM thread's name (its first 15 characters) without its number."""
    return re.sub(r"[#\-\s]*\d+$", "", name).strip() or name


class Processes:
    """This process's tree, grouped: `this_process` (the driver or the confluent loop),
    `spark_jvm`, `spark_python_workers` (every process under the JVM), `broker` and
    `cluster_other` (the consensus member and the controller)."""

    def __init__(self, broker_pid: int) -> None:
        self.broker_pid = broker_pid

    def usage(self) -> Usage:
        at = time.perf_counter()
        parents: dict[int, int] = {}
        own: dict[int, float] = {}  # utime + stime
        reaped: dict[int, float] = {}  # cutime + cstime: its children that ended
        names: dict[int, str] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            found = _stat(f"/proc/{entry}/stat")
            if found is None:
                continue
            name, fields = found
            pid = int(entry)
            parents[pid] = int(fields[1])
            names[pid] = name
            own[pid] = _ticks(fields[11:13])
            reaped[pid] = _ticks(fields[13:15])
        me = os.getpid()
        groups = dict.fromkeys(
            ("this_process", "spark_jvm", "spark_python_workers", "broker", "cluster_other"), 0.0
        )
        jvm = None
        singles = {"main_thread": _own(me, me)}
        for pid in own:
            group = self._group(pid, me, parents, names)
            if group is None:
                continue
            # A process that ends mid-pass moves into its parent's reaped time, so a
            # group's sum never drops: a Python worker's into its daemon's, a daemon's
            # into the JVM's, counted with the workers. This process's children are the
            # cluster's and the JVM, which outlive every pass.
            if group == "this_process":
                groups[group] += own[pid]
            elif group == "spark_jvm":
                groups[group] += own[pid]
                groups["spark_python_workers"] += reaped[pid]
                jvm = pid
            else:
                groups[group] += own[pid] + reaped[pid]
            if group == "spark_python_workers":
                singles[f"worker {pid}"] = own[pid]
        threads: dict[str, float] = {}
        if jvm is not None:
            for tid in os.listdir(f"/proc/{jvm}/task"):
                found = _stat(f"/proc/{jvm}/task/{tid}/stat")
                if found is not None:
                    key = _thread_group(found[0])
                    threads[key] = threads.get(key, 0.0) + _ticks(found[1][11:13])
        with open("/proc/stat") as file:
            cpu = [int(x) for x in file.readline().split()[1:9]]
        machine = (sum(cpu) - cpu[3] - cpu[4]) / CLOCK_TICKS  # all but idle and iowait
        return Usage(at, groups, threads, singles, machine)

    def _group(
        self, pid: int, me: int, parents: dict[int, int], names: dict[int, str]
    ) -> str | None:
        if pid == me:
            return "this_process"
        if pid == self.broker_pid:
            return "broker"
        chain = []
        at = parents.get(pid, 0)
        while at > 1 and at != me:
            chain.append(at)
            at = parents.get(at, 0)
        if at != me:
            return None  # not ours
        if names[pid] == "java":
            return "spark_jvm"
        if any(names.get(p) == "java" for p in chain):
            return "spark_python_workers"
        if self.broker_pid in chain:
            return "broker"
        return "cluster_other"


def _ticks(fields: list[str]) -> float:
    return sum(int(f) for f in fields) / CLOCK_TICKS


def _own(pid: int, tid: int | None = None) -> float:
    """A process's own CPU time, not its reaped children's; with `tid`, one thread's."""
    found = _stat(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat")
    return 0.0 if found is None else _ticks(found[1][11:13])


@dataclass(frozen=True)
class Cores:
    """Cores busy between two samples."""

    groups: dict[str, float]  # by process group, and `outside`: the machine's busy cores
    # that none of ours took (other work on this machine)
    jvm_threads: dict[str, float]  # by JVM thread group
    singles: dict[str, float]  # this process's main thread; the busiest Python worker
    machine: float


def cores(before: Usage, after: Usage) -> Cores:
    wall = after.at - before.at

    def rate(now: dict[str, float], then: dict[str, float]) -> dict[str, float]:
        return {k: (v - then.get(k, 0.0)) / wall for k, v in now.items()}

    groups = rate(after.groups, before.groups)
    machine = (after.machine - before.machine) / wall
    groups["outside"] = max(0.0, machine - sum(groups.values()))
    threads = rate(after.jvm_threads, before.jvm_threads)
    singles = rate(after.singles, before.singles)
    workers = [v for k, v in singles.items() if k.startswith("worker")]
    return Cores(
        {k: round(v, 2) for k, v in groups.items()},
        {k: round(v, 3) for k, v in threads.items() if v >= 0.0005},
        {
            "main_thread": round(singles["main_thread"], 2),
            "python_worker_max": round(max(workers, default=0.0), 2),
        },
        round(machine, 2),
    )


def jit_cores(threads: dict[str, float]) -> float:
    """The JVM's JIT compiler threads' share of `threads` (C1 and C2 CompilerThreadN)."""
    return round(sum(v for k, v in threads.items() if "CompilerThre" in k), 2)


def busiest(threads: dict[str, float]) -> dict[str, float]:
    return dict(sorted(threads.items(), key=lambda kv: -kv[1])[:JVM_THREAD_GROUPS])


# The two sides -----------------------------------------------------------------------------


def start_spark() -> SparkSession:
    """The run's one SparkSession, local[2], DirectlogSource registered; Spark's Python
    workers run this interpreter (the venv's)."""
    builder = SparkSession.builder.master("local[2]").appName("bench-spark")
    for key, value in SPARK.items():
        builder = builder.config(key, value)
    # The JVM and the Python workers it starts inherit this environment: glibc takes
    # keep_freed_heap's thresholds from it, so Spark's processes allocate as the
    # confluent loop in this process does.
    environment = dict(os.environ)
    os.environ.update(
        PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", **MALLOC_ENVIRONMENT
    )
    try:
        session = builder.getOrCreate()
    finally:
        os.environ.clear()
        os.environ.update(environment)
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(DirectlogSource)
    return session


def frame(spark: SparkSession, bootstrap: str, **options: str) -> DataFrame:
    reader = spark.read.format("directlog").option("kafka.bootstrap.servers", bootstrap)
    for key, value in {"subscribe": TOPIC, **options}.items():
        reader = reader.option(key, value)
    return reader.load()


def spark_sum(spark: SparkSession, bootstrap: str) -> tuple[int, int]:
    """(rows, value bytes) of the whole topic, aggregated in the JVM."""
    (row,) = frame(spark, bootstrap).select(F.count(F.lit(1)), F.sum(F.length("value"))).collect()
    return int(row[0]), int(row[1] or 0)


def spark_count(spark: SparkSession, bootstrap: str) -> tuple[int, int]:
    """(rows, value bytes the topic must hold) by df.count()."""
    rows = int(frame(spark, bootstrap).count())
    return rows, rows * VALUE_BYTES


def spark_contents(spark: SparkSession, bootstrap: str) -> dict[int, Contents]:
    """Per partition: rows, first and last offset, the sum of the values' CRC-32s."""
    rows = (
        frame(spark, bootstrap)
        .groupBy("partition")
        .agg(F.count(F.lit(1)), F.min("offset"), F.max("offset"), F.sum(F.crc32("value")))
        .collect()
    )
    return {int(r[0]): Contents(int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows}


def spark_small_read(spark: SparkSession, bootstrap: str) -> float:
    """Seconds of a read of SMALL_READ records a partition: what every read costs."""
    ending = json.dumps({TOPIC: {str(p): SMALL_READ for p in range(PARTITIONS)}})
    started = time.perf_counter()
    (row,) = frame(spark, bootstrap, endingOffsets=ending).select(F.count(F.lit(1))).collect()
    seconds = time.perf_counter() - started
    if int(row[0]) != SMALL_READ * PARTITIONS:
        raise BenchError(f"small read: {row[0]} rows")
    return seconds


def consumer(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-spark-{time.monotonic_ns()}",  # never joined nor committed
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            # librdkafka pauses fetching for fetch.queue.backoff.ms (1 s by default)
            # whenever its queue passes queued.min.messages; a fast broker trips it.
            "fetch.queue.backoff.ms": 5,
        }
    )


def confluent_read(bootstrap: str, records: int) -> tuple[int, int]:
    """(messages, value bytes) of the whole topic, each message's value touched."""
    client = consumer(bootstrap)
    try:
        client.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        got = value_bytes = 0
        deadline = time.monotonic() + TIMEOUT
        while got < records:
            if time.monotonic() > deadline:
                raise BenchError(f"confluent: {got}/{records} in {TIMEOUT:.0f} s")
            batch = client.consume(num_messages=min(CONSUME_CALL, records - got), timeout=0.5)
            for message in batch:
                if message.error() is not None:
                    raise BenchError(f"consume error: {message.error()}")
                value_bytes += len(message.value() or b"")
            got += len(batch)
    finally:
        client.close()
    return got, value_bytes


def confluent_contents(bootstrap: str, records: int) -> dict[int, Contents]:
    """The same read, every message's partition, offset (dense from 0) and CRC checked."""
    client = consumer(bootstrap)
    counts = [0] * PARTITIONS
    lasts = [-1] * PARTITIONS
    crc_sums = [0] * PARTITIONS
    try:
        client.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        got = 0
        deadline = time.monotonic() + TIMEOUT
        while got < records and time.monotonic() < deadline:
            for message in client.consume(num_messages=CONSUME_CALL, timeout=0.5):
                if message.error() is not None:
                    raise BenchError(f"consume error: {message.error()}")
                partition, offset = message.partition(), message.offset()
                value = message.value()
                if partition is None or offset is None or value is None:
                    raise BenchError(f"a message without partition, offset or value: {message}")
                if offset != lasts[partition] + 1:
                    raise BenchError(
                        f"partition {partition}: offset {offset} after {lasts[partition]}"
                    )
                lasts[partition] = offset
                counts[partition] += 1
                crc_sums[partition] += zlib.crc32(value)
                got += 1
    finally:
        client.close()
    return {p: Contents(counts[p], 0, lasts[p], crc_sums[p]) for p in range(PARTITIONS)}


def reader_alone(bootstrap: str, contents: dict[int, Contents]) -> float:
    """Records/s of directlog.spark's reader (read_range) in this process, no Spark: every
    partition in turn, the rows and value bytes of its Arrow batches summed."""
    rows = value_bytes = 0
    started = time.perf_counter()
    for partition, held in contents.items():
        read = RangeRead(
            {"bootstrap.servers": bootstrap}, TOPIC, partition, 0, held.records, False, True
        )
        for batch in read_range(read):
            rows += batch.num_rows
            value_bytes += batch.column(1).buffers()[2].size if batch.num_rows else 0
    seconds = time.perf_counter() - started
    total = sum(c.records for c in contents.values())
    if rows != total or value_bytes < total * VALUE_BYTES:
        raise BenchError(f"reader alone: {rows} rows, {value_bytes} value bytes")
    return rows / seconds


# Passes ------------------------------------------------------------------------------------


@dataclass
class Pass:
    seconds: float
    records: int
    cores: Cores
    broker_records_out: int  # records the broker sent meanwhile

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    def figures(self) -> dict[str, Any]:
        return {
            "records_per_s": round(self.rate),
            "seconds": round(self.seconds, 3),
            "cores": self.cores.groups,
            "machine_cores": self.cores.machine,
            "single_thread_cores": self.cores.singles,
            "jit_cores": jit_cores(self.cores.jvm_threads),
            "jvm_busiest_threads": busiest(self.cores.jvm_threads),
            "broker_records_out": self.broker_records_out,
        }


def timed(
    cluster: Cluster,
    processes: Processes,
    read: Callable[[], tuple[int, int]],
    records: int,
) -> Pass:
    """One timed read, its count and value bytes checked, with the cores each process
    group kept busy and the records the broker sent meanwhile (counted outside the timed
    part: a scrape costs the broker CPU)."""
    broker = cluster.brokers[0]
    out_before = broker.total("directlog_broker_records_out_total", topic=TOPIC)
    before = processes.usage()
    got, value_bytes = read()
    after = processes.usage()
    out = broker.total("directlog_broker_records_out_total", topic=TOPIC) - out_before
    if got != records or value_bytes != records * VALUE_BYTES:
        raise BenchError(f"{got} records, {value_bytes} value bytes read; {records} produced")
    if out < records:
        raise BenchError(f"the broker sent {out:.0f} records during a read of {records}")
    return Pass(after.at - before.at, got, cores(before, after), int(out))


def warm_up(
    cluster: Cluster,
    processes: Processes,
    sides: dict[str, Callable[[], tuple[int, int]]],
    records: int,
) -> list[dict[str, Any]]:
    """WARM_PASSES untimed Spark passes, sum and count in turn, each checked like a timed
    one; returns each one's seconds and JIT compiler cores (they fall as the JVM warms)."""
    passes = []
    for i in range(WARM_PASSES):
        side = ("spark", "spark_count")[i % 2]
        result = timed(cluster, processes, sides[side], records)
        jit = jit_cores(result.cores.jvm_threads)
        passes.append({"side": side, "seconds": round(result.seconds, 3), "jit_cores": jit})
        print(f"warm-up {side:>11}: {result.figures()}", flush=True)
    return passes


# Run ---------------------------------------------------------------------------------------


@dataclass
class Collected:
    passes: dict[str, list[Pass]] = field(default_factory=dict)
    ratios: list[float] = field(default_factory=list)  # spark/confluent, round by round
    outside: list[float] = field(default_factory=list)  # each round's most outside cores

    def add(self, side: str, result: Pass) -> None:
        self.passes.setdefault(side, []).append(result)


def run(sizes: Sizes) -> dict[str, Any]:
    started = time.monotonic()
    source = broker_source()
    load_start = os.getloadavg()
    collected = Collected()
    untimed: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as work, Cluster(Path(work)) as cluster:
        bootstrap = cluster.bootstrap
        broker = cluster.brokers[0]
        assert broker.process is not None
        processes = Processes(broker.process.pid)
        create(bootstrap)
        contents, produce_rate = produce(bootstrap, sizes.records)
        records = sum(c.records for c in contents.values())
        print(
            f"produced {records} records of {VALUE_BYTES} bytes ({produce_rate:.0f}/s)", flush=True
        )
        untimed["produce_records_per_s"] = round(produce_rate)

        at = time.perf_counter()
        spark = start_spark()
        untimed["spark_session_start_s"] = round(time.perf_counter() - at, 2)
        try:
            at = time.perf_counter()
            found = spark_contents(spark, bootstrap)
            untimed["spark_first_read_s"] = round(time.perf_counter() - at, 2)
            if found != contents:
                raise BenchError(f"spark read {found}, produced {contents}")
            at = time.perf_counter()
            found = confluent_contents(bootstrap, records)
            untimed["confluent_first_read_s"] = round(time.perf_counter() - at, 2)
            if found != contents:
                raise BenchError(f"confluent read {found}, produced {contents}")
            print(f"contents checked on both sides: {untimed}", flush=True)

            sides: dict[str, Callable[[], tuple[int, int]]] = {
                "spark": lambda: spark_sum(spark, bootstrap),
                "spark_count": lambda: spark_count(spark, bootstrap),
                "confluent": lambda: confluent_read(bootstrap, records),
            }
            untimed["spark_warm_up"] = warm_up(cluster, processes, sides, records)
            untimed["spark_small_read_s"] = round(
                statistics.median(spark_small_read(spark, bootstrap) for _ in range(3)), 3
            )
            untimed["reader_alone_records_per_s"] = round(reader_alone(bootstrap, contents))
            print(
                f"small read {untimed['spark_small_read_s']} s, reader alone "
                f"{untimed['reader_alone_records_per_s']} records/s",
                flush=True,
            )
            for round_ in range(sizes.rounds):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                rates: dict[str, float] = {}
                for side in order:
                    result = timed(cluster, processes, sides[side], records)
                    collected.add(side, result)
                    rates[side] = result.rate
                    print(f"round {round_} {side:>11}: {result.figures()}", flush=True)
                collected.ratios.append(rates["spark"] / rates["confluent"])
                collected.outside.append(
                    max(p[-1].cores.groups["outside"] for p in collected.passes.values())
                )
        finally:
            spark.stop()
    sources = [source, broker_source()]
    if sources[0].partition(":")[2] != sources[1].partition(":")[2]:
        print(f"WARNING: the broker's code changed during the run: {sources}", flush=True)
    return summarize(
        collected, untimed, sizes, records, load_start, time.monotonic() - started, sources
    )


def bound(entry: dict[str, Any], cpus: int) -> str:
    """What a side's figure ran into, from its median cores: every core of the machine
    busy, or one thread's core (this process's main thread: the driver or the confluent
    loop; a Python worker's), or else nothing CPU-wise (waits and fixed costs)."""
    ours = {k: v for k, v in entry["cores"].items() if k != "outside"}
    top = max(ours, key=lambda k: ours[k])
    singles = entry["single_thread_cores"]
    thread = max(singles, key=lambda k: singles[k])
    if entry["machine_cores"] >= 0.9 * cpus:
        return (
            f"the machine's CPUs ({entry['machine_cores']} of {cpus} busy; most: {top} "
            f"{ours[top]}, outside {entry['cores']['outside']})"
        )
    if singles[thread] >= 0.8:
        return f"one thread near a full core: {thread} {singles[thread]} (groups: {ours})"
    return (
        f"no CPU: waits and fixed costs (the machine {entry['machine_cores']} of {cpus} busy, "
        f"busiest thread {thread} {singles[thread]}, busiest group {top} {ours[top]})"
    )


def summarize(
    collected: Collected,
    untimed: dict[str, Any],
    sizes: Sizes,
    records: int,
    load_start: tuple[float, float, float],
    seconds: float,
    sources: list[str],
) -> dict[str, Any]:
    cpus = os.cpu_count() or 1
    sides: dict[str, Any] = {}
    for side, passes in collected.passes.items():
        rates = [p.rate for p in passes]
        median_pass = sorted(passes, key=lambda p: p.rate)[len(passes) // 2]
        groups = {
            k: round(statistics.median(p.cores.groups[k] for p in passes), 2)
            for k in passes[0].cores.groups
        }
        singles = {
            k: round(statistics.median(p.cores.singles[k] for p in passes), 2)
            for k in passes[0].cores.singles
        }
        sides[side] = {
            "records_per_s": round(statistics.median(rates)),
            "value_MBps": round(statistics.median(rates) * VALUE_BYTES / 1e6, 1),
            "rounds_records_per_s": [round(r) for r in rates],
            "cores": groups,
            "single_thread_cores": singles,
            "machine_cores": round(statistics.median(p.cores.machine for p in passes), 2),
            "outside_cores_max": max(p.cores.groups["outside"] for p in passes),
            "jit_cores": round(
                statistics.median(jit_cores(p.cores.jvm_threads) for p in passes), 2
            ),
            "jvm_busiest_threads_median_pass": busiest(median_pass.cores.jvm_threads),
            "broker_records_out_per_pass": sorted({p.broker_records_out for p in passes}),
        }
        sides[side]["bound"] = bound(sides[side], cpus)
    ratio = sides["spark"]["records_per_s"] / sides["confluent"]["records_per_s"]
    count_ratio = sides["spark_count"]["records_per_s"] / sides["spark"]["records_per_s"]
    spark_seconds = records / sides["spark"]["records_per_s"]
    return {
        "setup": {
            "records": records,
            "value_bytes": VALUE_BYTES,
            "partitions": PARTITIONS,
            "producer_batch_bytes": PRODUCER["batch.size"],
            "spark_master": "local[2]",
            "consume_call_messages": CONSUME_CALL,
            "rounds": sizes.rounds,
            "cpus": cpus,
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "seconds": round(seconds, 1),
            "broker_source_start_end": sources,
        },
        "untimed": untimed,
        "sides": sides,
        "spark_confluent_ratio": round(ratio, 3),
        "spark_confluent_ratio_rounds": [round(r, 3) for r in collected.ratios],
        "rounds_outside_cores_max": collected.outside,
        "spark_count_spark_sum_ratio": round(count_ratio, 3),
        "spark_small_read_fraction": round(untimed["spark_small_read_s"] / spark_seconds, 3),
        "goals": {
            "spark_confluent_ratio": {
                "goal": f">= {GOAL_RATIO} (records/s, medians of the rounds)",
                "value": round(ratio, 3),
                "met": ratio >= GOAL_RATIO,
            },
        },
    }


def report(figures: dict[str, Any]) -> None:
    setup = figures["setup"]
    untimed = {k: v for k, v in figures["untimed"].items() if k != "spark_warm_up"}
    warm = [w["seconds"] for w in figures["untimed"]["spark_warm_up"]]
    print(
        f"\n{setup['records']} records of {setup['value_bytes']} bytes over "
        f"{setup['partitions']} partitions, {setup['cpus']} CPUs; untimed: {untimed}; "
        f"Spark warm-up passes {warm} s"
    )
    print(
        "records/s, median of rounds (cores busy by process group; the machine; JIT "
        "compilers; this process's main thread and the busiest Python worker)"
    )
    for side, entry in figures["sides"].items():
        cores_text = ", ".join(f"{k} {v:.2f}" for k, v in entry["cores"].items() if v >= 0.01)
        print(
            f"  {side:>11}: {entry['records_per_s']:>9}  ({cores_text}; machine "
            f"{entry['machine_cores']:.2f}; JIT {entry['jit_cores']:.2f}; "
            f"{entry['single_thread_cores']})  "
            f"rounds {entry['rounds_records_per_s']}"
        )
        print(f"  {'':>11}  bound: {entry['bound']}")
        if entry["outside_cores_max"] > OUTSIDE_WARNING_CORES:
            print(
                f"  {'':>11}  WARNING: other work on this machine took up to "
                f"{entry['outside_cores_max']} cores during a pass"
            )
    print(
        f"  spark/confluent {figures['spark_confluent_ratio']} (rounds "
        f"{figures['spark_confluent_ratio_rounds']}, the most cores other work took in each: "
        f"{figures['rounds_outside_cores_max']}), count/sum "
        f"{figures['spark_count_spark_sum_ratio']}; a {SMALL_READ}-records-a-partition read "
        f"takes {figures['spark_small_read_fraction']} of a whole spark pass"
    )
    print_goals(figures["goals"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.spark", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1M records, 3 rounds")
    parser.add_argument("--rounds", type=int, help="alternating rounds (5; 3 with --quick)")
    args = parser.parse_args(argv)
    keep_freed_heap()
    sizes = QUICK if args.quick else FULL
    if args.rounds:
        sizes = Sizes(sizes.records, args.rounds)
    figures = run(sizes)
    report(figures)
    save_results("spark", figures)


if __name__ == "__main__":
    main()
