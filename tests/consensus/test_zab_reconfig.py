"""Reconfiguration in the ZAB core: a configuration entry commits with a quorum of the
active voters and of the new ones, then each member makes it active; members outside a
configuration follow without a vote. Scenario tests here; seeded runs that reconfigure at
random under faults are in test_zab_simulation.py's VARIANTS."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.consensus.zab import Accepted, Membership, ServerState
from tests.consensus.zab_sim import CALM, Disk, Simulation, established


def _writes(sim: Simulation, ticks: int) -> None:
    """A write on the serving leader every tick: a client that keeps writing."""
    for _ in range(ticks):
        for i, node in sim.nodes.items():
            if node is not None and node.role == ServerState.LEADING:
                sim.propose(i)
        sim.step()


def _active_everywhere(sim: Simulation, voters: tuple[int, ...]) -> bool:
    return all(sim.nodes[i] is None or sim.node(i).config.voters == voters for i in sim.ids)


def test_grow_three_to_five_under_writes() -> None:
    sim, lead = established(1, replace(CALM, spares=2))
    for i in (4, 5):  # started from the three-voter file: they follow without a vote
        node = sim.node(i)
        assert (node.role, node.is_voter) == (ServerState.FOLLOWING, False)
    epoch = sim.node(lead).epoch
    _writes(sim, 10)
    result = sim.reconfigure(lead, [1, 2, 3, 4, 5], [])
    assert isinstance(result, Accepted) and result.zxid is not None
    assert sim.node(lead).pending_config == Membership(result.zxid, (1, 2, 3, 4, 5))
    _writes(sim, 30)
    assert _active_everywhere(sim, (1, 2, 3, 4, 5))
    assert all(sim.node(i).config.version == result.zxid for i in sim.ids)
    assert sim.node(lead).pending_config is None
    assert all(sim.node(i).is_voter for i in sim.ids)
    # No election: the same leadership carried on.
    assert sim.leader() == lead and all(sim.node(i).epoch == epoch for i in sim.ids)
    # Five voters: two may fail.
    for i in [i for i in sim.ids if i != lead][:2]:
        sim.crash(i)
    before = len(sim.acknowledged)
    _writes(sim, 20)
    assert len(sim.acknowledged) > before + 10
    sim.finish()


def test_shrink_five_to_three_under_writes() -> None:
    sim, lead = established(2, replace(CALM, nodes=5))
    keep = sorted([lead, *[i for i in sim.ids if i != lead][:2]])
    gone = [i for i in sim.ids if i not in keep]
    _writes(sim, 10)
    assert isinstance(sim.reconfigure(lead, keep, []), Accepted)
    _writes(sim, 30)
    assert _active_everywhere(sim, tuple(keep))
    assert [sim.node(i).is_voter for i in gone] == [False, False]
    # The removed members are no quorum any more: down, and one voter down too, the
    # remaining two of three still commit.
    for i in [*gone, next(i for i in keep if i != lead)]:
        sim.crash(i)
    before = len(sim.acknowledged)
    _writes(sim, 20)
    assert len(sim.acknowledged) > before + 10
    sim.finish()


def test_the_leader_removes_itself() -> None:
    sim, lead = established(3, replace(CALM, spares=1))
    voters = [i for i in sim.ids if i != lead]  # the other two voters and the spare
    epoch = sim.node(lead).epoch
    _writes(sim, 5)
    assert isinstance(sim.reconfigure(lead, voters, []), Accepted)
    sim.run_until(lambda: sim.node(lead).role != ServerState.LEADING, max_ticks=50)
    sim.run_until(lambda: sim.leader() is not None, max_ticks=300)
    new = sim.leader()
    assert new in voters and sim.node(new).epoch > epoch
    old = sim.node(lead)
    assert (old.role, old.is_voter, old.config.voters) == (
        ServerState.FOLLOWING,
        False,
        tuple(voters),
    )
    before = len(sim.acknowledged)
    _writes(sim, 20)
    assert len(sim.acknowledged) > before + 10
    sim.finish()


def test_a_new_configuration_needs_a_quorum_of_the_new_voters_too() -> None:
    """Three voters and two members outside; the leader proposes itself, one other voter
    and the two outsiders (three of those four must ack), and the outsiders fail before
    they ack: the old voters' acks alone commit neither it nor anything after it, and no
    follower infers a commit past it. One outsider back, it commits."""
    sim, lead = established(4, replace(CALM, spares=2))
    others = [i for i in (1, 2, 3) if i != lead]
    voters = sorted([lead, others[0], 4, 5])  # needs 3 of 4: one of 4 and 5
    _writes(sim, 5)
    sim.run_until(lambda: all(len(sim.applied[i]) == 5 for i in sim.ids), max_ticks=50)
    result = sim.reconfigure(lead, voters, [])
    assert isinstance(result, Accepted) and result.zxid is not None
    sim.crash(4)
    sim.crash(5)
    for _ in range(3):
        assert isinstance(sim.propose(lead), Accepted)
    for _ in range(8):  # within election_ticks: the leader keeps the old quorum
        sim.step()
    for i in (1, 2, 3):
        node = sim.node(i)
        assert node.commit_zxid < result.zxid and node.config.version == 0
    assert max(e.zxid for e in sim.history) < result.zxid
    sim.restart(4)
    sim.run_until(lambda: _active_everywhere(sim, tuple(voters)), max_ticks=300)
    sim.finish()


def _race(seed: int) -> tuple[Membership, Membership]:
    """Propose {1..5} from three voters, crash the leader 0 to 6 ticks later, heal: the
    configuration every node ends in (finish() demands there is one), and the new one."""
    sim, lead = established(seed, replace(CALM, spares=2))
    _writes(sim, 5)
    result = sim.reconfigure(lead, [1, 2, 3, 4, 5], [])
    assert isinstance(result, Accepted) and result.zxid is not None
    for _ in range(sim.rng.randint(0, 6)):
        sim.step()
    sim.crash(lead)
    sim.finish()  # restarts the leader; demands one configuration on every node
    (config,) = {sim.node(i).config for i in sim.ids}
    return config, Membership(result.zxid, (1, 2, 3, 4, 5))


@pytest.mark.parametrize("seed", range(10, 40))
def test_a_reconfiguration_racing_a_leader_crash_ends_in_one_configuration(seed: int) -> None:
    config, proposed = _race(seed)
    assert config in (Membership(0, (1, 2, 3)), proposed)


def test_racing_crashes_end_both_ways() -> None:
    """Over those seeds the crash comes both before and after the commit."""
    versions = {_race(seed)[0].version for seed in range(10, 40)}
    assert 0 in versions and len(versions) > 1, versions


def test_a_member_started_from_a_stale_file_learns_the_configuration() -> None:
    sim, lead = established(5, replace(CALM, spares=2))
    assert isinstance(sim.reconfigure(lead, [1, 2, 3, 4, 5], []), Accepted)
    _writes(sim, 30)
    assert _active_everywhere(sim, (1, 2, 3, 4, 5))
    current = sim.node(lead).config
    stale = next(i for i in (4, 5) if i != lead)
    sim.crash(stale)
    # A fresh data directory, started from the static file naming voters 1..3.
    sim.disks[stale] = Disk(config=Membership(0, (1, 2, 3)))
    sim.restart(stale)
    sim.run_until(lambda: sim.node(stale).config == current, max_ticks=300)
    sim.run_until(lambda: sim.leader() is not None, max_ticks=300)
    assert sim.node(stale).is_voter and sim.node(stale).role == ServerState.FOLLOWING
    sim.finish()


def test_a_voter_becomes_an_observer() -> None:
    sim, lead = established(6, replace(CALM, spares=1))
    demoted = next(i for i in (1, 2, 3) if i != lead)
    voters = sorted(i for i in sim.ids if i != demoted)
    assert isinstance(sim.reconfigure(lead, voters, [demoted]), Accepted)
    sim.run_until(lambda: sim.node(demoted).role == ServerState.OBSERVING, max_ticks=300)
    sim.run_until(lambda: sim.leader() is not None, max_ticks=300)
    assert sim.node(sim.leader() or 0).learner_counts()[2] == 1  # one synced observer
    _writes(sim, 10)
    sim.finish()
