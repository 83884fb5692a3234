"""The group coordinator of one broker: the groups whose `__consumer_offsets` partition this
broker leads, their membership (group.py) driven by requests and a clock, and their
committed offsets, durable in that partition.

Durability is Kafka's design (services/broker/internal_topic_coordinator.py): every commit,
and every group generation a leader's assignment completes, is a record in the group's
partition of the compacted `__consumer_offsets` topic, answered once the ISR has it. A new
leader of a partition serves its groups, members included, so a coordinator failover keeps
every acknowledged commit and members need not rejoin; anything waiting on a partition this
broker stops leading is told NOT_COORDINATOR.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.records.batch import Record, build_batch
from directlog.records.markers import COMMIT, control_type
from services.broker.groups.group import (
    CommittedOffset,
    Group,
    GroupLimits,
    GroupState,
    JoinReply,
    JoinRequest,
    LeaveResult,
    Reply,
    SyncReply,
)
from services.broker.groups.offsets_topic import (
    OFFSETS_TOPIC,
    GroupKey,
    GroupValue,
    OffsetKey,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from services.broker.internal_topic_coordinator import (
    TOO_LARGE,
    InternalTopicCoordinator,
    Keyed,
    LedPartition,
    append_replicated,
    read_partition,
    wall_ms,
)
from services.broker.partition import Partition
from services.broker.storage.log import AppendResult

log = logging.getLogger(__name__)

TICK_SECONDS = 0.1  # how often deadlines are checked


@dataclass(frozen=True, slots=True)
class CoordinatorSettings:
    """Kafka's offsets.* and group.* broker settings, with its defaults."""

    limits: GroupLimits = field(default_factory=GroupLimits)
    commit_timeout_ms: int = 5000  # offsets.commit.timeout.ms
    metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.ms
    retention_check_interval_ms: int = 600000  # offsets.retention.check.interval.ms


@dataclass(frozen=True, slots=True)
class Commit:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None


# What _read_offsets finds: a record outside any transaction (producer id None), one in a
# producer's transaction, or that producer's marker (commit: True/False).
Read = tuple[int | None, Keyed | bool]


class GroupCoordinator(InternalTopicCoordinator[list[Read]]):
    topic = OFFSETS_TOPIC
    noun = "groups"

    def __init__(
        self,
        settings: CoordinatorSettings,
        partition_count: Callable[[], int],
        clock: Callable[[], int] = wall_ms,
    ) -> None:
        super().__init__(partition_count, clock)
        self.settings = settings
        self.groups: dict[str, Group] = {}
        self._waiters: dict[tuple[str, str, str], asyncio.Future[Reply]] = {}
        self._next_expiry_check = 0
        # TxnOffsetCommit (KIP-98): the groups holding offsets of each producer's open
        # transaction, by (partition, producer id); they count from its COMMIT marker on
        # (Kafka's openGroupsForProducer). The offsets themselves wait in the groups.
        self._open_txns: dict[tuple[int, int], set[str]] = {}
        # Markers written while a partition loads, applied once it has (producer id, commit).
        self._early_markers: dict[int, list[tuple[int, bool]]] = {}

    # Loading and unloading ----------------------------------------------------------------

    def _read(self, partition: Partition) -> list[Read]:
        return _read_offsets(partition)

    def _apply(self, index: int, owned: LedPartition, read: list[Read]) -> int:
        """Replay the partition in log order through the same steps as the live requests,
        so a successor ends where the leader was: plain commits count at once, those of a
        transaction from its COMMIT marker on, each losing to a commit of the partition
        written later (Kafka's loadGroupsAndOffsets with its `olderThan` rule)."""
        now = self._clock()
        used = 0
        for producer_id, item in read:
            if isinstance(item, bool):
                assert producer_id is not None  # markers are read for producers only
                self._end_txn(index, producer_id, item)
                continue
            used += 1
            self._replay(index, owned, producer_id, item, now)
        for producer_id, commit in self._early_markers.pop(index, []):
            self._end_txn(index, producer_id, commit)
        return used

    def _replay(
        self, index: int, owned: LedPartition, producer_id: int | None, record: Keyed, now: int
    ) -> None:
        log_offset, key, value = record
        try:
            decoded = decode_key(key)
            if isinstance(decoded, OffsetKey):
                tp = (decoded.topic, decoded.partition)
                group = self._group(owned, decoded.group, create=value is not None)
                if group is None:
                    return
                if value is None:
                    if producer_id is None:
                        group.uncommitted(*tp, log_offset)
                        group.cancel_pending([tp])
                    else:
                        group.txn_uncommitted(producer_id, *tp)
                    return
                v = decode_offset_value(value)
                offset = CommittedOffset(
                    v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, log_offset
                )
                if producer_id is None:
                    group.committed(*tp, offset)
                else:
                    group.txn_commit_started(producer_id, {tp: offset})
                    self._open_txns.setdefault((index, producer_id), set()).add(decoded.group)
            elif value is None:
                self.groups.pop(decoded.group, None)
                owned.ids.discard(decoded.group)
            else:
                group = self._group(owned, decoded.group, create=True)
                assert group is not None
                group.load(decode_group_value(value), now)
        except Exception as error:  # one bad record must not hide the others
            log.warning("%s at %d: skipping a record: %s", OFFSETS_TOPIC, log_offset, error)

    def _group(self, owned: LedPartition, group_id: str, *, create: bool) -> Group | None:
        group = self.groups.get(group_id)
        if group is None and create:
            group = self.groups[group_id] = Group(
                group_id, self._clock(), self.settings.limits, _new_member_id
            )
            owned.ids.add(group_id)
        return group

    def _dropped(self, index: int, owned: LedPartition) -> None:
        for pending in [k for k in self._open_txns if k[0] == index]:
            del self._open_txns[pending]
        self._early_markers.pop(index, None)
        for group_id in owned.ids:
            group = self.groups.pop(group_id, None)
            if group is not None:
                group.mark_dead()
                self._deliver(group)

    # Finding a group --------------------------------------------------------------------

    def _owned(self, group_id: str) -> LedPartition:
        """As the base's, and INVALID_GROUP_ID for an empty group id."""
        if not group_id:
            raise KafkaError(ErrorCode.INVALID_GROUP_ID, "the group id is empty")
        return super()._owned(group_id)

    def lookup(self, group_id: str, *, create: bool = False) -> Group | None:
        owned = self._owned(group_id)
        return self._group(owned, group_id, create=create)

    # Membership ---------------------------------------------------------------------------

    async def join(self, group_id: str, request: JoinRequest) -> JoinReply:
        try:
            group = self.lookup(group_id, create=True)
        except KafkaError as error:
            return JoinReply(request.member_id, error.code)
        assert group is not None
        outcome = group.join(request, self._clock())
        if isinstance(outcome, JoinReply):
            self._after(group)
            if outcome.error is not ErrorCode.NONE and _unused(group):
                self._forget(group)  # a refused first join leaves no group behind
            return outcome
        future = self._wait("join", group_id, outcome)
        self._after(group)
        reply = await future
        assert isinstance(reply, JoinReply)
        return reply

    async def sync(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        generation: int,
        protocol_type: str | None,
        protocol: str | None,
        assignments: dict[str, bytes],
    ) -> SyncReply:
        try:
            group = self.lookup(group_id)
        except KafkaError as error:
            return SyncReply(member_id, error.code)
        if group is None:
            return SyncReply(member_id, ErrorCode.UNKNOWN_MEMBER_ID)
        now = self._clock()
        reply = group.sync(member_id, group_instance_id, generation, protocol_type, protocol, now)
        if reply is not None:
            return reply
        future = self._wait("sync", group_id, member_id)
        if member_id == group.leader:
            known = {m: a for m, a in assignments.items() if m in group.members}
            stored = await self._store_group(group, group.to_value(known))
            group.assignment_stored(generation, known, stored, self._clock())
            self._after(group)
        answer = await future
        assert isinstance(answer, SyncReply)
        return answer

    def heartbeat(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation: int
    ) -> ErrorCode:
        try:
            group = self.lookup(group_id)
        except KafkaError as error:
            return error.code
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        code = group.heartbeat(member_id, group_instance_id, generation, self._clock())
        self._after(group)
        return code

    def leave(
        self, group_id: str, leaving: list[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[LeaveResult]]:
        try:
            group = self.lookup(group_id)
        except KafkaError as error:
            return error.code, []
        if group is None:
            return ErrorCode.NONE, [
                LeaveResult(m, i, ErrorCode.UNKNOWN_MEMBER_ID) for m, i in leaving
            ]
        results = group.leave(leaving, self._clock())
        self._after(group)
        return ErrorCode.NONE, results

    def _wait(self, kind: str, group_id: str, member_id: str) -> asyncio.Future[Reply]:
        key = (kind, group_id, member_id)
        earlier = self._waiters.pop(key, None)
        if earlier is not None and not earlier.done():
            # The client sent the request again (it timed out waiting); the older one is moot.
            earlier.set_result(
                JoinReply(member_id, ErrorCode.REBALANCE_IN_PROGRESS)
                if kind == "join"
                else SyncReply(member_id, ErrorCode.REBALANCE_IN_PROGRESS)
            )
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiters[key] = future
        return future

    def _after(self, group: Group) -> None:
        """Deliver the answers a call or a tick produced and store what must be durable."""
        self._deliver(group)
        if group.take_store():
            self._spawn(self._store_group_logged(group))

    def _deliver(self, group: Group) -> None:
        for reply in group.take_replies():
            kind = "join" if isinstance(reply, JoinReply) else "sync"
            future = self._waiters.pop((kind, group.group_id, reply.member_id), None)
            if future is not None and not future.done():
                future.set_result(reply)

    async def _store_group_logged(self, group: Group) -> None:
        error = await self._store_group(group, group.to_value())
        if error is not ErrorCode.NONE:
            log.warning("group %s: metadata not stored: %s", group.group_id, error.name)

    async def _store_group(self, group: Group, value: GroupValue) -> ErrorCode:
        code, _ = await self._append(
            group.group_id,
            [(encode_group_key(GroupKey(group.group_id)), encode_group_value(value))],
        )
        return ErrorCode.UNKNOWN_SERVER_ERROR if code in TOO_LARGE else code

    # Offsets -------------------------------------------------------------------------------

    async def commit(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        generation: int,
        commits: list[Commit],
    ) -> list[ErrorCode]:
        """OffsetCommit: one code per commit, in order."""
        try:
            owned = self._owned(group_id)
        except KafkaError as error:
            return [error.code] * len(commits)
        group = self.groups.get(group_id)
        if group is None:
            if generation >= 0 or member_id or group_instance_id is not None:
                # The group is gone (expired, deleted, or moved and back): a stale member.
                return [ErrorCode.ILLEGAL_GENERATION] * len(commits)
            group = self._group(owned, group_id, create=True)
            assert group is not None
        code = group.validate_commit(member_id, group_instance_id, generation, self._clock())
        if code is not ErrorCode.NONE:
            return [code] * len(commits)
        now = self._clock()
        codes, records, kept = self._offset_records(group_id, commits, now)
        if not records:
            return codes
        written = {(c.topic, c.partition) for _, c in kept}
        token = group.commit_started(written)
        code, first = await self._append(group_id, records)
        if code in TOO_LARGE:
            code = ErrorCode.INVALID_COMMIT_OFFSET_SIZE
        # Those an OffsetDelete or DeleteGroups cancelled meanwhile do not count.
        counted = {tp for tp in written if group.commit_finished(token, *tp)}
        for n, (i, commit) in enumerate(kept):
            codes[i] = code
            if code is ErrorCode.NONE and (commit.topic, commit.partition) in counted:
                group.committed(
                    commit.topic,
                    commit.partition,
                    _committed(commit, now, first + n),
                )
        return codes

    async def txn_commit(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        member_id: str,
        generation: int,
        commits: list[Commit],
    ) -> list[ErrorCode]:
        """TxnOffsetCommit: the offsets are written to the group's partition in the
        producer's transaction (its id and epoch on the batch) and take effect when the
        transaction's COMMIT marker is written there; one code per commit, in order.
        Kafka's checks: a member id, if given, must be a member; a generation, if given,
        the group's."""
        try:
            owned = self._owned(group_id)
        except KafkaError as error:
            return [error.code] * len(commits)
        group = self.groups.get(group_id)
        code = ErrorCode.NONE
        if group is not None and group.state is GroupState.DEAD:
            code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        elif member_id and (group is None or member_id not in group.members):
            code = ErrorCode.UNKNOWN_MEMBER_ID
        elif generation >= 0 and (group is None or generation != group.generation):
            code = ErrorCode.ILLEGAL_GENERATION
        if code is not ErrorCode.NONE:
            return [code] * len(commits)
        if group is None:
            group = self._group(owned, group_id, create=True)
            assert group is not None
        now = self._clock()
        codes, records, kept = self._offset_records(group_id, commits, now)
        if not records:
            return codes
        partition = owned.partition
        index = partition.tp.partition
        # Pending from now on (a stable OffsetFetch answers UNSTABLE_OFFSET_COMMIT), with
        # its log position once appended: the append runs before anything else can.
        group.txn_commit_started(
            producer_id, {(c.topic, c.partition): _committed(c, now, -1) for _, c in kept}
        )
        self._open_txns.setdefault((index, producer_id), set()).add(group_id)
        appended_at: list[int] = []

        def build(base_offset: int, timestamp: int) -> bytes:
            return build_batch(
                [
                    Record(base_offset + n, timestamp, key, value)
                    for n, (key, value) in enumerate(records)
                ],
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                partition_leader_epoch=partition.leader_epoch,
                transactional=True,
            )

        def append() -> AppendResult:
            partition.check_appendable(-1)
            appended = partition.log.append_from_coordinator(build, partition.leader_epoch)
            partition.appended()
            appended_at.append(appended.first_offset)
            group.txn_commit_appended(
                producer_id,
                {
                    (c.topic, c.partition): _committed(c, now, appended.first_offset + n)
                    for n, (_, c) in enumerate(kept)
                },
            )
            return appended

        code, _ = await append_replicated(
            partition, append, self.settings.commit_timeout_ms, f"group {group_id}"
        )
        if code is ErrorCode.NONE:
            return codes
        if not appended_at:
            # Never written. Once in the log, they stay pending whatever the ISR does, as
            # a successor reading the log would hold them: the transaction decides.
            group.txn_commit_failed(producer_id, [(c.topic, c.partition) for _, c in kept])
        return [code if c is ErrorCode.NONE else c for c in codes]

    def _offset_records(
        self, group_id: str, commits: list[Commit], now: int
    ) -> tuple[list[ErrorCode], list[tuple[bytes, bytes | None]], list[tuple[int, Commit]]]:
        """The records of a commit request: a code per commit (NONE so far, or
        OFFSET_METADATA_TOO_LARGE), the key and value of each kept one, and the kept ones
        with their index in the request."""
        codes = [ErrorCode.NONE] * len(commits)
        records: list[tuple[bytes, bytes | None]] = []
        kept: list[tuple[int, Commit]] = []
        for i, commit in enumerate(commits):
            metadata = commit.metadata or ""
            if len(metadata.encode("utf-8")) > self.settings.metadata_max_bytes:
                codes[i] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                continue
            key = encode_offset_key(OffsetKey(group_id, commit.topic, commit.partition))
            value = OffsetValue(commit.offset, commit.leader_epoch, metadata, now)
            records.append((key, encode_offset_value(value)))
            kept.append((i, commit))
        return codes, records, kept

    def transaction_ended(self, index: int, producer_id: int, commit: bool) -> None:
        """A marker of the producer's transaction is in the ISR of __consumer_offsets-index
        (written by this broker as its leader): its offset commits count, or are dropped.
        A group deleted since keeps none of them (as in Kafka, none is re-created)."""
        owned = self.owned.get(index)
        if owned is None:
            return
        if not owned.loaded:
            # Written after the load read the log: applied once the load is done.
            self._early_markers.setdefault(index, []).append((producer_id, commit))
            return
        self._end_txn(index, producer_id, commit)

    def _end_txn(self, index: int, producer_id: int, commit: bool) -> None:
        for group_id in self._open_txns.pop((index, producer_id), ()):
            group = self.groups.get(group_id)
            if group is not None and group.state is not GroupState.DEAD:
                group.txn_ended(producer_id, commit)

    def fetch_offsets(
        self,
        group_id: str,
        wanted: list[tuple[str, list[int]]] | None,
        require_stable: bool = False,
    ) -> dict[tuple[str, int], CommittedOffset | ErrorCode | None]:
        """OffsetFetch: the committed offset of each wanted partition (None: none), or of
        every partition the group committed when `wanted` is None. With `require_stable`
        (KIP-447, OffsetFetch v7+), a partition whose commit is still being written or
        waits for its transaction is UNSTABLE_OFFSET_COMMIT instead, as in Kafka. Raises
        KafkaError when this broker cannot answer for the group."""
        group = self.lookup(group_id)
        if group is None:
            return {} if wanted is None else {(t, p): None for t, ps in wanted for p in ps}
        keys = list(group.offsets) if wanted is None else [(t, p) for t, ps in wanted for p in ps]
        return {
            tp: ErrorCode.UNSTABLE_OFFSET_COMMIT
            if require_stable and group.is_unstable(*tp)
            else group.offsets.get(tp)
            for tp in keys
        }

    async def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]], subscribed: set[str]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """OffsetDelete (Kafka's rules): not for a group with members, unless it is a
        consumer group not subscribed to the topic (GROUP_SUBSCRIBED_TO_TOPIC). As in
        Kafka, commits of those partitions still being written or waiting for their
        transaction are cancelled too; a tombstone is written for them as well, so a
        successor reading the log cancels them at the same place."""
        try:
            group = self.lookup(group_id)
        except KafkaError as error:
            return error.code, {}
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        if group.members and group.protocol_type != "consumer":
            return ErrorCode.NON_EMPTY_GROUP, {}
        results: dict[tuple[str, int], ErrorCode] = {}
        deleting = []
        pending = group.pending_partitions()
        for tp in partitions:
            if group.members and tp[0] in subscribed:
                results[tp] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                results[tp] = ErrorCode.NONE
                if (tp in group.offsets or tp in pending) and tp not in deleting:
                    deleting.append(tp)
        if deleting:
            group.cancel_pending(deleting)
            code = await self._tombstone_offsets(group, deleting)
            if code is not ErrorCode.NONE:
                return code, {}
        return ErrorCode.NONE, results

    async def delete_group(self, group_id: str) -> ErrorCode:
        """DeleteGroups for one group: only one without members (NON_EMPTY_GROUP). As in
        Kafka, the group is gone at once, with its commits still being written or waiting
        for their transaction (a COMMIT marker later finds no group to apply them to, as a
        successor finds the group's tombstone before it); a request meanwhile meets a new
        group, whose records follow the tombstones."""
        try:
            group = self.lookup(group_id)
        except KafkaError as error:
            return error.code
        if group is None or group.state is GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.state is not GroupState.EMPTY:
            return ErrorCode.NON_EMPTY_GROUP
        records: list[tuple[bytes, bytes | None]] = [
            (encode_offset_key(OffsetKey(group_id, t, p)), None) for t, p in group.offsets
        ]
        records.append((encode_group_key(GroupKey(group_id)), None))
        self._forget(group)
        code, _ = await self._append(group_id, records)
        return code

    async def _tombstone_offsets(
        self, group: Group, partitions: list[tuple[str, int]]
    ) -> ErrorCode:
        records: list[tuple[bytes, bytes | None]] = [
            (encode_offset_key(OffsetKey(group.group_id, t, p)), None) for t, p in partitions
        ]
        code, first = await self._append(group.group_id, records)
        if code is ErrorCode.NONE:
            for n, (topic, partition) in enumerate(partitions):
                group.uncommitted(topic, partition, first + n)
        return code

    def _forget(self, group: Group) -> None:
        group.mark_dead()
        self._deliver(group)
        self.groups.pop(group.group_id, None)
        owned = self.owned.get(self.partition_of(group.group_id))
        if owned is not None:
            owned.ids.discard(group.group_id)

    # Listing ----------------------------------------------------------------------------

    def listed_groups(self) -> list[Group]:
        """Groups of every loaded partition this broker leads."""
        return [
            self.groups[g]
            for owned in self.owned.values()
            if owned.loaded
            for g in sorted(owned.ids)
            if g in self.groups and self.groups[g].state is not GroupState.DEAD
        ]

    # Appending to __consumer_offsets -------------------------------------------------------

    async def _append(
        self, group_id: str, records: list[tuple[bytes, bytes | None]]
    ) -> tuple[ErrorCode, int]:
        """Append records to the group's partition as its leader and wait for the ISR:
        (NONE, first offset) or the code the client gets."""
        owned = self.owned.get(self.partition_of(group_id))
        if owned is None:
            return ErrorCode.NOT_COORDINATOR, -1
        now = self._clock()
        batch = build_batch([Record(i, now, key, value) for i, (key, value) in enumerate(records)])
        partition = owned.partition
        return await append_replicated(
            partition,
            lambda: partition.append_as_leader(batch, -1),
            self.settings.commit_timeout_ms,
            f"group {group_id}",
        )

    # Time ---------------------------------------------------------------------------------

    def _tick_seconds(self) -> float:
        return TICK_SECONDS

    def tick(self) -> None:
        now = self._clock()
        for group in list(self.groups.values()):
            group.tick(now)
            self._after(group)
        if now >= self._next_expiry_check:
            self._next_expiry_check = now + self.settings.retention_check_interval_ms
            self._spawn(self._expire_offsets())

    async def _expire_offsets(self) -> None:
        """offsets.retention.ms (Kafka 2.1+): a group's offsets go once it has been Empty
        that long (a group that never had members: each offset that long after its commit);
        a group left with no members, no member id waiting for its second join and no
        offsets goes too. A partition with a commit still being written or waiting for its
        transaction is kept until that ends (Kafka skips only the first kind; skipping both
        keeps a successor, which reads a tombstone as cancelling what is pending, in step),
        and so is a group with any."""
        now = self._clock()
        retention = self.settings.retention_ms
        for group in list(self.groups.values()):
            if group.state is not GroupState.EMPTY or not self._is_loaded(group.group_id):
                continue
            if group.protocol_type is None and group.generation == 0:
                expired = [
                    tp for tp, o in group.offsets.items() if o.commit_timestamp + retention <= now
                ]
            elif group.state_timestamp + retention <= now:
                expired = list(group.offsets)
            else:
                continue
            expired = [tp for tp in expired if not group.is_unstable(*tp)]
            if expired:
                log.info("group %s: %d committed offsets expired", group.group_id, len(expired))
                if await self._tombstone_offsets(group, expired) is not ErrorCode.NONE:
                    continue
            if _abandoned(group):
                code, _ = await self._append(
                    group.group_id, [(encode_group_key(GroupKey(group.group_id)), None)]
                )
                # A join may have come while the tombstone replicated: the group is in use
                # again, and what it stores later supersedes the tombstone.
                if (
                    code is ErrorCode.NONE
                    and self.groups.get(group.group_id) is group
                    and _abandoned(group)
                ):
                    self._forget(group)


def _abandoned(group: Group) -> bool:
    """Empty with nothing to keep: no members, no member ids handed out and waiting for
    their second join, no offsets (committed, being written or in an open transaction)."""
    return (
        group.state is GroupState.EMPTY
        and not group.members
        and not group.pending_members
        and not group.has_offsets()
    )


def _committed(commit: Commit, now: int, log_offset: int) -> CommittedOffset:
    return CommittedOffset(
        commit.offset, commit.leader_epoch, commit.metadata or "", now, log_offset
    )


def _unused(group: Group) -> bool:
    return group.generation == 0 and _abandoned(group)


def _new_member_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


def _read_offsets(partition: Partition) -> list[Read]:
    """Every keyed record of the partition and every transaction marker, in order."""
    out: list[Read] = []
    for header, record in read_partition(partition):
        producer = header.producer_id if header.is_transactional else None
        if header.is_control:
            if producer is not None:
                out.append((producer, control_type(record.key) == COMMIT))
        elif record.key is not None:
            out.append((producer, (record.offset, record.key, record.value)))
    return out
