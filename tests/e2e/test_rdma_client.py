"""directlog.client.Producer and Consumer, the confluent-kafka drop-ins, against real
brokers on the shm and tcp providers: records they write over RDMA are read back by
confluent-kafka and the other way round, with confluent's own partitioning, delivery
reports, group membership and committed offsets; against a broker without RDMA they fall
back to TCP; bad rdma.* keys are refused."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaException
from confluent_kafka.admin import NewTopic

from directlog.client import Consumer, Producer, TopicPartition
from directlog.client.rdma_produce import RdmaProduceError, RdmaProducer
from directlog.records.batch import iter_batches
from directlog.records.compression import Compression
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.conftest import RDKAFKA_LOG, Clients, _stop_checked
from tests.e2e.records import fetch_partition

pytestmark = pytest.mark.timeout(150)

PREALLOCATED = {"preallocate": "true", "segment.bytes": str(1 << 20)}
GRANTS = "directlog_broker_rdma_produce_grants"
REVOCATIONS = "directlog_broker_rdma_produce_revocations_total"


@pytest.fixture(scope="module", params=["shm", "tcp"])
def rdma_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BrokerProcess, str]]:
    provider = request.param
    settings = {
        "rdma_produce": True,
        "rdma_consume": True,
        "rdma_provider": provider,
        "rdma_grant_max_bytes": 256 * 1024,
    }
    cluster = Cluster(tmp_path_factory.mktemp(f"client-{provider}"), broker_settings=settings)
    cluster.start()
    try:
        yield cluster.brokers[0], provider
        _stop_checked(cluster.brokers[0])
    finally:
        cluster.stop()


def config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "logger": RDKAFKA_LOG, **extra}


def keyed(count: int, prefix: str = "v") -> list[dict[str, Any]]:
    return [
        {
            "key": f"key-{i % 17}".encode(),
            "value": f"{prefix}-{i}".encode(),
            "headers": [("n", str(i).encode())],
        }
        for i in range(count)
    ]


def by_partition(reports: list[tuple[Any, Any]]) -> dict[int, list[tuple[int, bytes]]]:
    found: dict[int, list[tuple[int, bytes]]] = {}
    for error, message in reports:
        assert error is None, error
        found.setdefault(message.partition(), []).append((message.offset(), message.value()))
    return found


@pytest.mark.parametrize(
    ("mode", "partitioner"), [("exclusive", "consistent_random"), ("shared", "murmur2_random")]
)
def test_producer_writes_over_rdma_where_confluent_would(
    rdma_broker, clients: Clients, topic_name, mode, partitioner
):
    broker, provider = rdma_broker
    topic, reference = topic_name("p"), topic_name("ref")
    for name in (topic, reference):
        clients.create_topic(broker.bootstrap, name, partitions=3, config=PREALLOCATED)
    settings = {"rdma.produce": mode, "rdma.provider": provider, "partitioner": partitioner}
    revocations = broker.sample(REVOCATIONS)
    producer = Producer(config(broker.bootstrap, **settings))
    try:
        reports = clients.produce_all(producer, topic, keyed(600))
        # A grant of the mode per partition written, each with its writer, while it is open.
        assert broker.sample(GRANTS, mode=mode) == 3
        assert broker.sample("directlog_broker_rdma_produce_writers") == 3
    finally:
        producer.close()
    wait_for(lambda: broker.total(GRANTS) == 0, 30, "grants sealed once the producer left")
    # A producer that closes is no fault: nothing revoked, nothing warned about.
    assert broker.sample(REVOCATIONS) == revocations
    assert "WARNING services.broker.rdma.produce" not in broker.stderr_text()
    # The same records through confluent-kafka, with the same partitioner, land in the
    # same partitions.
    tcp = clients.producer(broker.bootstrap, {"partitioner": partitioner})
    expected = clients.produce_all(tcp, reference, keyed(600))
    assert {p: [v for _, v in got] for p, got in by_partition(reports).items()} == {
        p: [v for _, v in got] for p, got in by_partition(expected).items()
    }
    for partition, got in by_partition(reports).items():
        assert [offset for offset, _ in got] == list(range(len(got)))
        consumer = clients.consumer(broker.bootstrap)
        clients.assign_from(consumer, topic, [partition])
        messages = clients.consume(consumer, len(got))
        assert [(m.offset(), m.value()) for m in messages] == got
        assert all(m.headers() == [("n", m.value()[2:])] for m in messages)
    # RDMA writes carried them, not Kafka-protocol produces.
    assert sum(count for p in range(3) for _, count in broker.stored_batches(topic, p)) == 600
    writes = broker.sample("directlog_broker_rdma_produce_writes_total", topic=topic)
    assert writes is not None and writes >= 3


@pytest.mark.parametrize("idempotent", [True, False])
@pytest.mark.parametrize("mode", ["exclusive", "shared"])
def test_batches_left_unanswered_are_written_again_over_tcp(
    rdma_broker,
    clients: Clients,
    topic_name,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    idempotent: bool,
):
    """A failed RDMA write that the broker committed in full but answered only for its first
    batch (the replies lost: a fault injected into RdmaProducer.send). The unanswered
    batches are written again with Kafka Produce requests before any later record: an
    idempotent producer's land once, where the RDMA write put them; without idempotence
    they land twice (at least once). The answered batch is never written again."""
    broker, provider = rdma_broker
    topic = topic_name("again")
    clients.create_topic(broker.bootstrap, topic, partitions=1, config=PREALLOCATED)
    real_send = RdmaProducer.send
    faults: list[int] = []

    async def replies_lost(self: RdmaProducer, batches: Any) -> Any:
        produced = await real_send(self, batches)
        if faults:
            return produced
        faults.append(len(batches))
        await self.close()  # as a failing RdmaProducer does: the broker revokes the grant
        error = RdmaProduceError("replies lost (injected)")
        error.produced = [produced[0]] + [None] * (len(produced) - 1)
        raise error

    monkeypatch.setattr(RdmaProducer, "send", replies_lost)
    producer = Producer(
        config(
            broker.bootstrap,
            **{
                "rdma.produce": mode,
                "rdma.provider": provider,
                "enable.idempotence": idempotent,
                "linger.ms": 200,
                "batch.num.messages": 10,
            },
        )
    )
    values = [f"again-{i}".encode() for i in range(70)]
    try:
        reports = clients.produce_all(
            producer, topic, [{"value": v, "partition": 0} for v in values[:50]]
        )
        reports += clients.produce_all(
            producer, topic, [{"value": v, "partition": 0} for v in values[50:]]
        )
    finally:
        producer.close()
    assert faults == [5], "one RDMA write of five batches failed"
    assert all(error is None for error, _ in reports), reports
    delivered = {m.value(): m.offset() for _, m in reports}
    assert sorted(delivered) == sorted(values)
    consumer = clients.consumer(broker.bootstrap)
    clients.assign_from(consumer, topic, [0])
    stored = [(m.offset(), m.value()) for m in clients.consume(consumer, 70 if idempotent else 110)]
    if idempotent:
        assert [v for _, v in stored] == values
    else:
        # The batches written again follow the RDMA write's: 2-5 twice, then the rest.
        assert [v for _, v in stored] == values[:50] + values[10:50] + values[50:]
    for value, offset in delivered.items():
        assert (offset, value) in stored, (offset, value)


def test_consumer_reads_over_rdma_in_a_group_and_commits(rdma_broker, clients: Clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("c")
    clients.create_topic(broker.bootstrap, topic, partitions=2, config=PREALLOCATED)
    sent = by_partition(
        clients.produce_all(clients.producer(broker.bootstrap), topic, keyed(400, "c"))
    )
    group = f"rdma-{topic}"
    consumer = Consumer(
        config(
            broker.bootstrap,
            **{
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "rdma.consume": True,
                "rdma.provider": provider,
            },
        )
    )
    try:
        consumer.subscribe([topic])
        messages = clients.consume(consumer, 300, timeout=60)
        got: dict[int, list[tuple[int, bytes]]] = {}
        for message in messages:
            got.setdefault(message.partition(), []).append((message.offset(), message.value()))
        for partition, records in got.items():
            assert records == sent[partition][: len(records)]
        consumer.commit(asynchronous=False)
        positions = {p.partition: p.offset for p in consumer.position(consumer.assignment())}
        assert positions == {p: len(got.get(p, [])) for p in range(2)}
    finally:
        consumer.close()
    # One-sided reads carried them: no Fetch answered a record of the topic.
    assert not broker.sample("directlog_broker_records_out_total", topic=topic)
    # A confluent consumer in the same group resumes at the committed offsets.
    resumed = clients.consumer(
        broker.bootstrap, {"group.id": group, "auto.offset.reset": "earliest"}
    )
    resumed.subscribe([topic])
    rest = clients.consume(resumed, 100, timeout=60)
    seen = {(m.partition(), m.offset()) for m in messages} | {
        (m.partition(), m.offset()) for m in rest
    }
    assert seen == {(p, o) for p, records in sent.items() for o, _ in records}


def test_consumer_seeks_pauses_and_resumes_over_rdma(rdma_broker, clients: Clients, topic_name):
    broker, provider = rdma_broker
    topic = topic_name("s")
    clients.create_topic(broker.bootstrap, topic, config=PREALLOCATED)
    reports = clients.produce_all(clients.producer(broker.bootstrap), topic, keyed(100, "s"))
    sent = by_partition(reports)[0]
    consumer = Consumer(
        config(
            broker.bootstrap,
            **{
                "group.id": f"seek-{topic}",
                "enable.auto.commit": False,
                "rdma.consume": True,
                "rdma.provider": provider,
            },
        )
    )
    tp = TopicPartition(topic, 0)

    def take(count: int) -> list[tuple[int, bytes]]:
        return [(m.offset(), m.value()) for m in clients.consume(consumer, count, timeout=30)]

    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        assert take(10) == sent[:10]
        consumer.pause([tp])
        assert consumer.poll(1.0) is None  # paused: nothing handed out, read-ahead dropped
        assert consumer.position([tp])[0].offset == 10
        consumer.resume([tp])
        assert take(10) == sent[10:20]
        consumer.seek(TopicPartition(topic, 0, 5))
        assert consumer.position([tp])[0].offset == 5
        assert take(3) == sent[5:8]
        consumer.seek(TopicPartition(topic, 0, OFFSET_BEGINNING))
        assert take(2) == sent[:2]
        consumer.pause([tp])
        consumer.seek(TopicPartition(topic, 0, 50))  # while paused: takes effect on resume
        assert consumer.poll(0.5) is None
        consumer.resume([tp])
        assert take(50) == sent[50:]
        assert consumer.poll(0.5) is None
        assert consumer.consumer_group_metadata() is not None  # confluent's own, delegated
    finally:
        consumer.close()
    # librdkafka fetched nothing of the topic, whatever was paused and resumed.
    assert not broker.sample("directlog_broker_records_out_total", topic=topic)


def test_cooperative_rebalance_moves_partitions_and_keeps_the_rest(
    rdma_broker, clients: Clients, topic_name
):
    """cooperative-sticky: a second member takes half the partitions; the first keeps
    reading the others without a restart. Every record is handed out once in the group."""
    broker, provider = rdma_broker
    topic = topic_name("coop")
    clients.create_topic(broker.bootstrap, topic, partitions=4, config=PREALLOCATED)
    producer = clients.producer(broker.bootstrap)
    old = by_partition(clients.produce_all(producer, topic, keyed(200, "old")))
    settings = {
        "group.id": f"coop-{topic}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "partition.assignment.strategy": "cooperative-sticky",
        "rdma.consume": True,
        "rdma.provider": provider,
    }
    first = Consumer(config(broker.bootstrap, **settings))
    second = Consumer(config(broker.bootstrap, **settings))
    try:
        first.subscribe([topic])
        read = clients.consume(first, 200, timeout=60)
        assert sorted((m.partition(), m.offset()) for m in read) == sorted(
            (p, o) for p, records in old.items() for o, _ in records
        )
        first.commit(asynchronous=False)
        second.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(first.assignment()) != 2 or len(second.assignment()) != 2:
            assert time.monotonic() < deadline, (first.assignment(), second.assignment())
            for member in (first, second):
                assert member.poll(0.1) is None  # nothing new yet, and nothing twice
        new = by_partition(clients.produce_all(producer, topic, keyed(200, "new")))
        mine = {p.partition for p in first.assignment()}
        theirs = {p.partition for p in second.assignment()}
        count_first = sum(len(new.get(p, [])) for p in mine)
        got = clients.consume(first, count_first, timeout=60)
        got += clients.consume(second, 200 - count_first, timeout=60)
        assert sorted((m.partition(), m.offset(), m.value()) for m in got) == sorted(
            (p, o, v) for p, records in new.items() for o, v in records
        )
        assert {m.partition() for m in got[:count_first]} <= mine
        assert {m.partition() for m in got[count_first:]} <= theirs
        assert first.poll(0.5) is None and second.poll(0.5) is None
    finally:
        second.close()
        first.close()
    assert not broker.sample("directlog_broker_records_out_total", topic=topic)


@pytest.fixture(scope="module")
def rdma_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three brokers serving RDMA consume on shm; a test may stop one of them."""
    settings = {"rdma_consume": True, "rdma_provider": "shm"}
    cluster = Cluster(tmp_path_factory.mktemp("client-rf3"), brokers=3, broker_settings=settings)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_consumer_follows_a_moving_leader_over_rdma(
    rdma_cluster, clients: Clients, topic_name, caplog: pytest.LogCaptureFixture
):
    """The leader stops (a controlled shutdown moves its leadership): the consumer goes on
    reading from the new leader over RDMA, every record once and in order."""
    topic = topic_name("moving")
    admin = clients.admin(rdma_cluster.bootstrap)
    created = admin.create_topics([NewTopic(topic, 1, 3, config=PREALLOCATED)])
    created[topic].result(timeout=20)
    producer = clients.producer(rdma_cluster.bootstrap, {"acks": "all"})
    sent = by_partition(clients.produce_all(producer, topic, keyed(60, "m")))[0]
    consumer = Consumer(
        config(
            rdma_cluster.bootstrap,
            **{
                "group.id": f"moving-{topic}",
                "enable.auto.commit": False,
                "rdma.consume": True,
                "rdma.provider": "shm",
            },
        )
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        first = clients.consume(consumer, 30, timeout=30)
        assert [(m.offset(), m.value()) for m in first] == sent[:30]
        old = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
        rdma_cluster.brokers[old].stop()
        more = by_partition(clients.produce_all(producer, topic, keyed(40, "n")))[0]
        rest = clients.consume(consumer, 70, timeout=60)  # fails on any error message
        assert [(m.offset(), m.value()) for m in rest] == sent[30:] + more
        assert consumer.poll(0.5) is None
    finally:
        consumer.close()
    new = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    assert new != old
    # The new leader served the consumer over RDMA (its fetches went to the other replica).
    slot_writes = "directlog_broker_rdma_consume_slot_writes_total"
    assert rdma_cluster.brokers[new].sample(slot_writes, topic=topic)
    assert "consuming over TCP" not in caplog.text


def test_producer_and_consumer_fall_back_to_tcp(module_broker, clients: Clients, topic_name):
    """The module broker serves no RDMA: everything goes over TCP, nothing is lost."""
    topic = topic_name("fb")
    clients.create_topic(module_broker.bootstrap, topic, partitions=2)
    producer = Producer(config(module_broker.bootstrap, **{"rdma.produce": "shared"}))
    try:
        reports = clients.produce_all(producer, topic, keyed(200))
    finally:
        producer.close()
    sent = by_partition(reports)
    consumer = Consumer(
        config(
            module_broker.bootstrap,
            **{"group.id": "fb", "rdma.consume": "true", "enable.auto.commit": False},
        )
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
        messages = clients.consume(consumer, 200, timeout=60)
    finally:
        consumer.close()
    assert sorted((m.partition(), m.offset(), m.value()) for m in messages) == sorted(
        (p, o, v) for p, records in sent.items() for o, v in records
    )
    assert module_broker.sample("directlog_broker_rdma_produce_writes_total", topic=topic) is None


def test_a_topic_the_broker_recompresses_is_written_over_tcp(
    rdma_broker, clients: Clients, topic_name
):
    """compression.type other than producer: the broker rewrites each batch in the topic's
    codec, which RDMA writes would bypass, so it grants no RDMA produce and the producer
    falls back to TCP; the batches are stored recompressed."""
    broker, provider = rdma_broker
    topic = topic_name("gz")
    clients.create_topic(
        broker.bootstrap, topic, config={**PREALLOCATED, "compression.type": "gzip"}
    )
    producer = Producer(
        config(broker.bootstrap, **{"rdma.produce": "shared", "rdma.provider": provider})
    )
    try:
        reports = clients.produce_all(producer, topic, keyed(50))
    finally:
        producer.close()
    assert [v for _, v in by_partition(reports)[0]] == [f"v-{i}".encode() for i in range(50)]
    assert broker.sample("directlog_broker_rdma_produce_writes_total", topic=topic) is None
    data = fetch_partition(broker.bootstrap, topic, 0).records
    codecs = {header.compression for _, header in iter_batches(data)}
    assert codecs == {Compression.GZIP}


@pytest.mark.parametrize(
    "bad",
    [
        {"rdma.produce": "sometimes"},
        {"rdma.consume": "maybe"},
        {"rdma.provider": "carrier-pigeon"},
        {"rdma.read.size": 8},
    ],
)
def test_bad_rdma_settings_are_refused(bad):
    for client in (Producer, Consumer):
        with pytest.raises(KafkaException):
            client(config("127.0.0.1:1", **{"group.id": "g", **bad}))


EXIT_WITHOUT_CLOSE = """
import sys
from directlog.client import Producer
producer = Producer({"bootstrap.servers": sys.argv[1], "rdma.produce": "exclusive",
                     "rdma.provider": sys.argv[2], "linger.ms": 1})
for i in range(50):
    producer.produce(sys.argv[3], b"v%d" % i, partition=0)
assert producer.flush(30) == 0
print("flushed")
"""


def test_a_program_may_exit_after_flush_without_close(rdma_broker, clients: Clients, topic_name):
    """As with confluent-kafka's Producer, flush() and exit is a clean end: Python workers
    (Spark's among them) come and go without closing their producers."""
    broker, provider = rdma_broker
    topic = topic_name("exit")
    clients.create_topic(broker.bootstrap, topic, partitions=1, config=PREALLOCATED)
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WITHOUT_CLOSE, broker.bootstrap, provider, topic],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0 and done.stdout.strip() == "flushed", done.stderr
    assert "Task was destroyed" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    consumer = clients.consumer(broker.bootstrap)
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 50)
