"""Log compaction: what a pass keeps (the latest committed record of each key at its own
offset, tombstones until delete.retention.ms, producers' last batches, transaction markers
until their transaction's data is gone), what it never touches (the head, offsets at or
above the last stable offset, young segments), how the swap treats readers and crashes, how
the broker's log manager drives it, and a property test against a model of the uncompacted
log."""

from __future__ import annotations

import dataclasses
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from directlog.records.batch import (
    Record,
    build_batch,
    decode_records,
    iter_batches,
    read_header,
    verify_crc,
)
from directlog.records.compression import Compression
from directlog.records.errors import InvalidRecordError
from directlog.records.markers import ABORT, control_type
from directlog.topics import TopicPartition
from services.broker.storage import LogConfig, PartitionLog
from services.broker.storage.cleaner import (
    CleanResult,
    clean,
    find_cleanable,
    read_checkpoint,
)
from services.broker.storage.log_manager import LogManager
from services.broker.storage.segment import LogSegment, finish_interrupted_swaps
from tests.storage.helpers import T0, ManualClock, tree_digest

DAY = 86_400_000
COMPACT = LogConfig(
    segment_bytes=512,
    index_interval_bytes=64,
    cleanup_policy="compact",
    min_cleanable_dirty_ratio=0.0,
)

Pair = tuple[bytes | None, bytes | None]


def keyed(pairs: list[Pair], *, ts: int = T0, **kwargs: object) -> bytes:
    """A producer batch of (key, value) records, all at timestamp `ts`."""
    records = [Record(i, ts, key, value) for i, (key, value) in enumerate(pairs)]
    return build_batch(records, **kwargs)  # type: ignore[arg-type]


def fetch(log: PartitionLog, start: int = 0, max_bytes: int = 300) -> list[Record]:
    """Every record at or after `start`, read through the fetch path in small reads that
    move on by each read's next offset (compaction leaves offsets without records)."""
    out: list[Record] = []
    offset = start
    while offset < log.log_end_offset:
        read = log.read(offset, max_bytes)
        data = read.records.read()
        if not data:
            break
        for position, header in iter_batches(data):
            verify_crc(data, position, header)
            out += [r for r in decode_records(data, position, header) if r.offset >= start]
        assert read.next_offset > offset
        offset = read.next_offset
    return out


def latest_per_key(records: list[Record]) -> list[Record]:
    """The model of a fully compacted log: each key's last record, in offset order."""
    latest = {record.key: record for record in records}
    return sorted(latest.values(), key=lambda record: record.offset)


def clean_now(log: PartitionLog, now: int = T0, **kwargs: object) -> CleanResult | None:
    """One pass if one is due."""
    cleanable = find_cleanable(log, now)
    if cleanable is None or not cleanable.due:
        return None
    return clean(log, cleanable, now, **kwargs)  # type: ignore[arg-type]


def clean_fully(log: PartitionLog, now: int = T0, **kwargs: object) -> None:
    """Passes until none is due (a small key map takes several)."""
    for _ in range(1000):
        result = clean_now(log, now, **kwargs)
        if result is None:
            return
        assert result.complete
    raise AssertionError("cleaning never finished")


def fill(log: PartitionLog, count: int, keys: int, *, ts: int = T0) -> list[Record]:
    """`count` single-record appends cycling over `keys` keys; the log is then rolled and
    fully committed, so everything but the empty head is cleanable."""
    appended = []
    for i in range(count):
        key, value = b"k%d" % (i % keys), b"v%d" % i
        result = log.append(keyed([(key, value)], ts=ts))
        appended.append(Record(result.first_offset, ts, key, value))
    log.roll()
    log.update_high_watermark(log.log_end_offset)
    return appended


def log_bytes_of(batch: bytes, *, base_offset: int, epoch: int) -> bytes:
    """`batch` as the log stores it: base offset and partition leader epoch stamped."""
    stamped = bytearray(batch)
    stamped[0:8] = base_offset.to_bytes(8, "big")
    stamped[12:16] = epoch.to_bytes(4, "big", signed=True)
    return bytes(stamped)


# What a pass keeps -----------------------------------------------------------------------


def test_the_latest_record_of_each_key_stays_at_its_offset(open_log):
    log = open_log(COMPACT)
    appended = fill(log, 60, keys=5)
    assert len(log.segments) > 4
    end, start = log.log_end_offset, log.log_start_offset
    result = clean_now(log)
    assert result is not None and result.complete and result.records_removed == 55
    assert fetch(log) == latest_per_key(appended)
    assert [r.offset for r in fetch(log)] == list(range(55, 60))
    assert (log.log_end_offset, log.log_start_offset) == (end, start)
    assert read_checkpoint(log.directory) == log.segments[-1].base_offset
    assert clean_now(log) is None  # nothing dirty any more


def test_fetches_from_any_offset_see_the_compacted_records_after_it(open_log):
    log = open_log(COMPACT)
    appended = fill(log, 40, keys=7)
    clean_now(log)
    expected = latest_per_key(appended)
    for start in range(0, log.log_end_offset + 1):
        assert fetch(log, start, max_bytes=1) == [r for r in expected if r.offset >= start]


def test_the_first_segment_stays_so_the_log_start_does_not_move(open_log, tmp_path):
    log = open_log(COMPACT)
    fill(log, 40, keys=2)
    first = log.segments[0].base_offset
    clean_now(log)
    assert log.segments[0].base_offset == first == log.log_start_offset
    assert log.segments[0].is_empty()
    log.close()
    reopened = open_log(COMPACT, log_start_offset=0, clean_shutdown=True, recovery_point=40)
    assert reopened.log_start_offset == 0 and reopened.segments[0].is_empty()
    assert [r.offset for r in fetch(reopened)] == [38, 39]
    reopened.close()
    unclean = open_log(COMPACT, log_start_offset=0)
    assert [r.offset for r in fetch(unclean)] == [38, 39]


def test_cleaned_segments_fit_segment_bytes_and_small_ones_merge(open_log):
    log = open_log(COMPACT)
    appended = fill(log, 120, keys=30)
    before = len(log.segments)
    clean_now(log)
    assert len(log.segments) < before
    assert all(segment.size <= COMPACT.segment_bytes for segment in log.segments)
    assert fetch(log) == latest_per_key(appended)
    for segment in log.segments:  # each index entry points at the batch holding its offset
        index = segment.offset_index
        for offset, position in zip(index.keys, index.values, strict=True):
            header = read_header(segment.log.read(position, 61), 0, segment.size - position)
            assert header.base_offset == offset


def test_the_head_and_offsets_at_or_above_the_high_watermark_are_untouched(open_log):
    log = open_log(COMPACT)
    for i in range(30):
        log.append(keyed([(b"k", b"v%d" % i)]))
    segments = log.segments
    log.update_high_watermark(segments[2].next_offset)  # inside the fourth segment
    head_files = [segments[-1].log.path.read_bytes()]
    clean_now(log)
    after = log.segments
    assert after[-1] is segments[-1] and head_files == [after[-1].log.path.read_bytes()]
    assert all(s in after for s in segments[3:])  # the segment the watermark cuts stays
    kept = fetch(log)
    assert [r.offset for r in kept if r.offset < segments[3].base_offset] == [
        segments[3].base_offset - 1
    ]
    assert [r.offset for r in kept if r.offset >= segments[3].base_offset] == list(
        range(segments[3].base_offset, 30)
    )


def test_records_younger_than_min_compaction_lag_wait(open_log, clock):
    log = open_log(dataclasses.replace(COMPACT, min_compaction_lag_ms=60_000))
    old = fill(log, 20, keys=2, ts=T0 - 120_000)
    young = [log.append(keyed([(b"k0", b"young%d" % i)], ts=T0)) for i in range(20)]
    log.roll()
    log.update_high_watermark(log.log_end_offset)
    clean_now(log, clock.now)
    kept = fetch(log)
    # The old segments were cleaned against the map of the old part only.
    assert [r.value for r in kept if r.offset < 20] == [old[18].value, old[19].value]
    assert len([r for r in kept if r.offset >= 20]) == len(young)


def test_dirty_ratio_and_max_compaction_lag_decide_when_a_log_is_due(open_log, clock):
    config = LogConfig(segment_bytes=512, cleanup_policy="compact", min_cleanable_dirty_ratio=0.9)
    log = open_log(config)
    fill(log, 40, keys=40)
    assert clean_now(log) is not None  # all dirty: ratio 1
    for i in range(3):
        log.append(keyed([(b"k%d" % i, b"new")]))
    log.roll()
    log.update_high_watermark(log.log_end_offset)
    cleanable = find_cleanable(log, clock.now)
    assert cleanable is not None and cleanable.dirty_ratio < 0.9 and not cleanable.due
    log.config = dataclasses.replace(config, max_compaction_lag_ms=1000)
    clock.advance(1001)
    cleanable = find_cleanable(log, clock.now)
    assert cleanable is not None and cleanable.overdue and cleanable.due


def test_tombstones_outlive_older_values_by_delete_retention_ms(open_log, clock):
    log = open_log(COMPACT)
    log.append(keyed([(b"gone", b"v1"), (b"kept", b"v1")]))
    log.append(keyed([(b"gone", None)]))
    fill(log, 10, keys=1)  # k0 records after the tombstone
    clean_now(log, clock.now)
    assert [(r.key, r.value) for r in fetch(log)] == [
        (b"kept", b"v1"),
        (b"gone", None),
        (b"k0", b"v9"),
    ]
    clock.advance(DAY + 1)
    assert clean_now(log, clock.now) is None  # nothing dirty: the tombstone waits for a pass
    fill(log, 1, keys=1)
    clean_now(log, clock.now)
    assert [(r.key, r.value) for r in fetch(log)] == [(b"kept", b"v1"), (b"k0", b"v0")]


def test_records_without_a_key_are_dropped_and_refused_on_produce(open_log):
    log = open_log(LogConfig())  # written before the topic became compacted
    data = keyed([(b"a", b"1"), (None, b"2")])
    log.append(data)
    log.config = COMPACT
    with pytest.raises(InvalidRecordError, match=r"records \[1\] have no key") as refused:
        log.append(data)
    assert refused.value.record_errors == (
        (1, "Compacted topic cannot accept message without key"),
    )
    log.append(keyed([(b"a", b"1")], compression=Compression.GZIP))  # keyed: accepted
    fill(log, 2, keys=1)
    clean_now(log)
    assert [(r.offset, r.key) for r in fetch(log)] == [(2, b"a"), (4, b"k0")]


def test_a_rebuilt_batch_keeps_its_header_and_codec(open_log):
    log = open_log(COMPACT)
    original = keyed(
        [(b"a", b"1"), (b"b", b"1"), (b"c", b"1"), (b"d", b"1")],
        compression=Compression.ZSTD,
        producer_id=42,
        producer_epoch=3,
        base_sequence=0,
    )
    log.append(original, leader_epoch=5)
    log.append(keyed([(b"b", b"2"), (b"d", b"2")], ts=T0 + 7))
    log.roll()
    log.update_high_watermark(log.log_end_offset)
    clean_now(log)
    data = log.read(0, 10_000).records.read()
    (position, header), (_, second) = list(iter_batches(data))
    verify_crc(data, position, header)
    before = read_header(log_bytes_of(original, base_offset=0, epoch=5))
    assert header._replace(crc=0, batch_length=0, records_count=0) == before._replace(
        crc=0, batch_length=0, records_count=0
    )
    assert header.records_count == 2 and header.compression is Compression.ZSTD
    assert (header.base_offset, header.last_offset, header.partition_leader_epoch) == (0, 3, 5)
    assert [(r.offset, r.key) for r in decode_records(data, position, header)] == [
        (0, b"a"),
        (2, b"c"),
    ]
    assert second.base_offset == 4


def test_an_emptied_batch_stays_only_as_its_producers_last(open_log):
    log = open_log(COMPACT)
    producer = {"producer_id": 7, "producer_epoch": 0}
    log.append(keyed([(b"a", b"1")], base_sequence=0, **producer))  # offset 0
    log.append(keyed([(b"a", b"2")], base_sequence=1, **producer))  # offset 1, its last
    log.append(keyed([(b"a", b"3")], producer_id=8, producer_epoch=0, base_sequence=0))  # 2
    log.append(keyed([(b"a", b"4")], producer_id=8, producer_epoch=0, base_sequence=1))  # 3
    log.append(keyed([(b"b", b"x"), (b"a", b"5")]))  # 4-5, no producer id
    log.append(keyed([(b"b", b"y")]))  # 6
    log.roll()
    log.update_high_watermark(log.log_end_offset)
    clean_now(log)
    data = b"".join(s.log.read(0, s.size) for s in log.segments)
    headers = [header for _, header in iter_batches(data)]
    assert [(h.base_offset, h.last_offset, h.records_count, h.producer_id) for h in headers] == [
        (1, 1, 0, 7),
        (3, 3, 0, 8),
        (4, 5, 1, -1),
        (6, 6, 1, -1),
    ]
    empty = headers[0]
    assert (empty.base_sequence, empty.producer_epoch, empty.compression) == (
        1,
        0,
        Compression.NONE,
    )
    assert empty.base_timestamp == empty.max_timestamp == T0
    for position, header in iter_batches(data):
        verify_crc(data, position, header)
    assert [(r.offset, r.value) for r in fetch(log)] == [(5, b"5"), (6, b"y")]


# Transactions ------------------------------------------------------------------------------


class Txns:
    """Transactional appends to a log, each producer with its own sequence."""

    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self.sequences: dict[int, int] = {}

    def send(self, producer_id: int, pairs: list[Pair], *, epoch: int = 0) -> int:
        """One transactional batch; its base offset."""
        sequence = self.sequences.get(producer_id, 0)
        self.sequences[producer_id] = sequence + len(pairs)
        batch = keyed(
            pairs,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=sequence,
            transactional=True,
        )
        return self.log.append(batch, leader_epoch=0).first_offset

    def end(self, producer_id: int, *, commit: bool, epoch: int = 0) -> int:
        """The producer's marker; its offset."""
        return self.log.append_marker(producer_id, epoch, commit, 0, leader_epoch=0).first_offset

    def settle(self) -> None:
        """Roll and replicate everything, so all but the empty head may be cleaned."""
        self.log.roll()
        self.log.update_high_watermark(self.log.log_end_offset)


def stored(log: PartitionLog) -> list[tuple[int, int, bool]]:
    """(base offset, record count, is control) of every batch on disk."""
    data = b"".join(s.log.read(0, s.size) for s in log.segments)
    return [(h.base_offset, h.records_count, h.is_control) for _, h in iter_batches(data)]


def read_committed(log: PartitionLog) -> list[tuple[bytes | None, bytes | None]]:
    return [(r.key, r.value) for r in read_committed_records(log)]


def read_committed_records(log: PartitionLog) -> list[Record]:
    """What a read_committed consumer reading the whole log in one fetch gets, filtering as
    Kafka's consumers do: from an aborted transaction's first offset on, the transactional
    batches of its producer are skipped until that producer's ABORT marker."""
    data = b"".join(s.log.read(0, s.size) for s in log.segments)
    aborted = sorted(log.aborted_transactions(0, log.log_end_offset), key=lambda e: e.first_offset)
    skipping: set[int] = set()
    out: list[Record] = []
    for position, header in iter_batches(data):
        while aborted and aborted[0].first_offset <= header.last_offset:
            skipping.add(aborted.pop(0).producer_id)
        records = decode_records(data, position, header)
        if header.is_control:  # consumers never deliver control records
            if records and control_type(records[0].key) == ABORT:
                skipping.discard(header.producer_id)
        elif not (header.is_transactional and header.producer_id in skipping):
            out += records
    return out


def test_an_aborted_value_never_shadows_the_committed_one(open_log):
    log = open_log(COMPACT)
    txns = Txns(log)
    txns.send(1, [(b"a", b"committed")])  # 0
    txns.end(1, commit=True)  # 1
    txns.send(2, [(b"a", b"aborted"), (b"b", b"aborted")])  # 2-3
    txns.end(2, commit=False)  # 4
    txns.send(2, [(b"c", b"later")])  # 5: producer 2's last batch
    txns.end(2, commit=True)  # 6
    txns.settle()
    assert read_committed(log) == [(b"a", b"committed"), (b"c", b"later")]

    result = clean_now(log)
    assert result is not None and result.complete and result.records_removed == 2
    # The aborted batch is gone, not emptied; the markers are young: they stay.
    assert stored(log) == [(0, 1, False), (1, 1, True), (4, 1, True), (5, 1, False), (6, 1, True)]
    assert [(r.offset, r.value) for r in fetch(log) if r.offset in (0, 5)] == [
        (0, b"committed"),
        (5, b"later"),
    ]
    assert read_committed(log) == [(b"a", b"committed"), (b"c", b"later")]
    assert [(e.producer_id, e.last_offset) for e in log.aborted_transactions(0, 100)] == [(2, 4)]


@pytest.mark.parametrize("segment_bytes", [100, 4096])
def test_markers_go_after_delete_retention_once_their_transactions_are_gone(
    open_log, clock, segment_bytes
):
    """Past delete.retention.ms a COMMIT marker goes in the pass that removes the last
    record of its transaction; an ABORT marker in that pass only if its batches went in an
    earlier swap (one batch per segment and group here), otherwise in the next pass, its
    index entry first."""
    log = open_log(dataclasses.replace(COMPACT, segment_bytes=segment_bytes))
    txns = Txns(log)
    txns.send(1, [(b"a", b"1")])  # 0, shadowed by offset 2
    txns.end(1, commit=True)  # 1
    txns.send(1, [(b"a", b"2")])  # 2, producer 1's last batch
    txns.end(1, commit=True)  # 3
    txns.send(2, [(b"b", b"aborted")])  # 4
    txns.end(2, commit=False)  # 5
    txns.send(2, [(b"c", b"1")])  # 6, producer 2's last batch
    txns.end(2, commit=True)  # 7
    txns.settle()
    end = log.log_end_offset
    clock.advance(DAY + 1)
    clean_now(log, clock.now)
    assert [o for o, _, control in stored(log) if not control] == [2, 6]
    separate_groups = segment_bytes == 100
    assert [o for o, _, control in stored(log) if control] == (
        [3, 7] if separate_groups else [3, 5, 7]
    )
    assert [e.last_offset for e in log.aborted_transactions(0, end)] == (
        [] if separate_groups else [5]
    )
    log.append(keyed([(b"d", b"2")]))  # new dirty data, for another pass
    txns.settle()
    clean_now(log, clock.now)
    assert [o for o, _, control in stored(log) if control] == [3, 7]
    assert log.aborted_transactions(0, log.log_end_offset) == []
    assert read_committed(log) == [(b"a", b"2"), (b"c", b"1"), (b"d", b"2")]
    assert log.log_start_offset == 0


def test_an_abort_marker_stays_while_its_producers_last_batch_does(open_log, clock):
    """The last batch of a producer stays, emptied even when aborted, and keeps its
    marker and index entry; a marker with a newer producer epoch than the producer's last
    data batch (a timed-out transaction's abort) stays as its last."""
    log = open_log(COMPACT)
    txns = Txns(log)
    txns.send(1, [(b"a", b"aborted")])  # 0, producer 1's only batch
    txns.end(1, commit=False)  # 1
    txns.send(2, [(b"a", b"committed")])  # 2
    txns.end(2, commit=True)  # 3
    txns.end(2, commit=False, epoch=1)  # 4: the coordinator bumped the epoch
    txns.send(3, [(b"z", b"1")])  # 5
    txns.end(3, commit=False, epoch=1)  # 6: an older epoch's data, this epoch's abort
    log.append(keyed([(b"z", b"2")]))  # 7: z=1 would be shadowed anyway
    txns.settle()
    clock.advance(DAY + 1)
    clean_now(log, clock.now)
    assert stored(log) == [
        (0, 0, False),  # emptied, kept for producer 1's sequence
        (1, 1, True),
        (2, 1, False),
        (3, 1, True),
        (4, 1, True),
        (5, 0, False),
        (6, 1, True),
        (7, 1, False),
    ]
    assert [e.last_offset for e in log.aborted_transactions(0, 100)] == [1, 6]
    assert read_committed(log) == [(b"a", b"committed"), (b"z", b"2")]


def test_open_transactions_are_never_cleaned(open_log):
    log = open_log(COMPACT)
    txns = Txns(log)
    log.append(keyed([(b"a", b"1")]))  # 0
    log.roll()
    txns.send(1, [(b"a", b"open")])  # 1, open
    log.roll()
    log.append(keyed([(b"a", b"3")]))  # 2
    txns.settle()
    assert log.last_stable_offset == 1
    cleanable = find_cleanable(log, T0)
    assert cleanable is not None and cleanable.end == 1
    clean_now(log)
    assert [(r.offset, r.value) for r in fetch(log)] == [(0, b"1"), (1, b"open"), (2, b"3")]

    marker = txns.end(1, commit=False)  # 3
    log.update_high_watermark(marker)  # written, not yet replicated: still unstable
    assert find_cleanable(log, T0) is None
    txns.settle()
    clean_now(log)
    # Offset 0 went (a later a); producer 1's last batch, aborted, stays empty.
    assert stored(log) == [(1, 0, False), (2, 1, False), (3, 1, True)]
    assert read_committed(log) == [(b"a", b"3")]


def test_a_small_key_map_cleans_in_several_passes(open_log):
    log = open_log(COMPACT)
    appended = fill(log, 80, keys=20)
    passes = 0
    while (result := clean_now(log, max_keys=6)) is not None:
        passes += 1
        assert result.complete
    assert passes > 3
    assert fetch(log) == latest_per_key(appended)


def test_a_stopped_pass_leaves_the_log_as_it_was(open_log, tmp_path):
    log = open_log(COMPACT)
    appended = fill(log, 30, keys=3)
    digest = tree_digest(tmp_path)
    result = clean_now(log, stop=lambda: True)
    assert result is not None and not result.complete
    assert tree_digest(tmp_path) == digest
    assert fetch(log) == appended


def test_a_pass_that_meets_a_changed_log_stops_without_swapping(open_log, clock):
    log = open_log(dataclasses.replace(COMPACT, cleanup_policy="compact,delete"))
    appended = fill(log, 30, keys=3)
    cleanable = find_cleanable(log, clock.now)
    assert cleanable is not None
    clock.advance(8 * DAY)
    assert log.delete_retained_segments() > 0  # retention gets there first
    result = clean(log, cleanable, clock.now)
    assert not result.complete
    assert not list(log.directory.glob("*.cleaned")) and not list(log.directory.glob("*.swap"))
    assert fetch(log, log.log_start_offset) == [
        r for r in appended if r.offset >= log.log_start_offset
    ]


# Retention under cleanup.policy ----------------------------------------------------------


def test_retention_deletes_only_when_the_policy_includes_delete(open_log, clock):
    log = open_log(dataclasses.replace(COMPACT, retention_ms=1000))
    fill(log, 30, keys=30)
    clock.advance(2000)
    assert log.delete_retained_segments() == 0
    log.config = dataclasses.replace(log.config, cleanup_policy="compact,delete")
    assert log.delete_retained_segments() > 0


def test_an_empty_first_segment_does_not_hold_retention_back(open_log, clock):
    log = open_log(dataclasses.replace(COMPACT, cleanup_policy="delete,compact"))
    fill(log, 40, keys=2)
    clean_now(log, clock.now)
    assert log.segments[0].is_empty()
    # An empty segment's age is its file's: move the clock to the wall clock's time.
    clock.now = time.time_ns() // 1_000_000
    assert log.delete_retained_segments() == 0  # nothing expired, no size limit
    clock.advance(8 * DAY)
    inactive = len(log.segments) - 1
    assert log.delete_retained_segments() == inactive
    assert log.log_start_offset == log.log_end_offset


# The swap: readers and crashes -----------------------------------------------------------


def test_a_reader_keeps_the_slice_it_got_before_the_swap(open_log):
    log = open_log(COMPACT)
    fill(log, 30, keys=3)
    before = log.read(0, 10_000)
    old_bytes = before.records.read()
    clean_now(log)
    assert log.read(0, 10_000).records.read() != old_bytes
    assert before.records.read() == old_bytes  # the old file's descriptor still serves it
    sent = _sendfile(before.records.fileno(), before.records.position, before.records.size)
    assert sent == old_bytes
    assert [r.offset for r in fetch(log)] == [27, 28, 29]


def _sendfile(fd: int, position: int, size: int) -> bytes:
    """What os.sendfile would put on the wire for this slice (through a pipe-like file)."""
    with tempfile.TemporaryFile() as out:
        done = 0
        while done < size:
            done += os.sendfile(out.fileno(), fd, position + done, size - done)
        out.seek(0)
        return out.read()


def test_concurrent_fetches_only_ever_see_original_records(open_log):
    log = open_log(COMPACT)
    original = {i: Record(i, T0, b"k%d" % (i % 9), b"v%d" % i) for i in range(260)}
    appended = fill(log, 200, keys=9)
    failures: list[BaseException] = []
    done = threading.Event()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not done.is_set():
                start = rng.randrange(0, log.log_end_offset)
                for record in fetch(log, start, max_bytes=rng.choice([1, 200, 4000])):
                    assert original[record.offset] == record
        except BaseException as exc:  # reported below
            failures.append(exc)

    readers = [threading.Thread(target=reader, args=(seed,)) for seed in range(3)]
    for thread in readers:
        thread.start()
    try:
        for i in range(200, 260):
            log.append(keyed([(original[i].key, original[i].value)]))
            appended.append(original[i])
            if i % 10 == 0:
                log.roll()
                log.update_high_watermark(log.log_end_offset)
                clean_now(log, max_keys=4)
    finally:
        done.set()
        for thread in readers:
            thread.join()
    assert not failures, failures[0]
    log.roll()
    log.update_high_watermark(log.log_end_offset)
    clean_fully(log)
    assert fetch(log) == latest_per_key(appended)


class Crash(Exception):
    """Stands for the process dying at a step of the swap."""


def _crash_at(step: int, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Make the `step`-th rename or segment deletion from now on raise Crash; returns a
    counter of the steps taken (step 0: never crash, just count)."""
    taken = 0
    real_replace, real_delete = os.replace, LogSegment.delete

    def counted(real: Callable[..., None]) -> Callable[..., None]:
        def step_then(*args: object) -> None:
            nonlocal taken
            taken += 1
            if taken == step:
                raise Crash(f"step {step}")
            real(*args)

        return step_then

    monkeypatch.setattr(os, "replace", counted(real_replace))
    monkeypatch.setattr(LogSegment, "delete", counted(real_delete))
    return lambda: taken


def _crash_log(directory: Path, clock: ManualClock) -> tuple[PartitionLog, list[Record]]:
    log = PartitionLog.open(directory, COMPACT, clock=clock)
    log.append(keyed([(b"t", b"old")]))
    log.append(keyed([(b"t", None)]))  # a tombstone that expires
    appended = [Record(0, T0, b"t", b"old"), Record(1, T0, b"t", None)]
    return log, appended + fill(log, 60, keys=4)


def test_a_crash_at_any_step_of_a_pass_leaves_a_log_that_opens_and_finishes(
    tmp_path, clock, monkeypatch
):
    clock.advance(DAY + 1)  # the tombstone may go
    counting = tmp_path / "count" / "t-0"
    log, appended = _crash_log(counting, clock)
    steps = _crash_at(0, monkeypatch)
    clean_now(log, clock.now)
    total = steps()
    monkeypatch.undo()
    assert total > 6
    final = [r for r in latest_per_key(appended) if r.value is not None]
    assert fetch(log) == final

    for step in range(1, total + 1):
        directory = tmp_path / str(step) / "t-0"
        log, appended = _crash_log(directory, clock)
        end = log.log_end_offset
        _crash_at(step, monkeypatch)
        with pytest.raises(Crash):
            clean_now(log, clock.now)
        monkeypatch.undo()
        reopened = PartitionLog.open(directory, COMPACT, clock=clock)
        assert not [p for p in directory.iterdir() if p.suffix in (".cleaned", ".swap")]
        assert (reopened.log_start_offset, reopened.log_end_offset) == (0, end)
        records = fetch(reopened)
        original = {r.offset: r for r in appended}
        assert all(original[r.offset] == r for r in records), step
        assert set(final) <= set(records), step  # every key's latest record survived
        assert (b"t", b"old") not in [(r.key, r.value) for r in records] or (
            Record(1, T0, b"t", None) in records
        ), step  # the deleted key never comes back
        reopened.update_high_watermark(reopened.log_end_offset)
        clean_fully(reopened, clock.now)
        assert fetch(reopened) == final, step


def _txn_crash_log(directory: Path, config: LogConfig, clock: ManualClock) -> PartitionLog:
    log = PartitionLog.open(directory, config, clock=clock)
    txns = Txns(log)
    txns.send(1, [(b"a", b"1")])
    txns.end(1, commit=True)
    txns.send(2, [(b"a", b"aborted"), (b"b", b"aborted")])
    txns.end(2, commit=False)
    txns.send(1, [(b"a", b"2")])
    txns.end(1, commit=True)
    txns.send(2, [(b"c", b"1")])
    txns.end(2, commit=True)
    log.append(keyed([(b"z", b"1")]))
    txns.settle()
    return log


def _markers_of_entries_exist(log: PartitionLog) -> bool:
    data = b"".join(s.log.read(0, s.size) for s in log.segments)
    markers = {h.base_offset for _, h in iter_batches(data) if h.is_control}
    return all(e.last_offset in markers for e in log.aborted_transactions(0, 1 << 62))


@pytest.mark.parametrize("segment_bytes", [100, 4096])  # a group per batch, or one group
def test_a_crash_at_any_step_of_a_transactional_pass_keeps_every_transaction_decided(
    tmp_path, clock, monkeypatch, segment_bytes
):
    """Whatever step of a pass that drops aborted data, markers and index entries a crash
    hits, the reopened log has every transaction ended (the last stable offset reaches the
    high watermark), no index entry without its marker, and read_committed sees no aborted
    record and every key's latest committed one."""
    config = dataclasses.replace(COMPACT, segment_bytes=segment_bytes)
    later = clock.now + DAY + 1  # the markers, written now, may go then
    final = [(b"a", b"2"), (b"c", b"1"), (b"z", b"1")]
    log = _txn_crash_log(tmp_path / "count" / "t-0", config, clock)
    steps = _crash_at(0, monkeypatch)
    clean_now(log, later)
    total = steps()
    monkeypatch.undo()
    assert read_committed(log) == final
    # Its marker went too, unless it shared a group with the aborted batch.
    assert len(log.aborted_transactions(0, log.log_end_offset)) == (segment_bytes > 100)

    for step in range(1, total + 1):
        directory = tmp_path / str(step) / "t-0"
        log = _txn_crash_log(directory, config, clock)
        end = log.log_end_offset
        _crash_at(step, monkeypatch)
        with pytest.raises(Crash):
            clean_now(log, later)
        monkeypatch.undo()
        reopened = PartitionLog.open(directory, config, clock=clock)
        reopened.update_high_watermark(end)
        assert reopened.last_stable_offset == end, step
        assert _markers_of_entries_exist(reopened), step
        seen = read_committed(reopened)
        assert set(final) <= set(seen) and (b"b", b"aborted") not in seen, step
        clean_fully(reopened, later)
        assert read_committed(reopened) == final, step
        assert _markers_of_entries_exist(reopened), step


def test_leftovers_of_an_interrupted_swap_are_completed_or_discarded(tmp_path):
    directory = tmp_path / "t-0"
    directory.mkdir()
    for name in ("00000000000000000000.log.cleaned", "00000000000000000000.index.swap"):
        (directory / name).write_bytes(b"partial")
    finish_interrupted_swaps(directory)
    assert list(directory.iterdir()) == []

    complete = keyed([(b"a", b"1"), (b"b", b"2")])
    (directory / "00000000000000000000.log").write_bytes(b"old segment, replaced")
    (directory / "00000000000000000001.log").write_bytes(b"old segment, inside the swap")
    (directory / "00000000000000000002.log").write_bytes(b"old segment, after the swap")
    (directory / "00000000000000000000.log.swap").write_bytes(complete)
    finish_interrupted_swaps(directory)
    assert sorted(p.name for p in directory.iterdir()) == [
        "00000000000000000000.log",
        "00000000000000000002.log",
    ]
    assert (directory / "00000000000000000000.log").read_bytes() == complete


# The broker's driver ---------------------------------------------------------------------


def test_the_log_manager_compacts_the_log_that_needs_it_most(tmp_path, clock):
    offsets = TopicPartition("__consumer_offsets", 0)
    orders = TopicPartition("orders", 0)
    compact = LogConfig.from_properties(
        {"cleanup.policy": "compact", "segment.bytes": "512", "min.cleanable.dirty.ratio": "0.1"}
    )
    manager = LogManager.open(
        tmp_path, lambda topic: compact if topic.startswith("__") else LogConfig(), clock=clock
    )
    compacted, plain = manager.create(offsets), manager.create(orders)
    appended = fill(compacted, 50, keys=5)
    fill(plain, 50, keys=5)
    plain_files = tree_digest(plain.directory)
    result = manager.clean_compacted()
    assert result is not None and result.complete
    assert fetch(compacted) == latest_per_key(appended)
    assert tree_digest(plain.directory) == plain_files
    assert manager.clean_compacted() is None
    manager.delete(offsets)
    manager.close()


def test_a_failing_log_is_set_aside(tmp_path, clock, caplog):
    manager = LogManager.open(tmp_path, lambda topic: COMPACT, clock=clock)
    broken = manager.create(TopicPartition("broken", 0))
    fill(broken, 30, keys=3)
    first = broken.segments[0]
    with open(first.log.path, "r+b") as damaged:  # a record length that overruns its batch
        damaged.seek(61)
        damaged.write(b"\x7f")
    assert manager.clean_compacted() is None
    assert "compaction of broken-0 failed" in caplog.text
    assert manager.clean_compacted() is None  # not tried again
    manager.close()


# The property ----------------------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.lists(
                st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"]), st.booleans()),
                min_size=1,
                max_size=4,
            ),
            st.sampled_from([Compression.NONE, Compression.LZ4]),
        ),
        st.tuples(st.just("roll")),
        st.tuples(st.just("commit"), st.integers(0, 100)),
        st.tuples(st.just("clean"), st.integers(1, 8)),
        st.tuples(st.just("reopen"), st.booleans()),
    ),
    max_size=40,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.data())
def test_compaction_keeps_exactly_the_latest_record_of_each_key(ops, data):
    config = dataclasses.replace(COMPACT, segment_bytes=300)
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name) / "t-0"
        log = PartitionLog.open(directory, config, clock=clock)
        appended: list[Record] = []
        for op in ops:
            if op[0] == "append":
                pairs = [(key, None if tomb else b"v%d" % len(appended)) for key, tomb in op[1]]
                first = log.append(keyed(pairs, compression=op[2])).first_offset
                appended += [Record(first + i, T0, k, v) for i, (k, v) in enumerate(pairs)]
            elif op[0] == "roll":
                log.roll()
            elif op[0] == "commit":
                log.update_high_watermark(
                    max(log.high_watermark, log.log_end_offset * op[1] // 100)
                )
            elif op[0] == "clean":
                clean_now(log, max_keys=op[1])
            else:
                log = _reopen(log, directory, config, clock, op[1])
            records = fetch(log)
            original = {r.offset: r for r in appended}
            assert all(original[r.offset] == r for r in records)
            assert set(latest_per_key(appended)) <= set(records)
            assert log.log_end_offset == len(appended)
        log.roll()
        log.update_high_watermark(log.log_end_offset)
        clean_fully(log, max_keys=data.draw(st.integers(1, 8)))
        expected = latest_per_key(appended)
        assert fetch(log) == expected
        start = data.draw(st.integers(0, len(appended)))
        assert fetch(log, start) == [r for r in expected if r.offset >= start]


def _reopen(
    log: PartitionLog, directory: Path, config: LogConfig, clock: ManualClock, clean: bool
) -> PartitionLog:
    """The log opened again after a clean close or, without `clean`, as after a crash."""
    if clean:
        log.close()
    return PartitionLog.open(
        directory,
        config,
        clock=clock,
        clean_shutdown=clean,
        recovery_point=log.recovery_point,
        high_watermark=log.high_watermark,
    )


transactional_operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("send"),
            st.sampled_from([1, 2, 3]),
            st.lists(
                st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]), st.booleans()),
                min_size=1,
                max_size=3,
            ),
        ),
        st.tuples(st.just("end"), st.sampled_from([1, 2, 3]), st.booleans()),
        st.tuples(
            st.just("plain"), st.sampled_from([b"a", b"b", b"c", b"d"]), st.sampled_from([0])
        ),
        st.tuples(st.just("roll")),
        st.tuples(st.just("clean"), st.integers(1, 8)),
        st.tuples(st.just("reopen"), st.booleans()),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transactional_operations)
def test_compaction_keeps_the_latest_committed_record_of_each_key(ops):
    """Random transactional histories: after every step read_committed sees no aborted
    record, every undecided one and each key's latest committed record, and every index
    entry has its marker; cleaned fully past delete.retention.ms, it sees exactly each
    key's latest committed value."""
    config = dataclasses.replace(COMPACT, segment_bytes=300)
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name) / "t-0"
        log = PartitionLog.open(directory, config, clock=clock)
        txns = Txns(log)
        committed: list[Record] = []  # plain records and those of committed transactions
        aborted: list[Record] = []
        open_txns: dict[int, list[Record]] = {}
        for op in ops:
            if op[0] == "send":
                _, producer_id, spec = op
                end = log.log_end_offset
                pairs = [
                    (k, None if tomb else b"v%d" % (end + i)) for i, (k, tomb) in enumerate(spec)
                ]
                first = txns.send(producer_id, pairs)
                open_txns.setdefault(producer_id, []).extend(
                    Record(first + i, T0, k, v) for i, (k, v) in enumerate(pairs)
                )
            elif op[0] == "end" and op[1] in open_txns:
                txns.end(op[1], commit=op[2])
                (committed if op[2] else aborted).extend(open_txns.pop(op[1]))
                committed.sort(key=lambda r: r.offset)  # what "latest" means
            elif op[0] == "plain":
                value = b"p%d" % log.log_end_offset
                first = log.append(keyed([(op[1], value)]), leader_epoch=0).first_offset
                committed.append(Record(first, T0, op[1], value))
            elif op[0] == "roll":
                log.roll()
            elif op[0] == "clean":
                clean_now(log, max_keys=op[1])
            elif op[0] == "reopen":
                log = _reopen(log, directory, config, clock, op[1])
                txns.log = log
            log.update_high_watermark(log.log_end_offset)
            seen = set(read_committed_records(log))
            undecided = [r for records in open_txns.values() for r in records]
            assert not set(aborted) & seen
            assert set(latest_per_key(committed) + undecided) <= seen
            assert _markers_of_entries_exist(log)
        for producer_id in list(open_txns):
            txns.end(producer_id, commit=True)
            committed.extend(open_txns.pop(producer_id))
        txns.settle()
        clean_fully(log, T0 + DAY + 1)
        committed.sort(key=lambda r: r.offset)
        expected = [(r.key, r.value) for r in latest_per_key(committed) if r.value is not None]
        assert read_committed(log) == expected
        assert _markers_of_entries_exist(log)
        reopened = _reopen(log, directory, config, clock, False)
        reopened.update_high_watermark(reopened.log_end_offset)
        assert reopened.last_stable_offset == reopened.log_end_offset
        assert read_committed(reopened) == expected
