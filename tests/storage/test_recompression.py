"""compression.type other than "producer": the leader stores produced batches in the
topic's codec (Kafka's LogValidator rebuilds a batch whose codec differs), records, offsets,
timestamps and producer fields kept; "producer" stores the producer's bytes untouched."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from directlog.records.batch import (
    Record,
    TimestampType,
    build_batch,
    decode_records,
    iter_batches,
)
from directlog.records.compression import Compression
from directlog.records.errors import CorruptRecordError
from directlog.topic_config import COMPRESSION_TYPES, LogConfig
from services.broker.storage import PartitionLog
from services.broker.storage.errors import MessageTooLargeError
from services.broker.storage.validator import recompressed
from tests.storage.helpers import T0, ManualClock, batch, read_all

pytestmark = pytest.mark.timeout(60)

OpenLog = Callable[..., PartitionLog]
VALUES = [b"value-%d-" % i + b"x" * (50 * i) for i in range(5)]


def stored_batches(log: PartitionLog) -> list[tuple[Compression, bytes]]:
    """Each stored batch's codec and bytes, read through the fetch path."""
    data = log.read(0, 1 << 20).records.read()
    return [
        (header.compression, data[pos : pos + header.size]) for pos, header in iter_batches(data)
    ]


@pytest.mark.parametrize("target", sorted(COMPRESSION_TYPES))
@pytest.mark.parametrize("source", list(Compression))
def test_batches_are_stored_in_the_topics_codec(
    open_log: OpenLog, target: str, source: Compression
) -> None:
    log = open_log(LogConfig.from_properties({"compression.type": target}))
    log.append(batch([b"first"], ts=T0))  # the second batch's offsets follow a first
    result = log.append(batch(VALUES, ts=T0 + 10, compression=source))
    assert (result.first_offset, result.last_offset) == (1, 5)
    stored = stored_batches(log)
    assert [codec for codec, _ in stored] == [COMPRESSION_TYPES[target]] * 2
    records = read_all(log)
    assert [r.value for r in records] == [b"first", *VALUES]
    assert [r.offset for r in records] == list(range(6))
    assert [r.timestamp for r in records[1:]] == [T0 + 10 + i for i in range(5)]
    assert [r.key for r in records[1:]] == [b"key-%d" % i for i in range(5)]


@pytest.mark.parametrize("source", list(Compression))
def test_producer_keeps_the_producers_bytes(open_log: OpenLog, source: Compression) -> None:
    log = open_log(LogConfig.from_properties({"compression.type": "producer"}))
    produced = batch(VALUES, compression=source)
    assert recompressed(produced, log.config) is produced
    log.append(produced)
    ((codec, stored),) = stored_batches(log)
    assert codec is source
    assert stored[61:] == produced[61:]  # the records area as the producer compressed it


def test_same_codec_is_not_rebuilt() -> None:
    produced = batch(VALUES, compression=Compression.LZ4)
    assert recompressed(produced, LogConfig(compression_type="lz4")) is produced


def test_producer_fields_survive_and_a_retry_is_a_duplicate(open_log: OpenLog) -> None:
    log = open_log(LogConfig(compression_type="zstd"))
    records = [r._replace(offset=i) for i, r in enumerate(_records(3))]
    produced = build_batch(
        records,
        compression=Compression.GZIP,
        producer_id=7,
        producer_epoch=2,
        base_sequence=0,
        transactional=True,
    )
    first = log.append(produced)
    again = log.append(produced)
    assert again.duplicate and (again.first_offset, again.last_offset) == (0, 2)
    assert first.last_offset == 2 and log.log_end_offset == 3
    data = log.read(0, 1 << 20).records.read()
    ((pos, header),) = list(iter_batches(data))
    assert header.compression is Compression.ZSTD
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 0)
    assert header.is_transactional
    assert [r.value for r in decode_records(data, pos, header)] == [r.value for r in records]


def test_log_append_time_is_stamped_on_the_rebuilt_batch(
    open_log: OpenLog, clock: ManualClock
) -> None:
    log = open_log(
        LogConfig.from_properties(
            {"compression.type": "snappy", "message.timestamp.type": "LogAppendTime"}
        )
    )
    clock.now = T0 + 5000
    result = log.append(batch(VALUES, ts=T0))
    assert result.log_append_time == T0 + 5000
    data = log.read(0, 1 << 20).records.read()
    ((pos, header),) = list(iter_batches(data))
    assert header.compression is Compression.SNAPPY
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert {r.timestamp for r in decode_records(data, pos, header)} == {T0 + 5000}


def test_a_corrupt_batch_is_refused_not_laundered(open_log: OpenLog) -> None:
    log = open_log(LogConfig(compression_type="gzip"))
    good = batch(VALUES)
    bad = good[:70] + bytes([good[70] ^ 0xFF]) + good[71:]
    with pytest.raises(CorruptRecordError, match="CRC"):
        log.append(bad)
    assert log.log_end_offset == 0 and log.read(0, 1 << 20).records.read() == b""


def test_the_produced_size_counts_against_max_message_bytes(open_log: OpenLog) -> None:
    """As Kafka: the batch as it came is checked, whatever it shrinks to."""
    produced = batch([b"z" * 4000])
    log = open_log(LogConfig(compression_type="zstd", max_message_bytes=len(produced) - 1))
    with pytest.raises(MessageTooLargeError):
        log.append(produced)
    assert log.log_end_offset == 0
    log.append(batch([b"z" * 3000]))
    assert stored_batches(log)[0][0] is Compression.ZSTD


def _records(count: int) -> list[Record]:
    data = batch([b"r%d" % i for i in range(count)])
    ((pos, header),) = list(iter_batches(data))
    return decode_records(data, pos, header)
