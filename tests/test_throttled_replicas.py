"""The topic configs leader.replication.throttled.replicas and
follower.replication.throttled.replicas: Kafka's format (a list of partition:broker, or *),
kept as set, refused otherwise with INVALID_CONFIG naming the config."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.topic_config import (
    BROKER_DEFAULT_NAMES,
    CONFIG_NAMES,
    InvalidConfigError,
    LogConfig,
    ThrottledReplicas,
    throttled_replicas,
)

NAMES = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", ThrottledReplicas(False, frozenset())),
        ("*", ThrottledReplicas(True, frozenset())),
        (" * ", ThrottledReplicas(True, frozenset())),
        ("0:1", ThrottledReplicas(False, frozenset({(0, 1)}))),
        ("0:1, 1:2 ,,2:0", ThrottledReplicas(False, frozenset({(0, 1), (1, 2), (2, 0)}))),
        ("0:1,0:1", ThrottledReplicas(False, frozenset({(0, 1)}))),
    ],
)
def test_valid_lists_are_kept_as_set_and_read(value: str, expected: ThrottledReplicas) -> None:
    for name in NAMES:
        properties = LogConfig.from_properties({name: value}).to_properties()
        assert properties[name] == value
    assert throttled_replicas(value) == expected


@pytest.mark.parametrize(
    "value", ["0", "0:", ":1", "a:1", "0:b", "0-1", "1:2:3", "*,0:1", "**", "-1:0", "0:1;1:2"]
)
def test_bad_lists_are_refused_naming_the_config(value: str) -> None:
    for name in NAMES:
        with pytest.raises(InvalidConfigError) as refused:
            LogConfig.from_properties({name: value})
        message = str(refused.value)
        assert name in message and "[partitionId]:[brokerId]" in message


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)), max_size=20))
def test_any_list_of_pairs_reads_back(pairs: list[tuple[int, int]]) -> None:
    value = ",".join(f"{p}:{b}" for p, b in pairs)
    read = throttled_replicas(value)
    assert not read.every and read.pairs == frozenset(pairs)
    assert all(read.throttles(p, b) for p, b in pairs)


def test_they_are_topic_configs_with_no_broker_default() -> None:
    assert set(NAMES) <= CONFIG_NAMES
    assert not set(NAMES) & BROKER_DEFAULT_NAMES
    assert LogConfig().leader_replication_throttled_replicas == ""
