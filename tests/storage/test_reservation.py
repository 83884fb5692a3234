"""The reserve-then-commit append path: a producer places batches straight into the mapped,
preallocated head segment and the broker commits them through the same validation as a
TCP append (the shape KafkaDirect's RDMA produce needs)."""

from __future__ import annotations

import os

import pytest

from directlog.records.batch import iter_batches, read_header, verify_crc
from directlog.records.errors import CorruptRecordError
from services.broker.storage import LogConfig, ReservationStateError
from tests.storage.helpers import batch, read_all

PREALLOCATED = LogConfig(preallocate=True, segment_bytes=64 * 1024)


def fill(reservation, data: bytes) -> None:
    reservation.buffer[: len(data)] = data


def test_committed_region_is_stamped_in_place_and_readable(open_log):
    log = open_log(PREALLOCATED)
    log.append(batch([b"tcp"]))
    data = batch([b"direct-1", b"direct-2"])
    reservation = log.reserve(len(data))
    fill(reservation, data)
    assert log.log_end_offset == 1  # placed, not yet committed: invisible to readers
    assert log.read(1, 1 << 20).records.size == 0
    result = log.commit(reservation, leader_epoch=4)
    assert (result.first_offset, result.last_offset) == (1, 2)
    stored = log.read(1, 1 << 20).records.read()
    header = read_header(stored)
    assert (header.base_offset, header.partition_leader_epoch) == (1, 4)
    verify_crc(stored, 0, header)
    assert [r.value for r in read_all(log)] == [b"tcp", b"direct-1", b"direct-2"]


def test_head_segment_is_preallocated_and_trimmed_when_it_rolls(open_log):
    log = open_log(PREALLOCATED)
    head = log.segments[-1]
    assert os.path.getsize(head.log.path) == 64 * 1024
    log.append(batch([b"x"]))
    size = head.size
    log.roll()
    assert os.path.getsize(head.log.path) == size
    assert os.path.getsize(log.segments[-1].log.path) == 64 * 1024


def test_reservations_commit_in_order(open_log):
    log = open_log(PREALLOCATED)
    first_data, second_data = batch([b"first"]), batch([b"second"])
    first, second = log.reserve(len(first_data)), log.reserve(len(second_data))
    assert second.position == first.position + first.size
    fill(first, first_data)
    fill(second, second_data)
    with pytest.raises(ReservationStateError, match="oldest"):
        log.commit(second)
    with pytest.raises(ReservationStateError, match="pending"):
        log.append(batch([b"tcp"]))
    log.commit(first)
    log.commit(second)
    assert [r.value for r in read_all(log)] == [b"first", b"second"]
    log.append(batch([b"tcp"]))  # nothing pending any more
    assert log.log_end_offset == 3


def test_newest_reservation_may_commit_fewer_bytes(open_log):
    log = open_log(PREALLOCATED)
    data = batch([b"short"])
    reservation = log.reserve(4096)
    fill(reservation, data)
    log.commit(reservation, len(data))
    following = batch([b"next"])
    after = log.reserve(len(following))
    assert after.position == len(data)
    fill(after, following)
    log.commit(after)
    assert [r.value for r in read_all(log)] == [b"short", b"next"]


def test_invalid_region_is_discarded_with_later_reservations(open_log):
    log = open_log(PREALLOCATED)
    good = batch([b"good"])
    bad = bytearray(batch([b"bad"]))
    bad[-1] ^= 0xFF
    first, second = log.reserve(len(bad)), log.reserve(len(good))
    fill(first, bytes(bad))
    fill(second, good)
    with pytest.raises(CorruptRecordError, match="CRC"):
        log.commit(first)
    assert not first.open and not second.open
    with pytest.raises(ReservationStateError):
        log.commit(second)
    assert log.log_end_offset == 0
    head = log.segments[-1]
    assert head.log.read(0, 12) == b""  # nothing committed
    retry = log.reserve(len(good))
    assert retry.position == 0
    fill(retry, good)
    log.commit(retry)
    assert [r.value for r in read_all(log)] == [b"good"]


def test_abort_zeroes_the_region_header_so_recovery_stops_there(open_log, tmp_path):
    log = open_log(PREALLOCATED)
    log.append(batch([b"kept"]))
    data = batch([b"abandoned"])
    reservation = log.reserve(len(data))
    fill(reservation, data)
    position = reservation.position
    log.abort(reservation)
    with open(log.segments[-1].log.path, "rb") as raw:
        raw.seek(position)
        assert raw.read(12) == bytes(12)
    reopened = open_log(PREALLOCATED)  # as after a crash: no clean shutdown
    assert reopened.log_end_offset == 1
    assert [r.value for r in read_all(reopened)] == [b"kept"]


def test_reservation_rules(open_log):
    with pytest.raises(ReservationStateError, match="preallocate"):
        open_log(LogConfig()).reserve(100)


def test_reservation_that_does_not_fit_rolls_or_waits(open_log):
    log = open_log(LogConfig(preallocate=True, segment_bytes=1024))
    data = batch([b"v" * 500])
    first = log.reserve(len(data))
    with pytest.raises(ReservationStateError, match="full"):
        log.reserve(len(data))
    fill(first, data)
    log.commit(first)
    second = log.reserve(len(data))  # the head is now too full: a new segment starts
    assert [s.base_offset for s in log.segments] == [0, 1] and second.position == 0
    fill(second, batch([b"w" * 500]))
    log.commit(second)
    data_read = [h.base_offset for s in log.segments for _, h in iter_batches(s.log.read(0, 4096))]
    assert data_read == [0, 1]
