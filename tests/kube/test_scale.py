"""A fourth broker, as `kubectl scale statefulset directlog-broker --replicas=4` adds it:
`directlog rebalance --execute --wait` puts replicas on it as its printed plan says; then
`directlog brokers drain 3 --wait` and the scale back to three leave no replica on it, and
every record is still there."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.kube.clients import BOOTSTRAP, directlog, kcat, kcat_read
from tests.kube.conftest import READY_TIMEOUT, SETUP_TIMEOUT
from tests.kube.kubelet import Exit, Node

TOPIC = "kube-scale"
BROKERS = "directlog-broker"
RECORDS = 600
METADATA_TIMEOUT = 120.0

Assignment = dict[tuple[str, int], list[int]]


def assignment(cluster: Node) -> Assignment:
    """Every partition of every topic (internal ones too) with its replicas."""
    topics = json.loads(directlog(cluster, "--output", "json", "topics", "describe"))
    return {(t["topic"], p["partition"]): p["replicas"] for t in topics for p in t["partitions"]}


def planned(report: str) -> Assignment:
    """The plan a rebalance or drain printed (--output json), in the same shape."""
    entries = json.loads(report)["plan"]["partitions"]
    return {(e["topic"], e["partition"]): e["replicas"] for e in entries}


def metadata_brokers(cluster: Node, scratch: Path) -> list[int]:
    listing = json.loads(kcat(cluster, scratch, "-L", "-J", "-b", BOOTSTRAP))
    return sorted(b["id"] for b in listing["brokers"])


def values(cluster: Node, scratch: Path) -> list[str]:
    return sorted(v for _, _, _, v in kcat_read(cluster, scratch, TOPIC))


@pytest.mark.timeout(SETUP_TIMEOUT + 900)
def test_scale_out_rebalance_then_drain_and_scale_in(cluster: Node, scratch: Path) -> None:
    directlog(cluster, *f"topics create {TOPIC} --partitions 6 --replication-factor 2".split())
    written = [f"scale-{i:04d}" for i in range(RECORDS)]
    produce = f"-P -b {BOOTSTRAP} -t {TOPIC} -X acks=all"
    kcat(cluster, scratch, *produce.split(), stdin="\n".join(written) + "\n")
    assert values(cluster, scratch) == written

    assert cluster.scale(BROKERS, 4, READY_TIMEOUT) == {}
    plan = planned(directlog(cluster, *["--output", "json", "rebalance", "--execute", "--wait"]))
    assert any(3 in replicas for replicas in plan.values()), plan
    now = assignment(cluster)
    assert {p: now[p] for p in plan} == plan  # every move done as printed

    held = {p for p, replicas in now.items() if 3 in replicas}
    drain = "--output json brokers drain 3 --wait"
    moves = planned(directlog(cluster, *drain.split(), pod="directlog-broker-1"))
    assert set(moves) == held and not any(3 in replicas for replicas in moves.values())
    now = assignment(cluster)
    assert {p: now[p] for p in moves} == moves
    ended = cluster.scale(BROKERS, 3, READY_TIMEOUT)
    [(pod, containers)] = ended.items()
    assert (pod, list(containers)) == ("directlog-broker-3", ["broker"])
    assert containers["broker"] == Exit(0, False, 0), containers["broker"].logs

    # Metadata names a stopped broker until the controller ends its session (about 10 s):
    # meanwhile a client that picks it is refused.
    deadline = time.monotonic() + METADATA_TIMEOUT
    while metadata_brokers(cluster, scratch) != [0, 1, 2]:
        assert time.monotonic() < deadline, "Metadata still names broker 3"
        time.sleep(1)
    left = {p: r for p, r in assignment(cluster).items() if 3 in r}
    assert left == {}, f"replicas left on broker 3: {left}"
    brokers = json.loads(directlog(cluster, *["--output", "json", "brokers", "list"]))
    assert [(b["id"], b["live"]) for b in brokers] == [(0, True), (1, True), (2, True)]
    assert values(cluster, scratch) == written
    assert cluster.restarted() == {}, cluster.events  # no crash, no probe failed
