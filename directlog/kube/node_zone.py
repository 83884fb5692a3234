"""`python -m directlog.kube.node_zone`: write a label of this pod's node to a file.

Pods cannot read their node's labels through the downward API, so the broker pods' init
container runs this to learn their zone (``topology.kubernetes.io/zone``), which the broker
reads into DIRECTLOG_RACK for rack-aware replica assignment. It talks to the API server the
way in-cluster clients do (directlog/kube/api.py): ``GET /api/v1/nodes/<name>`` with the
ServiceAccount's token (which needs ``get`` on ``nodes``).

A node without the label gets an empty file (the broker then runs without a rack) unless
``--required``; an API error or an unreachable API server is retried until ``--timeout``,
then the process exits non-zero so the kubelet restarts the init container.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from directlog.kube.api import (
    REQUEST_TIMEOUT,
    SERVICE_ACCOUNT_DIR,
    ApiError,
    ApiServer,
    get,
    node_path,
)

log = logging.getLogger("directlog.kube.node_zone")

ZONE_LABEL = "topology.kubernetes.io/zone"
RETRY_SECONDS = 2.0


class LabelMissingError(RuntimeError):
    """The node has no such label and the caller required it."""


def node_labels(api: ApiServer, node: str, timeout: float = REQUEST_TIMEOUT) -> dict[str, str]:
    """The labels of ``node``, read with one GET over TLS checked against the CA bundle."""
    path = node_path(node)
    document = get(api, path, timeout)
    try:
        labels = document["metadata"].get("labels") or {}
    except (KeyError, AttributeError, TypeError) as error:
        raise ApiError(f"GET {path}: not a Node object: {error}") from error
    if not isinstance(labels, dict):
        raise ApiError(f"GET {path}: metadata.labels is not a map")
    return {str(k): str(v) for k, v in labels.items()}


def write_label(output: Path, value: str) -> None:
    """Write ``value`` (and nothing else) atomically, so a reader sees all of it or none."""
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".tmp")
    partial.write_text(value, encoding="utf-8")
    os.replace(partial, output)


def lookup(
    api: ApiServer,
    node: str,
    label: str,
    *,
    required: bool = False,
    deadline: float,
    retry_seconds: float = RETRY_SECONDS,
) -> str:
    """The node's ``label`` ("" when absent and not required), retrying lookup errors until
    ``deadline`` (time.monotonic())."""
    while True:
        try:
            labels = node_labels(
                api, node, timeout=max(0.1, min(REQUEST_TIMEOUT, deadline - time.monotonic()))
            )
            break
        except ApiError as error:
            if time.monotonic() + retry_seconds >= deadline:
                raise
            log.warning("%s; retrying in %.0f s", error, retry_seconds)
            time.sleep(retry_seconds)
    value = labels.get(label, "")
    if not value:
        if required:
            raise LabelMissingError(f"node {node} has no label {label}")
        log.warning("node %s has no label %s: no rack", node, label)
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m directlog.kube.node_zone", description=__doc__)
    parser.add_argument("--node", default=os.environ.get("NODE_NAME"), help="the node's name")
    parser.add_argument("--label", default=ZONE_LABEL, help="the label to read")
    parser.add_argument("--output", type=Path, required=True, help="file to write its value to")
    parser.add_argument("--required", action="store_true", help="fail when the label is missing")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to keep retrying")
    parser.add_argument(
        "--service-account-dir", type=Path, default=SERVICE_ACCOUNT_DIR, help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if not args.node:
        parser.error("--node (or NODE_NAME) is required")
    try:
        api = ApiServer.in_cluster(args.service_account_dir)
        value = lookup(
            api,
            args.node,
            args.label,
            required=args.required,
            deadline=time.monotonic() + args.timeout,
        )
    except (ApiError, LabelMissingError, OSError) as error:
        print(f"node_zone: {error}", file=sys.stderr)
        return 1
    write_label(args.output, value)
    log.info("node %s: %s=%r written to %s", args.node, args.label, value, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
