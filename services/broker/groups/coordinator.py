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
        # TxnOffsetCommit (KIP-98): offsets written in a transaction, by (partition,
        # producer id), that take effect when its COMMIT marker is written there.
        self._pending_txn: dict[tuple[int, int], list[tuple[str, str, int, CommittedOffset]]] = {}

    # Loading and unloading ----------------------------------------------------------------

    def _read(self, partition: Partition) -> list[Read]:
        return _read_offsets(partition)

    def _apply(self, index: int, owned: LedPartition, read: list[Read]) -> int:
        now = self._clock()
        records, open_txns = _settle_transactions(read)
        for log_offset, key, value in records:
            self._replay(owned, log_offset, key, value, now)
        for producer_id, txn_records in open_txns.items():
            for log_offset, key, value in txn_records:
                self._hold(index, producer_id, log_offset, key, value)
        return len(records)

    def _replay(
        self, owned: LedPartition, log_offset: int, key: bytes, value: bytes | None, now: int
    ) -> None:
        try:
            decoded = decode_key(key)
            if isinstance(decoded, OffsetKey):
                group = self._group(owned, decoded.group, create=value is not None)
                if group is not None:
                    offset = None
                    if value is not None:
                        v = decode_offset_value(value)
                        offset = CommittedOffset(
                            v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, log_offset
                        )
                    group.committed(decoded.topic, decoded.partition, offset)
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

    def _hold(
        self, index: int, producer_id: int, log_offset: int, key: bytes, value: bytes | None
    ) -> None:
        """Keep a transaction's offset commit read back from the log until its marker."""
        try:
            decoded = decode_key(key)
            if isinstance(decoded, OffsetKey) and value is not None:
                v = decode_offset_value(value)
                offset = CommittedOffset(
                    v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, log_offset
                )
                self._pending_txn.setdefault((index, producer_id), []).append(
                    (decoded.group, decoded.topic, decoded.partition, offset)
                )
        except Exception as error:
            log.warning("%s at %d: skipping a record: %s", OFFSETS_TOPIC, log_offset, error)

    def _dropped(self, index: int, owned: LedPartition) -> None:
        for pending in [k for k in self._pending_txn if k[0] == index]:
            del self._pending_txn[pending]
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
        code, first = await self._append(group_id, records)
        if code in TOO_LARGE:
            code = ErrorCode.INVALID_COMMIT_OFFSET_SIZE
        for n, (i, commit) in enumerate(kept):
            codes[i] = code
            if code is ErrorCode.NONE and self.groups.get(group_id) is group:
                metadata = commit.metadata or ""
                group.committed(
                    commit.topic,
                    commit.partition,
                    CommittedOffset(commit.offset, commit.leader_epoch, metadata, now, first + n),
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
            self._group(owned, group_id, create=True)
        now = self._clock()
        codes, records, kept = self._offset_records(group_id, commits, now)
        if not records:
            return codes
        partition = owned.partition
        index = partition.tp.partition

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
            return appended

        code, first = await append_replicated(
            partition, append, self.settings.commit_timeout_ms, f"group {group_id}"
        )
        if code is not ErrorCode.NONE:
            return [code if c is ErrorCode.NONE else c for c in codes]
        if self.owned.get(index) is owned:
            held = self._pending_txn.setdefault((index, producer_id), [])
            for n, (_, commit) in enumerate(kept):
                offset = CommittedOffset(
                    commit.offset, commit.leader_epoch, commit.metadata or "", now, first + n
                )
                held.append((group_id, commit.topic, commit.partition, offset))
        return codes

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
        """A marker of the producer's transaction is written to __consumer_offsets-index
        (by this broker as its leader): its offset commits take effect, or are dropped."""
        held = self._pending_txn.pop((index, producer_id), [])
        owned = self.owned.get(index)
        if not commit or owned is None:
            return
        for group_id, topic, partition, offset in held:
            group = self._group(owned, group_id, create=True)
            assert group is not None
            group.committed(topic, partition, offset)

    def fetch_offsets(
        self, group_id: str, wanted: list[tuple[str, list[int]]] | None
    ) -> dict[tuple[str, int], CommittedOffset | None]:
        """OffsetFetch: the committed offset of each wanted partition (None: none), or of
        every partition the group committed when `wanted` is None. Raises KafkaError when
        this broker cannot answer for the group."""
        group = self.lookup(group_id)
        offsets = group.offsets if group is not None else {}
        if wanted is None:
            return dict(offsets)
        return {(t, p): offsets.get((t, p)) for t, partitions in wanted for p in partitions}

    async def delete_offsets(
        self, group_id: str, partitions: list[tuple[str, int]], subscribed: set[str]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """OffsetDelete (Kafka's rules): not for a group with members, unless it is a
        consumer group not subscribed to the topic (GROUP_SUBSCRIBED_TO_TOPIC)."""
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
        for tp in partitions:
            if group.members and tp[0] in subscribed:
                results[tp] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                results[tp] = ErrorCode.NONE
                if tp in group.offsets:
                    deleting.append(tp)
        if deleting:
            code = await self._tombstone_offsets(group, deleting)
            if code is not ErrorCode.NONE:
                return code, {}
        return ErrorCode.NONE, results

    async def delete_group(self, group_id: str) -> ErrorCode:
        """DeleteGroups for one group: only one without members (NON_EMPTY_GROUP)."""
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
        code, _ = await self._append(group_id, records)
        if code is ErrorCode.NONE and self.groups.get(group_id) is group:
            self._forget(group)
        return code

    async def _tombstone_offsets(
        self, group: Group, partitions: list[tuple[str, int]]
    ) -> ErrorCode:
        records: list[tuple[bytes, bytes | None]] = [
            (encode_offset_key(OffsetKey(group.group_id, t, p)), None) for t, p in partitions
        ]
        code, _ = await self._append(group.group_id, records)
        if code is ErrorCode.NONE:
            for topic, partition in partitions:
                group.committed(topic, partition, None)
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
        offsets goes too."""
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
    their second join, no committed offsets."""
    return (
        group.state is GroupState.EMPTY
        and not group.members
        and not group.pending_members
        and not group.offsets
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


def _settle_transactions(read: list[Read]) -> tuple[list[Keyed], dict[int, list[Keyed]]]:
    """The records that count, in log order — those outside transactions, and those of
    committed transactions placed at their COMMIT marker — and the records of the
    transactions still open, by producer id (aborted ones are dropped)."""
    settled: list[Keyed] = []
    open_txns: dict[int, list[Keyed]] = {}
    for producer, item in read:
        if producer is None:
            assert not isinstance(item, bool)
            settled.append(item)
        elif isinstance(item, bool):
            ended = open_txns.pop(producer, [])
            if item:
                settled.extend(ended)
        else:
            open_txns.setdefault(producer, []).append(item)
    return settled, open_txns
