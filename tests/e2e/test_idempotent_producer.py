"""Idempotent producers against real brokers: confluent-kafka with enable.idempotence while
the partition leader is killed (no duplicates, no gaps, send order kept), and raw Produce
requests that retry, skip or go back in sequence, across broker restarts."""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.records.batch import Record, build_batch
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster
from tests.e2e.records import produce_raw
from tests.e2e.replicated import (
    PARTITIONS,
    Load,
    check_replicas_identical,
    create_topic,
    leader_of,
    read_back,
)
from tests.e2e.test_replication import wait_for_new_leader

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, brokers=3) as running:
        create_topic(running)
        yield running


@pytest.mark.timeout(240)
def test_leader_killed_under_idempotent_load_leaves_no_duplicates_and_no_gaps(
    cluster: Cluster,
) -> None:
    with Load(cluster.bootstrap, idempotent=True) as load:
        load.wait_acked(500)
        victim = leader_of(cluster, 0)
        cluster.brokers[victim].kill()
        wait_for_new_leader(cluster, victim)
        load.wait_acked(500)
        cluster.brokers[victim].start()
        load.wait_acked(500)
    assert load.failed == 0, f"{load.failed} sends failed: {load.failures[:3]}"
    stored = read_back(cluster)
    for partition in range(PARTITIONS):
        values = [int(v) for _, v in stored[partition]]
        acked = sorted(int(v) for _, v in load.acked[partition])
        # Every send to the partition once, in send order, from the first to the last acked.
        assert values == list(range(partition, acked[-1] + 1, PARTITIONS)), (
            f"partition {partition}: {len(values)} stored, {len(set(values))} distinct"
        )
        assert values == acked
    check_replicas_identical(cluster, stored)


# Raw produce requests --------------------------------------------------------------------

TOPIC = "idempotent"


class RawProducer:
    """Produce requests built by hand, so a test chooses producer ids, epochs and sequences."""

    def __init__(self, bootstrap: str) -> None:
        self.host, port = bootstrap.rsplit(":", 1)
        self.port = int(port)

    def call(self, request: Any, response_class: Any) -> Any:
        async def exchange() -> Any:
            connection = await KafkaConnection.connect(self.host, self.port, timeout=10)
            try:
                return await connection.request(request, response_class, "idempotence-test")
            finally:
                await connection.close()

        return asyncio.run(exchange())

    def init_producer_id(self) -> tuple[int, int]:
        request = InitProducerIdRequest(
            version=4,
            transactional_id=None,
            transaction_timeout_ms=60000,
            producer_id=-1,
            producer_epoch=-1,
        )
        response = self.call(request, InitProducerIdResponse)
        assert response.error_code == 0
        return int(response.producer_id), int(response.producer_epoch)

    def produce(
        self, producer_id: int, epoch: int, sequence: int, values: list[bytes]
    ) -> tuple[ErrorCode, int]:
        """(error code, base offset) of one batch carrying `values` from `sequence` on."""
        now = int(time.time() * 1000)
        batch = build_batch(
            [Record(i, now, None, v) for i, v in enumerate(values)],
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=sequence,
        )
        return produce_raw(f"{self.host}:{self.port}", TOPIC, batch)


def stored_values(broker: BrokerProcess) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "check", "enable.partition.eof": True}
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == -191:  # end of partition
                    return values
                continue
            values.append(message.value())
        raise AssertionError(f"no end of partition after {values!r}")
    finally:
        consumer.close()


@pytest.mark.timeout(180)
def test_retries_gaps_and_old_epochs_get_kafkas_answers_across_restarts(tmp_path: Path) -> None:
    with Cluster(tmp_path) as single:  # not the checked `broker` fixture: it is killed here
        check_sequences_across_restarts(single.brokers[0])


def check_sequences_across_restarts(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])[TOPIC].result(
        timeout=30
    )
    raw = RawProducer(broker.bootstrap)
    pid, epoch = raw.init_producer_id()
    other, _ = raw.init_producer_id()
    assert epoch == 0 and other != pid

    assert raw.produce(pid, 0, 0, [b"v0", b"v1"]) == (ErrorCode.NONE, 0)
    assert raw.produce(pid, 0, 2, [b"v2"]) == (ErrorCode.NONE, 2)
    # A retry of the first batch: the original offset, nothing written.
    assert raw.produce(pid, 0, 0, [b"v0", b"v1"]) == (ErrorCode.NONE, 0)
    # A gap in the sequence.
    code, _ = raw.produce(pid, 0, 5, [b"v5"])
    assert code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    # A newer epoch restarts at sequence 0; the older epoch is fenced from then on.
    assert raw.produce(pid, 1, 0, [b"w0"]) == (ErrorCode.NONE, 3)
    code, _ = raw.produce(pid, 0, 3, [b"v3"])
    assert code is ErrorCode.INVALID_PRODUCER_EPOCH
    code, _ = raw.produce(pid, 2, 7, [b"x7"])
    assert code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # a new epoch must start at 0

    broker.stop()  # clean: the state comes from the snapshot written at close
    broker.start()
    assert raw.produce(pid, 1, 0, [b"w0"]) == (ErrorCode.NONE, 3)
    assert raw.produce(pid, 1, 1, [b"w1"]) == (ErrorCode.NONE, 4)

    broker.kill()  # unclean: rebuilt from the last snapshot and the batches after it
    broker.start()
    assert raw.produce(pid, 1, 1, [b"w1"]) == (ErrorCode.NONE, 4)
    code, _ = raw.produce(pid, 0, 3, [b"v3"])
    assert code is ErrorCode.INVALID_PRODUCER_EPOCH
    assert raw.produce(pid, 1, 2, [b"w2"]) == (ErrorCode.NONE, 5)

    assert stored_values(broker) == [b"v0", b"v1", b"v2", b"w0", b"w1", b"w2"]
