"""What a copy ships and what remote retention deletes, and how a broker checks and cuts
remote records: the pieces between the tiering service's walk of a segment and a broker's
answer, tested on real segment bytes in a real (directory) store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from directlog.records.batch import Record, build_batch, iter_batches
from directlog.remote.index import RemoteIndex
from directlog.remote.store import RemoteStore, StoreConfig
from directlog.rpc import controller_pb2 as pb
from directlog.topic_config import LogConfig
from services.broker.metrics import BrokerMetrics
from services.broker.tiered.remote_reads import (
    RemoteDataCorruptError,
    RemoteReader,
    _select,
    _trimmed,
)
from services.tiering.manager import _past_retention
from services.tiering.segment_scan import SegmentChangedError, scan_segment

T0 = 1_700_000_000_000


def segment(tmp_path: Path, batches: int = 40, records: int = 5, size: int = 200) -> Path:
    """A segment file of `batches` batches of `records` records each, offsets from 0,
    timestamps T0 + offset, leader epoch 3 then 4 from the middle on."""
    data = bytearray()
    for b in range(batches):
        first = b * records
        batch = build_batch(
            [Record(first + i, T0 + first + i, b"k", bytes([b]) * size) for i in range(records)],
            partition_leader_epoch=3 if b < batches // 2 else 4,
        )
        data += batch
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(bytes(data))
    return path


def scan(path: Path, start: int = 0, span: int = 4096, size: int | None = None):
    fd = os.open(path, os.O_RDONLY)
    try:
        return scan_segment(
            fd, path.stat().st_size if size is None else size, "file:///store/s.log", start, span
        )
    finally:
        os.close(fd)


def test_a_scan_makes_spans_of_whole_batches_and_finds_the_epochs(tmp_path):
    path = segment(tmp_path)
    data = path.read_bytes()
    result = scan(path)
    assert (result.start_offset, result.end_offset) == (0, 199)
    assert result.epochs == [(3, 0), (4, 100)]
    assert result.max_timestamp == T0 + 199
    positions = {at for at, _ in iter_batches(data)} | {len(data)}
    covered = 0
    for entry in result.entries:
        assert entry.rdi.position == covered and entry.rdi.position in positions
        assert entry.rdi.end in positions  # whole batches only
        assert (
            entry.data_length <= 4096
            or len(list(iter_batches(data[entry.rdi.position : entry.rdi.end]))) == 1
        )
        covered = entry.rdi.end
    assert covered == len(data)
    assert result.entries[0].first_offset == 0 and result.entries[-1].last_offset == 199
    assert all(
        b.first_offset == a.last_offset + 1
        for a, b in zip(result.entries, result.entries[1:], strict=False)
    )
    assert result.entries[0].first_timestamp == T0


def test_a_scan_skips_what_an_earlier_copy_holds(tmp_path):
    result = scan(segment(tmp_path), start=52)
    assert result.start_offset == 50  # the batch holding 52 starts there
    assert result.entries[0].first_offset == 50 and result.entries[0].rdi.position > 0


def test_a_damaged_or_changed_segment_is_never_shipped(tmp_path):
    path = segment(tmp_path)
    with pytest.raises(SegmentChangedError):
        scan(path, size=path.stat().st_size + 100)  # shorter than the broker said
    data = bytearray(path.read_bytes())
    with pytest.raises(SegmentChangedError):
        scan(path, size=len(data) - 10)  # the size cuts a batch
    data[500] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(Exception, match="CRC"):
        scan(path)


def record(start: int, end: int, size: int, max_ts: int) -> pb.RemoteLogSegment:
    return pb.RemoteLogSegment(
        state=pb.COPY_FINISHED, start_offset=start, end_offset=end, size_bytes=size,
        max_timestamp=max_ts,
    )  # fmt: skip


def test_remote_retention_deletes_the_oldest_first():
    copies = [record(i * 100, i * 100 + 99, 1000, T0 + i * 1000) for i in range(5)]
    config = LogConfig(retention_ms=2500, retention_bytes=-1, remote_storage_enable=True)
    # Past retention.ms: those whose largest timestamp is older than now - 2500.
    assert _past_retention(copies, config, 0, 0, T0 + 4000) == copies[:2]
    assert _past_retention(copies, config, 0, 0, T0 + 10_000) == copies
    # Below the log start (DeleteRecords) go whatever their age.
    forever = LogConfig(retention_ms=-1, retention_bytes=-1, remote_storage_enable=True)
    assert _past_retention(copies, forever, 250, 0, T0) == copies[:2]
    # retention.bytes counts what is only local too: keep the total at or above the limit.
    by_size = LogConfig(retention_ms=-1, retention_bytes=3000, remote_storage_enable=True)
    assert _past_retention(copies, by_size, 0, 500, T0) == copies[:2]
    assert _past_retention(copies, by_size, 0, 3000, T0) == copies[:5]


def test_a_broker_checks_remote_bytes_against_their_entries(tmp_path):
    path = segment(tmp_path)
    store = RemoteStore(StoreConfig(f"file://{tmp_path}/store"))
    key = "t-x/0/segments/s.log"
    store.write(key, [path.read_bytes()])
    fd = os.open(path, os.O_RDONLY)
    try:
        entries = scan_segment(fd, path.stat().st_size, store.uri_of(key), 0, 4096).entries
    finally:
        os.close(fd)
    reader = RemoteReader(store, 1, 4, BrokerMetrics())
    try:
        data = reader.read_entries(entries[1:3])
        assert bytes(data) == path.read_bytes()[entries[1].rdi.position : entries[2].rdi.end]
        # A read that starts inside the first entry: whole batches from the one holding it.
        read = _select(data, entries[1].first_offset + 7, entries[2].last_offset + 1)
        first = next(iter_batches(read.records))[1]
        assert first.base_offset <= entries[1].first_offset + 7 <= first.last_offset
        assert read.next_offset == entries[2].last_offset + 1
        cut = _trimmed(read, 1, min_one_batch=True)
        assert len(list(iter_batches(cut.records))) == 1 and cut.next_offset == first.next_offset
        assert _trimmed(read, 1, min_one_batch=False).records.nbytes == 0
        # An entry whose bytes are not what it promises is refused, never served.
        shifted = entries[1].__class__(
            entries[1].first_offset + 1,
            entries[1].last_offset,
            entries[1].first_timestamp,
            entries[1].last_timestamp,
            entries[1].rdi,
        )
        with pytest.raises(RemoteDataCorruptError):
            reader.read_entries([shifted])
        damaged = bytearray(path.read_bytes())
        damaged[entries[1].rdi.position + 100] ^= 1
        store.write(key, [bytes(damaged)])
        with pytest.raises(RemoteDataCorruptError):
            reader.read_entries(entries[1:2])
    finally:
        reader.close()


def test_index_entries_of_a_scan_index_and_find_offsets(tmp_path):
    entries = scan(segment(tmp_path)).entries
    index = RemoteIndex.open(tmp_path / "dir", writable=True)
    index.append(entries, now_ms=0)
    assert (
        index.entries_from(123, 1)[0].first_offset
        <= 123
        <= index.entries_from(123, 1)[0].last_offset
    )
    assert index.entry_for_timestamp(T0 + 150).last_timestamp >= T0 + 150
    index.close()
