"""RDMA produce, exclusive mode, against a real broker on the shm and tcp providers:
batches written with WRITE_WITH_IMM are read back by confluent-kafka beside records it
produced itself; grants are exclusive; bad writes and dead writers revoke the grant and
leave no byte behind that a consumer or recovery could see; the head segment rolls."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from directlog.client.rdma_produce import REPLY_SIZE, Produced, RdmaProduceError, RdmaProducer
from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.protocol.rdma_access import (
    EXCLUSIVE,
    RdmaAccessRequest,
    decode_response_frame,
    request_frame,
)
from directlog.rdma import Access, Opcode, RdmaError, open_context
from directlog.records.batch import Record, build_batch
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster
from tests.e2e.conftest import Clients, _stop_checked
from tests.e2e.rdma_writer import RECORDS_PER_BATCH

pytestmark = pytest.mark.timeout(120)

PREALLOCATED = {"preallocate": "true"}


@pytest.fixture(scope="module", params=["shm", "tcp"])
def rdma_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BrokerProcess, str]]:
    provider = request.param
    settings = {
        "rdma_produce": True,
        "rdma_provider": provider,
        "rdma_grant_max_bytes": 1 << 20,
        "rdma_connect_timeout_ms": 5000,
    }
    cluster = Cluster(tmp_path_factory.mktemp(f"rdma-{provider}"), broker_settings=settings)
    cluster.start()
    try:
        yield cluster.brokers[0], provider
        _stop_checked(cluster.brokers[0])
    finally:
        cluster.stop()


def batches_of(first: int, count: int, size: int = 5) -> list[bytes]:
    """``count`` batches of ``size`` records with values r-<first + n>."""
    now = int(time.time() * 1000)
    return [
        build_batch(
            [
                Record(
                    j,
                    now,
                    f"k{first + b * size + j}".encode(),
                    f"r-{first + b * size + j}".encode(),
                )
                for j in range(size)
            ]
        )
        for b in range(count)
    ]


def rdma_send(
    leader: str, topic: str, provider: str, batches: list[bytes], **kw: Any
) -> list[Produced]:
    async def run() -> list[Produced]:
        producer = RdmaProducer(leader, topic, 0, provider=provider, **kw)
        await producer.start()
        try:
            return await producer.send(batches)
        finally:
            await producer.close()

    return asyncio.run(run())


def values(clients: Clients, bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes]]:
    consumer = clients.consumer(bootstrap)
    clients.assign_from(consumer, topic, [0])
    messages = clients.consume(consumer, count)
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] == count
    return [(m.offset(), m.value()) for m in messages]


def produce_plain(clients: Clients, bootstrap: str, topic: str, first: int, count: int) -> None:
    producer = clients.producer(bootstrap, {"acks": 1})
    reports = clients.produce_all(
        producer,
        topic,
        [
            {"key": f"k{first + i}".encode(), "value": f"r-{first + i}".encode(), "partition": 0}
            for i in range(count)
        ],
    )
    assert [e for e, _ in reports if e is not None] == []


def test_rdma_and_kafka_records_read_back_in_order(rdma_broker, clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("rw")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    produce_plain(clients, broker.bootstrap, topic, 0, 30)
    produced = rdma_send(broker.bootstrap, topic, provider, batches_of(30, 20))
    assert produced == [Produced(30 + 5 * i, 5) for i in range(20)]
    produce_plain(clients, broker.bootstrap, topic, 130, 30)
    assert values(clients, broker.bootstrap, topic, 160) == [
        (i, f"r-{i}".encode()) for i in range(160)
    ]


def test_small_staging_is_reused_as_writes_stay_in_flight(rdma_broker, clients, topic_name):
    """Staging of three 64 KiB batches under a window of 16: the producer fills staging
    front to back and starts over while replies are outstanding, dozens of times, and
    every record lands in order as written. (That it waits for the sends first matters
    where the provider reads staging after post returns: an RNIC, or tcp while its socket
    is full; shm copies in post.)"""
    broker, provider = rdma_broker
    topic = topic_name("ring")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    now = int(time.time() * 1000)
    pad = os.urandom(1000)
    batches = [
        build_batch([Record(j, now, None, b"%06d" % (b * 64 + j) + pad) for j in range(64)])
        for b in range(96)
    ]
    staging = 3 * max(len(b) for b in batches)
    produced = rdma_send(
        broker.bootstrap, topic, provider, batches, window=16, staging_bytes=staging
    )
    assert produced == [Produced(64 * i, 64) for i in range(96)]
    assert values(clients, broker.bootstrap, topic, 96 * 64) == [
        (i, b"%06d" % i + pad) for i in range(96 * 64)
    ]


def test_second_exclusive_grant_and_kafka_produce_are_refused(rdma_broker, clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("excl")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)

    async def run() -> None:
        first = RdmaProducer(broker.bootstrap, topic, 0, provider=provider)
        await first.start()
        try:
            second = RdmaProducer(broker.bootstrap, topic, 0, provider=provider, timeout=1.0)
            with pytest.raises(RdmaProduceError) as refused:
                await second.start()
            assert refused.value.code == ErrorCode.POLICY_VIOLATION
            producer = clients.producer(broker.bootstrap, {"acks": 1, "message.timeout.ms": 5000})
            reports = clients.produce_all(producer, topic, [{"value": b"x", "partition": 0}])
            assert [e.code() for e, _ in reports] == [ErrorCode.POLICY_VIOLATION]
            assert await first.send(batches_of(0, 2)) == [Produced(0, 5), Produced(5, 5)]
        finally:
            await first.close()

    asyncio.run(run())
    # The first producer let its grant go: Kafka-protocol produces go on after its records.
    deadline = time.monotonic() + 10
    while True:
        producer = clients.producer(broker.bootstrap, {"acks": 1, "message.timeout.ms": 5000})
        reports = clients.produce_all(producer, topic, [{"value": b"r-10", "partition": 0}])
        if reports[0][0] is None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert reports[0][0] is None
    assert [v for _, v in values(clients, broker.bootstrap, topic, 11)] == [
        f"r-{i}".encode() for i in range(11)
    ]


async def raw_grant(leader: str, topic: str, provider: str, replies_addr: int, rkey: int) -> Any:
    host, _, port = leader.rpartition(":")
    connection = await KafkaConnection.connect(host, int(port), 5.0)
    try:
        request = RdmaAccessRequest(
            topic, 0, EXCLUSIVE, 1, (provider,), replies_addr, rkey, 4 * REPLY_SIZE
        )
        frame = await connection.exchange(request_frame(request, 7, "raw"))
        return decode_response_frame(frame, 7)
    finally:
        await connection.close()


@pytest.mark.parametrize("fault", ["bad_crc", "wrong_order", "wrong_file"])
def test_bad_write_revokes_and_later_writes_fail_at_the_provider(
    rdma_broker, clients, topic_name, fault
):
    broker, provider = rdma_broker
    topic = topic_name(fault)
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    with open_context(provider) as ctx:
        pd, cq = ctx.alloc_pd(), ctx.create_cq(256)
        replies = pd.allocate(4 * REPLY_SIZE, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        grant = asyncio.run(
            raw_grant(broker.bootstrap, topic, provider, replies.addr, replies.rkey)
        )
        assert grant.error_code == 0, grant.error_message
        qp = pd.connect(grant.conn_info, cq)
        for slot in range(4):
            qp.post_recv(slot)
        staging = pd.allocate(1 << 16, Access.LOCAL_WRITE)
        good, bad = batches_of(0, 2)
        staging.buf[: len(good)] = good
        qp.post_write_with_imm(
            0, staging.sge(0, len(good)), grant.addr, grant.rkey, grant.file_id << 16
        )
        completions = poll(cq, 2)
        assert all(c.ok for c in completions)
        bad_batch = bytearray(bad)
        imm = grant.file_id << 16 | 1
        if fault == "bad_crc":
            bad_batch[-1] ^= 0xFF
        elif fault == "wrong_order":
            imm = grant.file_id << 16 | 7
        else:
            imm = (grant.file_id ^ 1) << 16 | 1
        staging.buf[: len(bad_batch)] = bad_batch
        qp.post_write_with_imm(
            1, staging.sge(0, len(bad_batch)), grant.addr + len(good), grant.rkey, imm
        )
        completions = poll(cq, 2)
        reply = [c for c in completions if c.opcode is Opcode.RECV_RDMA_WITH_IMM]
        assert reply and reply[0].ok
        code = int.from_bytes(replies.buf[REPLY_SIZE + 2 : REPLY_SIZE + 4], "big", signed=True)
        expected = ErrorCode.CORRUPT_MESSAGE if fault == "bad_crc" else ErrorCode.INVALID_REQUEST
        assert code == expected
        # Revoked: the next write is refused by the provider and lands nowhere.
        staging.buf[: len(good)] = good
        wait_until_refused(qp, cq, staging, grant, len(good))
    # Only the good batch is there; the bytes of the bad one were zeroed.
    assert values(clients, broker.bootstrap, topic, 5) == [(i, f"r-{i}".encode()) for i in range(5)]
    assert broker.stored_batches(topic) == [(0, 5)]
    produce_plain(clients, broker.bootstrap, topic, 5, 5)
    assert values(clients, broker.bootstrap, topic, 10)[-1] == (9, b"r-9")


def poll(cq: Any, count: int) -> list[Any]:
    completions: list[Any] = []
    deadline = time.monotonic() + 10
    while len(completions) < count and time.monotonic() < deadline:
        completions += cq.poll(count - len(completions), timeout=0.5)
    assert len(completions) == count, completions
    return completions


def wait_until_refused(qp: Any, cq: Any, staging: Any, grant: Any, offset: int) -> None:
    try:
        qp.post_write(9, staging.sge(0, 64), grant.addr + offset, grant.rkey)
    except RdmaError:
        return  # the broker already closed the queue pair: nothing can be posted
    (completion,) = poll(cq, 1)
    assert not completion.ok


def test_killed_writer_leaves_nothing_behind_and_a_new_one_continues(
    rdma_broker, clients, topic_name
):
    broker, provider = rdma_broker
    topic = topic_name("kill")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.rdma_writer", broker.bootstrap, topic, provider],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert writer.stdout is not None
        for _ in range(10):
            line = writer.stdout.readline()
            assert line, "the writer stopped"
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(10)
    # A new writer gets the grant once the broker saw the old one go, and continues.
    deadline = time.monotonic() + 20
    while True:
        try:
            produced = rdma_send(broker.bootstrap, topic, provider, batches_of(0, 1), timeout=2.0)
            break
        except RdmaProduceError as error:
            if error.code != ErrorCode.POLICY_VIOLATION or time.monotonic() > deadline:
                raise
    committed = produced[0].base_offset
    assert committed % RECORDS_PER_BATCH == 0 and committed >= 10 * 4 * RECORDS_PER_BATCH
    got = values(clients, broker.bootstrap, topic, committed + 5)
    assert [v for _, v in got[:committed]] == [
        f"w-{i}-{j}".encode() * 20
        for i in range(committed // RECORDS_PER_BATCH)
        for j in range(RECORDS_PER_BATCH)
    ]
    assert [v for _, v in got[committed:]] == [f"r-{i}".encode() for i in range(5)]
    assert [o for o, _ in got] == list(range(committed + 5))
    assert sum(count for _, count in broker.stored_batches(topic)) == committed + 5


def test_head_segment_rolls_when_full(rdma_broker, clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("roll")
    clients.create_topic(broker.bootstrap, topic, config={**PREALLOCATED, "segment.bytes": "8192"})
    produced = rdma_send(broker.bootstrap, topic, provider, batches_of(0, 100, size=10))
    assert [p.base_offset for p in produced] == [10 * i for i in range(100)]
    segments = sorted((broker.data_dir / f"{topic}-0").glob("*.log"))
    assert len(segments) >= 3
    assert values(clients, broker.bootstrap, topic, 1000) == [
        (i, f"r-{i}".encode()) for i in range(1000)
    ]
