"""Topic and broker configs: reading the overridden ones, changing them with
IncrementalAlterConfigs (validated first when a command changes several things, so a
refusal leaves nothing changed)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping

from directlog.admin.session import AdminError, ServerError, Session

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.protocol.admin import IncrementalAlterConfigsRequest

TOPIC = int(ConfigResourceType.TOPIC)
BROKER = int(ConfigResourceType.BROKER)
SET, DELETE = 0, 1
_KIND = {TOPIC: "topic", BROKER: "broker"}


def parse_assignments(items: Iterable[str]) -> dict[str, str]:
    """`--config K=V` arguments as a dict; AdminError for one without '=' or a repeat."""
    configs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise AdminError(f"--config {item!r}: expected NAME=VALUE")
        if name in configs:
            raise AdminError(f"--config {name} is given twice")
        configs[name] = value
    return configs


def topic_overrides(session: Session, topics: Iterable[str]) -> dict[str, dict[str, str]]:
    """Each topic's configs set on the topic itself (not its defaults)."""
    names = sorted(set(topics))
    if not names:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    described = session.api(
        "DescribeConfigs",
        lambda: session.kafka.describe_configs(resources, config_filter="modified"),
    )
    found = described.get("topic", {})
    return {
        name: {
            key: str(entry.get("value"))
            for key, entry in sorted(found.get(name, {}).items())
            if entry.get("config_source") == "DYNAMIC_TOPIC_CONFIG"
        }
        for name in names
    }


def broker_values(session: Session, broker: int, keys: Iterable[str]) -> dict[str, str]:
    """The values of `keys` set on broker `broker` itself (Kafka's per-broker dynamic
    configs), as it reports them; defaults and the cluster-wide ones are left out."""
    resource = ConfigResource(ConfigResourceType.BROKER, str(broker), list(keys))
    described = session.api(
        "DescribeConfigs", lambda: session.kafka.describe_configs([resource], config_filter="all")
    )
    entries = described.get("broker", {}).get(str(broker), {})
    return {
        k: str(e["value"])
        for k, e in entries.items()
        if e.get("value") not in (None, "") and e.get("config_source") == "DYNAMIC_BROKER_CONFIG"
    }


def alter(
    session: Session,
    resource_type: int,
    name: str,
    set_configs: Mapping[str, str] | None = None,
    delete: Iterable[str] = (),
    *,
    validate_only: bool = False,
) -> None:
    """One resource's configs changed (all or none, as the broker applies them);
    ServerError with the broker's code and message when refused. Broker resources go to
    that broker."""
    changes: list[tuple[str, int, str | None]] = [
        (k, SET, v) for k, v in (set_configs or {}).items()
    ]
    changes += [(k, DELETE, None) for k in delete]
    if not changes:
        return
    request = IncrementalAlterConfigsRequest(
        resources=[(resource_type, name, changes)], validate_only=validate_only
    )
    node = int(name) if resource_type == BROKER else None
    response = session.send(request, node_id=node)
    for result in response.responses:
        if result.error_code:
            what = f"{_KIND.get(resource_type, 'resource')} {result.resource_name} configs"
            raise ServerError(what, int(result.error_code), result.error_message)
