"""Log settings under their Kafka property names."""

import re

import pytest

from directlog.records.batch import TimestampType
from directlog.records.compression import Compression
from directlog.topic_config import (
    BROKER_DEFAULT_NAMES,
    CONFIG_NAMES,
    DEFAULT_NAMES,
    InvalidConfigError,
    LogConfig,
    config_type,
    default_name,
)


def test_defaults_match_kafka():
    config = LogConfig()
    assert config.segment_bytes == 1 << 30
    assert config.index_interval_bytes == 4096
    assert config.retention_ms == 7 * 24 * 3600 * 1000
    assert config.retention_bytes == -1
    assert config.message_timestamp_type is TimestampType.CREATE_TIME


def test_properties_override_a_base():
    base = LogConfig(retention_ms=1000)
    config = LogConfig.from_properties(
        {
            "segment.bytes": "1048576",
            "preallocate": "true",
            "message.timestamp.type": "LogAppendTime",
        },
        base,
    )
    assert config.segment_bytes == 1048576 and config.preallocate
    assert config.message_timestamp_type is TimestampType.LOG_APPEND_TIME
    assert config.retention_ms == 1000


def test_round_trip_through_properties():
    config = LogConfig(segment_ms=5, preallocate=True, retention_bytes=77)
    properties = config.to_properties()
    assert properties["segment.ms"] == "5" and properties["preallocate"] == "true"
    assert properties["message.timestamp.type"] == "CreateTime"
    assert LogConfig.from_properties(properties) == config


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("segment.bytes", "ten", "cannot parse"),
        ("segment.bytes", "12", "below the minimum"),
        ("retention.ms", "-2", "below the minimum"),
        ("preallocate", "yes", "cannot parse"),
        ("message.timestamp.type", "WallTime", "cannot parse"),
        ("no.such.setting", "1", "unknown"),
    ],
)
def test_bad_properties_are_refused(name, value, problem):
    with pytest.raises(InvalidConfigError, match=problem):
        LogConfig.from_properties({name: value})


def test_compaction_settings_default_to_kafkas():
    config = LogConfig()
    assert config.cleanup_policy == "delete" and not config.compact
    assert config.delete_by_retention
    assert config.min_cleanable_dirty_ratio == 0.5
    assert config.delete_retention_ms == 86_400_000
    assert config.min_compaction_lag_ms == 0
    assert config.max_compaction_lag_ms == (1 << 63) - 1


@pytest.mark.parametrize(
    ("policy", "compact", "delete"),
    [
        ("compact", True, False),
        ("delete", False, True),
        ("compact,delete", True, True),
        ("delete, compact", True, True),
    ],
)
def test_cleanup_policy_says_what_removes_old_data(policy, compact, delete):
    config = LogConfig.from_properties({"cleanup.policy": policy})
    assert (config.compact, config.delete_by_retention) == (compact, delete)
    assert config.to_properties()["cleanup.policy"] == policy.replace(" ", "")


def test_compaction_settings_round_trip_through_properties():
    config = LogConfig.from_properties(
        {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": "0.25",
            "delete.retention.ms": "1000",
            "min.compaction.lag.ms": "5",
            "max.compaction.lag.ms": "60000",
        }
    )
    assert (config.min_cleanable_dirty_ratio, config.delete_retention_ms) == (0.25, 1000)
    assert (config.min_compaction_lag_ms, config.max_compaction_lag_ms) == (5, 60000)
    assert config.to_properties()["min.cleanable.dirty.ratio"] == "0.25"
    assert LogConfig.from_properties(config.to_properties()) == config


@pytest.mark.parametrize(
    ("properties", "problem"),
    [
        ({"cleanup.policy": "compress"}, "cannot parse"),
        ({"cleanup.policy": ""}, "cannot parse"),
        ({"cleanup.policy": "compact,compact"}, "cannot parse"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "above the maximum"),
        ({"min.cleanable.dirty.ratio": "-0.1"}, "below the minimum"),
        ({"min.cleanable.dirty.ratio": "nan"}, "cannot parse"),
        ({"delete.retention.ms": "-1"}, "below the minimum"),
        ({"min.compaction.lag.ms": "-1"}, "below the minimum"),
        ({"max.compaction.lag.ms": "0"}, "below the minimum"),
        ({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}, "min.compaction.lag.ms"),
    ],
)
def test_bad_compaction_settings_are_refused(properties, problem):
    with pytest.raises(InvalidConfigError, match=problem):
        LogConfig.from_properties(properties)


def test_tiered_storage_settings_and_their_defaults():
    config = LogConfig.from_properties(
        {"remote.storage.enable": "true", "retention.ms": "86400000", "retention.bytes": "-1"}
    )
    assert config.remote_storage_enable and not config.remote_log_copy_disable
    assert config.local_retention_ms == config.local_retention_bytes == -2
    # -2 follows retention.*
    assert config.effective_local_retention_ms == 86_400_000
    assert config.effective_local_retention_bytes == -1
    config = LogConfig.from_properties(
        {
            "remote.storage.enable": "true",
            "local.retention.ms": "1000",
            "local.retention.bytes": "0",
        }
    )
    assert (config.effective_local_retention_ms, config.effective_local_retention_bytes) == (
        1000,
        0,
    )
    assert LogConfig.from_properties(config.to_properties()) == config


@pytest.mark.parametrize(
    ("properties", "problem"),
    [
        ({"cleanup.policy": "compact"}, "compacted"),
        ({"cleanup.policy": "compact,delete"}, "compacted"),
        (
            {"retention.ms": "1000", "local.retention.ms": "2000"},
            "local.retention.ms 2000 is above",
        ),
        ({"retention.ms": "1000", "local.retention.ms": "-1"}, "may not be -1"),
        ({"retention.bytes": "10", "local.retention.bytes": "11"}, "local.retention.bytes 11"),
        ({"retention.bytes": "10", "local.retention.bytes": "-1"}, "may not be -1"),
        ({"local.retention.ms": "-3"}, "below the minimum"),
    ],
)
def test_tiered_storage_combinations_kafka_refuses(properties, problem):
    with pytest.raises(InvalidConfigError, match=problem):
        LogConfig.from_properties({"remote.storage.enable": "true", **properties})


def test_the_combination_rules_hold_only_for_tiered_topics():
    plain = LogConfig.from_properties(
        {"cleanup.policy": "compact", "retention.ms": "1000", "local.retention.ms": "5000"}
    )
    assert plain.compact and not plain.remote_storage_enable
    # Unlimited total retention allows any local retention.
    LogConfig.from_properties({"remote.storage.enable": "true", "local.retention.ms": "5000"})


def test_every_kafka_3_7_topic_config_is_known_with_its_default():
    """Kafka 3.7's LogConfig names and defaults (remote.log.* are later Kafka's)."""
    kafka_3_7 = {
        "cleanup.policy": "delete",
        "compression.type": "producer",
        "delete.retention.ms": "86400000",
        "file.delete.delay.ms": "60000",
        "flush.messages": str((1 << 63) - 1),
        "flush.ms": str((1 << 63) - 1),
        "follower.replication.throttled.replicas": "",
        "index.interval.bytes": "4096",
        "leader.replication.throttled.replicas": "",
        "local.retention.bytes": "-2",
        "local.retention.ms": "-2",
        "max.compaction.lag.ms": str((1 << 63) - 1),
        "max.message.bytes": "1048588",
        "message.downconversion.enable": "true",
        "message.format.version": "3.0-IV1",
        "message.timestamp.after.max.ms": str((1 << 63) - 1),
        "message.timestamp.before.max.ms": str((1 << 63) - 1),
        "message.timestamp.difference.max.ms": str((1 << 63) - 1),
        "message.timestamp.type": "CreateTime",
        "min.cleanable.dirty.ratio": "0.5",
        "min.compaction.lag.ms": "0",
        "min.insync.replicas": "1",
        "preallocate": "false",
        "remote.storage.enable": "false",
        "retention.bytes": "-1",
        "retention.ms": "604800000",
        "segment.bytes": "1073741824",
        "segment.index.bytes": "10485760",
        "segment.jitter.ms": "0",
        "segment.ms": "604800000",
        "unclean.leader.election.enable": "false",
    }
    properties = LogConfig().to_properties()
    assert {name: properties[name] for name in kafka_3_7} == kafka_3_7


@pytest.mark.parametrize(
    ("name", "value", "field", "stored"),
    [
        ("compression.type", " zstd ", "compression_type", "zstd"),
        ("compression.type", "uncompressed", "compression_type", "uncompressed"),
        ("message.format.version", "0.10.2", "message_format_version", "0.10.2"),
        ("message.format.version", "2.8-IV1", "message_format_version", "2.8-IV1"),
        ("message.format.version", "3.7.1", "message_format_version", "3.7.1"),
        ("message.format.version", "0.10.0.1", "message_format_version", "0.10.0.1"),
        ("file.delete.delay.ms", "0", "file_delete_delay_ms", 0),
        ("segment.jitter.ms", "+5000", "segment_jitter_ms", 5000),
        ("message.timestamp.difference.max.ms", "100", "message_timestamp_difference_max_ms", 100),
        ("retention.bytes", "-7", "retention_bytes", -7),
    ],
)
def test_kafka_accepts_these_and_so_do_we(name, value, field, stored):
    config = LogConfig.from_properties({name: value})
    assert getattr(config, field) == stored
    assert LogConfig.from_properties(config.to_properties()) == config


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "compression.type",
            "brotli",
            "Invalid value brotli for configuration compression.type: String must be one "
            "of: uncompressed, zstd, lz4, snappy, gzip, producer",
        ),
        ("compression.type", "GZIP", "String must be one of"),
        (
            "message.format.version",
            "0.8",
            "Invalid value 0.8 for configuration message.format.version: "
            "Version 0.8 is not a valid version",
        ),
        ("message.format.version", "3.8", "Version 3.8 is not a valid version"),
        ("message.format.version", "3.7-IV5", "is not a valid version"),
        ("segment.jitter.ms", "-1", "below the minimum"),
        ("file.delete.delay.ms", "-1", "below the minimum"),
        ("message.timestamp.difference.max.ms", "-1", "below the minimum"),
        ("segment.bytes", "2147483648", "Not a number of type INT"),
        ("segment.ms", "9223372036854775808", "Not a number of type LONG"),
        ("segment.ms", "1_000", "cannot parse"),
        ("min.insync.replicas", "1.0", "cannot parse"),
    ],
)
def test_kafkas_refusals(name, value, message):
    with pytest.raises(InvalidConfigError, match=re.escape(message)):
        LogConfig.from_properties({name: value})


def test_compression_type_names_the_codec_the_leader_stores():
    assert LogConfig().target_compression is None
    assert LogConfig(compression_type="uncompressed").target_compression is Compression.NONE
    assert LogConfig(compression_type="lz4").target_compression is Compression.LZ4


def test_timestamp_difference_bounds_both_ways_until_before_or_after_is_set():
    """Kafka 3.7's transition rule for the deprecated message.timestamp.difference.max.ms."""
    config = LogConfig.from_properties({"message.timestamp.difference.max.ms": "100"})
    assert (config.timestamp_before_max_ms, config.timestamp_after_max_ms) == (100, 100)
    config = LogConfig.from_properties(
        {"message.timestamp.difference.max.ms": "100", "message.timestamp.after.max.ms": "5"}
    )
    assert (config.timestamp_before_max_ms, config.timestamp_after_max_ms) == (100, 5)
    assert LogConfig().timestamp_before_max_ms == (1 << 63) - 1


def test_each_config_has_kafkas_type():
    """Kafka's ConfigType ids: BOOLEAN 1, STRING 2, INT 3, LONG 5, DOUBLE 6, LIST 7."""
    types = {name: config_type(name) for name in CONFIG_NAMES}
    assert types["segment.bytes"] == types["max.message.bytes"] == 3
    assert types["segment.ms"] == types["file.delete.delay.ms"] == types["retention.bytes"] == 5
    assert types["compression.type"] == types["message.format.version"] == 2
    assert types["message.timestamp.type"] == 2
    assert types["preallocate"] == types["remote.storage.enable"] == 1
    assert types["min.cleanable.dirty.ratio"] == 6
    assert types["cleanup.policy"] == types["leader.replication.throttled.replicas"] == 7


def test_cluster_wide_defaults_go_by_kafkas_broker_names():
    assert default_name("compression.type") == "compression.type"
    assert default_name("min.insync.replicas") == "min.insync.replicas"
    assert default_name("unclean.leader.election.enable") == "unclean.leader.election.enable"
    assert default_name("retention.ms") == "log.retention.ms"
    assert default_name("segment.ms") == "log.roll.ms"
    assert default_name("segment.jitter.ms") == "log.roll.jitter.ms"
    assert default_name("max.message.bytes") == "message.max.bytes"
    assert default_name("min.cleanable.dirty.ratio") == "log.cleaner.min.cleanable.ratio"
    assert default_name("delete.retention.ms") == "log.cleaner.delete.retention.ms"
    assert default_name("file.delete.delay.ms") == "log.segment.delete.delay.ms"
    assert sorted(DEFAULT_NAMES.values()) == sorted(BROKER_DEFAULT_NAMES)
