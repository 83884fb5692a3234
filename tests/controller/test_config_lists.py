"""IncrementalAlterConfigs' APPEND and SUBTRACT of list configs, as Kafka 3.7's
ConfigurationControlManager does them: from the stored override, else Kafka's built-in
default; values added when missing, removed once each; the result validated as a SET of it;
any other config INVALID_CONFIG in Kafka's words; the change all or nothing."""

from __future__ import annotations

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.topic_config import LIST_CONFIGS, LogConfig, altered_list
from tests.controller.clusters import commit, with_topic

FOLLOWERS = "follower.replication.throttled.replicas"


@pytest.mark.parametrize(
    ("name", "current", "values", "subtract", "result"),
    [
        ("cleanup.policy", None, "compact", False, "delete,compact"),  # from the default
        ("cleanup.policy", "compact", "delete,compact", False, "compact,delete"),
        ("cleanup.policy", "delete,compact", "delete", True, "compact"),
        ("cleanup.policy", None, "compact", True, "delete"),  # not there: nothing removed
        ("cleanup.policy", None, "delete", True, ""),
        (FOLLOWERS, None, "0:1,1:2", False, "0:1,1:2"),  # the default is the empty list
        (FOLLOWERS, "0:1,1:2", "1:2,2:3", False, "0:1,1:2,2:3"),
        (FOLLOWERS, "0:1,0:1,1:2", "0:1", True, "0:1,1:2"),  # the first occurrence
        (FOLLOWERS, "0:1,,1:2", "2:2,", False, "0:1,1:2,2:2"),  # empties dropped, Java split
        (FOLLOWERS, "", ",", False, ""),
        (FOLLOWERS, "0:1", " 0:1", False, "0:1, 0:1"),  # nothing trimmed
    ],
)
def test_altered_list(
    name: str, current: str | None, values: str, subtract: bool, result: str
) -> None:
    assert altered_list(name, current, values, subtract=subtract) == result


def test_list_configs_are_kafkas() -> None:
    assert {
        "cleanup.policy",
        "leader.replication.throttled.replicas",
        "follower.replication.throttled.replicas",
    } == LIST_CONFIGS
    assert LogConfig().to_properties().keys() >= LIST_CONFIGS


def lists(
    append: dict[str, str] | None = None, subtract: dict[str, str] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    return append or {}, subtract or {}


def test_append_and_subtract_a_topic_list() -> None:
    state, topic_id = with_topic([(1,)])
    commit(state, state.alter_configs("t", {}, [], lists=lists({"cleanup.policy": "compact"})))
    assert state.topics[topic_id].configs == {"cleanup.policy": "delete,compact"}
    change = state.alter_configs("t", {}, [], lists=lists(subtract={"cleanup.policy": "delete"}))
    commit(state, change)
    assert state.topics[topic_id].configs == {"cleanup.policy": "compact"}
    # Appending what is there changes nothing.
    assert state.alter_configs("t", {}, [], lists=lists({"cleanup.policy": "compact"})).ops == ()
    # With other operations of the same request, all at once.
    change = state.alter_configs(
        "t",
        {"retention.ms": "5"},
        ["cleanup.policy"],
        lists=lists({FOLLOWERS: "0:1"}, {"leader.replication.throttled.replicas": "0:2"}),
    )
    commit(state, change)
    assert state.topics[topic_id].configs == {
        "retention.ms": "5",
        FOLLOWERS: "0:1",
        "leader.replication.throttled.replicas": "",
    }


@pytest.mark.parametrize(
    ("append", "subtract", "code", "message"),
    [
        (
            {"retention.ms": "5"},
            {},
            ErrorCode.INVALID_CONFIG,
            "Can't APPEND to key retention.ms because its type is not LIST.",
        ),
        (
            {},
            {"min.insync.replicas": "2"},
            ErrorCode.INVALID_CONFIG,
            "Can't SUBTRACT to key min.insync.replicas because its type is not LIST.",
        ),
        ({"cleanup.policy": "compress"}, {}, ErrorCode.INVALID_CONFIG, "cleanup.policy"),
        ({FOLLOWERS: "x"}, {}, ErrorCode.INVALID_CONFIG, "partitionId"),
        # Subtracting every policy leaves an empty value, refused as setting it is.
        ({}, {"cleanup.policy": "delete"}, ErrorCode.INVALID_CONFIG, "cleanup.policy"),
        (
            {"cleanup.policy": "compact"},
            {"cleanup.policy": "delete"},
            ErrorCode.INVALID_REQUEST,
            "cleanup.policy",
        ),
    ],
)
def test_bad_list_changes_change_nothing(
    append: dict[str, str], subtract: dict[str, str], code: ErrorCode, message: str
) -> None:
    state, topic_id = with_topic([(1,)], configs={"segment.ms": "9"})
    with pytest.raises(KafkaError) as refused:
        state.alter_configs("t", {"flush.ms": "7"}, [], lists=lists(append, subtract))
    assert ErrorCode(refused.value.code) is code
    assert message in str(refused.value)
    assert state.topics[topic_id].configs == {"segment.ms": "9"}


def test_list_changes_do_not_replace() -> None:
    state, _ = with_topic([(1,)])
    with pytest.raises(KafkaError) as refused:
        state.alter_configs("t", {}, [], replace_all=True, lists=lists({"cleanup.policy": "x"}))
    assert ErrorCode(refused.value.code) is ErrorCode.INVALID_REQUEST


def test_append_to_the_cluster_wide_default() -> None:
    """log.cleanup.policy on the broker resource "": from the stored default, else
    Kafka's; checked against every topic's overrides as a SET is."""
    state, _ = with_topic([(1,)])
    commit(state, state.alter_log_defaults({}, [], lists=lists({"cleanup.policy": "compact"})))
    assert state.log_defaults == {"cleanup.policy": "delete,compact"}
    change = state.alter_log_defaults({}, [], lists=lists(subtract={"cleanup.policy": "delete"}))
    commit(state, change)
    assert state.log_defaults == {"cleanup.policy": "compact"}
    for append, subtract in [
        ({"retention.ms": "1"}, {}),
        ({FOLLOWERS: "0:1"}, {}),  # a topic config with no broker default
        ({}, {"cleanup.policy": "compact"}),  # empty
    ]:
        with pytest.raises(KafkaError) as refused:
            state.alter_log_defaults({}, [], lists=lists(append, subtract))
        assert ErrorCode(refused.value.code) is ErrorCode.INVALID_CONFIG
    assert state.log_defaults == {"cleanup.policy": "compact"}
    # A topic whose overrides would not combine with the result refuses it too.
    state, _ = with_topic([(1,)], configs={"remote.storage.enable": "true"})
    with pytest.raises(KafkaError) as refused:
        state.alter_log_defaults({}, [], lists=lists({"cleanup.policy": "compact"}))
    assert ErrorCode(refused.value.code) is ErrorCode.INVALID_CONFIG
