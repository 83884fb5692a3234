"""The `.log` file of a segment: record batches back to back, appended at a logical end.

The logical size is tracked apart from the file's length because a preallocated head
segment (log.preallocate) is created at its full capacity and filled in place — by
positional writes for TCP produce, or through a shared memory mapping for producers that
place bytes themselves (the RDMA datapaths). Readers never see past the logical size.

A file without a capacity reserves disk blocks ahead of its logical end instead, in steps
that grow with the file up to 32 MiB (Redpanda's segment fallocation step), with
FALLOC_FL_KEEP_SIZE so the file's length stays the logical size. ext4 otherwise allocates
blocks at every write (delayed allocation and buffer heads): 1 MiB pwritev in reused pages
measured 0.16 ms/MiB without the reservation and 0.10 with it. The reservation is given
back when the segment stops being the head (`trim`).

The descriptor closes when the file is closed or, after a delete, when the last FileSlice
still being sent from it is dropped — the same grace Kafka gives in-flight fetches.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

from directlog.records.varint import Buffer
from services.broker.storage.errors import StorageError

_IOV_MAX = 1024
_RESERVE_MIN = 1 << 20
_RESERVE_MAX = 32 << 20
_FALLOC_FL_KEEP_SIZE = 1
_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
_libc.fallocate.restype = ctypes.c_int


class LogFile:
    def __init__(self, path: Path, *, capacity: int | None = None, create: bool = False) -> None:
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o644)
        self._closer = weakref.finalize(self, os.close, self.fd)
        self.size = 0 if create else os.fstat(self.fd).st_size
        self.capacity: int | None = None
        self._mapping: mmap.mmap | None = None
        self._reserved = self.size  # disk blocks allocated up to here (files without capacity)
        if capacity is not None:
            self.preallocate(capacity)

    @property
    def length_on_disk(self) -> int:
        return os.fstat(self.fd).st_size

    def preallocate(self, capacity: int) -> None:
        """Extend the file to `capacity` (sparse, like Kafka's setLength) for in-place writes."""
        if self.length_on_disk < capacity:
            os.ftruncate(self.fd, capacity)
        self.capacity = capacity

    def append(self, iov: list[Buffer]) -> None:
        """Write the buffers at the logical end. On failure the file is cut back to where it
        was, so no partial batch is ever left behind, and StorageError is raised."""
        start = self.size
        total = sum(map(len, iov))
        if self.capacity is None and start + total > self._reserved:
            self._reserve(start + total)
        try:
            written = os.pwritev(self.fd, iov, start) if len(iov) <= _IOV_MAX else 0
            position = start + written
            if written != total:  # a short write, or too many buffers for one call
                remaining = _advance(iov, written)
                while remaining:
                    chunk = remaining[:_IOV_MAX]
                    written = os.pwritev(self.fd, chunk, position)
                    if written <= 0:
                        raise OSError("pwritev wrote nothing")
                    position += written
                    remaining = _advance(remaining, written)
        except OSError as exc:
            self._cut(start)
            raise StorageError(f"append to {self.path} failed: {exc}") from exc
        self.size = start + total

    def _reserve(self, end: int) -> None:
        """Allocate blocks from the reserved end to past `end`. A refusal (no space left, a
        file system without fallocate) is not an error: the writes then allocate for
        themselves, and report what actually fails."""
        target = end + min(max(end, _RESERVE_MIN), _RESERVE_MAX)
        if reserve_blocks(self.fd, self._reserved, target - self._reserved):
            self._reserved = target

    def region(self, position: int, length: int) -> memoryview:
        """A writable view of [position, position + length) of the preallocated file."""
        assert self.capacity is not None and position + length <= self.capacity
        if self._mapping is None:
            self._mapping = mmap.mmap(self.fd, self.capacity)
        return memoryview(self._mapping)[position : position + length]

    def unmap(self) -> None:
        """Drop the mapping; every region view must have been released."""
        if self._mapping is not None:
            self._mapping.close()
            self._mapping = None

    def advance(self, length: int) -> None:
        """Extend the logical end over bytes already placed through a region."""
        assert self.capacity is not None and self.size + length <= self.capacity
        self.size += length

    def read(self, position: int, length: int) -> bytes:
        length = max(0, min(length, self.size - position))
        return os.pread(self.fd, length, position) if length else b""

    def truncate(self, size: int) -> None:
        """Cut the logical end to `size`. The bytes after it are removed from disk too, even
        in a preallocated file, so recovery can never find stale batches there."""
        assert size <= self.size
        self._cut(size)
        self.size = size

    def _cut(self, size: int) -> None:
        self.unmap()
        os.ftruncate(self.fd, size)  # frees the blocks reserved past it as well
        self._reserved = size
        if self.capacity is not None:
            os.ftruncate(self.fd, self.capacity)

    def trim(self) -> None:
        """Give back preallocated and reserved space: the file becomes exactly its logical
        size on disk. Cut unconditionally: a file reopened after a crash may hold blocks
        reserved past its end that `_reserved` cannot know of."""
        self.capacity = None
        self._cut(self.size)

    def flush(self) -> None:
        if self._closer.alive:
            os.fsync(self.fd)

    def close(self) -> None:
        self.unmap()
        self._closer()

    def delete(self) -> None:
        """Remove the file; the descriptor lives on while a FileSlice still refers to it."""
        self.unmap()
        self.path.unlink(missing_ok=True)


def reserve_blocks(fd: int, offset: int, length: int) -> bool:
    """Allocate disk blocks for [offset, offset + length) without changing the file's
    length (fallocate with FALLOC_FL_KEEP_SIZE); False when the file system refuses."""
    result: int = _libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length)
    return result == 0


def _advance(chunk: list[Buffer], written: int) -> list[Buffer]:
    """The iovec left after `written` bytes of `chunk` went out (one pass: a produce
    group's iovec holds two buffers per request)."""
    done = 0
    while done < len(chunk) and written >= len(chunk[done]):
        written -= len(chunk[done])
        done += 1
    left = chunk[done:]
    if left and written:
        left[0] = memoryview(left[0])[written:]
    return left


@dataclass(slots=True, frozen=True)
class FileSlice:
    """A byte range of a segment file holding whole batches, ready for os.sendfile."""

    file: LogFile | None
    position: int
    size: int

    def fileno(self) -> int:
        assert self.file is not None
        return self.file.fd

    def read(self) -> bytes:
        return b"" if self.file is None else os.pread(self.file.fd, self.size, self.position)


EMPTY_SLICE = FileSlice(None, 0, 0)
