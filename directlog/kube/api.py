"""The little of the Kubernetes API client that Directlog's pods need, from inside a pod.

It talks to the API server the way in-cluster clients do: ``KUBERNETES_SERVICE_HOST`` and
``KUBERNETES_SERVICE_PORT`` (the kubelet sets them in every container), the ServiceAccount's
token, CA bundle and namespace from ``/var/run/secrets/kubernetes.io/serviceaccount``, one
``GET`` over TLS checked against that CA bundle. The token is never sent to a server the
bundle does not vouch for.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_RESPONSE_BYTES = 4 * 1024 * 1024  # a Node or a StatefulSet is a few KiB; refuse anything absurd
REQUEST_TIMEOUT = 10.0  # seconds for one request


class ApiError(RuntimeError):
    """The API could not be read (not in a pod, unreachable, an HTTP error, a bad answer).

    ``status`` is the HTTP status when the server answered, else None."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ApiServer:
    """Where and how to reach the API server from inside a pod."""

    host: str
    port: int
    token: str
    ca_file: Path
    namespace: str = ""  # the pod's own namespace, "" when the account has no such file

    @classmethod
    def in_cluster(cls, service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> ApiServer:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
        if not host or not port.isdigit():
            raise ApiError(
                "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set: not in a pod?"
            )
        try:
            token = (service_account_dir / "token").read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ApiError(
                f"no ServiceAccount token at {service_account_dir}: {error.strerror}"
            ) from None
        namespace_file = service_account_dir / "namespace"
        try:
            namespace = namespace_file.read_text(encoding="utf-8").strip()
        except OSError:
            namespace = ""
        return cls(host, int(port), token, service_account_dir / "ca.crt", namespace)


def get(api: ApiServer, path: str, timeout: float = REQUEST_TIMEOUT) -> dict[str, Any]:
    """The JSON object at ``path`` (already quoted), read with one GET; ApiError otherwise,
    with the HTTP status when the server answered."""
    try:
        context = ssl.create_default_context(cafile=str(api.ca_file))
    except (OSError, ssl.SSLError) as error:
        raise ApiError(f"the CA bundle {api.ca_file} cannot be read: {error}") from None
    host = api.host.strip("[]")  # an IPv6 service address comes bracketed or not
    conn = http.client.HTTPSConnection(host, api.port, timeout=timeout, context=context)
    try:
        conn.request(
            "GET",
            path,
            headers={"Authorization": f"Bearer {api.token}", "Accept": "application/json"},
        )
        response = conn.getresponse()
        body = response.read(MAX_RESPONSE_BYTES + 1)
    except (OSError, http.client.HTTPException) as error:
        raise ApiError(f"GET {path}: {error}") from error
    finally:
        conn.close()
    if response.status != 200:
        reason = body[:200].decode("utf-8", "replace")
        raise ApiError(f"GET {path}: HTTP {response.status} {reason}", response.status)
    if len(body) > MAX_RESPONSE_BYTES:
        raise ApiError(f"GET {path}: answer larger than {MAX_RESPONSE_BYTES} bytes")
    try:
        document = json.loads(body)
    except ValueError as error:
        raise ApiError(f"GET {path}: not JSON: {error}") from error
    if not isinstance(document, dict):
        raise ApiError(f"GET {path}: not a JSON object")
    return document


def quote(segment: str) -> str:
    """One path segment (a name) as it goes into a URL."""
    return urllib.parse.quote(segment, safe="")


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name)}"


def statefulset_path(namespace: str, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{quote(namespace)}/statefulsets/{quote(name)}"
