"""One partition replica on this broker: as leader it tracks its followers, the ISR and the
high watermark and completes acks=-1 produces; as follower it only holds the log its
fetcher fills.

The leader's rules are Kafka's: a follower's log end offset is the offset of its latest
fetch; it is caught up when it fetched everything the leader had at that fetch or the one
before; the ISR loses a replica that has not caught up for `replica.lag.time.max.ms` and
regains it once it reaches the high watermark within the current leader epoch. The high
watermark is the smallest log end offset over the ISR, counting a replica whose addition is
still pending with the controller (never advance on fewer copies than may be promised).
ISR changes go to the controller (AlterPartition) and take effect when it commits them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.records.varint import Buffer
from directlog.topic_config import LogConfig
from directlog.topics import TopicPartition
from directlog.waits import within
from services.broker.cluster_metadata import PartitionInfo
from services.broker.storage import AppendResult, PartitionLog

log = logging.getLogger(__name__)

IsrProposal = Callable[["Partition", tuple[int, ...]], None]


@dataclass(slots=True)
class FollowerProgress:
    log_end_offset: int = -1  # unknown until its first fetch under this leader
    log_start_offset: int = -1  # as its latest fetch said; unknown before
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    leader_end_at_last_fetch: int = -1


class Partition:
    def __init__(
        self,
        tp: TopicPartition,
        topic_id: uuid.UUID,
        log: PartitionLog,
        local_id: int,
        notify: Callable[[], None],
        propose_isr: IsrProposal,
    ) -> None:
        self.tp = tp
        self.topic_id = topic_id
        self.log = log
        self.local_id = local_id
        self.info = PartitionInfo(tp.partition, (), -1, -1, (), -1)
        self.is_leader = False
        self.followers: dict[int, FollowerProgress] = {}
        self.pending_isr: tuple[int, ...] | None = None
        self._leader_epoch_start = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._start_waiters: list[tuple[int, asyncio.Future[None]]] = []  # DeleteRecords
        self._notify = notify
        self._propose_isr = propose_isr
        # Told when a leader has something new for its followers (records, or a higher
        # high watermark): RDMA push replication pushes it at once.
        self.push_listener: Callable[[Partition], None] | None = None

    @property
    def config(self) -> LogConfig:
        return self.log.config

    @property
    def leader_epoch(self) -> int:
        return self.info.leader_epoch

    # Role changes ------------------------------------------------------------------------

    def become_leader(self, info: PartitionInfo, now_ms: int) -> None:
        """Lead from now on (new epoch), or take a newer state of the same leadership."""
        new_epoch = not self.is_leader or info.leader_epoch != self.info.leader_epoch
        if not new_epoch:
            self._log_isr_change(info)
        self.info = info
        self.is_leader = True
        if self.pending_isr is not None and info.isr == self.pending_isr:
            self.pending_isr = None
        if new_epoch:
            self.pending_isr = None
            self._leader_epoch_start = self.log.log_end_offset
            self.log.leader_epochs.assign(info.leader_epoch, self._leader_epoch_start)
            self.followers = {
                replica: FollowerProgress(last_caught_up_ms=now_ms if replica in info.isr else 0)
                for replica in info.replicas
                if replica != self.local_id
            }
            log.info(
                "%s: leader in epoch %d, ISR %s, log end %d",
                self.tp,
                info.leader_epoch,
                list(info.isr),
                self._leader_epoch_start,
            )
        else:
            # A reassignment changes the replicas within an epoch: follow the new ones from
            # nothing caught up, forget the removed ones.
            wanted = {r for r in info.replicas if r != self.local_id}
            for replica in wanted - self.followers.keys():
                self.followers[replica] = FollowerProgress(last_caught_up_ms=0)
            for replica in self.followers.keys() - wanted:
                del self.followers[replica]
        self.maybe_advance_high_watermark()

    def become_follower(self, info: PartitionInfo) -> None:
        was_leader = self.is_leader
        self.info = info
        self.is_leader = False
        self.pending_isr = None
        self.followers = {}
        if was_leader:
            log.info("%s: follower of %d in epoch %d", self.tp, info.leader, info.leader_epoch)
        self.fail_waiters(
            KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{self.tp}: leadership moved")
        )

    def stop(self) -> None:
        self.is_leader = False
        self.fail_waiters(KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{self.tp}: removed"))

    def check_leader(self, current_leader_epoch: int = -1) -> None:
        """Raise the error a request for this partition gets when we may not answer it as
        its leader (a client's current_leader_epoch, when it sends one, must be ours)."""
        if current_leader_epoch >= 0:
            if current_leader_epoch < self.info.leader_epoch:
                raise KafkaError(
                    ErrorCode.FENCED_LEADER_EPOCH,
                    f"{self.tp}: epoch {current_leader_epoch} < {self.info.leader_epoch}",
                )
            if current_leader_epoch > self.info.leader_epoch:
                raise KafkaError(
                    ErrorCode.UNKNOWN_LEADER_EPOCH,
                    f"{self.tp}: epoch {current_leader_epoch} > {self.info.leader_epoch}",
                )
        if not self.is_leader:
            raise KafkaError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{self.tp}: broker {self.local_id} is not the leader (leader {self.info.leader})",
            )

    def check_readable(self, current_leader_epoch: int = -1) -> None:
        """As `check_leader`, for a consumer that may read from a follower (KIP-392): any
        replica here answers, under the leader epoch the client knows."""
        if self.is_leader:
            self.check_leader(current_leader_epoch)
        elif current_leader_epoch >= 0 and current_leader_epoch != self.info.leader_epoch:
            self.check_leader(current_leader_epoch)  # raises the epoch's error

    def follow_high_watermark(self, leader_high_watermark: int) -> None:
        """A follower takes the leader's high watermark, within what it holds; a move wakes
        the consumers long-polling it (KIP-392)."""
        before = self.log.high_watermark
        moved = self.log.update_high_watermark(min(leader_high_watermark, self.log.log_end_offset))
        if moved != before:
            self._notify()

    # Producing ---------------------------------------------------------------------------

    def check_appendable(self, acks: int) -> None:
        """Raise what a produce with ``acks`` gets when this replica may not take it now."""
        self.check_leader()
        if acks == -1 and len(self.info.isr) < self.config.min_insync_replicas:
            raise KafkaError(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"{self.tp}: ISR {list(self.info.isr)} is smaller than min.insync.replicas "
                f"{self.config.min_insync_replicas}",
            )

    def append_as_leader(self, records: Buffer, acks: int) -> AppendResult:
        self.check_appendable(acks)
        (result,) = self.append_produced([records])
        if isinstance(result, Exception):
            raise result
        return result

    def append_produced(self, records: Sequence[Buffer]) -> list[AppendResult | Exception]:
        """The records of several produce requests (each passed `check_appendable`) in one
        go, each answered with its result or error (PartitionLog.append_produced); the high
        watermark moves once for all of them."""
        results = self.log.append_produced(records, self.info.leader_epoch)
        # An idempotent producer's retry (duplicate) brings nothing new to replicate.
        if any(isinstance(result, AppendResult) and not result.duplicate for result in results):
            self.appended()
        return results

    def appended(self) -> None:
        """New records are in the leader's log (a produce, or an RDMA write committed in
        place): move the high watermark, or wake followers' fetches that wait for them."""
        if not self.maybe_advance_high_watermark():
            self._notify()
        if self.push_listener is not None:
            self.push_listener(self)

    def replicated(self, offset: int) -> bool:
        """Whether acks=-1 for records up to `offset` can be answered now: the high watermark
        passed it. Raises NOT_ENOUGH_REPLICAS_AFTER_APPEND when it did but the ISR is below
        min.insync.replicas, and NOT_LEADER_OR_FOLLOWER once this replica no longer leads (a
        follower's high watermark says nothing of records it may have truncated)."""
        if not self.is_leader:
            raise KafkaError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{self.tp}: leadership moved before offset {offset} was replicated",
            )
        if self.log.high_watermark <= offset:
            return False
        if len(self.info.isr) < self.config.min_insync_replicas:
            raise KafkaError(
                ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                f"{self.tp}: ISR {list(self.info.isr)} shrank below min.insync.replicas",
            )
        return True

    async def wait_replicated(self, offset: int, timeout: float) -> None:
        """Until `replicated(offset)` (acks=-1); raises with Kafka's code when it cannot be:
        REQUEST_TIMED_OUT, NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS_AFTER_APPEND."""
        if self.replicated(offset):
            return
        await self._wait(self._waiters, offset, timeout, f"offset {offset} not replicated")
        self.replicated(offset)

    async def _wait(
        self,
        waiters: list[tuple[int, asyncio.Future[None]]],
        offset: int,
        timeout: float,
        what: str,
    ) -> None:
        """Until `_wake(waiters, reached)` passes `offset`; REQUEST_TIMED_OUT after `timeout`."""
        future = asyncio.get_running_loop().create_future()
        waiters.append((offset, future))
        try:
            await within(future, timeout)
        except TimeoutError:
            raise KafkaError(
                ErrorCode.REQUEST_TIMED_OUT, f"{self.tp}: {what} by the ISR in time"
            ) from None

    @staticmethod
    def _wake(waiters: list[tuple[int, asyncio.Future[None]]], reached: int) -> None:
        """Answer, in place, the waiters whose offset `reached` passed (the high watermark:
        strictly; a log start: at or past)."""
        waiting = []
        for offset, future in waiters:
            if offset < reached:
                if not future.done():
                    future.set_result(None)
            else:
                waiting.append((offset, future))
        waiters[:] = waiting

    def fail_waiters(self, error: KafkaError) -> None:
        waiters = self._waiters + self._start_waiters
        self._waiters.clear()
        self._start_waiters.clear()
        for _, future in waiters:
            if not future.done():
                future.set_exception(error)

    # DeleteRecords -----------------------------------------------------------------------

    def low_watermark(self) -> int:
        """The lowest log start over the leader and the ISR (with a pending addition): below
        it no replica that may lead next still serves records. A follower that has not said
        its log start since this leadership began counts as -1."""
        low = self.log.log_start_offset
        for replica in set(self.info.isr) | set(self.pending_isr or ()):
            if replica != self.local_id:
                progress = self.followers.get(replica)
                low = min(low, progress.log_start_offset if progress else -1)
        return low

    async def delete_records(self, offset: int, timeout: float) -> int:
        """Kafka's DeleteRecords on the leader: records below `offset` (-1: the high
        watermark) are gone from this log at once and from the ISR's as their fetches learn
        the new log start; answers the low watermark once it reached `offset`. Raises
        OFFSET_OUT_OF_RANGE past the high watermark, REQUEST_TIMED_OUT, or
        NOT_LEADER_OR_FOLLOWER when leadership moves meanwhile."""
        if offset == -1:
            offset = self.log.high_watermark
        self.log.advance_log_start(offset)
        if self.low_watermark() < offset:
            await self._wait(
                self._start_waiters, offset, timeout, f"log start {offset} not reached"
            )
        return self.low_watermark()

    # Followers ---------------------------------------------------------------------------

    def follower_fetched(
        self, replica: int, fetch_offset: int, now_ms: int, log_start_offset: int = -1
    ) -> None:
        """A follower asked for `fetch_offset`, or answered a push with it as its log end:
        it holds everything before it (and nothing below `log_start_offset`, when a fetch
        says so; a push reply does not)."""
        progress = self.followers.get(replica)
        if progress is None:
            raise KafkaError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{self.tp}: broker {replica} is no replica"
            )
        if log_start_offset >= 0:
            progress.log_start_offset = log_start_offset
        leader_end = self.log.log_end_offset
        if fetch_offset >= leader_end:
            progress.last_caught_up_ms = now_ms
        elif fetch_offset >= progress.leader_end_at_last_fetch >= 0:
            progress.last_caught_up_ms = max(progress.last_caught_up_ms, progress.last_fetch_ms)
        progress.log_end_offset = fetch_offset
        progress.last_fetch_ms = now_ms
        progress.leader_end_at_last_fetch = leader_end
        self._maybe_expand_isr(replica, progress)
        if self.maybe_advance_high_watermark() and self.push_listener is not None:
            self.push_listener(self)

    def _maybe_expand_isr(self, replica: int, progress: FollowerProgress) -> None:
        if replica in self.info.isr or self.pending_isr is not None:
            return
        if (
            progress.log_end_offset >= self.log.high_watermark
            and progress.log_end_offset >= self._leader_epoch_start
        ):
            self._propose(tuple(sorted((*self.info.isr, replica))))

    def maybe_shrink_isr(self, now_ms: int, lag_ms: int) -> None:
        if not self.is_leader or self.pending_isr is not None:
            return
        lagging = {
            replica
            for replica in self.info.isr
            if replica != self.local_id
            and now_ms - self.followers[replica].last_caught_up_ms > lag_ms
        }
        if lagging:
            log.info("%s: replicas %s fell behind; shrinking the ISR", self.tp, sorted(lagging))
            self._propose(tuple(r for r in self.info.isr if r not in lagging))

    def _propose(self, isr: tuple[int, ...]) -> None:
        self.pending_isr = isr
        self._propose_isr(self, isr)

    def isr_change_settled(self, info: PartitionInfo | None) -> None:
        """The controller answered an ISR change (with the state now in force, or None)."""
        self.pending_isr = None
        if (
            info is not None
            and self.is_leader
            and info.leader == self.local_id
            and info.leader_epoch == self.info.leader_epoch
            and info.partition_epoch > self.info.partition_epoch
        ):
            self._log_isr_change(info)
            self.info = info  # leadership moved on otherwise: the image will say so
        self.maybe_advance_high_watermark()

    def _log_isr_change(self, info: PartitionInfo) -> None:
        """The leader's one line per ISR change, whichever news of it comes first (the
        controller's answer or the image)."""
        if info.isr != self.info.isr:
            log.info("%s: ISR now %s", self.tp, list(info.isr))

    def maybe_advance_high_watermark(self) -> bool:
        """Move the high watermark up to what the ISR holds; True if it moved (and waiting
        fetches and acks=-1 produces were told). DeleteRecords waiting for the ISR's log
        starts are answered here too: a fetch or an ISR change may have moved them."""
        if not self.is_leader:
            return False
        if self._start_waiters:
            self._wake(self._start_waiters, self.low_watermark() + 1)
        members = set(self.info.isr) | set(self.pending_isr or ())
        end = self.log.log_end_offset
        for replica in members:
            if replica != self.local_id:
                progress = self.followers.get(replica)
                end = min(end, progress.log_end_offset if progress else -1)
        if end > self.log.high_watermark:
            high_watermark = self.log.update_high_watermark(end)
            for listener in list(self.log.listeners):
                listener.high_watermark_moved(self.log)
            self._wake(self._waiters, high_watermark)
            self._notify()
            return True
        return False
