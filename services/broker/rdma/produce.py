"""RDMA produce (KafkaDirect §4.2.2): clients granted a partition's head segment write
record batches straight into it with WRITE_WITH_IMM; the broker commits them strictly in
order through the log's reserve/commit path and writes a reply back to each writer.

Exclusive mode: one writer, which places its writes back to back itself. Shared mode: any
number of writers, and the Kafka-protocol produces to the partition, reserve each write
with FETCH_AND_ADD on the grant's 64-bit word (order in the top 16 bits, region offset in
the low 48); the order each reservation got is the order its write commits in. A
reservation that runs past the region's end is an overflow: its writer sends an empty
write in its place (a marker), and committing a marker seals the grant, since every later
reservation overflowed too. A reservation whose write never comes is a hole: when later
writes wait behind one for ``rdma_hole_timeout_ms`` the grant is revoked.

It runs on an RdmaEndpoint (endpoint.py): the event loop owns every grant.

A grant is revoked (its memory deregistered so later writes fail at the provider, its
uncommitted bytes zeroed, its writers told) when: an exclusive writer's queue pair fails
or disconnects, an immediate names another file or an order out of range, a write
overruns the region, a batch fails validation, a hole times out, the partition's
leadership moves, or no queue pair uses an exclusive grant in time; and when a writer's
authority ends (docs/security.md, "RDMA grants"): its principal may no longer WRITE the
topic, its SASL credentials were deleted, or its session ended.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.protocol.rdma_access import (
    EXCLUSIVE,
    MAX_IN_FLIGHT,
    SHARED,
    RdmaAccessRequest,
    RdmaAccessResponse,
)
from directlog.rdma import (
    Access,
    MemoryRegion,
    Opcode,
    QpCaps,
    QueuePair,
    RdmaError,
    WcStatus,
    WorkCompletion,
)
from directlog.records.varint import Buffer
from directlog.security.acl import Operation, ResourceType
from directlog.topics import TopicPartition
from services.broker.authentication import SESSION, Session
from services.broker.authorization import denied
from services.broker.authorizer import Authorizer
from services.broker.error_codes import error_code_for
from services.broker.metrics import BrokerMetrics
from services.broker.partition import Partition
from services.broker.rdma.endpoint import RdmaEndpoint
from services.broker.replica_manager import ReplicaManager
from services.broker.settings import BrokerSettings
from services.broker.storage import AppendResult
from services.broker.storage.segment import LogSegment

log = logging.getLogger(__name__)

REPLY = struct.Struct(">Hhiq")  # order, error code, record count, base offset
MAX_REPLY_SLOTS = 1024
RECV_CREDITS = MAX_IN_FLIGHT  # receives posted per queue pair
SEND_DEPTH = 64  # replies not yet completed per queue pair
MAX_CONNECTIONS = 64  # queue pairs the completion queue has room for
FILE_IDS = 1 << 16
ORDERS = 1 << 16
ORDER_ONE = 1 << 48  # one order in the reservation word
OFFSET_MASK = ORDER_ONE - 1
MAX_AHEAD = MAX_CONNECTIONS * MAX_IN_FLIGHT  # orders a shared grant buffers past a hole
ABORTED = ErrorCode.REQUEST_TIMED_OUT  # what writers hear when others' faults end a grant
REPLICATION_TIMEOUT = 30.0  # acks=-1: as a Kafka producer's request.timeout.ms default


def session_holding(settings: BrokerSettings) -> Session | None:
    """The session a grant made now belongs to and ends with: the requester's, when its
    authority can change (the broker checks ACLs, or it logged in with SASL). None: the
    grant outlives the connection that asked for it, as an unauthenticated client's grant
    on a broker without the authorizer always has."""
    session = SESSION.get()
    if session is not None and (settings.authorizer_enabled or session.sasl):
        return session
    return None


def authority_lost(
    session: Session,
    authorizer: Authorizer | None,
    operation: Operation,
    names: Iterable[str],
    resource_type: ResourceType = ResourceType.TOPIC,
) -> KafkaError | None:
    """Why the session may no longer hold grants on the resources ``names`` (topics, or the
    cluster) needing ``operation`` (``authorizer``: None when ACLs are not checked), or
    None while it may."""
    if not session.credentials_exist():
        return KafkaError(
            ErrorCode.SASL_AUTHENTICATION_FAILED,
            f"the credentials {session.principal} logged in with were deleted",
        )
    if authorizer is None:
        return None
    principal, host = session.principal, session.client_host
    for name in names:
        if not authorizer.authorize(principal, host, operation, resource_type, name):
            return denied(operation, resource_type, name)
    return None


@dataclass(eq=False, slots=True)
class Grant:
    """Write access to ``region``, file position ``start`` onwards of ``segment``; in
    shared mode reserved through ``word``. Open until sealed or revoked."""

    partition: Partition
    segment: LogSegment
    start: int
    region: MemoryRegion
    word: MemoryRegion | None  # shared mode's reservation word
    closed: asyncio.Future[None]
    writers: list[Writer] = field(default_factory=list)
    written: int = 0  # bytes committed so far
    next_order: int = 0
    pending: dict[int, Arrival] = field(default_factory=dict)  # waiting behind a hole
    hole_timer: asyncio.TimerHandle | None = None
    hole_order: int = -1

    @property
    def open(self) -> bool:
        return not self.closed.done()

    @property
    def shared(self) -> bool:
        return self.word is not None


@dataclass(eq=False, slots=True)
class Writer:
    """One client's handle on a grant: its file id, its reply region and, once it wrote,
    its queue pair. Replies go to slot ``replies_sent mod slots``. With acks=-1 a reply
    waits in ``replicating`` until the high watermark passes its write."""

    file_id: int
    grant: Grant
    replies: MemoryRegion  # the broker's send buffer, one slot per reply
    reply_addr: int
    reply_rkey: int
    acks: int
    qp: QueuePair | None = None
    replies_sent: int = 0
    replies_done: int = 0  # their completions polled
    failed: bool = False  # told an error: dropped when that reply completes
    timer: asyncio.TimerHandle | None = None
    replicating: deque[tuple[int, AppendResult]] = field(default_factory=deque)
    replier: asyncio.Task[None] | None = None
    failure: int | None = None  # to tell once the replicating replies went out
    session: Session | None = None  # the session the grant is held on (session_holding)
    unwatch: Callable[[], None] | None = None  # stops watching that session's end

    @property
    def slots(self) -> int:
        return self.replies.length // REPLY.size


@dataclass(slots=True)
class Arrival:
    """A write (``writer``) or a Kafka-protocol produce (``result``) waiting for its turn;
    ``length`` 0 is an overflow marker."""

    length: int
    writer: Writer | None
    result: asyncio.Future[AppendResult | None] | None = None


class RdmaProduce:
    """Grants head segments to RDMA producers and commits what they write."""

    def __init__(
        self, settings: BrokerSettings, replicas: ReplicaManager, metrics: BrokerMetrics
    ) -> None:
        self.settings = settings
        self.replicas = replicas
        self.metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._endpoint = RdmaEndpoint(
            "RDMA produce",
            settings,
            settings.rdma_port,
            QpCaps(max_send_wr=SEND_DEPTH, max_recv_wr=RECV_CREDITS),
            MAX_CONNECTIONS * (RECV_CREDITS + SEND_DEPTH),
            self._accepted,
            self._complete,
        )
        self._pd = self._endpoint.pd
        self._listener = self._endpoint.listener
        self._grants: dict[TopicPartition, Grant] = {}  # open grants
        self._writers: dict[int, Writer] = {}  # by file id
        self._qps: dict[int, QueuePair] = {}
        self._bound: dict[int, Writer] = {}  # qp_num -> the writer its first write named
        self._unbound_timers: dict[int, asyncio.TimerHandle] = {}
        self._next_file_id = 1
        self._tasks: set[asyncio.Task[None]] = set()  # seals started when writers left
        metrics.rdma_grants.labels("exclusive").set_function(lambda: self._open_grants(False))
        metrics.rdma_grants.labels("shared").set_function(lambda: self._open_grants(True))
        metrics.rdma_writers.set_function(lambda: len(self._writers))

    def _open_grants(self, shared: bool) -> int:
        """Open grants of one mode (read on the metrics server's thread: a copy)."""
        return sum(g.shared == shared for g in list(self._grants.values()))

    @property
    def connect_timeout(self) -> float:
        return self.settings.rdma_connect_timeout_ms / 1000

    @property
    def hole_timeout(self) -> float:
        return self.settings.rdma_hole_timeout_ms / 1000

    # Granting ------------------------------------------------------------------------

    async def grant(self, request: RdmaAccessRequest) -> RdmaAccessResponse:
        """Give ``request``'s client write access to the partition's head segment: a new
        grant, or a place among a shared grant's writers; raises KafkaError with the code
        the client gets."""
        if request.mode not in (EXCLUSIVE, SHARED):
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"RDMA produce mode {request.mode}")
        if request.acks not in (1, -1):
            raise KafkaError(ErrorCode.INVALID_REQUIRED_ACKS, f"RDMA produce acks={request.acks}")
        offered = self._listener.conn_info.providers
        if not set(request.providers) & set(offered):
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"no common RDMA provider: client {list(request.providers)}, broker {offered}",
            )
        if (
            not REPLY.size <= request.reply_length <= REPLY.size * MAX_REPLY_SLOTS
            or request.reply_length % REPLY.size
        ):
            raise KafkaError(
                ErrorCode.INVALID_REQUEST, f"reply region of {request.reply_length} bytes"
            )
        while True:
            partition = self.replicas.leader_partition(request.topic, request.partition)
            partition.check_leader()
            held = self._grants.get(partition.tp)
            if held is None:
                grant = self._new_grant(partition, request)
                try:
                    writer = self._add_writer(grant, request)
                except BaseException:
                    self._close(grant, "its first writer could not be added")
                    raise
                break
            if not held.shared or request.mode != SHARED:
                kind = "a shared" if held.shared else "an exclusive"
                raise KafkaError(
                    ErrorCode.POLICY_VIOLATION, f"{partition.tp} is held by {kind} RDMA grant"
                )
            assert held.word is not None
            reserved = held.word.local_fetch_and_add(0, 0) & OFFSET_MASK
            if reserved + request.min_free <= held.region.length:
                grant = held
                writer = self._add_writer(grant, request)
                break
            await self._seal(held)  # full: close it and start the next segment
        segment = grant.segment
        return RdmaAccessResponse(
            ErrorCode.NONE,
            None,
            self._listener.conn_info.encode(),
            writer.file_id,
            grant.region.addr,
            grant.region.rkey,
            grant.region.length,
            segment.base_offset,
            grant.start,
            grant.word.addr if grant.word is not None else 0,
            grant.word.rkey if grant.word is not None else 0,
        )

    def _new_grant(self, partition: Partition, request: RdmaAccessRequest) -> Grant:
        plog = partition.log
        if not plog.config.preallocate:
            raise KafkaError(
                ErrorCode.INVALID_CONFIG, f"{partition.tp}: RDMA produce needs preallocate=true"
            )
        if plog.config.target_compression is not None:
            # RDMA writes land as the producer wrote them; a codec the broker imposes means
            # rewriting every batch, which only a produce over TCP goes through.
            raise KafkaError(
                ErrorCode.INVALID_CONFIG,
                f"{partition.tp}: compression.type={plog.config.compression_type} has the "
                "broker recompress batches: produce over TCP (RDMA produce needs 'producer')",
            )
        largest = min(plog.config.segment_bytes, self.settings.rdma_grant_max_bytes)
        if not 0 < request.min_free <= largest:
            raise KafkaError(
                ErrorCode.RECORD_LIST_TOO_LARGE,
                f"min_free {request.min_free}; a grant holds at most {largest} bytes here",
            )
        head = plog.segments[-1]
        capacity = head.log.capacity
        if capacity is None or capacity - head.size < request.min_free:
            head = plog.roll()
            capacity = head.log.capacity
            if capacity is None:
                raise KafkaError(ErrorCode.INVALID_CONFIG, f"{partition.tp}: head not preallocated")
        start = head.size
        length = min(capacity - start, self.settings.rdma_grant_max_bytes)
        region = self._pd.register_file(
            head.log.path, length, Access.LOCAL_WRITE | Access.REMOTE_WRITE, offset=start
        )
        word = None
        if request.mode == SHARED:
            try:
                # REMOTE_WRITE for the empty writes that mark overflowed reservations.
                word = self._pd.allocate(
                    8, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC
                )
            except BaseException:
                region.deregister()
                raise
        grant = Grant(partition, head, start, region, word, self._loop.create_future())
        self._grants[partition.tp] = grant
        log.info(
            "%s: %s RDMA grant: %d bytes at position %d of segment %d",
            partition.tp,
            "shared" if word is not None else "exclusive",
            length,
            start,
            head.base_offset,
        )
        return grant

    def _add_writer(self, grant: Grant, request: RdmaAccessRequest) -> Writer:
        if len(self._writers) >= FILE_IDS - 1:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "no free RDMA file id")
        replies = self._pd.allocate(request.reply_length, Access.LOCAL_WRITE)
        writer = Writer(
            self._take_file_id(),
            grant,
            replies,
            request.reply_addr,
            request.reply_rkey,
            request.acks,
        )
        writer.timer = self._loop.call_later(self.connect_timeout, self._writer_unused, writer)
        writer.session = session_holding(self.settings)
        if writer.session is not None:
            writer.unwatch = writer.session.on_end(partial(self._session_ended, writer))
        grant.writers.append(writer)
        self._writers[writer.file_id] = writer
        return writer

    def _take_file_id(self) -> int:
        while self._next_file_id in self._writers or self._next_file_id == 0:
            self._next_file_id = (self._next_file_id + 1) % FILE_IDS
        file_id = self._next_file_id
        self._next_file_id = (file_id + 1) % FILE_IDS
        return file_id

    def leadership_changed(self, partition: Partition) -> None:
        grant = self._grants.get(partition.tp)
        if grant is not None and (not partition.is_leader or grant.partition is not partition):
            self._revoke(grant, "leadership moved", ErrorCode.NOT_LEADER_OR_FOLLOWER)

    # Authority ---------------------------------------------------------------------------

    def recheck(self, authorizer: Authorizer | None) -> None:
        """Revoke every open grant one of whose writers lost its authority: WRITE on the
        topic by ``authorizer`` (the ACLs just taken; None when ACLs are not checked), or
        the credentials of its SASL login. A shared grant goes whole, since its writers
        share one region and one cut off must not write into the others' reservations:
        they hear ABORTED and ask again, it hears why."""
        for grant in list(self._grants.values()):
            lost: dict[Writer | None, int | None] = {}
            reason = ""
            for writer in grant.writers:
                if writer.session is None:
                    continue
                topics = (grant.partition.tp.topic,)
                error = authority_lost(writer.session, authorizer, Operation.WRITE, topics)
                if error is not None:
                    lost[writer] = error.code
                    reason = reason or f"{writer.session.principal}: {error}"
            if lost:
                self._revoke(grant, reason, ABORTED, lost)

    def _session_ended(self, writer: Writer, why: str) -> None:
        """A grant lasts no longer than the session of any of its writers (not counted as
        a revocation: a producer closing ends its connection too)."""
        if self._writers.get(writer.file_id) is writer and writer.grant.open:
            reason = f"the session of writer {writer.file_id} ended: {why}"
            self._revoke(writer.grant, reason, ABORTED, {writer: None}, fault=False)

    # Kafka-protocol produces -------------------------------------------------------------

    async def append(self, partition: Partition, records: Buffer, acks: int) -> AppendResult:
        """A Kafka-protocol produce: through the reservation word while a shared grant is
        open, refused while an exclusive one is, an ordinary append otherwise."""
        while (grant := self._grants.get(partition.tp)) is not None:
            if grant.word is None:
                raise KafkaError(
                    ErrorCode.POLICY_VIOLATION,
                    f"{partition.tp} is held by an exclusive RDMA writer",
                )
            partition.check_appendable(acks)
            duplicate = partition.log.find_duplicate(records)  # validates, too
            if duplicate is not None:
                return duplicate
            size = len(records)
            reserved = grant.word.local_fetch_and_add(0, ORDER_ONE | size)
            order, offset = reserved >> 48, reserved & OFFSET_MASK
            result: asyncio.Future[AppendResult | None] = self._loop.create_future()
            if offset + size > grant.region.length:
                self._arrive(grant, order, Arrival(0, None, result))  # seals the grant
            else:
                grant.region.buf[offset : offset + size] = records
                self._arrive(grant, order, Arrival(size, None, result))
            appended = await result
            if appended is not None:
                return appended
            # The grant ended before this produce committed: its bytes are gone; go again.
        return partition.append_as_leader(records, acks)

    # On the loop -----------------------------------------------------------------------

    def _accepted(self, qp: QueuePair) -> None:
        self._qps[qp.qp_num] = qp
        self._unbound_timers[qp.qp_num] = self._loop.call_later(
            self.connect_timeout, self._drop_qp, qp.qp_num, "no write in time"
        )

    def _complete(self, wc: WorkCompletion) -> None:
        qp = self._qps.get(wc.qp_num)
        if qp is None:
            return  # a queue pair already dropped: its flushed requests
        writer = self._bound.get(wc.qp_num)
        if wc.opcode is not Opcode.RECV_RDMA_WITH_IMM:  # one of our replies
            if writer is not None:
                writer.replies_done += 1
            if not wc.ok or writer is None:
                self._drop_qp(wc.qp_num, f"reply completed with {wc.status.name}")
            elif (
                writer.failed
                and writer.replier is None
                and writer.replies_done == writer.replies_sent
            ):
                self._drop_qp(wc.qp_num, "told its error")
            return
        if wc.status is WcStatus.WR_FLUSH_ERR:  # its queue pair closed: the writer left
            self._drop_qp(wc.qp_num, "its writer left", fault=False)
            return
        if not wc.ok:
            self._drop_qp(wc.qp_num, f"queue pair failed: {wc.status.name}")
            return
        imm = wc.imm_data or 0
        file_id, order = imm >> 16, imm & (ORDERS - 1)
        if writer is None:
            writer = self._writers.get(file_id)
            if writer is None or writer.qp is not None:
                self._drop_qp(wc.qp_num, f"write names file {file_id}, not granted to it")
                return
            self._bind(writer, qp)
        if writer.failed:
            return
        try:
            qp.post_recv(wc.wr_id)
        except RdmaError as error:
            self._drop_qp(wc.qp_num, f"receive not reposted: {error}")
            return
        grant = writer.grant
        if file_id != writer.file_id:
            self._revoke(
                grant,
                f"immediate names file {file_id}, the writer holds {writer.file_id}",
                ABORTED,
                {writer: ErrorCode.INVALID_REQUEST},
            )
        elif grant.open:
            self._arrive(grant, order, Arrival(wc.byte_len, writer))
        elif wc.byte_len == 0:
            self._reply(writer, order, ErrorCode.NONE, 0, -1)  # overflowed a sealed grant
        else:
            self._fail_writer(writer, ErrorCode.INVALID_REQUEST, "a write after the grant ended")

    def _bind(self, writer: Writer, qp: QueuePair) -> None:
        writer.qp = qp
        self._bound[qp.qp_num] = writer
        timer = self._unbound_timers.pop(qp.qp_num, None)
        if timer is not None:
            timer.cancel()
        if writer.timer is not None:
            writer.timer.cancel()
            writer.timer = None

    # Committing in order ---------------------------------------------------------------

    def _arrive(self, grant: Grant, order: int, arrival: Arrival) -> None:
        """Queue ``arrival`` as reservation ``order`` and commit whatever is now next."""
        ahead = (order - grant.next_order) % ORDERS
        if (not grant.shared and ahead) or ahead >= MAX_AHEAD or order in grant.pending:
            self._revoke(
                grant,
                f"order {order} where {grant.next_order} is next",
                ABORTED,
                {arrival.writer: ErrorCode.INVALID_REQUEST},
            )
            return
        grant.pending[order] = arrival
        while grant.open and (next_arrival := grant.pending.pop(grant.next_order, None)):
            current = grant.next_order
            grant.next_order = (current + 1) % ORDERS
            self._process(grant, current, next_arrival)
        if grant.open:
            self._watch_for_holes(grant)

    def _process(self, grant: Grant, order: int, arrival: Arrival) -> None:
        if arrival.length == 0:
            if not grant.shared:
                self._revoke(
                    grant, "an empty write", ABORTED, {arrival.writer: ErrorCode.INVALID_REQUEST}
                )
                return
            self._answer(arrival, order, None)
            self._close(grant, "sealed: a reservation overflowed the region")
            return
        try:
            if arrival.writer is not None and arrival.writer.acks == -1:
                grant.partition.check_appendable(-1)
            result = self._commit(grant, arrival.length)
        except Exception as error:
            if arrival.result is not None and not arrival.result.done():
                arrival.result.set_exception(error)  # the produce's own bytes were bad
            self._revoke(grant, str(error), ABORTED, {arrival.writer: error_code_for(error)})
            return
        self._answer(arrival, order, result)

    def _commit(self, grant: Grant, length: int) -> AppendResult:
        """Commit the ``length`` bytes written right after what is committed."""
        partition = grant.partition
        partition.check_leader()
        plog = partition.log
        position = grant.start + grant.written
        if not 0 < length <= grant.region.length - grant.written:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"write of {length} bytes overruns")
        if plog.segments[-1] is not grant.segment or grant.segment.size != position:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "the head segment moved under the grant")
        reservation = plog.reserve(length)
        if reservation.segment is not grant.segment or reservation.position != position:
            plog.abort(reservation)
            raise KafkaError(ErrorCode.INVALID_REQUEST, "the head segment rolled under the grant")
        result = plog.commit(reservation, leader_epoch=partition.leader_epoch)
        if result.duplicate:
            raise KafkaError(ErrorCode.DUPLICATE_SEQUENCE_NUMBER, "a batch already written")
        grant.written += length
        partition.appended()
        return result

    def _answer(self, arrival: Arrival, order: int, result: AppendResult | None) -> None:
        if arrival.writer is not None:
            if result is None:
                self._reply(arrival.writer, order, ErrorCode.NONE, 0, -1)
            else:
                writer = arrival.writer
                topic = writer.grant.partition.tp.topic
                self.metrics.produced(topic, result.records, result.size)
                self.metrics.rdma_writes.labels(topic).inc()
                if writer.acks == -1:
                    writer.replicating.append((order, result))
                    if writer.replier is None:
                        writer.replier = self._loop.create_task(self._reply_replicated(writer))
                else:
                    self._reply(writer, order, ErrorCode.NONE, result.records, result.first_offset)
        elif arrival.result is not None and not arrival.result.done():
            arrival.result.set_result(result)

    def _watch_for_holes(self, grant: Grant) -> None:
        """Arm the hole timer while writes wait behind the next order; re-arm it when
        that order moved."""
        if not grant.pending:
            if grant.hole_timer is not None:
                grant.hole_timer.cancel()
                grant.hole_timer = None
            return
        if grant.hole_timer is not None and grant.hole_order == grant.next_order:
            return
        if grant.hole_timer is not None:
            grant.hole_timer.cancel()
        grant.hole_order = grant.next_order
        grant.hole_timer = self._loop.call_later(
            self.hole_timeout,
            self._revoke,
            grant,
            f"hole: order {grant.next_order} not written in time",
            ABORTED,
        )

    async def _seal(self, grant: Grant) -> None:
        """Close a shared grant from the broker's side: reserve past its end (a marker of
        our own) and wait until the reservations before it committed or timed out."""
        if grant.open:
            assert grant.word is not None
            reserved = grant.word.local_fetch_and_add(0, ORDER_ONE | grant.region.length + 1)
            self._arrive(grant, reserved >> 48, Arrival(0, None))
        try:
            await asyncio.wait_for(asyncio.shield(grant.closed), 2 * self.hole_timeout + 1)
        except TimeoutError:
            self._revoke(grant, "not sealed in time", ABORTED)

    # Replies ---------------------------------------------------------------------------

    def _reply(self, writer: Writer, order: int, code: int, records: int, base: int) -> None:
        """Write a reply into the writer's next slot (WRITE_WITH_IMM, immediate = order)."""
        qp = writer.qp
        assert qp is not None
        slot = writer.replies_sent % writer.slots * REPLY.size
        writer.replies_sent += 1
        REPLY.pack_into(writer.replies.buf, slot, order, code, records, base)
        try:
            qp.post_write_with_imm(
                order,
                writer.replies.sge(slot, REPLY.size),
                writer.reply_addr + slot,
                writer.reply_rkey,
                order,
            )
        except RdmaError as error:
            self._drop_qp(qp.qp_num, f"reply not posted: {error}")

    async def _reply_replicated(self, writer: Writer) -> None:
        """acks=-1: answer the writer's committed writes, in order, as the high watermark
        passes each; then the failure it is owed, if any."""
        partition = writer.grant.partition
        try:
            while writer.replicating:
                order, result = writer.replicating[0]
                try:
                    await partition.wait_replicated(result.last_offset, REPLICATION_TIMEOUT)
                except KafkaError as error:
                    writer.replicating.clear()
                    writer.failure = None
                    self._fail_writer(writer, error.code, str(error))
                    return
                writer.replicating.popleft()
                if writer.qp is not None:
                    self._reply(writer, order, ErrorCode.NONE, result.records, result.first_offset)
            if writer.failure is not None:
                self._reply(writer, writer.grant.next_order, writer.failure, 0, -1)
        finally:
            writer.replier = None

    def _fail_writer(self, writer: Writer, code: int, reason: str) -> None:
        """Tell a writer ``code`` (after the replies to its committed writes, which it must
        not write again) and drop its queue pair once that reply completed."""
        if writer.failed:
            return
        log.info("RDMA writer %d: %s", writer.file_id, reason)
        writer.failed = True
        if writer.qp is None:
            self._writer_gone(writer)
        elif writer.replier is not None:
            writer.failure = code
        else:
            self._reply(writer, writer.grant.next_order, code, 0, -1)

    # Ending grants ---------------------------------------------------------------------

    def _revoke(
        self,
        grant: Grant,
        reason: str,
        code: int | None,
        culprits: Mapping[Writer | None, int | None] | None = None,
        fault: bool = True,
    ) -> None:
        """End ``grant`` for a fault: its writers hear ``code`` (``culprits``, whose write
        or lost authority caused it, hear their own code) and stop; produces waiting in it
        go again.
        Without `fault` (an exclusive grant whose writer just left, a writer's session
        that ended) the same, but neither
        counted as a revocation nor logged as a warning."""
        if not grant.open:
            return
        if fault:
            self.metrics.rdma_revocations.inc()
        why = f"revoked: {reason}" if fault else f"ended: {reason}"
        self._close(grant, why, revoked=True, warn=fault)
        for writer in list(grant.writers):
            told = culprits[writer] if culprits and writer in culprits else code
            if told is None or told == ErrorCode.NONE:
                if writer.qp is not None:
                    self._drop_qp(writer.qp.qp_num, reason)
                else:
                    self._writer_gone(writer)
            else:
                self._fail_writer(writer, told, reason)

    def _close(self, grant: Grant, why: str, revoked: bool = False, warn: bool = False) -> None:
        """No write lands in ``grant`` after this: deregister it, zero what was not
        committed, and let produces waiting in it go again (a sealed grant's writers stay
        connected to hear about their overflowed reservations; a revoked one's do not).
        Logged as a warning with `warn`."""
        grant.closed.set_result(None)
        if self._grants.get(grant.partition.tp) is grant:
            del self._grants[grant.partition.tp]
        if grant.hole_timer is not None:
            grant.hole_timer.cancel()
        grant.region.deregister()
        if grant.word is not None:
            # Every later reservation overflows; the word stays reachable until the last
            # writer left, so theirs complete and they can mark them.
            grant.word.local_fetch_and_add(0, grant.region.length + 1)
            if not grant.writers:
                grant.word.deregister()
        self._zero_uncommitted(grant)
        pending, grant.pending = grant.pending, {}
        for order, arrival in pending.items():
            if arrival.writer is None or (arrival.length == 0 and not revoked):
                self._answer(arrival, order, None)  # produces go again; overflows are fine
            elif not revoked:
                self._fail_writer(arrival.writer, ErrorCode.INVALID_REQUEST, "wrote past a seal")
        (log.warning if warn else log.info)(
            "%s: RDMA grant at position %d of segment %d %s (%d bytes committed)",
            grant.partition.tp,
            grant.start,
            grant.segment.base_offset,
            why,
            grant.written,
        )

    def _zero_uncommitted(self, grant: Grant) -> None:
        """Zero what writers may have put beyond the committed end, so neither a reader
        nor recovery ever finds a batch there (as an aborted reservation does)."""
        segment = grant.segment
        position = grant.start + grant.written
        end = grant.start + grant.region.length
        if segment.log.capacity is None or segment.size != position or end <= position:
            return  # rolled and trimmed (nothing beyond its end) or written past since
        view = segment.log.region(position, end - position)
        try:
            view[:] = bytes(end - position)
        finally:
            view.release()

    def _writer_unused(self, writer: Writer) -> None:
        writer.timer = None
        if writer.qp is None:
            self._writer_gone(writer, "no queue pair used it in time")

    def _writer_gone(self, writer: Writer, reason: str = "", fault: bool = True) -> None:
        """Forget a writer; an exclusive grant ends with it (revoked when `fault`: a bad
        write, no queue pair in time; else closed, as when the writer just went away), a
        shared one is sealed once its last writer left (a dead writer's reservation is then
        a hole)."""
        if self._writers.get(writer.file_id) is not writer:
            return
        del self._writers[writer.file_id]
        if writer.unwatch is not None:
            writer.unwatch()
        if writer.timer is not None:
            writer.timer.cancel()
        if writer.replier is not None:
            writer.replier.cancel()
        writer.replies.deregister()
        grant = writer.grant
        grant.writers.remove(writer)
        if not grant.open:
            if not grant.writers and grant.word is not None:
                grant.word.deregister()
            return
        if not reason:
            return
        if not grant.shared:
            self._revoke(grant, reason, None, fault=fault)
        elif not grant.writers:
            task = self._loop.create_task(self._seal(grant))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _drop_qp(self, qp_num: int, reason: str, fault: bool = True) -> None:
        qp = self._qps.pop(qp_num, None)
        timer = self._unbound_timers.pop(qp_num, None)
        if timer is not None:
            timer.cancel()
        writer = self._bound.pop(qp_num, None)
        if writer is not None:
            self._writer_gone(writer, reason, fault)
        if qp is not None:
            qp.close()

    async def close(self) -> None:
        """Revoke every grant, stop the threads and close the provider."""
        for grant in list(self._grants.values()):
            self._revoke(grant, "broker stopping", None)
        for qp_num in list(self._qps):
            self._drop_qp(qp_num, "broker stopping")
        for writer in list(self._writers.values()):
            self._writer_gone(writer)
        for task in list(self._tasks):
            task.cancel()
        await self._endpoint.close()
