"""RDMA produce in shared mode against a real broker on the shm and tcp providers: RDMA
writers and Kafka-protocol producers reserve through one FETCH_AND_ADD word and every
record lands exactly once, in each producer's order; grants seal and roll over; a
reservation never written (a writer dying between reserving and writing) times out as a
hole, aborts the writes behind it, which are written again, and leaves no byte behind."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from directlog.client.rdma_produce import (
    NATIVE_WORD,
    ORDER_ONE,
    REPLY_SIZE,
    Produced,
    RdmaProduceError,
    RdmaProducer,
)
from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.protocol.rdma_access import (
    EXCLUSIVE,
    SHARED,
    RdmaAccessRequest,
    decode_response_frame,
    request_frame,
)
from directlog.rdma import Access, Opcode, open_context
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster
from tests.e2e.conftest import _stop_checked
from tests.e2e.rdma_writer import RECORDS_PER_BATCH
from tests.e2e.test_rdma_produce import batches_of, poll, values

pytestmark = pytest.mark.timeout(150)

TOPIC_CONFIG = {"preallocate": "true", "segment.bytes": str(64 * 1024)}
GRANT_BYTES = 32 * 1024
HOLE_TIMEOUT_MS = 500


@pytest.fixture(scope="module", params=["shm", "tcp"])
def shared_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BrokerProcess, str]]:
    provider = request.param
    settings = {
        "rdma_produce": True,
        "rdma_provider": provider,
        "rdma_grant_max_bytes": GRANT_BYTES,
        "rdma_connect_timeout_ms": 5000,
        "rdma_hole_timeout_ms": HOLE_TIMEOUT_MS,
    }
    cluster = Cluster(tmp_path_factory.mktemp(f"shared-{provider}"), broker_settings=settings)
    cluster.start()
    try:
        yield cluster.brokers[0], provider
        _stop_checked(cluster.brokers[0])
    finally:
        cluster.stop()


def writer(broker: BrokerProcess, topic: str, provider: str, name: str, batches: int) -> Any:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.e2e.rdma_writer",
            broker.bootstrap,
            topic,
            provider,
            "shared",
            name,
            str(batches),
        ],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_two_rdma_writers_and_a_kafka_producer_share_a_partition(
    shared_broker, clients, topic_name
):
    broker, provider = shared_broker
    topic = topic_name("share")
    clients.create_topic(broker.bootstrap, topic, config=TOPIC_CONFIG)
    per_writer = 40  # about 70 KiB each: grants of 32 KiB seal and roll over
    writers = [writer(broker, topic, provider, name, per_writer) for name in ("a", "b")]
    plain = 300
    delivered: list[Any] = []

    def produce_plain() -> None:
        producer = clients.producer(broker.bootstrap, {"acks": 1, "linger.ms": 1})
        for i in range(plain):
            producer.produce(topic, f"c-{i}".encode(), partition=0)
            if i % 20 == 19:
                producer.flush(30)
        delivered.append(producer.flush(30))

    thread = threading.Thread(target=produce_plain)
    thread.start()
    try:
        for process in writers:
            assert process.wait(120) == 0
    finally:
        for process in writers:
            process.kill()
        thread.join(60)
    assert delivered == [0]
    total = 2 * per_writer * RECORDS_PER_BATCH + plain
    got = values(clients, broker.bootstrap, topic, total)
    assert [offset for offset, _ in got] == list(range(total))
    by_source: dict[str, list[bytes]] = {"a": [], "b": [], "c": []}
    for _, value in got:
        by_source[value[:1].decode()].append(value)
    assert by_source["c"] == [f"c-{i}".encode() for i in range(plain)]
    for name in ("a", "b"):
        assert by_source[name] == [
            f"{name}-{i}-{j}".encode() * 20
            for i in range(per_writer)
            for j in range(RECORDS_PER_BATCH)
        ]
    assert sum(count for _, count in broker.stored_batches(topic)) == total
    assert len(list((broker.data_dir / f"{topic}-0").glob("*.log"))) >= 2


def test_writes_past_the_grant_seal_it_and_continue_in_the_next(shared_broker, clients, topic_name):
    broker, provider = shared_broker
    topic = topic_name("seal")
    clients.create_topic(broker.bootstrap, topic, config=TOPIC_CONFIG)

    async def run() -> list[Produced]:
        producer = RdmaProducer(broker.bootstrap, topic, 0, provider=provider, mode="shared")
        await producer.start()
        try:
            first = await producer.send(batches_of(0, 150, size=10))
            # A Kafka-protocol produce in between reserves through the same word.
            clients.produce_all(
                clients.producer(broker.bootstrap, {"acks": 1}),
                topic,
                [{"value": f"r-{1500 + i}".encode(), "partition": 0} for i in range(10)],
            )
            return first + await producer.send(batches_of(1510, 10, size=10))
        finally:
            await producer.close()

    produced = asyncio.run(run())
    assert [p.base_offset for p in produced] == [10 * i for i in range(150)] + [
        1510 + 10 * i for i in range(10)
    ]
    assert values(clients, broker.bootstrap, topic, 1610) == [
        (i, f"r-{i}".encode()) for i in range(1610)
    ]


async def shared_grant(leader: str, topic: str, provider: str, replies: Any, mode: int) -> Any:
    host, _, port = leader.rpartition(":")
    connection = await KafkaConnection.connect(host, int(port), 5.0)
    try:
        request = RdmaAccessRequest(
            topic, 0, mode, 1, (provider,), replies.addr, replies.rkey, 4 * REPLY_SIZE
        )
        frame = await connection.exchange(request_frame(request, 7, "raw"))
        return decode_response_frame(frame, 7)
    finally:
        await connection.close()


def reserve(qp: Any, cq: Any, word: Any, grant: Any, size: int) -> tuple[int, int]:
    qp.post_fetch_and_add(1, word.sge(), grant.word_addr, grant.word_rkey, ORDER_ONE | size)
    (completion,) = poll(cq, 1)
    assert completion.ok and completion.opcode is Opcode.FETCH_AND_ADD
    (old,) = NATIVE_WORD.unpack_from(word.buf)
    return old >> 48, old & (ORDER_ONE - 1)


def test_a_reservation_never_written_times_out_and_the_writes_behind_it_go_again(
    shared_broker, clients, topic_name
):
    broker, provider = shared_broker
    topic = topic_name("hole")
    clients.create_topic(broker.bootstrap, topic, config=TOPIC_CONFIG)
    with open_context(provider) as ctx:
        pd, cq = ctx.alloc_pd(), ctx.create_cq(256)
        replies = pd.allocate(4 * REPLY_SIZE, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        word = pd.allocate(8, Access.LOCAL_WRITE)
        grant = asyncio.run(shared_grant(broker.bootstrap, topic, provider, replies, SHARED))
        assert grant.error_code == 0, grant.error_message
        qp = pd.connect(grant.conn_info, cq)
        for slot in range(4):
            qp.post_recv(slot)
        # Reserve like a writer that dies before its write: order 0 stays a hole.
        hole = batches_of(900, 1)[0]
        assert reserve(qp, cq, word, grant, len(hole)) == (0, 0)

        async def run() -> list[Produced]:
            producer = RdmaProducer(broker.bootstrap, topic, 0, provider=provider, mode="shared")
            await producer.start()
            try:
                return await producer.send(batches_of(0, 3))
            finally:
                await producer.close()

        produced = asyncio.run(run())
        # Aborted behind the hole, written again on the next grant: once each.
        assert produced == [Produced(0, 5), Produced(5, 5), Produced(10, 5)]
        # The hole's writer comes back too late: its grant is gone.
        staging = pd.allocate(len(hole), Access.LOCAL_WRITE)
        staging.buf[:] = hole
        qp.post_write_with_imm(2, staging.sge(), grant.addr, grant.rkey, grant.file_id << 16)
        completions = poll(cq, 1)
        assert not completions[0].ok or completions[0].opcode is Opcode.RECV_RDMA_WITH_IMM
    assert values(clients, broker.bootstrap, topic, 15) == [
        (i, f"r-{i}".encode()) for i in range(15)
    ]
    assert sum(count for _, count in broker.stored_batches(topic)) == 15


def test_modes_exclude_each_other_and_bad_orders_revoke(shared_broker, clients, topic_name):
    broker, provider = shared_broker
    topic = topic_name("modes")
    clients.create_topic(broker.bootstrap, topic, config=TOPIC_CONFIG)

    async def run() -> None:
        exclusive = RdmaProducer(broker.bootstrap, topic, 0, provider=provider)
        await exclusive.start()
        try:
            shared = RdmaProducer(
                broker.bootstrap, topic, 0, provider=provider, mode="shared", timeout=0.5
            )
            with pytest.raises(RdmaProduceError) as refused:
                await shared.start()
            assert refused.value.code == ErrorCode.POLICY_VIOLATION
        finally:
            await exclusive.close()

    asyncio.run(run())
    with open_context(provider) as ctx:
        pd, cq = ctx.alloc_pd(), ctx.create_cq(256)
        replies = pd.allocate(4 * REPLY_SIZE, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        deadline = time.monotonic() + 10
        while True:  # until the broker saw the exclusive writer go
            grant = asyncio.run(shared_grant(broker.bootstrap, topic, provider, replies, SHARED))
            if grant.error_code != ErrorCode.POLICY_VIOLATION or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert grant.error_code == 0, grant.error_message
        other = asyncio.run(shared_grant(broker.bootstrap, topic, provider, replies, EXCLUSIVE))
        assert other.error_code == ErrorCode.POLICY_VIOLATION
        qp = pd.connect(grant.conn_info, cq)
        for slot in range(4):
            qp.post_recv(slot)
        batch = batches_of(0, 1)[0]
        staging = pd.allocate(len(batch), Access.LOCAL_WRITE)
        staging.buf[:] = batch
        # An order no reservation handed out (far ahead of the next): revoked.
        qp.post_write_with_imm(
            0, staging.sge(), grant.addr, grant.rkey, grant.file_id << 16 | 40000
        )
        completions = poll(cq, 2)
        reply = [c for c in completions if c.opcode is Opcode.RECV_RDMA_WITH_IMM]
        assert reply and reply[0].ok
        code = int.from_bytes(replies.buf[2:4], "big", signed=True)
        assert code == ErrorCode.INVALID_REQUEST
    assert broker.stored_batches(topic) == []
