"""`directlog topics ...`: list, describe, create, alter and delete topics."""

from __future__ import annotations

from collections.abc import Sequence

from directlog.admin import configs
from directlog.admin.output import Report, Table
from directlog.admin.session import AdminError, ServerError, Session
from directlog.protocol.errors import ErrorCode


def list_topics(session: Session) -> Report:
    view = session.cluster()
    rows = []
    for topic, count in sorted(view.partition_counts.items()):
        rf = max(len(s.replicas) for s in view.topic(topic).values())
        rows.append(
            {
                "topic": topic,
                "partitions": count,
                "replication_factor": rf,
                "internal": topic in view.internal,
            }
        )
    table = Table(
        ["TOPIC", "PARTITIONS", "REPLICATION-FACTOR", "INTERNAL"],
        [[r["topic"], r["partitions"], r["replication_factor"], r["internal"]] for r in rows],
    )
    return Report(rows, [table])


def describe_topics(session: Session, names: Sequence[str]) -> Report:
    """Every partition's leader, replicas and in-sync replicas, and the configs set on
    each topic, as `kafka-topics --describe` shows them."""
    view = session.cluster(names or None)
    topics = sorted(names) if names else sorted(view.partition_counts)
    overrides = configs.topic_overrides(session, topics)
    data = []
    tables = []
    for topic in topics:
        partitions = view.topic(topic)
        rf = max((len(s.replicas) for s in partitions.values()), default=0)
        described = {
            "topic": topic,
            "partitions": [
                {
                    "partition": number,
                    "leader": state.leader,
                    "replicas": list(state.replicas),
                    "isr": list(state.isr),
                }
                for number, state in partitions.items()
            ],
            "replication_factor": rf,
            "internal": topic in view.internal,
            "configs": overrides.get(topic, {}),
        }
        data.append(described)
        title = (
            f"Topic: {topic}  PartitionCount: {len(partitions)}  ReplicationFactor: {rf}  "
            f"Configs: {_configs_text(overrides.get(topic, {}))}"
        )
        tables.append(
            Table(
                ["PARTITION", "LEADER", "REPLICAS", "ISR"],
                [
                    [
                        number,
                        state.leader if state.leader >= 0 else "none",
                        state.replicas,
                        state.isr,
                    ]
                    for number, state in partitions.items()
                ],
                title=title,
            )
        )
    return Report(data, tables)


def _configs_text(values: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in values.items()) or "-"


def create_topic(
    session: Session,
    name: str,
    partitions: int,
    replication_factor: int,
    config_items: Sequence[str],
    if_not_exists: bool,
) -> Report:
    if partitions < 1:
        raise AdminError(f"--partitions must be at least 1, not {partitions}")
    if replication_factor < 1:
        raise AdminError(f"--replication-factor must be at least 1, not {replication_factor}")
    topic_configs = configs.parse_assignments(config_items)
    spec = {
        name: {
            "num_partitions": partitions,
            "replication_factor": replication_factor,
            "configs": topic_configs,
        }
    }
    result = session.api(
        "CreateTopics",
        lambda: session.kafka.create_topics(
            spec, timeout_ms=session.timeout_ms, raise_errors=False
        ),
    )
    (answer,) = [t for t in result["topics"] if t["name"] == name]
    code = int(answer["error_code"])
    data = {"topic": name, "partitions": partitions, "replication_factor": replication_factor}
    if code == ErrorCode.TOPIC_ALREADY_EXISTS and if_not_exists:
        return Report({**data, "created": False}, notes=[f"Topic {name} already exists."])
    if code:
        raise ServerError(f"cannot create topic {name!r}", code, answer.get("error_message"))
    # Answered once the topic exists; wait until every partition has a leader, so the
    # next command (a Helm hook's producer) finds it usable.
    session.api(
        "Metadata", lambda: session.kafka.wait_for_topics([name], timeout_ms=session.timeout_ms)
    )
    return Report({**data, "created": True}, notes=[f"Created topic {name}."])


def alter_topic(
    session: Session,
    name: str,
    config_items: Sequence[str],
    delete_configs: Sequence[str],
    partitions: int | None,
) -> Report:
    """Configs set or removed and partitions added, validated by the brokers first so a
    refused part leaves the topic as it was."""
    set_configs = configs.parse_assignments(config_items)
    both = sorted(set(set_configs) & set(delete_configs))
    if both:
        raise AdminError(f"config(s) {both} are both set and deleted")
    if not set_configs and not delete_configs and partitions is None:
        raise AdminError("nothing to change: give --config, --delete-config or --partitions")
    view = session.cluster([name])
    current = len(view.topic(name))
    if partitions is not None and partitions <= current:
        raise AdminError(
            f"topic {name!r} has {current} partition(s): --partitions can only raise the "
            f"count, not set it to {partitions} ({ErrorCode.INVALID_PARTITIONS.name})"
        )
    for validate_only in (True, False):
        configs.alter(
            session, configs.TOPIC, name, set_configs, delete_configs, validate_only=validate_only
        )
        if partitions is not None:
            _add_partitions(session, name, partitions, validate_only)
    notes = [f"Set {k}={v} on topic {name}." for k, v in set_configs.items()]
    notes += [f"Removed {k} from topic {name}." for k in delete_configs]
    if partitions is not None:
        notes.append(f"Topic {name} now has {partitions} partitions (was {current}).")
    data = {
        "topic": name,
        "set": set_configs,
        "deleted": list(delete_configs),
        "partitions": partitions if partitions is not None else current,
    }
    return Report(data, notes=notes)


def _add_partitions(session: Session, name: str, count: int, validate_only: bool) -> None:
    response = session.api(
        "CreatePartitions",
        lambda: session.kafka.create_partitions(
            {name: count},
            timeout_ms=session.timeout_ms,
            validate_only=validate_only,
            raise_errors=False,
        ),
    )
    for result in response.results:
        if result.error_code:
            raise ServerError(
                f"cannot add partitions to {name!r}", int(result.error_code), result.error_message
            )


def delete_topics(session: Session, names: Sequence[str], if_exists: bool) -> Report:
    existing = set(session.api("Metadata", session.kafka.list_topics))
    missing = sorted(set(names) - existing)
    if missing and not if_exists:
        raise AdminError(
            f"no topic {', '.join(repr(t) for t in missing)} in the cluster: nothing deleted "
            "(--if-exists skips missing topics)"
        )
    doomed = sorted(set(names) & existing)
    notes = [f"Topic {t} does not exist." for t in missing]
    if not doomed:
        return Report({"deleted": [], "missing": missing}, notes=notes)
    result = session.api(
        "DeleteTopics",
        lambda: session.kafka.delete_topics(
            doomed, timeout_ms=session.timeout_ms, raise_errors=False
        ),
    )
    failures = []
    deleted = []
    for answer in result["topics"]:
        code = int(answer["error_code"])
        if code:
            failures.append(
                ServerError(f"topic {answer['name']!r}", code, answer.get("error_message"))
            )
        else:
            deleted.append(answer["name"])
            notes.append(f"Deleted topic {answer['name']}.")
    if failures:
        raise AdminError("\n".join([*notes, *(str(f) for f in failures)]))
    return Report({"deleted": sorted(deleted), "missing": missing}, notes=notes)
