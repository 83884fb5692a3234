"""`directlog groups ...`: list, describe (committed offsets and lag), reset offsets and
delete consumer groups, as kafka-consumer-groups does."""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from directlog.admin.output import EXIT_ERROR, Report, Table
from directlog.admin.session import (
    RETRIABLE_GROUP_CODES,
    AdminError,
    Session,
    describe_error,
    error_code_of,
    error_name,
)
from directlog.protocol.errors import ErrorCode

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.errors as kafka_errors
    from kafka import OffsetAndMetadata, TopicPartition
    from kafka.admin import OffsetSpec, OffsetTimestamp

INACTIVE_STATES = frozenset({"Empty", "Dead"})
_CODES_BY_CLASS_NAME = {cls.__name__: cls.errno for cls in kafka_errors.kafka_errors.values()}


@dataclass(frozen=True, slots=True)
class Member:
    member_id: str
    client_id: str
    host: str
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class GroupInfo:
    group: str
    state: str
    protocol_type: str
    members: tuple[Member, ...]


def _describe(session: Session, groups: Sequence[str]) -> dict[str, GroupInfo]:
    """DescribeGroups, retried while a coordinator is still loading its groups."""
    deadline = time.monotonic() + session.timeout
    while True:
        described = session.api("DescribeGroups", lambda: session.kafka.describe_groups(groups))
        pending = []
        infos = {}
        for group in groups:
            raw = described.get(group)
            if raw is None:
                raise AdminError(f"DescribeGroups did not answer for group {group!r}")
            if raw.get("error"):
                code = _error_code_in(raw["error"])
                if code in RETRIABLE_GROUP_CODES and time.monotonic() < deadline:
                    pending.append(group)
                    continue
                raise AdminError(f"group {group!r}: {raw['error']}")
            infos[group] = GroupInfo(
                group=group,
                state=str(raw.get("group_state") or "Unknown"),
                protocol_type=str(raw.get("protocol_type") or ""),
                members=tuple(_member(m) for m in raw.get("members", [])),
            )
        if not pending:
            return infos
        time.sleep(0.2)


def _error_code_in(text: str) -> int:
    """The code in kafka-python's "[Error 14] CoordinatorLoadInProgressError: ..."."""
    if text.startswith("[Error "):
        number = text[len("[Error ") :].split("]", 1)[0]
        if number.lstrip("-").isdigit():
            return int(number)
    return -1


def _member(raw: dict[str, Any]) -> Member:
    assignment = raw.get("member_assignment")
    partitions: list[tuple[str, int]] = []
    if assignment is not None and hasattr(assignment, "partitions"):
        partitions = [(tp.topic, tp.partition) for tp in assignment.partitions()]
    elif isinstance(assignment, dict):
        for entry in assignment.get("assigned_partitions") or []:
            if isinstance(entry, dict):
                topic, numbers = entry.get("topic"), entry.get("partitions") or []
            else:
                topic, numbers = entry[0], entry[1]
            partitions += [(str(topic), int(n)) for n in numbers]
    return Member(
        member_id=str(raw.get("member_id") or ""),
        client_id=str(raw.get("client_id") or ""),
        host=str(raw.get("client_host") or ""),
        partitions=tuple(sorted(partitions)),
    )


def _committed(session: Session, group: str) -> dict[tuple[str, int], int]:
    offsets = session.api(
        "OffsetFetch", lambda: session.kafka.list_group_offsets({group: None})
    ).get(group, {})
    return {(tp.topic, tp.partition): int(o.offset) for tp, o in offsets.items() if o.offset >= 0}


def _offsets(
    session: Session, partitions: Sequence[tuple[str, int]], spec: Any
) -> dict[tuple[str, int], int]:
    if not partitions:
        return {}
    answer = session.api(
        "ListOffsets",
        lambda: session.kafka.list_partition_offsets(
            {TopicPartition(t, p): spec for t, p in partitions}, timeout_ms=session.timeout_ms
        ),
    )
    return {(tp.topic, tp.partition): int(o.offset) for tp, o in answer.items()}


def list_groups(session: Session) -> Report:
    listed = session.api("ListGroups", session.kafka.list_groups)
    names = sorted({str(g["group_id"]) for g in listed})
    infos = _describe(session, names) if names else {}
    rows = [
        {"group": n, "state": infos[n].state, "protocol_type": infos[n].protocol_type}
        for n in names
    ]
    table = Table(
        ["GROUP", "STATE", "PROTOCOL-TYPE"],
        [[r["group"], r["state"], r["protocol_type"] or None] for r in rows],
    )
    return Report(rows, [table])


def describe_groups(session: Session, groups: Sequence[str]) -> Report:
    """State, members and, per partition, the committed offset, the log end offset and
    the lag between them (kafka-consumer-groups --describe)."""
    infos = _describe(session, list(dict.fromkeys(groups)))
    existing_topics = set(session.api("Metadata", session.kafka.list_topics))
    data = []
    tables = []
    notes = []
    exit_code = 0
    for group, info in infos.items():
        committed = _committed(session, group)
        if info.state == "Dead" and not committed:
            notes.append(f"Consumer group {group!r} does not exist.")
            exit_code = EXIT_ERROR
            continue
        owner = {tp: m for m in info.members for tp in m.partitions}
        partitions = sorted(tp for tp in set(committed) | set(owner) if tp[0] in existing_topics)
        ends = _offsets(session, partitions, OffsetSpec.LATEST)
        rows = []
        for tp in partitions:
            current = committed.get(tp)
            end = ends.get(tp)
            member = owner.get(tp)
            rows.append(
                {
                    "topic": tp[0],
                    "partition": tp[1],
                    "current_offset": current,
                    "log_end_offset": end,
                    "lag": end - current if current is not None and end is not None else None,
                    "consumer_id": member.member_id if member else None,
                    "host": member.host if member else None,
                    "client_id": member.client_id if member else None,
                }
            )
        data.append(
            {
                "group": group,
                "state": info.state,
                "members": [
                    {
                        "member_id": m.member_id,
                        "client_id": m.client_id,
                        "host": m.host,
                        "partitions": [f"{t}-{p}" for t, p in m.partitions],
                    }
                    for m in info.members
                ],
                "partitions": rows,
            }
        )
        title = f"Group: {group}  State: {info.state}  Members: {len(info.members)}"
        tables.append(
            Table(
                [
                    "TOPIC",
                    "PARTITION",
                    "CURRENT-OFFSET",
                    "LOG-END-OFFSET",
                    "LAG",
                    "CONSUMER-ID",
                    "HOST",
                    "CLIENT-ID",
                ],
                [list(r.values()) for r in rows],
                title=title,
            )
        )
    return Report(data, tables, notes, exit_code)


# Offset resets ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResetTarget:
    """How the new offsets are found: "earliest", "latest", "offset" (value), "datetime"
    (value: milliseconds since the epoch) or "shift" (value: records to move by)."""

    kind: str
    value: int = 0


def parse_datetime(text: str) -> int:
    """Milliseconds since the epoch of an ISO 8601 date-time; one without a zone is in
    the local zone (as kafka-consumer-groups reads it)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise AdminError(
            f"--to-datetime {text!r}: expected ISO 8601, such as 2024-05-01T12:00:00Z"
        ) from None
    return int(moment.timestamp() * 1000)


def parse_topic_partitions(spec: str) -> tuple[str, list[int] | None]:
    """`T` (every partition) or `T:0,2`."""
    topic, sep, rest = spec.rpartition(":")
    if not sep:
        return spec, None
    try:
        numbers = [int(p) for p in rest.split(",") if p.strip()]
    except ValueError:
        raise AdminError(f"--topic {spec!r}: expected TOPIC or TOPIC:P,P") from None
    if not topic or not numbers or any(n < 0 for n in numbers):
        raise AdminError(f"--topic {spec!r}: expected TOPIC or TOPIC:P,P with partitions >= 0")
    return topic, numbers


def reset_offsets(
    session: Session, group: str, topic_specs: Sequence[str], target: ResetTarget, execute: bool
) -> Report:
    """The group's new committed offsets, each kept between the partition's earliest and
    latest offsets; committed with --execute, only shown without. Refused while the
    group has members (Kafka's rule: a reset races with a live consumer's commits)."""
    wanted = [parse_topic_partitions(s) for s in topic_specs]
    view = session.cluster([t for t, _ in wanted])
    partitions: list[tuple[str, int]] = []
    for topic, numbers in wanted:
        count = len(view.topic(topic))
        for n in numbers if numbers is not None else range(count):
            if n >= count:
                raise AdminError(f"topic {topic!r} has {count} partition(s), no partition {n}")
            partitions.append((topic, n))
    partitions = sorted(set(partitions))
    info = _describe(session, [group])[group]
    if info.state not in INACTIVE_STATES or info.members:
        raise AdminError(
            f"cannot reset the offsets of group {group!r}: it is {info.state} with "
            f"{len(info.members)} active member(s); offsets can only be reset while the group "
            "is inactive (stop its consumers first)"
        )
    committed = _committed(session, group)
    earliest = _offsets(session, partitions, OffsetSpec.EARLIEST)
    latest = _offsets(session, partitions, OffsetSpec.LATEST)
    if target.kind == "datetime":
        found = _offsets(session, partitions, OffsetTimestamp(target.value))
    new: dict[tuple[str, int], int] = {}
    for tp in partitions:
        if target.kind == "earliest":
            offset = earliest[tp]
        elif target.kind == "latest":
            offset = latest[tp]
        elif target.kind == "offset":
            offset = target.value
        elif target.kind == "datetime":
            offset = found[tp] if found.get(tp, -1) >= 0 else latest[tp]
        elif target.kind == "shift":
            if tp not in committed:
                raise AdminError(
                    f"cannot shift {tp[0]}-{tp[1]}: group {group!r} has no committed offset there"
                )
            offset = committed[tp] + target.value
        else:
            raise AssertionError(target.kind)
        new[tp] = min(max(offset, earliest[tp]), latest[tp])
    rows = [
        {
            "topic": t,
            "partition": p,
            "current_offset": committed.get((t, p)),
            "new_offset": new[t, p],
        }
        for t, p in partitions
    ]
    table = Table(
        ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"],
        [[group, *r.values()] for r in rows],
    )
    data = {"group": group, "executed": execute, "partitions": rows}
    if not execute:
        notes = ["Dry run: nothing committed. Add --execute to commit these offsets."]
        return Report(data, [table], notes)
    results = session.api(
        "OffsetCommit",
        lambda: session.kafka.alter_group_offsets(
            group,
            {TopicPartition(t, p): OffsetAndMetadata(o, "", None) for (t, p), o in new.items()},
        ),
    )
    failures = [
        f"{tp.topic}-{tp.partition}: {describe_error(error_code_of(error))}"
        for tp, error in sorted(results.items())
        if error_code_of(error) != 0
    ]
    if failures:
        raise AdminError(f"group {group!r}: offsets not committed:\n" + "\n".join(failures))
    return Report(data, [table], [f"Committed the new offsets of group {group}."])


def delete_groups(session: Session, groups: Sequence[str]) -> Report:
    results = session.api(
        "DeleteGroups", lambda: session.kafka.delete_groups(list(dict.fromkeys(groups)))
    )
    notes = []
    data = []
    failed = False
    for group, outcome in sorted(results.items()):
        if outcome == "OK":
            notes.append(f"Deleted group {group}.")
            data.append({"group": group, "deleted": True})
            continue
        code = _CODES_BY_CLASS_NAME.get(str(outcome), -1)
        failed = True
        reason = describe_error(code) if code >= 0 else str(outcome)
        if code == ErrorCode.NON_EMPTY_GROUP:
            reason += ": the group has active members"
        notes.append(f"Group {group} not deleted: {reason}")
        data.append(
            {
                "group": group,
                "deleted": False,
                "error": error_name(code) if code >= 0 else str(outcome),
            }
        )
    return Report(data, notes=notes, exit_code=EXIT_ERROR if failed else 0)
