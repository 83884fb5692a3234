"""The follower's end of RDMA push replication (KafkaDirect §4.3.2): it grants its leader
exclusive write access to its own preallocated head segment, commits each push strictly in
order as a follower append, and answers each with its log end offset.

A partition is granted only while its pull fetcher has truncated in the current leader
epoch and stops pulling it (ReplicaFetcher.start_push), so the pushed bytes continue a log
that is a prefix of the leader's. Each write consumes one of the receives posted on the
queue pair (the leader's credits) and is answered by exactly one reply write, after which
the receive is posted again.

A channel ends, its region deregistered, its uncommitted bytes zeroed, the leader's queue
pair disconnected and the partition pulled again from its log end, when: its queue pair
fails or disconnects; an immediate names another channel or an order out of sequence; a
push overruns the grant, does not continue the log or fails validation; the partition's
leader or epoch changes; nothing arrives for ``rdma_replication_timeout_ms`` (the leader's
heartbeats keep it open); or the leader's authority ends, as every RDMA grant's does
(docs/security.md, "RDMA grants"): the principal of the connection that asked for the
grant may no longer CLUSTER_ACTION the cluster, the credentials of its SASL login were
deleted, or that connection's session ended (the leader keeps it open while it pushes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.protocol.rdma_replica import (
    HIGH_WATERMARK,
    KIND_RECORDS,
    MAX_CHANNELS,
    MAX_CREDITS,
    OPEN,
    ORDERS,
    REPLY,
    RdmaReplicaRequest,
    RdmaReplicaResponse,
    parse_immediate,
)
from directlog.rdma import (
    Access,
    Listener,
    MemoryRegion,
    Opcode,
    ProtectionDomain,
    QueuePair,
    WorkCompletion,
)
from directlog.security.acl import CLUSTER_NAME, Operation, ResourceType
from directlog.topics import TopicPartition
from services.broker.authentication import Session
from services.broker.authorizer import Authorizer
from services.broker.error_codes import error_code_for
from services.broker.partition import Partition
from services.broker.rdma.produce import authority_lost, session_holding
from services.broker.replica_fetcher import FollowState, ReplicaFetcher
from services.broker.replica_manager import ReplicaManager
from services.broker.settings import BrokerSettings
from services.broker.storage.segment import LogSegment

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class FollowerChannel:
    """One partition pushed by one leader epoch: the current grant and the order due next."""

    channel_id: int
    partition: Partition
    leader_id: int
    leader_epoch: int
    fetcher: ReplicaFetcher
    state: FollowState  # the fetcher's, marked pushed while this channel lives
    segment: LogSegment
    start: int  # file position of the grant's first byte
    region: MemoryRegion
    hw: MemoryRegion  # the word the leader writes its high watermark into
    replies: MemoryRegion  # reply slots, sent from here
    reply_addr: int
    reply_rkey: int
    credits: int
    written: int = 0  # bytes of the grant committed
    next_order: int = 0
    qp: QueuePair | None = None
    closed: bool = False
    timer: asyncio.TimerHandle | None = None
    session: Session | None = None  # the leader's session the grant is held on
    unwatch: Callable[[], None] | None = None  # stops watching that session's end


class ReplicaFollower:
    """Grants head segments to leaders that push, and commits what they write."""

    def __init__(
        self,
        settings: BrokerSettings,
        replicas: ReplicaManager,
        pd: ProtectionDomain,
        listener: Listener,
    ) -> None:
        self.settings = settings
        self.replicas = replicas
        self._pd = pd
        self._listener = listener
        self._loop = asyncio.get_running_loop()
        self._channels: dict[TopicPartition, FollowerChannel] = {}
        self._by_id: dict[int, FollowerChannel] = {}
        self._qps: dict[int, QueuePair] = {}
        self._bound: dict[int, FollowerChannel] = {}
        self._next_id = 1

    @property
    def timeout(self) -> float:
        return self.settings.rdma_replication_timeout_ms / 1000

    def owns(self, qp_num: int) -> bool:
        return qp_num in self._qps

    def pushed(self, tp: TopicPartition) -> bool:
        return tp in self._channels

    # Granting ------------------------------------------------------------------------

    def grant(self, request: RdmaReplicaRequest) -> RdmaReplicaResponse:
        """Open a channel or renew its grant; raises KafkaError with the code the leader
        gets (it keeps the partition on pull replication then). The grant is held on the
        asking connection's session (session_holding): it ends with it."""
        tp = TopicPartition(request.topic, request.partition)
        holder = session_holding(self.settings)
        if request.channel_id == OPEN:
            channel = self._open(tp, request)
        else:
            found = self._by_id.get(request.channel_id)
            if found is None or found.partition.tp != tp:
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST, f"{tp}: no channel {request.channel_id}"
                )
            channel = found
            try:
                self._check_leader(channel.partition, request.leader_id, request.leader_epoch)
                self._renew(channel, request)
            except Exception as error:
                self._close(channel, f"grant renewal refused: {error}")
                raise
        self._hold(channel, holder)
        plog = channel.partition.log
        return RdmaReplicaResponse(
            ErrorCode.NONE,
            None,
            self._listener.conn_info.encode(),
            channel.channel_id,
            channel.credits,
            plog.log_end_offset,
            plog.leader_epochs.latest_epoch,
            channel.region.addr,
            channel.region.rkey,
            channel.region.length,
            channel.segment.base_offset,
            channel.start,
            channel.hw.addr,
            channel.hw.rkey,
        )

    def _open(self, tp: TopicPartition, request: RdmaReplicaRequest) -> FollowerChannel:
        partition = self.replicas.partitions.get(tp)
        if partition is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no replica of {tp} here")
        self._check_leader(partition, request.leader_id, request.leader_epoch)
        if not partition.config.preallocate:
            raise KafkaError(ErrorCode.INVALID_CONFIG, f"{tp}: push needs preallocate=true")
        if not set(request.providers) & set(self._listener.conn_info.providers):
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"no common RDMA provider: leader {list(request.providers)}, "
                f"follower {self._listener.conn_info.providers}",
            )
        slots, rest = divmod(request.reply_length, REPLY.size)
        if rest or not 1 <= slots <= MAX_CREDITS:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST, f"reply region of {request.reply_length} bytes"
            )
        if len(self._by_id) >= MAX_CHANNELS - 1:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "no free channel id")
        old = self._channels.get(tp)
        if old is not None:
            self._close(old, "the leader opens a new channel")
        fetcher = self.replicas.fetchers.get(request.leader_id)
        state = None if fetcher is None else fetcher.start_push(tp, request.leader_epoch)
        if fetcher is None or state is None:
            raise KafkaError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{tp}: not following in sync yet (truncating)"
            )
        try:
            segment, start, region = self._register_head(partition, request.min_free)
        except BaseException:
            fetcher.end_push(state)
            raise
        regions = [region]
        try:
            hw = self._pd.allocate(HIGH_WATERMARK.size, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
            regions.append(hw)
            credits = min(slots, self.settings.rdma_replication_credits)
            replies = self._pd.allocate(credits * REPLY.size, Access.LOCAL_WRITE)
        except BaseException:
            for taken in regions:
                taken.deregister()
            fetcher.end_push(state)
            raise
        HIGH_WATERMARK.pack_into(hw.buf, 0, partition.log.high_watermark)
        channel = FollowerChannel(
            self._take_id(),
            partition,
            request.leader_id,
            request.leader_epoch,
            fetcher,
            state,
            segment,
            start,
            region,
            hw,
            replies,
            request.reply_addr,
            request.reply_rkey,
            credits,
        )
        self._channels[tp] = channel
        self._by_id[channel.channel_id] = channel
        self._arm(channel)
        log.info(
            "%s: pushed by broker %d (channel %d) from offset %d, position %d of segment %d",
            tp,
            channel.leader_id,
            channel.channel_id,
            partition.log.log_end_offset,
            start,
            segment.base_offset,
        )
        return channel

    def _renew(self, channel: FollowerChannel, request: RdmaReplicaRequest) -> None:
        """The next grant, once the leader has every push of this one answered."""
        plog = channel.partition.log
        if request.log_end_offset != plog.log_end_offset:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"renewal at {request.log_end_offset}, the log ends at {plog.log_end_offset}",
            )
        channel.region.deregister()  # every push of it was answered: nothing to zero
        channel.segment, channel.start, channel.region = self._register_head(
            channel.partition, request.min_free
        )
        channel.written = 0

    def _register_head(
        self, partition: Partition, min_free: int
    ) -> tuple[LogSegment, int, MemoryRegion]:
        """The unwritten part of the head segment, rolled first if less than ``min_free``
        bytes are left, registered for the leader to write."""
        plog = partition.log
        if not 0 <= min_free <= plog.config.segment_bytes:
            raise KafkaError(ErrorCode.RECORD_LIST_TOO_LARGE, f"min_free {min_free}")
        head = plog.segments[-1]
        capacity = head.log.capacity
        if capacity is None or capacity - head.size < max(min_free, 1):
            head = plog.roll()
            capacity = head.log.capacity
            if capacity is None:
                raise KafkaError(ErrorCode.INVALID_CONFIG, f"{partition.tp}: head not preallocated")
        start = head.size
        region = self._pd.register_file(
            head.log.path, capacity - start, Access.LOCAL_WRITE | Access.REMOTE_WRITE, offset=start
        )
        return head, start, region

    def _check_leader(self, partition: Partition, leader_id: int, leader_epoch: int) -> None:
        if partition.is_leader or partition.info.leader != leader_id:
            raise KafkaError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{partition.tp}: broker {leader_id} does not lead it here",
            )
        if leader_epoch != partition.leader_epoch:
            code = (
                ErrorCode.FENCED_LEADER_EPOCH
                if leader_epoch < partition.leader_epoch
                else ErrorCode.UNKNOWN_LEADER_EPOCH
            )
            raise KafkaError(
                code, f"{partition.tp}: epoch {leader_epoch}, here {partition.leader_epoch}"
            )

    def _hold(self, channel: FollowerChannel, session: Session | None) -> None:
        """Hold ``channel``'s grant on ``session``, the one that asked for it last (None:
        on no session, as without the authorizer and SASL)."""
        if channel.session is session:
            return
        if channel.unwatch is not None:
            channel.unwatch()
            channel.unwatch = None
        channel.session = session
        if session is not None:
            channel.unwatch = session.on_end(partial(self._session_ended, channel))

    def _take_id(self) -> int:
        while self._next_id in self._by_id or self._next_id == 0:
            self._next_id = (self._next_id + 1) % MAX_CHANNELS
        channel_id = self._next_id
        self._next_id = (channel_id + 1) % MAX_CHANNELS
        return channel_id

    def leadership_changed(self, partition: Partition) -> None:
        channel = self._channels.get(partition.tp)
        if channel is not None and (
            channel.partition is not partition
            or partition.is_leader
            or partition.info.leader != channel.leader_id
            or partition.leader_epoch != channel.leader_epoch
            or self.replicas.partitions.get(partition.tp) is not partition
        ):
            self._close(channel, "leadership moved")
        elif channel is not None:
            self._keep_pushed(channel)

    def _keep_pushed(self, channel: FollowerChannel) -> None:
        """A new image of the same leadership (an ISR change) gives the fetcher a new state
        for the partition: it stays pushed, not pulled, while the channel lives."""
        state = channel.fetcher.partitions.get(channel.partition.tp)
        if state is channel.state:
            return
        if state is None or state.leader_epoch != channel.leader_epoch or state.pushed:
            self._close(channel, "no longer followed")
            return
        state.pushed = True
        channel.state = state

    # Authority ---------------------------------------------------------------------------

    def recheck(self, authorizer: Authorizer | None) -> None:
        """End every channel whose leader lost its authority: CLUSTER_ACTION on the cluster
        by ``authorizer`` (the ACLs just taken; None when ACLs are not checked), or the
        credentials of its SASL login. The partition is pulled again."""
        for channel in list(self._channels.values()):
            session = channel.session
            if session is None:
                continue
            error = authority_lost(  # as RdmaReplica asked: CLUSTER_ACTION on the cluster
                session,
                authorizer,
                Operation.CLUSTER_ACTION,
                (CLUSTER_NAME,),
                ResourceType.CLUSTER,
            )
            if error is not None:
                self._close(channel, f"grant revoked: {session.principal}: {error}")

    def _session_ended(self, channel: FollowerChannel, why: str) -> None:
        """A grant lasts no longer than the session that asked for it (not a fault: a
        leader ending a channel hangs its connection up too)."""
        if not channel.closed:
            self._close(channel, f"the session holding the grant ended: {why}", quiet=True)

    # Completions (on the loop) -----------------------------------------------------------

    def accepted(self, qp: QueuePair) -> None:
        """A leader's queue pair, its receives posted (RdmaEndpoint): bound by its first
        request, or dropped."""
        self._qps[qp.qp_num] = qp
        self._loop.call_later(self.timeout, self._drop_if_unbound, qp.qp_num)

    def completed(self, wc: WorkCompletion) -> None:
        qp = self._qps.get(wc.qp_num)
        if qp is None:
            return  # a queue pair already dropped: its flushed requests
        channel = self._bound.get(wc.qp_num)
        if wc.opcode is not Opcode.RECV_RDMA_WITH_IMM:  # one of our replies
            if not wc.ok:
                self._drop_qp(wc.qp_num, f"reply completed with {wc.status.name}")
            return
        if not wc.ok:
            self._drop_qp(wc.qp_num, f"queue pair failed: {wc.status.name}")
            return
        kind, channel_id, order = parse_immediate(wc.imm_data or 0)
        if channel is None:
            channel = self._by_id.get(channel_id)
            if channel is None or channel.qp is not None:
                self._drop_qp(wc.qp_num, f"write names channel {channel_id}, not granted to it")
                return
            channel.qp = qp
            self._bound[qp.qp_num] = channel
        if channel.closed:
            return
        if channel_id != channel.channel_id or order != channel.next_order:
            self._close(
                channel,
                f"immediate channel {channel_id} order {order}, expected channel "
                f"{channel.channel_id} order {channel.next_order}",
            )
            return
        failure = None
        try:
            self._check_leader(channel.partition, channel.leader_id, channel.leader_epoch)
            if channel.fetcher.partitions.get(channel.partition.tp) is not channel.state:
                raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "no longer followed")
            qp.post_recv(wc.wr_id)
            if kind == KIND_RECORDS:
                self._commit(channel, wc.byte_len)
            else:
                self._take_high_watermark(channel)
            channel.next_order = (order + 1) % ORDERS
            self._reply(channel, order)
            self._arm(channel)
        except Exception as error:
            failure = f"{error!r} ({ErrorCode(error_code_for(error)).name})"
        if failure is not None:  # out of the handler: its traceback no longer pins views
            self._close(channel, failure)

    def _commit(self, channel: FollowerChannel, length: int) -> None:
        """Commit the ``length`` bytes the leader wrote right after what is committed."""
        if not 0 < length <= channel.region.length - channel.written:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"push of {length} bytes overruns")
        channel.partition.log.commit_replicated(
            channel.segment, channel.start + channel.written, length
        )
        channel.written += length

    @staticmethod
    def _take_high_watermark(channel: FollowerChannel) -> None:
        (high_watermark,) = HIGH_WATERMARK.unpack_from(channel.hw.buf, 0)
        channel.partition.follow_high_watermark(high_watermark)

    def _reply(self, channel: FollowerChannel, order: int) -> None:
        """Write the log end into the leader's slot ``order % credits`` (WRITE_WITH_IMM, the
        immediate is the order)."""
        assert channel.qp is not None
        slot = order % channel.credits * REPLY.size
        REPLY.pack_into(
            channel.replies.buf, slot, order, ErrorCode.NONE, channel.partition.log.log_end_offset
        )
        channel.qp.post_write_with_imm(
            order,
            channel.replies.sge(slot, REPLY.size),
            channel.reply_addr + slot,
            channel.reply_rkey,
            order,
        )

    def _arm(self, channel: FollowerChannel) -> None:
        if channel.timer is not None:
            channel.timer.cancel()
        channel.timer = self._loop.call_later(
            self.timeout, self._close, channel, "the leader fell silent"
        )

    # Ending ------------------------------------------------------------------------------

    def _close(self, channel: FollowerChannel, reason: str, *, quiet: bool = False) -> None:
        """End ``channel``: no write lands after this, uncommitted bytes are zeroed, the
        leader's queue pair is disconnected and the partition is pulled again. Logged as
        a warning unless `quiet`."""
        if channel.closed:
            return
        channel.closed = True
        if channel.timer is not None:
            channel.timer.cancel()
        if channel.unwatch is not None:
            channel.unwatch()
            channel.unwatch = None
        if self._channels.get(channel.partition.tp) is channel:
            del self._channels[channel.partition.tp]
        self._by_id.pop(channel.channel_id, None)
        for region in (channel.region, channel.hw):
            if region.registered:  # a failed renewal may have let the grant go already
                region.deregister()
        self._zero_uncommitted(channel)
        (log.info if quiet else log.warning)(
            "%s: push channel %d closed, pulling again from %d: %s",
            channel.partition.tp,
            channel.channel_id,
            channel.partition.log.log_end_offset,
            reason,
        )
        if channel.qp is not None:
            self._drop_qp(channel.qp.qp_num, reason)
        channel.replies.deregister()
        channel.fetcher.end_push(channel.state)

    @staticmethod
    def _zero_uncommitted(channel: FollowerChannel) -> None:
        """Zero what the leader may have written beyond the committed end (the file is cut
        there and extended again, whatever the grant's size), so neither a reader nor
        recovery ever finds a batch there. The region is deregistered first."""
        segment = channel.segment
        if segment.log.capacity is not None and segment.size == channel.start + channel.written:
            try:
                segment.log.truncate(segment.size)
            except BufferError:  # its mapping is still viewed: later appends overwrite it
                log.warning("%s: could not zero past the log end", channel.partition.tp)

    def _drop_if_unbound(self, qp_num: int) -> None:
        if qp_num in self._qps and qp_num not in self._bound:
            self._drop_qp(qp_num, "no write in time")

    def _drop_qp(self, qp_num: int, reason: str) -> None:
        qp = self._qps.pop(qp_num, None)
        channel = self._bound.pop(qp_num, None)
        if qp is not None:
            qp.close()
        if channel is not None:
            self._close(channel, reason)

    def close(self) -> None:
        for channel in list(self._channels.values()):
            self._close(channel, "broker stopping")
        for qp_num in list(self._qps):
            self._drop_qp(qp_num, "broker stopping")
