"""Durable member state: transaction log, hard state, snapshots, load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.consensus.payloads import Logged, decode_logged, encode_logged
from services.consensus.storage import (
    CorruptHardStateError,
    DataDir,
    HardStateFile,
    LogFailedError,
    Snapshots,
    TxnLog,
    load,
)
from services.consensus.storage.snapshots import snapshot_name
from services.consensus.storage.txn_log import RECORD_HEADER, encode_record, segment_name
from services.consensus.tree import (
    OPEN_ACL_UNSAFE,
    Create,
    CreateMode,
    CreateSession,
    DataTree,
    Multi,
    Request,
    Session,
    SetData,
    Txn,
)
from services.consensus.zab import EMPTY_SNAPSHOT, HardState, LogEntry, PersistedState, make_zxid

REPO = Path(__file__).resolve().parents[2]


def entry(counter: int, epoch: int = 1) -> LogEntry:
    zxid = make_zxid(epoch, counter)
    return LogEntry(zxid, f"txn-{zxid:x}".encode() * (counter % 3 + 1))


def entries(first: int, count: int, epoch: int = 1) -> list[LogEntry]:
    return [entry(c, epoch) for c in range(first, first + count)]


def read_all(log: TxnLog) -> list[LogEntry]:
    return list(log.read_from(0))


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts os.fsync and os.fdatasync calls; the real ones still run."""
    calls: list[int] = []
    for name in ("fsync", "fdatasync"):
        real: Callable[[int], None] = getattr(os, name)

        def counting(fd: int, real: Callable[[int], None] = real) -> None:
            calls.append(fd)
            real(fd)

        monkeypatch.setattr(os, name, counting)
    return calls


def record_end(data: bytes) -> int:
    """Where the records of a segment file end and its preallocated zeros begin."""
    pos = 0
    while pos + RECORD_HEADER.size <= len(data):
        length, _crc, zxid = RECORD_HEADER.unpack_from(data, pos)
        if zxid == 0:
            break
        pos += RECORD_HEADER.size + length
    return pos


# -- transaction log ---------------------------------------------------------------------


def test_round_trip_across_segment_rolls(tmp_path: Path) -> None:
    written = entries(1, 60)
    with TxnLog(tmp_path, segment_bytes=256) as log:
        assert log.sync() == 0
        for start in range(0, 60, 7):
            log.append(written[start : start + 7])
            assert log.sync() == written[min(start + 7, 60) - 1].zxid
        segments = log.segments()
        assert len(segments) > 3
        for first, path in segments:
            assert path.name == segment_name(first)
            assert path.stat().st_size >= 1
        firsts = [first for first, _ in segments]
        assert firsts == sorted(firsts) and firsts[0] == written[0].zxid
        assert read_all(log) == written
        assert list(log.read_from(written[29].zxid)) == written[30:]
        assert list(log.read_from(written[-1].zxid)) == []
    with TxnLog(tmp_path, segment_bytes=256) as log:
        assert read_all(log) == written
        assert log.last_zxid == log.durable_zxid == written[-1].zxid
        assert [first for first, _ in log.segments()] == firsts
        log.append(entries(61, 5))
        log.sync()
    with TxnLog(tmp_path, segment_bytes=256) as log:
        assert read_all(log) == entries(1, 65)


def test_segment_files_hold_documented_records(tmp_path: Path) -> None:
    with TxnLog(tmp_path, segment_bytes=4096) as log:
        log.append([LogEntry(make_zxid(1, 1), b"abc")])
        log.sync()
    raw = (tmp_path / segment_name(make_zxid(1, 1))).read_bytes()
    length, _crc, zxid = RECORD_HEADER.unpack_from(raw)
    end = RECORD_HEADER.size + 3
    assert (length, zxid, raw[RECORD_HEADER.size : end]) == (3, make_zxid(1, 1), b"abc")
    assert len(raw) == 4096 and raw[end:] == bytes(4096 - end)  # preallocated


def test_read_from_includes_buffered_entries(tmp_path: Path) -> None:
    with TxnLog(tmp_path) as log:
        log.append(entries(1, 3))
        log.sync()
        log.append(entries(4, 2))
        assert log.last_zxid == entry(5).zxid and log.durable_zxid == entry(3).zxid
        assert read_all(log) == entries(1, 5)
    with TxnLog(tmp_path) as log:  # close dropped the unsynced ones
        assert read_all(log) == entries(1, 3)


def test_group_commit_one_fsync(tmp_path: Path, fsyncs: list[int]) -> None:
    with TxnLog(tmp_path) as log:
        log.append(entries(1, 1))
        log.sync()
        assert len(fsyncs) == 2  # the new segment file, and its directory entry
        fsyncs.clear()
        for counter in range(2, 202):
            log.append([entry(counter)])
        assert fsyncs == []
        assert log.sync() == entry(201).zxid
        assert len(fsyncs) == 1
        fsyncs.clear()
        assert log.sync() == entry(201).zxid  # nothing written, nothing to sync
        assert fsyncs == []
    with TxnLog(tmp_path) as log:
        assert read_all(log) == entries(1, 201)


def test_force_sync_off_writes_without_fsync(tmp_path: Path, fsyncs: list[int]) -> None:
    with TxnLog(tmp_path, segment_bytes=128, force_sync=False) as log:
        log.append(entries(1, 40))
        assert log.sync() == entry(40).zxid
        assert len(log.segments()) > 1
    assert fsyncs == []
    with TxnLog(tmp_path) as log:  # written to the OS, so a process crash keeps them
        assert read_all(log) == entries(1, 40)


def test_zxids_must_strictly_increase(tmp_path: Path) -> None:
    with TxnLog(tmp_path) as log:
        log.append(entries(1, 3))
        with pytest.raises(ValueError):
            log.append([entry(3)])
        with pytest.raises(ValueError):
            log.append([entry(5), entry(4)])
        with pytest.raises(ValueError):
            log.append([LogEntry(0, b"")])
        assert log.last_zxid == entry(3).zxid
        log.sync()
        assert read_all(log) == entries(1, 3)


def test_truncate_across_segments_then_append(tmp_path: Path) -> None:
    with TxnLog(tmp_path, segment_bytes=200) as log:
        log.append(entries(1, 50))
        log.sync()
        log.append(entries(51, 5))  # buffered, partly truncated too
        before = log.segments()
        assert len(before) > 4
        keep_to = entry(12).zxid
        log.truncate_to(keep_to)
        assert log.last_zxid == log.durable_zxid == keep_to
        assert read_all(log) == entries(1, 12)
        assert all(first <= keep_to for first, _ in log.segments())
        removed = [path for first, path in before if first > keep_to]
        assert removed and not any(path.exists() for path in removed)
        new = entries(1, 30, epoch=2)
        log.append(new)
        log.sync()
        assert read_all(log) == entries(1, 12) + new
    with TxnLog(tmp_path, segment_bytes=200) as log:
        assert read_all(log) == entries(1, 12) + new


def test_truncate_keeps_buffered_prefix_durable(tmp_path: Path) -> None:
    with TxnLog(tmp_path) as log:
        log.append(entries(1, 10))
        log.truncate_to(entry(6).zxid)
        assert log.durable_zxid == entry(6).zxid
    with TxnLog(tmp_path) as log:
        assert read_all(log) == entries(1, 6)
        log.truncate_to(0)
        assert read_all(log) == [] and log.segments() == [] and log.last_zxid == 0
        log.append(entries(1, 2, epoch=3))
        log.sync()
    with TxnLog(tmp_path) as log:
        assert read_all(log) == entries(1, 2, epoch=3)


def test_torn_tail_is_cut_on_reopen(tmp_path: Path) -> None:
    with TxnLog(tmp_path, segment_bytes=4096) as log:
        log.append(entries(1, 10))
        log.sync()
        ((_, path),) = log.segments()
    data = bytearray(path.read_bytes())
    end = record_end(data)
    data[end - 3 : end] = bytes(3)  # a crash mid-write: the last record's end never landed
    path.write_bytes(bytes(data))
    with TxnLog(tmp_path, segment_bytes=4096) as log:
        assert read_all(log) == entries(1, 9)
        assert log.last_zxid == entry(9).zxid
        cut = record_end(path.read_bytes())
        assert cut < end - 3
        assert path.read_bytes()[cut:] == bytes(4096 - cut)  # cut, then preallocated again
        log.append([entry(10)])
        log.sync()
    assert record_end(path.read_bytes()) == end
    with TxnLog(tmp_path) as log:
        assert read_all(log) == entries(1, 10)


def test_zero_fill_is_the_end_and_a_torn_header_is_cut(tmp_path: Path) -> None:
    with TxnLog(tmp_path, segment_bytes=4096) as log:
        log.append(entries(1, 4))
        log.sync()
        ((_, path),) = log.segments()
    before = path.read_bytes()
    end = record_end(before)
    with TxnLog(tmp_path, segment_bytes=4096) as log:  # the preallocated zeros are no damage
        assert read_all(log) == entries(1, 4)
    assert path.read_bytes() == before
    with open(path, "r+b") as f:
        f.seek(end)
        f.write(b"\0\0\0\x07\x01")  # half a header
    with TxnLog(tmp_path, segment_bytes=4096) as log:
        assert read_all(log) == entries(1, 4)
    assert path.read_bytes() == before


def test_flipped_byte_cuts_there_and_drops_later_segments(tmp_path: Path) -> None:
    written = entries(1, 40)
    with TxnLog(tmp_path, segment_bytes=200) as log:
        log.append(written)
        log.sync()
        segments = log.segments()
    assert len(segments) >= 3
    first, path = segments[1]
    data = bytearray(path.read_bytes())
    # The third record of the second segment: skip two records, then hit its payload.
    pos = 0
    for _ in range(2):
        length = int.from_bytes(data[pos : pos + 4], "big")
        pos += RECORD_HEADER.size + length
    data[pos + RECORD_HEADER.size] ^= 0x40
    path.write_bytes(bytes(data))
    index = next(i for i, e in enumerate(written) if e.zxid == first)
    with TxnLog(tmp_path, segment_bytes=200) as log:
        assert read_all(log) == written[: index + 2]
        assert [f for f, _ in log.segments()] == [segments[0][0], first]
    after = path.read_bytes()
    assert after[:pos] == data[:pos] and after[pos:] == bytes(len(after) - pos)
    assert not any(p.exists() for _, p in segments[2:])


def test_corrupt_first_record_removes_segment(tmp_path: Path) -> None:
    with TxnLog(tmp_path, segment_bytes=100) as log:
        log.append(entries(1, 10))
        log.sync()
        segments = log.segments()
    _, path = segments[1]
    data = bytearray(path.read_bytes())
    data[5] ^= 1  # the CRC of its first record
    path.write_bytes(bytes(data))
    with TxnLog(tmp_path, segment_bytes=100) as log:
        assert log.segments() == segments[:1]
        assert read_all(log) == entries(1, segments[1][0] - segments[0][0])
        log.append([entry(50)])
        log.sync()
        assert log.segments()[-1][0] == entry(50).zxid


def test_out_of_order_records_are_cut(tmp_path: Path) -> None:
    a, b, c, d = entries(1, 4)
    first = tmp_path / segment_name(a.zxid)
    first.write_bytes(encode_record(a) + encode_record(c) + encode_record(b))
    (tmp_path / segment_name(d.zxid)).write_bytes(encode_record(d))
    with TxnLog(tmp_path) as log:
        assert read_all(log) == [a, c]
        assert [f for f, _ in log.segments()] == [a.zxid]
    assert not (tmp_path / segment_name(d.zxid)).exists()


def test_segment_not_matching_its_name_is_dropped(tmp_path: Path) -> None:
    a, b, c = entries(1, 3)
    (tmp_path / segment_name(a.zxid)).write_bytes(encode_record(a))
    (tmp_path / segment_name(b.zxid)).write_bytes(encode_record(c))
    with TxnLog(tmp_path) as log:
        assert read_all(log) == [a]
        assert [f for f, _ in log.segments()] == [a.zxid]


def test_empty_segment_file_from_a_crash_is_dropped(tmp_path: Path) -> None:
    with TxnLog(tmp_path) as log:
        log.append(entries(1, 3))
        log.sync()
    (tmp_path / segment_name(entry(4).zxid)).touch()  # created, then the crash
    for _ in range(2):
        with TxnLog(tmp_path) as log:
            assert read_all(log) == entries(1, 3)
            assert len(log.segments()) == 1
    with TxnLog(tmp_path) as log:
        log.append(entries(4, 2))
        log.sync()
    with TxnLog(tmp_path) as log:
        assert read_all(log) == entries(1, 5)


def test_failed_fsync_poisons_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with TxnLog(tmp_path) as log:
        log.append(entries(1, 2))
        log.sync()
        log.append(entries(3, 2))

        def failing(fd: int) -> None:
            raise OSError(5, "Input/output error")

        with monkeypatch.context() as patch:
            patch.setattr(os, "fsync", failing)
            patch.setattr(os, "fdatasync", failing)
            with pytest.raises(OSError):
                log.sync()
        assert log.durable_zxid == entry(2).zxid
        with pytest.raises(LogFailedError):
            log.sync()  # never report durable what a failed fsync may have dropped
        with pytest.raises(LogFailedError):
            log.append(entries(5, 1))
    with TxnLog(tmp_path) as log:  # reopening recovers what reached the file
        assert read_all(log)[:2] == entries(1, 2)


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 6)),
        st.tuples(st.just("sync"), st.just(0)),
        st.tuples(st.just("truncate"), st.integers(0, 40)),
        st.tuples(st.just("reopen"), st.just(0)),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS, segment_bytes=st.sampled_from([64, 160, 1 << 20]))
def test_reopen_returns_exactly_the_synced_prefix(
    ops: list[tuple[str, int]], segment_bytes: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        log = TxnLog(directory, segment_bytes=segment_bytes)
        appended: list[LogEntry] = []
        durable = 0
        counter = 0
        try:
            for op, arg in ops:
                if op == "append":
                    batch = []
                    for _ in range(arg):
                        counter += 1
                        batch.append(entry(counter))
                    log.append(batch)
                    appended += batch
                elif op == "sync":
                    log.sync()
                    durable = len(appended)
                elif op == "truncate":
                    cut = make_zxid(1, arg)
                    log.truncate_to(cut)
                    appended = [e for e in appended if e.zxid <= cut]
                    durable = len(appended)
                    counter = max(counter, arg)  # later zxids must still increase
                else:
                    log.close()
                    appended = appended[:durable]
                    log = TxnLog(directory, segment_bytes=segment_bytes)
                assert read_all(log) == appended
                assert log.last_zxid == (appended[-1].zxid if appended else 0)
        finally:
            log.close()
        with TxnLog(directory, segment_bytes=segment_bytes) as reopened:
            assert read_all(reopened) == appended[:durable]


_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from services.consensus.storage import DataDir
    from services.consensus.zab import HardState, LogEntry, make_zxid

    data_dir = DataDir(Path(sys.argv[1]), segment_bytes=4096)
    data_dir.save_hard_state(HardState(1, 1, 1))
    counter = 0
    while True:
        batch = []
        for _ in range(1 + counter % 5):
            counter += 1
            batch.append(LogEntry(make_zxid(1, counter), b"x" * (counter % 97)))
        data_dir.append(batch)
        print(data_dir.sync(), flush=True)
    """
)


def test_sigkill_keeps_every_reported_zxid(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    reported: list[int] = []
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 10
        while len(reported) < 300 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            reported.append(int(line))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()
    assert len(reported) >= 20, "child made too little progress"
    state = load(tmp_path)
    zxids = [e.zxid for e in state.log]
    assert state.hard_state == HardState(1, 1, 1)
    assert zxids == [make_zxid(1, c) for c in range(1, len(zxids) + 1)]  # dense, ordered
    assert set(reported) <= set(zxids)
    assert all(e.payload == b"x" * ((e.zxid & 0xFFFFFFFF) % 97) for e in state.log)


# -- hard state --------------------------------------------------------------------------


def test_hard_state_round_trip(tmp_path: Path) -> None:
    hs = HardStateFile(tmp_path)
    assert hs.read() is None
    hs.write(HardState(accepted_epoch=7, accepted_leader=3, current_epoch=6))
    hs.write(HardState(accepted_epoch=8, accepted_leader=-1, current_epoch=7))
    assert HardStateFile(tmp_path).read() == HardState(8, -1, 7)
    assert [p.name for p in tmp_path.iterdir()] == ["hardstate"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "extend"])
def test_corrupt_hard_state_is_a_typed_error(tmp_path: Path, damage: str) -> None:
    hs = HardStateFile(tmp_path)
    hs.write(HardState(5, 2, 5))
    data = bytearray(hs.path.read_bytes())
    if damage == "flip":
        data[10] ^= 0x01
    elif damage == "truncate":
        del data[-3:]
    elif damage == "empty":
        data.clear()
    else:
        data += b"\0"
    hs.path.write_bytes(bytes(data))
    with pytest.raises(CorruptHardStateError):
        hs.read()
    with pytest.raises(CorruptHardStateError):
        load(tmp_path)


def test_missing_hard_state_with_a_log_is_an_error(tmp_path: Path) -> None:
    with DataDir(tmp_path) as data_dir:
        data_dir.append(entries(1, 2))
        data_dir.sync()
    with pytest.raises(CorruptHardStateError):
        load(tmp_path)


# -- snapshots ---------------------------------------------------------------------------


def test_latest_valid_skips_corrupt_newest(tmp_path: Path) -> None:
    snaps = Snapshots(tmp_path)
    assert snaps.latest_valid() is None
    for counter in (10, 20, 30):
        snaps.write(make_zxid(1, counter), f"tree@{counter}".encode() * 50)
    newest = tmp_path / snapshot_name(make_zxid(1, 30))
    data = bytearray(newest.read_bytes())
    data[-7] ^= 0xFF
    newest.write_bytes(bytes(data))
    latest = snaps.latest_valid()
    assert latest is not None
    assert (latest.zxid, latest.data) == (make_zxid(1, 20), b"tree@20" * 50)
    middle = tmp_path / snapshot_name(make_zxid(1, 20))
    os.truncate(middle, middle.stat().st_size - 1)  # a short file fails the length check
    latest = snaps.latest_valid()
    assert latest is not None and latest.zxid == make_zxid(1, 10)
    # A valid file under another zxid's name is not trusted either.
    os.replace(tmp_path / snapshot_name(make_zxid(1, 10)), newest)
    assert snaps.latest_valid() is None


def test_purge_keeps_n_and_removes_segments_below_oldest_kept(tmp_path: Path) -> None:
    with DataDir(tmp_path, segment_bytes=200) as data_dir:
        data_dir.save_hard_state(HardState(1, 1, 1))
        data_dir.append(entries(1, 100))
        data_dir.sync()
        segments = data_dir.log.segments()
        assert len(segments) > 6
        snap_counters = [15, 40, 60, 80]
        for counter in snap_counters:
            data_dir.save_snapshot(make_zxid(1, counter), b"tree%d" % counter)
        assert data_dir.purge(keep=5) == ([], [])  # fewer than 5 valid: nothing to do
        removed_snaps, removed_segments = data_dir.purge(keep=2)
        oldest_kept = make_zxid(1, 60)
        assert removed_snaps == [make_zxid(1, 15), make_zxid(1, 40)]
        assert data_dir.snapshots.zxids() == [oldest_kept, make_zxid(1, 80)]
        firsts = [first for first, _ in segments]
        expected = [
            path for i, (_, path) in enumerate(segments[:-1]) if firsts[i + 1] <= oldest_kept + 1
        ]
        assert removed_segments == expected and expected
        assert not any(p.exists() for p in expected)
        # The log still holds every entry after the oldest kept snapshot.
        assert data_dir.log.segments()[0][0] <= oldest_kept
        assert list(data_dir.log.read_from(oldest_kept)) == entries(61, 40)
        state = data_dir.load()
    assert state.snapshot.zxid == make_zxid(1, 80)
    assert state.log == tuple(entries(81, 20))


# -- load --------------------------------------------------------------------------------


def test_empty_dir_loads_as_fresh_member(tmp_path: Path) -> None:
    for directory in (tmp_path, tmp_path / "not" / "yet"):
        state = load(directory)
        assert state == PersistedState()
        assert state.hard_state == HardState()
        assert state.snapshot == EMPTY_SNAPSHOT


def test_load_returns_snapshot_and_log_after_it(tmp_path: Path) -> None:
    with DataDir(tmp_path, segment_bytes=300) as data_dir:
        data_dir.save_hard_state(HardState(2, 4, 2))
        data_dir.append(entries(1, 30))
        data_dir.sync()
        data_dir.save_snapshot(entry(20).zxid, b"tree-at-20")
        data_dir.append(entries(31, 3))  # never synced: lost with the process
    (tmp_path / "snapshot.0000000100000099.tmp").write_bytes(b"half")
    state = load(tmp_path)
    assert state.hard_state == HardState(2, 4, 2)
    assert (state.snapshot.zxid, state.snapshot.data) == (entry(20).zxid, b"tree-at-20")
    assert state.log == tuple(entries(21, 10))
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_truncate_drops_snapshots_above(tmp_path: Path) -> None:
    with DataDir(tmp_path) as data_dir:
        data_dir.save_hard_state(HardState(1, 1, 1))
        data_dir.append(entries(1, 30))
        data_dir.sync()
        data_dir.save_snapshot(entry(10).zxid, b"t10")
        data_dir.save_snapshot(entry(25).zxid, b"t25")
        data_dir.truncate_to(entry(18).zxid)
        state = data_dir.load()
    assert state.snapshot.zxid == entry(10).zxid
    assert state.log == tuple(entries(11, 8))


# -- null znode data through the data directory -------------------------------------------


def test_null_and_empty_znode_data_survive_a_reload(tmp_path: Path) -> None:
    """A tree rebuilt from a data directory (its snapshot, then the log after it) holds
    null data (None) and empty data (b"") where the member's tree held them."""
    tree, session = DataTree(), Session(5)

    def logged(counter: int, request: Request) -> LogEntry:
        zxid = make_zxid(1, counter)
        txn = tree.prepare(request, session, zxid, 1_000 + counter)
        assert isinstance(txn, Txn), txn
        tree.apply(txn)
        return LogEntry(zxid, encode_logged(Logged(txn.time_ms, txn.session_id, txn.body)))

    before: list[Request] = [
        CreateSession(30_000),
        Create("/snap-null", None, OPEN_ACL_UNSAFE),
        Create("/snap-empty", b"", OPEN_ACL_UNSAFE),
        Create("/snap-seq-null-", None, OPEN_ACL_UNSAFE, CreateMode.PERSISTENT_SEQUENTIAL),
        Create("/snap-eph-null", None, OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL),
        Create("/snap-set-null", b"x", OPEN_ACL_UNSAFE),
        SetData("/snap-set-null", None),
    ]
    after: list[Request] = [
        Create("/log-null", None, OPEN_ACL_UNSAFE, CreateMode.CONTAINER),
        Create("/log-empty", b"", OPEN_ACL_UNSAFE),
        SetData("/snap-null", b""),
        SetData("/snap-empty", None),
        Multi((Create("/multi-null", None, OPEN_ACL_UNSAFE), SetData("/log-empty", None))),
    ]
    with DataDir(tmp_path) as data_dir:
        data_dir.save_hard_state(HardState(1, 1, 1))
        data_dir.append([logged(n, r) for n, r in enumerate(before, start=1)])
        data_dir.sync()
        data_dir.save_snapshot(tree.last_zxid, tree.snapshot())
        data_dir.append([logged(n, r) for n, r in enumerate(after, start=len(before) + 1)])
        data_dir.sync()

    state = load(tmp_path)
    assert state.snapshot.zxid == make_zxid(1, len(before)) and len(state.log) == len(after)
    restored = DataTree.from_snapshot(state.snapshot.data)
    assert restored.nodes["/snap-null"].data is None
    assert restored.nodes["/snap-set-null"].data is None
    assert restored.nodes["/snap-empty"].data == b""
    for entry_ in state.log:
        restored.apply(decode_logged(entry_.payload).txn(entry_.zxid))
    restored.check_invariants()
    assert {p: n.data for p, n in restored.nodes.items()} == {
        "/": b"",
        "/snap-null": b"",
        "/snap-empty": None,
        "/snap-seq-null-0000000002": None,
        "/snap-eph-null": None,
        "/snap-set-null": None,
        "/log-null": None,
        "/log-empty": None,
        "/multi-null": None,
    }
    assert restored.digest() == tree.digest()
