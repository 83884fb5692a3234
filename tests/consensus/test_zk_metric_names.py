"""ZooKeeper's own Prometheus series on a consensus member, without processes: the summary
and size helpers, and the exposition of a real (unstarted) Member driven through its role
changes, in both formats Prometheus scrapes (text 0.0.4 and OpenMetrics, whose parser is
strict about types and suffixes).

The names, types and quantile labels are those of ZooKeeper 3.6-3.9's
PrometheusMetricsProvider (simpleclient 0.9): gauges registered by ZooKeeperServer,
QuorumZooKeeperServer and LeaderZooKeeperServer, summaries and counters from
ServerMetrics. tests/e2e/test_zk_metric_names.py checks the values against a running
ensemble.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from services.consensus.connections import ClientServer
from services.consensus.member import Member
from services.consensus.metrics import (
    ADVANCED,
    BASIC,
    SUMMARY_MAX_AGE,
    SUMMARY_WINDOW,
    BufferStats,
    ZkSummary,
)
from services.consensus.settings import ConsensusSettings
from services.consensus.zab import RoleChange, ServerState

# name -> quantiles (ServerMetrics: BASIC or ADVANCED detail)
SUMMARIES = {
    "fsynctime": BASIC,
    "snapshottime": BASIC,
    "election_time": BASIC,
    "follower_sync_time": BASIC,
    "dbinittime": BASIC,
    "startup_txns_loaded": BASIC,
    "readlatency": ADVANCED,
    "updatelatency": ADVANCED,
}
COUNTERS = {  # ServerMetrics counters: ZooKeeper's samples carry no _total
    "looking_count",
    "commit_count",
    "proposal_count",
    "learner_commit_received_count",
    "snap_count",
    "diff_count",
    "connection_request_count",
    "connection_rejected",
    "connection_drop_count",
    "bytes_received_count",
}
SERVER_GAUGES = {  # ZooKeeperServer.registerMetrics, while the member serves
    "avg_latency",
    "min_latency",
    "max_latency",
    "packets_received",
    "packets_sent",
    "num_alive_connections",
    "outstanding_requests",
    "uptime",
    "znode_count",
    "watch_count",
    "ephemerals_count",
    "approximate_data_size",
    "global_sessions",
    "local_sessions",
    "open_file_descriptor_count",
    "max_file_descriptor_count",
    "connection_drop_probability",
    "last_client_response_size",
    "min_client_response_size",
    "max_client_response_size",
    "outstanding_tls_handshake",
}
QUORUM_GAUGES = {"quorum_size", "synced_observers"}
LEADER_GAUGES = {
    "learners",
    "synced_followers",
    "synced_non_voting_followers",
    "pending_syncs",
    "leader_uptime",
    "last_proposal_size",
    "min_proposal_size",
    "max_proposal_size",
}


# -- ZkSummary ----------------------------------------------------------------------------


def test_summary_counts_every_observation_and_takes_quantiles_from_recent_ones() -> None:
    summary = ZkSummary("fsynctime", "doc", ADVANCED)
    assert [math.isnan(v) for v in summary.quantile_values(0.0)] == [True, True, True]
    for i in range(1, 101):
        summary.observe(float(i), now=10.0)
    assert (summary.count, summary.sum) == (100, 5050.0)
    assert summary.quantile_values(10.0) == [50.0, 90.0, 99.0]
    # Older than SUMMARY_MAX_AGE: still counted and summed, out of the quantiles.
    later = 10.0 + SUMMARY_MAX_AGE + 1
    assert all(math.isnan(v) for v in summary.quantile_values(later))
    summary.observe(7.0, now=later)
    assert summary.quantile_values(later) == [7.0, 7.0, 7.0]
    assert (summary.count, summary.sum) == (101, 5057.0)


def test_summary_window_is_bounded() -> None:
    summary = ZkSummary("readlatency", "doc")
    for i in range(SUMMARY_WINDOW + 500):
        summary.observe(1000.0 if i < 500 else 1.0, now=0.0)
    assert summary.count == SUMMARY_WINDOW + 500
    assert summary.quantile_values(0.0) == [1.0]  # the first 500 fell out of the window


@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=300),
    st.lists(st.floats(0.001, 0.999), min_size=1, max_size=5, unique=True),
)
def test_summary_quantiles_are_observed_values_in_order(
    values: list[float], quantiles: list[float]
) -> None:
    quantiles.sort()
    summary = ZkSummary("x", "doc", tuple(quantiles))
    for v in values:
        summary.observe(v, now=0.0)
    got = summary.quantile_values(0.0)
    assert all(q in values for q in got)
    assert got == sorted(got)
    # Nearest rank: at least a q share of the observations are <= the q-quantile.
    for q, v in zip(quantiles, got, strict=True):
        assert sum(1 for x in values if x <= v) >= q * len(values)


def test_buffer_stats_start_at_minus_one_like_zookeepers() -> None:
    stats = BufferStats()
    assert (stats.last, stats.min, stats.max, stats.count) == (-1, -1, -1, 0)
    for size in (40, 12, 90, 33):
        stats.update(size)
    assert (stats.last, stats.min, stats.max, stats.count) == (33, 12, 90, 4)


# -- a member's exposition ------------------------------------------------------------------


@pytest.fixture
def member(tmp_path: Path) -> Iterator[Member]:
    members = {
        i: {"client": f"127.0.0.1:{2180 + i}", "peer": f"127.0.0.1:{2880 + i}"} for i in (1, 2, 3)
    }
    settings = ConsensusSettings.model_validate({"members": members, "data_dir": tmp_path})
    m = Member(settings, 1)
    ClientServer(m)
    try:
        yield m
    finally:
        asyncio.run(m.stop())


def families(member: Member) -> dict[str, Metric]:
    """The member's /metrics in both formats; the OpenMetrics parse must accept it and name
    the same families with the same samples."""
    text = generate_latest(member.metrics.registry).decode()
    by_text = {f.name: f for f in text_string_to_metric_families(text)}
    openmetrics = generate_openmetrics(member.metrics.registry).decode()  # type: ignore[no-untyped-call]
    by_om = {f.name: f for f in parse_openmetrics(openmetrics)}  # type: ignore[no-untyped-call]
    for name in SUMMARIES.keys() | COUNTERS | SERVER_GAUGES | QUORUM_GAUGES | LEADER_GAUGES:
        assert (name in by_text) == (name in by_om), name
        if name in by_text:
            assert [s.name for s in by_text[name].samples] == [s.name for s in by_om[name].samples]
    return by_text


def check_types(found: dict[str, Metric]) -> None:
    for name, quantiles in SUMMARIES.items():
        family = found[name]
        assert family.type == "summary", name
        samples = {(s.name, tuple(sorted(s.labels.items()))) for s in family.samples}
        assert samples == {
            *((name, (("quantile", str(q)),)) for q in quantiles),
            (f"{name}_count", ()),
            (f"{name}_sum", ()),
        }
    for name in COUNTERS:
        family = found[name]
        assert family.type == "unknown", name
        assert [(s.name, s.labels) for s in family.samples] == [(name, {})]
    for name in (SERVER_GAUGES | QUORUM_GAUGES | LEADER_GAUGES) & found.keys():
        family = found[name]
        assert family.type == "gauge", name
        assert [(s.name, s.labels) for s in family.samples] == [(name, {})]


def value(found: dict[str, Metric], name: str) -> float:
    """The value of the unlabelled sample ``name`` (a gauge, or a summary's _count)."""
    family = (
        found[name.removesuffix("_count").removesuffix("_sum")]
        if name not in found
        else found[name]
    )
    (sample,) = [s for s in family.samples if s.name == name and not s.labels]
    return sample.value


def test_series_follow_the_members_role_as_zookeepers_do(member: Member) -> None:
    # Not serving: ServerMetrics' summaries and counters only, like a LOOKING ZooKeeper.
    found = families(member)
    check_types(found)
    assert not found.keys() & (SERVER_GAUGES | QUORUM_GAUGES | LEADER_GAUGES)
    assert "directlog_consensus_znodes" in found  # our own series stay
    assert value(found, "dbinittime_count") == 1
    assert value(found, "startup_txns_loaded_count") == 1

    member._role_changed(RoleChange(ServerState.LOOKING, None, 0, False))
    member._role_changed(RoleChange(ServerState.FOLLOWING, 2, 1, False))
    found = families(member)
    assert value(found, "looking_count") == 1
    assert value(found, "election_time_count") == 1
    assert not found.keys() & SERVER_GAUGES  # syncing with the leader: not serving yet

    member._role_changed(RoleChange(ServerState.FOLLOWING, 2, 1, True))
    found = families(member)
    check_types(found)
    assert found.keys() >= SERVER_GAUGES | QUORUM_GAUGES
    assert not found.keys() & LEADER_GAUGES
    assert value(found, "follower_sync_time_count") == 1
    assert value(found, "quorum_size") == 3
    assert value(found, "znode_count") == 1  # "/"
    assert value(found, "approximate_data_size") == 1  # len("/")
    assert value(found, "num_alive_connections") == 0
    assert value(found, "min_client_response_size") == -1  # no reply yet: BufferStats
    assert (
        0 < value(found, "open_file_descriptor_count") <= value(found, "max_file_descriptor_count")
    )

    # The leader dies: back to LOOKING, every server gauge goes; then this member leads.
    member._role_changed(RoleChange(ServerState.LOOKING, None, 0, False))
    assert not families(member).keys() & (SERVER_GAUGES | QUORUM_GAUGES)
    member._role_changed(RoleChange(ServerState.LEADING, 1, 2, False))
    assert not families(member).keys() & LEADER_GAUGES  # not established yet
    member._role_changed(RoleChange(ServerState.LEADING, 1, 2, True))
    found = families(member)
    check_types(found)
    assert found.keys() >= SERVER_GAUGES | QUORUM_GAUGES | LEADER_GAUGES
    assert value(found, "looking_count") == 2
    assert value(found, "election_time_count") == 2
    assert value(found, "leader_uptime") <= value(found, "uptime")
    assert value(found, "learners") == value(found, "synced_followers") == 0  # core unstarted
    assert value(found, "pending_syncs") == 0
    assert value(found, "last_proposal_size") == -1


def test_standalone_has_no_quorum_series(tmp_path: Path) -> None:
    settings = ConsensusSettings.model_validate(
        {
            "members": {1: {"client": "127.0.0.1:2181", "peer": "127.0.0.1:2881"}},
            "data_dir": tmp_path,
        }
    )
    m = Member(settings, 1)
    ClientServer(m)
    try:
        m._role_changed(RoleChange(ServerState.LOOKING, None, 0, False))
        m._role_changed(RoleChange(ServerState.LEADING, 1, 1, False))
        m._role_changed(RoleChange(ServerState.LEADING, 1, 1, True))
        found = families(m)
        check_types(found)
        assert found.keys() >= SERVER_GAUGES
        assert not found.keys() & (QUORUM_GAUGES | LEADER_GAUGES)
        assert value(found, "looking_count") == 0  # ZooKeeper standalone never elects
        assert value(found, "election_time_count") == 0
    finally:
        asyncio.run(m.stop())
