"""The aborted transactions of a partition (Kafka's `.txnindex`), which read_committed
fetches answer with so consumers drop the aborted records (docs/transactions.md).

Each entry is Kafka's 34-byte AbortedTxn: int16 version 0, int64 producer id, int64 first
offset (the transaction's first batch here), int64 last offset (its ABORT marker), int64
the last stable offset when the marker was written. Kafka keeps one file per segment; we
keep one per partition, `aborted.txnindex`, entries in marker order: aborts are rare, and
one file needs no lifecycle beside the segments'.

The file is a cache of the log, like the producer state: it is fsynced before every
producer state snapshot, so the entries of markers below a snapshot are durable, and
loading the producer state from a snapshot at offset S drops the entries at or above S and
lets the replay of the batches after S add them again.
"""

from __future__ import annotations

import bisect
import os
import struct
from pathlib import Path
from typing import NamedTuple

from directlog.durable_files import write_atomically
from services.broker.storage.errors import StorageError

FILE_NAME = "aborted.txnindex"
_ENTRY = struct.Struct(">hqqqq")  # version, producer id, first, last, last stable offset


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int


class AbortedTxnIndex:
    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME
        self.entries: list[AbortedTxn] = []
        self._dirty = False
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(f"cannot read {self.path}: {exc}") from exc
        # A torn last entry (a crash mid-append) is dropped; the replay restores it.
        for at in range(0, len(data) - _ENTRY.size + 1, _ENTRY.size):
            version, *fields = _ENTRY.unpack_from(data, at)
            entry = AbortedTxn(*fields)
            if version != 0 or (self.entries and entry.last_offset <= self.entries[-1].last_offset):
                break  # not an entry we wrote: what follows is rebuilt by the replay
            self.entries.append(entry)

    def append(self, entry: AbortedTxn) -> None:
        assert not self.entries or entry.last_offset > self.entries[-1].last_offset, "in order"
        try:
            with self.path.open("ab") as file:
                file.write(_ENTRY.pack(0, *entry))
        except OSError as exc:
            raise StorageError(f"cannot append to {self.path}: {exc}") from exc
        self.entries.append(entry)
        self._dirty = True

    def collect(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """The aborted transactions a read of [fetch_offset, upper_offset) may hold records
        of: aborted at or after fetch_offset, started before upper_offset."""
        start = self._first_ending_at_or_after(fetch_offset)
        return [e for e in self.entries[start:] if e.first_offset < upper_offset]

    def truncate_to(self, offset: int) -> None:
        """Drop the entries of markers at or above `offset`."""
        keep = self._first_ending_at_or_after(offset)
        if keep < len(self.entries):
            self._rewrite(self.entries[:keep])

    def drop_below(self, offset: int) -> None:
        """Drop the entries of transactions wholly below `offset` (the new log start)."""
        drop = self._first_ending_at_or_after(offset)
        if drop:
            self._rewrite(self.entries[drop:])

    def clear(self) -> None:
        self._rewrite([])

    def flush(self) -> None:
        if not self._dirty:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"cannot fsync {self.path}: {exc}") from exc
        self._dirty = False

    def _first_ending_at_or_after(self, offset: int) -> int:
        """The index of the first entry whose marker is at or above `offset`."""
        return bisect.bisect_left(self.entries, offset, key=lambda e: e.last_offset)

    def _rewrite(self, entries: list[AbortedTxn]) -> None:
        try:
            if entries:
                write_atomically(self.path, b"".join(_ENTRY.pack(0, *e) for e in entries))
            else:
                self.path.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot rewrite {self.path}: {exc}") from exc
        self.entries = list(entries)
        self._dirty = False
