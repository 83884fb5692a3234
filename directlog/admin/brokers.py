"""`directlog brokers ...` and `directlog rebalance`: what each broker holds, emptying a
broker before it is removed, and spreading replicas over brokers just added."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Collection
from typing import TextIO

from directlog.admin import leaders, reassignment
from directlog.admin.output import Report, Table
from directlog.admin.plans import Assignment, PlanError, balance_plan, drain_plan, plan_document
from directlog.admin.session import AdminError, ClusterView, Session


class DrainRefused(AdminError):
    """The drain would leave a partition with fewer replicas: nothing was submitted."""


def list_brokers(session: Session) -> Report:
    """Live brokers, and brokers that are down but still named as replicas."""
    view = session.cluster()
    led = Counter(s.leader for s in view.partitions.values() if s.leader >= 0)
    held = Counter(b for s in view.partitions.values() for b in s.replicas)
    rows = []
    for broker in sorted(set(view.brokers) | set(held)):
        live = broker in view.brokers
        rows.append(
            {
                "id": broker,
                "address": view.addresses.get(broker),
                "rack": view.brokers[broker].rack if live else None,
                "live": live,
                "leaders": led[broker],
                "replicas": held[broker],
            }
        )
    table = Table(
        ["ID", "HOST:PORT", "RACK", "LIVE", "LEADERS", "REPLICAS"],
        [list(r.values()) for r in rows],
    )
    return Report(rows, [table])


def _moves_table(view: ClusterView, plan: Assignment) -> Table:
    return Table(
        ["TOPIC", "PARTITION", "CURRENT", "TARGET"],
        [[p.topic, p.partition, view.partitions[p].replicas, r] for p, r in sorted(plan.items())],
    )


def drain(
    session: Session,
    broker: int,
    wait: bool,
    throttle: int | None,
    progress: TextIO = sys.stderr,
    *,
    deadline: float | None = None,
    keep_off: Collection[int] = (),
) -> Report:
    """Every replica of `broker` moved to the other live brokers (plans.drain_plan);
    refused whole (DrainRefused) when a partition could not keep its replica count.
    `keep_off`: brokers that get none of the replicas either (they are leaving too);
    `deadline` (time.monotonic()) bounds the wait (reassignment.WaitTimeout)."""
    if broker < 0:
        raise AdminError(f"broker ids are >= 0, not {broker}")
    view = session.cluster()
    holds = [p for p, s in view.partitions.items() if broker in s.replicas]
    if broker not in view.brokers and not holds:
        raise AdminError(
            f"broker {broker} is not in the cluster (live brokers: {sorted(view.brokers)})"
        )
    if not holds:
        return Report(
            {"broker": broker, "plan": plan_document({})},
            notes=[f"Broker {broker} holds no replicas: nothing to move."],
        )
    try:
        live = [b for b in view.brokers.values() if b.id not in keep_off]
        plan = drain_plan(view.assignment, broker, live)
    except PlanError as error:
        raise DrainRefused(f"{error}; nothing was submitted") from None
    report = reassignment.execute(session, plan, throttle, view)
    report.data = {"broker": broker, "plan": plan_document(plan), **_dict(report.data)}
    if wait:
        reassignment.wait(session, plan, progress, deadline)
        report.notes.append(f"Broker {broker} holds no replicas any more.")
    else:
        report.notes.append(
            "Follow it with `directlog reassign list`, or run `brokers drain` with --wait."
        )
    return report


def rebalance(
    session: Session,
    execute: bool,
    wait: bool,
    throttle: int | None = None,
    progress: TextIO = sys.stderr,
) -> Report:
    """Replicas and preferred leaders spread evenly over every live broker; only printed
    without --execute. With --wait, preferred leaders are elected once the moves are done."""
    view = session.cluster()
    try:
        plan = balance_plan(view.assignment, list(view.brokers.values()))
    except PlanError as error:
        raise AdminError(str(error)) from None
    document = plan_document(plan)
    if not plan:
        return Report(document, notes=["The replicas are already spread evenly: nothing to move."])
    table = _moves_table(view, plan)
    if not execute:
        return Report(
            document,
            [table],
            ["Dry run: nothing submitted. Add --execute to start these moves."],
        )
    report = reassignment.execute(session, plan, throttle, view)
    report.data = {"plan": document, **_dict(report.data)}
    if wait:
        reassignment.wait(session, plan, progress)
        wanted: dict[str, list[int]] = {}
        for p, replicas in sorted(plan.items()):
            if view.partitions[p].leader != replicas[0]:
                wanted.setdefault(p.topic, []).append(p.partition)
        if wanted:
            elected = leaders.elect(session, wanted, "preferred")
            report.tables.append(elected.tables[0])
    return report


def _dict(data: object) -> dict[str, object]:
    return dict(data) if isinstance(data, dict) else {"result": data}
