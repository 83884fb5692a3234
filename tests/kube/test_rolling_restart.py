"""`kubectl rollout restart` of every StatefulSet — consensus, controllers, brokers — under
an acks=all producer and a consumer group that run throughout (tests/kube/workload.py):
each pod gets SIGTERM and its grace period, its replacement must be Ready (and the
producer acknowledged again) before the next one goes, and afterwards the history shows no
send failed, no client was told of an error it could not retry, nothing acknowledged was
lost and the group read all of it. The brokers' preStop hook (the scale-down drain) sees
the StatefulSet keep its replicas and exits at once: no replica moves."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.images.engine import REPO
from tests.kube.clients import (
    BOOTSTRAP,
    CLIENT_TIMEOUT,
    assignment,
    directlog,
    in_cluster,
    kcat_read,
    python,
)
from tests.kube.conftest import READY_TIMEOUT, SETUP_TIMEOUT
from tests.kube.kubelet import Exit, Node
from tests.kube.workload import PARTITIONS, History, check

TOPIC = "kube-history"
STATEFULSETS = {"directlog-consensus": 3, "directlog-controller": 2, "directlog-broker": 3}
PROGRESS = 100  # sends the producer must get acknowledged after each pod is replaced
PROGRESS_TIMEOUT = 180.0
STOP_TIMEOUT = 420.0  # the workload's flush and catch-up after SIGTERM


class Workload:
    """tests/kube/workload.py in the cluster's name space, and its history so far."""

    def __init__(self, cluster: Node, scratch: Path) -> None:
        self.history = scratch / "history.jsonl"
        self.log = scratch / "workload.log"
        argv = python("tests.kube.workload", BOOTSTRAP, TOPIC, "kube-readers", str(self.history))
        with self.log.open("wb") as output:
            self.process = subprocess.Popen(
                in_cluster(cluster, argv, scratch), cwd=REPO, stdout=output, stderr=output
            )
        self.acknowledged = 0

    def progress(self, *_: object) -> None:
        """Wait for PROGRESS more acknowledged sends."""
        wanted = self.acknowledged + PROGRESS
        deadline = time.monotonic() + PROGRESS_TIMEOUT
        while self.acknowledged < wanted:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{self.acknowledged} acknowledged, not {wanted}"
            time.sleep(0.5)
            self.acknowledged = History.load(self.history).acknowledged()

    def stop(self) -> History:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(STOP_TIMEOUT) == 0, self.log.read_text()[-3000:]
        return History.load(self.history)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(CLIENT_TIMEOUT)


@pytest.fixture
def workload(cluster: Node, scratch: Path) -> Iterator[Workload]:
    create = f"topics create {TOPIC} --partitions {PARTITIONS} --replication-factor 3"
    directlog(cluster, *create.split(), "--config", "min.insync.replicas=2", "--if-not-exists")
    running = Workload(cluster, scratch)
    try:
        yield running
    finally:
        running.kill()


@pytest.mark.timeout(SETUP_TIMEOUT + 1500)
def test_rolling_restart_of_every_statefulset_loses_nothing(
    cluster: Node, workload: Workload, scratch: Path
) -> None:
    workload.progress()
    before = assignment(cluster)
    exits: dict[str, dict[str, Exit]] = {}
    for statefulset in STATEFULSETS:
        exits.update(cluster.rollout_restart(statefulset, READY_TIMEOUT, workload.progress))
    history = workload.stop()
    # A restart is no scale-down: each broker's hook said so and exited 0, and no partition
    # that existed before the restart has other replicas now.
    for ordinal in range(STATEFULSETS["directlog-broker"]):
        hook = exits[f"directlog-broker-{ordinal}"]["broker"].pre_stop
        assert hook is not None, "the broker container has no preStop hook"
        assert hook.code == 0, hook.output
        assert f"broker {ordinal} stays" in hook.output and "no drain" in hook.output, hook.output
    after = assignment(cluster)
    assert {p: after.get(p) for p in before} == before
    # Every pod was replaced, and every container stopped by itself within its grace period.
    assert sorted(exits) == sorted(f"{s}-{i}" for s, n in STATEFULSETS.items() for i in range(n))
    ended = {f"{pod}/{c}": e for pod, containers in exits.items() for c, e in containers.items()}
    unclean = {name: f"{e}\n{e.logs}" for name, e in ended.items() if e != Exit(0, False, 0)}
    assert unclean == {}, "\n".join(unclean.values())
    assert cluster.restarted() == {}, cluster.events  # no crash, no probe failed
    log: dict[int, dict[int, str]] = {p: {} for p in range(PARTITIONS)}
    for p, o, _, v in kcat_read(cluster, scratch, TOPIC):
        log[p][o] = v
    print(f"rolling restart of {len(exits)} pods: {check(history, log)}")
