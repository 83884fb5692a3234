"""Kafka's broker configs as a Directlog broker reports and guards them."""

import pytest

from directlog.broker_config import STATIC_CONFIGS, STATIC_NAMES, static_refusal
from directlog.topic_config import DEFAULT_NAMES
from services.broker.settings import BrokerSettings


def test_every_static_config_names_a_broker_setting():
    assert set(STATIC_CONFIGS.values()) <= set(BrokerSettings.model_fields)


def test_no_dynamic_config_is_static():
    assert not STATIC_NAMES & set(DEFAULT_NAMES)
    assert not STATIC_NAMES & {
        "leader.replication.throttled.rate",
        "follower.replication.throttled.rate",
    }


@pytest.mark.parametrize(
    ("names", "refusal"),
    [
        (["log.retention.ms", "leader.replication.throttled.rate"], None),
        (["broker.id"], "Cannot update these configs dynamically: Set(broker.id)"),
        (
            ["log.dirs", "log.retention.ms", "auto.create.topics.enable"],
            "Cannot update these configs dynamically: Set(auto.create.topics.enable, log.dirs)",
        ),
    ],
)
def test_static_configs_are_refused_as_kafka_refuses_them(names, refusal):
    assert static_refusal(names) == refusal
