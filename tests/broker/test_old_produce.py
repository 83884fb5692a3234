"""Produce v0-2 with magic 0/1 message sets (old producers): up-converted to a v2 batch that
keeps each message's timestamp as Kafka's LogValidator does, so a magic 0 message, or a
magic 1 one sent with -1, is stored with NO_TIMESTAMP (-1) on a CreateTime topic rather than
the broker's clock; ListOffsets by timestamp then passes those records by, as Kafka's does."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import pytest

from directlog.records.batch import (
    NO_TIMESTAMP,
    Record,
    TimestampType,
    build_batch,
    decode_records,
    iter_batches,
)
from directlog.records.compression import Compression
from directlog.records.legacy import LegacyMessage, encode_message_set
from directlog.topics import TopicPartition
from services.broker.apis import MAX_TIMESTAMP, _up_convert
from tests.broker.test_protocol import InProcessBroker
from tests.storage.helpers import read_all

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.producer import ProduceRequest

KEPT = 1_700_000_000_000  # the timestamp of InProcessBroker's one record, at offset 0


def converted(message_set: bytes) -> list[tuple[int, int, bytes | None]]:
    batch = _up_convert(message_set)
    ((position, header),) = list(iter_batches(batch))
    assert header.timestamp_type is TimestampType.CREATE_TIME
    records = decode_records(batch, position, header)
    assert header.max_timestamp == max(r.timestamp for r in records)
    return [(r.offset, r.timestamp, r.value) for r in records]


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_magic_0_messages_have_no_timestamp(compression: Compression) -> None:
    messages = [LegacyMessage(i, None, None, b"v%d" % i) for i in range(3)]
    message_set = encode_message_set(messages, magic=0, compression=compression)
    assert converted(message_set) == [(i, NO_TIMESTAMP, b"v%d" % i) for i in range(3)]


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP])
def test_magic_1_timestamps_are_kept_as_sent(compression: Compression) -> None:
    stamps = [NO_TIMESTAMP, KEPT, NO_TIMESTAMP]
    messages = [LegacyMessage(i, t, None, b"v") for i, t in enumerate(stamps)]
    message_set = encode_message_set(messages, magic=1, compression=compression)
    assert [t for _, t, _ in converted(message_set)] == stamps


def produce_v2(broker: InProcessBroker, message_set: bytes) -> None:
    request = ProduceRequest(
        acks=1,
        timeout_ms=1000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="fuzz",
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(
                        index=0, records=message_set
                    )
                ],
            )
        ],
    )
    request.API_VERSION = 2
    request.with_header(correlation_id=1, client_id="old-producer")
    broker.respond(bytes(request.encode(header=True)))


def offset_for(broker: InProcessBroker, timestamp: int) -> tuple[int, int]:
    apis = broker.server.apis
    partition = apis.replicas.leader_partition("fuzz", 0)
    return asyncio.run(apis._offset_for(partition, timestamp))


def test_old_produce_keeps_no_timestamp_and_list_offsets_passes_it_by(tmp_path: Path) -> None:
    broker = InProcessBroker(tmp_path)
    try:
        log = broker.logs.get(TopicPartition("fuzz", 0))
        assert log is not None
        old = [LegacyMessage(i, None, None, b"old%d" % i) for i in range(2)]
        produce_v2(broker, encode_message_set(old, magic=0))
        produce_v2(broker, encode_message_set([LegacyMessage(0, -1, None, b"m1")], magic=1))
        assert [(r.offset, r.timestamp) for r in read_all(log)] == [
            (0, KEPT),
            (1, NO_TIMESTAMP),
            (2, NO_TIMESTAMP),
            (3, NO_TIMESTAMP),
        ]
        log.update_high_watermark(4)
        assert offset_for(broker, 0) == (0, KEPT)
        assert offset_for(broker, KEPT + 1) == (-1, -1)  # no record has one at or after
        assert offset_for(broker, MAX_TIMESTAMP) == (0, KEPT)
        # A later record with a timestamp is found past the ones without.
        log.append(build_batch([Record(0, KEPT + 10, None, b"new")]))
        log.update_high_watermark(5)
        assert offset_for(broker, KEPT + 1) == (4, KEPT + 10)
        assert offset_for(broker, MAX_TIMESTAMP) == (4, KEPT + 10)
    finally:
        broker.logs.close()
