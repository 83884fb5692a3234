"""Leader epochs and topic ids of a partition log: the epoch cache's rules (Kafka's
LeaderEpochFileCache), its checkpoint file, how appends, truncation, retention and restarts
keep it in step with the log, and the partition.metadata file."""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from directlog.records.batch import (
    Record,
    build_batch,
    iter_batches,
    stamp_offset_and_epoch,
)
from directlog.records.errors import CorruptRecordError
from directlog.topics import TopicPartition
from directlog.topics import uuid_text as encode_topic_id
from services.broker.storage import (
    EpochEntry,
    LeaderEpochCache,
    LogConfig,
    PartitionLog,
    StorageError,
)
from services.broker.storage.leader_epochs import LEADER_EPOCH_CHECKPOINT
from services.broker.storage.log import PARTITION_METADATA
from services.broker.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManager
from tests.storage.helpers import T0, ManualClock, batch, read_all

ORDERS = TopicPartition("orders", 0)
SMALL = LogConfig(segment_bytes=600, index_interval_bytes=128)


def cache_with(path: Path, *entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache.load(path)
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def leader_batch(base_offset: int, count: int, epoch: int) -> bytes:
    """A batch as a leader stores it: its offsets and partition leader epoch stamped."""
    records = [Record(i, T0 + i, None, b"v%d" % i) for i in range(count)]
    data = bytearray(build_batch(records))
    stamp_offset_and_epoch(data, 0, base_offset, epoch)
    return bytes(data)


def trimmed(pairs: list[tuple[int, int]], start: int) -> list[EpochEntry]:
    """Kafka's truncateFromStart spelled out: the last entry at or below `start` moves
    there, earlier ones go."""
    entries = [EpochEntry(*pair) for pair in pairs]
    below = [e for e in entries if e.start_offset <= start]
    kept = [e for e in entries if e.start_offset > start]
    return [EpochEntry(below[-1].epoch, start), *kept] if below else kept


def epochs_in_log(log: PartitionLog) -> list[EpochEntry]:
    """Where each rising partition leader epoch starts, read from the stored batches."""
    found: list[EpochEntry] = []
    for segment in log.segments:
        for _, header in iter_batches(segment.log.read(0, segment.size)):
            epoch = header.partition_leader_epoch
            if epoch >= 0 and (not found or epoch > found[-1].epoch):
                found.append(EpochEntry(epoch, header.base_offset))
    return found


# The cache -----------------------------------------------------------------------------


def test_an_empty_cache_knows_no_epoch(tmp_path):
    cache = LeaderEpochCache.load(tmp_path / LEADER_EPOCH_CHECKPOINT)
    assert cache.latest_epoch == -1
    assert cache.entries == []
    assert cache.end_offset_for(0, 10) == (-1, -1)
    cache.truncate_from_end(0)
    cache.truncate_from_start(5)
    cache.clear()
    assert not (tmp_path / LEADER_EPOCH_CHECKPOINT).exists()  # nothing changed, nothing written


def test_kafka_examples_of_end_offset_for(tmp_path):
    cache = cache_with(tmp_path / "cp", (0, 0), (2, 10), (4, 20))
    assert cache.latest_epoch == 4
    assert cache.end_offset_for(3, 30) == (2, 20)
    assert cache.end_offset_for(4, 30) == (4, 30)
    assert cache.end_offset_for(1, 30) == (0, 10)
    assert cache.end_offset_for(0, 30) == (0, 10)
    assert cache.end_offset_for(2, 30) == (2, 20)


def test_end_offset_for_edge_cases_follow_kafka(tmp_path):
    cache = cache_with(tmp_path / "cp", (2, 10), (4, 20))
    assert cache.end_offset_for(-1, 30) == (-1, -1)  # undefined epoch
    assert cache.end_offset_for(5, 30) == (-1, -1)  # newer than anything known
    # Older than every entry: that data is gone; the follower keeps nothing past the first.
    assert cache.end_offset_for(1, 30) == (1, 10)


def test_assign_only_moves_forward(tmp_path, caplog):
    cache = cache_with(tmp_path / "cp", (0, 0), (2, 10))
    cache.assign(2, 15)  # same epoch: it started earlier
    with caplog.at_level(logging.WARNING):
        cache.assign(1, 12)
    assert "older than the latest epoch 2" in caplog.text
    assert cache.entries == [(0, 0), (2, 10)]
    cache.assign(4, 20)
    assert cache.entries == [(0, 0), (2, 10), (4, 20)]
    with pytest.raises(ValueError):
        cache.assign(5, -1)


def test_assign_drops_entries_at_or_after_the_new_start(tmp_path, caplog):
    cache = cache_with(tmp_path / "cp", (0, 0), (2, 10), (4, 20))
    with caplog.at_level(logging.WARNING):
        cache.assign(5, 20)  # elected again before writing anything: quiet
    assert cache.entries == [(0, 0), (2, 10), (5, 20)]
    assert "replaces" not in caplog.text
    with caplog.at_level(logging.WARNING):
        cache.assign(6, 10)
    assert cache.entries == [(0, 0), (6, 10)]
    assert "replaces entries" in caplog.text


def test_truncate_from_end(tmp_path):
    cache = cache_with(tmp_path / "cp", (0, 0), (2, 10), (4, 20))
    cache.truncate_from_end(25)
    assert cache.entries == [(0, 0), (2, 10), (4, 20)]
    cache.truncate_from_end(20)
    assert cache.entries == [(0, 0), (2, 10)]
    cache.truncate_from_end(5)
    assert cache.entries == [(0, 0)]
    cache.truncate_from_end(0)
    assert cache.entries == []
    assert cache.latest_epoch == -1


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (0, [(0, 0), (2, 10), (4, 20)]),
        (5, [(0, 5), (2, 10), (4, 20)]),
        (10, [(2, 10), (4, 20)]),  # an entry starting at the new log start stays as it is
        (15, [(2, 15), (4, 20)]),
        (20, [(4, 20)]),
        (99, [(4, 99)]),
    ],
)
def test_truncate_from_start(tmp_path, start, expected):
    cache = cache_with(tmp_path / "cp", (0, 0), (2, 10), (4, 20))
    cache.truncate_from_start(start)
    assert cache.entries == expected
    assert LeaderEpochCache.load(tmp_path / "cp").entries == expected


def test_clear(tmp_path):
    cache = cache_with(tmp_path / "cp", (0, 0), (2, 10))
    cache.clear()
    assert cache.entries == [] and cache.latest_epoch == -1
    assert (tmp_path / "cp").read_text() == "0\n0\n"


def test_entries_is_a_copy(tmp_path):
    cache = cache_with(tmp_path / "cp", (0, 0))
    cache.entries.append(EpochEntry(9, 9))
    assert cache.entries == [(0, 0)]


# The checkpoint file ---------------------------------------------------------------------


def test_checkpoint_is_kafkas_text_format_and_round_trips(tmp_path):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    cache_with(path, (0, 0), (2, 10), (4, 20))
    assert path.read_text() == "0\n3\n0 0\n2 10\n4 20\n"
    loaded = LeaderEpochCache.load(path)
    assert loaded.entries == [(0, 0), (2, 10), (4, 20)]
    assert loaded.latest_epoch == 4


def test_each_change_replaces_the_file_atomically(tmp_path):
    path = tmp_path / "cp"
    cache = cache_with(path, (0, 0))
    before = path.stat().st_ino
    cache.assign(1, 5)
    assert path.stat().st_ino != before  # a new file renamed over the old one
    assert not list(tmp_path.glob("*.tmp"))
    unchanged = path.stat()
    cache.assign(1, 9)
    cache.truncate_from_end(6)
    cache.truncate_from_start(0)
    assert path.stat().st_ino == unchanged.st_ino
    assert path.stat().st_mtime_ns == unchanged.st_mtime_ns


def test_a_failed_write_changes_nothing(tmp_path, monkeypatch):
    path = tmp_path / "cp"
    cache = cache_with(path, (0, 0))

    def fail(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(StorageError, match="No space left"):
        cache.assign(1, 5)
    assert cache.entries == [(0, 0)] and cache.latest_epoch == 0
    assert path.read_text() == "0\n1\n0 0\n"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0\n",
        "1\n0\n",
        "0\nx\n",
        "0\n2\n0 0\n",
        "0\n1\n0 0\n1 5\n",
        "0\n1\nzero 0\n",
        "0\n1\n0\n",
        "0\n1\n0 0 0\n",
        "0\n1\n-1 0\n",
        "0\n2\n3 10\n2 20\n",
        "0\n2\n2 10\n3 10\n",
    ],
)
def test_a_malformed_checkpoint_is_a_storage_error_naming_the_file(tmp_path, text):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    path.write_text(text)
    with pytest.raises(StorageError, match=str(path)):
        LeaderEpochCache.load(path)


def test_a_binary_checkpoint_is_a_storage_error(tmp_path):
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    path.write_bytes(b"0\n1\n\xff\xfe 0\n")
    with pytest.raises(StorageError, match=str(path)):
        LeaderEpochCache.load(path)


# In the partition log --------------------------------------------------------------------


def test_leader_appends_start_each_new_epoch(open_log, tmp_path):
    log = open_log()
    log.append(batch([b"a", b"b"]))  # no epoch (-1): nothing to record
    assert log.leader_epochs.entries == []
    assert not (tmp_path / "topic-0" / LEADER_EPOCH_CHECKPOINT).exists()
    log.append(batch([b"c", b"d", b"e"]), leader_epoch=0)
    log.append(batch([b"f"]), leader_epoch=0)
    log.append(batch([b"g", b"h"]), leader_epoch=3)
    log.append(batch([b"i"]), leader_epoch=3)
    assert log.leader_epochs.entries == [(0, 2), (3, 6)]
    assert log.leader_epochs.entries == epochs_in_log(log)
    assert log.end_offset_for_epoch(0) == (0, 6)
    assert log.end_offset_for_epoch(2) == (0, 6)
    assert log.end_offset_for_epoch(3) == (3, 9)
    assert log.end_offset_for_epoch(4) == (-1, -1)
    text = (tmp_path / "topic-0" / LEADER_EPOCH_CHECKPOINT).read_text()
    assert text == "0\n2\n0 2\n3 6\n"


def test_a_stale_leader_epoch_leaves_the_cache_alone(open_log):
    log = open_log()
    log.append(batch([b"a"]), leader_epoch=5)
    log.append(batch([b"b"]), leader_epoch=4)
    assert log.leader_epochs.entries == [(5, 0)]


def test_a_rejected_append_records_no_epoch(open_log):
    log = open_log()
    damaged = bytearray(batch([b"a"]))
    damaged[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append(bytes(damaged), leader_epoch=2)
    assert log.leader_epochs.entries == []


def test_committed_reservations_start_epochs(open_log):
    log = open_log(LogConfig(preallocate=True, segment_bytes=64 * 1024))
    for epoch, values in [(1, [b"a", b"b"]), (1, [b"c"]), (2, [b"d"])]:
        data = batch(values)
        reservation = log.reserve(len(data))
        reservation.buffer[:] = data
        log.commit(reservation, leader_epoch=epoch)
    assert log.leader_epochs.entries == [(1, 0), (2, 3)]
    assert log.leader_epochs.entries == epochs_in_log(log)


def test_follower_appends_take_the_epochs_of_their_batches(open_log):
    log = open_log()
    first = leader_batch(0, 3, 1) + leader_batch(3, 2, 1) + leader_batch(5, 4, 3)
    log.append(first, assign_offsets=False)
    assert log.leader_epochs.entries == [(1, 0), (3, 5)]
    second = leader_batch(9, 1, 3) + leader_batch(10, 2, 6) + leader_batch(12, 1, 7)
    log.append(second, assign_offsets=False)
    assert log.leader_epochs.entries == [(1, 0), (3, 5), (6, 10), (7, 12)]
    assert log.leader_epochs.entries == epochs_in_log(log)
    assert log.read(0, 1 << 20).records.read() == first + second  # stored as the leader has it
    assert log.end_offset_for_epoch(3) == (3, 10)
    assert log.end_offset_for_epoch(5) == (3, 10)
    assert log.end_offset_for_epoch(7) == (7, 13)


def test_follower_batches_without_an_epoch_record_none(open_log):
    log = open_log()
    log.append(leader_batch(0, 2, -1), assign_offsets=False)
    assert log.leader_epochs.entries == []


def test_truncate_to_cuts_the_cache_at_the_new_log_end(open_log):
    log = open_log(SMALL)
    for epoch in range(4):
        for _ in range(3):
            log.append(batch([b"x" * 40, b"y" * 40]), leader_epoch=epoch)
    assert log.leader_epochs.entries == [(0, 0), (1, 6), (2, 12), (3, 18)]
    log.truncate_to(19)  # inside the batch [18, 19]: it goes, and epoch 3 with it
    assert log.log_end_offset == 18
    assert log.leader_epochs.entries == [(0, 0), (1, 6), (2, 12)]
    log.truncate_to(13)
    assert log.leader_epochs.entries == [(0, 0), (1, 6)]
    assert log.end_offset_for_epoch(1) == (1, 12)
    log.append(batch([b"z"]), leader_epoch=5)
    assert log.leader_epochs.entries == [(0, 0), (1, 6), (5, 12)]
    assert log.leader_epochs.entries == epochs_in_log(log)
    log.truncate_to(0)
    assert log.leader_epochs.entries == []


def test_truncating_fully_clears_the_cache(open_log, tmp_path):
    log = open_log()
    log.append(batch([b"a"]), leader_epoch=1)
    log.truncate_fully_and_start_at(100)
    assert log.leader_epochs.entries == []
    assert (tmp_path / "topic-0" / LEADER_EPOCH_CHECKPOINT).read_text() == "0\n0\n"
    log.append(leader_batch(100, 2, 4), assign_offsets=False)
    assert log.leader_epochs.entries == [(4, 100)]


def test_retention_moves_the_first_epoch_to_the_log_start(open_log, clock):
    log = open_log(LogConfig(segment_bytes=600, retention_ms=10_000))
    for epoch in range(3):
        for _ in range(6):
            log.append(batch([b"v" * 100], ts=clock.now), leader_epoch=epoch)
    assert log.leader_epochs.entries == [(0, 0), (1, 6), (2, 12)]
    log.update_high_watermark(log.log_end_offset)
    clock.advance(20_000)
    log.append(batch([b"fresh"], ts=clock.now), leader_epoch=2)
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_retained_segments() > 0
    start = log.log_start_offset
    assert start > 0 and start not in (6, 12)  # the first surviving epoch really moves
    assert log.leader_epochs.entries == trimmed([(0, 0), (1, 6), (2, 12)], start)
    assert log.leader_epochs.entries[0].start_offset == start
    assert LeaderEpochCache.load(log.leader_epochs.path).entries == log.leader_epochs.entries


def test_the_cache_survives_a_clean_restart(open_log):
    log = open_log()
    log.append(batch([b"a"]), leader_epoch=1)
    log.append(batch([b"b"]), leader_epoch=2)
    log.close()
    reopened = open_log(clean_shutdown=True, recovery_point=2)
    assert reopened.leader_epochs.entries == [(1, 0), (2, 1)]
    assert reopened.end_offset_for_epoch(1) == (1, 1)


def test_a_crash_that_tears_the_tail_cuts_the_cache_too(open_log):
    log = open_log(SMALL)
    sizes = [log.append(batch([b"x" * 30]), leader_epoch=e).size for e in (0, 0, 1, 2)]
    path = log.segments[-1].log.path
    os.truncate(path, sum(sizes) - 5)  # the epoch-2 batch is torn
    recovered = open_log(SMALL)
    assert recovered.log_end_offset == 3
    assert recovered.leader_epochs.entries == [(0, 0), (1, 2)]
    assert LeaderEpochCache.load(recovered.leader_epochs.path).entries == [(0, 0), (1, 2)]


def test_an_epoch_recorded_before_its_records_reached_disk_is_dropped(open_log):
    """The cache is written before the records: a crash in between leaves an entry at or
    beyond the log end, which the next open removes."""
    log = open_log()
    log.append(batch([b"a", b"b"]), leader_epoch=1)
    log.leader_epochs.assign(2, 2)  # as an append does before its write
    log.leader_epochs.assign(3, 7)
    recovered = open_log()
    assert recovered.leader_epochs.entries == [(1, 0)]


def test_a_crash_during_retention_leaves_entries_the_next_open_trims(open_log):
    log = open_log(SMALL)
    for epoch in range(3):
        for _ in range(4):
            log.append(batch([b"x" * 60]), leader_epoch=epoch)
    entries = log.leader_epochs.entries
    assert entries == [(0, 0), (1, 4), (2, 8)]
    start = log.segments[2].base_offset
    log.close()
    # Retention saved the new log start, but died before deleting segments and the cache
    # write: the next open finishes both.
    recovered = open_log(SMALL, log_start_offset=start, clean_shutdown=True, recovery_point=12)
    assert recovered.log_start_offset == recovered.segments[0].base_offset == start
    assert recovered.leader_epochs.entries == trimmed(entries, start)
    assert LeaderEpochCache.load(recovered.leader_epochs.path).entries == trimmed(entries, start)


def test_a_malformed_cache_file_stops_the_log_from_opening(open_log, tmp_path):
    log = open_log()
    log.append(batch([b"a"]), leader_epoch=1)
    log.close()
    path = tmp_path / "topic-0" / LEADER_EPOCH_CHECKPOINT
    path.write_text("0\n3\n1 0\n")
    with pytest.raises(StorageError, match=LEADER_EPOCH_CHECKPOINT):
        open_log(clean_shutdown=True)


def test_leftover_temporaries_are_removed_at_open(open_log, tmp_path):
    directory = tmp_path / "topic-0"
    directory.mkdir()
    (directory / (LEADER_EPOCH_CHECKPOINT + ".tmp")).write_text("0\n1\n9 9\n")
    log = open_log()
    assert log.leader_epochs.entries == []
    assert not list(directory.glob("*.tmp"))


# partition.metadata ----------------------------------------------------------------------


def test_topic_id_round_trips_through_the_log_manager(tmp_path):
    topic_id = uuid.UUID("0b9c5b3e-6a43-4f1d-9a3b-2f8c1e7d4a50")
    manager = LogManager.open(tmp_path)
    log = manager.create(ORDERS, topic_id=topic_id)
    assert log.topic_id == topic_id
    text = (tmp_path / "orders-0" / PARTITION_METADATA).read_text()
    assert text == f"version: 0\ntopic_id: {encode_topic_id(topic_id)}"
    log.append(batch([b"a"]), leader_epoch=0)
    manager.close()
    reopened = LogManager.open(tmp_path)
    assert reopened.get(ORDERS).topic_id == topic_id
    reopened.close()


def test_topic_ids_are_written_as_kafka_writes_them():
    # Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, no padding.
    assert encode_topic_id(uuid.UUID(int=0)) == "AAAAAAAAAAAAAAAAAAAAAA"
    assert encode_topic_id(uuid.UUID(int=(1 << 128) - 1)) == "_____________________w"
    topic_id = uuid.UUID("fb9c5b3e-6a43-4f1d-9a3b-2f8c1e7d4afe")
    assert encode_topic_id(topic_id) == "-5xbPmpDTx2aOy-MHn1K_g"


def test_an_existing_log_is_returned_unchanged(tmp_path):
    first, second = uuid.uuid4(), uuid.uuid4()
    manager = LogManager.open(tmp_path)
    log = manager.create(ORDERS, topic_id=first)
    log.append(batch([b"a"]))
    assert manager.create(ORDERS, topic_id=second) is log
    assert log.topic_id == first  # the caller compares and deletes a stale log itself
    manager.delete(ORDERS)
    assert manager.create(ORDERS, topic_id=second).topic_id == second
    manager.close()


def test_set_topic_id_adopts_a_log_without_one(tmp_path):
    topic_id = uuid.uuid4()
    manager = LogManager.open(tmp_path)
    log = manager.create(ORDERS)
    assert log.topic_id is None
    assert not (tmp_path / "orders-0" / PARTITION_METADATA).exists()
    log.set_topic_id(topic_id)
    log.set_topic_id(topic_id)
    assert log.topic_id == topic_id
    with pytest.raises(ValueError, match="belongs to topic id"):
        log.set_topic_id(uuid.uuid4())
    manager.close()
    reopened = LogManager.open(tmp_path)
    assert reopened.get(ORDERS).topic_id == topic_id
    reopened.close()


def test_an_empty_partition_metadata_file_means_no_topic_id(tmp_path):
    directory = tmp_path / "orders-0"
    directory.mkdir()
    (directory / PARTITION_METADATA).write_text("")  # Kafka creates it empty first
    manager = LogManager.open(tmp_path)
    assert manager.get(ORDERS).topic_id is None
    manager.close()


@pytest.mark.parametrize(
    "text",
    [
        "version: 1\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA",
        "version: 0\n",
        "version: 0\ntopic: AAAAAAAAAAAAAAAAAAAAAA",
        "version: 0\ntopic_id: AAAA",
        "version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAA+",
        "version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAB",  # not canonical: 2 stray bits
        "topic_id: AAAAAAAAAAAAAAAAAAAAAA\nversion: 0",
    ],
)
def test_a_malformed_partition_metadata_file_is_a_storage_error(tmp_path, text):
    directory = tmp_path / "orders-0"
    directory.mkdir()
    (directory / PARTITION_METADATA).write_text(text)
    with pytest.raises(StorageError, match=PARTITION_METADATA):
        LogManager.open(tmp_path)


def test_the_cache_files_go_with_a_deleted_log(tmp_path):
    manager = LogManager.open(tmp_path)
    manager.create(ORDERS, topic_id=uuid.uuid4()).append(batch([b"a"]), leader_epoch=1)
    manager.delete(ORDERS)
    assert not (tmp_path / "orders-0").exists()
    manager.close()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()


# Properties ------------------------------------------------------------------------------


def reference_end_offset_for(
    entries: list[EpochEntry], epoch: int, log_end: int
) -> tuple[int, int]:
    """Kafka's endOffsetFor, spelled out with linear scans."""
    if epoch < 0 or not entries:
        return -1, -1
    if entries[-1].epoch == epoch:
        return epoch, log_end
    higher = [e for e in entries if e.epoch > epoch]
    floor = [e for e in entries if e.epoch <= epoch]
    if not higher:
        return -1, -1
    if not floor:
        return epoch, higher[0].start_offset
    return floor[-1].epoch, higher[0].start_offset


cache_ops = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.integers(0, 12), st.integers(0, 60)),
        st.tuples(st.just("end"), st.integers(0, 60)),
        st.tuples(st.just("start"), st.integers(0, 60)),
        st.tuples(st.just("clear")),
    ),
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(cache_ops, st.integers(-2, 14))
def test_cache_stays_ordered_and_reloads_to_itself(ops, probe):
    with tempfile.TemporaryDirectory() as name:
        path = Path(name) / LEADER_EPOCH_CHECKPOINT
        cache = LeaderEpochCache.load(path)
        for op in ops:
            before = cache.entries
            if op[0] == "assign":
                cache.assign(op[1], op[2])
                if op[1] > (before[-1].epoch if before else -1):
                    kept = [e for e in before if e.start_offset < op[2]]
                    assert cache.entries == [*kept, (op[1], op[2])]
                else:
                    assert cache.entries == before
            elif op[0] == "end":
                cache.truncate_from_end(op[1])
                assert cache.entries == [e for e in before if e.start_offset < op[1]]
            elif op[0] == "start":
                cache.truncate_from_start(op[1])
                assert cache.entries == trimmed(before, op[1])
            else:
                cache.clear()
            entries = cache.entries
            for a, b in itertools.pairwise(entries):
                assert a.epoch < b.epoch and a.start_offset < b.start_offset
            assert cache.latest_epoch == (entries[-1].epoch if entries else -1)
            log_end = (entries[-1].start_offset if entries else 0) + 5
            assert cache.end_offset_for(probe, log_end) == reference_end_offset_for(
                entries, probe, log_end
            )
        assert LeaderEpochCache.load(path).entries == cache.entries


log_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 2), st.integers(1, 4)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("restart"), st.booleans()),
    ),
    min_size=1,
    max_size=15,
)


@settings(max_examples=40, deadline=None)
@given(log_ops)
def test_the_cache_matches_the_epochs_stored_in_the_log(ops):
    """Leader appends under rising epochs, truncations and restarts (clean or not): the
    cache always says where each epoch's first surviving batch starts."""
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name) / "t-0"
        clock = ManualClock()
        log = PartitionLog.open(directory, SMALL, clock=clock)
        epoch = 0
        for op in ops:
            if op[0] == "append":
                epoch += op[1]
                log.append(batch([b"r" * 20] * op[2]), leader_epoch=epoch)
            elif op[0] == "truncate":
                log.truncate_to(int(log.log_end_offset * op[1]))
            else:
                if op[1]:
                    log.close()
                end = log.log_end_offset
                log = PartitionLog.open(
                    directory, SMALL, clock=clock, clean_shutdown=op[1], recovery_point=end
                )
            assert log.leader_epochs.entries == epochs_in_log(log)
        assert [r.offset for r in read_all(log)] == list(range(log.log_end_offset))
