"""Idempotent producers' state in a partition log (Kafka's ProducerStateManager): the leader's
epoch and sequence checks, duplicates answered with the original offsets, followers that
only apply, and the state kept right across restarts, truncation, retention and expiry."""

from __future__ import annotations

import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.records.batch import Record, TimestampType, build_batch
from directlog.records.errors import InvalidRecordError
from services.broker.error_codes import error_code_for
from services.broker.storage import LogConfig, PartitionLog
from services.broker.storage.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from services.broker.storage.producer_state import (
    SNAPSHOT_SUFFIX,
    BatchMetadata,
    ProducerEntry,
    ProducerSnapshotFiles,
    ProducerStateManager,
)
from tests.storage.helpers import T0, ManualClock, batch, read_all, tree_digest

INT32_MAX = (1 << 31) - 1
SMALL = LogConfig(segment_bytes=600, index_interval_bytes=128)


def pbatch(
    producer_id: int, epoch: int, sequence: int, count: int = 1, *, ts: int = T0, offset: int = 0
) -> bytes:
    """A batch of `count` records from an idempotent producer (offsets from `offset`)."""
    records = [Record(offset + i, ts + i, None, b"v%d" % i) for i in range(count)]
    return build_batch(
        records, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence
    )


def state_of(log: PartitionLog) -> dict[int, tuple[int, int, list[tuple[int, ...]]]]:
    return {
        pid: (e.producer_epoch, e.last_timestamp, [tuple(b) for b in e.batches])
        for pid, e in log.producers.entries().items()
    }


def snapshots(log: PartitionLog) -> list[int]:
    return sorted(int(p.stem) for p in log.directory.glob("*" + SNAPSHOT_SUFFIX))


# The leader's checks ----------------------------------------------------------------------


def test_batches_without_producer_id_leave_no_state(open_log):
    log = open_log()
    result = log.append(batch([b"a", b"b"]))
    assert not result.duplicate and len(log.producers) == 0


def test_in_sequence_batches_are_recorded(open_log):
    log = open_log()
    log.append(batch([b"plain"]))
    first = log.append(pbatch(7, 0, 0, 2))
    second = log.append(pbatch(7, 0, 2, 3))
    assert (first.first_offset, second.first_offset, second.last_offset) == (1, 3, 5)
    assert state_of(log) == {7: (0, T0 + 2, [(0, 1, 1, 2, T0 + 1), (2, 4, 3, 5, T0 + 2)])}


def test_unknown_producer_may_start_at_any_sequence(open_log):
    log = open_log()
    log.append(pbatch(7, 3, 42))
    log.append(pbatch(7, 3, 43))
    with pytest.raises(OutOfOrderSequenceError, match="expected 44"):
        log.append(pbatch(7, 3, 45))


def test_gap_is_out_of_order_and_writes_nothing(open_log, tmp_path):
    log = open_log()
    log.append(pbatch(7, 0, 0))
    before = tree_digest(tmp_path)
    with pytest.raises(OutOfOrderSequenceError):
        log.append(pbatch(7, 0, 2))
    assert tree_digest(tmp_path) == before and log.log_end_offset == 1


def test_every_one_of_the_last_five_batches_is_a_duplicate(open_log, tmp_path):
    log = open_log()
    for n in range(6):
        log.append(pbatch(7, 0, 2 * n, 2))
    before = tree_digest(tmp_path)
    for n in range(1, 6):
        result = log.append(pbatch(7, 0, 2 * n, 2), leader_epoch=9)
        assert result == (2 * n, 2 * n + 1, 0, 0, -1, True)
    assert tree_digest(tmp_path) == before
    assert log.leader_epochs.latest_epoch == -1  # a duplicate starts no leader epoch
    with pytest.raises(OutOfOrderSequenceError):  # the sixth newest is forgotten
        log.append(pbatch(7, 0, 0, 2))
    with pytest.raises(OutOfOrderSequenceError):  # same first sequence, other length
        log.append(pbatch(7, 0, 10, 1))


def test_duplicate_under_log_append_time_answers_the_original_time(open_log, clock):
    log = open_log(LogConfig(message_timestamp_type=TimestampType.LOG_APPEND_TIME))
    first = log.append(pbatch(7, 0, 0))
    clock.advance(1000)
    retry = log.append(pbatch(7, 0, 0))
    assert retry.duplicate and retry.log_append_time == first.log_append_time == T0


def test_epoch_rules(open_log):
    log = open_log()
    log.append(pbatch(7, 1, 0, 2))
    with pytest.raises(InvalidProducerEpochError):
        log.append(pbatch(7, 0, 2))
    with pytest.raises(OutOfOrderSequenceError, match="starts at sequence 2"):
        log.append(pbatch(7, 2, 2))
    log.append(pbatch(7, 2, 0))
    with pytest.raises(InvalidProducerEpochError):  # a retry from the fenced epoch
        log.append(pbatch(7, 1, 0, 2))
    assert state_of(log)[7][0] == 2 and len(state_of(log)[7][2]) == 1


def test_sequences_wrap_to_zero(open_log):
    log = open_log()
    log.append(pbatch(7, 0, INT32_MAX - 1, 3))  # sequences 2**31-2, 2**31-1, 0
    assert state_of(log)[7][2][0][:2] == (INT32_MAX - 1, 0)
    log.append(pbatch(7, 0, 1))
    log.append(pbatch(8, 0, INT32_MAX))
    log.append(pbatch(8, 0, 0))


def test_negative_sequence_of_an_idempotent_batch_is_invalid(open_log):
    log = open_log()
    with pytest.raises(InvalidRecordError, match="sequence number -1"):
        log.append(pbatch(7, 0, -1))


def test_batches_of_one_append_are_checked_in_order(open_log, tmp_path):
    log = open_log()
    result = log.append(pbatch(7, 0, 0) + pbatch(8, 0, 5) + pbatch(7, 0, 1, 2))
    assert (result.first_offset, result.last_offset) == (0, 3)
    assert state_of(log)[7][2] == [(0, 0, 0, 0, T0), (1, 2, 2, 3, T0 + 1)]
    before = tree_digest(tmp_path)
    with pytest.raises(OutOfOrderSequenceError):  # the second batch has a gap: none written
        log.append(pbatch(7, 0, 3) + pbatch(7, 0, 5))
    with pytest.raises(OutOfOrderSequenceError):  # repeating a batch of the same append
        log.append(pbatch(7, 0, 3) + pbatch(7, 0, 3))
    with pytest.raises(InvalidProducerEpochError):  # an epoch bump fences the next batch
        log.append(pbatch(7, 1, 0) + pbatch(7, 0, 3))
    assert tree_digest(tmp_path) == before


def test_a_duplicate_anywhere_answers_for_the_whole_append(open_log, tmp_path):
    log = open_log()
    log.append(pbatch(7, 0, 0))
    before = tree_digest(tmp_path)
    result = log.append(pbatch(8, 0, 0) + pbatch(7, 0, 0))
    assert result.duplicate and (result.first_offset, result.last_offset) == (0, 0)
    assert tree_digest(tmp_path) == before and 8 not in state_of(log)


def test_errors_map_to_kafka_codes():
    assert error_code_for(OutOfOrderSequenceError()) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert error_code_for(InvalidProducerEpochError()) is ErrorCode.INVALID_PRODUCER_EPOCH


# Reservations -----------------------------------------------------------------------------


def test_reserved_commits_are_checked_like_appends(open_log):
    log = open_log(LogConfig(preallocate=True, segment_bytes=64 * 1024))
    data = pbatch(7, 0, 0)
    reservation = log.reserve(len(data))
    reservation.buffer[:] = data
    assert log.commit(reservation).first_offset == 0
    retry, later = log.reserve(len(data)), log.reserve(len(data))
    retry.buffer[:] = data
    assert log.commit(retry) == (0, 0, 0, 0, -1, True)
    assert not later.open  # it cannot commit past the discarded retry
    gap = pbatch(7, 0, 5)
    reservation = log.reserve(len(gap))
    reservation.buffer[:] = gap
    with pytest.raises(OutOfOrderSequenceError):
        log.commit(reservation)
    following = pbatch(7, 0, 1)
    reservation = log.reserve(len(following))
    reservation.buffer[:] = following
    assert log.commit(reservation).first_offset == 1
    assert log.log_end_offset == 2 and state_of(log)[7][2][-1][:4] == (1, 1, 1, 1)


# Followers --------------------------------------------------------------------------------


def test_followers_apply_without_checking_and_detect_duplicates_once_leaders(open_log):
    log = open_log()
    replicated = (
        pbatch(7, 0, 0, 2, offset=0) + pbatch(7, 0, 9, offset=2) + pbatch(8, 0, 4, offset=3)
    )
    log.append(replicated, assign_offsets=False)
    assert state_of(log)[7][2] == [(0, 1, 0, 1, T0 + 1), (9, 9, 2, 2, T0)]
    assert log.append(pbatch(7, 0, 9)) == (2, 2, 0, 0, -1, True)  # now leader: a retry
    assert log.append(pbatch(8, 0, 5)).first_offset == 4


def test_replicated_control_batch_moves_epoch_only(open_log):
    log = open_log()
    log.append(pbatch(7, 0, 0, offset=0), assign_offsets=False)
    marker = build_batch(
        [Record(1, T0 + 5, None, None)],
        producer_id=7,
        producer_epoch=1,
        base_sequence=-1,
        control=True,
        transactional=True,
    )
    log.append(marker, assign_offsets=False)
    assert state_of(log) == {7: (1, T0 + 5, [])}


# Restarts ---------------------------------------------------------------------------------


def test_state_survives_a_clean_restart_from_the_snapshot_alone(open_log):
    log = open_log(SMALL)
    for n in range(12):
        log.append(pbatch(n % 3, 0, n // 3))
    expected = state_of(log)
    log.close()
    end = log.log_end_offset
    assert snapshots(log)[-1] == end
    reopened = open_log(SMALL, clean_shutdown=True)
    assert state_of(reopened) == expected
    assert reopened.append(pbatch(0, 0, 3)).duplicate
    reopened.close()


def test_state_is_rebuilt_after_an_unclean_shutdown(open_log):
    log = open_log(SMALL)
    for n in range(15):
        log.append(pbatch(n % 2, 0, n // 2, ts=T0 + n))
    expected = state_of(log)
    assert 0 < snapshots(log)[-1] < log.log_end_offset  # the tail lies past the last roll
    reopened = open_log(SMALL)  # no close: headers after the last snapshot are replayed
    assert state_of(reopened) == expected
    assert reopened.append(pbatch(1, 0, 6)).duplicate


def test_snapshot_past_a_cut_tail_is_deleted_and_an_older_one_used(open_log):
    log = open_log(SMALL)
    for n in range(15):
        log.append(pbatch(7, 0, n))
    head = log.segments[-1]
    positions = [p for p, _ in head.headers_from(0)]
    log.close()
    assert snapshots(log)[-1] == 15
    with open(head.log.path, "r+b") as file:  # the crash lost the last two batches
        file.truncate(positions[-2])
    reopened = open_log(SMALL)
    assert reopened.log_end_offset == 13
    assert snapshots(reopened)[-1] == head.base_offset
    assert state_of(reopened) == {7: (0, T0, [(s, s, s, s, T0) for s in range(8, 13)])}


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-1],
        lambda data: data[:5],
        lambda data: b"",
        lambda data: data[:20] + bytes([data[20] ^ 1]) + data[21:],
        lambda data: b"\x00\x09" + data[2:],  # an unknown version
    ],
)
def test_a_corrupt_snapshot_is_deleted_and_the_state_rebuilt(open_log, damage):
    log = open_log(SMALL)
    for n in range(15):
        log.append(pbatch(n % 2, 0, n // 2))
    expected = state_of(log)
    log.close()
    newest = log.directory / f"{log.log_end_offset:020d}{SNAPSHOT_SUFFIX}"
    newest.write_bytes(damage(newest.read_bytes()))
    reopened = open_log(SMALL, clean_shutdown=True)
    assert not newest.exists()
    assert state_of(reopened) == expected


def test_snapshots_kept_are_the_two_newest_and_the_one_recovery_needs(open_log):
    log = open_log(SMALL)
    for n in range(10):
        log.append(pbatch(7, 0, n))
    first = snapshots(log)[-1]
    log.flush()
    log.update_high_watermark(log.log_end_offset)
    for n in range(10, 50):
        log.append(pbatch(7, 0, n))
    kept = snapshots(log)
    assert len(kept) == 3 and kept[0] == first  # newest at or below the recovery point
    log.flush()
    log.update_high_watermark(log.log_end_offset)
    log.append(pbatch(7, 0, 50))
    log.roll()
    assert len(snapshots(log)) == 2


# Truncation, retention, expiry ------------------------------------------------------------


def test_truncation_rebuilds_the_state_and_drops_later_snapshots(open_log):
    log = open_log(SMALL)
    for n in range(20):
        log.append(pbatch(7, 0, n))
    log.truncate_to(8)
    assert all(o <= 8 for o in snapshots(log))
    assert state_of(log)[7][2] == [(s, s, s, s, T0) for s in range(3, 8)]
    assert not log.append(pbatch(7, 0, 8)).duplicate  # offset 8 is gone: not a retry
    log.truncate_fully_and_start_at(100)
    assert len(log.producers) == 0 and snapshots(log) == []
    log.append(pbatch(7, 0, 12))  # unknown again: any sequence
    assert state_of(log)[7][2] == [(12, 12, 100, 100, T0)]


def test_retention_drops_producers_whose_data_is_gone(open_log, clock):
    log = open_log(LogConfig(segment_bytes=600, retention_bytes=100))
    log.append(pbatch(1, 0, 0))
    for n in range(10):
        log.append(pbatch(2, 0, n))
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_retained_segments() > 0
    assert 1 not in state_of(log) and 2 in state_of(log)
    assert all(o >= log.log_start_offset for o in snapshots(log))


def test_expiry_forgets_idle_producers(open_log, clock):
    log = open_log(producer_id_expiration_ms=1000)
    log.append(pbatch(1, 0, 0, ts=clock.now))
    clock.advance(500)
    log.append(pbatch(2, 0, 0, ts=clock.now))
    assert log.expire_producers(clock.now + 499) == 0
    assert log.expire_producers(clock.now + 500) == 1 and list(state_of(log)) == [2]
    log.append(pbatch(1, 0, 7, ts=clock.now))  # forgotten: any sequence is accepted
    log.close()
    clock.advance(1000)
    assert len(open_log(clean_shutdown=True, producer_id_expiration_ms=1000).producers) == 0


# The sans-I/O manager and its snapshot format ---------------------------------------------

entries = st.dictionaries(
    st.integers(0, (1 << 63) - 1),
    st.builds(
        ProducerEntry,
        st.integers(-(1 << 15), (1 << 15) - 1),
        st.integers(-(1 << 63), (1 << 63) - 1),
        st.lists(
            st.builds(
                BatchMetadata,
                st.integers(0, INT32_MAX),
                st.integers(0, INT32_MAX),
                st.integers(0, 999),
                st.integers(0, 999),
                st.integers(-(1 << 63), (1 << 63) - 1),
            ).filter(lambda b: b.first_offset <= b.last_offset),
            max_size=5,
        ),
        st.integers(-1, 999),  # open transaction's first offset
        st.integers(-1, INT32_MAX),  # coordinator epoch
    ),
    max_size=6,
)


@given(entries, st.data())
def test_snapshot_round_trip_and_any_damage_is_refused(producers, data):
    state = ProducerStateManager()
    state._producers = producers
    encoded = state.snapshot(1000)
    restored = ProducerStateManager()
    restored.restore(1000, encoded)
    assert restored.entries() == producers
    with pytest.raises(ValueError):
        restored.restore(1001, encoded)
    position = data.draw(st.integers(0, len(encoded) - 1))
    damaged = bytearray(encoded)
    damaged[position] ^= data.draw(st.integers(1, 255))
    try:
        restored.restore(1000, bytes(damaged))
    except ValueError:
        pass  # a refused snapshot changes nothing
    else:  # the version lies outside the CRC: no entries read the same in any version
        assert position < 2 and not producers
    assert restored.entries() == producers


def test_version_1_and_2_snapshots_still_load():
    """Written by older brokers: version 1 has no open transaction, neither 1 nor 2 a
    coordinator epoch (-1: the next marker of any coordinator epoch is taken)."""
    batch = struct.pack(">iiqqq", 0, 2, 10, 12, T0)
    v2_entry = struct.pack(">qhqbq", 7, 3, T0, 1, 11) + batch
    v1_entry = struct.pack(">qhqb", 7, 3, T0, 1) + batch
    for version, entry, txn_first_offset in ((2, v2_entry, 11), (1, v1_entry, -1)):
        body = struct.pack(">qi", 20, 1) + entry
        crc = crc32c(body)
        state = ProducerStateManager()
        state.restore(20, struct.pack(">hI", version, crc) + body)
        assert state.entries() == {
            7: ProducerEntry(3, T0, [BatchMetadata(0, 2, 10, 12, T0)], txn_first_offset, -1)
        }
        assert state.first_unstable_offset(20) == (None if version == 1 else 11)
        state.check_marker(7, 3, 0)  # nothing to fence against


def txn_pbatch(producer_id: int, sequence: int) -> bytes:
    return build_batch(
        [Record(0, T0, None, b"t")],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=sequence,
        transactional=True,
    )


@pytest.mark.parametrize("clean_shutdown", [True, False])
def test_the_coordinator_epoch_of_the_last_marker_survives_a_restart(open_log, clean_shutdown):
    """From the snapshot (marker 1, before the roll) or from the replay after it (marker 2,
    read back from the log after an unclean shutdown): an older coordinator is fenced."""
    log = open_log(SMALL)
    log.append(txn_pbatch(1, 0), leader_epoch=0)
    log.append_marker(1, 0, True, 5, leader_epoch=0)
    log.append(txn_pbatch(2, 0), leader_epoch=0)
    log.append_marker(2, 0, False, 9, leader_epoch=0)
    log.roll()  # a snapshot holding both epochs
    log.append(txn_pbatch(2, 1), leader_epoch=0)
    log.append_marker(2, 0, True, 11, leader_epoch=0)  # after the snapshot
    if clean_shutdown:
        log.close()
    reopened = open_log(SMALL, clean_shutdown=clean_shutdown)
    epochs = {pid: e.coordinator_epoch for pid, e in reopened.producers.entries().items()}
    assert epochs == {1: 5, 2: 11}
    for producer_id, stale in ((1, 4), (2, 10)):
        reopened.append(txn_pbatch(producer_id, 1 if producer_id == 1 else 2), leader_epoch=0)
        end = reopened.log_end_offset
        with pytest.raises(KafkaError) as fenced:
            reopened.append_marker(producer_id, 0, True, stale, leader_epoch=0)
        assert fenced.value.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED
        assert reopened.log_end_offset == end
    reopened.append_marker(1, 0, True, 5, leader_epoch=0)


def test_snapshot_files_ignore_other_names(tmp_path):
    (tmp_path / "00000000000000000007.snapshot").write_bytes(b"")
    (tmp_path / "7.snapshot").write_bytes(b"")
    (tmp_path / "00000000000000000007.log").write_bytes(b"")
    files = ProducerSnapshotFiles(tmp_path)
    assert files.offsets == [7]
    state = ProducerStateManager()
    assert files.restore(state, 10) is None and files.offsets == []


# The stateful property: the log's producer state always equals a model's -------------------


@dataclass(frozen=True)
class Written:
    """A batch as the model believes the log holds it."""

    producer_id: int
    epoch: int
    sequence: int
    count: int
    base_offset: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1


def wrap(sequence: int) -> int:
    return sequence - INT32_MAX - 1 if sequence > INT32_MAX else sequence


def replay(written: list[Written]) -> dict[int, tuple[int, int, list[tuple[int, ...]]]]:
    """What the state must be after these batches: per producer its latest epoch, the max
    timestamp of its latest batch and its last five batches of that epoch."""
    state: dict[int, tuple[int, int, list[tuple[int, ...]]]] = {}
    for b in written:
        if b.producer_id < 0:
            continue
        epoch, _, batches = state.get(b.producer_id, (b.epoch, 0, []))
        if epoch != b.epoch:
            batches = []
        last = wrap(b.sequence + b.count - 1)
        meta = (b.sequence, last, b.base_offset, b.last_offset, T0 + b.count - 1)
        state[b.producer_id] = (b.epoch, T0 + b.count - 1, [*batches, meta][-5:])
    return state


def predict(written: list[Written], specs: list[tuple[int, int, int, int]], end: int) -> object:
    """The outcome Kafka's rules give a leader append of `specs` (producer id, epoch,
    sequence, count): "ok", an error class, or the (first, last) offsets it duplicates."""
    model = list(written)
    offset = end
    for pid, epoch, sequence, count in specs:
        if pid >= 0:
            known = replay(model).get(pid)
            last = wrap(sequence + count - 1)
            if known is not None:
                current, _, batches = known
                if epoch < current:
                    return InvalidProducerEpochError
                if epoch > current and sequence != 0:
                    return OutOfOrderSequenceError
                if epoch == current:
                    for first_seq, last_seq, first, last_offset, _ in batches:
                        if (first_seq, last_seq) == (sequence, last) and first < end:
                            return (first, last_offset)
                    expected = wrap(batches[-1][1] + 1) if batches else 0
                    if sequence != expected:
                        return OutOfOrderSequenceError
        model.append(Written(pid, epoch, sequence, count, offset))
        offset += count
    return "ok"


class ProducerStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self.directory = Path(self._tmp.name) / "t-0"
        self.clock = ManualClock()
        self.log = self._open(clean=False)
        self.written: list[Written] = []
        self.base = 0  # where the log (re)started

    def _open(self, *, clean: bool) -> PartitionLog:
        return PartitionLog.open(self.directory, SMALL, clean_shutdown=clean, clock=self.clock)

    @property
    def end(self) -> int:
        return self.written[-1].last_offset + 1 if self.written else self.base

    def _specs(self, data: st.DataObject) -> list[tuple[int, int, int, int]]:
        specs = []
        for _ in range(data.draw(st.integers(1, 2))):
            pid = data.draw(st.sampled_from([-1, 0, 1, 2]))
            count = data.draw(st.integers(1, 3))
            known = replay(self.written).get(pid)
            epoch, batches = (known[0], known[2]) if known else (0, [])
            epoch = max(epoch + data.draw(st.sampled_from([0, 0, 0, 1, -1])), 0)
            choice = data.draw(st.sampled_from(["next", "next", "dup", "zero", "any", "wrap"]))
            sequence = {
                "next": wrap(batches[-1][1] + 1) if batches else 0,
                "zero": 0,
                "any": data.draw(st.integers(0, 12)),
                "wrap": INT32_MAX - 1,
                "dup": batches[0][0] if batches else 0,
            }[choice]
            if choice == "dup" and batches:
                dup = data.draw(st.sampled_from(batches))
                sequence, count = dup[0], dup[3] - dup[2] + 1
            specs.append((pid, epoch, -1 if pid < 0 else sequence, count))
        return specs

    @staticmethod
    def _buffer(specs: list[tuple[int, int, int, int]], offset: int) -> bytes:
        out = b""
        for pid, epoch, sequence, count in specs:
            out += pbatch(pid, epoch if pid >= 0 else -1, sequence, count, offset=offset)
            offset += count
        return out

    @rule(data=st.data())
    def produce(self, data: st.DataObject) -> None:
        specs = self._specs(data)
        expected = predict(self.written, specs, self.end)
        try:
            result = self.log.append(self._buffer(specs, 0))
        except (OutOfOrderSequenceError, InvalidProducerEpochError) as error:
            event(type(error).__name__)
            assert expected is type(error)
            return
        if result.duplicate:
            event("duplicate")
            assert expected == (result.first_offset, result.last_offset)
            return
        event("appended")
        assert expected == "ok" and result.first_offset == self.end
        offset = self.end
        for pid, epoch, sequence, count in specs:
            self.written.append(Written(pid, epoch, sequence, count, offset))
            offset += count

    @rule(data=st.data())
    def replicate(self, data: st.DataObject) -> None:
        specs = self._specs(data)
        self.log.append(self._buffer(specs, self.end), assign_offsets=False)
        for pid, epoch, sequence, count in specs:
            self.written.append(Written(pid, epoch, sequence, count, self.end))

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def restart_clean(self) -> None:
        self.log.close()
        self.log = self._open(clean=True)

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """Stop without closing (only descriptors are released, nothing is flushed or
        snapshotted), maybe losing every batch from some batch on, and recover."""
        kept = data.draw(st.integers(0, len(self.written)))
        cuts = self._cuts_losing(self.written[kept].base_offset) if kept < len(self.written) else []
        for segment in self.log.segments:
            segment.close()
        for path, position in cuts:
            if position is None:
                for suffix in (".log", ".index", ".timeindex"):
                    path.with_suffix(suffix).unlink()
            else:
                with open(path, "r+b") as file:
                    file.truncate(position)
        del self.written[kept:]
        self.log = self._open(clean=False)

    def _cuts_losing(self, offset: int) -> list[tuple[Path, int | None]]:
        """(.log file, where to cut it or None to delete its segment) to lose `offset` on."""
        cuts: list[tuple[Path, int | None]] = []
        for index, segment in enumerate(self.log.segments):
            if segment.next_offset <= offset:
                continue
            if segment.base_offset >= offset and index > 0:
                cuts.append((segment.log.path, None))
            else:
                headers = segment.headers_from(0)
                cuts.append(
                    (segment.log.path, next(p for p, h in headers if h.base_offset >= offset))
                )
        return cuts

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.base, self.end))
        self.log.truncate_to(offset)
        if offset < self.end and offset <= self.base:
            self.base, self.written = offset, []
        else:
            self.written = [b for b in self.written if b.last_offset < offset]

    @rule(gap=st.integers(0, 3))
    def restart_empty(self, gap: int) -> None:
        self.base = self.end + gap
        self.log.truncate_fully_and_start_at(self.base)
        self.written = []

    @invariant()
    def state_matches_the_model(self) -> None:
        assert self.log.log_end_offset == self.end
        assert state_of(self.log) == replay(self.written)
        stored = [
            (h.base_offset, h.producer_id, h.base_sequence)
            for s in self.log.segments
            for _, h in s.headers_from(0)
        ]
        assert stored == [(b.base_offset, b.producer_id, b.sequence) for b in self.written]
        assert len(snapshots(self.log)) <= 3

    def teardown(self) -> None:
        self.log.close()
        self._tmp.cleanup()


ProducerStateMachine.TestCase.settings = settings(stateful_step_count=30)
test_producer_state_machine = ProducerStateMachine.TestCase


def test_read_back_is_unaffected_by_idempotent_batches(open_log):
    log = open_log()
    log.append(pbatch(7, 0, 0, 2))
    log.append(pbatch(7, 0, 0, 2))
    assert [r.offset for r in read_all(log)] == [0, 1]
