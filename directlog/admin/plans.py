"""Replica placement plans, with no I/O: what `brokers drain`, `reassign generate` and
`rebalance` propose, and the checks every plan passes before it is submitted.

A plan maps partitions to their target replica lists, the first replica being the
preferred leader, in the shape of Kafka's kafka-reassign-partitions JSON
(``{"version": 1, "partitions": [{"topic", "partition", "replicas"}]}``). Planners return
only the partitions whose replica list changes, so an already balanced cluster gets an
empty plan, and they are deterministic: the same cluster gives the same plan.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

PLAN_VERSION = 1


@dataclass(frozen=True, slots=True, order=True)
class Partition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class Broker:
    id: int
    rack: str | None = None


Assignment = dict[Partition, tuple[int, ...]]


class PlanError(ValueError):
    """A plan that cannot be made or must not be submitted; `problems` names every reason,
    so a user fixes a plan file in one go."""

    def __init__(self, problems: Sequence[str]) -> None:
        assert problems
        super().__init__("\n".join(problems))
        self.problems = list(problems)


# Planning -------------------------------------------------------------------------------


class _Placement:
    """The replica lists being planned, with the counts the choices are made from."""

    def __init__(self, current: Mapping[Partition, Sequence[int]], brokers: Sequence[Broker]):
        self.replicas = {p: list(r) for p, r in current.items()}
        self.racks = {b.id: b.rack for b in brokers}
        self.targets = sorted(self.racks)
        self.load: Counter[int] = Counter()
        self.leaders: Counter[int] = Counter()
        self.topic_load: Counter[tuple[str, int]] = Counter()
        for partition, replicas in self.replicas.items():
            for broker in replicas:
                self.load[broker] += 1
                self.topic_load[partition.topic, broker] += 1
            if replicas:
                self.leaders[replicas[0]] += 1

    def distinct_racks(self, replicas: Iterable[int]) -> int:
        racks = {self.racks.get(b) for b in replicas}
        return len(racks - {None}) + sum(1 for b in replicas if self.racks.get(b) is None)

    def best_replacement(self, partition: Partition, position: int) -> int:
        """The target broker to take over `position`: one that keeps the partition's racks
        apart when it can, then the least loaded (overall, then within the topic)."""
        replicas = self.replicas[partition]
        others = [b for i, b in enumerate(replicas) if i != position]
        used_racks = {self.racks.get(b) for b in others} - {None}
        candidates = [b for b in self.targets if b not in others]
        assert candidates, (partition, replicas)

        def cost(broker: int) -> tuple[int, int, int, int]:
            rack = self.racks.get(broker)
            return (
                int(rack is not None and rack in used_racks),
                self.load[broker],
                self.topic_load[partition.topic, broker],
                broker,
            )

        return min(candidates, key=cost)

    def replace(self, partition: Partition, position: int, broker: int) -> None:
        replicas = self.replicas[partition]
        old = replicas[position]
        replicas[position] = broker
        self.load[old] -= 1
        self.load[broker] += 1
        self.topic_load[partition.topic, old] -= 1
        self.topic_load[partition.topic, broker] += 1
        if position == 0:
            self.leaders[old] -= 1
            self.leaders[broker] += 1

    def changes(self, current: Mapping[Partition, Sequence[int]]) -> Assignment:
        return {
            p: tuple(r) for p, r in sorted(self.replicas.items()) if tuple(r) != tuple(current[p])
        }


def drain_plan(
    current: Mapping[Partition, Sequence[int]], drained: int, live: Sequence[Broker]
) -> Assignment:
    """Every replica on broker `drained` moved to another live broker: each partition keeps
    its replica count and, where the racks allow, its rack spread; the least loaded
    brokers are filled first and the new replica takes the drained one's place in the
    list. Refused (PlanError naming the partitions) when a partition has more replicas
    than there are other live brokers: nothing of such a drain may be submitted."""
    others = [b for b in live if b.id != drained]
    short = sorted((p, len(r)) for p, r in current.items() if drained in r and len(r) > len(others))
    if short:
        named = ", ".join(f"{p} (replication factor {rf})" for p, rf in short)
        raise PlanError(
            [
                f"cannot drain broker {drained}: only {len(others)} other live broker(s), "
                f"fewer than the replicas of {named}"
            ]
        )
    placement = _Placement(current, others)
    for partition in sorted(current):
        replicas = placement.replicas[partition]
        if drained in replicas:
            position = replicas.index(drained)
            placement.replace(partition, position, placement.best_replacement(partition, position))
    return placement.changes(current)


def balance_plan(
    current: Mapping[Partition, Sequence[int]], brokers: Sequence[Broker]
) -> Assignment:
    """The partitions moved onto `brokers` and spread evenly over them, moving as few
    replicas as it takes: replicas on other brokers move first; then, while one broker
    holds two or more replicas more than another, one replica moves from the fuller to
    the emptier (never narrowing a partition's rack spread); then preferred leaders are
    evened out by reordering replicas, which moves no data. Replica counts are kept."""
    if not brokers:
        raise PlanError(["no brokers to place the replicas on"])
    too_wide = sorted((p, len(r)) for p, r in current.items() if len(r) > len(brokers))
    if too_wide:
        named = ", ".join(f"{p} (replication factor {rf})" for p, rf in too_wide)
        raise PlanError([f"{len(brokers)} broker(s) cannot hold every replica of {named}"])
    placement = _Placement(current, brokers)
    targets = set(placement.targets)
    for partition in sorted(current):
        for position, broker in enumerate(list(placement.replicas[partition])):
            if broker not in targets:
                placement.replace(
                    partition, position, placement.best_replacement(partition, position)
                )
    _even_out_replicas(placement)
    _even_out_leaders(placement)
    return placement.changes(current)


def _even_out_replicas(placement: _Placement) -> None:
    # Each move lowers the sum of squared loads by at least 2: the loop is bounded.
    bound = sum(len(r) for r in placement.replicas.values()) ** 2 + 1
    for _ in range(bound):
        move = _best_replica_move(placement)
        if move is None:
            return
        partition, position, broker = move
        placement.replace(partition, position, broker)
    raise AssertionError("replica balancing did not settle")


def _best_replica_move(placement: _Placement) -> tuple[Partition, int, int] | None:
    """One replica from the fullest broker it can leave to the emptiest broker it can go
    to, two or more replicas apart; the partition whose topic is most lopsided between
    the two, and a follower rather than a preferred leader."""
    by_load = sorted(placement.targets, key=lambda b: (placement.load[b], b))
    for full in reversed(by_load):
        for empty in by_load:
            if placement.load[full] - placement.load[empty] < 2:
                break
            best: tuple[tuple[int, int, Partition], Partition, int] | None = None
            for partition, replicas in placement.replicas.items():
                if full not in replicas or empty in replicas:
                    continue
                position = replicas.index(full)
                moved = [empty if b == full else b for b in replicas]
                if placement.distinct_racks(moved) < placement.distinct_racks(replicas):
                    continue
                skew = (
                    placement.topic_load[partition.topic, full]
                    - placement.topic_load[partition.topic, empty]
                )
                key = (-skew, int(position == 0), partition)
                if best is None or key < best[0]:
                    best = (key, partition, position)
            if best is not None:
                return best[1], best[2], empty
    return None


def _even_out_leaders(placement: _Placement) -> None:
    partitions = sorted(placement.replicas)
    bound = len(partitions) ** 2 + 1  # each swap lowers the sum of squared leader counts
    for _ in range(bound):
        best: tuple[int, Partition, int] | None = None
        for partition in partitions:
            replicas = placement.replicas[partition]
            if not replicas:
                continue
            leader = replicas[0]
            for position in range(1, len(replicas)):
                gap = placement.leaders[leader] - placement.leaders[replicas[position]]
                if gap >= 2 and (best is None or gap > best[0]):
                    best = (gap, partition, position)
        if best is None:
            return
        _, partition, position = best
        replicas = placement.replicas[partition]
        placement.leaders[replicas[0]] -= 1
        placement.leaders[replicas[position]] += 1
        replicas[0], replicas[position] = replicas[position], replicas[0]
    raise AssertionError("leader balancing did not settle")


# Plan files -----------------------------------------------------------------------------


def plan_document(plan: Mapping[Partition, Sequence[int]]) -> dict[str, object]:
    """A plan as kafka-reassign-partitions writes it (partitions in order)."""
    return {
        "version": PLAN_VERSION,
        "partitions": [
            {"topic": p.topic, "partition": p.partition, "replicas": list(r)}
            for p, r in sorted(plan.items())
        ],
    }


def plan_json(plan: Mapping[Partition, Sequence[int]]) -> str:
    return json.dumps(plan_document(plan))


def parse_plan(text: str, source: str = "the plan") -> Assignment:
    """A plan file's partitions and target replicas; PlanError listing every problem in
    it (malformed JSON, wrong types, negative or repeated partitions, empty or repeated
    replica lists). Log directories other than "any" are refused: replicas move between
    brokers, not between one broker's directories."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise PlanError(
            [f"{source} is not valid JSON (line {error.lineno}, column {error.colno}): {error.msg}"]
        ) from None
    if not isinstance(document, dict):
        raise PlanError([f'{source} must be a JSON object with a "partitions" list'])
    problems: list[str] = []
    version = document.get("version", PLAN_VERSION)
    if version != PLAN_VERSION:
        problems.append(f"{source}: version {version!r} is not supported (only {PLAN_VERSION})")
    entries = document.get("partitions")
    if not isinstance(entries, list):
        raise PlanError([*problems, f'{source} must have a "partitions" list'])
    if not entries:
        problems.append(f'{source}: the "partitions" list is empty')
    plan: Assignment = {}
    for index, entry in enumerate(entries):
        where = f"{source}: partitions[{index}]"
        if not isinstance(entry, dict):
            problems.append(f"{where} is not an object")
            continue
        topic, number, replicas = entry.get("topic"), entry.get("partition"), entry.get("replicas")
        entry_problems: list[str] = []
        if not isinstance(topic, str) or not topic:
            entry_problems.append(f'{where}: "topic" must be a non-empty string')
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            entry_problems.append(f'{where}: "partition" must be an integer >= 0, not {number!r}')
        if not isinstance(replicas, list) or not all(_is_int(b) and b >= 0 for b in replicas):
            entry_problems.append(f'{where}: "replicas" must be a list of broker ids >= 0')
        elif not replicas:
            entry_problems.append(f"{where}: the replica list is empty")
        elif len(set(replicas)) != len(replicas):
            repeated = sorted(b for b, n in Counter(replicas).items() if n > 1)
            entry_problems.append(f"{where}: broker(s) {repeated} appear more than once")
        log_dirs = entry.get("log_dirs")
        if log_dirs is not None and (
            not isinstance(log_dirs, list) or any(d != "any" for d in log_dirs)
        ):
            entry_problems.append(
                f'{where}: "log_dirs" other than "any" are not supported (replicas move '
                "between brokers, not between one broker's directories)"
            )
        if entry_problems:
            problems.extend(entry_problems)
            continue
        assert isinstance(topic, str) and isinstance(number, int) and isinstance(replicas, list)
        partition = Partition(topic, number)
        if partition in plan:
            problems.append(f"{where}: {partition} is listed more than once")
            continue
        plan[partition] = tuple(replicas)
    if problems:
        raise PlanError(problems)
    return plan


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_plan(
    plan: Mapping[Partition, Sequence[int]],
    partition_counts: Mapping[str, int],
    live_brokers: Iterable[int],
) -> None:
    """PlanError naming every partition of `plan` the cluster does not have and every
    broker in it that is not live (topics as `partition_counts`, from its metadata)."""
    live = set(live_brokers)
    problems: list[str] = []
    for partition, replicas in sorted(plan.items()):
        count = partition_counts.get(partition.topic)
        if count is None:
            problems.append(f"{partition}: no topic {partition.topic!r} in the cluster")
        elif partition.partition >= count:
            problems.append(f"{partition}: topic {partition.topic!r} has {count} partition(s)")
        unknown = sorted(set(replicas) - live)
        if unknown:
            problems.append(
                f"{partition}: broker(s) {unknown} are not live brokers of the cluster "
                f"(live: {sorted(live)})"
            )
        if not replicas:
            problems.append(f"{partition}: the replica list is empty")
        elif len(set(replicas)) != len(replicas):
            problems.append(f"{partition}: a broker appears more than once in {list(replicas)}")
    if problems:
        raise PlanError(problems)


def throttled_replicas(
    current: Mapping[Partition, Sequence[int]], plan: Mapping[Partition, Sequence[int]]
) -> dict[str, tuple[str, str]]:
    """Per topic, the values kafka-reassign-partitions gives
    ``leader.replication.throttled.replicas`` (every current replica of a moving
    partition, as ``partition:broker``) and ``follower.replication.throttled.replicas``
    (the replicas the move adds)."""
    leaders: dict[str, list[str]] = {}
    followers: dict[str, list[str]] = {}
    for partition, target in sorted(plan.items()):
        existing = list(current.get(partition, ()))
        if existing == list(target):
            continue
        leaders.setdefault(partition.topic, []).extend(
            f"{partition.partition}:{b}" for b in existing
        )
        followers.setdefault(partition.topic, []).extend(
            f"{partition.partition}:{b}" for b in target if b not in existing
        )
    return {
        topic: (",".join(leaders[topic]), ",".join(followers.get(topic, []))) for topic in leaders
    }
