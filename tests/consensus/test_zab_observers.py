"""Observers in the ZAB core: they learn every committed entry from the leader's Informs,
forward writes, and never vote, ack or count in a quorum. Seeded runs with observers are in
test_zab_simulation.py's VARIANTS."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from services.consensus.zab import (
    Accepted,
    HardState,
    Node,
    NotLeader,
    PersistedState,
    ServerState,
)
from services.consensus.zab.messages import (
    Ack,
    Commit,
    Inform,
    Message,
    Notification,
    Proposal,
)
from tests.consensus.zab_sim import CALM, SimConfig, Simulation, established

OBSERVED = replace(CALM, observers=2)
VOTERS = (1, 2, 3)
OBSERVERS = (4, 5)


def _established(seed: int, config: SimConfig = OBSERVED) -> tuple[Simulation, int]:
    return established(seed, config)


def _record_sends(sim: Simulation) -> list[tuple[int, int, Message]]:
    sent: list[tuple[int, int, Message]] = []
    send = sim._send

    def recording(src: int, dst: int, message: Message) -> None:
        sent.append((src, dst, message))
        send(src, dst, message)

    sim._send = recording  # type: ignore[method-assign]
    return sent


@pytest.mark.parametrize("seed", range(1, 21))
def test_an_observer_is_never_elected(seed: int) -> None:
    """Votes tie on history and the highest id breaks ties: yet the leader is a voter, and
    the observers observe it."""
    sim, lead = _established(seed)
    assert lead in VOTERS
    for i in OBSERVERS:
        node = sim.node(i)
        assert (node.role, node.leader, node.epoch) == (ServerState.OBSERVING, lead, 1)
    assert sim.node(lead).learner_counts() == (4, 2, 2)


def test_observers_get_informs_and_never_ack() -> None:
    sim, lead = _established(2)
    sent = _record_sends(sim)
    zxids = []
    for _ in range(5):
        result = sim.propose(lead)
        assert isinstance(result, Accepted) and result.zxid is not None
        zxids.append(result.zxid)
    sim.run_until(lambda: all(len(sim.applied[i]) == 5 for i in sim.ids), max_ticks=50)
    to_observers = Counter(type(m).__name__ for _, dst, m in sent if dst in OBSERVERS)
    assert set(to_observers) <= {"Inform", "Ping"}, to_observers
    for o in OBSERVERS:  # each entry once, in order
        assert [m.entry.zxid for _, dst, m in sent if dst == o and isinstance(m, Inform)] == zxids
    assert not [m for src, _, m in sent if src in OBSERVERS and isinstance(m, Ack)]
    followers = [i for i in VOTERS if i != lead]
    voters_got = Counter(type(m) for _, dst, m in sent if dst in followers)
    assert voters_got[Proposal] == 10 and voters_got[Inform] == 0
    for i in OBSERVERS:
        assert [e.zxid for e in sim.applied[i]] == zxids


def test_a_write_on_an_observer_is_forwarded() -> None:
    sim, _ = _established(3)
    result = sim.propose(4)
    assert isinstance(result, Accepted) and result.zxid is None
    sim.run_until(lambda: len(sim.acknowledged) == 1, max_ticks=50)
    sim.run_until(lambda: all(len(sim.applied[i]) == 1 for i in sim.ids), max_ticks=50)
    (payload,) = sim.acknowledged.values()
    assert sim.applied[5][0].payload == payload


def test_observers_down_change_nothing() -> None:
    sim, lead = _established(4)
    for i in OBSERVERS:
        sim.crash(i)
    for _ in range(40):  # past election_ticks: the leader keeps its quorum of voters
        sim.step()
    assert sim.node(lead).role == ServerState.LEADING
    for _ in range(5):
        assert isinstance(sim.propose(lead), Accepted)
    sim.run_until(lambda: len(sim.acknowledged) == 5, max_ticks=50)
    sim.run_until(lambda: all(len(sim.applied[i]) == 5 for i in VOTERS), max_ticks=50)
    # Back up, they catch up from the leader.
    for i in OBSERVERS:
        sim.restart(i)
    sim.run_until(lambda: all(len(sim.applied[i]) == 5 for i in OBSERVERS), max_ticks=200)


def test_observers_make_no_quorum() -> None:
    """Two voters down of three, both observers up: three members live, but no quorum of
    voters, so nothing commits and the leader steps down."""
    sim, lead = _established(5)
    assert isinstance(sim.propose(lead), Accepted)
    sim.run_until(lambda: len(sim.acknowledged) == 1, max_ticks=50)
    down = [i for i in VOTERS if i != lead]
    for i in down:
        sim.crash(i)
    result = sim.propose(lead)
    assert isinstance(result, Accepted)
    sim.run_until(lambda: sim.node(lead).role == ServerState.LOOKING, max_ticks=50)
    for _ in range(100):
        sim.step()
        assert all(sim.node(i).role != ServerState.LEADING for i in (lead, *OBSERVERS))
    assert len(sim.history) == 1 and len(sim.acknowledged) == 1
    assert sim.node(4).propose(b"x") == NotLeader(None)
    # One voter back: a quorum again, observers follow the new leadership.
    sim.restart(down[0])
    sim.run_until(
        lambda: any(sim.node(i).role == ServerState.LEADING for i in (lead, down[0])),
        max_ticks=300,
    )
    sim.run_until(
        lambda: all(sim.node(i).role == ServerState.OBSERVING for i in OBSERVERS), max_ticks=300
    )


@pytest.mark.parametrize("quorum", ["majority", "all"])
def test_quorum_all_counts_only_voters(quorum: str) -> None:
    """quorum "all": every voter acks each proposal, observers down or not."""
    config = replace(OBSERVED, quorum=quorum)  # type: ignore[arg-type]
    sim, lead = _established(6, config)
    sim.crash(4)
    assert isinstance(sim.propose(lead), Accepted)
    sim.run_until(lambda: len(sim.acknowledged) == 1, max_ticks=50)


def test_voters_ignore_observer_votes() -> None:
    """An observer's notification, whatever it claims, is answered and never counted."""
    node = Node(1, VOTERS, observers=OBSERVERS)
    node.advance()
    # A LOOKING observer voting for itself with a newer history than anyone.
    node.step(Notification(4, 4, 1 << 40, 9, 99, ServerState.LOOKING))
    ready = node.ready()
    node.advance()
    assert [(to, type(m)) for to, m in ready.messages] == [(4, Notification)]
    reply = ready.messages[0][1]
    assert isinstance(reply, Notification) and reply.leader == 1  # its own vote, unchanged
    assert node.role == ServerState.LOOKING and node._recv == {1: node._vote}


def test_an_observer_syncs_whatever_epoch_it_promised() -> None:
    """An observer that once accepted epoch 9 from a leader that never established still
    syncs with the epoch-1 leadership of the voters (a voter would refuse it), and its
    promise does not push the voters' epoch."""
    initial = {4: PersistedState(HardState(9, 2, 0))}
    sim = Simulation(7, OBSERVED, initial)
    sim.run_until(lambda: sim.leader() is not None, max_ticks=300)
    assert all(sim.node(i).epoch == 1 for i in sim.ids)
    assert sim.node(4).role == ServerState.OBSERVING
    lead = sim.leader()
    assert lead is not None and isinstance(sim.propose(lead), Accepted)
    sim.run_until(lambda: all(len(sim.applied[i]) == 1 for i in sim.ids), max_ticks=100)


def test_observer_commit_messages_are_not_sent() -> None:
    """Observers need no Commit: the Inform is the commit."""
    sim, lead = _established(8)
    sent = _record_sends(sim)
    result = sim.propose(next(i for i in VOTERS if i != lead))  # forwarded
    assert isinstance(result, Accepted)
    sim.run_until(lambda: all(len(sim.applied[i]) == 1 for i in sim.ids), max_ticks=50)
    assert not [m for _, dst, m in sent if dst in OBSERVERS and isinstance(m, Commit)]
