"""The region table: which memory a software context exposes, and the access protocol.

The table is a file mapped MAP_SHARED. Its owner (a shm or tcp context) publishes every
registered region in it; shm peers map it and check each op against it before they touch
the region's pages themselves, and the owner's tcp progress thread checks ops the same way.
Layout (little-endian, docs/rdma.md has the same table):

    header, 64 bytes: magic b"DLRDMAT1", version u32, entry size u32, capacity u32,
                      owner pid u32, zero padding
    entry i at 64 + 256 * i:
        0  ctl u64       generation << 8 | state (0 free, 1 valid, 2 revoked)
        8  inflight u64  ops between admit() and finish()
        16 rkey u32      random, nonzero, rkey % capacity == i (see RegionTable.publish)
        20 access u32    Access flags
        24 pd u32        protection domain handle
        28 path_len u32
        32 addr u64      the region's advertised address (the owner's virtual address)
        40 length u64
        48 file_offset u64
        56 path          UTF-8, at most 200 bytes: the file holding the region

Fields other than ctl and inflight change only while the entry is not valid, and ctl moves
to valid last, so a reader that sees the same valid ctl before and after reading them read
a consistent entry (a seqlock).

Revocation is a handshake on two words, all accesses sequentially consistent (the C
atomics): an accessor increments inflight, then checks ctl is still what it looked up; the
owner stores a new ctl (revoked), then waits until inflight drains. Either the accessor sees
the revocation and backs off, or the owner sees the access and waits for it: when revoke()
returns True no admitted access is running and none can start. Only an accessor that stops
between admit and finish (SIGSTOP, or killed) can keep inflight up; revoke() then gives up
after its timeout, returns False and the slot is retired for good, and an accessor that was
merely stopped may still finish its copy later. finish() re-reads ctl so such an access
reports the race (the op completes with REM_ACCESS_ERR) instead of success.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from directlog.rdma import _atomics
from directlog.rdma.verbs import Access, RegistrationError, WcStatus

log = logging.getLogger(__name__)

MAGIC = b"DLRDMAT1"
VERSION = 1
HEADER = struct.Struct("<8sIIII")
HEADER_SIZE = 64
ENTRY_SIZE = 256
FIELDS = struct.Struct("<IIIIQQQ")  # rkey, access, pd, path_len, addr, length, file_offset
CTL_AT = 0
INFLIGHT_AT = 8
FIELDS_AT = 16
PATH_AT = FIELDS_AT + FIELDS.size
PATH_MAX = ENTRY_SIZE - PATH_AT
MAX_CAPACITY = 1 << 16

FREE, VALID, REVOKED = 0, 1, 2
MINUS_ONE = (1 << 64) - 1


@dataclass(slots=True, frozen=True)
class Entry:
    """A consistent snapshot of one valid entry; ``ctl`` identifies this registration.
    ``access`` holds Access flags as a plain int: every op checks it."""

    slot: int
    ctl: int
    rkey: int
    access: int
    pd: int
    addr: int
    length: int
    file_offset: int
    path: str

    def check(self, addr: int, length: int, needed: int, pd: int) -> WcStatus:
        """Whether an op of ``length`` bytes at ``addr`` needing ``needed`` from a QP of
        ``pd`` may proceed (SUCCESS) or how it is refused."""
        if self.pd != pd or needed & ~self.access:
            return WcStatus.REM_ACCESS_ERR
        if addr < self.addr or addr + length > self.addr + self.length:
            return WcStatus.REM_ACCESS_ERR
        return WcStatus.SUCCESS


def entry_offset(slot: int) -> int:
    """Where entry ``slot`` starts in the table (its ctl word, then inflight)."""
    return HEADER_SIZE + ENTRY_SIZE * slot


class TableView:
    """A reader of some context's table: lookup, admit and finish accesses."""

    def __init__(self, buf: mmap.mmap) -> None:
        magic, version, entry_size, capacity, _pid = HEADER.unpack_from(buf, 0)
        if magic != MAGIC or version != VERSION or entry_size != ENTRY_SIZE:
            raise ValueError("not a directlog region table")
        if len(buf) < entry_offset(capacity):
            raise ValueError("region table shorter than its capacity")
        self.buf = buf
        self.capacity = capacity

    @classmethod
    def open(cls, path: str) -> TableView:
        """Map a peer's table (read-write: admitting an access increments its inflight)."""
        fd = os.open(path, os.O_RDWR)
        try:
            return cls(mmap.mmap(fd, 0))
        finally:
            os.close(fd)

    def lookup(self, rkey: int) -> Entry | None:
        """The valid entry ``rkey`` names, or None (unknown, stale, revoked)."""
        slot = rkey % self.capacity
        at = entry_offset(slot)
        for _ in range(64):  # an owner rewrites an entry in microseconds
            ctl = _atomics.load(self.buf, at + CTL_AT)
            if ctl & 0xFF != VALID:
                return None
            key, access, pd, path_len, addr, length, offset = FIELDS.unpack_from(
                self.buf, at + FIELDS_AT
            )
            path = bytes(self.buf[at + PATH_AT : at + PATH_AT + min(path_len, PATH_MAX)])
            if _atomics.load(self.buf, at + CTL_AT) != ctl:
                continue
            if key != rkey:
                return None
            return Entry(slot, ctl, rkey, access, pd, addr, length, offset, path.decode())
        return None

    def admit(self, entry: Entry) -> bool:
        """Start an access under ``entry``: False when it was revoked (nothing to undo)."""
        at = entry_offset(entry.slot)
        _atomics.fetch_add(self.buf, at + INFLIGHT_AT, 1)
        if _atomics.load(self.buf, at + CTL_AT) == entry.ctl:
            return True
        _atomics.fetch_add(self.buf, at + INFLIGHT_AT, MINUS_ONE)
        return False

    def finish(self, entry: Entry) -> bool:
        """End an admitted access: False when a revocation raced it (see module doc)."""
        at = entry_offset(entry.slot)
        still_valid = _atomics.load(self.buf, at + CTL_AT) == entry.ctl
        _atomics.fetch_add(self.buf, at + INFLIGHT_AT, MINUS_ONE)
        return still_valid

    def close(self) -> None:
        self.buf.close()


class RegionTable:
    """The owner's side: publish and revoke entries in a table file it creates."""

    def __init__(self, path: Path, capacity: int) -> None:
        if not 1 <= capacity <= MAX_CAPACITY:
            raise ValueError(f"region table capacity must be 1..{MAX_CAPACITY}")
        self.path = path
        size = entry_offset(capacity)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self.buf = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        HEADER.pack_into(self.buf, 0, MAGIC, VERSION, ENTRY_SIZE, capacity, os.getpid())
        self.view = TableView(self.buf)
        self.capacity = capacity
        self._free = list(range(capacity))
        self._last_rkey = [0] * capacity

    def publish(
        self, *, access: Access, pd: int, addr: int, length: int, path: str, file_offset: int
    ) -> int:
        """Make a region reachable; its rkey: a free slot and a multiple of the capacity
        above it, both drawn from `secrets`, so no rkey tells anything of the next one (a
        peer holding earlier grants cannot guess a live one). rkey % capacity names the
        slot, so live rkeys are unique, and a slot never gets its previous rkey again."""
        encoded = path.encode()
        if len(encoded) > PATH_MAX:
            raise RegistrationError(f"region file path longer than {PATH_MAX} bytes: {path}")
        if not self._free:
            raise RegistrationError("region table full: deregister regions first")
        pick = secrets.randbelow(len(self._free))
        self._free[pick], self._free[-1] = self._free[-1], self._free[pick]
        slot = self._free.pop()
        multiples = ((1 << 32) - 1 - slot) // self.capacity + 1  # at least 65536
        rkey = 0
        while rkey in (0, self._last_rkey[slot]):  # redrawn with odds of 2 in 65536 at most
            rkey = secrets.randbelow(multiples) * self.capacity + slot
        self._last_rkey[slot] = rkey
        at = entry_offset(slot)
        generation = _atomics.load(self.buf, at + CTL_AT) >> 8
        FIELDS.pack_into(
            self.buf, at + FIELDS_AT, rkey, int(access), pd, len(encoded), addr, length, file_offset
        )
        self.buf[at + PATH_AT : at + PATH_AT + len(encoded)] = encoded
        _atomics.store(self.buf, at + CTL_AT, (generation + 1) << 8 | VALID)
        return rkey

    def revoke(self, rkey: int, drain_timeout: float) -> bool:
        """Refuse every later access to ``rkey`` and wait for admitted ones to finish. False
        when they did not within ``drain_timeout``: the slot is then retired."""
        slot = rkey % self.capacity
        at = entry_offset(slot)
        generation = _atomics.load(self.buf, at + CTL_AT) >> 8
        _atomics.store(self.buf, at + CTL_AT, (generation + 1) << 8 | REVOKED)
        deadline = time.monotonic() + drain_timeout
        spins = 0
        while _atomics.load(self.buf, at + INFLIGHT_AT) != 0:
            if time.monotonic() > deadline:
                log.warning("rkey %#x: an access did not finish, slot %d retired", rkey, slot)
                return False
            spins += 1
            time.sleep(0 if spins < 100 else 0.0001)
        self._free.append(slot)
        return True

    def close(self) -> None:
        self.view.close()
