"""What the node asks its driver to do, and what it answers a client."""

from __future__ import annotations

from dataclasses import dataclass, field

from directlog.record import record
from services.consensus.zab.messages import Message, ServerState
from services.consensus.zab.state import HardState, LogEntry, Membership, Snapshot


@record
class Accepted:
    """The write was taken. ``zxid`` is known at once on the leader; on a follower the
    write was forwarded and a later ``Proposed`` result carries it."""

    request_id: int
    zxid: int | None


@record
class NotLeader:
    """No write path here: try ``leader_hint`` (None: no leader known, try another node)."""

    leader_hint: int | None


@record
class Busy:
    """The leader is not yet serving writes, or too many proposals are in flight."""

    leader_hint: int | None


ProposeResult = Accepted | NotLeader | Busy


@record
class Proposed:
    request_id: int
    zxid: int


@record
class Committed:
    request_id: int
    zxid: int


@record
class Rejected:
    """The leader refused a forwarded write (not serving writes or overloaded)."""

    request_id: int
    leader_hint: int | None


@record
class Unknown:
    """The node lost its leader before learning the outcome: it may or may not commit."""

    request_id: int


ClientResult = Proposed | Committed | Rejected | Unknown


@record
class RoleChange:
    """``established`` is True once the leader got its quorum of NEWLEADER acks (for a
    follower: once it received UPTODATE)."""

    role: ServerState
    leader: int | None
    epoch: int
    established: bool


@dataclass(slots=True)
class Ready:
    """Actions for the driver, to be done in this order:

    1. persist ``hard_state`` (if set) and apply ``truncate_to`` (drop every entry with a
       larger zxid, including ones still being written) durably, before anything else;
       then, if ``snapshot`` is set, replace the state machine with it and store it
       durably (the leader sent its history: snapshot plus ``entries``);
    2. append ``entries`` to the log (may complete later; report with ``Node.persisted``);
    3. send ``messages``;
    4. apply ``committed`` entries to the state machine, in order;
    5. hand ``results`` to clients; note ``role_changes``; when ``config`` is set, the
       configuration it names is now active here: persist it and link to its members.

    Then call ``Node.advance()``.
    """

    messages: list[tuple[int, Message]] = field(default_factory=list)
    hard_state: HardState | None = None
    truncate_to: int | None = None
    snapshot: Snapshot | None = None
    entries: list[LogEntry] = field(default_factory=list)
    committed: list[LogEntry] = field(default_factory=list)
    results: list[ClientResult] = field(default_factory=list)
    role_changes: list[RoleChange] = field(default_factory=list)
    config: Membership | None = None

    def is_empty(self) -> bool:
        return not (
            self.messages
            or self.hard_state is not None
            or self.truncate_to is not None
            or self.snapshot is not None
            or self.entries
            or self.committed
            or self.results
            or self.role_changes
            or self.config is not None
        )
