"""Fast leader election: the vote order."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class Vote:
    """Field order is the comparison order: the most recent history wins, then the
    highest server id breaks ties."""

    peer_epoch: int
    zxid: int
    leader: int
