"""The broker's cluster image layers a topic's log settings: built-in defaults, the broker's
static log_defaults, the cluster-wide defaults the controller streams, the topic's
overrides; a change of the cluster-wide defaults reconfigures every topic."""

from __future__ import annotations

import uuid

from directlog.rpc import controller_pb2 as pb
from directlog.topic_config import LogConfig
from services.broker.cluster_metadata import ClusterImage

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
