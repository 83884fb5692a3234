"""Log settings under their Kafka property names."""

import pytest

from directlog.records.batch import TimestampType
from directlog.topic_config import InvalidConfigError, LogConfig


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
