"""The transaction log: ``log.<first zxid as 16 hex digits>`` segment files.

A segment is a plain sequence of records, no file header. Each record, big-endian:

    length  i32   payload length in bytes (>= 0)
    crc     u32   CRC-32C of the zxid field (8 bytes, as stored) followed by the payload
    zxid    i64   strictly greater than the previous record's, in this segment and across
                  segments; the first record of a segment has the zxid in its file name
    payload       ``length`` bytes

Writing: ``append`` only buffers; ``sync`` writes every buffered record and, with
``force_sync`` (the default; ZooKeeper's ``forceSync``), syncs once for the whole batch
(group commit), plus the directory when a segment file was created. With
``force_sync=False`` records are written without any sync, so a machine crash may lose
them. A segment is rolled when it has reached ``segment_bytes``: the next record starts
a new file named for its zxid.

Like ZooKeeper's log, a segment file is preallocated to ``segment_bytes`` (zeros after
the last record), so an append does not change the file's size and ``fdatasync`` has
little metadata to write: a small synced append costs about half of an ``fsync`` that
grows the file. A record never starts with a zero zxid, so the zeros read as the end.

Recovery on open scans every segment and stops at the first record that is torn (runs
past the end of the file), has a bad length or CRC, or breaks zxid order. If only zeros
follow, that is the preallocated end. Otherwise the file is cut there and every later
segment is deleted: a torn tail is the normal result of a crash
during a write, and nothing after a bad record can be trusted to follow it. Whatever was
cut was never reported durable unless the disk lied; ZAB then resynchronises the missing
suffix from the leader.

``truncate_to`` is always made durable (file and directory fsync), even with
``force_sync=False``: a truncated suffix that reappeared after a crash would be a history
this member promised the leader it dropped.

An I/O error while writing or syncing poisons the log (``LogFailedError`` from then on):
after a failed fsync the kernel may have dropped the dirty pages, so retrying could report
data durable that is not.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from crc32c import crc32c

from directlog.durable_files import fsync_path
from services.consensus.storage.snapshots import parse_zxid
from services.consensus.zab.state import LogEntry

log = logging.getLogger(__name__)

PREFIX = "log."
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
RECORD_HEADER = struct.Struct(">iIq")
_ZXID = struct.Struct(">q")
MAX_ZXID = (1 << 63) - 1


class CorruptLogError(Exception):
    """A segment changed under the open log and no longer reads back as written."""


class LogFailedError(Exception):
    """An earlier write or fsync failed; the log must be reopened (which recovers)."""


def segment_name(first_zxid: int) -> str:
    return f"{PREFIX}{first_zxid:016x}"


def encode_record(entry: LogEntry) -> bytes:
    zxid = _ZXID.pack(entry.zxid)
    crc = crc32c(entry.payload, crc32c(zxid))
    return struct.pack(">iI", len(entry.payload), crc) + zxid + entry.payload


def parse_records(data: bytes, first_zxid: int, after: int) -> Iterator[tuple[int, LogEntry]]:
    """Yield ``(end offset, entry)`` for each valid record of a segment, stopping silently
    at the first torn or corrupt one. ``after`` is the last zxid before this segment."""
    view = memoryview(data)
    pos = 0
    prev = after
    while pos + RECORD_HEADER.size <= len(data):
        length, crc, zxid = RECORD_HEADER.unpack_from(data, pos)
        end = pos + RECORD_HEADER.size + length
        if length < 0 or end > len(data):
            return
        payload = bytes(view[pos + RECORD_HEADER.size : end])
        if crc32c(payload, crc32c(view[pos + 8 : pos + 16])) != crc:
            return
        if zxid <= prev or (pos == 0 and zxid != first_zxid):
            return
        yield end, LogEntry(zxid, payload)
        prev = zxid
        pos = end


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


@dataclass(slots=True)
class _Segment:
    first_zxid: int
    path: Path
    size: int
    last_zxid: int


class TxnLog:
    """The log of one member. Not thread-safe; one process per data directory."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        force_sync: bool = True,
    ) -> None:
        if segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be positive, got {segment_bytes}")
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.force_sync = force_sync
        self._segments: list[_Segment] = []
        self._pending: list[LogEntry] = []
        self._fd: int | None = None  # the last segment, opened for appending
        self._unsynced_fds: list[int] = []
        self._dir_dirty = False
        self._failed: BaseException | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self._recover()
        self._last_zxid = self._written_zxid
        self._durable_zxid = self._written_zxid

    # -- state -----------------------------------------------------------------------

    @property
    def _written_zxid(self) -> int:
        return self._segments[-1].last_zxid if self._segments else 0

    @property
    def last_zxid(self) -> int:
        """The last appended zxid (buffered ones included), 0 for an empty log."""
        return self._last_zxid

    @property
    def durable_zxid(self) -> int:
        """The last zxid the most recent ``sync`` (or ``truncate_to``) made durable."""
        return self._durable_zxid

    def segments(self) -> list[tuple[int, Path]]:
        """``(first zxid, path)`` of each segment file, oldest first."""
        return [(s.first_zxid, s.path) for s in self._segments]

    # -- recovery --------------------------------------------------------------------

    def _recover(self) -> None:
        found = sorted(
            (zxid, path)
            for path in self.directory.iterdir()
            if (zxid := parse_zxid(path.name, PREFIX)) is not None
        )
        changed = False
        cut = False
        prev = 0
        for first, path in found:
            if cut:
                log.warning("deleting log segment %s after a corrupt record", path)
                path.unlink()
                changed = True
                continue
            data = path.read_bytes()
            size, last = 0, prev
            for size, entry in parse_records(data, first, prev):  # noqa: B007
                last = entry.zxid
            if size == 0:
                # No record at all (an empty or all-zero file, or garbage): a segment
                # created just before a crash. Drop it, so that every segment's first
                # record carries the zxid of its name.
                cut = True
                log.warning("deleting log segment %s: no valid record", path)
                path.unlink()
                changed = True
                continue
            if data.count(0, size) != len(data) - size:  # not just the preallocated zeros
                cut = True
                log.warning("cutting log segment %s at %d of %d bytes", path, size, len(data))
                os.truncate(path, size)
                fsync_path(path)
            self._segments.append(_Segment(first, path, size, last))
            prev = last
        if changed:
            fsync_path(self.directory)
        if self._segments:
            self._open_last()

    def _open_last(self) -> None:
        """Open the last segment for writing at its end, preallocated again if a cut
        shortened it."""
        fd = os.open(self._segments[-1].path, os.O_WRONLY)
        if os.fstat(fd).st_size < self.segment_bytes:
            os.posix_fallocate(fd, 0, self.segment_bytes)
        self._fd = fd

    # -- writing ---------------------------------------------------------------------

    def _check(self) -> None:
        if self._failed is not None:
            raise LogFailedError("an earlier write or fsync failed") from self._failed

    def append(self, entries: Iterable[LogEntry]) -> None:
        """Buffer entries; their zxids must strictly increase past ``last_zxid``."""
        self._check()
        batch = list(entries)
        last = self._last_zxid
        for entry in batch:
            if not last < entry.zxid <= MAX_ZXID:
                raise ValueError(f"zxid {entry.zxid:#x} does not follow {last:#x}")
            last = entry.zxid
        self._pending.extend(batch)
        self._last_zxid = last

    def sync(self) -> int:
        """Write the buffered entries, fsync unless ``force_sync`` is off, and return the
        last durable zxid (with ``force_sync`` off: the last written one)."""
        self._check()
        try:
            self._write_pending()
            if self.force_sync:
                self._fsync_written()
        except BaseException as exc:
            self._failed = exc
            raise
        self._unsynced_fds.clear()
        self._dir_dirty = False
        self._durable_zxid = self._written_zxid
        return self._durable_zxid

    def _write_pending(self) -> None:
        chunk: list[bytes] = []
        active = self._segments[-1] if self._segments else None
        offset = active.size if active is not None else 0  # where ``chunk`` goes
        for entry in self._pending:
            record = encode_record(entry)
            if active is None or active.size >= self.segment_bytes:
                self._flush(chunk, offset)
                chunk = []
                active = self._roll(entry.zxid)
                offset = 0
            chunk.append(record)
            active.size += len(record)
            active.last_zxid = entry.zxid
        self._flush(chunk, offset)
        self._pending.clear()

    def _flush(self, chunk: list[bytes], offset: int) -> None:
        if not chunk:
            return
        assert self._fd is not None
        _write_all(self._fd, b"".join(chunk), offset)
        if self._fd not in self._unsynced_fds:
            self._unsynced_fds.append(self._fd)

    def _roll(self, first_zxid: int) -> _Segment:
        if self._fd is not None:
            if self._fd in self._unsynced_fds:
                if self.force_sync:
                    os.fdatasync(self._fd)  # this batch's sync of a file about to be closed
                self._unsynced_fds.remove(self._fd)
            os.close(self._fd)
            self._fd = None
        path = self.directory / segment_name(first_zxid)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.posix_fallocate(self._fd, 0, self.segment_bytes)
        self._dir_dirty = True
        segment = _Segment(first_zxid, path, 0, 0)
        self._segments.append(segment)
        return segment

    def _fsync_written(self) -> None:
        for fd in self._unsynced_fds:
            os.fdatasync(fd)
        if self._dir_dirty:
            fsync_path(self.directory)

    def truncate_to(self, zxid: int) -> None:
        """Remove every entry with a larger zxid, buffered or on disk; durable on return."""
        self._check()
        try:
            self._pending = [e for e in self._pending if e.zxid <= zxid]
            self._write_pending()
            self._cut(zxid)
            if self._fd is not None:
                os.fsync(self._fd)
            fsync_path(self.directory)
        except BaseException as exc:
            self._failed = exc
            raise
        self._unsynced_fds.clear()
        self._dir_dirty = False
        self._last_zxid = self._durable_zxid = self._written_zxid

    def _cut(self, zxid: int) -> None:
        while self._segments and self._segments[-1].first_zxid > zxid:
            segment = self._segments.pop()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            segment.path.unlink()
        if not self._segments:
            return
        segment = self._segments[-1]
        if segment.last_zxid > zxid:
            end, last = 0, segment.first_zxid
            for offset, entry in self._read_segment(segment):
                if entry.zxid > zxid:
                    break
                end, last = offset, entry.zxid
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            os.truncate(segment.path, end)
            segment.size, segment.last_zxid = end, last
        if self._fd is None:
            self._open_last()

    def remove_segments_through(self, zxid: int) -> list[Path]:
        """Delete the segments holding only entries with zxid <= ``zxid`` (never the last
        one, which the log appends to). ZooKeeper's PurgeTxnLog rule."""
        self._check()
        removed: list[Path] = []
        while len(self._segments) > 1 and self._segments[1].first_zxid <= zxid + 1:
            segment = self._segments.pop(0)
            segment.path.unlink()
            removed.append(segment.path)
        if removed:
            fsync_path(self.directory)
        return removed

    # -- reading ---------------------------------------------------------------------

    def _read_segment(self, segment: _Segment) -> Iterator[tuple[int, LogEntry]]:
        with open(segment.path, "rb") as f:
            data = f.read(segment.size)
        end = 0
        for end, entry in parse_records(data, segment.first_zxid, 0):
            yield end, entry
        if end != segment.size:
            raise CorruptLogError(f"{segment.path} no longer reads back at offset {end}")

    def read_from(self, zxid: int) -> Iterator[LogEntry]:
        """Every appended entry (buffered ones included) with a zxid above ``zxid``, in
        order. Do not write to the log while iterating."""
        self._check()
        segments = list(self._segments)
        pending = list(self._pending)
        for i, segment in enumerate(segments):
            if i + 1 < len(segments) and segments[i + 1].first_zxid <= zxid + 1:
                continue
            if segment.last_zxid <= zxid:
                continue
            for _, entry in self._read_segment(segment):
                if entry.zxid > zxid:
                    yield entry
        for entry in pending:
            if entry.zxid > zxid:
                yield entry

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close the files. Buffered, unsynced entries are dropped."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._pending.clear()
        self._unsynced_fds.clear()

    def __enter__(self) -> TxnLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
