"""Follower replication: one fetcher per leader broker pulls the partitions this broker
follows from it, with Kafka's Fetch API (replica id set), as Kafka followers do.

A partition starts in the truncating state: the fetcher asks the leader for the end offset
of the follower's latest leader epoch (OffsetForLeaderEpoch, KIP-101/279) and cuts any tail
the leader never had, repeating with an older epoch until the logs agree. Then it fetches
from its log end; record batches are appended with the leader's offsets and epochs, and the
follower's high watermark follows the leader's.

A follower of a tiered partition that needs offsets the leader keeps only in the remote
store gets OFFSET_MOVED_TO_TIERED_STORAGE: it asks the leader where its local log starts
(ListOffsets, earliest local) and restarts its log there from the remote state
(services/broker/tiered/remote_state.py), off the fetch loop, then fetches on.

Replication throttles (services/broker/replication_quota.py): a partition this broker does
not yet hold in sync and whose topic's follower.replication.throttled.replicas names its
replica is left out of the fetches while this broker's follower quota is used up; what the
leader sends for it is counted against the quota.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from directlog.protocol import replica_fetch
from directlog.protocol.client import ClientSecurity, KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.records.batch import LOG_OVERHEAD
from directlog.records.errors import CorruptRecordError
from directlog.topics import TopicPartition
from directlog.waits import wait_event, within
from services.broker.partition import Partition
from services.broker.replication_quota import ReplicationQuotas
from services.broker.tiered.remote_state import RemoteLogState

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer import (
        ListOffsetsRequest,
        ListOffsetsResponse,
        OffsetForLeaderEpochRequest,
        OffsetForLeaderEpochResponse,
    )

log = logging.getLogger(__name__)

EPOCH_VERSION = 4
LIST_OFFSETS_VERSION = 8  # the first with EARLIEST_LOCAL (KIP-405)
EARLIEST_LOCAL = -4
UNDEFINED = -1
CONNECT_TIMEOUT = 5.0
SOCKET_TIMEOUT = 30.0  # an answer later than this (past a fetch's wait): reconnect (Kafka's)
_RETRY_PARTITION = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE,  # without a remote store to restart from
    }
)


@dataclass(slots=True, eq=False)  # compared by identity: a newer state replaces it
class FollowState:
    partition: Partition
    leader_epoch: int
    truncating: bool = True
    paused_until: float = 0.0  # after an error, until metadata or time moves on
    lag: int = 0  # offsets behind the leader's high watermark at the last fetch
    pushed: bool = False  # the leader pushes it over RDMA: no pull fetches meanwhile
    rebuilding: bool = False  # restarting from the remote store's state: no fetches meanwhile


@dataclass(frozen=True, slots=True)
class FetchSettings:
    broker_id: int
    wait_max_ms: int
    max_bytes: int
    backoff_ms: int
    # How to reach the leaders' inter-broker listener (TLS, SASL); None: plaintext.
    security: ClientSecurity | None = None


class ReplicaFetcher:
    def __init__(
        self,
        leader_id: int,
        address: Callable[[int], tuple[str, int] | None],
        settings: FetchSettings,
    ) -> None:
        self.leader_id = leader_id
        self.settings = settings
        self._address = address
        self.partitions: dict[TopicPartition, FollowState] = {}
        self._changed = asyncio.Event()
        self._connection: KafkaConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self.pulled: Callable[[TopicPartition, int], None] | None = None  # bytes appended
        self.remote_state: RemoteLogState | None = None  # set when tiered storage is on
        self.quotas: ReplicationQuotas | None = None  # the replication throttles
        self._held = False  # the last round left partitions out for the follower quota
        self._rebuilds: set[asyncio.Task[None]] = set()

    def start_push(self, tp: TopicPartition, leader_epoch: int) -> FollowState | None:
        """Stop pulling `tp` because its leader will push it (services/broker/rdma): only
        once it has truncated in `leader_epoch`, so its log is a prefix of the leader's. A
        fetch in flight meanwhile brings nothing for it (its answer is dropped)."""
        state = self.partitions.get(tp)
        if (
            state is None
            or state.leader_epoch != leader_epoch
            or state.truncating
            or state.pushed
            or state.paused_until > asyncio.get_running_loop().time()
        ):
            return None
        state.pushed = True
        return state

    def end_push(self, state: FollowState) -> None:
        """Pull `state`'s partition again, from its log end (a newer state is unaffected)."""
        state.pushed = False
        self._changed.set()

    def follow(self, partition: Partition) -> None:
        """Fetch `partition` from this leader in its current epoch (truncating first)."""
        known = self.partitions.get(partition.tp)
        if known is None or known.leader_epoch != partition.leader_epoch:
            self.partitions[partition.tp] = FollowState(partition, partition.leader_epoch)
            self._changed.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def forget(self, tp: TopicPartition) -> None:
        self.partitions.pop(tp, None)

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._rebuilds) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._disconnect()

    # The loop ------------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = self.settings.backoff_ms / 1000
        while True:
            if not self.partitions:
                self._changed.clear()
                await self._changed.wait()
                continue
            try:
                connection = await self._connect()
                if connection is None:
                    await asyncio.sleep(backoff)
                    continue
                await self._truncate(connection)
                if not await self._fetch(connection):
                    self._changed.clear()
                    await wait_event(self._changed, self._idle_wait(backoff))
            except Exception as error:  # never end: the partitions would stop following
                if isinstance(error, OSError | ConnectionError | TimeoutError | CorruptRecordError):
                    log.info("fetching from broker %d: %r; reconnecting", self.leader_id, error)
                else:
                    log.exception("fetching from broker %d failed; reconnecting", self.leader_id)
                await self._disconnect()
                await asyncio.sleep(backoff)

    def _idle_wait(self, backoff: float) -> float:
        """How long a round with nothing to fetch waits: the back-off, or less when only
        the follower quota held partitions back and frees up sooner."""
        if not self._held or self.quotas is None:
            return backoff
        return min(backoff, max(self.quotas.follower.seconds_until_allowed(), 0.01))

    def _throttled(self, states: list[FollowState]) -> set[TopicPartition]:
        """The partitions among ``states`` under the follower throttle."""
        quotas = self.quotas
        if quotas is None:
            return set()
        return {
            s.partition.tp
            for s in states
            if quotas.follower_throttles(
                s.partition.config, s.partition.tp.partition, s.partition.info.isr
            )
        }

    async def _connect(self) -> KafkaConnection | None:
        if self._connection is None:
            address = self._address(self.leader_id)
            if address is None:
                return None
            self._connection = await KafkaConnection.connect(
                *address, timeout=CONNECT_TIMEOUT, security=self.settings.security
            )
        return self._connection

    async def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    def _ready(self, truncating: bool) -> list[FollowState]:
        now = asyncio.get_running_loop().time()
        return [
            s
            for s in self.partitions.values()
            if s.truncating == truncating
            and s.paused_until <= now
            and not s.pushed
            and not s.rebuilding
        ]

    def _pause(self, state: FollowState, code: int) -> None:
        log.info(
            "%s: leader %d answered %s; retrying after back-off",
            state.partition.tp,
            self.leader_id,
            _name(code),
        )
        self._back_off(state)

    def _back_off(self, state: FollowState) -> None:
        state.paused_until = asyncio.get_running_loop().time() + self.settings.backoff_ms / 1000

    # Truncation ----------------------------------------------------------------------------

    async def _truncate(self, connection: KafkaConnection) -> None:
        states = self._ready(truncating=True)
        if not states:
            return
        asking = [s for s in states if s.partition.log.leader_epochs.latest_epoch >= 0]
        for state in states:
            if state.partition.log.leader_epochs.latest_epoch < 0:
                state.truncating = False  # nothing written under any epoch: nothing to cut
        if not asking:
            return
        request = OffsetForLeaderEpochRequest(
            version=EPOCH_VERSION,
            replica_id=self.settings.broker_id,
            topics=[
                OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
                    topic=topic,
                    partitions=[
                        OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
                            partition=s.partition.tp.partition,
                            current_leader_epoch=s.leader_epoch,
                            leader_epoch=s.partition.log.leader_epochs.latest_epoch,
                        )
                        for s in group
                    ],
                )
                for topic, group in _by_topic(asking).items()
            ],
        )
        response = await within(
            connection.request(request, OffsetForLeaderEpochResponse, self._client_id),
            SOCKET_TIMEOUT,
        )
        for topic in response.topics:
            for answer in topic.partitions:
                asked = self.partitions.get(TopicPartition(topic.topic, answer.partition))
                if asked is None or asked not in asking:
                    continue
                if answer.error_code != ErrorCode.NONE:
                    self._pause(asked, answer.error_code)
                    continue
                self._apply_epoch_end(asked, answer.leader_epoch, answer.end_offset)

    @staticmethod
    def _apply_epoch_end(state: FollowState, leader_epoch: int, end_offset: int) -> None:
        """Kafka's truncation rule for the leader's (epoch, end offset) answer."""
        partition_log = state.partition.log
        end = partition_log.log_end_offset
        done = True
        if end_offset == UNDEFINED or leader_epoch == UNDEFINED:
            target = partition_log.high_watermark
        else:
            own_epoch, own_end = partition_log.end_offset_for_epoch(leader_epoch)
            if own_epoch == UNDEFINED:
                target = partition_log.high_watermark
            elif own_epoch != leader_epoch:
                target, done = min(own_end, end), False  # ask again about the older epoch
            else:
                target = min(end_offset, own_end, end)
        if target < end:
            log.info(
                "%s: truncating from %d to %d (leader epoch %d ends at %d)",
                state.partition.tp,
                end,
                target,
                leader_epoch,
                end_offset,
            )
            partition_log.truncate_to(target)
        state.truncating = not done

    # Fetching ------------------------------------------------------------------------------

    async def _fetch(self, connection: KafkaConnection) -> bool:
        """One fetch round; False when there was nothing to fetch."""
        states = self._ready(truncating=False)
        throttled = self._throttled(states)
        self._held = False
        if throttled and self.quotas is not None and self.quotas.follower.exceeded():
            states = [s for s in states if s.partition.tp not in throttled]
            self._held = True
        if not states:
            return False
        offsets = {state.partition.tp: state.partition.log.log_end_offset for state in states}
        frame = replica_fetch.encode_request(
            connection.next_correlation_id(),
            self._client_id,
            self.settings.broker_id,
            self.settings.wait_max_ms,
            self.settings.max_bytes,
            [
                replica_fetch.FetchPosition(
                    s.partition.tp.topic,
                    s.partition.tp.partition,
                    s.leader_epoch,
                    offsets[s.partition.tp],
                    s.partition.log.log_start_offset,
                    self.settings.max_bytes,
                )
                for s in states
            ],
        )
        answer = await within(
            connection.exchange(frame), self.settings.wait_max_ms / 1000 + SOCKET_TIMEOUT
        )
        _, code, fetched = replica_fetch.decode_response(answer)
        if code != ErrorCode.NONE:
            raise ConnectionError(f"fetch answered {_name(code)}")
        for data in fetched:
            tp = TopicPartition(data.topic, data.partition)
            if tp in throttled and tp in offsets and self.quotas is not None:
                self.quotas.follower.record(len(data.records))
            state = self.partitions.get(tp)
            if state is None or tp not in offsets or state.truncating or state.pushed:
                continue
            try:
                self._apply_fetched(state, offsets[tp], data)
            except (ConnectionError, CorruptRecordError):
                raise
            except Exception:  # this partition's log refused it: the others go on
                log.exception("%s: taking what leader %d sent failed", tp, self.leader_id)
                self._back_off(state)
                continue
            state.lag = max(data.high_watermark - state.partition.log.log_end_offset, 0)
        return True

    def _apply_fetched(
        self, state: FollowState, offset: int, data: replica_fetch.FetchedPartition
    ) -> None:
        partition_log = state.partition.log
        code = data.error_code
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            leader_start = data.log_start_offset
            if offset < leader_start:
                log.info(
                    "%s: leader's log starts at %d; restarting there",
                    state.partition.tp,
                    leader_start,
                )
                partition_log.truncate_fully_and_start_at(leader_start)
            else:
                state.truncating = True  # ahead of the leader: find where we diverged
            return
        if code == ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE and self.remote_state is not None:
            state.rebuilding = True
            task = asyncio.get_running_loop().create_task(
                self._restart_from_remote(state, data.log_start_offset)
            )
            self._rebuilds.add(task)
            task.add_done_callback(self._rebuilds.discard)
            return
        if code != ErrorCode.NONE:
            if code in _RETRY_PARTITION:
                self._pause(state, code)
                return
            raise ConnectionError(f"{state.partition.tp}: fetch answered {_name(code)}")
        if partition_log.log_end_offset != offset:
            return  # truncated or appended meanwhile; the next round starts from the new end
        start = 0
        for end in _runs(data.records, partition_log.config.segment_bytes):
            partition_log.append(data.records[start:end], assign_offsets=False)
            if self.pulled is not None:
                self.pulled(state.partition.tp, end - start)
            start = end
        state.partition.follow_high_watermark(data.high_watermark)
        if data.log_start_offset > partition_log.log_start_offset:  # DeleteRecords, retention
            partition_log.advance_log_start(
                min(data.log_start_offset, partition_log.high_watermark)
            )

    # Tiered storage ------------------------------------------------------------------------

    async def _restart_from_remote(self, state: FollowState, leader_log_start: int) -> None:
        """Restart `state`'s log where the leader's local log starts, from remote state."""
        tp = state.partition.tp
        remote_state = self.remote_state
        assert remote_state is not None
        try:
            local_start = await self._leader_local_start(state)
            start = await remote_state.start_for(tp, state.partition.topic_id, local_start)
            if self.partitions.get(tp) is not state:
                return  # the partition moved on meanwhile
            log.info(
                "%s: the leader keeps offsets below %d in the remote store; restarting at %d "
                "from its remote state (log start %d)",
                tp,
                local_start,
                start.offset,
                leader_log_start,
            )
            state.partition.log.restart_from_remote(
                start.offset,
                min(max(leader_log_start, 0), start.offset),
                start.epochs,
                start.producer_snapshot,
            )
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.info("%s: restart from remote state failed: %r; retrying after back-off", tp, error)
            self._back_off(state)
        finally:
            state.rebuilding = False
            self._changed.set()

    async def _leader_local_start(self, state: FollowState) -> int:
        """The leader's local log start (ListOffsets EARLIEST_LOCAL, as a replica)."""
        connection = await self._connect()
        if connection is None:
            raise ConnectionError(f"no address for leader {self.leader_id}")
        tp = state.partition.tp
        topic = ListOffsetsRequest.ListOffsetsTopic
        request = ListOffsetsRequest(
            version=LIST_OFFSETS_VERSION,
            replica_id=self.settings.broker_id,
            isolation_level=0,
            topics=[
                topic(
                    name=tp.topic,
                    partitions=[
                        topic.ListOffsetsPartition(
                            partition_index=tp.partition,
                            current_leader_epoch=state.leader_epoch,
                            timestamp=EARLIEST_LOCAL,
                        )
                    ],
                )
            ],
        )
        response = await within(
            connection.request(request, ListOffsetsResponse, self._client_id), SOCKET_TIMEOUT
        )
        answer = response.topics[0].partitions[0]
        if answer.error_code != ErrorCode.NONE or answer.offset < 0:
            raise ConnectionError(
                f"{tp}: the leader's earliest local offset: {_name(answer.error_code)}"
            )
        return int(answer.offset)

    @property
    def _client_id(self) -> str:
        return f"directlog-replica-{self.settings.broker_id}"


def _by_topic(states: list[FollowState]) -> dict[str, list[FollowState]]:
    grouped: dict[str, list[FollowState]] = {}
    for state in states:
        grouped.setdefault(state.partition.tp.topic, []).append(state)
    return grouped


def _runs(records: memoryview, max_bytes: int) -> list[int]:
    """Where each run of whole batches at the start of `records` ends, a run at most
    `max_bytes` long unless one batch alone is longer: a fetch may bring more than a segment
    holds (segment.bytes below replica_fetch_max_bytes), and one append goes to one
    segment. A partial batch at the end is left for the next fetch to bring whole."""
    ends: list[int] = []
    run_start = position = 0
    size = len(records)
    while size - position >= LOG_OVERHEAD:
        length = LOG_OVERHEAD + int.from_bytes(records[position + 8 : position + 12], "big")
        if position + length > size:
            break
        if position > run_start and position + length - run_start > max_bytes:
            ends.append(position)
            run_start = position
        position += length
    if position > run_start:
        ends.append(position)
    return ends


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
