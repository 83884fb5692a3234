"""A partition's log: an ordered run of segments, addressed by offset.

Appends come two ways and commit through one path (validator.plan_append, then
LogSegment.committed): `append` writes a producer's or a leader's buffer at the log end
with one positional gathered write, stamping base offsets in the header copies it writes;
`reserve` hands out a writable region of the preallocated, memory-mapped head segment that
a producer fills itself (the RDMA produce of KafkaDirect), and `commit` validates those
bytes where they lie and stamps offsets in place. Readers get whole batches as file slices
bounded by max bytes and an upper offset (the high watermark), ready for os.sendfile.

Beside the segments the directory holds the leader epoch cache (`leader-epoch-checkpoint`,
see leader_epochs.py), kept in step with appends, truncation and retention, Kafka's
`partition.metadata`, which names the topic id the log belongs to, and the idempotent
producers' state (`<offset>.snapshot`, see producer_state.py), checked before a producer
append writes anything and snapshotted when a segment rolls and when the log closes.

On a broker with a head directory (rdma_head_segments_dir) the `.log` files of a
preallocating log's newest segments live there, in memory, until they are sealed and
written back (`write_back`); log_layout.py holds the rules.

A tiered log (KIP-405, docs/tiering.md) also has remote index files in its directory,
which its tiering service writes: its log start may then lie below its first local
segment (the records between are in the remote store; `read` raises
OffsetMovedToTieredStorageError for them), and retention deletes a local segment only
once the remote indexes hold its records.

Invariants: offsets are dense for producer appends and never go back; log start <= high
watermark <= log end; recovery point <= log end; the head segment is the last one; no
leader epoch entry starts past the log end.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import struct
import threading
import time
import uuid
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol

from directlog.durable_files import fsync_path, remove_temporaries, write_atomically
from directlog.records.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    BatchHeader,
    TimestampType,
    decode_records,
    iter_batches,
    stamp_offset_and_epoch,
)
from directlog.records.errors import InvalidRecordError
from directlog.records.markers import (
    ABORT,
    build_marker,
    control_type,
    marker_coordinator_epoch,
)
from directlog.records.varint import Buffer
from directlog.remote.index import CorruptIndexError, RemoteIndex, has_remote_index
from directlog.remote.layout import is_index_file
from directlog.topic_config import LogConfig
from directlog.topics import uuid_text
from services.broker.storage.errors import (
    OffsetMovedToTieredStorageError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
    ReservationStateError,
    StorageError,
)
from services.broker.storage.leader_epochs import (
    LEADER_EPOCH_CHECKPOINT,
    EpochEntry,
    LeaderEpochCache,
)
from services.broker.storage.log_file import EMPTY_SLICE, FileSlice
from services.broker.storage.log_layout import LogLayout
from services.broker.storage.offset_index import OffsetIndex
from services.broker.storage.producer_state import (
    PRODUCER_ID_EXPIRATION_MS,
    BatchMetadata,
    ProducerAppend,
    ProducerSnapshotFiles,
    ProducerStateManager,
)
from services.broker.storage.segment import (
    SWAP_SUFFIX,
    LogSegment,
    finish_interrupted_swaps,
)
from services.broker.storage.txn_index import AbortedTxn, AbortedTxnIndex
from services.broker.storage.validator import AppendPlan, plan_append, recompressed

log = logging.getLogger(__name__)

Clock = Callable[[], int]
_PREFIX = struct.Struct(">qii")  # base_offset, batch_length, partition_leader_epoch
_INT32_MAX = (1 << 31) - 1
PARTITION_METADATA = "partition.metadata"


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class AppendResult(NamedTuple):
    first_offset: int
    last_offset: int
    records: int
    size: int
    log_append_time: int  # -1 unless the topic stamps LogAppendTime
    # An idempotent producer's retry: nothing was written; the offsets are the original's.
    duplicate: bool = False


@dataclass(slots=True, frozen=True)
class LogRead:
    records: FileSlice
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    first_offset: int = -1  # base offset of the first batch in `records`
    next_offset: int = -1  # offset after the last batch in `records`

    @property
    def offsets(self) -> int:
        """Offsets the slice spans (its record count unless compaction left gaps)."""
        return max(self.next_offset - self.first_offset, 0)


class LogListener(Protocol):
    """Told of a log's segments changing under registrations of them (RDMA consume).
    Called with the log's lock held, on the thread that made the change."""

    def segment_rolled(self, log: PartitionLog, sealed: LogSegment) -> None:
        """``sealed`` stops being the head; it still has its preallocated length, which it
        gives back when this returns."""

    def segments_removed(self, log: PartitionLog, segments: list[LogSegment]) -> None:
        """``segments`` are about to be deleted (retention, compaction, truncation) or,
        for a truncated head, cut."""

    def high_watermark_moved(self, log: PartitionLog) -> None:
        """The leader moved the high watermark up."""

    def segment_moved(self, log: PartitionLog, segment: LogSegment) -> None:
        """The sealed ``segment`` was written back from the head directory (log_layout.py):
        ``segment.log`` is a new file, with the same bytes, and the old one is removed
        when this returns (mappings of it stay valid; new opens of its path fail). Called
        on the thread that writes back, not the event loop."""


@dataclass(eq=False, slots=True)
class Reservation:
    """A region of the head segment handed to a producer that writes it directly."""

    segment: LogSegment
    position: int
    size: int
    buffer: memoryview
    open: bool = field(default=True)


class PartitionLog:
    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        recovery_point: int,
        high_watermark: int,
        clock: Clock,
        leader_epochs: LeaderEpochCache,
        topic_id: uuid.UUID | None = None,
        producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS,
        layout: LogLayout | None = None,
    ) -> None:
        assert segments, "a log always has a head segment"
        self.directory = directory
        self.layout = layout or LogLayout(directory)
        # Bumped when segments are cut or replaced by truncation: a write-back copying
        # outside the lock then knows its copy may be stale.
        self._generation = 0
        self._deleted = False
        self.config = config
        self._segments = segments
        self._bases = [segment.base_offset for segment in segments]
        self._clock = clock
        self._lock = threading.RLock()
        self._pending: list[Reservation] = []
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self.high_watermark = high_watermark
        self._unflushed_records = 0
        self._last_flush_ms = clock()
        self.leader_epochs = leader_epochs
        self.topic_id = topic_id
        self.producers = ProducerStateManager(producer_id_expiration_ms)
        self._producer_snapshots = ProducerSnapshotFiles(directory)
        self.aborted = AbortedTxnIndex(directory)  # read_committed fetches' aborted list
        self.listeners: list[LogListener] = []
        # Tiered storage: the remote indexes (read-only here) and the offset after the last
        # record they hold at their last reading (-1: none).
        self.remote: RemoteIndex | None = None
        self.remote_end_offset = -1
        self._start_unchecked = False  # see `open`'s config_pending

    # Opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig,
        *,
        log_start_offset: int = 0,
        recovery_point: int = 0,
        high_watermark: int = 0,
        clean_shutdown: bool = False,
        clock: Clock = wall_clock_ms,
        producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS,
        config_pending: bool = False,
        head_directory: Path | None = None,
    ) -> PartitionLog:
        """Open or create the log in `directory`, with the `.log` files of its newest
        segments in `head_directory` if given (log_layout.py: segments found there are
        always recovered; those lost with it end the log before them).

        A log start below the first segment is raised to it (a crash after retention can
        leave the checkpoint behind), unless the log is tiered (remote indexes in the
        directory, or `config` says so), whose records below are in the remote store. With
        `config_pending` (a broker opening its logs before it knows their topics' configs)
        that check waits for `configure`.

        After an unclean shutdown every segment holding offsets at or above
        `recovery_point` is validated batch by batch; the log is cut after the last valid
        batch and any later segment is deleted. Segments wholly below `log_start_offset`
        (left by a crash during retention) are deleted, after a compacted segment's swap
        that a crash interrupted is completed or discarded (segment.finish_interrupted_swaps).
        The leader epoch cache is then cut to the log as it stands (a crash may have lost
        records an epoch entry points at), and the producer state rebuilt from the newest
        usable snapshot at or below the log end plus the batch headers after it.
        A malformed leader-epoch-checkpoint or partition.metadata raises StorageError."""
        directory.mkdir(parents=True, exist_ok=True)
        # The remote indexes' are the tiering service's, which may be writing one now.
        remove_temporaries(directory, lambda name: not is_index_file(name))
        finish_interrupted_swaps(directory)
        topic_id = read_partition_metadata(directory)
        leader_epochs = LeaderEpochCache.load(directory / LEADER_EPOCH_CHECKPOINT)
        now = clock()
        layout = LogLayout(directory, head_directory)
        found = layout.segment_logs()
        bases = [base for base, _ in found]
        segments: list[LogSegment] = []
        for i, (base, log_directory) in enumerate(found):
            next_base = bases[i + 1] if i + 1 < len(bases) else None
            recover = log_directory != directory or (
                not clean_shutdown and (next_base is None or next_base > recovery_point)
            )
            segment, cut = LogSegment.open(
                directory,
                base,
                index_interval=config.index_interval_bytes,
                now_ms=now,
                recover=recover,
                log_directory=log_directory,
            )
            if segments and segment.base_offset < segments[-1].next_offset:
                segment.delete()
                cut = True
            else:
                segments.append(segment)
            if recover:
                segment.flush()
            if cut:
                for later in bases[i + 1 :]:
                    layout.delete_segment_files(later)
                break
        while len(segments) > 1 and segments[1].base_offset <= log_start_offset:
            segments.pop(0).delete()
        if not segments:
            start = max(log_start_offset, 0)
            segments.append(
                LogSegment.create(
                    directory,
                    start,
                    index_interval=config.index_interval_bytes,
                    now_ms=now,
                    capacity=None,
                    log_directory=layout.new_log_directory(config, None),
                )
            )
        if layout.may_preallocate(segments[-1], config):
            segments[-1].log.preallocate(config.segment_bytes)
        log_end = segments[-1].next_offset
        durable_end = next(
            (segment.base_offset for segment in segments if layout.in_memory(segment)), log_end
        )
        local_start = max(log_start_offset, segments[0].base_offset)
        tiered = has_remote_index(directory) or config.remote_storage_enable
        keep = tiered or config_pending
        start = min(max(log_start_offset, 0) if keep else local_start, log_end)
        point = min(log_end if not clean_shutdown else recovery_point, durable_end)
        leader_epochs.truncate_from_end(log_end)
        leader_epochs.truncate_from_start(min(local_start, log_end))
        opened = cls(
            directory,
            config,
            segments,
            log_start_offset=start,
            recovery_point=min(max(point, start), log_end),
            high_watermark=min(max(high_watermark, start), log_end),
            clock=clock,
            leader_epochs=leader_epochs,
            topic_id=topic_id,
            producer_id_expiration_ms=producer_id_expiration_ms,
            layout=layout,
        )
        opened._start_unchecked = config_pending and not tiered
        opened._producer_snapshots.delete_below(start)
        opened._load_producer_state()
        if not config_pending:
            opened._settle_head()
        if tiered:
            opened.refresh_remote()
        return opened

    # State -----------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def tiered(self) -> bool:
        """Whether records below the first local segment may be in the remote store: the
        topic says so, or the directory has remote indexes."""
        return self.config.remote_storage_enable or self.remote is not None

    @property
    def local_log_start_offset(self) -> int:
        """The first offset a local segment serves (the log start unless the log is tiered)."""
        return max(self.log_start_offset, self._segments[0].base_offset)

    @property
    def segments(self) -> list[LogSegment]:
        with self._lock:
            return list(self._segments)

    @property
    def size_bytes(self) -> int:
        return sum(segment.size for segment in self.segments)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (largest known epoch <= `epoch`, offset where it ends), the
        log end for the latest epoch; see LeaderEpochCache.end_offset_for for the edges."""
        with self._lock:
            return self.leader_epochs.end_offset_for(epoch, self.log_end_offset)

    def set_topic_id(self, topic_id: uuid.UUID) -> None:
        """Record the topic id in partition.metadata if the log has none yet (a log from
        before topic ids, or a crash between creating it and writing the file). A log that
        already names another topic id raises ValueError: the caller should have deleted it."""
        with self._lock:
            if self.topic_id == topic_id:
                return
            if self.topic_id is not None:
                raise ValueError(
                    f"{self.directory} belongs to topic id {self.topic_id}, not {topic_id}"
                )
            write_partition_metadata(self.directory, topic_id)
            self.topic_id = topic_id

    def configure(self, config: LogConfig) -> None:
        """Take the topic's (new) config; the first one after an open with config_pending
        settles the log start (see `open`)."""
        with self._lock:
            self.config = config
            self._settle_head()
            if self._start_unchecked:
                self._start_unchecked = False
                if not self.tiered and self.log_start_offset < self._segments[0].base_offset:
                    self._start_at(self._segments[0].base_offset)

    def update_high_watermark(self, offset: int) -> int:
        """Move the high watermark, kept within [log start, log end]; returns it."""
        with self._lock:
            self.high_watermark = min(max(offset, self.log_start_offset), self.log_end_offset)
            self.producers.forget_replicated(self.high_watermark)
            return self.high_watermark

    # Appending -------------------------------------------------------------------------

    def append(
        self, buf: Buffer, *, leader_epoch: int = -1, assign_offsets: bool = True
    ) -> AppendResult:
        """Validate and append one or more batches. With `assign_offsets` (producer data)
        they take the next offsets; without (a follower) they keep the leader's offsets.
        A rejected buffer raises a typed error and leaves the log unchanged.

        Producer data from idempotent producers must pass their epoch and sequence checks
        (InvalidProducerEpochError, OutOfOrderSequenceError); an append repeating a batch
        already written is not written again and answers that batch's offsets with
        `duplicate` set. A follower's batches only update the producer state.

        A leader's `leader_epoch` (>= 0) newer than the cache's latest starts that epoch at
        the first offset; a follower's batches start each newer epoch they carry."""
        if assign_offsets:
            (result,) = self.append_produced([buf], leader_epoch)
            if isinstance(result, Exception):
                raise result
            return result
        with self._lock:
            if self._pending:
                raise ReservationStateError("append while reservations are pending")
            now = self._clock()
            plan = self._plan(buf, leader_epoch, False, now)
            self._maybe_roll(plan.size, plan.last_offset, plan.max_timestamp, now)
            if plan.epoch_starts:
                self._assign_replicated_epochs(plan.epoch_starts)
            self._write([(buf, plan)], leader_epoch)
            self.producers.update_replicated(buf, plan)
            self._index_aborted(buf)
            return self._appended(plan)

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        leader_epoch: int,
    ) -> AppendResult:
        """A leader writes a transaction marker (directlog/records/markers.py) at the log
        end, ending the producer's open transaction here. Producers may not write control
        batches, so the marker is built here; an epoch older than the producer's here raises
        InvalidProducerEpochError, an older coordinator epoch than its last marker's here
        TRANSACTION_COORDINATOR_FENCED."""
        with self._lock:
            self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
            return self.append_from_coordinator(
                lambda base_offset, now: build_marker(
                    producer_id,
                    producer_epoch,
                    commit,
                    coordinator_epoch,
                    base_offset,
                    leader_epoch,
                    now,
                ),
                leader_epoch,
            )

    def append_from_coordinator(
        self, build: Callable[[int, int], bytes], leader_epoch: int
    ) -> AppendResult:
        """A leader appends a batch a coordinator made — a marker, or a transaction's offset
        commits carrying the producer's id and epoch but no sequence — built by
        `build(base offset, now)` at the log end and taken as built: validated as a
        follower's batch, the producer state applied without the producer checks."""
        with self._lock:
            if self._pending:
                raise ReservationStateError("append while reservations are pending")
            now = self._clock()
            buf = build(self.log_end_offset, now)
            plan = self._plan(buf, leader_epoch, False, now)
            self._maybe_roll(plan.size, plan.last_offset, plan.max_timestamp, now)
            if leader_epoch > self.leader_epochs.latest_epoch:
                self.leader_epochs.assign(leader_epoch, plan.first_offset)
            self._write([(buf, plan)], leader_epoch)
            self.producers.update_replicated(buf, plan)
            self._index_aborted(buf)
            return self._appended(plan)

    def aborted_transactions(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """The aborted transactions a read_committed read of [fetch_offset, upper_offset)
        answers with, so the consumer drops their records."""
        with self._lock:
            return self.aborted.collect(fetch_offset, upper_offset)

    def forget_aborted(self, marker_offsets: list[int]) -> None:
        """Drop, durably, the index entries of these ABORT markers: the log cleaner removes
        the markers next, every batch of their transactions being gone already. A
        read_committed fetch must not name a transaction whose marker it cannot meet: the
        consumer would skip that producer's later transactions too."""
        with self._lock:
            self.aborted.remove(set(marker_offsets))

    def _index_aborted(self, data: Buffer | None) -> None:
        """Index the aborted transactions among those the batches just applied ended
        (`data`: those batches; None: read each marker back from the log)."""
        for producer_id, first_offset, marker_offset in self.producers.take_ended():
            kind = _marker_type(data, marker_offset) if data is not None else None
            if kind is None:
                read = self.read(marker_offset, 1 << 16)
                kind = _marker_type(read.records.read(), marker_offset)
            if kind == ABORT:
                self.aborted.append(
                    AbortedTxn(producer_id, first_offset, marker_offset, self.last_stable_offset)
                )

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: below it every transaction is decided on every replica that may
        lead (the high watermark, or the first offset of a transaction still undecided)."""
        with self._lock:
            high_watermark = self.high_watermark
            unstable = self.producers.first_unstable_offset(high_watermark)
            return high_watermark if unstable is None else min(unstable, high_watermark)

    def append_produced(
        self, bufs: Sequence[Buffer], leader_epoch: int = -1
    ) -> list[AppendResult | Exception]:
        """Producer data of several requests, in order: each buffer is checked and takes
        offsets as `append` would do for it alone, and answers with its result or the
        error that rejected it (the others still go in), but consecutive accepted buffers
        are written with one `pwritev`. A connection's pipelined produce requests arrive
        together; one write, one segment update and one high watermark move for all of
        them is what lets a broker keep up with batch-size-1 producers. A group is written
        early where one by one would differ: before a roll, after the first batch of an
        empty segment (whose timestamp segment.ms counts from), and before an idempotent
        producer's batch is checked (its sequence check must see the batches before it)."""
        answers: list[AppendResult | Exception | None] = []
        with self._lock:
            if self._pending:
                return [
                    ReservationStateError("append while reservations are pending") for _ in bufs
                ]
            now = self._clock()
            group: list[_Planned] = []
            group_bytes = 0
            for buf in bufs:
                try:
                    buf = recompressed(buf, self.config)  # compression.type: stored rebuilt
                    next_offset = group[-1].plan.last_offset + 1 if group else self.log_end_offset
                    plan = self._plan(buf, leader_epoch, True, now, next_offset)
                    if group and (
                        group[-1].producers is not None
                        or self._segments[-1].is_empty()
                        or self._roll_due(
                            group_bytes + plan.size,
                            plan.last_offset,
                            plan.max_timestamp,
                            now,
                            len(group) + 1,
                        )
                    ):
                        self._write_group(group, answers, leader_epoch)
                        group, group_bytes = [], 0
                    producers = self.producers.check_append(buf, plan)
                    if producers is not None and producers.duplicate is not None:
                        answers.append(_duplicate(producers.duplicate, self.config))
                        continue
                    if not group:
                        self._maybe_roll(plan.size, plan.last_offset, plan.max_timestamp, now)
                    # Before the write, as Kafka does: an entry whose records a crash lost
                    # is cut at the next open, while records without their epoch entry
                    # could not be repaired.
                    if leader_epoch > self.leader_epochs.latest_epoch:
                        self.leader_epochs.assign(leader_epoch, plan.first_offset)
                except Exception as error:
                    answers.append(error)
                    continue
                group.append(_Planned(buf, plan, producers, len(answers)))
                group_bytes += plan.size
                answers.append(None)  # until the group is written
            if group:
                self._write_group(group, answers, leader_epoch)
        written: list[AppendResult | Exception] = []
        for answer in answers:
            assert answer is not None, "every accepted append is in a written group"
            written.append(answer)
        return written

    def _write_group(
        self,
        group: list[_Planned],
        answers: list[AppendResult | Exception | None],
        leader_epoch: int,
    ) -> None:
        """Write planned producer appends and fill in their answers: the results, or for
        every one of them the error that stopped the write or the flush after it."""
        try:
            self._write([(planned.buf, planned.plan) for planned in group], leader_epoch)
            for planned in group:
                if planned.producers is not None:
                    self.producers.complete(planned.producers)
                answers[planned.answer] = _result(planned.plan)
            self._count_unflushed(sum(planned.plan.records for planned in group))
        except Exception as error:
            for planned in group:
                answers[planned.answer] = error

    def _write(self, appends: list[tuple[Buffer, AppendPlan]], leader_epoch: int) -> None:
        """One write of planned appends at the head's end, then their accounting."""
        segment = self._segments[-1]
        position = segment.size
        iov: list[Buffer] = []
        for buf, plan in appends:
            iov += _iovecs(buf, plan, leader_epoch)
        segment.log.append(iov)
        for _, plan in appends:
            segment.committed(plan, position)
            position += plan.size

    def find_duplicate(self, buf: Buffer) -> AppendResult | None:
        """What `append` would answer if `buf` repeats an idempotent producer's batches
        already written, else None; writes nothing, but raises as `append` would on
        invalid batches (a produce reserving space elsewhere checks first)."""
        with self._lock:
            plan = self._plan(buf, -1, True, self._clock())
            producers = self.producers.check_append(buf, plan)
            if producers is not None and producers.duplicate is not None:
                return _duplicate(producers.duplicate, self.config)
            return None

    def reserve(self, size: int) -> Reservation:
        """Hand out the next `size` bytes of the preallocated head segment for a producer to
        fill with batches; commit or abort reservations in the order they were made."""
        with self._lock:
            if not self.config.preallocate:
                raise ReservationStateError("reservations need log.preallocate")
            if not 0 < size <= self.config.segment_bytes:
                raise RecordBatchTooLargeError(
                    f"reservation of {size} bytes; segment.bytes is {self.config.segment_bytes}"
                )
            if self._pending:
                last = self._pending[-1]
                position = last.position + last.size
                if position + size > self.config.segment_bytes:
                    raise ReservationStateError(
                        "head segment full: commit pending reservations first"
                    )
            else:
                self._maybe_roll(size, self.log_end_offset, None, self._clock())
                position = self._segments[-1].size
            segment = self._segments[-1]
            reservation = Reservation(segment, position, size, segment.log.region(position, size))
            self._pending.append(reservation)
            return reservation

    def commit(
        self, reservation: Reservation, length: int | None = None, *, leader_epoch: int = -1
    ) -> AppendResult:
        """Validate the first `length` bytes of a filled reservation where they lie, stamp
        offsets in place and make them part of the log. Only the oldest pending reservation
        can commit; only the newest may commit fewer bytes than it reserved. A region that
        fails validation (the producer checks included, as in `append`) is discarded with
        every later reservation, and the error raised; so is a region that repeats batches
        already written, answered like `append` answers a duplicate."""
        with self._lock:
            if not self._pending or self._pending[0] is not reservation:
                raise ReservationStateError(
                    "commit of a reservation that is not the oldest pending"
                )
            used = reservation.size if length is None else length
            if not 0 < used <= reservation.size:
                raise ReservationStateError(
                    f"commit of {used} bytes of a {reservation.size}-byte reservation"
                )
            if used < reservation.size and len(self._pending) > 1:
                raise ReservationStateError("only the newest reservation may commit short")
            region = reservation.buffer[:used]
            try:
                plan = self._plan(region, leader_epoch, True, self._clock())
                producers = self.producers.check_append(region, plan)
                if producers is not None and producers.duplicate is not None:
                    region.release()
                    self._discard_pending(0)  # later reservations cannot commit past the gap
                    return _duplicate(producers.duplicate, self.config)
                if leader_epoch > self.leader_epochs.latest_epoch:
                    self.leader_epochs.assign(leader_epoch, plan.first_offset)
            except Exception:
                region.release()
                self._discard_pending(0)
                raise
            for batch in plan.batches:
                if batch.header is not None:
                    region[batch.position : batch.position + HEADER_SIZE] = batch.header
                else:
                    stamp_offset_and_epoch(region, batch.position, batch.base_offset, leader_epoch)
            region.release()
            self._pending.pop(0)
            self._close(reservation)
            reservation.segment.log.advance(used)
            reservation.segment.committed(plan, reservation.position)
            if producers is not None:
                self.producers.complete(producers)
            return self._appended(plan)

    def commit_replicated(self, segment: LogSegment, position: int, length: int) -> AppendResult:
        """A follower's append in place (RDMA push replication): the leader placed `length`
        bytes of its log at `position` of the preallocated head `segment`, the log end.
        They are validated where they lie as replicated batches (leader offsets and epochs
        kept, the first at the log end) and become part of the log as `append` with
        `assign_offsets=False` would make them. Never rolls: a push that does not fit the
        head raises, as does a rejected region, and the log stays unchanged."""
        with self._lock:
            if self._pending:
                raise ReservationStateError("replicated commit while reservations are pending")
            head = self._segments[-1]
            capacity = segment.log.capacity
            if (
                head is not segment
                or segment.size != position
                or capacity is None
                or not 0 < length <= capacity - position
            ):
                raise ReservationStateError("the push does not continue the head segment")
            region = segment.log.region(position, length)
            try:
                plan = self._plan(region, -1, False, self._clock())
                if plan.first_offset != self.log_end_offset:
                    raise InvalidRecordError(
                        f"pushed batches start at {plan.first_offset}, "
                        f"the log ends at {self.log_end_offset}"
                    )
                if (
                    plan.last_offset - segment.base_offset > _INT32_MAX
                    or segment.offset_index.size_bytes + OffsetIndex.ENTRY.size
                    > self.config.segment_index_bytes
                ):
                    raise ReservationStateError("the head segment cannot index more batches")
                self._assign_replicated_epochs(plan.epoch_starts)
                segment.log.advance(length)
                segment.committed(plan, position)
                self.producers.update_replicated(region, plan)
                self._index_aborted(region)
            finally:
                region.release()
            return self._appended(plan)

    def abort(self, reservation: Reservation) -> None:
        """Give up a reservation and every one made after it (they cannot commit past a gap)."""
        with self._lock:
            if reservation not in self._pending:
                raise ReservationStateError("abort of a reservation that is not pending")
            self._discard_pending(self._pending.index(reservation))

    def _discard_pending(self, first: int) -> None:
        for reservation in self._pending[first:]:
            # Zero the header so recovery after a crash stops here instead of finding a batch.
            reservation.buffer[: min(LOG_OVERHEAD, reservation.size)] = bytes(
                min(LOG_OVERHEAD, reservation.size)
            )
            self._close(reservation)
        del self._pending[first:]

    @staticmethod
    def _close(reservation: Reservation) -> None:
        reservation.buffer.release()
        reservation.open = False

    def _plan(
        self,
        buf: Buffer,
        leader_epoch: int,
        assign_offsets: bool,
        now_ms: int,
        next_offset: int | None = None,
    ) -> AppendPlan:
        """Validate `buf` as the next append (after the log end, or at `next_offset`
        when appends planned before it are still to be written)."""
        plan = plan_append(
            buf,
            next_offset=self.log_end_offset if next_offset is None else next_offset,
            leader_epoch=leader_epoch,
            config=self.config,
            now_ms=now_ms,
            assign_offsets=assign_offsets,
        )
        if plan.size > self.config.segment_bytes:
            raise RecordBatchTooLargeError(
                f"append of {plan.size} bytes exceeds segment.bytes {self.config.segment_bytes}"
            )
        return plan

    def _assign_replicated_epochs(self, epoch_starts: list[tuple[int, int]]) -> None:
        epochs = self.leader_epochs
        for epoch, start_offset in epoch_starts:
            if epoch > epochs.latest_epoch:
                epochs.assign(epoch, start_offset)

    def _appended(self, plan: AppendPlan) -> AppendResult:
        assert self.log_end_offset == plan.last_offset + 1
        self._count_unflushed(plan.records)
        return _result(plan)

    def _count_unflushed(self, records: int) -> None:
        """Count records appended since the last flush; flush at flush.messages."""
        self._unflushed_records += records
        if self._unflushed_records >= self.config.flush_messages:
            self.flush()

    # Producer state --------------------------------------------------------------------

    def expire_producers(self, now_ms: int) -> int:
        """Forget idempotent producers whose latest batch is producer.id.expiration.ms older
        than `now_ms` (the broker's housekeeping calls this); returns how many."""
        with self._lock:
            return self.producers.expire(now_ms)

    def _load_producer_state(self) -> None:
        """Rebuild the producer state at the log end, as Kafka's loadProducerState does:
        the newest usable snapshot at or below it, then the batch headers after it."""
        end = self.log_end_offset
        self._producer_snapshots.delete_above(end)
        restored = self._producer_snapshots.restore(self.producers, end)
        # The index entries of the markers replayed below are made again by the replay.
        self.aborted.truncate_to(0 if restored is None else restored)
        for header in self._batch_headers_from(0 if restored is None else restored):
            if header.is_control and header.producer_id >= 0:
                data = self.read(header.base_offset, header.size).records.read()
                self.producers.update(header, _marker_epoch(data, header.base_offset))
                self._index_aborted(data)
            else:
                self.producers.update(header)
        self.producers.drop_before(self.log_start_offset)
        self.producers.expire(self._clock())

    def _batch_headers_from(self, offset: int) -> Iterator[BatchHeader]:
        """Headers of the batches whose base offset is at or above `offset`, in order."""
        for segment in self._segments:
            if segment.next_offset <= offset:
                continue
            found = segment.locate(offset)
            if found is None:
                continue
            for _, header in segment.headers_from(found[0]):
                if header.base_offset >= offset:
                    yield header

    def _take_producer_snapshot(self) -> None:
        """Snapshot the producer state at the log end (Kafka does at roll and close) so the
        next open rebuilds only from there; keep only the snapshots still worth having."""
        end = self.log_end_offset
        self.aborted.flush()  # entries below a snapshot are not made again on load
        self._producer_snapshots.write(end, self.producers.snapshot(end))
        # A tiered log keeps the snapshot at the end of every segment not yet copied: the
        # tiering service ships it with the segment.
        uncopied = self.remote_end_offset if self.config.remote_storage_enable else None
        self._producer_snapshots.retain(
            min(self.recovery_point, self.high_watermark), keep_from=uncopied
        )

    # Rolling ---------------------------------------------------------------------------

    def _maybe_roll(
        self, size: int, last_offset: int, max_timestamp: int | None, now_ms: int
    ) -> None:
        if self._roll_due(size, last_offset, max_timestamp, now_ms, 1):
            self.roll()

    def _roll_due(
        self, size: int, last_offset: int, max_timestamp: int | None, now_ms: int, batches: int
    ) -> bool:
        """Whether the head cannot take `size` more bytes in `batches` appends (each may
        add an index entry) up to `last_offset`, or has waited segment.ms."""
        head = self._segments[-1]
        config = self.config
        return (
            head.size > config.segment_bytes - size
            or (
                not head.is_empty()
                and head.time_waited_for_roll(max_timestamp, now_ms)
                >= config.segment_ms - config.roll_jitter_ms(self.directory, head.base_offset)
            )
            or head.offset_index.size_bytes + batches * OffsetIndex.ENTRY.size
            > config.segment_index_bytes
            or last_offset - head.base_offset > _INT32_MAX
        )

    def roll(self) -> LogSegment:
        """Start a new head segment at the log end offset (no-op if the head is empty)."""
        with self._lock:
            head = self._segments[-1]
            if head.is_empty():
                return head
            if self._pending:
                raise ReservationStateError("roll while reservations are pending")
            for listener in list(self.listeners):
                listener.segment_rolled(self, head)
            head.on_inactive()
            segment = self._new_segment(self.log_end_offset, head)
            self._segments.append(segment)
            self._bases.append(segment.base_offset)
            self._take_producer_snapshot()
            return segment

    def _settle_head(self) -> None:
        """With a head directory, make a preallocating log's head one the RDMA datapaths
        can map: a head there without its preallocated length (opened before the topic's
        config was known) gets it; an empty head outside it (a clean close wrote it back,
        truncation emptied a written-back segment) is made anew there. A head outside it
        holding records stays; the datapaths roll it when they need a preallocated one."""
        head, config = self._segments[-1], self.config
        if self.layout.head_directory is None or not config.preallocate or self._pending:
            return
        if self.layout.in_memory(head):
            if head.log.capacity is None and head.size < config.segment_bytes:
                head.log.preallocate(config.segment_bytes)
            return
        if not head.is_empty():
            return
        self._generation += 1
        self._removing([head])
        head.delete()
        self._segments[-1] = self._new_segment(head.base_offset, None)

    def _new_segment(self, base_offset: int, after: LogSegment | None) -> LogSegment:
        """An empty segment at base_offset, following `after` (None: all segments went),
        with this log's settings (preallocated if asked), where the layout puts it."""
        return LogSegment.create(
            self.directory,
            base_offset,
            index_interval=self.config.index_interval_bytes,
            now_ms=self._clock(),
            capacity=self.config.segment_bytes if self.config.preallocate else None,
            log_directory=self.layout.new_log_directory(self.config, after),
        )

    # Reading ---------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        upper_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> LogRead:
        """Whole batches from the one holding `offset`, at most `max_bytes` (at least one
        batch when `min_one_batch`), none holding offsets at or above `upper_offset`
        (default: the log end; consumers pass the high watermark)."""
        with self._lock:
            first = max(bisect_right(self._bases, offset) - 1, 0)
            segments = self._segments[first : first + 2]  # the offset lies in these two at most
            start, end, hw = self.log_start_offset, self.log_end_offset, self.high_watermark
            local = self.local_log_start_offset
        if start <= offset < local:
            raise OffsetMovedToTieredStorageError(offset, start, local)
        if not start <= offset <= end:
            raise OffsetOutOfRangeError(offset, start, end)
        upper = end if upper_offset is None else min(upper_offset, end)
        for segment in segments:
            if segment.base_offset >= upper or offset >= upper:
                break
            found = segment.locate(offset)
            if found is None:
                continue
            position = found[0]
            stop, next_offset = segment.slice_end(position, max_bytes, upper, min_one_batch)
            if stop > position:
                records = FileSlice(segment.log, position, stop - position)
                return LogRead(records, hw, start, end, found[1].base_offset, next_offset)
            break
        return LogRead(EMPTY_SLICE, hw, start, end)

    def offset_for_timestamp(
        self, timestamp: int, *, upper_offset: int | None = None
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record from the log start on whose timestamp is
        >= `timestamp`."""
        upper = self.log_end_offset if upper_offset is None else upper_offset
        start = self.log_start_offset
        for segment in self.segments:
            if segment.base_offset >= upper:
                break
            if segment.max_timestamp != NO_TIMESTAMP and segment.max_timestamp >= timestamp:
                found = segment.find_timestamp(timestamp, upper, start)
                if found is not None:
                    return found
        return None

    # Durability ------------------------------------------------------------------------

    def flush(self) -> None:
        """fsync everything appended so far and move the recovery point to the log end,
        or to the first segment still in the head directory (fsynced there, but not
        durable: see `write_back`). The fsyncs run outside the lock, so a flush thread
        never stalls appends."""
        with self._lock:
            target = self.log_end_offset
            if target <= self.recovery_point:
                return
            dirty = [s for s in self._segments if s.next_offset > self.recovery_point]
            self._unflushed_records = 0
            self._last_flush_ms = self._clock()
        try:
            for segment in dirty:
                segment.flush()
        except OSError as exc:
            raise StorageError(f"flush of {self.directory} failed: {exc}") from exc
        with self._lock:
            self.recovery_point = max(
                self.recovery_point, min(target, self.log_end_offset, self._durable_end())
            )

    def _durable_end(self) -> int:
        """The base offset of the first segment in the head directory, else the log end."""
        in_memory = self.layout.in_memory
        return next((s.base_offset for s in self._segments if in_memory(s)), self.log_end_offset)

    def write_back(self) -> int:
        """Write the sealed segments still in the head directory back to the log directory,
        oldest first (log_layout.py); returns how many. Blocking (a copy and fsyncs, done
        outside the lock), for a worker thread; a segment deleted or cut meanwhile ends
        the round, as does an I/O error (logged; the next round tries again)."""
        written = 0
        while self._write_back_oldest(head_too=False):
            written += 1
        return written

    def _write_back_oldest(self, *, head_too: bool) -> bool:
        """Write back the oldest segment in the head directory if it is sealed (or
        `head_too`); whether one was."""
        layout = self.layout
        with self._lock:
            segment = next((s for s in self._segments if layout.in_memory(s)), None)
            if self._deleted or segment is None or (segment is self._segments[-1] and not head_too):
                return False
            source, size, generation = segment.log, segment.size, self._generation
            temporary = layout.write_back_target(segment)
            try:  # created under the lock: `delete` removes it with the directory
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            except OSError as exc:
                log.error("write-back of %s failed: %s", source.path, exc)
                return False

        def still_current() -> bool:
            return (
                not self._deleted
                and not segment.deleted
                and self._generation == generation
                and segment.log is source
                and segment.size == size
                and (head_too or segment is not self._segments[-1])
            )

        try:
            try:
                copied = layout.copy(source, size, fd)
            finally:
                os.close(fd)
            with self._lock:
                if not copied or not still_current():
                    temporary.unlink(missing_ok=True)
                    return False
                segment.log = layout.install(segment, temporary)
                for listener in list(self.listeners):
                    listener.segment_moved(self, segment)
            fsync_path(self.directory)
            source.delete()  # the memory copy; readers sending from it keep its descriptor
            segment.flush()  # its indexes, in the log directory
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            if not (self._deleted or segment.deleted):
                log.error("write-back of %s failed: %s", source.path, exc)
            return False
        with self._lock:
            if self.recovery_point >= segment.base_offset and not segment.deleted:
                self.recovery_point = max(
                    self.recovery_point, min(segment.next_offset, self._durable_end())
                )
        log.debug("wrote back segment %d of %s", segment.base_offset, self.directory)
        return True

    def flush_if_due(self) -> bool:
        """Flush if flush.ms has passed since the last flush and data is waiting."""
        if (
            self._clock() - self._last_flush_ms >= self.config.flush_ms
            and self.log_end_offset > self.recovery_point
        ):
            self.flush()
            return True
        return False

    # Compaction ------------------------------------------------------------------------

    def replace_segments(
        self, old: list[LogSegment], sizes: list[int], cleaned: LogSegment | None
    ) -> bool:
        """Swap `cleaned`, which the log cleaner wrote under `.cleaned` names at old[0]'s
        base, in for `old`, consecutive inactive segments of these `sizes`; with None, drop
        `old` (the cleaner kept none of their records). Returns False, deleting `cleaned`,
        if `old` is no longer what the cleaner read (retention, truncation or a reset got
        there first): the caller ends its pass.

        Crash-safe (segment.finish_interrupted_swaps completes what a crash leaves): the
        cleaned files become `.swap` files, the commit point; the old segments are deleted;
        the swap files take the usual names. Readers already holding an old segment or a
        FileSlice of one keep reading it; its descriptor closes when they drop it."""
        with self._lock:
            first = next((i for i, s in enumerate(self._segments) if s is old[0]), -1)
            stop = first + len(old)
            current = self._segments[first:stop] if first >= 0 else []
            if (
                stop >= len(self._segments)
                or len(current) != len(old)
                or any(
                    s is not o or s.size != n for s, o, n in zip(current, old, sizes, strict=True)
                )
            ):
                if cleaned is not None:
                    cleaned.delete()
                return False
            replacement = [] if cleaned is None else [cleaned]
            self._removing(old)
            try:
                if cleaned is not None:
                    cleaned.move_to(SWAP_SUFFIX)
                self._segments[first:stop] = replacement
                self._bases[first:stop] = [s.base_offset for s in replacement]
                for segment in old:  # in offset order: what a crash keeps is always safe
                    segment.delete()
                if cleaned is not None:
                    cleaned.move_to("")
            except OSError as exc:
                raise StorageError(f"swap of cleaned segments in {self.directory}: {exc}") from exc
            return True

    # Retention and truncation ----------------------------------------------------------

    def delete_retained_segments(self) -> int:
        """Delete whole segments past retention.ms or beyond retention.bytes, oldest first,
        never above the high watermark, unless cleanup.policy leaves out `delete` (a
        compacted log keeps its segments). With remote storage on, only segments the remote
        indexes hold go, by the local retention (`_delete_copied_segments`). Returns how
        many were deleted."""
        with self._lock:
            if self._pending or not self.config.delete_by_retention:
                return 0
            if self.config.remote_storage_enable:
                return self._delete_copied_segments()
            config = self.config
            # Without a size limit the excess is negative, so even an empty segment (the
            # cleaner may leave one at the log start) goes only once retention.ms passes.
            excess = self.size_bytes - config.retention_bytes if config.retention_bytes >= 0 else -1
            doomed = self._count_doomed(lambda segment: (config.retention_ms, excess))
            if doomed == 0:
                return 0
            self._delete_oldest(doomed)
            self._start_at(max(self.log_start_offset, self._segments[0].base_offset))
            return doomed

    def _delete_copied_segments(self) -> int:
        """Retention of a tiered log's local part: a segment goes once the remote indexes
        hold all its records and it is past local.retention.ms or beyond
        local.retention.bytes (-2: retention.*). The log start stays: its records are
        remote. With remote.log.copy.disable, segments never copied go by retention.ms and
        retention.bytes (nothing else would ever delete them), moving the log start."""
        config = self.config
        local_bytes = config.effective_local_retention_bytes
        local_excess = self.size_bytes - local_bytes if local_bytes >= 0 else -1
        total_excess = (
            self.size_bytes - config.retention_bytes if config.retention_bytes >= 0 else -1
        )

        def limits(segment: LogSegment) -> tuple[int, int] | None:
            if segment.next_offset <= self.remote_end_offset:
                return config.effective_local_retention_ms, local_excess
            if config.remote_log_copy_disable:
                return config.retention_ms, total_excess
            return None  # not copied yet: it stays

        doomed = self._count_doomed(limits)
        if doomed == 0:
            return 0
        self._delete_oldest(doomed)
        local_start = self._segments[0].base_offset
        if self.remote_end_offset < local_start:  # what lies between is gone everywhere
            self._start_at(max(self.log_start_offset, local_start))
        else:
            self.leader_epochs.truncate_from_start(local_start)
            self._producer_snapshots.delete_below(local_start)
        return doomed

    def _count_doomed(self, limits: Callable[[LogSegment], tuple[int, int] | None]) -> int:
        """How many segments from the oldest are past their retention: `limits` gives each
        its (retention.ms, bytes over the size limit when the walk reaches it, -1 without a
        limit), or None to stop. The head goes only when it holds records, and no segment
        holding offsets at or above the high watermark goes."""
        now = self._clock()
        doomed = 0
        removed = 0
        for segment in self._segments:
            head = segment is self._segments[-1]
            if (head and segment.is_empty()) or segment.next_offset > self.high_watermark:
                break
            limit = limits(segment)
            if limit is None:
                break
            retention_ms, excess = limit
            expired = retention_ms >= 0 and now - segment.largest_timestamp() > retention_ms
            if not expired and (excess < 0 or excess - removed < segment.size):
                break
            removed += segment.size
            doomed += 1
        return doomed

    def _delete_oldest(self, count: int) -> None:
        if count == len(self._segments):
            self.roll()
        self._delete_first(count)

    def refresh_remote(self) -> bool:
        """Read the remote indexes again (the tiering service changed them) and take the
        offset after the last record they hold; False, the last reading kept, when they
        cannot be read (logged: the tiering service repairs them at its next start)."""
        try:
            if self.remote is None:
                if not has_remote_index(self.directory):
                    return True
                self.remote = RemoteIndex.open(self.directory)
            else:
                self.remote.refresh()
        except (CorruptIndexError, OSError) as exc:
            log.warning("remote indexes of %s unreadable: %s", self.directory, exc)
            return False
        with self._lock:
            self.remote_end_offset = self.remote.end_offset
        return True

    def restart_from_remote(
        self,
        offset: int,
        log_start_offset: int,
        epochs: Sequence[EpochEntry],
        producer_snapshot: bytes | None,
    ) -> None:
        """A follower whose leader keeps the records below `offset` only in the remote store
        (KIP-405's OFFSET_MOVED_TO_TIERED_STORAGE): drop all local data and restart empty at
        `offset`, with the log start at `log_start_offset` (the leader's, <= offset), the
        leader epochs of the records before it and the idempotent producers' state there,
        both as the remote segment ending there recorded them. A snapshot that does not
        check out (ValueError) leaves the log unchanged."""
        if not 0 <= log_start_offset <= offset:
            raise ValueError(f"log start {log_start_offset} above the restart at {offset}")
        with self._lock:
            restored = ProducerStateManager(self.producers.expiration_ms)
            if producer_snapshot is not None:
                restored.restore(offset, producer_snapshot)
            self._discard_pending(0)
            self._reset_at(offset)
            self.log_start_offset = log_start_offset
            for entry in epochs:
                if entry.start_offset < offset and entry.epoch > self.leader_epochs.latest_epoch:
                    self.leader_epochs.assign(entry.epoch, entry.start_offset)
            self.leader_epochs.truncate_from_start(log_start_offset)
            restored.drop_before(log_start_offset)
            self.producers = restored
            self._producer_snapshots.write(offset, restored.snapshot(offset))

    def advance_log_start(self, offset: int) -> bool:
        """DeleteRecords: records below `offset` are no longer served, and the segments wholly
        below it are deleted (the head segment stays); on a tiered log it may lie below the
        first local segment (the tiering service deletes the remote records below it).
        `offset` may not pass the high watermark (OffsetOutOfRangeError). Returns whether
        the log start moved."""
        with self._lock:
            if not 0 <= offset <= self.high_watermark:
                raise OffsetOutOfRangeError(offset, self.log_start_offset, self.high_watermark)
            if offset <= self.log_start_offset:
                return False
            self._delete_first(bisect_right(self._bases, offset, lo=1) - 1)  # wholly below
            self._start_at(offset)
            return True

    def _delete_first(self, count: int) -> None:
        if count <= 0:
            return
        self._removing(self._segments[:count])
        for segment in self._segments[:count]:
            segment.delete()
        del self._segments[:count]
        del self._bases[:count]

    def _start_at(self, offset: int) -> None:
        """The log start moved up to `offset`: what described records below it goes."""
        self.log_start_offset = offset
        self.recovery_point = max(self.recovery_point, offset)
        self.leader_epochs.truncate_from_start(offset)
        self.producers.drop_before(offset)
        self._producer_snapshots.delete_below(offset)
        self.aborted.drop_below(offset)

    def truncate_to(self, offset: int) -> None:
        """Remove every batch holding offsets >= offset, as a follower does when it diverged
        from its leader. Pending reservations are discarded. Leader epoch entries from the
        new log end on go too (it may lie below `offset` when that fell inside a batch); a
        cut at or below the first segment restarts the log and clears them, like Kafka.
        The producer state is rebuilt at the new end (snapshots above it are deleted)."""
        with self._lock:
            if offset >= self.log_end_offset:
                return
            self._discard_pending(0)
            if offset <= self._segments[0].base_offset:
                self._reset_at(offset)
                return
            self._generation += 1
            self._removing([s for s in self._segments if s.next_offset > offset])
            while self._segments[-1].base_offset >= offset:
                self._segments.pop().delete()
                self._bases.pop()
            head = self._segments[-1]
            head.truncate_to(offset)
            if head.log.capacity is None and self.layout.may_preallocate(head, self.config):
                head.log.preallocate(self.config.segment_bytes)
            self._settle_head()
            self.leader_epochs.truncate_from_end(self.log_end_offset)
            self._after_truncation()
            self._load_producer_state()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop all data and restart the log, empty, at `offset`; the leader epoch cache is
        cleared (the next append says which epoch the new records belong to), and so are
        the producer state and its snapshots."""
        with self._lock:
            self._discard_pending(0)
            self._reset_at(offset)

    def _reset_at(self, offset: int) -> None:
        self._generation += 1
        self._removing(self._segments)
        for segment in self._segments:
            segment.delete()
        head = self._new_segment(offset, None)
        self._segments = [head]
        self._bases = [offset]
        self.log_start_offset = offset
        self.leader_epochs.clear()
        self.producers.clear()
        self._producer_snapshots.delete_all()
        self.aborted.clear()
        self._after_truncation()

    def _removing(self, segments: list[LogSegment]) -> None:
        for listener in list(self.listeners):
            listener.segments_removed(self, list(segments))

    def _after_truncation(self) -> None:
        end = self.log_end_offset
        self.high_watermark = min(self.high_watermark, end)
        self.recovery_point = min(self.recovery_point, end)
        self.log_start_offset = min(self.log_start_offset, end)

    # Lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, snapshot the producer state, record the head's largest timestamp, trim
        preallocation, close files."""
        with self._lock:
            self._discard_pending(0)
            self.flush()
            self._take_producer_snapshot()
            head = self._segments[-1]
            head.on_inactive()
            head.flush()
            while self._write_back_oldest(head_too=True):
                pass
            if any(self.layout.in_memory(segment) for segment in self._segments):
                raise StorageError(f"{self.directory}: segments left in the head directory")
            for segment in self._segments:
                segment.close()
            if self.remote is not None:
                self.remote.close()

    def delete(self) -> None:
        """Remove the log's files, in its directory and its head directory."""
        with self._lock:
            self._deleted = True
            self._discard_pending(0)
            for segment in self._segments:
                segment.delete()
            self._segments.clear()
            if self.remote is not None:
                self.remote.close()
        self.layout.remove()
        for leftover in self.directory.iterdir():
            leftover.unlink()
        self.directory.rmdir()


class _Planned(NamedTuple):
    """A producer append checked and waiting for its group's write."""

    buf: Buffer
    plan: AppendPlan
    producers: ProducerAppend | None  # the idempotent state to complete after the write
    answer: int  # its place among the answers


def _marker_at(data: Buffer, offset: int) -> tuple[int, BatchHeader] | None:
    """The position and header of the control batch at `offset` in `data`, if it is there."""
    for position, header in iter_batches(data):
        if header.base_offset == offset and header.is_control:
            return position, header
    return None


def _marker_type(data: Buffer, offset: int) -> int | None:
    """The ControlRecordType of the control batch at `offset` in `data`, if it is there."""
    found = _marker_at(data, offset)
    if found is not None:
        for record in decode_records(data, *found):
            return control_type(record.key)
    return None


def _marker_epoch(data: Buffer, offset: int) -> int | None:
    """The coordinator epoch of the marker at `offset` in `data`, if it is there."""
    found = _marker_at(data, offset)
    return None if found is None else marker_coordinator_epoch(data, found[0])


def _result(plan: AppendPlan) -> AppendResult:
    return AppendResult(
        plan.first_offset, plan.last_offset, plan.records, plan.size, plan.log_append_time
    )


def _iovecs(buf: Buffer, plan: AppendPlan, leader_epoch: int) -> list[Buffer]:
    """The buffers to write for `plan`: each batch's stamped or rewritten header, then its
    unchanged bytes straight from the request buffer (no payload copy)."""
    view = memoryview(buf)
    if not plan.stamp:
        return [view[: plan.size]]
    iov: list[Buffer] = []
    for batch in plan.batches:
        start, stop = batch.position, batch.position + batch.size
        if batch.header is not None:
            iov.append(batch.header)
            iov.append(view[start + HEADER_SIZE : stop])
        else:
            iov.append(_PREFIX.pack(batch.base_offset, batch.size - LOG_OVERHEAD, leader_epoch))
            iov.append(view[start + _PREFIX.size : stop])
    return iov


def _duplicate(batch: BatchMetadata, config: LogConfig) -> AppendResult:
    """The answer to a retried idempotent batch, nothing written: what its first append
    answered (offsets, and under LogAppendTime the time stamped then, its max timestamp)."""
    log_append = config.message_timestamp_type is TimestampType.LOG_APPEND_TIME
    append_time = batch.max_timestamp if log_append else -1
    return AppendResult(batch.first_offset, batch.last_offset, 0, 0, append_time, duplicate=True)


def read_partition_metadata(directory: Path) -> uuid.UUID | None:
    """The topic id in `directory`'s partition.metadata; None if the file is missing or
    empty (Kafka creates it empty before the first write)."""
    path = directory / PARTITION_METADATA
    try:
        text = path.read_bytes().decode("ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise StorageError(f"cannot read {path}: {exc}") from exc
    if not text.strip():
        return None
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        if len(lines) != 2:
            raise ValueError(f"{len(lines)} lines, expected 2")
        fields = [line.partition(":") for line in lines]
        if fields[0][0] != "version" or fields[0][2].strip() != "0":
            raise ValueError(f"unknown version line {lines[0]!r}")
        if fields[1][0] != "topic_id":
            raise ValueError(f"unknown line {lines[1]!r}")
        return _decode_topic_id(fields[1][2].strip())
    except ValueError as exc:
        raise StorageError(f"malformed {path}: {exc}") from exc


def write_partition_metadata(directory: Path, topic_id: uuid.UUID) -> None:
    """Write partition.metadata atomically, byte for byte as Kafka writes it."""
    path = directory / PARTITION_METADATA
    text = f"version: 0\ntopic_id: {uuid_text(topic_id)}"
    try:
        write_atomically(path, text.encode("ascii"))
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc}") from exc


def _decode_topic_id(text: str) -> uuid.UUID:
    if len(text) != 22:
        raise ValueError(f"topic id {text!r} is not 22 base64 characters")
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"topic id {text!r} is not URL-safe base64") from exc
    if len(raw) != 16 or uuid_text(uuid.UUID(bytes=raw)) != text:
        raise ValueError(f"topic id {text!r} is not 16 bytes in URL-safe base64")
    return uuid.UUID(bytes=raw)
