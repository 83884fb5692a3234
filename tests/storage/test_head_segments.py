"""Head segments in a memory-backed head directory (log_layout.py; docs/formats.md "Head
segments in a memory-backed directory"): a preallocating log's newest `.log` files live
there, sealed ones are written back to the log directory, a clean close writes back the
head, and a restart recovers what the head directory kept or ends the log where the
written-back segments end when it was lost."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from directlog.topics import TopicPartition
from services.broker.settings import BrokerSettings
from services.broker.storage import LogConfig, PartitionLog, StorageError
from services.broker.storage.checkpoint import OffsetCheckpointFile
from services.broker.storage.cleaner import find_cleanable
from services.broker.storage.log_file import LogFile
from services.broker.storage.log_layout import LogLayout
from services.broker.storage.log_manager import (
    HIGH_WATERMARK_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    LogManager,
)
from services.broker.storage.segment import LogSegment
from services.broker.tiered.service import _hosted
from tests.storage.helpers import ManualClock, batch, read_all

ORDERS = TopicPartition("orders", 0)
SEGMENT = 4096
PREALLOCATED = LogConfig(preallocate=True, segment_bytes=SEGMENT)
VALUE = b"v" * 300  # a batch of one such record is about 370 bytes: ten fill a segment


def names(directory: Path, suffix: str = ".log") -> list[str]:
    return sorted(p.name for p in directory.glob("*" + suffix)) if directory.exists() else []


def base_name(base: int) -> str:
    return f"{base:020d}.log"


def fill(log: PartitionLog, first: int, count: int) -> None:
    """`count` one-record batches with values r-<first>, r-<first + 1>, ..."""
    for i in range(first, first + count):
        log.append(batch([b"r-%d-" % i + VALUE]))


def values(log: PartitionLog, start: int = 0) -> list[int]:
    return [int(r.value.split(b"-")[1]) for r in read_all(log, start)]


def in_memory(log: PartitionLog) -> list[LogSegment]:
    return [s for s in log.segments if log.layout.in_memory(s)]


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A log directory and a head directory (both on the test's file system: the
    semantics matter, not the medium)."""
    return tmp_path / "data", tmp_path / "heads"


def open_manager(
    dirs: tuple[Path, Path], clock: ManualClock, config: LogConfig = PREALLOCATED
) -> LogManager:
    data, heads = dirs
    return LogManager.open(data, lambda topic: config, clock=clock, head_segments_dir=heads)


def crash(manager: LogManager) -> None:
    """The process dies: no close, the directory locks go with it."""
    os.close(manager._lock_fd)
    os.close(manager._head_lock_fd)


def test_a_preallocated_head_lives_in_the_head_directory(dirs, clock):
    data, heads = dirs
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    head = log.segments[-1]
    assert head.log.path == heads / "orders-0" / base_name(0)
    assert head.log.capacity == SEGMENT and os.path.getsize(head.log.path) == SEGMENT
    assert names(data / "orders-0") == []
    assert names(data / "orders-0", ".index") == [f"{0:020d}.index"]  # indexes stay on disk
    # The reserve-and-commit path (RDMA produce) writes the memory-backed file in place.
    data_batch = batch([b"direct"])
    reservation = log.reserve(len(data_batch))
    assert reservation.segment is head
    reservation.buffer[: len(data_batch)] = data_batch
    log.commit(reservation)
    fill(log, 1, 2)
    assert [r.value for r in read_all(log)] == [b"direct", b"r-1-" + VALUE, b"r-2-" + VALUE]
    manager.close()


def test_a_sealed_segment_is_written_back_and_then_its_memory_copy_removed(dirs, clock):
    data, heads = dirs
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    fill(log, 0, 5)
    sealed = log.segments[-1]
    log.roll()
    fill(log, 5, 3)
    assert names(heads / "orders-0") == [base_name(0), base_name(5)]
    assert names(data / "orders-0") == []
    log.flush()
    assert log.recovery_point == 0  # fsynced in memory is not durable
    in_flight = log.read(0, 1 << 20).records  # a fetch still sending from the memory copy
    assert manager.flush_due() == 0  # (flush.ms is not due: only the write-back ran)
    assert names(data / "orders-0") == [base_name(0)]
    assert names(heads / "orders-0") == [base_name(5)]  # the head stays in memory
    assert sealed.log.path == data / "orders-0" / base_name(0)
    assert sealed.log.capacity is None and os.path.getsize(sealed.log.path) == sealed.size
    assert in_flight.read() == log.read(0, 1 << 20).records.read()  # same bytes, either file
    assert values(log) == list(range(8))
    log.flush()
    assert log.recovery_point == 5  # up to the first segment still in memory
    assert OffsetCheckpointFile(data / RECOVERY_POINT_CHECKPOINT).read()[ORDERS] == 5
    assert log.write_back() == 0  # nothing sealed is left in memory
    manager.close()


def test_segments_roll_when_full_and_are_written_back_oldest_first(dirs, clock):
    data, _heads = dirs
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    fill(log, 0, 40)
    sealed = log.segments[:-1]
    assert len(sealed) >= 3
    assert all(log.layout.in_memory(s) for s in log.segments)
    assert log.write_back() == len(sealed)
    assert in_memory(log) == [log.segments[-1]]
    assert names(data / "orders-0") == [base_name(s.base_offset) for s in sealed]
    assert values(log) == list(range(40))
    manager.close()


def test_a_segment_cut_while_being_written_back_stays_where_it_is(dirs, clock, monkeypatch):
    """Truncation (a follower diverged) cuts the sealed segment the write-back copied: the
    copy is dropped, the segment, now the head again, stays in memory."""
    data, _heads = dirs
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    fill(log, 0, 4)
    log.roll()
    fill(log, 4, 2)
    copy = LogLayout.copy

    def copy_then_truncate(source: LogFile, size: int, fd: int) -> bool:
        copied = copy(source, size, fd)
        log.truncate_to(2)  # outside the lock, while the copy is not installed yet
        return copied

    monkeypatch.setattr(LogLayout, "copy", staticmethod(copy_then_truncate))
    assert log.write_back() == 0
    monkeypatch.undo()
    assert names(data / "orders-0") == []
    assert names(data / "orders-0", ".tmp") == []
    head = log.segments[-1]
    assert (head.base_offset, log.log_end_offset) == (0, 2)
    assert log.layout.in_memory(head) and head.log.capacity == SEGMENT  # writable again
    fill(log, 2, 1)
    assert values(log) == [0, 1, 2]
    manager.close()


def test_a_clean_close_writes_back_the_head_and_the_next_head_is_in_memory(dirs, clock):
    data, heads = dirs
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    fill(log, 0, 3)
    log.roll()
    fill(log, 3, 2)
    manager.close()
    assert names(heads / "orders-0") == []
    assert names(data / "orders-0") == [base_name(0), base_name(3)]

    # A pod restart (a new, empty head directory) loses nothing after a clean close.
    shutil.rmtree(heads)
    manager = open_manager(dirs, clock)
    log = manager.get(ORDERS)
    assert values(log) == list(range(5))
    head = log.segments[-1]
    assert not log.layout.in_memory(head) and head.log.capacity is None  # never mapped
    fill(log, 5, 1)  # a TCP append goes on in it
    new_head = log.roll()
    assert log.layout.in_memory(new_head) and new_head.log.capacity == SEGMENT
    fill(log, 6, 1)
    assert values(log) == list(range(7))
    manager.close()


def test_an_empty_head_written_back_is_made_anew_in_memory(dirs, clock):
    data, _heads = dirs
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    fill(log, 0, 2)
    log.roll()
    manager.close()
    assert names(data / "orders-0") == [base_name(0), base_name(2)]

    # Opened before the topics' configs are known (a broker starting), then configured.
    data_dir, head_dir = dirs
    manager = LogManager.open(
        data_dir, lambda topic: LogConfig(), clock=clock, head_segments_dir=head_dir
    )
    log = manager.get(ORDERS)
    log.configure(PREALLOCATED)
    head = log.segments[-1]
    assert head.base_offset == 2 and log.layout.in_memory(head)
    assert head.log.capacity == SEGMENT
    assert names(data / "orders-0") == [base_name(0)]
    manager.close()


def test_an_unclean_restart_keeping_the_head_directory_recovers_it(dirs, clock):
    """A container restart: the emptyDir stays. Sealed segments not yet written back and
    the head are recovered where they are; a torn tail in the head is cut."""
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    fill(log, 0, 3)
    log.roll()
    assert log.write_back() == 1
    fill(log, 3, 3)
    log.roll()
    fill(log, 6, 3)
    log.update_high_watermark(9)
    log.flush()
    manager.checkpoint()
    head = log.segments[-1]
    with open(head.log.path, "r+b") as torn:  # half a batch after the last one
        torn.seek(head.size)
        torn.write(batch([b"torn" + VALUE])[:100])
    crash(manager)

    manager = open_manager(dirs, clock)
    log = manager.get(ORDERS)
    assert values(log) == list(range(9))
    assert [log.layout.in_memory(s) for s in log.segments] == [False, True, True]
    assert log.recovery_point == 3  # the first segment still in memory
    assert log.high_watermark == 9
    assert log.segments[-1].log.capacity == SEGMENT
    assert log.write_back() == 1
    fill(log, 9, 1)
    assert values(log) == list(range(10))
    manager.close()


def test_a_lost_head_directory_ends_the_log_at_the_written_back_segments(dirs, clock):
    """A pod restart after a crash: the emptyDir is new. The log ends where the written-back
    segments end, and no checkpoint points past it; the leader epochs and producer state
    follow, so replication refills the rest from the leader."""
    data, heads = dirs
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    producer = {"producer_id": 7, "producer_epoch": 0}
    for i in range(3):
        log.append(batch([b"r-%d-" % i + VALUE], base_sequence=i, **producer), leader_epoch=1)
    log.roll()
    assert log.write_back() == 1
    for i in range(3, 6):
        log.append(batch([b"r-%d-" % i + VALUE], base_sequence=i, **producer), leader_epoch=2)
    log.roll()  # sealed, not written back yet
    fill(log, 6, 2)
    log.update_high_watermark(8)
    log.flush()
    manager.checkpoint()
    assert OffsetCheckpointFile(data / HIGH_WATERMARK_CHECKPOINT).read()[ORDERS] == 8
    crash(manager)
    shutil.rmtree(heads)

    manager = open_manager(dirs, clock)
    log = manager.get(ORDERS)
    assert values(log) == [0, 1, 2]
    assert (log.log_end_offset, log.high_watermark, log.recovery_point) == (3, 3, 3)
    assert OffsetCheckpointFile(data / HIGH_WATERMARK_CHECKPOINT).read()[ORDERS] == 3
    assert OffsetCheckpointFile(data / RECOVERY_POINT_CHECKPOINT).read()[ORDERS] == 3
    assert log.leader_epochs.latest_epoch == 1
    assert log.end_offset_for_epoch(1) == (1, 3)
    assert names(data / "orders-0") == [base_name(0)]
    assert names(data / "orders-0", ".index") == [f"{0:020d}.index"]
    assert all(int(p.stem) <= 3 for p in (data / "orders-0").glob("*.snapshot"))
    # Appends go on after the records kept (the producer's next sequence follows them)
    # in the written-back head, never mapped; the next head is in memory again.
    log.append(batch([b"r-3-" + VALUE], base_sequence=3, **producer), leader_epoch=3)
    assert not log.layout.in_memory(log.segments[-1])
    head = log.roll()
    assert log.layout.in_memory(head) and head.log.capacity == SEGMENT
    fill(log, 4, 1)
    assert values(log) == [0, 1, 2, 3, 4]
    manager.close()


def test_a_copy_in_both_places_is_a_write_back_leftover(dirs, clock):
    """A crash after the write-back's rename, before the memory copy went: the log
    directory's copy is used and the memory copy removed."""
    _data, heads = dirs
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    fill(log, 0, 3)
    log.roll()
    fill(log, 3, 1)
    memory_copy = (heads / "orders-0" / base_name(0)).read_bytes()
    assert log.write_back() == 1
    log.flush()
    crash(manager)
    (heads / "orders-0" / base_name(0)).write_bytes(memory_copy)

    manager = open_manager(dirs, clock)
    log = manager.get(ORDERS)
    assert names(heads / "orders-0") == [base_name(3)]
    assert not log.layout.in_memory(log.segments[0])
    assert values(log) == list(range(4))
    manager.close()


def test_retention_deletes_segments_wherever_they_are(dirs, clock):
    data, heads = dirs
    config = LogConfig(preallocate=True, segment_bytes=SEGMENT, retention_ms=1000)
    manager = open_manager(dirs, clock, config)
    log = manager.create(ORDERS)
    for i in range(3):
        log.append(batch([b"r-%d-" % i + VALUE], ts=clock.now))
    log.roll()
    assert log.write_back() == 1
    for i in range(3, 6):
        log.append(batch([b"r-%d-" % i + VALUE], ts=clock.now))
    log.roll()  # still in memory
    log.append(batch([b"r-6-" + VALUE], ts=clock.now + 5000))
    log.update_high_watermark(7)
    clock.advance(2000)
    assert manager.enforce_retention() == 2
    assert log.log_start_offset == 6
    assert names(data / "orders-0") == []
    assert names(heads / "orders-0") == [base_name(6)]
    assert values(log, 6) == [6]
    manager.close()


def test_deleting_a_partition_removes_it_from_both_places(dirs, clock):
    data, heads = dirs
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    fill(log, 0, 3)
    log.roll()
    fill(log, 3, 1)
    manager.delete(ORDERS)
    assert not (data / "orders-0").exists()
    assert not (heads / "orders-0").exists()
    manager.close()


def test_a_head_directory_whose_log_is_gone_is_removed(dirs, clock):
    data, heads = dirs
    manager = open_manager(dirs, clock)
    fill(manager.create(ORDERS), 0, 1)
    crash(manager)
    shutil.rmtree(data / "orders-0")  # a crash while deleting it
    manager = open_manager(dirs, clock)
    assert manager.get(ORDERS) is None
    assert not (heads / "orders-0").exists()
    manager.close()


def test_a_head_directory_has_one_owner(dirs, clock, tmp_path):
    manager = open_manager(dirs, clock)
    with pytest.raises(StorageError, match="in use"):
        LogManager.open(tmp_path / "other", head_segments_dir=dirs[1])
    manager.close()


def test_logs_that_do_not_preallocate_keep_their_segments_on_disk(dirs, clock):
    _data, heads = dirs
    manager = open_manager(dirs, clock, LogConfig(segment_bytes=SEGMENT))
    log = manager.create(ORDERS)
    fill(log, 0, 20)
    assert in_memory(log) == []
    assert names(heads / "orders-0") == []
    assert values(log) == list(range(20))
    manager.close()


def test_turning_preallocate_off_keeps_memory_segments_the_newest(dirs, clock):
    """Segments following a head in memory go there too, so losing the head directory
    can only end the log, never leave a gap in it."""
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    fill(log, 0, 2)
    log.configure(LogConfig(segment_bytes=SEGMENT))
    new_head = log.roll()
    assert log.layout.in_memory(new_head) and new_head.log.capacity is None
    manager.close()
    manager = open_manager(dirs, clock, LogConfig(segment_bytes=SEGMENT))
    log = manager.get(ORDERS)
    fill(log, 2, 1)
    assert not log.layout.in_memory(log.roll())  # all written back: on disk from now on
    manager.close()


def test_the_cleaner_leaves_segments_in_memory_alone(dirs, clock):
    config = LogConfig(preallocate=True, segment_bytes=SEGMENT, cleanup_policy="compact")
    manager = open_manager(dirs, clock, config)
    log = manager.create(ORDERS)
    for _i in range(4):
        log.append(batch([VALUE], ts=clock.now))
        log.roll()
    log.update_high_watermark(log.log_end_offset)
    assert find_cleanable(log, clock.now) is None
    assert log.write_back() == 4
    cleanable = find_cleanable(log, clock.now)
    assert cleanable is not None and len(cleanable.segments) == 4
    assert cleanable.end == 4
    manager.close()


def test_without_a_head_directory_every_file_is_in_the_log_directory(tmp_path, clock):
    manager = LogManager.open(tmp_path, lambda topic: PREALLOCATED, clock=clock)
    log = manager.create(ORDERS)
    fill(log, 0, 20)
    assert all(s.log.path.parent == tmp_path / "orders-0" for s in log.segments)
    assert log.write_back() == 0
    assert log.segments[-1].log.capacity == SEGMENT
    manager.close()


def test_a_head_kept_in_memory_is_preallocated_once_its_config_is_known(dirs, clock):
    """A container restart, the broker opening its logs before it knows their configs:
    the head recovered in memory gets its preallocated length back when configured."""
    data, heads = dirs
    manager = open_manager(dirs, clock)
    fill(manager.create(ORDERS), 0, 2)
    crash(manager)
    manager = LogManager.open(
        data, lambda topic: LogConfig(), clock=clock, head_segments_dir=heads, configs_pending=True
    )
    log = manager.get(ORDERS)
    head = log.segments[-1]
    assert log.layout.in_memory(head) and head.log.capacity is None
    log.configure(PREALLOCATED)
    assert head.log.capacity == SEGMENT
    data_batch = batch([b"direct"])
    reservation = log.reserve(len(data_batch))
    reservation.buffer[: len(data_batch)] = data_batch
    assert log.commit(reservation).first_offset == 2
    manager.close()


@pytest.mark.parametrize("heads", [".", "heads", "heads/deeper"])
def test_the_head_directory_lies_outside_the_log_directory(tmp_path, heads):
    with pytest.raises(ValidationError, match="outside data_dir"):
        BrokerSettings(data_dir=tmp_path, rdma_head_segments_dir=tmp_path / heads)
    settings = BrokerSettings(data_dir=tmp_path / "data", rdma_head_segments_dir=tmp_path / heads)
    assert settings.rdma_head_segments_dir == tmp_path / heads


def test_the_tiering_service_is_told_a_segment_in_memory_is_not_closed_yet(dirs, clock):
    """The tiering sidecar copies closed segments from the log directory: a sealed one
    still in the head directory is listed as active until it is written back."""
    manager = open_manager(dirs, clock)
    log = manager.create(ORDERS)
    fill(log, 0, 5)
    log.roll()
    fill(log, 5, 2)
    partition = SimpleNamespace(
        log=log,
        topic_id=uuid.UUID(int=1),
        is_leader=True,
        leader_epoch=0,
        config=PREALLOCATED,
    )
    listed = _hosted(ORDERS, partition)  # type: ignore[arg-type]
    assert [(s.base_offset, s.active) for s in listed.segments] == [(0, True), (5, True)]
    manager.flush_due()
    listed = _hosted(ORDERS, partition)  # type: ignore[arg-type]
    assert [(s.base_offset, s.active) for s in listed.segments] == [(0, False), (5, True)]
    manager.close()
