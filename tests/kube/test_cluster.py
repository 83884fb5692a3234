"""The chart's pods, started as a kubelet would start them, turn Ready and serve real
clients by the names the chart gives out: confluent-kafka and kcat through the brokers'
bootstrap Service, kazoo through the consensus client Service, and the admin CLI inside a
broker container."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kube.clients import (
    BOOTSTRAP,
    ZOOKEEPER,
    directlog,
    kcat,
    kcat_read,
    pod_host,
    python,
    run,
)
from tests.kube.conftest import SETUP_TIMEOUT
from tests.kube.kubelet import Node

# The first test of a session also waits for the images and the install.
pytestmark = pytest.mark.timeout(SETUP_TIMEOUT + 300)

TOPIC = "kube-smoke"
BROKERS = [f"directlog-broker-{i}" for i in range(3)]


def test_every_pod_ready_as_the_chart_runs_it(cluster: Node) -> None:
    assert sorted(cluster.pods) == [
        *BROKERS,
        *(f"directlog-consensus-{i}" for i in range(3)),
        *(f"directlog-controller-{i}" for i in range(2)),
    ]
    for name, pod in cluster.pods.items():
        assert pod.ready, name
        [container] = pod.containers  # tiering is off: no sidecar
        script = "id -u; touch /x 2>&1; true"
        uid, *touch = cluster.exec(
            name, container.name, "sh", "-c", script, timeout=60
        ).stdout.splitlines()
        assert uid == "10001", name
        assert "Read-only file system" in "".join(touch), name
    assert cluster.restarted() == {}, cluster.events  # no crash, no probe failed


@pytest.fixture(scope="module")
def smoke_topic(cluster: Node) -> str:
    create = f"topics create {TOPIC} --partitions 3 --replication-factor 3"
    directlog(cluster, *create.split(), "--config", "min.insync.replicas=2", "--if-not-exists")
    return TOPIC


def test_confluent_kafka_and_kcat_through_the_bootstrap_service(
    cluster: Node, smoke_topic: str, scratch: Path
) -> None:
    lines = [f"k{i}:kcat-{i}" for i in range(100)]
    produce = f"-P -b {BOOTSTRAP} -t {smoke_topic} -K: -X acks=all"
    kcat(cluster, scratch, *produce.split(), stdin="\n".join(lines) + "\n")
    command = python("tests.kube.clients", "roundtrip", BOOTSTRAP, smoke_topic, "100")
    trip = json.loads(run(cluster, command, scratch).stdout)
    assert {v for _, _, v in trip["acked"]} == {f"confluent-{i}" for i in range(100)}
    read = {(p, o): v for p, o, v in trip["read"]}
    assert all(read[(p, o)] == v for p, o, v in trip["acked"])
    by_kcat = kcat_read(cluster, scratch, smoke_topic)
    assert {(p, o): v for p, o, _, v in by_kcat} == read  # both read the same log
    assert {(k, v) for _, _, k, v in by_kcat if v.startswith("kcat-")} == {
        (f"k{i}", f"kcat-{i}") for i in range(100)
    }
    # Metadata names every broker by its pod's name through the headless Service.
    listing = json.loads(kcat(cluster, scratch, "-L", "-J", "-b", BOOTSTRAP, "-t", smoke_topic))
    assert sorted(b["name"] for b in listing["brokers"]) == [f"{pod_host(b)}:9092" for b in BROKERS]


def test_kazoo_through_the_consensus_service(cluster: Node, scratch: Path) -> None:
    found = json.loads(
        run(cluster, python("tests.kube.clients", "znodes", ZOOKEEPER), scratch).stdout
    )
    assert found["written"] == "written through the Service"
    assert sorted(found["brokers"]) == ["0", "1", "2"]
    for broker_id, registration in found["brokers"].items():
        [internal] = [x for x in registration["listeners"] if x["name"] == "INTERNAL"]
        assert (internal["host"], internal["port"]) == (pod_host(BROKERS[int(broker_id)]), 9092)
    controllers = {f"{pod_host(f'directlog-controller-{i}')}:9190" for i in range(2)}
    assert found["controller"]["address"] in controllers


def test_admin_cli_in_a_broker_container(cluster: Node, smoke_topic: str) -> None:
    text = directlog(cluster, "topics", "describe", smoke_topic, pod="directlog-broker-1")
    header, columns, *rows = text.strip().splitlines()
    assert (
        header.split()
        == (
            f"Topic: {smoke_topic} PartitionCount: 3 ReplicationFactor: 3 "
            "Configs: min.insync.replicas=2"
        ).split()
    )
    assert columns.split() == ["PARTITION", "LEADER", "REPLICAS", "ISR"]
    assert [row.split()[0] for row in rows] == ["0", "1", "2"]
    for row in rows:
        _, leader, replicas, isr = row.split()
        assert sorted(replicas.split(",")) == sorted(isr.split(",")) == ["0", "1", "2"]
        assert leader in replicas.split(",")
    brokers = json.loads(directlog(cluster, "--output", "json", "brokers", "list"))
    assert [(b["id"], b["live"], b["address"]) for b in brokers] == [
        (i, True, f"{pod_host(b)}:9092") for i, b in enumerate(BROKERS)
    ]
