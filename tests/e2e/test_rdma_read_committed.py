"""RDMA consume in read_committed mode (RdmaConsume v1) against a real broker on the shm
provider, with confluent-kafka transactional producers: a read_committed RdmaConsumer gets
exactly the non-transactional and committed records, in offset order, never a control
record, across segment rolls and with transactions of two producers interleaved; while a
transaction is open its records are not returned and the consumer is not granted a byte
past the last stable offset, which moves when the transaction commits or the coordinator
aborts it on timeout; a read_uncommitted consumer still sees every data record. A v1
request with an unknown isolation level gets INVALID_REQUEST and is granted nothing."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

from directlog.client import Consumer as RdmaClientConsumer
from directlog.client.rdma_consume import RdmaConsumer
from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.protocol.rdma_consume import (
    ACCESS,
    NEW_CONSUMER,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RdmaConsumeRequest,
    RdmaConsumeResponse,
    decode_response_frame,
    request_frame,
)
from directlog.records.batch import Record
from tests.e2e.broker import BrokerProcess
from tests.e2e.conftest import RDKAFKA_LOG, Clients, single_broker
from tests.e2e.test_rdma_consume import batch_end_below

pytestmark = pytest.mark.timeout(180)

SETTINGS: dict[str, object] = {
    "transaction_state_log_replication_factor": 1,
    "transaction_state_log_num_partitions": 3,
    "transaction_abort_timed_out_transaction_cleanup_interval_ms": 200,
    "rdma_consume": True,
    "rdma_provider": "shm",
    "rdma_connect_timeout_ms": 5000,
}
# Preallocated segments (RDMA consume of the head needs them), small enough to read whole.
PREALLOCATED = {"preallocate": "true", "segment.bytes": str(1 << 20)}
WAIT = 60.0  # bound of every wait on the broker or a client
QUIET = 1.5  # how long a consumer is polled to show it returns nothing more


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with single_broker(tmp_path_factory.mktemp("rdma-read-committed"), SETTINGS) as process:
        yield process


def transactional(bootstrap: str, **extra: Any) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"rdma-rc-{uuid.uuid4().hex[:8]}",
            "linger.ms": 0,
            "batch.size": 1000,  # batches that fit small segments
            "logger": RDKAFKA_LOG,
            **extra,
        }
    )
    producer.init_transactions(WAIT)
    return producer


def send(producer: Producer, topic: str, values: list[bytes]) -> None:
    """Produce to partition 0 and wait until every record is written."""
    for value in values:
        producer.produce(topic, value=value, key=value, partition=0)
    assert producer.flush(WAIT) == 0


def values(prefix: str, count: int) -> list[bytes]:
    """Values named for what becomes of them (plain, commit, abort), padded so a few
    dozen fill a small segment."""
    return [b"%s-%d-%s" % (prefix.encode(), i, b"." * 64) for i in range(count)]


async def poll_until(consumer: RdmaConsumer, count: int) -> list[Record]:
    """Exactly ``count`` records (more is a failure), within WAIT seconds."""
    records: list[Record] = []
    deadline = time.monotonic() + WAIT
    while len(records) < count:
        assert time.monotonic() < deadline, f"{len(records)} of {count} records in {WAIT} s"
        records += await consumer.poll(0.5)
    assert len(records) == count, [r.value for r in records]
    return records


async def quiet(consumer: RdmaConsumer) -> list[Record]:
    """What the consumer returns in QUIET seconds of polling (nothing, when it holds)."""
    records: list[Record] = []
    deadline = time.monotonic() + QUIET
    while time.monotonic() < deadline:
        records += await consumer.poll(0.1)
    return records


def offsets_and_values(records: list[Record]) -> list[tuple[int, bytes | None]]:
    return [(r.offset, r.value) for r in records]


def committed_only(everything: list[Record]) -> list[tuple[int, bytes | None]]:
    """What read_committed must return, given every data record in offset order."""
    return [(r.offset, r.value) for r in everything if not (r.value or b"").startswith(b"abort")]


def test_committed_and_plain_records_in_offset_order(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """Plain records, committed and aborted transactions of two producers interleaved
    (one left open across the other's end), over small segments: read_committed returns
    the plain and committed records in offset order, read_uncommitted every data record;
    neither returns a control record."""
    bootstrap = txn_broker.bootstrap
    topic = f"rc-mixed-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic, config={**PREALLOCATED, "segment.bytes": "2048"})
    plain = clients.producer(bootstrap, {"acks": "all", "linger.ms": 0, "batch.size": 1000})
    first, second = transactional(bootstrap), transactional(bootstrap)

    send(plain, topic, values("plain-a", 5))
    first.begin_transaction()
    send(first, topic, values("commit-x", 20))
    send(plain, topic, values("plain-b", 3))
    second.begin_transaction()
    send(second, topic, values("abort-y", 20))
    send(first, topic, values("commit-x2", 10))
    first.commit_transaction(WAIT)  # its marker lands above the open transaction's start
    send(plain, topic, values("plain-c", 4))
    send(second, topic, values("abort-y2", 5))
    second.abort_transaction(WAIT)
    first.begin_transaction()
    send(first, topic, values("abort-z", 15))
    first.abort_transaction(WAIT)
    second.begin_transaction()
    send(second, topic, values("commit-w", 12))
    second.commit_transaction(WAIT)
    send(plain, topic, values("plain-d", 6))
    produced = 5 + 20 + 3 + 20 + 10 + 4 + 5 + 15 + 12 + 6

    async def run() -> tuple[list[Record], list[Record]]:
        async with (
            RdmaConsumer(bootstrap, topic, 0, 0, provider="shm") as everything,
            RdmaConsumer(
                bootstrap, topic, 0, 0, provider="shm", isolation_level="read_committed"
            ) as committed,
        ):
            uncommitted = await poll_until(everything, produced)
            want = len(committed_only(uncommitted))
            got = await poll_until(committed, want)
            assert await quiet(committed) == []
            return uncommitted, got

    uncommitted, got = asyncio.run(run())
    assert sorted(r.value for r in uncommitted if r.value is not None) == sorted(
        values("plain-a", 5)
        + values("commit-x", 20)
        + values("plain-b", 3)
        + values("abort-y", 20)
        + values("commit-x2", 10)
        + values("plain-c", 4)
        + values("abort-y2", 5)
        + values("abort-z", 15)
        + values("commit-w", 12)
        + values("plain-d", 6)
    )
    offsets = [r.offset for r in uncommitted]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert offsets[-1] > len(offsets)  # markers took offsets between the data records
    assert offsets_and_values(got) == committed_only(uncommitted)
    assert [v for _, v in offsets_and_values(got) if v is not None and v[:5] == b"plain"] == (
        values("plain-a", 5) + values("plain-b", 3) + values("plain-c", 4) + values("plain-d", 6)
    )
    segments = sorted((txn_broker.data_dir / f"{topic}-0").glob("*.log"))
    assert len(segments) > 2  # the consumers held transactions across segments


def test_an_open_transaction_holds_read_committed_back(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """While a transaction is open, a read_committed consumer returns the records before
    it and is granted nothing past its first batch (the last stable offset), though plain
    records follow; read_uncommitted reads on. After the commit it returns the
    transaction's records and the plain ones after them, in offset order."""
    bootstrap = txn_broker.bootstrap
    topic = f"rc-open-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic, config=PREALLOCATED)
    plain = clients.producer(bootstrap, {"acks": "all", "linger.ms": 0})
    producer = transactional(bootstrap)
    send(plain, topic, values("plain-a", 5))
    producer.begin_transaction()
    send(producer, topic, values("commit-x", 7))
    send(plain, topic, values("plain-b", 4))

    async def run() -> None:
        async with (
            RdmaConsumer(bootstrap, topic, 0, 0, provider="shm") as everything,
            RdmaConsumer(
                bootstrap, topic, 0, 0, provider="shm", isolation_level="read_committed"
            ) as committed,
        ):
            before = await poll_until(committed, 5)
            assert offsets_and_values(before) == list(enumerate(values("plain-a", 5)))
            assert await quiet(committed) == []
            lso_end = batch_end_below(txn_broker, topic, 5)  # the transaction's first batch
            assert committed.readable_end == lso_end
            assert committed.position == 5
            uncommitted = await poll_until(everything, 16)
            assert [r.value for r in uncommitted] == (
                values("plain-a", 5) + values("commit-x", 7) + values("plain-b", 4)
            )
            assert everything.readable_end > lso_end

            await asyncio.to_thread(producer.commit_transaction, WAIT)
            after = await poll_until(committed, 11)
            assert offsets_and_values(after) == offsets_and_values(uncommitted[5:])
            assert await quiet(committed) == []
            assert committed.readable_end > lso_end

    asyncio.run(run())


def test_a_transaction_aborted_on_timeout_is_never_returned(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """A transaction its producer abandons holds read_committed back until the coordinator
    aborts it (transaction.timeout.ms); then the consumer reads on past its records, which
    it never returns, to the plain records after them."""
    bootstrap = txn_broker.bootstrap
    topic = f"rc-timeout-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic, config=PREALLOCATED)
    plain = clients.producer(bootstrap, {"acks": "all", "linger.ms": 0})
    abandoned = transactional(bootstrap, **{"transaction.timeout.ms": 3000})
    send(plain, topic, values("plain-a", 3))
    abandoned.begin_transaction()
    send(abandoned, topic, values("abort-t", 6))
    send(plain, topic, values("plain-b", 4))

    async def run() -> list[Record]:
        async with RdmaConsumer(
            bootstrap, topic, 0, 0, provider="shm", isolation_level="read_committed"
        ) as committed:
            before = await poll_until(committed, 3)
            assert [r.value for r in before] == values("plain-a", 3)
            after = await poll_until(committed, 4)  # once the coordinator aborted it
            assert await quiet(committed) == []
            return after

    after = asyncio.run(run())
    assert offsets_and_values(after) == list(zip(range(9, 13), values("plain-b", 4), strict=True))


def test_the_confluent_style_consumer_takes_isolation_level(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """directlog.client.Consumer reads over RDMA with librdkafka's ``isolation.level`` and
    default (read_committed): the aborted records are not handed out; read_uncommitted
    hands out every data record."""
    bootstrap = txn_broker.bootstrap
    topic = f"rc-client-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic, config=PREALLOCATED)
    plain = clients.producer(bootstrap, {"acks": "all", "linger.ms": 0})
    producer = transactional(bootstrap)
    send(plain, topic, values("plain-a", 3))
    producer.begin_transaction()
    send(producer, topic, values("abort-x", 4))
    producer.abort_transaction(WAIT)
    producer.begin_transaction()
    send(producer, topic, values("commit-y", 5))
    producer.commit_transaction(WAIT)
    send(plain, topic, values("plain-b", 2))

    def read(count: int, **isolation: str) -> list[tuple[int, bytes | None]]:
        consumer = RdmaClientConsumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"rc-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "rdma.consume": True,
                "rdma.provider": "shm",
                "logger": RDKAFKA_LOG,
                **isolation,
            }
        )
        try:
            consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            got = [(m.offset(), m.value()) for m in clients.consume(consumer, count, WAIT)]
            extra = consumer.consume(10, QUIET)
            assert [(m.offset(), m.value()) for m in extra] == []
            return got
        finally:
            consumer.close()

    writes = txn_broker.sample("directlog_broker_rdma_consume_slot_writes_total", topic=topic)
    committed = read(10)
    everything = read(14, **{"isolation.level": "read_uncommitted"})
    assert sorted(v for _, v in everything if v is not None) == sorted(
        values("plain-a", 3) + values("abort-x", 4) + values("commit-y", 5) + values("plain-b", 2)
    )
    # Markers are written after EndTxn answers, so plain-b may land before the commit's.
    assert committed == [(o, v) for o, v in everything if not (v or b"").startswith(b"abort")]
    later = txn_broker.sample("directlog_broker_rdma_consume_slot_writes_total", topic=topic)
    assert later is not None and later > (writes or 0)  # read over RDMA, not librdkafka


# Bad input ---------------------------------------------------------------------------------


def test_an_unknown_isolation_level_is_refused_and_granted_nothing(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """A v1 ACCESS with an isolation byte other than 0 or 1 is answered INVALID_REQUEST,
    with no consumer, registration or rkey; the connection serves on, and a consumer keeps
    the isolation level it was created with."""
    bootstrap = txn_broker.bootstrap
    topic = f"rc-bad-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic, config=PREALLOCATED)
    send(clients.producer(bootstrap, {"acks": "all"}), topic, values("plain", 3))
    consumers = txn_broker.sample("directlog_broker_rdma_consumers")
    registrations = txn_broker.sample("directlog_broker_rdma_consume_registrations")

    def access(consumer_id: int, level: int) -> RdmaConsumeRequest:
        return RdmaConsumeRequest(topic, 0, ACCESS, consumer_id, 0, ("shm",), level)

    async def run() -> None:
        host, _, port = bootstrap.rpartition(":")
        connection = await KafkaConnection.connect(host, int(port), 5.0)

        async def ask(request: RdmaConsumeRequest) -> RdmaConsumeResponse:
            correlation_id = connection.next_correlation_id()
            frame = await connection.exchange(request_frame(request, correlation_id, "raw"))
            return decode_response_frame(frame, correlation_id)

        try:
            for level in (7, -1, 2):
                refused = await ask(access(NEW_CONSUMER, level))
                assert refused.error_code == ErrorCode.INVALID_REQUEST
                assert f"isolation level {level}" in (refused.error_message or "")
                assert (refused.consumer_id, refused.rkey, refused.length) == (NEW_CONSUMER, 0, 0)
            assert txn_broker.sample("directlog_broker_rdma_consumers") == consumers
            assert txn_broker.sample("directlog_broker_rdma_consume_registrations") == (
                registrations
            )
            good = await ask(access(NEW_CONSUMER, READ_COMMITTED))
            assert good.error_code == ErrorCode.NONE, good.error_message
            assert good.consumer_id != NEW_CONSUMER and good.length > 0
            mixed = await ask(access(good.consumer_id, READ_UNCOMMITTED))
            assert mixed.error_code == ErrorCode.INVALID_REQUEST
            assert "another isolation level" in (mixed.error_message or "")
        finally:
            await connection.close()

    asyncio.run(run())

    async def read() -> list[Record]:
        async with RdmaConsumer(
            bootstrap, topic, 0, 0, provider="shm", isolation_level="read_committed"
        ) as consumer:
            return await poll_until(consumer, 3)

    assert [r.value for r in asyncio.run(read())] == values("plain", 3)


def test_read_committed_needs_records_not_batches() -> None:
    with pytest.raises(ValueError):
        RdmaConsumer("127.0.0.1:1", "t", 0, 0, isolation_level="read_committed", batches=True)
    with pytest.raises(ValueError):
        RdmaConsumer("127.0.0.1:1", "t", 0, 0, isolation_level="committed")
