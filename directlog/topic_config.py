"""Topic settings, under Kafka's topic config names and defaults.

Brokers apply them to partition logs and replication; the controller validates them when a
topic is created or altered. Both read and write them as Kafka properties (CreateTopics,
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs), so one table lists each name, its
field, type and bounds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from directlog.records.batch import HEADER_SIZE, TimestampType


class InvalidConfigError(ValueError):
    """A topic config value of the wrong type or range. Kafka: INVALID_CONFIG."""


LONG_MAX = (1 << 63) - 1
DAY_MS = 24 * 60 * 60 * 1000

CLEANUP_POLICIES = ("compact", "delete")

_TIMESTAMP_TYPES = {
    "CreateTime": TimestampType.CREATE_TIME,
    "LogAppendTime": TimestampType.LOG_APPEND_TIME,
}


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * DAY_MS
    segment_index_bytes: int = 10 << 20
    index_interval_bytes: int = 4096
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    retention_ms: int = 7 * DAY_MS  # the paper's 7-day SLA; -1 keeps data forever
    retention_bytes: int = -1
    max_message_bytes: int = 1048588
    preallocate: bool = False
    message_timestamp_type: TimestampType = TimestampType.CREATE_TIME
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = LONG_MAX
    min_insync_replicas: int = 1  # acks=-1 needs this many in-sync replicas
    unclean_leader_election_enable: bool = False  # a replica outside the ISR may lead
    cleanup_policy: str = "delete"  # "delete", "compact", or both comma-separated
    min_cleanable_dirty_ratio: float = 0.5
    delete_retention_ms: int = DAY_MS  # how long a tombstone outlives its key's last value
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX

    @property
    def compact(self) -> bool:
        """Whether the log cleaner keeps only the latest record of each key."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete_by_retention(self) -> bool:
        """Whether retention.ms and retention.bytes delete old segments."""
        return "delete" in self.cleanup_policy.split(",")

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
            except (ValueError, KeyError) as exc:
                raise InvalidConfigError(f"{name}: cannot parse {raw!r}") from exc
            if minimum is not None and value < minimum:
                raise InvalidConfigError(f"{name}: {value} is below the minimum {minimum}")
            if maximum is not None and value > maximum:
                raise InvalidConfigError(f"{name}: {value} is above the maximum {maximum}")
            changes[field_name] = value
        config = dataclasses.replace(base or cls(), **changes)
        if config.min_compaction_lag_ms > config.max_compaction_lag_ms:
            raise InvalidConfigError(
                f"min.compaction.lag.ms {config.min_compaction_lag_ms} is above "
                f"max.compaction.lag.ms {config.max_compaction_lag_ms}"
            )
        return config

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


def _parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(raw)
    return lowered == "true"


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
    "segment.bytes": ("segment_bytes", int, HEADER_SIZE, None),
    "segment.ms": ("segment_ms", int, 1, None),
    "segment.index.bytes": ("segment_index_bytes", int, 8, None),
    "index.interval.bytes": ("index_interval_bytes", int, 0, None),
    "flush.messages": ("flush_messages", int, 1, None),
    "flush.ms": ("flush_ms", int, 0, None),
    "retention.ms": ("retention_ms", int, -1, None),
    "retention.bytes": ("retention_bytes", int, -1, None),
    "max.message.bytes": ("max_message_bytes", int, 0, None),
    "preallocate": ("preallocate", _parse_bool, None, None),
    "message.timestamp.type": ("message_timestamp_type", _parse_timestamp_type, None, None),
    "message.timestamp.before.max.ms": ("message_timestamp_before_max_ms", int, 0, None),
    "message.timestamp.after.max.ms": ("message_timestamp_after_max_ms", int, 0, None),
    "min.insync.replicas": ("min_insync_replicas", int, 1, None),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", _parse_bool, None, None),
    "cleanup.policy": ("cleanup_policy", _parse_cleanup_policy, None, None),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", _parse_ratio, 0, 1),
    "delete.retention.ms": ("delete_retention_ms", int, 0, None),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", int, 0, None),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", int, 1, None),
}
