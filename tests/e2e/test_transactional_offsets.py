"""Offsets committed in a transaction (TxnOffsetCommit) against a real broker, as the
consumers that read them see them: while the transaction is open, a stable OffsetFetch
(KIP-447's RequireStable, OffsetFetch v7+) answers UNSTABLE_OFFSET_COMMIT (88) for the
partition, at partition level (in each group for v8+), and a plain one the offset as it was;
a read_committed confluent-kafka consumer, which asks for stable offsets, waits until the
transaction commits and then starts at the offset it committed."""

from __future__ import annotations

import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition

from directlog.protocol.errors import ErrorCode
from tests.e2e.broker import BrokerProcess
from tests.e2e.conftest import RDKAFKA_LOG, Clients, single_broker
from tests.e2e.records import raw_request

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer import OffsetFetchRequest

pytestmark = pytest.mark.timeout(240)

SETTINGS: dict[str, object] = {
    "transaction_state_log_replication_factor": 1,
    "transaction_state_log_num_partitions": 3,
}
WAIT = 60.0  # bound of every wait on the broker or a client
UNSTABLE = ErrorCode.UNSTABLE_OFFSET_COMMIT


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with single_broker(tmp_path_factory.mktemp("txn-offsets-cluster"), SETTINGS) as process:
        yield process


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def open_transaction(bootstrap: str, consumer: Consumer, topic: str, offset: int) -> Producer:
    """A transactional producer whose open transaction commits `offset` of partition 0 of
    `topic` for the consumer's group; the caller ends it."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": unique("tx"), "logger": RDKAFKA_LOG}
    )
    producer.init_transactions(WAIT)
    producer.begin_transaction()
    producer.send_offsets_to_transaction(
        [CTopicPartition(topic, 0, offset)], consumer.consumer_group_metadata(), WAIT
    )
    return producer


def fetch_v7(bootstrap: str, group: str, topic: str, *, stable: bool, version: int = 7) -> Any:
    topics = [OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])]
    request: dict[str, Any] = {"group_id": group, "topics": topics}
    if version >= 7:
        request["require_stable"] = stable
    return raw_request(bootstrap, OffsetFetchRequest(version=version, **request))


def answer_v7(response: Any) -> tuple[int, list[tuple[int, int, int]]]:
    """The group code, and each partition's (index, committed offset, code)."""
    partitions = [
        (p.partition_index, p.committed_offset, p.error_code)
        for t in response.topics
        for p in t.partitions
    ]
    return response.error_code, partitions


def fetch_v8(bootstrap: str, groups: list[tuple[str, str | None]]) -> dict[str, Any]:
    """A stable OffsetFetch v8 of partition 0 of each (group, topic); None: every partition.
    Each group's answer: its code and (topic, index, committed offset, code) per partition."""
    group_type = OffsetFetchRequest.OffsetFetchRequestGroup
    request = OffsetFetchRequest(
        version=8,
        groups=[
            group_type(
                group_id=group,
                topics=None
                if topic is None
                else [group_type.OffsetFetchRequestTopics(name=topic, partition_indexes=[0])],
            )
            for group, topic in groups
        ],
        require_stable=True,
    )
    response = raw_request(bootstrap, request)
    return {
        g.group_id: (
            g.error_code,
            [
                (t.name, p.partition_index, p.committed_offset, p.error_code)
                for t in g.topics
                for p in t.partitions
            ],
        )
        for g in response.groups
    }


def until_stable(bootstrap: str, group: str, topic: str) -> tuple[int, list[tuple[int, int, int]]]:
    """A stable v7 answer once the partition has no pending commit (the COMMIT marker
    reaches __consumer_offsets just after EndTxn is answered)."""
    deadline = time.monotonic() + WAIT
    while True:
        answer = answer_v7(fetch_v7(bootstrap, group, topic, stable=True))
        if answer[1][0][2] != UNSTABLE:
            return answer
        assert time.monotonic() < deadline, "still unstable"
        time.sleep(0.1)


def test_a_stable_offset_fetch_answers_unstable_until_the_transaction_commits(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    bootstrap = txn_broker.bootstrap
    topic = unique("src")
    clients.create_topic(bootstrap, topic)
    pending_group, plain_group = unique("pending"), unique("plain")
    pending = clients.consumer(bootstrap, {"group.id": pending_group})
    plain = clients.consumer(bootstrap, {"group.id": plain_group})
    plain.commit(offsets=[CTopicPartition(topic, 0, 3)], asynchronous=False)
    unstable_before = txn_broker.total(
        "directlog_broker_request_errors_total", api="offset_fetch", code=UNSTABLE.name
    )

    producer = open_transaction(bootstrap, pending, topic, 5)
    assert answer_v7(fetch_v7(bootstrap, pending_group, topic, stable=True)) == (
        ErrorCode.NONE,
        [(0, -1, UNSTABLE)],
    )
    # Without RequireStable (false, or before v7): the offset as it is, nothing committed.
    for version, stable in ((7, False), (6, False), (2, False)):
        answer = fetch_v7(bootstrap, pending_group, topic, stable=stable, version=version)
        assert answer_v7(answer) == (ErrorCode.NONE, [(0, -1, ErrorCode.NONE)]), version
    # v8: the code sits with each partition of each group; the groups' own codes are NONE.
    assert fetch_v8(bootstrap, [(pending_group, topic), (plain_group, topic)]) == {
        pending_group: (ErrorCode.NONE, [(topic, 0, -1, UNSTABLE)]),
        plain_group: (ErrorCode.NONE, [(topic, 0, 3, ErrorCode.NONE)]),
    }
    # Every partition (topics null): only committed partitions are listed, as in Kafka.
    assert fetch_v8(bootstrap, [(pending_group, None)]) == {pending_group: (ErrorCode.NONE, [])}
    after = txn_broker.total(
        "directlog_broker_request_errors_total", api="offset_fetch", code=UNSTABLE.name
    )
    assert after - unstable_before == 2  # the v7 and the v8 stable answers above

    producer.commit_transaction(WAIT)
    assert until_stable(bootstrap, pending_group, topic) == (
        ErrorCode.NONE,
        [(0, 5, ErrorCode.NONE)],
    )
    # A plain commit written after a pending transactional one wins when it commits.
    second = open_transaction(bootstrap, pending, topic, 8)
    pending.commit(offsets=[CTopicPartition(topic, 0, 6)], asynchronous=False)
    assert answer_v7(fetch_v7(bootstrap, pending_group, topic, stable=False)) == (
        ErrorCode.NONE,
        [(0, 6, ErrorCode.NONE)],
    )
    second.commit_transaction(WAIT)
    assert until_stable(bootstrap, pending_group, topic) == (
        ErrorCode.NONE,
        [(0, 6, ErrorCode.NONE)],
    )


def test_a_read_committed_consumer_waits_for_the_transactional_commit(
    txn_broker: BrokerProcess, clients: Clients
) -> None:
    """librdkafka asks for stable offsets when read_committed (its default) and retries
    on UNSTABLE_OFFSET_COMMIT; a read_uncommitted consumer gets the offset as it is."""
    bootstrap = txn_broker.bootstrap
    topic = unique("src")
    clients.create_topic(bootstrap, topic)
    producer = clients.producer(bootstrap)
    clients.produce_all(producer, topic, [{"value": b"%d" % i, "partition": 0} for i in range(10)])
    group = unique("eos")
    committed_reader = clients.consumer(
        bootstrap, {"group.id": group, "isolation.level": "read_committed"}
    )
    uncommitted_reader = clients.consumer(
        bootstrap, {"group.id": group, "isolation.level": "read_uncommitted"}
    )
    transaction = open_transaction(bootstrap, committed_reader, topic, 7)
    (found,) = uncommitted_reader.committed([CTopicPartition(topic, 0)], timeout=WAIT)
    assert found.error is None and found.offset == OFFSET_INVALID

    before = txn_broker.total(
        "directlog_broker_request_errors_total", api="offset_fetch", code=UNSTABLE.name
    )
    answers: list[CTopicPartition] = []
    asking = threading.Thread(
        target=lambda: answers.extend(
            committed_reader.committed([CTopicPartition(topic, 0)], timeout=WAIT)
        )
    )
    asking.start()
    deadline = time.monotonic() + WAIT
    while (
        txn_broker.total(
            "directlog_broker_request_errors_total", api="offset_fetch", code=UNSTABLE.name
        )
        == before
    ):
        assert time.monotonic() < deadline, "the consumer was never told the offset is unstable"
        time.sleep(0.05)
    assert answers == []  # still waiting: nothing was answered while the commit is pending
    transaction.commit_transaction(WAIT)
    asking.join(WAIT)
    assert not asking.is_alive()
    ((topic_found, partition, offset, error),) = [
        (a.topic, a.partition, a.offset, a.error) for a in answers
    ]
    assert (topic_found, partition, offset, error) == (topic, 0, 7, None)

    committed_reader.assign([CTopicPartition(topic, 0)])  # from the committed offset
    first = clients.consume(committed_reader, 3, WAIT)
    assert [(m.offset(), m.value()) for m in first] == [(7, b"7"), (8, b"8"), (9, b"9")]
