"""One cluster for the session: the chart rendered with small resources (3 consensus
members, 2 controllers, 3 brokers, tiering off), every pod started by tests/kube/kubelet.py
from the images `make images` builds (the images fixture of tests/images), with the test
API server (tests/chart/apiserver.py) serving the StatefulSets' replicas to the brokers'
scale-down hook. Its containers and host directories are removed at the end, whatever
happened."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chart.apiserver import FakeApiServer
from tests.chart.render import template
from tests.images.conftest import BUILD_TIMEOUT, images  # noqa: F401 (the session fixture)
from tests.kube.kubelet import Node

# Waits that bound a hang on a loaded two-core machine; nothing asserts on durations.
INSTALL_TIMEOUT = 600.0  # every pod Ready after `helm install`
READY_TIMEOUT = 300.0  # one pod Ready again after a restart
SETUP_TIMEOUT = BUILD_TIMEOUT + INSTALL_TIMEOUT  # what the first test waits for the fixtures

SMALL = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
# Probes as the chart's, looked at more often: a restarted pod is seen Ready sooner.
READINESS = {
    "initialDelaySeconds": 1,
    "periodSeconds": 2,
    "timeoutSeconds": 3,
    "failureThreshold": 3,
}
VALUES = {
    # Pods share the host's network here: each must listen on its own address only.
    "listenAddress": "podIP",
    "consensus": {"replicaCount": 3, "resources": SMALL, "readinessProbe": READINESS},
    "controller": {"replicaCount": 2, "resources": SMALL, "readinessProbe": READINESS},
    "broker": {
        "replicaCount": 3,
        "resources": SMALL,
        "readinessProbe": READINESS,
        "startupProbe": {"periodSeconds": 1, "timeoutSeconds": 3, "failureThreshold": 600},
        # Fewer group-offsets partitions than Kafka's 50: less to move and catch up on.
        "config": {"auto_create_topics": False, "offsets_topic_num_partitions": 6},
    },
    "tiering": {"enabled": False},
}


@pytest.fixture(scope="session")
def cluster(images: None) -> Iterator[Node]:  # noqa: F811
    with (
        tempfile.TemporaryDirectory(prefix="directlog-kube-", ignore_cleanup_errors=True) as name,
        FakeApiServer(Path(name) / "api-server") as api,
    ):
        node = Node(template(VALUES), Path(name), api=api)
        try:
            node.install(INSTALL_TIMEOUT)
            yield node
        finally:
            node.close()


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """Hosts files and client output of one test."""
    return tmp_path
