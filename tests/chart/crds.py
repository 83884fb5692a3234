"""The openAPIV3 schemas of the custom resources the chart renders, checked with jsonschema.

The files in crd_schemas/ are the `openAPIV3Schema` of these CRDs, descriptions removed
(see crd_schemas/README.md for where each comes from and its license). Like an API server
with strict field validation, `validator` also refuses fields a schema does not declare.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMAS = Path(__file__).resolve().parent / "crd_schemas"
FILES = {
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor_v1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor_v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule_v1.json",
    ("sparkoperator.k8s.io/v1beta2", "SparkApplication"): "sparkapplication_v1beta2.json",
}


def _strict(node: Any) -> Any:
    """additionalProperties: false wherever properties are listed and unknown fields are not
    explicitly kept (x-kubernetes-preserve-unknown-fields); Go regexps made Python's."""
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        pattern = node.get("pattern")
        if isinstance(pattern, str) and pattern.startswith("^(?i)"):
            # Go's regexp takes flags anywhere; Python's only at the start.
            node["pattern"] = "(?i)^" + pattern[len("^(?i)") :]
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@cache
def _validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    document = json.loads((SCHEMAS / FILES[(api_version, kind)]).read_text(encoding="utf-8"))
    assert f"{document['group']}/{document['version']}" == api_version
    assert document["kind"] == kind
    schema = _strict(copy.deepcopy(document["schema"]))
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked elsewhere
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    validator: jsonschema.protocols.Validator = cls(schema)
    return validator


def is_custom(manifest: dict[str, Any]) -> bool:
    return (manifest["apiVersion"], manifest["kind"]) in FILES


def errors(manifest: dict[str, Any]) -> list[str]:
    """What the CRD's schema finds wrong with the object (empty: valid)."""
    validator = _validator(manifest["apiVersion"], manifest["kind"])
    return [
        f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in validator.iter_errors(manifest)
    ]
