"""The cluster-wide defaults of topic configs (AlterLogDefaults, Kafka's dynamic broker
defaults) without a store: one write and a metadata update, validation of the values and
of every topic's overrides over them, what they decide on the controller (unclean election,
KIP-950), and the znode carried to the next controller."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.topics import NO_LEADER
from services.controller import layout, messages
from services.controller.cluster import KIP_950_MESSAGE, Change, ClusterState, Delta, Image
from services.controller.layout import SetData
from tests.controller.clusters import PATHS, TIMEOUT, commit, fence, partition, with_topic

pytestmark = pytest.mark.timeout(30)

OFF = {"message.downconversion.enable": "false"}


def refused(plan: Callable[..., object], *args: object) -> KafkaError:
    """The KafkaError ``plan(*args)`` raises."""
    with pytest.raises(KafkaError) as raised:
        plan(*args)
    return raised.value


def test_defaults_are_one_write_and_reach_brokers_in_every_update() -> None:
    state, topic_id = with_topic([(1,)])
    change = state.alter_log_defaults({**OFF, "retention.ms": "1000"}, [])
    data = b'{"configs":{"message.downconversion.enable":"false","retention.ms":"1000"}}'
    assert change.ops == (SetData("/directlog/log_defaults", data),)
    assert change.touches_image and change.delta == Delta()
    assert state.log_defaults == {}  # nothing until it commits
    commit(state, change)
    assert state.log_defaults == {**OFF, "retention.ms": "1000"}
    for delta in (None, change.delta):
        update = messages.metadata_update(
            state, version=2, controller_id=1, controller_epoch=1, delta=delta
        )
        assert dict(update.log_defaults) == state.log_defaults
    # Topics keep their overrides only.
    assert state.topics[topic_id].configs == {}

    commit(state, state.alter_log_defaults({}, ["retention.ms", "segment.ms"]))
    assert state.log_defaults == OFF
    assert state.alter_log_defaults(OFF, ["segment.ms"]).ops == ()  # nothing to change
    commit(state, state.alter_log_defaults({"retention.ms": "5"}, [], replace_all=True))
    assert state.log_defaults == {"retention.ms": "5"}
    commit(state, state.alter_log_defaults({}, [], replace_all=True))
    assert state.log_defaults == {}


@pytest.mark.parametrize(
    ("set_configs", "delete", "error", "named"),
    [
        ({"retention.ms": "abc"}, [], ErrorCode.INVALID_CONFIG, "log.retention.ms"),
        ({"segment.bytes": "1"}, [], ErrorCode.INVALID_CONFIG, "log.segment.bytes"),
        ({"no.such.config": "1"}, [], ErrorCode.INVALID_CONFIG, "log.no.such.config"),
        (
            {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"},
            [],
            ErrorCode.INVALID_CONFIG,
            "max.compaction.lag.ms",
        ),
        ({"retention.ms": "1"}, ["retention.ms"], ErrorCode.INVALID_REQUEST, "retention.ms"),
    ],
)
def test_bad_defaults_are_refused_naming_the_key(
    set_configs: dict[str, str], delete: list[str], error: ErrorCode, named: str
) -> None:
    state, _ = with_topic([(1,)])
    commit(state, state.alter_log_defaults(OFF, []))
    exc = refused(state.alter_log_defaults, set_configs, delete)
    assert exc.code is error and named in str(exc)
    assert state.log_defaults == OFF


def test_defaults_a_topic_does_not_combine_with_are_refused() -> None:
    overrides = {"remote.storage.enable": "true", "local.retention.ms": "5000"}
    state, _ = with_topic([(1,)], configs=overrides)
    exc = refused(state.alter_log_defaults, {"retention.ms": "1000"}, [])
    assert exc.code is ErrorCode.INVALID_CONFIG
    assert str(exc).startswith("topic 't': local.retention.ms 5000 is above retention.ms 1000")
    assert state.alter_log_defaults({"retention.ms": "5000"}, []).ops


def test_topic_configs_are_validated_over_the_defaults() -> None:
    state, _ = with_topic([(1,)])
    commit(state, state.alter_log_defaults({"retention.ms": "1000"}, []))
    overrides = {"remote.storage.enable": "true", "local.retention.ms": "5000"}
    for plan, args in (
        (state.create_topic, ("u", 1, 1, overrides)),
        (state.alter_configs, ("t", overrides, [])),
    ):
        assert refused(plan, *args).code is ErrorCode.INVALID_CONFIG
    assert state.alter_configs("t", {**overrides, "retention.ms": "-1"}, []).ops


def test_an_inherited_remote_storage_is_turned_off_only_with_its_data_deleted() -> None:
    """KIP-950 for what topics inherit: deleting the default, or a topic's override false,
    turns remote storage off."""
    state, _ = with_topic([(1,)])
    commit(state, state.alter_log_defaults({"remote.storage.enable": "true"}, []))
    for plan, args in (
        (state.alter_log_defaults, ({}, ["remote.storage.enable"])),
        (state.alter_configs, ("t", {"remote.storage.enable": "false"}, [])),
    ):
        exc = refused(plan, *args)
        assert exc.code is ErrorCode.INVALID_CONFIG and KIP_950_MESSAGE in str(exc)
    deleting = {"remote.log.delete.on.disable": "true"}
    assert state.alter_log_defaults(deleting, ["remote.storage.enable"]).ops
    assert state.alter_configs("t", {"remote.storage.enable": "false", **deleting}, []).ops


def test_an_unclean_election_default_elects_an_offline_partition() -> None:
    state, topic_id = with_topic([(1, 2)], brokers=2, isr=[(1,)])
    fence(state, 1)
    assert state.elect() is None
    commit(state, state.alter_log_defaults({"unclean.leader.election.enable": "true"}, []))
    change = state.elect()
    assert change is not None and change.unclean_elections == 1
    commit(state, change)
    assert partition(state, topic_id).leader == 2
    # A topic's override still wins over the default.
    state, topic_id = with_topic([(1, 2)], brokers=2, isr=[(1,)])
    commit(state, state.alter_configs("t", {"unclean.leader.election.enable": "false"}, []))
    commit(state, state.alter_log_defaults({"unclean.leader.election.enable": "true"}, []))
    fence(state, 1)
    assert partition(state, topic_id).leader == NO_LEADER


class FakeStore:
    """The defaults znode as Store.prepare creates it, changed by committed setData ops."""

    def __init__(self) -> None:
        self.data = {PATHS.log_defaults: layout.encode_log_defaults({})}

    def commit(self, change: Change) -> None:
        for op in change.ops:
            assert isinstance(op, SetData) and op.path in self.data, op
            self.data[op.path] = op.data

    def load(self, state: ClusterState) -> ClusterState:
        """A new controller's state: ``state``'s brokers and topics, and the defaults read
        from the store as Store.load reads them."""
        image = Image(
            state.cluster_id,
            state.brokers,
            state.topics,
            state.last_broker_epoch,
            state.next_producer_id,
            log_defaults=layout.decode_log_defaults(self.data[PATHS.log_defaults]),
        )
        return ClusterState(image, PATHS, now=0.0, session_timeout=TIMEOUT)


def test_the_defaults_survive_a_reload_from_the_store() -> None:
    store = FakeStore()
    state, _ = with_topic([(1,)])
    assert store.load(state).log_defaults == {}
    for set_configs, delete in (({**OFF, "retention.ms": "1000"}, []), ({}, ["retention.ms"])):
        change = state.alter_log_defaults(set_configs, delete)
        store.commit(change)
        commit(state, change)
    # A change planned but never committed (the term ended) is not in the store.
    state.alter_log_defaults({"segment.ms": "1000"}, [])
    successor = store.load(state)
    assert successor.log_defaults == OFF
    update = messages.metadata_update(
        successor, version=1, controller_id=2, controller_epoch=2, delta=None
    )
    assert dict(update.log_defaults) == OFF


@pytest.mark.parametrize(
    "data", [b'{"configs":{"retention.ms":"abc"}}', b'{"configs":{"nope":"1"}}', b"{}"]
)
def test_a_damaged_defaults_znode_stops_a_takeover(data: bytes) -> None:
    with pytest.raises((ValueError, KeyError)):
        layout.decode_log_defaults(data)
