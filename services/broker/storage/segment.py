"""One segment of a partition log: `<base offset>.log` with its `.index` and `.timeindex`.
The indexes are in the log's directory; the `.log` is there too, or in the log's head
directory (log_layout.py).

Files are named by the 20-digit offset of the first record they may hold. The segment keeps
what appends and reads need in memory: its logical size, the next offset, the largest
timestamp so far and the offset where it was reached, and bytes since the last index entry.

The log cleaner (cleaner.py) writes a compacted segment under `.cleaned` names and swaps it
in for old segments through `.swap` names (`move_to`); `finish_interrupted_swaps` completes
or discards, when a log opens, whatever a crash left of such a swap.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from directlog.durable_files import fsync_path
from directlog.records.batch import (
    HEADER_SIZE,
    NO_TIMESTAMP,
    BatchHeader,
    decode_records,
    iter_batches,
    read_header,
    records_area,
    scan_records,
    verify_crc,
)
from directlog.records.errors import RecordError
from directlog.records.varint import Buffer
from services.broker.storage.errors import StorageError
from services.broker.storage.log_file import LogFile
from services.broker.storage.offset_index import OffsetIndex
from services.broker.storage.time_index import TimeIndex
from services.broker.storage.validator import MAX_DECOMPRESSED, AppendPlan

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
CLEANED_SUFFIX = ".cleaned"  # after the usual name: a compacted segment being written
SWAP_SUFFIX = ".swap"  # after the usual name: a complete compacted segment, being swapped in
_READ_CHUNK = 16 * 1024


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class LogSegment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        log: LogFile,
        index_interval: int,
        created_ms: int,
        suffix: str = "",
    ) -> None:
        name = segment_name(base_offset)
        self.base_offset = base_offset
        self.log = log
        self.offset_index = OffsetIndex(directory / (name + INDEX_SUFFIX + suffix), base_offset)
        self.time_index = TimeIndex(directory / (name + TIME_INDEX_SUFFIX + suffix), base_offset)
        self.index_interval = index_interval
        self.created_ms = created_ms
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self.first_batch_timestamp = NO_TIMESTAMP
        self.bytes_since_index = 0
        self.deleted = False

    @classmethod
    def create(
        cls,
        directory: Path,
        base_offset: int,
        *,
        index_interval: int,
        now_ms: int,
        capacity: int | None,
        suffix: str = "",
        log_directory: Path | None = None,
    ) -> LogSegment:
        """A new, empty segment; with a `suffix` (CLEANED_SUFFIX) its files carry it after
        their usual names until `move_to` renames them. Its `.log` goes to
        `log_directory` if given (the log's head directory), else beside its indexes."""
        path = (log_directory or directory) / (segment_name(base_offset) + LOG_SUFFIX + suffix)
        log = LogFile(path, capacity=capacity, create=True)
        segment = cls(directory, base_offset, log, index_interval, now_ms, suffix)
        segment.offset_index.reset()
        segment.time_index.reset()
        return segment

    @classmethod
    def open(
        cls,
        directory: Path,
        base_offset: int,
        *,
        index_interval: int,
        now_ms: int,
        recover: bool,
        log_directory: Path | None = None,
    ) -> tuple[LogSegment, bool]:
        """Open an existing segment (its `.log` in `log_directory` if given). With
        `recover`, or when its indexes fail their sanity check, every batch is validated
        and the indexes rebuilt; returns whether bytes had to be cut from the end."""
        name = segment_name(base_offset)
        indexes_present = all(
            (directory / (name + suffix)).exists() for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
        )
        log_file = LogFile((log_directory or directory) / (name + LOG_SUFFIX))
        segment = cls(directory, base_offset, log_file, index_interval, now_ms)
        if not recover and indexes_present:
            indexes_ok = segment.offset_index.load() and segment.time_index.load()
            if indexes_ok and segment.offset_index.last_position_within(segment.log.size):
                try:
                    segment._restore_tail()
                    return segment, False
                except RecordError:
                    pass
        return segment, segment.recover()

    @property
    def size(self) -> int:
        return self.log.size

    def is_empty(self) -> bool:
        return self.log.size == 0

    def largest_timestamp(self) -> int:
        """Largest record timestamp, or the file's modification time if it holds none."""
        if self.max_timestamp != NO_TIMESTAMP:
            return self.max_timestamp
        return int(os.stat(self.log.path).st_mtime * 1000)

    def time_waited_for_roll(self, incoming_timestamp: int | None, now_ms: int) -> int:
        """What segment.ms is compared with. As in Kafka, record time when both the first
        batch and the incoming data carry timestamps (so producers whose clocks differ from
        the broker's do not roll a segment per append), else wall time since creation."""
        if self.first_batch_timestamp != NO_TIMESTAMP and incoming_timestamp is not None:
            return incoming_timestamp - self.first_batch_timestamp
        return now_ms - self.created_ms

    # Appending -------------------------------------------------------------------------

    def committed(self, plan: AppendPlan, position: int) -> None:
        """Account for the batches of `plan`, now in the file from `position` on."""
        for batch in plan.batches:
            self._account(
                position + batch.position,
                batch.base_offset,
                batch.last_offset,
                batch.max_timestamp,
                batch.size,
            )

    def append_batch(self, batch: Buffer, header: BatchHeader) -> None:
        """Append one whole batch as it is, e.g. one the log cleaner kept or rebuilt."""
        position = self.log.size
        self.log.append([batch])
        self._account(
            position, header.base_offset, header.last_offset, header.max_timestamp, header.size
        )

    def _account(
        self, position: int, base_offset: int, last_offset: int, max_timestamp: int, size: int
    ) -> None:
        if self.first_batch_timestamp == NO_TIMESTAMP and position == 0:
            self.first_batch_timestamp = max_timestamp
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        if self.bytes_since_index > self.index_interval:
            self.offset_index.append(base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self.bytes_since_index = 0
        self.bytes_since_index += size
        self.next_offset = last_offset + 1

    def on_inactive(self) -> None:
        """The segment stops being the head: record its largest timestamp in the time index
        (so it survives a restart without a scan) and give back preallocated space."""
        if self.max_timestamp != NO_TIMESTAMP:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
        self.log.trim()

    # Reading ---------------------------------------------------------------------------

    def headers_from(
        self, position: int, limit: int | None = None
    ) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch from `position` (a batch boundary) to `limit`."""
        end = self.log.size if limit is None else limit
        chunk = b""
        chunk_start = position
        while position < end:
            offset_in_chunk = position - chunk_start
            if offset_in_chunk + HEADER_SIZE > len(chunk):
                chunk = self.log.read(position, _READ_CHUNK)
                chunk_start, offset_in_chunk = position, 0
            header = read_header(chunk, offset_in_chunk, offset_in_chunk + end - position)
            yield position, header
            position += header.size

    def locate(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The batch holding `offset` (or the first after it), or None past the end."""
        _, position = self.offset_index.lookup(offset)
        for batch_position, header in self.headers_from(position):
            if header.last_offset >= offset:
                return batch_position, header
        return None

    def slice_end(
        self, start: int, max_bytes: int, upper_offset: int, min_one_batch: bool
    ) -> tuple[int, int]:
        """(end position, next offset after the slice) of a read from the batch starting at
        `start`: whole batches only, at most max_bytes (but at least one batch if
        min_one_batch), none holding offsets >= upper_offset."""
        limit, limit_offset = self.log.size, self.next_offset
        if upper_offset < self.next_offset:
            found = self.locate(upper_offset)
            if found is not None:
                limit, limit_offset = found[0], found[1].base_offset
        if start >= limit:
            return start, limit_offset
        target = start + max_bytes
        if target >= limit:
            return limit, limit_offset
        end = max(self.offset_index.lookup_position(target), start)
        next_offset = -1
        for position, header in self.headers_from(end, limit):
            if position + header.size > target:
                if end == start and min_one_batch and position == start:
                    end, next_offset = start + header.size, header.next_offset
                elif next_offset < 0:
                    next_offset = header.base_offset
                break
            end, next_offset = position + header.size, header.next_offset
        return end, next_offset

    def find_timestamp(
        self, timestamp: int, upper_offset: int, lower_offset: int = 0
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `timestamp` with an offset in
        [lower_offset, upper_offset)."""
        indexed = self.time_index.lookup(timestamp) or self.base_offset
        found = self.locate(max(indexed, lower_offset))
        if found is None:
            return None
        for position, header in self.headers_from(found[0]):
            if header.base_offset >= upper_offset:
                return None
            if header.max_timestamp >= timestamp:
                data = self.log.read(position, header.size)
                for record in decode_records(data, 0, header, MAX_DECOMPRESSED):
                    if (
                        record.timestamp >= timestamp
                        and lower_offset <= record.offset < upper_offset
                    ):
                        return record.offset, record.timestamp
        return None

    # Recovery and truncation -----------------------------------------------------------

    def recover(self) -> bool:
        """Validate every batch (bounds, CRC, record framing, offsets never going back),
        rebuild both indexes, and cut the file after the last valid batch. Returns whether
        anything had to be cut (a torn or corrupt tail; preallocated zeros do not count)."""
        self.offset_index.reset()
        self.time_index.reset()
        self.next_offset = self.base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self.first_batch_timestamp = NO_TIMESTAMP
        self.bytes_since_index = 0
        length = self.log.length_on_disk
        valid = 0
        if length:
            with mmap.mmap(self.log.fd, length, prot=mmap.PROT_READ) as mapped:
                valid = self._scan_valid(mapped, length)
                torn = any(mapped[valid : min(length, valid + 4096)]) if valid < length else False
        else:
            torn = False
        self.log.size = length
        if valid < self.log.size:
            self.log.truncate(valid)
        return torn

    def _scan_valid(self, data: Buffer, length: int) -> int:
        position = 0
        expected = self.base_offset
        with memoryview(data) as view:
            while position < length:
                try:
                    header = read_header(view, position, length)
                    if header.base_offset < expected:
                        break
                    verify_crc(view, position, header)
                    records = records_area(view, position, header, MAX_DECOMPRESSED)
                    scan_records(records, 0, len(records), header.records_count, False)
                    if isinstance(records, memoryview):
                        records.release()
                except RecordError:
                    break
                self._account(
                    position,
                    header.base_offset,
                    header.last_offset,
                    header.max_timestamp,
                    header.size,
                )
                position += header.size
                expected = header.next_offset
        return position

    def _restore_tail(self) -> None:
        """After loading trusted indexes: walk the batches after the last index entry to find
        the next offset and the largest timestamp, instead of scanning the whole file."""
        last = len(self.offset_index) - 1
        position = self.offset_index.values[last] if last >= 0 else 0
        if self.time_index.last_timestamp is not None:
            self.max_timestamp = self.time_index.last_timestamp
            self.offset_of_max_timestamp = self.time_index.values[-1]
        self.next_offset = self.offset_index.keys[last] if last >= 0 else self.base_offset
        if self.log.size:
            first = read_header(self.log.read(0, HEADER_SIZE), 0, self.log.size)
            self.first_batch_timestamp = first.max_timestamp
        for _, header in self.headers_from(position):
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp = header.max_timestamp
                self.offset_of_max_timestamp = header.last_offset
            self.next_offset = header.next_offset
        self.bytes_since_index = self.log.size - position

    def truncate_to(self, offset: int) -> None:
        """Remove every batch holding offsets >= offset (a batch is kept or dropped whole)."""
        found = self.locate(offset)
        if found is None:
            return
        position, header = found
        self.log.truncate(position)
        self.offset_index.truncate_to(header.base_offset)
        self.time_index.truncate_to(header.base_offset)
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        if position == 0:
            self.first_batch_timestamp = NO_TIMESTAMP
        self._restore_tail()

    # Lifecycle -------------------------------------------------------------------------

    def flush(self) -> None:
        if self.deleted:  # a flush that listed it before retention or the cleaner removed it
            return
        self.log.flush()
        self.offset_index.flush()
        self.time_index.flush()

    def close(self) -> None:
        self.log.close()
        self.offset_index.close()
        self.time_index.close()

    def delete(self) -> None:
        self.deleted = True
        self.log.delete()
        self.offset_index.delete()
        self.time_index.delete()

    def move_to(self, suffix: str) -> None:
        """Rename the files to their usual names followed by `suffix` ("" for the usual names
        themselves): the indexes first, then, once those renames (and any deletion before
        them) are durable, the `.log`. So a `.log` under a suffix vouches for its indexes
        under the same suffix or already past it, which `finish_interrupted_swaps` relies on."""
        directory = self.offset_index.path.parent
        assert self.log.path.parent == directory, "only segments beside their indexes move"
        name = segment_name(self.base_offset)
        for index, usual in (
            (self.offset_index, INDEX_SUFFIX),
            (self.time_index, TIME_INDEX_SUFFIX),
        ):
            target = directory / (name + usual + suffix)
            os.replace(index.path, target)
            index.path = target
        fsync_path(directory)
        target = directory / (name + LOG_SUFFIX + suffix)
        os.replace(self.log.path, target)
        self.log.path = target
        fsync_path(directory)


def finish_interrupted_swaps(directory: Path) -> None:
    """Complete or discard what a crash left of the cleaner's swaps, before a log opens.

    `.cleaned` files were never complete: deleted. A `<base>.log.swap` is a complete
    compacted segment (the swap's commit point): the old segments it replaces, those whose
    base lies in (base, its next offset), are deleted, then its files take their usual names
    (replacing the old segment at `base`). Old segments past its next offset, all of whose
    records the cleaner removed, may remain: they hold only records superseded later in the
    log, so keeping them is safe. Index `.swap` files without their `.log.swap` are
    leftovers from before a commit point: deleted."""
    changed = False
    for leftover in directory.glob("*" + CLEANED_SUFFIX):
        leftover.unlink()
        changed = True
    for log_swap in sorted(directory.glob("*" + LOG_SUFFIX + SWAP_SUFFIX)):
        name = log_swap.name[: -len(LOG_SUFFIX + SWAP_SUFFIX)]
        if not (len(name) == 20 and name.isdigit()):
            continue
        base = int(name)
        end = _next_offset_of(log_swap, base)
        for path in directory.glob("*" + LOG_SUFFIX):
            stem = path.stem
            if len(stem) == 20 and stem.isdigit() and base < int(stem) < end:
                for usual in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                    (directory / (stem + usual)).unlink(missing_ok=True)
        for usual in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            swap = directory / (name + usual + SWAP_SUFFIX)
            if swap.exists():
                os.replace(swap, directory / (name + usual))
        fsync_path(directory)  # the deletions and index renames before the log takes its name
        os.replace(log_swap, directory / (name + LOG_SUFFIX))
        changed = True
    for orphan in directory.glob("*" + SWAP_SUFFIX):
        orphan.unlink()
        changed = True
    if changed:
        fsync_path(directory)


def _next_offset_of(path: Path, base_offset: int) -> int:
    """The offset after the last batch of a complete (fsynced) segment file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return base_offset
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
            next_offset = base_offset
            for _, header in iter_batches(mapped):
                next_offset = header.next_offset
            return next_offset
    except RecordError as exc:
        raise StorageError(f"{path} is not a complete compacted segment: {exc}") from exc
    finally:
        os.close(fd)
