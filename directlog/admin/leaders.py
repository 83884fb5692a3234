"""`directlog elect-leaders`: ElectLeaders, preferred (the first replica leads again) or
unclean (any live replica, accepting the loss of records it lacks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from directlog.admin.output import EXIT_ERROR, Report, Table
from directlog.admin.session import AdminError, ServerError, Session, describe_error

ELECTION_TYPES = {"preferred": 0, "unclean": 1}
ELECTION_NOT_NEEDED = 84


def select(
    session: Session, topics: Sequence[str], partitions: Sequence[int]
) -> dict[str, list[int]]:
    """The partitions an election covers: all of the cluster's, all of `topics`, or
    `partitions` of the one topic; AdminError for ones the cluster does not have."""
    if partitions and len(topics) != 1:
        raise AdminError("--partition needs exactly one --topic")
    view = session.cluster(topics or None)
    chosen: dict[str, list[int]] = {}
    for topic, count in sorted(view.partition_counts.items()):
        if partitions:
            unknown = sorted(p for p in partitions if not 0 <= p < count)
            if unknown:
                raise AdminError(f"topic {topic!r} has {count} partition(s), not {unknown}")
            chosen[topic] = sorted(set(partitions))
        else:
            chosen[topic] = list(range(count))
    return chosen


def elect(session: Session, partitions: Mapping[str, Sequence[int]], kind: str) -> Report:
    if kind not in ELECTION_TYPES:
        raise AdminError(f"--type must be one of {sorted(ELECTION_TYPES)}, not {kind!r}")
    wanted = {t: list(ps) for t, ps in partitions.items() if ps}
    if not wanted:
        return Report([], notes=["No partitions to elect leaders for."])
    response = session.api(
        "ElectLeaders",
        lambda: session.kafka.elect_leaders(
            ELECTION_TYPES[kind], wanted, timeout_ms=session.timeout_ms, raise_errors=False
        ),
    )
    if getattr(response, "error_code", 0):
        raise ServerError("ElectLeaders", int(response.error_code))
    rows = []
    failed = False
    for topic in response.replica_election_results:
        for p in topic.partition_result:
            code = int(p.error_code)
            if code == 0:
                result = "elected"
            elif code == ELECTION_NOT_NEEDED:
                result = (
                    "already led by its preferred replica"
                    if kind == "preferred"
                    else "has a leader"
                )
            else:
                result = describe_error(code, p.error_message)
                failed = True
            rows.append({"topic": topic.topic, "partition": int(p.partition_id), "result": result})
    rows.sort(key=lambda r: (str(r["topic"]), int(str(r["partition"]))))
    table = Table(["TOPIC", "PARTITION", "RESULT"], [list(r.values()) for r in rows])
    return Report(rows, [table], exit_code=EXIT_ERROR if failed else 0)
