"""The remote log manager (KIP-405's RLM): what a tiering service does each round for the
partitions of tiered topics its broker hosts (docs/tiering.md).

As the partition's leader:
1. finish what a crash or a deposed leader left: copies never finished, deletions never
   completed (their objects are deleted, their records removed);
2. make the local remote indexes hold every finished copy (they are appended only after a
   copy is recorded finished, so a crash in between leaves them behind);
3. copy, oldest first, every closed segment below the high watermark holding offsets no
   finished copy holds: record COPY_STARTED (with a fresh segment id, so a redone copy
   never writes over a half-written one), upload the segment with its indexes, producer
   snapshot, leader epochs, remoteLogIndex entries and aborted transactions (those with
   records in it, from the broker's index and the copy before), record COPY_FINISHED,
   append the entries to the remote indexes (rotating them by size or age and shipping
   each rotated set), and tell the broker, which may then delete the local copy by local
   retention;
4. remote retention: remote segments past retention.ms or beyond retention.bytes, or below
   the log start (DeleteRecords), go, and all of them with remote.log.delete.on.disable
   once remote storage is off: the log start moves first, then the objects are deleted.

As a follower, every follower_sync_interval_ms, it builds its own remote indexes from the
store (the rotated sets, then each later segment's entries) so that it can serve remote
reads the moment it leads, and so its broker's local retention can delete what is copied.
Every change of a remote record goes through the broker to the controller, which accepts
it only from the partition's leader in its current leader epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from directlog.records.batch import NO_TIMESTAMP
from directlog.remote import layout
from directlog.remote.index import (
    CorruptIndexError,
    IndexEntry,
    RemoteIndex,
    decode_entries,
    encode_entries,
)
from directlog.remote.store import RemoteObjectMissingError, RemoteStorageError, RemoteStore
from directlog.remote.txn_index import (
    PARTITION_FILE,
    AbortedTxn,
    decode_aborted,
    encode_aborted,
    overlapping,
    valid_prefix,
)
from directlog.rpc import controller_pb2 as pb
from directlog.rpc import tiering_pb2 as tpb
from directlog.topic_config import InvalidConfigError, LogConfig
from directlog.topics import TopicPartition
from directlog.waits import wait_event
from services.tiering.broker_link import BrokerLink, BrokerUnavailableError, RefusedError
from services.tiering.metrics import TieringMetrics
from services.tiering.segment_scan import SegmentChangedError, scan_segment
from services.tiering.settings import TieringSettings

log = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"  # the broker's file (leader_epochs.py)
ROTATED_SETS_AFTER = 8  # segments missing from an empty index: take rotated sets first
OBJECT_SUFFIXES = (*layout.SEGMENT_SUFFIXES, layout.REMOTE_LOG_INDEX, layout.TXN_INDEX)


@dataclass(slots=True)
class PartitionTiering:
    """One hosted partition: its remote indexes and its remote records as last read."""

    hosted: tpb.HostedPartition
    index: RemoteIndex
    version: int = -1  # of the remote records below; -1: never read
    next_offset: int = -1  # the first offset no finished copy holds
    records: list[pb.RemoteLogSegment] = field(default_factory=list)
    finished: list[pb.RemoteLogSegment] = field(default_factory=list)  # by start offset
    next_sync: float = 0.0  # a follower's next catch-up (monotonic seconds)
    fresh: bool = False  # the records above were read (or written) this round
    announced: bool = False  # the broker was told to read the indexes as this process opened them
    reported: set[str] = field(default_factory=set)  # faults logged, until they clear

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.hosted.topic, self.hosted.partition)

    @property
    def topic_id(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.hosted.topic_id)

    @property
    def prefix(self) -> str:
        return layout.partition_prefix(self.hosted.topic, self.topic_id, self.hosted.partition)

    def take(self, records: list[pb.RemoteLogSegment]) -> None:
        """The partition's remote records now, and the finished ones among them in order."""
        self.records = records
        self.finished = sorted(
            (r for r in records if r.state == pb.COPY_FINISHED), key=lambda r: r.start_offset
        )

    def object_key(self, record: pb.RemoteLogSegment, suffix: str) -> str:
        return layout.segment_key(
            self.prefix, record.base_offset, uuid.UUID(bytes=record.segment_id), suffix
        )


class RemoteLogManager:
    def __init__(
        self,
        settings: TieringSettings,
        link: BrokerLink,
        store: RemoteStore,
        metrics: TieringMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.link = link
        self.store = store
        self.metrics = metrics
        self.partitions: dict[TopicPartition, PartitionTiering] = {}
        self._clock = clock
        self._copying = asyncio.Semaphore(settings.copy_concurrency)
        self._next_deletion_check = 0.0
        self._broker_reachable = True
        self._broker_answered = False  # ever: until then the sidecar is not ready
        # Topics whose series the metrics keep: hosted by the broker, and deleted with their
        # remote data still to delete (after a failed try).
        self._hosted_topics: set[str] = set()
        self._deleting: set[str] = set()

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds every interval_ms until `stop` is set."""
        while not stop.is_set():
            await self.round()
            await wait_event(stop, self.settings.interval_ms / 1000)

    def readiness(self) -> str | None:
        """/readyz: ready while the broker beside it answers."""
        if not self._broker_answered:
            return "the broker has not answered yet"
        return None if self._broker_reachable else "the broker does not answer"

    def close(self) -> None:
        for work in self.partitions.values():
            work.index.close()

    # Rounds ------------------------------------------------------------------------------------

    async def round(self) -> None:
        """One look at every partition; a broker that does not answer ends it early."""
        try:
            reply = await self.link.partitions()
        except BrokerUnavailableError as error:
            if self._broker_reachable:
                log.info("waiting for the broker: %s", error)
            self._broker_reachable = False
            return
        if not self._broker_reachable:
            log.info("the broker answers again")
        self._broker_reachable = self._broker_answered = True
        self._follow_hosting(list(reply.partitions))
        leaders = [w for w in self.partitions.values() if w.hosted.leader]
        due = time.monotonic()
        followers = [
            w for w in self.partitions.values() if not w.hosted.leader and w.next_sync <= due
        ]
        await self._refresh(leaders + followers)
        await asyncio.gather(
            *(self._guarded(w, self._lead) for w in leaders),
            *(self._guarded(w, self._follow) for w in followers),
        )
        if due >= self._next_deletion_check:
            self._next_deletion_check = due + self.settings.deletion_check_interval_ms / 1000
            await self._delete_removed_topics()

    def _follow_hosting(self, hosted: list[tpb.HostedPartition]) -> None:
        """Start on newly hosted partitions; let go of those the broker no longer hosts."""
        current = {TopicPartition(h.topic, h.partition): h for h in hosted}
        gone = False
        replaced: set[str] = set()  # deleted and created again: their series start anew
        for tp in list(self.partitions):
            work = self.partitions[tp]
            if tp not in current or current[tp].topic_id != work.hosted.topic_id:
                work.index.close()
                del self.partitions[tp]
                self.metrics.forget(tp.topic, tp.partition)
                gone = True
                if tp in current:
                    replaced.add(tp.topic)
            elif work.hosted.leader and not current[tp].leader:
                self.metrics.stopped_leading(tp.topic, tp.partition)
        self._hosted_topics = {tp.topic for tp in current}
        if gone:
            self.metrics.retain(self._hosted_topics - replaced, self._deleting - replaced)
        for tp, partition in current.items():
            known = self.partitions.get(tp)
            if known is None:
                try:
                    index = RemoteIndex.open(
                        Path(partition.directory), writable=True, now_ms=self._now_ms()
                    )
                except OSError as error:  # the broker deleted the directory meanwhile
                    log.info("%s: remote indexes not opened: %s", tp, error)
                    continue
                self.partitions[tp] = PartitionTiering(partition, index)
            else:
                known.hosted = partition

    async def _guarded(
        self, work: PartitionTiering, job: Callable[[PartitionTiering], Awaitable[None]]
    ) -> None:
        """Run one partition's job; its faults are logged once until they clear."""
        try:
            await job(work)
            work.reported.clear()
        except (
            RefusedError,
            BrokerUnavailableError,
            RemoteStorageError,
            CorruptIndexError,
            SegmentChangedError,
            OSError,
        ) as error:
            kind = type(error).__name__
            if kind not in work.reported:
                work.reported.add(kind)
                log.warning("%s: %s: %s; trying again next round", work.tp, kind, error)
        except Exception:
            log.exception("%s: tiering round failed", work.tp)

    # Remote records ----------------------------------------------------------------------------

    async def _refresh(self, works: list[PartitionTiering]) -> None:
        """Read the remote records of partitions whose version moved (one call for all);
        `fresh` says whose are known to be current this round."""
        if not works:
            return
        try:
            answers = await self.link.remote_segments(
                [
                    pb.PartitionVersion(
                        topic_id=w.hosted.topic_id,
                        partition=w.hosted.partition,
                        known_version=w.version,
                    )
                    for w in works
                ]
            )
        except BrokerUnavailableError as error:
            log.info("remote log metadata unavailable: %s", error)
            for work in works:
                work.fresh = False
            return
        for work in works:
            work.fresh = work.version >= 0  # no answer: the version known is current
        by_key = {(w.hosted.topic_id, w.hosted.partition): w for w in works}
        for answer in answers:
            answered = by_key.get((answer.topic_id, answer.partition))
            if answered is None:
                continue
            answered.fresh = not answer.error_code
            if not answer.error_code:
                answered.version = answer.version
                answered.next_offset = answer.next_offset
                answered.take(list(answer.segments))

    async def _record(self, work: PartitionTiering, record: pb.RemoteLogSegment) -> None:
        """Move a remote record to `record.state` as this partition's leader."""
        reply = await self.link.update_segment(
            work.hosted.topic_id, work.hosted.partition, work.hosted.leader_epoch, record
        )
        work.version = reply.version
        work.next_offset = reply.next_offset
        others = [r for r in work.records if r.segment_id != record.segment_id]
        work.take(others if record.state == pb.DELETE_FINISHED else [*others, record])

    # Leading -------------------------------------------------------------------------------------

    async def _lead(self, work: PartitionTiering) -> None:
        if not work.fresh:
            return  # nothing is decided on remote records that may be out of date
        await self._announce_once(work)
        hosted = work.hosted
        config = _config(hosted)
        await self._clean_unfinished(work)
        if await self._catch_up_index(work):
            await self.link.remote_log_changed(hosted.topic, hosted.partition)
        if config.remote_storage_enable and not config.remote_log_copy_disable:
            async with self._copying:
                await self._copy_closed_segments(work)
        await self._apply_retention(work, config)
        await self._settle_log_start(work, config)
        await self._rotate_if_due(work)
        self._observe(work)

    async def _announce_once(self, work: PartitionTiering) -> None:
        """The broker reads the remote indexes again once this process has opened them (and
        repaired what a crash left)."""
        if not work.announced:
            await self.link.remote_log_changed(work.hosted.topic, work.hosted.partition)
            work.announced = True

    async def _clean_unfinished(self, work: PartitionTiering) -> None:
        """Copies and deletions a crash or a deposed leader left half done: their objects go,
        then their records (a reader never sees either: the indexes point only at finished
        copies)."""
        for record in [r for r in work.records if r.state in (pb.COPY_STARTED, pb.DELETE_STARTED)]:
            log.info(
                "%s: cleaning up the unfinished %s at offsets %d-%d",
                work.tp,
                pb.RemoteSegmentState.Name(record.state),
                record.start_offset,
                record.end_offset,
            )
            await self._delete_copy(work, record)

    async def _delete_copy(self, work: PartitionTiering, record: pb.RemoteLogSegment) -> None:
        deleting = _with_state(record, pb.DELETE_STARTED)
        if record.state != pb.DELETE_STARTED:
            await self._record(work, deleting)
        await asyncio.to_thread(
            self.store.delete, [work.object_key(record, s) for s in OBJECT_SUFFIXES]
        )
        await self._record(work, _with_state(deleting, pb.DELETE_FINISHED))
        self.metrics.deleted_segments.labels(work.tp.topic).inc()

    async def _copy_closed_segments(self, work: PartitionTiering) -> None:
        hosted = work.hosted
        start_from = max(work.next_offset, hosted.log_start_offset, 0)
        for segment in hosted.segments:
            if segment.active or segment.next_offset > hosted.high_watermark:
                break
            if segment.next_offset <= start_from:
                continue
            await self._copy(work, segment, start_from)
            start_from = segment.next_offset

    async def _copy(
        self, work: PartitionTiering, segment: tpb.LocalSegment, start_from: int
    ) -> None:
        started = time.perf_counter()
        directory = Path(work.hosted.directory)
        record_id = uuid.uuid4()
        base = segment.base_offset
        objects = {
            suffix: layout.segment_key(work.prefix, base, record_id, suffix)
            for suffix in OBJECT_SUFFIXES
        }
        try:
            fd = os.open(directory / f"{base:020d}.log", os.O_RDONLY)
        except FileNotFoundError as error:
            raise SegmentChangedError(f"segment {base} is gone") from error
        try:
            # The files that change as the log moves on are read now, with the segment held.
            uploads = await asyncio.to_thread(_files_beside, directory, segment)
            # Below the last stable offset every transaction is decided, its ABORT marker
            # indexed by the broker: those with records in this segment are all there.
            aborted = await asyncio.to_thread(_aborted_transactions, directory)
            scan = await asyncio.to_thread(
                scan_segment,
                fd,
                segment.size_bytes,
                self.store.uri_of(objects[layout.LOG]),
                start_from,
                self.settings.index_span_bytes,
            )
            if not scan.entries:
                return
            record = pb.RemoteLogSegment(
                segment_id=record_id.bytes,
                state=pb.COPY_STARTED,
                base_offset=base,
                start_offset=scan.start_offset,
                end_offset=scan.end_offset,
                max_timestamp=scan.max_timestamp,
                size_bytes=segment.size_bytes,
                epochs=[pb.EpochStart(epoch=e, start_offset=o) for e, o in scan.epochs],
            )
            previous = next(
                (r for r in reversed(work.finished) if r.end_offset < scan.start_offset), None
            )
            shipped = await asyncio.to_thread(
                _shipped_aborted,
                self.store,
                None if previous is None else work.object_key(previous, layout.TXN_INDEX),
                aborted,
                scan.start_offset,
                scan.end_offset,
            )
            await self._record(work, record)
            uploads[layout.REMOTE_LOG_INDEX] = encode_entries(scan.entries)
            uploads[layout.TXN_INDEX] = encode_aborted(shipped)
            self.metrics.copy_requests.labels(work.tp.topic).inc()
            try:
                await asyncio.to_thread(self._upload, objects, fd, segment.size_bytes, uploads)
                await self._record(work, _with_state(record, pb.COPY_FINISHED))
            except BrokerUnavailableError:
                # Whether COPY_FINISHED committed is unknown: the next round reads the record
                # and either indexes the copy or cleans it up. Deleting now could lose it.
                raise
            except BaseException:
                await self._abandon(work, record, objects)
                raise
        finally:
            os.close(fd)
        await self._append_entries(work, scan.entries)
        await self.link.remote_log_changed(work.hosted.topic, work.hosted.partition)
        self.metrics.copy_latency.observe(time.perf_counter() - started)
        self.metrics.copied_segments.labels(work.tp.topic).inc()
        self.metrics.copied_bytes.labels(work.tp.topic).inc(segment.size_bytes)
        log.info(
            "%s: copied segment %d (offsets %d-%d, %d bytes) to the remote store",
            work.tp,
            base,
            scan.start_offset,
            scan.end_offset,
            segment.size_bytes,
        )

    def _upload(
        self, objects: dict[str, str], fd: int, size: int, others: dict[str, bytes | None]
    ) -> None:
        self.store.write_file(objects[layout.LOG], fd, size)
        for suffix, data in others.items():
            if data is not None:
                self.store.write(objects[suffix], [data])

    async def _abandon(
        self, work: PartitionTiering, record: pb.RemoteLogSegment, objects: dict[str, str]
    ) -> None:
        """A copy that failed half way: its objects go now if the store lets them (the next
        round's clean-up, or the next leader's, finishes otherwise)."""
        self.metrics.copy_errors.labels(work.tp.topic).inc()
        try:
            await self._delete_copy(work, record)
        except Exception as error:
            log.info("%s: clean-up of the failed copy left for later: %s", work.tp, error)
            await asyncio.to_thread(_quietly, self.store.delete, list(objects.values()))

    async def _append_entries(self, work: PartitionTiering, entries: list[IndexEntry]) -> None:
        """Add a copy's entries to the remote indexes, rotating first when the active set is
        due (and shipping the rotated one)."""
        index = work.index
        now = self._now_ms()
        if index.rotation_due(self.settings.index_rotate_bytes, self.settings.index_rotate_ms, now):
            await asyncio.to_thread(self._rotate, work, entries[0].first_offset, now)
        await asyncio.to_thread(index.append, entries, now)

    async def _rotate_if_due(self, work: PartitionTiering) -> None:
        index = work.index
        now = self._now_ms()
        if index.rotation_due(self.settings.index_rotate_bytes, self.settings.index_rotate_ms, now):
            await asyncio.to_thread(self._rotate, work, index.end_offset, now)
            await self.link.remote_log_changed(work.hosted.topic, work.hosted.partition)

    def _rotate(self, work: PartitionTiering, next_offset: int, now_ms: int) -> None:
        """Close the active remote index set and upload it, so replicas can take it whole
        (blocking: on a worker thread)."""
        closed = work.index.rotate(next_offset, now_ms)
        if closed is None:
            return
        for suffix, path in zip(layout.INDEX_SUFFIXES, closed.paths, strict=True):
            key = layout.index_key(work.prefix, closed.base_offset, suffix)
            self.store.write(key, [path.read_bytes()])

    async def _apply_retention(self, work: PartitionTiering, config: LogConfig) -> None:
        hosted = work.hosted
        finished = work.finished
        if not config.remote_storage_enable:
            doomed = finished if config.remote_log_delete_on_disable else []
        else:
            doomed = _past_retention(
                finished,
                config,
                hosted.log_start_offset,
                _local_only_bytes(hosted, work.next_offset),
                self._now_ms(),
            )
        if not doomed:
            return
        kept = finished[len(doomed) :]  # the doomed are the oldest
        new_start = kept[0].start_offset if kept else hosted.local_log_start_offset
        if new_start > hosted.log_start_offset:
            # Readers stop asking for these offsets before their objects go.
            await self.link.remote_log_changed(hosted.topic, hosted.partition, new_start)
            hosted.log_start_offset = new_start
        for record in doomed:
            log.info(
                "%s: deleting remote segment %d-%d (retention)",
                work.tp,
                record.start_offset,
                record.end_offset,
            )
            await self._delete_copy(work, record)
        if kept:
            dropped = await asyncio.to_thread(work.index.drop_below, new_start)
        else:
            dropped = await asyncio.to_thread(_drop_all, work.index)
        await asyncio.to_thread(
            self.store.delete,
            [
                layout.index_key(work.prefix, base, suffix)
                for base in dropped
                for suffix in layout.INDEX_SUFFIXES
            ],
        )
        await self.link.remote_log_changed(hosted.topic, hosted.partition)

    async def _settle_log_start(self, work: PartitionTiering, config: LogConfig) -> None:
        """A broker restarted from a checkpoint older than the last remote deletion can
        start its log below the first remote record left: move it up to it."""
        hosted = work.hosted
        finished = work.finished
        if not config.remote_storage_enable and finished:
            return
        first = finished[0].start_offset if finished else hosted.local_log_start_offset
        if hosted.log_start_offset < first:
            await self.link.remote_log_changed(hosted.topic, hosted.partition, first)

    def _observe(self, work: PartitionTiering) -> None:
        hosted = work.hosted
        lagging = [
            s
            for s in hosted.segments
            if not s.active
            and s.next_offset <= hosted.high_watermark
            and s.next_offset > work.next_offset
        ]
        finished = work.finished
        self.metrics.observe(
            hosted.topic,
            hosted.partition,
            leader=hosted.leader,
            lag_segments=len(lagging),
            lag_bytes=sum(s.size_bytes for s in lagging),
            remote_segments=len(finished),
            remote_bytes=sum(r.size_bytes for r in finished),
            remote_records=len(work.records),
        )

    # Following -----------------------------------------------------------------------------------

    async def _follow(self, work: PartitionTiering) -> None:
        work.next_sync = time.monotonic() + self.settings.follower_sync_interval_ms / 1000
        await self._announce_once(work)
        changed = await self._catch_up_index(work)
        if await asyncio.to_thread(work.index.drop_below, work.hosted.log_start_offset):
            changed = True
        if changed:
            await self.link.remote_log_changed(work.hosted.topic, work.hosted.partition)
        self._observe(work)

    # Remote indexes from the store -------------------------------------------------------------

    async def _catch_up_index(self, work: PartitionTiering) -> bool:
        """Append to the local remote indexes the entries of every finished copy they do not
        hold yet, from the store: the rotated sets first when the indexes are empty and much
        is missing, then each copy's own entries. Indexes that disagree with the records
        are built again from nothing. Returns whether they changed."""
        try:
            return await self._extend_index(work)
        except ValueError as error:
            log.warning("%s: remote indexes disagree (%s); rebuilding them", work.tp, error)
            await asyncio.to_thread(_drop_all, work.index)
            await self._extend_index(work)
            return True

    async def _extend_index(self, work: PartitionTiering) -> bool:
        index = work.index
        missing = _missing(work.finished, index.end_offset)
        if not missing:
            return False
        if index.end_offset < 0 and len(missing) > ROTATED_SETS_AFTER:
            await self._install_rotated_sets(work)
            missing = _missing(work.finished, index.end_offset)
        for record in missing:
            data = await asyncio.to_thread(
                self.store.read_all, work.object_key(record, layout.REMOTE_LOG_INDEX)
            )
            shipped = decode_entries(data)
            _check_entries(record, shipped, work.object_key(record, layout.LOG))
            end = index.end_offset
            entries = [e for e in shipped if e.first_offset >= end]
            await asyncio.to_thread(index.append, entries, self._now_ms())
            self.metrics.index_syncs.labels(work.tp.topic).inc(len(entries))
        return True

    async def _install_rotated_sets(self, work: PartitionTiering) -> None:
        """Take the rotated sets the leader shipped, as long as each checks out against the
        remote records (every entry inside a finished copy's object and offsets)."""
        prefix = f"{work.prefix}/indexes"
        objects = await asyncio.to_thread(self.store.list, prefix)
        bases = sorted(
            int(Path(o.key).name[:20]) for o in objects if o.key.endswith(layout.REMOTE_LOG_INDEX)
        )
        finished = {work.object_key(r, layout.LOG): r for r in work.finished}
        for base in bases:
            key = layout.index_key(work.prefix, base, layout.REMOTE_LOG_INDEX)
            try:
                entries = decode_entries(await asyncio.to_thread(self.store.read_all, key))
            except (CorruptIndexError, RemoteObjectMissingError) as error:
                log.warning("%s: rotated remote index %s unusable: %s", work.tp, key, error)
                return
            owner = [finished.get(self.store.key_of(e.rdi.uri)) for e in entries]
            if not entries or any(
                r is None or not r.start_offset <= e.first_offset <= e.last_offset <= r.end_offset
                for r, e in zip(owner, entries, strict=True)
            ):
                return
            end = work.index.end_offset
            if entries[0].first_offset < end:
                continue
            await asyncio.to_thread(work.index.replace, base, entries, self._now_ms())
            self.metrics.index_syncs.labels(work.tp.topic).inc(len(entries))

    # Deleted topics -------------------------------------------------------------------------------

    async def _delete_removed_topics(self) -> None:
        """Topics deleted with remote data: any tiering service deletes their objects (the
        topic id in the prefix keeps a newer topic of the name apart), then says so."""
        try:
            deleted = await self.link.deletions()
        except BrokerUnavailableError:
            return
        pending: set[str] = set()
        for topic in deleted:
            prefix = layout.topic_prefix(topic.name, uuid.UUID(bytes=topic.topic_id))
            try:
                await asyncio.to_thread(self.store.delete_prefix, prefix)
                await self.link.finish_deletion(topic.topic_id)
                log.info("deleted the remote data of deleted topic %s (%s)", topic.name, prefix)
            except (RemoteStorageError, RefusedError, BrokerUnavailableError) as error:
                self.metrics.delete_errors.labels(topic.name).inc()
                pending.add(topic.name)
                log.info("remote data of deleted topic %s not deleted yet: %s", topic.name, error)
        finished, self._deleting = self._deleting - pending, pending
        if finished:  # their deletion errors go
            self.metrics.retain(self._hosted_topics, pending)


def _config(hosted: tpb.HostedPartition) -> LogConfig:
    try:
        return LogConfig.from_properties(dict(hosted.configs))
    except InvalidConfigError as error:
        raise RefusedError(0, f"the broker's configs of {hosted.topic}: {error}") from error


def _with_state(record: pb.RemoteLogSegment, state: int) -> pb.RemoteLogSegment:
    moved = pb.RemoteLogSegment()
    moved.CopyFrom(record)
    moved.state = state  # type: ignore[assignment]
    return moved


def _files_beside(directory: Path, segment: tpb.LocalSegment) -> dict[str, bytes | None]:
    """The small objects a copy ships beside the segment, by suffix: its indexes, the
    producer snapshot at its end and the leader epochs (None: the file is not there)."""
    base = segment.base_offset
    return {
        layout.OFFSET_INDEX: _read_if_present(directory / f"{base:020d}{layout.OFFSET_INDEX}"),
        layout.TIME_INDEX: _read_if_present(directory / f"{base:020d}{layout.TIME_INDEX}"),
        layout.PRODUCER_SNAPSHOT: _read_if_present(
            directory / f"{segment.next_offset:020d}{layout.PRODUCER_SNAPSHOT}"
        ),
        layout.LEADER_EPOCHS: _read_if_present(directory / LEADER_EPOCH_CHECKPOINT)
        or b"0\n0\n",  # an empty checkpoint: version 0, no entries
    }


def _aborted_transactions(directory: Path) -> list[AbortedTxn]:
    """The broker's aborted-transaction index of the partition (none: no file yet); an
    entry it is appending now may be torn, and is of a marker above what is copied."""
    return valid_prefix(_read_if_present(directory / PARTITION_FILE) or b"")


def _shipped_aborted(
    store: RemoteStore, previous_key: str | None, local: list[AbortedTxn], first: int, last: int
) -> list[AbortedTxn]:
    """The aborted transactions a copy of offsets first..last ships: those with records
    there in the broker's index, and those the copy before it shipped that reach into it (a
    broker restarted without a producer snapshot does not know where a transaction begun
    before its local segments started); in marker order (blocking: on a worker thread)."""
    found = overlapping(local, first, last)
    if previous_key is not None:
        try:
            found += overlapping(decode_aborted(store.read_all(previous_key)), first, last)
        except RemoteObjectMissingError:
            pass  # a copy made before copies shipped their aborted transactions
        except CorruptIndexError as error:
            log.warning("%s unusable, its entries not carried on: %s", previous_key, error)
    unique = {(t.producer_id, t.first_offset): t for t in found}
    return sorted(unique.values(), key=lambda t: t.last_offset)


def _read_if_present(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _quietly(delete: Callable[[list[str]], None], keys: list[str]) -> None:
    with contextlib.suppress(RemoteStorageError):
        delete(keys)


def _missing(finished: list[pb.RemoteLogSegment], end: int) -> list[pb.RemoteLogSegment]:
    """The finished copies holding offsets at or after `end` (the indexes' end; -1: empty)."""
    return [r for r in finished if r.end_offset >= max(end, 0)]


def _check_entries(record: pb.RemoteLogSegment, entries: list[IndexEntry], key: str) -> None:
    """A copy's shipped entries must lie inside its offsets and point into its own object
    (CorruptIndexError otherwise)."""
    for entry in entries:
        if not record.start_offset <= entry.first_offset <= entry.last_offset <= record.end_offset:
            raise CorruptIndexError(
                f"entry {entry.first_offset}-{entry.last_offset} outside the copy's "
                f"{record.start_offset}-{record.end_offset}"
            )
        if not entry.rdi.uri.endswith("/" + key):
            raise CorruptIndexError(f"entry pointing at {entry.rdi.uri}, not {key}")


def _local_only_bytes(hosted: tpb.HostedPartition, remote_next: int) -> int:
    """Bytes of the local segments holding records no finished copy holds."""
    return sum(s.size_bytes for s in hosted.segments if s.next_offset > max(remote_next, 0))


def _past_retention(
    finished: list[pb.RemoteLogSegment],
    config: LogConfig,
    log_start: int,
    local_only_bytes: int,
    now_ms: int,
) -> list[pb.RemoteLogSegment]:
    """The remote copies to delete, oldest first: those wholly below the log start, then
    those past retention.ms, then as many as keep the log's size (remote plus what is only
    local) at or above retention.bytes."""
    doomed = [r for r in finished if r.end_offset < log_start]
    rest = finished[len(doomed) :]
    size = sum(r.size_bytes for r in rest) + local_only_bytes
    for record in rest:
        expired = (
            config.retention_ms >= 0
            and record.max_timestamp != NO_TIMESTAMP
            and now_ms - record.max_timestamp > config.retention_ms
        )
        oversized = (
            config.retention_bytes >= 0 and size - record.size_bytes >= config.retention_bytes
        )
        if not (expired or oversized):
            break
        doomed.append(record)
        size -= record.size_bytes
    return doomed


def _drop_all(index: RemoteIndex) -> list[int]:
    bases = [f.base_offset for f in index.files]
    index.delete_all()
    return bases
