"""ZAB wire messages: small records, one per message type. Every message names its sender.

Leader/follower messages carry the epoch of the session they belong to, so that leftovers of
an earlier session on the same connection are recognised and dropped.
"""

from __future__ import annotations

from enum import Enum

from directlog.record import record
from services.consensus.zab.state import LogEntry, Snapshot


class ServerState(Enum):
    LOOKING = "looking"
    FOLLOWING = "following"
    LEADING = "leading"
    OBSERVING = "observing"  # an observer that found its leader: never votes nor acks


class SyncMode(Enum):
    DIFF = "diff"  # follower's log is a prefix of the leader's: send the missing suffix
    TRUNC = "trunc"  # follower has entries the leader lacks: truncate, then send the rest
    SNAP = "snap"  # replace the follower's log with the leader's whole log


@record
class Notification:
    """Fast leader election vote: (peer_epoch, zxid, leader) in lexicographic order. It
    carries the sender's active configuration, as ZooKeeper's does, so that a member that
    missed a reconfiguration (or started from a stale file) learns it while it looks."""

    sender: int
    leader: int
    zxid: int
    peer_epoch: int
    election_epoch: int
    state: ServerState
    config_version: int = 0
    voters: tuple[int, ...] = ()
    observers: tuple[int, ...] = ()


@record
class FollowerInfo:
    sender: int
    accepted_epoch: int
    accepted_leader: int


@record
class NewEpoch:
    sender: int
    epoch: int


@record
class AckEpoch:
    """``epoch_ends`` holds the last zxid of every epoch in the follower's log (ascending);
    with it the leader finds the exact point where the two logs diverge."""

    sender: int
    epoch: int
    current_epoch: int
    last_zxid: int
    epoch_ends: tuple[int, ...]


@record
class Sync:
    """DIFF or TRUNC: truncate the log to ``truncate_to`` then append ``entries``.
    SNAP: replace the state with ``snapshot``, then append ``entries`` (those after it)."""

    sender: int
    epoch: int
    mode: SyncMode
    truncate_to: int
    entries: tuple[LogEntry, ...]
    snapshot: Snapshot | None = None


@record
class NewLeader:
    """Carries the leader's active configuration, which a learner adopts when it is newer
    than its own (it may have missed the commit, or started from a stale file)."""

    sender: int
    epoch: int
    zxid: int
    config_version: int = 0
    voters: tuple[int, ...] = ()
    observers: tuple[int, ...] = ()


@record
class AckNewLeader:
    sender: int
    epoch: int
    zxid: int


@record
class UpToDate:
    sender: int
    epoch: int
    commit_zxid: int


@record
class Proposal:
    sender: int
    epoch: int
    entry: LogEntry


@record
class Ack:
    """Cumulative: the sender has persisted everything up to ``zxid``."""

    sender: int
    epoch: int
    zxid: int


@record
class Commit:
    """Cumulative: everything up to ``zxid`` is committed."""

    sender: int
    epoch: int
    zxid: int


@record
class Inform:
    """To an observer: ``entry`` is committed (ZooKeeper's INFORM, a proposal and its
    commit in one). Observers get no Proposal, Commit or Ack; each committed entry once."""

    sender: int
    epoch: int
    entry: LogEntry


@record
class Ping:
    sender: int
    epoch: int


@record
class PingAck:
    """``sessions``: client sessions the follower heard from since its last PingAck, so
    the leader, which expires sessions, knows they are alive."""

    sender: int
    epoch: int
    sessions: tuple[int, ...] = ()


@record
class Forward:
    """A client write that reached a follower, passed on to the leader."""

    sender: int
    epoch: int
    request_id: int
    payload: bytes


@record
class ForwardReply:
    """``zxid`` is the proposal's zxid, or None when the leader could not take it."""

    sender: int
    epoch: int
    request_id: int
    zxid: int | None


Message = (
    Notification
    | FollowerInfo
    | NewEpoch
    | AckEpoch
    | Sync
    | NewLeader
    | AckNewLeader
    | UpToDate
    | Proposal
    | Ack
    | Commit
    | Ping
    | PingAck
    | Forward
    | ForwardReply
    | Inform
)
