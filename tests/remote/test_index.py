"""A partition's remote index files: what a tiering service writes and a broker reads."""

import os

import pytest

from directlog.remote.index import CorruptIndexError, IndexEntry, RemoteIndex
from directlog.remote.rdi import RemoteDataId

MIB = 1 << 20


def span(first: int, last: int, max_ts: int | None = None, key: str = "seg") -> IndexEntry:
    """Ten bytes of data per offset, at the object's position of its first offset."""
    rdi = RemoteDataId(f"file:///store/{key}.log", first * 10, (last - first + 1) * 10)
    return IndexEntry(first, last, first * 1000, max_ts if max_ts is not None else last * 1000, rdi)


@pytest.fixture
def writer(tmp_path):
    index = RemoteIndex.open(tmp_path, writable=True, now_ms=0)
    yield index
    index.close()


def test_appended_entries_are_found_by_offset_and_time(tmp_path, writer):
    writer.append([span(0, 99), span(100, 199), span(200, 299)], now_ms=1)
    reader = RemoteIndex.open(tmp_path)
    assert (reader.first_offset, reader.end_offset) == (0, 300)
    assert reader.entries_from(150, 1) == [span(100, 199)]
    assert reader.entries_from(0, 2000) == [span(0, 99), span(100, 199)]
    assert reader.entries_from(100, 1001) == [span(100, 199), span(200, 299)]
    assert reader.entries_from(299, 10 * MIB) == [span(200, 299)]
    assert reader.entries_from(300, 1) == []
    assert reader.entry_for_timestamp(0) == span(0, 99)
    assert reader.entry_for_timestamp(150_000) == span(100, 199)
    assert reader.entry_for_timestamp(299_001) is None
    assert list(reader) == [span(0, 99), span(100, 199), span(200, 299)]
    names = sorted(os.listdir(tmp_path))
    assert names == [
        f"{0:020d}{suffix}"
        for suffix in (".remoteLogIndex", ".remoteOffsetIndex", ".remoteTimeIndex")
    ]
    assert os.path.getsize(tmp_path / f"{0:020d}.remoteOffsetIndex") == 3 * 8
    reader.close()


def test_the_time_index_keeps_only_growing_timestamps(tmp_path, writer):
    writer.append([span(0, 9, max_ts=500), span(10, 19, max_ts=400), span(20, 29, max_ts=900)], 0)
    assert os.path.getsize(tmp_path / f"{0:020d}.remoteTimeIndex") == 2 * 12
    assert writer.entry_for_timestamp(450) == span(0, 9, max_ts=500)
    assert writer.entry_for_timestamp(501) == span(20, 29, max_ts=900)
    assert writer.entry_for_timestamp(500) == span(0, 9, max_ts=500)


def test_offsets_between_entries_find_the_next(writer):
    writer.append([span(0, 9), span(50, 59)], 0)  # records 10-49 were deleted before the copy
    assert writer.entries_from(20, 1) == [span(50, 59)]


def test_entries_must_follow_the_last(writer):
    writer.append([span(0, 9)], 0)
    with pytest.raises(ValueError):
        writer.append([span(5, 20)], 0)
    with pytest.raises(ValueError):
        writer.append([span(30, 40), span(35, 50)], 0)
    assert writer.end_offset == 10


def test_rotation_by_size_and_age_and_reads_across_sets(tmp_path, writer):
    writer.append([span(0, 9)], now_ms=0)
    assert not writer.rotation_due(max_bytes=10_000, max_age_ms=1000, now_ms=999)
    assert writer.rotation_due(max_bytes=10_000, max_age_ms=1000, now_ms=1000)
    assert writer.rotation_due(max_bytes=50, max_age_ms=10**9, now_ms=0)
    closed = writer.rotate(writer.end_offset, now_ms=1000)
    assert closed is not None and closed.base_offset == 0
    assert writer.active.base_offset == 10 and not writer.rotation_due(1, 1, 10**9)  # empty
    writer.append([span(10, 19), span(20, 29)], now_ms=1001)
    reader = RemoteIndex.open(tmp_path)
    assert [f.base_offset for f in reader.files] == [0, 10]
    assert reader.entries_from(5, 201) == [span(0, 9), span(10, 19), span(20, 29)]
    assert reader.entry_for_timestamp(12_000) == span(10, 19)
    reader.close()


def test_a_reader_refreshes_to_appends_new_sets_and_drops(tmp_path, writer):
    writer.append([span(0, 9)], 0)
    reader = RemoteIndex.open(tmp_path)
    writer.append([span(10, 19)], 0)
    writer.rotate(20, 0)
    writer.append([span(20, 29)], 0)
    assert reader.end_offset == 10
    reader.refresh()
    assert reader.end_offset == 30 and reader.entries_from(25, 1) == [span(20, 29)]
    assert writer.drop_below(20) == [0]
    reader.refresh()
    assert reader.first_offset == 20 and reader.entries_from(0, 1) == [span(20, 29)]
    reader.close()


def test_a_torn_append_is_cut_at_the_next_writable_open(tmp_path, writer):
    writer.append([span(0, 9), span(10, 19)], 0)
    log_path = tmp_path / f"{0:020d}.remoteLogIndex"
    whole = log_path.read_bytes()
    log_path.write_bytes(whole + span(20, 29).encode()[:30])  # a crash mid-write
    writer.close()
    reader = RemoteIndex.open(tmp_path)  # the offset index never saw the torn entry
    assert reader.end_offset == 20
    repaired = RemoteIndex.open(tmp_path, writable=True)
    assert log_path.read_bytes() == whole and repaired.end_offset == 20
    repaired.append([span(20, 29)], 0)
    assert list(RemoteIndex.open(tmp_path)) == [span(0, 9), span(10, 19), span(20, 29)]


def test_log_entries_without_their_offset_entries_are_indexed_at_the_next_writable_open(
    tmp_path, writer
):
    writer.append([span(0, 9)], 0)
    offset_path = tmp_path / f"{0:020d}.remoteOffsetIndex"
    log_path = tmp_path / f"{0:020d}.remoteLogIndex"
    log_path.write_bytes(log_path.read_bytes() + span(10, 19).encode())  # crashed before the index
    assert RemoteIndex.open(tmp_path).end_offset == 10
    RemoteIndex.open(tmp_path, writable=True)
    assert os.path.getsize(offset_path) == 16
    assert RemoteIndex.open(tmp_path).end_offset == 20


def test_a_corrupt_entry_is_detected_and_never_returned(tmp_path, writer):
    writer.append([span(0, 9), span(10, 19), span(20, 29)], 0)
    log_path = tmp_path / f"{0:020d}.remoteLogIndex"
    data = bytearray(log_path.read_bytes())
    second = len(span(0, 9).encode())
    data[second + 12] ^= 1  # a bit of the second entry's first offset
    log_path.write_bytes(bytes(data))
    reader = RemoteIndex.open(tmp_path)
    assert reader.entries_from(0, 1) == [span(0, 9)]
    with pytest.raises(CorruptIndexError, match="CRC"):
        reader.entries_from(15, 1)
    with pytest.raises(CorruptIndexError):
        list(reader)
    repaired = RemoteIndex.open(tmp_path, writable=True)  # keeps what precedes the damage
    assert list(repaired) == [span(0, 9)]


def test_an_offset_index_that_does_not_fit_is_refused_by_a_reader(tmp_path, writer):
    writer.append([span(0, 9)], 0)
    (tmp_path / f"{0:020d}.remoteOffsetIndex").write_bytes(b"\x00\x00\x00\x00\x00\x10\x00\x00")
    with pytest.raises(CorruptIndexError):
        RemoteIndex.open(tmp_path)


def test_a_set_from_the_store_replaces_what_it_overlaps(tmp_path, writer):
    writer.append([span(0, 9), span(10, 19)], 0)
    writer.replace(0, [span(0, 9), span(10, 19), span(20, 29), span(30, 39)], now_ms=5)
    assert writer.end_offset == 40 and writer.active.base_offset == 40  # never appended to
    writer.append([span(40, 49)], 0)
    reader = RemoteIndex.open(tmp_path)
    assert [f.base_offset for f in reader.files] == [0, 40]
    assert reader.entries_from(35, 101) == [span(30, 39), span(40, 49)]
    reader.close()


def test_offsets_far_from_the_base_start_a_new_set(tmp_path, writer):
    writer.append([span(0, 9)], 0)
    writer.append([span(2**31 + 5, 2**31 + 9)], 0)
    assert [f.base_offset for f in writer.files] == [0, 2**31 + 5]
    assert writer.entries_from(2**31, 1) == [span(2**31 + 5, 2**31 + 9)]
