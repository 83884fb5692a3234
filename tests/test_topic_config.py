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
