"""Kafka's dynamic broker configs that Directlog supports: the replication throttle rates,
and one broker's defaults of topic configs.

``kafka-configs --alter --entity-type brokers --entity-name 1`` and
``kafka-reassign-partitions --throttle`` set them with AlterConfigs or
IncrementalAlterConfigs of the broker resource named with the broker's id;
``--entity-default`` (the resource "") sets the rates for every broker without its own. Each
rate is a long of bytes per second, at least 0; a broker without one is not throttled
(Kafka's default is Long.MAX_VALUE). Brokers apply them (services/broker/replication_quota.py).

A topic config's default under its broker name (``log.retention.ms``, ``message.max.bytes``:
topic_config.default_name) set on one broker holds for the partitions that broker hosts,
over the cluster-wide default and under a topic's own override, as in Kafka. The controller
validates and stores all of them; brokers show them in DescribeConfigs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from directlog.topic_config import DEFAULT_NAMES, InvalidConfigError, LogConfig

# The broker id the cluster-wide dynamic broker configs (Kafka's default entity, the broker
# resource "": --entity-default) are stored and streamed under; a broker's own override them.
CLUSTER_DEFAULT = -1
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
BROKER_CONFIG_NAMES = frozenset({LEADER_RATE, FOLLOWER_RATE})
LONG_MAX = (1 << 63) - 1  # the value Kafka reports for a rate that is not set


# Kafka's static broker configs (read-only: a restart with another value changes them) that a
# Directlog broker has a setting for: Kafka name -> BrokerSettings field. DescribeConfigs of a
# broker lists them, with source STATIC_BROKER_CONFIG when the setting was given.
STATIC_CONFIGS = {
    "broker.id": "node_id",
    "node.id": "node_id",
    "broker.rack": "rack",
    "auto.create.topics.enable": "auto_create_topics",
    "socket.request.max.bytes": "socket_request_max_bytes",
    "replica.lag.time.max.ms": "replica_lag_time_max_ms",
    "replica.fetch.wait.max.ms": "replica_fetch_wait_max_ms",
    "replica.fetch.max.bytes": "replica_fetch_max_bytes",
    "replica.fetch.backoff.ms": "replica_fetch_backoff_ms",
    "offsets.topic.num.partitions": "offsets_topic_num_partitions",
    "offsets.topic.replication.factor": "offsets_topic_replication_factor",
    "offsets.topic.segment.bytes": "offsets_topic_segment_bytes",
    "offsets.commit.timeout.ms": "offsets_commit_timeout_ms",
    "offset.metadata.max.bytes": "offset_metadata_max_bytes",
    "offsets.retention.check.interval.ms": "offsets_retention_check_interval_ms",
    "group.initial.rebalance.delay.ms": "group_initial_rebalance_delay_ms",
    "group.min.session.timeout.ms": "group_min_session_timeout_ms",
    "group.max.session.timeout.ms": "group_max_session_timeout_ms",
    "group.max.size": "group_max_size",
    "remote.log.storage.system.enable": "remote_log_storage_system_enable",
    "connections.max.reauth.ms": "connections_max_reauth_ms",
    "transaction.partition.verification.enable": "transaction_partition_verification_enable",
}
# Other Kafka configs no dynamic update may touch (DynamicConfig.Broker.nonDynamicProps).
_OTHER_STATIC = frozenset(
    {
        "log.dir",
        "log.dirs",
        "process.roles",
        "controller.quorum.voters",
        "controller.listener.names",
        "inter.broker.protocol.version",
        "inter.broker.listener.name",
        "zookeeper.connect",
        "num.partitions",
        "default.replication.factor",
        "delete.topic.enable",
        "offsets.retention.minutes",
    }
)
STATIC_NAMES = frozenset(STATIC_CONFIGS) | _OTHER_STATIC


def static_refusal(names: Iterable[str]) -> str | None:
    """Kafka's refusal of a dynamic update naming static configs (INVALID_REQUEST, from
    DynamicBrokerConfig.validateConfigs, the names as a Scala Set), or None."""
    fixed = sorted(set(names) & STATIC_NAMES)
    if not fixed:
        return None
    return f"Cannot update these configs dynamically: Set({', '.join(fixed)})"


class InvalidBrokerConfigError(ValueError):
    """A per-broker config that is not supported, or a bad value. Kafka: INVALID_CONFIG."""


def validate_broker_configs(configs: Mapping[str, str]) -> dict[str, str]:
    """``configs`` as they are to be stored: each one a rate, a long >= 0, or a topic
    config's default valid as that topic config, kept as written (Kafka reports a value as
    it was set)."""
    for name, raw in configs.items():
        if name in DEFAULT_NAMES:
            try:
                LogConfig.from_properties({DEFAULT_NAMES[name]: raw})
            except InvalidConfigError as exc:
                raise InvalidBrokerConfigError(
                    f"Invalid value {raw} for configuration {name}: {exc}"
                ) from None
            continue
        if name not in BROKER_CONFIG_NAMES:
            raise InvalidBrokerConfigError(
                f"{name} is not a per-broker dynamic config here: only the defaults of topic "
                f"configs and {', '.join(sorted(BROKER_CONFIG_NAMES))} can be set on one broker"
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


def log_overrides(configs: Mapping[str, str]) -> dict[str, str]:
    """The topic-config defaults among a broker's validated ``configs``, by topic config
    name (``log.retention.ms`` -> ``retention.ms``)."""
    return {DEFAULT_NAMES[k]: v for k, v in configs.items() if k in DEFAULT_NAMES}


def throttle_rate(configs: Mapping[str, str], name: str) -> int | None:
    """The rate ``name`` in validated ``configs``; None when it is not set."""
    raw = configs.get(name)
    return None if raw is None else int(raw.strip())
