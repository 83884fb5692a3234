"""Where the files of one partition log live: its directory in the log directory, and, on
a broker with a head directory (rdma_head_segments_dir), a directory of the same name there
for the `.log` files of its newest segments.

Why a head directory: Linux (>= 6.5) refuses long-term writable pinning of file mappings
that need dirty tracking (ext4, xfs), so a NIC cannot register a preallocated segment file
of an ordinary file system for remote writes (RDMA produce, RDMA push replication). A
memory-backed directory (tmpfs: a Kubernetes `emptyDir: {medium: Memory}`) can be; not
hugetlbfs, which has no write(2) for TCP appends. Until it is written back, a segment
there is as durable as that memory is: replication and tiering keep its records
meanwhile. This module is the one place that decides; the RDMA datapaths map and register
`segment.log.path` wherever it lies.

The rules (docs/formats.md, "Head segments in a memory-backed directory"):
- A new segment's `.log` goes to the head directory when the log preallocates, or when the
  head it follows is there; its `.index` and `.timeindex` always go to the log directory.
  So the segments in the head directory are always the log's newest ones: losing them all
  ends the log at the last written-back segment, never leaves a gap in it.
- Only a segment whose `.log` is in the head directory is preallocated. A head left in the
  log directory (written back at a clean close, or a written-back segment become the head
  again by truncation) is appended to as it is until it rolls; the RDMA datapaths roll a
  head without preallocated space before they map one.
- A sealed segment is written back oldest first (PartitionLog.write_back, which the broker's
  housekeeping runs off the event loop): copied to `<base>.log.tmp` in the log directory
  and fsynced, renamed to `<base>.log` (the segment's reads and registrations move to it),
  the directory fsynced, and only then the memory copy removed. A clean close writes back
  the head too.
- Opening: a `.log` found in both places is a write-back's leftover, and the log
  directory's copy wins. A `.log` missing from the head directory (a pod restarted: its
  emptyDir is new) leaves only its indexes behind, which are removed as any index without
  its `.log` is: the log ends where the written-back segments end, and recovery, the
  checkpoints and replication go on from there as after a torn tail. A segment still in
  the head directory is always recovered (validated) when the log opens, and the recovery
  point never passes its base offset.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from directlog.durable_files import TMP_SUFFIX, remove_temporaries
from directlog.topic_config import LogConfig
from services.broker.storage.log_file import LogFile
from services.broker.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    segment_name,
)

log = logging.getLogger(__name__)

_COPY_CHUNK = 8 << 20  # bytes per sendfile call of a write-back


@dataclass(frozen=True, slots=True)
class LogLayout:
    directory: Path  # every file of the log except the `.log` files below
    head_directory: Path | None = None  # `.log` files of the newest segments, if any

    def new_log_directory(self, config: LogConfig, after: LogSegment | None) -> Path:
        """Where the `.log` of a new segment goes: following `after` (the head it
        replaces; None for a log's first segment), in a log with `config`."""
        if self.head_directory is None:
            return self.directory
        if config.preallocate or (after is not None and self.in_memory(after)):
            self.head_directory.mkdir(parents=True, exist_ok=True)
            return self.head_directory
        return self.directory

    def in_memory(self, segment: LogSegment) -> bool:
        """Whether `segment`'s `.log` is in the head directory (not written back yet)."""
        return self.head_directory is not None and segment.log.path.parent == self.head_directory

    def may_preallocate(self, segment: LogSegment, config: LogConfig) -> bool:
        """Whether the head `segment` gets its preallocated length (a file registered for
        remote writes must be in the head directory, when there is one)."""
        return config.preallocate and (self.head_directory is None or self.in_memory(segment))

    def segment_logs(self) -> list[tuple[int, Path]]:
        """(base offset, directory of its `.log`) of every segment, oldest first, once
        what a crash or a lost head directory left is settled: a `.log` in both places
        loses its memory copy, and indexes without their `.log` anywhere are removed."""
        durable = _log_bases(self.directory)
        memory: set[int] = set()
        head = self.head_directory
        if head is not None and head.is_dir():
            remove_temporaries(head)
            memory = _log_bases(head)
            for base in sorted(durable & memory):
                (head / (segment_name(base) + LOG_SUFFIX)).unlink()
            memory -= durable
        orphans: set[int] = set()
        for path in self.directory.iterdir():
            stem, suffix = path.stem, path.suffix
            if (
                suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
                and _is_base(stem)
                and int(stem) not in durable
                and int(stem) not in memory
            ):
                path.unlink()
                orphans.add(int(stem))
        newest = max(durable | memory, default=-1)
        lost = sorted(base for base in orphans if base > newest)
        if head is not None and lost:
            log.warning(
                "%s: no .log of segment(s) %s, neither here nor in %s (lost with the head "
                "directory): the log ends before them",
                self.directory,
                ", ".join(map(str, lost)),
                head,
            )
        found = [(base, self.directory) for base in durable]
        if head is not None:
            found += [(base, head) for base in memory]
        return sorted(found)

    def delete_segment_files(self, base: int) -> None:
        """Remove every file of the segment at `base`, wherever it lies."""
        name = segment_name(base)
        if self.head_directory is not None:
            (self.head_directory / (name + LOG_SUFFIX)).unlink(missing_ok=True)
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            (self.directory / (name + suffix)).unlink(missing_ok=True)

    # Writing back ----------------------------------------------------------------------

    def write_back_target(self, segment: LogSegment) -> Path:
        """The temporary file in the log directory a write-back of `segment` copies to."""
        return self.directory / (segment_name(segment.base_offset) + LOG_SUFFIX + TMP_SUFFIX)

    @staticmethod
    def copy(source: LogFile, size: int, fd: int) -> bool:
        """Copy the first `size` bytes of `source` into the file open at `fd` and fsync
        it; False when `source`'s file was removed midway (the segment was deleted)."""
        position = 0
        while position < size:
            if not source.path.exists():
                return False
            sent = os.sendfile(fd, source.fd, position, min(_COPY_CHUNK, size - position))
            if sent <= 0:
                raise OSError(f"{source.path} ended at {position} of {size} bytes")
            position += sent
        os.fsync(fd)
        return True

    def install(self, segment: LogSegment, temporary: Path) -> LogFile:
        """Rename the write-back copy of `segment` to its usual name; its log file there."""
        target = self.directory / (segment_name(segment.base_offset) + LOG_SUFFIX)
        os.replace(temporary, target)
        installed = LogFile(target)
        assert installed.size == segment.size, "a write-back copies the whole segment"
        return installed

    def remove(self) -> None:
        """Remove the log's directory in the head directory, with whatever is left in it."""
        if self.head_directory is not None and self.head_directory.exists():
            shutil.rmtree(self.head_directory)


def _is_base(stem: str) -> bool:
    return len(stem) == 20 and stem.isdigit()


def _log_bases(directory: Path) -> set[int]:
    return {
        int(path.stem)
        for path in directory.iterdir()
        if path.suffix == LOG_SUFFIX and _is_base(path.stem)
    }
