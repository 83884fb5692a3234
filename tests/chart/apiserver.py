"""A small HTTPS server on 127.0.0.1 that answers like the Kubernetes API server for the few
objects Directlog's pods read (a Node, the broker StatefulSet): GET by path with a bearer
token, over TLS with a CA of its own, and the ServiceAccount files an in-cluster client
reads (token, ca.crt, namespace).

    with FakeApiServer(tmp_path) as api:
        api.put_statefulset("streaming", "directlog-broker", replicas=3)
        api.write_service_account(tmp_path / "serviceaccount", "streaming")
        env = api.environment()  # KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT

Used by the unit tests of directlog/kube (tests/chart) and by the kubelet emulator's pods
(tests/kube), which mount those files at /var/run/secrets/kubernetes.io/serviceaccount.
"""

from __future__ import annotations

import copy
import http.server
import json
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from directlog.security.certs import CertificateAuthority

TOKEN = "token-of-the-broker-service-account"


def certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for 127.0.0.1 it signed: (ca.crt, server.crt, key)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority.create("test-kubernetes-ca", days=1)
    ca_path, cert_path, key_path = (
        directory / "ca.crt",
        directory / "server.crt",
        directory / "server.key",
    )
    ca.write(ca_path)
    ca.issue("kube-apiserver", hosts=["127.0.0.1"], days=1).write(cert_path, key_path)
    return ca_path, cert_path, key_path


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"


def statefulset_path(namespace: str, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}"


@dataclass
class ApiServerState:
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # by path
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    failures_left: int = 0  # answer 503 this many times first
    forbidden: set[str] = field(default_factory=set)  # paths answered 403 (no RBAC for them)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(state: ApiServerState, token: str) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with state.lock:
                state.requests.append((self.path, self.headers.get("Authorization")))
                failing = state.failures_left > 0
                if failing:
                    state.failures_left -= 1
                found = copy.deepcopy(state.objects.get(self.path))
                forbidden = self.path in state.forbidden
            if failing:
                return self._answer(503, status(503, "ServiceUnavailable", "starting"))
            if self.headers.get("Authorization") != f"Bearer {token}":
                return self._answer(401, status(401, "Unauthorized", "Unauthorized"))
            if forbidden:
                message = f"GET {self.path} is forbidden for this ServiceAccount"
                return self._answer(403, status(403, "Forbidden", message))
            if found is None:
                name = self.path.rsplit("/", 1)[-1]
                return self._answer(404, status(404, "NotFound", f'"{name}" not found'))
            self._answer(200, found)

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


class FakeApiServer:
    """The API server stand-in: started by `with` (or start()), on 127.0.0.1, any port."""

    def __init__(self, directory: Path, token: str = TOKEN) -> None:
        self.directory = directory
        self.token = token
        self.ca, cert, key = certificates(directory / "pki")
        self.state = ApiServerState()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state, token))
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
            self._thread.join(5)
        self.server.server_close()

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # What a pod sees ---------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        """What the kubelet sets in every container for the `kubernetes` Service."""
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port)}

    @property
    def ca_pem(self) -> str:
        return self.ca.read_text(encoding="ascii")

    def write_service_account(self, directory: Path, namespace: str) -> Path:
        """The files of /var/run/secrets/kubernetes.io/serviceaccount, in `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "token").write_text(self.token + "\n", encoding="utf-8")
        (directory / "ca.crt").write_text(self.ca_pem, encoding="ascii")
        (directory / "namespace").write_text(namespace, encoding="utf-8")
        return directory

    # Objects ------------------------------------------------------------------------------

    def put(self, path: str, document: dict[str, Any]) -> None:
        with self.state.lock:
            self.state.objects[path] = copy.deepcopy(document)

    def remove(self, path: str) -> None:
        with self.state.lock:
            self.state.objects.pop(path, None)

    def put_node(self, name: str, labels: dict[str, str]) -> None:
        self.put(
            node_path(name),
            {
                "kind": "Node",
                "apiVersion": "v1",
                "metadata": {"name": name, "labels": labels},
                "status": {"nodeInfo": {"kubeletVersion": "v1.33.1"}},
            },
        )

    def put_statefulset(
        self, namespace: str, name: str, replicas: int, manifest: dict[str, Any] | None = None
    ) -> None:
        """A StatefulSet as the API returns it: the rendered `manifest` (or a bare one) with
        `replicas` in its spec."""
        document = copy.deepcopy(manifest) if manifest else {"spec": {}}
        document.setdefault("kind", "StatefulSet")
        document.setdefault("apiVersion", "apps/v1")
        document.setdefault("metadata", {}).update({"name": name, "namespace": namespace})
        document.setdefault("spec", {})["replicas"] = replicas
        document["status"] = {"replicas": replicas, "observedGeneration": 1}
        self.put(statefulset_path(namespace, name), document)

    def set_replicas(self, namespace: str, name: str, replicas: int) -> None:
        """`kubectl scale`: the StatefulSet's spec.replicas, as the API serves it from now."""
        path = statefulset_path(namespace, name)
        with self.state.lock:
            self.state.objects[path]["spec"]["replicas"] = replicas

    def replicas(self, namespace: str, name: str) -> int:
        with self.state.lock:
            return int(self.state.objects[statefulset_path(namespace, name)]["spec"]["replicas"])

    @property
    def requests(self) -> list[tuple[str, str | None]]:
        with self.state.lock:
            return list(self.state.requests)
