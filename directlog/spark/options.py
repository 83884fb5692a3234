"""The options of the `directlog` Spark data source, under the names of Spark's Kafka
connector, checked on the driver before any job starts: a bad one is named in the error."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException

from directlog.client.common import RdmaConfig

EARLIEST = -2
LATEST = -1

_READ_KEYS = {
    "subscribe",
    "subscribepattern",
    "assign",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy",
    "endingtimestamp",
    "endingoffsetsbytimestamp",
    "failondataloss",
    "minpartitions",
    "maxoffsetspertrigger",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "includeheaders",
    "maxrecordsperpartition",
    "rdma.consume",
    "rdma.provider",
    "rdma.read.size",
}
_WRITE_KEYS = {"topic", "includeheaders", "rdma.produce", "rdma.provider"}
# What Spark itself passes to a source or sink: load(path) / save(path), and a streaming
# query's checkpoint and name.
_SPECIAL = {"path", "checkpointlocation", "queryname"}


class OptionError(ValueError):
    """An option the data source cannot take; the message names it."""


@dataclass(frozen=True)
class Subscription:
    """What to read: named topics, a pattern over topic names, or exact partitions."""

    topics: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None
    partitions: tuple[tuple[str, int], ...] = ()


# Per topic-partition offsets (-2 earliest, -1 latest) or timestamps (ms).
PartitionSpec = dict[tuple[str, int], int]


@dataclass(frozen=True)
class Bound:
    """A starting or ending point: one of "earliest"/"latest", per-partition offsets, a
    timestamp for every partition, or per-partition timestamps."""

    position: int | None = None  # EARLIEST or LATEST for every partition
    offsets: PartitionSpec | None = None
    timestamp: int | None = None
    timestamps: PartitionSpec | None = None


@dataclass(frozen=True)
class ReadOptions:
    client: dict[str, str]  # kafka.* options, for the Kafka clients
    subscription: Subscription
    starting: Bound
    ending: Bound
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    starting_by_timestamp_strategy: str = "error"  # or "latest"
    rdma: RdmaConfig | None = None  # rdma.consume=true: the tasks read over RDMA

    @property
    def bootstrap(self) -> str:
        return self.client["bootstrap.servers"]


@dataclass(frozen=True)
class WriteOptions:
    client: dict[str, str]
    topic: str | None = None


def read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """The read options, checked as Spark's Kafka source checks them."""
    lowered = _lowered(options)
    client = _client(lowered)
    _refuse_unknown(lowered, _READ_KEYS)
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if k in lowered]
    if len(chosen) != 1:
        raise OptionError(
            "exactly one of the options 'subscribe', 'subscribePattern' and 'assign' must "
            f"be given (got {len(chosen)})"
        )
    subscription = _subscription(chosen[0], lowered[chosen[0]])
    starting = _bound(lowered, "starting", default=LATEST if streaming else EARLIEST)
    if not streaming and starting.position == LATEST:
        raise OptionError("option 'startingOffsets' may not be 'latest' for batch queries")
    if not streaming and starting.offsets and LATEST in starting.offsets.values():
        raise OptionError("option 'startingOffsets' may not use -1 (latest) for batch queries")
    ending = _bound(lowered, "ending", default=LATEST)
    if streaming and any(k.startswith("ending") for k in lowered):
        raise OptionError("the 'ending*' options are for batch queries only")
    if ending.position == EARLIEST or (ending.offsets and EARLIEST in ending.offsets.values()):
        raise OptionError("option 'endingOffsets' may not be earliest (-2)")
    strategy = lowered.get("startingoffsetsbytimestampstrategy", "error").lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            f"option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', not "
            f"{strategy!r}"
        )
    rdma = _rdma(lowered)
    max_per_trigger = _positive(lowered, "maxoffsetspertrigger", "maxOffsetsPerTrigger")
    min_per_trigger = _positive(lowered, "minoffsetspertrigger", "minOffsetsPerTrigger")
    if max_per_trigger and min_per_trigger and min_per_trigger > max_per_trigger:
        raise OptionError("option 'minOffsetsPerTrigger' is above 'maxOffsetsPerTrigger'")
    return ReadOptions(
        client=client,
        subscription=subscription,
        starting=starting,
        ending=ending,
        fail_on_data_loss=_flag(lowered, "failondataloss", "failOnDataLoss", True),
        min_partitions=_positive(lowered, "minpartitions", "minPartitions"),
        max_records_per_partition=_positive(
            lowered, "maxrecordsperpartition", "maxRecordsPerPartition"
        ),
        include_headers=_flag(lowered, "includeheaders", "includeHeaders", False),
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=_duration_ms(lowered.get("maxtriggerdelay", "15m")),
        starting_by_timestamp_strategy=strategy,
        rdma=rdma if rdma.consume else None,
    )


def include_headers(options: Mapping[str, str]) -> bool:
    """The includeHeaders option alone: it decides the schema, batch or streaming."""
    return _flag(_lowered(options), "includeheaders", "includeHeaders", False)


def write_options(options: Mapping[str, str]) -> WriteOptions:
    lowered = _lowered(options)
    client = _client(lowered)
    _refuse_unknown(lowered, _WRITE_KEYS)
    _rdma(lowered)
    rdma = {k: v for k, v in lowered.items() if k.startswith("rdma.")}
    return WriteOptions(client={**client, **rdma}, topic=lowered.get("topic") or None)


def _rdma(lowered: dict[str, str]) -> RdmaConfig:
    """The rdma.* options, checked by the client code that takes them, so that a bad one
    fails before any task runs."""
    try:
        return RdmaConfig.take({k: v for k, v in lowered.items() if k.startswith("rdma.")})
    except KafkaException as error:
        raise OptionError(f"option {error.args[0]}") from None


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items() if v is not None}


def _client(lowered: dict[str, str]) -> dict[str, str]:
    client = {k[len("kafka.") :]: v for k, v in lowered.items() if k.startswith("kafka.")}
    if not client.get("bootstrap.servers"):
        raise OptionError("option 'kafka.bootstrap.servers' must be given")
    for key in ("group.id", "auto.offset.reset", "enable.auto.commit"):
        if key in client:  # as Spark's connector: offsets live in the query, not a group
            raise OptionError(f"option 'kafka.{key}' is not supported: offsets are the query's")
    protocol = client.get("security.protocol", "plaintext")
    if protocol.lower() != "plaintext":  # the readers fetch over plain TCP
        raise OptionError(f"option 'kafka.security.protocol' {protocol!r} is not supported yet")
    return client


def _refuse_unknown(lowered: dict[str, str], known: set[str]) -> None:
    for key in lowered:
        if key.startswith("kafka.") or key in known or key in _SPECIAL:
            continue
        raise OptionError(f"unknown option {key!r} for the directlog data source")


def _subscription(kind: str, raw: str) -> Subscription:
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise OptionError("option 'subscribe' names no topic")
        return Subscription(topics=topics)
    if kind == "subscribepattern":
        try:
            return Subscription(pattern=re.compile(raw))
        except re.error as error:
            raise OptionError(f"option 'subscribePattern' is not a pattern: {error}") from None
    parsed = _json(raw, "assign")
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError("option 'assign' must be JSON like {\"topic\": [0, 1]}")
    partitions = []
    for topic, numbers in parsed.items():
        if not isinstance(numbers, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers
        ):
            raise OptionError(f"option 'assign': partitions of {topic!r} must be a list of ints")
        partitions += [(topic, n) for n in numbers]
    return Subscription(partitions=tuple(sorted(set(partitions))))


def _bound(lowered: dict[str, str], side: str, default: int) -> Bound:
    """Spark's precedence: <side>Timestamp, then <side>OffsetsByTimestamp, then
    <side>Offsets."""
    name = {"starting": "startingTimestamp", "ending": "endingTimestamp"}[side]
    if f"{side}timestamp" in lowered:
        return Bound(timestamp=_int(lowered[f"{side}timestamp"], name, minimum=0))
    name = f"{side}OffsetsByTimestamp"
    if f"{side}offsetsbytimestamp" in lowered:
        return Bound(timestamps=_partition_spec(lowered[f"{side}offsetsbytimestamp"], name, 0))
    name = f"{side}Offsets"
    raw = lowered.get(f"{side}offsets")
    if raw is None:
        return Bound(position=default)
    if raw.strip().lower() in ("earliest", "latest"):
        return Bound(position=EARLIEST if raw.strip().lower() == "earliest" else LATEST)
    return Bound(offsets=_partition_spec(raw, name, EARLIEST))


def _partition_spec(raw: str, name: str, minimum: int) -> PartitionSpec:
    parsed = _json(raw, name)
    if not isinstance(parsed, dict):
        raise OptionError(f'option {name!r} must be JSON like {{"topic": {{"0": 23}}}}')
    spec: PartitionSpec = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"option {name!r}: {topic!r} must map partitions to numbers")
        for partition, value in partitions.items():
            try:
                number = int(partition)
            except ValueError:
                raise OptionError(f"option {name!r}: partition {partition!r} is no int") from None
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise OptionError(
                    f"option {name!r}: {topic}-{partition} has {value!r}, not an int >= {minimum}"
                )
            spec[(topic, number)] = value
    return spec


def _json(raw: str, name: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise OptionError(f"option {name!r} is not valid JSON: {error}") from None


def _int(raw: str, name: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name!r} must be >= {minimum}, not {value}")
    return value


def _positive(lowered: dict[str, str], key: str, name: str) -> int | None:
    return _int(lowered[key], name, minimum=1) if key in lowered else None


def _flag(lowered: dict[str, str], key: str, name: str, default: bool) -> bool:
    raw = lowered.get(key)
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise OptionError(f"option {name!r} must be true or false, not {raw!r}")
    return raw.strip().lower() == "true"


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(raw: str) -> int:
    """A duration as Spark writes them ("15m", "30s", "500ms"; a bare number is ms)."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if not match or match.group(2) not in ("", *_UNITS_MS):
        raise OptionError(f"option 'maxTriggerDelay' is not a duration: {raw!r}")
    return int(match.group(1)) * _UNITS_MS.get(match.group(2) or "ms", 1)
