"""Streaming reads: micro-batches of offset ranges, whose offsets Spark keeps in the query's
checkpoint as {"topic": {"partition": next offset}} (the form of Spark's Kafka source), so no
consumer group is needed and a restarted query goes on exactly where it stopped."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from directlog.spark.fetch import DataLossError, range_reads, read_range
from directlog.spark.offsets import Brokers, OffsetRange, Partition, split
from directlog.spark.options import ReadOptions

Offsets = dict[str, dict[str, int]]


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """One streaming query's reader, on the driver (its `read` runs in the tasks)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._client: Brokers | None = None
        self._target: dict[Partition, int] | None = None  # Trigger.AvailableNow's end
        self._last_trigger = time.monotonic()

    def __getstate__(self) -> dict[str, object]:
        """Spark ships the reader to its tasks for `read`: without the driver's client."""
        return {**self.__dict__, "_client": None}

    @property
    def _brokers(self) -> Brokers:
        if self._client is None:
            self._client = Brokers(self.options.client)
        return self._client

    def initialOffset(self) -> Offsets:
        partitions = self._brokers.partitions(self.options.subscription)
        marks = self._brokers.watermarks(partitions)
        start = self._brokers.resolve(
            self.options.starting,
            partitions,
            marks,
            "starting",
            self.options.starting_by_timestamp_strategy,
        )
        return _encode(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        partitions = self._brokers.partitions(self.options.subscription)
        self._target = self._brokers.high_watermarks(partitions)

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        """Where the next micro-batch ends: every partition's high watermark (partitions
        new since `start` begin at their earliest offset), within the read limit, and not
        before minOffsetsPerTrigger records are there or maxTriggerDelay has passed."""
        begin = self._with_new_partitions(_decode(start))
        highs = self._brokers.high_watermarks(list(begin))
        end = {tp: max(begin[tp], high) for tp, high in highs.items()}
        if self._target is not None:
            end = {tp: min(o, self._target.get(tp, begin[tp])) for tp, o in end.items()}
        available = sum(end[tp] - begin[tp] for tp in end)
        if isinstance(limit, ReadMaxRows) and available > limit.max_rows:
            end = _rate_limited(begin, end, limit.max_rows)
        minimum = self.options.min_offsets_per_trigger
        if minimum and self._target is None and available < minimum:
            waited_ms = (time.monotonic() - self._last_trigger) * 1000
            if waited_ms < self.options.max_trigger_delay_ms:
                return _encode(begin)
        if end != begin:
            self._last_trigger = time.monotonic()
        return _encode(end)

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        """The ranges of one micro-batch, checked against the logs: offsets deleted before
        they were read fail the query with failOnDataLoss, and are skipped without."""
        begin = self._with_new_partitions(_decode(start))
        finish = _decode(end)
        starts = self._brokers.log_starts(list(finish))
        ranges = []
        for tp, last in finish.items():
            low = starts[tp]
            first = begin.get(tp, low)
            if first < low:
                if self.options.fail_on_data_loss:
                    raise DataLossError(
                        f"{tp[0]}-{tp[1]}: offsets {first} to {low - 1} were deleted "
                        "(retention or DeleteRecords) before the query read them; set "
                        "failOnDataLoss to false to skip them"
                    )
                first = min(low, last)
            ranges.append(OffsetRange(tp[0], tp[1], first, last))
        reads = range_reads(
            self.options,
            split(ranges, self.options.min_partitions, self.options.max_records_per_partition),
        )
        return [InputPartition(r) for r in reads]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_range(partition.value)

    def commit(self, end: Offsets) -> None:
        """Nothing to do: the offsets are in the checkpoint, not in a consumer group."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _with_new_partitions(self, offsets: dict[Partition, int]) -> dict[Partition, int]:
        """`offsets` and, at their earliest offset, partitions created since (as Spark's
        Kafka source starts them)."""
        partitions = self._brokers.partitions(self.options.subscription)
        new = [tp for tp in partitions if tp not in offsets]
        if not new:
            return offsets
        return {**offsets, **self._brokers.log_starts(new)}


def _rate_limited(
    begin: dict[Partition, int], end: dict[Partition, int], budget: int
) -> dict[Partition, int]:
    """Spark's rate limit: `budget` offsets shared among the partitions in proportion to
    how far behind each is (at least one for a partition that has any)."""
    lag = {tp: end[tp] - begin[tp] for tp in end}
    total = sum(lag.values())
    return {
        tp: begin[tp] + min(lag[tp], max(1, lag[tp] * budget // total) if lag[tp] else 0)
        for tp in end
    }


def _encode(offsets: dict[Partition, int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _decode(offsets: Offsets) -> dict[Partition, int]:
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in offsets.items()
        for partition, offset in partitions.items()
    }
