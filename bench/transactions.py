"""What Kafka transactions (KIP-98) cost a producer and a consumer (issue 29).

    python -m bench.transactions [--quick] [--rounds N] [--no-pin]

Both measurements run in one go against one Directlog cluster (tests/e2e/cluster.py: a
consensus member, the controller and one broker as subprocesses on loopback, production
timeouts as bench.broker, `__transaction_state` with replication factor 1 so that one
broker can host it), through confluent-kafka (librdkafka), on fresh 4-partition topics
deleted after each run, 200-byte records, null keys (librdkafka's sticky partitioner):

1. Throughput: an idempotent producer (`enable.idempotence=true`, acks=all, `linger.ms=5`)
   against a transactional one (the same plus a `transactional.id`), each producing as
   fast as the Python loop can for a fixed time and then waiting for its last
   acknowledgement (a flush, or the last commit). The transactional producer commits after
   every 100 ms of producing and begins the next transaction at once, as a stream processor
   with `commit.interval.ms=100` would: the commits (AddPartitionsToTxn, the flush, EndTxn,
   while nothing else is produced) are part of its time. After one untimed idempotent run
   (the broker's first writes fault in fresh pages, docs/broker.md), the two alternate
   round after round (the first of each pair swaps); records/s and MB/s of record values
   (MB = 10**6 bytes), best and median of the rounds. Goal: transactional at least 0.8x
   idempotent (best rounds). Next to each figure, the cores this process (the Python
   loop and librdkafka's threads) and the broker kept busy meanwhile, and the seconds the
   loop waited on a full librdkafka queue (100,000 records): the transactional producer's
   commits empty that queue every 100 ms, the idempotent producer's can stay full, its
   loop then waiting for the broker's acknowledgements. The broker's extra work for a
   transaction (AddPartitionsToTxn, EndTxn, markers) shows only if the broker is the side
   near a full core. After every transactional round a read_committed consumer reads the
   topic to its end: it must get, partition by partition, exactly the records that were
   acknowledged, or the bench fails.
2. End-to-end latency at a fixed rate (2,000 records/s, paced by this process): a producer
   and, from before its first record, a read_committed and a read_uncommitted consumer
   (`assign()` from the start, no group), each in its own thread of this process. Every
   value carries its sequence number and the time of its `produce()` call on this
   machine's monotonic clock; a record's latency is the consumer's receive time on the
   same clock minus that. p50 and p99 of each run, leaving out the records of its first
   0.5 s (connections and first fetches settling), then the median of each over the rounds
   (the machine's other work can spoil a run); with an idempotent producer as the baseline
   and with a transactional one committing every 100 ms, alternating. read_committed
   latency includes the commit interval by design: a transaction's records stay invisible
   to it until the commit's marker is written (the partition's last stable offset passes
   them), so a record waits for the rest of its 100 ms transaction and the commit itself,
   about 50 ms plus a commit on average; read_uncommitted consumers see records as soon as
   they are replicated, transaction or not. Each consumer must get every acknowledged
   record exactly once, or the bench fails.

Placement, as in bench.broker: this process (the Python loop, librdkafka's threads and the
consumer threads) on the first half of the CPUs this process may use and the cluster's
processes on the other half, one core a side on a 2-core machine, as on two machines.
`--no-pin` leaves it to the scheduler. The output ends with a summary table, the goal and
one JSON line of every figure, also written to bench/results/transactions.json. A part
that fails (transactions refused, records lost or duplicated) is reported with the call
and the error, its figures stay null, and the bench exits with status 1.
"""

from __future__ import annotations

import contextlib
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.broker import (
    PRODUCTION_TIMEOUTS,
    BenchError,
    CpuMeter,
    Placement,
    delete_topic,
    wait_for_topic,
)
from bench.processes import keep_freed_heap, print_goals, save_results, sized_options
from tests.e2e.cluster import Cluster

RECORD = 200
PARTITIONS = 4
COMMIT_INTERVAL = 0.1  # seconds of producing per transaction
RATE = 2000  # records/s of the latency runs
WARMUP = 0.5  # seconds of each latency run left out of its percentiles
WAIT = 60.0  # bound of every wait on the cluster
THROUGHPUT_GOAL = 0.8
MODES = ("idempotent", "transactional")
ISOLATIONS = ("read_uncommitted", "read_committed")
CLUSTER_SETTINGS = {
    **PRODUCTION_TIMEOUTS,
    "transaction_state_log_replication_factor": 1,
    "transaction_state_log_num_partitions": 4,
}
PRODUCER = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}
STAMP = struct.Struct(">qq")  # sequence number, produce() time in ns (monotonic)
FILL = b"t" * (RECORD - 12)


@dataclass(frozen=True)
class Sizes:
    rounds: int  # throughput pairs and latency runs per mode
    produce_seconds: float  # producing time of one throughput run
    latency_seconds: float  # producing time of one latency run


FULL = Sizes(rounds=3, produce_seconds=10.0, latency_seconds=15.0)
QUICK = Sizes(rounds=2, produce_seconds=3.0, latency_seconds=5.0)


class Failed(Exception):
    """A part of the bench that could not finish; says which call failed and how."""


# --- clients -------------------------------------------------------------------------------


@dataclass
class Acks:
    """The producer's delivery reports: acknowledged records per partition, and failures."""

    per_partition: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        partition = msg.partition()
        if err is None and partition is not None:
            self.per_partition[partition] += 1
        else:
            self.failures.append(str(err))

    @property
    def total(self) -> int:
        return sum(self.per_partition.values())


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics(
        [NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)],
        operation_timeout=10,
        request_timeout=15,
    )[topic].result(timeout=20)


def producer(bootstrap: str, topic: str, transactional_id: str | None, acks: Acks) -> Producer:
    """An idempotent producer, transactional (and initialised) when given an id."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "on_delivery": acks, **PRODUCER}
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    made = Producer(config)
    wait_for_topic(made, topic)
    if transactional_id is not None:
        call(made.init_transactions, "init_transactions", WAIT)
    return made


def call(method: Any, name: str, *args: Any) -> Any:
    """`method(*args)`, its failure turned into one naming the call (the report says which
    transactional call the broker refused, and with what)."""
    try:
        return method(*args)
    except Exception as exc:
        raise Failed(f"{name}: {type(exc).__name__}: {exc}") from exc


def check_acks(acks: Acks, produced: int) -> None:
    if acks.failures or acks.total != produced:
        first = acks.failures[0] if acks.failures else "none"
        raise Failed(
            f"{acks.total}/{produced} acknowledged, {len(acks.failures)} failed "
            f"(first error: {first})"
        )


def consumer(bootstrap: str, topic: str, isolation: str, eof: bool = False) -> Consumer:
    made = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-transactions-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": eof,
            "fetch.queue.backoff.ms": 5,  # see bench.broker.consume
        }
    )
    wait_for_topic(made, topic)
    made.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    return made


# --- 1. throughput -------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    records: int
    seconds: float
    commits: int
    commit_ms: float | None  # median time of one commit_transaction call
    cores: tuple[float, float]  # this process's and the broker's, while timed
    blocked: float  # seconds the loop waited on a full librdkafka queue


def produce_for(
    client: Producer, topic: str, seconds: float, transactional: bool, broker_pid: int
) -> Run:
    """Produce as fast as the loop goes for `seconds`, committing every COMMIT_INTERVAL of
    producing when transactional; timed to the last acknowledgement."""
    commit_times: list[float] = []

    def commit() -> None:
        began = time.perf_counter()
        call(client.commit_transaction, "commit_transaction", WAIT)
        commit_times.append(time.perf_counter() - began)

    produced, blocked = 0, 0.0
    meter = CpuMeter(broker_pid)
    start = time.perf_counter()
    end = start + seconds
    if transactional:
        call(client.begin_transaction, "begin_transaction")
    opened = time.perf_counter()
    while True:
        for _ in range(64):
            try:
                client.produce(topic, FILL + b"%012d" % produced)
            except BufferError:  # librdkafka's queue is full: serve reports, then retry
                waited = time.perf_counter()
                client.poll(0.005)
                blocked += time.perf_counter() - waited
                continue
            produced += 1
        client.poll(0)
        now = time.perf_counter()
        if now >= end:
            break
        if transactional and now - opened >= COMMIT_INTERVAL:
            commit()
            call(client.begin_transaction, "begin_transaction")
            opened = time.perf_counter()
    if transactional:
        commit()
    elif (left := client.flush(WAIT)) != 0:
        raise Failed(f"flush: {left} records unsent after {WAIT:.0f} s")
    elapsed = time.perf_counter() - start
    median = statistics.median(commit_times) * 1e3 if commit_times else None
    return Run(produced, elapsed, len(commit_times), median, meter.cores(), blocked)


def read_committed_counts(bootstrap: str, topic: str, want: int) -> Counter[int]:
    """Records per partition a read_committed consumer gets from the topic's start to its
    end: until it has `want` (or more) and stands at every partition's end."""
    got: Counter[int] = Counter()
    at_end: set[int] = set()
    reader = consumer(bootstrap, topic, "read_committed", eof=True)
    try:
        deadline = time.monotonic() + WAIT
        while True:
            for message in reader.consume(10_000, 0.5):
                partition = message.partition()
                assert partition is not None
                error = message.error()
                if error is None:
                    got[partition] += 1
                    at_end.discard(partition)
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(partition)
                else:
                    raise Failed(f"read_committed consume: {error}")
            if got.total() >= want and len(at_end) == PARTITIONS and at_high_watermark(reader):
                return got
            if time.monotonic() > deadline:
                raise Failed(
                    f"read_committed consumer got {got.total()} of {want} committed records "
                    f"in {WAIT:.0f} s ({dict(got)})"
                )
    finally:
        reader.close()


def at_high_watermark(reader: Consumer) -> bool:
    """Whether the consumer's position is each partition's end (the markers included)."""
    for position in reader.position(reader.assignment()):
        _, high = reader.get_watermark_offsets(position, timeout=10, cached=False)
        if position.offset != high:
            return False
    return True


def throughput_run(target: Target, topic: str, mode: str, seconds: float, nonce: str) -> Run:
    bootstrap = target.bootstrap
    create_topic(bootstrap, topic)
    acks = Acks()
    transactional = mode == "transactional"
    client = producer(bootstrap, topic, f"bench-{nonce}-{topic}" if transactional else None, acks)
    run = produce_for(client, topic, seconds, transactional, target.broker_pid)
    check_acks(acks, run.records)
    if transactional:
        seen = read_committed_counts(bootstrap, topic, run.records)
        if seen != acks.per_partition:
            raise Failed(
                f"read_committed consumer read {dict(seen)} records per partition, "
                f"{dict(acks.per_partition)} were committed"
            )
    return run


def bench_throughput(target: Target, sizes: Sizes, nonce: str) -> dict[str, Any]:
    """An untimed run first (later runs reuse the pages its deleted topic freed), then
    alternating rounds."""
    warmup = f"bench-txn-warmup-{nonce}"
    throughput_run(target, warmup, "idempotent", sizes.produce_seconds, nonce)
    delete_topic(target.bootstrap, warmup)
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    for round_ in range(sizes.rounds):
        for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
            topic = f"bench-txn-throughput-{mode}-{nonce}-{round_}"
            run = throughput_run(target, topic, mode, sizes.produce_seconds, nonce)
            rate = run.records / run.seconds
            commits = (
                f"  {run.commits} commits, median {run.commit_ms:.1f} ms"
                if run.commit_ms is not None
                else ""
            )
            print(
                f"[throughput] {mode:14} round {round_}: {rate:10,.0f} records/s "
                f"{rate * RECORD / 1e6:7.1f} MB/s ({run.records:,} in {run.seconds:.2f} s)  "
                f"cores client {run.cores[0]:.2f} broker {run.cores[1]:.2f}  "
                f"queue full {run.blocked:.2f} s{commits}",
                flush=True,
            )
            runs[mode].append(run)
            if refused := delete_topic(target.bootstrap, topic):
                print(f"[throughput] {topic} kept: {refused}", flush=True)
    figures: dict[str, Any] = {}
    for mode in MODES:
        rates = [r.records / r.seconds for r in runs[mode]]
        figures[f"{mode}_records_s_best"] = max(rates)
        figures[f"{mode}_records_s_median"] = statistics.median(rates)
        figures[f"{mode}_MBps_best"] = max(rates) * RECORD / 1e6
        best = max(runs[mode], key=lambda r: r.records / r.seconds)
        figures[f"{mode}_client_cores"], figures[f"{mode}_broker_cores"] = best.cores
        figures[f"{mode}_queue_full_s"] = best.blocked
    figures["commit_ms_median"] = statistics.median(
        r.commit_ms for r in runs["transactional"] if r.commit_ms is not None
    )
    figures["commits_per_run"] = statistics.median(r.commits for r in runs["transactional"])
    for kind in ("best", "median"):
        figures[f"ratio_{kind}"] = (
            figures[f"transactional_records_s_{kind}"] / figures[f"idempotent_records_s_{kind}"]
        )
    return figures


# --- 2. latency ----------------------------------------------------------------------------


class Reader(threading.Thread):
    """A consumer thread that notes, per record, its sequence number and its latency."""

    def __init__(self, bootstrap: str, topic: str, isolation: str) -> None:
        super().__init__(name=f"reader-{isolation}", daemon=True)
        self.isolation = isolation
        self.client = consumer(bootstrap, topic, isolation)
        self.seen: dict[int, int] = {}  # sequence number -> latency in ns
        self.duplicates = 0
        self.error: str | None = None
        self.want: int | None = None  # set once the producer knows its count
        self.stop_at = time.monotonic() + 3600.0  # set to a bound once `want` is

    def run(self) -> None:
        try:
            while (self.want is None or len(self.seen) < self.want) and (
                time.monotonic() < self.stop_at
            ):
                # poll, not consume(n, timeout): that one waits for n records or its timeout
                message = self.client.poll(0.05)
                received = time.monotonic_ns()
                if message is None:
                    continue
                if (error := message.error()) is not None:
                    raise Failed(f"{self.isolation} consume: {error}")
                sequence, sent = STAMP.unpack_from(message.value() or b"")
                if sequence in self.seen:
                    self.duplicates += 1
                self.seen[sequence] = received - sent
        except Exception as exc:  # reported by the caller, which checks every reader
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.client.close()


def paced(client: Producer, topic: str, seconds: float, transactional: bool) -> tuple[int, int]:
    """Produce RATE records a second for `seconds`, each stamped; commit every
    COMMIT_INTERVAL when transactional. Returns the records produced and how many of them
    were produced in the first WARMUP seconds."""
    produced, warmup = 0, 0
    if transactional:
        call(client.begin_transaction, "begin_transaction")
    start = time.monotonic()
    opened = start
    while (now := time.monotonic()) < start + seconds:
        due = int((now - start) * RATE)
        while produced < due:
            stamp = STAMP.pack(produced, time.monotonic_ns())
            client.produce(topic, stamp + FILL[: RECORD - STAMP.size])
            produced += 1
        if now - start < WARMUP:
            warmup = produced
        client.poll(0)
        if transactional and now - opened >= COMMIT_INTERVAL:
            call(client.commit_transaction, "commit_transaction", WAIT)
            call(client.begin_transaction, "begin_transaction")
            opened = time.monotonic()
        time.sleep(0.0005)
    if transactional:
        call(client.commit_transaction, "commit_transaction", WAIT)
    elif (left := client.flush(WAIT)) != 0:
        raise Failed(f"flush: {left} records unsent after {WAIT:.0f} s")
    return produced, warmup


def latency_run(
    bootstrap: str, topic: str, mode: str, seconds: float, nonce: str
) -> dict[str, list[float]]:
    """Latencies in ms, per consumer's isolation level, of the records after the warm-up."""
    create_topic(bootstrap, topic)
    acks = Acks()
    transactional = mode == "transactional"
    client = producer(bootstrap, topic, f"bench-{nonce}-{topic}" if transactional else None, acks)
    readers = [Reader(bootstrap, topic, isolation) for isolation in ISOLATIONS]
    for reader in readers:
        reader.start()
    produced, acknowledged = 0, False
    try:
        time.sleep(1.0)  # both consumers assigned and fetching before the first record
        produced, warmup = paced(client, topic, seconds, transactional)
        check_acks(acks, produced)
        acknowledged = True
    finally:  # on a failure, the readers stop at once
        for reader in readers:
            reader.want = produced
            reader.stop_at = time.monotonic() + (WAIT if acknowledged else 0.0)
        for reader in readers:
            reader.join(WAIT + 10)
    out: dict[str, list[float]] = {}
    for reader in readers:
        if reader.error is not None or reader.is_alive():
            raise Failed(f"{reader.isolation} consumer: {reader.error or 'still running'}")
        if len(reader.seen) != produced or reader.duplicates:
            raise Failed(
                f"{reader.isolation} consumer got {len(reader.seen)} of {produced} records "
                f"({reader.duplicates} duplicates)"
            )
        out[reader.isolation] = [
            reader.seen[sequence] / 1e6 for sequence in range(warmup, produced)
        ]
    return out


def bench_latency(target: Target, sizes: Sizes, nonce: str) -> dict[str, Any]:
    """p50 and p99 of every run; each figure the median over the rounds, so that one run
    the machine's other work disturbed does not decide it."""
    bootstrap = target.bootstrap
    per_round: dict[str, list[tuple[float, float]]] = {
        f"{m}_{i}": [] for m in MODES for i in ISOLATIONS
    }
    for round_ in range(sizes.rounds):
        for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
            topic = f"bench-txn-latency-{mode}-{nonce}-{round_}"
            got = latency_run(bootstrap, topic, mode, sizes.latency_seconds, nonce)
            for isolation, latencies in got.items():
                p50, p99 = percentiles(latencies)
                per_round[f"{mode}_{isolation}"].append((p50, p99))
                print(
                    f"[latency] {mode:14} {isolation:17} round {round_}: "
                    f"p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  ({len(latencies):,} records)",
                    flush=True,
                )
            if refused := delete_topic(bootstrap, topic):
                print(f"[latency] {topic} kept: {refused}", flush=True)
    figures: dict[str, Any] = {}
    for key, rounds in per_round.items():
        figures[f"{key}_p50_ms"] = statistics.median(p50 for p50, _ in rounds)
        figures[f"{key}_p99_ms"] = statistics.median(p99 for _, p99 in rounds)
    return figures


def percentiles(latencies: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(latencies, n=100)
    return cuts[49], cuts[98]


# --- report --------------------------------------------------------------------------------


def cell(figures: dict[str, Any], key: str, form: str) -> str:
    """The figure in format `form`, or a dash as wide when there is none."""
    value = figures.get(key)
    if value is None:
        return "-".rjust(len(f"{0.0:{form}}"))
    return f"{value:{form}}"


def print_tables(figures: dict[str, Any], sizes: Sizes) -> None:
    print(
        f"\n{'throughput, 200 B, 4 partitions':34}{'records/s best':>16}{'median':>12}"
        f"{'MB/s best':>12}{'cores client':>14}{'broker':>8}{'queue full s':>14}"
        f"   ({sizes.rounds} rounds)"
    )
    for mode in MODES:
        print(
            f"{mode:34}{cell(figures, f'{mode}_records_s_best', '16,.0f')}"
            f"{cell(figures, f'{mode}_records_s_median', '12,.0f')}"
            f"{cell(figures, f'{mode}_MBps_best', '12,.1f')}"
            f"{cell(figures, f'{mode}_client_cores', '14.2f')}"
            f"{cell(figures, f'{mode}_broker_cores', '8.2f')}"
            f"{cell(figures, f'{mode}_queue_full_s', '14.2f')}"
        )
    print(
        f"{'transactional / idempotent':34}{cell(figures, 'ratio_best', '16.3f')}"
        f"{cell(figures, 'ratio_median', '12.3f')}"
    )
    if figures.get("commit_ms_median") is not None:
        print(
            f"commit_transaction: median {figures['commit_ms_median']:.1f} ms, "
            f"{figures['commits_per_run']:.0f} commits per run"
        )
    print(f"\n{f'latency at {RATE:,} records/s, ms':34}{'p50':>12}{'p99':>12}")
    for mode in MODES:
        for isolation in ISOLATIONS:
            key = f"{mode}_{isolation}"
            print(
                f"{mode + ' ' + isolation:34}{cell(figures, f'{key}_p50_ms', '12.2f')}"
                f"{cell(figures, f'{key}_p99_ms', '12.2f')}"
            )


def goals(figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    value = figures.get("ratio_best")
    return {
        "transactional_vs_idempotent_throughput": {
            "value": None if value is None else round(value, 3),
            "goal": f">= {THROUGHPUT_GOAL}",
            "met": value is not None and value >= THROUGHPUT_GOAL,
        }
    }


# --- main ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    bootstrap: str
    broker_pid: int  # whose cores are reported next to the throughputs
    pids: tuple[int, ...]  # every process of the cluster: the server side

    @staticmethod
    def of(cluster: Cluster) -> Target:
        broker = cluster.brokers[0].process
        assert broker is not None
        services = [*cluster.brokers.values(), *cluster.controllers]
        pids = [s.process.pid for s in services if s.process is not None]
        pids += [p.pid for p in cluster.ensemble.processes.values()]
        return Target(cluster.bootstrap, broker.pid, tuple(pids))


def run(sizes: Sizes, placement: Placement | None) -> tuple[dict[str, Any], list[str]]:
    figures: dict[str, Any] = {}
    errors: list[str] = []
    nonce = f"{time.time_ns() % 10**9}"
    with (
        tempfile.TemporaryDirectory(prefix="bench-transactions-") as name,
        Cluster(Path(name), broker_settings=CLUSTER_SETTINGS) as cluster,
    ):
        target = Target.of(cluster)
        print(f"[cluster] up at {target.bootstrap}", flush=True)
        for part, measure in (("throughput", bench_throughput), ("latency", bench_latency)):
            placed: AbstractContextManager[None] = (
                placement.apply(target.pids) if placement is not None else contextlib.nullcontext()
            )
            try:
                with placed:
                    figures |= measure(target, sizes, nonce)
            except (Failed, BenchError, KafkaException) as exc:
                errors.append(f"{part}: {exc}")
                print(f"[{part}] FAILED: {exc}", flush=True)
    return figures, errors


def main(argv: list[str] | None = None) -> None:
    sizes, pin = sized_options("bench.transactions", __doc__, QUICK, FULL, argv)
    keep_freed_heap()
    placement = Placement.split(pin)
    figures, errors = run(sizes, placement)
    print_tables(figures, sizes)
    met = goals(figures)
    print()
    print_goals(met)
    for error in errors:
        print(f"FAILED {error}")
    save_results(
        "transactions",
        {
            "bench": "transactions",
            "figures": {k: round(v, 4) for k, v in figures.items()},
            "goals": met,
            "errors": errors,
            "sizes": vars(sizes),
            "record_bytes": RECORD,
            "partitions": PARTITIONS,
            "commit_interval_ms": COMMIT_INTERVAL * 1e3,
            "latency_rate": RATE,
            "placement": None
            if placement is None
            else {
                "client_cpus": sorted(placement.client),
                "server_cpus": sorted(placement.server),
            },
        },
    )
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
