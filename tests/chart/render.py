"""Rendering the chart with `helm template`, and the scenarios the tests render."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.chart.tools import helm

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "directlog"
RELEASE = "directlog"
NAMESPACE = "streaming"
# The Kubernetes versions the chart supports (Chart.yaml's kubeVersion is the oldest), the
# ones every rendered object is validated against.
OLDEST_KUBERNETES = "1.29.0"
NEWEST_KUBERNETES = "1.37.0"
HELM_TIMEOUT = 60  # seconds for one helm command

Manifest = dict[str, Any]

SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "rdma-shared-plugin": {
        "rdma": {
            "enabled": True,
            "resourceName": "rdma/rdma_shared_device_a",
            "sharedDevicePlugin": {"enabled": True},
        }
    },
    "rdma-sriov": {
        "rdma": {
            "enabled": True,
            "resourceName": "intel.com/mlnx_sriov_rdma",
            "networks": "sriov-rdma",
            "sriovDevicePlugin": {"enabled": True},
        }
    },
    "rdma-rxe": {
        "rdma": {
            "enabled": True,
            "resourceName": "rdma/rxe",
            "rxe": {"enabled": True, "netdev": "eth0"},
            "sharedDevicePlugin": {
                "enabled": True,
                "resourceName": "rxe",
                "selectors": {"ifNames": ["eth0"], "vendors": []},
            },
        }
    },
    "s3-tiering": {
        "tiering": {
            "enabled": True,
            "remote": "s3://directlog-tiered/prod",
            "s3": {
                "endpoint": "https://minio.storage.svc:9000",
                "region": "eu-west-1",
                "existingSecret": "directlog-s3",
            },
        }
    },
    "consensus-5": {"consensus": {"replicaCount": 5}},
    "external-nodeport": {
        "broker": {
            "external": {
                "enabled": True,
                "type": "NodePort",
                "nodePorts": [31090, 31091, 31092],
                "advertisedHosts": ["", "kafka-1.example.com"],
            }
        }
    },
    "external-loadbalancer": {
        "broker": {
            "external": {
                "enabled": True,
                "type": "LoadBalancer",
                "servicePort": 9094,
                "advertisedHosts": ["b0.kafka.example.com", "b1.kafka.example.com", "10.1.2.3"],
                "loadBalancerSourceRanges": ["10.0.0.0/8"],
            }
        }
    },
    "metrics": {
        "tiering": {"enabled": True, "remote": "file:///mnt/remote"},
        "metrics": {
            "podMonitor": {"enabled": True},
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "dashboards": {"enabled": True},
        },
    },
    "spark": {"spark": {"enabled": True, "operator": {"enabled": True}}},
    # Every process on the pod's own address (status.podIP), as tests/kube runs the pods.
    "listen-pod-ip": {
        "listenAddress": "podIP",
        "broker": {
            "external": {
                "enabled": True,
                "type": "LoadBalancer",
                "servicePort": 9094,
                "advertisedHosts": ["b0.kafka.example.com", "b1.kafka.example.com", "10.1.2.3"],
            }
        },
        "tiering": {"enabled": True, "remote": "file:///mnt/remote"},
    },
    # No drain on scale-down: no preStop hook, no Role, no token in the broker container;
    # an existing ServiceAccount.
    "scale-down-drain-off": {
        "broker": {
            "scaleDown": {"drain": {"enabled": False}},
            "serviceAccount": {"create": False, "name": "brokers"},
        }
    },
    "rack-topics-hdfs": {
        "broker": {"rack": {"enabled": True}},
        "tiering": {
            "enabled": True,
            "remote": "hdfs://namenode.hadoop:8020/directlog",
            "hdfs": {"user": "directlog", "configMap": "hadoop-conf"},
        },
        "consensus": {"sessionSecret": {"existingSecret": "consensus-secret"}},
        "networkPolicy": {
            "clientsFrom": [{"namespaceSelector": {"matchLabels": {"team": "streaming"}}}]
        },
        "topics": [
            {"name": "orders", "partitions": 6, "replicationFactor": 3,
             "config": {"min.insync.replicas": "2", "retention.ms": 604800000}},
            {"name": "events"},
        ],
    },
}  # fmt: skip


class HelmError(RuntimeError):
    pass


def run_helm(*args: str, values: Mapping[str, Any] | None = None) -> str:
    """helm's stdout; HelmError with its stderr when it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [str(helm()), *args]
        if values is not None:
            path = Path(tmp) / "values.yaml"
            path.write_text(yaml.safe_dump(dict(values)), encoding="utf-8")
            command += ["--values", str(path)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=HELM_TIMEOUT)
    if done.returncode != 0:
        raise HelmError(done.stderr.strip() or done.stdout.strip())
    return done.stdout


def template(
    values: Mapping[str, Any], kube_version: str = NEWEST_KUBERNETES, *extra: str
) -> list[Manifest]:
    """Every object `helm template` renders for these values (hooks included)."""
    out = run_helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--kube-version", kube_version, *extra, values=values,
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def schema_refusal(values: Mapping[str, Any]) -> str:
    """helm's message refusing `values` by the chart's schema (AssertionError if it
    renders, or fails for another reason)."""
    try:
        template(values)
    except HelmError as error:
        message = str(error)
        assert "values don't meet the specifications of the schema" in message, message
        return message
    raise AssertionError("the values rendered")


@cache
def _rendered(name: str, kube_version: str) -> str:
    return json.dumps(template(SCENARIOS[name], kube_version))


def scenario(name: str, kube_version: str = NEWEST_KUBERNETES) -> list[Manifest]:
    """A scenario's objects, rendered once per test session (a fresh copy each call)."""
    manifests: list[Manifest] = json.loads(_rendered(name, kube_version))
    return manifests


def find(manifests: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [
        m for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]  # fmt: skip


def one(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    found = find(manifests, kind, name)
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def component(name: str) -> str:
    """The name of a component's objects in the tests' release."""
    return f"{RELEASE}-{name}"
