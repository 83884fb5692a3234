"""Per-broker dynamic configs (AlterBrokerConfigs: Kafka's replication throttle rates set on
one broker) without a store: one znode per broker id, created with the first config and
deleted with the last, validated, carried in every metadata update and to the next
controller."""

from __future__ import annotations

import pytest

from directlog.broker_config import CLUSTER_DEFAULT, FOLLOWER_RATE, LEADER_RATE
from directlog.protocol.errors import ErrorCode, KafkaError
from services.controller import layout, messages
from services.controller.cluster import Change, ClusterState, Image
from services.controller.layout import Create, Delete, SetData
from tests.controller.clusters import PATHS, TIMEOUT, commit, with_topic

pytestmark = pytest.mark.timeout(30)


def configs_in_updates(state: ClusterState) -> dict[int, dict[str, str]]:
    update = messages.metadata_update(
        state, version=2, controller_id=1, controller_epoch=1, delta=None
    )
    return {c.broker_id: dict(c.configs) for c in update.broker_configs}


def test_a_brokers_rates_are_one_znode_and_reach_every_broker() -> None:
    state, _ = with_topic([(1,)])
    change = state.alter_broker_configs(1, {LEADER_RATE: "100000"}, [])
    data = b'{"configs":{"leader.replication.throttled.rate":"100000"}}'
    assert change.ops == (Create("/directlog/broker_configs/1", data),)
    assert change.touches_image
    assert state.broker_configs == {}  # nothing until it commits
    commit(state, change)
    assert state.broker_configs == {1: {LEADER_RATE: "100000"}}
    assert configs_in_updates(state) == {1: {LEADER_RATE: "100000"}}

    change = state.alter_broker_configs(1, {FOLLOWER_RATE: "5"}, [])
    assert isinstance(change.ops[0], SetData)
    commit(state, change)
    # An id that never registered may have configs too (Kafka keeps them apart).
    commit(state, state.alter_broker_configs(7, {FOLLOWER_RATE: "0"}, []))
    assert configs_in_updates(state) == {
        1: {LEADER_RATE: "100000", FOLLOWER_RATE: "5"},
        7: {FOLLOWER_RATE: "0"},
    }
    assert state.alter_broker_configs(1, {FOLLOWER_RATE: "5"}, []).ops == ()  # no change
    assert state.alter_broker_configs(3, {}, [LEADER_RATE]).ops == ()  # nothing to delete

    change = state.alter_broker_configs(1, {}, [LEADER_RATE, FOLLOWER_RATE])
    assert change.ops == (Delete("/directlog/broker_configs/1"),)
    commit(state, change)
    commit(state, state.alter_broker_configs(7, {LEADER_RATE: "9"}, [], replace_all=True))
    assert configs_in_updates(state) == {7: {LEADER_RATE: "9"}}


def test_the_cluster_wide_rates_are_the_default_entitys_znode() -> None:
    """Kafka's --entity-default: stored and streamed under CLUSTER_DEFAULT (-1)."""
    state, _ = with_topic([(1,)])
    change = state.alter_broker_configs(CLUSTER_DEFAULT, {FOLLOWER_RATE: "700"}, [])
    data = b'{"configs":{"follower.replication.throttled.rate":"700"}}'
    assert change.ops == (Create("/directlog/broker_configs/-1", data),)
    commit(state, change)
    commit(state, state.alter_broker_configs(1, {FOLLOWER_RATE: "5"}, []))
    assert configs_in_updates(state) == {-1: {FOLLOWER_RATE: "700"}, 1: {FOLLOWER_RATE: "5"}}
    with pytest.raises(KafkaError) as refused:
        state.alter_broker_configs(CLUSTER_DEFAULT, {"num.io.threads": "8"}, [])
    assert refused.value.code is ErrorCode.INVALID_CONFIG


@pytest.mark.parametrize(
    ("broker", "set_configs", "delete", "error", "named"),
    [
        (1, {LEADER_RATE: "abc"}, [], ErrorCode.INVALID_CONFIG, LEADER_RATE),
        (1, {LEADER_RATE: "-1"}, [], ErrorCode.INVALID_CONFIG, "at least 0"),
        (1, {FOLLOWER_RATE: "1.5"}, [], ErrorCode.INVALID_CONFIG, FOLLOWER_RATE),
        (1, {FOLLOWER_RATE: str(1 << 63)}, [], ErrorCode.INVALID_CONFIG, FOLLOWER_RATE),
        (1, {"log.retention.ms": "abc"}, [], ErrorCode.INVALID_CONFIG, "log.retention.ms"),
        (1, {"log.segment.ms": "1"}, [], ErrorCode.INVALID_CONFIG, "log.segment.ms"),
        (1, {"num.io.threads": "8"}, [], ErrorCode.INVALID_CONFIG, "num.io.threads"),
        (1, {LEADER_RATE: "1"}, [LEADER_RATE], ErrorCode.INVALID_REQUEST, LEADER_RATE),
        (-2, {LEADER_RATE: "1"}, [], ErrorCode.INVALID_REQUEST, "negative"),
    ],
)
def test_bad_broker_configs_are_refused_naming_them(
    broker: int, set_configs: dict[str, str], delete: list[str], error: ErrorCode, named: str
) -> None:
    state, _ = with_topic([(1,)])
    commit(state, state.alter_broker_configs(1, {LEADER_RATE: "10"}, []))
    with pytest.raises(KafkaError) as refused:
        state.alter_broker_configs(broker, set_configs, delete)
    assert refused.value.code is error and named in str(refused.value)
    assert state.broker_configs == {1: {LEADER_RATE: "10"}}


def test_a_brokers_defaults_of_topic_configs_are_checked_against_every_topic() -> None:
    """Kafka's per-broker log.* configs: stored with the rates under their broker names,
    refused when a topic's overrides would not combine with them."""
    state, _ = with_topic([(1,)])
    commit(state, state.alter_broker_configs(1, {"log.retention.ms": "60000"}, []))
    assert configs_in_updates(state) == {1: {"log.retention.ms": "60000"}}
    commit(state, state.alter_configs("t", {"min.compaction.lag.ms": "10"}, []))
    with pytest.raises(KafkaError) as refused:
        state.alter_broker_configs(1, {"log.cleaner.max.compaction.lag.ms": "5"}, [])
    assert refused.value.code is ErrorCode.INVALID_CONFIG and "'t'" in str(refused.value)
    assert state.broker_configs == {1: {"log.retention.ms": "60000"}}


def test_the_throttled_replicas_are_topic_configs_with_no_broker_default() -> None:
    state, _ = with_topic([(1,)])
    with pytest.raises(KafkaError) as refused:
        state.alter_log_defaults({"leader.replication.throttled.replicas": "*"}, [])
    assert refused.value.code is ErrorCode.INVALID_CONFIG
    assert state.alter_configs("t", {"leader.replication.throttled.replicas": "0:1"}, []).ops
    with pytest.raises(KafkaError) as refused:
        state.alter_configs("t", {"follower.replication.throttled.replicas": "0:x"}, [])
    assert refused.value.code is ErrorCode.INVALID_CONFIG
    assert "follower.replication.throttled.replicas" in str(refused.value)


class FakeStore:
    """The broker_configs znodes, changed by committed ops as the consensus store would."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def commit(self, change: Change) -> None:
        for op in change.ops:
            if isinstance(op, Create):
                assert op.path not in self.data
                self.data[op.path] = op.data
            elif isinstance(op, SetData):
                assert op.path in self.data
                self.data[op.path] = op.data
            else:
                del self.data[op.path]

    def load(self, state: ClusterState) -> ClusterState:
        """A new controller's state, with the configs read back as Store.load reads them."""
        prefix = PATHS.broker_configs + "/"
        configs = {
            int(path.removeprefix(prefix)): layout.decode_broker_configs(data)
            for path, data in self.data.items()
        }
        image = Image(
            state.cluster_id,
            state.brokers,
            state.topics,
            state.last_broker_epoch,
            state.next_producer_id,
            broker_configs=configs,
        )
        return ClusterState(image, PATHS, now=0.0, session_timeout=TIMEOUT)


def test_the_configs_survive_a_reload_from_the_store() -> None:
    store = FakeStore()
    state, _ = with_topic([(1,)])
    for broker, set_configs, delete in (
        (0, {LEADER_RATE: "100", FOLLOWER_RATE: "200"}, []),
        (1, {LEADER_RATE: "300"}, []),
        (0, {}, [FOLLOWER_RATE]),
        (2, {LEADER_RATE: "1"}, []),
        (2, {}, [LEADER_RATE]),
    ):
        change = state.alter_broker_configs(broker, set_configs, delete)
        store.commit(change)
        commit(state, change)
    state.alter_broker_configs(1, {LEADER_RATE: "5"}, [])  # planned, never committed
    successor = store.load(state)
    assert successor.broker_configs == {0: {LEADER_RATE: "100"}, 1: {LEADER_RATE: "300"}}
    assert configs_in_updates(successor) == successor.broker_configs


@pytest.mark.parametrize(
    "data",
    [
        b'{"configs":{"leader.replication.throttled.rate":"-5"}}',
        b'{"configs":{"log.retention.ms":"soon"}}',
        b"{}",
    ],
)
def test_a_damaged_broker_configs_znode_stops_a_takeover(data: bytes) -> None:
    with pytest.raises((ValueError, KeyError)):
        layout.decode_broker_configs(data)
