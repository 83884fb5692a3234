"""RDMA produce (shm provider) against our own TCP Kafka path, in one run: the KafkaDirect
paper's (SIGMOD'22) produce experiments that can be measured today.

    python -m bench.rdma [--quick] [--rounds N]

One Directlog cluster (tests/e2e/cluster.py: a consensus member, the controller and one
broker, subprocesses on loopback) with `rdma_produce` on and `rdma_provider=shm`, production
heartbeat timeouts and the default grant size (`rdma_grant_max_bytes`, 8 MiB: a producer
takes a new grant every 8 MiB, and that cost is in its figures). Every measurement gets a
fresh one-partition topic with `preallocate=true` (required by RDMA produce; the TCP topics
get it too, so only the path differs), deleted afterwards. Both paths run against the same
broker in the same run, alternating which goes first from round to round.

* TCP: confluent-kafka (librdkafka) with acks=1, idempotence off.
* RDMA: directlog.client.rdma_produce.RdmaProducer over shm (default window, 16 writes in
  flight; default 4 MiB staging). Its record batches are built before the clock starts:
  the Python batch encoder (directlog.records.batch.build_batch) is not the transport under
  test, and its own rate is printed beside the figures so nobody mistakes one for the
  other. librdkafka builds its batches in C inside its timing.

Experiments:

1. Produce latency (paper Fig. 10): one record per request, the next sent when the last is
   acknowledged; median and p99 of send-to-acknowledgement for 64 B, 1 KiB and 16 KiB
   values. TCP: `linger.ms=0`, `Producer.poll` until the delivery report. RDMA: `send()` of
   one one-record batch. Ratio per size = TCP median / RDMA median.
2. Produce bandwidth by record size (Fig. 11): 256 B, 1 KiB, 4 KiB, 16 KiB and 64 KiB
   values, MB/s (10**6 bytes) of record values. Both paths put the same number of records
   in a batch: max(4, 64 KiB / size) (256, 64, 16, 4 and 4), i.e. 64 KiB batches, and four
   records for the big sizes. TCP: `batch.num.messages` set to that, `linger.ms=5`,
   `batch.size` large enough that it is never the limit. RDMA: `send()` of all the batches
   in one call (the client pipelines up to its window). Ratio per size = RDMA MB/s / TCP MB/s.

Every figure is checked: every record acknowledged, at offsets 0..n-1 (TCP delivery reports,
RDMA base offsets and record counts). Rounds: `--rounds` (3, or 1 with `--quick`); latency
keeps each size's lowest median and lowest p99 over rounds, bandwidth the best round.

The headline ratios, `produce_latency_ratio` and `produce_bw_ratio`, are the geometric means
of the per-size ratios (the per-size ratios and their minimum are in the JSON file). The
paper's goals (issue 7): latency >= 3.3x lower, bandwidth >= 7x higher.

The machine has two cores: the client (this process, plus librdkafka's threads) and the
broker share them, and shm RDMA's broker side still needs the broker's CPU to commit each
batch and reply. The figures say how the two paths compare here, not what RDMA hardware
would do.

Not yet measurable (the features do not exist yet), so no figures or keys for them:
produce bandwidth by partitions (Fig. 12), RF=3 produce latency and bandwidth over RDMA
replication (Fig. 14/15, `rf3_latency_ratio`), RDMA consume latency (Fig. 18,
`consume_latency_ratio`), empty-fetch rate and broker CPU per empty fetch
(`empty_fetch_ratio`), consume bandwidth (Fig. 20).

The output is a table, the ratios, bench/results/rdma.json, and a final JSON line with the
two ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.broker import BenchError, delete_topic, produce, wait_for_topic
from directlog.client.rdma_produce import Produced, RdmaProducer
from directlog.records.batch import Record, build_batch
from tests.e2e.cluster import Cluster

RESULTS = Path(__file__).resolve().parent / "results"
PROVIDER = "shm"
BROKER_SETTINGS = {
    "heartbeat_interval_ms": 1000,
    "replica_lag_time_max_ms": 30000,
    "rdma_produce": True,
    "rdma_provider": PROVIDER,
}
TOPIC_CONFIG = {"preallocate": "true"}
LATENCY_SIZES = {"64B": 64, "1KiB": 1024, "16KiB": 16 * 1024}
BANDWIDTH_SIZES = {
    "256B": 256,
    "1KiB": 1024,
    "4KiB": 4 * 1024,
    "16KiB": 16 * 1024,
    "64KiB": 64 * 1024,
}
BATCH_BYTES = 64 * 1024
MIN_BATCH_RECORDS = 4
WARMUP = 50
TIME_LIMIT = 120.0


@dataclass(frozen=True)
class Counts:
    latency_samples: int  # per size, per path, per round
    bandwidth_bytes: int  # value bytes per size, per path, per round


FULL = Counts(latency_samples=5000, bandwidth_bytes=1 << 30)
QUICK = Counts(latency_samples=1000, bandwidth_bytes=256 << 20)


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


# --- topics ----------------------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1, config=TOPIC_CONFIG)],
        operation_timeout=10,
        request_timeout=15,
    )[topic]
    future.result(timeout=20)
    wait_for_topic(admin, topic)


# --- TCP (confluent-kafka) -------------------------------------------------------------------


def tcp_producer(bootstrap: str, on_delivery: Any, **settings: Any) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": 1,
            "enable.idempotence": False,
            "on_delivery": on_delivery,
            **settings,
        }
    )


def tcp_latency(bootstrap: str, topic: str, size: int, samples: int) -> list[float]:
    """Seconds from produce() to the delivery report, one record in flight."""
    value = os.urandom(size)
    reports: list[tuple[KafkaError | None, int | None]] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        reports.append((err, msg.offset()))

    producer = tcp_producer(bootstrap, delivered, **{"linger.ms": 0})
    wait_for_topic(producer, topic)
    out: list[float] = []
    deadline = time.monotonic() + TIME_LIMIT
    for i in range(WARMUP + samples):
        start = time.perf_counter()
        producer.produce(topic, value, partition=0)
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


def tcp_bandwidth(bootstrap: str, topic: str, size: int, count: int) -> float:
    """Seconds to produce `count` records of `size` bytes, every one acknowledged."""
    per_batch = records_per_batch(size)
    settings = {
        "enable.idempotence": False,
        "linger.ms": 5,
        "batch.num.messages": per_batch,
        "batch.size": max(1_000_000, 2 * per_batch * (size + 64)),
        "message.max.bytes": max(1_000_000, 2 * per_batch * (size + 64)),
    }
    return produce(bootstrap, topic, [os.urandom(size)] * count, settings, TIME_LIMIT).seconds


# --- RDMA (shm) ------------------------------------------------------------------------------


def check_offsets(produced: list[Produced], per_batch: int, first: int = 0) -> None:
    expected = [Produced(first + i * per_batch, per_batch) for i in range(len(produced))]
    if produced != expected:
        bad = next(i for i, (p, e) in enumerate(zip(produced, expected, strict=True)) if p != e)
        raise BenchError(f"batch {bad} landed as {produced[bad]}, expected {expected[bad]}")


def rdma_latency(bootstrap: str, topic: str, size: int, samples: int) -> list[float]:
    """Seconds for `send()` of one one-record batch, one in flight."""
    batch = one_batch(size, 1)

    async def run() -> list[float]:
        producer = RdmaProducer(bootstrap, topic, 0, provider=PROVIDER)
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


def rdma_bandwidth(bootstrap: str, topic: str, size: int, count: int) -> float:
    """Seconds to write `count` records of `size` bytes in batches, every one committed."""
    per_batch = records_per_batch(size)
    batch = one_batch(size, per_batch)
    batches = [batch] * (count // per_batch)

    async def run() -> float:
        producer = RdmaProducer(bootstrap, topic, 0, provider=PROVIDER)
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


# --- runs ------------------------------------------------------------------------------------


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(len(ordered) * 0.99) - 1)]


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


class Run:
    """The cluster, a topic counter and the figures collected so far."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.nonce = time.time_ns() % 10**9
        self.topics = 0
        self.deletion_errors: list[str] = []

    def topic(self, what: str) -> str:
        self.topics += 1
        return f"bench-rdma-{what}-{self.nonce}-{self.topics}"

    def on_fresh_topic(self, what: str, measure: Any, *args: Any) -> Any:
        topic = self.topic(what)
        create_topic(self.bootstrap, topic)
        try:
            return measure(self.bootstrap, topic, *args)
        finally:
            refused = delete_topic(self.bootstrap, topic)
            if refused and not self.deletion_errors:
                self.deletion_errors.append(refused)
                print(f"topic deletion failed (topics kept): {refused}", flush=True)


def measure_latency(run: Run, counts: Counts, rounds: int) -> dict[str, dict[str, float]]:
    """Per size: tcp/rdma median and p99 in microseconds (lowest over rounds)."""
    figures: dict[str, dict[str, float]] = {}
    paths = {"tcp": tcp_latency, "rdma": rdma_latency}
    for label, size in LATENCY_SIZES.items():
        best: dict[str, float] = {}
        for rnd in range(rounds):
            order = ("tcp", "rdma") if rnd % 2 == 0 else ("rdma", "tcp")
            for path in order:
                samples = run.on_fresh_topic(
                    f"lat-{path}", paths[path], size, counts.latency_samples
                )
                median, tail = statistics.median(samples) * 1e6, p99(samples) * 1e6
                print(
                    f"latency   {label:>6} {path:4} round {rnd + 1}: "
                    f"median {median:9.1f} us  p99 {tail:9.1f} us",
                    flush=True,
                )
                for key, value in ((f"{path}_median_us", median), (f"{path}_p99_us", tail)):
                    best[key] = min(best.get(key, math.inf), value)
        best["ratio"] = best["tcp_median_us"] / best["rdma_median_us"]
        figures[label] = best
    return figures


def measure_bandwidth(run: Run, counts: Counts, rounds: int) -> dict[str, dict[str, float]]:
    """Per size: tcp/rdma MB/s of record values (best round)."""
    figures: dict[str, dict[str, float]] = {}
    paths = {"tcp": tcp_bandwidth, "rdma": rdma_bandwidth}
    for label, size in BANDWIDTH_SIZES.items():
        per_batch = records_per_batch(size)
        count = max(per_batch, counts.bandwidth_bytes // size // per_batch * per_batch)
        best: dict[str, float] = {"records_per_batch": per_batch, "records": count}
        for rnd in range(rounds):
            order = ("tcp", "rdma") if rnd % 2 == 0 else ("rdma", "tcp")
            for path in order:
                seconds = run.on_fresh_topic(f"bw-{path}", paths[path], size, count)
                rate = count * size / seconds / 1e6
                print(
                    f"bandwidth {label:>6} {path:4} round {rnd + 1}: {rate:9.1f} MB/s "
                    f"({count:,} records, {per_batch} per batch, {seconds:.2f} s)",
                    flush=True,
                )
                best[f"{path}_MBps"] = max(best.get(f"{path}_MBps", 0.0), rate)
        best["ratio"] = best["rdma_MBps"] / best["tcp_MBps"]
        best["python_build_batch_MBps"] = build_rate_mbps(size)
        figures[label] = best
    return figures


def print_report(latency: dict[str, dict[str, float]], bw: dict[str, dict[str, float]]) -> None:
    cores = os.cpu_count()
    print(f"\nNOTE: {cores} cores; client and broker share them (loopback, shm provider).")
    print("\nProduce latency (Fig. 10), one record per request, microseconds")
    print(
        f"{'size':>8}{'tcp median':>12}{'tcp p99':>10}{'rdma median':>13}{'rdma p99':>10}"
        f"{'tcp/rdma':>10}"
    )
    for label, f in latency.items():
        print(
            f"{label:>8}{f['tcp_median_us']:12.1f}{f['tcp_p99_us']:10.1f}"
            f"{f['rdma_median_us']:13.1f}{f['rdma_p99_us']:10.1f}{f['ratio']:10.2f}"
        )
    print("\nProduce bandwidth (Fig. 11), MB/s of record values")
    print(
        f"{'size':>8}{'rec/batch':>10}{'tcp MB/s':>10}{'rdma MB/s':>11}{'rdma/tcp':>10}"
        f"{'  (py build_batch MB/s, untimed)':>34}"
    )
    for label, f in bw.items():
        print(
            f"{label:>8}{int(f['records_per_batch']):10d}{f['tcp_MBps']:10.1f}"
            f"{f['rdma_MBps']:11.1f}{f['ratio']:10.2f}{f['python_build_batch_MBps']:34.1f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.rdma", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and bytes, 1 round")
    parser.add_argument("--rounds", type=int, help="rounds per measurement (3, 1 with --quick)")
    args = parser.parse_args(argv)
    counts = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else 3)
    print(
        f"bench.rdma: RDMA produce ({PROVIDER}) vs confluent-kafka TCP (acks=1), one broker; "
        f"{os.cpu_count()} cores shared by the client and the broker",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory(prefix="bench-rdma-") as tmp,
        Cluster(Path(tmp), brokers=1, broker_settings=BROKER_SETTINGS) as cluster,
    ):
        run = Run(cluster.brokers[0].bootstrap)
        print(f"broker up at {run.bootstrap}", flush=True)
        latency = measure_latency(run, counts, rounds)
        bandwidth = measure_bandwidth(run, counts, rounds)
    latency_ratio = geomean([f["ratio"] for f in latency.values()])
    bw_ratio = geomean([f["ratio"] for f in bandwidth.values()])
    print_report(latency, bandwidth)
    print(
        f"\nproduce_latency_ratio (TCP median / RDMA median, geometric mean over sizes): "
        f"{latency_ratio:.2f}  (goal >= 3.3)"
    )
    print(
        f"produce_bw_ratio (RDMA MB/s / TCP MB/s, geometric mean over sizes): "
        f"{bw_ratio:.2f}  (goal >= 7)"
    )
    headline = {"produce_latency_ratio": latency_ratio, "produce_bw_ratio": bw_ratio}
    result = {
        "bench": "rdma",
        "provider": PROVIDER,
        "cores": os.cpu_count(),
        **headline,
        "produce_latency_ratio_min": min(f["ratio"] for f in latency.values()),
        "produce_bw_ratio_min": min(f["ratio"] for f in bandwidth.values()),
        "latency": latency,
        "bandwidth": bandwidth,
        "counts": {**vars(counts), "rounds": rounds, "warmup": WARMUP},
        "errors": run.deletion_errors,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "rdma.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
