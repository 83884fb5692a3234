"""directlog.kube.node_zone against a small HTTPS server on 127.0.0.1 that answers like the
API server: GET /api/v1/nodes/<name> with a bearer token, over TLS with its own CA."""

from __future__ import annotations

import datetime
import http.server
import json
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from directlog.kube import node_zone

pytestmark = pytest.mark.timeout(60)

TOKEN = "token-of-the-broker-service-account"
NODES = {
    "node-a": {"topology.kubernetes.io/zone": "eu-west-1a", "kubernetes.io/hostname": "node-a"},
    "node-b": {"kubernetes.io/hostname": "node-b"},  # no zone
}


@dataclass
class ApiServerState:
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    failures_left: int = 0  # answer 503 this many times first


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for 127.0.0.1 it signed: (ca.crt, server.crt, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-kubernetes-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(IPv4Address("127.0.0.1"))]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (
        directory / "ca.crt",
        directory / "server.crt",
        directory / "server.key",
    )
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


def _handler(state: ApiServerState) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests.append((self.path, self.headers.get("Authorization")))
            if state.failures_left > 0:
                state.failures_left -= 1
                return self._answer(503, _status(503, "ServiceUnavailable", "starting"))
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self._answer(401, _status(401, "Unauthorized", "Unauthorized"))
            prefix = "/api/v1/nodes/"
            name = self.path.removeprefix(prefix)
            if not self.path.startswith(prefix) or name not in NODES:
                return self._answer(404, _status(404, "NotFound", f'nodes "{name}" not found'))
            node = {
                "kind": "Node",
                "apiVersion": "v1",
                "metadata": {"name": name, "labels": NODES[name]},
                "status": {"nodeInfo": {"kubeletVersion": "v1.33.1"}},
            }
            self._answer(200, node)

        def _answer(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


@dataclass
class FakeCluster:
    port: int
    service_account: Path
    state: ApiServerState


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    ca, cert, key = _certificates(tmp_path)
    state = ApiServerState()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN + "\n", encoding="utf-8")
    (account / "ca.crt").write_bytes(ca.read_bytes())
    (account / "namespace").write_text("streaming", encoding="utf-8")
    port = server.server_address[1]
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
    try:
        yield FakeCluster(port, account, state)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


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
    api = node_zone.ApiServer.in_cluster(cluster.service_account)
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
    api = node_zone.ApiServer.in_cluster(cluster.service_account)
    with pytest.raises(node_zone.NodeLookupError, match="HTTP 401"):
        node_zone.node_labels(api, "node-a")


def test_untrusted_certificate_is_refused(cluster: FakeCluster, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    ca, _, _ = _certificates(other)
    (cluster.service_account / "ca.crt").write_bytes(ca.read_bytes())
    api = node_zone.ApiServer.in_cluster(cluster.service_account)
    with pytest.raises(node_zone.NodeLookupError, match="CERTIFICATE_VERIFY_FAILED"):
        node_zone.node_labels(api, "node-a")
    assert cluster.state.requests == []  # no token sent to a server it cannot trust


def test_outside_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(node_zone.NodeLookupError, match="not in a pod"):
        node_zone.ApiServer.in_cluster(tmp_path)
