"""ZooKeeper's own Prometheus series on a real 3-member ensemble, driven by kazoo.

Each member's /metrics is parsed with prometheus_client's parser and checked for the
series the common ZooKeeper dashboards query (Grafana 10465 "ZooKeeper by Prometheus"),
under ZooKeeper 3.6-3.9's names, types and quantile labels, with the values they have in
ZooKeeper: znodes, ephemerals and data size as a client walking the tree sees them,
watches and connections on the member the clients use, the leader's series on exactly one
member, quorum and sync counts. Apache ZooKeeper itself is not run for comparison: Debian's
package has no Prometheus metrics provider; tests/consensus/test_zk_metric_names.py holds
the names to ZooKeeper's provider instead. Every wait is bounded; nothing asserts a
duration.
"""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import WatchedEvent, ZnodeStat
from prometheus_client.parser import text_string_to_metric_families

from tests.consensus.test_zk_metric_names import (
    COUNTERS,
    LEADER_GAUGES,
    QUORUM_GAUGES,
    SERVER_GAUGES,
    SUMMARIES,
)
from tests.e2e.ensemble import Ensemble, KazooClients, wait_until

pytestmark = pytest.mark.timeout(180)


class Scrape:
    """One member's /metrics as Prometheus' parser reads it."""

    def __init__(self, ens: Ensemble, member: int) -> None:
        with urllib.request.urlopen(ens.metrics_url(member), timeout=5) as response:
            text = response.read().decode()
        self.types: dict[str, str] = {}
        self.samples: dict[str, float] = {}  # name, or name{k=v,...}
        self.labelled: dict[str, list[tuple[str, dict[str, str]]]] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            self.labelled[family.name] = [(s.name, s.labels) for s in family.samples]
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                self.samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value

    def __getitem__(self, name: str) -> float:
        return self.samples[name]

    def has(self, name: str) -> bool:
        return name in self.samples


def scrapes(ens: Ensemble) -> dict[int, Scrape]:
    return {i: Scrape(ens, i) for i in ens.running()}


def walk(client: KazooClient, path: str = "/") -> list[tuple[str, bytes, ZnodeStat]]:
    """Every znode a client sees, from the root (ZooKeeper's own /zookeeper nodes, if the
    server had them, included as ZooKeeper counts them)."""
    data, stat = client.get(path)
    found = [(path, data, stat)]
    for child in sorted(client.get_children(path)):
        found += walk(client, f"{path.rstrip('/')}/{child}")
    return found


def check_zookeeper_exposition(scrape: Scrape) -> None:
    """ZooKeeper's types and labels: summaries with their quantiles, _count and _sum;
    counters sampled under their own names (no _total); unlabelled gauges."""
    for name, quantiles in SUMMARIES.items():
        assert scrape.types[name] == "summary", name
        assert sorted(scrape.labelled[name], key=str) == sorted(
            [
                *((name, {"quantile": str(q)}) for q in quantiles),
                (f"{name}_count", {}),
                (f"{name}_sum", {}),
            ],
            key=str,
        )
    for name in COUNTERS:
        assert scrape.types[name] == "unknown", name
        assert scrape.labelled[name] == [(name, {})]
    for name in (SERVER_GAUGES | QUORUM_GAUGES | LEADER_GAUGES) & scrape.types.keys():
        assert scrape.types[name] == "gauge", name
        assert scrape.labelled[name] == [(name, {})]


def leader_series_settled(ens: Ensemble, followers: int) -> dict[int, Scrape] | None:
    """Every running member's scrape once they all serve, exactly one shows the leader's
    series and it has ``followers`` synced followers; else None (also while a member just
    started does not answer on its metrics port yet)."""
    try:
        found = scrapes(ens)
    except OSError:
        return None
    if not all(s.has("uptime") for s in found.values()):
        return None
    leaders = [i for i, s in found.items() if s.has("leader_uptime")]
    if len(leaders) != 1 or found[leaders[0]]["synced_followers"] != followers:
        return None
    return found


# -- role and quorum ------------------------------------------------------------------------


def test_leader_series_on_exactly_the_leader(ens: Ensemble) -> None:
    found = wait_until(lambda: leader_series_settled(ens, 2), "a leader with 2 synced followers")
    leader = ens.wait_serving()
    for i, scrape in found.items():
        check_zookeeper_exposition(scrape)
        assert scrape["quorum_size"] == 3
        assert scrape["synced_observers"] == 0
        assert scrape["election_time_count"] >= 1
        assert scrape["looking_count"] >= 1
        assert scrape.has("directlog_consensus_role")  # our own series stay
        if i == leader:
            assert scrape.types.keys() >= LEADER_GAUGES
            assert scrape["learners"] == scrape["synced_followers"] == 2
            assert scrape["synced_non_voting_followers"] == 0
            assert 0 <= scrape["leader_uptime"] <= scrape["uptime"]
            assert scrape["diff_count"] + scrape["snap_count"] >= 2  # one sync per follower
            assert scrape["directlog_consensus_role"] == 2
        else:
            assert not scrape.types.keys() & LEADER_GAUGES
            assert scrape["follower_sync_time_count"] >= 1
            assert scrape["directlog_consensus_role"] == 1


# -- the tree -------------------------------------------------------------------------------


def test_tree_gauges_are_what_kazoo_sees(ens: Ensemble, zk: KazooClients, base: str) -> None:
    writer = zk(ens.hosts)
    other = zk(ens.host(ens.ids[-1]))
    writer.create(base, b"top")
    for i in range(6):
        writer.create(f"{base}/p{i}", b"x" * (i * 37))
    writer.create(f"{base}/seq-", b"s", sequence=True)
    writer.create(f"{base}/e-writer", b"ephemeral", ephemeral=True)
    for i in range(3):
        other.create(f"{base}/e-other{i}", b"e" * i, ephemeral=True)
    writer.set(f"{base}/p2", b"y" * 500)  # data size follows a setData
    writer.delete(f"{base}/p5")

    def expected(client: KazooClient) -> tuple[int, int, int]:
        client.sync("/")
        tree = walk(client)
        return (
            len(tree),
            sum(1 for _, _, stat in tree if stat.ephemeralOwner),
            sum(len(path) + len(data) for path, data, _ in tree),
        )

    def tree_gauges(s: Scrape) -> tuple[int, int, int]:
        return int(s["znode_count"]), int(s["ephemerals_count"]), int(s["approximate_data_size"])

    def converged(want: tuple[int, int, int], sessions: int) -> dict[int, Scrape] | None:
        found = scrapes(ens)
        ok = all(
            tree_gauges(s) == want and s["global_sessions"] == sessions for s in found.values()
        )
        return found if ok else None

    want = expected(writer)
    assert want[1] == 4
    found = wait_until(lambda: converged(want, 2), f"every member at {want}, 2 sessions")
    for scrape in found.values():
        assert scrape["znode_count"] == scrape["directlog_consensus_znodes"]
        assert scrape["local_sessions"] == 0

    other.stop()  # its session closes: its ephemerals go
    want = expected(writer)
    assert want[1] == 1
    wait_until(lambda: converged(want, 1), f"every member at {want}, 1 session")


# -- where the clients are --------------------------------------------------------------------


def test_watches_connections_and_traffic_counted_where_clients_are(
    ens: Ensemble, zk: KazooClients, base: str
) -> None:
    a, b, c = ens.ids
    leader = ens.wait_serving()
    on_a = [zk(ens.host(a)), zk(ens.host(a))]
    on_b = zk(ens.host(b))
    writer = on_a[0]
    writer.create(f"{base}/data", b"1", makepath=True)
    writer.create(f"{base}/kids/k0", makepath=True)

    wait_until(
        lambda: [Scrape(ens, i)["num_alive_connections"] for i in (a, b, c)] == [2, 1, 0],
        "2, 1 and 0 client connections",
    )
    events: list[WatchedEvent] = []
    fired = threading.Event()

    def record(event: WatchedEvent) -> None:
        events.append(event)
        fired.set()

    # Three registrations on a, one on b: data, child, and exists of a missing node.
    on_a[0].get(f"{base}/data", watch=record)
    on_a[1].get_children(f"{base}/kids", watch=record)
    on_a[1].exists(f"{base}/missing", watch=record)
    on_b.exists(f"{base}/data", watch=record)
    wait_until(
        lambda: [Scrape(ens, i)["watch_count"] for i in (a, b, c)] == [3, 1, 0],
        "3, 1 and 0 watches",
    )
    writer.set(f"{base}/data", b"2")  # fires one watch on a and the one on b
    wait_until(lambda: len(events) == 2, "two data-changed events")
    wait_until(
        lambda: [Scrape(ens, i)["watch_count"] for i in (a, b, c)] == [2, 0, 0],
        "2, 0 and 0 watches after the event",
    )

    before = scrapes(ens)
    reads, writes = 20, 8
    for _ in range(reads):
        writer.get(f"{base}/data")
    for i in range(writes):
        writer.set(f"{base}/data", b"%d" % i)
    writer.sync(base)

    def traffic_seen() -> dict[int, Scrape] | None:
        now = scrapes(ens)
        followers = [i for i in ens.ids if i != leader]
        done = (
            now[leader]["commit_count"] >= before[leader]["commit_count"] + writes
            and all(
                now[i]["learner_commit_received_count"]
                >= before[i]["learner_commit_received_count"] + writes
                for i in followers
            )
            and all(s["outstanding_requests"] == 0 for s in now.values())
            and now[leader]["pending_syncs"] == 0
        )
        return now if done else None

    after = wait_until(traffic_seen, "the writes committed everywhere, nothing outstanding")
    sa, ba = after[a], before[a]
    assert sa["packets_received"] >= ba["packets_received"] + reads + writes + 1
    assert sa["packets_sent"] >= ba["packets_sent"] + reads + writes + 1
    assert sa["bytes_received_count"] > ba["bytes_received_count"]
    assert sa["readlatency_count"] >= ba["readlatency_count"] + reads
    assert sa["updatelatency_count"] >= ba["updatelatency_count"] + writes
    assert sa["connection_request_count"] >= 2
    assert 0 <= sa["min_latency"] <= sa["avg_latency"] <= sa["max_latency"]
    assert 0 < sa["min_client_response_size"] <= sa["last_client_response_size"]
    assert sa["last_client_response_size"] <= sa["max_client_response_size"]
    for q in ("0.5", "0.9", "0.99"):
        assert sa[f"readlatency{{quantile={q}}}"] >= 0
    for i, s in after.items():
        assert s["fsynctime_count"] > before[i]["fsynctime_count"]
        assert s["fsynctime_sum"] >= before[i]["fsynctime_sum"]
        assert 0 < s["open_file_descriptor_count"] <= s["max_file_descriptor_count"]
        if i != leader:  # only the leader proposes and commits
            assert s["commit_count"] == before[i]["commit_count"]
            assert s["proposal_count"] == before[i]["proposal_count"]
    sl = after[leader]
    assert sl["proposal_count"] >= before[leader]["proposal_count"] + writes
    assert 0 < sl["min_proposal_size"] <= sl["last_proposal_size"] <= sl["max_proposal_size"]
    assert sl["learner_commit_received_count"] == before[leader]["learner_commit_received_count"]

    for client in [*on_a, on_b]:
        client.stop()
    wait_until(
        lambda: [Scrape(ens, i)["num_alive_connections"] for i in (a, b, c)] == [0, 0, 0],
        "no client connections left",
    )
    wait_until(
        lambda: [Scrape(ens, i)["watch_count"] for i in (a, b, c)] == [0, 0, 0],
        "no watches left with their sessions",
    )


# -- a new leader ---------------------------------------------------------------------------


def test_leader_series_move_with_the_leadership(tmp_path: Path) -> None:
    with Ensemble(tmp_path / "ensemble") as ens:
        ens.start()
        old = ens.wait_serving()
        before = wait_until(lambda: leader_series_settled(ens, 2), "a settled leader")
        ens.stop(old)
        survivors = [i for i in ens.ids if i != old]
        new = ens.wait_serving(survivors)
        found = wait_until(lambda: leader_series_settled(ens, 1), "a leader with one follower")
        assert [i for i, s in found.items() if s.has("leader_uptime")] == [new]
        assert found[new]["learners"] == 1
        for i in survivors:
            check_zookeeper_exposition(found[i])
            assert found[i]["looking_count"] > before[i]["looking_count"]
            assert found[i]["election_time_count"] > before[i]["election_time_count"]
            assert found[i]["quorum_size"] == 3

        ens.start(old)  # back as a follower of the new leader
        found = wait_until(lambda: leader_series_settled(ens, 2), "the old leader following")
        assert [i for i, s in found.items() if s.has("leader_uptime")] == [new]
        assert not found[old].types.keys() & LEADER_GAUGES
        assert found[old]["follower_sync_time_count"] >= 1
        assert found[old]["dbinittime_count"] == 1
