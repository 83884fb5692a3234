"""Common mechanics of the two sparse index files of a segment.

An index is an append-only file of fixed-size big-endian entries, mirrored in memory as
two parallel arrays (key, value) kept sorted by key so lookups are a bisect. Appends touch
only memory; the file catches up in one write when the segment is flushed, rolled or closed.
That is safe because an index is only trusted after a clean shutdown: after a crash every
segment past the recovery point (the only ones with unwritten entries) is recovered and its
indexes rebuilt from the log. A file that fails its sanity check is rebuilt the same way.
"""

from __future__ import annotations

import os
import struct
from abc import ABC, abstractmethod
from array import array
from bisect import bisect_right
from pathlib import Path


class IndexFile(ABC):
    ENTRY: struct.Struct

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.keys = array("q")
        self.values = array("q")
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._written = os.fstat(self._fd).st_size // self.ENTRY.size  # entries in the file

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def size_bytes(self) -> int:
        return len(self.keys) * self.ENTRY.size

    def load(self) -> bool:
        """Read the file into memory; False (and empty) if it is not a valid index."""
        data = _read_all(self._fd)
        if len(data) % self.ENTRY.size:
            self.reset()
            return False
        self._written = len(data) // self.ENTRY.size
        for entry in self.ENTRY.iter_unpack(data):
            key, value = self._decode(*entry)
            self.keys.append(key)
            self.values.append(value)
        if not self._entries_valid():
            self.reset()
            return False
        return True

    @abstractmethod
    def _decode(self, first: int, second: int) -> tuple[int, int]:
        """(key, value) in memory from the two fields of a file entry."""

    @abstractmethod
    def _encode(self, key: int, value: int) -> bytes:
        """The file entry for (key, value)."""

    def _entries_valid(self) -> bool:
        keys, values = self.keys, self.values
        return all(
            keys[i] <= keys[i + 1] and values[i] <= values[i + 1] for i in range(len(keys) - 1)
        )

    def append_entry(self, key: int, value: int) -> None:
        self.keys.append(key)
        self.values.append(value)

    def write_pending(self) -> None:
        """Write the entries appended since the last call to the file."""
        entries = len(self.keys)
        if entries > self._written:
            pending = b"".join(
                self._encode(self.keys[i], self.values[i]) for i in range(self._written, entries)
            )
            os.pwrite(self._fd, pending, self._written * self.ENTRY.size)
            self._written = entries

    def floor(self, key: int) -> int:
        """Index of the last entry whose key is <= key, or -1."""
        return bisect_right(self.keys, key) - 1

    def truncate(self, entries: int) -> None:
        """Keep the first `entries` entries."""
        del self.keys[entries:]
        del self.values[entries:]
        if entries < self._written:
            os.ftruncate(self._fd, entries * self.ENTRY.size)
            self._written = entries

    def reset(self) -> None:
        self.truncate(0)

    def flush(self) -> None:
        self.write_pending()
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            self.write_pending()
            self._close_fd()

    def delete(self) -> None:
        self._close_fd()
        self.path.unlink(missing_ok=True)

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks = []
    position = 0
    while position < size:
        chunk = os.pread(fd, size - position, position)
        if not chunk:
            break
        chunks.append(chunk)
        position += len(chunk)
    return b"".join(chunks)
