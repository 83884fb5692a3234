"""Snapshot files ``snapshot.<zxid as 16 hex digits>`` in the data directory.

Each file wraps the data tree's snapshot bytes (opaque here), big-endian:

    header  magic b"DLSN" | u16 format version (1) | u16 flags (0) | i64 zxid
            | u64 body length | u32 CRC-32C of the body
    body    the snapshot bytes

Files are written atomically (temporary file, fsync, rename, fsync of the directory).
A snapshot is valid when its header parses, its zxid matches its name, its length
matches the file and its CRC matches; ``latest_valid`` skips invalid ones, so a crash or
a bad sector in the newest snapshot falls back to an older one (the log after it is
kept until a newer snapshot is known good; see ``DataDir.purge``).
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

from crc32c import crc32c

from directlog.durable_files import fsync_path, write_atomically
from services.consensus.zab.state import Snapshot

log = logging.getLogger(__name__)

PREFIX = "snapshot."
MAGIC = b"DLSN"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">4sHHqQI")


def snapshot_name(zxid: int) -> str:
    return f"{PREFIX}{zxid:016x}"


def parse_zxid(name: str, prefix: str) -> int | None:
    """The zxid in a ``<prefix><16 hex digits>`` file name, None for other names."""
    if not name.startswith(prefix):
        return None
    digits = name[len(prefix) :]
    if len(digits) != 16:
        return None
    try:
        return int(digits, 16)
    except ValueError:
        return None


def encode(zxid: int, data: bytes) -> bytes:
    return _HEADER.pack(MAGIC, FORMAT_VERSION, 0, zxid, len(data), crc32c(data)) + data


def decode(zxid: int, raw: bytes) -> bytes | None:
    """The body of a snapshot file named for ``zxid``, None if it fails any check."""
    if len(raw) < _HEADER.size:
        return None
    magic, version, _flags, stored_zxid, length, crc = _HEADER.unpack_from(raw)
    body = raw[_HEADER.size :]
    if magic != MAGIC or version != FORMAT_VERSION or stored_zxid != zxid:
        return None
    if length != len(body) or crc32c(body) != crc:
        return None
    return body


class Snapshots:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def zxids(self) -> list[int]:
        """Zxids of every snapshot file, valid or not, oldest first."""
        found = (parse_zxid(p.name, PREFIX) for p in self.directory.iterdir())
        return sorted(z for z in found if z is not None)

    def path(self, zxid: int) -> Path:
        return self.directory / snapshot_name(zxid)

    def write(self, zxid: int, data: bytes) -> Path:
        path = self.path(zxid)
        write_atomically(path, encode(zxid, data))
        return path

    def read(self, zxid: int) -> Snapshot | None:
        try:
            raw = self.path(zxid).read_bytes()
        except FileNotFoundError:
            return None
        body = decode(zxid, raw)
        if body is None:
            log.warning("snapshot %s is corrupt", self.path(zxid))
            return None
        return Snapshot(zxid, body)

    def valid(self, limit: int | None = None) -> list[Snapshot]:
        """Up to ``limit`` valid snapshots, newest first."""
        out: list[Snapshot] = []
        for zxid in reversed(self.zxids()):
            if limit is not None and len(out) >= limit:
                break
            snap = self.read(zxid)
            if snap is not None:
                out.append(snap)
        return out

    def latest_valid(self) -> Snapshot | None:
        found = self.valid(limit=1)
        return found[0] if found else None

    def remove(self, zxids: list[int]) -> None:
        if not zxids:
            return
        for zxid in zxids:
            self.path(zxid).unlink(missing_ok=True)
        fsync_path(self.directory)

    def remove_above(self, zxid: int) -> list[int]:
        """Delete snapshots newer than ``zxid`` (they hold truncated transactions)."""
        doomed = [z for z in self.zxids() if z > zxid]
        self.remove(doomed)
        return doomed
