"""Transactions in a partition log: transactional batches open a producer's transaction, a
marker ends it, and the last stable offset stays at the first undecided transaction (or the
high watermark) — also across a restart and on a follower."""

from __future__ import annotations

from pathlib import Path

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.records.batch import Record, build_batch, decode_records, iter_batches
from directlog.records.markers import ABORT, COMMIT, control_type
from services.broker.storage import LogConfig, PartitionLog
from services.broker.storage.errors import InvalidProducerEpochError
from tests.storage.helpers import T0, ManualClock

pytestmark = pytest.mark.timeout(60)


def txn_batch(producer_id: int, epoch: int, sequence: int, count: int) -> bytes:
    records = [Record(i, T0 + i, None, b"t%d" % i) for i in range(count)]
    return build_batch(
        records,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        transactional=True,
    )


def plain_batch(count: int) -> bytes:
    return build_batch([Record(i, T0, None, b"p") for i in range(count)])


def open_at(directory: Path) -> PartitionLog:
    return PartitionLog.open(directory, LogConfig(), clock=ManualClock())


def test_markers_end_transactions_and_move_the_lso(tmp_path: Path) -> None:
    log = open_at(tmp_path / "t-0")
    log.append(txn_batch(7, 0, 0, 3), leader_epoch=0)  # offsets 0-2
    log.append(plain_batch(2), leader_epoch=0)  # 3-4
    log.append(txn_batch(8, 0, 0, 1), leader_epoch=0)  # 5
    log.update_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == 0

    commit = log.append_marker(7, 0, True, 4, leader_epoch=0)
    assert (commit.first_offset, commit.last_offset) == (6, 6)
    # The marker is written but not replicated: producer 7's transaction stays unstable.
    assert log.last_stable_offset == 0
    log.update_high_watermark(7)
    assert log.last_stable_offset == 5  # producer 8's is still open
    log.append_marker(8, 0, False, 4, leader_epoch=0)
    log.update_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == log.log_end_offset == 8

    data = log.read(0, 1 << 20).records.read()
    controls = [
        (header.base_offset, header.producer_id, control_type(record.key), record.value)
        for position, header in iter_batches(data)
        if header.is_control and header.is_transactional
        for record in decode_records(data, position, header)
    ]
    assert controls == [
        (6, 7, COMMIT, b"\x00\x00\x00\x00\x00\x04"),
        (7, 8, ABORT, b"\x00\x00\x00\x00\x00\x04"),
    ]


def test_a_marker_of_an_older_epoch_is_refused(tmp_path: Path) -> None:
    log = open_at(tmp_path / "t-0")
    log.append(txn_batch(7, 3, 0, 1), leader_epoch=0)
    end = log.log_end_offset
    with pytest.raises(InvalidProducerEpochError):
        log.append_marker(7, 2, False, 0, leader_epoch=0)
    assert log.log_end_offset == end
    log.append_marker(7, 4, False, 0, leader_epoch=0)  # a fencing abort has a newer epoch
    log.update_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == log.log_end_offset


def test_a_marker_of_an_older_coordinator_epoch_is_fenced(tmp_path: Path) -> None:
    """Kafka's check: a marker whose coordinator epoch is older than the producer's last
    marker here comes from a coordinator that lost its partition; a follower that copied
    the markers refuses it too once it leads."""
    log = open_at(tmp_path / "t-0")
    log.append(txn_batch(7, 0, 0, 2), leader_epoch=0)  # 0-1
    log.append_marker(7, 0, True, 5, leader_epoch=0)  # 2, coordinator epoch 5
    log.append(txn_batch(7, 0, 2, 1), leader_epoch=0)  # 3
    end = log.log_end_offset
    with pytest.raises(KafkaError) as refused:
        log.append_marker(7, 0, False, 4, leader_epoch=0)
    assert refused.value.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert log.log_end_offset == end
    log.update_high_watermark(end)
    assert log.last_stable_offset == 3  # still open: nothing was written
    log.append_marker(8, 0, False, 1, leader_epoch=0)  # another producer: its own epoch
    log.append_marker(7, 0, True, 5, leader_epoch=0)  # the same coordinator epoch is fine

    follower = open_at(tmp_path / "f-0")
    follower.append(log.read(0, 1 << 20).records.read(), assign_offsets=False)
    follower.append(txn_batch(7, 0, 3, 1), leader_epoch=1)
    with pytest.raises(KafkaError):
        follower.append_marker(7, 0, True, 3, leader_epoch=1)
    follower.append_marker(7, 0, True, 6, leader_epoch=1)
    log.close()
    follower.close()


def test_an_open_transaction_survives_a_restart_and_reaches_followers(tmp_path: Path) -> None:
    log = open_at(tmp_path / "t-0")
    log.append(plain_batch(4), leader_epoch=0)
    log.append(txn_batch(9, 0, 0, 2), leader_epoch=0)  # 4-5
    log.close()
    reopened = open_at(tmp_path / "t-0")
    reopened.update_high_watermark(reopened.log_end_offset)
    assert reopened.last_stable_offset == 4
    reopened.append_marker(9, 0, True, 0, leader_epoch=0)

    follower = open_at(tmp_path / "f-0")
    data = reopened.read(0, 1 << 20).records.read()
    follower.append(data, assign_offsets=False)
    follower.update_high_watermark(6)
    assert follower.last_stable_offset == 4  # the marker at 6 is not below the watermark
    follower.update_high_watermark(7)
    assert follower.last_stable_offset == 7
    reopened.close()
    follower.close()


def test_aborted_transactions_are_indexed_and_survive_restarts(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = open_at(directory)
    log.append(txn_batch(1, 0, 0, 2), leader_epoch=0)  # 0-1
    log.append(txn_batch(2, 0, 0, 2), leader_epoch=0)  # 2-3
    log.append_marker(1, 0, False, 0, leader_epoch=0)  # 4: producer 1 aborted
    log.append_marker(2, 0, True, 0, leader_epoch=0)  # 5: producer 2 committed
    log.append(txn_batch(1, 0, 2, 1), leader_epoch=0)  # 6
    log.append_marker(1, 0, False, 0, leader_epoch=0)  # 7
    log.update_high_watermark(log.log_end_offset)
    both = [(1, 0), (1, 6)]
    assert [(e.producer_id, e.first_offset) for e in log.aborted_transactions(0, 8)] == both
    assert [e.first_offset for e in log.aborted_transactions(5, 8)] == [6]  # 0-4 ended below
    assert [e.first_offset for e in log.aborted_transactions(0, 6)] == [0]  # 6 starts above
    log.close()

    reopened = open_at(directory)  # from the file
    assert [(e.producer_id, e.first_offset) for e in reopened.aborted_transactions(0, 8)] == both
    reopened.truncate_to(7)  # the second abort's marker goes
    assert [e.last_offset for e in reopened.aborted_transactions(0, 8)] == [4]
    reopened.close()

    # A crash that loses the index file: the entries come back from the log.
    (directory / "aborted.txnindex").unlink()
    for snapshot in directory.glob("*.snapshot"):
        snapshot.unlink()
    rebuilt = open_at(directory)
    assert [(e.producer_id, e.first_offset, e.last_offset) for e in rebuilt.aborted.entries] == [
        (1, 0, 4)
    ]
    rebuilt.close()


def test_a_follower_indexes_the_aborts_it_copies(tmp_path: Path) -> None:
    leader = open_at(tmp_path / "l-0")
    leader.append(txn_batch(3, 0, 0, 3), leader_epoch=0)
    leader.append_marker(3, 0, False, 0, leader_epoch=0)
    follower = open_at(tmp_path / "f-0")
    follower.append(leader.read(0, 1 << 20).records.read(), assign_offsets=False)
    assert [(e.producer_id, e.first_offset, e.last_offset) for e in follower.aborted.entries] == [
        (3, 0, 3)
    ]
    leader.close()
    follower.close()
