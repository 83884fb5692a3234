"""RDMA consume against real brokers on the shm and tcp providers: records produced by
confluent-kafka come back over one-sided READs in order with their offsets, keys and
values, from the log start or mid-segment; the head segment rolls under a reading consumer,
which goes on into the next segment seeing every record once; a consumer never reads above
the high watermark (followers paused in a 3-broker cluster), and gets the rest once they
resume; READs outside a grant or with a released segment's rkey are refused by the
provider, bad releases get error codes, and the broker serves on."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from directlog.client.rdma_consume import RdmaConsumeError, RdmaConsumer
from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.protocol.rdma_consume import (
    ACCESS,
    NEW_CONSUMER,
    NO_SLOT,
    RELEASE,
    SLOT_SIZE,
    RdmaConsumeRequest,
    RdmaConsumeResponse,
    decode_response_frame,
    read_slot,
    request_frame,
)
from directlog.rdma import Access, WcStatus, open_context
from directlog.records.batch import Record
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster
from tests.e2e.conftest import Clients, _stop_checked

pytestmark = pytest.mark.timeout(120)

PREALLOCATED = {"preallocate": "true"}
CONSUME = {"rdma_consume": True, "rdma_connect_timeout_ms": 5000}
SMALL_BATCHES = {"linger.ms": 0, "batch.size": 1000}  # for segments of 2 KiB


@pytest.fixture(scope="module", params=["shm", "tcp"])
def rdma_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BrokerProcess, str]]:
    provider = request.param
    settings = {**CONSUME, "rdma_provider": provider}
    cluster = Cluster(tmp_path_factory.mktemp(f"rdma-consume-{provider}"), broker_settings=settings)
    cluster.start()
    try:
        yield cluster.brokers[0], provider
        _stop_checked(cluster.brokers[0])
    finally:
        cluster.stop()


def produce(
    clients: Clients, bootstrap: str, topic: str, first: int, count: int, **kw: Any
) -> None:
    producer = clients.producer(bootstrap, {"acks": kw.pop("acks", 1), **kw})
    reports = clients.produce_all(
        producer,
        topic,
        [
            {"key": f"k{first + i}".encode(), "value": f"r-{first + i}".encode(), "partition": 0}
            for i in range(count)
        ],
    )
    assert [e for e, _ in reports if e is not None] == []


def expected(first: int, count: int) -> list[tuple[int, bytes, bytes]]:
    return [(i, f"k{i}".encode(), f"r-{i}".encode()) for i in range(first, first + count)]


def triples(records: list[Record]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in records]


async def poll_until(consumer: RdmaConsumer, count: int, timeout: float = 20.0) -> list[Record]:
    records: list[Record] = []
    deadline = time.monotonic() + timeout
    while len(records) < count:
        assert time.monotonic() < deadline, f"{len(records)} of {count} records in {timeout} s"
        records += await consumer.poll(0.5)
    return records


def consume(leader: str, topic: str, provider: str, offset: int, count: int) -> list[Record]:
    async def run() -> list[Record]:
        async with RdmaConsumer(leader, topic, 0, offset, provider=provider) as consumer:
            records = await poll_until(consumer, count)
            assert await consumer.poll(0.2) == []
            return records

    return asyncio.run(run())


def test_records_come_back_in_order(rdma_broker, clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("order")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    produce(clients, broker.bootstrap, topic, 0, 300)
    records = consume(broker.bootstrap, topic, provider, 0, 300)
    assert triples(records) == expected(0, 300)
    assert all(r.timestamp > 0 for r in records)


def test_metrics_count_consumers_registrations_and_slot_writes(rdma_broker, clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("metrics")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    produce(clients, broker.bootstrap, topic, 0, 20)
    consumers = broker.sample("directlog_broker_rdma_consumers")
    registrations = broker.sample("directlog_broker_rdma_consume_registrations")
    assert consumers is not None and registrations is not None

    async def run() -> None:
        async with RdmaConsumer(broker.bootstrap, topic, 0, 0, provider=provider) as consumer:
            assert triples(await poll_until(consumer, 20)) == expected(0, 20)
            assert broker.sample("directlog_broker_rdma_consumers") == consumers + 1
            assert broker.sample("directlog_broker_rdma_consume_registrations") == (
                registrations + 1
            )
            writes = broker.sample("directlog_broker_rdma_consume_slot_writes_total", topic=topic)
            assert writes is not None and writes >= 1
            produce(clients, broker.bootstrap, topic, 20, 5)  # the high watermark moves
            assert triples(await poll_until(consumer, 5)) == expected(20, 5)
            later = broker.sample("directlog_broker_rdma_consume_slot_writes_total", topic=topic)
            assert later is not None and later > writes

    asyncio.run(run())
    # Closed: once the broker sees the queue pair go, the consumer is gone and nothing
    # holds the segment registered any more.
    deadline = time.monotonic() + 10
    while broker.sample("directlog_broker_rdma_consumers") != consumers:
        assert time.monotonic() < deadline, "the closed consumer is still counted"
        time.sleep(0.05)
    assert broker.sample("directlog_broker_rdma_consume_registrations") == registrations


def test_a_lost_queue_pair_is_replaced_without_losing_or_repeating(
    rdma_broker, clients, topic_name
):
    broker, provider = rdma_broker
    topic = topic_name("lost")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    for first in range(0, 100, 10):
        produce(clients, broker.bootstrap, topic, first, 10)

    async def run() -> list[Record]:
        async with RdmaConsumer(
            broker.bootstrap, topic, 0, 0, provider=provider, read_size=128, max_poll_bytes=256
        ) as consumer:
            records: list[Record] = []
            for _ in range(3):
                got = await consumer.poll(5)
                assert got
                records += got
                consumer._qp.close()  # type: ignore[union-attr]  # as a READ refused would
            assert len(records) < 100
            return records + await poll_until(consumer, 100 - len(records))

    assert triples(asyncio.run(run())) == expected(0, 100)


def test_consume_from_the_middle_of_a_segment(rdma_broker, clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("mid")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    for first in range(0, 200, 50):  # several batches, so 137 lies inside one
        produce(clients, broker.bootstrap, topic, first, 50)
    assert triples(consume(broker.bootstrap, topic, provider, 137, 63)) == expected(137, 63)


def test_head_rolls_while_a_consumer_reads(rdma_broker, clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("roll")
    clients.create_topic(broker.bootstrap, topic, config={**PREALLOCATED, "segment.bytes": "2048"})
    total = 600

    def producing() -> None:
        for first in range(0, total, 50):
            produce(clients, broker.bootstrap, topic, first, 50, **SMALL_BATCHES)
            time.sleep(0.02)

    async def run() -> tuple[list[Record], set[int]]:
        async with RdmaConsumer(broker.bootstrap, topic, 0, 0, provider=provider) as consumer:
            writer = threading.Thread(target=producing)
            writer.start()
            bases = {consumer.base_offset}
            records: list[Record] = []
            deadline = time.monotonic() + 30
            while len(records) < total and time.monotonic() < deadline:
                records += await consumer.poll(0.2)
                bases.add(consumer.base_offset)
            writer.join()
            return records, bases

    records, bases = asyncio.run(run())
    assert triples(records) == expected(0, total)
    assert len(bases) > 3  # it moved through several segments
    segments = sorted((broker.data_dir / f"{topic}-0").glob("*.log"))
    assert len(segments) > 3


# Bad input ---------------------------------------------------------------------------


async def exchange(leader: str, request: RdmaConsumeRequest) -> RdmaConsumeResponse:
    host, _, port = leader.rpartition(":")
    connection = await KafkaConnection.connect(host, int(port), 5.0)
    try:
        frame = await connection.exchange(request_frame(request, 9, "raw"))
        return decode_response_frame(frame, 9)
    finally:
        await connection.close()


def raw(leader: str, topic: str, op: int, consumer_id: int, offset: int, provider: str) -> Any:
    request = RdmaConsumeRequest(topic, 0, op, consumer_id, offset, (provider,))
    return asyncio.run(exchange(leader, request))


def read_statuses(
    ctx: Any, grant: RdmaConsumeResponse, reads: list[tuple[int, int, int]]
) -> tuple[list[WcStatus], Any]:
    """Connect a queue pair as ``grant``'s consumer and READ (addr, rkey, size) after
    (addr, rkey, size) into one buffer; the statuses (the first refusal ends the queue
    pair) and the buffer."""
    pd, cq = ctx.alloc_pd(), ctx.create_cq(256)
    local = pd.allocate(4096, Access.LOCAL_WRITE)
    qp = pd.connect(grant.conn_info, cq)
    qp.post_write_with_imm(1, local.sge(0, 8), grant.bind_addr, grant.bind_rkey, grant.consumer_id)
    statuses = [c.status for c in poll(cq, 1)]
    for wr_id, (addr, rkey, size) in enumerate(reads, 2):
        qp.post_read(wr_id, local.sge(0, size), addr, rkey)
        statuses += [c.status for c in poll(cq, 1)]
    return statuses, local


def test_reads_outside_the_grant_are_refused(rdma_broker, clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("bad")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    produce(clients, broker.bootstrap, topic, 0, 20)
    ok, refused = WcStatus.SUCCESS, WcStatus.REM_ACCESS_ERR
    with open_context(provider) as ctx:
        grant = raw(broker.bootstrap, topic, ACCESS, NEW_CONSUMER, 0, provider)
        assert grant.error_code == 0, grant.error_message
        assert grant.mutable and grant.position == 0 and grant.readable_end > 0
        slot_at = grant.slot_addr + grant.slot_index * SLOT_SIZE
        beyond = (grant.addr + grant.length - 4, grant.rkey, 8)
        statuses, local = read_statuses(ctx, grant, [(slot_at, grant.slot_rkey, SLOT_SIZE)])
        assert statuses == [ok, ok]
        slot = read_slot(local.buf)
        assert slot is not None and slot.mutable and slot.readable_end == grant.readable_end
        assert (slot.addr, slot.rkey, slot.base_offset) == (grant.addr, grant.rkey, 0)
        grant = raw(broker.bootstrap, topic, ACCESS, NEW_CONSUMER, 0, provider)
        beyond = (grant.addr + grant.length - 4, grant.rkey, 8)
        assert read_statuses(ctx, grant, [(grant.addr, grant.rkey, 61), beyond])[0] == [
            ok,
            ok,
            refused,
        ]
        grant = raw(broker.bootstrap, topic, ACCESS, NEW_CONSUMER, 0, provider)
        below_slots = (grant.slot_addr - 8, grant.slot_rkey, 8)
        assert read_statuses(ctx, grant, [below_slots])[0] == [ok, refused]
    assert triples(consume(broker.bootstrap, topic, provider, 0, 20)) == expected(0, 20)


def test_released_rkey_is_refused(rdma_broker, clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("released")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    produce(clients, broker.bootstrap, topic, 0, 20)
    with open_context(provider) as ctx:
        pd, cq = ctx.alloc_pd(), ctx.create_cq(256)
        local = pd.allocate(64, Access.LOCAL_WRITE)
        grant = raw(broker.bootstrap, topic, ACCESS, NEW_CONSUMER, 0, provider)
        assert grant.error_code == 0, grant.error_message
        qp = pd.connect(grant.conn_info, cq)
        qp.post_write_with_imm(
            1, local.sge(0, 8), grant.bind_addr, grant.bind_rkey, grant.consumer_id
        )
        qp.post_read(2, local.sge(0, 61), grant.addr, grant.rkey)
        assert [c.status for c in poll(cq, 2)] == [WcStatus.SUCCESS, WcStatus.SUCCESS]
        released = raw(broker.bootstrap, topic, RELEASE, grant.consumer_id, 0, provider)
        assert released.error_code == 0, released.error_message
        qp.post_read(3, local.sge(0, 61), grant.addr, grant.rkey)
        assert [c.status for c in poll(cq, 1)] == [WcStatus.REM_ACCESS_ERR]
    # The broker serves on, other consumers included.
    produce(clients, broker.bootstrap, topic, 20, 10)
    assert triples(consume(broker.bootstrap, topic, provider, 0, 30)) == expected(0, 30)


def test_retention_revokes_what_it_deletes(rdma_broker, clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("retained")
    config = {**PREALLOCATED, "segment.bytes": "2048", "retention.bytes": "4096"}
    clients.create_topic(broker.bootstrap, topic, config=config)
    for first in range(0, 150, 50):  # two segments: the first sealed
        produce(clients, broker.bootstrap, topic, first, 50, **SMALL_BATCHES)
    consumer = clients.consumer(broker.bootstrap)
    low, _ = consumer.get_watermark_offsets(CTopicPartition(topic, 0), timeout=10)
    with open_context(provider) as ctx:
        pd, cq = ctx.alloc_pd(), ctx.create_cq(256)
        local = pd.allocate(64, Access.LOCAL_WRITE)
        grant = raw(broker.bootstrap, topic, ACCESS, NEW_CONSUMER, low, provider)
        assert grant.error_code == 0, grant.error_message
        assert not grant.mutable and grant.slot_index == NO_SLOT  # sealed: no roll to come
        qp = pd.connect(grant.conn_info, cq)
        qp.post_write_with_imm(
            1, local.sge(0, 8), grant.bind_addr, grant.bind_rkey, grant.consumer_id
        )
        assert [c.status for c in poll(cq, 1)] == [WcStatus.SUCCESS]
        for first in range(150, 450, 50):  # retention deletes the segment
            produce(clients, broker.bootstrap, topic, first, 50, **SMALL_BATCHES)
        deadline = time.monotonic() + 10
        status = WcStatus.SUCCESS
        while status is WcStatus.SUCCESS and time.monotonic() < deadline:
            time.sleep(0.05)
            qp.post_read(2, local.sge(0, 61), grant.addr, grant.rkey)
            (status,) = [c.status for c in poll(cq, 1)]
        assert status is WcStatus.REM_ACCESS_ERR
    answer = raw(broker.bootstrap, topic, ACCESS, NEW_CONSUMER, low, provider)
    assert answer.error_code == ErrorCode.OFFSET_OUT_OF_RANGE


def poll(cq: Any, count: int) -> list[Any]:
    completions: list[Any] = []
    deadline = time.monotonic() + 5
    while len(completions) < count and time.monotonic() < deadline:
        completions += cq.poll(count - len(completions), timeout=0.5)
    return completions


def test_bad_requests_get_error_codes(rdma_broker, clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("codes")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    produce(clients, broker.bootstrap, topic, 0, 10)
    leader = broker.bootstrap
    assert raw(leader, topic, RELEASE, 12345, 0, provider).error_code == (
        ErrorCode.UNKNOWN_MEMBER_ID
    )
    grant = raw(leader, topic, ACCESS, NEW_CONSUMER, 0, provider)
    assert grant.error_code == 0, grant.error_message
    not_held = raw(leader, topic, RELEASE, grant.consumer_id, 5, provider)
    assert not_held.error_code == ErrorCode.INVALID_REQUEST
    assert "holds no segment 5" in (not_held.error_message or "")
    assert raw(leader, topic, 9, grant.consumer_id, 0, provider).error_code == (
        ErrorCode.INVALID_REQUEST
    )
    assert raw(leader, topic, ACCESS, grant.consumer_id, 11, provider).error_code == (
        ErrorCode.OFFSET_OUT_OF_RANGE
    )
    assert raw(leader, topic, ACCESS, NEW_CONSUMER, 0, "pyverbs").error_code == (
        ErrorCode.INVALID_REQUEST
    )
    plain = topic_name("plain")
    clients.create_topic(leader, plain)
    assert raw(leader, plain, ACCESS, NEW_CONSUMER, 0, provider).error_code == (
        ErrorCode.INVALID_CONFIG
    )
    with pytest.raises(RdmaConsumeError) as refused:
        consume(leader, topic, provider, 50, 1)
    assert refused.value.code == ErrorCode.OFFSET_OUT_OF_RANGE


# The high watermark --------------------------------------------------------------------


@pytest.fixture(scope="module", params=["shm", "tcp"])
def replicated(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, str]]:
    """Three brokers that neither fence a paused one nor drop it from the ISR soon."""
    provider = request.param
    cluster = Cluster(
        tmp_path_factory.mktemp(f"rdma-consume-rf3-{provider}"),
        brokers=3,
        broker_settings={**CONSUME, "rdma_provider": provider, "replica_lag_time_max_ms": 60000},
        controller_settings={"broker_session_timeout_ms": 60000},
    )
    cluster.start()
    try:
        yield cluster, provider
    finally:
        cluster.stop()


def test_nothing_above_the_high_watermark_is_read(replicated, clients, topic_name):
    cluster, provider = replicated
    topic = topic_name("hw")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    created = admin.create_topics([NewTopic(topic, 1, 3, config=PREALLOCATED)])
    created[topic].result(timeout=20)
    leader_id = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    leader = cluster.brokers[leader_id]
    followers = [b for i, b in cluster.brokers.items() if i != leader_id]
    produce(clients, leader.bootstrap, topic, 0, 50, acks=-1)

    async def run() -> None:
        async with RdmaConsumer(leader.bootstrap, topic, 0, 0, provider=provider) as consumer:
            assert triples(await poll_until(consumer, 50)) == expected(0, 50)
            committed_end = consumer.readable_end
            assert committed_end == batch_end_below(leader, topic, 50)
            for follower in followers:
                follower.pause()
            try:
                await asyncio.to_thread(produce, clients, leader.bootstrap, topic, 50, 50)
                assert sum(n for _, n in leader.stored_batches(topic)) == 100
                assert await consumer.poll(1.0) == []
                assert consumer.readable_end == committed_end
            finally:
                for follower in followers:
                    follower.resume()
            assert triples(await poll_until(consumer, 50)) == expected(50, 50)
            assert consumer.readable_end > committed_end

    asyncio.run(run())


def batch_end_below(broker: BrokerProcess, topic: str, offset: int) -> int:
    """File position after the last batch below ``offset`` in the partition's one segment."""
    (segment,) = (broker.data_dir / f"{topic}-0").glob("*.log")
    data = segment.read_bytes()
    position = 0
    while position + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, position)
        (last_delta,) = struct.unpack_from(">i", data, position + 23)
        if length <= 0 or base + last_delta >= offset:
            break
        position += 12 + length
    return position


def test_leadership_moving_away_revokes_slots(replicated, clients, topic_name):
    """Runs last: it stops the leader (a controlled shutdown moves its leaderships)."""
    cluster, provider = replicated
    topic = topic_name("moved")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config=PREALLOCATED)])[topic].result(timeout=20)
    leader_id = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    leader = cluster.brokers[leader_id]
    produce(clients, leader.bootstrap, topic, 0, 10, acks=-1)
    with open_context(provider) as ctx:
        pd, cq = ctx.alloc_pd(), ctx.create_cq(256)
        local = pd.allocate(SLOT_SIZE, Access.LOCAL_WRITE)
        grant = raw(leader.bootstrap, topic, ACCESS, NEW_CONSUMER, 0, provider)
        assert grant.error_code == 0, grant.error_message
        qp = pd.connect(grant.conn_info, cq)
        qp.post_write_with_imm(
            1, local.sge(0, 8), grant.bind_addr, grant.bind_rkey, grant.consumer_id
        )
        assert [c.status for c in poll(cq, 1)] == [WcStatus.SUCCESS]
        stopping = threading.Thread(target=leader.stop)
        stopping.start()
        slot_at = grant.slot_addr + grant.slot_index * SLOT_SIZE
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            qp.post_read(2, local.sge(0, SLOT_SIZE), slot_at, grant.slot_rkey)
            (status,) = [c.status for c in poll(cq, 1)]
            if status is not WcStatus.SUCCESS:
                break
            slot = read_slot(local.buf)
            if slot is not None:
                seen.append(slot)
                if slot.revoked:
                    break
        stopping.join()
    assert seen and seen[0].mutable and not seen[0].revoked
    if seen[-1].revoked:
        assert seen[-1].readable_end == 0
    else:
        # The revocation and the end of the stop can fall between two READs: the queue pair
        # then fails first, and the broker's log is where the revocation shows.
        assert "revoked: leadership moved" in leader.stderr_text(), leader.stderr_tail()
