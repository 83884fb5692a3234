"""What a node keeps on disk: its epochs and its log."""

from __future__ import annotations

from dataclasses import field

from directlog.record import record


@record
class LogEntry:
    """One transaction. A zxid names exactly one entry ensemble-wide: only the single
    leader of an epoch mints zxids in it."""

    zxid: int
    payload: bytes


@record
class HardState:
    """The epochs ZAB must persist before acting on them.

    ``accepted_leader`` records who proposed ``accepted_epoch`` so that a follower that
    reconnects to the same leader (same epoch) can acknowledge it again, while a second
    leader that picked the same epoch is refused.
    """

    accepted_epoch: int = 0
    accepted_leader: int = -1
    current_epoch: int = 0


@record
class Snapshot:
    """The state machine's image after applying every entry up to ``zxid``; opaque to ZAB.
    ``Snapshot(0, b"")`` is the empty state before the first entry."""

    zxid: int
    data: bytes


EMPTY_SNAPSHOT = Snapshot(0, b"")


@record
class Membership:
    """One configuration of the ensemble: who votes and who observes. ``version`` is the
    zxid of the entry that proposed it (0: the static one members start with), as
    ZooKeeper's config version is."""

    version: int
    voters: tuple[int, ...]
    observers: tuple[int, ...] = ()


@record
class PersistedState:
    """What survives a crash: the hard state, the latest snapshot and the durable log
    entries after it (zxid order)."""

    hard_state: HardState = field(default_factory=HardState)
    log: tuple[LogEntry, ...] = ()
    snapshot: Snapshot = EMPTY_SNAPSHOT
