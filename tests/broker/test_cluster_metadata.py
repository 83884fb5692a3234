"""The broker's cluster image layers a topic's log settings: built-in defaults, the broker's
static log_defaults, the cluster-wide defaults the controller streams, its own per-broker
ones, the topic's overrides; a change of the dynamic defaults reconfigures every topic. It
keeps the security metadata (SCRAM credentials, ACLs, client quotas) each kind's delta flag
says is sent whole, tells "unchanged" from "emptied", and tells its listeners which kinds
changed."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from directlog.rpc import controller_pb2 as pb
from directlog.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from directlog.security.client_quotas import QuotaEntity
from directlog.security.scram import ScramMechanism
from directlog.topic_config import LogConfig
from services.broker.cluster_metadata import ClusterImage, SecurityKind

STATIC = {"retention.ms": "2000", "segment.ms": "9000"}


def update(version: int, log_defaults: dict[str, str], *, full: bool = False) -> pb.MetadataUpdate:
    """Topic "plain" without overrides and "custom" with retention.ms 1."""
    topics = [
        pb.TopicState(name="plain", topic_id=uuid.UUID(int=1).bytes),
        pb.TopicState(
            name="custom", topic_id=uuid.UUID(int=2).bytes, configs={"retention.ms": "1"}
        ),
    ]
    return pb.MetadataUpdate(
        version=version,
        full=full,
        controller_epoch=1,
        topics=topics if full else [],
        log_defaults=log_defaults,
    )


def reconfigured(image: ClusterImage, message: pb.MetadataUpdate) -> list[str]:
    change = image.apply(message)
    assert change is not None
    return sorted(topic.name for topic in change.reconfigured)


def test_cluster_wide_defaults_lie_between_static_defaults_and_overrides() -> None:
    image = ClusterImage(LogConfig.from_properties(STATIC))
    defaults = {"retention.ms": "3000", "message.downconversion.enable": "false"}
    assert reconfigured(image, update(1, defaults, full=True)) == ["custom", "plain"]
    plain, custom = image.config_for("plain"), image.config_for("custom")
    assert (plain.retention_ms, plain.segment_ms, plain.message_downconversion_enable) == (
        3000,
        9000,
        False,
    )
    assert (custom.retention_ms, custom.message_downconversion_enable) == (1, False)
    assert image.dynamic_defaults == defaults
    assert image.log_defaults == LogConfig.from_properties(defaults, image.static_defaults)

    assert reconfigured(image, update(2, defaults)) == []  # the same defaults again
    assert reconfigured(image, update(3, {})) == ["custom", "plain"]
    plain = image.config_for("plain")
    assert (plain.retention_ms, plain.message_downconversion_enable) == (2000, True)
    assert image.log_defaults == image.static_defaults


def test_a_brokers_own_defaults_lie_between_the_cluster_wide_ones_and_overrides() -> None:
    """Kafka's per-broker log.* configs: only the broker they name takes them."""
    image = ClusterImage(LogConfig.from_properties(STATIC), node_id=1)
    image.apply(update(1, {"retention.ms": "3000", "segment.ms": "4000"}, full=True))
    mine = pb.BrokerConfigs(broker_id=1, configs={"log.retention.ms": "5000"})
    other = pb.BrokerConfigs(broker_id=2, configs={"log.roll.ms": "6000"})
    message = update(2, {"retention.ms": "3000", "segment.ms": "4000"})
    message.broker_configs.extend([mine, other])
    assert reconfigured(image, message) == ["custom", "plain"]
    plain, custom = image.config_for("plain"), image.config_for("custom")
    assert (plain.retention_ms, plain.segment_ms, custom.retention_ms) == (5000, 4000, 1)
    assert image.broker_defaults == {"retention.ms": "5000"}

    assert reconfigured(image, update(3, {"retention.ms": "3000", "segment.ms": "4000"})) == [
        "custom",
        "plain",
    ]  # deleted: the cluster-wide value again
    assert image.config_for("plain").retention_ms == 3000


def test_defaults_that_do_not_combine_with_the_static_ones_are_refused() -> None:
    image = ClusterImage(LogConfig.from_properties({"min.compaction.lag.ms": "10"}))
    image.apply(update(1, {"retention.ms": "3000"}, full=True))
    assert reconfigured(image, update(2, {"max.compaction.lag.ms": "5"})) == []
    assert image.dynamic_defaults == {"retention.ms": "3000"}
    assert image.config_for("plain").retention_ms == 3000


def test_every_update_carries_every_brokers_dynamic_configs() -> None:
    image = ClusterImage(LogConfig())
    message = update(1, {}, full=True)
    message.broker_configs.add(broker_id=2, configs={"leader.replication.throttled.rate": "1000"})
    image.apply(message)
    assert image.configs_of_broker(2) == {"leader.replication.throttled.rate": "1000"}
    assert image.configs_of_broker(0) == {}
    image.apply(update(2, {}))  # a delta without them: none are left
    assert image.broker_configs == {}


def test_a_brokers_own_rates_override_the_cluster_wide_ones() -> None:
    image = ClusterImage(LogConfig())
    message = update(1, {}, full=True)
    leader, follower = "leader.replication.throttled.rate", "follower.replication.throttled.rate"
    message.broker_configs.add(broker_id=-1, configs={leader: "500", follower: "700"})
    message.broker_configs.add(broker_id=2, configs={leader: "1000"})
    image.apply(message)
    assert image.configs_in_effect(2) == {leader: "1000", follower: "700"}
    assert image.configs_in_effect(0) == {leader: "500", follower: "700"}
    assert image.configs_of_broker(0) == {}  # its own: none
    image.apply(update(2, {}))
    assert image.configs_in_effect(2) == {}


def security_update(version: int, *, full: bool = False, **kinds: list[Any]) -> pb.MetadataUpdate:
    """An update carrying the kinds of security metadata named (``acls=[]``: emptied)."""
    message = update(version, {}, full=full)
    for kind, items in kinds.items():
        setattr(message, f"has_{kind}", True)
        getattr(message, kind).extend(items)
    return message


ALICE_256 = pb.ScramCredential(
    user="alice", mechanism=1, salt=b"s", stored_key=b"k" * 32, server_key=b"v" * 32,
    iterations=4096,
)  # fmt: skip
ALICE_512 = pb.ScramCredential(
    user="alice", mechanism=2, salt=b"t", stored_key=b"k" * 64, server_key=b"v" * 64,
    iterations=8192,
)  # fmt: skip
READ_ORDERS = pb.AclBinding(
    resource_type=2, resource_name="orders", pattern_type=3, principal="User:alice", host="*",
    operation=3, permission=3,
)  # fmt: skip
ALICE_QUOTA = pb.ClientQuota(
    entity=[pb.QuotaEntityComponent(entity_type="user", name="alice")],
    values={"producer_byte_rate": 1024.0},
)
DEFAULT_QUOTA = pb.ClientQuota(
    entity=[
        pb.QuotaEntityComponent(entity_type="user"),  # no name: the default user
        pb.QuotaEntityComponent(entity_type="client-id", name="app"),
    ],
    values={"request_percentage": 50.0},
)


@pytest.mark.timeout(30)
def test_the_security_metadata_comes_in_full_images_and_is_kept_through_other_deltas() -> None:
    image = ClusterImage(LogConfig())
    told: list[frozenset[SecurityKind]] = []
    image.on_security_change.append(told.append)
    image.apply(
        security_update(
            1,
            full=True,
            scram_credentials=[ALICE_256, ALICE_512],
            acls=[READ_ORDERS],
            client_quotas=[ALICE_QUOTA, DEFAULT_QUOTA],
        )
    )
    assert told == [frozenset(SecurityKind)]
    assert image.scram_credential("alice", 2) == ALICE_512
    assert image.scram_credential("alice", ScramMechanism.SCRAM_SHA_256) == ALICE_256
    assert image.scram_credential("bob", 1) is None
    assert image.scram_users() == {"alice": [ALICE_256, ALICE_512]}
    assert image.acls == {
        AclBinding(
            ResourceType.TOPIC,
            "orders",
            PatternType.LITERAL,
            "User:alice",
            "*",
            Operation.READ,
            Permission.ALLOW,
        )
    }
    assert image.client_quotas == {
        QuotaEntity((("user", "alice"),)): {"producer_byte_rate": 1024.0},
        QuotaEntity((("client-id", "app"), ("user", None))): {"request_percentage": 50.0},
    }

    # A delta that does not carry them (an ISR change, say) leaves them as they are.
    image.apply(update(2, {}))
    assert told == [frozenset(SecurityKind)]
    assert image.scram_users() == {"alice": [ALICE_256, ALICE_512]} and len(image.acls) == 1
    assert len(image.client_quotas) == 2

    # A full image from a new controller with the same content is no change.
    image.apply(
        security_update(
            1,
            full=True,
            scram_credentials=[ALICE_512, ALICE_256],
            acls=[READ_ORDERS],
            client_quotas=[DEFAULT_QUOTA, ALICE_QUOTA],
        )
    )
    assert told == [frozenset(SecurityKind)]


@pytest.mark.timeout(30)
def test_a_delta_flag_with_nothing_listed_empties_that_kind_only() -> None:
    image = ClusterImage(LogConfig())
    told: list[frozenset[SecurityKind]] = []
    image.on_security_change.append(told.append)
    image.apply(
        security_update(
            1, full=True, scram_credentials=[ALICE_256], acls=[READ_ORDERS], client_quotas=[]
        )
    )
    image.apply(security_update(2, acls=[]))
    assert told[-1] == {SecurityKind.ACLS}
    assert image.acls == frozenset()
    assert image.scram_users() == {"alice": [ALICE_256]}  # untouched

    image.apply(security_update(3, scram_credentials=[ALICE_512], client_quotas=[ALICE_QUOTA]))
    assert told[-1] == {SecurityKind.SCRAM_CREDENTIALS, SecurityKind.CLIENT_QUOTAS}
    assert image.scram_users() == {"alice": [ALICE_512]}  # the set is replaced whole
    assert image.client_quotas == {
        QuotaEntity((("user", "alice"),)): {"producer_byte_rate": 1024.0}
    }

    # A full image without them: a new controller whose store has none.
    image.apply(security_update(4, full=True, scram_credentials=[], acls=[], client_quotas=[]))
    assert told[-1] == {SecurityKind.SCRAM_CREDENTIALS, SecurityKind.CLIENT_QUOTAS}
    assert (image.scram_users(), image.acls, image.client_quotas) == ({}, frozenset(), {})
    # The first image had no quotas, as the image had none before it: no change of them.
    assert told[0] == {SecurityKind.SCRAM_CREDENTIALS, SecurityKind.ACLS} and len(told) == 4
