"""The znode layout and the bytes of each znode."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.controller import layout
from services.controller.layout import ControllerRecord, Layout
from services.controller.model import (
    BrokerRegistration,
    Listener,
    PartitionState,
    RemotePartition,
    RemoteSegment,
    RemoteSegmentState,
    RemoteTopic,
)


def test_paths() -> None:
    paths = Layout("/clusters/a")
    topic_id = bytes(range(16))
    assert paths.controller_epoch == "/clusters/a/controller_epoch"
    assert paths.broker(3) == "/clusters/a/brokers/3"
    assert paths.producer_ids == "/clusters/a/producer_ids"
    assert paths.log_defaults == "/clusters/a/log_defaults"
    assert paths.topic(topic_id) == "/clusters/a/topics/AAECAwQFBgcICQoLDA0ODw"
    assert paths.partition(topic_id, 7) == "/clusters/a/topics/AAECAwQFBgcICQoLDA0ODw/7"
    assert paths.remote_log == "/clusters/a/remote_log"
    assert paths.remote_topic(topic_id) == "/clusters/a/remote_log/AAECAwQFBgcICQoLDA0ODw"
    assert paths.remote_partition(topic_id, 7) == "/clusters/a/remote_log/AAECAwQFBgcICQoLDA0ODw/7"
    segment_id = bytes.fromhex("fb3ef7e5a1a2497e9d8ac4ba3c9a3e3f")
    assert paths.remote_segment(topic_id, 7, segment_id) == (
        "/clusters/a/remote_log/AAECAwQFBgcICQoLDA0ODw/7/-z735aGiSX6disS6PJo-Pw"
    )


@pytest.mark.parametrize("root", ["directlog", "/directlog/", ""])
def test_root_must_be_an_absolute_path(root: str) -> None:
    with pytest.raises(ValueError):
        Layout(root)


def test_topic_ids_print_as_kafka_prints_them() -> None:
    topic_id = bytes.fromhex("fb3ef7e5a1a2497e9d8ac4ba3c9a3e3f")
    text = layout.uuid_text(topic_id)
    assert len(text) == 22 and "=" not in text
    assert layout.uuid_bytes(text) == topic_id
    with pytest.raises(ValueError):
        layout.uuid_bytes("AAAA")


def test_records_round_trip() -> None:
    broker = BrokerRegistration(4, "inc", 17, (Listener("PLAINTEXT", "h", 9092),), "r1")
    assert layout.decode_broker(4, layout.encode_broker(broker)) == broker
    rackless = BrokerRegistration(5, "inc", 18, (), None)
    assert layout.decode_broker(5, layout.encode_broker(rackless)) == rackless
    defaults = {"retention.ms": "5", "message.downconversion.enable": "false"}
    assert layout.decode_log_defaults(layout.encode_log_defaults(defaults)) == defaults
    state = PartitionState((1, 2, 3), 2, 4, (2, 3), 9)
    assert layout.decode_partition((1, 2, 3), layout.encode_partition(state)) == state
    # moved by a reassignment: the partition znode's replicas replace the topic znode's
    moving = PartitionState((4, 2, 1, 3), 2, 4, (2, 3, 1), 10, adding=(4,), removing=(1, 3))
    assert layout.decode_partition((1, 2, 3), layout.encode_partition(moving)) == moving
    moved = PartitionState((4, 2), 2, 4, (2, 4), 11)
    assert layout.decode_partition((1, 2, 3), layout.encode_partition(moved)) == moved
    # written before partition znodes held replicas: the topic znode's are in force
    old = b'{"leader":2,"leader_epoch":4,"isr":[2,3],"partition_epoch":9}'
    assert layout.decode_partition((1, 2, 3), old) == state
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
    assert len(layout.encode_partition(state)) < 100


@pytest.mark.parametrize("data", [b"[]", b"{", b'{"epoch": "x"}'])
def test_malformed_znodes_raise_value_errors(data: bytes) -> None:
    with pytest.raises(ValueError):
        layout.decode_epoch(data)


SEGMENT = RemoteSegment(
    bytes(range(16)),
    RemoteSegmentState.COPY_FINISHED,
    base_offset=100,
    start_offset=120,
    end_offset=199,
    max_timestamp=1_700_000_000_000,
    size_bytes=4096,
    leader_epoch=3,
    broker_id=2,
    epochs=((2, 100), (3, 150)),
    event_time_ms=1_700_000_000_500,
)


def test_remote_log_records_round_trip() -> None:
    data = layout.encode_remote_segment(SEGMENT)
    assert b"segment_id" not in data  # the znode's name says it
    assert b'"state":"COPY_FINISHED"' in data and b'"epochs":[[2,100],[3,150]]' in data
    assert layout.decode_remote_segment(SEGMENT.segment_id, data) == SEGMENT
    for state in RemoteSegmentState:
        record = replace(SEGMENT, state=state, epochs=())
        assert (
            layout.decode_remote_segment(record.segment_id, layout.encode_remote_segment(record))
            == record
        )
    partition = layout.decode_remote_partition(layout.encode_remote_partition(7, 200), [SEGMENT])
    assert partition == RemotePartition(7, 200, {SEGMENT.segment_id: SEGMENT})
    for topic in (RemoteTopic("t"), RemoteTopic("t", deleted=True)):
        assert layout.decode_remote_topic(layout.encode_remote_topic(topic)) == topic


LONGS = st.integers(-(2**63), 2**63 - 1)
INTS = st.integers(-(2**31), 2**31 - 1)


@given(
    st.builds(
        RemoteSegment,
        st.binary(min_size=16, max_size=16),
        st.sampled_from(RemoteSegmentState),
        LONGS,
        LONGS,
        LONGS,
        LONGS,
        LONGS,
        INTS,
        INTS,
        st.lists(st.tuples(INTS, LONGS), max_size=5).map(tuple),
        LONGS,
    )
)
def test_any_remote_record_round_trips(segment: RemoteSegment) -> None:
    data = layout.encode_remote_segment(segment)
    assert layout.decode_remote_segment(segment.segment_id, data) == segment
    name = layout.uuid_text(segment.segment_id)
    assert len(name) == 22 and layout.uuid_bytes(name) == segment.segment_id


@pytest.mark.parametrize(
    "data",
    [
        b"[]",
        b'{"state": "COPIED"}',
        layout.encode_remote_segment(SEGMENT).replace(b"[[2,100],", b"[[2],"),
        layout.encode_remote_segment(SEGMENT).replace(b'"size_bytes":4096', b'"size_bytes":"x"'),
    ],
)
def test_malformed_remote_records_are_refused(data: bytes) -> None:
    with pytest.raises((ValueError, KeyError)):
        layout.decode_remote_segment(SEGMENT.segment_id, data)


@pytest.mark.parametrize(
    "data", [b'{"version": 0, "next_offset": -1}', b'{"version": 2, "next_offset": -2}', b"{}"]
)
def test_malformed_remote_partitions_are_refused(data: bytes) -> None:
    with pytest.raises((ValueError, KeyError)):
        layout.decode_remote_partition(data, [])


def test_a_remote_topic_mark_must_be_a_boolean() -> None:
    with pytest.raises(ValueError):
        layout.decode_remote_topic(b'{"name": "t", "deleted": "yes"}')
