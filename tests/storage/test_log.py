"""Partition log behaviour: appends, reads, rolling, indexes, time lookup, retention,
truncation and flushing, each checked on the records and files it produces."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

import pytest

from directlog.records.batch import (
    HEADER_SIZE,
    Record,
    TimestampType,
    build_batch,
    decode_records,
    iter_batches,
    read_header,
    verify_crc,
)
from directlog.records.compression import Compression
from directlog.records.errors import CorruptRecordError, InvalidRecordError, UnsupportedMagicError
from services.broker.storage import (
    InvalidTimestampError,
    LogConfig,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
    log_file,
)
from tests.storage.helpers import T0, batch, read_all, tree_digest


def test_appends_take_consecutive_offsets_and_read_back_in_order(open_log):
    log = open_log()
    results = [log.append(batch([b"a%d" % i, b"b%d" % i, b"c%d" % i])) for i in range(10)]
    assert [(r.first_offset, r.last_offset, r.records) for r in results] == [
        (3 * i, 3 * i + 2, 3) for i in range(10)
    ]
    assert log.log_end_offset == 30
    records = read_all(log)
    assert [r.offset for r in records] == list(range(30))
    assert [r.value for r in records[:4]] == [b"a0", b"b0", b"c0", b"a1"]
    assert records[4].key == b"key-1" and records[4].timestamp == T0 + 1


def test_stored_batches_carry_offsets_and_epoch_with_a_valid_crc(open_log):
    log = open_log()
    log.append(batch([b"x"]), leader_epoch=7)
    log.append(batch([b"y", b"z"]), leader_epoch=9)
    data = log.read(0, 1 << 20).records.read()
    headers = list(iter_batches(data))
    assert [(h.base_offset, h.partition_leader_epoch) for _, h in headers] == [(0, 7), (1, 9)]
    for position, header in headers:
        verify_crc(data, position, header)


def test_every_codec_is_stored_as_it_arrives(open_log):
    log = open_log()
    for codec in Compression:
        incoming = batch([b"payload-%d" % i * 20 for i in range(5)], compression=codec)
        result = log.append(incoming)
        stored = log.read(result.first_offset, 1 << 20).records.read()
        header = read_header(stored)
        assert header.compression is codec
        assert stored[HEADER_SIZE : header.size] == incoming[HEADER_SIZE:]
        assert [r.value for r in decode_records(stored, 0, header)] == [
            b"payload-%d" % i * 20 for i in range(5)
        ]


def test_one_append_may_carry_several_batches(open_log):
    log = open_log()
    log.append(batch([b"first"]) + batch([b"second", b"third"]) + batch([b"fourth"]))
    assert [r.value for r in read_all(log)] == [b"first", b"second", b"third", b"fourth"]
    assert [r.offset for r in read_all(log)] == [0, 1, 2, 3]


def test_reads_return_whole_batches_within_max_bytes(open_log):
    log = open_log()
    sizes = [log.append(batch([b"v" * 100])).size for _ in range(20)]
    size = sizes[0]
    read = log.read(0, 3 * size + size // 2)
    assert read.records.size == 3 * size
    assert read.records.position == 0
    read = log.read(5, 2 * size)
    assert read.records.position == 5 * size and read.records.size == 2 * size


def test_a_batch_larger_than_max_bytes_is_still_returned_for_progress(open_log):
    log = open_log()
    size = log.append(batch([b"v" * 1000])).size
    assert log.read(0, 10).records.size == size
    assert log.read(0, 10, min_one_batch=False).records.size == 0


def test_read_inside_a_batch_starts_at_that_batch(open_log):
    log = open_log()
    log.append(batch([b"a", b"b", b"c"]))
    log.append(batch([b"d", b"e"]))
    data = log.read(4, 1 << 20).records.read()
    assert [h.base_offset for _, h in iter_batches(data)] == [3]


def test_reads_stop_below_the_upper_offset(open_log):
    log = open_log()
    for i in range(5):
        log.append(batch([b"%d" % i, b"%d" % i]))
    assert log.update_high_watermark(6) == 6
    data = log.read(0, 1 << 20, upper_offset=log.high_watermark).records.read()
    assert [h.last_offset for _, h in iter_batches(data)] == [1, 3, 5]
    assert log.read(6, 1 << 20, upper_offset=6).records.size == 0


def test_high_watermark_stays_within_the_log(open_log):
    log = open_log()
    log.append(batch([b"a", b"b"]))
    assert log.update_high_watermark(100) == 2
    assert log.update_high_watermark(-5) == 0


def test_reads_outside_the_log_are_out_of_range(open_log):
    log = open_log()
    log.append(batch([b"a"]))
    assert log.read(1, 100).records.size == 0  # the log end itself is a valid, empty read
    with pytest.raises(OffsetOutOfRangeError) as info:
        log.read(2, 100)
    assert (info.value.log_start_offset, info.value.log_end_offset) == (0, 1)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)


def test_segments_roll_on_size_and_are_named_by_base_offset(open_log, tmp_path: Path):
    log = open_log(LogConfig(segment_bytes=1024))
    for i in range(30):
        log.append(batch([b"v" * 100], ts=T0 + i))
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 3 and bases[0] == 0
    assert all(s.size <= 1024 for s in log.segments)
    names = sorted(p.name for p in (tmp_path / "topic-0").glob("*.log"))
    assert names == [f"{b:020d}.log" for b in bases]
    suffixes = {p.suffix for p in (tmp_path / "topic-0").iterdir()}
    assert suffixes == {".log", ".index", ".timeindex", ".snapshot"}  # producer state at rolls
    assert [r.offset for r in read_all(log)] == list(range(30))


def disk_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_head_segment_reserves_disk_ahead_and_gives_it_back_when_it_rolls(open_log):
    log = open_log(LogConfig(segment_bytes=8 << 20))
    head = log.segments[-1]
    values = [b"%02d" % i * 32 * 1024 for i in range(40)]  # 2.6 MB: past the first steps
    for i, value in enumerate(values):
        log.append(batch([value], ts=T0 + i))
        assert os.path.getsize(head.log.path) == head.size  # the length is the logical end
        assert disk_bytes(head.log.path) >= max(head.size, 1 << 20)  # allocated ahead
    assert [r.value for r in read_all(log)] == values
    log.roll()
    assert head.size <= disk_bytes(head.log.path) < head.size + 64 * 1024
    new_head = log.segments[-1]
    log.append(batch([b"after"], ts=T0 + 40))
    log.close()
    assert disk_bytes(new_head.log.path) < 64 * 1024  # a clean close gives it back too


def test_reserved_blocks_left_by_a_crash_are_invisible_and_reclaimed(open_log):
    log = open_log(LogConfig(segment_bytes=1 << 20))
    values = [b"%03d" % i * 300 for i in range(50)]
    for i, value in enumerate(values):
        log.append(batch([value], ts=T0 + i))
    path = log.segments[-1].log.path
    assert disk_bytes(path) >= 1 << 20  # reserved, never given back: as after a crash
    recovered = open_log(LogConfig(segment_bytes=1 << 20))
    assert recovered.log_end_offset == 50
    assert [r.value for r in read_all(recovered)] == values
    assert recovered.append(batch([b"next"], ts=T0 + 50)).first_offset == 50
    recovered.roll()
    assert disk_bytes(path) < os.path.getsize(path) + 64 * 1024


def test_a_crash_reservation_is_reclaimed_even_without_a_new_append(open_log):
    log = open_log(LogConfig(segment_bytes=1 << 20))
    log.append(batch([b"v" * 3000], ts=T0))
    path = log.segments[-1].log.path
    recovered = open_log(LogConfig(segment_bytes=1 << 20))  # the first never closed
    recovered.close()
    assert disk_bytes(path) < os.path.getsize(path) + 64 * 1024


def test_appends_go_on_when_the_file_system_refuses_to_reserve(open_log, monkeypatch):
    class Refusing:  # a file system without fallocate, or one that is full
        @staticmethod
        def fallocate(fd: int, mode: int, offset: int, length: int) -> int:
            return -1

    monkeypatch.setattr(log_file, "_libc", Refusing)
    log = open_log(LogConfig(segment_bytes=1 << 20))
    values = [b"%02d" % i * 1000 for i in range(20)]
    for i, value in enumerate(values):
        log.append(batch([value], ts=T0 + i))
    assert disk_bytes(log.segments[-1].log.path) < 64 * 1024
    assert [r.value for r in read_all(log)] == values


def test_segments_roll_on_time(open_log, clock):
    log = open_log(LogConfig(segment_ms=60_000))
    log.append(batch([b"a"], ts=clock.now))
    clock.advance(59_999)
    log.append(batch([b"b"], ts=clock.now))
    assert len(log.segments) == 1
    clock.advance(1)
    log.append(batch([b"c"], ts=clock.now))
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_segment_jitter_rolls_each_segment_somewhat_sooner(open_log, clock):
    """segment.jitter.ms: each segment rolls up to that much before segment.ms, by an
    amount of its own (Kafka's random draw; a hash of partition and base offset here)."""
    config = LogConfig(segment_ms=60_000, segment_jitter_ms=30_000)
    log = open_log(config)
    jitters = {config.roll_jitter_ms(log.directory, offset) for offset in range(0, 200, 10)}
    assert len(jitters) > 10 and all(0 <= j < 30_000 for j in jitters)
    assert LogConfig(segment_ms=60_000).roll_jitter_ms(log.directory, 0) == 0
    jitter = config.roll_jitter_ms(log.directory, 0)
    log.append(batch([b"a"], ts=clock.now))
    clock.advance(60_000 - jitter - 1)
    log.append(batch([b"b"], ts=clock.now))
    assert len(log.segments) == 1
    clock.advance(1)
    log.append(batch([b"c"], ts=clock.now))
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_old_record_timestamps_do_not_roll_a_segment_per_append(open_log, clock):
    log = open_log(LogConfig(segment_ms=60_000))
    year_ago = clock.now - 365 * 86_400_000
    for i in range(10):
        log.append(batch([b"%d" % i], ts=year_ago + i))
    assert len(log.segments) == 1
    log.append(batch([b"late"], ts=year_ago + 60_000))  # a minute of record time later
    assert [s.base_offset for s in log.segments] == [0, 10]


def test_offset_index_has_an_entry_per_interval_at_batch_starts(open_log):
    log = open_log(LogConfig(index_interval_bytes=500))
    size = log.append(batch([b"v" * 100])).size
    for _ in range(49):
        log.append(batch([b"v" * 100]))
    index = log.segments[0].offset_index
    assert 8 <= len(index) <= 50 * size // 500
    for offset, position in zip(index.keys, index.values, strict=True):
        assert position == offset * size  # one-record batches of equal size
    log.flush()  # entries reach the file when the segment is flushed, rolled or closed
    raw = index.path.read_bytes()
    assert len(raw) == 8 * len(index)
    assert struct.unpack_from(">ii", raw, 0) == (index.keys[0], index.values[0])
    assert struct.unpack_from(">ii", raw, len(raw) - 8) == (index.keys[-1], index.values[-1])


def test_time_lookup_finds_the_first_record_at_or_after_a_timestamp(open_log):
    log = open_log(LogConfig(index_interval_bytes=200, segment_bytes=2048))
    for i in range(40):
        log.append(batch([b"v" * 50, b"w" * 50], ts=T0 + 10 * i))  # records at +10i, +10i+1
    assert log.offset_for_timestamp(T0) == (0, T0)
    assert log.offset_for_timestamp(T0 + 1) == (1, T0 + 1)
    assert log.offset_for_timestamp(T0 + 2) == (2, T0 + 10)
    assert log.offset_for_timestamp(T0 + 255) == (52, T0 + 260)
    assert log.offset_for_timestamp(T0 + 391) == (79, T0 + 391)
    assert log.offset_for_timestamp(T0 + 392) is None
    assert log.offset_for_timestamp(T0 + 255, upper_offset=50) is None


def test_log_append_time_stamps_batches_and_keeps_the_crc_valid(open_log, clock):
    log = open_log(LogConfig(message_timestamp_type=TimestampType.LOG_APPEND_TIME))
    clock.advance(5_000)
    result = log.append(batch([b"a", b"b"], ts=T0 - 1_000_000))
    assert result.log_append_time == clock.now
    data = log.read(0, 1 << 20).records.read()
    header = read_header(data)
    verify_crc(data, 0, header)
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert [r.timestamp for r in decode_records(data, 0, header)] == [clock.now, clock.now]


def test_create_time_max_timestamp_is_corrected_from_the_records(open_log):
    records = [Record(0, T0 + 5, None, b"a"), Record(1, T0 + 9, None, b"b")]
    wrong = bytearray(build_batch(records))
    struct.pack_into(">q", wrong, 35, T0)  # maxTimestamp lies; fix the CRC so it is intact
    from crc32c import crc32c

    struct.pack_into(">I", wrong, 17, crc32c(bytes(wrong[21:])))
    log = open_log()
    log.append(bytes(wrong))
    data = log.read(0, 1 << 20).records.read()
    header = read_header(data)
    verify_crc(data, 0, header)
    assert header.max_timestamp == T0 + 9
    assert log.segments[0].max_timestamp == T0 + 9


def test_timestamps_outside_the_window_are_rejected(open_log, clock, tmp_path):
    log = open_log(
        LogConfig(message_timestamp_before_max_ms=1000, message_timestamp_after_max_ms=1000)
    )
    log.append(batch([b"ok"], ts=clock.now - 1000))
    before = tree_digest(tmp_path)
    with pytest.raises(InvalidTimestampError, match=r"before\.max\.ms"):
        log.append(batch([b"old"], ts=clock.now - 1001))
    with pytest.raises(InvalidTimestampError, match=r"after\.max\.ms"):
        log.append(batch([b"new"], ts=clock.now + 1001))
    assert tree_digest(tmp_path) == before and log.log_end_offset == 1


def test_size_limits(open_log, tmp_path):
    log = open_log(LogConfig(max_message_bytes=500, segment_bytes=1200))
    with pytest.raises(MessageTooLargeError):
        log.append(batch([b"v" * 600]))
    with pytest.raises(RecordBatchTooLargeError):
        log.append(b"".join(batch([b"v" * 300]) for _ in range(4)))
    assert log.log_end_offset == 0 and log.segments[0].size == 0


BAD_INPUT = {
    "wrong CRC": lambda b: b[:30] + bytes([b[30] ^ 0xFF]) + b[31:],
    "length beyond buffer": lambda b: b[:8] + struct.pack(">i", len(b)) + b[12:],
    "truncated": lambda b: b[:-3],
    "unknown magic": lambda b: b[:16] + b"\x07" + b[17:],
    "negative record count": lambda b: b[:57] + struct.pack(">i", -1) + b[61:],
    "empty": lambda b: b"",
    "garbage": lambda b: b"\x00\x01garbage" * 10,
}


@pytest.mark.parametrize("name", BAD_INPUT)
def test_bad_input_is_rejected_with_a_typed_error_and_changes_nothing(open_log, tmp_path, name):
    log = open_log()
    log.append(batch([b"kept"]))
    before = tree_digest(tmp_path)
    bad = BAD_INPUT[name](batch([b"one", b"two"]))
    with pytest.raises((CorruptRecordError, InvalidRecordError, UnsupportedMagicError)) as info:
        log.append(bad)
    assert str(info.value)
    assert tree_digest(tmp_path) == before
    assert log.log_end_offset == 1
    assert [r.value for r in read_all(log)] == [b"kept"]
    log.append(batch([b"after"]))
    assert [r.value for r in read_all(log)] == [b"kept", b"after"]


def test_producer_rules(open_log):
    log = open_log()
    gappy = build_batch([Record(0, T0, None, b"a"), Record(2, T0, None, b"b")])
    with pytest.raises(InvalidRecordError, match=r"out of sequence|disagrees"):
        log.append(gappy)
    with pytest.raises(InvalidRecordError, match="control"):
        log.append(batch([b"c"], control=True))
    assert log.log_end_offset == 0


def test_follower_appends_keep_the_leaders_offsets(open_log):
    log = open_log()
    leader_batch = build_batch(
        [Record(10, T0, None, b"a"), Record(12, T0, None, b"b")], partition_leader_epoch=3
    )
    log.truncate_fully_and_start_at(10)
    result = log.append(leader_batch, assign_offsets=False)
    assert (result.first_offset, result.last_offset) == (10, 12)
    assert log.read(10, 1000).records.read() == leader_batch
    with pytest.raises(InvalidRecordError, match="below"):
        log.append(leader_batch, assign_offsets=False)


def test_retention_by_time_deletes_whole_old_segments(open_log, clock):
    log = open_log(LogConfig(segment_bytes=600, retention_ms=10_000))
    for _ in range(12):
        log.append(batch([b"v" * 100], ts=clock.now))
        clock.advance(1_000)
    log.update_high_watermark(log.log_end_offset)
    segments_before = log.segments
    clock.now = segments_before[1].max_timestamp + 10_001
    deleted = log.delete_retained_segments()
    assert deleted == 2
    assert log.log_start_offset == segments_before[2].base_offset
    assert not segments_before[0].log.path.exists()
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    assert read_all(log, log.log_start_offset)[0].offset == log.log_start_offset


def test_retention_never_passes_the_high_watermark(open_log, clock):
    log = open_log(LogConfig(segment_bytes=600, retention_ms=1))
    for _ in range(8):
        log.append(batch([b"v" * 100]))
    clock.advance(10 * 86_400_000)
    assert log.delete_retained_segments() == 0
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_retained_segments() >= 2
    assert log.log_start_offset == log.log_end_offset  # all expired: rolled, head is empty
    assert log.read(log.log_end_offset, 100).records.size == 0


def test_retention_by_size(open_log):
    log = open_log(LogConfig(segment_bytes=600, retention_bytes=1500, retention_ms=-1))
    for _ in range(20):
        log.append(batch([b"v" * 100]))
    log.update_high_watermark(log.log_end_offset)
    assert log.size_bytes > 3000
    assert log.delete_retained_segments() > 0
    # Kafka's rule: delete the oldest while what remains would still be >= retention.bytes.
    assert log.size_bytes >= 1500 > log.size_bytes - log.segments[0].size
    assert read_all(log, log.log_start_offset)[-1].offset == 19


def test_advancing_the_log_start_hides_records_and_deletes_segments_below_it(open_log, clock):
    log = open_log(LogConfig(segment_bytes=600))
    for i in range(12):
        log.append(batch([b"%02d" % i + b"v" * 100], ts=clock.now + 10 * i))
    segments_before = log.segments
    assert len(segments_before) >= 3
    with pytest.raises(OffsetOutOfRangeError):
        log.advance_log_start(1)  # nothing is committed yet: the high watermark is 0
    log.update_high_watermark(10)
    with pytest.raises(OffsetOutOfRangeError):
        log.advance_log_start(11)
    with pytest.raises(OffsetOutOfRangeError):
        log.advance_log_start(-2)

    cut = segments_before[2].base_offset + 1  # inside the third segment
    assert log.advance_log_start(cut) is True
    assert log.log_start_offset == cut
    assert log.segments == segments_before[2:]
    assert not segments_before[0].log.path.exists() and not segments_before[1].log.path.exists()
    with pytest.raises(OffsetOutOfRangeError):
        log.read(cut - 1, 1000)
    assert [r.offset for r in read_all(log, cut)] == list(range(cut, 12))
    # A timestamp lookup answers from the log start on, not with a hidden record.
    assert log.offset_for_timestamp(0) == (cut, clock.now + 10 * cut)
    assert log.advance_log_start(cut - 1) is False and log.log_start_offset == cut
    # Up to the high watermark, which may be the head segment's base: the head stays.
    assert log.advance_log_start(10) is True
    assert log.segments[-1] is segments_before[-1] and log.log_start_offset == 10


def test_truncate_to_removes_whole_batches_and_later_segments(open_log, tmp_path):
    log = open_log(LogConfig(segment_bytes=700, index_interval_bytes=100))
    for i in range(30):
        log.append(batch([b"%d" % i * 50, b"x"]))
    log.update_high_watermark(60)
    log.truncate_to(31)  # inside the batch [30, 31]: that batch goes too
    assert log.log_end_offset == 30
    assert log.high_watermark == 30
    assert [r.offset for r in read_all(log)] == list(range(30))
    assert all(s.base_offset < 30 for s in log.segments)
    head = log.segments[-1]
    assert head.offset_index.keys and max(head.offset_index.keys) < 30
    assert max(head.offset_index.values) < head.size
    result = log.append(batch([b"again"]))
    assert result.first_offset == 30
    assert read_all(log)[-1].value == b"again"


def test_truncate_fully_restarts_the_log(open_log):
    log = open_log()
    log.append(batch([b"a", b"b"]))
    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.log_end_offset) == (100, 100)
    assert log.append(batch([b"c"])).first_offset == 100
    assert [s.base_offset for s in log.segments] == [100]


def test_flush_messages_moves_the_recovery_point(open_log):
    log = open_log(LogConfig(flush_messages=5))
    log.append(batch([b"1", b"2"]))
    log.append(batch([b"3", b"4"]))
    assert log.recovery_point == 0
    log.append(batch([b"5"]))
    assert log.recovery_point == 5


def test_flush_ms(open_log, clock):
    log = open_log(LogConfig(flush_ms=1000))
    log.append(batch([b"1"]))
    assert not log.flush_if_due()
    clock.advance(1000)
    assert log.flush_if_due()
    assert log.recovery_point == 1
    clock.advance(1000)
    assert not log.flush_if_due()  # nothing new to flush


def test_clean_reopen_restores_state_without_recovery(open_log, clock):
    log = open_log(LogConfig(segment_bytes=1000, index_interval_bytes=200))
    for i in range(25):
        log.append(batch([b"v" * 60, b"w"], ts=T0 + i))
    segments = [(s.base_offset, s.next_offset, s.max_timestamp, s.size) for s in log.segments]
    log.close()
    reopened = open_log(
        LogConfig(segment_bytes=1000, index_interval_bytes=200),
        clean_shutdown=True,
        recovery_point=50,
    )
    assert [
        (s.base_offset, s.next_offset, s.max_timestamp, s.size) for s in reopened.segments
    ] == segments
    assert reopened.log_end_offset == 50
    assert [r.offset for r in read_all(reopened)] == list(range(50))
    assert reopened.append(batch([b"next"])).first_offset == 50


def test_read_slices_go_straight_to_a_socket_with_sendfile(open_log):
    log = open_log(LogConfig(segment_bytes=4096))
    for i in range(40):
        log.append(batch([b"record-%d" % i * 8]))
    sender, receiver = socket.socketpair()
    with sender, receiver:
        offset, received = 0, []
        while offset < log.log_end_offset:
            chunk = log.read(offset, 2000).records
            sent = 0
            while sent < chunk.size:
                sent += os.sendfile(
                    sender.fileno(), chunk.fileno(), chunk.position + sent, chunk.size - sent
                )
            data = b""
            while len(data) < chunk.size:
                data += receiver.recv(chunk.size - len(data))
            for position, header in iter_batches(data):
                verify_crc(data, position, header)
                received += decode_records(data, position, header)
            offset = received[-1].offset + 1
    assert [r.value for r in received] == [b"record-%d" % i * 8 for i in range(40)]
