"""`python -m directlog.kube.network_status --network NAME`: print this pod's address on a
Multus network.

A broker whose RNIC sits on a secondary network (SR-IOV, or macvlan over the RNIC) must
listen and advertise its RDMA endpoints on that network's address, which is only known once
the pod runs. Multus writes it into the pod's ``k8s.v1.cni.cncf.io/network-status``
annotation, which the downward API hands the container as an environment variable; the
broker's start command reads it into DIRECTLOG_RDMA_HOST and DIRECTLOG_RDMA_ADVERTISED_HOST.

The annotation is a JSON list of attachments, each with the network's ``name``
(``namespace/name``, or ``name`` for the pod's own namespace), its ``interface`` and its
``ips``. ``NAME`` is written as in the ``k8s.v1.cni.cncf.io/networks`` annotation:
``name``, ``namespace/name``, optionally with ``@interface``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

STATUS_ENV = "NETWORK_STATUS"  # the annotation, through the downward API
NAMESPACE_ENV = "POD_NAMESPACE"


class NetworkStatusError(ValueError):
    """The annotation is missing, not what Multus writes, or has no such network."""


def address_on(status: str, network: str, namespace: str) -> str:
    """The first address of the attachment to ``network`` in the annotation ``status``."""
    name, _, interface = network.strip().partition("@")
    wanted = name if "/" in name else f"{namespace}/{name}"
    try:
        attachments: Any = json.loads(status)
    except json.JSONDecodeError as error:
        raise NetworkStatusError(f"the network-status annotation is not JSON: {error}") from None
    if not isinstance(attachments, list):
        raise NetworkStatusError("the network-status annotation is not a list")
    seen = []
    for attachment in attachments:
        if not isinstance(attachment, dict):
            continue
        found = str(attachment.get("name", ""))
        seen.append(found)
        qualified = found if "/" in found else f"{namespace}/{found}"
        if qualified != wanted or (interface and attachment.get("interface") != interface):
            continue
        ips = attachment.get("ips")
        if not isinstance(ips, list) or not ips:
            raise NetworkStatusError(f"network {found!r} has no address")
        return str(ips[0])
    raise NetworkStatusError(f"no attachment to {network!r} in network-status (found {seen})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="directlog.kube.network_status", description=__doc__)
    parser.add_argument("--network", required=True, help="as in k8s.v1.cni.cncf.io/networks")
    args = parser.parse_args(argv)
    status = os.environ.get(STATUS_ENV, "")
    if not status:
        print(f"network_status: {STATUS_ENV} is empty (no Multus attachment?)", file=sys.stderr)
        return 1
    try:
        print(address_on(status, args.network, os.environ.get(NAMESPACE_ENV, "default")))
    except NetworkStatusError as error:
        print(f"network_status: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
