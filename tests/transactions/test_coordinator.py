"""The transaction coordinator's runtime over a real `__transaction_state` partition log,
without a network: what it writes is what a successor loads, and its refusals carry the
codes clients act on."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from pathlib import Path

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.records.batch import decode_records, iter_batches
from directlog.topic_config import LogConfig
from directlog.topics import TopicPartition
from services.broker.cluster_metadata import PartitionInfo
from services.broker.internal_topic_coordinator import read_partition
from services.broker.partition import Partition
from services.broker.storage import PartitionLog
from services.broker.transactions.coordinator import TransactionCoordinator, TransactionSettings
from services.broker.transactions.metadata import TxnState
from services.broker.transactions.state_topic import (
    TRANSACTION_STATE_TOPIC,
    decode_key,
    decode_value,
)

pytestmark = pytest.mark.timeout(60)
NOW = 1_700_000_000_000


class ProducerIds:
    def __init__(self, first: int = 1000) -> None:
        self._ids = itertools.count(first)

    async def next_id(self) -> int:
        return next(self._ids)


class Markers:
    """Records every marker attempt; partitions in `failing` answer NOT_LEADER_OR_FOLLOWER
    until a test clears it."""

    def __init__(self) -> None:
        self.written: list[tuple[int, int, bool, int, tuple[str, int]]] = []
        self.failing: set[tuple[str, int]] = set()
        self.attempts = 0

    async def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: set[tuple[str, int]],
    ) -> dict[tuple[str, int], ErrorCode]:
        self.attempts += 1
        results = {}
        for tp in sorted(partitions):
            if tp in self.failing:
                results[tp] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                self.written.append((producer_id, producer_epoch, commit, coordinator_epoch, tp))
                results[tp] = ErrorCode.NONE
        return results


def leading(directory: Path, epoch: int = 0) -> Partition:
    """Partition 0 of a one-partition __transaction_state, led here (broker 1)."""
    log = PartitionLog.open(directory, LogConfig(cleanup_policy="compact"))
    partition = Partition(
        TopicPartition(TRANSACTION_STATE_TOPIC, 0),
        uuid.uuid4(),
        log,
        1,
        lambda: None,
        lambda p, i: None,
    )
    partition.become_leader(PartitionInfo(0, (1,), 1, epoch, (1,), 0), 0)
    return partition


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


async def loaded(
    partition: Partition,
    ids: ProducerIds,
    markers: Markers | None = None,
    clock: Clock | None = None,
) -> TransactionCoordinator:
    coordinator = TransactionCoordinator(
        TransactionSettings(60_000), lambda: 1, ids, markers or Markers(), clock or Clock()
    )
    coordinator.leadership_changed(partition)
    for _ in range(200):
        if coordinator.owned[0].loaded:
            return coordinator
        await asyncio.sleep(0.01)
    raise AssertionError("the partition did not load")


async def refused(code: ErrorCode, call: asyncio.Future[object] | object) -> None:
    with pytest.raises(KafkaError) as caught:
        await call  # type: ignore[misc]
    assert caught.value.code is code, caught.value


def stored(partition: Partition) -> list[tuple[str, int, int, TxnState]]:
    data = partition.log.read(0, 1 << 20).records.read()
    return [
        (decode_key(r.key), v.producer_id, v.producer_epoch, v.state)
        for position, header in iter_batches(data)
        for r in decode_records(data, position, header)
        if r.key is not None and r.value is not None
        for v in [decode_value(r.value)]
    ]


def test_epochs_are_bumped_stored_and_loaded_by_a_successor(tmp_path: Path) -> None:
    async def run() -> None:
        partition = leading(tmp_path)
        ids = ProducerIds()
        first = await loaded(partition, ids)
        assert await first.init_producer_id("tx", 30_000, None) == (1000, 0)
        assert await first.init_producer_id("tx", 30_000, None) == (1000, 1)
        assert await first.init_producer_id("other", 30_000, None) == (1001, 0)
        # KIP-360: the producer names its id and epoch; a zombie with an older one is fenced.
        assert await first.init_producer_id("tx", 30_000, (1000, 1)) == (1000, 2)
        await refused(ErrorCode.PRODUCER_FENCED, first.init_producer_id("tx", 30_000, (1000, 0)))
        assert stored(partition) == [
            ("tx", 1000, 0, TxnState.EMPTY),
            ("tx", 1000, 1, TxnState.EMPTY),
            ("other", 1001, 0, TxnState.EMPTY),
            ("tx", 1000, 2, TxnState.EMPTY),
        ]
        await first.close()
        partition.log.close()

        successor = await loaded(leading(tmp_path, epoch=1), ids)
        assert await successor.init_producer_id("tx", 30_000, None) == (1000, 3)
        assert await successor.init_producer_id("other", 30_000, None) == (1001, 1)

    asyncio.run(run())


def test_refusals(tmp_path: Path) -> None:
    async def run() -> None:
        coordinator = await loaded(leading(tmp_path), ProducerIds())
        for timeout in (0, -5, 60_001):
            await refused(
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                coordinator.init_producer_id("tx", timeout, None),
            )
        await refused(ErrorCode.INVALID_REQUEST, coordinator.init_producer_id("", 1000, None))
        # Stops leading: its ids go with it.
        partition = coordinator.owned[0].partition
        partition.become_follower(PartitionInfo(0, (1, 2), 2, 1, (1, 2), 0))
        coordinator.leadership_changed(partition)
        await refused(ErrorCode.NOT_COORDINATOR, coordinator.init_producer_id("tx", 1000, None))
        assert coordinator.transactions == {}

    asyncio.run(run())


async def settled(coordinator: TransactionCoordinator, transactional_id: str) -> TxnState:
    """The id's state once no marker or completion is in flight."""
    for _ in range(500):
        txn = coordinator.transactions[transactional_id]
        if txn.pending is None and txn.current.state not in (
            TxnState.PREPARE_COMMIT,
            TxnState.PREPARE_ABORT,
        ):
            return txn.current.state
        await asyncio.sleep(0.01)
    raise AssertionError(f"{transactional_id} did not complete")


def test_commit_and_abort_write_markers_to_every_partition(tmp_path: Path) -> None:
    async def run() -> None:
        markers = Markers()
        coordinator = await loaded(leading(tmp_path), ProducerIds(), markers)
        pid, epoch = await coordinator.init_producer_id("tx", 30_000, None)
        await coordinator.add_partitions("tx", pid, epoch, {("a", 0), ("b", 3)})
        await coordinator.add_partitions("tx", pid, epoch, {("a", 1)})
        await coordinator.end_txn("tx", pid, epoch, True)
        assert await settled(coordinator, "tx") is TxnState.COMPLETE_COMMIT
        assert markers.written == [
            (pid, epoch, True, 0, ("a", 0)),
            (pid, epoch, True, 0, ("a", 1)),
            (pid, epoch, True, 0, ("b", 3)),
        ]
        await coordinator.end_txn("tx", pid, epoch, True)  # a retry: nothing more written
        assert len(markers.written) == 3

        markers.written.clear()
        await coordinator.add_partitions("tx", pid, epoch, {("c", 0)})
        await coordinator.end_txn("tx", pid, epoch, False)
        assert await settled(coordinator, "tx") is TxnState.COMPLETE_ABORT
        assert markers.written == [(pid, epoch, False, 0, ("c", 0))]
        await refused(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            coordinator.add_partitions("nobody", pid, epoch, {("a", 0)}),
        )

    asyncio.run(run())


def test_a_failed_marker_is_retried_and_a_successor_finishes_a_prepared_commit(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        markers = Markers()
        markers.failing = {("b", 0)}
        partition = leading(tmp_path)
        first = await loaded(partition, ProducerIds(), markers)
        pid, epoch = await first.init_producer_id("tx", 30_000, None)
        await first.add_partitions("tx", pid, epoch, {("a", 0), ("b", 0)})
        await first.end_txn("tx", pid, epoch, True)
        while markers.attempts < 2:
            await asyncio.sleep(0.01)
        assert first.transactions["tx"].current.state is TxnState.PREPARE_COMMIT
        await refused(
            ErrorCode.CONCURRENT_TRANSACTIONS, first.add_partitions("tx", pid, epoch, {("a", 0)})
        )
        await first.close()  # the broker stops before ("b", 0) takes its marker
        partition.log.close()

        markers.failing.clear()
        markers.written.clear()
        successor = await loaded(leading(tmp_path, epoch=1), ProducerIds(), markers)
        assert await settled(successor, "tx") is TxnState.COMPLETE_COMMIT
        assert {m[4] for m in markers.written} == {("a", 0), ("b", 0)}
        assert {m[3] for m in markers.written} == {1}  # under the new coordinator epoch

    asyncio.run(run())


def test_a_new_producer_fences_an_open_transaction_by_aborting_it(tmp_path: Path) -> None:
    async def run() -> None:
        markers = Markers()
        coordinator = await loaded(leading(tmp_path), ProducerIds(), markers)
        pid, zombie = await coordinator.init_producer_id("tx", 30_000, None)
        await coordinator.add_partitions("tx", pid, zombie, {("a", 0)})
        await refused(
            ErrorCode.CONCURRENT_TRANSACTIONS, coordinator.init_producer_id("tx", 30_000, None)
        )
        assert await settled(coordinator, "tx") is TxnState.COMPLETE_ABORT
        assert markers.written == [(pid, zombie + 1, False, 0, ("a", 0))]
        assert await coordinator.init_producer_id("tx", 30_000, None) == (pid, zombie + 2)
        await refused(
            ErrorCode.PRODUCER_FENCED, coordinator.add_partitions("tx", pid, zombie, {("a", 0)})
        )
        await refused(ErrorCode.PRODUCER_FENCED, coordinator.end_txn("tx", pid, zombie, True))

    asyncio.run(run())


def test_a_transaction_open_past_its_timeout_is_aborted(tmp_path: Path) -> None:
    async def run() -> None:
        markers, clock = Markers(), Clock()
        coordinator = await loaded(leading(tmp_path), ProducerIds(), markers, clock)
        pid, epoch = await coordinator.init_producer_id("tx", 1000, None)
        await coordinator.add_partitions("tx", pid, epoch, {("a", 0)})
        clock.now += 1000
        coordinator.abort_expired()
        await asyncio.sleep(0.05)
        assert coordinator.transactions["tx"].current.state is TxnState.ONGOING
        clock.now += 1
        coordinator.abort_expired()
        assert await settled(coordinator, "tx") is TxnState.COMPLETE_ABORT
        assert markers.written == [(pid, epoch + 1, False, 0, ("a", 0))]
        await refused(ErrorCode.PRODUCER_FENCED, coordinator.end_txn("tx", pid, epoch, True))

    asyncio.run(run())


def test_an_idle_transactional_id_expires_with_a_tombstone(tmp_path: Path) -> None:
    """transactional.id.expiration.ms (7 days by default): ids with nothing in flight and
    unwritten that long are removed, as a tombstone a successor loads; an id with an open
    transaction, or written since, stays."""

    async def run() -> None:
        clock = Clock()
        partition = leading(tmp_path)
        coordinator = await loaded(partition, ProducerIds(), clock=clock)
        week = TransactionSettings().id_expiration_ms
        assert week == 7 * 24 * 3600 * 1000
        idle, _ = await coordinator.init_producer_id("idle", 30_000, None)
        done_pid, done_epoch = await coordinator.init_producer_id("done", 30_000, None)
        await coordinator.add_partitions("done", done_pid, done_epoch, {("a", 0)})
        await coordinator.end_txn("done", done_pid, done_epoch, True)
        assert await settled(coordinator, "done") is TxnState.COMPLETE_COMMIT
        busy_pid, busy_epoch = await coordinator.init_producer_id("busy", 30_000, None)
        clock.now += week - 1
        recent, _ = await coordinator.init_producer_id("recent", 30_000, None)
        await coordinator.add_partitions("busy", busy_pid, busy_epoch, {("b", 0)})

        coordinator.tick()  # the first tick removes: not a week yet
        await asyncio.sleep(0.05)
        assert set(coordinator.transactions) == {"idle", "done", "busy", "recent"}
        clock.now += 1
        coordinator.remove_expired_ids()
        for _ in range(200):
            if "idle" not in coordinator.transactions and "done" not in coordinator.transactions:
                break
            await asyncio.sleep(0.01)
        assert set(coordinator.transactions) == {"busy", "recent"}
        assert coordinator.owned[0].ids == {"busy", "recent"}
        with pytest.raises(KafkaError) as gone:
            coordinator.describe("idle")
        assert gone.value.code is ErrorCode.TRANSACTIONAL_ID_NOT_FOUND

        tombstones = [  # a week on, the log has rolled: read every segment
            decode_key(record.key)
            for _, record in read_partition(partition)
            if record.key is not None and record.value is None
        ]
        assert sorted(tombstones) == ["done", "idle"]
        await coordinator.close()

        successor = await loaded(partition, ProducerIds(2000), clock=clock)
        assert set(successor.transactions) == {"busy", "recent"}
        # The expired id starts afresh: a new producer id, epoch 0.
        assert await successor.init_producer_id("idle", 30_000, None) == (2000, 0)
        assert idle != 2000 and recent != 2000

    asyncio.run(run())


def test_partitions_are_verified_against_the_open_transaction(tmp_path: Path) -> None:
    """KIP-890's question from a partition's leader, in each state of the id."""

    async def run() -> None:
        markers = Markers()
        markers.failing = {("a", 0)}  # keeps the commit prepared until cleared
        coordinator = await loaded(leading(tmp_path), ProducerIds(), markers)
        pid, epoch = await coordinator.init_producer_id("tx", 30_000, None)
        both = {("a", 0), ("b", 0)}

        def verify(producer_id: int = pid, producer_epoch: int = epoch) -> set[ErrorCode]:
            return set(
                coordinator.verify_partitions("tx", producer_id, producer_epoch, both).values()
            )

        assert verify() == {ErrorCode.INVALID_TXN_STATE}  # nothing open yet
        await coordinator.add_partitions("tx", pid, epoch, {("a", 0)})
        assert coordinator.verify_partitions("tx", pid, epoch, both) == {
            ("a", 0): ErrorCode.NONE,
            ("b", 0): ErrorCode.INVALID_TXN_STATE,
        }
        assert verify(producer_epoch=epoch - 1) == {ErrorCode.PRODUCER_FENCED}
        assert verify(producer_id=pid + 1) == {ErrorCode.INVALID_PRODUCER_ID_MAPPING}
        assert set(coordinator.verify_partitions("other", pid, epoch, both).values()) == {
            ErrorCode.INVALID_PRODUCER_ID_MAPPING
        }
        await coordinator.end_txn("tx", pid, epoch, True)
        assert verify() == {ErrorCode.CONCURRENT_TRANSACTIONS}  # markers going out
        markers.failing.clear()
        assert await settled(coordinator, "tx") is TxnState.COMPLETE_COMMIT
        assert verify() == {ErrorCode.INVALID_TXN_STATE}  # ended: a late batch is refused
        await coordinator.close()

    asyncio.run(run())
