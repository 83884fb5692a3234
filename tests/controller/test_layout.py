"""The znode layout and the bytes of each znode."""

from __future__ import annotations

import pytest

from services.controller import layout
from services.controller.layout import ControllerRecord, Layout
from services.controller.model import BrokerRegistration, Listener, PartitionState


def test_paths() -> None:
    paths = Layout("/clusters/a")
    topic_id = bytes(range(16))
    assert paths.controller_epoch == "/clusters/a/controller_epoch"
    assert paths.broker(3) == "/clusters/a/brokers/3"
    assert paths.producer_ids == "/clusters/a/producer_ids"
    assert paths.topic(topic_id) == "/clusters/a/topics/AAECAwQFBgcICQoLDA0ODw"
    assert paths.partition(topic_id, 7) == "/clusters/a/topics/AAECAwQFBgcICQoLDA0ODw/7"


@pytest.mark.parametrize("root", ["directlog", "/directlog/", ""])
def test_root_must_be_an_absolute_path(root: str) -> None:
    with pytest.raises(ValueError):
        Layout(root)


def test_topic_ids_print_as_kafka_prints_them() -> None:
    topic_id = bytes.fromhex("fb3ef7e5a1a2497e9d8ac4ba3c9a3e3f")
    text = layout.uuid_text(topic_id)
    assert len(text) == 22 and "=" not in text
    assert layout.topic_id_bytes(text) == topic_id
    with pytest.raises(ValueError):
        layout.topic_id_bytes("AAAA")


def test_records_round_trip() -> None:
    broker = BrokerRegistration(4, "inc", 17, (Listener("PLAINTEXT", "h", 9092),), "r1")
    assert layout.decode_broker(4, layout.encode_broker(broker)) == broker
    rackless = BrokerRegistration(5, "inc", 18, (), None)
    assert layout.decode_broker(5, layout.encode_broker(rackless)) == rackless
    state = PartitionState((1, 2, 3), 2, 4, (2, 3), 9)
    assert layout.decode_partition((1, 2, 3), layout.encode_partition(state)) == state
    record = ControllerRecord(2, "127.0.0.1:9190", 6)
    assert layout.decode_controller(layout.encode_controller(record)) == record
    assert layout.decode_epoch(layout.encode_epoch(12)) == 12
    assert layout.decode_last_broker_epoch(layout.encode_last_broker_epoch(40)) == 40
    for next_id in (0, 7000, 2**63):
        assert layout.decode_next_producer_id(layout.encode_next_producer_id(next_id)) == next_id
    assert layout.decode_cluster_id(layout.encode_cluster_id("abc")) == "abc"
    topic = layout.decode_topic(layout.encode_topic("t", {"a": "1"}, [(1, 2), (2, 1)]))
    assert (topic.name, topic.configs, topic.replicas) == ("t", {"a": "1"}, [(1, 2), (2, 1)])


def test_a_partition_state_znode_is_small() -> None:
    state = PartitionState((1, 2, 3), 1, 0, (1, 2, 3), 1)
    assert len(layout.encode_partition(state)) < 80


@pytest.mark.parametrize("data", [b"[]", b"{", b'{"epoch": "x"}'])
def test_malformed_znodes_raise_value_errors(data: bytes) -> None:
    with pytest.raises(ValueError):
        layout.decode_epoch(data)
