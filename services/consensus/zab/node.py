"""The ZAB state machine of one ensemble member, sans I/O.

The driver feeds events (``step``, ``tick``, ``propose``, ``persisted``, ``link_reset``,
``compact``, ``report_sessions``), then collects actions with ``ready()`` and confirms them
with ``advance()``. Nothing here reads a clock, a socket, a disk or a random source, so a
simulator can replay any run.

A node's history is a snapshot (the state machine's image at some committed zxid, opaque
here) followed by the log entries after it. ``compact`` moves the snapshot forward so the
log held in memory stays short; a follower too far behind gets the snapshot (SNAP).

The transport must behave like TCP: per connection, messages arrive in order and none is
lost; when a connection breaks, everything in flight on it is gone and both ends are told
with ``link_reset(peer)``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from services.consensus.zab.election import Vote, better_vote, votes_for
from services.consensus.zab.messages import (
    Ack,
    AckEpoch,
    AckNewLeader,
    Commit,
    FollowerInfo,
    Forward,
    ForwardReply,
    Message,
    NewEpoch,
    NewLeader,
    Notification,
    Ping,
    PingAck,
    Proposal,
    ServerState,
    Sync,
    SyncMode,
    UpToDate,
)
from services.consensus.zab.ready import (
    Accepted,
    Busy,
    Committed,
    NotLeader,
    Proposed,
    ProposeResult,
    Ready,
    Rejected,
    RoleChange,
    Unknown,
)
from services.consensus.zab.state import (
    EMPTY_SNAPSHOT,
    HardState,
    LogEntry,
    PersistedState,
    Snapshot,
)
from services.consensus.zab.sync import epoch_ends, plan_sync
from services.consensus.zab.zxid import COUNTER_MASK, make_zxid, zxid_counter, zxid_epoch

QuorumMode = Literal["majority", "all"]

# The leader's last word on a write before it is proposed: (zxid it will get, what the
# client asked) -> the entry's payload. ZooKeeper's PrepRequestProcessor lives here.
Prepare = Callable[[int, bytes], bytes]


class Phase(Enum):
    ELECTION = "election"
    DISCOVERY = "discovery"
    SYNC = "sync"
    BROADCAST = "broadcast"


@dataclass(slots=True)
class _Session:
    """The leader's view of one follower during this leadership."""

    accepted_epoch: int
    ack_epoch: AckEpoch | None = None
    newleader_sent: bool = False
    newleader_acked: bool = False
    acked_zxid: int = 0
    durable_sent: int = 0  # the last of our own Acks sent to it (see ``Node.ready``)
    idle_ticks: int = 0


class Node:
    """One ZAB ensemble member.

    ``quorum="majority"``: elections, discovery and commits need a majority.
    ``quorum="all"``: elections and discovery still need a majority (any majority meets
    "everyone"), but NEWLEADER and proposals commit only once every member has acked them.

    When the leader and one follower make a commit quorum (three members, majority), the
    leader also sends its own Ack (the zxid up to which its log is durable) to the followers
    in broadcast. A follower then commits whatever both it and the leader have made durable,
    without waiting for the leader to hear its Ack and answer with a Commit: the entry is on
    a quorum's logs, which is what makes it committed in ZAB. That takes one round trip off
    a follower's write latency, and the leader leaves out Commits such an inference covers.
    """

    def __init__(
        self,
        node_id: int,
        members: Iterable[int],
        quorum: QuorumMode = "majority",
        election_ticks: int = 10,
        heartbeat_ticks: int = 2,
        persisted_state: PersistedState | None = None,
        diff_window: int = 1000,
        max_in_flight: int = 256,
        prepare: Prepare | None = None,
    ) -> None:
        self.id = node_id
        self.members: tuple[int, ...] = tuple(sorted(set(members)))
        assert node_id in self.members, (node_id, self.members)
        assert quorum in ("majority", "all"), quorum
        assert 0 < heartbeat_ticks < election_ticks, (heartbeat_ticks, election_ticks)
        assert diff_window >= 0 and max_in_flight > 0
        self.quorum_mode: QuorumMode = quorum
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.diff_window = diff_window
        self.max_in_flight = max_in_flight
        self._prepare = prepare
        self._peers = tuple(m for m in self.members if m != node_id)
        self._election_quorum = len(self.members) // 2 + 1
        self._commit_quorum = len(self.members) if quorum == "all" else self._election_quorum
        # A follower and its leader alone are a commit quorum: see the class docstring.
        self._pair_quorum = len(self.members) > 1 and self._commit_quorum <= 2

        state = persisted_state if persisted_state is not None else PersistedState()
        hs = state.hard_state
        self._accepted_epoch = hs.accepted_epoch
        self._accepted_leader = hs.accepted_leader
        self._current_epoch = hs.current_epoch
        self._snapshot = state.snapshot
        self._log: list[LogEntry] = list(state.log)
        self._zxids: list[int] = [e.zxid for e in self._log]
        assert all(a < b for a, b in zip(self._zxids, self._zxids[1:], strict=False))
        assert not self._zxids or self._zxids[0] > self._snapshot.zxid
        self._persisted_zxid = self.last_zxid
        # Volatile: learnt again from the leader after a restart. A snapshot is committed.
        self._commit_zxid = self._snapshot.zxid

        self.role = ServerState.LOOKING
        self.phase = Phase.ELECTION
        self.leader: int | None = None
        self.epoch = 0  # epoch of the leadership this node leads or follows
        # Election.
        self._logical_clock = 0
        self._vote = self._own_vote()
        self._recv: dict[int, Vote] = {}
        self._out_of_election: dict[int, tuple[Vote, ServerState]] = {}
        self._early_infos: dict[int, FollowerInfo] = {}
        # Timers (in ticks).
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._phase_elapsed = 0
        self._leader_silence = 0
        # Leader.
        self._sessions: dict[int, _Session] = {}
        self._epoch_chosen = False
        self._newleader_zxid = 0
        # Follower.
        self._pending_newleader: int | None = None
        self._newleader_acked = False
        self._acked_sent = 0
        self._leader_durable = 0  # the leader's own Ack, heard in broadcast
        self._live_sessions: set[int] = set()
        # Clients.
        self._next_request_id = 1
        self._pending_forwards: set[int] = set()
        self._awaiting: dict[int, int] = {}  # zxid -> request_id
        # Output, drained by ready()/advance().
        self._out = Ready()
        self._hard_dirty = False
        self._commit_unsent = False
        self._durable_unsent = False
        # Followers this node synced as leader, by kind (ZooKeeper's snap_count and
        # diff_count, where a TRUNC counts as a diff): counters for metrics only.
        self.snap_syncs = 0
        self.diff_syncs = 0

        self._become_looking()

    # ------------------------------------------------------------------ properties

    @property
    def last_zxid(self) -> int:
        return self._zxids[-1] if self._zxids else self._snapshot.zxid

    @property
    def next_zxid(self) -> int:
        """The zxid the next proposal will get (meaningful on an established leader)."""
        last = self.last_zxid
        return last + 1 if zxid_epoch(last) == self.epoch else make_zxid(self.epoch, 1)

    def learner_counts(self) -> tuple[int, int]:
        """(followers taking part in this leadership, those of them in sync: NEWLEADER
        acked), or (0, 0) unless leading; for metrics. Safe to call from another thread:
        the table is copied in one C-level call before it is read."""
        if self.role != ServerState.LEADING:
            return 0, 0
        sessions = list(self._sessions.values())
        return len(sessions), sum(1 for s in sessions if s.newleader_acked)

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def commit_zxid(self) -> int:
        return self._commit_zxid

    @property
    def hard_state(self) -> HardState:
        return HardState(self._accepted_epoch, self._accepted_leader, self._current_epoch)

    @property
    def log(self) -> Sequence[LogEntry]:
        return tuple(self._log)

    # ------------------------------------------------------------------ driver API

    def ready(self) -> Ready:
        if self._hard_dirty:
            self._out.hard_state = self.hard_state
        if self._durable_unsent:
            # Our own Ack, after the proposals it covers, to followers in broadcast.
            self._durable_unsent = False
            durable = self._persisted_zxid
            ack = Ack(self.id, self.epoch, durable)
            for peer, s in self._sessions.items():
                if s.newleader_acked:
                    self._send(peer, ack)
                    s.durable_sent = durable
        if self._commit_unsent:
            # One cumulative Commit per follower for everything committed since the last
            # Ready, after the proposals it covers; none to a follower that infers it.
            self._commit_unsent = False
            commit = Commit(self.id, self.epoch, self._commit_zxid)
            for peer, s in self._sessions.items():
                if s.newleader_sent and not (
                    s.newleader_acked and self._commit_zxid <= s.durable_sent
                ):
                    self._send(peer, commit)
        return self._out

    def has_ready(self) -> bool:
        return (
            self._hard_dirty
            or self._commit_unsent
            or self._durable_unsent
            or not self._out.is_empty()
        )

    def advance(self) -> None:
        self._out = Ready()
        self._hard_dirty = False

    def persisted(self, up_to_zxid: int) -> None:
        """Entries up to ``up_to_zxid`` are durable. Stale reports (for entries since
        truncated) are ignored."""
        if up_to_zxid <= self._persisted_zxid or up_to_zxid > self.last_zxid:
            return
        i = bisect_right(self._zxids, up_to_zxid)
        if i == 0 or self._zxids[i - 1] != up_to_zxid:
            return
        self._persisted_zxid = up_to_zxid
        if self.role == ServerState.LEADING:
            if self.phase == Phase.SYNC:
                self._check_established()
            elif self.phase == Phase.BROADCAST:
                self._durable_unsent = self._pair_quorum
                self._maybe_commit()
        elif self.role == ServerState.FOLLOWING:
            self._follower_maybe_ack()
            self._infer_commit()

    def compact(self, snapshot: Snapshot) -> None:
        """The state machine's image at ``snapshot.zxid`` (committed, applied, and durable
        in the log) replaces the entries up to there."""
        zxid = snapshot.zxid
        assert self._snapshot.zxid < zxid <= self._commit_zxid, (zxid, self._commit_zxid)
        assert zxid <= self._persisted_zxid, (zxid, self._persisted_zxid)
        cut = bisect_right(self._zxids, zxid)
        assert cut and self._zxids[cut - 1] == zxid, zxid
        del self._log[:cut]
        del self._zxids[:cut]
        self._snapshot = snapshot

    def report_sessions(self, session_ids: Iterable[int]) -> None:
        """Client sessions heard from here; a follower passes them on in its next PingAck."""
        self._live_sessions.update(session_ids)

    def link_reset(self, peer: int) -> None:
        """The connection to ``peer`` broke; what was in flight on it is lost."""
        if peer not in self._peers:
            return
        if self.role == ServerState.FOLLOWING and peer == self.leader:
            self._become_looking()
        elif self.role == ServerState.LEADING:
            self._sessions.pop(peer, None)
        elif self.role == ServerState.LOOKING:
            self._early_infos.pop(peer, None)
            self._send(peer, self._notification())

    def tick(self) -> None:
        if self.role == ServerState.LOOKING:
            self._election_elapsed += 1
            if self._election_elapsed >= self.election_ticks:
                self._election_elapsed = 0
                self._broadcast_notification()
        elif self.role == ServerState.FOLLOWING:
            self._leader_silence += 1
            if self._leader_silence >= self.election_ticks:
                self._become_looking()
        else:
            self._leader_tick()

    def propose(self, payload: bytes) -> ProposeResult:
        """A client write. On the leader ``payload`` goes through ``prepare`` at once;
        on a follower it is forwarded and the leader prepares it."""
        if self.role == ServerState.LEADING:
            if self.phase != Phase.BROADCAST or self._in_flight() >= self.max_in_flight:
                return Busy(self.id)
            request_id = self._new_request_id()
            zxid = self._propose(payload)
            self._awaiting[zxid] = request_id
            return Accepted(request_id, zxid)
        if self.role == ServerState.FOLLOWING and self.leader is not None:
            if self.phase != Phase.BROADCAST:
                return Busy(self.leader)
            if len(self._pending_forwards) + len(self._awaiting) >= self.max_in_flight:
                return Busy(self.leader)
            request_id = self._new_request_id()
            self._pending_forwards.add(request_id)
            self._send(self.leader, Forward(self.id, self.epoch, request_id, payload))
            return Accepted(request_id, None)
        return NotLeader(None)

    def step(self, message: Message) -> None:
        sender = message.sender
        if sender not in self._peers:
            return
        if isinstance(message, Notification):
            self._on_notification(message)
        elif self.role == ServerState.LEADING:
            self._leader_step(message)
        elif self.role == ServerState.FOLLOWING and sender == self.leader:
            self._follower_step(message)
        elif self.role == ServerState.LOOKING and isinstance(message, FollowerInfo):
            # The peer decided for us before we decided ourselves; keep it for later.
            self._early_infos[sender] = message

    # ------------------------------------------------------------------ election

    def _own_vote(self) -> Vote:
        return Vote(self._current_epoch, self.last_zxid, self.id)

    def _notification(self) -> Notification:
        v = self._vote
        return Notification(self.id, v.leader, v.zxid, v.peer_epoch, self._logical_clock, self.role)

    def _broadcast_notification(self) -> None:
        note = self._notification()
        for peer in self._peers:
            self._send(peer, note)

    def _become_looking(self) -> None:
        self._resolve_pending_unknown()
        self.role = ServerState.LOOKING
        self.phase = Phase.ELECTION
        self.leader = None
        self.epoch = 0
        self._sessions = {}
        self._epoch_chosen = False
        self._pending_newleader = None
        self._newleader_acked = False
        self._early_infos = {}
        self._logical_clock += 1
        self._vote = self._own_vote()
        self._recv = {self.id: self._vote}
        self._out_of_election = {}
        self._election_elapsed = 0
        self._role_change(False)
        self._broadcast_notification()
        self._check_election()

    def _on_notification(self, n: Notification) -> None:
        vote = Vote(n.peer_epoch, n.zxid, n.leader)
        if self.role != ServerState.LOOKING:
            if n.state == ServerState.LOOKING:
                self._send(n.sender, self._notification())
            return
        if n.state == ServerState.LOOKING:
            self._out_of_election.pop(n.sender, None)
            if n.election_epoch > self._logical_clock:
                self._logical_clock = n.election_epoch
                self._recv = {}
                self._vote = better_vote(self._own_vote(), vote)
                self._broadcast_notification()
            elif n.election_epoch < self._logical_clock:
                self._send(n.sender, self._notification())
                return
            elif vote > self._vote:
                self._vote = vote
                self._broadcast_notification()
            elif vote < self._vote:
                # The sender may have missed our vote (it arrived while it still followed
                # a leader that just died): tell it, rather than wait for a timeout.
                self._send(n.sender, self._notification())
            self._recv[n.sender] = vote
            self._recv[self.id] = self._vote
            self._check_election()
        else:
            self._out_of_election[n.sender] = (vote, n.state)
            if n.election_epoch == self._logical_clock:
                self._recv[n.sender] = vote
            self._check_established_ensemble(vote.leader)

    def _check_election(self) -> None:
        agreeing = sum(1 for v in self._recv.values() if v == self._vote)
        if agreeing < self._election_quorum:
            return
        if self._vote.leader == self.id:
            self._become_leader()
        else:
            self._become_follower(self._vote.leader)

    def _leader_confirmed(self, leader: int) -> bool:
        seen = self._out_of_election.get(leader)
        return seen is not None and seen[1] == ServerState.LEADING and seen[0].leader == leader

    def _check_established_ensemble(self, leader: int) -> None:
        """Join a running ensemble: a quorum outside the election agrees on ``leader``
        and the leader itself says it leads (ZooKeeper's out-of-election check)."""
        if leader == self.id or not self._leader_confirmed(leader):
            return
        supporters = sum(1 for v, _ in self._out_of_election.values() if v.leader == leader)
        if (
            supporters >= self._election_quorum
            or votes_for(self._recv.values(), leader) >= self._election_quorum
        ):
            self._vote = self._out_of_election[leader][0]
            self._become_follower(leader)

    # ------------------------------------------------------------------ follower

    def _become_follower(self, leader: int) -> None:
        self._early_infos = {}
        self.role = ServerState.FOLLOWING
        self.phase = Phase.DISCOVERY
        self.leader = leader
        self.epoch = 0
        self._leader_silence = 0
        self._pending_newleader = None
        self._newleader_acked = False
        self._acked_sent = 0
        self._leader_durable = 0
        self._role_change(False)
        self._send(leader, FollowerInfo(self.id, self._accepted_epoch, self._accepted_leader))

    def _follower_step(self, m: Message) -> None:
        self._leader_silence = 0
        if isinstance(m, NewEpoch):
            self._on_new_epoch(m)
            return
        if isinstance(m, Notification | FollowerInfo | AckEpoch | AckNewLeader | PingAck | Forward):
            return
        if m.epoch != self.epoch or self.epoch == 0:
            return
        if isinstance(m, Ack):  # the leader's own: how far its log is durable
            if self.phase == Phase.BROADCAST and self._pair_quorum:
                self._leader_durable = max(self._leader_durable, m.zxid)
                self._infer_commit()
            return
        if isinstance(m, Sync):
            self._on_sync(m)
        elif isinstance(m, NewLeader):
            if self.phase != Phase.SYNC or m.zxid != self.last_zxid:
                self._become_looking()
                return
            self._pending_newleader = m.zxid
            self._follower_maybe_ack()
        elif isinstance(m, Proposal):
            self._on_proposal(m)
        elif isinstance(m, Commit):
            if self._newleader_acked or self._pending_newleader is not None:
                self._commit_to(min(m.zxid, self.last_zxid))
        elif isinstance(m, UpToDate):
            if not self._newleader_acked:
                self._become_looking()
                return
            self.phase = Phase.BROADCAST
            self._commit_to(min(m.commit_zxid, self.last_zxid))
            self._role_change(True)
        elif isinstance(m, Ping):
            sessions = tuple(sorted(self._live_sessions))
            self._live_sessions.clear()
            self._send(m.sender, PingAck(self.id, self.epoch, sessions))
        elif isinstance(m, ForwardReply):
            self._on_forward_reply(m)

    def _on_new_epoch(self, m: NewEpoch) -> None:
        if self.phase != Phase.DISCOVERY:
            return
        same = m.epoch == self._accepted_epoch and self._accepted_leader == m.sender
        if not (m.epoch > self._accepted_epoch or same):
            self._become_looking()
            return
        if not same:
            self._accepted_epoch = m.epoch
            self._accepted_leader = m.sender
            self._hard_dirty = True
        self.epoch = m.epoch
        self.phase = Phase.SYNC
        ends = epoch_ends(self._history_zxids())
        self._send(
            m.sender,
            AckEpoch(self.id, m.epoch, self._current_epoch, self.last_zxid, ends),
        )

    def _on_sync(self, m: Sync) -> None:
        if self.phase != Phase.SYNC or self._pending_newleader is not None:
            self._become_looking()
            return
        if m.mode == SyncMode.SNAP:
            self._install_snapshot(m.snapshot or EMPTY_SNAPSHOT, m.entries)
            return
        self._truncate(m.truncate_to)
        for entry in m.entries:
            if entry.zxid <= self.last_zxid:
                self._become_looking()
                return
            self._append(entry)

    def _install_snapshot(self, snapshot: Snapshot, entries: Sequence[LogEntry]) -> None:
        # The leader's history replaces ours. Ours up to our commit point is a prefix of
        # it; the driver rebuilds its state machine from ``snapshot`` and applies the
        # entries again as they commit.
        if any(e.zxid <= snapshot.zxid for e in entries[:1]):
            self._become_looking()
            return
        self._log.clear()
        self._zxids.clear()
        self._persisted_zxid = snapshot.zxid
        self._commit_zxid = snapshot.zxid
        self._snapshot = snapshot
        out = self._out
        out.truncate_to = 0
        out.entries = []
        out.committed = []
        out.snapshot = snapshot
        for entry in entries:
            if entry.zxid <= self.last_zxid:
                self._become_looking()
                return
            self._append(entry)

    def _on_proposal(self, m: Proposal) -> None:
        if self._pending_newleader is None and not self._newleader_acked:
            self._become_looking()
            return
        if m.entry.zxid != self.next_zxid:
            self._become_looking()
            return
        self._append(m.entry)

    def _follower_maybe_ack(self) -> None:
        if self._pending_newleader is not None:
            if self._persisted_zxid < self._pending_newleader:
                return
            zxid = self._pending_newleader
            self._pending_newleader = None
            self._newleader_acked = True
            self._current_epoch = self.epoch
            self._hard_dirty = True
            assert self.leader is not None
            self._send(self.leader, AckNewLeader(self.id, self.epoch, zxid))
            self._acked_sent = zxid
        if self._newleader_acked and self._persisted_zxid > self._acked_sent:
            assert self.leader is not None
            self._acked_sent = self._persisted_zxid
            self._send(self.leader, Ack(self.id, self.epoch, self._persisted_zxid))

    def _infer_commit(self) -> None:
        """Commit what is durable both here and on the leader: a commit quorum's logs.
        Our log is a prefix of the leader's once we are in broadcast."""
        if self.phase == Phase.BROADCAST and self._leader_durable:
            self._commit_to(min(self._leader_durable, self._persisted_zxid))

    def _on_forward_reply(self, m: ForwardReply) -> None:
        if m.request_id not in self._pending_forwards:
            return
        self._pending_forwards.discard(m.request_id)
        if m.zxid is None:
            self._out.results.append(Rejected(m.request_id, self.leader))
        elif m.zxid <= self._commit_zxid:
            self._out.results.append(Proposed(m.request_id, m.zxid))
            self._out.results.append(Committed(m.request_id, m.zxid))
        else:
            self._awaiting[m.zxid] = m.request_id
            self._out.results.append(Proposed(m.request_id, m.zxid))

    # ------------------------------------------------------------------ leader

    def _become_leader(self) -> None:
        early = self._early_infos
        self._early_infos = {}
        self.role = ServerState.LEADING
        self.phase = Phase.DISCOVERY
        self.leader = self.id
        self.epoch = 0
        self._sessions = {}
        self._epoch_chosen = False
        self._phase_elapsed = 0
        self._heartbeat_elapsed = 0
        self._role_change(False)
        for info in early.values():
            self._on_follower_info(info)
        self._maybe_choose_epoch()

    def _leader_tick(self) -> None:
        self._heartbeat_elapsed += 1
        if self._heartbeat_elapsed >= self.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            for peer in self._sessions:
                self._send(peer, Ping(self.id, self.epoch))
        for session in self._sessions.values():
            session.idle_ticks += 1
        if self.phase == Phase.BROADCAST:
            live = 1 + sum(
                1
                for s in self._sessions.values()
                if s.newleader_acked and s.idle_ticks < self.election_ticks
            )
            if live < self._election_quorum:
                self._become_looking()
        else:
            # ZooKeeper's initLimit: establish within a bounded time or start over.
            self._phase_elapsed += 1
            if self._phase_elapsed >= 2 * self.election_ticks:
                self._become_looking()

    def _leader_step(self, m: Message) -> None:
        session = self._sessions.get(m.sender)
        if session is not None:
            session.idle_ticks = 0
        if isinstance(m, FollowerInfo):
            self._on_follower_info(m)
            return
        if session is None or isinstance(
            m,
            Notification
            | NewEpoch
            | Sync
            | NewLeader
            | UpToDate
            | Proposal
            | Commit
            | Ping
            | ForwardReply,
        ):
            return
        if m.epoch != self.epoch or not self._epoch_chosen:
            return
        if isinstance(m, AckEpoch):
            self._on_ack_epoch(session, m)
        elif isinstance(m, AckNewLeader):
            if not session.newleader_sent or session.newleader_acked:
                return
            session.newleader_acked = True
            session.acked_zxid = max(session.acked_zxid, m.zxid)
            if self.phase == Phase.SYNC:
                self._check_established()
            elif self.phase == Phase.BROADCAST:
                self._send(m.sender, UpToDate(self.id, self.epoch, self._commit_zxid))
                self._maybe_commit()
        elif isinstance(m, Ack):
            if session.newleader_acked and m.zxid <= self.last_zxid:
                session.acked_zxid = max(session.acked_zxid, m.zxid)
                self._maybe_commit()
        elif isinstance(m, Forward):
            self._on_forward(m)

    def _on_follower_info(self, m: FollowerInfo) -> None:
        if self._epoch_chosen and (
            m.accepted_epoch > self.epoch
            or (m.accepted_epoch == self.epoch and m.accepted_leader != self.id)
        ):
            # This member promised our epoch number (or a later one) to another leader
            # and can never join this leadership: start over so a higher epoch is chosen.
            self._become_looking()
            return
        self._sessions[m.sender] = _Session(accepted_epoch=m.accepted_epoch)
        if self._epoch_chosen:
            self._send(m.sender, NewEpoch(self.id, self.epoch))
        else:
            self._maybe_choose_epoch()

    def _maybe_choose_epoch(self) -> None:
        if self._epoch_chosen or 1 + len(self._sessions) < self._election_quorum:
            return
        epoch = 1 + max(
            [self._accepted_epoch, *(s.accepted_epoch for s in self._sessions.values())]
        )
        assert epoch > self._accepted_epoch
        self._accepted_epoch = epoch
        self._accepted_leader = self.id
        self._hard_dirty = True
        self.epoch = epoch
        self._epoch_chosen = True
        for peer in self._sessions:
            self._send(peer, NewEpoch(self.id, epoch))
        self._maybe_finish_discovery()

    def _on_ack_epoch(self, session: _Session, m: AckEpoch) -> None:
        if session.ack_epoch is not None:
            return
        if self.phase == Phase.DISCOVERY:
            if (m.current_epoch, m.last_zxid) > (self._current_epoch, self.last_zxid):
                # The ZAB rule: the leader's history must be the latest of its quorum.
                self._become_looking()
                return
            session.ack_epoch = m
            self._maybe_finish_discovery()
        else:
            session.ack_epoch = m
            self._sync_follower(m.sender, session)

    def _maybe_finish_discovery(self) -> None:
        if self.phase != Phase.DISCOVERY or not self._epoch_chosen:
            return
        acked = [p for p, s in self._sessions.items() if s.ack_epoch is not None]
        if 1 + len(acked) < self._election_quorum:
            return
        self._current_epoch = self.epoch
        self._hard_dirty = True
        self.phase = Phase.SYNC
        self._newleader_zxid = self.last_zxid
        for peer in acked:
            self._sync_follower(peer, self._sessions[peer])
        self._check_established()

    def _sync_follower(self, peer: int, session: _Session) -> None:
        ack = session.ack_epoch
        assert ack is not None
        plan = plan_sync(self._log, ack.epoch_ends, ack.last_zxid, self.diff_window, self._snapshot)
        if plan.mode == SyncMode.SNAP:
            self.snap_syncs += 1
        else:
            self.diff_syncs += 1
        self._send(
            peer,
            Sync(self.id, self.epoch, plan.mode, plan.truncate_to, plan.entries, plan.snapshot),
        )
        self._send(peer, NewLeader(self.id, self.epoch, self.last_zxid))
        session.newleader_sent = True

    def _check_established(self) -> None:
        acks = sum(1 for s in self._sessions.values() if s.newleader_acked)
        if self._persisted_zxid >= self._newleader_zxid:
            acks += 1
        if acks < self._commit_quorum:
            return
        self.phase = Phase.BROADCAST
        self._commit_to(self._newleader_zxid)
        for peer, s in self._sessions.items():
            if s.newleader_acked:
                self._send(peer, UpToDate(self.id, self.epoch, self._commit_zxid))
        self._role_change(True)
        self._maybe_commit()

    def _propose(self, request: bytes) -> int:
        zxid = self.next_zxid
        assert zxid_counter(zxid) <= COUNTER_MASK and zxid_epoch(zxid) == self.epoch, "epoch full"
        payload = request if self._prepare is None else self._prepare(zxid, request)
        entry = LogEntry(zxid, payload)
        self._append(entry)
        proposal = Proposal(self.id, self.epoch, entry)
        for peer, s in self._sessions.items():
            if s.newleader_sent:
                self._send(peer, proposal)
        return entry.zxid

    def _on_forward(self, m: Forward) -> None:
        if self.phase != Phase.BROADCAST or self._in_flight() >= self.max_in_flight:
            self._send(m.sender, ForwardReply(self.id, self.epoch, m.request_id, None))
            return
        zxid = self._propose(m.payload)
        self._send(m.sender, ForwardReply(self.id, self.epoch, m.request_id, zxid))

    def _maybe_commit(self) -> None:
        if self.phase != Phase.BROADCAST:
            return
        acks = [self._persisted_zxid]
        acks.extend(s.acked_zxid for s in self._sessions.values() if s.newleader_acked)
        if len(acks) < self._commit_quorum:
            return
        acks.sort(reverse=True)
        zxid = acks[self._commit_quorum - 1]
        if zxid <= self._commit_zxid:
            return
        self._commit_to(zxid)
        self._commit_unsent = True

    def _in_flight(self) -> int:
        return len(self._zxids) - bisect_right(self._zxids, self._commit_zxid)

    # ------------------------------------------------------------------ log and output

    def _append(self, entry: LogEntry) -> None:
        assert entry.zxid > self.last_zxid, (entry.zxid, self.last_zxid)
        self._log.append(entry)
        self._zxids.append(entry.zxid)
        self._out.entries.append(entry)

    def _history_zxids(self) -> list[int]:
        """The log's zxids, led by the snapshot's: enough to summarise the history."""
        base = self._snapshot.zxid
        return [base, *self._zxids] if base else self._zxids

    def _truncate(self, zxid: int) -> None:
        if zxid >= self.last_zxid:
            return
        # Committed entries are never taken back; if they were, the protocol is broken.
        assert zxid >= self._commit_zxid, (zxid, self._commit_zxid)
        cut = bisect_right(self._zxids, zxid)
        del self._log[cut:]
        del self._zxids[cut:]
        self._persisted_zxid = min(self._persisted_zxid, zxid)
        out = self._out
        out.truncate_to = zxid if out.truncate_to is None else min(out.truncate_to, zxid)
        out.entries = [e for e in out.entries if e.zxid <= zxid]

    def _commit_to(self, zxid: int) -> None:
        if zxid <= self._commit_zxid:
            return
        start = bisect_right(self._zxids, self._commit_zxid)
        end = bisect_right(self._zxids, zxid)
        for entry in self._log[start:end]:
            self._out.committed.append(entry)
            request_id = self._awaiting.pop(entry.zxid, None)
            if request_id is not None:
                self._out.results.append(Committed(request_id, entry.zxid))
        self._commit_zxid = zxid

    def _send(self, to: int, message: Message) -> None:
        self._out.messages.append((to, message))

    def _role_change(self, established: bool) -> None:
        self._commit_unsent = False
        self._durable_unsent = False
        self._out.role_changes.append(RoleChange(self.role, self.leader, self.epoch, established))

    def _new_request_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id

    def _resolve_pending_unknown(self) -> None:
        for request_id in sorted(self._pending_forwards):
            self._out.results.append(Unknown(request_id))
        for request_id in self._awaiting.values():
            self._out.results.append(Unknown(request_id))
        self._pending_forwards.clear()
        self._awaiting.clear()
