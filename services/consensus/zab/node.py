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

from services.consensus.zab.election import Vote
from services.consensus.zab.messages import (
    Ack,
    AckEpoch,
    AckNewLeader,
    Commit,
    FollowerInfo,
    Forward,
    ForwardReply,
    Inform,
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
    Membership,
    PersistedState,
    Snapshot,
)
from services.consensus.zab.sync import epoch_ends, plan_sync
from services.consensus.zab.zxid import COUNTER_MASK, make_zxid, zxid_counter, zxid_epoch

QuorumMode = Literal["majority", "all"]

# The vote of a member that may not lead: below every candidate's.
_NO_CANDIDATE = Vote(-1, -1, -1)

# The roles that learn from a leader.
_LEARNING = (ServerState.FOLLOWING, ServerState.OBSERVING)

# The leader's last word on a write before it is proposed: (zxid it will get, what the
# client asked) -> the entry's payload. ZooKeeper's PrepRequestProcessor lives here.
Prepare = Callable[[int, bytes], bytes]
# Which entries change the configuration: an entry's payload -> the (voters, observers) it
# proposes, or None for any other entry. Only the driver can read payloads.
ConfigOf = Callable[[bytes], tuple[tuple[int, ...], tuple[int, ...]] | None]


class Phase(Enum):
    ELECTION = "election"
    DISCOVERY = "discovery"
    SYNC = "sync"
    BROADCAST = "broadcast"


@dataclass(slots=True)
class _Session:
    """The leader's view of one follower during this leadership."""

    accepted_epoch: int
    observer: bool = False  # gets Informs, never counts in a quorum
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

    ``observers`` (ZooKeeper's observers) sync with the leader like followers but never
    vote, never ack, and count in no quorum; the leader sends them each committed entry
    once (``Inform``). An observer looks for its leader by asking the voters, and follows
    the one a quorum of them backs and that says it leads.

    Reconfiguration (with ``config_of``): an entry that names a new configuration is
    "pending" from the moment it is in the log. Until it commits, it and every entry after
    it need acks from a commit quorum of the active voters AND of the new ones (so new
    voters must be learners already: a member outside the configuration follows without a
    vote, its acks counted for the configuration that names it). Elections, discovery and
    NEWLEADER then need both quorums as well. When the entry commits, each member makes it
    active (``Ready.config``); a leader that is no voter in it steps down once its Commit
    is out, and a learner whose role changed rejoins in its new role. Only one pending
    configuration at a time: the driver refuses a second (``pending_config``).
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
        observers: Iterable[int] = (),
        config_version: int = 0,
        config_of: ConfigOf | None = None,
    ) -> None:
        self.id = node_id
        assert quorum in ("majority", "all"), quorum
        assert 0 < heartbeat_ticks < election_ticks, (heartbeat_ticks, election_ticks)
        assert diff_window >= 0 and max_in_flight > 0
        self.quorum_mode: QuorumMode = quorum
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.diff_window = diff_window
        self.max_in_flight = max_in_flight
        self._prepare = prepare
        self._config_of = config_of
        self._set_membership(
            Membership(config_version, tuple(sorted(set(members))), tuple(sorted(set(observers))))
        )
        # The newest configuration in the log, not yet committed (ZooKeeper's last seen).
        self._pending: Membership | None = None
        self._retire = False  # leader: step down once this Ready's Commits are out
        self._rejoin = False  # learner: look again, to come back in its new role
        self._commit_everyone = False  # leader: a Commit to every learner in the next Ready

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
        for entry in self._log:
            self._note_config(entry)

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

    def learner_counts(self) -> tuple[int, int, int]:
        """(learners taking part in this leadership, followers in sync: NEWLEADER acked,
        observers in sync), or zeros unless leading; for metrics. Safe to call from another
        thread: the table is copied in one C-level call before it is read."""
        if self.role != ServerState.LEADING:
            return 0, 0, 0
        sessions = list(self._sessions.values())
        synced = [s.observer for s in sessions if s.newleader_acked]
        return len(sessions), synced.count(False), synced.count(True)

    @property
    def config(self) -> Membership:
        """The active configuration."""
        return self._config

    @property
    def pending_config(self) -> Membership | None:
        return self._pending

    def synced_quorum(self, voters: Iterable[int]) -> bool:
        """Leading: do this leader and its synced followers hold a commit quorum of
        ``voters``? (ZooKeeper's isQuorumSynced, which a reconfig must pass.)"""
        if self.role != ServerState.LEADING or self.phase != Phase.BROADCAST:
            return False
        want = set(voters)
        synced = {p for p, s in self._sessions.items() if s.newleader_acked and not s.observer}
        synced.add(self.id)
        return bool(want) and len(synced & want) >= self._need(len(want))

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
                # Only a voter makes a commit quorum with the leader.
                if s.newleader_acked and not s.observer and peer in self._voter_set:
                    self._send(peer, ack)
                    s.durable_sent = durable
        if self._commit_unsent:
            # One cumulative Commit per follower for everything committed since the last
            # Ready, after the proposals it covers; none to a follower that infers it.
            self._commit_unsent = False
            commit = Commit(self.id, self.epoch, self._commit_zxid)
            everyone = self._commit_everyone
            self._commit_everyone = False
            for peer, s in self._sessions.items():
                if s.newleader_sent and not s.observer and (everyone or not self._infers(peer, s)):
                    self._send(peer, commit)
        if self._retire or self._rejoin:
            self._retire = self._rejoin = False
            self._become_looking()
        return self._out

    def has_ready(self) -> bool:
        return (
            self._hard_dirty
            or self._commit_unsent
            or self._durable_unsent
            or self._retire
            or self._rejoin
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
        elif self.role in _LEARNING:
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
        if peer == self.id:
            return
        if self.role in _LEARNING and peer == self.leader:
            self._become_looking()
        elif self.role == ServerState.LEADING:
            self._sessions.pop(peer, None)
        elif self.role == ServerState.LOOKING:
            self._early_infos.pop(peer, None)
            self._send(peer, self._notification())

    def tick(self) -> None:
        if self.role == ServerState.LOOKING:
            self._election_elapsed += 1
            # A member without a vote only asks the voters who leads: it asks often,
            # costing no one.
            every = self.election_ticks if self._counts(self.id) else self.heartbeat_ticks
            if self._election_elapsed >= every:
                self._election_elapsed = 0
                self._broadcast_notification()
        elif self.role in _LEARNING:
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
        if self.role in _LEARNING and self.leader is not None:
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
        if sender == self.id:
            return
        if isinstance(message, Notification):
            self._on_notification(message)
        elif self.role == ServerState.LEADING:
            self._leader_step(message)
        elif self.role in _LEARNING and sender == self.leader:
            self._follower_step(message)
        elif self.role == ServerState.LOOKING and isinstance(message, FollowerInfo):
            # The peer decided for us before we decided ourselves; keep it for later.
            self._early_infos[sender] = message

    # ------------------------------------------------------------------ election

    def _own_vote(self) -> Vote:
        if self.id not in self._voter_set:
            return _NO_CANDIDATE
        return Vote(self._current_epoch, self.last_zxid, self.id)

    def _rank(self, vote: Vote) -> tuple[bool, Vote]:
        """Votes for a voter of the active configuration come first: only those may lead
        (a pending configuration's new voters follow until it is active)."""
        return vote.leader in self._voter_set, vote

    def _notification(self) -> Notification:
        v, c = self._vote, self._config
        return Notification(
            self.id,
            v.leader,
            v.zxid,
            v.peer_epoch,
            self._logical_clock,
            self.role,
            c.version,
            c.voters,
            c.observers,
        )

    def _broadcast_notification(self) -> None:
        note = self._notification()
        pending = self._pending.voters if self._pending is not None else ()
        for peer in sorted({*self.members, *pending} - {self.id}):
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
        if (
            self.role == ServerState.LOOKING
            and n.voters
            and n.config_version > self._config.version
        ):
            # The sender's active configuration is committed and newer than ours: look
            # again in it.
            self._adopt(Membership(n.config_version, n.voters, n.observers))
            self._become_looking()
        vote = Vote(n.peer_epoch, n.zxid, n.leader)
        if not self._counts(n.sender):
            # An observer (or a member outside the configuration) asking who leads:
            # answer, never count its vote. Anyone not looking answers: the asker may be
            # a voter of a configuration only it knows of yet, and need to hear whom we
            # follow.
            if n.state == ServerState.LOOKING and (
                self.role != ServerState.LOOKING or self._counts(self.id)
            ):
                self._send(n.sender, self._notification())
            return
        # From a voter. Members that are no voter here still keep their vote in step
        # (a voter that counts them in a pending configuration needs it) and join the
        # leader a quorum backs, but never decide an election themselves.
        if self.role != ServerState.LOOKING:
            if n.state == ServerState.LOOKING:
                self._send(n.sender, self._notification())
            return
        if n.state == ServerState.LOOKING:
            self._out_of_election.pop(n.sender, None)
            if n.election_epoch > self._logical_clock:
                self._logical_clock = n.election_epoch
                self._recv = {}
                self._vote = max(self._own_vote(), vote, key=self._rank)
                self._broadcast_notification()
            elif n.election_epoch < self._logical_clock:
                self._send(n.sender, self._notification())
                return
            elif self._rank(vote) > self._rank(self._vote):
                self._vote = vote
                self._broadcast_notification()
            elif self._rank(vote) < self._rank(self._vote):
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
        if not self._counts(self.id):
            return
        agreeing = {p for p, v in self._recv.items() if v == self._vote}
        if not self._quorums(agreeing, commit=False):
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
        # We would back it too: a quorum may need us (one of a pending configuration's).
        supporters = {p for p, (v, _) in self._out_of_election.items() if v.leader == leader}
        supporters.add(self.id)
        # Joining a leadership decides nothing (its leader counts its quorums): the active
        # configuration is enough, and a pending one we hold may never commit.
        voted = {p for p, v in self._recv.items() if v.leader == leader}
        if self._quorums(supporters, commit=False, pending=False) or self._quorums(
            voted, commit=False, pending=False
        ):
            self._vote = self._out_of_election[leader][0]
            self._become_follower(leader)

    # ------------------------------------------------------------------ follower

    def _become_follower(self, leader: int) -> None:
        self._early_infos = {}
        self.role = ServerState.OBSERVING if self.is_observer else ServerState.FOLLOWING
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
            # Kept even when it allows no inference: a configuration about to become
            # active here may make this follower and the leader a quorum.
            if self.phase == Phase.BROADCAST:
                self._leader_durable = max(self._leader_durable, m.zxid)
                self._infer_commit()
            return
        if isinstance(m, Inform):
            if self.is_observer:
                self._on_inform(m)
            return
        if isinstance(m, Sync):
            self._on_sync(m)
        elif isinstance(m, NewLeader):
            if self.phase != Phase.SYNC or m.zxid != self.last_zxid:
                self._become_looking()
                return
            if m.voters and m.config_version > self._config.version:
                self._adopt(Membership(m.config_version, m.voters, m.observers))
                if self._rejoin:
                    return
            self._pending_newleader = m.zxid
            self._follower_maybe_ack()
        elif isinstance(m, Proposal):
            self._on_proposal(m)
        elif isinstance(m, Commit):
            if self._newleader_acked or self._pending_newleader is not None:
                self._commit_to(min(m.zxid, self.last_zxid))
                self._infer_commit()  # a configuration just active may allow more
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
        if self.is_observer:
            # An observer promises nothing: its acks count in no quorum, so any epoch the
            # leader a quorum backs has chosen is the one to sync with.
            self.epoch = m.epoch
            self.phase = Phase.SYNC
            ends = epoch_ends(self._history_zxids())
            self._send(
                m.sender,
                AckEpoch(self.id, m.epoch, self._current_epoch, self.last_zxid, ends),
            )
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
        self._pending = None  # the leader's NEWLEADER names its configuration
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

    def _on_inform(self, m: Inform) -> None:
        """A committed entry. One synced with the log already (it was in flight when the
        leader sent our Sync) is only committed; a new one must be the next in order."""
        if self._pending_newleader is None and not self._newleader_acked:
            self._become_looking()
            return
        zxid = m.entry.zxid
        if zxid > self.last_zxid:
            if zxid != self.next_zxid:
                self._become_looking()
                return
            self._append(m.entry)
        self._commit_to(zxid)

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
        if self.is_observer:
            return  # an observer's acks count in no quorum
        if self._newleader_acked and self._persisted_zxid > self._acked_sent:
            assert self.leader is not None
            self._acked_sent = self._persisted_zxid
            self._send(self.leader, Ack(self.id, self.epoch, self._persisted_zxid))

    def _infer_commit(self) -> None:
        """Commit what is durable both here and on the leader: a commit quorum's logs.
        Our log is a prefix of the leader's once we are in broadcast."""
        if (
            self.phase == Phase.BROADCAST
            and self._leader_durable
            and self._pair_quorum
            and self.is_voter
        ):
            zxid = min(self._leader_durable, self._persisted_zxid)
            if self._pending is not None:  # a pending configuration needs two quorums
                zxid = min(zxid, self._before(self._pending.version))
            self._commit_to(zxid)

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
                for p, s in self._sessions.items()
                if s.newleader_acked and p in self._voter_set and s.idle_ticks < self.election_ticks
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
            | Inform
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
            if session.newleader_acked and not session.observer and m.zxid <= self.last_zxid:
                # Any learner's acks: counted where it is a voter (active or pending).
                session.acked_zxid = max(session.acked_zxid, m.zxid)
                self._maybe_commit()
        elif isinstance(m, Forward):
            self._on_forward(m)

    def _on_follower_info(self, m: FollowerInfo) -> None:
        if m.sender in self._observer_set:
            # An observer's promises play no part in choosing the epoch: it syncs with it.
            # (A member outside every configuration follows without a vote instead: it
            # may be a voter of the next one, whose quorum its acks then count for.)
            self._sessions[m.sender] = _Session(accepted_epoch=0, observer=True)
            if self._epoch_chosen:
                self._send(m.sender, NewEpoch(self.id, self.epoch))
            return
        if self._epoch_chosen and (
            m.accepted_epoch > self.epoch
            or (m.accepted_epoch == self.epoch and m.accepted_leader != self.id)
        ):
            if not self._counts(m.sender):
                return  # no voter anywhere: it cannot unseat us; it will look again
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
        learners = [p for p, s in self._sessions.items() if not s.observer]
        if self._epoch_chosen or not self._quorums({self.id, *learners}, commit=False):
            return
        epoch = 1 + max(
            [self._accepted_epoch, *(self._sessions[p].accepted_epoch for p in learners)]
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
            newer = (m.current_epoch, m.last_zxid) > (self._current_epoch, self.last_zxid)
            # Only a member that could lead instead: a new voter of a pending configuration
            # holds nothing committed that a quorum of the active voters lacks.
            if newer and m.sender in self._voter_set:
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
        voters = {p for p in acked if not self._sessions[p].observer}
        if not self._quorums({self.id, *voters}, commit=False):
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
        c = self._config
        self._send(
            peer,
            NewLeader(self.id, self.epoch, self.last_zxid, c.version, c.voters, c.observers),
        )
        session.newleader_sent = True

    def _check_established(self) -> None:
        acks = {p for p, s in self._sessions.items() if s.newleader_acked and not s.observer}
        if self._persisted_zxid >= self._newleader_zxid:
            acks.add(self.id)
        if not self._quorums(acks, commit=True):
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
            if s.newleader_sent and not s.observer:
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
        zxid = self._acked_by_quorum(self._voter_set)
        pending = self._pending
        if pending is not None and zxid >= pending.version:
            new = self._acked_by_quorum(frozenset(pending.voters))
            zxid = min(zxid, new) if new >= pending.version else self._before(pending.version)
        if zxid <= self._commit_zxid:
            return
        self._commit_to(zxid)
        self._commit_unsent = True

    def _infers(self, peer: int, s: _Session) -> bool:
        """Will this follower commit up to our commit point on our own Ack alone?"""
        return (
            self._pair_quorum
            and s.newleader_acked
            and peer in self._voter_set
            and self._pending is None
            and self._commit_zxid <= s.durable_sent
        )

    def _acked_by_quorum(self, voters: frozenset[int]) -> int:
        """The highest zxid that a commit quorum of ``voters`` has acked (0: none)."""
        acks = [self._persisted_zxid] if self.id in voters else []
        acks.extend(
            s.acked_zxid
            for p, s in self._sessions.items()
            if p in voters and s.newleader_acked and not s.observer
        )
        need = self._need(len(voters))
        if len(acks) < need:
            return 0
        acks.sort(reverse=True)
        return acks[need - 1]

    def _in_flight(self) -> int:
        return len(self._zxids) - bisect_right(self._zxids, self._commit_zxid)

    # ------------------------------------------------------------------ log and output

    def _append(self, entry: LogEntry) -> None:
        assert entry.zxid > self.last_zxid, (entry.zxid, self.last_zxid)
        self._log.append(entry)
        self._zxids.append(entry.zxid)
        self._out.entries.append(entry)
        self._note_config(entry)

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
        if self._pending is not None and self._pending.version > zxid:
            self._pending = None  # never committed: the configuration stays as it is
        self._persisted_zxid = min(self._persisted_zxid, zxid)
        out = self._out
        out.truncate_to = zxid if out.truncate_to is None else min(out.truncate_to, zxid)
        out.entries = [e for e in out.entries if e.zxid <= zxid]

    def _commit_to(self, zxid: int) -> None:
        if zxid <= self._commit_zxid:
            return
        start = bisect_right(self._zxids, self._commit_zxid)
        end = bisect_right(self._zxids, zxid)
        observers: tuple[int, ...] = ()
        if self.role == ServerState.LEADING:
            observers = tuple(
                p for p, s in self._sessions.items() if s.observer and s.newleader_sent
            )
        for entry in self._log[start:end]:
            self._out.committed.append(entry)
            if observers:
                inform = Inform(self.id, self.epoch, entry)
                for peer in observers:
                    self._send(peer, inform)
            if self._pending is not None and entry.zxid == self._pending.version:
                self._activate(self._pending)
            request_id = self._awaiting.pop(entry.zxid, None)
            if request_id is not None:
                self._out.results.append(Committed(request_id, entry.zxid))
        self._commit_zxid = zxid

    # ------------------------------------------------------------------ configuration

    def _set_membership(self, config: Membership) -> None:
        assert config.voters and not set(config.voters) & set(config.observers), config
        self._config = config
        self.members: tuple[int, ...] = config.voters
        self.observers: tuple[int, ...] = config.observers
        self._voter_set = frozenset(config.voters)
        self._observer_set = frozenset(config.observers)
        self.is_voter = self.id in self._voter_set
        self.is_observer = self.id in self._observer_set
        self._election_quorum = len(config.voters) // 2 + 1
        self._commit_quorum = self._need(len(config.voters))
        # A follower and its leader alone are a commit quorum: see the class docstring.
        self._pair_quorum = len(config.voters) > 1 and self._commit_quorum <= 2

    def _need(self, voters: int) -> int:
        return voters if self.quorum_mode == "all" else voters // 2 + 1

    def _counts(self, member: int) -> bool:
        """A voter of the active or the pending configuration."""
        pending = self._pending
        return member in self._voter_set or (pending is not None and member in pending.voters)

    def _quorums(self, ids: set[int], commit: bool, pending: bool = True) -> bool:
        """Do ``ids`` hold a quorum (a commit quorum with ``commit``) of the active voters
        and, while a configuration is pending (unless not ``pending``), of its voters?"""
        configs = [self._config]
        if pending and self._pending is not None:
            configs.append(self._pending)
        for c in configs:
            n = len(c.voters)
            need = self._need(n) if commit else n // 2 + 1
            if len(ids.intersection(c.voters)) < need:
                return False
        return True

    def _before(self, zxid: int) -> int:
        """The zxid of the entry just before ``zxid`` in the history."""
        i = bisect_right(self._zxids, zxid)
        return self._zxids[i - 2] if i >= 2 else self._snapshot.zxid

    def _note_config(self, entry: LogEntry) -> None:
        if self._config_of is None or entry.zxid <= self._config.version:
            return
        named = self._config_of(entry.payload)
        if named is not None:
            voters, observers = named
            self._pending = Membership(
                entry.zxid, tuple(sorted(set(voters))), tuple(sorted(set(observers)))
            )

    def _activate(self, config: Membership) -> None:
        """``config`` committed: it is the configuration from now on."""
        self._pending = None
        self._adopt(config)
        if self.role == ServerState.LEADING:
            self._commit_everyone = True  # learners may not infer past a configuration
            self._retire = not self.is_voter

    def _adopt(self, config: Membership) -> None:
        if self._pending is not None and self._pending.version <= config.version:
            self._pending = None
        was = (self.is_voter, self.is_observer)
        self._set_membership(config)
        self._out.config = config
        if self.role in _LEARNING and was != (self.is_voter, self.is_observer):
            self._rejoin = True

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
