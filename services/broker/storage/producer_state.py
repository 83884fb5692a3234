"""Per-partition state of idempotent producers (Kafka's ProducerStateManager, KIP-98 and
KIP-360), and the `<offset>.snapshot` files that carry it across restarts.

For every producer id that wrote to the partition the state keeps its current epoch, the
metadata of its last five batches and the max timestamp of its latest batch. A leader
checks each idempotent batch of a producer append against it before anything is written:
an older epoch is a fenced producer (INVALID_PRODUCER_EPOCH), a new epoch must start at
sequence 0 and an epoch's batches must follow one another (OUT_OF_ORDER_SEQUENCE_NUMBER),
and a batch that repeats one of the last five is a retry: nothing is written and the
original batch's offsets are answered. Followers and recovery apply batch headers without
checking, so a follower that becomes leader already knows what its old leader wrote.

The state is a function of the batch headers in the log (less producers expired by the
clock or whose data retention deleted): a snapshot at offset N holds the state after every
batch below N, and the state at the log end is the newest usable snapshot plus the headers
after it. ProducerStateManager does no I/O; ProducerSnapshotFiles owns the files.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import struct
from bisect import insort
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from directlog.durable_files import write_atomically
from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.records.batch import ATTRIBUTES_AT, CONTROL_FLAG, TRANSACTIONAL_FLAG, BatchHeader
from directlog.records.errors import InvalidRecordError
from directlog.records.markers import marker_coordinator_epoch
from directlog.records.varint import Buffer
from services.broker.storage.errors import (
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    StorageError,
)
from services.broker.storage.validator import AppendPlan, BatchPlan

log = logging.getLogger(__name__)

PRODUCER_ID_EXPIRATION_MS = 86_400_000  # Kafka's producer.id.expiration.ms, a broker setting
BATCHES_PER_PRODUCER = 5  # Kafka's ProducerStateEntry.NumBatchesToRetain
SNAPSHOT_SUFFIX = ".snapshot"
# 2 adds each producer's open transaction, 3 its coordinator epoch; 1 and 2 are still read
SNAPSHOT_VERSION = 3
SNAPSHOTS_KEPT = 2  # newest snapshots kept, besides the one a crash recovery may need

_INT32_MAX = (1 << 31) - 1
_PRODUCER_ID_AT = 43
_PRODUCER = struct.Struct(">qhi")  # producer id, producer epoch, base sequence at byte 43
_ATTRIBUTES_AND_PRODUCER = struct.Struct(">h20xqhi")  # attributes at byte 21, then as above
assert ATTRIBUTES_AT + _ATTRIBUTES_AND_PRODUCER.size == _PRODUCER_ID_AT + _PRODUCER.size

# Snapshot file layout (docs/formats.md, "Producer state snapshots").
_SNAPSHOT_HEADER = struct.Struct(">hIqi")  # version, crc, offset, producer count
_CRC_FROM = 6  # the CRC32C covers every byte after the crc field
_SNAPSHOT_ENTRY_V1 = struct.Struct(">qhqb")  # producer id, epoch, last timestamp, batch count
_SNAPSHOT_ENTRY_V2 = struct.Struct(">qhqbq")  # and the open transaction's first offset
_SNAPSHOT_ENTRY = struct.Struct(">qhqbqi")  # v3: and the coordinator epoch of its last marker
_SNAPSHOT_ENTRIES = {1: _SNAPSHOT_ENTRY_V1, 2: _SNAPSHOT_ENTRY_V2, 3: _SNAPSHOT_ENTRY}
_SNAPSHOT_BATCH = struct.Struct(">iiqqq")  # first/last sequence, first/last offset, max ts


class BatchMetadata(NamedTuple):
    """What a retry of a batch is recognised by and answered with."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    """One producer id's state in one partition."""

    producer_epoch: int
    last_timestamp: int  # max timestamp of its latest batch: what expiry compares
    batches: list[BatchMetadata] = field(default_factory=list)  # oldest first, at most 5
    # Offset of its open transaction's first batch here (KIP-98), -1 when none is open:
    # the last stable offset stays at or below it until the transaction's marker.
    txn_first_offset: int = -1
    # The coordinator epoch of its latest marker here (-1: none seen, or only before a
    # version 1 or 2 snapshot): a marker from an older one is a fenced coordinator's.
    # Snapshots keep it and the replay after one reads it from each marker.
    coordinator_epoch: int = -1

    @property
    def last_sequence(self) -> int:
        """Sequence of its last record in the current epoch; -1 before its first batch."""
        return self.batches[-1].last_sequence if self.batches else -1

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def copy(self) -> ProducerEntry:
        return ProducerEntry(
            self.producer_epoch,
            self.last_timestamp,
            list(self.batches),
            self.txn_first_offset,
            self.coordinator_epoch,
        )

    def add(self, epoch: int, timestamp: int, batch: BatchMetadata | None) -> None:
        """Record a batch (None: a control batch, which moves only epoch and time). A new
        epoch forgets the old epoch's batches: their sequences mean nothing any more."""
        if epoch != self.producer_epoch:
            self.producer_epoch = epoch
            self.batches.clear()
        self.last_timestamp = timestamp
        if batch is not None:
            self.batches.append(batch)
            if len(self.batches) > BATCHES_PER_PRODUCER:
                del self.batches[0]


@dataclass(slots=True, frozen=True)
class ProducerAppend:
    """What check_append found: the producers' state to install once the batches are
    written, or the already written batch that this append repeats."""

    updates: dict[int, ProducerEntry]
    duplicate: BatchMetadata | None = None


class ProducerStateManager:
    """Producer id -> ProducerEntry for one partition, without I/O."""

    def __init__(self, expiration_ms: int = PRODUCER_ID_EXPIRATION_MS) -> None:
        self.expiration_ms = expiration_ms
        self._producers: dict[int, ProducerEntry] = {}
        self._open_txns: dict[int, int] = {}  # producer id -> its open transaction's first offset
        # Transactions a marker ended, as (first offset, marker offset) in marker order, until
        # the high watermark passes the marker: until then a new leader might not have it.
        self._unreplicated: deque[tuple[int, int]] = deque()
        # Transactions markers ended since the log last asked (take_ended), as (producer
        # id, first offset, marker offset): the log indexes the aborted ones.
        self._ended: list[tuple[int, int, int]] = []

    def __len__(self) -> int:
        return len(self._producers)

    def entries(self) -> dict[int, ProducerEntry]:
        """The current entries by producer id (a new dict of the live entries: read only)."""
        return dict(self._producers)

    # The leader's producer appends -------------------------------------------------------

    def check_append(self, buf: Buffer, plan: AppendPlan) -> ProducerAppend | None:
        """Check the idempotent batches of a planned producer append of `buf` (offsets
        assigned from the log end), before any byte of it is written. None when no batch
        carries a producer id, the hot case, which costs one byte read per batch; raises
        InvalidProducerEpochError, OutOfOrderSequenceError or InvalidRecordError; otherwise
        the updates to `complete` after the write, or the duplicate to answer instead."""
        for batch in plan.batches:
            # The sign bit of the big-endian int64: Kafka treats any negative id as none.
            if buf[batch.position + _PRODUCER_ID_AT] < 0x80:
                return self._check_idempotent(buf, plan.batches, plan.first_offset)
        return None

    def _check_idempotent(
        self, buf: Buffer, batches: list[BatchPlan], log_end_offset: int
    ) -> ProducerAppend:
        updates: dict[int, ProducerEntry] = {}
        for batch in batches:
            attributes, producer_id, epoch, first = _ATTRIBUTES_AND_PRODUCER.unpack_from(
                buf, batch.position + ATTRIBUTES_AT
            )
            if producer_id < 0:
                continue
            if first < 0:
                raise InvalidRecordError(
                    f"invalid sequence number {first} in a batch of producer id {producer_id}"
                )
            last = _add_sequence(first, batch.last_offset - batch.base_offset)
            # Later batches of the append see the state as the earlier ones left it.
            entry = updates.get(producer_id) or self._producers.get(producer_id)
            if entry is not None:
                duplicate = _check_sequence(entry, producer_id, epoch, first, last, log_end_offset)
                if duplicate is not None:
                    return ProducerAppend({}, duplicate)
            if producer_id not in updates:
                updates[producer_id] = (
                    entry.copy() if entry is not None else ProducerEntry(epoch, batch.max_timestamp)
                )
            metadata = BatchMetadata(
                first, last, batch.base_offset, batch.last_offset, batch.max_timestamp
            )
            updated = updates[producer_id]
            updated.add(epoch, batch.max_timestamp, metadata)
            if attributes & TRANSACTIONAL_FLAG and updated.txn_first_offset < 0:
                updated.txn_first_offset = batch.base_offset
        return ProducerAppend(updates)

    def complete(self, append: ProducerAppend) -> None:
        """The batches check_append passed are in the log: make their state current."""
        self._producers.update(append.updates)
        for producer_id, entry in append.updates.items():
            if entry.txn_first_offset >= 0:
                self._open_txns[producer_id] = entry.txn_first_offset

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """A transaction marker of a producer epoch older than the partition has seen
        comes from a fenced coordinator or a stale request: InvalidProducerEpochError; one
        from an older coordinator epoch than the producer's last marker here, from a
        coordinator that lost its `__transaction_state` partition:
        TRANSACTION_COORDINATOR_FENCED (Kafka's ProducerAppendInfo checks, in that order)."""
        entry = self._producers.get(producer_id)
        if entry is None:
            return
        if epoch < entry.producer_epoch:
            raise InvalidProducerEpochError(
                f"producer id {producer_id}: marker epoch {epoch} is older than its epoch "
                f"{entry.producer_epoch} in this partition"
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise KafkaError(
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                f"producer id {producer_id}: marker coordinator epoch {coordinator_epoch} is "
                f"older than {entry.coordinator_epoch}, its last marker's in this partition",
            )

    def take_ended(self) -> list[tuple[int, int, int]]:
        """The transactions ended by the markers applied since the last call."""
        ended, self._ended = self._ended, []
        return ended

    def forget_replicated(self, high_watermark: int) -> None:
        """The high watermark moved: forget the ended transactions whose marker it passed."""
        while self._unreplicated and self._unreplicated[0][1] < high_watermark:
            self._unreplicated.popleft()

    def has_open_transaction(self, producer_id: int) -> bool:
        """Whether the producer's transaction is open here (KIP-890: its next batches need
        no verification by the coordinator)."""
        return producer_id in self._open_txns

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of a transaction not yet known decided by every replica that
        may lead: one still open, or ended by a marker at or above the high watermark.
        The last stable offset is this or the high watermark, whichever is lower."""
        self.forget_replicated(high_watermark)
        if not self._unreplicated and not self._open_txns:
            return None  # every fetch asks: no transactions, no work
        firsts = itertools.chain(
            (first for first, _ in self._unreplicated), self._open_txns.values()
        )
        return min(firsts)

    # Followers and recovery --------------------------------------------------------------

    def update_replicated(self, buf: Buffer, plan: AppendPlan) -> None:
        """Apply the batches of `buf` a follower copied from its leader (written as `plan`
        says, not checked)."""
        for batch in plan.batches:
            position = batch.position
            if buf[position + _PRODUCER_ID_AT] >= 0x80:
                continue
            attributes, producer_id, epoch, first = _ATTRIBUTES_AND_PRODUCER.unpack_from(
                buf, position + ATTRIBUTES_AT
            )
            self._replay(
                producer_id,
                epoch,
                first,
                batch.base_offset,
                batch.last_offset,
                batch.max_timestamp,
                attributes,
                marker_coordinator_epoch(buf, position) if attributes & CONTROL_FLAG else None,
            )

    def update(self, header: BatchHeader, coordinator_epoch: int | None = None) -> None:
        """Apply one batch of the log, read back by its header (loading and truncation);
        `coordinator_epoch`: a marker's, when the caller read its record."""
        if header.producer_id >= 0:
            self._replay(
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.base_offset,
                header.last_offset,
                header.max_timestamp,
                header.attributes,
                coordinator_epoch,
            )

    def _replay(
        self,
        producer_id: int,
        epoch: int,
        first: int,
        first_offset: int,
        last_offset: int,
        max_timestamp: int,
        attributes: int,
        coordinator_epoch: int | None = None,
    ) -> None:
        """`coordinator_epoch`: a marker's, when its record was read (None: not read)."""
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = self._producers[producer_id] = ProducerEntry(epoch, max_timestamp)
        metadata = None
        if attributes & CONTROL_FLAG:  # a transaction marker ends the open transaction
            if entry.txn_first_offset >= 0:
                self._unreplicated.append((entry.txn_first_offset, last_offset))
                self._ended.append((producer_id, entry.txn_first_offset, last_offset))
            entry.txn_first_offset = -1
            self._open_txns.pop(producer_id, None)
            if coordinator_epoch is not None:
                entry.coordinator_epoch = coordinator_epoch
        else:
            last = _add_sequence(first, last_offset - first_offset)
            metadata = BatchMetadata(first, last, first_offset, last_offset, max_timestamp)
            if attributes & TRANSACTIONAL_FLAG and entry.txn_first_offset < 0:
                entry.txn_first_offset = first_offset
                self._open_txns[producer_id] = first_offset
        entry.add(epoch, max_timestamp, metadata)

    # Forgetting --------------------------------------------------------------------------

    def expire(self, now_ms: int) -> int:
        """Drop producers whose latest batch is producer.id.expiration.ms old; how many."""
        limit = now_ms - self.expiration_ms
        return self._drop(
            [
                pid
                for pid, e in self._producers.items()
                if e.last_timestamp <= limit and e.txn_first_offset < 0  # none left open
            ]
        )

    def drop_before(self, log_start_offset: int) -> int:
        """Drop producers whose last batch lies below the log start (retention deleted it,
        so the log no longer proves what they wrote); how many."""
        return self._drop(
            [pid for pid, e in self._producers.items() if e.last_offset < log_start_offset]
        )

    def _drop(self, producer_ids: list[int]) -> int:
        for producer_id in producer_ids:
            del self._producers[producer_id]
            self._open_txns.pop(producer_id, None)
        return len(producer_ids)

    def clear(self) -> None:
        self._producers.clear()
        self._open_txns.clear()
        self._unreplicated.clear()
        self._ended.clear()

    # Snapshots ---------------------------------------------------------------------------

    def snapshot(self, offset: int) -> bytes:
        """The state as a snapshot taken at `offset` (the log end it describes)."""
        body = bytearray()
        for producer_id, entry in sorted(self._producers.items()):
            body += _SNAPSHOT_ENTRY.pack(
                producer_id,
                entry.producer_epoch,
                entry.last_timestamp,
                len(entry.batches),
                entry.txn_first_offset,
                entry.coordinator_epoch,
            )
            for batch in entry.batches:
                body += _SNAPSHOT_BATCH.pack(*batch)
        header = bytearray(_SNAPSHOT_HEADER.pack(SNAPSHOT_VERSION, 0, offset, len(self._producers)))
        crc = crc32c(body, crc32c(memoryview(header)[_CRC_FROM:]))
        struct.pack_into(">I", header, 2, crc)
        return bytes(header + body)

    def restore(self, offset: int, data: bytes) -> None:
        """Replace the state with a snapshot's, checked whole first (ValueError if it is
        not a sound snapshot taken at `offset`; the state is then unchanged)."""
        self._producers = _decode_snapshot(offset, data)
        self._open_txns = {
            pid: e.txn_first_offset for pid, e in self._producers.items() if e.txn_first_offset >= 0
        }
        self._unreplicated.clear()
        self._ended.clear()


def _add_sequence(sequence: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap from 2**31-1 to 0."""
    if sequence > _INT32_MAX - increment:
        return increment - (_INT32_MAX - sequence) - 1
    return sequence + increment


def _check_sequence(
    entry: ProducerEntry, producer_id: int, epoch: int, first: int, last: int, written_below: int
) -> BatchMetadata | None:
    """Kafka's epoch and sequence rules for one batch of a known producer: raises, or
    returns the written batch (offsets below `written_below`) it repeats, if any."""
    if epoch < entry.producer_epoch:
        raise InvalidProducerEpochError(
            f"producer id {producer_id}: epoch {epoch} is older than its epoch "
            f"{entry.producer_epoch} in this partition"
        )
    if epoch > entry.producer_epoch:
        if first != 0:
            raise OutOfOrderSequenceError(
                f"producer id {producer_id}: new epoch {epoch} starts at sequence {first}, not 0"
            )
        return None
    for batch in entry.batches:
        if (
            batch.first_sequence == first
            and batch.last_sequence == last
            and batch.first_offset < written_below
        ):
            return batch
    expected = _add_sequence(entry.last_sequence, 1)
    if first != expected:
        raise OutOfOrderSequenceError(
            f"producer id {producer_id} epoch {epoch}: sequence {first}, expected {expected}"
        )
    return None


def _decode_snapshot(offset: int, data: bytes) -> dict[int, ProducerEntry]:
    if len(data) < _SNAPSHOT_HEADER.size:
        raise ValueError(f"{len(data)} bytes, shorter than the {_SNAPSHOT_HEADER.size}-byte header")
    version, crc, stored_offset, count = _SNAPSHOT_HEADER.unpack_from(data)
    layout = _SNAPSHOT_ENTRIES.get(version)
    if layout is None:
        raise ValueError(f"unknown version {version}")
    computed = crc32c(memoryview(data)[_CRC_FROM:])
    if computed != crc:
        raise ValueError(f"CRC32C is {computed:#010x}, header says {crc:#010x}")
    if stored_offset != offset:
        raise ValueError(f"holds offset {stored_offset}, named for {offset}")
    producers: dict[int, ProducerEntry] = {}
    position = _SNAPSHOT_HEADER.size
    for _ in range(count):
        if position + layout.size > len(data):
            raise ValueError(f"ends inside the entry at byte {position}")
        producer_id, epoch, last_timestamp, batch_count, *later = layout.unpack_from(data, position)
        txn_first_offset, coordinator_epoch = [*later, -1, -1][:2]  # what older versions lack
        position += layout.size
        if producer_id < 0 or producer_id in producers:
            raise ValueError(f"producer id {producer_id} is negative or repeated")
        if not 0 <= batch_count <= BATCHES_PER_PRODUCER:
            raise ValueError(f"producer id {producer_id}: {batch_count} batches")
        end = position + batch_count * _SNAPSHOT_BATCH.size
        if end > len(data):
            raise ValueError(f"producer id {producer_id}: batches run past the end")
        batches = [
            BatchMetadata._make(_SNAPSHOT_BATCH.unpack_from(data, at))
            for at in range(position, end, _SNAPSHOT_BATCH.size)
        ]
        position = end
        if any(not 0 <= b.first_offset <= b.last_offset < offset for b in batches):
            raise ValueError(f"producer id {producer_id}: batch offsets outside [0, {offset})")
        if not -1 <= txn_first_offset < offset:
            raise ValueError(f"producer id {producer_id}: open transaction at {txn_first_offset}")
        if coordinator_epoch < -1:
            raise ValueError(f"producer id {producer_id}: coordinator epoch {coordinator_epoch}")
        producers[producer_id] = ProducerEntry(
            epoch, last_timestamp, batches, txn_first_offset, coordinator_epoch
        )
    if position != len(data):
        raise ValueError(f"{len(data) - position} bytes after the last of {count} entries")
    return producers


class ProducerSnapshotFiles:
    """The `<20-digit offset>.snapshot` files of one partition directory. Each is written
    atomically and holds ProducerStateManager.snapshot(offset)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets: list[int] = sorted(
            int(path.stem)
            for path in directory.glob("*" + SNAPSHOT_SUFFIX)
            if len(path.stem) == 20 and path.stem.isdigit()
        )

    def path(self, offset: int) -> Path:
        return self.directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"

    def write(self, offset: int, data: bytes) -> None:
        try:
            write_atomically(self.path(offset), data)
        except OSError as exc:
            raise StorageError(f"cannot write {self.path(offset)}: {exc}") from exc
        if offset not in self.offsets:
            insort(self.offsets, offset)

    def restore(self, state: ProducerStateManager, end_offset: int) -> int | None:
        """Load into `state` the newest snapshot at or below `end_offset` that reads back
        sound, deleting the unreadable or corrupt ones on the way (a crash or a bad disk
        must cost a longer rebuild, never the open). Returns its offset; None, with the
        state cleared, when no snapshot is left to load."""
        for offset in reversed([o for o in self.offsets if o <= end_offset]):
            path = self.path(offset)
            try:
                state.restore(offset, path.read_bytes())
                return offset
            except (OSError, ValueError) as exc:
                log.warning("deleting unusable producer state snapshot %s: %s", path, exc)
                self.offsets.remove(offset)
                with contextlib.suppress(OSError):  # left behind, it is only tried again
                    path.unlink(missing_ok=True)
        state.clear()
        return None

    def delete_above(self, offset: int) -> None:
        """Delete the snapshots of offsets the log no longer reaches (after a truncation)."""
        self._delete([o for o in self.offsets if o > offset])

    def delete_below(self, offset: int) -> None:
        """Delete the snapshots below the log start (their batches are gone)."""
        self._delete([o for o in self.offsets if o < offset])

    def delete_all(self) -> None:
        self._delete(list(self.offsets))

    def retain(self, floor: int, keep_from: int | None = None) -> None:
        """Keep the SNAPSHOTS_KEPT newest, the newest at or below `floor` (the point a crash
        recovery or a truncation to the high watermark may fall back to) and, with
        `keep_from`, every one above it (a tiered log's segment ends not yet copied)."""
        keep = set(self.offsets[-SNAPSHOTS_KEPT:])
        below = [o for o in self.offsets if o <= floor]
        if below:
            keep.add(below[-1])
        if keep_from is not None:
            keep.update(o for o in self.offsets if o > keep_from)
        self._delete([o for o in self.offsets if o not in keep])

    def _delete(self, offsets: list[int]) -> None:
        for offset in offsets:
            try:
                self.path(offset).unlink(missing_ok=True)
            except OSError as exc:
                raise StorageError(f"cannot delete {self.path(offset)}: {exc}") from exc
            self.offsets.remove(offset)
