"""The member's HardState file, ``hardstate`` in the data directory.

Format, big-endian, 34 bytes:

    magic b"DLHS" | u16 format version (1) | i64 accepted_epoch | i64 accepted_leader
    | i64 current_epoch | u32 CRC-32C of everything before it

Written atomically (temporary file, fsync, rename, fsync of the directory).

A missing file means a fresh member. A present but unreadable file raises
``CorruptHardStateError`` and is never treated as missing: the epochs are promises this
member made to leaders. Reading them back as 0 would let it acknowledge a NEWEPOCH it
already refused, or ack a second leader of an epoch it already accepted, and so help two
leaders commit conflicting histories. An operator must decide (restore the file, or wipe
the member and let it rejoin as empty).
"""

from __future__ import annotations

import struct
from pathlib import Path

from crc32c import crc32c

from directlog.durable_files import write_atomically
from services.consensus.zab.state import HardState

FILE_NAME = "hardstate"
MAGIC = b"DLHS"
FORMAT_VERSION = 1
_BODY = struct.Struct(">4sHqqq")
_CRC = struct.Struct(">I")
SIZE = _BODY.size + _CRC.size


class CorruptHardStateError(Exception):
    """The hard state file exists but cannot be trusted; see the module docstring."""


def encode(state: HardState) -> bytes:
    body = _BODY.pack(
        MAGIC,
        FORMAT_VERSION,
        state.accepted_epoch,
        state.accepted_leader,
        state.current_epoch,
    )
    return body + _CRC.pack(crc32c(body))


def decode(data: bytes) -> HardState:
    if len(data) != SIZE:
        raise CorruptHardStateError(f"hard state is {len(data)} bytes, expected {SIZE}")
    body = data[: _BODY.size]
    (crc,) = _CRC.unpack_from(data, _BODY.size)
    if crc32c(body) != crc:
        raise CorruptHardStateError("hard state CRC mismatch")
    magic, version, accepted_epoch, accepted_leader, current_epoch = _BODY.unpack(body)
    if magic != MAGIC or version != FORMAT_VERSION:
        raise CorruptHardStateError(f"bad hard state header {magic!r} v{version}")
    return HardState(accepted_epoch, accepted_leader, current_epoch)


class HardStateFile:
    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> HardState | None:
        """The stored hard state, None if there is no file (a fresh member)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return decode(data)

    def write(self, state: HardState) -> None:
        write_atomically(self.path, encode(state))
