"""Produce throughput and latency with RF=1 against RF=3, acks=all, over TCP replication.

    python -m bench.replication [--quick] [--rounds N]

The setups of the KafkaDirect paper's Fig. 14-16 (SIGMOD'22), on one machine: a Directlog
cluster of three brokers (tests/e2e/cluster.py: consensus member, controller, brokers as
subprocesses on loopback), one topic with one partition per replication factor, RF=3 with
min.insync.replicas=2. Through confluent-kafka with acks=all:

* throughput: `--messages` records pipelined (librdkafka batching, linger.ms=5), msg/s and
  MB/s of record values, every acknowledgement checked (count and offsets 0..n-1);
* latency: one record at a time (the next sent when the last is acknowledged), p50 and p99
  of send-to-acknowledgement.

Record sizes 100 bytes and 32 KiB. The RF=3/RF=1 ratios say what replication costs; these
figures are the baseline the RDMA replication issue must beat. The brokers, the client and
the followers share two cores, so RF=3 also pays for two more processes' CPU. The output
closes with one JSON line; the same JSON goes to bench/results/replication.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.processes import save_results
from tests.e2e.cluster import Cluster

SIZES = {"100B": 100, "32KiB": 32 * 1024}
PRODUCTION_TIMEOUTS = {"heartbeat_interval_ms": 1000, "replica_lag_time_max_ms": 30000}


class BenchError(Exception):
    pass


def create(bootstrap: str, topic: str, replication: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"min.insync.replicas": str(min(2, replication))}
    admin.create_topics([NewTopic(topic, 1, replication, config=config)])[topic].result(30)
    deadline = time.monotonic() + 30
    while True:
        partition = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(0)
        if partition is not None and len(partition.isrs) == replication and partition.leader >= 0:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"{topic}: ISR never complete")
        time.sleep(0.1)


def producer(bootstrap: str, **extra: Any) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", **extra})


def throughput(bootstrap: str, topic: str, value: bytes, count: int) -> float:
    """Records/s for `count` pipelined sends, every one acknowledged at offsets 0..count-1."""
    acked: list[int] = []
    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        (failures.append(str(error)) if error else acked.append(message.offset()))

    client = producer(bootstrap, **{"linger.ms": 5, "on_delivery": delivered})
    start = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                client.produce(topic, value, partition=0)
                break
            except BufferError:
                client.poll(0.005)
        client.poll(0)
    if client.flush(120):
        raise BenchError(f"{topic}: sends left unacknowledged")
    seconds = time.perf_counter() - start
    if failures or sorted(acked) != list(range(count)):
        raise BenchError(f"{topic}: {len(acked)}/{count} acknowledged, {failures[:1]}")
    return count / seconds


def latency(bootstrap: str, topic: str, value: bytes, count: int) -> tuple[float, float]:
    """p50 and p99 seconds from send to acknowledgement, one record in flight."""
    client = producer(bootstrap, **{"linger.ms": 0})
    client.produce(topic, value, partition=0)  # warm the connection and metadata
    client.flush(30)
    samples = []
    for _ in range(count):
        done: list[Any] = []
        start = time.perf_counter()
        client.produce(
            topic, value, partition=0, on_delivery=lambda e, m, done=done: done.append(e)
        )
        while not done:
            client.poll(0.0005)
        samples.append(time.perf_counter() - start)
        if done[0] is not None:
            raise BenchError(f"{topic}: {done[0]}")
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def run(messages: int, latency_samples: int, rounds: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-replication-") as name,
        Cluster(Path(name), brokers=3, broker_settings=PRODUCTION_TIMEOUTS) as cluster,
    ):
        for label, size in SIZES.items():
            value = bytes(size)
            count = messages if size < 1024 else max(messages // 50, 500)
            for replication in (1, 3):
                best, p50s, p99s = 0.0, [], []
                for round_ in range(rounds):
                    topic = f"rf{replication}-{label}-{round_}"
                    create(cluster.bootstrap, topic, replication)
                    best = max(best, throughput(cluster.bootstrap, topic, value, count))
                    p50, p99 = latency(cluster.bootstrap, topic, value, latency_samples)
                    p50s.append(p50)
                    p99s.append(p99)
                key = f"rf{replication}_{label}"
                figures[f"{key}_msgs"] = round(best)
                figures[f"{key}_MBps"] = round(best * size / 1e6, 1)
                figures[f"{key}_p50_ms"] = round(min(p50s) * 1000, 3)
                figures[f"{key}_p99_ms"] = round(min(p99s) * 1000, 3)
                print(
                    f"RF={replication} {label:>6}: {best:12,.0f} msg/s "
                    f"{best * size / 1e6:8.1f} MB/s   p50 {min(p50s) * 1000:6.2f} ms "
                    f"p99 {min(p99s) * 1000:6.2f} ms",
                    flush=True,
                )
            figures[f"ratio_throughput_rf3_rf1_{label}"] = round(
                figures[f"rf3_{label}_msgs"] / figures[f"rf1_{label}_msgs"], 3
            )
            figures[f"ratio_p50_rf3_rf1_{label}"] = round(
                figures[f"rf3_{label}_p50_ms"] / figures[f"rf1_{label}_p50_ms"], 3
            )
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.replication", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer messages, one round")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--messages", type=int)
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    messages = args.messages or (20_000 if args.quick else 100_000)
    figures = run(messages, 200 if args.quick else 1000, rounds)
    save_results("replication", figures)


if __name__ == "__main__":
    main()
