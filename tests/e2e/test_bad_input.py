"""Bad input against a running broker: garbage, oversized and truncated frames, unknown
APIs, invalid topics, missing partitions. Each gets the protocol's error code or closes that
one connection; the broker keeps serving everyone else and stored data does not change."""

from __future__ import annotations

import socket
import struct
import time
import urllib.request
import warnings
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.broker import BrokerProcess
from tests.e2e.conftest import single_broker
from tests.storage.helpers import tree_digest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse
    from kafka.protocol.producer import ProduceRequest, ProduceResponse

from directlog.records.batch import Record, build_batch


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    with single_broker(tmp_path_factory.mktemp("bad-input")) as running:
        produce(running, "kept", [b"before"])
        yield running


def produce(broker: BrokerProcess, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 3})
    failures: list[object] = []
    for value in values:
        producer.produce(topic, value, on_delivery=lambda e, _m: failures.append(e) if e else None)
    assert producer.flush(30) == 0 and not failures


def connect(broker: BrokerProcess) -> socket.socket:
    host, port = broker.bootstrap.rsplit(":", 1)
    connection = socket.create_connection((host, int(port)), timeout=10)
    return connection


def produce_request(topic: str, records: bytes, acks: int = -1) -> Any:
    """A Produce of `records` to partition 0 of `topic` (its version set when sent)."""
    parts = ProduceRequest.TopicProduceData.PartitionProduceData
    return ProduceRequest(
        acks=acks,
        timeout_ms=1000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic, partition_data=[parts(index=0, records=records)]
            )
        ],
    )


def closed_by_peer(connection: socket.socket) -> bool:
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


def roundtrip(connection: socket.socket, request: object, version: int, correlation: int) -> bytes:
    request.API_VERSION = version  # type: ignore[attr-defined]
    request.with_header(correlation_id=correlation, client_id="bad-input")  # type: ignore[attr-defined]
    payload = bytes(request.encode(header=True))  # type: ignore[attr-defined]
    connection.sendall(struct.pack(">i", len(payload)) + payload)
    size = struct.unpack(">i", read_exactly(connection, 4))[0]
    return read_exactly(connection, size)


def read_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        assert chunk, "connection closed mid-response"
        data += chunk
    return data


def closed_for_bad_input(broker: BrokerProcess) -> float:
    text = urllib.request.urlopen(broker.metrics_url, timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "directlog_broker_connections_closed_for_bad_input":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("metric missing")


def stored(broker: BrokerProcess) -> dict[str, str]:
    return tree_digest(broker.data_dir / "kept-0")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x10" + b"\xff" * 16,  # a frame whose header is nonsense
        struct.pack(">i", 200 * 1024 * 1024),  # a length over socket.request.max.bytes
        struct.pack(">i", -1),  # a negative length
        struct.pack(">ihhih", 10, 999, 0, 1, -1),  # an API key nobody defined
        struct.pack(">ihhih", 10, 0, 99, 1, -1),  # Produce v99
        struct.pack(">ihhih", 12, 3, 12, 1, 2) + b"\xff\xfe",  # client id that is not UTF-8-safe
    ],
)
def test_bad_frames_close_only_their_connection(broker: BrokerProcess, garbage: bytes) -> None:
    before, closed_before = stored(broker), closed_for_bad_input(broker)
    bystander = connect(broker)
    attacker = connect(broker)
    attacker.sendall(garbage)
    answer = roundtrip(
        bystander, MetadataRequest(topics=None, allow_auto_topic_creation=False), 9, 5
    )
    assert struct.unpack_from(">i", answer)[0] == 5
    if garbage[4:6] == b"\x00\x03":  # the non-UTF-8 client id is still a valid request
        attacker.close()
    else:
        assert closed_by_peer(attacker)
        deadline = time.monotonic() + 5
        while closed_for_bad_input(broker) == closed_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert closed_for_bad_input(broker) == closed_before + 1
    bystander.close()
    assert stored(broker) == before
    produce(broker, "kept", [b"still served"])


@pytest.mark.timeout(60)
def test_a_stalled_partial_frame_blocks_nobody(broker: BrokerProcess) -> None:
    staller = connect(broker)
    staller.sendall(struct.pack(">i", 1000) + b"\x00\x03")  # promises 1000 bytes, sends 2
    produce(broker, "kept", [b"while another client stalls"])
    staller.close()


@pytest.mark.timeout(60)
def test_produce_to_a_missing_partition_fails_only_that_partition(broker: BrokerProcess) -> None:
    records = build_batch([Record(0, 1_700_000_000_000, None, b"to partition 0")])
    parts = ProduceRequest.TopicProduceData.PartitionProduceData
    request = ProduceRequest(
        acks=1,
        timeout_ms=1000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="kept",
                partition_data=[parts(index=0, records=records), parts(index=7, records=records)],
            ),
            ProduceRequest.TopicProduceData(
                name="no-such-topic", partition_data=[parts(index=0, records=records)]
            ),
        ],
    )
    connection = connect(broker)
    body = roundtrip(connection, request, 7, 9)
    response = ProduceResponse.decode(body[4:], version=7)
    codes = {
        (t.name, p.index): p.error_code for t in response.responses for p in t.partition_responses
    }
    assert codes == {
        ("kept", 0): 0,
        ("kept", 7): 3,
        ("no-such-topic", 0): 3,
    }  # 3: UNKNOWN_TOPIC_OR_PARTITION
    connection.close()


@pytest.mark.timeout(60)
def test_corrupt_batch_gets_corrupt_message_and_changes_nothing(broker: BrokerProcess) -> None:
    before = stored(broker)
    batch = bytearray(build_batch([Record(0, 1_700_000_000_000, None, b"flipped")]))
    batch[-1] ^= 0xFF
    request = produce_request("kept", bytes(batch))
    connection = connect(broker)
    response = ProduceResponse.decode(roundtrip(connection, request, 9, 3)[5:], version=9)
    partition = response.responses[0].partition_responses[0]
    assert partition.error_code == 2 and "CRC" in (partition.error_message or "")  # CORRUPT_MESSAGE
    connection.close()
    assert stored(broker) == before


@pytest.mark.timeout(60)
def test_invalid_topic_names_get_invalid_topic(broker: BrokerProcess) -> None:
    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name="bad topic/name")],
        allow_auto_topic_creation=True,
    )
    connection = connect(broker)
    response = MetadataResponse.decode(roundtrip(connection, request, 9, 4)[5:], version=9)
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("bad topic/name", 17)
    ]  # INVALID_TOPIC_EXCEPTION
    connection.close()


def produce_frame(topic: str, batch: bytes, correlation: int, version: int = 7) -> bytes:
    request = produce_request(topic, batch, acks=1)
    request.API_VERSION = version
    request.with_header(correlation_id=correlation, client_id="pipelined")
    payload = bytes(request.encode(header=True))
    return struct.pack(">i", len(payload)) + payload


def fetched_values(broker: BrokerProcess, topic: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "check", "log_level": 3}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < count and time.monotonic() < deadline:
            for message in consumer.consume(count - len(values), 1.0):
                assert message.error() is None, message.error()
                values.append(message.value())
        return values
    finally:
        consumer.close()


@pytest.mark.timeout(60)
def test_pipelined_produces_are_answered_in_order_and_a_corrupt_one_fails_alone(
    broker: BrokerProcess,
) -> None:
    """Produce requests that arrive in one read are appended together; each still gets its
    own answer, in order, and a corrupt batch among them fails only its own request."""
    produce(broker, "pipelined", [b"first"])
    batches = [build_batch([Record(0, 1_700_000_000_000, None, b"r%d" % i)]) for i in range(6)]
    corrupted = bytearray(batches[3])
    corrupted[-1] ^= 0xFF
    batches[3] = bytes(corrupted)
    connection = connect(broker)
    connection.sendall(
        b"".join(produce_frame("pipelined", b, 100 + i) for i, b in enumerate(batches))
    )
    answers = []
    for _ in batches:
        size = struct.unpack(">i", read_exactly(connection, 4))[0]
        body = read_exactly(connection, size)
        response = ProduceResponse.decode(body[4:], version=7)
        partition = response.responses[0].partition_responses[0]
        answers.append(
            (struct.unpack(">i", body[:4])[0], partition.error_code, partition.base_offset)
        )
    connection.close()
    assert answers == [
        (100, 0, 1),
        (101, 0, 2),
        (102, 0, 3),
        (103, 2, -1),  # CORRUPT_MESSAGE
        (104, 0, 4),
        (105, 0, 5),
    ]
    assert fetched_values(broker, "pipelined", 6) == [b"first", b"r0", b"r1", b"r2", b"r4", b"r5"]


@pytest.mark.timeout(60)
def test_a_pipelined_produce_that_does_not_decode_closes_and_stores_none_of_its_read(
    broker: BrokerProcess,
) -> None:
    before = stored(broker)
    batch = build_batch([Record(0, 1_700_000_000_000, None, b"never")])
    good = produce_frame("kept", batch, 1)
    truncated = produce_frame("kept", batch, 2)
    truncated = struct.pack(">i", len(truncated) - 4 - 30) + truncated[4:-30]
    connection = connect(broker)
    connection.sendall(good + truncated + produce_frame("kept", batch, 3))
    assert closed_by_peer(connection)
    connection.close()
    assert stored(broker) == before


@pytest.mark.timeout(60)
def test_records_a_compacted_topic_refuses_are_named_and_none_of_their_batch_stored(
    broker: BrokerProcess,
) -> None:
    """KIP-467 (Produce v8+): the batch with a keyless record fails INVALID_RECORD as a whole,
    and record_errors names the keyless records by their index in it."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = NewTopic("compacted", num_partitions=1, config={"cleanup.policy": "compact"})
    admin.create_topics([topic])["compacted"].result(timeout=30)
    stamp = 1_700_000_000_000
    batch = build_batch(
        [Record(0, stamp, b"k0", b"a"), Record(1, stamp, None, b"b"), Record(2, stamp, None, b"c")]
    )
    request = produce_request("compacted", batch)
    connection = connect(broker)
    for version, correlation in ((8, 4), (9, 5)):
        response = ProduceResponse.decode(
            roundtrip(connection, request, version, correlation)[4 if version < 9 else 5 :],
            version=version,
        )
        partition = response.responses[0].partition_responses[0]
        assert partition.error_code == 87  # INVALID_RECORD
        assert [e.batch_index for e in partition.record_errors] == [1, 2]
        assert all("without key" in e.batch_index_error_message for e in partition.record_errors)
        assert "have no key" in partition.error_message
    connection.close()
    keyed = Producer({"bootstrap.servers": broker.bootstrap, "log_level": 3})
    offsets: list[int] = []
    keyed.produce(
        "compacted", b"kept", key=b"k0", on_delivery=lambda e, m: offsets.append(m.offset())
    )
    assert keyed.flush(30) == 0 and offsets == [0]  # nothing of the refused batches was stored
