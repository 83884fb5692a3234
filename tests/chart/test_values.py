"""`helm lint --strict`, and values the chart refuses with a message naming the value."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.render import CHART, SCENARIOS, HelmError, run_helm, schema_refusal, template

pytestmark = pytest.mark.timeout(120)


def test_lint_strict() -> None:
    out = run_helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_lint_strict_with_scenario(name: str) -> None:
    run_helm("lint", "--strict", str(CHART), values=SCENARIOS[name])


BAD_VALUES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("even consensus", {"consensus": {"replicaCount": 4}}, ["/consensus/replicaCount", "1, 3, 5"]),
    ("no consensus", {"consensus": {"replicaCount": 0}}, ["/consensus/replicaCount"]),
    (
        "rdma without a resource",
        {"rdma": {"enabled": True}},
        ["/rdma/resourceName"],
    ),
    (
        "rdma resource without a prefix",
        {"rdma": {"enabled": True, "resourceName": "mlnx_sriov_rdma"}},
        ["/rdma/resourceName"],
    ),
    (
        "s3 tiering without credentials",
        {"tiering": {"enabled": True, "remote": "s3://bucket/prefix"}},
        ["/tiering/s3/existingSecret", "/tiering/s3/useSdkCredentialChain"],
    ),
    ("tiering without a store", {"tiering": {"enabled": True}}, ["/tiering/remote"]),
    (
        "unknown store",
        {"tiering": {"enabled": True, "remote": "gs://bucket"}},
        ["/tiering/remote"],
    ),
    (
        "negative volume",
        {"broker": {"persistence": {"size": "-100Gi"}}},
        ["/broker/persistence/size"],
    ),
    (
        "negative memory dir",
        {"rdma": {"headSegments": {"sizeLimit": "-1Gi"}}},
        ["/rdma/headSegments/sizeLimit"],
    ),
    ("negative brokers", {"broker": {"replicaCount": -1}}, ["/broker/replicaCount"]),
    (
        "negative shutdown",
        {"broker": {"controlledShutdownTimeoutMs": -5}},
        ["/broker/controlledShutdownTimeoutMs"],
    ),
    (
        "no time to drain",
        {"broker": {"scaleDown": {"drain": {"timeoutSeconds": 0}}}},
        ["/broker/scaleDown/drain/timeoutSeconds"],
    ),
    (
        "unknown drain key",
        {"broker": {"scaleDown": {"drain": {"enable": False}}}},
        ["/broker/scaleDown/drain", "enable"],
    ),
    ("unknown top-level key", {"brokers": {"replicaCount": 3}}, ["brokers", "not allowed"]),
    ("unknown component key", {"broker": {"replicas": 3}}, ["/broker", "replicas"]),
    ("bad port", {"broker": {"ports": {"internal": 70000}}}, ["/broker/ports/internal"]),
    ("bad topic name", {"topics": [{"name": "a topic"}]}, ["/topics/0/name"]),
    ("topic without a name", {"topics": [{"partitions": 3}]}, ["/topics/0", "name"]),
    ("bad external type", {"broker": {"external": {"type": "Ingress"}}}, ["/broker/external/type"]),
    ("listen on a name", {"listenAddress": "localhost"}, ["/listenAddress"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("values", "expected"),
    [pytest.param(v, e, id=name) for name, v, e in BAD_VALUES],
)
def test_schema_refuses(values: dict[str, Any], expected: list[str]) -> None:
    message = schema_refusal(values)
    for part in expected:
        assert part in message, message


TEMPLATE_CHECKS: list[tuple[str, dict[str, Any], str]] = [
    (
        "node ports missing",
        {"broker": {"external": {"enabled": True, "nodePorts": [31090]}}},
        "broker.external.nodePorts: 1 given, one per broker needed",
    ),
    (
        "load balancer hosts missing",
        {"broker": {"external": {"enabled": True, "type": "LoadBalancer"}}},
        "broker.external.advertisedHosts: 0 given",
    ),
    (
        "load balancer host empty",
        {"broker": {"replicaCount": 1, "external": {
            "enabled": True, "type": "LoadBalancer", "advertisedHosts": [""]}}},
        "broker.external.advertisedHosts[0] is empty",
    ),
    (
        "operator without spark",
        {"spark": {"operator": {"enabled": True}}},
        "spark.operator.enabled needs spark.enabled",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("values", "expected"),
    [pytest.param(v, e, id=name) for name, v, e in TEMPLATE_CHECKS],
)
def test_template_refuses(values: dict[str, Any], expected: str) -> None:
    """What the schema cannot say (one value against another) the templates check."""
    with pytest.raises(HelmError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        template(values)


def test_kubernetes_too_old_refused() -> None:
    with pytest.raises(HelmError, match="kubeVersion"):
        template({}, "1.28.0")
