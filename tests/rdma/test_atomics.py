"""directlog.rdma._atomics.guarded_copy: the shm provider's READ and WRITE under the region
table's admit/finish handshake (region_table.py), as one C call."""

from __future__ import annotations

import mmap
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from directlog.rdma import _atomics

pytestmark = pytest.mark.timeout(60)

ENTRY = 64  # a table entry's offset: ctl word, then inflight
CTL = 1 << 8 | 1  # generation 1, valid


def table_with(ctl: int) -> bytearray:
    table = bytearray(256)
    _atomics.store(table, ENTRY, ctl)
    return table


def test_copies_under_a_valid_entry_and_counts_itself_out() -> None:
    table, src, dst = table_with(CTL), bytes(range(100)), bytearray(120)
    done = _atomics.guarded_copy(table, ENTRY, CTL, dst, 10, src, 5, 90)
    assert done == _atomics.COPIED
    assert dst[10:100] == src[5:95] and dst[:10] == bytes(10) and dst[100:] == bytes(20)
    assert _atomics.load(table, ENTRY + 8) == 0


def test_revoked_entry_admits_nothing() -> None:
    table, dst = table_with(2 << 8 | 2), bytearray(16)
    done = _atomics.guarded_copy(table, ENTRY, CTL, dst, 0, b"x" * 16, 0, 16)
    assert done == _atomics.NOT_ADMITTED
    assert dst == bytes(16) and _atomics.load(table, ENTRY + 8) == 0


@pytest.mark.parametrize(
    ("entry", "dst_offset", "src_offset", "length", "error"),
    [
        (250, 0, 0, 8, IndexError),  # the entry's two words run past the table
        (ENTRY + 4, 0, 0, 8, ValueError),  # not aligned
        (ENTRY, 9, 0, 8, IndexError),  # past the destination
        (ENTRY, -1, 0, 8, IndexError),
        (ENTRY, 0, 1, 16, IndexError),  # past the source
        (ENTRY, 0, 0, -1, ValueError),
    ],
)
def test_out_of_bounds_is_refused_before_anything_moves(
    entry: int, dst_offset: int, src_offset: int, length: int, error: type[Exception]
) -> None:
    table, dst = table_with(CTL), bytearray(16)
    with pytest.raises(error):
        _atomics.guarded_copy(table, entry, CTL, dst, dst_offset, b"y" * 16, src_offset, length)
    assert dst == bytes(16) and _atomics.load(table, ENTRY + 8) == 0


def test_read_only_destination_is_refused() -> None:
    with pytest.raises(BufferError):
        _atomics.guarded_copy(table_with(CTL), ENTRY, CTL, b"z" * 8, 0, b"y" * 8, 0, 8)


REVOKER = """
import mmap, sys, time
from directlog.rdma import _atomics
with open(sys.argv[1], "r+b") as f:
    table = mmap.mmap(f.fileno(), 0)
deadline = time.monotonic() + 30
while _atomics.load(table, {entry} + 8) == 0:  # until a copy is admitted
    if time.monotonic() > deadline:
        sys.exit(2)
_atomics.store(table, {entry}, 2 << 8 | 2)  # revoke, then wait for the access to drain
while _atomics.load(table, {entry} + 8) != 0:
    if time.monotonic() > deadline:
        sys.exit(3)
"""


def test_a_revocation_from_another_process_stops_the_copies(tmp_path: Path) -> None:
    """Another process revokes the entry while copies run (the owner's RegionTable.revoke):
    the copy it overlapped reports RACED (or, if the store came just after that copy,
    the next is NOT_ADMITTED), and the revoker's wait for inflight to drain ends."""
    path = tmp_path / "table"
    path.write_bytes(bytes(256))
    with path.open("r+b") as f:
        table = mmap.mmap(f.fileno(), 0)
    _atomics.store(table, ENTRY, CTL)
    script = textwrap.dedent(REVOKER.format(entry=ENTRY))
    revoker = subprocess.Popen([sys.executable, "-c", script, str(path)])
    src, dst = bytes(32 << 20), bytearray(32 << 20)
    try:
        deadline = time.monotonic() + 30
        done = _atomics.COPIED
        while done == _atomics.COPIED and time.monotonic() < deadline:
            done = _atomics.guarded_copy(table, ENTRY, CTL, dst, 0, src, 0, len(src))
        assert done in (_atomics.RACED, _atomics.NOT_ADMITTED)
        assert revoker.wait(timeout=30) == 0
        assert _atomics.guarded_copy(table, ENTRY, CTL, dst, 0, src, 0, 8) == _atomics.NOT_ADMITTED
        assert _atomics.load(table, ENTRY + 8) == 0
    finally:
        revoker.kill()
        revoker.wait()
        table.close()
