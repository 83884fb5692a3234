"""The leader's end of RDMA push replication (KafkaDirect §4.3.2): for each follower of a
preallocated partition it asks for a grant of the follower's head segment (RdmaReplica,
API key 10002, over the follower's Kafka port) and WRITE_WITH_IMMs the exact bytes of its
own log into it, straight from its registered segment file, as soon as they are appended.

Contiguous batches are coalesced opportunistically (whatever is appended and not yet
pushed when a push is posted, up to ``rdma_replication_batch_bytes``; one larger batch goes
alone). Credits: at most as many pushes unanswered as the follower posted receives. Each
reply carries the follower's log end offset and is fed to Partition.follower_fetched, as a
pull fetch would be, so the ISR and the high watermark follow pushes exactly as they follow
fetches. A higher high watermark (and, when idle, the same one as a heartbeat) goes to the
follower as a write of its high watermark word; its reply keeps the follower caught up.

When the next batch does not fit the grant, the leader lets every push be answered and
asks for the next grant. Any failure ends the channel; the follower then pulls, and a new
channel is tried after ``replica_fetch_backoff_ms`` from the follower's log end. Channels
open only to followers in the ISR: one that fell behind catches up by pull fetches, which
move a backlog in large reads rather than in credit-limited 1 KiB writes.

The Kafka connection a channel's grant was asked on stays open while the channel lives
(renewals go over it too) and is hung up when it ends: the follower holds the grant on that
connection's session, as every RDMA grant is held (docs/security.md, "RDMA grants"), and
ends the channel when the session ends or its principal loses CLUSTER_ACTION or its
credentials; the leader sees its queue pair fail and, refused, keeps retrying with back-off.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field

from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.protocol.rdma_replica import (
    HIGH_WATERMARK,
    KIND_HIGH_WATERMARK,
    KIND_RECORDS,
    OPEN,
    ORDERS,
    REPLY,
    RdmaReplicaRequest,
    RdmaReplicaResponse,
    decode_response_frame,
    immediate,
    request_frame,
)
from directlog.rdma import (
    Access,
    CompletionQueue,
    MemoryRegion,
    Opcode,
    ProtectionDomain,
    QpCaps,
    QueuePair,
    Sge,
    WorkCompletion,
)
from directlog.records.batch import LOG_OVERHEAD
from directlog.topics import TopicPartition
from directlog.waits import within
from services.broker.metrics import BrokerMetrics
from services.broker.partition import Partition
from services.broker.replica_manager import ReplicaManager, now_ms
from services.broker.settings import BrokerSettings
from services.broker.storage.segment import LogSegment

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
# A reply can free a credit before the completion of the push it answers is polled, so
# the send queue holds twice the credits (and the CQ room for it).
SEND_SLACK = 2
MAX_BACKOFF_SHIFT = 4  # failed opens back off up to 16 x replica_fetch_backoff_ms
HIGH_WATERMARK_PUSH = -1  # what an in-flight high watermark write expects back: any end
_LAST_DELTA_AT = 23  # last_offset_delta in a batch header


@dataclass(slots=True)
class PushPlan:
    """One write: ``length`` bytes of whole batches from file position ``position``,
    ending before offset ``next_offset``; ``needs_grant`` when the first batch (of
    ``length`` bytes) does not fit what is left of the grant."""

    length: int
    next_offset: int
    batches: int
    needs_grant: bool = False


def plan_push(
    view: memoryview, position: int, end: int, batch_bytes: int, room: int
) -> PushPlan | None:
    """Coalesce the whole batches at ``view[position:end]`` into one write of at most
    ``batch_bytes`` (a larger first batch alone) that fits ``room``; None when no whole
    batch is there. Sans-I/O: the leader's segment bytes in, a plan out."""
    length = batches = 0
    next_offset = -1
    while end - (position + length) >= LOG_OVERHEAD:
        at = position + length
        size = LOG_OVERHEAD + int.from_bytes(view[at + 8 : at + 12], "big")
        if size <= LOG_OVERHEAD or at + size > end:
            break
        if length and (length + size > batch_bytes or length + size > room):
            break
        if not length and size > room:
            return PushPlan(size, -1, 0, needs_grant=True)
        base = int.from_bytes(view[at : at + 8], "big")
        delta = int.from_bytes(view[at + _LAST_DELTA_AT : at + _LAST_DELTA_AT + 4], "big")
        length += size
        batches += 1
        next_offset = base + delta + 1
        if length >= batch_bytes:
            break
    return PushPlan(length, next_offset, batches) if length else None


@dataclass(slots=True)
class Credits:
    """Pushes posted and not yet answered, in post order: (order, follower log end the
    answer must report, or HIGH_WATERMARK_PUSH; when posted). Sans-I/O."""

    limit: int
    next_order: int = 0
    unanswered: collections.deque[tuple[int, int, float]] = field(default_factory=collections.deque)

    @property
    def available(self) -> bool:
        return len(self.unanswered) < self.limit

    def take(self, expect: int, now: float) -> int:
        assert self.available
        order = self.next_order
        self.unanswered.append((order, expect, now))
        self.next_order = (order + 1) % ORDERS
        return order

    def answer(self, order: int, log_end_offset: int) -> None:
        """Match a reply to the oldest push; ValueError for any other (out of order, not
        posted, a log end that is not what the push made it)."""
        if not self.unanswered:
            raise ValueError(f"reply {order} to no push")
        expected, expect, _ = self.unanswered[0]
        if order != expected:
            raise ValueError(f"reply {order}, expected {expected}")
        if expect != HIGH_WATERMARK_PUSH and log_end_offset != expect:
            raise ValueError(f"follower log end {log_end_offset} after a push to {expect}")
        self.unanswered.popleft()

    def oldest(self) -> float | None:
        return self.unanswered[0][2] if self.unanswered else None


@dataclass(eq=False, slots=True)
class LeaderChannel:
    """Pushing one partition to one follower in one leader epoch."""

    partition: Partition
    follower: int
    leader_epoch: int
    credits: Credits = field(default_factory=lambda: Credits(1))
    channel_id: int = 0
    qp: QueuePair | None = None
    replies: MemoryRegion | None = None  # the follower writes its replies here
    hw_out: MemoryRegion | None = None  # high watermark values being written, per credit
    remote_addr: int = 0
    remote_rkey: int = 0
    remote_length: int = 0
    remote_written: int = 0
    hw_addr: int = 0
    hw_rkey: int = 0
    offset: int = 0  # the next offset to push
    source: MemoryRegion | None = None  # the leader's segment file it is pushed from
    source_segment: LogSegment | None = None
    position: int = 0  # file position of ``offset`` in ``source_segment``
    sent_high_watermark: int = -1
    last_post: float = 0.0
    live: bool = False  # granted and connected
    renewing: bool = False
    needed: int = 0  # bytes the next grant must hold in one piece
    closed: bool = False
    scheduled: bool = False
    connection: KafkaConnection | None = None  # the grant's session on the follower
    asking: bool = False  # an RdmaReplica exchange on ``connection`` is under way


class ReplicaLeader:
    """Pushes led preallocated partitions to their followers."""

    def __init__(
        self,
        settings: BrokerSettings,
        replicas: ReplicaManager,
        pd: ProtectionDomain,
        cq: CompletionQueue,
        providers: tuple[str, ...],
        metrics: BrokerMetrics,
    ) -> None:
        self.settings = settings
        self.replicas = replicas
        self.metrics = metrics
        self._pd = pd
        self._cq = cq
        self._providers = providers
        self._loop = asyncio.get_running_loop()
        self._channels: dict[tuple[TopicPartition, int], LeaderChannel] = {}
        self._by_qp: dict[int, LeaderChannel] = {}
        self._retry_at: dict[tuple[TopicPartition, int], float] = {}
        self._failed_opens: dict[tuple[TopicPartition, int], int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._hang_ups: set[asyncio.Task[None]] = set()  # awaited, never cancelled, at close

    def owns(self, qp_num: int) -> bool:
        return qp_num in self._by_qp

    @property
    def backoff(self) -> float:
        return self.settings.replica_fetch_backoff_ms / 1000

    # Channels ----------------------------------------------------------------------------

    def maintain(self) -> None:
        """Open channels where missing, end stale or silent ones, send heartbeats; the
        facade calls this every back-off period."""
        now = self._loop.time()
        timeout = self.settings.rdma_replication_timeout_ms / 1000
        idle = min(self.settings.replica_fetch_wait_max_ms / 1000, timeout / 3)
        for channel in list(self._channels.values()):
            if not self._leads(channel):
                self._fail(channel, "leadership moved")
            elif (oldest := channel.credits.oldest()) is not None and now - oldest > timeout:
                self._fail(channel, "a push went unanswered")
            elif self._behind_log_start(channel.partition, channel.follower):
                self._fail(channel, "the log start moved; the follower pulls it", quiet=True)
            elif channel.live and now - channel.last_post >= idle:
                channel.sent_high_watermark = -1  # a heartbeat: the high watermark again
                self._schedule(channel)
        hosted = self.replicas.partitions
        for key in [key for key in self._retry_at if key[0] not in hosted]:
            del self._retry_at[key]
            self._failed_opens.pop(key, None)
        for partition in list(self.replicas.partitions.values()):
            if not partition.is_leader or not partition.config.preallocate:
                continue
            partition.push_listener = self.wake
            for follower in partition.info.replicas:
                key = (partition.tp, follower)
                if (
                    follower == self.replicas.broker_id
                    or key in self._channels
                    or self._retry_at.get(key, 0.0) > now
                    or follower not in self.replicas.image.brokers
                    or follower not in partition.info.isr
                    or self._behind_log_start(partition, follower)
                ):
                    continue
                channel = LeaderChannel(partition, follower, partition.leader_epoch)
                self._channels[key] = channel
                self._spawn(self._open(channel))

    @staticmethod
    def _behind_log_start(partition: Partition, follower: int) -> bool:
        """A follower whose last known log end is below our local log start must restart its
        log there (from the remote store's state, if the log is tiered), and one whose log
        start (as its latest fetch said; -1 before its first fetch under this leadership) is
        below ours must move it (DeleteRecords, retention): only a pull fetch does either,
        so meanwhile no grant is asked for and an open channel ends."""
        progress = partition.followers.get(follower)
        plog = partition.log
        return progress is not None and (
            0 <= progress.log_end_offset < plog.local_log_start_offset
            or progress.log_start_offset < plog.log_start_offset
        )

    def wake(self, partition: Partition) -> None:
        """New records or a higher high watermark: push them to every follower."""
        for follower in partition.info.replicas:
            channel = self._channels.get((partition.tp, follower))
            if channel is not None and channel.partition is partition:
                self._schedule(channel)

    def leadership_changed(self, partition: Partition) -> None:
        for (tp, _), channel in list(self._channels.items()):
            if tp == partition.tp and not self._leads(channel):
                self._fail(channel, "leadership moved")

    def _leads(self, channel: LeaderChannel) -> bool:
        partition = channel.partition
        return (
            partition.is_leader
            and partition.leader_epoch == channel.leader_epoch
            and self.replicas.partitions.get(partition.tp) is partition
            and channel.follower in partition.info.replicas
        )

    def _spawn(self, coroutine: Coroutine[None, None, None]) -> None:
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ask(self, channel: LeaderChannel, channel_id: int) -> RdmaReplicaResponse:
        """One RdmaReplica exchange with the follower's Kafka port, on the channel's
        connection (made by the first): the grant lasts as long as that connection's
        session, so it is kept until the channel ends. A failed exchange hangs it up."""
        broker = self.replicas.image.brokers.get(channel.follower)
        if broker is None or broker.port <= 0:
            raise ConnectionError(f"broker {channel.follower} has no address")
        assert channel.replies is not None and not channel.asking
        partition = channel.partition
        request = RdmaReplicaRequest(
            partition.tp.topic,
            partition.tp.partition,
            self.replicas.broker_id,
            channel.leader_epoch,
            channel_id,
            channel.offset if channel_id != OPEN else -1,
            channel.needed,
            channel.replies.addr,
            channel.replies.rkey,
            channel.replies.length,
            self._providers,
        )
        channel.asking = True
        try:
            if channel.connection is None:
                channel.connection = await KafkaConnection.connect(
                    broker.host,
                    broker.port,
                    CONNECT_TIMEOUT,
                    self.replicas.fetch_settings.security,
                )
            connection = channel.connection
            correlation_id = connection.next_correlation_id()
            frame = request_frame(
                request, correlation_id, f"directlog-pusher-{self.replicas.broker_id}"
            )
            answer = await within(connection.exchange(frame), CONNECT_TIMEOUT)
            response = decode_response_frame(answer, correlation_id)
        except BaseException:
            await self._hang_up(channel)
            raise
        finally:
            channel.asking = False
        if channel.closed:  # ended meanwhile: the hang-up was left to this exchange
            await self._hang_up(channel)
        if response.error_code != ErrorCode.NONE:
            raise KafkaError(ErrorCode(response.error_code), response.error_message or "")
        return response

    async def _open(self, channel: LeaderChannel) -> None:
        if channel.closed:  # ended before it started: nothing to allocate or ask
            return
        partition = channel.partition
        credits = self.settings.rdma_replication_credits
        try:
            channel.replies = self._pd.allocate(
                credits * REPLY.size, Access.LOCAL_WRITE | Access.REMOTE_WRITE
            )
            response = await self._ask(channel, OPEN)
            if channel.closed or not self._leads(channel):
                raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "leadership moved")
            self._check_logs_agree(partition, response)
            channel.credits = Credits(min(credits, response.credits))
            channel.hw_out = self._pd.allocate(
                channel.credits.limit * HIGH_WATERMARK.size, Access.LOCAL_WRITE
            )
            caps = QpCaps(max_send_wr=SEND_SLACK * credits, max_recv_wr=credits)
            qp = await asyncio.to_thread(
                self._pd.connect, response.conn_info, self._cq, caps, timeout=CONNECT_TIMEOUT
            )
            if self._channels.get((partition.tp, channel.follower)) is not channel:
                qp.close()  # ended while connecting
                return
            channel.qp = qp
            self._by_qp[qp.qp_num] = channel
            for credit in range(credits):
                qp.post_recv(credit)
        except Exception as error:
            self._fail(channel, f"no push channel: {error}", quiet=True)
            return
        channel.channel_id = response.channel_id
        self._granted(channel, response)
        channel.offset = response.log_end_offset
        channel.live = True
        channel.last_post = self._loop.time()
        self.metrics.replication_channels.labels(partition.tp.topic).inc()
        log.info(
            "%s: pushing to broker %d from offset %d (channel %d, %d credits)",
            partition.tp,
            channel.follower,
            channel.offset,
            channel.channel_id,
            channel.credits.limit,
        )
        self._schedule(channel)

    @staticmethod
    def _check_logs_agree(partition: Partition, response: RdmaReplicaResponse) -> None:
        """The follower's log must be a prefix of ours: its end within ours, at a batch
        boundary, and its latest epoch ending (here) no earlier than its log end."""
        plog = partition.log
        end = response.log_end_offset
        if not plog.local_log_start_offset <= end <= plog.log_end_offset:
            raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE, f"follower log end {end}")
        if response.last_epoch >= 0:
            epoch, epoch_end = plog.end_offset_for_epoch(response.last_epoch)
            if epoch != response.last_epoch or epoch_end < end:
                raise KafkaError(
                    ErrorCode.FENCED_LEADER_EPOCH,
                    f"follower epoch {response.last_epoch} up to {end} diverges here",
                )

    @staticmethod
    def _granted(channel: LeaderChannel, response: RdmaReplicaResponse) -> None:
        channel.remote_addr = response.addr
        channel.remote_rkey = response.rkey
        channel.remote_length = response.length
        channel.remote_written = 0
        channel.hw_addr = response.hw_addr
        channel.hw_rkey = response.hw_rkey

    async def _renew(self, channel: LeaderChannel) -> None:
        try:
            response = await self._ask(channel, channel.channel_id)
        except Exception as error:
            self._fail(channel, f"next grant refused: {error}")
            return
        if channel.closed:
            return
        self._granted(channel, response)
        channel.renewing = False
        self._schedule(channel)

    # Pushing -----------------------------------------------------------------------------

    def _schedule(self, channel: LeaderChannel) -> None:
        """Push on the next loop turn: appends made meanwhile coalesce into fewer writes."""
        if not channel.scheduled and channel.live and not channel.closed:
            channel.scheduled = True
            self._loop.call_soon(self._pump, channel)

    def _pump(self, channel: LeaderChannel) -> None:
        channel.scheduled = False
        try:
            while channel.live and not channel.closed and not channel.renewing:
                if not channel.credits.available or not self._push_once(channel):
                    break
        except Exception as error:
            self._fail(channel, f"push failed: {error!r}")

    def _push_once(self, channel: LeaderChannel) -> bool:
        """Post one write if there is something to push; False when there is not (or it
        must wait for every push to be answered first)."""
        plog = channel.partition.log
        if channel.offset < plog.log_end_offset:
            if not self._source_ready(channel):
                return False
            assert channel.source is not None and channel.source_segment is not None
            plan = plan_push(
                channel.source.buf,
                channel.position,
                channel.source_segment.size,
                self.settings.rdma_replication_batch_bytes,
                channel.remote_length - channel.remote_written,
            )
            if plan is None:
                return False
            if plan.needs_grant:
                channel.needed = plan.length
                channel.renewing = True
                if not channel.credits.unanswered:
                    self._spawn(self._renew(channel))
                return False
            self._post(
                channel,
                KIND_RECORDS,
                channel.source.sge(channel.position, plan.length),
                channel.remote_addr + channel.remote_written,
                channel.remote_rkey,
                plan.next_offset,
            )
            channel.offset = plan.next_offset
            channel.position += plan.length
            channel.remote_written += plan.length
            tp = channel.partition.tp
            self.metrics.replication_pushed_bytes.labels(tp.topic).inc(plan.length)
            self.metrics.replication_pushes.labels(tp.topic).inc()
            return True
        high_watermark = plog.high_watermark
        if high_watermark == channel.sent_high_watermark:
            return False
        assert channel.hw_out is not None
        slot = channel.credits.next_order % channel.credits.limit * HIGH_WATERMARK.size
        HIGH_WATERMARK.pack_into(channel.hw_out.buf, slot, high_watermark)
        self._post(
            channel,
            KIND_HIGH_WATERMARK,
            channel.hw_out.sge(slot, HIGH_WATERMARK.size),
            channel.hw_addr,
            channel.hw_rkey,
            HIGH_WATERMARK_PUSH,
        )
        channel.sent_high_watermark = high_watermark
        return True

    def _post(
        self,
        channel: LeaderChannel,
        kind: int,
        local: Sge,
        remote_addr: int,
        rkey: int,
        expect: int,
    ) -> None:
        assert channel.qp is not None
        now = self._loop.time()
        order = channel.credits.take(expect, now)
        channel.qp.post_write_with_imm(
            order,
            local,
            remote_addr,
            rkey,
            immediate(kind, channel.channel_id, order),
        )
        channel.last_post = now

    def _source_ready(self, channel: LeaderChannel) -> bool:
        """Make ``source`` the registered segment file holding ``offset``. Switching files
        waits until every push from the old one is answered (its buffer is then free)."""
        segment = channel.source_segment
        if segment is not None and channel.position < segment.size:
            return True
        if segment is not None and segment is channel.partition.log.segments[-1]:
            return False  # at the head's end: nothing more yet
        if channel.credits.unanswered:
            return False
        if channel.source is not None:
            channel.source.deregister()
            channel.source = None
        segment = _segment_of(channel.partition, channel.offset)
        found = segment.locate(channel.offset)
        if found is None or found[1].base_offset != channel.offset:
            raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE, f"no batch starts at {channel.offset}")
        # Read only (no access flags): pyverbs can then pin a file on any filesystem.
        channel.source = self._pd.register_file(
            segment.log.path, segment.log.length_on_disk, Access(0)
        )
        channel.source_segment = segment
        channel.position = found[0]
        return True

    # Completions (on the loop) -----------------------------------------------------------

    def completed(self, wc: WorkCompletion) -> None:
        channel = self._by_qp.get(wc.qp_num)
        if channel is None or channel.closed:
            return
        if not wc.ok:
            self._fail(channel, f"queue pair failed: {wc.status.name}")
            return
        if wc.opcode is not Opcode.RECV_RDMA_WITH_IMM:
            return  # a push placed; its reply says it was committed
        try:
            assert channel.qp is not None and channel.replies is not None
            order = (wc.imm_data or 0) % ORDERS
            slot = order % channel.credits.limit * REPLY.size
            echoed, code, log_end_offset = REPLY.unpack_from(channel.replies.buf, slot)
            if echoed != order or code != ErrorCode.NONE:
                raise ValueError(f"reply {echoed} for {order} with error {code}")
            channel.credits.answer(order, log_end_offset)
            channel.qp.post_recv(wc.wr_id)
            if not self._leads(channel):
                raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "leadership moved")
            channel.partition.follower_fetched(channel.follower, log_end_offset, now_ms())
        except Exception as error:
            self._fail(channel, f"bad reply: {error!r}")
            return
        if channel.renewing:
            if not channel.credits.unanswered:
                self._spawn(self._renew(channel))
            return
        self._schedule(channel)

    # Ending ------------------------------------------------------------------------------

    def _fail(self, channel: LeaderChannel, reason: str, *, quiet: bool = False) -> None:
        """End ``channel``; the follower notices (its queue pair fails or goes silent) and
        pulls. Another channel is tried after the back-off."""
        if channel.closed:
            return
        channel.closed = True
        worked = channel.live
        if worked:
            self.metrics.replication_channels.labels(channel.partition.tp.topic).dec()
        channel.live = False
        key = (channel.partition.tp, channel.follower)
        if self._channels.get(key) is channel:
            del self._channels[key]
        # A channel that worked is tried again soon; opens that keep failing back off.
        failed = 0 if worked else self._failed_opens.get(key, 0) + 1
        self._failed_opens[key] = failed
        self._retry_at[key] = self._loop.time() + self.backoff * (
            1 << min(failed, MAX_BACKOFF_SHIFT)
        )
        (log.info if quiet else log.warning)(
            "%s: push to broker %d ended: %s", channel.partition.tp, channel.follower, reason
        )
        if channel.qp is not None:
            self._by_qp.pop(channel.qp.qp_num, None)
            channel.qp.close()
        for region in (channel.source, channel.replies, channel.hw_out):
            if region is not None:
                region.deregister()
        if channel.connection is not None and not channel.asking:
            task = self._loop.create_task(self._hang_up(channel))
            self._hang_ups.add(task)
            task.add_done_callback(self._hang_ups.discard)

    @staticmethod
    async def _hang_up(channel: LeaderChannel) -> None:
        """Close the connection the channel's grant is held on (the follower ends the
        grant with its session, if it had not already)."""
        connection, channel.connection = channel.connection, None
        if connection is not None:
            await connection.close()

    async def close(self) -> None:
        """End every channel and hang their connections up."""
        for task in self._tasks:
            task.cancel()
        for channel in list(self._channels.values()):
            self._fail(channel, "broker stopping", quiet=True)
        # The cancelled exchanges hang their own connections up as they unwind.
        await asyncio.gather(*self._tasks, *self._hang_ups, return_exceptions=True)


def _segment_of(partition: Partition, offset: int) -> LogSegment:
    """The segment holding ``offset`` (the last with a base at or below it)."""
    segments = partition.log.segments
    for segment in reversed(segments):
        if segment.base_offset <= offset:
            return segment
    raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset} is below the log start")
