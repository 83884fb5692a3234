"""Where a batch read starts and ends, under each of the Kafka connector's options:
startingOffsets/endingOffsets (earliest, latest, per-partition JSON with -2 and -1),
startingTimestamp, startingOffsetsByTimestamp, endingTimestamp, endingOffsetsByTimestamp
(and their precedence), startingOffsetsByTimestampStrategy=latest, assign,
subscribePattern, a subscribe list, and minPartitions.

One topic, `slices`, holds records with known timestamps; every expected slice is computed
here from those timestamps, not asked of the broker. Each test reads all its cases in one
Spark job (frames.read_cases).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.e2e.broker import BrokerProcess
from tests.e2e.conftest import Clients
from tests.e2e.records import recent_base_timestamp
from tests.spark.frames import Record, load, read_cases, slice_of

pytestmark = pytest.mark.timeout(120)

COUNTS = (12, 15, 9)  # records in partitions 0, 1, 2
STEP_MS = 100  # record i of partition p is stamped base + STEP_MS * i + SKEW_MS * p
SKEW_MS = 7


@dataclass(frozen=True)
class Slices:
    topic: str
    base: int  # ms
    records: list[Record]

    def timestamp(self, partition: int, index: int) -> int:
        return self.base + STEP_MS * index + SKEW_MS * partition

    def at_or_after(self, partition: int, timestamp: int) -> int | None:
        """The first offset of `partition` stamped at or after `timestamp`; None if none."""
        for index in range(COUNTS[partition]):
            if self.timestamp(partition, index) >= timestamp:
                return index
        return None

    def ranges(
        self, starts: dict[int, int], ends: dict[int, int]
    ) -> dict[tuple[str, int], tuple[int, int]]:
        return {(self.topic, p): (starts[p], ends[p]) for p in range(len(COUNTS))}

    def everything(self) -> list[Record]:
        return sorted(self.records, key=lambda r: (r.topic, r.partition, r.offset))


def produce(
    bootstrap: str, topic: str, counts: tuple[int, ...], timestamp: Callable[[int, int], int]
) -> list[Record]:
    """`counts[p]` records in each partition p of a new topic, record i stamped
    timestamp(p, i); the records as a read returns them."""
    clients = Clients()
    clients.create_topic(bootstrap, topic, len(counts))
    records = [
        Record(topic, p, i, f"k-{p}-{i}".encode(), f"{topic}/{p}/{i}".encode(), timestamp(p, i), 0)
        for p, count in enumerate(counts)
        for i in range(count)
    ]
    reports = clients.produce_all(
        clients.producer(bootstrap),
        topic,
        [
            {"key": r.key, "value": r.value, "partition": r.partition, "timestamp": r.timestamp_ms}
            for r in records
        ],
    )
    assert sorted((m.partition(), m.offset(), m.value()) for e, m in reports if e is None) == [
        (r.partition, r.offset, r.value) for r in records
    ]
    return records


@pytest.fixture(scope="module")
def slices(module_broker: BrokerProcess) -> Iterator[Slices]:
    topic = "slices"
    base = recent_base_timestamp()
    records = produce(
        module_broker.bootstrap,
        topic,
        COUNTS,
        lambda p, i: base + STEP_MS * i + SKEW_MS * p,
    )
    yield Slices(topic, base, records)


def offsets(topic: str, by_partition: dict[int, int]) -> str:
    return json.dumps({topic: {str(p): o for p, o in by_partition.items()}})


def test_starting_and_ending_offsets(spark, module_broker, slices):
    t = slices.topic
    ends = dict(enumerate(COUNTS))
    cases = {
        "default": {"subscribe": t},
        "earliest-latest": {
            "subscribe": t,
            "startingOffsets": "earliest",
            "endingOffsets": "latest",
        },
        "json": {
            "subscribe": t,
            "startingOffsets": offsets(t, {0: 3, 1: -2, 2: 8}),
            "endingOffsets": offsets(t, {0: 10, 1: -1, 2: 8}),
        },
        "json-start": {"subscribe": t, "startingOffsets": offsets(t, {0: 12, 1: 0, 2: -2})},
        "json-end": {"subscribe": t, "endingOffsets": offsets(t, {0: 1, 1: 14, 2: -1})},
        "option-case": {
            "SUBSCRIBE": t,
            "startingoffsets": offsets(t, {0: 2, 1: 2, 2: 2}),
            "ENDINGOFFSETS": offsets(t, {0: 4, 1: 4, 2: 4}),
        },
    }
    got = read_cases(spark, module_broker.bootstrap, cases)

    everything = slices.everything()
    assert len(everything) == sum(COUNTS)
    assert got["default"] == everything
    assert got["earliest-latest"] == everything
    assert got["json"] == slice_of(
        everything, slices.ranges({0: 3, 1: 0, 2: 8}, {0: 10, 1: 15, 2: 8})
    )
    assert got["json-start"] == slice_of(everything, slices.ranges({0: 12, 1: 0, 2: 0}, ends))
    assert got["json-end"] == slice_of(
        everything, slices.ranges({0: 0, 1: 0, 2: 0}, {0: 1, 1: 14, 2: 9})
    )
    assert got["option-case"] == slice_of(
        everything, slices.ranges({0: 2, 1: 2, 2: 2}, {0: 4, 1: 4, 2: 4})
    )


def test_offsets_by_timestamp(spark, module_broker, slices):
    t, base = slices.topic, slices.base
    start = base + 503  # between records: partition 0 from 6, 1 and 2 from 5
    end = slices.timestamp(1, 8)  # exactly partition 1's record 8: it is left out
    late = base + 1050  # after partition 2's last record
    by_start = {0: base, 1: slices.timestamp(1, 11), 2: base + 214}
    by_end = {0: base + 10_000, 1: base + 1400, 2: base + 500}  # none in 0: its end
    never = {0: base + 10_000, 1: base + 1300, 2: base}
    cases = {
        "startingTimestamp": {"subscribe": t, "startingTimestamp": str(start)},
        "endingTimestamp": {"subscribe": t, "endingTimestamp": str(end)},
        "both-timestamps": {
            "subscribe": t,
            "startingTimestamp": str(start),
            "endingTimestamp": str(end),
        },
        "by-partition": {
            "subscribe": t,
            "startingOffsetsByTimestamp": offsets(t, by_start),
            "endingOffsetsByTimestamp": offsets(t, by_end),
        },
        # Spark's precedence: startingTimestamp, then startingOffsetsByTimestamp, then
        # startingOffsets.
        "precedence": {
            "subscribe": t,
            "startingTimestamp": str(start),
            "startingOffsetsByTimestamp": offsets(t, by_start),
            "startingOffsets": offsets(t, {0: 1, 1: 1, 2: 1}),
            "endingOffsetsByTimestamp": offsets(t, by_end),
            "endingOffsets": offsets(t, {0: 2, 1: 2, 2: 2}),
        },
        "strategy-latest": {
            "subscribe": t,
            "startingTimestamp": str(late),
            "startingOffsetsByTimestampStrategy": "latest",
        },
        "strategy-latest-by-partition": {
            "subscribe": t,
            "startingOffsetsByTimestamp": offsets(t, never),
            "startingOffsetsByTimestampStrategy": "LATEST",
        },
    }
    got = read_cases(spark, module_broker.bootstrap, cases)

    def first(partition: int, timestamp: int) -> int:
        """The offset a timestamp resolves to: its record's, or the end when none is."""
        found = slices.at_or_after(partition, timestamp)
        return COUNTS[partition] if found is None else found

    zero = dict.fromkeys(range(3), 0)
    ends = dict(enumerate(COUNTS))
    starts = {p: first(p, start) for p in range(3)}
    stops = {p: first(p, end) for p in range(3)}
    assert starts == {0: 6, 1: 5, 2: 5} and stops == {0: 9, 1: 8, 2: 8}
    everything = slices.everything()
    assert got["startingTimestamp"] == slice_of(everything, slices.ranges(starts, ends))
    assert got["endingTimestamp"] == slice_of(everything, slices.ranges(zero, stops))
    assert got["both-timestamps"] == slice_of(everything, slices.ranges(starts, stops))
    per_start = {p: first(p, by_start[p]) for p in range(3)}
    per_end = {p: first(p, by_end[p]) for p in range(3)}
    assert per_start == {0: 0, 1: 11, 2: 2} and per_end == {0: 12, 1: 14, 2: 5}
    assert got["by-partition"] == slice_of(everything, slices.ranges(per_start, per_end))
    assert got["precedence"] == slice_of(everything, slices.ranges(starts, per_end))
    late_starts = {p: first(p, late) for p in range(3)}
    assert late_starts == {0: 11, 1: 11, 2: 9}
    assert got["strategy-latest"] == slice_of(everything, slices.ranges(late_starts, ends))
    never_starts = {p: first(p, never[p]) for p in range(3)}
    assert never_starts == {0: 12, 1: 13, 2: 0}
    assert got["strategy-latest-by-partition"] == slice_of(
        everything, slices.ranges(never_starts, ends)
    )


def test_assign_subscribe_pattern_and_subscribe_list(spark, module_broker, slices):
    bootstrap, t = module_broker.bootstrap, slices.topic
    base = recent_base_timestamp()
    names = {name: f"pattern-{name}" for name in ("a", "b", "c")}
    others = {
        name: produce(bootstrap, topic, (4, 3), lambda p, i: base + i)
        for name, topic in names.items()
    }
    pattern = "pattern-[ab]"
    cases = {
        "assign": {"assign": json.dumps({t: [0, 2]})},
        "assign-offsets": {
            "assign": json.dumps({t: [2, 0]}),
            "startingOffsets": offsets(t, {0: 4, 2: 1}),
            "endingOffsets": offsets(t, {0: 6, 2: -1}),
        },
        "assign-two-topics": {"assign": json.dumps({names["a"]: [1], t: [1]})},
        "pattern": {"subscribePattern": pattern},
        # Spark's rule: the pattern may match anywhere in a name.
        "pattern-inside": {"subscribePattern": "ttern-[ab]"},
        "subscribe-list": {"subscribe": f" {names['a']} ,{names['b']},"},
    }
    got = read_cases(spark, bootstrap, cases)

    everything = slices.everything()

    def of(records: list[Record], *partitions: tuple[str, int]) -> list[Record]:
        return sorted(
            (r for r in records if (r.topic, r.partition) in partitions),
            key=lambda r: (r.topic, r.partition, r.offset),
        )

    assert got["assign"] == of(everything, (t, 0), (t, 2))
    assert got["assign-offsets"] == slice_of(everything, {(t, 0): (4, 6), (t, 2): (1, 9)})
    assert got["assign-two-topics"] == of(everything + others["a"], (names["a"], 1), (t, 1))
    ab = sorted(others["a"] + others["b"], key=lambda r: (r.topic, r.partition, r.offset))
    assert [n for n in names.values() if re.fullmatch(pattern, n)] == [names["a"], names["b"]]
    assert got["pattern"] == got["pattern-inside"] == ab
    assert got["subscribe-list"] == ab


def test_min_partitions_splits_the_read(spark, module_broker, slices):
    bootstrap, t = module_broker.bootstrap, slices.topic
    split = load(spark, bootstrap, {"subscribe": t, "minPartitions": "7"})
    assert split.rdd.getNumPartitions() >= 7
    # At or below the topic's partition count: one task per partition.
    assert (
        load(spark, bootstrap, {"subscribe": t, "minPartitions": "2"}).rdd.getNumPartitions() == 3
    )
    capped = load(spark, bootstrap, {"subscribe": t, "maxRecordsPerPartition": "4"})
    sizes = [len([r for r in slices.everything() if r.partition == p]) for p in range(3)]
    assert capped.rdd.getNumPartitions() == sum(-(-size // 4) for size in sizes)
    sliced = {
        "subscribe": t,
        "minPartitions": "5",
        "startingOffsets": offsets(t, {0: 10, 1: 1, 2: 0}),
    }
    assert load(spark, bootstrap, sliced).rdd.getNumPartitions() >= 5

    got = read_cases(
        spark,
        bootstrap,
        {
            "min7": {"subscribe": t, "minPartitions": "7"},
            "capped": {"subscribe": t, "maxRecordsPerPartition": "4"},
            "min2": {"subscribe": t, "minPartitions": "2"},
            "min-sliced": sliced,
            "min-above-offsets": {"subscribe": t, "minPartitions": "40"},
        },
    )

    everything = slices.everything()
    assert got["min7"] == got["capped"] == everything
    assert got["min2"] == everything
    assert got["min-above-offsets"] == everything
    assert got["min-sliced"] == slice_of(
        everything, slices.ranges({0: 10, 1: 1, 2: 0}, dict(enumerate(COUNTS)))
    )
