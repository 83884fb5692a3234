"""Restart recovery: torn and corrupt tails are cut at the last valid batch, later segments
are dropped, and missing or damaged indexes are rebuilt from the log."""

from __future__ import annotations

import os

from directlog.records.batch import iter_batches, verify_crc
from services.broker.storage import LogConfig
from tests.storage.helpers import batch, read_all

SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=128)


def fill_log(log, batches: int) -> list[int]:
    """Append numbered two-record batches; return each batch's size."""
    return [log.append(batch([b"%04d" % i * 20, b"tail-%d" % i])).size for i in range(batches)]


def test_torn_tail_is_cut_to_the_last_whole_batch(open_log):
    log = open_log(SMALL)
    sizes = fill_log(log, 5)
    path = log.segments[-1].log.path
    os.truncate(path, sum(sizes) - 7)  # the last batch loses its end
    recovered = open_log(SMALL)
    assert recovered.log_end_offset == 8
    assert os.path.getsize(path) == sum(sizes[:4])
    assert [r.value for r in read_all(recovered)][-1] == b"tail-3"
    assert recovered.append(batch([b"next"])).first_offset == 8


def test_corruption_cuts_the_log_and_drops_later_segments(open_log, tmp_path):
    log = open_log(SMALL)
    fill_log(log, 30)
    segments = log.segments
    assert len(segments) >= 4
    victim = segments[1]
    data = victim.log.read(0, victim.size)
    positions = [p for p, _ in iter_batches(data)]
    with open(victim.log.path, "r+b") as raw:
        raw.seek(positions[2] + 70)  # inside the records of the third batch
        byte = raw.read(1)
        raw.seek(positions[2] + 70)
        raw.write(bytes([byte[0] ^ 0x55]))
    recovered = open_log(SMALL)
    assert [s.base_offset for s in recovered.segments] == [
        segments[0].base_offset,
        victim.base_offset,
    ]
    assert recovered.log_end_offset == victim.base_offset + 4
    assert not segments[2].log.path.exists() and not segments[3].log.path.exists()
    records = read_all(recovered)
    assert [r.offset for r in records] == list(range(recovered.log_end_offset))
    for segment in recovered.segments:
        data = segment.log.read(0, segment.size)
        for position, header in iter_batches(data):
            verify_crc(data, position, header)


def test_preallocated_head_recovers_past_its_zero_tail(open_log):
    config = LogConfig(preallocate=True, segment_bytes=8192)
    log = open_log(config)
    sizes = fill_log(log, 6)
    assert os.path.getsize(log.segments[-1].log.path) == 8192
    recovered = open_log(config)  # no close: the file still has its zero-filled tail
    assert recovered.log_end_offset == 12
    assert recovered.segments[-1].size == sum(sizes)
    assert os.path.getsize(recovered.segments[-1].log.path) == 8192  # preallocated again
    assert recovered.append(batch([b"more"])).first_offset == 12
    assert read_all(recovered)[-1].value == b"more"


def test_damaged_or_missing_indexes_are_rebuilt_on_a_clean_open(open_log):
    log = open_log(SMALL)
    fill_log(log, 30)
    expected = [
        (s.base_offset, list(s.offset_index.keys), list(s.time_index.keys)) for s in log.segments
    ]
    log.close()
    first, second, third = log.segments[0], log.segments[1], log.segments[2]
    first.offset_index.path.write_bytes(b"\x00" * 13)  # not a whole number of entries
    second.offset_index.path.unlink()
    second.time_index.path.unlink()
    with open(third.offset_index.path, "r+b") as raw:  # an entry pointing past the log
        raw.write(b"\x00\x00\x00\x01\x7f\xff\xff\xff")
    reopened = open_log(SMALL, clean_shutdown=True, recovery_point=60)
    rebuilt = [
        (s.base_offset, list(s.offset_index.keys), list(s.time_index.keys))
        for s in reopened.segments
    ]
    for (base, offsets, times), (base2, offsets2, times2) in zip(expected, rebuilt, strict=True):
        assert base == base2 and offsets == offsets2
        assert times2[: len(times)] == times  # the rebuilt index may add the final entry
    assert [r.offset for r in read_all(reopened)] == list(range(60))
    assert reopened.offset_for_timestamp(0) == (0, read_all(reopened)[0].timestamp)


def test_index_files_without_a_log_are_removed(open_log, tmp_path):
    log = open_log(SMALL)
    fill_log(log, 3)
    log.close()
    orphan = tmp_path / "topic-0" / f"{999:020d}.index"
    orphan.write_bytes(b"")
    open_log(SMALL, clean_shutdown=True)
    assert not orphan.exists()


def test_segments_below_the_log_start_offset_are_deleted_on_open(open_log):
    log = open_log(SMALL)
    fill_log(log, 30)
    segments = log.segments
    log.close()
    start = segments[2].base_offset
    reopened = open_log(SMALL, clean_shutdown=True, recovery_point=60, log_start_offset=start)
    assert reopened.segments[0].base_offset == start
    assert reopened.log_start_offset == start
    assert not segments[0].log.path.exists()
    assert read_all(reopened, start)[0].offset == start
