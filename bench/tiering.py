"""Tiered storage (KIP-405) against what it replaces and against the store's own speed.

    python -m bench.tiering [--quick]

Three figures, each measured side by side in one run, on clusters of tests/e2e/cluster.py
(consensus member, controller, brokers and tiering services as subprocesses on loopback):

* rebuild (the seed's test case 3): a follower of a one-partition RF=2 topic holding
  `--rebuild-mb` of data is stopped, its disk wiped, and started again; measured are the
  record bytes it fetches from the leader (its pulled-bytes counter) and the time from its
  registration until the leader takes it back into the ISR (both from the brokers' log
  lines), with
  tiering (local.retention.bytes=0: only the head segment is local) and without, the same
  data retained (8 GiB by default, as 32 KiB records in 16 MiB segments). Goal: at least
  100x fewer bytes and 100x less time.
* catch-up read: confluent-kafka reads a tiered topic from offset 0, every record from the
  remote store through the broker (8 MiB fetches), against the store's own ranged-read
  rate through pyarrow for the same objects and ranges (adjoining remoteLogIndex entries
  read in order, up to 8 MiB a read, as the broker reads them). For `file://` both are
  measured with the objects out of the page cache (written back, then posix_fadvise
  DONTNEED, as a store's own disks would be) and again warm; `s3://` is moto's server.
  Goal: at least 0.5 of the store's rate, cold `file://` and S3.
  A warm `file://` store reads at memory speed (4-12 GB/s here), far above what any Kafka
  consumer can take through a broker on this machine: the same consumer reading the same
  data from a topic kept local (page-cached segments, sent with sendfile) is measured in
  the same run as that limit, and the warm figure is given against both.
* produce latency: p99 of acks=all sends to an RF=3 topic, one in flight, while a
  background producer (about 8 MB/s) keeps a tiered topic's segments rolling and its
  tiering services copying, against the same load on a topic without remote storage, in
  alternating rounds on one cluster (medians of the rounds). Goal: at most 1.1x.

The output closes with one JSON line; the same JSON goes to bench/results/tiering.json.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.processes import keep_freed_heap, save_results
from bench.replication import throughput
from directlog.remote.index import RemoteIndex
from directlog.remote.store import RemoteStore, StoreConfig
from tests.e2e.cluster import Cluster, wait_for
from tests.s3_server import S3Server

TIERING = {"interval_ms": 200, "follower_sync_interval_ms": 500}
VALUE_BYTES = 32 * 1024
CATCH_UP_FETCH_BYTES = 8 << 20
CONSUME_CALL_BYTES = 8 << 20  # value bytes asked of one Consumer.consume call
TIMEOUT = 600.0
REGISTERED = re.compile(r"^(\S+ \S+) INFO services\.broker\.controller_link: registered", re.M)
BOTH_IN_SYNC = re.compile(
    r"^(\S+ \S+) INFO services\.broker\.partition: rebuild-0: ISR now \[0, 1\]", re.M
)


class BenchError(Exception):
    pass


# Helpers ---------------------------------------------------------------------------------


def create(bootstrap: str, topic: str, replication: int, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, replication, config=configs)])[topic].result(60)
    wait_for(lambda: isr(bootstrap, topic) == replication, 60, f"{topic}'s ISR")


def isr(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partition = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(0)
    return len(partition.isrs) if partition is not None else 0


def leader(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return int(admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader)


def fill(bootstrap: str, topic: str, total_bytes: int) -> int:
    """Produce `total_bytes` of 32 KiB values to a new topic (acks=all, every one checked);
    returns the records sent."""
    count = total_bytes // VALUE_BYTES
    throughput(bootstrap, topic, os.urandom(VALUE_BYTES), count)
    return count


def sample(cluster: Cluster, node: int, name: str, **labels: str) -> float:
    return cluster.brokers[node].total(name, **labels)


def logged_at(cluster: Cluster, node: int, line: re.Pattern[str]) -> float:
    """Wall time of the last line of broker `node`'s log that `line` matches."""
    found = line.findall(cluster.brokers[node].stderr_text())
    if not found:
        raise BenchError(f"broker {node} never logged {line.pattern}")
    return datetime.strptime(found[-1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def tiered_configs() -> dict[str, str]:
    return {
        "remote.storage.enable": "true",
        "local.retention.bytes": "0",
        "retention.ms": "-1",
        "segment.bytes": str(16 << 20),
    }


# Rebuild ---------------------------------------------------------------------------------


def rebuild(work: Path, data_mb: int, tiered: bool) -> dict[str, float]:
    """Wipe the follower and time it back into the ISR."""
    settings = {"remote": f"file://{work}/remote", **TIERING} if tiered else None
    with Cluster(work, brokers=2, tiering=settings) as cluster:
        configs = tiered_configs() if tiered else {"retention.ms": "-1"}
        configs["segment.bytes"] = str(16 << 20)
        create(cluster.bootstrap, "rebuild", 2, configs)
        fill(cluster.bootstrap, "rebuild", data_mb << 20)
        lead = leader(cluster.bootstrap, "rebuild")
        follower = 1 - lead
        if tiered:
            for node in (lead, follower):
                wait_for(
                    lambda node=node: (
                        local_start(cluster, node) > 0 and local_bytes(cluster, node) < 64 << 20
                    ),
                    TIMEOUT,
                    f"broker {node} keeping only its local tail",
                )
        retained = log_end(cluster, lead)
        broker = cluster.brokers[follower]
        if tiered:
            cluster.tierings[follower].stop()
        broker.stop()
        shutil.rmtree(broker.data_dir)
        broker.start()
        if tiered:
            cluster.tierings[follower].start()
        wait_for(lambda: isr(cluster.bootstrap, "rebuild") == 2, TIMEOUT, "the ISR complete")
        pulled = sample(cluster, follower, "directlog_broker_replica_pulled_bytes_total")
        seconds = logged_at(cluster, lead, BOTH_IN_SYNC) - logged_at(cluster, follower, REGISTERED)
        local = local_bytes(cluster, lead)
    return {
        "records": retained,
        "leader_local_MB": round(local / 1e6, 1),
        "pulled_MB": round(pulled / 1e6, 3),
        "seconds": round(seconds, 3),
    }


def local_start(cluster: Cluster, node: int) -> float:
    return sample(cluster, node, "directlog_broker_local_log_start_offset", topic="rebuild")


def local_bytes(cluster: Cluster, node: int) -> float:
    return sample(cluster, node, "directlog_broker_log_size_bytes", topic="rebuild")


def log_end(cluster: Cluster, node: int) -> int:
    return int(sample(cluster, node, "directlog_broker_log_end_offset", topic="rebuild"))


# Catch-up read ---------------------------------------------------------------------------


def catch_up(work: Path, data_mb: int, store_kind: str, s3: S3Server | None) -> dict[str, float]:
    if store_kind == "file":
        remote = {"remote": f"file://{work}/remote"}
    else:
        assert s3 is not None
        remote = {"remote": f"s3://{s3.bucket}/{work.name}", **s3.settings}
    with Cluster(work, tiering={**remote, **TIERING}) as cluster:
        create(cluster.bootstrap, "history", 1, tiered_configs())
        count = fill(cluster.bootstrap, "history", data_mb << 20)
        if store_kind == "file":  # the limit: the same data read from local segments
            create(cluster.bootstrap, "local", 1, {"segment.bytes": str(16 << 20)})
            fill(cluster.bootstrap, "local", data_mb << 20)
        broker = cluster.brokers[0]
        wait_for(
            lambda: (
                broker.total("directlog_broker_local_log_start_offset", topic="history")
                >= count - (16 << 20) // VALUE_BYTES - 1
            ),
            TIMEOUT,
            "the history tiered",
        )
        directory = broker.data_dir / "history-0"
        index = RemoteIndex.open(directory)
        local_start = int(broker.total("directlog_broker_local_log_start_offset", topic="history"))
        entries = [e for e in index if e.first_offset < local_start]
        index.close()
        store = RemoteStore(StoreConfig(**_store_fields(remote)))
        remote_bytes = sum(e.data_length for e in entries)
        figures: dict[str, float] = {"remote_MB": round(remote_bytes / 1e6, 1)}
        temperatures = ("cold", "warm") if store_kind == "file" else ("server",)
        for temperature in temperatures:
            if temperature == "cold":
                evict(work / "remote")
            store_rate = read_store(store, entries) / 1e6
            if temperature == "cold":
                evict(work / "remote")
            broker_rate = read_broker(cluster.bootstrap, "history", local_start)
            figures[f"{temperature}_store_MBps"] = round(store_rate, 1)
            figures[f"{temperature}_broker_MBps"] = round(broker_rate / 1e6, 1)
            figures[f"{temperature}_ratio"] = round(broker_rate / 1e6 / store_rate, 3)
            if temperature == "warm":
                local_rate = read_broker(cluster.bootstrap, "local", local_start)
                figures["warm_local_broker_MBps"] = round(local_rate / 1e6, 1)
                figures["warm_remote_local_ratio"] = round(broker_rate / local_rate, 3)
    return figures


def _store_fields(remote: dict[str, str]) -> dict[str, str]:
    """StoreConfig's fields from the tiering service's."""
    return {"uri" if k == "remote" else k: v for k, v in remote.items()}


def evict(directory: Path) -> None:
    """Drop the objects' pages from the page cache (written back first: dirty pages stay):
    a store's data is on its own disks, not in the reader's memory."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def read_store(store: RemoteStore, entries: list[Any]) -> float:
    """Bytes/s of the entries' data read in order through pyarrow, in the ranges a broker
    asks of the store for a catch-up consumer: adjoining entries of one object, up to one
    fetch's bytes per read."""
    runs: list[tuple[str, int, int]] = []  # key, position, length
    for entry in entries:
        key = store.key_of(entry.rdi.uri)
        if (
            runs
            and runs[-1][0] == key
            and runs[-1][1] + runs[-1][2] == entry.rdi.position
            and runs[-1][2] + entry.data_length <= CATCH_UP_FETCH_BYTES
        ):
            runs[-1] = (key, runs[-1][1], runs[-1][2] + entry.data_length)
        else:
            runs.append((key, entry.rdi.position, entry.data_length))
    start = time.perf_counter()
    total = sum(store.read(*run).nbytes for run in runs)
    return total / (time.perf_counter() - start)


def read_broker(bootstrap: str, topic: str, upto: int) -> float:
    """Bytes/s of record values read by confluent-kafka from offset 0 to `upto`."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"catch-up-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            # librdkafka pauses fetching for fetch.queue.backoff.ms (1 s by default) once
            # its queue passes queued.max.messages.kbytes; a fast broker trips it.
            "fetch.queue.backoff.ms": 5,
            # A consumer catching up asks for more per fetch than the 1 MiB default: every
            # fetch of remote records is a round trip through the broker's reader threads.
            "max.partition.fetch.bytes": CATCH_UP_FETCH_BYTES,
        }
    )
    consumer.assign([CTopicPartition(topic, 0, 0)])
    start = time.perf_counter()
    got = 0
    value_bytes = 0
    deadline = time.monotonic() + TIMEOUT
    try:
        while got < upto and time.monotonic() < deadline:
            # No more per call than librdkafka's prefetch queue holds (bench.broker's rule).
            for message in consumer.consume(CONSUME_CALL_BYTES // VALUE_BYTES, timeout=0.5):
                if message.error() is not None:
                    raise BenchError(str(message.error()))
                got += 1
                value_bytes += len(message.value())
    finally:
        consumer.close()
    if got < upto:
        raise BenchError(f"{topic}: {got}/{upto} records read back")
    return value_bytes / (time.perf_counter() - start)


# Produce latency --------------------------------------------------------------------------


def produce_latency(work: Path, samples: int, rounds: int) -> dict[str, Any]:
    """p50 and p99 of a probe's sends while the load goes, in alternating rounds, to a topic
    without remote storage (nothing to copy: tiering off) and to one with it (its segments
    copied as they close), on one cluster, so both sides share its placement on the cores.
    The figures are the medians over the rounds."""
    # The tiering services' own intervals (a round a second), not the quick ones the other
    # parts use to finish sooner: this is the normal traffic of the seed's test case 1.
    settings = {"remote": f"file://{work}/remote"}
    figures: dict[str, list[float]] = {"off_p50": [], "off_p99": [], "on_p50": [], "on_p99": []}
    with Cluster(work, brokers=3, tiering=settings) as cluster:
        configs = {"min.insync.replicas": "2", "segment.bytes": str(4 << 20)}
        create(cluster.bootstrap, "plain", 3, configs)
        create(cluster.bootstrap, "tiered", 3, {**tiered_configs(), **configs})
        create(cluster.bootstrap, "probe", 3, {"min.insync.replicas": "2"})
        copied = 0.0
        for _ in range(rounds):
            for side, topic in (("off", "plain"), ("on", "tiered")):
                before = copied_segments(cluster)
                latencies = probe_under_load(cluster.bootstrap, topic, samples)
                copied += copied_segments(cluster) - before if side == "on" else 0
                latencies.sort()
                figures[f"{side}_p50"].append(statistics.median(latencies) * 1000)
                figures[f"{side}_p99"].append(latencies[int(len(latencies) * 0.99) - 1] * 1000)
    result: dict[str, Any] = {
        name: round(statistics.median(values), 3) for name, values in figures.items()
    }
    result["p99_rounds_ms"] = {k: [round(v, 3) for v in vs] for k, vs in figures.items()}
    result["segments_copied"] = copied
    return result


def copied_segments(cluster: Cluster) -> float:
    return sum(
        t.total("directlog_tiering_copied_segments_total") for t in cluster.tierings.values()
    )


def probe_under_load(bootstrap: str, topic: str, samples: int) -> list[float]:
    stop = threading.Event()
    background = threading.Thread(target=load, args=(bootstrap, topic, stop), daemon=True)
    background.start()
    try:
        time.sleep(1.0)  # the load's segments start rolling (and being copied)
        return probe(bootstrap, samples)
    finally:
        stop.set()
        background.join(60)


def load(bootstrap: str, topic: str, stop: threading.Event) -> None:
    """About 8 MB/s of 32 KiB values: segments roll every half second."""
    client = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    value = os.urandom(VALUE_BYTES)
    while not stop.is_set():
        for _ in range(32):
            client.produce(topic, value, partition=0)
        client.poll(0)
        time.sleep(0.125)
    client.flush(60)


def probe(bootstrap: str, count: int) -> list[float]:
    client = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    client.produce("probe", b"warm", partition=0)
    client.flush(30)
    samples = []
    for _ in range(count):
        done: list[Any] = []
        start = time.perf_counter()
        client.produce(
            "probe", b"x" * 100, partition=0, on_delivery=lambda e, m, done=done: done.append(e)
        )
        while not done:
            client.poll(0.0005)
        samples.append(time.perf_counter() - start)
        if done[0] is not None:
            raise BenchError(str(done[0]))
        time.sleep(0.002)
    return samples


# Run ----------------------------------------------------------------------------------------


PARTS = ("rebuild", "read", "latency")


def run(
    parts: tuple[str, ...], quick: bool, rebuild_mb: int, read_mb: int, samples: int
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tiering-") as name:
        root = Path(name)
        if "rebuild" in parts:
            figures.update(run_rebuild(root, rebuild_mb))
        if "read" in parts:
            figures["catch_up_file"] = catch_up(root / "read-file", read_mb, "file", None)
            with S3Server(root / "s3") as s3:
                figures["catch_up_s3"] = catch_up(
                    root / "read-s3", min(read_mb, 128 if quick else 256), "s3", s3
                )
            for kind in ("file", "s3"):
                print(
                    f"catch-up read, {kind}: {figures[f'catch_up_{kind}']} (goal: cold and "
                    "server ratios >= 0.5; warm against the local-read limit)"
                )
        if "latency" in parts:
            latency = produce_latency(root / "latency", samples, 2 if quick else 3)
            figures["produce_latency"] = latency
            figures["produce_p99_ratio"] = round(latency["on_p99"] / latency["off_p99"], 3)
            print(
                f"produce acks=all RF=3: p99 {latency['on_p99']} ms with tiering copying "
                f"({latency['segments_copied']:.0f} segments) against {latency['off_p99']} ms "
                f"without (medians of alternating rounds): {figures['produce_p99_ratio']}x "
                "(goal <= 1.1)",
                flush=True,
            )
    return figures


def run_rebuild(root: Path, rebuild_mb: int) -> dict[str, Any]:
    without = rebuild(root / "rebuild-local", rebuild_mb, tiered=False)
    shutil.rmtree(root / "rebuild-local", ignore_errors=True)
    with_tiering = rebuild(root / "rebuild-tiered", rebuild_mb, tiered=True)
    shutil.rmtree(root / "rebuild-tiered", ignore_errors=True)
    figures = {
        "rebuild_without": without,
        "rebuild_with": with_tiering,
        "rebuild_bytes_ratio": round(
            without["pulled_MB"] / max(with_tiering["pulled_MB"], 1e-6), 1
        ),
        "rebuild_time_ratio": round(without["seconds"] / max(with_tiering["seconds"], 1e-6), 1),
    }
    print(
        f"rebuild, {rebuild_mb} MB retained: without tiering {without['pulled_MB']} MB "
        f"in {without['seconds']} s; with tiering {with_tiering['pulled_MB']} MB in "
        f"{with_tiering['seconds']} s: {figures['rebuild_bytes_ratio']}x fewer bytes, "
        f"{figures['rebuild_time_ratio']}x less time (goal 100x, 100x)",
        flush=True,
    )
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.tiering", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="less data, fewer samples")
    parser.add_argument("--rebuild-mb", type=int)
    parser.add_argument("--read-mb", type=int)
    parser.add_argument("--samples", type=int)
    parser.add_argument("--only", action="append", choices=PARTS, help="run only these parts")
    args = parser.parse_args(argv)
    keep_freed_heap()
    figures = run(
        tuple(args.only or PARTS),
        args.quick,
        args.rebuild_mb or (512 if args.quick else 8192),
        args.read_mb or (256 if args.quick else 1024),
        args.samples or (500 if args.quick else 2000),
    )
    save_results("tiering", figures)


if __name__ == "__main__":
    main()
