"""read_committed reads of tiered data (KIP-405 with KIP-98): transactions committed and
aborted, some spanning segments and interleaved with others, are copied to the remote store
with each copy's aborted transactions (`.txnindex`), the local segments are deleted, and
confluent-kafka and kafka-python read_committed consumers reading from offset 0 get exactly
the committed records (read_uncommitted ones every record) — also from a broker whose disk
was wiped, which rebuilt from the store and never saw those transactions' markers."""

from __future__ import annotations

import random
import shutil
import time
import uuid
import warnings
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as CTopicPartition

from directlog.protocol.errors import ErrorCode
from directlog.remote import layout
from directlog.remote.store import RemoteStore, StoreConfig
from directlog.remote.txn_index import AbortedTxn, decode_aborted
from directlog.rpc import controller_pb2 as pb
from services.broker.storage.txn_index import AbortedTxnIndex
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.conftest import RDKAFKA_LOG
from tests.e2e.records import fetch_partition
from tests.e2e.test_tiering import in_sync, remote_index_end
from tests.e2e.tiered import (
    TIMEOUT,
    create_tiered_topic,
    leader_of,
    local_log_start,
    remote_records,
    tiering_settings,
    topic_id_of,
    wait_tiered,
)
from tests.s3_server import S3Server

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

pytestmark = pytest.mark.timeout(420)

BROKER = {
    "transaction_state_log_replication_factor": 1,
    "transaction_state_log_num_partitions": 1,
}


class Produced:
    """What the test producers sent: the values of committed and of aborted records."""

    def __init__(self) -> None:
        self.committed: set[bytes] = set()
        self.aborted: set[bytes] = set()


def value(rng: random.Random, kind: str, round_: int, i: int) -> bytes:
    return f"{kind}-{round_}-{i}-".encode() + rng.randbytes(rng.randint(300, 700))


def produce_transactions(bootstrap: str, topic: str, rounds: int) -> Produced:
    """Rounds of: a committed transaction; an aborted one (a segment or more); a committed
    and an aborted transaction interleaved; a large aborted one (three segments or so) with
    non-transactional records among its own. Then committed records, so the segments
    holding the last abort close and are copied too."""
    rng = random.Random(11)
    produced = Produced()
    common = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "batch.size": 16384,
        "logger": RDKAFKA_LOG,
    }
    run = uuid.uuid4().hex[:8]
    committer = Producer({**common, "transactional.id": f"commit-{run}"})
    aborter = Producer({**common, "transactional.id": f"abort-{run}"})
    plain = Producer({**common, "enable.idempotence": True})
    for producer in (committer, aborter):
        producer.init_transactions(TIMEOUT)

    def send(producer: Producer, values: list[bytes]) -> None:
        for v in values:
            producer.produce(topic, v, key=v[:12], partition=0)
        producer.poll(0)

    for r in range(rounds):
        kind = r % 4
        if kind == 0:
            committed = [value(rng, "c", r, i) for i in range(150)]
            committer.begin_transaction()
            send(committer, committed)
            committer.commit_transaction(TIMEOUT)
            produced.committed.update(committed)
        elif kind == 1:
            aborted = [value(rng, "a", r, i) for i in range(150)]
            aborter.begin_transaction()
            send(aborter, aborted)
            aborter.flush(TIMEOUT)  # written, then aborted
            aborter.abort_transaction(TIMEOUT)
            produced.aborted.update(aborted)
        elif kind == 2:
            committer.begin_transaction()
            aborter.begin_transaction()
            for i in range(100):
                c, a = value(rng, "ic", r, i), value(rng, "ia", r, i)
                send(committer, [c])
                send(aborter, [a])
                produced.committed.add(c)
                produced.aborted.add(a)
                if i % 20 == 19:
                    committer.flush(TIMEOUT)
                    aborter.flush(TIMEOUT)
            committer.commit_transaction(TIMEOUT)
            aborter.flush(TIMEOUT)
            aborter.abort_transaction(TIMEOUT)
        else:
            aborter.begin_transaction()
            for i in range(300):
                a = value(rng, "la", r, i)
                send(aborter, [a])
                produced.aborted.add(a)
                if i % 6 == 5:
                    p = value(rng, "p", r, i)
                    send(plain, [p])
                    produced.committed.add(p)
                if i % 50 == 49:
                    aborter.flush(TIMEOUT)
                    plain.flush(TIMEOUT)
            aborter.flush(TIMEOUT)
            aborter.abort_transaction(TIMEOUT)
    tail = [value(rng, "t", rounds, i) for i in range(300)]
    send(plain, tail)
    produced.committed.update(tail)
    assert plain.flush(TIMEOUT) == 0
    return produced


def end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"w-{uuid.uuid4()}"})
    try:
        _, high = consumer.get_watermark_offsets(CTopicPartition(topic, 0), timeout=TIMEOUT)
        return int(high)
    finally:
        consumer.close()


def read_confluent(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    """Every value of partition 0 from offset 0 a confluent-kafka consumer of `isolation`
    gets, once its position reached the log end (it passes markers and aborted records)."""
    end = end_offset(bootstrap, topic)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "logger": RDKAFKA_LOG,
        }
    )
    consumer.assign([CTopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while consumer.position([CTopicPartition(topic, 0)])[0].offset < end:
            assert time.monotonic() < deadline, f"{isolation}: {len(got)} values, end {end}"
            for message in consumer.consume(500, timeout=1):
                if message.error() is not None:
                    raise KafkaException(message.error())
                got.append(message.value())
    finally:
        consumer.close()
    return got


def read_kafka_python(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    end = end_offset(bootstrap, topic)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation
    )
    tp = KTopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    got: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"{isolation}: {len(got)} values, end {end}"
            for records in consumer.poll(timeout_ms=1000).values():
                got.extend(r.value for r in records)
    finally:
        consumer.close()
    return got


def check_reads(bootstrap: str, topic: str, produced: Produced) -> None:
    """read_uncommitted consumers get every record, read_committed ones exactly the
    committed records, in the log's order, both clients."""
    everything = read_confluent(bootstrap, topic, "read_uncommitted")
    assert len(everything) == len(set(everything))
    assert set(everything) == produced.committed | produced.aborted
    expected = [v for v in everything if v in produced.committed]
    for read in (read_confluent, read_kafka_python):
        got = read(bootstrap, topic, "read_committed")
        leaked = [v[:12] for v in got if v in produced.aborted]
        assert not leaked, f"{read.__name__}: {len(leaked)} aborted records, {leaked[:5]}"
        assert got == expected, read.__name__
    assert read_kafka_python(bootstrap, topic, "read_uncommitted") == everything


def shipped_aborted(
    settings: dict[str, Any], s3: S3Server | None, cluster: Cluster, topic: str
) -> list[tuple[int, int, list[AbortedTxn]]]:
    """(start, end offset, `.txnindex` entries) of each finished copy of partition 0 of
    `topic`, in order (a missing object fails the test)."""
    extra = s3.settings if s3 is not None and settings["remote"].startswith("s3") else {}
    store = RemoteStore(StoreConfig(settings["remote"], **extra))
    prefix = layout.partition_prefix(topic, topic_id_of(cluster, topic), 0)
    shipped = []
    for record in remote_records(cluster, topic):
        if record.state != pb.COPY_FINISHED:
            continue
        segment_id = uuid.UUID(bytes=record.segment_id)
        key = layout.segment_key(prefix, record.base_offset, segment_id, layout.TXN_INDEX)
        entries = decode_aborted(store.read_all(key))
        shipped.append((record.start_offset, record.end_offset, entries))
    return shipped


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_read_committed_consumers_skip_aborted_records_read_from_the_remote_store(
    kind, tmp_path, s3
):
    topic = "payments"
    settings = tiering_settings(kind, tmp_path, s3)
    with Cluster(tmp_path, broker_settings=BROKER, tiering=settings) as cluster:
        create_tiered_topic(cluster, topic)
        produced = produce_transactions(cluster.bootstrap, topic, rounds=8)
        total = len(produced.committed) + len(produced.aborted)
        wait_tiered(cluster, 0, topic, at_least=total * 3 // 4)
        broker = cluster.brokers[0]
        local_start = int(local_log_start(cluster, 0, topic) or 0)

        # Every copy shipped the aborted transactions with records in it, as the broker
        # indexed them.
        shipped = shipped_aborted(settings, s3, cluster, topic)
        assert shipped[0][0] == 0 and shipped[-1][1] >= local_start - 1
        local = AbortedTxnIndex(broker.data_dir / f"{topic}-0").entries
        assert len(local) == 6  # rounds 1, 2, 3, 5, 6, 7
        for start, end, entries in shipped:
            assert entries == [t for t in local if t.first_offset <= end and t.last_offset >= start]
        assert any(t.last_offset < local_start for t in local)  # aborts wholly remote
        assert sum(len(entries) for _, _, entries in shipped) > len(local) // 2

        check_reads(cluster.bootstrap, topic, produced)
        assert broker.total("directlog_broker_remote_fetch_bytes_total", topic=topic) > 0


def test_a_wiped_broker_answers_aborted_transactions_from_the_remote_store(tmp_path):
    topic = "ledger"
    settings = tiering_settings("file", tmp_path, None, index_rotate_bytes=256)
    with Cluster(tmp_path, brokers=2, broker_settings=BROKER, tiering=settings) as cluster:
        create_tiered_topic(cluster, topic, replicas=2)
        produced = produce_transactions(cluster.bootstrap, topic, rounds=8)
        total = len(produced.committed) + len(produced.aborted)
        leader = leader_of(cluster, topic)
        follower = 1 - leader
        wait_tiered(cluster, leader, topic, at_least=total * 3 // 4)
        wait_tiered(cluster, follower, topic, at_least=total // 2)
        # The follower's disk is replaced: it restarts its log past the remote copies and
        # its tiering service builds its remote indexes from the store.
        broker = cluster.brokers[follower]
        cluster.tierings[follower].stop()
        broker.stop()
        shutil.rmtree(broker.data_dir)
        broker.start()
        cluster.tierings[follower].start()
        wait_for(lambda: in_sync(cluster, topic, follower), TIMEOUT, "the follower in sync")
        restart = int(local_log_start(cluster, follower, topic) or 0)
        assert restart >= total // 2
        wait_for(
            lambda: remote_index_end(broker.data_dir / f"{topic}-0") >= restart,
            TIMEOUT,
            "the wiped broker's remote indexes",
        )
        cluster.tierings[leader].kill()
        cluster.brokers[leader].kill()
        wait_for(lambda: leader_of(cluster, topic) == follower, TIMEOUT, "the wiped broker leads")

        # Its own index does not know the aborts below where its log restarted: the
        # answers for those remote records come from the copies' transaction indexes.
        local = set(AbortedTxnIndex(broker.data_dir / f"{topic}-0").entries)
        copies = shipped_aborted(settings, None, cluster, topic)
        unknown = {t for _, _, entries in copies for t in entries} - local
        assert any(t.last_offset < restart for t in unknown), (restart, local)
        check_reads(cluster.bootstrap, topic, produced)
        assert broker.total("directlog_broker_remote_fetch_bytes_total", topic=topic) > 0


def test_a_corrupt_remote_transaction_index_is_never_answered_as_committed(tmp_path):
    topic = "audit"
    settings = tiering_settings("file", tmp_path, None)
    with Cluster(tmp_path, broker_settings=BROKER, tiering=settings) as cluster:
        create_tiered_topic(cluster, topic)
        produced = produce_transactions(cluster.bootstrap, topic, rounds=4)
        total = len(produced.committed) + len(produced.aborted)
        wait_tiered(cluster, 0, topic, at_least=total // 2)
        store = RemoteStore(StoreConfig(settings["remote"]))
        prefix = layout.partition_prefix(topic, topic_id_of(cluster, topic), 0)
        first = next(r for r in remote_records(cluster, topic) if r.state == pb.COPY_FINISHED)
        key = layout.segment_key(
            prefix, first.base_offset, uuid.UUID(bytes=first.segment_id), layout.TXN_INDEX
        )
        good = store.read_all(key)
        store.write(key, [good + b"\x00" * 7])  # a torn entry

        def fetched(isolation_level: int) -> Any:
            """The first answer with records or an error (a remote read may take a fetch
            or two to finish)."""
            deadline = time.monotonic() + TIMEOUT
            while True:
                answer = fetch_partition(
                    cluster.bootstrap, topic, 0, isolation_level=isolation_level
                )
                if answer.error_code or answer.records:
                    return answer
                assert time.monotonic() < deadline, "no answer from the remote store"
                time.sleep(0.2)

        refused = fetched(1)
        assert refused.error_code == ErrorCode.KAFKA_STORAGE_ERROR and not refused.records
        uncommitted = fetched(0)  # the records themselves are fine
        assert uncommitted.error_code == 0 and uncommitted.records
        store.write(key, [good])  # repaired: read_committed reads again, with the aborts
        committed = fetched(1)
        assert committed.error_code == 0 and committed.records
        assert committed.aborted_transactions
        check_reads(cluster.bootstrap, topic, produced)
