"""The consume side of bench.rdma (KafkaDirect §5.3): consume latency, empty fetches and
consume bandwidth, each path measured by one function that checks what it read.

Every function takes a fresh topic (`preallocate=true`, RDMA consume needs it) on a broker
with `rdma_consume` on; bench.rdma creates the topics, alternates the paths and prints.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from bench.broker import BenchError, consume, wait_for_topic
from bench.processes import cpu_seconds
from directlog.client.rdma_consume import RdmaConsumer
from directlog.client.rdma_produce import RdmaProducer
from directlog.protocol import replica_fetch
from directlog.records.batch import Record, build_batch

TIME_LIMIT = 120.0
WARMUP = 50
CONSUMER_REPLICA_ID = -1  # a Fetch from a consumer, not a follower
PIPELINE = 8  # raw Fetch requests in flight on the one connection


@dataclass(frozen=True)
class Target:
    """Where one measurement runs: the cluster's bootstrap, the topic and, per partition,
    its leader's "host:port" (the RDMA clients talk to the leader only)."""

    bootstrap: str
    topic: str
    leaders: dict[int, str]
    broker_pid: int


@dataclass(frozen=True)
class EmptyChecks:
    checks: int
    seconds: float
    broker_cpu_seconds: float


def one_by_one(target: Target) -> Callable[[bytes, int], float]:
    """The producer both consume-latency paths share (acks=1, linger 0), as a function that
    sends one record and returns the perf_counter of its acknowledgement, checked to be
    at the expected offset."""
    reports: list[tuple[KafkaError | None, int | None, float]] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        reports.append((err, msg.offset(), time.perf_counter()))

    producer = Producer(
        {
            "bootstrap.servers": target.bootstrap,
            "acks": 1,
            "enable.idempotence": False,
            "linger.ms": 0,
            "on_delivery": delivered,
        }
    )
    wait_for_topic(producer, target.topic)

    def send(value: bytes, offset: int) -> float:
        deadline = time.monotonic() + TIME_LIMIT
        producer.produce(target.topic, value, partition=0)
        while not reports:
            producer.poll(0.0005)
            if time.monotonic() > deadline:
                raise BenchError(f"no delivery report for offset {offset}")
        err, landed, acked = reports.pop()
        if err is not None or landed != offset:
            raise BenchError(f"record for offset {offset}: error {err}, offset {landed}")
        return acked

    return send


def tcp_consume_latency(target: Target, size: int, samples: int) -> list[float]:
    """Seconds from a record's acknowledgement to confluent-kafka's poll handing it out."""
    send = one_by_one(target)
    consumer = Consumer(
        {
            "bootstrap.servers": target.bootstrap,
            "group.id": "bench-rdma",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 0,
            "fetch.min.bytes": 1,
            "fetch.error.backoff.ms": 0,
            "fetch.queue.backoff.ms": 0,
        }
    )
    consumer.assign([TopicPartition(target.topic, 0, OFFSET_BEGINNING)])
    value = os.urandom(size)
    out: list[float] = []
    try:
        for offset in range(WARMUP + samples):
            acked = send(value, offset)
            deadline = time.monotonic() + TIME_LIMIT
            while (message := consumer.poll(0)) is None:
                if time.monotonic() > deadline:
                    raise BenchError(f"offset {offset} never consumed")
            handed = time.perf_counter()
            if message.error() is not None or message.offset() != offset:
                raise BenchError(f"consumed {message.error()} at {message.offset()}, not {offset}")
            if message.value() != value:
                raise BenchError(f"offset {offset}: the value read differs from the one sent")
            if offset >= WARMUP:
                out.append(handed - acked)
    finally:
        consumer.close()
    return out


def rdma_consume_latency(target: Target, size: int, samples: int) -> list[float]:
    """Seconds from a record's acknowledgement to RdmaConsumer.poll(0) handing it out."""
    send = one_by_one(target)
    value = os.urandom(size)

    async def run() -> list[float]:
        consumer = RdmaConsumer(target.leaders[0], target.topic, 0, 0, provider="shm")
        await consumer.start()
        out: list[float] = []
        try:
            for offset in range(WARMUP + samples):
                acked = send(value, offset)
                deadline = time.monotonic() + TIME_LIMIT
                while not (records := await consumer.poll(0)):
                    if time.monotonic() > deadline:
                        raise BenchError(f"offset {offset} never consumed")
                handed = time.perf_counter()
                if [(r.offset, r.value) for r in records] != [(offset, value)]:
                    got = [r.offset for r in records]
                    raise BenchError(f"consumed offsets {got}, expected just {offset}")
                if offset >= WARMUP:
                    out.append(handed - acked)
        finally:
            await consumer.close()
        return out

    return asyncio.run(asyncio.wait_for(run(), TIME_LIMIT * 2))


# --- empty fetches ---------------------------------------------------------------------------


def tcp_empty_fetches(target: Target, end: int, seconds: float) -> EmptyChecks:
    """Raw Fetch requests (max_wait_ms=0, at the log end) on one connection, PIPELINE in
    flight, for `seconds`: every answer checked to be empty with the expected high
    watermark."""
    host, _, port = target.leaders[0].rpartition(":")
    position = replica_fetch.FetchPosition(target.topic, 0, -1, end, -1, 1 << 20)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def request(correlation_id: int) -> None:
            sock.sendall(
                replica_fetch.encode_request(
                    correlation_id, "bench-rdma", CONSUMER_REPLICA_ID, 0, 1 << 20, [position]
                )
            )

        def answer(correlation_id: int) -> None:
            frame = memoryview(receive(sock, int.from_bytes(receive(sock, 4), "big")))
            answered, code, partitions = replica_fetch.decode_response(frame)
            if answered != correlation_id or code != 0 or len(partitions) != 1:
                raise BenchError(f"fetch {correlation_id}: answer {answered}, error {code}")
            (part,) = partitions
            if part.error_code != 0 or len(part.records) or part.high_watermark != end:
                raise BenchError(
                    f"empty fetch {correlation_id}: error {part.error_code}, "
                    f"{len(part.records)} record bytes, high watermark {part.high_watermark}"
                )

        for correlation_id in range(PIPELINE):
            request(correlation_id)
        answered = 0
        cpu = cpu_seconds(target.broker_pid)
        start = time.perf_counter()
        stop = start + seconds
        while time.perf_counter() < stop:
            answer(answered)
            request(answered + PIPELINE)
            answered += 1
        elapsed = time.perf_counter() - start
        cpu = cpu_seconds(target.broker_pid) - cpu
        for correlation_id in range(answered, answered + PIPELINE):
            answer(correlation_id)
    return EmptyChecks(answered, elapsed, cpu)


def receive(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    view, filled = memoryview(buffer), 0
    while filled < size:
        got = sock.recv_into(view[filled:])
        if not got:
            raise BenchError("the broker closed the connection")
        filled += got
    return buffer


def rdma_empty_fetches(target: Target, end: int, seconds: float) -> EmptyChecks:
    """RdmaConsumer.poll(0) at the log end for `seconds`: each call READs the metadata slot
    once and must return nothing."""

    async def run() -> EmptyChecks:
        consumer = RdmaConsumer(target.leaders[0], target.topic, 0, end, provider="shm")
        await consumer.start()
        try:
            checks = 0
            cpu = cpu_seconds(target.broker_pid)
            start = time.perf_counter()
            stop = start + seconds
            while time.perf_counter() < stop:
                if await consumer.poll(0):
                    raise BenchError("an empty check returned records")
                checks += 1
            elapsed = time.perf_counter() - start
            cpu = cpu_seconds(target.broker_pid) - cpu
            if consumer.position != end or consumer.readable_end == 0:
                raise BenchError(f"consumer at {consumer.position}, expected {end}")
        finally:
            await consumer.close()
        return EmptyChecks(checks, elapsed, cpu)

    return asyncio.run(asyncio.wait_for(run(), TIME_LIMIT))


def idle_broker(target: Target, seconds: float) -> EmptyChecks:
    """The broker's own CPU use over `seconds` with no client at all (its background)."""
    cpu = cpu_seconds(target.broker_pid)
    start = time.perf_counter()
    time.sleep(seconds)
    elapsed = time.perf_counter() - start
    return EmptyChecks(0, elapsed, cpu_seconds(target.broker_pid) - cpu)


# --- consume bandwidth -----------------------------------------------------------------------


def fill(target: Target, size: int, count: int, per_batch: int) -> bytes:
    """Write `count` records of `size` bytes (the same random value) to partition 0 over
    RDMA; the value."""
    value = os.urandom(size)
    now = int(time.time() * 1000)
    batch = build_batch([Record(i, now, None, value) for i in range(per_batch)])

    async def run() -> None:
        producer = RdmaProducer(target.leaders[0], target.topic, 0, provider="shm")
        await producer.start()
        try:
            produced = await producer.send([batch] * (count // per_batch))
        finally:
            await producer.close()
        if sum(p.records for p in produced) != count:
            raise BenchError(f"filled {sum(p.records for p in produced)}/{count} records")

    asyncio.run(asyncio.wait_for(run(), TIME_LIMIT))
    return value


def tcp_consume_bandwidth(target: Target, value: bytes, count: int) -> float:
    """Seconds for confluent-kafka to read the `count` records from offset 0."""
    return consume(target.bootstrap, target.topic, [value] * count, TIME_LIMIT).seconds


def rdma_consume_bandwidth(target: Target, value: bytes, count: int, read_size: int) -> float:
    """Seconds for RdmaConsumer (READs of `read_size` bytes) to read the `count` records from
    offset 0, each checked to come at its offset with its value's length."""

    async def run() -> float:
        consumer = RdmaConsumer(
            target.leaders[0], target.topic, 0, 0, provider="shm", read_size=read_size
        )
        await consumer.start()
        try:
            got, last = 0, b""
            deadline = time.monotonic() + TIME_LIMIT
            start = time.perf_counter()
            while got < count:
                for record in await consumer.poll(1.0):
                    last = record.value or b""
                    if record.offset != got or len(last) != len(value):
                        raise BenchError(f"record {got} came as offset {record.offset}")
                    got += 1
                if time.monotonic() > deadline:
                    raise BenchError(f"read {got}/{count} records in {TIME_LIMIT:.0f} s")
            seconds = time.perf_counter() - start
        finally:
            await consumer.close()
        if last != value:
            raise BenchError("the last value read back differs from what was written")
        return seconds

    return asyncio.run(asyncio.wait_for(run(), TIME_LIMIT * 2))
