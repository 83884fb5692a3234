"""Lazy, chunked down-conversion for old consumers (KIP-283) against eager conversion.

    python -m bench.down_conversion [--quick] [--rounds N] [--[no-]chunk-sizes]

The seed's two experiments (its "Testing Strategy"), in one run, on a one-broker Directlog
cluster (tests/e2e/cluster.py: a consensus member, the controller and the broker as
subprocesses on free loopback ports). The data is written once with confluent-kafka (1 KiB
values, no key, uncompressed, `batch.size` 16384 as the Java producer's default, so a chunk
holds several batches: a batch is never split, so with batches larger than a chunk a chunk
is one batch). The broker is then restarted over the same data directory with
`down_conversion_chunk_bytes` 131072 (lazy, the default) or 0 (eager: each partition's
answer converted whole before anything is sent, as before KIP-283), the order alternating
round after round, so both read the same files under the same machine noise.

The old consumer is a raw Fetch v3 client (requests encoded by hand in this file): it
receives the answer into one 1 MiB buffer and walks the legacy entries' offset/size headers
as they arrive, dropping what it has walked, so neither its memory nor a decoder bounds a
figure. A trailing entry claiming more than is left (the broker's padding: offset -1, size
0x7FFFFFFF, zeros) is skipped as old clients skip it.

* memory (the seed's first experiment): fetches of `fetch.max.bytes` 250 MiB and
  `max.partition.fetch.bytes` 1 MiB over the 250 partitions of a topic holding 1100
  records (about 1.1 MiB) per partition: about 250 MiB an answer (300 records, 75 MiB, with
  --quick). Measured is the broker process's peak resident memory growth: its peak is reset
  by writing 5 to /proc/<pid>/clear_refs, then VmRSS is read, the fetches are sent and
  their answers read, and VmHWM from /proc/<pid>/status is compared with that VmRSS. On
  each restarted broker, after a warm-up (one 4-partition fetch of 64 KiB a partition and
  one scrape of its metrics page): the first such fetch, the same fetch again, then 4 at
  once on 4 connections (growth per fetch = growth / 4). Every message of every answer is
  checked (its CRC and magic, offsets consecutive from 0), and each partition's message
  count must equal the one computed from the batches in its segment file (the whole
  converted batches that fit in S_pre = max(source bytes, first batch converted)): the
  figures are of real answers. Also reported: the time to each answer's first byte, and
  the largest value of the broker's directlog_broker_temporary_memory_bytes{request=
  "fetch"} gauge seen (sampled every 50 ms; the eager path does not set it). Goals: the
  lazy broker's peak RSS grows by at most 2 MiB per fetch in flight in every measurement,
  whatever the fetch size; the eager one's by about the answer or more.
* throughput (the seed's second experiment): 1 GiB of 1 KiB records (128 MiB with --quick)
  over 12 partitions, consumed from offset 0 to the end on one connection by the same
  client loop (the Java consumer's defaults: 50 MiB a fetch, 1 MiB a partition, one fetch
  in flight): Fetch v3 (magic 1) from the lazy broker and from the eager one, and Fetch v4
  (the v2 batches as stored, sent with sendfile: zero-copy; the loop walks batch headers)
  after each of those restarts. MB/s are of record values (records x 1024 bytes, MB =
  10**6 bytes), medians of the rounds. Goal: lazy/eager at least 1.1 (the seed's 197.7
  against 178.9 MB/s); the fraction lazy/zero-copy is reported. With the chunk sizes
  sweep (on by default, off with --quick) the lazy broker also runs with 32 KiB,
  512 KiB and 1 MiB chunks (the seed's table), throughput only.

What bounds a figure: next to each pass are the cores the client (this process) and the
broker kept busy, the cores' worth of broker threads that were ready but waited for a CPU
(schedstat), and the broker's page faults per MB sent. Measured alone in this process, once:
the client loop over a recorded answer replayed from memory (v3 and v4), and the broker's
own conversion function (convert_batches to magic 1) over the first 1 MiB of each
partition. A figure near the conversion's own rate with the broker near one core is
conversion-bound (the broker converts on its event loop's one core); one far below the
client's own rate is not client-bound. The machine's load average is recorded at the start
and the end: the client, the broker and whatever else runs here share its cores. So is the
commit the broker runs from (commit: trees of services/ and directlog/), at the start and
the end: each restart loads the code afresh.

The output closes with one JSON line holding every figure and the goals, each with whether
it is met; the same JSON is written to bench/results/down_conversion.json.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.processes import cpu_seconds, keep_freed_heap, print_goals, save_results
from services.broker.down_conversion import convert_batches
from tests.e2e.cluster import Cluster, wait_for

VALUE_BYTES = 1024
LEGACY_ENTRY_BYTES = 12 + 22 + VALUE_BYTES  # offset, size; crc, magic, attributes, ts, key, value
LAZY_CHUNK = 128 * 1024
SWEEP_CHUNKS = (32 * 1024, 512 * 1024, 1024 * 1024)
MEMORY_TOPIC, MEMORY_PARTITIONS = "memory", 250
MEMORY_MAX_BYTES = 250 << 20
THROUGHPUT_TOPIC, THROUGHPUT_PARTITIONS = "throughput", 12
THROUGHPUT_MAX_BYTES = 50 << 20  # the Java consumer's fetch.max.bytes
PARTITION_MAX_BYTES = 1 << 20  # max.partition.fetch.bytes, both experiments
IN_FLIGHT = 4
WARM_PARTITIONS, WARM_PARTITION_BYTES = 4, 64 * 1024
GAUGE_SECONDS = 0.05
CLIENT_BUFFER = 1 << 20
TIMEOUT = 300.0
PRODUCER = {
    "acks": 1,
    "linger.ms": 5,
    "batch.size": 16384,  # the Java producer's default
    "compression.type": "none",
    "queue.buffering.max.kbytes": 64 * 1024,
}
GOAL_LAZY_GROWTH_MIB = 2.0
GOAL_LAZY_EAGER = 1.1
MIB = 1 << 20

FETCH_KEY = 1
CLIENT_ID = b"bench-down-conversion"
ENTRY = struct.Struct(">qi")  # offset (base offset), size (batch length)
INT16, INT32 = struct.Struct(">h"), struct.Struct(">i")
RESPONSE_HEAD = struct.Struct(">iiii")  # size, correlation id, throttle ms, topics
PARTITION_HEAD = {3: struct.Struct(">ihq"), 4: struct.Struct(">ihqqi")}  # + lso, aborted
V2_LAST_DELTA_AT, V2_COUNT_AT, V2_HEADER = 23, 57, 61
GAUGE_LINE = re.compile(
    rb'^directlog_broker_temporary_memory_bytes\{request="fetch"\} (\S+)$', re.MULTILINE
)


class BenchError(Exception):
    pass


@dataclass(frozen=True)
class Sizes:
    memory_records: int  # per partition of the memory topic
    throughput_records: int  # in all, over the throughput topic's partitions
    rounds: int


FULL = Sizes(memory_records=1100, throughput_records=(1 << 30) // VALUE_BYTES, rounds=4)
QUICK = Sizes(memory_records=300, throughput_records=(128 << 20) // VALUE_BYTES, rounds=2)


# The raw old consumer ------------------------------------------------------------------


def fetch_request(
    version: int,
    correlation: int,
    topic: str,
    offsets: dict[int, int],
    max_bytes: int,
    partition_max_bytes: int,
) -> bytes:
    """A size-prefixed Fetch v3 or v4 request (header v1) for `offsets` of one topic."""
    name = topic.encode()
    parts = [
        struct.pack(">hhih", FETCH_KEY, version, correlation, len(CLIENT_ID)),
        CLIENT_ID,
        struct.pack(">iiii", -1, 500, 1, max_bytes),  # replica, max wait, min bytes, max bytes
        b"\x00" if version >= 4 else b"",  # isolation level: read_uncommitted
        struct.pack(">ih", 1, len(name)),
        name,
        INT32.pack(len(offsets)),
        *(struct.pack(">iqi", p, o, partition_max_bytes) for p, o in offsets.items()),
    ]
    payload = b"".join(parts)
    return INT32.pack(len(payload)) + payload


class Stream:
    """A connection's bytes, received into one fixed buffer and dropped once walked: the
    client holds CLIENT_BUFFER bytes whatever the answer's size. One request in flight, so
    nothing past the answer is ever received."""

    def __init__(self, receive: Callable[[memoryview], int]) -> None:
        self.receive = receive
        self.buffer = bytearray(CLIENT_BUFFER)
        self.view = memoryview(self.buffer)
        self.start = self.end = 0
        self.first_byte_at = 0.0

    def need(self, count: int) -> None:
        """At least `count` unread bytes at buffer[start:end]."""
        if self.end - self.start >= count:
            return
        if count > len(self.buffer):
            raise BenchError(f"{count} bytes needed at once, the buffer holds {len(self.buffer)}")
        if self.start:
            left = self.end - self.start
            self.view[:left] = self.view[self.start : self.end]
            self.start, self.end = 0, left
        while self.end - self.start < count:
            got = self.receive(self.view[self.end :])
            if not got:
                raise BenchError("the broker closed the connection mid-answer")
            if not self.first_byte_at:
                self.first_byte_at = time.perf_counter()
            self.end += got

    def skip(self, count: int) -> None:
        have = self.end - self.start
        if count <= have:
            self.start += count
            return
        count -= have
        self.start = self.end = 0
        while count:
            got = self.receive(self.view[: min(count, len(self.buffer))])
            if not got:
                raise BenchError("the broker closed the connection mid-answer")
            count -= got

    def take(self, layout: struct.Struct) -> tuple[Any, ...]:
        self.need(layout.size)
        values = layout.unpack_from(self.buffer, self.start)
        self.start += layout.size
        return values

    def walk(self, length: int, magic: int, first: int, verify: bool) -> tuple[int, int]:
        """Walk `length` bytes of records: legacy entries (magic 0/1) or v2 batches. Returns
        (records, the offset after the last whole one, or `first` if none). Offsets must go
        on from `first` without a gap. A trailing entry that claims more than is left (the
        cut-off message header, offset -1 and size 0x7FFFFFFF, or a message cut by the
        limit) is skipped as old clients skip it. `verify` checks every legacy message's
        CRC and magic too."""
        buffer = self.buffer
        left = length
        records = 0
        expected = first
        while left >= ENTRY.size:
            if self.end - self.start < ENTRY.size:
                self.need(ENTRY.size)
            offset, size = ENTRY.unpack_from(buffer, self.start)
            whole = ENTRY.size + size
            if size < 0 or whole > left:
                break
            if offset != expected:
                raise BenchError(f"offset {offset} where {expected} was expected")
            if magic == 2:
                if self.end - self.start < V2_HEADER:
                    self.need(V2_HEADER)
                (delta,) = INT32.unpack_from(buffer, self.start + V2_LAST_DELTA_AT)
                (count,) = INT32.unpack_from(buffer, self.start + V2_COUNT_AT)
                records += count
                expected = offset + delta + 1
            else:
                if verify:
                    self.need(whole)
                    at = self.start + ENTRY.size
                    crc = int.from_bytes(buffer[at : at + 4], "big")
                    if buffer[at + 4] != magic or zlib.crc32(self.view[at + 4 : at + size]) != crc:
                        raise BenchError(f"message at offset {offset}: bad magic or CRC")
                records += 1
                expected = offset + 1
            if self.end - self.start >= whole:
                self.start += whole
            else:
                self.skip(whole)
            left -= whole
        self.skip(left)
        return records, expected


@dataclass
class Answer:
    """What one fetch answer held, partition by partition."""

    records: dict[int, int] = field(default_factory=dict)
    next_offsets: dict[int, int] = field(default_factory=dict)
    record_bytes: int = 0  # the records fields' sizes, padding included
    first_byte_at: float = 0.0


def read_answer(
    stream: Stream, version: int, correlation: int, offsets: dict[int, int], verify: bool
) -> Answer:
    """Walk one Fetch v3/v4 answer from `stream`, every partition error-free."""
    size, got_correlation, _, topics = stream.take(RESPONSE_HEAD)
    if got_correlation != correlation:
        raise BenchError(f"answer to request {got_correlation}, not {correlation}")
    magic = 1 if version < 4 else 2
    answer = Answer()
    for _ in range(topics):
        (name_length,) = stream.take(INT16)
        stream.skip(name_length)
        (partitions,) = stream.take(INT32)
        for _ in range(partitions):
            head = stream.take(PARTITION_HEAD[min(version, 4)])
            index, error = head[0], head[1]
            if error:
                raise BenchError(f"partition {index}: error code {error}")
            if version >= 4 and head[4] > 0:
                stream.skip(head[4] * 16)  # aborted transactions: producer id, first offset
            (length,) = stream.take(INT32)
            length = max(length, 0)
            count, after = stream.walk(length, magic, offsets[index], verify)
            answer.records[index] = count
            answer.next_offsets[index] = after
            answer.record_bytes += length
    if stream.start != stream.end:
        raise BenchError(f"{stream.end - stream.start} bytes left after a {size}-byte answer")
    answer.first_byte_at = stream.first_byte_at
    return answer


class OldConsumer:
    """One connection sending Fetch v3 (or v4) requests one at a time."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.socket = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        self.stream = Stream(self.socket.recv_into)
        self.correlation = 0

    def send(
        self,
        version: int,
        topic: str,
        offsets: dict[int, int],
        max_bytes: int,
        partition_max_bytes: int = PARTITION_MAX_BYTES,
    ) -> None:
        self.correlation += 1
        request = fetch_request(
            version, self.correlation, topic, offsets, max_bytes, partition_max_bytes
        )
        self.stream.first_byte_at = 0.0
        self.socket.sendall(request)

    def receive(self, version: int, offsets: dict[int, int], verify: bool = False) -> Answer:
        return read_answer(self.stream, version, self.correlation, offsets, verify)

    def fetch(
        self,
        version: int,
        topic: str,
        offsets: dict[int, int],
        max_bytes: int,
        partition_max_bytes: int = PARTITION_MAX_BYTES,
        *,
        verify: bool = False,
    ) -> Answer:
        self.send(version, topic, offsets, max_bytes, partition_max_bytes)
        return self.receive(version, offsets, verify)

    def close(self) -> None:
        self.socket.close()


# Data ------------------------------------------------------------------------------------


def create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = {"retention.ms": "-1", "retention.bytes": "-1"}
    admin.create_topics([NewTopic(topic, partitions, 1, config=configs)])[topic].result(60)
    wait_for(lambda: led(bootstrap, topic) == partitions, 60, f"{topic}'s leaders")


def led(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
    return sum(1 for p in found if p.leader >= 0 and p.error is None)


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> float:
    """`per_partition` 1 KiB records to each partition, round robin, every one acknowledged
    without error; returns MB/s of values."""
    acked = [0] * partitions
    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))
        else:
            acked[message.partition()] += 1

    client = Producer({"bootstrap.servers": bootstrap, **PRODUCER, "on_delivery": delivered})
    value = os.urandom(VALUE_BYTES)
    started = time.perf_counter()
    for i in range(per_partition * partitions):
        while True:
            try:
                client.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                client.poll(0.005)
        if i % 1000 == 0:
            client.poll(0)
    if client.flush(TIMEOUT):
        raise BenchError(f"{topic}: sends left unacknowledged")
    seconds = time.perf_counter() - started
    if failures or acked != [per_partition] * partitions:
        raise BenchError(f"{topic}: {sum(acked)} acknowledged, {failures[:1]}")
    return per_partition * partitions * VALUE_BYTES / seconds / 1e6


def expected_records(data_dir: Path, topic: str, partitions: int, magic: int) -> dict[int, int]:
    """Records each partition's answer to a fetch from offset 0 must hold, from the v2
    batches in its first segment file: the whole batches within PARTITION_MAX_BYTES (at
    least one), and for magic 1 the whole converted batches that fit in S_pre = max(those
    bytes, the first batch converted), each record LEGACY_ENTRY_BYTES."""
    expected = {}
    for partition in range(partitions):
        directory = data_dir / f"{topic}-{partition}"
        (segment,) = sorted(directory.glob("*.log"))[:1]
        with open(segment, "rb") as file:
            data = file.read(PARTITION_MAX_BYTES + MIB)
        counts: list[int] = []
        position = source = 0
        while position + V2_HEADER <= len(data):
            (length,) = INT32.unpack_from(data, position + 8)
            if length <= 0 or (counts and source + 12 + length > PARTITION_MAX_BYTES):
                break
            (count,) = INT32.unpack_from(data, position + V2_COUNT_AT)
            counts.append(count)
            source += 12 + length
            position += 12 + length
        if magic == 2:
            expected[partition] = sum(counts)
            continue
        room = max(source, counts[0] * LEGACY_ENTRY_BYTES)
        fitted = 0
        for count in counts:
            if count * LEGACY_ENTRY_BYTES > room:
                break
            room -= count * LEGACY_ENTRY_BYTES
            fitted += count
        expected[partition] = fitted
    return expected


# The broker -------------------------------------------------------------------------------


def restart(cluster: Cluster, chunk_bytes: int, partitions: dict[str, int]) -> int:
    """The broker stopped and started over the same data with `chunk_bytes`; returns its
    pid once every partition answers a fetch."""
    broker = cluster.brokers[0]
    broker.stop()
    broker.settings["down_conversion_chunk_bytes"] = chunk_bytes
    broker.start()
    for topic, count in partitions.items():
        wait_for(
            lambda topic=topic, count=count: serves(broker.bootstrap, topic, count),  # type: ignore[misc]
            60,
            f"{topic} served",
        )
    assert broker.process is not None
    return broker.process.pid


def serves(bootstrap: str, topic: str, partitions: int) -> bool:
    client = OldConsumer(bootstrap)
    try:
        client.fetch(4, topic, dict.fromkeys(range(partitions), 0), MIB, 4096)
        return True
    except BenchError:
        return False
    finally:
        client.close()


def status_kib(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise BenchError(f"no {field_name} in /proc/{pid}/status")


class GaugeWatch:
    """The largest value of the temporary-memory gauge seen while it runs."""

    def __init__(self, metrics_url: str) -> None:
        self.url = metrics_url
        self.peak = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(GAUGE_SECONDS):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    found = GAUGE_LINE.search(response.read())
            except OSError:
                continue
            if found:
                self.peak = max(self.peak, float(found.group(1)))
                self.samples += 1

    def __enter__(self) -> GaugeWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


# Memory ------------------------------------------------------------------------------------


def memory(
    cluster: Cluster, pid: int, in_flight: int, expected: dict[int, int]
) -> dict[str, float]:
    """Peak RSS growth of broker `pid` while `in_flight` clients each fetch the memory
    topic's 250 partitions from offset 0 at once; every answer checked against
    `expected`."""
    broker = cluster.brokers[0]
    offsets = dict.fromkeys(range(MEMORY_PARTITIONS), 0)
    clients = [OldConsumer(broker.bootstrap) for _ in range(in_flight)]
    answers: list[Answer | BaseException] = [BenchError("no answer")] * in_flight
    try:
        # Code paths and conversion threads warmed before the peak is reset, with a fetch
        # too small to leave a heap behind.
        warm = dict.fromkeys(range(WARM_PARTITIONS), 0)
        clients[0].fetch(3, MEMORY_TOPIC, warm, MEMORY_MAX_BYTES, WARM_PARTITION_BYTES)
        urllib.request.urlopen(broker.metrics_url, timeout=10).close()  # its first page too
        time.sleep(0.3)

        def one(index: int) -> None:
            try:
                answers[index] = clients[index].receive(3, offsets, verify=True)
            except BaseException as error:
                answers[index] = error

        threads = [threading.Thread(target=one, args=(i,)) for i in range(in_flight)]
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        before = status_kib(pid, "VmRSS")
        with GaugeWatch(broker.metrics_url) as gauge:
            started = time.perf_counter()
            for client in clients:
                client.send(3, MEMORY_TOPIC, offsets, MEMORY_MAX_BYTES)
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(TIMEOUT)
            seconds = time.perf_counter() - started
        peak = status_kib(pid, "VmHWM")
    finally:
        for client in clients:
            client.close()
    for answer in answers:
        if isinstance(answer, BaseException):
            raise BenchError(f"a memory fetch failed: {answer}") from answer
        if answer.records != expected:
            wrong = {p: (n, expected[p]) for p, n in answer.records.items() if n != expected[p]}
            raise BenchError(f"records (got, expected) differ in partitions {wrong}")
    first = [a.first_byte_at for a in answers if isinstance(a, Answer)]
    record_bytes = sum(a.record_bytes for a in answers if isinstance(a, Answer))
    growth = (peak - before) / 1024
    return {
        "rss_before_MiB": round(before / 1024, 1),
        "growth_MiB": round(growth, 2),
        "growth_per_fetch_MiB": round(growth / in_flight, 2),
        "answer_MiB": round(record_bytes / in_flight / MIB, 1),
        "messages_per_answer": sum(expected.values()),
        "seconds": round(seconds, 3),
        "first_byte_ms": round((min(first) - started) * 1000, 1),
        "last_first_byte_ms": round((max(first) - started) * 1000, 1),
        "gauge_peak_MiB": round(gauge.peak / MIB, 3),
        "gauge_samples": gauge.samples,
    }


# Throughput -------------------------------------------------------------------------------


def broker_counters(pid: int) -> tuple[float, int, float]:
    """(CPU seconds, page faults, seconds its threads waited for a CPU) of process `pid` so
    far; the wait summed over the threads alive now (schedstat's run_delay)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    faults = int(fields[7]) + int(fields[9])  # minflt, majflt
    waited = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            waited += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
    return cpu_seconds(pid), faults, waited / 1e9


@dataclass
class Pass:
    seconds: float
    records: int
    record_bytes: int
    client_cores: float
    broker_cores: float
    broker_waiting: float  # cores' worth of broker threads ready but not running
    broker_faults: int

    @property
    def value_mbps(self) -> float:
        return self.records * VALUE_BYTES / self.seconds / 1e6

    def figures(self) -> dict[str, float]:
        return {
            "MBps": round(self.value_mbps, 1),
            "wire_MBps": round(self.record_bytes / self.seconds / 1e6, 1),
            "seconds": round(self.seconds, 3),
            "client_cores": round(self.client_cores, 2),
            "broker_cores": round(self.broker_cores, 2),
            "broker_waiting_cores": round(self.broker_waiting, 2),
            "broker_faults_per_MB": round(self.broker_faults / (self.record_bytes / 1e6), 1),
        }


def consume(bootstrap: str, pid: int, version: int, ends: dict[int, int]) -> Pass:
    """Every record of the throughput topic from offset 0 to `ends`, one fetch in flight,
    offsets advanced from the walked entries."""
    client = OldConsumer(bootstrap)
    offsets = dict.fromkeys(ends, 0)
    records = record_bytes = 0
    stalls = 0
    try:
        cpu_client, before = time.process_time(), broker_counters(pid)
        started = time.perf_counter()
        while offsets:
            answer = client.fetch(version, THROUGHPUT_TOPIC, offsets, THROUGHPUT_MAX_BYTES)
            records += sum(answer.records.values())
            record_bytes += answer.record_bytes
            stalls = 0 if any(answer.records.values()) else stalls + 1
            if stalls > 3:
                raise BenchError(f"no records from offsets {offsets} of {ends}")
            offsets = {p: o for p, o in answer.next_offsets.items() if o < ends[p]}
        seconds = time.perf_counter() - started
        client_cpu = time.process_time() - cpu_client
        cpu, faults, waited = (b - a for a, b in zip(before, broker_counters(pid), strict=True))
    finally:
        client.close()
    if records != sum(ends.values()):
        raise BenchError(f"{records} records read, {sum(ends.values())} produced")
    return Pass(
        seconds,
        records,
        record_bytes,
        client_cpu / seconds,
        cpu / seconds,
        waited / seconds,
        int(faults),
    )


class Replay:
    """An answer's bytes handed out again from memory, as a socket would."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.at = 0

    def receive(self, into: memoryview) -> int:
        count = min(len(into), len(self.data) - self.at)
        into[:count] = self.data[self.at : self.at + count]
        self.at += count
        return count


def client_rate(bootstrap: str, version: int, partitions: int, seconds: float = 1.0) -> float:
    """MB/s of values the client loop walks alone: one answer from offset 0, recorded, then
    replayed from memory until `seconds` have passed."""
    client = OldConsumer(bootstrap)
    recorded = bytearray()

    def record(into: memoryview) -> int:
        got = client.socket.recv_into(into)
        recorded.extend(into[:got])
        return got

    offsets = dict.fromkeys(range(partitions), 0)
    try:
        client.send(version, THROUGHPUT_TOPIC, offsets, THROUGHPUT_MAX_BYTES)
        read_answer(Stream(record), version, client.correlation, offsets, verify=False)
    finally:
        client.close()
    data = bytes(recorded)
    walked = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        answer = read_answer(Stream(Replay(data).receive), version, 1, offsets, verify=False)
        walked += sum(answer.records.values())
    return walked * VALUE_BYTES / (time.perf_counter() - started) / 1e6


def conversion_rate(data_dir: Path, partitions: int, seconds: float = 1.0) -> float:
    """MB/s of values the broker's own conversion (convert_batches, to magic 1) makes in
    this process, alone: the whole batches in the first PARTITION_MAX_BYTES of each
    partition's first segment, converted again and again until `seconds` have passed."""
    sources = []
    for partition in range(partitions):
        (segment,) = sorted((data_dir / f"{THROUGHPUT_TOPIC}-{partition}").glob("*.log"))[:1]
        with open(segment, "rb") as file:
            data = file.read(PARTITION_MAX_BYTES)
        end = position = 0
        while position + V2_HEADER <= len(data):
            (length,) = INT32.unpack_from(data, position + 8)
            if length <= 0 or position + 12 + length > len(data):
                break
            position = end = position + 12 + length
        sources.append(data[:end])
    converted = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        for source in sources:
            converted += sum(count for _, count in convert_batches(source, 1))
    return converted * VALUE_BYTES / (time.perf_counter() - started) / 1e6


# Run ----------------------------------------------------------------------------------------


def broker_source() -> str:
    """The broker's code: the git trees of services/ and directlog/ at HEAD (short), with
    "+dirty" if the working tree differs from them. Each restart loads the code afresh,
    so a change during a run would mix versions."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "unknown"

    trees = "/".join(git("rev-parse", "--short", f"HEAD:{d}") for d in ("services", "directlog"))
    dirty = git("status", "--porcelain", "--", "services", "directlog")
    return f"{git('rev-parse', '--short', 'HEAD')}:{trees}" + ("+dirty" if dirty else "")


# Memory measurements on each restarted broker, in this order: a fresh broker's first such
# fetch, the same again (what a broker that has served one keeps growing by), then
# IN_FLIGHT at once.
MEMORY_STEPS = (("1_fresh", 1), ("1_again", 1), (f"{IN_FLIGHT}_at_once", IN_FLIGHT))


@dataclass
class Collected:
    memory: dict[str, dict[str, list[dict[str, float]]]] = field(default_factory=dict)
    passes: dict[str, list[Pass]] = field(default_factory=dict)
    pairs: list[float] = field(default_factory=list)  # lazy/eager, round by round

    def add_pass(self, name: str, result: Pass) -> None:
        self.passes.setdefault(name, []).append(result)

    def add_memory(self, name: str, step: str, figures: dict[str, float]) -> None:
        self.memory.setdefault(name, {}).setdefault(step, []).append(figures)


def name_of(chunk: int) -> str:
    return "eager" if chunk == 0 else f"lazy_{chunk // 1024}k"


def run(sizes: Sizes, sweep: bool) -> dict[str, Any]:
    collected = Collected()
    source = broker_source()
    load_start = os.getloadavg()
    started = time.monotonic()
    per_partition = sizes.throughput_records // THROUGHPUT_PARTITIONS
    topics = {MEMORY_TOPIC: MEMORY_PARTITIONS, THROUGHPUT_TOPIC: THROUGHPUT_PARTITIONS}
    lazy = name_of(LAZY_CHUNK)
    with (
        tempfile.TemporaryDirectory(prefix="bench-down-conversion-") as name,
        Cluster(Path(name), broker_settings={"down_conversion_chunk_bytes": LAZY_CHUNK}) as cluster,
    ):
        bootstrap = cluster.bootstrap
        create(bootstrap, MEMORY_TOPIC, MEMORY_PARTITIONS)
        create(bootstrap, THROUGHPUT_TOPIC, THROUGHPUT_PARTITIONS)
        produced = {
            MEMORY_TOPIC: produce(bootstrap, MEMORY_TOPIC, MEMORY_PARTITIONS, sizes.memory_records),
            THROUGHPUT_TOPIC: produce(
                bootstrap, THROUGHPUT_TOPIC, THROUGHPUT_PARTITIONS, per_partition
            ),
        }
        print(
            f"produced {MEMORY_PARTITIONS} x {sizes.memory_records} and {THROUGHPUT_PARTITIONS}"
            f" x {per_partition} records of {VALUE_BYTES} bytes "
            f"({produced[MEMORY_TOPIC]:.0f} and {produced[THROUGHPUT_TOPIC]:.0f} MB/s)",
            flush=True,
        )
        data_dir = cluster.brokers[0].data_dir
        expected = expected_records(data_dir, MEMORY_TOPIC, MEMORY_PARTITIONS, 1)
        ends = dict.fromkeys(range(THROUGHPUT_PARTITIONS), per_partition)
        alone: dict[str, float] = {
            "conversion_magic1_MBps": round(conversion_rate(data_dir, THROUGHPUT_PARTITIONS), 1)
        }
        for round_ in range(sizes.rounds):
            main = [LAZY_CHUNK, 0] if round_ % 2 == 0 else [0, LAZY_CHUNK]
            extra = list(SWEEP_CHUNKS if round_ % 2 == 0 else reversed(SWEEP_CHUNKS))
            mbps: dict[str, float] = {}
            for chunk in main + (extra if sweep else []):
                label = name_of(chunk)
                pid = restart(cluster, chunk, topics)
                if chunk in main:
                    for step, in_flight in MEMORY_STEPS:
                        figures = memory(cluster, pid, in_flight, expected)
                        collected.add_memory(label, step, figures)
                        print(f"round {round_} {label:>9} memory {step}: {figures}", flush=True)
                result = consume(cluster.bootstrap, pid, 3, ends)
                collected.add_pass(label, result)
                mbps[label] = result.value_mbps
                print(f"round {round_} {label:>9} Fetch v3: {result.figures()}", flush=True)
                if chunk in main:
                    result = consume(cluster.bootstrap, pid, 4, ends)
                    collected.add_pass("zero_copy", result)
                    print(f"round {round_} zero-copy Fetch v4: {result.figures()}", flush=True)
                if round_ == 0 and chunk == LAZY_CHUNK:
                    for version in (3, 4):
                        alone[f"client_walk_v{version}_MBps"] = round(
                            client_rate(cluster.bootstrap, version, THROUGHPUT_PARTITIONS), 1
                        )
            collected.pairs.append(mbps[lazy] / mbps["eager"])
    sources = [source, broker_source()]
    if sources[0].partition(":")[2] != sources[1].partition(":")[2]:
        print(f"WARNING: the broker's code changed during the run: {sources}", flush=True)
    return summarize(collected, alone, sizes, load_start, time.monotonic() - started, sources)


def summarize(
    collected: Collected,
    alone: dict[str, float],
    sizes: Sizes,
    load_start: tuple[float, float, float],
    seconds: float,
    sources: list[str],
) -> dict[str, Any]:
    lazy = name_of(LAZY_CHUNK)
    memory_figures: dict[str, Any] = {}
    for label, steps in collected.memory.items():
        for step, samples in steps.items():
            per_fetch = [s["growth_per_fetch_MiB"] for s in samples]
            memory_figures[f"{label}_{step}"] = {
                "growth_per_fetch_MiB_max": max(per_fetch),
                "growth_per_fetch_MiB_median": round(statistics.median(per_fetch), 2),
                "answer_MiB": samples[0]["answer_MiB"],
                "first_byte_ms_median": round(
                    statistics.median(s["first_byte_ms"] for s in samples), 1
                ),
                "rounds": samples,
            }
    lazy_worst = max(
        entry["growth_per_fetch_MiB_max"]
        for name, entry in memory_figures.items()
        if name.startswith(lazy)
    )
    eager_fresh = memory_figures["eager_1_fresh"]
    answer_mib = eager_fresh["answer_MiB"]
    eager_growth = eager_fresh["growth_per_fetch_MiB_median"]
    throughput: dict[str, Any] = {}
    for label, passes in collected.passes.items():
        figures = [p.figures() for p in passes]
        throughput[label] = {
            key: round(statistics.median(f[key] for f in figures), 2)
            for key in (
                "MBps",
                "wire_MBps",
                "client_cores",
                "broker_cores",
                "broker_waiting_cores",
                "broker_faults_per_MB",
            )
        }
        throughput[label]["rounds_MBps"] = [f["MBps"] for f in figures]
    ratio = throughput[lazy]["MBps"] / throughput["eager"]["MBps"]
    fraction = throughput[lazy]["MBps"] / throughput["zero_copy"]["MBps"]
    return {
        "setup": {
            "value_bytes": VALUE_BYTES,
            "producer_batch_bytes": PRODUCER["batch.size"],
            "memory_partitions": MEMORY_PARTITIONS,
            "memory_records_per_partition": sizes.memory_records,
            "memory_fetch_max_bytes": MEMORY_MAX_BYTES,
            "partition_max_bytes": PARTITION_MAX_BYTES,
            "throughput_partitions": THROUGHPUT_PARTITIONS,
            "throughput_records": sizes.throughput_records
            // THROUGHPUT_PARTITIONS
            * THROUGHPUT_PARTITIONS,
            "throughput_fetch_max_bytes": THROUGHPUT_MAX_BYTES,
            "rounds": sizes.rounds,
            "cpus": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "seconds": round(seconds, 1),
            "broker_source_start_end": sources,
        },
        "memory": memory_figures,
        "eager_growth_per_answer": round(eager_growth / answer_mib, 2),
        "throughput": throughput,
        "alone": alone,
        "lazy_eager_ratio": round(ratio, 3),
        "lazy_eager_ratio_rounds": [round(r, 3) for r in collected.pairs],
        "lazy_zero_copy_fraction": round(fraction, 3),
        "goals": {
            "lazy_growth_per_fetch_MiB": {
                "goal": f"<= {GOAL_LAZY_GROWTH_MIB} (worst of every lazy measurement)",
                "value": lazy_worst,
                "met": lazy_worst <= GOAL_LAZY_GROWTH_MIB,
            },
            "eager_growth_per_fetch_MiB": {
                "goal": f"about the answer, {answer_mib} MiB, or more",
                "value": eager_growth,
                "met": eager_growth >= 0.8 * answer_mib,
            },
            "lazy_eager_throughput_ratio": {
                "goal": f">= {GOAL_LAZY_EAGER}",
                "value": round(ratio, 3),
                "met": ratio >= GOAL_LAZY_EAGER,
            },
        },
    }


def report(figures: dict[str, Any]) -> None:
    print("\nmemory: broker peak RSS growth per fetch in flight, MiB (max / median of rounds)")
    for name, entry in figures["memory"].items():
        gauge = max(s["gauge_peak_MiB"] for s in entry["rounds"])
        print(
            f"  {name:>21}: {entry['growth_per_fetch_MiB_max']:8.2f} / "
            f"{entry['growth_per_fetch_MiB_median']:8.2f}   answer {entry['answer_MiB']} MiB, "
            f"first byte after {entry['first_byte_ms_median']} ms, gauge peak {gauge} MiB"
        )
    print(
        "throughput: MB/s of values, median of rounds (cores busy: client, broker; "
        "broker cores waiting for a CPU; broker page faults per MB)"
    )
    for label, entry in figures["throughput"].items():
        print(
            f"  {label:>9}: {entry['MBps']:8.1f}  ({entry['client_cores']:.2f}, "
            f"{entry['broker_cores']:.2f}; {entry['broker_waiting_cores']:.2f}; "
            f"{entry['broker_faults_per_MB']:.0f})  rounds {entry['rounds_MBps']}"
        )
    print(f"  alone, in this process: {figures['alone']} (MB/s of values)")
    print(
        f"  lazy/eager {figures['lazy_eager_ratio']} (rounds {figures['lazy_eager_ratio_rounds']})"
        f", lazy/zero-copy {figures['lazy_zero_copy_fraction']}"
    )
    print_goals(figures["goals"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.down_conversion", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="less data, no chunk sizes sweep")
    parser.add_argument("--rounds", type=int, help="alternating rounds (4; 2 with --quick)")
    parser.add_argument(
        "--chunk-sizes",
        action=argparse.BooleanOptionalAction,
        help="also 32 KiB, 512 KiB and 1 MiB chunks (on by default, off with --quick)",
    )
    args = parser.parse_args(argv)
    keep_freed_heap()
    sizes = QUICK if args.quick else FULL
    if args.rounds:
        sizes = Sizes(sizes.memory_records, sizes.throughput_records, args.rounds)
    sweep = not args.quick if args.chunk_sizes is None else args.chunk_sizes
    figures = run(sizes, sweep)
    report(figures)
    save_results("down_conversion", figures)


if __name__ == "__main__":
    main()
