"""A fourth broker, as `kubectl scale statefulset directlog-broker --replicas=4` adds it:
`directlog rebalance --execute --wait` puts replicas on it as its printed plan says; then
`kubectl scale ... --replicas=3` takes it away again and its preStop hook
(directlog.kube.scale_down, reading the StatefulSet's replicas from the test API server)
drains it before it stops: no replica is left on broker 3, every partition keeps its
replica count, and every record is still there."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.kube.clients import BOOTSTRAP, Assignment, assignment, directlog, kcat, kcat_read
from tests.kube.conftest import READY_TIMEOUT, SETUP_TIMEOUT
from tests.kube.kubelet import Exit, Node

TOPIC = "kube-scale"
BROKERS = "directlog-broker"
RECORDS = 600
METADATA_TIMEOUT = 120.0


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
def test_scale_out_rebalance_then_scale_in_drains_by_itself(cluster: Node, scratch: Path) -> None:
    directlog(cluster, *f"topics create {TOPIC} --partitions 6 --replication-factor 2".split())
    written = [f"scale-{i:04d}" for i in range(RECORDS)]
    produce = f"-P -b {BOOTSTRAP} -t {TOPIC} -X acks=all"
    kcat(cluster, scratch, *produce.split(), stdin="\n".join(written) + "\n")
    assert values(cluster, scratch) == written

    assert cluster.scale(BROKERS, 4, READY_TIMEOUT) == {}
    plan = planned(directlog(cluster, *["--output", "json", "rebalance", "--execute", "--wait"]))
    assert any(3 in replicas for replicas in plan.values()), plan
    before = assignment(cluster)
    assert {p: before[p] for p in plan} == plan  # every move done as printed
    held = {p for p, replicas in before.items() if 3 in replicas}
    assert held

    # `kubectl scale --replicas=3`: the API serves 3 replicas, then broker-3 is deleted; its
    # preStop hook sees its ordinal is not below them and drains it before SIGTERM.
    ended = cluster.scale(BROKERS, 3, READY_TIMEOUT)
    [(pod, containers)] = ended.items()
    assert (pod, list(containers)) == ("directlog-broker-3", ["broker"])
    broker = containers["broker"]
    hook = broker.pre_stop
    assert hook is not None, "the broker container has no preStop hook"
    assert hook.code == 0, f"{hook.output}\n{cluster.events}"
    assert "broker 3 is leaving (StatefulSet directlog-broker scaled to 3)" in hook.output
    assert "broker 3 drained" in hook.output, hook.output
    assert broker == Exit(0, False, 0), broker.logs
    # What the hook said is in the broker's own log too (hook output goes nowhere else).
    assert "scale_down: broker 3 drained" in broker.logs, broker.logs
    print(f"broker-3's preStop hook:\n{hook.output}")

    # Metadata names a stopped broker until the controller ends its session (about 10 s):
    # meanwhile a client that picks it is refused.
    deadline = time.monotonic() + METADATA_TIMEOUT
    while metadata_brokers(cluster, scratch) != [0, 1, 2]:
        assert time.monotonic() < deadline, "Metadata still names broker 3"
        time.sleep(1)
    after = assignment(cluster)
    left = {p: r for p, r in after.items() if 3 in r}
    assert left == {}, f"replicas left on broker 3: {left}"
    for partition in held:  # each moved partition kept its replica count
        assert len(set(after[partition])) == len(before[partition]), (partition, after[partition])
    unmoved = {p: r for p, r in before.items() if p not in held}
    assert {p: after[p] for p in unmoved} == unmoved  # the drain moved nothing else
    brokers = json.loads(directlog(cluster, *["--output", "json", "brokers", "list"]))
    assert [(b["id"], b["live"]) for b in brokers] == [(0, True), (1, True), (2, True)]
    assert values(cluster, scratch) == written
    assert cluster.restarted() == {}, cluster.events  # no crash, no probe failed
