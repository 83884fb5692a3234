"""Submitting, following and cancelling replica reassignments (KIP-455's
AlterPartitionReassignments and ListPartitionReassignments), with the replication
throttles kafka-reassign-partitions sets.

While a partition moves its replicas are the target's and the current ones together;
ListPartitionReassignments names the replicas being added and removed, and the move is
done once the added ones are in sync and the metadata lists exactly the target.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

from directlog.admin import configs
from directlog.admin.output import EXIT_ERROR, EXIT_IN_PROGRESS, Report, Table
from directlog.admin.plans import (
    Assignment,
    Broker,
    Partition,
    PlanError,
    balance_plan,
    check_plan,
    plan_document,
    plan_json,
    throttled_replicas,
)
from directlog.admin.session import AdminError, ClusterView, ServerError, Session, describe_error

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import TopicPartition
    from kafka.protocol.admin import AlterPartitionReassignmentsRequest

THROTTLE_RATES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
THROTTLE_REPLICAS = (
    "leader.replication.throttled.replicas",
    "follower.replication.throttled.replicas",
)
NO_REASSIGNMENT_IN_PROGRESS = 85
POLL_INTERVAL = 1.0  # seconds between looks at a running reassignment

DONE, IN_PROGRESS, DIFFERS = "done", "in progress", "differs"


class InProgressError(AdminError):
    """A reassignment of a planned partition is running already: nothing was submitted."""


class WaitTimeout(AdminError):
    """`wait` reached its deadline before every partition had its target replicas (the
    reassignment itself keeps running)."""


@dataclass(frozen=True, slots=True)
class Ongoing:
    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


def ongoing(
    session: Session, partitions: Iterable[Partition] | None = None
) -> dict[Partition, Ongoing]:
    """The reassignments in progress (of `partitions`, or all)."""
    wanted = (
        None if partitions is None else [TopicPartition(p.topic, p.partition) for p in partitions]
    )
    if wanted == []:
        return {}
    listed = session.api(
        "ListPartitionReassignments",
        lambda: session.kafka.list_partition_reassignments(wanted, timeout_ms=session.timeout_ms),
    )
    return {
        Partition(tp.topic, tp.partition): Ongoing(
            tuple(r["replicas"]), tuple(r["adding_replicas"]), tuple(r["removing_replicas"])
        )
        for tp, r in listed.items()
    }


def alter(
    session: Session, targets: Mapping[Partition, Sequence[int] | None]
) -> dict[Partition, tuple[int, str | None]]:
    """AlterPartitionReassignments: each partition's error code and message (0 when the
    move, or with None the cancellation, was accepted)."""
    topic_type = AlterPartitionReassignmentsRequest.ReassignableTopic
    partition_type = topic_type.ReassignablePartition
    by_topic: dict[str, list[object]] = {}
    for partition, replicas in sorted(targets.items()):
        by_topic.setdefault(partition.topic, []).append(
            partition_type(
                partition_index=partition.partition,
                replicas=None if replicas is None else list(replicas),
            )
        )
    request = AlterPartitionReassignmentsRequest(
        timeout_ms=session.timeout_ms,
        topics=[topic_type(name=t, partitions=ps) for t, ps in by_topic.items()],
    )
    response = session.send_to_controller(request)
    if response.error_code:
        raise ServerError(
            "AlterPartitionReassignments", int(response.error_code), response.error_message
        )
    answers = {}
    for topic in response.responses:
        for p in topic.partitions:
            answers[Partition(topic.name, p.partition_index)] = (
                int(p.error_code),
                p.error_message,
            )
    return answers


def generate(session: Session, brokers: Sequence[int], topics: Sequence[str]) -> Report:
    """A plan moving the partitions of `topics` (all when empty) onto `brokers`, evenly
    and with as few moves as it takes; the plan file's JSON is the output, the current
    assignment of what it moves (for a roll-back) goes to stderr."""
    if not brokers:
        raise AdminError("--brokers names no broker")
    view = session.cluster(topics or None)
    unknown = sorted(set(brokers) - set(view.brokers))
    if unknown:
        raise AdminError(
            f"broker(s) {unknown} are not live brokers of the cluster "
            f"(live: {sorted(view.brokers)})"
        )
    targets = [view.brokers[b] if b in view.brokers else Broker(b) for b in sorted(set(brokers))]
    try:
        plan = balance_plan(view.assignment, targets)
    except PlanError as error:
        raise AdminError(str(error)) from None
    current = {p: view.partitions[p].replicas for p in plan}
    if plan:
        moved = sum(len(set(r) - set(current[p])) for p, r in plan.items())
        aside = [
            f"{len(plan)} partition(s) change, {moved} replica(s) move. "
            "The current assignment of those partitions, to roll back:",
            plan_json(current),
        ]
    else:
        aside = ["The partitions are already spread evenly over these brokers: nothing to move."]
    return Report(plan_document(plan), raw=plan_json(plan), aside=aside)


# Throttles ------------------------------------------------------------------------------


def set_throttles(session: Session, current: Assignment, plan: Assignment, rate: int) -> None:
    """As kafka-reassign-partitions --throttle: the replication rate limit on every broker
    a moving partition has or gets, and the replicas it applies to on each topic.
    Validated everywhere before anything is set."""
    if rate <= 0:
        raise AdminError(f"--throttle must be a positive number of bytes per second, not {rate}")
    brokers = sorted({b for p, target in plan.items() for b in (*current.get(p, ()), *target)})
    per_topic = throttled_replicas(current, plan)
    rates = dict.fromkeys(THROTTLE_RATES, str(rate))
    for validate_only in (True, False):
        for broker in brokers:
            configs.alter(session, configs.BROKER, str(broker), rates, validate_only=validate_only)
        for topic, (leaders, followers) in sorted(per_topic.items()):
            values = {THROTTLE_REPLICAS[0]: leaders}
            if followers:
                values[THROTTLE_REPLICAS[1]] = followers
            configs.alter(session, configs.TOPIC, topic, values, validate_only=validate_only)


def clear_throttles(session: Session, topics: Iterable[str], brokers: Iterable[int]) -> list[str]:
    """The throttle configs removed from `topics` and `brokers` (only those set)."""
    removed = []
    for topic, values in sorted(configs.topic_overrides(session, topics).items()):
        present = [k for k in THROTTLE_REPLICAS if k in values]
        if present:
            configs.alter(session, configs.TOPIC, topic, delete=present)
            removed += [f"topic {topic}: {k}" for k in present]
    for broker in sorted(set(brokers)):
        present = sorted(configs.broker_values(session, broker, THROTTLE_RATES))
        if present:
            configs.alter(session, configs.BROKER, str(broker), delete=present)
            removed += [f"broker {broker}: {k}" for k in present]
    return removed


# Executing ------------------------------------------------------------------------------


def execute(
    session: Session, plan: Assignment, throttle: int | None, view: ClusterView | None = None
) -> Report:
    """The plan checked against the cluster, then submitted whole; when the brokers refuse
    part of it, the accepted part is cancelled again, so nothing is left half-applied."""
    view = view or session.cluster()
    try:
        check_plan(plan, view.partition_counts, view.brokers)
    except PlanError as error:
        raise AdminError("the plan is refused, nothing was submitted:\n" + str(error)) from None
    current = {p: view.partitions[p].replicas for p in plan}
    moving = {p: tuple(r) for p, r in plan.items() if tuple(r) != current[p]}
    table = Table(
        ["TOPIC", "PARTITION", "CURRENT", "TARGET"],
        [[p.topic, p.partition, current[p], plan[p]] for p in sorted(plan)],
    )
    if not moving:
        unchanged = {"submitted": [], "current": plan_document(current)}
        return Report(unchanged, [table], ["Every partition already has its target replicas."])
    busy = ongoing(session, moving)
    if busy:
        named = ", ".join(str(p) for p in sorted(busy))
        raise InProgressError(
            f"reassignments of {named} are still in progress: nothing was submitted "
            "(wait for them, or `directlog reassign cancel` them first)"
        )
    if throttle is not None:
        set_throttles(session, current, moving, throttle)
    answers = alter(session, moving)
    refused = {p: a for p, a in answers.items() if a[0]}
    if refused:
        accepted = [p for p in moving if p not in refused]
        undone = alter(session, dict.fromkeys(accepted)) if accepted else {}
        if throttle is not None:
            clear_throttles(session, {p.topic for p in moving}, view.brokers)
        lines = [
            f"{p}: {describe_error(code, message)}"
            for p, (code, message) in sorted(refused.items())
        ]
        if accepted:
            still = [
                p for p, (code, _) in undone.items() if code not in (0, NO_REASSIGNMENT_IN_PROGRESS)
            ]
            lines.append(
                f"the {len(accepted)} accepted partition(s) were cancelled again"
                + (f" except {', '.join(map(str, sorted(still)))}" if still else "")
            )
        raise AdminError("the brokers refused the reassignment:\n" + "\n".join(lines))
    notes = [
        f"Started the reassignment of {len(moving)} partition(s)"
        + (f", replication throttled to {throttle} bytes/s." if throttle else "."),
        "The current assignment, to roll back with `directlog reassign execute`:",
        plan_json(current),
    ]
    data: dict[str, object] = {
        "submitted": [str(p) for p in sorted(moving)],
        "current": plan_document(current),
        "throttle": throttle,
    }
    return Report(data, [table], notes)


# Following ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    partition: Partition
    state: str
    replicas: tuple[int, ...]
    target: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()


def status(session: Session, plan: Assignment) -> list[PartitionStatus]:
    """Each planned partition: done (its replicas are the target), in progress, or
    differs (no reassignment running, yet not at the target)."""
    running = ongoing(session, plan)
    view = session.cluster({p.topic for p in plan})
    statuses = []
    for partition, target in sorted(plan.items()):
        state = view.partitions.get(partition)
        if state is None:
            raise AdminError(f"{partition}: no such partition in the cluster")
        if partition in running:
            move = running[partition]
            statuses.append(
                PartitionStatus(
                    partition, IN_PROGRESS, move.replicas, tuple(target), move.adding, move.removing
                )
            )
        else:
            done = state.replicas == tuple(target)
            statuses.append(
                PartitionStatus(partition, DONE if done else DIFFERS, state.replicas, tuple(target))
            )
    return statuses


def verify(session: Session, plan: Assignment) -> Report:
    """Done, in progress or differing, per partition; once every one is done, the
    throttles are removed (as kafka-reassign-partitions --verify does)."""
    statuses = status(session, plan)
    report = _status_report(statuses)
    states = {s.state for s in statuses}
    if states == {DONE}:
        view = session.cluster([])
        removed = clear_throttles(session, {p.topic for p in plan}, view.brokers)
        report.notes.append("Every partition has its target replicas.")
        if removed:
            report.notes.append("Removed the replication throttles: " + "; ".join(removed) + ".")
    elif DIFFERS in states:
        report.exit_code = EXIT_ERROR
        report.notes.append(
            "Some partitions are not moving and do not have their target replicas "
            "(cancelled, or replaced by another reassignment)."
        )
    else:
        report.exit_code = EXIT_IN_PROGRESS
        report.notes.append("The reassignment is still in progress.")
    return report


def _status_report(statuses: Sequence[PartitionStatus]) -> Report:
    rows = [
        {
            "topic": s.partition.topic,
            "partition": s.partition.partition,
            "status": s.state,
            "replicas": list(s.replicas),
            "target": list(s.target),
            "adding": list(s.adding),
            "removing": list(s.removing),
        }
        for s in statuses
    ]
    table = Table(
        ["TOPIC", "PARTITION", "STATUS", "REPLICAS", "TARGET", "ADDING", "REMOVING"],
        [list(r.values()) for r in rows],
    )
    return Report(rows, [table])


def wait(
    session: Session,
    plan: Assignment,
    progress: TextIO = sys.stderr,
    deadline: float | None = None,
) -> None:
    """Until every partition of `plan` has its target replicas, then the throttles are
    removed. Progress goes to `progress` as it changes. A partition that is neither moving
    nor at its target for longer than the session timeout fails the wait (the metadata
    may trail the controller by a moment); Ctrl-C stops waiting, not the reassignment.
    With a `deadline` (time.monotonic()), WaitTimeout once it passes with moves left."""
    last = None
    differing_since: float | None = None
    while True:
        statuses = status(session, plan)
        done = sum(1 for s in statuses if s.state == DONE)
        if done != last:
            progress.write(f"reassignment: {done} of {len(statuses)} partition(s) done\n")
            progress.flush()
            last = done
        if done == len(statuses):
            break
        if any(s.state == DIFFERS for s in statuses) and not any(
            s.state == IN_PROGRESS for s in statuses
        ):
            differing_since = differing_since or time.monotonic()
            if time.monotonic() - differing_since > session.timeout:
                named = ", ".join(str(s.partition) for s in statuses if s.state == DIFFERS)
                raise AdminError(
                    f"{named}: no reassignment is running and the replicas are not the target"
                )
        else:
            differing_since = None
        if deadline is not None and time.monotonic() >= deadline:
            left = ", ".join(str(s.partition) for s in statuses if s.state != DONE)
            raise WaitTimeout(
                f"{done} of {len(statuses)} partition(s) had their target replicas by the "
                f"deadline; still moving: {left}"
            )
        pause = (
            POLL_INTERVAL if deadline is None else min(POLL_INTERVAL, deadline - time.monotonic())
        )
        time.sleep(max(0.0, pause))
    view = session.cluster([])
    removed = clear_throttles(session, {p.topic for p in plan}, view.brokers)
    if removed:
        progress.write("removed the replication throttles: " + "; ".join(removed) + "\n")


def list_reassignments(session: Session) -> Report:
    running = ongoing(session)
    rows = [
        {
            "topic": p.topic,
            "partition": p.partition,
            "replicas": list(m.replicas),
            "adding": list(m.adding),
            "removing": list(m.removing),
        }
        for p, m in sorted(running.items())
    ]
    table = Table(
        ["TOPIC", "PARTITION", "REPLICAS", "ADDING", "REMOVING"], [list(r.values()) for r in rows]
    )
    notes = [] if rows else ["No reassignment is in progress."]
    return Report(rows, [table] if rows else [], notes)


def cancel(session: Session, plan: Assignment) -> Report:
    """The plan's running reassignments cancelled (their partitions go back to the
    replicas they had), and the throttles removed."""
    view = session.cluster()
    try:
        check_plan(
            plan, view.partition_counts, set(view.brokers) | {b for r in plan.values() for b in r}
        )
    except PlanError as error:
        raise AdminError(str(error)) from None
    answers = alter(session, dict.fromkeys(plan))
    rows = []
    failed = False
    for partition, (code, message) in sorted(answers.items()):
        if code == 0:
            outcome = "cancelled"
        elif code == NO_REASSIGNMENT_IN_PROGRESS:
            outcome = "no reassignment in progress"
        else:
            outcome = describe_error(code, message)
            failed = True
        rows.append({"topic": partition.topic, "partition": partition.partition, "result": outcome})
    removed = clear_throttles(session, {p.topic for p in plan}, view.brokers)
    notes = ["Removed the replication throttles: " + "; ".join(removed) + "."] if removed else []
    table = Table(["TOPIC", "PARTITION", "RESULT"], [list(r.values()) for r in rows])
    return Report(rows, [table], notes, EXIT_ERROR if failed else 0)
