"""Kafka transactions (KIP-98) against a real broker: confluent-kafka transactional producers
commit and abort across several topics and partitions, read_committed consumers
(confluent-kafka, kafka-python) see exactly the committed records in offset order while
read_uncommitted ones see every record, the markers sit at the offsets they should, a
zombie producer is fenced, and a transaction left open past its timeout is aborted."""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import NewTopic

from directlog.protocol.errors import ErrorCode
from directlog.records.batch import decode_records, iter_batches
from directlog.records.markers import ABORT, COMMIT, control_type
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster
from tests.e2e.conftest import RDKAFKA_LOG, Clients, single_broker
from tests.e2e.records import fetch_partition, raw_request
from tests.e2e.test_old_consumers import legacy_records, old_fetch

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition
    from kafka.errors import KafkaError as KafkaPythonError
    from kafka.protocol.admin import (
        DeleteRecordsRequest,
        DescribeTransactionsRequest,
        ListTransactionsRequest,
    )
    from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
    from kafka.protocol.producer import (
        AddPartitionsToTxnRequest,
        EndTxnRequest,
        InitProducerIdRequest,
    )

pytestmark = pytest.mark.timeout(180)

SETTINGS: dict[str, object] = {
    "transaction_state_log_replication_factor": 1,
    "transaction_state_log_num_partitions": 3,
    "transaction_abort_timed_out_transaction_cleanup_interval_ms": 200,
}
WAIT = 60.0  # bound of every wait on the broker


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with single_broker(tmp_path_factory.mktemp("txn-cluster"), SETTINGS) as process:
        yield process


def transactional(bootstrap: str, transactional_id: str, **extra: Any) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 5,
            "logger": RDKAFKA_LOG,
            **extra,
        }
    )
    producer.init_transactions(WAIT)
    return producer


def produce(producer: Producer, topic: str, partition: int, values: list[bytes]) -> None:
    for value in values:
        producer.produce(topic, value=value, key=value, partition=partition)
    producer.poll(0)


def read_committed(clients: Clients, bootstrap: str, topic: str, partitions: int, end: int) -> Any:
    """Every record a read_committed confluent-kafka consumer gets from the topic, once it
    reached offset `end` of each partition (its position passes markers and aborted data)."""
    consumer = clients.consumer(
        bootstrap, {"isolation.level": "read_committed", "enable.partition.eof": True}
    )
    clients.assign_from(consumer, topic, list(range(partitions)))
    got: dict[int, list[tuple[int | None, bytes | None]]] = {p: [] for p in range(partitions)}
    deadline = time.monotonic() + WAIT
    while True:
        positions = consumer.position([CTopicPartition(topic, p) for p in range(partitions)])
        if all(tp.offset >= end for tp in positions):
            return got
        assert time.monotonic() < deadline, f"positions {[tp.offset for tp in positions]}"
        for message in consumer.consume(500, 0.5):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            partition = message.partition()
            assert partition is not None
            got[partition].append((message.offset(), message.value()))


def raw_log(bootstrap: str, topic: str, partition: int) -> list[tuple[int, bool, int | None, Any]]:
    """The partition as stored, read_uncommitted by a raw Fetch v11: (offset, control,
    marker type, value) of every record."""
    data = fetch_partition(bootstrap.split(",")[0], topic, 0, partition=partition).records
    out = []
    for position, header in iter_batches(data):
        for record in decode_records(data, position, header):
            marker = control_type(record.key) if header.is_control else None
            out.append((record.offset, header.is_control, marker, record.value))
    return out


def test_commit_and_abort_over_two_topics(txn_broker: BrokerProcess, clients: Clients) -> None:
    bootstrap = txn_broker.bootstrap
    first, second = f"txn-a-{uuid.uuid4().hex[:6]}", f"txn-b-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, first, partitions=3)
    clients.create_topic(bootstrap, second, partitions=1)
    producer = transactional(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")

    producer.begin_transaction()
    for p in range(3):
        produce(producer, first, p, [b"c1-%d-%d" % (p, i) for i in range(5)])
    produce(producer, second, 0, [b"c1-s-%d" % i for i in range(4)])
    producer.commit_transaction(WAIT)

    producer.begin_transaction()
    produce(producer, first, 0, [b"a-%d" % i for i in range(3)])
    produce(producer, second, 0, [b"a-s-%d" % i for i in range(2)])
    assert producer.flush(WAIT) == 0  # written, so the abort has records to hide
    producer.abort_transaction(WAIT)

    producer.begin_transaction()
    produce(producer, first, 0, [b"c2-%d" % i for i in range(2)])
    producer.commit_transaction(WAIT)

    # read_uncommitted: every record, markers where each transaction ended.
    stored = raw_log(bootstrap, first, 0)
    assert stored == (
        [(i, False, None, b"c1-0-%d" % i) for i in range(5)]
        + [(5, True, COMMIT, b"\x00\x00\x00\x00\x00\x00")]
        + [(6 + i, False, None, b"a-%d" % i) for i in range(3)]
        + [(9, True, ABORT, b"\x00\x00\x00\x00\x00\x00")]
        + [(10 + i, False, None, b"c2-%d" % i) for i in range(2)]
        + [(12, True, COMMIT, b"\x00\x00\x00\x00\x00\x00")]
    )
    assert [(o, c, m) for o, c, m, _ in raw_log(bootstrap, first, 1)] == [
        *((i, False, None) for i in range(5)),
        (5, True, COMMIT),
    ]

    # read_committed: exactly the committed records, in offset order.
    got = read_committed(clients, bootstrap, first, 3, 6)
    assert got[1] == [(i, b"c1-1-%d" % i) for i in range(5)]
    assert got[2] == [(i, b"c1-2-%d" % i) for i in range(5)]
    got = read_committed(clients, bootstrap, first, 1, 13)
    assert got[0] == [(i, b"c1-0-%d" % i) for i in range(5)] + [
        (10 + i, b"c2-%d" % i) for i in range(2)
    ]
    got = read_committed(clients, bootstrap, second, 1, 8)
    assert got[0] == [(i, b"c1-s-%d" % i) for i in range(4)]


def kafka_python_values(bootstrap: str, topic: str, isolation: str, end: int) -> list[Any]:
    """(offset, value) of every record a kafka-python consumer with `isolation` gets from
    partition 0 before its position reaches `end`."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        consumer_timeout_ms=1000,
    )
    try:
        tp = KTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got: list[Any] = []
        deadline = time.monotonic() + WAIT
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"position {consumer.position(tp)} of {end}"
            for records in consumer.poll(timeout_ms=500).values():
                got.extend((r.offset, r.value) for r in records)
        return got
    finally:
        consumer.close()


def test_read_committed_and_read_uncommitted_consumers(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """Committed, aborted and committed transactions interleaved with plain records: each
    client in read_committed mode sees the plain and committed records only, in offset
    order; read_uncommitted sees every data record."""
    bootstrap = txn_broker.bootstrap
    topic = f"txn-mixed-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic)
    plain = clients.producer(bootstrap)
    producer = transactional(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
    expected_committed: list[bytes] = []
    everything: list[bytes] = []
    for round_ in range(4):
        producer.begin_transaction()
        values = [b"r%d-%d" % (round_, i) for i in range(3)]
        produce(producer, topic, 0, values)
        assert producer.flush(WAIT) == 0
        clients.produce_all(plain, topic, [{"value": b"plain-%d" % round_, "partition": 0}])
        everything += [*values, b"plain-%d" % round_]
        if round_ % 2:
            producer.abort_transaction(WAIT)
            expected_committed.append(b"plain-%d" % round_)
        else:
            producer.commit_transaction(WAIT)
            expected_committed += [*values, b"plain-%d" % round_]
    end = 4 * 5  # 4 rounds of 3 records, a plain one and a marker

    uncommitted = kafka_python_values(bootstrap, topic, "read_uncommitted", end)
    committed = kafka_python_values(bootstrap, topic, "read_committed", end)
    # The plain record of a round lands after its transaction's records but before its
    # marker: stored order is values, plain, marker.
    assert [v for _, v in uncommitted] == everything
    assert [v for _, v in committed] == expected_committed
    assert [o for o, _ in committed] == sorted(o for o, _ in committed)
    confluent = read_committed(clients, bootstrap, topic, 1, end)
    assert confluent[0] == committed


def test_a_zombie_producer_is_fenced(txn_broker: BrokerProcess, clients: Clients) -> None:
    bootstrap = txn_broker.bootstrap
    topic = f"txn-zombie-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic)
    transactional_id = f"tx-{uuid.uuid4().hex[:6]}"
    zombie = transactional(bootstrap, transactional_id)
    zombie.begin_transaction()
    produce(zombie, topic, 0, [b"zombie-%d" % i for i in range(3)])
    assert zombie.flush(WAIT) == 0

    # Its successor takes the id: the zombie's open transaction is aborted, its epoch fenced.
    successor = transactional(bootstrap, transactional_id)
    successor.begin_transaction()
    produce(successor, topic, 0, [b"successor"])
    successor.commit_transaction(WAIT)

    with pytest.raises(KafkaException) as caught:
        produce(zombie, topic, 0, [b"late"])
        zombie.commit_transaction(WAIT)
    assert caught.value.args[0].fatal() or caught.value.args[0].code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ), caught.value
    stored = raw_log(bootstrap, topic, 0)
    assert [(o, c, m, v) for o, c, m, v in stored if not c] == [
        (0, False, None, b"zombie-0"),
        (1, False, None, b"zombie-1"),
        (2, False, None, b"zombie-2"),
        (4, False, None, b"successor"),
    ]
    assert [(o, m) for o, c, m, _ in stored if c] == [(3, ABORT), (5, COMMIT)]
    assert read_committed(clients, bootstrap, topic, 1, 6)[0] == [(4, b"successor")]


def test_a_transaction_open_past_its_timeout_is_aborted(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    bootstrap = txn_broker.bootstrap
    topic = f"txn-expired-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic)
    producer = transactional(
        bootstrap, f"tx-{uuid.uuid4().hex[:6]}", **{"transaction.timeout.ms": 1500}
    )
    producer.begin_transaction()
    produce(producer, topic, 0, [b"expired-%d" % i for i in range(2)])
    assert producer.flush(WAIT) == 0
    deadline = time.monotonic() + WAIT
    while not any(c for _, c, _, _ in raw_log(bootstrap, topic, 0)):
        assert time.monotonic() < deadline, "the coordinator did not abort the transaction"
        time.sleep(0.2)
    assert [(o, c, m) for o, c, m, _ in raw_log(bootstrap, topic, 0)] == [
        (0, False, None),
        (1, False, None),
        (2, True, ABORT),
    ]
    assert read_committed(clients, bootstrap, topic, 1, 3)[0] == []
    with pytest.raises(KafkaException):
        producer.commit_transaction(WAIT)


def test_init_producer_id_checks_the_transaction_timeout(txn_broker: BrokerProcess) -> None:
    def init(timeout_ms: int, producer_id: int = -1, epoch: int = -1) -> Any:
        request = InitProducerIdRequest(
            version=4,
            transactional_id="raw-tx",
            transaction_timeout_ms=timeout_ms,
            producer_id=producer_id,
            producer_epoch=epoch,
        )
        deadline = time.monotonic() + WAIT
        while True:  # the coordinator may still be loading or electing
            response = raw_request(txn_broker.bootstrap, request)
            if response.error_code not in (
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                ErrorCode.NOT_COORDINATOR,
            ):
                return response
            assert time.monotonic() < deadline, response
            time.sleep(0.2)

    assert init(900_001).error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert init(0).error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    first = init(60_000)
    assert first.error_code == ErrorCode.NONE and first.producer_epoch == 0
    second = init(60_000, first.producer_id, 0)
    assert (second.error_code, second.producer_id, second.producer_epoch) == (
        ErrorCode.NONE,
        first.producer_id,
        1,
    )
    # A retry of that bump (its answer lost) gets the same epoch again (KIP-360) ...
    assert init(60_000, first.producer_id, 0).producer_epoch == 1
    assert init(60_000, first.producer_id, 1).producer_epoch == 2
    # ... but an older epoch than that is a zombie's.
    assert init(60_000, first.producer_id, 0).error_code == ErrorCode.PRODUCER_FENCED


def test_markers_reach_partitions_led_by_other_brokers(tmp_path: Path, clients: Clients) -> None:
    """Three brokers: the coordinator writes markers into the partitions it leads and sends
    WriteTxnMarkers to the leaders of the others; every partition ends each transaction
    with its marker and read_committed sees only the committed records."""
    settings = {**SETTINGS, "transaction_state_log_replication_factor": 3}
    with Cluster(tmp_path, brokers=3, broker_settings=settings) as cluster:
        bootstrap = cluster.bootstrap
        topic = f"txn-spread-{uuid.uuid4().hex[:6]}"
        admin = clients.admin(bootstrap)
        admin.create_topics([NewTopic(topic, num_partitions=6, replication_factor=2)])[
            topic
        ].result(timeout=WAIT)
        leaders = {
            p.id: p.leader for p in admin.list_topics(topic).topics[topic].partitions.values()
        }
        assert len(set(leaders.values())) == 3, leaders
        producer = transactional(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
        producer.begin_transaction()
        for p in range(6):
            produce(producer, topic, p, [b"keep-%d" % p])
        producer.commit_transaction(WAIT)
        producer.begin_transaction()
        for p in range(6):
            produce(producer, topic, p, [b"drop-%d" % p])
        assert producer.flush(WAIT) == 0
        producer.abort_transaction(WAIT)

        got = read_committed(clients, bootstrap, topic, 6, 4)
        assert got == {p: [(0, b"keep-%d" % p)] for p in range(6)}
        for p in range(6):
            address = cluster.brokers[leaders[p]].bootstrap
            assert [(o, c, m) for o, c, m, _ in raw_log(address, topic, p)] == [
                (0, False, None),
                (1, True, COMMIT),
                (2, False, None),
                (3, True, ABORT),
            ], f"partition {p} led by broker {leaders[p]}"


def coordinator_of(bootstrap: str, transactional_id: str) -> int:
    """The node id FindCoordinator (key type 1) names for the id, once one is named."""
    request = FindCoordinatorRequest(version=4, key_type=1, coordinator_keys=[transactional_id])
    deadline = time.monotonic() + WAIT
    while True:
        (found,) = ask(bootstrap, request).coordinators
        if found.error_code == ErrorCode.NONE:
            return int(found.node_id)
        assert time.monotonic() < deadline, found
        time.sleep(0.2)


def three_brokers(tmp_path: Path) -> Cluster:
    """Three brokers with __transaction_state on all three, so a coordinator can fail over."""
    settings = {**SETTINGS, "transaction_state_log_replication_factor": 3}
    return Cluster(tmp_path, brokers=3, broker_settings=settings)


def replicated_topic(cluster: Cluster, clients: Clients, prefix: str) -> str:
    """A new topic of one partition on all three brokers."""
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin = clients.admin(cluster.bootstrap)
    admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=3)], operation_timeout=20
    )[topic].result(timeout=WAIT)
    return topic


def test_the_coordinator_fails_over_with_the_ids_state(tmp_path: Path, clients: Clients) -> None:
    """The coordinator broker is killed between two transactions: a replica of its
    __transaction_state partition takes over with the id's producer id and epoch, so the
    same producer commits again, and a new producer of the id still fences it."""
    with three_brokers(tmp_path) as cluster:
        topic = replicated_topic(cluster, clients, "txn-failover")
        transactional_id = f"tx-{uuid.uuid4().hex[:6]}"
        producer = transactional(cluster.bootstrap, transactional_id)
        producer.begin_transaction()
        produce(producer, topic, 0, [b"before"])
        producer.commit_transaction(WAIT)

        victim = coordinator_of(cluster.bootstrap, transactional_id)
        cluster.brokers[victim].kill()
        survivors = ",".join(b.bootstrap for n, b in cluster.brokers.items() if n != victim)
        deadline = time.monotonic() + WAIT
        while coordinator_of(survivors, transactional_id) == victim:
            assert time.monotonic() < deadline, "the coordinator did not move"
            time.sleep(0.5)

        producer.begin_transaction()
        produce(producer, topic, 0, [b"after"])
        producer.commit_transaction(WAIT)

        successor = transactional(survivors, transactional_id)
        with pytest.raises(KafkaException):
            producer.begin_transaction()
            produce(producer, topic, 0, [b"zombie"])
            producer.commit_transaction(WAIT)
        successor.begin_transaction()
        produce(successor, topic, 0, [b"successor"])
        successor.commit_transaction(WAIT)

        got = read_committed(clients, survivors, topic, 1, 6)
        assert [v for _, v in got[0]] == [b"before", b"after", b"successor"]


def test_offsets_sent_in_a_transaction_count_only_when_it_commits(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """Consume-transform-produce: the consumer's offsets go in the producer's transaction
    (AddOffsetsToTxn, TxnOffsetCommit) and become the group's committed offsets with the
    commit; an aborted transaction's offsets never do."""
    bootstrap = txn_broker.bootstrap
    source, sink = f"txn-in-{uuid.uuid4().hex[:6]}", f"txn-out-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, source)
    clients.create_topic(bootstrap, sink)
    group = f"txn-group-{uuid.uuid4().hex[:6]}"
    consumer = clients.consumer(bootstrap, {"group.id": group})
    producer = transactional(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
    tp = CTopicPartition(source, 0)

    def committed() -> int:
        (found,) = consumer.committed([CTopicPartition(source, 0)], timeout=WAIT)
        return int(found.offset)

    producer.begin_transaction()
    produce(producer, sink, 0, [b"out-1"])
    producer.send_offsets_to_transaction(
        [CTopicPartition(source, 0, 5)], consumer.consumer_group_metadata(), WAIT
    )
    producer.commit_transaction(WAIT)
    deadline = time.monotonic() + WAIT
    while committed() != 5:  # the offsets take effect once the marker is written
        assert time.monotonic() < deadline, f"committed {committed()}"
        time.sleep(0.1)

    producer.begin_transaction()
    produce(producer, sink, 0, [b"out-2"])
    producer.send_offsets_to_transaction(
        [CTopicPartition(tp.topic, 0, 9)], consumer.consumer_group_metadata(), WAIT
    )
    assert producer.flush(WAIT) == 0
    producer.abort_transaction(WAIT)
    producer.begin_transaction()  # a later transaction completes only after the abort did
    producer.commit_transaction(WAIT)
    assert committed() == 5
    assert [v for _, v in read_committed(clients, bootstrap, sink, 1, 4)[0]] == [b"out-1"]


def test_the_last_stable_offset_stops_read_committed_at_an_open_transaction(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """An open transaction holds the LSO at its first offset: read_committed consumers
    stop there (ListOffsets LATEST says so too) until it commits; read_uncommitted ones
    read on to the high watermark."""
    bootstrap = txn_broker.bootstrap
    topic = f"txn-lso-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic)
    clients.produce_all(clients.producer(bootstrap), topic, [{"value": b"p0", "partition": 0}])
    producer = transactional(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
    producer.begin_transaction()
    produce(producer, topic, 0, [b"t1", b"t2"])
    assert producer.flush(WAIT) == 0
    clients.produce_all(clients.producer(bootstrap), topic, [{"value": b"p3", "partition": 0}])

    def end_offset(isolation: str) -> int:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
        try:
            return int(consumer.end_offsets([KTopicPartition(topic, 0)])[KTopicPartition(topic, 0)])
        finally:
            consumer.close()

    assert end_offset("read_uncommitted") == 4
    assert end_offset("read_committed") == 1
    assert kafka_python_values(bootstrap, topic, "read_uncommitted", 4) == [
        (0, b"p0"),
        (1, b"t1"),
        (2, b"t2"),
        (3, b"p3"),
    ]
    producer.commit_transaction(WAIT)
    deadline = time.monotonic() + WAIT
    while end_offset("read_committed") != 5:  # the marker follows the commit's answer
        assert time.monotonic() < deadline, end_offset("read_committed")
        time.sleep(0.1)
    assert kafka_python_values(bootstrap, topic, "read_committed", 5) == [
        (0, b"p0"),
        (1, b"t1"),
        (2, b"t2"),
        (3, b"p3"),
    ]


def ask(bootstrap: str, request: Any) -> Any:
    """One request to the first broker of `bootstrap`: its decoded answer."""
    return raw_request(bootstrap.split(",")[0], request)


def init_producer_id(coordinator: str, transactional_id: str) -> tuple[int, int]:
    """A raw InitProducerId v4 for the id at its coordinator's address, retried until it
    is answered without error: the producer id and epoch."""
    request = InitProducerIdRequest(
        version=4,
        transactional_id=transactional_id,
        transaction_timeout_ms=60_000,
        producer_id=-1,
        producer_epoch=-1,
    )
    deadline = time.monotonic() + WAIT
    while (init := ask(coordinator, request)).error_code != ErrorCode.NONE:
        assert time.monotonic() < deadline, init
        time.sleep(0.2)
    return init.producer_id, init.producer_epoch


def test_bad_transaction_requests_get_kafkas_codes(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    bootstrap = txn_broker.bootstrap
    topic = f"txn-bad-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic)
    transactional_id = f"tx-{uuid.uuid4().hex[:6]}"
    coordinator_of(bootstrap, transactional_id)  # creates __transaction_state if need be
    pid, epoch = init_producer_id(bootstrap, transactional_id)

    def add(version: int, partitions: dict[str, list[int]], producer_epoch: int = epoch) -> Any:
        request = AddPartitionsToTxnRequest(
            version=version,
            v3_and_below_transactional_id=transactional_id,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=producer_epoch,
            v3_and_below_topics=[
                AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=p)
                for t, p in partitions.items()
            ],
        )
        answer = ask(bootstrap, request)
        return {
            (t.name, p.partition_index): p.partition_error_code
            for t in answer.results_by_topic_v3_and_below
            for p in t.results_by_partition
        }

    def end(version: int, producer_id: int, producer_epoch: int, commit: bool) -> int:
        request = EndTxnRequest(
            version=version,
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            committed=commit,
        )
        return int(ask(bootstrap, request).error_code)

    # No transaction open yet.
    assert end(3, pid, epoch, True) == ErrorCode.INVALID_TXN_STATE
    # A partition that does not exist fails the request; nothing joins the transaction.
    assert add(3, {topic: [0], "no-such-topic": [0]}) == {
        (topic, 0): ErrorCode.OPERATION_NOT_ATTEMPTED,
        ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert add(3, {"__transaction_state": [0]}) == {
        ("__transaction_state", 0): ErrorCode.INVALID_TOPIC_EXCEPTION
    }
    assert end(3, pid, epoch, False) == ErrorCode.INVALID_TXN_STATE
    # A fenced epoch: PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH before v2.
    assert add(3, {topic: [0]}, epoch - 1) == {(topic, 0): ErrorCode.PRODUCER_FENCED}
    assert add(1, {topic: [0]}, epoch - 1) == {(topic, 0): ErrorCode.INVALID_PRODUCER_EPOCH}
    assert add(3, {topic: [0]}) == {(topic, 0): ErrorCode.NONE}
    assert end(3, pid + 1, epoch, True) == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert end(1, pid, epoch - 1, True) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert end(3, pid, epoch, True) == ErrorCode.NONE
    # The same EndTxn again: CONCURRENT_TRANSACTIONS while the marker goes out, then NONE.
    deadline = time.monotonic() + WAIT
    while (code := end(3, pid, epoch, True)) != ErrorCode.NONE:
        assert code == ErrorCode.CONCURRENT_TRANSACTIONS, code
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert end(3, pid, epoch, False) == ErrorCode.INVALID_TXN_STATE
    assert [(o, c, m) for o, c, m, _ in raw_log(bootstrap, topic, 0)] == [(0, True, COMMIT)]


def test_describe_and_list_transactions(txn_broker: BrokerProcess, clients: Clients) -> None:
    """KIP-664 against the one coordinator: an open transaction and a completed one."""
    bootstrap = txn_broker.bootstrap
    topic = f"txn-describe-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic, partitions=2)
    open_id, done_id = f"tx-open-{uuid.uuid4().hex[:6]}", f"tx-done-{uuid.uuid4().hex[:6]}"
    done = transactional(bootstrap, done_id)
    done.begin_transaction()
    produce(done, topic, 0, [b"d"])
    done.commit_transaction(WAIT)
    still_open = transactional(bootstrap, open_id, **{"transaction.timeout.ms": 120_000})
    still_open.begin_transaction()
    produce(still_open, topic, 0, [b"o"])
    produce(still_open, topic, 1, [b"o"])
    assert still_open.flush(WAIT) == 0

    described = {
        s.transactional_id: s
        for s in ask(
            bootstrap,
            DescribeTransactionsRequest(
                version=0, transactional_ids=[open_id, done_id, "tx-never-seen"]
            ),
        ).transaction_states
    }
    opened = described[open_id]
    assert (opened.error_code, opened.transaction_state, opened.transaction_timeout_ms) == (
        ErrorCode.NONE,
        "Ongoing",
        120_000,
    )
    assert [(t.topic, sorted(t.partitions)) for t in opened.topics] == [(topic, [0, 1])]
    assert opened.transaction_start_time_ms > 0 and opened.producer_epoch == 0
    deadline = time.monotonic() + WAIT
    while described[done_id].transaction_state != "CompleteCommit":  # markers are async
        assert time.monotonic() < deadline, described[done_id]
        time.sleep(0.1)
        (described[done_id],) = ask(
            bootstrap,
            DescribeTransactionsRequest(version=0, transactional_ids=[done_id]),
        ).transaction_states
    assert described[done_id].topics == []
    assert described["tx-never-seen"].error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND

    def listed(states: list[str], producer_ids: list[int]) -> Any:
        return ask(
            bootstrap,
            ListTransactionsRequest(
                version=0, state_filters=states, producer_id_filters=producer_ids
            ),
        )

    everything = {
        s.transactional_id: s.transaction_state for s in listed([], []).transaction_states
    }
    assert everything[open_id] == "Ongoing" and everything[done_id] == "CompleteCommit"
    ongoing = listed(["Ongoing", "Sleeping"], [])
    assert ongoing.unknown_state_filters == ["Sleeping"]
    assert open_id in {s.transactional_id for s in ongoing.transaction_states}
    assert done_id not in {s.transactional_id for s in ongoing.transaction_states}
    by_producer = listed([], [opened.producer_id]).transaction_states
    assert [(s.transactional_id, s.producer_id) for s in by_producer] == [
        (open_id, opened.producer_id)
    ]
    still_open.abort_transaction(WAIT)


def test_the_transaction_state_topic_is_internal(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """Metadata flags `__transaction_state` internal, as `__consumer_offsets`, so clients
    that leave internal topics out (kafka-python's default) do not list it."""
    bootstrap = txn_broker.bootstrap
    coordinator_of(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")  # creates __transaction_state
    group = f"txn-internal-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, group)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    try:
        consumer.subscribe([group])
        deadline = time.monotonic() + WAIT
        while not consumer.assignment():  # creates __consumer_offsets
            assert time.monotonic() < deadline, "no assignment"
            consumer.poll(timeout_ms=200)
        listed = consumer.topics()
    finally:
        consumer.close()
    request = MetadataRequest(
        version=12,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    flags = {t.name: t.is_internal for t in ask(bootstrap, request).topics}
    assert flags["__transaction_state"] is True and flags["__consumer_offsets"] is True
    assert flags[group] is False
    assert group in listed and "__transaction_state" not in listed
    assert "__consumer_offsets" not in listed
    # Nor may its records be deleted, as Kafka refuses it for every internal topic.
    delete = DeleteRecordsRequest[2](
        topics=[
            DeleteRecordsRequest[2].DeleteRecordsTopic(
                name="__transaction_state",
                partitions=[
                    DeleteRecordsRequest[2].DeleteRecordsTopic.DeleteRecordsPartition(
                        partition_index=0, offset=-1
                    )
                ],
            )
        ],
        timeout_ms=5000,
    )
    (answer,) = ask(bootstrap, delete).topics[0].partitions
    assert answer.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION


def test_a_new_partition_leader_keeps_the_open_transaction_unstable(
    tmp_path: Path, clients: Clients
) -> None:
    """The leader of a partition with an open transaction is killed: the follower that
    takes over learned the transaction from the replicated batches, so its LSO stays at the
    transaction's first offset until the commit's marker reaches it."""
    with three_brokers(tmp_path) as cluster:
        topic = replicated_topic(cluster, clients, "txn-leader")
        admin = clients.admin(cluster.bootstrap)
        leader = admin.list_topics(topic).topics[topic].partitions[0].leader
        # An id coordinated elsewhere: only the data partition's leader is killed.
        transactional_id = next(
            candidate
            for candidate in (f"tx-{uuid.uuid4().hex[:6]}" for _ in range(100))
            if coordinator_of(cluster.bootstrap, candidate) != leader
        )
        producer = transactional(cluster.bootstrap, transactional_id)
        producer.begin_transaction()
        produce(producer, topic, 0, [b"t0", b"t1"])
        assert producer.flush(WAIT) == 0
        plain = clients.producer(cluster.bootstrap, {"acks": "all"})
        clients.produce_all(plain, topic, [{"value": b"plain", "partition": 0}])

        cluster.brokers[leader].kill()
        survivors = ",".join(b.bootstrap for n, b in cluster.brokers.items() if n != leader)

        def end_offset(isolation: str) -> int:
            consumer = KafkaConsumer(bootstrap_servers=survivors, isolation_level=isolation)
            try:
                tp = KTopicPartition(topic, 0)
                return int(consumer.end_offsets([tp])[tp])
            finally:
                consumer.close()

        deadline = time.monotonic() + WAIT
        while True:
            try:
                if end_offset("read_uncommitted") == 3:
                    break
            except KafkaPythonError:  # the leadership is moving
                pass
            assert time.monotonic() < deadline, "no new leader with the records"
            time.sleep(0.5)
        assert end_offset("read_committed") == 0
        producer.commit_transaction(WAIT)
        assert [v for _, v in read_committed(clients, survivors, topic, 1, 4)[0]] == [
            b"t0",
            b"t1",
            b"plain",
        ]


def whole_log(bootstrap: str, topic: str) -> list[tuple[int, bool, int | None, Any]]:
    """raw_log of partition 0 over every segment (a fetch answers from one segment)."""
    out: list[tuple[int, bool, int | None, Any]] = []
    offset = 0
    while True:
        data = fetch_partition(bootstrap, topic, offset).records
        batches = list(iter_batches(data))
        if not batches:
            return out
        for position, header in batches:
            for record in decode_records(data, position, header):
                if record.offset >= offset:
                    marker = control_type(record.key) if header.is_control else None
                    out.append((record.offset, header.is_control, marker, record.value))
        offset = batches[-1][1].next_offset  # (compaction may have emptied a batch)


def test_compaction_keeps_each_keys_latest_committed_value(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """A compacted topic gets committed, aborted and timed-out transactions over small
    segments; the cleaner removes the aborted records and the overwritten committed ones,
    and a read_committed consumer then sees each key's latest committed value only, never
    an aborted write that came after it."""
    bootstrap = txn_broker.bootstrap
    topic = f"txn-compact-{uuid.uuid4().hex[:6]}"
    config = {
        "cleanup.policy": "compact",
        "segment.bytes": "700",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "0",  # markers may go as soon as their data has
    }
    clients.create_topic(bootstrap, topic, config=config)

    def send(producer: Producer, tag: str, keys: range) -> None:
        for key in keys:
            producer.produce(topic, key=b"k%d" % key, value=b"%s:k%d" % (tag.encode(), key))
        assert producer.flush(WAIT) == 0

    producer = transactional(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
    for tag, keys, commit in (
        ("first", range(10), True),
        ("aborted", range(10), False),
        ("second", range(5), True),
    ):
        producer.begin_transaction()
        send(producer, tag, keys)
        if commit:
            producer.commit_transaction(WAIT)
        else:
            producer.abort_transaction(WAIT)
    abandoned = transactional(
        bootstrap, f"tx-{uuid.uuid4().hex[:6]}", **{"transaction.timeout.ms": 1500}
    )
    abandoned.begin_transaction()
    send(abandoned, "timed-out", range(5, 10))
    (written,) = [o for o, _, _, v in whole_log(bootstrap, topic) if v == b"timed-out:k9"]
    deadline = time.monotonic() + WAIT  # (the cleaner may remove the earlier abort's marker)
    while not [o for o, c, m, _ in whole_log(bootstrap, topic) if c and m == ABORT and o > written]:
        assert time.monotonic() < deadline, "the coordinator did not abort the transaction"
        time.sleep(0.2)
    producer.begin_transaction()
    send(producer, "third", range(10, 12))
    producer.commit_transaction(WAIT)
    plain = clients.producer(bootstrap)
    for round_ in range(4):  # roll a few segments past the transactions: the head stays
        clients.produce_all(
            plain,
            topic,
            [{"key": b"f%d" % i, "value": b"fill%d:f%d" % (round_, i)} for i in range(8)],
        )
    expected = {b"k%d" % k: b"second:k%d" % k for k in range(5)}
    expected |= {b"k%d" % k: b"first:k%d" % k for k in range(5, 10)}
    expected |= {b"k%d" % k: b"third:k%d" % k for k in range(10, 12)}

    def gone(value: bytes) -> bool:
        """Aborted, or overwritten by a later committed value of its key."""
        key = value.split(b":")[1]
        return not key.startswith(b"f") and expected[key] != value

    deadline = time.monotonic() + WAIT
    while True:
        stored = [(o, v) for o, c, _, v in whole_log(bootstrap, topic) if not c]
        if not any(gone(v) for _, v in stored):
            break
        assert time.monotonic() < deadline, f"never compacted: {stored}"
        time.sleep(0.5)
    end = whole_log(bootstrap, topic)[-1][0] + 1
    got = [v for _, v in read_committed(clients, bootstrap, topic, 1, end)[0]]
    latest: dict[bytes, bytes] = {}
    for value in got:
        latest[value.split(b":")[1]] = value
    assert {k: v for k, v in latest.items() if not k.startswith(b"f")} == expected
    assert not [v for v in got if gone(v)]
    assert {v for v in got if v.startswith(b"fill")} >= {b"fill3:f%d" % i for i in range(8)}


def test_old_consumers_read_only_committed_records(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """Fetch v0-3 carries no isolation level and old clients cannot tell aborted records
    apart: they read as read_committed consumers, up to the last stable offset, the aborted
    transactions' records left out of the converted answer, markers never in it."""
    bootstrap = txn_broker.bootstrap
    topic = f"txn-old-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic)
    producer = transactional(bootstrap, f"tx-{uuid.uuid4().hex[:6]}")
    for values, commit in (([b"c1", b"c2"], True), ([b"a1", b"a2"], False), ([b"c3"], True)):
        producer.begin_transaction()
        produce(producer, topic, 0, values)
        assert producer.flush(WAIT) == 0
        if commit:
            producer.commit_transaction(WAIT)
        else:
            producer.abort_transaction(WAIT)
    producer.begin_transaction()
    produce(producer, topic, 0, [b"open"])
    assert producer.flush(WAIT) == 0
    # c1 c2 COMMIT a1 a2 ABORT c3 COMMIT open: the last stable offset is 8 once the marker
    # of c3 is in (commit_transaction may return before).
    deadline = time.monotonic() + WAIT
    while [o for o, _, _, _ in raw_log(bootstrap, topic, 0)][-2:] != [7, 8]:
        assert time.monotonic() < deadline
        time.sleep(0.1)

    def values(version: int, offset: int) -> list[tuple[int, bytes | None]]:
        (answer,) = old_fetch(bootstrap, version, [(topic, offset)]).values()
        assert answer.error_code == ErrorCode.NONE
        magic = 0 if version < 2 else 1
        return [(r[0], r[2]) for r in legacy_records(answer.records, magic) if r[0] >= offset]

    for version in range(4):
        assert values(version, 0) == [(0, b"c1"), (1, b"c2"), (6, b"c3")], version
        assert values(version, 3) == [(6, b"c3")], version
        assert values(version, 7) == [], version  # the open transaction waits
    producer.commit_transaction(WAIT)
    deadline = time.monotonic() + WAIT
    while values(3, 7) != [(8, b"open")]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
