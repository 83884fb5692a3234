"""RDMA consume (KafkaDirect §4.4.2): consumers read segment files with one-sided RDMA
READs and learn how far they may read from metadata slots they also READ, so a broker's
CPU serves no fetch requests.

A consumer asks (RdmaConsume ACCESS, over its Kafka connection) for the segment holding an
offset. The broker registers the segment file REMOTE_READ, once however many consumers read
it (reference-counted by the consumers holding it): a sealed segment at its size, the head
at its preallocated length. For a segment whose readable end may still move (the head, or a
sealed one the high watermark has not passed yet) the consumer also gets a slot in its own
slot region: one contiguous REMOTE_READ region per consumer, lowest free slots first, so a
consumer reads all its slots with one READ. The broker rewrites a segment's slots whenever
the high watermark moves (the readable end is the end of the last batch below it, never
further; for a read_committed consumer, below the last stable offset too), when the head
rolls (the sealed file is registered anew at its final size before the log gives back its
preallocated tail, so no registration ever covers bytes past the end of a file) and when
access ends (REVOKED: leadership moved, the segment was deleted or cut).

A read_committed consumer (RdmaConsume v1) reads only below the last stable offset. That
offset moves only when the high watermark does: a transaction stops holding it back once
the high watermark passes its marker (ProducerStateManager.first_unstable_offset), and a
marker, written by the coordinator on commit, abort or timeout, moves the high watermark
through Partition.appended like any append. So the high watermark listener rewrites those
slots too. Dropping aborted records is the consumer's part (directlog/client/rdma_consume.py):
everything below the last stable offset belongs to decided transactions.

A consumer's queue pair names its consumer id once (WRITE_WITH_IMM into a scratch word,
immediate = id); when that queue pair fails or disconnects, or none names the id in time,
the consumer's slot region is deregistered and every segment it held released. A segment
no consumer holds is deregistered.

A consumer whose authority ends (docs/security.md, "RDMA grants": its principal may no
longer READ a topic it holds, its SASL credentials were deleted, its session ended) is
dropped likewise, and the segments it shared with others are registered anew: their old
rkeys, which it knows, read nothing from then on.

Threads: one accepts queue pairs, one polls the completion queue (receives only); both hand
what they get to the event loop, which owns all state. Log changes reach it through
PartitionLog listeners (called on the loop, except compaction's, which are deferred to it).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.protocol.rdma_consume import (
    ACCESS,
    MUTABLE,
    NEW_CONSUMER,
    NO_SLOT,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RELEASE,
    REVOKED,
    SLOT_SIZE,
    RdmaConsumeRequest,
    RdmaConsumeResponse,
    Slot,
    write_slot,
)
from directlog.rdma import (
    Access,
    MemoryRegion,
    QpCaps,
    QueuePair,
    RdmaError,
    WorkCompletion,
)
from directlog.security.acl import Operation
from directlog.topics import TopicPartition
from services.broker.authentication import SESSION, Session
from services.broker.authorizer import Authorizer
from services.broker.metrics import BrokerMetrics
from services.broker.partition import Partition
from services.broker.rdma.endpoint import RdmaEndpoint
from services.broker.rdma.produce import authority_lost, session_holding
from services.broker.replica_manager import ReplicaManager
from services.broker.settings import BrokerSettings
from services.broker.storage import PartitionLog
from services.broker.storage.segment import LogSegment

log = logging.getLogger(__name__)

SLOTS_PER_CONSUMER = 64
RECV_CREDITS = 2  # a bind, and one spare to notice a misbehaving peer
BIND_BYTES = 8
ID_BITS = 31


def readable_bound(plog: PartitionLog, committed: bool) -> int:
    """The offset a consumer reads below: the high watermark, or for read_committed the
    last stable offset (never above the high watermark)."""
    return plog.last_stable_offset if committed else plog.high_watermark


@dataclass(eq=False, slots=True)
class SegmentAccess:
    """One registration of a segment file, shared by the consumers in ``holders``."""

    tp: TopicPartition
    plog: PartitionLog
    segment: LogSegment
    region: MemoryRegion
    mutable: bool  # the head: registered at its preallocated length
    holders: dict[int, Holding] = field(default_factory=dict)
    revoked: bool = False

    @property
    def key(self) -> tuple[TopicPartition, int]:
        return self.tp, self.segment.base_offset

    def readable_end(self, committed: bool) -> int:
        """End of the last whole batch below ``readable_bound`` in this segment."""
        segment, bound = self.segment, readable_bound(self.plog, committed)
        if bound >= segment.next_offset:
            return segment.size
        if bound <= segment.base_offset:
            return 0
        found = segment.locate(bound)
        return segment.size if found is None else found[0]

    def complete(self, committed: bool) -> bool:
        """Sealed, and ``readable_bound`` passed its end: nothing more will be readable."""
        return not self.mutable and readable_bound(self.plog, committed) >= self.segment.next_offset


@dataclass(eq=False, slots=True)
class Holding:
    consumer: Consumer
    access: SegmentAccess
    slot: int  # NO_SLOT when the segment was complete when granted


@dataclass(eq=False, slots=True)
class Consumer:
    consumer_id: int
    slots: MemoryRegion
    committed: bool  # read_committed: it reads below the last stable offset only
    versions: list[int] = field(default_factory=lambda: [0] * SLOTS_PER_CONSUMER)
    free: set[int] = field(default_factory=lambda: set(range(SLOTS_PER_CONSUMER)))
    holdings: dict[tuple[TopicPartition, int], Holding] = field(default_factory=dict)
    qp: QueuePair | None = None
    timer: asyncio.TimerHandle | None = None
    session: Session | None = None  # the session it is held on (session_holding)
    unwatch: Callable[[], None] | None = None  # stops watching that session's end


class RdmaConsume:
    """Grants segments to RDMA consumers and keeps their metadata slots current."""

    def __init__(
        self, settings: BrokerSettings, replicas: ReplicaManager, metrics: BrokerMetrics
    ) -> None:
        self.settings = settings
        self.replicas = replicas
        self.metrics = metrics
        self._slot_writes: dict[str, Any] = {}  # topic -> its labelled counter
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        max_qps = settings.rdma_consume_max_consumers + 16  # room for unbound queue pairs
        self._endpoint = RdmaEndpoint(
            "RDMA consume",
            settings,
            settings.rdma_consume_port,
            QpCaps(max_send_wr=1, max_recv_wr=RECV_CREDITS),
            max_qps * (RECV_CREDITS + 1),
            self._accepted,
            self._complete,
        )
        self._pd = self._endpoint.pd
        self._listener = self._endpoint.listener
        self._bind_word = self._pd.allocate(BIND_BYTES, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        self._consumers: dict[int, Consumer] = {}
        self._accesses: dict[PartitionLog, dict[int, SegmentAccess]] = {}
        self._qps: dict[int, QueuePair] = {}
        self._bound: dict[int, Consumer] = {}  # qp_num -> the consumer it named
        self._unbound_timers: dict[int, asyncio.TimerHandle] = {}
        metrics.rdma_consumers.set_function(lambda: len(self._consumers))
        metrics.rdma_consume_registrations.set_function(
            lambda: sum(len(accesses) for accesses in self._accesses.values())
        )

    @property
    def connect_timeout(self) -> float:
        return self.settings.rdma_connect_timeout_ms / 1000

    # Requests ------------------------------------------------------------------------

    def handle(self, request: RdmaConsumeRequest) -> RdmaConsumeResponse:
        """Answer an ACCESS or a RELEASE; raises KafkaError with the code the client gets."""
        if request.op == ACCESS:
            return self._access(request)
        if request.op == RELEASE:
            self._release(request)
            return RdmaConsumeResponse(ErrorCode.NONE, consumer_id=request.consumer_id)
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"RdmaConsume op {request.op}")

    def _access(self, request: RdmaConsumeRequest) -> RdmaConsumeResponse:
        if request.isolation_level not in (READ_UNCOMMITTED, READ_COMMITTED):
            raise KafkaError(
                ErrorCode.INVALID_REQUEST, f"unknown isolation level {request.isolation_level}"
            )
        committed = request.isolation_level == READ_COMMITTED
        offered = self._listener.conn_info.providers
        if not set(request.providers) & set(offered):
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"no common RDMA provider: client {list(request.providers)}, broker {offered}",
            )
        partition = self.replicas.leader_partition(request.topic, request.partition)
        created = request.consumer_id == NEW_CONSUMER
        consumer = self._new_consumer(committed) if created else self._consumer(request.consumer_id)
        if consumer.session is not None and consumer.session is not SESSION.get():
            raise KafkaError(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"RDMA consumer {consumer.consumer_id} belongs to another session",
            )
        if consumer.committed != committed:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"RDMA consumer {consumer.consumer_id} has another isolation level",
            )
        try:
            holding, position = self._grant(consumer, partition, request.offset)
        except BaseException:
            if created:
                self._drop_consumer(consumer, "its first access failed")
            raise
        access = holding.access
        return RdmaConsumeResponse(
            ErrorCode.NONE,
            None,
            self._listener.conn_info.encode(),
            consumer.consumer_id,
            access.segment.base_offset,
            access.region.addr,
            access.region.rkey,
            access.region.length,
            position,
            access.readable_end(consumer.committed),
            not access.complete(consumer.committed),
            consumer.slots.addr,
            consumer.slots.rkey,
            consumer.slots.length,
            holding.slot,
            self._bind_word.addr,
            self._bind_word.rkey,
        )

    def _grant(self, consumer: Consumer, partition: Partition, offset: int) -> tuple[Holding, int]:
        """The consumer's holding of the segment with ``offset`` (registered and slotted as
        needed) and the file position of the batch holding it."""
        plog = partition.log
        # As for a Fetch, an offset between the high watermark and the log end is in range
        # (a new leader's high watermark can lag what consumers saw); nothing above the high
        # watermark is readable until it moves there. A tiered log's remote records are
        # not registered: only its local part is served.
        start, end = plog.local_log_start_offset, plog.log_end_offset
        if not start <= offset <= end:
            raise KafkaError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"{partition.tp}: offset {offset} is outside [{start}, {end}]",
            )
        segments = plog.segments
        index = max(bisect_right([s.base_offset for s in segments], offset) - 1, 0)
        position = 0
        for segment in segments[index:]:
            head = segment is segments[-1]
            found = segment.locate(offset)
            if found is not None or head:
                position = segment.size if found is None else found[0]
                break
        key = (partition.tp, segment.base_offset)
        holding = consumer.holdings.get(key)
        if holding is not None:
            if not holding.access.revoked and holding.access.segment is segment:
                return holding, position
            self._release_holding(holding)  # revoked, or a compacted segment replaced it
        growing = head or readable_bound(plog, consumer.committed) < segment.next_offset
        if growing and not consumer.free:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"consumer {consumer.consumer_id} holds {SLOTS_PER_CONSUMER} growing "
                f"segments already: release some",
            )
        access = self._access_of(partition, segment, head)
        slot = NO_SLOT
        if growing:
            slot = min(consumer.free)
            consumer.free.discard(slot)
        holding = Holding(consumer, access, slot)
        access.holders[consumer.consumer_id] = holding
        consumer.holdings[key] = holding
        self._update_slots(access, holding)
        return holding, position

    def _access_of(self, partition: Partition, segment: LogSegment, head: bool) -> SegmentAccess:
        """The segment's shared registration, made on first use."""
        plog = partition.log
        accesses = self._accesses.get(plog)
        access = None if accesses is None else accesses.get(segment.base_offset)
        if access is not None:
            if access.segment is segment:
                return access
            self._revoke(access, "a compacted segment replaced it")
            accesses = self._accesses.get(plog)
        if head:
            length = segment.log.capacity
            if length is None:
                raise KafkaError(
                    ErrorCode.INVALID_CONFIG,
                    f"{partition.tp}: RDMA consume of the head segment needs preallocate=true",
                )
        else:
            length = segment.size
        try:
            region = self._pd.register_file(segment.log.path, length, Access.REMOTE_READ)
        except RdmaError as error:
            raise KafkaError(
                ErrorCode.KAFKA_STORAGE_ERROR, f"{partition.tp}: cannot register segment: {error}"
            ) from None
        access = SegmentAccess(partition.tp, plog, segment, region, head)
        if accesses is None:
            accesses = self._accesses[plog] = {}
            plog.listeners.append(self)
        accesses[segment.base_offset] = access
        log.info(
            "%s: segment %d registered for RDMA reads (%d bytes)",
            partition.tp,
            segment.base_offset,
            length,
        )
        return access

    def _release(self, request: RdmaConsumeRequest) -> None:
        consumer = self._consumer(request.consumer_id)
        key = (TopicPartition(request.topic, request.partition), request.offset)
        holding = consumer.holdings.get(key)
        if holding is None:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"consumer {consumer.consumer_id} holds no segment {request.offset} of "
                f"{request.topic}-{request.partition}",
            )
        self._release_holding(holding)

    def _new_consumer(self, committed: bool) -> Consumer:
        if len(self._consumers) >= self.settings.rdma_consume_max_consumers:
            raise KafkaError(
                ErrorCode.POLICY_VIOLATION,
                f"{len(self._consumers)} RDMA consumers already (rdma_consume_max_consumers)",
            )
        consumer_id = NEW_CONSUMER
        while consumer_id == NEW_CONSUMER or consumer_id in self._consumers:
            consumer_id = secrets.randbits(ID_BITS)
        try:
            slots = self._pd.allocate(SLOTS_PER_CONSUMER * SLOT_SIZE, Access.REMOTE_READ)
        except RdmaError as error:
            raise KafkaError(
                ErrorCode.POLICY_VIOLATION, f"no slot region for a consumer: {error}"
            ) from None
        consumer = Consumer(consumer_id, slots, committed, session=session_holding(self.settings))
        consumer.timer = self._loop.call_later(
            self.connect_timeout, self._drop_consumer, consumer, "no queue pair named it in time"
        )
        if consumer.session is not None:
            consumer.unwatch = consumer.session.on_end(
                lambda why: self._cut_off(consumer, f"its session ended: {why}")
            )
        self._consumers[consumer_id] = consumer
        return consumer

    def _consumer(self, consumer_id: int) -> Consumer:
        consumer = self._consumers.get(consumer_id)
        if consumer is None:
            raise KafkaError(
                ErrorCode.UNKNOWN_MEMBER_ID, f"no RDMA consumer {consumer_id} on this broker"
            )
        return consumer

    # Slots ---------------------------------------------------------------------------

    def _update_slots(self, access: SegmentAccess, only: Holding | None = None) -> None:
        """Rewrite the slots of ``access`` (or of ``only``): a new version, then the
        checksum, so a READ overlapping the write fails its check."""
        holders = access.holders.values() if only is None else (only,)
        slotted = [holding for holding in holders if holding.slot != NO_SLOT]
        if not slotted:
            return
        views: dict[bool, tuple[int, int]] = {}  # isolation -> flags, readable end
        region = access.region
        for holding in slotted:
            consumer = holding.consumer
            view = views.get(consumer.committed)
            if view is None:
                if access.revoked:
                    view = REVOKED, 0
                else:
                    committed = consumer.committed
                    flags = 0 if access.complete(committed) else MUTABLE
                    view = flags, access.readable_end(committed)
                views[consumer.committed] = view
            flags, end = view
            version = consumer.versions[holding.slot] = consumer.versions[holding.slot] + 1
            slot = Slot(
                version,
                flags,
                access.segment.base_offset,
                end,
                region.addr,
                region.rkey,
                region.length,
            )
            write_slot(consumer.slots.buf, holding.slot * SLOT_SIZE, slot)
        topic = access.tp.topic
        writes = self._slot_writes.get(topic)
        if writes is None:
            writes = self._slot_writes[topic] = self.metrics.rdma_slot_writes.labels(topic)
        writes.inc(len(slotted))

    # Log listener (services/broker/storage/log.py LogListener) -------------------------

    def high_watermark_moved(self, plog: PartitionLog) -> None:
        for access in self._accesses.get(plog, {}).values():
            self._update_slots(access)

    def segment_rolled(self, plog: PartitionLog, sealed: LogSegment) -> None:
        """Before the log trims the sealed head: register it anew at its final size (the
        file is still at its preallocated length, so that succeeds) and drop the old
        registration, whose tail is about to leave the file."""
        access = self._accesses.get(plog, {}).get(sealed.base_offset)
        if access is None or access.segment is not sealed or not access.mutable:
            return
        self._register_anew(access, sealed, "the sealed segment")

    def segment_moved(self, plog: PartitionLog, segment: LogSegment) -> None:
        """The sealed segment's file was replaced by a copy (written back from the head
        directory): register the copy and drop the old registration, as at a roll.
        Consumers that read the old one in between fail a READ and ask again."""
        if threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self.segment_moved, plog, segment)
            return
        access = self._accesses.get(plog, {}).get(segment.base_offset)
        if access is None or access.segment is not segment or access.revoked or segment.deleted:
            return
        if self._register_anew(access, segment, "the written-back segment"):
            log.info("%s: segment %d registered anew, written back", access.tp, segment.base_offset)

    def _register_anew(
        self, access: SegmentAccess, segment: LogSegment, what: str, length: int | None = None
    ) -> bool:
        """Register `segment`'s file in place of the access's old registration, and tell
        its consumers: as it is now (final size, read-only) or, given `length`, the same
        bytes under a new rkey. Revoke the access if that fails. Returns whether it
        succeeded."""
        size = segment.size if length is None else length
        try:
            region = self._pd.register_file(segment.log.path, size, Access.REMOTE_READ)
        except RdmaError as error:
            self._revoke(access, f"cannot register {what}: {error}")
            return False
        access.region.deregister()
        access.region = region
        if length is None:
            access.mutable = False
        self._update_slots(access)
        return True

    def segments_removed(self, plog: PartitionLog, segments: list[LogSegment]) -> None:
        if threading.get_ident() != self._loop_thread:  # compaction: files only unlinked
            self._loop.call_soon_threadsafe(self.segments_removed, plog, segments)
            return
        accesses = self._accesses.get(plog, {})
        for segment in segments:
            access = accesses.get(segment.base_offset)
            if access is not None and access.segment is segment:
                self._revoke(access, "the segment was deleted or cut")

    def leadership_changed(self, partition: Partition) -> None:
        if partition.is_leader:
            return
        for access in list(self._accesses.get(partition.log, {}).values()):
            self._revoke(access, "leadership moved")

    def _revoke(self, access: SegmentAccess, reason: str) -> None:
        """End remote access to the segment; holders' slots say REVOKED until released."""
        if access.revoked:
            return
        access.revoked = True
        self._forget(access)
        access.region.deregister()
        self._update_slots(access)
        self.metrics.rdma_consume_revocations.inc()
        log.info("%s: RDMA reads of segment %d revoked: %s", access.tp, access.key[1], reason)

    def _forget(self, access: SegmentAccess) -> None:
        accesses = self._accesses.get(access.plog)
        if accesses is None or accesses.get(access.segment.base_offset) is not access:
            return
        del accesses[access.segment.base_offset]
        if not accesses:
            del self._accesses[access.plog]
            access.plog.listeners.remove(self)

    # Authority ---------------------------------------------------------------------------

    def recheck(self, authorizer: Authorizer | None) -> None:
        """Cut off every consumer that lost its authority: READ on a topic it holds by
        ``authorizer`` (the ACLs just taken; None when ACLs are not checked), or the
        credentials of its SASL login."""
        for consumer in list(self._consumers.values()):
            session = consumer.session
            if session is None:
                continue
            topics = sorted({holding.access.tp.topic for holding in consumer.holdings.values()})
            error = authority_lost(session, authorizer, Operation.READ, topics)
            if error is not None:
                self._cut_off(consumer, f"{session.principal}: {error}")

    def _cut_off(self, consumer: Consumer, reason: str) -> None:
        """Drop a consumer whose authority ended, and give the segments it shared with
        other consumers new rkeys, so nothing it learned reads anything any more."""
        shared = [
            holding.access
            for holding in consumer.holdings.values()
            if not holding.access.revoked and len(holding.access.holders) > 1
        ]
        self._drop_consumer(consumer, reason)
        for access in shared:
            length = access.region.length
            self._register_anew(access, access.segment, "the segment (new rkey)", length)

    def _release_holding(self, holding: Holding) -> None:
        consumer, access = holding.consumer, holding.access
        del consumer.holdings[access.key]
        del access.holders[consumer.consumer_id]
        if holding.slot != NO_SLOT:
            at = holding.slot * SLOT_SIZE
            consumer.slots.buf[at : at + SLOT_SIZE] = bytes(SLOT_SIZE)
            consumer.free.add(holding.slot)
        if not access.holders and not access.revoked:
            self._forget(access)
            access.region.deregister()

    def _drop_consumer(self, consumer: Consumer, reason: str) -> None:
        if self._consumers.get(consumer.consumer_id) is not consumer:
            return
        del self._consumers[consumer.consumer_id]
        if consumer.unwatch is not None:
            consumer.unwatch()
        if consumer.timer is not None:
            consumer.timer.cancel()
        for holding in list(consumer.holdings.values()):
            self._release_holding(holding)
        consumer.slots.deregister()
        log.info("RDMA consumer %d dropped: %s", consumer.consumer_id, reason)
        if consumer.qp is not None:
            self._drop_qp(consumer.qp.qp_num, reason)

    # Queue pairs, on the loop ------------------------------------------------------------

    def _accepted(self, qp: QueuePair) -> None:
        self._qps[qp.qp_num] = qp
        self._unbound_timers[qp.qp_num] = self._loop.call_later(
            self.connect_timeout, self._drop_qp, qp.qp_num, "it named no consumer in time"
        )

    def _complete(self, wc: WorkCompletion) -> None:
        qp = self._qps.get(wc.qp_num)
        if qp is None:
            return  # flushed receives of a queue pair already dropped
        if not wc.ok:
            self._drop_qp(wc.qp_num, f"queue pair ended: {wc.status.name}")
            return
        consumer = self._consumers.get(wc.imm_data or 0)
        bound = self._bound.get(wc.qp_num)
        if bound is not None or consumer is None or consumer.qp is not None:
            self._drop_qp(wc.qp_num, f"it named consumer {wc.imm_data}, not its to name")
            return
        consumer.qp = qp
        self._bound[wc.qp_num] = consumer
        for timer in (consumer.timer, self._unbound_timers.pop(wc.qp_num, None)):
            if timer is not None:
                timer.cancel()
        consumer.timer = None

    def _drop_qp(self, qp_num: int, reason: str) -> None:
        qp = self._qps.pop(qp_num, None)
        timer = self._unbound_timers.pop(qp_num, None)
        if timer is not None:
            timer.cancel()
        consumer = self._bound.pop(qp_num, None)
        if consumer is not None:
            consumer.qp = None
            self._drop_consumer(consumer, reason)
        if qp is not None:
            qp.close()

    async def close(self) -> None:
        """Drop every consumer and registration, stop the threads, close the provider."""
        for consumer in list(self._consumers.values()):
            self._drop_consumer(consumer, "broker stopping")
        for qp_num in list(self._qps):
            self._drop_qp(qp_num, "broker stopping")
        for accesses in list(self._accesses.values()):
            for access in list(accesses.values()):
                self._revoke(access, "broker stopping")
        await self._endpoint.close()
