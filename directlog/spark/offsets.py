"""Where a read starts and ends, resolved on the driver from the brokers (Metadata and
ListOffsets through confluent-kafka's AdminClient), as Spark's Kafka connector resolves its
options; and the offset ranges a batch read splits into tasks (minPartitions)."""

from __future__ import annotations

import itertools
import math
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from directlog.spark.options import EARLIEST, LATEST, Bound, OptionError, Subscription

TIMEOUT = 30.0
INTERNAL = "__consumer_offsets"
# What ListOffsets asks for (shared instances in confluent-kafka, whose getters are untyped).
EARLIEST_OFFSET: OffsetSpec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
LATEST_OFFSET: OffsetSpec = OffsetSpec.latest()  # type: ignore[no-untyped-call]

Partition = tuple[str, int]


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int  # exclusive

    @property
    def size(self) -> int:
        return self.end - self.start


def metadata_client(client: dict[str, str]) -> Consumer:
    """A confluent-kafka client for metadata and offset look-ups; its group is never
    joined nor committed to (a query keeps its own offsets)."""
    return Consumer({**client, "group.id": "directlog-spark", "enable.auto.commit": False})


class Brokers:
    """The driver's view of the cluster, over one confluent-kafka AdminClient. Offsets are
    asked of all the partitions at once, one ListOffsets request to each leader (as Spark's
    Kafka connector asks its Admin): a streaming query asks on every poll for new records,
    every 10 ms or so while idle."""

    def __init__(self, client: dict[str, str]) -> None:
        self._admin: AdminClient | None = AdminClient({**client})

    def close(self) -> None:
        """An AdminClient has no close(): its last reference going ends it."""
        self._admin = None

    @property
    def _client(self) -> AdminClient:
        assert self._admin is not None, "Brokers used after close()"
        return self._admin

    def __enter__(self) -> Brokers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partitions(self, subscription: Subscription) -> list[Partition]:
        """The partitions the subscription reads now; a topic or partition it names that
        does not exist is an OptionError."""
        topics = self._client.list_topics(timeout=TIMEOUT).topics
        if subscription.pattern is not None:
            # Spark's rule: the pattern is found anywhere in the name.
            names = [t for t in topics if t != INTERNAL and subscription.pattern.search(t)]
        else:
            names = list(subscription.topics or {t for t, _ in subscription.partitions})
            for name in names:
                if name not in topics or topics[name].error is not None:
                    kind = "subscribe" if subscription.topics else "assign"
                    raise OptionError(f"option {kind!r}: topic {name!r} does not exist")
        found = sorted((name, p) for name in names for p in topics[name].partitions)
        if subscription.partitions:
            missing = set(subscription.partitions) - set(found)
            if missing:
                raise OptionError(f"option 'assign': no partitions {sorted(missing)}")
            return list(subscription.partitions)
        return found

    def watermarks(self, partitions: list[Partition]) -> dict[Partition, tuple[int, int]]:
        """(log start, high watermark) of each partition: both requests go out together."""
        starts = self._ask({tp: EARLIEST_OFFSET for tp in partitions})
        ends = self._ask({tp: LATEST_OFFSET for tp in partitions})
        return {tp: (_offset(starts[tp]), _offset(ends[tp])) for tp in partitions}

    def log_starts(self, partitions: list[Partition]) -> dict[Partition, int]:
        return _offsets(self._ask({tp: EARLIEST_OFFSET for tp in partitions}))

    def high_watermarks(self, partitions: list[Partition]) -> dict[Partition, int]:
        return _offsets(self._ask({tp: LATEST_OFFSET for tp in partitions}))

    def offsets_for_times(self, wanted: dict[Partition, int]) -> dict[Partition, int]:
        """The first offset at or after each timestamp (ms); -1 where none is."""
        return _offsets(self._ask({tp: OffsetSpec.for_timestamp(ts) for tp, ts in wanted.items()}))

    def _ask(self, specs: dict[Partition, OffsetSpec]) -> dict[Partition, Future[Any]]:
        """One ListOffsets request to each leader of the partitions in `specs`."""
        if not specs:
            return {}
        futures = self._client.list_offsets(
            {TopicPartition(t, p): spec for (t, p), spec in specs.items()},
            request_timeout=TIMEOUT,
        )
        return {(tp.topic, tp.partition): future for tp, future in futures.items()}

    def resolve(
        self,
        bound: Bound,
        partitions: list[Partition],
        marks: dict[Partition, tuple[int, int]],
        side: str,
        strategy: str = "error",
    ) -> dict[Partition, int]:
        """`bound` as an absolute offset for each partition. `side`: "starting" or
        "ending", to name the option in errors."""
        if bound.position is not None:
            return {tp: marks[tp][0 if bound.position == EARLIEST else 1] for tp in partitions}
        if bound.offsets is not None:
            spec = _covering(bound.offsets, partitions, f"{side}Offsets")
            return {
                tp: marks[tp][0] if o == EARLIEST else marks[tp][1] if o == LATEST else o
                for tp, o in spec.items()
            }
        if bound.timestamp is not None:
            times = {tp: bound.timestamp for tp in partitions}
            name = f"{side}Timestamp"
        else:
            assert bound.timestamps is not None
            name = f"{side}OffsetsByTimestamp"
            times = _covering(bound.timestamps, partitions, name)
        found = self.offsets_for_times(times)
        out = {}
        for tp in partitions:
            offset = found.get(tp, -1)
            if offset < 0:  # no record at or after the timestamp
                if side == "starting" and strategy == "error":
                    raise OptionError(
                        f"option {name!r}: {tp[0]}-{tp[1]} has no record at or after "
                        f"timestamp {times[tp]} (startingOffsetsByTimestampStrategy=latest "
                        "starts such partitions at their end)"
                    )
                offset = marks[tp][1]
            out[tp] = offset
        return out


def batch_ranges(
    brokers: Brokers,
    partitions: list[Partition],
    starting: Bound,
    ending: Bound,
    strategy: str,
    fail_on_data_loss: bool,
) -> list[OffsetRange]:
    """The offset range of each partition a batch read covers, checked against the logs."""
    marks = brokers.watermarks(partitions)
    start = brokers.resolve(starting, partitions, marks, "starting", strategy)
    end = brokers.resolve(ending, partitions, marks, "ending")
    ranges = []
    for tp in partitions:
        low, high = marks[tp]
        first, last = start[tp], end[tp]
        if first < low:
            if fail_on_data_loss:
                raise OptionError(
                    f"option 'startingOffsets': offsets {first} to {low - 1} of {tp[0]}-{tp[1]} "
                    "were deleted (retention or DeleteRecords); set failOnDataLoss to false "
                    "to start at the earliest offset left"
                )
            first = low
        for offset, name in ((first, "startingOffsets"), (last, "endingOffsets")):
            if offset > high:
                raise OptionError(
                    f"option {name!r}: offset {offset} of {tp[0]}-{tp[1]} is beyond the log "
                    f"end {high}"
                )
        if last < first:
            raise OptionError(
                f"option 'endingOffsets': {tp[0]}-{tp[1]} would end at {last}, before its "
                f"start {first}"
            )
        ranges.append(OffsetRange(tp[0], tp[1], first, last))
    return ranges


def split(
    ranges: list[OffsetRange], min_partitions: int | None, max_records: int | None = None
) -> list[OffsetRange]:
    """Spark's rules: with minPartitions above the number of ranges, each range is cut into
    pieces in proportion to its share of all the offsets, so every task reads about as
    much; with maxRecordsPerPartition, no piece holds more offsets than that."""
    ranges = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        parts = 1
        if min_partitions and min_partitions > len(ranges):
            parts = max(1, math.ceil(r.size * min_partitions / total))
        if max_records:
            parts = max(parts, math.ceil(r.size / max_records))
        bounds = [r.start + r.size * i // parts for i in range(parts + 1)]
        out += [OffsetRange(r.topic, r.partition, a, b) for a, b in itertools.pairwise(bounds)]
    return out


def _offset(answer: Future[Any]) -> int:
    """The offset of a ListOffsets answer (its request timeout bounds the wait)."""
    return int(answer.result().offset)


def _offsets(answers: dict[Partition, Future[Any]]) -> dict[Partition, int]:
    return {tp: _offset(answer) for tp, answer in answers.items()}


def _covering(
    spec: dict[Partition, int], partitions: list[Partition], name: str
) -> dict[Partition, int]:
    """`spec` checked to name exactly the partitions read."""
    unknown = set(spec) - set(partitions)
    if unknown:
        raise OptionError(f"option {name!r} names partitions not read: {sorted(unknown)}")
    missing = set(partitions) - set(spec)
    if missing:
        raise OptionError(f"option {name!r} leaves out partitions read: {sorted(missing)}")
    return {tp: spec[tp] for tp in partitions}
