"""A tiered partition log (KIP-405): its local part, retention gated on the remote indexes,
log starts below the first local segment, and a follower's restart from remote state."""

from __future__ import annotations

import pytest

from directlog.remote.index import IndexEntry, RemoteIndex
from directlog.remote.rdi import RemoteDataId
from services.broker.storage import LogConfig, OffsetOutOfRangeError, PartitionLog
from services.broker.storage.errors import OffsetMovedToTieredStorageError
from services.broker.storage.leader_epochs import EpochEntry
from services.broker.storage.producer_state import ProducerStateManager
from tests.storage.helpers import T0, batch, read_all

TIERED = LogConfig(segment_bytes=600, retention_ms=-1, remote_storage_enable=True)


def fill(log: PartitionLog, records: int, clock=None) -> None:
    for _ in range(records):
        log.append(batch([b"v" * 100], ts=clock.now if clock else T0))
        if clock:
            clock.advance(1_000)
    log.update_high_watermark(log.log_end_offset)


def copy_to_remote(log: PartitionLog, up_to: int) -> None:
    """What the tiering service does: index offsets [remote end or 0, up_to) as remote."""
    index = RemoteIndex.open(log.directory, writable=True)
    start = max(index.end_offset, 0)
    if up_to > start:
        rdi = RemoteDataId("file:///store/x.log", start * 100, (up_to - start) * 100)
        index.append([IndexEntry(start, up_to - 1, T0, T0, rdi)], now_ms=0)
    index.close()
    assert log.refresh_remote()


def test_local_retention_deletes_only_what_the_remote_indexes_hold(open_log):
    log = open_log(
        LogConfig(
            segment_bytes=600, retention_ms=-1, remote_storage_enable=True, local_retention_bytes=0
        )
    )
    fill(log, 20)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 4
    assert log.delete_retained_segments() == 0  # nothing copied: nothing goes
    copy_to_remote(log, bases[3])  # the first three segments are remote
    assert log.remote_end_offset == bases[3]
    assert log.delete_retained_segments() == 3
    assert log.log_start_offset == 0 and log.local_log_start_offset == bases[3]
    with pytest.raises(OffsetMovedToTieredStorageError) as moved:
        log.read(0, 100)
    assert moved.value.local_log_start_offset == bases[3]
    assert isinstance(moved.value, OffsetOutOfRangeError)
    assert read_all(log, bases[3])[0].offset == bases[3]


def test_local_retention_ms_and_its_default(open_log, clock):
    log = open_log(LogConfig(segment_bytes=600, retention_ms=50_000, remote_storage_enable=True))
    fill(log, 20, clock)
    second = log.segments[1]
    copy_to_remote(log, second.next_offset)
    clock.now = second.max_timestamp + 50_001  # local.retention.ms -2: retention.ms
    assert log.delete_retained_segments() == 2
    assert log.log_start_offset == 0  # the records are remote; the log still starts at 0


def test_with_copying_disabled_uncopied_segments_go_by_total_retention(open_log):
    config = LogConfig(
        segment_bytes=600,
        retention_ms=-1,
        retention_bytes=1500,
        remote_storage_enable=True,
        remote_log_copy_disable=True,
    )
    log = open_log(config)
    fill(log, 20)
    copy_to_remote(log, log.segments[1].base_offset)
    deleted = log.delete_retained_segments()
    assert deleted > 1
    # Records past the remote end went everywhere: the log starts at the local start.
    assert log.log_start_offset == log.local_log_start_offset == log.segments[0].base_offset


def test_a_tiered_log_keeps_its_log_start_below_its_local_segments_across_restarts(
    open_log, tmp_path
):
    config = LogConfig(
        segment_bytes=600, retention_ms=-1, remote_storage_enable=True, local_retention_bytes=0
    )
    log = open_log(config)
    fill(log, 20)
    copy_to_remote(log, log.segments[2].base_offset)
    log.delete_retained_segments()
    local_start = log.local_log_start_offset
    log.advance_log_start(5)  # DeleteRecords into the remote part
    log.close()
    reopened = open_log(
        config, log_start_offset=5, recovery_point=20, high_watermark=20, clean_shutdown=True
    )
    assert reopened.tiered and reopened.remote_end_offset == local_start
    assert reopened.log_start_offset == 5 and reopened.local_log_start_offset == local_start
    with pytest.raises(OffsetMovedToTieredStorageError):
        reopened.read(5, 100)
    with pytest.raises(OffsetOutOfRangeError):
        reopened.read(4, 100)


def test_a_log_without_remote_indexes_clamps_a_stale_log_start(open_log):
    log = open_log(LogConfig(segment_bytes=600, retention_ms=-1))
    fill(log, 20)
    second = log.segments[1].base_offset
    log.advance_log_start(second)
    log.close()
    reopened = open_log(
        log_start_offset=0, recovery_point=20, high_watermark=20, clean_shutdown=True
    )
    assert not reopened.tiered and reopened.log_start_offset == second


def test_producer_snapshots_of_uncopied_segment_ends_are_kept(open_log):
    log = open_log(TIERED)
    for producer in range(12):
        log.append(batch([b"v" * 200], producer_id=producer, producer_epoch=0, base_sequence=0))
    log.update_high_watermark(log.log_end_offset)
    ends = [s.next_offset for s in log.segments[:-1]]
    assert len(ends) >= 5
    log.roll()
    kept = sorted(int(p.stem) for p in log.directory.glob("*.snapshot"))
    assert set(ends) <= set(kept)
    copy_to_remote(log, ends[2])
    log.append(batch([b"w"]))
    log.roll()
    kept = sorted(int(p.stem) for p in log.directory.glob("*.snapshot"))
    assert set(e for e in ends if e > ends[2]) <= set(kept)


def test_a_follower_restarts_from_remote_state(open_log, tmp_path):
    log = open_log(TIERED)
    fill(log, 5)
    leader = PartitionLog.open(tmp_path / "leader-0", TIERED)
    fill(leader, 50)
    leader.append(batch([b"p"], producer_id=77, producer_epoch=3, base_sequence=9))  # at 50
    state = ProducerStateManager()
    state.restore(51, leader.producers.snapshot(51))
    leader.close()
    epochs = [EpochEntry(0, 0), EpochEntry(2, 60), EpochEntry(5, 100)]
    with pytest.raises(ValueError):
        log.restart_from_remote(100, 40, epochs, state.snapshot(51))  # taken at 51, not 100
    assert log.log_end_offset == 5  # unchanged
    log.restart_from_remote(100, 40, epochs, state.snapshot(100))
    assert (log.log_start_offset, log.local_log_start_offset, log.log_end_offset) == (40, 100, 100)
    assert log.leader_epochs.entries == [EpochEntry(0, 40), EpochEntry(2, 60)]
    assert 77 in log.producers.entries()
    with pytest.raises(OffsetMovedToTieredStorageError):
        log.read(50, 100)
    log.append(batch([b"next"]), leader_epoch=6)
    assert read_all(log, 100)[0].value == b"next"
    log.close()
    # Before its first image a broker opens logs with their defaults: the start waits.
    reopened = open_log(
        log_start_offset=40,
        recovery_point=101,
        high_watermark=0,
        clean_shutdown=True,
        config_pending=True,
    )
    assert reopened.log_start_offset == 40 and 77 in reopened.producers.entries()
    reopened.configure(TIERED)
    assert reopened.log_start_offset == 40
    reopened.close()
    untiered = open_log(
        log_start_offset=40, recovery_point=101, clean_shutdown=True, config_pending=True
    )
    untiered.configure(LogConfig())  # not tiered after all: the log starts where its data does
    assert untiered.log_start_offset == 100


def test_broker_and_tiering_service_leave_each_others_temporary_files_alone(tmp_path):
    """They share the partition directory: the tiering service opening its remote indexes
    must not delete a producer snapshot the broker is writing right now (its rename then
    fails and the produce with it), nor the broker opening its log a remote index file
    the sidecar is writing. Each removes only its own leftovers."""
    directory = tmp_path / "orders-0"
    directory.mkdir()
    snapshot = directory / "00000000000000000501.snapshot.tmp"
    offsets = directory / "00000000000000000000.remoteOffsetIndex.tmp"
    for leftover in (snapshot, offsets):
        leftover.write_bytes(b"half written")
    RemoteIndex.open(directory, writable=True)
    assert snapshot.exists() and not offsets.exists()
    offsets.write_bytes(b"half written")
    PartitionLog.open(directory, LogConfig()).close()
    assert offsets.exists() and not snapshot.exists()
