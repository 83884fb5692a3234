"""A log directory: one sub-directory `<topic>-<partition>` per partition log, plus the
files that describe them all.

    .lock                              held (flock) while a broker owns the directory
    .clean-shutdown                    present only after a clean close: skip recovery
    recovery-point-offset-checkpoint   offsets below which data is known to be on disk
    log-start-offset-checkpoint        first offset still readable in each log
    replication-offset-checkpoint      high watermark of each log

and in each partition directory, beside its segments, `leader-epoch-checkpoint` (see
leader_epochs.py), `partition.metadata` (the topic id; see log.py) and, for compacted
logs, `cleaner-offset-checkpoint` (see cleaner.py).

A broker with a head directory (rdma_head_segments_dir: memory-backed, for the segment
files RDMA peers write) has there a `.lock` and a `<topic>-<partition>` directory per log
holding the `.log` files of its newest segments until they are written back; see
log_layout.py.

The manager does one round of each periodic duty on request (write back sealed segments
and flush what flush.ms says is due, apply retention, compact one log, write checkpoints);
the broker's scheduler decides when.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from directlog.durable_files import fsync_path, remove_temporaries
from directlog.topic_config import LogConfig
from directlog.topics import TopicPartition, topic_name_error
from services.broker.storage.checkpoint import OffsetCheckpointFile
from services.broker.storage.cleaner import CleanResult, clean, find_cleanable
from services.broker.storage.errors import StorageError
from services.broker.storage.log import (
    Clock,
    PartitionLog,
    wall_clock_ms,
    write_partition_metadata,
)
from services.broker.storage.producer_state import PRODUCER_ID_EXPIRATION_MS

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "replication-offset-checkpoint"

ConfigFor = Callable[[str], LogConfig]


class LogManager:
    def __init__(
        self,
        log_dir: Path,
        config_for: ConfigFor,
        clock: Clock,
        lock_fd: int,
        producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS,
        head_segments_dir: Path | None = None,
        head_lock_fd: int = -1,
    ) -> None:
        self.log_dir = log_dir
        self.head_segments_dir = head_segments_dir
        self._head_lock_fd = head_lock_fd
        self._producer_id_expiration_ms = producer_id_expiration_ms
        self._config_for = config_for
        self._clock = clock
        self._lock_fd = lock_fd
        self.logs: dict[TopicPartition, PartitionLog] = {}
        self._recovery_points = OffsetCheckpointFile(log_dir / RECOVERY_POINT_CHECKPOINT)
        self._log_starts = OffsetCheckpointFile(log_dir / LOG_START_CHECKPOINT)
        self._high_watermarks = OffsetCheckpointFile(log_dir / HIGH_WATERMARK_CHECKPOINT)
        self._checkpointing = threading.Lock()
        # One compaction pass at a time; close() and delete() stop it and wait for it, so a
        # pass never reads a closed descriptor or writes into a deleted directory.
        self._cleaning = threading.Lock()
        self._stop_cleaning = threading.Event()
        self._uncleanable: set[PartitionLog] = set()

    @classmethod
    def open(
        cls,
        log_dir: Path,
        config_for: ConfigFor | None = None,
        *,
        clock: Clock = wall_clock_ms,
        producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS,
        configs_pending: bool = False,
        head_segments_dir: Path | None = None,
    ) -> LogManager:
        """Take the directory (and the head directory, if given), load every partition
        log (recovering them if the last shutdown was not clean) and remove the
        clean-shutdown marker. With `configs_pending`, `config_for` does not know the
        topics yet (a broker before its first cluster image): each log waits for its
        `configure` (PartitionLog.open)."""
        lock_fd = _lock(log_dir)
        head_lock_fd = -1
        if head_segments_dir is not None:
            try:
                head_lock_fd = _lock(head_segments_dir)
            except BaseException:
                os.close(lock_fd)
                raise
        manager = cls(
            log_dir,
            config_for or (lambda topic: LogConfig()),
            clock,
            lock_fd,
            producer_id_expiration_ms,
            head_segments_dir,
            head_lock_fd,
        )
        manager._load(configs_pending)
        return manager

    def _head_directory(self, tp: TopicPartition) -> Path | None:
        return None if self.head_segments_dir is None else self.head_segments_dir / str(tp)

    def _load(self, configs_pending: bool) -> None:
        marker = self.log_dir / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        remove_temporaries(self.log_dir)
        recovery_points = self._recovery_points.read()
        log_starts = self._log_starts.read()
        high_watermarks = self._high_watermarks.read()
        for path in sorted(self.log_dir.iterdir()):
            tp = parse_log_dir_name(path.name) if path.is_dir() else None
            if tp is None:
                continue
            self.logs[tp] = PartitionLog.open(
                path,
                self._config_for(tp.topic),
                log_start_offset=log_starts.get(tp, 0),
                recovery_point=recovery_points.get(tp, 0),
                high_watermark=high_watermarks.get(tp, 0),
                clean_shutdown=clean,
                clock=self._clock,
                producer_id_expiration_ms=self._producer_id_expiration_ms,
                config_pending=configs_pending,
                head_directory=self._head_directory(tp),
            )
        self._remove_orphan_heads()
        if not clean and self.logs:
            log.info(
                "recovered %d logs in %s after an unclean shutdown", len(self.logs), self.log_dir
            )
        marker.unlink(missing_ok=True)
        self.checkpoint()

    def _remove_orphan_heads(self) -> None:
        """Directories in the head directory whose log is gone (deleted while a crash
        interrupted the deletion): nothing can read them."""
        if self.head_segments_dir is None:
            return
        for path in sorted(self.head_segments_dir.iterdir()):
            tp = parse_log_dir_name(path.name) if path.is_dir() else None
            if tp is not None and tp not in self.logs:
                log.warning("removing %s: its log is gone from %s", path, self.log_dir)
                shutil.rmtree(path)

    def get(self, tp: TopicPartition) -> PartitionLog | None:
        return self.logs.get(tp)

    def create(
        self,
        tp: TopicPartition,
        config: LogConfig | None = None,
        topic_id: uuid.UUID | None = None,
    ) -> PartitionLog:
        """The log of `tp`, created empty if it does not exist yet, with `topic_id` recorded
        in its partition.metadata when given. An existing log is returned as it is, whatever
        topic id it records (or none): the caller compares `log.topic_id`, and deletes a log
        left by an older topic of the same name or adopts one with `set_topic_id`."""
        existing = self.logs.get(tp)
        if existing is not None:
            return existing
        problem = topic_name_error(tp.topic)
        if problem is not None or tp.partition < 0:
            raise ValueError(problem or f"partition {tp.partition} is negative")
        directory = self.log_dir / str(tp)
        if topic_id is not None and not directory.exists():
            # The id goes down before any segment, so a crash never leaves data without it.
            directory.mkdir()
            write_partition_metadata(directory, topic_id)
        created = PartitionLog.open(
            directory,
            config or self._config_for(tp.topic),
            clock=self._clock,
            producer_id_expiration_ms=self._producer_id_expiration_ms,
            head_directory=self._head_directory(tp),
        )
        if topic_id is not None:
            created.set_topic_id(topic_id)  # no-op unless a leftover directory lacked it
        self.logs[tp] = created
        return created

    def delete(self, *tps: TopicPartition) -> None:
        """Delete these partitions' logs, then rewrite the checkpoints once without them."""
        with self._cleaner_stopped():
            removed = [log for log in (self.logs.pop(tp, None) for tp in tps) if log is not None]
            for partition_log in removed:
                partition_log.delete()
                self._uncleanable.discard(partition_log)
        if removed:
            self.checkpoint()

    def checkpoint(self) -> None:
        self._write(self._recovery_points, lambda p: p.recovery_point)
        self._write(self._log_starts, lambda p: p.log_start_offset)
        self._write(self._high_watermarks, lambda p: p.high_watermark)

    def _write(
        self, checkpoint: OffsetCheckpointFile, offset_of: Callable[[PartitionLog], int]
    ) -> None:
        """Every log's offset, read and written under one lock: housekeeping's fsync thread
        and a DeleteRecords may write a checkpoint at once, and must neither share its
        temporary file nor let the older reading land last."""
        with self._checkpointing:
            checkpoint.write({tp: offset_of(p) for tp, p in list(self.logs.items())})

    def flush_due(self) -> int:
        """Write back every sealed segment still in the head directory (log_layout.py),
        then flush every log whose flush.ms has passed; returns how many logs were
        flushed. Blocking, for a worker thread."""
        written = sum(p.write_back() for p in list(self.logs.values()))
        flushed = sum(1 for p in list(self.logs.values()) if p.flush_if_due())
        if flushed or written:
            self._write(self._recovery_points, lambda p: p.recovery_point)
        return flushed

    def enforce_retention(self) -> int:
        """Apply retention.ms and retention.bytes to every log; returns segments deleted."""
        deleted = sum(p.delete_retained_segments() for p in list(self.logs.values()))
        if deleted:
            self.checkpoint_log_starts()
        return deleted

    def checkpoint_log_starts(self) -> None:
        """Write every log's start offset: after retention, or once DeleteRecords moved one
        (a restart must not serve deleted records again)."""
        self._write(self._log_starts, lambda p: p.log_start_offset)

    def expire_producers(self) -> int:
        """Forget idempotent producers unseen for producer.id.expiration.ms; returns how many."""
        now = self._clock()
        return sum(p.expire_producers(now) for p in list(self.logs.values()))

    def clean_compacted(self) -> CleanResult | None:
        """One compaction pass (cleaner.py) over the compacted log that needs it most: one
        past max.compaction.lag.ms first, else the one with the highest dirty ratio at or
        above its min.cleanable.dirty.ratio. Blocking, for a worker thread; None if no log
        was due."""
        with self._cleaning:
            now = self._clock()
            due = []
            for tp, partition_log in list(self.logs.items()):
                if partition_log in self._uncleanable:
                    continue
                cleanable = find_cleanable(partition_log, now)
                if cleanable is not None and cleanable.due:
                    due.append(
                        (cleanable.overdue, cleanable.dirty_ratio, tp, partition_log, cleanable)
                    )
            if not due:
                return None
            _, _, tp, partition_log, cleanable = max(due, key=lambda entry: entry[:2])
            try:
                result = clean(partition_log, cleanable, now, stop=self._stop_cleaning.is_set)
            except Exception:
                # Like Kafka, a log whose pass fails (a corrupt batch, an I/O error) is left
                # alone until the broker restarts, so it neither floods the log nor starves
                # the other compacted logs.
                log.exception("compaction of %s failed; not compacting it again", tp)
                self._uncleanable.add(partition_log)
                return None
            log.info(
                "compacted %s below offset %d: %d bytes rewritten into %d, %d records removed%s",
                tp,
                result.cleaned_to,
                result.bytes_before,
                result.bytes_after,
                result.records_removed,
                "" if result.complete else " (stopped early)",
            )
            return result

    @contextmanager
    def _cleaner_stopped(self) -> Iterator[None]:
        """Stop a compaction pass in progress (it ends at its next batch) and hold off others."""
        self._stop_cleaning.set()
        with self._cleaning:
            self._stop_cleaning.clear()
            yield

    def close(self) -> None:
        """Flush and close every log, write the checkpoints and mark the shutdown clean."""
        with self._cleaner_stopped():
            for partition_log in self.logs.values():
                partition_log.close()
            self.checkpoint()
            marker = self.log_dir / CLEAN_SHUTDOWN_FILE
            marker.touch()
            fsync_path(self.log_dir)
            self.logs.clear()
            for fd in (self._lock_fd, self._head_lock_fd):
                if fd >= 0:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)


def _lock(directory: Path) -> int:
    """Create `directory` if needed and hold its `.lock`; StorageError if another process
    holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise StorageError(f"{directory} is in use by another process") from exc
    return fd


def parse_log_dir_name(name: str) -> TopicPartition | None:
    """`orders-3` -> TopicPartition("orders", 3); None for anything that is not a log."""
    topic, sep, partition = name.rpartition("-")
    if not sep or not partition.isdigit() or topic_name_error(topic) is not None:
        return None
    return TopicPartition(topic, int(partition))
