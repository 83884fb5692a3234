"""The aborted transactions of a partition (Kafka's `.txnindex`), which read_committed
fetches answer with so consumers drop the aborted records (docs/transactions.md).

Each entry is Kafka's 34-byte AbortedTxn: int16 version 0, int64 producer id, int64 first
offset (the transaction's first batch here), int64 last offset (its ABORT marker), int64
the last stable offset when the marker was written. Kafka keeps one file per segment; we
keep one per partition, `aborted.txnindex`, entries in marker order: aborts are rare, and
one file needs no lifecycle beside the segments'. The entry format is shared with the
`.txnindex` objects of remote copies (directlog/remote/txn_index.py): a tiering service
reads this file to ship each copy's entries, which remote read_committed fetches answer
from once the local records, or the whole disk, are gone.

The file is a cache of the log, like the producer state: it is fsynced before every
producer state snapshot, so the entries of markers below a snapshot are durable, and
loading the producer state from a snapshot at offset S drops the entries at or above S and
lets the replay of the batches after S add them again.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

from directlog.durable_files import write_atomically
from directlog.remote.txn_index import PARTITION_FILE, AbortedTxn, encode_aborted, valid_prefix
from services.broker.storage.errors import StorageError

__all__ = ["FILE_NAME", "AbortedTxn", "AbortedTxnIndex"]

FILE_NAME = PARTITION_FILE


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
        # A torn last entry (a crash mid-append) or one not written here ends what is
        # taken; the replay rebuilds what follows.
        self.entries = valid_prefix(data)

    def append(self, entry: AbortedTxn) -> None:
        assert not self.entries or entry.last_offset > self.entries[-1].last_offset, "in order"
        try:
            with self.path.open("ab") as file:
                file.write(encode_aborted([entry]))
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

    def remove(self, marker_offsets: set[int]) -> None:
        """Drop the entries of these ABORT markers (the log cleaner removes the markers)."""
        kept = [entry for entry in self.entries if entry.last_offset not in marker_offsets]
        if len(kept) < len(self.entries):
            self._rewrite(kept)

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
                write_atomically(self.path, encode_aborted(entries))
            else:
                self.path.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot rewrite {self.path}: {exc}") from exc
        self.entries = list(entries)
        self._dirty = False
