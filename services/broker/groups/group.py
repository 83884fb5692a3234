"""One consumer group's membership protocol, as Kafka's classic group coordinator runs it,
without I/O or clocks: calls carry the time, and answers that must wait (a JoinGroup until
the rebalance completes, a SyncGroup until the leader's assignment is stored) come out later
through `take_replies`. What must be made durable comes out through `take_store`.

States (Kafka's names): Empty (no members, maybe offsets), PreparingRebalance (collecting
JoinGroups until every known member rejoined or the rebalance timeout passed),
CompletingRebalance (the generation is formed; waiting for the leader's assignment), Stable,
Dead (deleted or moved to another coordinator).

The rules follow Kafka's GroupCoordinator: two-phase join (MEMBER_ID_REQUIRED, JoinGroup v4+)
for members without an id; static members (`group.instance.id`) keep their identity across
restarts and a newer incarnation fences the older one (FENCED_INSTANCE_ID); a follower that
rejoins a Stable group with unchanged metadata gets the current generation back without a
rebalance; a new group waits `group.initial.rebalance.delay.ms` for more members; members
whose heartbeats stop for their session timeout are removed, as are members that do not
rejoin within the rebalance timeout or do not sync within it after the join completed.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from directlog.protocol.errors import ErrorCode
from services.broker.groups.offsets_topic import GroupValue, MemberValue


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """Kafka's broker settings for groups, with its defaults."""

    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1800000
    max_size: int = (1 << 31) - 1


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    heartbeat_deadline: int = 0
    joining: bool = False  # a JoinGroup waits for the rebalance to complete
    syncing: bool = False  # a SyncGroup waits for the leader's assignment

    def metadata(self, protocol: str | None) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")

    def to_value(self, protocol: str | None) -> MemberValue:
        return MemberValue(
            self.member_id,
            self.group_instance_id,
            self.client_id,
            self.client_host,
            self.rebalance_timeout_ms,
            self.session_timeout_ms,
            self.metadata(protocol),
            self.assignment,
        )


@dataclass(frozen=True, slots=True)
class JoinRequest:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    require_known_member_id: bool  # JoinGroup v4+: a new member first gets its id
    can_skip_assignment: bool = False  # JoinGroup v9+ (KIP-814): a leader may skip assigning


@dataclass(frozen=True, slots=True)
class JoinReply:
    member_id: str
    error: ErrorCode
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    # For the leader: every member's id, instance id and metadata for the chosen protocol.
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)
    skip_assignment: bool = False  # a rejoined static leader keeps the current assignment


@dataclass(frozen=True, slots=True)
class SyncReply:
    member_id: str
    error: ErrorCode
    protocol_type: str | None = None
    protocol: str | None = None
    assignment: bytes = b""


Reply = JoinReply | SyncReply


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    log_offset: int  # of its record in __consumer_offsets (-1: being written); later wins


@dataclass(frozen=True, slots=True)
class LeaveResult:
    member_id: str
    group_instance_id: str | None
    error: ErrorCode


class Group:
    def __init__(
        self,
        group_id: str,
        now_ms: int,
        limits: GroupLimits,
        new_member_id: Callable[[str], str],
    ) -> None:
        self.group_id = group_id
        self.limits = limits
        self._new_member_id = new_member_id
        self.state = GroupState.EMPTY
        self.state_timestamp = now_ms
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}  # group.instance.id -> member id
        self.pending_members: dict[str, int] = {}  # ids handed out, not yet joined -> deadline
        self.offsets: dict[tuple[str, int], CommittedOffset] = {}
        # Kafka's pendingTransactionalOffsetCommits: by producer id, offsets written in its
        # open transaction; and its pendingOffsetCommits: plain commits being written, by
        # partition, as the tokens of their writes.
        self.pending_txn: dict[int, dict[tuple[str, int], CommittedOffset]] = {}
        self._writing: dict[tuple[str, int], set[int]] = {}
        self._next_write = 0
        self._rebalance_deadline = 0
        self._initial_join_until = 0  # while a new group waits for more members
        self._replies: list[Reply] = []
        self._store = False

    # Outputs ----------------------------------------------------------------------------

    def take_replies(self) -> list[Reply]:
        replies, self._replies = self._replies, []
        return replies

    def take_store(self) -> bool:
        """True once after a change the group metadata record must carry (a new Empty
        generation); the leader's assignment is stored through `sync` instead."""
        store, self._store = self._store, False
        return store

    def to_value(self, assignments: dict[str, bytes] | None = None) -> GroupValue:
        """The group metadata record; `assignments` overrides members' current ones."""
        members = []
        for member in self.members.values():
            value = member.to_value(self.protocol)
            if assignments is not None:
                value = dataclasses.replace(
                    value, assignment=assignments.get(member.member_id, b"")
                )
            members.append(value)
        return GroupValue(
            self.protocol_type or "",
            self.generation,
            self.protocol,
            self.leader,
            self.state_timestamp,
            members,
        )

    # JoinGroup --------------------------------------------------------------------------

    def join(self, request: JoinRequest, now_ms: int) -> JoinReply | str:
        """The answer now, or the member id the answer will carry: it comes through
        take_replies when the rebalance completes, which may be within this very call."""
        if self.state is GroupState.DEAD:
            return JoinReply(request.member_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not (
            self.limits.min_session_timeout_ms
            <= request.session_timeout_ms
            <= self.limits.max_session_timeout_ms
        ):
            return JoinReply(request.member_id, ErrorCode.INVALID_SESSION_TIMEOUT)
        if not request.protocol_type or not request.protocols or not self._supports(request):
            return JoinReply(request.member_id, ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if request.member_id == "":
            return self._join_new(request, now_ms)
        return self._join_known(request, now_ms)

    def _supports(self, request: JoinRequest) -> bool:
        if not self.members:
            return True
        names = {name for name, _ in request.protocols}
        return request.protocol_type == self.protocol_type and bool(names & self._candidates())

    def _candidates(self) -> set[str]:
        counts = Counter(name for m in self.members.values() for name, _ in m.protocols)
        return {name for name, count in counts.items() if count == len(self.members)}

    def _join_new(self, request: JoinRequest, now_ms: int) -> JoinReply | str:
        instance = request.group_instance_id
        if instance is not None and instance in self.static_members:
            return self._replace_static(request, self.static_members[instance], now_ms)
        if len(self.members) + len(self.pending_members) >= self.limits.max_size:
            return JoinReply("", ErrorCode.GROUP_MAX_SIZE_REACHED)
        member_id = self._new_member_id(instance or request.client_id)
        if instance is None and request.require_known_member_id:
            self.pending_members[member_id] = now_ms + request.session_timeout_ms
            return JoinReply(member_id, ErrorCode.MEMBER_ID_REQUIRED)
        self._add(member_id, request, now_ms)
        return member_id

    def _join_known(self, request: JoinRequest, now_ms: int) -> JoinReply | str:
        member_id = request.member_id
        if member_id in self.pending_members:
            del self.pending_members[member_id]
            self._add(member_id, request, now_ms)
            return member_id
        if self._fenced(member_id, request.group_instance_id):
            return JoinReply(member_id, ErrorCode.FENCED_INSTANCE_ID)
        member = self.members.get(member_id)
        if member is None:
            return JoinReply(member_id, ErrorCode.UNKNOWN_MEMBER_ID)
        unchanged = member.protocols == request.protocols
        if self.state is GroupState.PREPARING_REBALANCE:
            self._update(member, request, now_ms)
            member.joining = True
            self._maybe_complete_join(now_ms)
            return member_id
        if unchanged and (
            self.state is GroupState.COMPLETING_REBALANCE
            or (self.state is GroupState.STABLE and member_id != self.leader)
        ):
            member.heartbeat_deadline = now_ms + member.session_timeout_ms
            return self._join_reply(member_id)  # it missed its answer: the same one again
        self._update(member, request, now_ms)
        member.joining = True
        self._prepare_rebalance(now_ms)
        return member_id

    def _replace_static(self, request: JoinRequest, old_id: str, now_ms: int) -> JoinReply | str:
        """A static member restarted: it takes over the old identity under a new member id;
        whatever the old incarnation waits for is answered FENCED_INSTANCE_ID.

        In a stable group whose protocol it leaves as it is, nothing rebalances (KIP-345):
        the new id is stored and SyncGroup hands back the old assignment. A rejoining leader
        is told it leads but must not assign (KIP-814's SkipAssignment, JoinGroup v9+), so it
        still watches topic metadata; an older client is told the old id leads, so it does not
        assign either."""
        member = self.members.pop(old_id)
        if member.joining:
            self._replies.append(JoinReply(old_id, ErrorCode.FENCED_INSTANCE_ID))
        if member.syncing:
            self._replies.append(SyncReply(old_id, ErrorCode.FENCED_INSTANCE_ID))
        member.joining = member.syncing = False
        new_id = self._new_member_id(request.group_instance_id or request.client_id)
        member.member_id = new_id
        self.members[new_id] = member
        assert request.group_instance_id is not None
        self.static_members[request.group_instance_id] = new_id
        was_leader = self.leader == old_id
        if was_leader:
            self.leader = new_id
        self._update(member, request, now_ms)
        if self.state is GroupState.STABLE and self._select_protocol() == self.protocol:
            self._store = True  # the new member id, with the assignments as they are
            if not was_leader:
                return self._join_reply(new_id)
            if request.can_skip_assignment:
                return dataclasses.replace(self._join_reply(new_id), skip_assignment=True)
            return dataclasses.replace(self._join_reply(new_id), leader=old_id, members=[])
        member.joining = True
        if self.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(now_ms)
        else:
            self._prepare_rebalance(now_ms)
        return new_id

    def _add(self, member_id: str, request: JoinRequest, now_ms: int) -> None:
        member = Member(
            member_id,
            request.group_instance_id,
            request.client_id,
            request.client_host,
            request.rebalance_timeout_ms,
            request.session_timeout_ms,
            request.protocol_type,
            list(request.protocols),
            heartbeat_deadline=now_ms + request.session_timeout_ms,
            joining=True,
        )
        if not self.members:
            self.protocol_type = request.protocol_type
        self.members[member_id] = member
        if request.group_instance_id is not None:
            self.static_members[request.group_instance_id] = member_id
        if self.state is GroupState.PREPARING_REBALANCE:
            if self._initial_join_until:
                # A new group waits a little longer for each member that arrives.
                self._rebalance_deadline = min(
                    now_ms + self.limits.initial_rebalance_delay_ms, self._initial_join_until
                )
            self._maybe_complete_join(now_ms)
        else:
            self._prepare_rebalance(now_ms)

    def _update(self, member: Member, request: JoinRequest, now_ms: int) -> None:
        member.protocols = list(request.protocols)
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.client_id = request.client_id
        member.client_host = request.client_host
        member.heartbeat_deadline = now_ms + request.session_timeout_ms

    def _fenced(self, member_id: str, instance: str | None) -> bool:
        return instance is not None and self.static_members.get(instance) != member_id

    def _join_reply(self, member_id: str) -> JoinReply:
        members = []
        if member_id == self.leader:
            members = [
                (m.member_id, m.group_instance_id, m.metadata(self.protocol))
                for m in self.members.values()
            ]
        return JoinReply(
            member_id,
            ErrorCode.NONE,
            self.generation,
            self.protocol_type,
            self.protocol,
            self.leader or "",
            members,
        )

    # Rebalancing -------------------------------------------------------------------------

    def _prepare_rebalance(self, now_ms: int) -> None:
        if self.state is GroupState.COMPLETING_REBALANCE:
            self._fail_syncs(ErrorCode.REBALANCE_IN_PROGRESS)
        if self.state is GroupState.EMPTY:
            timeout = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
            self._initial_join_until = now_ms + timeout
            self._rebalance_deadline = min(
                now_ms + self.limits.initial_rebalance_delay_ms, self._initial_join_until
            )
        else:
            self._initial_join_until = 0
            self._rebalance_deadline = now_ms + self._rebalance_timeout()
        self._transition(GroupState.PREPARING_REBALANCE, now_ms)
        self._maybe_complete_join(now_ms)

    def _rebalance_timeout(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def _maybe_complete_join(self, now_ms: int) -> None:
        if (
            self.state is GroupState.PREPARING_REBALANCE
            and not self._initial_join_until
            and not self.pending_members
            and all(m.joining for m in self.members.values())
        ):
            self._complete_join(now_ms)

    def _complete_join(self, now_ms: int) -> None:
        """Form the next generation from the members that rejoined. Dynamic members that
        did not are removed; static ones stay (they may be restarting) until their session
        times out, and if only such members are left the group waits for that."""
        for member in [m for m in self.members.values() if not m.joining]:
            if member.group_instance_id is None:
                self._remove(member.member_id)
        self._initial_join_until = 0
        joined = [m.member_id for m in self.members.values() if m.joining]
        if self.members and not joined:
            self._rebalance_deadline = now_ms + self._rebalance_timeout()
            return
        self.generation += 1
        if not self.members:
            # The protocol type stays, as in Kafka: an emptied consumer group is still
            # listed as one, not as a group that only commits offsets.
            self.protocol = self.leader = None
            self._transition(GroupState.EMPTY, now_ms)
            self._store = True
            return
        self.protocol = self._select_protocol()
        if self.leader not in joined:
            self.leader = joined[0]
        self._rebalance_deadline = now_ms + self._rebalance_timeout()
        self._transition(GroupState.COMPLETING_REBALANCE, now_ms)
        for member in self.members.values():
            member.assignment = b""
            if member.joining:
                member.joining = False
                member.heartbeat_deadline = now_ms + member.session_timeout_ms
                self._replies.append(self._join_reply(member.member_id))

    def _select_protocol(self) -> str:
        """Each member votes for its most preferred protocol that every member supports;
        the most votes win, ties going to the leader's (or first member's) preference."""
        candidates = self._candidates()
        votes = Counter(
            next(name for name, _ in m.protocols if name in candidates)
            for m in self.members.values()
        )
        first = self.members.get(self.leader or "") or next(iter(self.members.values()))
        order = [name for name, _ in first.protocols if name in candidates]
        return max(order, key=lambda name: (votes[name], -order.index(name)))

    # SyncGroup ---------------------------------------------------------------------------

    def sync(
        self,
        member_id: str,
        group_instance_id: str | None,
        generation: int,
        protocol_type: str | None,
        protocol: str | None,
        now_ms: int,
    ) -> SyncReply | None:
        """The answer now, or None: a follower waits for the leader's assignment; the
        leader's own call is followed by `store_assignment` and `assignment_stored`."""
        error = self._check_member(member_id, group_instance_id, generation)
        if error is not ErrorCode.NONE:
            return SyncReply(member_id, error)
        if (protocol_type is not None and protocol_type != self.protocol_type) or (
            protocol is not None and protocol != self.protocol
        ):
            return SyncReply(member_id, ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        member = self.members[member_id]
        member.heartbeat_deadline = now_ms + member.session_timeout_ms
        if self.state is GroupState.PREPARING_REBALANCE:
            return SyncReply(member_id, ErrorCode.REBALANCE_IN_PROGRESS)
        if self.state is GroupState.STABLE:
            return self._sync_reply(member)
        member.syncing = True
        return None

    def assignment_stored(
        self, generation: int, assignments: dict[str, bytes], error: ErrorCode, now_ms: int
    ) -> None:
        """The leader's assignment for `generation` was written (or failed to be)."""
        if self.state is not GroupState.COMPLETING_REBALANCE or generation != self.generation:
            return  # a newer rebalance began meanwhile: its members rejoin
        if error is not ErrorCode.NONE:
            self._fail_syncs(error)
            self._prepare_rebalance(now_ms)
            return
        for member in self.members.values():
            member.assignment = assignments.get(member.member_id, b"")
        self._transition(GroupState.STABLE, now_ms)
        for member in self.members.values():
            if member.syncing:
                member.syncing = False
                member.heartbeat_deadline = now_ms + member.session_timeout_ms
                self._replies.append(self._sync_reply(member))

    def _sync_reply(self, member: Member) -> SyncReply:
        return SyncReply(
            member.member_id, ErrorCode.NONE, self.protocol_type, self.protocol, member.assignment
        )

    def _fail_syncs(self, error: ErrorCode) -> None:
        for member in self.members.values():
            member.assignment = b""
            if member.syncing:
                member.syncing = False
                self._replies.append(SyncReply(member.member_id, error))

    # Heartbeat and LeaveGroup -------------------------------------------------------------

    def heartbeat(
        self, member_id: str, group_instance_id: str | None, generation: int, now_ms: int
    ) -> ErrorCode:
        error = self._check_member(member_id, group_instance_id, generation)
        if error is not ErrorCode.NONE:
            return error
        member = self.members[member_id]
        member.heartbeat_deadline = now_ms + member.session_timeout_ms
        if self.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def _check_member(
        self, member_id: str, group_instance_id: str | None, generation: int
    ) -> ErrorCode:
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self._fenced(member_id, group_instance_id) and member_id in self.members:
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self.members:
            if group_instance_id is not None and group_instance_id in self.static_members:
                return ErrorCode.FENCED_INSTANCE_ID
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def leave(self, leaving: Iterable[tuple[str, str | None]], now_ms: int) -> list[LeaveResult]:
        """LeaveGroup for each (member id, instance id); a static member may be named by its
        instance id alone."""
        results = []
        removed = False
        for member_id, instance in leaving:
            if instance is not None:
                known = self.static_members.get(instance)
                if known is None:
                    error = ErrorCode.UNKNOWN_MEMBER_ID
                elif member_id not in ("", known):
                    error = ErrorCode.FENCED_INSTANCE_ID
                else:
                    self._remove(known)
                    removed, error = True, ErrorCode.NONE
            elif member_id in self.pending_members:
                del self.pending_members[member_id]
                removed, error = True, ErrorCode.NONE
            elif member_id in self.members:
                self._remove(member_id)
                removed, error = True, ErrorCode.NONE
            else:
                error = ErrorCode.UNKNOWN_MEMBER_ID
            results.append(LeaveResult(member_id, instance, error))
        if removed:
            self._after_removal(now_ms)
        return results

    def _remove(self, member_id: str) -> None:
        member = self.members.pop(member_id)
        if member.group_instance_id is not None:
            self.static_members.pop(member.group_instance_id, None)
        if member.joining:
            self._replies.append(JoinReply(member_id, ErrorCode.UNKNOWN_MEMBER_ID))
        if member.syncing:
            self._replies.append(SyncReply(member_id, ErrorCode.UNKNOWN_MEMBER_ID))
        if self.leader == member_id:
            self.leader = next(iter(self.members), None)

    def _after_removal(self, now_ms: int) -> None:
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(now_ms)
        else:
            self._maybe_complete_join(now_ms)

    # Offsets ------------------------------------------------------------------------------

    def validate_commit(
        self, member_id: str, group_instance_id: str | None, generation: int, now_ms: int
    ) -> ErrorCode:
        """Who may commit (Kafka's rules): a member of the current generation, or anyone
        without a member id or generation while the group has no members (a consumer that
        assigns partitions itself, or an admin tool resetting offsets)."""
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation >= 0 or member_id or group_instance_id is not None:
            error = self._check_member(member_id, group_instance_id, generation)
            if error is not ErrorCode.NONE:
                return error
            member = self.members[member_id]
            member.heartbeat_deadline = now_ms + member.session_timeout_ms
        elif self.state is not GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if self.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def committed(self, topic: str, partition: int, offset: CommittedOffset) -> None:
        """A commit that now counts; of two commits of a partition the one whose record
        is later in the log wins, whichever completes first (Kafka's `olderThan`)."""
        key = (topic, partition)
        current = self.offsets.get(key)
        if current is None or current.log_offset < offset.log_offset:
            self.offsets[key] = offset

    def uncommitted(self, topic: str, partition: int, log_offset: int) -> None:
        """A tombstone at `log_offset` deleted the partition's offset: a commit written
        before it goes, one written after it stays."""
        key = (topic, partition)
        current = self.offsets.get(key)
        if current is not None and current.log_offset < log_offset:
            del self.offsets[key]

    def commit_started(self, partitions: Iterable[tuple[str, int]]) -> int:
        """A plain OffsetCommit's records are being written: until `commit_finished`, a
        stable OffsetFetch of these partitions is answered UNSTABLE_OFFSET_COMMIT. The
        token names this write."""
        self._next_write += 1
        for key in partitions:
            self._writing.setdefault(key, set()).add(self._next_write)
        return self._next_write

    def commit_finished(self, token: int, topic: str, partition: int) -> bool:
        """The write `token` of the partition's commit ended; False when an OffsetDelete or
        DeleteGroups cancelled it meanwhile (then it must not count, as in Kafka)."""
        key = (topic, partition)
        writing = self._writing.get(key)
        if writing is None or token not in writing:
            return False
        writing.discard(token)
        if not writing:
            del self._writing[key]
        return True

    def txn_commit_started(
        self, producer_id: int, offsets: dict[tuple[str, int], CommittedOffset]
    ) -> None:
        """A TxnOffsetCommit's records are being written in the producer's transaction
        (their `log_offset` is -1 until `txn_commit_appended`); they count from its COMMIT
        marker on. A later one of the same partition in that transaction replaces it."""
        self.pending_txn.setdefault(producer_id, {}).update(offsets)

    def txn_commit_appended(
        self, producer_id: int, offsets: dict[tuple[str, int], CommittedOffset]
    ) -> None:
        """The records of `txn_commit_started` are in the log, at these positions."""
        pending = self.pending_txn.get(producer_id, {})
        for key, offset in offsets.items():
            held = pending.get(key)
            if held == dataclasses.replace(offset, log_offset=-1):
                pending[key] = offset

    def txn_commit_failed(self, producer_id: int, partitions: Iterable[tuple[str, int]]) -> None:
        """The records of `txn_commit_started` were not written: they never count."""
        pending = self.pending_txn.get(producer_id)
        if pending is None:
            return
        for key in partitions:
            held = pending.get(key)
            if held is not None and held.log_offset < 0:
                del pending[key]
        if not pending:
            del self.pending_txn[producer_id]

    def txn_uncommitted(self, producer_id: int, topic: str, partition: int) -> None:
        """A tombstone inside the producer's transaction: that partition's pending commit
        in it is withdrawn (Kafka's reading of `__consumer_offsets`)."""
        pending = self.pending_txn.get(producer_id)
        if pending is not None:
            pending.pop((topic, partition), None)

    def txn_ended(self, producer_id: int, commit: bool) -> None:
        """The producer's transaction ended: on COMMIT its offsets count, each unless the
        partition's current commit was written later (Kafka's `olderThan` on log
        positions, so a plain OffsetCommit written after the TxnOffsetCommit wins)."""
        pending = self.pending_txn.pop(producer_id, {})
        if not commit:
            return
        for (topic, partition), offset in pending.items():
            if offset.log_offset >= 0:
                self.committed(topic, partition, offset)

    def cancel_pending(self, partitions: Iterable[tuple[str, int]]) -> None:
        """OffsetDelete or DeleteGroups: the partitions' commits still being written or
        waiting for their transaction never count (Kafka's `removeOffsets`)."""
        for key in partitions:
            self._writing.pop(key, None)
            for producer_id in list(self.pending_txn):
                pending = self.pending_txn[producer_id]
                pending.pop(key, None)
                if not pending:
                    del self.pending_txn[producer_id]

    def pending_partitions(self) -> set[tuple[str, int]]:
        """Partitions with a commit that does not count yet."""
        keys = set(self._writing)
        for pending in self.pending_txn.values():
            keys |= pending.keys()
        return keys

    def is_unstable(self, topic: str, partition: int) -> bool:
        """Whether the partition has a commit being written or held by an open transaction
        (a stable OffsetFetch answers UNSTABLE_OFFSET_COMMIT, KIP-447)."""
        key = (topic, partition)
        return key in self._writing or any(key in p for p in self.pending_txn.values())

    def has_offsets(self) -> bool:
        """Kafka's `hasOffsets`: committed, being written, or waiting for a transaction."""
        return bool(self.offsets or self._writing or self.pending_txn)

    # Time --------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """Expire what is due: the join or sync phase's deadline, silent members, member
        ids handed out but never used."""
        if self.state is GroupState.DEAD:
            return
        expired_pending = [m for m, deadline in self.pending_members.items() if now_ms >= deadline]
        for member_id in expired_pending:
            del self.pending_members[member_id]
        if self.state is GroupState.PREPARING_REBALANCE and now_ms >= self._rebalance_deadline:
            if self._initial_join_until and not self.members:
                self._initial_join_until = 0
            self._complete_join(now_ms)
            return
        if self.state is GroupState.COMPLETING_REBALANCE and now_ms >= self._rebalance_deadline:
            late = [m.member_id for m in self.members.values() if not m.syncing]
            if late:
                for member_id in late:
                    self._remove(member_id)
                self._prepare_rebalance(now_ms)
                return
        silent = [
            m.member_id
            for m in self.members.values()
            if now_ms >= m.heartbeat_deadline and not m.joining and not m.syncing
        ]
        for member_id in silent:
            self._remove(member_id)
        if silent or expired_pending:
            self._after_removal(now_ms)

    # Loading and deleting ---------------------------------------------------------------

    def load(self, value: GroupValue, now_ms: int) -> None:
        """Take the state a group metadata record holds (a coordinator taking over): a group
        with members is Stable, and its members have a full session to heartbeat here."""
        self.protocol_type = value.protocol_type or None
        self.generation = value.generation
        self.protocol = value.protocol
        self.leader = value.leader
        self.state_timestamp = value.state_timestamp if value.state_timestamp >= 0 else now_ms
        self.members = {}
        self.static_members = {}
        for m in value.members:
            self.members[m.member_id] = Member(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.rebalance_timeout_ms,
                m.session_timeout_ms,
                value.protocol_type,
                [(value.protocol or "", m.subscription)],
                m.assignment,
                heartbeat_deadline=now_ms + m.session_timeout_ms,
            )
            if m.group_instance_id is not None:
                self.static_members[m.group_instance_id] = m.member_id
        self.state = GroupState.STABLE if self.members else GroupState.EMPTY

    def mark_dead(self) -> None:
        """Deleted, or unloaded because this broker no longer coordinates it: everything
        waiting is told to find the coordinator again."""
        for member in self.members.values():
            if member.joining:
                self._replies.append(JoinReply(member.member_id, ErrorCode.NOT_COORDINATOR))
            if member.syncing:
                self._replies.append(SyncReply(member.member_id, ErrorCode.NOT_COORDINATOR))
            member.joining = member.syncing = False
        self.state = GroupState.DEAD

    def _transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp = now_ms

    def subscribed_protocol_metadata(self) -> list[bytes]:
        """Each member's metadata for the chosen protocol (a consumer's subscription)."""
        return [m.metadata(self.protocol) for m in self.members.values()]
