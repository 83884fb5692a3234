"""Topic settings, under Kafka's topic config names and defaults.

Brokers apply them to partition logs and replication; the controller validates them when a
topic is created or altered. Both read and write them as Kafka properties (CreateTopics,
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs), so one table lists each name, its
field, type and bounds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from directlog.records.batch import TimestampType
from directlog.records.compression import Compression


class InvalidConfigError(ValueError):
    """A topic config value of the wrong type or range. Kafka: INVALID_CONFIG."""


LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1
# Kafka's lowest segment.bytes: a magic 0 message's overhead (no batch fits a segment that
# small, so every produce to it is refused, as in Kafka).
LEGACY_RECORD_OVERHEAD = 14
DAY_MS = 24 * 60 * 60 * 1000
FOLLOW_RETENTION = -2  # local.retention.*: the value of retention.*

CLEANUP_POLICIES = ("compact", "delete")

# compression.type: "producer" keeps each batch as its producer compressed it; any other
# makes the leader recompress batches in another codec (Kafka's BrokerCompressionType).
PRODUCER_COMPRESSION = "producer"
COMPRESSION_TYPES = {
    "uncompressed": Compression.NONE,
    "zstd": Compression.ZSTD,
    "lz4": Compression.LZ4,
    "snappy": Compression.SNAPPY,
    "gzip": Compression.GZIP,
}

_TIMESTAMP_TYPES = {
    "CreateTime": TimestampType.CREATE_TIME,
    "LogAppendTime": TimestampType.LOG_APPEND_TIME,
}


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * DAY_MS
    segment_jitter_ms: int = 0  # see roll_jitter_ms
    segment_index_bytes: int = 10 << 20
    index_interval_bytes: int = 4096
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    retention_ms: int = 7 * DAY_MS  # the paper's 7-day SLA; -1 keeps data forever
    retention_bytes: int = -1
    max_message_bytes: int = 1048588
    preallocate: bool = False
    compression_type: str = PRODUCER_COMPRESSION
    message_timestamp_type: TimestampType = TimestampType.CREATE_TIME
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = LONG_MAX
    # Deprecated in Kafka 3.6: the bound both ways, where before/after are left at their
    # defaults (see timestamp_before_max_ms).
    message_timestamp_difference_max_ms: int = LONG_MAX
    # Deprecated; Kafka 3.x ignores it (its inter-broker protocol is 3.0 or later), so does
    # Directlog, which stores the v2 format only. Validated and reported as Kafka does.
    message_format_version: str = "3.0-IV1"
    # Kafka keeps deleted segments this long renamed *.deleted; Directlog unlinks them at
    # once (readers hold open files), so it is accepted and reported only.
    file_delete_delay_ms: int = 60000
    min_insync_replicas: int = 1  # acks=-1 needs this many in-sync replicas
    unclean_leader_election_enable: bool = False  # a replica outside the ISR may lead
    cleanup_policy: str = "delete"  # "delete", "compact", or both comma-separated
    min_cleanable_dirty_ratio: float = 0.5
    delete_retention_ms: int = DAY_MS  # how long a tombstone outlives its key's last value
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    # Tiered storage (KIP-405, docs/tiering.md): closed segments are copied to the remote
    # store, and local segments go once copied and past the local retention (-2: follow
    # retention.ms / retention.bytes).
    remote_storage_enable: bool = False
    local_retention_ms: int = FOLLOW_RETENTION
    local_retention_bytes: int = FOLLOW_RETENTION
    remote_log_copy_disable: bool = False  # keep what is remote, copy nothing more
    remote_log_delete_on_disable: bool = False  # remote.storage.enable=false deletes it
    # Whether consumers older than the v2 record format (Fetch v0-3) are served, converted.
    message_downconversion_enable: bool = True
    # Replication throttles (kafka-reassign-partitions --throttle): the replicas whose
    # replication the brokers' leader / follower throttle rates limit, as Kafka writes them
    # ("partition:broker,..." or "*"), kept as set. ``throttled_replicas`` reads them.
    leader_replication_throttled_replicas: str = ""
    follower_replication_throttled_replicas: str = ""

    @property
    def compact(self) -> bool:
        """Whether the log cleaner keeps only the latest record of each key."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete_by_retention(self) -> bool:
        """Whether retention.ms and retention.bytes delete old segments."""
        return "delete" in self.cleanup_policy.split(",")

    def roll_jitter_ms(self, partition: object, base_offset: int) -> int:
        """How much sooner than segment.ms the segment at ``base_offset`` of ``partition``
        (its directory) rolls: Kafka draws it at random below min(segment.jitter.ms,
        segment.ms) per segment, so partitions created together do not all roll at once;
        here it is a hash of the two, spread the same way and stable across restarts."""
        if self.segment_jitter_ms == 0:
            return 0
        key = f"{partition}:{base_offset}".encode()
        return zlib.crc32(key) % min(self.segment_jitter_ms, self.segment_ms)

    @property
    def target_compression(self) -> Compression | None:
        """The codec the leader stores produced batches in; None keeps the producer's."""
        return COMPRESSION_TYPES.get(self.compression_type)

    @property
    def timestamp_before_max_ms(self) -> int:
        """How far before the broker's clock a CreateTime timestamp may lie: Kafka 3.7 takes
        message.timestamp.difference.max.ms while before.max.ms keeps its default."""
        if self.message_timestamp_before_max_ms != LONG_MAX:
            return self.message_timestamp_before_max_ms
        return self.message_timestamp_difference_max_ms

    @property
    def timestamp_after_max_ms(self) -> int:
        """How far after the broker's clock a CreateTime timestamp may lie (as above)."""
        if self.message_timestamp_after_max_ms != LONG_MAX:
            return self.message_timestamp_after_max_ms
        return self.message_timestamp_difference_max_ms

    @property
    def effective_local_retention_ms(self) -> int:
        """How long local segments stay once copied (-1: kept)."""
        if self.local_retention_ms == FOLLOW_RETENTION:
            return self.retention_ms
        return self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        """How many bytes of copied segments a replica keeps locally (-1: no limit)."""
        if self.local_retention_bytes == FOLLOW_RETENTION:
            return self.retention_bytes
        return self.local_retention_bytes

    @classmethod
    def from_properties(
        cls, properties: Mapping[str, str], base: LogConfig | None = None
    ) -> LogConfig:
        """Apply Kafka-named properties over `base` (the defaults if None)."""
        changes: dict[str, Any] = {}
        for name, raw in properties.items():
            spec = _PROPERTIES.get(name)
            if spec is None:
                raise InvalidConfigError(f"unknown log config {name!r}")
            field_name, parse, minimum, maximum = spec
            try:
                value = parse(raw)
            except InvalidConfigError as exc:
                raise InvalidConfigError(
                    f"Invalid value {raw} for configuration {name}: {exc}"
                ) from None
            except (ValueError, KeyError) as exc:
                raise InvalidConfigError(f"{name}: cannot parse {raw!r}") from exc
            if minimum is not None and value < minimum:
                raise InvalidConfigError(f"{name}: {value} is below the minimum {minimum}")
            if maximum is not None and value > maximum:
                raise InvalidConfigError(f"{name}: {value} is above the maximum {maximum}")
            changes[field_name] = value
        config = dataclasses.replace(base or cls(), **changes)
        config._check_combination()
        return config

    def _check_combination(self) -> None:
        """The rules between settings Kafka's LogConfig.validate applies."""
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise InvalidConfigError(
                f"min.compaction.lag.ms {self.min_compaction_lag_ms} is above "
                f"max.compaction.lag.ms {self.max_compaction_lag_ms}"
            )
        if not self.remote_storage_enable:
            return
        if self.compact:
            raise InvalidConfigError("remote log storage is unsupported for compacted topics")
        for local, total, name in (
            (self.local_retention_ms, self.retention_ms, "ms"),
            (self.local_retention_bytes, self.retention_bytes, "bytes"),
        ):
            if total < 0 or local == FOLLOW_RETENTION:  # a negative total: no limit
                continue
            if local == -1:
                raise InvalidConfigError(
                    f"local.retention.{name} may not be -1 while retention.{name} is {total}"
                )
            if local > total:
                raise InvalidConfigError(
                    f"local.retention.{name} {local} is above retention.{name} {total}"
                )

    def to_properties(self) -> dict[str, str]:
        """Every setting under its Kafka name, as DescribeConfigs reports it."""
        out = {}
        for name, (field_name, *_) in _PROPERTIES.items():
            value = getattr(self, field_name)
            if isinstance(value, TimestampType):
                out[name] = next(k for k, v in _TIMESTAMP_TYPES.items() if v is value)
            elif isinstance(value, bool):
                out[name] = str(value).lower()
            else:
                out[name] = str(value)
        return out


ALL_REPLICAS = "*"  # a throttled replicas list that names every replica
_REPLICA = re.compile(r"[0-9]+:[0-9]+")  # partitionId:brokerId, ASCII digits as Kafka's


@dataclass(frozen=True, slots=True)
class ThrottledReplicas:
    """A ``*.replication.throttled.replicas`` value read: every replica, or the named
    (partition, broker) pairs."""

    every: bool
    pairs: frozenset[tuple[int, int]]

    def throttles(self, partition: int, broker: int) -> bool:
        """Whether the replica of ``partition`` on ``broker`` is throttled. Kafka reads the
        leader list on each broker for its own id (the replicas that send from there) and
        the follower list the same way (the replicas that fetch there)."""
        return self.every or (partition, broker) in self.pairs


@functools.lru_cache(maxsize=4096)
def throttled_replicas(value: str) -> ThrottledReplicas:
    """A valid ``*.replication.throttled.replicas`` value (from ``LogConfig``), read; cached,
    since the fetch path asks for every partition of every follower fetch."""
    return _parse_throttled_replicas(value)


def _parse_throttled_replicas(raw: str) -> ThrottledReplicas:
    """Kafka's ThrottledReplicaListValidator: a list (comma-separated, blanks around items
    ignored) of ``partitionId:brokerId``, empty items allowed, or the literal ``*``."""
    items = [item.strip() for item in raw.split(",")]
    if "".join(items) == ALL_REPLICAS:
        return ThrottledReplicas(True, frozenset())
    pairs = set()
    for item in items:
        if not item:
            continue
        if _REPLICA.fullmatch(item) is None:
            raise InvalidConfigError(
                "must be the literal '*' or a list of replicas in the following format: "
                "[partitionId]:[brokerId],[partitionId]:[brokerId],..."
            )
        partition, broker = item.split(":")
        pairs.add((int(partition), int(broker)))
    return ThrottledReplicas(False, frozenset(pairs))


def _check_throttled_replicas(raw: str) -> str:
    _parse_throttled_replicas(raw)
    return raw


def flag(properties: Mapping[str, str], name: str) -> bool:
    """One boolean config read alone from Kafka-named properties (true only when set to
    true), for a rule about it that must hold whatever the others say."""
    return properties.get(name, "").strip().lower() == "true"


def _parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(raw)
    return lowered == "true"


_INTEGER = re.compile(r"[+-]?[0-9]+")


def _integer(raw: str, maximum: int, kind: str) -> int:
    """Java's Integer/Long.parseLong of a trimmed value, as Kafka's ConfigDef parses INT
    and LONG configs."""
    text = raw.strip()
    if _INTEGER.fullmatch(text) is None:
        raise ValueError(raw)
    value = int(text)
    if not -maximum - 1 <= value <= maximum:
        raise InvalidConfigError(f"Not a number of type {kind}")
    return value


def _int(raw: str) -> int:
    return _integer(raw, INT_MAX, "INT")


def _long(raw: str) -> int:
    return _integer(raw, LONG_MAX, "LONG")


def _parse_compression_type(raw: str) -> str:
    value = raw.strip()
    if value != PRODUCER_COMPRESSION and value not in COMPRESSION_TYPES:
        raise InvalidConfigError(
            "String must be one of: " + ", ".join((*COMPRESSION_TYPES, PRODUCER_COMPRESSION))
        )
    return value


def _metadata_versions() -> frozenset[str]:
    """The names Kafka 3.7's MetadataVersion.fromVersionString knows: each version with its
    IV suffix, and each release alone (its latest production version)."""
    ivs = {"0.8.0": 0, "0.8.1": 0, "0.8.2": 0, "0.9.0": 0, "0.10.0": 2, "0.10.1": 3}
    ivs |= {"0.10.2": 1, "0.11.0": 3, "1.0": 1, "1.1": 1, "2.0": 2, "2.1": 3, "2.2": 2}
    ivs |= {"2.3": 2, "2.4": 2, "2.5": 1, "2.6": 1, "2.7": 3, "2.8": 2, "3.0": 2, "3.1": 1}
    ivs |= {"3.2": 1, "3.3": 4, "3.4": 1, "3.5": 3, "3.6": 3, "3.7": 5}
    names = set(ivs)
    for release, count in ivs.items():
        names.update(f"{release}-IV{n}" for n in range(count))
    names.add("3.8-IV0")  # not production in 3.7, so named with its IV only
    return frozenset(names)


_METADATA_VERSIONS = _metadata_versions()


def _parse_message_format_version(raw: str) -> str:
    """Kafka's MetadataVersionValidator: "3.7.1" reads as "3.7", "0.10.2.1" as "0.10.2"."""
    value = raw.strip()
    parts = value.split(".")
    kept = 3 if value.startswith("0.") else 2
    key = value if kept >= len(parts) else ".".join(parts[:kept])
    if key not in _METADATA_VERSIONS:
        raise InvalidConfigError(f"Version {value} is not a valid version")
    return value


def _parse_timestamp_type(raw: str) -> TimestampType:
    return _TIMESTAMP_TYPES[raw.strip()]


def _parse_cleanup_policy(raw: str) -> str:
    """A comma-separated list of distinct policies, kept in the order given (Kafka reports
    the value as it was set)."""
    policies = [policy.strip() for policy in raw.split(",")]
    if any(p not in CLEANUP_POLICIES for p in policies) or len(set(policies)) != len(policies):
        raise ValueError(raw)
    return ",".join(policies)


def _parse_ratio(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


# Kafka name -> (field, parser, lower bound or None, upper bound or None).
_PROPERTIES: dict[str, tuple[str, Any, float | None, float | None]] = {
    "segment.bytes": ("segment_bytes", _int, LEGACY_RECORD_OVERHEAD, None),
    "segment.ms": ("segment_ms", _long, 1, None),
    "segment.jitter.ms": ("segment_jitter_ms", _long, 0, None),
    "segment.index.bytes": ("segment_index_bytes", _int, 4, None),
    "index.interval.bytes": ("index_interval_bytes", _int, 0, None),
    "flush.messages": ("flush_messages", _long, 1, None),
    "flush.ms": ("flush_ms", _long, 0, None),
    "retention.ms": ("retention_ms", _long, -1, None),
    "retention.bytes": ("retention_bytes", _long, None, None),
    "max.message.bytes": ("max_message_bytes", _int, 0, None),
    "file.delete.delay.ms": ("file_delete_delay_ms", _long, 0, None),
    "preallocate": ("preallocate", _parse_bool, None, None),
    "compression.type": ("compression_type", _parse_compression_type, None, None),
    "message.format.version": (
        "message_format_version",
        _parse_message_format_version,
        None,
        None,
    ),
    "message.timestamp.type": ("message_timestamp_type", _parse_timestamp_type, None, None),
    "message.timestamp.difference.max.ms": (
        "message_timestamp_difference_max_ms",
        _long,
        0,
        None,
    ),
    "message.timestamp.before.max.ms": ("message_timestamp_before_max_ms", _long, 0, None),
    "message.timestamp.after.max.ms": ("message_timestamp_after_max_ms", _long, 0, None),
    "min.insync.replicas": ("min_insync_replicas", _int, 1, None),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", _parse_bool, None, None),
    "cleanup.policy": ("cleanup_policy", _parse_cleanup_policy, None, None),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", _parse_ratio, 0, 1),
    "delete.retention.ms": ("delete_retention_ms", _long, 0, None),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", _long, 0, None),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", _long, 1, None),
    "remote.storage.enable": ("remote_storage_enable", _parse_bool, None, None),
    "local.retention.ms": ("local_retention_ms", _long, FOLLOW_RETENTION, None),
    "local.retention.bytes": ("local_retention_bytes", _long, FOLLOW_RETENTION, None),
    "remote.log.copy.disable": ("remote_log_copy_disable", _parse_bool, None, None),
    "remote.log.delete.on.disable": ("remote_log_delete_on_disable", _parse_bool, None, None),
    "message.downconversion.enable": ("message_downconversion_enable", _parse_bool, None, None),
    "leader.replication.throttled.replicas": (
        "leader_replication_throttled_replicas",
        _check_throttled_replicas,
        None,
        None,
    ),
    "follower.replication.throttled.replicas": (
        "follower_replication_throttled_replicas",
        _check_throttled_replicas,
        None,
        None,
    ),
}
CONFIG_NAMES = frozenset(_PROPERTIES)  # every topic config, Kafka names
# Kafka's ConfigType ids, as DescribeConfigs v3+ reports a config's type.
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7
_TYPES = {
    _int: INT,
    _long: LONG,
    _parse_bool: BOOLEAN,
    _parse_ratio: DOUBLE,
    _parse_cleanup_policy: LIST,
    _check_throttled_replicas: LIST,
}


def config_type(name: str) -> int:
    """Topic config ``name``'s type as Kafka defines it (STRING for the enumerations)."""
    return _TYPES.get(_PROPERTIES[name][1], STRING)


# Topic configs a broker has no log.* default of (Kafka has no broker synonym for them): the
# throttled replicas name partitions of one topic.
TOPIC_ONLY_CONFIGS = frozenset(
    {"leader.replication.throttled.replicas", "follower.replication.throttled.replicas"}
)
BROKER_DEFAULT_NAMES = CONFIG_NAMES - TOPIC_ONLY_CONFIGS  # the ones with a cluster default
# The broker config holding a topic config's cluster-wide default where Kafka names it other
# than log.<topic config> (ServerTopicConfigSynonyms, the first synonym of each: the one
# Kafka lets a dynamic default set; its hours and minutes variants are static only).
_BROKER_SYNONYMS = {
    "compression.type": "compression.type",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "max.message.bytes": "message.max.bytes",
    "segment.ms": "log.roll.ms",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "segment.index.bytes": "log.index.size.max.bytes",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
}


def default_name(name: str) -> str:
    """The broker config holding topic config ``name``'s cluster-wide default, as a Kafka
    broker names it."""
    return _BROKER_SYNONYMS.get(name, "log." + name)


# Broker config name -> the topic config whose cluster-wide default it holds.
DEFAULT_NAMES = {default_name(name): name for name in BROKER_DEFAULT_NAMES}
# Kafka's LIST-typed topic configs: the ones IncrementalAlterConfigs' APPEND and SUBTRACT
# apply to (Kafka's broker configs of them, log.cleanup.policy here, too).
LIST_CONFIGS = frozenset(
    {
        "cleanup.policy",
        "leader.replication.throttled.replicas",
        "follower.replication.throttled.replicas",
    }
)


def altered_list(name: str, current: str | None, values: str, *, subtract: bool) -> str:
    """Kafka's APPEND (``subtract`` False) or SUBTRACT of ``values`` on the list config
    ``name`` whose override is ``current`` (None: none, so Kafka's built-in default, not the
    cluster-wide one, is the start, as ConfigurationControlManager.getParts takes it).

    As Kafka splits them: the current value at commas, empty items dropped; ``values`` as
    Java's String.split does (trailing empty items dropped), nothing trimmed. APPEND adds
    each value not there yet, in order; SUBTRACT removes each value's first occurrence. The
    result is to be validated as a SET of it would be."""
    assert name in LIST_CONFIGS, name
    if current is None:
        current = LogConfig().to_properties()[name]
    items = [item for item in current.split(",") if item]
    wanted = values.split(",")
    while "," in values and wanted and not wanted[-1]:
        wanted.pop()
    for value in wanted:
        if subtract:
            if value in items:
                items.remove(value)
        elif value not in items:
            items.append(value)
    return ",".join(items)
