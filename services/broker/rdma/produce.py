"""RDMA produce, exclusive mode (KafkaDirect §4.2.2): a client granted a partition's head
segment writes record batches straight into it with WRITE_WITH_IMM; the broker commits
them strictly in order through the log's reserve/commit path and writes a reply back.

Threads: one thread accepts queue pairs, one polls the completion queue; both hand what
they get to the event loop (call_soon_threadsafe), which owns every grant and is the only
thread that posts. The poller waits for the loop to take a batch before it polls more, so
at most ``HANDOFF_BATCHES`` batches are ever queued on the loop.

A grant is revoked, its memory region deregistered (later writes fail at the provider) and
its uncommitted bytes zeroed, when: its queue pair fails or disconnects, an immediate names
another file or an order out of sequence, a write overruns the grant, a batch fails
validation, the partition's leadership moves, or no queue pair uses it in time.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
from dataclasses import dataclass, field

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.protocol.rdma_access import (
    EXCLUSIVE,
    MAX_IN_FLIGHT,
    RdmaAccessRequest,
    RdmaAccessResponse,
)
from directlog.rdma import (
    Access,
    Context,
    MemoryRegion,
    Opcode,
    QpCaps,
    QueuePair,
    RdmaError,
    WorkCompletion,
    open_context,
)
from directlog.topics import TopicPartition
from services.broker.error_codes import error_code_for
from services.broker.metrics import BrokerMetrics
from services.broker.partition import Partition
from services.broker.replica_manager import ReplicaManager
from services.broker.settings import BrokerSettings
from services.broker.storage.segment import LogSegment

log = logging.getLogger(__name__)

REPLY = struct.Struct(">Hhiq")  # order, error code, record count, base offset
MAX_REPLY_SLOTS = 1024
RECV_CREDITS = MAX_IN_FLIGHT  # receives posted per queue pair
SEND_DEPTH = 64  # replies not yet completed per queue pair
MAX_CONNECTIONS = 64  # queue pairs the completion queue has room for
HANDOFF_BATCHES = 4
POLL_BATCH = 64
THREAD_WAKE_SECONDS = 0.2  # how often the threads look at the stop flag
FILE_IDS = 1 << 16
ORDERS = 1 << 16


@dataclass(eq=False, slots=True)
class Grant:
    """Exclusive write access to ``region``: file position ``start`` onwards of ``segment``."""

    file_id: int
    partition: Partition
    segment: LogSegment
    start: int
    region: MemoryRegion
    replies: MemoryRegion  # the broker's send buffer, one slot per reply
    reply_addr: int
    reply_rkey: int
    written: int = 0  # bytes committed so far
    next_order: int = 0
    qp: QueuePair | None = None
    revoked: bool = False
    timer: asyncio.TimerHandle | None = field(default=None)

    @property
    def slots(self) -> int:
        return self.replies.length // REPLY.size


class RdmaProduce:
    """Grants head segments to RDMA producers and commits what they write."""

    def __init__(
        self, settings: BrokerSettings, replicas: ReplicaManager, metrics: BrokerMetrics
    ) -> None:
        self.settings = settings
        self.replicas = replicas
        self.metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._context: Context = open_context(settings.rdma_provider)
        self._pd = self._context.alloc_pd()
        self._cq = self._context.create_cq(MAX_CONNECTIONS * (RECV_CREDITS + SEND_DEPTH))
        host = settings.rdma_host or settings.host
        self._listener = self._pd.listen(
            self._cq,
            QpCaps(max_send_wr=SEND_DEPTH, max_recv_wr=RECV_CREDITS),
            host=host,
            port=settings.rdma_port,
            advertised_host=settings.advertised_host or host,
        )
        self._grants: dict[TopicPartition, Grant] = {}
        self._by_file: dict[int, Grant] = {}
        self._qps: dict[int, QueuePair] = {}
        self._bound: dict[int, Grant] = {}  # qp_num -> the grant its first write named
        self._unbound_timers: dict[int, asyncio.TimerHandle] = {}
        self._next_file_id = 1
        self._stop = threading.Event()
        self._handoff = threading.Semaphore(HANDOFF_BATCHES)
        self._threads = [
            threading.Thread(target=self._accept_loop, name="rdma-accept", daemon=True),
            threading.Thread(target=self._poll_loop, name="rdma-poll", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        log.info("RDMA produce listening: %s", self._listener.conn_info.encode())

    @property
    def connect_timeout(self) -> float:
        return self.settings.rdma_connect_timeout_ms / 1000

    # Granting ------------------------------------------------------------------------

    def grant(self, request: RdmaAccessRequest) -> RdmaAccessResponse:
        """Register the unwritten part of the partition's head segment for ``request``'s
        client; raises KafkaError with the code the client gets."""
        if request.mode != EXCLUSIVE:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"RDMA produce mode {request.mode}")
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
        partition = self.replicas.leader_partition(request.topic, request.partition)
        partition.check_leader()
        if partition.tp in self._grants:
            raise KafkaError(
                ErrorCode.POLICY_VIOLATION, f"{partition.tp} is held by an exclusive RDMA writer"
            )
        if len(self._by_file) >= FILE_IDS - 1:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "no free RDMA file id")
        plog = partition.log
        if not plog.config.preallocate:
            raise KafkaError(
                ErrorCode.INVALID_CONFIG, f"{partition.tp}: RDMA produce needs preallocate=true"
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
        try:
            replies = self._pd.allocate(request.reply_length, Access.LOCAL_WRITE)
        except BaseException:
            region.deregister()
            raise
        grant = Grant(
            self._take_file_id(),
            partition,
            head,
            start,
            region,
            replies,
            request.reply_addr,
            request.reply_rkey,
        )
        grant.timer = self._loop.call_later(
            self.connect_timeout, self._revoke, grant, "no queue pair used it in time", None
        )
        self._grants[partition.tp] = grant
        self._by_file[grant.file_id] = grant
        log.info(
            "%s: RDMA grant %d: %d bytes at position %d of segment %d",
            partition.tp,
            grant.file_id,
            length,
            start,
            head.base_offset,
        )
        return RdmaAccessResponse(
            ErrorCode.NONE,
            None,
            self._listener.conn_info.encode(),
            grant.file_id,
            region.addr,
            region.rkey,
            region.length,
            head.base_offset,
            start,
        )

    def check_produce(self, topic: str, partition: int) -> None:
        """Kafka-protocol produces may not write a partition an RDMA writer holds."""
        if TopicPartition(topic, partition) in self._grants:
            raise KafkaError(
                ErrorCode.POLICY_VIOLATION,
                f"{topic}-{partition} is held by an exclusive RDMA writer",
            )

    def leadership_changed(self, partition: Partition) -> None:
        grant = self._grants.get(partition.tp)
        if grant is not None and (not partition.is_leader or grant.partition is not partition):
            self._revoke(grant, "leadership moved", ErrorCode.NOT_LEADER_OR_FOLLOWER)

    def _take_file_id(self) -> int:
        while self._next_file_id in self._by_file or self._next_file_id == 0:
            self._next_file_id = (self._next_file_id + 1) % FILE_IDS
        file_id = self._next_file_id
        self._next_file_id = (file_id + 1) % FILE_IDS
        return file_id

    # Threads -------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                qp = self._listener.accept(timeout=THREAD_WAKE_SECONDS)
            except TimeoutError:
                continue
            except RdmaError as error:
                if not self._stop.is_set():
                    log.warning("RDMA accept failed: %s", error)
                continue
            self._loop.call_soon_threadsafe(self._accepted, qp)

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            completions = self._cq.poll(POLL_BATCH, timeout=THREAD_WAKE_SECONDS)
            if not completions:
                continue
            while not self._handoff.acquire(timeout=THREAD_WAKE_SECONDS):
                if self._stop.is_set():
                    return
            try:
                self._loop.call_soon_threadsafe(self._completed, completions)
            except RuntimeError:  # the loop closed under us: shutting down
                return

    # On the loop -----------------------------------------------------------------------

    def _accepted(self, qp: QueuePair) -> None:
        if self._stop.is_set():
            qp.close()
            return
        try:
            for credit in range(RECV_CREDITS):
                qp.post_recv(credit)
        except RdmaError as error:
            log.warning("RDMA queue pair %d: %s", qp.qp_num, error)
            qp.close()
            return
        self._qps[qp.qp_num] = qp
        self._unbound_timers[qp.qp_num] = self._loop.call_later(
            self.connect_timeout, self._drop_qp, qp.qp_num, "no write in time"
        )

    def _completed(self, completions: list[WorkCompletion]) -> None:
        try:
            for completion in completions:
                self._complete(completion)
        finally:
            self._handoff.release()

    def _complete(self, wc: WorkCompletion) -> None:
        qp = self._qps.get(wc.qp_num)
        if qp is None:
            return  # a queue pair already dropped: its flushed requests
        grant = self._bound.get(wc.qp_num)
        if wc.opcode is not Opcode.RECV_RDMA_WITH_IMM:  # one of our replies
            if not wc.ok or grant is None or grant.revoked:
                self._drop_qp(wc.qp_num, f"reply completed with {wc.status.name}")
            return
        if not wc.ok:
            self._drop_qp(wc.qp_num, f"queue pair failed: {wc.status.name}")
            return
        imm = wc.imm_data or 0
        file_id, order = imm >> 16, imm & (ORDERS - 1)
        if grant is None:
            grant = self._by_file.get(file_id)
            if grant is None or grant.qp is not None:
                self._drop_qp(wc.qp_num, f"write names file {file_id}, not granted to it")
                return
            self._bind(grant, qp)
        if grant.revoked:
            return
        if file_id != grant.file_id or order != grant.next_order:
            self._revoke(
                grant,
                f"immediate file {file_id} order {order}, expected file {grant.file_id} "
                f"order {grant.next_order}",
                ErrorCode.INVALID_REQUEST,
            )
            return
        try:
            qp.post_recv(wc.wr_id)
            self._commit(grant, order, wc.byte_len)
        except Exception as error:
            self._revoke(grant, str(error), error_code_for(error))

    def _bind(self, grant: Grant, qp: QueuePair) -> None:
        grant.qp = qp
        self._bound[qp.qp_num] = grant
        timer = self._unbound_timers.pop(qp.qp_num, None)
        if timer is not None:
            timer.cancel()
        if grant.timer is not None:
            grant.timer.cancel()
            grant.timer = None

    def _commit(self, grant: Grant, order: int, length: int) -> None:
        """Commit the ``length`` bytes the client wrote right after what is committed."""
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
        grant.next_order = (order + 1) % ORDERS
        partition.appended()
        self.metrics.produced(partition.tp.topic, result.records, result.size)
        self._reply(grant, order, ErrorCode.NONE, result.records, result.first_offset)

    def _reply(self, grant: Grant, order: int, code: int, records: int, base_offset: int) -> None:
        """Write the reply into the client's slot ``order % slots`` (WRITE_WITH_IMM, the
        immediate is the order)."""
        assert grant.qp is not None
        slot = order % grant.slots * REPLY.size
        REPLY.pack_into(grant.replies.buf, slot, order, code, records, base_offset)
        grant.qp.post_write_with_imm(
            order,
            grant.replies.sge(slot, REPLY.size),
            grant.reply_addr + slot,
            grant.reply_rkey,
            order,
        )

    def _revoke(self, grant: Grant, reason: str, code: int | None) -> None:
        """End ``grant``: no write lands after this, uncommitted bytes are zeroed, and the
        client is told ``code`` (if given and it is connected)."""
        if grant.revoked:
            return
        grant.revoked = True
        if grant.timer is not None:
            grant.timer.cancel()
        self._grants.pop(grant.partition.tp, None)
        self._by_file.pop(grant.file_id, None)
        grant.region.deregister()
        self._zero_uncommitted(grant)
        log.warning("%s: RDMA grant %d revoked: %s", grant.partition.tp, grant.file_id, reason)
        qp = grant.qp
        if qp is None:
            grant.replies.deregister()
            return
        if code is not None and code != ErrorCode.NONE:
            try:
                self._reply(grant, grant.next_order, code, 0, -1)
                return  # the queue pair is dropped when the reply completes
            except RdmaError as error:
                log.info("RDMA grant %d: error reply not sent: %s", grant.file_id, error)
        self._drop_qp(qp.qp_num, reason)

    def _zero_uncommitted(self, grant: Grant) -> None:
        """Zero what the client may have written beyond the committed end, so neither a
        reader nor recovery ever finds a batch there (as an aborted reservation does)."""
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

    def _drop_qp(self, qp_num: int, reason: str) -> None:
        qp = self._qps.pop(qp_num, None)
        timer = self._unbound_timers.pop(qp_num, None)
        if timer is not None:
            timer.cancel()
        grant = self._bound.pop(qp_num, None)
        if grant is not None:
            self._revoke(grant, reason, None)
            grant.replies.deregister()
        if qp is not None:
            qp.close()

    async def close(self) -> None:
        """Revoke every grant, stop the threads and close the provider."""
        for grant in list(self._grants.values()):
            self._revoke(grant, "broker stopping", None)
        for qp_num in list(self._qps):
            self._drop_qp(qp_num, "broker stopping")
        self._stop.set()
        for thread in self._threads:
            await asyncio.to_thread(thread.join)
        self._listener.close()
        self._context.close()
