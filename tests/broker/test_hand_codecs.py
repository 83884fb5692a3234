"""The hand-written Produce, Fetch and replica Fetch codecs agree with kafka-python's
schema-generated one (built from Kafka's JSON message definitions) at every version the
broker serves."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.protocol import replica_fetch
from directlog.protocol.produce import (
    PartitionResult,
    decode_produce_request,
    encode_produce_response,
)
from directlog.protocol.replica_fetch import FetchPosition
from directlog.records.errors import CorruptRecordError
from services.broker.fetch_response import PartitionData, TopicData, encode_fetch_response
from services.broker.storage import FileSlice
from services.broker.storage.log_file import LogFile

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer import FetchRequest, FetchResponse
    from kafka.protocol.producer import ProduceRequest, ProduceResponse

names = st.text(alphabet="abcxyz.-_", min_size=1, max_size=12)
produce_topics = st.lists(
    st.tuples(
        names,
        st.lists(
            st.tuples(st.integers(0, 1000), st.one_of(st.none(), st.binary(max_size=64))),
            max_size=3,
        ),
    ),
    max_size=3,
)


@given(
    st.integers(0, 10),
    st.sampled_from([-1, 0, 1]),
    st.integers(0, 60_000),
    produce_topics,
    st.one_of(st.none(), names),
)
def test_produce_requests_decode_as_kafka_encodes_them(version, acks, timeout, topics, txn):
    P = ProduceRequest
    request = P(
        transactional_id=txn,
        acks=acks,
        timeout_ms=timeout,
        topic_data=[
            P.TopicProduceData(
                name=name,
                partition_data=[
                    P.TopicProduceData.PartitionProduceData(index=index, records=records)
                    for index, records in partitions
                ],
            )
            for name, partitions in topics
        ],
    )
    body = bytes(request.encode(version=version))
    decoded = decode_produce_request(memoryview(body), version)
    assert (decoded.acks, decoded.timeout_ms, decoded.size) == (acks, timeout, len(body))
    assert decoded.transactional_id == (txn if version >= 3 else None)
    assert [
        (
            t.name,
            [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data],
        )
        for t in decoded.topic_data
    ] == topics


@given(
    st.integers(0, 10),
    st.lists(
        st.tuples(
            names,
            st.lists(
                st.tuples(
                    st.integers(0, 1000),
                    st.integers(-1, 120),
                    st.integers(-1, 1 << 40),
                    st.one_of(st.none(), st.text(max_size=20)),
                ),
                max_size=3,
            ),
        ),
        max_size=3,
    ),
    st.lists(st.tuples(st.integers(0, 1 << 20), st.text(max_size=20)), max_size=3),
)
def test_produce_responses_decode_with_kafkas_schema(version, topics, record_errors):
    """KIP-467's record errors travel with an error message (v8+)."""
    results = [
        (
            name,
            [
                PartitionResult(
                    i,
                    code,
                    base,
                    base + 1,
                    max(base - 5, -1),
                    message,
                    tuple(record_errors) if message is not None else (),
                )
                for i, code, base, message in partitions
            ],
        )
        for name, partitions in topics
    ]
    decoded = ProduceResponse.decode(encode_produce_response(version, results), version=version)
    assert [
        (t.name, [(p.index, p.error_code, p.base_offset) for p in t.partition_responses])
        for t in decoded.responses
    ] == [
        (name, [(i, code, base) for i, code, base, _ in partitions]) for name, partitions in topics
    ]
    for topic, (_, partitions) in zip(decoded.responses, topics, strict=True):
        for got, (_, _, base, message) in zip(topic.partition_responses, partitions, strict=True):
            if version >= 2:
                assert got.log_append_time_ms == base + 1
            if version >= 5:
                assert got.log_start_offset == max(base - 5, -1)
            if version >= 8:
                assert got.error_message == message
                sent = record_errors if message is not None else []
                assert [
                    (e.batch_index, e.batch_index_error_message) for e in got.record_errors
                ] == sent


def test_truncated_produce_requests_are_refused():
    P = ProduceRequest
    raw = bytes(
        P(
            acks=1,
            timeout_ms=5,
            topic_data=[
                P.TopicProduceData(
                    name="t",
                    partition_data=[
                        P.TopicProduceData.PartitionProduceData(index=0, records=b"x" * 30)
                    ],
                )
            ],
        ).encode(version=9)
    )
    for cut in range(len(raw)):
        with pytest.raises(CorruptRecordError):
            decode_produce_request(memoryview(raw[:cut]), 9)


@pytest.mark.parametrize("version", range(17))
def test_fetch_responses_decode_with_kafkas_schema(version):
    with tempfile.TemporaryDirectory() as name:
        path = Path(name) / "segment.log"
        path.write_bytes(b"0123456789" * 10)
        file = LogFile(path)
        topics = [
            TopicData(
                "orders",
                uuid.UUID(int=7),
                [
                    PartitionData(0, 0, 100, 100, 3, FileSlice(file, 10, 40)),
                    PartitionData(1, 3, -1, -1, -1, None),
                    PartitionData(2, 1, 5, 5, 0, b""),
                ],
            ),
        ]
        parts = encode_fetch_response(version, 0, topics)
        body = b"".join(p.read() if isinstance(p, FileSlice) else p for p in parts)
        decoded = FetchResponse.decode(body, version=version)
        file.close()
    topic = decoded.responses[0]
    assert (topic.topic_id == uuid.UUID(int=7)) if version >= 13 else (topic.topic == "orders")
    got = [(p.partition_index, p.error_code, p.high_watermark) for p in topic.partitions]
    assert got == [(0, 0, 100), (1, 3, -1), (2, 1, 5)]
    assert bytes(topic.partitions[0].records) == (b"0123456789" * 10)[10:50]
    assert topic.partitions[1].records is None
    if version >= 5:
        assert [p.log_start_offset for p in topic.partitions] == [3, -1, 0]


fetch_positions = st.lists(
    st.builds(
        FetchPosition,
        names,
        st.integers(0, 1000),
        st.integers(-1, 1 << 20),
        st.integers(0, 1 << 40),
        st.integers(-1, 1 << 40),
        st.integers(0, 1 << 24),
    ),
    max_size=6,
)


@given(st.integers(0, 1 << 30), st.integers(0, 100), fetch_positions)
def test_replica_fetch_requests_decode_as_kafka_reads_them(correlation, replica, positions):
    frame = replica_fetch.encode_request(correlation, "follower", replica, 500, 1 << 20, positions)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    decoded = FetchRequest.decode(frame[4:], version=12, header=True)
    assert decoded.header.correlation_id == correlation
    assert decoded.header.client_id == "follower"
    assert (decoded.replica_id, decoded.max_wait_ms, decoded.min_bytes) == (replica, 500, 1)
    got = [
        (t.topic, p.partition, p.current_leader_epoch, p.fetch_offset, p.log_start_offset,
         p.partition_max_bytes)
        for t in decoded.topics
        for p in t.partitions
    ]  # fmt: skip
    wanted = [
        (p.topic, p.partition, p.current_leader_epoch, p.fetch_offset, p.log_start_offset,
         p.max_bytes)
        for p in positions
    ]  # fmt: skip
    assert sorted(got) == sorted(wanted)


def test_replica_fetch_responses_read_what_the_broker_writes():
    with tempfile.TemporaryDirectory() as name:
        path = Path(name) / "segment.log"
        path.write_bytes(b"x" * 100 + b"y" * 28)
        file = LogFile(path)
        topics = [
            TopicData(
                "orders",
                uuid.UUID(int=0),
                [
                    PartitionData(0, 0, 128, 128, 3, FileSlice(file, 0, 128)),
                    PartitionData(1, 6, -1, -1, -1, None),
                    PartitionData(2, 0, 9, 9, 0, b""),
                ],
            ),
            TopicData("empty", uuid.UUID(int=0), []),
        ]
        parts = encode_fetch_response(12, 0, topics)
        body = b"".join(p.read() if isinstance(p, FileSlice) else p for p in parts)
        file.close()
    frame = memoryview((77).to_bytes(4, "big") + b"\x00" + body)  # header v1: id + tags
    correlation, code, fetched = replica_fetch.decode_response(frame)
    assert (correlation, code) == (77, 0)
    assert [
        (f.topic, f.partition, f.error_code, f.high_watermark, f.log_start_offset, bytes(f.records))
        for f in fetched
    ] == [
        ("orders", 0, 0, 128, 3, b"x" * 100 + b"y" * 28),
        ("orders", 1, 6, -1, -1, b""),
        ("orders", 2, 0, 9, 0, b""),
    ]


@given(st.binary(max_size=200))
def test_malformed_replica_fetch_responses_raise_only_corrupt_record(raw):
    with contextlib.suppress(CorruptRecordError):  # anything else fails the test
        replica_fetch.decode_response(memoryview(raw))
