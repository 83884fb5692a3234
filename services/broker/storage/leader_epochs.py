"""The leader epoch cache of one partition log: which leader epoch started at which offset.

Replication (KIP-101, KIP-279) answers OffsetForLeaderEpoch from it, and a follower uses
the answer to cut exactly the tail its leader never had instead of trusting the high
watermark. It lives in `<log dir>/leader-epoch-checkpoint`, Kafka's text format:

    0          <- format version
    2          <- number of entries
    0 0        <- epoch, start offset: one line per entry, both strictly increasing
    3 1042

The file is rewritten atomically on every change, which happens about once per leader
change (and on truncation or when the log start moves), never per append: the append path
only compares the batch's epoch with `latest_epoch`.

Mutations take the cache's own lock and replace the entry list as a whole, so readers (the
append path compares epochs under the log's lock only) always see a consistent snapshot.
"""

from __future__ import annotations

import itertools
import logging
import threading
from bisect import bisect_right
from pathlib import Path
from typing import NamedTuple

from directlog.durable_files import write_atomically
from services.broker.storage.errors import StorageError

log = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int  # offset of the first record written in this epoch


class LeaderEpochCache:
    """Ordered (epoch, start offset) entries, strictly increasing in both, persisted to
    `path` whenever they change. Load one with `LeaderEpochCache.load(path)`."""

    def __init__(self, path: Path, entries: list[EpochEntry] | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: list[EpochEntry] = list(entries or [])
        self._latest = self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH
        _check_monotonic(self._entries)

    @classmethod
    def load(cls, path: Path) -> LeaderEpochCache:
        """The cache stored at `path`: empty if the file is missing, StorageError if it is
        malformed (a log whose epoch history cannot be trusted must not serve replicas)."""
        try:
            text = path.read_bytes().decode("ascii")
        except FileNotFoundError:
            return cls(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise StorageError(f"cannot read leader epoch checkpoint {path}: {exc}") from exc
        try:
            entries = parse_checkpoint(text)
        except ValueError as exc:
            raise StorageError(f"malformed leader epoch checkpoint {path}: {exc}") from exc
        return cls(path, entries)

    # Reading -----------------------------------------------------------------------------

    @property
    def latest_epoch(self) -> int:
        """The newest epoch, -1 when the cache is empty."""
        return self._latest

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch answer: (largest known epoch <= `epoch`, start offset
        of the first epoch after it), with `log_end_offset` as the end of the latest epoch.

        The edge cases follow Kafka's LeaderEpochFileCache.endOffsetFor: an empty cache, an
        undefined (negative) epoch, or an epoch above the latest give (-1, -1); an epoch
        below every entry gives (`epoch`, start offset of the first entry), since the data
        before that entry is gone and a follower must not keep anything past it."""
        entries = self._entries
        if epoch < 0 or not entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if epoch == entries[-1].epoch:
            return epoch, log_end_offset
        after = bisect_right(entries, epoch, key=_epoch_of)  # first entry with a larger epoch
        if after == len(entries):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if after == 0:
            return epoch, entries[0].start_offset
        return entries[after - 1].epoch, entries[after].start_offset

    def epoch_for(self, offset: int) -> int:
        """The epoch the record at `offset` was written in (the last entry starting at or
        before it); -1 when no entry does."""
        entries = self._entries
        found = bisect_right(entries, offset, key=_start_of)
        return entries[found - 1].epoch if found else UNDEFINED_EPOCH

    # Changing ----------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` starts at `start_offset`, if it is newer than the latest epoch.

        An equal epoch is a no-op (it started earlier); an older one is ignored with a
        warning (a stale leader must have been fenced before it wrote). Later entries that
        start at or after `start_offset` are dropped, as Kafka does, so both columns stay
        strictly increasing."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        with self._lock:
            latest = self._latest
            if epoch == latest:
                return
            if epoch < latest:
                log.warning(
                    "%s: ignoring leader epoch %d at offset %d, older than the latest epoch %d",
                    self.path,
                    epoch,
                    start_offset,
                    latest,
                )
                return
            kept = list(self._entries)
            while kept and kept[-1].start_offset >= start_offset:
                kept.pop()
            dropped = self._entries[len(kept) :]
            # Dropping one entry that started at the same offset is the ordinary case of a
            # leader elected again before writing anything; anything else is worth a note.
            if len(dropped) > 1 or (dropped and dropped[0].start_offset != start_offset):
                log.warning(
                    "%s: leader epoch %d at offset %d replaces entries %s",
                    self.path,
                    epoch,
                    start_offset,
                    dropped,
                )
            kept.append(EpochEntry(epoch, start_offset))
            self._replace(kept)

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop the entries starting at or after `end_offset` (the log was cut there)."""
        with self._lock:
            entries = self._entries
            if end_offset < 0 or not entries or entries[-1].start_offset < end_offset:
                return
            self._replace([entry for entry in entries if entry.start_offset < end_offset])

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at `start_offset`: entries starting at or below it go, except
        the last of them, which stays with its start moved to `start_offset` (that epoch
        still holds the first records of the log)."""
        with self._lock:
            entries = self._entries
            below = bisect_right(entries, start_offset, key=_start_of)
            if below == 0 or (below == 1 and entries[0].start_offset == start_offset):
                return
            first = EpochEntry(entries[below - 1].epoch, start_offset)
            self._replace([first, *entries[below:]])

    def clear(self) -> None:
        """Drop every entry (the log restarted empty)."""
        with self._lock:
            if self._entries:
                self._replace([])

    def _replace(self, entries: list[EpochEntry]) -> None:
        """Persist `entries`, then make them current: a failed write changes nothing."""
        _check_monotonic(entries)
        lines = [str(VERSION), str(len(entries))]
        lines += [f"{entry.epoch} {entry.start_offset}" for entry in entries]
        try:
            write_atomically(self.path, ("\n".join(lines) + "\n").encode("ascii"))
        except OSError as exc:
            raise StorageError(f"cannot write leader epoch checkpoint {self.path}: {exc}") from exc
        self._entries = entries
        self._latest = entries[-1].epoch if entries else UNDEFINED_EPOCH

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self.path}, {self._entries})"


def _epoch_of(entry: EpochEntry) -> int:
    return entry.epoch


def _start_of(entry: EpochEntry) -> int:
    return entry.start_offset


def _check_monotonic(entries: list[EpochEntry]) -> None:
    for before, after in itertools.pairwise(entries):
        assert before.epoch < after.epoch and before.start_offset < after.start_offset, entries


def parse_checkpoint(text: str) -> list[EpochEntry]:
    """The entries of a leader-epoch-checkpoint file's text (ValueError if malformed)."""
    lines = text.splitlines()
    if len(lines) < 2:
        raise ValueError("missing version or entry count line")
    if lines[0].strip() != str(VERSION):
        raise ValueError(f"unknown version {lines[0].strip()!r}")
    count = int(lines[1])
    rows = lines[2:]
    if count != len(rows):
        raise ValueError(f"header says {count} entries, file has {len(rows)}")
    entries: list[EpochEntry] = []
    for row in rows:
        fields = row.split()
        if len(fields) != 2:
            raise ValueError(f"line {row!r} is not 'epoch start_offset'")
        entry = EpochEntry(int(fields[0]), int(fields[1]))
        if entry.epoch < 0 or entry.start_offset < 0:
            raise ValueError(f"negative value in line {row!r}")
        if entries and not (
            entries[-1].epoch < entry.epoch and entries[-1].start_offset < entry.start_offset
        ):
            raise ValueError(f"entry {row!r} does not follow {entries[-1]} in both columns")
        entries.append(entry)
    return entries
