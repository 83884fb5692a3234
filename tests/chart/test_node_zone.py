"""directlog.kube.node_zone against a small HTTPS server on 127.0.0.1 that answers like the
API server: GET /api/v1/nodes/<name> with a bearer token, over TLS with its own CA."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from directlog.kube import node_zone
from directlog.kube.api import ApiError, ApiServer
from tests.chart.apiserver import TOKEN, ApiServerState, FakeApiServer, certificates

pytestmark = pytest.mark.timeout(60)

NODES = {
    "node-a": {"topology.kubernetes.io/zone": "eu-west-1a", "kubernetes.io/hostname": "node-a"},
    "node-b": {"kubernetes.io/hostname": "node-b"},  # no zone
}


@dataclass
class FakeCluster:
    port: int
    service_account: Path
    state: ApiServerState


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    with FakeApiServer(tmp_path / "api") as api:
        for name, labels in NODES.items():
            api.put_node(name, labels)
        account = api.write_service_account(tmp_path / "serviceaccount", "streaming")
        for name, value in api.environment().items():
            monkeypatch.setenv(name, value)
        yield FakeCluster(api.port, account, api.state)


def _main(cluster: FakeCluster, output: Path, *args: str) -> int:
    return node_zone.main(
        ["--output", str(output), "--service-account-dir", str(cluster.service_account),
         "--timeout", "5", *args]
    )  # fmt: skip


def test_writes_the_zone_of_the_node(cluster: FakeCluster, tmp_path: Path) -> None:
    output = tmp_path / "rack" / "zone"
    assert _main(cluster, output, "--node", "node-a") == 0
    assert output.read_text(encoding="utf-8") == "eu-west-1a"
    assert cluster.state.requests == [("/api/v1/nodes/node-a", f"Bearer {TOKEN}")]


def test_node_name_from_the_environment(
    cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "node-a")
    output = tmp_path / "zone"
    assert _main(cluster, output) == 0
    assert output.read_text(encoding="utf-8") == "eu-west-1a"


def test_any_label(cluster: FakeCluster, tmp_path: Path) -> None:
    output = tmp_path / "host"
    assert _main(cluster, output, "--node", "node-b", "--label", "kubernetes.io/hostname") == 0
    assert output.read_text(encoding="utf-8") == "node-b"


def test_node_without_zone_gets_an_empty_file(cluster: FakeCluster, tmp_path: Path) -> None:
    output = tmp_path / "zone"
    assert _main(cluster, output, "--node", "node-b") == 0
    assert output.read_text(encoding="utf-8") == ""


def test_missing_zone_fails_when_required(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "zone"
    assert _main(cluster, output, "--node", "node-b", "--required") == 1
    assert not output.exists()
    assert "node node-b has no label topology.kubernetes.io/zone" in capsys.readouterr().err


def test_retries_while_the_api_server_is_unavailable(cluster: FakeCluster, tmp_path: Path) -> None:
    cluster.state.failures_left = 2
    api = ApiServer.in_cluster(cluster.service_account)
    deadline = time.monotonic() + 10
    zone = node_zone.lookup(
        api, "node-a", node_zone.ZONE_LABEL, deadline=deadline, retry_seconds=0.05
    )
    assert zone == "eu-west-1a"
    assert len(cluster.state.requests) == 3


def test_gives_up_at_the_deadline(
    cluster: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "zone"
    assert _main(cluster, output, "--node", "node-z", "--timeout", "0.5") == 1
    assert "HTTP 404" in capsys.readouterr().err
    assert not output.exists()


def test_bad_token_is_an_error(cluster: FakeCluster) -> None:
    (cluster.service_account / "token").write_text("stolen", encoding="utf-8")
    api = ApiServer.in_cluster(cluster.service_account)
    with pytest.raises(ApiError, match="HTTP 401"):
        node_zone.node_labels(api, "node-a")


def test_untrusted_certificate_is_refused(cluster: FakeCluster, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    ca, _, _ = certificates(other)
    (cluster.service_account / "ca.crt").write_bytes(ca.read_bytes())
    api = ApiServer.in_cluster(cluster.service_account)
    with pytest.raises(ApiError, match="CERTIFICATE_VERIFY_FAILED"):
        node_zone.node_labels(api, "node-a")
    assert cluster.state.requests == []  # no token sent to a server it cannot trust


def test_outside_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ApiError, match="not in a pod"):
        ApiServer.in_cluster(tmp_path)
