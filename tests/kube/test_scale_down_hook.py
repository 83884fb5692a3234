"""The brokers' preStop hook, `python -m directlog.kube.scale_down`, run as the kubelet runs
it (its own process, the pod's environment, the ServiceAccount files) against the test API
server (tests/chart/apiserver.py) and a real local cluster (tests/e2e/cluster.py), no
container engine needed: a restart moves nothing; a leaving broker's replicas all go to the
brokers that stay (none to another leaving one) and every record stays readable; a drain
that would leave a partition short is refused, exits non-zero, says why, and moves
nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from tests.chart.apiserver import FakeApiServer
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.timeout(300)

NAMESPACE = "streaming"
STATEFULSET = "directlog-broker"
DIRECTLOG = Path(sys.executable).with_name("directlog")
HOOK_TIMEOUT = 120  # the hook's own --timeout; the process is bounded a little above it
RECORDS = 300
# The readers' group makes __consumer_offsets: one replica, so brokers can leave.
SETTINGS = {"offsets_topic_replication_factor": 1, "offsets_topic_num_partitions": 3}


@dataclass
class Setup:
    cluster: Cluster
    api: FakeApiServer
    account: Path

    def hook(self, broker: int, replicas: int) -> subprocess.CompletedProcess[str]:
        """The StatefulSet scaled to `replicas`, then broker `broker`'s pod stopped: its
        preStop hook, run against the broker's own listener."""
        self.api.set_replicas(NAMESPACE, STATEFULSET, replicas)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("DIRECTLOG_")},
            **self.api.environment(),
            "POD_NAME": f"{STATEFULSET}-{broker}",
            "STATEFULSET_NAME": STATEFULSET,
            "DIRECTLOG_BOOTSTRAP_SERVERS": self.cluster.brokers[broker].bootstrap,
        }
        argv = ["--timeout", str(HOOK_TIMEOUT), "--service-account-dir", str(self.account)]
        return subprocess.run(
            [sys.executable, "-m", "directlog.kube.scale_down", *argv, "--log-file", ""],
            env=env,
            capture_output=True,
            text=True,
            timeout=HOOK_TIMEOUT + 60,
            check=False,
        )

    def directlog(self, *args: str) -> str:
        done = subprocess.run(
            [str(DIRECTLOG), "--bootstrap-server", self.cluster.bootstrap, "--timeout", "20",
             *args],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"directlog {' '.join(args)}: {done.stderr[-3000:]}"
        return done.stdout

    def create(self, topic: str, partitions: int, replication_factor: int) -> None:
        self.directlog("topics", "create", topic, "--partitions", str(partitions),
                       "--replication-factor", str(replication_factor))  # fmt: skip

    def replicas(self) -> dict[tuple[str, int], list[int]]:
        topics = json.loads(self.directlog("--output", "json", "topics", "describe"))
        return {
            (t["topic"], p["partition"]): p["replicas"] for t in topics for p in t["partitions"]
        }

    def reassignments(self) -> str:
        return self.directlog("--output", "json", "reassign", "list")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    with (
        FakeApiServer(tmp_path / "api") as api,
        Cluster(tmp_path / "cluster", brokers=3, broker_settings=SETTINGS) as cluster,
    ):
        api.put_statefulset(NAMESPACE, STATEFULSET, replicas=3)
        account = api.write_service_account(tmp_path / "serviceaccount", NAMESPACE)
        yield Setup(cluster, api, account)


def _produce(bootstrap: str, topic: str, partitions: int) -> list[str]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    values = [f"hook-{i:04d}" for i in range(RECORDS)]
    failed: list[object] = []
    for i, value in enumerate(values):
        producer.produce(
            topic,
            value=value.encode(),
            partition=i % partitions,
            on_delivery=lambda error, _: failed.append(error) if error else None,
        )
    assert producer.flush(60) == 0 and failed == [], failed
    return values


def _read(bootstrap: str, topic: str, partitions: int, count: int) -> list[str]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"hook-{uuid.uuid4().hex[:6]}",
         "enable.auto.commit": False, "enable.partition.eof": True}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got: list[str] = []
    at_end: set[int] = set()
    try:
        for _ in range(600):
            if len(at_end) == partitions and len(got) >= count:
                break
            message = consumer.poll(1.0)
            if message is None:
                continue
            partition, value = message.partition(), message.value()
            if message.error():
                assert partition is not None, message.error()
                at_end.add(partition)
                continue
            assert value is not None
            got.append(value.decode())
    finally:
        consumer.close()
    return sorted(got)


def test_a_restart_moves_nothing(setup: Setup) -> None:
    setup.create("restarted", 3, 2)
    before = setup.replicas()
    done = setup.hook(broker=2, replicas=3)
    assert done.returncode == 0, done.stderr
    assert "broker 2 stays (StatefulSet directlog-broker has 3 replicas): a restart" in done.stderr
    assert setup.replicas() == before
    assert json.loads(setup.reassignments()) == []


def test_a_leaving_broker_is_drained_onto_the_brokers_that_stay(setup: Setup) -> None:
    """Scaled from 3 to 1: brokers 1 and 2 leave. Broker 2's hook moves its replicas to
    broker 0 only; broker 1's stay where they are (its own hook moves them)."""
    topic, partitions = "leaving", 6
    setup.create(topic, partitions, 1)
    written = _produce(setup.cluster.bootstrap, topic, partitions)
    # Read once first: the group makes __consumer_offsets, which is drained too.
    assert _read(setup.cluster.bootstrap, topic, partitions, len(written)) == sorted(written)
    before = setup.replicas()
    on_two = {p for p, r in before.items() if 2 in r}
    assert on_two, before
    done = setup.hook(broker=2, replicas=1)
    assert done.returncode == 0, done.stderr
    assert "broker 2 is leaving (StatefulSet directlog-broker scaled to 1)" in done.stderr
    assert "brokers [1] are leaving too" in done.stderr
    assert "Broker 2 holds no replicas any more." in done.stderr
    after = setup.replicas()
    assert {p: after[p] for p in on_two} == {p: [0] for p in on_two}
    assert {p: r for p, r in after.items() if p not in on_two} == {
        p: r for p, r in before.items() if p not in on_two
    }
    assert _read(setup.cluster.bootstrap, topic, partitions, len(written)) == sorted(written)
    # Run again (a second SIGTERM, say): nothing left to move.
    again = setup.hook(broker=2, replicas=1)
    assert again.returncode == 0, again.stderr
    assert "Broker 2 holds no replicas: nothing to move." in again.stderr
    # Broker 1's hook empties it onto broker 0 as well.
    done = setup.hook(broker=1, replicas=1)
    assert done.returncode == 0, done.stderr
    assert all(r == [0] for r in setup.replicas().values())
    assert _read(setup.cluster.bootstrap, topic, partitions, len(written)) == sorted(written)


def test_a_refused_drain_exits_non_zero_and_moves_nothing(setup: Setup) -> None:
    setup.create("everywhere", 2, 3)
    before = setup.replicas()
    done = setup.hook(broker=2, replicas=2)
    assert done.returncode == 1, done.stderr
    err = done.stderr
    assert "drain of broker 2 refused: cannot drain broker 2: only 2 other live broker(s)" in err
    assert "everywhere-0 (replication factor 3)" in err and "everywhere-1" in err
    assert "nothing was submitted" in err
    assert "under-replicated" in err and "directlog brokers list" in err
    assert setup.replicas() == before
    assert json.loads(setup.reassignments()) == []
