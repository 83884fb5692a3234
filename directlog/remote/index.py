"""A partition's remote indexes (KIP-405): which remote bytes hold which offsets.

They live in the partition's log directory as sets of three files named by the first
offset of their first entry (formats.md "Remote indexes"):

    <base>.remoteLogIndex     entries: magic, length, crc, first and last offset, first and
                              largest timestamp, data length, RDI (where the bytes are)
    <base>.remoteOffsetIndex  one 8-byte entry per remoteLogIndex entry: its first offset
                              relative to the base, its position in the remoteLogIndex
    <base>.remoteTimeIndex    12-byte entries: a timestamp larger than any before it, and
                              the position of the first entry that reached it

A tiering service writes them (`writable`): it appends entries for each segment it copies
(log entries first, then the two indexes, so a reader that sees an offset or time entry
finds the log entry it points at), rotates to a new set by size or age (fsyncing the set it
closes), and ships each rotated set to the store. Brokers open them read-only and
`refresh` when told they changed. Every remoteLogIndex entry carries a CRC32C, checked
on every read: a corrupt entry raises CorruptIndexError and is never used to find records.
"""

from __future__ import annotations

import os
import struct
import threading
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from crc32c import crc32c

from directlog.durable_files import fsync_path, remove_temporaries, write_atomically
from directlog.remote.layout import (
    REMOTE_LOG_INDEX,
    REMOTE_OFFSET_INDEX,
    REMOTE_TIME_INDEX,
    is_index_file,
)
from directlog.remote.rdi import InvalidRdiError, RemoteDataId

ENTRY_MAGIC = 0
_HEAD = struct.Struct(">hhI")  # magic, length, crc
_BODY = struct.Struct(">qqqqih")  # offsets, timestamps, data length, rdi length
ENTRY_OVERHEAD = _HEAD.size + _BODY.size
MAX_ENTRY_BYTES = 0x7FFF  # length is an int16
_OFFSET_ENTRY = struct.Struct(">ii")  # relative offset, position
_TIME_ENTRY = struct.Struct(">qi")  # timestamp, position
_INT32_MAX = (1 << 31) - 1
_READ_AHEAD = 8  # entries read at a time while looking for enough data


class CorruptIndexError(ValueError):
    """Bytes of a remote index that fail their magic, length or CRC check."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One remoteLogIndex entry: a span of whole batches held at `rdi`."""

    first_offset: int
    last_offset: int
    first_timestamp: int  # of the span's first record
    last_timestamp: int  # the largest timestamp in the span
    rdi: RemoteDataId

    @property
    def data_length(self) -> int:
        return self.rdi.length

    def encode(self) -> bytes:
        rdi = self.rdi.encode()
        length = ENTRY_OVERHEAD + len(rdi)
        if length > MAX_ENTRY_BYTES:
            raise ValueError(f"an entry of {length} bytes (RDI {len(rdi)})")
        body = _BODY.pack(
            self.first_offset,
            self.last_offset,
            self.first_timestamp,
            self.last_timestamp,
            self.rdi.length,
            len(rdi),
        )
        crc = crc32c(rdi, crc32c(body))
        return _HEAD.pack(ENTRY_MAGIC, length, crc) + body + rdi


def decode_entry(data: bytes | memoryview, position: int = 0) -> tuple[IndexEntry, int]:
    """The entry at `position` and its size; CorruptIndexError unless it is whole and valid."""
    view = memoryview(data)
    if len(view) - position < ENTRY_OVERHEAD:
        raise CorruptIndexError(f"{len(view) - position} bytes left at {position}: a torn entry")
    magic, length, crc = _HEAD.unpack_from(view, position)
    if magic != ENTRY_MAGIC:
        raise CorruptIndexError(f"magic {magic} at {position}")
    if not ENTRY_OVERHEAD < length <= len(view) - position:
        raise CorruptIndexError(f"length {length} at {position}")
    start = position + _HEAD.size
    if crc32c(view[start : position + length]) != crc:
        raise CorruptIndexError(f"CRC mismatch in the entry at {position}")
    first, last, first_ts, last_ts, data_length, rdi_length = _BODY.unpack_from(view, start)
    if rdi_length != length - ENTRY_OVERHEAD or not 0 <= first <= last:
        raise CorruptIndexError(f"inconsistent fields in the entry at {position}")
    try:
        rdi = RemoteDataId.decode(bytes(view[start + _BODY.size : position + length]))
    except InvalidRdiError as exc:
        raise CorruptIndexError(f"the entry at {position}: {exc}") from exc
    if rdi.length != data_length:
        raise CorruptIndexError(f"data length {data_length} at {position} is not its RDI's")
    return IndexEntry(first, last, first_ts, last_ts, rdi), length


def decode_entries(data: bytes | memoryview) -> list[IndexEntry]:
    """Every entry of a whole remoteLogIndex (or a segment's shipped entries), in order;
    CorruptIndexError if any is invalid or the offsets do not increase."""
    entries, valid = _scan(data)
    if valid != len(data):
        raise CorruptIndexError(f"invalid bytes at {valid} of {len(data)}")
    return [entry for _, entry in entries]


def encode_entries(entries: Sequence[IndexEntry]) -> bytes:
    return b"".join(entry.encode() for entry in entries)


def _scan(data: bytes | memoryview) -> tuple[list[tuple[int, IndexEntry]], int]:
    """The valid entries from the start (with their positions), up to the first bad one or
    one whose offsets do not follow the one before; and where that stop is."""
    found: list[tuple[int, IndexEntry]] = []
    position = 0
    while position < len(data):
        try:
            entry, size = decode_entry(data, position)
        except CorruptIndexError:
            break
        if found and entry.first_offset <= found[-1][1].last_offset:
            break
        found.append((position, entry))
        position += size
    return found, position


def _index_name(base: int, suffix: str) -> str:
    return f"{base:020d}{suffix}"


class RemoteIndexFile:
    """One set of the three files, with its offset and time entries in memory."""

    def __init__(self, directory: Path, base_offset: int, created_ms: int) -> None:
        self.base_offset = base_offset
        self.created_ms = created_ms  # the writer rotates by age from here
        self.log_path = directory / _index_name(base_offset, REMOTE_LOG_INDEX)
        self.offset_path = directory / _index_name(base_offset, REMOTE_OFFSET_INDEX)
        self.time_path = directory / _index_name(base_offset, REMOTE_TIME_INDEX)
        self.offsets = array("q")  # first offset of each entry
        self.positions = array("q")  # where each entry starts in the remoteLogIndex
        self.times = array("q")  # increasing timestamps
        self.time_positions = array("q")
        self.log_size = 0  # bytes of the remoteLogIndex the entries above cover
        self.last_entry: IndexEntry | None = None
        self._log_fd: int | None = None
        self._identity: tuple[int, int, int] | None = None  # inode, log and offset sizes

    @property
    def paths(self) -> tuple[Path, Path, Path]:
        return self.log_path, self.offset_path, self.time_path

    @property
    def end_offset(self) -> int:
        """The offset after the last entry's records."""
        return -1 if self.last_entry is None else self.last_entry.last_offset + 1

    def __len__(self) -> int:
        return len(self.offsets)

    def _fd(self) -> int:
        if self._log_fd is None:
            self._log_fd = os.open(self.log_path, os.O_RDONLY)
        return self._log_fd

    def close(self) -> None:
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    # Loading ---------------------------------------------------------------------------------

    def load(self) -> None:
        """(Re)read the offset and time entries (a torn last one is left for later) and the
        last log entry they point at. Entries are read only up to what the offset index
        covers, so a writer's half-done append is not seen."""
        self.close()
        stat = os.stat(self.log_path)
        offset_data = self.offset_path.read_bytes()
        time_data = self.time_path.read_bytes() if self.time_path.exists() else b""
        offsets, positions = array("q"), array("q")
        for relative, position in _OFFSET_ENTRY.iter_unpack(_whole(offset_data, _OFFSET_ENTRY)):
            offsets.append(self.base_offset + relative)
            positions.append(position)
        times, time_positions = array("q"), array("q")
        for timestamp, position in _TIME_ENTRY.iter_unpack(_whole(time_data, _TIME_ENTRY)):
            times.append(timestamp)
            time_positions.append(position)
        if any(
            positions[i] >= positions[i + 1] or offsets[i] >= offsets[i + 1]
            for i in range(len(offsets) - 1)
        ) or (positions and positions[-1] >= stat.st_size):
            raise CorruptIndexError(f"{self.offset_path} does not match its remoteLogIndex")
        self.offsets, self.positions = offsets, positions
        self.times, self.time_positions = times, time_positions
        self.last_entry = None
        self.log_size = 0
        if positions:
            data = os.pread(self._fd(), MAX_ENTRY_BYTES, positions[-1])
            self.last_entry, size = decode_entry(data)
            self.log_size = positions[-1] + size
        self._identity = (stat.st_ino, stat.st_size, len(offset_data))

    def changed(self) -> bool:
        """Whether the files moved on since the last load (a reader's refresh)."""
        try:
            stat = os.stat(self.log_path)
            offset_size = os.stat(self.offset_path).st_size
        except FileNotFoundError:
            return True
        return self._identity != (stat.st_ino, stat.st_size, offset_size)

    # Reading ---------------------------------------------------------------------------------

    def locate(self, offset: int) -> int:
        """The number of the entry whose span may hold `offset` (the last starting at or
        before it), or 0 when it lies before them all."""
        return max(bisect_right(self.offsets, offset) - 1, 0)

    def read_entries(self, first: int, stop: int) -> Iterator[IndexEntry]:
        """Entries first..stop-1, read with one pread, each checked as it is reached (a
        caller that stops early never decodes the rest)."""
        if first >= stop:
            return
        start = self.positions[first]
        end = self.positions[stop] if stop < len(self.positions) else self.log_size
        data = os.pread(self._fd(), end - start, start)
        position = 0
        for _ in range(stop - first):
            entry, size = decode_entry(data, position)
            yield entry
            position += size

    def first_reaching(self, timestamp: int) -> int | None:
        """The number of the first entry whose largest timestamp is >= `timestamp`."""
        found = bisect_right(self.times, timestamp - 1)
        if found == len(self.times):
            return None
        return bisect_right(self.positions, self.time_positions[found]) - 1

    # Writing ---------------------------------------------------------------------------------

    def append(self, entries: Sequence[IndexEntry]) -> None:
        """Write entries after the last one: the log entries, then the offset and time
        entries pointing at them (a reader sees the writes in that order). Nothing is
        fsynced here: what a crash loses of the active set is cut by the repair at the next
        writable open and appended again from the store (the indexes are derived from the
        remote records); a set is fsynced once, when it is closed (`sync`)."""
        encoded = _encode_set(self, entries)
        _append(self.log_path, encoded.log, self.log_size)
        _append(self.offset_path, encoded.offsets, len(self.offsets) * _OFFSET_ENTRY.size)
        _append(self.time_path, encoded.times, len(self.times) * _TIME_ENTRY.size)
        self._take(encoded, entries)

    def sync(self) -> None:
        """Make the three files durable (a set being closed)."""
        for path in self.paths:
            fsync_path(path)

    def rewrite(self, entries: Sequence[IndexEntry]) -> None:
        """Replace the three files by ones holding `entries` alone (a repair, or a set taken
        over from the store), each atomically; the remoteLogIndex last, as its name is what
        makes a set exist for the next open."""
        self.close()
        self.offsets, self.positions = array("q"), array("q")
        self.times, self.time_positions = array("q"), array("q")
        self.log_size, self.last_entry = 0, None
        encoded = _encode_set(self, entries)
        write_atomically(self.offset_path, bytes(encoded.offsets))
        write_atomically(self.time_path, bytes(encoded.times))
        write_atomically(self.log_path, bytes(encoded.log))
        self._take(encoded, entries)

    def _take(self, encoded: _EncodedSet, entries: Sequence[IndexEntry]) -> None:
        """Make the in-memory state what the files now say."""
        self.offsets.extend(encoded.offset_keys)
        self.positions.extend(encoded.offset_positions)
        self.times.extend(encoded.time_keys)
        self.time_positions.extend(encoded.time_positions)
        self.log_size += len(encoded.log)
        if entries:
            self.last_entry = entries[-1]
        stat = os.stat(self.log_path)
        self._identity = (stat.st_ino, stat.st_size, os.stat(self.offset_path).st_size)

    def delete(self) -> None:
        self.close()
        for path in (self.offset_path, self.time_path, self.log_path):
            path.unlink(missing_ok=True)


def has_remote_index(directory: Path) -> bool:
    """Whether `directory` holds remote index files (its log is tiered)."""
    return bool(_bases(directory))


class RemoteIndex:
    """The remote index files of one partition directory, oldest first. A reader's lookups
    and refreshes may come from several threads: they take the index's lock, so a refresh
    never closes a file a lookup is reading."""

    def __init__(self, directory: Path, *, writable: bool) -> None:
        self.directory = directory
        self.writable = writable
        self.files: list[RemoteIndexFile] = []  # by base offset
        self._lock = threading.RLock()

    @classmethod
    def open(cls, directory: Path, *, writable: bool = False, now_ms: int = 0) -> RemoteIndex:
        """Load every set in `directory`. A writer repairs what a crash left: the newest
        set's log entries are cut after the last valid one and its offset and time indexes
        written again from them; index files without a remoteLogIndex are removed. A
        reader raises CorruptIndexError for a set whose offset index does not fit its
        remoteLogIndex (the writer repairs it at its next start)."""
        index = cls(directory, writable=writable)
        if writable:
            directory.mkdir(parents=True, exist_ok=True)
            remove_temporaries(directory, is_index_file)
            _remove_orphans(directory)
        bases = _bases(directory)
        for number, base in enumerate(bases):
            file = RemoteIndexFile(directory, base, now_ms)
            if writable and (number == len(bases) - 1 or not _loads(file)):
                _repair(file)
            else:
                file.load()
            index.files.append(file)
        return index

    def close(self) -> None:
        with self._lock:
            for file in self.files:
                file.close()

    # State -----------------------------------------------------------------------------------

    @property
    def first_offset(self) -> int:
        """The first offset of the oldest entry; -1 without entries."""
        for file in self.files:
            if len(file):
                return file.offsets[0]
        return -1

    @property
    def end_offset(self) -> int:
        """The offset after the newest entry's records; -1 without entries."""
        for file in reversed(self.files):
            if file.last_entry is not None:
                return file.end_offset
        return -1

    @property
    def active(self) -> RemoteIndexFile | None:
        return self.files[-1] if self.files else None

    def refresh(self) -> None:
        """A reader's catch-up: sets added, removed or appended to since the last look."""
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        present = _bases(self.directory)
        kept = {file.base_offset: file for file in self.files}
        files = []
        for base in present:
            file = kept.pop(base, None)
            if file is None:
                file = RemoteIndexFile(self.directory, base, 0)
                file.load()
            elif file.changed():
                file.load()
            files.append(file)
        for gone in kept.values():
            gone.close()
        self.files = files

    # Reading ---------------------------------------------------------------------------------

    def entries_from(self, offset: int, max_bytes: int) -> list[IndexEntry]:
        """Consecutive entries starting with the one whose span holds `offset` (or the first
        after it), as many as cover `max_bytes` of data (at least one); [] when no entry
        holds `offset` or anything after it."""
        with self._lock:
            return self._entries_from(offset, max_bytes)

    def _entries_from(self, offset: int, max_bytes: int) -> list[IndexEntry]:
        entries: list[IndexEntry] = []
        covered = 0
        number = max(bisect_right(self.files, offset, key=_base_of) - 1, 0)
        for file in self.files[number:]:
            position = file.locate(offset) if not entries else 0
            while position < len(file):
                stop = min(position + _READ_AHEAD, len(file))
                for entry in file.read_entries(position, stop):
                    if entry.last_offset < offset:
                        continue
                    entries.append(entry)
                    covered += entry.data_length
                    if covered >= max_bytes:
                        return entries
                position = stop
        return entries

    def entry_for_timestamp(self, timestamp: int) -> IndexEntry | None:
        """The first entry holding a timestamp >= `timestamp` (its span has the first such
        record), or None."""
        with self._lock:
            for file in self.files:
                number = file.first_reaching(timestamp)
                if number is not None:
                    return next(file.read_entries(number, number + 1))
            return None

    def __iter__(self) -> Iterator[IndexEntry]:
        """Every entry, oldest first (read and checked file by file)."""
        for file in self.files:
            yield from file.read_entries(0, len(file))

    # Writing ---------------------------------------------------------------------------------

    def append(self, entries: Sequence[IndexEntry], now_ms: int) -> None:
        """Add entries after the newest ones (their offsets must follow), starting a new set
        when there is none or the active one cannot take them (offsets too far from its
        base for its 32-bit relative offsets)."""
        assert self.writable, "a read-only remote index"
        if not entries:
            return
        end = self.end_offset
        if entries[0].first_offset < end or any(
            b.first_offset <= a.last_offset for a, b in pairwise(entries)
        ):
            raise ValueError(f"entries from {entries[0].first_offset} do not follow {end}")
        active = self.active
        if active is None or entries[-1].last_offset - active.base_offset > _INT32_MAX:
            self.rotate(entries[0].first_offset, now_ms)
            active = self.active
            assert active is not None
        active.append(entries)

    def rotation_due(self, max_bytes: int, max_age_ms: int, now_ms: int) -> bool:
        """Whether the active set reached `max_bytes` or `max_age_ms` with entries in it."""
        active = self.active
        return (
            active is not None
            and len(active) > 0
            and (active.log_size >= max_bytes or now_ms - active.created_ms >= max_age_ms)
        )

    def rotate(self, next_offset: int, now_ms: int) -> RemoteIndexFile | None:
        """Close the active set (it is never appended to again) and start an empty one at
        `next_offset`, named by it; returns the closed set (to ship to the store), if any."""
        closed = self.active
        if closed is not None and not len(closed):
            closed.delete()
            self.files.pop()
            closed = None
        elif closed is not None:
            closed.sync()
        file = RemoteIndexFile(self.directory, next_offset, now_ms)
        file.rewrite([])
        self.files.append(file)
        return closed

    def replace(self, base_offset: int, entries: Sequence[IndexEntry], now_ms: int) -> None:
        """Install a set taken from the store (a follower's rebuild): every set it overlaps
        goes, and it takes their place."""
        assert self.writable, "a read-only remote index"
        last = entries[-1].last_offset if entries else base_offset
        for file in list(self.files):
            if file.base_offset <= last and (file.end_offset < 0 or file.end_offset > base_offset):
                file.delete()
                self.files.remove(file)
        file = RemoteIndexFile(self.directory, base_offset, now_ms)
        file.rewrite(entries)
        self.files.append(file)
        self.files.sort(key=lambda f: f.base_offset)
        if file is self.files[-1] and entries:
            self.rotate(file.end_offset, now_ms)  # a set from the store is never appended to
        fsync_path(self.directory)

    def drop_below(self, offset: int) -> list[int]:
        """Delete the sets whose every entry lies below `offset` (the log start moved past
        them), but never the active one; returns their base offsets."""
        dropped = []
        for file in list(self.files[:-1]):
            if file.end_offset <= offset:
                file.delete()
                self.files.remove(file)
                dropped.append(file.base_offset)
        return dropped

    def delete_all(self) -> None:
        for file in self.files:
            file.delete()
        self.files = []


@dataclass(slots=True)
class _EncodedSet:
    """Entries to add to a set, as the bytes of its three files and the in-memory keys."""

    log: bytearray = field(default_factory=bytearray)
    offsets: bytearray = field(default_factory=bytearray)
    times: bytearray = field(default_factory=bytearray)
    offset_keys: list[int] = field(default_factory=list)
    offset_positions: list[int] = field(default_factory=list)
    time_keys: list[int] = field(default_factory=list)
    time_positions: list[int] = field(default_factory=list)


def _encode_set(file: RemoteIndexFile, entries: Sequence[IndexEntry]) -> _EncodedSet:
    """What appending `entries` to `file` writes (a time entry only where the largest
    timestamp grows, as in Kafka's time index)."""
    encoded = _EncodedSet()
    position = file.log_size
    largest = file.times[-1] if file.times else None
    for entry in entries:
        if not 0 <= entry.first_offset - file.base_offset <= entry.last_offset - file.base_offset:
            raise ValueError(f"offset {entry.first_offset} below the set's base {file.base_offset}")
        if entry.last_offset - file.base_offset > _INT32_MAX:
            raise ValueError(f"offset {entry.last_offset} too far from {file.base_offset}")
        data = entry.encode()
        if position + len(data) > _INT32_MAX:
            raise ValueError(f"{file.log_path} cannot grow past 2 GiB")
        encoded.offsets += _OFFSET_ENTRY.pack(entry.first_offset - file.base_offset, position)
        encoded.offset_keys.append(entry.first_offset)
        encoded.offset_positions.append(position)
        if largest is None or entry.last_timestamp > largest:
            largest = entry.last_timestamp
            encoded.times += _TIME_ENTRY.pack(largest, position)
            encoded.time_keys.append(largest)
            encoded.time_positions.append(position)
        encoded.log += data
        position += len(data)
    return encoded


def _whole(data: bytes, entry: struct.Struct) -> bytes:
    return data[: len(data) - len(data) % entry.size]


def _base_of(file: RemoteIndexFile) -> int:
    return file.base_offset


def _bases(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(
        int(name[:20])
        for name in names
        if name.endswith(REMOTE_LOG_INDEX)
        and len(name) == 20 + len(REMOTE_LOG_INDEX)
        and name[:20].isdigit()
    )


def _remove_orphans(directory: Path) -> None:
    """Offset and time indexes whose remoteLogIndex is gone (a set deleted half way)."""
    for suffix in (REMOTE_OFFSET_INDEX, REMOTE_TIME_INDEX):
        for path in directory.glob("*" + suffix):
            if not path.with_suffix(REMOTE_LOG_INDEX).exists():
                path.unlink()


def _loads(file: RemoteIndexFile) -> bool:
    try:
        file.load()
    except (CorruptIndexError, FileNotFoundError):
        return False
    return True


def _repair(file: RemoteIndexFile) -> None:
    """Keep the valid prefix of a set's remoteLogIndex and index it afresh."""
    data = file.log_path.read_bytes()
    entries, valid = _scan(data)
    if valid != len(data) or not _loads(file) or len(file) != len(entries):
        file.rewrite([entry for _, entry in entries])
        file.load()


def _append(path: Path, data: bytes | bytearray, position: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if data:
            os.pwrite(fd, data, position)
        os.ftruncate(fd, position + len(data))
    finally:
        os.close(fd)
