"""KIP-890 part 1 against real brokers: a partition's leader takes the first batch of a
producer's transaction only after the coordinator confirms the partition is in it, so a
produce arriving after its transaction ended cannot open one no marker closes; and
AddPartitionsToTxn v4 (what Kafka 3.7's brokers send each other) with and without
verify_only."""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from directlog.protocol.errors import ErrorCode
from directlog.records.batch import Record, build_batch
from directlog.records.markers import ABORT, COMMIT
from tests.e2e.broker import BrokerProcess
from tests.e2e.conftest import Clients, single_broker
from tests.e2e.records import produce_raw
from tests.e2e.test_transactions import (
    SETTINGS,
    WAIT,
    ask,
    coordinator_of,
    init_producer_id,
    raw_log,
    three_brokers,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer import ListOffsetsRequest
    from kafka.protocol.producer import (
        AddPartitionsToTxnRequest,
        EndTxnRequest,
    )

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with single_broker(tmp_path_factory.mktemp("verification"), SETTINGS) as process:
        yield process


class Txn:
    """A transactional id driven by raw requests, as a client would: `bootstrap` is its
    coordinator's address."""

    def __init__(self, bootstrap: str, transactional_id: str) -> None:
        self.bootstrap = bootstrap
        self.id = transactional_id
        self.sequences: dict[tuple[str, int], int] = {}
        self.pid, self.epoch = init_producer_id(bootstrap, transactional_id)

    def add(self, topic: str, partitions: list[int]) -> dict[tuple[str, int], int]:
        request = AddPartitionsToTxnRequest(
            version=3,
            v3_and_below_transactional_id=self.id,
            v3_and_below_producer_id=self.pid,
            v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=[
                AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic, partitions=partitions)
            ],
        )
        answer = ask(self.bootstrap, request)
        return {
            (t.name, p.partition_index): p.partition_error_code
            for t in answer.results_by_topic_v3_and_below
            for p in t.results_by_partition
        }

    def produce(self, address: str, topic: str, partition: int, value: bytes) -> ErrorCode:
        """One transactional batch of one record; its sequence moves on only when taken."""
        sequence = self.sequences.get((topic, partition), 0)
        batch = build_batch(
            [Record(0, int(time.time() * 1000), None, value)],
            producer_id=self.pid,
            producer_epoch=self.epoch,
            base_sequence=sequence,
            transactional=True,
        )
        code, _ = produce_raw(address, topic, batch, partition=partition, transactional_id=self.id)
        if code == ErrorCode.NONE:
            self.sequences[(topic, partition)] = sequence + 1
        return code

    def end(self, commit: bool) -> None:
        """EndTxn, then until its markers are out (CONCURRENT_TRANSACTIONS meanwhile)."""
        request = EndTxnRequest(
            version=3,
            transactional_id=self.id,
            producer_id=self.pid,
            producer_epoch=self.epoch,
            committed=commit,
        )
        deadline = time.monotonic() + WAIT
        assert ask(self.bootstrap, request).error_code == ErrorCode.NONE
        while (code := ask(self.bootstrap, request).error_code) != ErrorCode.NONE:
            assert code == ErrorCode.CONCURRENT_TRANSACTIONS, code
            assert time.monotonic() < deadline
            time.sleep(0.1)


def verify(
    bootstrap: str,
    transactions: list[tuple[str, int, int, dict[str, list[int]]]],
    *,
    verify_only: bool = True,
) -> tuple[int, dict[str, dict[tuple[str, int], int]]]:
    """AddPartitionsToTxn v4: the top-level code and each transaction's partition codes."""
    txn_type: Any = AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction
    topic_type: Any = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
    request = AddPartitionsToTxnRequest(
        version=4,
        transactions=[
            txn_type(
                transactional_id=tid,
                producer_id=pid,
                producer_epoch=epoch,
                verify_only=verify_only,
                topics=[topic_type(name=t, partitions=p) for t, p in topics.items()],
            )
            for tid, pid, epoch, topics in transactions
        ],
    )
    answer = ask(bootstrap, request)
    return answer.error_code, {
        result.transactional_id: {
            (t.name, p.partition_index): p.partition_error_code
            for t in result.topic_results
            for p in t.results_by_partition
        }
        for result in answer.results_by_transaction
    }


def stable_and_end(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    """The partition's last stable offset and high watermark (ListOffsets latest)."""
    offsets = []
    for isolation in (1, 0):
        request = ListOffsetsRequest(
            version=5,
            replica_id=-1,
            isolation_level=isolation,
            topics=[
                ListOffsetsRequest.ListOffsetsTopic(
                    name=topic,
                    partitions=[
                        ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                            partition_index=partition, current_leader_epoch=-1, timestamp=-1
                        )
                    ],
                )
            ],
        )
        (answered,) = ask(bootstrap, request).topics[0].partitions
        assert answered.error_code == ErrorCode.NONE, answered
        offsets.append(int(answered.offset))
    return offsets[0], offsets[1]


def marked(bootstrap: str, topic: str, partition: int) -> list[bytes | int | None]:
    """The partition's record values, a marker's type in its place."""
    return [m if c else v for _, c, m, v in raw_log(bootstrap, topic, partition)]


def test_a_partition_outside_the_transaction_takes_no_transactional_batch(
    broker: BrokerProcess, clients: Clients
) -> None:
    bootstrap = broker.bootstrap
    topic = f"verify-{uuid.uuid4().hex[:6]}"
    clients.create_topic(bootstrap, topic, partitions=2)
    transactional_id = f"tx-{uuid.uuid4().hex[:6]}"
    coordinator_of(bootstrap, transactional_id)  # creates __transaction_state if need be
    txn = Txn(bootstrap, transactional_id)
    assert txn.add(topic, [0]) == {(topic, 0): ErrorCode.NONE}

    # Partition 1 was never added: refused, and nothing written there.
    assert txn.produce(bootstrap, topic, 1, b"stray") == ErrorCode.INVALID_TXN_STATE
    assert raw_log(bootstrap, topic, 1) == []
    assert txn.produce(bootstrap, topic, 0, b"a") == ErrorCode.NONE
    assert txn.produce(bootstrap, topic, 0, b"b") == ErrorCode.NONE  # open here: no question

    # What the coordinator answers a broker for each partition, and for a stale epoch or an
    # unknown producer id; a batch may name several transactions.
    unknown = f"unknown-{uuid.uuid4().hex[:6]}"
    code, results = verify(
        bootstrap,
        [
            (txn.id, txn.pid, txn.epoch, {topic: [0, 1]}),
            (unknown, txn.pid, txn.epoch, {topic: [0]}),
        ],
    )
    assert code == ErrorCode.NONE
    assert results == {
        txn.id: {(topic, 0): ErrorCode.NONE, (topic, 1): ErrorCode.INVALID_TXN_STATE},
        unknown: {(topic, 0): ErrorCode.INVALID_PRODUCER_ID_MAPPING},
    }
    _, stale = verify(bootstrap, [(txn.id, txn.pid, txn.epoch - 1, {topic: [0]})])
    assert stale == {txn.id: {(topic, 0): ErrorCode.PRODUCER_FENCED}}

    # The transaction ends; a late batch of it (a retry held up in the network) would open a
    # transaction no marker closes. It is refused and the partition stays stable.
    txn.end(commit=False)
    assert txn.produce(bootstrap, topic, 0, b"late") == ErrorCode.INVALID_TXN_STATE
    stable, end = stable_and_end(bootstrap, topic, 0)
    assert stable == end == 3  # a, b and the ABORT marker
    assert marked(bootstrap, topic, 0) == [b"a", b"b", ABORT]

    # v4 without verify_only adds, as brokers batch it for clients (KIP-890 part 2).
    code, added = verify(bootstrap, [(txn.id, txn.pid, txn.epoch, {topic: [1]})], verify_only=False)
    assert (code, added) == (ErrorCode.NONE, {txn.id: {(topic, 1): ErrorCode.NONE}})
    assert txn.produce(bootstrap, topic, 1, b"c") == ErrorCode.NONE
    txn.end(commit=True)
    assert marked(bootstrap, topic, 1) == [b"c", COMMIT]


def test_a_coordinator_on_another_broker_verifies(tmp_path: Path, clients: Clients) -> None:
    """The partition's leader asks the coordinator over AddPartitionsToTxn v4."""
    with three_brokers(tmp_path) as cluster:
        bootstrap = cluster.bootstrap
        topic = f"verify-far-{uuid.uuid4().hex[:6]}"
        clients.create_topic(bootstrap, topic, partitions=3)
        transactional_id = f"tx-{uuid.uuid4().hex[:6]}"
        coordinator = coordinator_of(bootstrap, transactional_id)
        described = clients.admin(bootstrap).list_topics(topic).topics[topic].partitions
        leaders = {p.id: p.leader for p in described.values()}
        partition = next(p for p, leader in leaders.items() if leader != coordinator)
        address = cluster.brokers[leaders[partition]].bootstrap
        txn = Txn(cluster.brokers[coordinator].bootstrap, transactional_id)

        assert txn.produce(address, topic, partition, b"stray") == ErrorCode.INVALID_TXN_STATE
        assert txn.add(topic, [partition]) == {(topic, partition): ErrorCode.NONE}
        assert txn.produce(address, topic, partition, b"x") == ErrorCode.NONE
        txn.end(commit=True)
        assert marked(address, topic, partition) == [b"x", COMMIT]
