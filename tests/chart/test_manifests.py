"""Every object of every scenario is valid: Kubernetes' own kinds against the schemas of the
oldest and newest Kubernetes the chart supports (kubernetes-validate, strict: unknown fields
are errors), custom resources against their CRDs' openAPIV3 schemas."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.chart import crds
from tests.chart.render import NEWEST_KUBERNETES, OLDEST_KUBERNETES, SCENARIOS, scenario

pytestmark = pytest.mark.timeout(120)

VERSIONS = [OLDEST_KUBERNETES, NEWEST_KUBERNETES]


def _name(manifest: dict[str, object]) -> str:
    metadata = manifest["metadata"]
    assert isinstance(metadata, dict)
    return f"{manifest['kind']}/{metadata['name']}"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_object_is_valid(name: str, version: str) -> None:
    manifests = scenario(name, version)
    assert manifests
    failures = []
    for manifest in manifests:
        if crds.is_custom(manifest):
            failures += [f"{_name(manifest)}: {e}" for e in crds.errors(manifest)]
            continue
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            failures.append(f"{_name(manifest)}: {error}")
        except kubernetes_validate.SchemaNotFoundError as error:
            failures.append(f"{_name(manifest)}: no schema: {error}")
    assert not failures, "\n".join(failures)


def test_every_custom_kind_is_rendered_somewhere() -> None:
    """The CRD checks above run: each custom kind appears in a scenario."""
    kinds = {(m["apiVersion"], m["kind"]) for name in SCENARIOS for m in scenario(name)}
    assert set(crds.FILES) <= kinds


def test_crd_check_refuses_an_unknown_field() -> None:
    """The CRD validation is strict and not vacuous."""
    [monitor] = [m for m in scenario("metrics") if m["kind"] == "PodMonitor"][:1]
    assert crds.errors(monitor) == []
    monitor["spec"]["podMetricsEndpoints"][0]["prot"] = "metrics"
    monitor["spec"]["selector"] = "everything"
    found = crds.errors(monitor)
    assert any("prot" in e for e in found), found
    assert any("spec/selector" in e for e in found), found


def test_kubernetes_check_refuses_an_unknown_field() -> None:
    [sts] = [m for m in scenario("default") if m["kind"] == "StatefulSet"][:1]
    sts["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, OLDEST_KUBERNETES, strict=True)
