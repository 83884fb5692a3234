"""Observers (``role: observer``, ZooKeeper's observers) in a real ensemble of three voters
and two observers, driven by kazoo.

An observer serves reads and watches from its own tree, forwards writes to the leader, and
reports ``Mode: observer`` in ``srvr``/``mntr``; it never counts in a quorum: with every
observer down the voters keep committing, one observer's loss changes nothing (no
election), and observers without a quorum of voters serve nothing.
"""

from __future__ import annotations

import re
import threading
import urllib.request
from pathlib import Path

import pytest
from kazoo.protocol.states import WatchedEvent

from services.consensus.fourletter import ask
from tests.e2e.ensemble import Ensemble, wait_until
from tests.e2e.zk_history import connected

pytestmark = pytest.mark.timeout(300)

SLOW = 60.0  # seconds: generous for elections and reconnects on a loaded 2-core machine
VOTERS = [1, 2, 3]
OBSERVERS = [4, 5]


def ensemble(tmp_path: Path) -> Ensemble:
    return Ensemble(tmp_path, size=5, observers=OBSERVERS)


def srvr_mode(ens: Ensemble, member: int) -> str | None:
    found = re.search(r"^Mode: (\S+)$", ask(ens.client_ports[member], "srvr"), re.MULTILINE)
    return found.group(1) if found else None


def gauge(ens: Ensemble, member: int, name: str) -> float | None:
    with urllib.request.urlopen(ens.metrics_url(member), timeout=5) as response:
        text = response.read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def epochs(ens: Ensemble, members: list[int]) -> dict[int, str]:
    return {i: ens.stat(i)["zk_epoch"] for i in members}


def test_observers_serve_reads_watches_and_forward_writes(tmp_path: Path) -> None:
    with ensemble(tmp_path) as ens:
        ens.start()
        leader = ens.wait_serving(timeout=SLOW)
        assert leader in VOTERS
        modes = {i: ens.mode(i) for i in ens.ids}
        assert modes == {i: "leader" if i == leader else "follower" for i in VOTERS} | {
            4: "observer",
            5: "observer",
        }
        assert all(srvr_mode(ens, i) == "observer" for i in OBSERVERS)
        assert gauge(ens, leader, "quorum_size") == 3
        wait_until(
            lambda: gauge(ens, leader, "synced_observers") == 2,
            "the leader to count two synced observers",
            SLOW,
        )
        assert gauge(ens, leader, "learners") == 4
        assert gauge(ens, leader, "synced_followers") == 2
        assert gauge(ens, 4, "directlog_consensus_role") == 4

        with (
            connected(ens.host(4)) as on_observer,
            connected(",".join(ens.host(i) for i in VOTERS)) as on_voters,
        ):
            # A write through the observer: forwarded, committed, seen everywhere.
            on_observer.create("/obs/a", b"from-observer", makepath=True)
            assert on_observer.get("/obs/a")[0] == b"from-observer"
            on_voters.sync("/obs")
            assert on_voters.get("/obs/a")[0] == b"from-observer"

            # Watches set on the observer fire for writes made through the voters.
            fired: list[WatchedEvent] = []
            got = threading.Event()

            def watch(event: WatchedEvent) -> None:
                fired.append(event)
                got.set()

            assert on_observer.get("/obs/a", watch=watch)[0] == b"from-observer"
            children: list[WatchedEvent] = []
            on_observer.get_children("/obs", watch=children.append)
            on_voters.set("/obs/a", b"from-voters")
            on_voters.create("/obs/b", b"")
            assert got.wait(SLOW)
            assert [(e.type, e.path) for e in fired] == [("CHANGED", "/obs/a")]
            wait_until(lambda: children, "the child watch on the observer", SLOW)
            assert [(e.type, e.path) for e in children] == [("CHILD", "/obs")]
            # The observer's tree has the voters' write (its reads are its own tree's).
            assert on_observer.get("/obs/a")[0] == b"from-voters"
            assert sorted(on_observer.get_children("/obs")) == ["a", "b"]
        with connected(ens.host(5)) as other:
            other.sync("/obs")
            assert sorted(other.get_children("/obs")) == ["a", "b"]
            assert other.get("/obs/a")[0] == b"from-voters"


def test_observer_loss_changes_nothing_about_the_quorum(tmp_path: Path) -> None:
    with ensemble(tmp_path) as ens:
        ens.start()
        leader = ens.wait_serving(timeout=SLOW)
        before = epochs(ens, VOTERS)

        # One observer down: same leader, same epoch, writes through the other observer.
        ens.kill(4)
        with connected(ens.host(5)) as client:
            for n in range(10):
                client.create(f"/one-down/{n}", str(n).encode(), makepath=True)
        assert ens.leader() == leader and epochs(ens, VOTERS) == before

        # Both observers down: the voters alone still commit, no election.
        ens.kill(5)
        voters = ",".join(ens.host(i) for i in VOTERS)
        with connected(voters) as client:
            for n in range(10):
                client.create(f"/all-down/{n}", str(n).encode(), makepath=True)
            assert len(client.get_children("/all-down")) == 10
        assert ens.leader() == leader and epochs(ens, VOTERS) == before

        # Back up, they catch up with what was written meanwhile.
        ens.start(4)
        ens.start(5)
        ens.wait_serving(timeout=SLOW)
        for i in OBSERVERS:
            with connected(ens.host(i)) as client:
                client.sync("/")
                assert sorted(client.get_children("/one-down")) == [str(n) for n in range(10)]
                assert client.get("/all-down/9")[0] == b"9"
        assert ens.leader() == leader and epochs(ens, VOTERS) == before


def test_observers_are_no_quorum(tmp_path: Path) -> None:
    """One voter and two observers up: three of five members, but one of three voters:
    nobody serves, and the data written before survives a voter's return."""
    with ensemble(tmp_path) as ens:
        ens.start()
        leader = ens.wait_serving(timeout=SLOW)
        with connected(ens.host(4)) as client:
            client.create("/kept", b"before")
        down = [i for i in VOTERS if i != leader]
        for i in down:
            ens.kill(i)
        up = [leader, *OBSERVERS]
        wait_until(
            lambda: all(ens.mode(i) == "looking" for i in up),
            "the last voter and the observers to stop serving",
            SLOW,
        )
        assert all(ask(ens.client_ports[i], "isro") == "null" for i in up)
        ens.start(down[0])
        ens.wait_serving(timeout=SLOW)
        assert {ens.mode(i) for i in OBSERVERS} == {"observer"}
        with connected(ens.host(5)) as client:
            assert client.get("/kept")[0] == b"before"
            client.set("/kept", b"after")
        with connected(ens.host(down[0])) as client:
            client.sync("/kept")
            assert client.get("/kept")[0] == b"after"
