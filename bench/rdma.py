"""The KafkaDirect paper's (SIGMOD'22) experiments, RDMA (shm provider) against our own
TCP Kafka path, measured in one run and printed as ratios.

    python -m bench.rdma [--quick] [--rounds N] [--only latency,bandwidth,...]

Two Directlog clusters (tests/e2e/cluster.py: a consensus member, the controller and the
brokers, subprocesses on loopback), one after the other, with production heartbeat
timeouts, `rdma_provider=shm` and the default grant size (`rdma_grant_max_bytes`, 8 MiB:
a producer takes a new grant every 8 MiB, and that cost is in its figures):

* one broker with `rdma_produce` and `rdma_consume` on (experiments 1-6), and
  `rdma_poll_spin_us=100`: with a core to itself it polls its completion queue for a
  while after each completion rather than sleep on the doorbell;
* three brokers with `rdma_produce` and `rdma_replication` (push replication) on
  (experiment 7), not spinning: they and the client share the 2 cores.

Every measurement gets a fresh topic, deleted afterwards, with `preallocate=true` for both
paths (RDMA needs it; the TCP topics get it too, so only the path differs), except the
RF=3 anchor below. Both paths run against the same broker in the same run, in a different
order each round.

* TCP: confluent-kafka (librdkafka), idempotence off.
* RDMA: directlog.client.rdma_produce.RdmaProducer (exclusive mode, 16 writes in flight,
  4 MiB staging) and directlog.client.rdma_consume.RdmaConsumer over shm. The producer's
  record batches are built before the clock starts: the Python batch encoder
  (directlog.records.batch.build_batch) is not the transport under test, and its own rate
  is printed beside Fig. 11. librdkafka builds its batches in C inside its timing. The
  consumer decodes and CRC-checks in Python inside its timing.

Experiments (the JSON key of each section in brackets):

1. Produce latency, Fig. 10 [latency]: one record per request, the next sent when the last
   is acknowledged; median and p99 for 64 B, 1 KiB and 16 KiB values. TCP: acks=1,
   `linger.ms=0`, `Producer.poll` until the delivery report. RDMA: `send()` of one
   one-record batch. Ratio = TCP median / RDMA median.
2. Produce bandwidth by record size, Fig. 11 [bandwidth]: 256 B to 64 KiB values, MB/s
   (10**6 bytes) of record values. Both paths put max(4, 64 KiB / size) records in a batch.
   TCP: acks=1, `batch.num.messages` set to that, `linger.ms=5`, `batch.size` never the
   limit. RDMA: `send()` of all the batches in one call. Ratio = RDMA MB/s / TCP MB/s.
3. Produce bandwidth by partitions, Fig. 12 [partitions]: 1, 2 and 4 partitions, 1 KiB
   records (64 a batch), spread evenly. TCP: one confluent-kafka producer, round-robin.
   RDMA: one RdmaProducer per partition, all sending at once on one event loop (as the
   drop-in Producer runs its writers). Ratio per partition count, RDMA / TCP.
4. Consume latency, Fig. 18 [consume_latency]: one confluent-kafka producer (acks=1,
   `linger.ms=0`) writes one record at a time for both paths; from the moment its
   delivery report arrives (`perf_counter` in the callback, one process, one clock) the
   consumer is polled in a tight loop until it hands that record out. The record is
   committed and readable at that moment, so this is what a consumer needs to fetch a
   record that is there (the paper's figure), plus whatever it fetched ahead meanwhile:
   librdkafka fetches in its own thread (`fetch.wait.max.ms=0`, `fetch.min.bytes=1`,
   no backoffs) and may already hold the record; RdmaConsumer reads only when polled
   (`poll(0)`: its slot READ, then a data READ). 64 B and 1 KiB. Ratio = TCP median / RDMA
   median.
5. Empty fetches, paper §5.3 [empty_fetch]: a partition with nothing new past offset 8;
   for a fixed time, how many "anything new?" checks one client gets answered. TCP: raw
   Fetch v12 requests (replica id -1, `max_wait_ms=0`, at the log end) on one
   connection, 8 in flight, so the broker and not librdkafka's pacing sets the rate; every
   answer checked empty with the right high watermark. RDMA: `RdmaConsumer.poll(0)` at
   the log end, one READ of its metadata slot each, every one returning nothing. The
   broker process's CPU time (/proc/<pid>/stat, all threads) over each window gives its
   CPU share and CPU per check; its share with no client at all is printed beside them.
   Ratio = RDMA checks/s / TCP checks/s.
6. Consume bandwidth, Fig. 20 [consume_bandwidth]: a topic filled once over RDMA (1 KiB
   and 16 KiB records, 64 and 4 a batch), then read from offset 0 to the end by each
   consumer in turn: confluent-kafka (assign, `consume()`), RdmaConsumer with its default
   `read_size` (2 KiB) and with 64 KiB. Ratios = RDMA MB/s / TCP MB/s.
7. RF=3 produce latency and bandwidth, Fig. 14/15 [rf3_latency, rf3_bandwidth]: topics of
   three replicas, `min.insync.replicas=2`, every replica in sync and (for preallocated
   topics) both push channels open before the clock starts; the leader's pushed-bytes
   counter is checked afterwards. Three variants: `tcp_pull` (acks=all to a topic without
   preallocation, which replicates by pull: Kafka's own way, the paper's anchor),
   `tcp_push` (acks=all to a preallocated topic, pushed over RDMA: the paper's "RDMA
   replication only"), `rdma` (RdmaProducer with acks=-1, pushed: both RDMA modules).
   Latency as in 1 (64 B, 1 KiB), bandwidth as in 2 (1 KiB, 16 KiB). Ratio = tcp_pull
   over rdma; `ratio_push` = tcp_push over rdma.

Every figure is checked: produced records acknowledged at offsets 0..n-1 (per partition
in 3), consumed records handed out at the expected offsets with the values written.
Rounds: `--rounds` (3, or 1 with `--quick`); latency keeps each size's lowest median and
lowest p99 over rounds, the rates the best round. A measurement that fails (a datapath
error) is printed with its traceback and the tail of the leader's log, listed under
`errors`, and leaves its figures null, and so the headline built on them; the run goes on.

The final JSON line has the headline ratios (the paper's goals, issue 7, in brackets):
`produce_latency_ratio` (>= 3.3) and `rf3_latency_ratio` (>= 7), `consume_latency_ratio`
(>= 50), the geometric means of the per-size ratios of 1, 7 and 4; `produce_bw_ratio`
(>= 7), that of 2; `empty_fetch_ratio` (>= 156, "with no broker CPU"). The per-row
figures, the other ratios and the counts are in bench/results/rdma.json. An experiment
left out with `--only` leaves its key null.

The machine has two cores: the clients (this process plus librdkafka's threads) and the
brokers (three of them in 7) share them, and on shm an RDMA op is the initiator's CPU
copying through a shared mapping in Python (about 8 us an op, docs/rdma.md), not a NIC.
The figures say how the two paths compare here, not what RDMA hardware would do. As in
bench.broker, the process keeps the heap memory it frees (`keep_freed_heap`), for both
paths' clients.

Not measured: the OSU Kafka columns; the shared-mode producer; a single API worker's
bandwidth (Fig. 13), replication factors 1 to 4 (Fig. 16), replication batch sizes
(Fig. 17), end-to-end latency (Fig. 19) and event processing (Fig. 21); anything on a
real RNIC (pyverbs). On shm "no broker CPU" for empty checks shows only as the broker's
CPU share staying at its idle share.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench import rdma_consume
from bench.broker import BenchError, delete_topic, produce, wait_for_topic
from bench.processes import keep_freed_heap, save_results
from bench.rdma_consume import TIME_LIMIT, WARMUP, EmptyChecks, Target
from directlog.client.rdma_produce import Produced, RdmaProducer
from directlog.records.batch import Record, build_batch
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster

PROVIDER = "shm"
BROKER_SETTINGS = {
    "heartbeat_interval_ms": 1000,
    "replica_lag_time_max_ms": 30000,
    "rdma_produce": True,
    "rdma_consume": True,
    "rdma_provider": PROVIDER,
    "rdma_poll_spin_us": 100,
}
RF3_BROKER_SETTINGS = {**BROKER_SETTINGS, "rdma_replication": True, "rdma_poll_spin_us": 0}
TOPIC_CONFIG = {"preallocate": "true"}
RF3_PUSH_CONFIG = {"preallocate": "true", "min.insync.replicas": "2"}
RF3_PULL_CONFIG = {"preallocate": "false", "min.insync.replicas": "2"}
RF3_RDMA_ACKS = -1  # RdmaProducer answers once the high watermark passed the write
LATENCY_SIZES = {"64B": 64, "1KiB": 1024, "16KiB": 16 * 1024}
BANDWIDTH_SIZES = {
    "256B": 256,
    "1KiB": 1024,
    "4KiB": 4 * 1024,
    "16KiB": 16 * 1024,
    "64KiB": 64 * 1024,
}
PARTITION_COUNTS = (1, 2, 4)
PARTITION_RECORD = 1024
RF3_LATENCY_SIZES = {"64B": 64, "1KiB": 1024}
RF3_BANDWIDTH_SIZES = {"1KiB": 1024, "16KiB": 16 * 1024}
CONSUME_LATENCY_SIZES = {"64B": 64, "1KiB": 1024}
CONSUME_BANDWIDTH_SIZES = {"1KiB": 1024, "16KiB": 16 * 1024}
READ_SIZES = {"rdma": 2048, "rdma_64KiB": 64 * 1024}  # RdmaConsumer's default, and a larger
EMPTY_FILL = 8  # records in the topic the empty checks look past
BATCH_BYTES = 64 * 1024
MIN_BATCH_RECORDS = 4
EXPERIMENTS = ("latency", "bandwidth", "partitions", "consume", "empty", "consume-bw", "rf3")


@dataclass(frozen=True)
class Counts:
    latency_samples: int  # per size, per path, per round
    bandwidth_bytes: int  # value bytes per size (or partition count), per path, per round
    rf3_bandwidth_bytes: int  # value bytes per size, per path, per round, RF=3
    consume_bytes: int  # value bytes written once per size and read by every path
    empty_seconds: float  # per path, per round


FULL = Counts(
    latency_samples=5000,
    bandwidth_bytes=1 << 30,
    rf3_bandwidth_bytes=256 << 20,
    consume_bytes=1 << 30,
    empty_seconds=5.0,
)
QUICK = Counts(
    latency_samples=1000,
    bandwidth_bytes=256 << 20,
    rf3_bandwidth_bytes=64 << 20,
    consume_bytes=256 << 20,
    empty_seconds=2.0,
)


def records_per_batch(size: int) -> int:
    return max(MIN_BATCH_RECORDS, BATCH_BYTES // size)


def one_batch(size: int, records: int) -> bytes:
    now = int(time.time() * 1000)
    value = os.urandom(size)
    return build_batch([Record(i, now, None, value) for i in range(records)])


def build_rate_mbps(size: int) -> float:
    """MB/s of record values the Python batch encoder turns into batches, for the record."""
    records = records_per_batch(size)
    value = b"v" * size
    now = int(time.time() * 1000)
    count = max(3, (4 << 20) // (size * records))
    start = time.perf_counter()
    for _ in range(count):
        build_batch([Record(i, now, None, value) for i in range(records)])
    return count * records * size / (time.perf_counter() - start) / 1e6


# --- TCP (confluent-kafka) -------------------------------------------------------------------


def bandwidth_settings(size: int) -> dict[str, Any]:
    """librdkafka batching like the RDMA producer's: records_per_batch(size) a batch."""
    per_batch = records_per_batch(size)
    room = max(1_000_000, 2 * per_batch * (size + 64))
    return {
        "enable.idempotence": False,
        "linger.ms": 5,
        "batch.num.messages": per_batch,
        "batch.size": room,
        "message.max.bytes": room,
    }


def tcp_latency(target: Target, size: int, samples: int, acks: int | str = 1) -> list[float]:
    """Seconds from produce() to the delivery report, one record in flight."""
    value = os.urandom(size)
    reports: list[tuple[KafkaError | None, int | None]] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        reports.append((err, msg.offset()))

    producer = Producer(
        {
            "bootstrap.servers": target.bootstrap,
            "acks": acks,
            "enable.idempotence": False,
            "linger.ms": 0,
            "on_delivery": delivered,
        }
    )
    wait_for_topic(producer, target.topic)
    out: list[float] = []
    deadline = time.monotonic() + TIME_LIMIT
    for i in range(WARMUP + samples):
        start = time.perf_counter()
        producer.produce(target.topic, value, partition=0)
        while len(reports) <= i:
            producer.poll(0.001)
            if time.monotonic() > deadline:
                raise BenchError(f"no delivery report for record {i} in {TIME_LIMIT:.0f} s")
        elapsed = time.perf_counter() - start
        err, offset = reports[i]
        if err is not None or offset != i:
            raise BenchError(f"record {i}: error {err}, offset {offset}")
        if i >= WARMUP:
            out.append(elapsed)
    return out


def tcp_bandwidth(target: Target, size: int, count: int, acks: int | str = 1) -> float:
    """Seconds to produce `count` records of `size` bytes, every one acknowledged."""
    settings = {**bandwidth_settings(size), "acks": acks}
    return produce(
        target.bootstrap, target.topic, [os.urandom(size)] * count, settings, TIME_LIMIT
    ).seconds


def tcp_partitions(target: Target, partitions: int, count: int) -> float:
    """Seconds to produce `count` 1 KiB records round-robin over `partitions` partitions,
    every one acknowledged, each partition's offsets exactly 0..count/partitions-1."""
    value = os.urandom(PARTITION_RECORD)
    offsets: list[list[int]] = [[] for _ in range(partitions)]
    failures: list[str] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        offset, partition = msg.offset(), msg.partition()
        if err is not None or offset is None or partition is None:
            failures.append(str(err))
        else:
            offsets[partition].append(offset)

    producer = Producer(
        {
            "bootstrap.servers": target.bootstrap,
            "acks": 1,
            "on_delivery": delivered,
            **bandwidth_settings(PARTITION_RECORD),
        }
    )
    wait_for_topic(producer, target.topic)
    deadline = time.monotonic() + TIME_LIMIT
    start = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(target.topic, value, partition=i % partitions)
                break
            except BufferError:  # librdkafka's queue is full: serve reports, then retry
                producer.poll(0.005)
                if time.monotonic() > deadline:
                    raise BenchError(f"produce timed out at message {i}") from None
        producer.poll(0)
    left = producer.flush(max(deadline - time.monotonic(), 0.1))
    seconds = time.perf_counter() - start
    if left or failures:
        raise BenchError(f"{left} unsent, {len(failures)} failed: {failures[:1]}")
    for partition, landed in enumerate(offsets):
        if sorted(landed) != list(range(count // partitions)):
            raise BenchError(f"partition {partition}: {len(landed)} records, offsets wrong")
    return seconds


# --- RDMA (shm) ------------------------------------------------------------------------------


def check_offsets(produced: list[Produced], per_batch: int, first: int = 0) -> None:
    expected = [Produced(first + i * per_batch, per_batch) for i in range(len(produced))]
    if produced != expected:
        bad = next(i for i, (p, e) in enumerate(zip(produced, expected, strict=True)) if p != e)
        raise BenchError(f"batch {bad} landed as {produced[bad]}, expected {expected[bad]}")


def rdma_producer(target: Target, partition: int = 0, **options: Any) -> RdmaProducer:
    return RdmaProducer(
        target.leaders[partition], target.topic, partition, provider=PROVIDER, **options
    )


def rdma_latency(target: Target, size: int, samples: int, **options: Any) -> list[float]:
    """Seconds for `send()` of one one-record batch, one in flight."""
    batch = one_batch(size, 1)

    async def run() -> list[float]:
        producer = rdma_producer(target, **options)
        await producer.start()
        out: list[float] = []
        try:
            for i in range(WARMUP + samples):
                start = time.perf_counter()
                produced = await producer.send([batch])
                elapsed = time.perf_counter() - start
                check_offsets(produced, 1, first=i)
                if i >= WARMUP:
                    out.append(elapsed)
        finally:
            await producer.close()
        return out

    return asyncio.run(asyncio.wait_for(run(), TIME_LIMIT))


def rdma_bandwidth(target: Target, size: int, count: int, **options: Any) -> float:
    """Seconds to write `count` records of `size` bytes in batches, every one committed."""
    per_batch = records_per_batch(size)
    batch = one_batch(size, per_batch)
    batches = [batch] * (count // per_batch)

    async def run() -> float:
        producer = rdma_producer(target, **options)
        await producer.start()
        try:
            start = time.perf_counter()
            produced = await producer.send(batches)
            seconds = time.perf_counter() - start
        finally:
            await producer.close()
        check_offsets(produced, per_batch)
        return seconds

    return asyncio.run(asyncio.wait_for(run(), TIME_LIMIT))


def rdma_partitions(target: Target, partitions: int, count: int) -> float:
    """Seconds for one RdmaProducer per partition, all on one event loop (as the drop-in
    Producer runs its writers), to write `count` 1 KiB records split evenly, every one
    committed at the expected offsets."""
    per_batch = records_per_batch(PARTITION_RECORD)
    batches = [one_batch(PARTITION_RECORD, per_batch)] * (count // partitions // per_batch)

    async def run() -> float:
        producers = [rdma_producer(target, p) for p in range(partitions)]
        try:
            for producer in producers:
                await producer.start()
            start = time.perf_counter()
            results = await asyncio.gather(*(p.send(batches) for p in producers))
            seconds = time.perf_counter() - start
        finally:
            for producer in producers:
                await producer.close()
        for produced in results:
            check_offsets(produced, per_batch)
        return seconds

    return asyncio.run(asyncio.wait_for(run(), TIME_LIMIT))


# --- runs ------------------------------------------------------------------------------------


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(len(ordered) * 0.99) - 1)]


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def rotated(names: list[str], rnd: int) -> list[str]:
    """The paths in a different order each round, so none always goes first."""
    shift = rnd % len(names)
    return names[shift:] + names[:shift]


@dataclass(frozen=True)
class Variant:
    """One path of an experiment: what measures it and the config of its topics."""

    measure: Callable[..., Any]
    config: dict[str, str]


Variants = dict[str, Variant]
Figures = dict[str, dict[str, float | None]]  # None: not measured (its path failed)
PUSHED = "directlog_broker_replication_pushed_bytes_total"
CHANNELS = "directlog_broker_replication_push_channels"


class Run:
    """A cluster, a topic counter, and the topic-deletion errors and failed measurements
    seen so far."""

    def __init__(self, cluster: Cluster, replication_factor: int = 1) -> None:
        self.cluster = cluster
        self.bootstrap = cluster.bootstrap
        self.replication_factor = replication_factor
        self.nonce = time.time_ns() % 10**9
        self.topics = 0
        self.deletion_errors: list[str] = []
        self.failures: list[str] = []

    def attempt(
        self, what: str, measure: Callable[..., Any], *args: Any, log: Callable[[], str]
    ) -> Any:
        """measure(*args), or None when it fails: a failing datapath is a finding, so its
        error (traceback, and `log()`: the broker's log tail) is printed and kept in
        `failures`, and the run goes on without that figure."""
        try:
            return measure(*args)
        except Exception as error:
            self.failures.append(f"{what}: {type(error).__name__}: {error}")
            print(f"FAILED {what}:\n{traceback.format_exc()}{log()}", flush=True)
            return None

    def logs(self) -> str:
        return f"the cluster's logs:\n{self.cluster.logs(25)}"

    def on_fresh_topic(
        self,
        what: str,
        measure: Callable[..., Any],
        *args: Any,
        config: dict[str, str] = TOPIC_CONFIG,
        partitions: int = 1,
    ) -> Any:
        """measure(target, *args) on a new topic, deleted afterwards (None if it failed)."""
        self.topics += 1
        topic = f"bench-rdma-{what}-{self.nonce}-{self.topics}"
        leaders: list[BrokerProcess] = []

        def measured() -> Any:
            target, leader = self.create(topic, config, partitions)
            leaders.append(leader)
            result = measure(target, *args)
            if self.pushes(config) and not leader.sample(PUSHED, topic=topic):
                raise BenchError(f"{topic}: the leader pushed nothing (replicated by pull)")
            return result

        def log() -> str:
            return f"leader's log:\n{leaders[0].stderr_tail(25)}" if leaders else ""

        try:
            return self.attempt(topic, measured, log=log)
        finally:
            refused = delete_topic(self.bootstrap, topic)
            if refused and not self.deletion_errors:
                self.deletion_errors.append(refused)
                print(f"topic deletion failed (topics kept): {refused}", flush=True)

    def pushes(self, config: dict[str, str]) -> bool:
        """Whether a topic with `config` replicates by RDMA push on this cluster."""
        return self.replication_factor > 1 and config.get("preallocate") == "true"

    def create(
        self, topic: str, config: dict[str, str], partitions: int
    ) -> tuple[Target, BrokerProcess]:
        """The topic, every partition led and its ISR complete (and, when it replicates by
        push, its push channels open); the leader of partition 0."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        new = NewTopic(topic, partitions, self.replication_factor, config=config)
        admin.create_topics([new], operation_timeout=10, request_timeout=15)[topic].result(20)
        deadline = time.monotonic() + 30
        while True:
            found = admin.list_topics(topic, timeout=5).topics.get(topic)
            parts = found.partitions if found is not None and found.error is None else {}
            if len(parts) == partitions and all(
                p.leader >= 0 and sorted(p.isrs) == sorted(p.replicas) for p in parts.values()
            ):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"{topic}: partitions not all led and in sync after 30 s")
            time.sleep(0.1)
        brokers = self.cluster.brokers
        leaders = {index: brokers[p.leader] for index, p in parts.items()}
        process = leaders[0].process
        assert process is not None
        target = Target(
            self.bootstrap, topic, {i: b.bootstrap for i, b in leaders.items()}, process.pid
        )
        if self.pushes(config):
            want = (self.replication_factor - 1) * partitions
            while leaders[0].total(CHANNELS, topic=topic) < want:
                if time.monotonic() > deadline:
                    raise BenchError(f"{topic}: push channels not open after 30 s")
                time.sleep(0.1)
        return target, leaders[0]


def measure_latency(
    run: Run, title: str, sizes: dict[str, int], variants: Variants, samples: int, rounds: int
) -> Figures:
    """Per size and variant: median and p99 in microseconds (the lowest over rounds)."""
    slug = title.replace(" ", "-")  # in topic names
    figures: Figures = {}
    for label, size in sizes.items():
        best: dict[str, float | None] = {}
        for rnd in range(rounds):
            for name in rotated(list(variants), rnd):
                variant = variants[name]
                found = run.on_fresh_topic(
                    f"{slug}-{name}", variant.measure, size, samples, config=variant.config
                )
                if found is None:
                    continue
                median, tail = statistics.median(found) * 1e6, p99(found) * 1e6
                print(
                    f"{title:>13} {label:>6} {name:10} round {rnd + 1}: "
                    f"median {median:9.1f} us  p99 {tail:9.1f} us",
                    flush=True,
                )
                for key, value in ((f"{name}_median_us", median), (f"{name}_p99_us", tail)):
                    best[key] = min(best.get(key) or math.inf, value)
        figures[label] = best
    return figures


def measure_bandwidth(
    run: Run, title: str, sizes: dict[str, int], variants: Variants, total: int, rounds: int
) -> Figures:
    """Per size and variant: MB/s of record values (the best round)."""
    slug = title.replace(" ", "-")  # in topic names
    figures: Figures = {}
    for label, size in sizes.items():
        per_batch = records_per_batch(size)
        count = max(per_batch, total // size // per_batch * per_batch)
        best: dict[str, float | None] = {"records_per_batch": per_batch, "records": count}
        for rnd in range(rounds):
            for name in rotated(list(variants), rnd):
                variant = variants[name]
                seconds = run.on_fresh_topic(
                    f"{slug}-{name}", variant.measure, size, count, config=variant.config
                )
                if seconds is None:
                    continue
                rate = count * size / seconds / 1e6
                print(
                    f"{title:>13} {label:>6} {name:10} round {rnd + 1}: {rate:9.1f} MB/s "
                    f"({count:,} records, {per_batch} per batch, {seconds:.2f} s)",
                    flush=True,
                )
                best[f"{name}_MBps"] = max(best.get(f"{name}_MBps") or 0.0, rate)
        figures[label] = best
    return figures


def with_ratios(figures: Figures, anchor: str, **ours: str) -> Figures:
    """Adds, per row, ratio key -> figure of `anchor` over that of ours (latency: pass the
    median keys; bandwidth: the MB/s keys, which invert to ours over the anchor)."""
    for row in figures.values():
        for key, name in ours.items():
            theirs, mine = row.get(anchor), row.get(name)
            if theirs is None or mine is None:
                row[key] = None
            elif anchor.endswith("_MBps"):
                row[key] = mine / theirs
            else:
                row[key] = theirs / mine
    return figures


def measure_partitions(run: Run, counts: Counts, rounds: int) -> Figures:
    """Fig. 12: per partition count, MB/s of 1 KiB record values over all partitions."""
    variants = {"tcp": tcp_partitions, "rdma": rdma_partitions}
    per_batch = records_per_batch(PARTITION_RECORD)
    figures: Figures = {}
    for partitions in PARTITION_COUNTS:
        unit = partitions * per_batch
        count = max(unit, counts.bandwidth_bytes // PARTITION_RECORD // unit * unit)
        best: dict[str, float | None] = {"records": count}
        for rnd in range(rounds):
            for name in rotated(list(variants), rnd):
                seconds = run.on_fresh_topic(
                    f"parts-{name}", variants[name], partitions, count, partitions=partitions
                )
                if seconds is None:
                    continue
                rate = count * PARTITION_RECORD / seconds / 1e6
                print(
                    f"{'partitions':>13} {partitions:>6} {name:10} round {rnd + 1}: "
                    f"{rate:9.1f} MB/s ({count:,} records, {seconds:.2f} s)",
                    flush=True,
                )
                best[f"{name}_MBps"] = max(best.get(f"{name}_MBps") or 0.0, rate)
        figures[str(partitions)] = best
    return with_ratios(figures, "tcp_MBps", ratio="rdma_MBps")


def measure_empty(run: Run, counts: Counts, rounds: int) -> dict[str, float | None]:
    """Empty checks per second and the broker's CPU per check, per path (the best round),
    and the broker's CPU share with no client at all."""
    paths = {"tcp": rdma_consume.tcp_empty_fetches, "rdma": rdma_consume.rdma_empty_fetches}

    def measure(target: Target) -> dict[str, float | None]:
        rdma_consume.fill(target, 64, EMPTY_FILL, EMPTY_FILL)
        best: dict[str, EmptyChecks] = {}
        for rnd in range(rounds):
            for name in rotated(list(paths), rnd):
                what = f"{target.topic} {name}"
                found = run.attempt(
                    what, paths[name], target, EMPTY_FILL, counts.empty_seconds, log=run.logs
                )
                if found is None:
                    continue
                rate = found.checks / found.seconds
                print(
                    f"{'empty checks':>13} {name:17} round {rnd + 1}: {rate:11,.0f} /s, "
                    f"broker CPU {found.broker_cpu_seconds / found.seconds:6.1%}",
                    flush=True,
                )
                if name not in best or rate > best[name].checks / best[name].seconds:
                    best[name] = found
        idle = rdma_consume.idle_broker(target, counts.empty_seconds)
        out: dict[str, float | None] = {
            "idle_broker_cpu_share": idle.broker_cpu_seconds / idle.seconds
        }
        for name, found in best.items():
            out[f"{name}_checks_per_s"] = found.checks / found.seconds
            out[f"{name}_broker_cpu_share"] = found.broker_cpu_seconds / found.seconds
            out[f"{name}_broker_cpu_us_per_check"] = found.broker_cpu_seconds / found.checks * 1e6
        ours, theirs = out.get("rdma_checks_per_s"), out.get("tcp_checks_per_s")
        out["ratio"] = ours / theirs if ours is not None and theirs is not None else None
        return out

    result: dict[str, float | None] = run.on_fresh_topic("empty", measure) or {"ratio": None}
    return result


def measure_consume_bandwidth(run: Run, counts: Counts, rounds: int) -> Figures:
    """Fig. 20: per record size, MB/s of record values read from offset 0 to the end of a
    topic written once (over RDMA) and read by every path in turn."""
    figures: Figures = {}
    for label, size in CONSUME_BANDWIDTH_SIZES.items():
        per_batch = records_per_batch(size)
        count = max(per_batch, counts.consume_bytes // size // per_batch * per_batch)
        figures[label] = (
            run.on_fresh_topic("consume-bw", read_back, run, label, size, count, rounds) or {}
        )
    return with_ratios(figures, "tcp_MBps", ratio="rdma_MBps", ratio_64KiB="rdma_64KiB_MBps")


def read_back(
    target: Target, run: Run, label: str, size: int, count: int, rounds: int
) -> dict[str, float | None]:
    """Fill the topic with `count` records of `size` bytes, then read them all with each
    consumer in turn, `rounds` times: the best MB/s of each."""
    per_batch = records_per_batch(size)
    value = rdma_consume.fill(target, size, count, per_batch)
    paths: dict[str, Callable[[], float]] = {
        "tcp": functools.partial(rdma_consume.tcp_consume_bandwidth, target, value, count)
    }
    for name, read_size in READ_SIZES.items():
        paths[name] = functools.partial(
            rdma_consume.rdma_consume_bandwidth, target, value, count, read_size
        )
    best: dict[str, float | None] = {"records": count}
    for rnd in range(rounds):
        for name in rotated(list(paths), rnd):
            seconds = run.attempt(f"{target.topic} {name}", paths[name], log=run.logs)
            if seconds is None:
                continue
            rate = count * size / seconds / 1e6
            print(
                f"{'consume bw':>13} {label:>6} {name:10} round {rnd + 1}: "
                f"{rate:9.1f} MB/s ({count:,} records, {seconds:.2f} s)",
                flush=True,
            )
            best[f"{name}_MBps"] = max(best.get(f"{name}_MBps") or 0.0, rate)
    return best


def measure_rf3(counts: Counts, rounds: int, work: Path) -> tuple[Figures, Figures, list[str]]:
    """Fig. 14/15 on a second cluster of three brokers with RDMA push replication: latency
    and bandwidth figures (ratios against TCP with pull and with push replication) and the
    topic-deletion errors and failed measurements."""
    tcp = functools.partial(tcp_latency, acks="all")
    latency: Variants = {
        "tcp_pull": Variant(tcp, RF3_PULL_CONFIG),
        "tcp_push": Variant(tcp, RF3_PUSH_CONFIG),
        "rdma": Variant(functools.partial(rdma_latency, acks=RF3_RDMA_ACKS), RF3_PUSH_CONFIG),
    }
    tcp_bw = functools.partial(tcp_bandwidth, acks="all")
    bandwidth: Variants = {
        "tcp_pull": Variant(tcp_bw, RF3_PULL_CONFIG),
        "tcp_push": Variant(tcp_bw, RF3_PUSH_CONFIG),
        "rdma": Variant(functools.partial(rdma_bandwidth, acks=RF3_RDMA_ACKS), RF3_PUSH_CONFIG),
    }
    with Cluster(work, brokers=3, broker_settings=RF3_BROKER_SETTINGS) as cluster:
        run = Run(cluster, replication_factor=3)
        print(f"RF=3 cluster up at {run.bootstrap}", flush=True)
        lat = measure_latency(
            run, "rf3 latency", RF3_LATENCY_SIZES, latency, counts.latency_samples, rounds
        )
        bw = measure_bandwidth(
            run, "rf3 bw", RF3_BANDWIDTH_SIZES, bandwidth, counts.rf3_bandwidth_bytes, rounds
        )
    with_ratios(lat, "tcp_pull_median_us", ratio="rdma_median_us")
    with_ratios(lat, "tcp_push_median_us", ratio_push="rdma_median_us")
    with_ratios(bw, "tcp_pull_MBps", ratio="rdma_MBps")
    with_ratios(bw, "tcp_push_MBps", ratio_push="rdma_MBps")
    return lat, bw, run.deletion_errors + run.failures


# --- report ----------------------------------------------------------------------------------


def print_table(title: str, first: str, figures: Figures, columns: list[tuple[str, str]]) -> None:
    """One row per figure: its label, then each (header, key) column."""
    print(f"\n{title}")
    widths = [max(12, len(header) + 2) for header, _ in columns]
    print(f"{first:>10}" + "".join(f"{h:>{w}}" for (h, _), w in zip(columns, widths, strict=True)))
    for label, row in figures.items():
        cells = "".join(
            f"{'failed':>{w}}" if value is None else f"{value:{w}.{2 if 'ratio' in key else 1}f}"
            for (_, key), w in zip(columns, widths, strict=True)
            for value in (row.get(key),)
        )
        print(f"{label:>10}{cells}")


def latency_columns(names: list[str]) -> list[tuple[str, str]]:
    return [
        column
        for name in names
        for column in ((f"{name} median", f"{name}_median_us"), (f"{name} p99", f"{name}_p99_us"))
    ]


def rate_columns(names: list[str]) -> list[tuple[str, str]]:
    return [(f"{name} MB/s", f"{name}_MBps") for name in names]


def headline_of(figures: Figures | None) -> float | None:
    """The geometric mean of the rows' ratios; None unless every row has one."""
    ratios = [row.get("ratio") for row in (figures or {}).values()]
    if not ratios or None in ratios:
        return None
    return geomean([r for r in ratios if r is not None])


GOALS = {
    "produce_latency_ratio": ("TCP median / RDMA median, produce, geometric mean", 3.3),
    "produce_bw_ratio": ("RDMA MB/s / TCP MB/s, produce, geometric mean", 7.0),
    "rf3_latency_ratio": ("TCP+pull median / RDMA+push median, RF=3, geometric mean", 7.0),
    "consume_latency_ratio": ("TCP median / RDMA median, ack to consumer", 50.0),
    "empty_fetch_ratio": ("RDMA empty checks/s / TCP empty fetches/s", 156.0),
}


def print_report(results: dict[str, Any], headline: dict[str, float | None]) -> None:
    print(f"\nNOTE: {os.cpu_count()} cores; clients and brokers share them (loopback, shm).")
    both = ["tcp", "rdma"]
    rf3 = ["tcp_pull", "tcp_push", "rdma"]
    sections: list[tuple[str, str, str, list[tuple[str, str]]]] = [
        (
            "latency",
            "Produce latency (Fig. 10), one record per request, us",
            "size",
            [*latency_columns(both), ("tcp/rdma", "ratio")],
        ),
        (
            "bandwidth",
            "Produce bandwidth (Fig. 11), MB/s of record values",
            "size",
            [
                *rate_columns(both),
                ("rdma/tcp", "ratio"),
                ("py build MB/s", "python_build_batch_MBps"),
            ],
        ),
        (
            "partitions",
            "Produce bandwidth by partitions (Fig. 12), 1 KiB records, MB/s",
            "partitions",
            [*rate_columns(both), ("rdma/tcp", "ratio")],
        ),
        (
            "rf3_latency",
            f"RF=3 produce latency (Fig. 14), acks=all / RDMA acks={RF3_RDMA_ACKS}, us",
            "size",
            [*latency_columns(rf3), ("pull/rdma", "ratio"), ("push/rdma", "ratio_push")],
        ),
        (
            "rf3_bandwidth",
            "RF=3 produce bandwidth (Fig. 15), MB/s",
            "size",
            [*rate_columns(rf3), ("rdma/pull", "ratio"), ("rdma/push", "ratio_push")],
        ),
        (
            "consume_latency",
            "Consume latency (Fig. 18), acknowledgement to hand-out, us",
            "size",
            [*latency_columns(both), ("tcp/rdma", "ratio")],
        ),
        (
            "consume_bandwidth",
            "Consume bandwidth (Fig. 20), MB/s of record values",
            "size",
            [
                *rate_columns([*both, "rdma_64KiB"]),
                ("rdma/tcp", "ratio"),
                ("64KiB/tcp", "ratio_64KiB"),
            ],
        ),
    ]
    for key, title, first, columns in sections:
        if key in results:
            print_table(title, first, results[key], columns)
    if "empty_fetch" in results:
        e = results["empty_fetch"]
        print("\nEmpty fetches (paper 5.3): checks per second with nothing new, broker CPU")
        for name in both:
            if e.get(f"{name}_checks_per_s") is None:
                print(f"{name:>10}{'failed':>14}")
                continue
            print(
                f"{name:>10}{e[f'{name}_checks_per_s']:14,.0f} /s  broker CPU "
                f"{e[f'{name}_broker_cpu_share']:6.1%}  "
                f"{e[f'{name}_broker_cpu_us_per_check']:8.2f} us per check"
            )
        if e.get("idle_broker_cpu_share") is not None:
            print(f"{'idle':>10}{'':14}    broker CPU {e['idle_broker_cpu_share']:6.1%}")
    print()
    for key, value in headline.items():
        what, goal = GOALS[key]
        shown = "none (not run, or a measurement failed)" if value is None else f"{value:.2f}"
        print(f"{key} ({what}): {shown}  (goal >= {goal:g})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.rdma", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and bytes, 1 round")
    parser.add_argument("--rounds", type=int, help="rounds per measurement (3, 1 with --quick)")
    parser.add_argument(
        "--only",
        default=",".join(EXPERIMENTS),
        help=f"comma-separated experiments to run, of {','.join(EXPERIMENTS)} (default: all)",
    )
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if not only <= set(EXPERIMENTS):
        parser.error(f"unknown experiments: {sorted(only - set(EXPERIMENTS))}")
    counts = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else 3)
    keep_freed_heap()
    print(
        f"bench.rdma: RDMA ({PROVIDER}) vs confluent-kafka TCP, in one run; "
        f"{os.cpu_count()} cores shared by the clients and the brokers",
        flush=True,
    )
    results: dict[str, Any] = {}
    errors: list[str] = []
    samples = counts.latency_samples
    with tempfile.TemporaryDirectory(prefix="bench-rdma-") as tmp:
        if only - {"rf3"}:
            with Cluster(Path(tmp) / "rf1", brokers=1, broker_settings=BROKER_SETTINGS) as cluster:
                run = Run(cluster)
                print(f"broker up at {run.bootstrap}", flush=True)
                if "latency" in only:
                    variants = {
                        "tcp": Variant(tcp_latency, TOPIC_CONFIG),
                        "rdma": Variant(rdma_latency, TOPIC_CONFIG),
                    }
                    found = measure_latency(
                        run, "latency", LATENCY_SIZES, variants, samples, rounds
                    )
                    results["latency"] = with_ratios(found, "tcp_median_us", ratio="rdma_median_us")
                if "bandwidth" in only:
                    variants = {
                        "tcp": Variant(tcp_bandwidth, TOPIC_CONFIG),
                        "rdma": Variant(rdma_bandwidth, TOPIC_CONFIG),
                    }
                    found = measure_bandwidth(
                        run, "bandwidth", BANDWIDTH_SIZES, variants, counts.bandwidth_bytes, rounds
                    )
                    for label, size in BANDWIDTH_SIZES.items():
                        found[label]["python_build_batch_MBps"] = build_rate_mbps(size)
                    results["bandwidth"] = with_ratios(found, "tcp_MBps", ratio="rdma_MBps")
                if "partitions" in only:
                    results["partitions"] = measure_partitions(run, counts, rounds)
                if "consume" in only:
                    variants = {
                        "tcp": Variant(rdma_consume.tcp_consume_latency, TOPIC_CONFIG),
                        "rdma": Variant(rdma_consume.rdma_consume_latency, TOPIC_CONFIG),
                    }
                    found = measure_latency(
                        run, "consume", CONSUME_LATENCY_SIZES, variants, samples, rounds
                    )
                    results["consume_latency"] = with_ratios(
                        found, "tcp_median_us", ratio="rdma_median_us"
                    )
                if "empty" in only:
                    results["empty_fetch"] = measure_empty(run, counts, rounds)
                if "consume-bw" in only:
                    results["consume_bandwidth"] = measure_consume_bandwidth(run, counts, rounds)
                errors += run.deletion_errors + run.failures
        if "rf3" in only:
            lat, bw, deletion = measure_rf3(counts, rounds, Path(tmp) / "rf3")
            results["rf3_latency"], results["rf3_bandwidth"] = lat, bw
            errors += deletion
    headline = {
        "produce_latency_ratio": headline_of(results.get("latency")),
        "produce_bw_ratio": headline_of(results.get("bandwidth")),
        "rf3_latency_ratio": headline_of(results.get("rf3_latency")),
        "consume_latency_ratio": headline_of(results.get("consume_latency")),
        "empty_fetch_ratio": results["empty_fetch"]["ratio"] if "empty_fetch" in results else None,
    }
    print_report(results, headline)
    for error in errors:
        print(f"ERROR: {error}")
    result = {
        "bench": "rdma",
        "provider": PROVIDER,
        "cores": os.cpu_count(),
        **headline,
        **results,
        "counts": {**vars(counts), "rounds": rounds, "warmup": WARMUP},
        "errors": errors,
    }
    save_results("rdma", result, headline)


if __name__ == "__main__":
    main()
