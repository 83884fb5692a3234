"""Fast leader election: vote order and quorum tallies."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class Vote:
    """Field order is the comparison order: the most recent history wins, then the
    highest server id breaks ties."""

    peer_epoch: int
    zxid: int
    leader: int


def better_vote(a: Vote, b: Vote) -> Vote:
    return a if a >= b else b


def votes_for(votes: Iterable[Vote], leader: int) -> int:
    return sum(1 for v in votes if v.leader == leader)
