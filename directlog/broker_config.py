"""Kafka's per-broker dynamic configs that Directlog supports: the replication throttle rates.

``kafka-configs --alter --entity-type brokers --entity-name 1`` and
``kafka-reassign-partitions --throttle`` set them with AlterConfigs or
IncrementalAlterConfigs of the broker resource named with the broker's id. Each is a long
of bytes per second, at least 0; a broker without one is not throttled (Kafka's default is
Long.MAX_VALUE). The controller validates and stores them; brokers apply them
(services/broker/replication_quota.py) and show them in DescribeConfigs.
"""

from __future__ import annotations

from collections.abc import Mapping

LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
BROKER_CONFIG_NAMES = frozenset({LEADER_RATE, FOLLOWER_RATE})
LONG_MAX = (1 << 63) - 1  # the value Kafka reports for a rate that is not set


class InvalidBrokerConfigError(ValueError):
    """A per-broker config that is not supported, or a bad value. Kafka: INVALID_CONFIG."""


def validate_broker_configs(configs: Mapping[str, str]) -> dict[str, str]:
    """``configs`` as they are to be stored: each one a supported name with a long >= 0,
    kept as written (Kafka reports a value as it was set)."""
    for name, raw in configs.items():
        if name not in BROKER_CONFIG_NAMES:
            raise InvalidBrokerConfigError(
                f"{name} is not a per-broker dynamic config here: only "
                f"{', '.join(sorted(BROKER_CONFIG_NAMES))} can be set on one broker"
            )
        try:
            value = int(raw.strip())
        except ValueError:
            raise InvalidBrokerConfigError(
                f"Invalid value {raw} for configuration {name}: Not a number of type LONG"
            ) from None
        if not 0 <= value <= LONG_MAX:
            raise InvalidBrokerConfigError(
                f"Invalid value {raw} for configuration {name}: Value must be at least 0"
                if value < 0
                else f"Invalid value {raw} for configuration {name}: Not a number of type LONG"
            )
    return dict(configs)


def throttle_rate(configs: Mapping[str, str], name: str) -> int | None:
    """The rate ``name`` in validated ``configs``; None when it is not set."""
    raw = configs.get(name)
    return None if raw is None else int(raw.strip())
