"""fetch._columns: the record batches of a fetched blob as Arrow rows, walked in C
(record_columns), checked against the walk _columns made in Python (iter_batches and
decode_records): compressed batches (inflated by the Python codecs on a second call),
control and empty batches, LogAppendTime, headers, a trailing partial batch, `end` inside a
batch; and faults, which the Python decoder still names. No broker, no Spark.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from directlog.records._scan import record_columns
from directlog.records.batch import (
    ATTRIBUTES_AT,
    CRC_AT,
    HEADER_SIZE,
    Header,
    Record,
    TimestampType,
    build_batch,
    decode_records,
    iter_batches,
    read_header,
    rewrite_header,
)
from directlog.records.compression import Compression
from directlog.records.errors import CorruptRecordError, UnsupportedMagicError
from directlog.spark.fetch import RangeRead, _columns

TOPIC = "columns"
PARTITION = 3
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
APPEND_TIME = 1_700_000_999_000  # the broker's clock, for LogAppendTime batches


def range_read(start: int, end: int, headers: bool) -> RangeRead:
    return RangeRead({}, TOPIC, PARTITION, start, end, headers, True)


def reference(blob: bytes, start: int, end: int, headers: bool) -> tuple[list[Any], int]:
    """The rows and next offset _columns gave when it walked the batches in Python."""
    rows = []
    next_offset = start
    for position, header in iter_batches(blob):
        next_offset = max(next_offset, header.next_offset)
        if not header.is_control and header.records_count:
            kind = int(header.timestamp_type)
            for r in decode_records(blob, position, header):
                if start <= r.offset < end:
                    rows.append(row(r, kind, headers))
        if header.next_offset >= end:
            break
    return rows, next_offset


def row(record: Record, timestamp_type: int, headers: bool) -> dict[str, Any]:
    found = {
        "key": record.key,
        "value": record.value,
        "topic": TOPIC,
        "partition": PARTITION,
        "offset": record.offset,
        "timestamp": EPOCH + timedelta(milliseconds=record.timestamp),
        "timestampType": timestamp_type,
    }
    if headers:
        entries = [{"key": h.key, "value": h.value} for h in record.headers]
        found["headers"] = entries or None  # as Spark: no headers is null
    return found


def read(blob: bytes, start: int, end: int, headers: bool) -> tuple[list[Any], int]:
    batch, next_offset = _columns(range_read(start, end, headers), memoryview(blob), start)
    assert batch is None or batch.num_rows
    return ([] if batch is None else batch.to_pylist()), next_offset


def batch_of(
    offsets: list[int],
    *,
    base: int = 1_700_000_000_000,
    compression: Compression = Compression.NONE,
    log_append: bool = False,
    control: bool = False,
    with_headers: bool = False,
) -> bytes:
    records = [
        Record(
            o,
            base + 10 * i,
            None if o % 3 == 0 else b"k%d" % o,  # null keys, null and empty values
            None if o % 5 == 4 else b"v%d" % o * (o % 7),
            headers_of(o) if with_headers else (),
        )
        for i, o in enumerate(offsets)
    ]
    kind = TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME
    batch = build_batch(records, compression=compression, timestamp_type=kind, control=control)
    if not log_append:
        return batch
    header = read_header(batch)
    stamped = rewrite_header(
        batch,
        0,
        header,
        base_offset=header.base_offset,
        leader_epoch=header.partition_leader_epoch,
        attributes=header.attributes,
        max_timestamp=APPEND_TIME,
    )
    return stamped + batch[HEADER_SIZE:]


def headers_of(offset: int) -> tuple[Header, ...]:
    return (Header(f"h{offset}", None if offset % 2 else b"x%d" % offset), Header("", b""))


def empty_batch(base_offset: int, last_offset_delta: int) -> bytes:
    """A batch whose records compaction removed: a header with a count of 0."""
    header = bytearray(batch_of([base_offset])[:HEADER_SIZE])
    struct.pack_into(">i", header, 8, HEADER_SIZE - 12)
    struct.pack_into(">i", header, 23, last_offset_delta)
    struct.pack_into(">i", header, 57, 0)
    struct.pack_into(">I", header, CRC_AT, crc32c(header[ATTRIBUTES_AT:]))
    return bytes(header)


def test_rows_of_uncompressed_batches_from_start_to_end() -> None:
    blob = batch_of([0, 1, 2]) + batch_of([3, 4]) + batch_of([5, 6, 7])
    rows, next_offset = read(blob, 1, 7, False)
    assert [r["offset"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert (rows, next_offset) == reference(blob, 1, 7, False)
    assert next_offset == 8  # the batch `end` falls in is read whole


def test_walk_stops_after_the_batch_reaching_end() -> None:
    blob = batch_of([0, 1]) + batch_of([2, 3]) + b"\x00" * 80  # garbage after `end`
    assert read(blob, 0, 2, False) == reference(blob, 0, 2, False)
    assert read(blob, 0, 2, False)[1] == 2


@pytest.mark.parametrize("codec", [c for c in Compression if c is not Compression.NONE])
def test_compressed_batches_are_inflated_by_the_python_codecs(codec: Compression) -> None:
    blob = batch_of([0, 1]) + batch_of([2, 3, 4], compression=codec) + batch_of([5])
    positions = [position for position, _ in iter_batches(blob)]
    assert record_columns(blob, 0, 10, False, {}) == [positions[1]]
    assert read(blob, 0, 10, True) == reference(blob, 0, 10, True)
    assert [r["offset"] for r in read(blob, 0, 10, True)[0]] == [0, 1, 2, 3, 4, 5]


def test_control_and_empty_batches_are_skipped_but_advance_the_offset() -> None:
    blob = batch_of([0, 1]) + batch_of([2], control=True) + empty_batch(3, 4) + batch_of([8])
    rows, next_offset = read(blob, 0, 100, False)
    assert [r["offset"] for r in rows] == [0, 1, 8]
    assert next_offset == 9
    only_skipped = batch_of([2], control=True) + empty_batch(3, 4)
    assert read(only_skipped, 2, 100, False) == ([], 8)


def test_log_append_time_stamps_every_record_with_the_batch_max_timestamp() -> None:
    blob = batch_of([0, 1, 2], log_append=True) + batch_of([3, 4], log_append=True)
    rows, _ = read(blob, 0, 5, False)
    assert {r["timestamp"] for r in rows} == {EPOCH + timedelta(milliseconds=APPEND_TIME)}
    assert {r["timestampType"] for r in rows} == {1}
    assert read(blob, 0, 5, False) == reference(blob, 0, 5, False)


def test_headers_become_a_list_column_null_for_records_without_headers() -> None:
    blob = batch_of([0, 1], with_headers=True) + batch_of([2])
    rows, _ = read(blob, 0, 3, True)
    assert rows[1]["headers"] == [{"key": "h1", "value": None}, {"key": "", "value": b""}]
    assert rows[2]["headers"] is None
    assert (rows, 3) == reference(blob, 0, 3, True)
    assert "headers" not in read(blob, 0, 3, False)[0][0]


def test_a_trailing_partial_batch_ends_the_walk() -> None:
    whole = batch_of([0, 1])
    for cut in (1, 11, 12, 40, HEADER_SIZE, HEADER_SIZE + 3):
        blob = whole + batch_of([2, 3])[:cut]
        assert read(blob, 0, 10, False) == reference(blob, 0, 10, False) != ([], 0)
    assert read(batch_of([0, 1])[: HEADER_SIZE + 3], 0, 10, False) == ([], 0)


def test_sparse_offsets_outside_the_range_are_left_out() -> None:
    blob = batch_of([10, 13, 17, 20]) + batch_of([24, 30])
    rows, next_offset = read(blob, 14, 25, False)
    assert [r["offset"] for r in rows] == [17, 20, 24]
    assert next_offset == 31
    assert read(blob, 31, 40, False) == ([], 31)


def test_a_corrupt_record_is_named_by_the_python_decoder() -> None:
    good = batch_of([0, 1])
    bad = bytearray(batch_of([2, 3]))
    bad[HEADER_SIZE] = 0x7F  # the first record's length: far beyond the batch
    with pytest.raises(CorruptRecordError, match=r"record 0: length -64 does not fit"):
        _columns(range_read(0, 10, False), memoryview(good + bad), 0)


def test_a_corrupt_header_is_named_by_the_python_decoder() -> None:
    bad = bytearray(batch_of([2, 3]))
    bad[16] = 1  # magic
    with pytest.raises(UnsupportedMagicError, match=r"magic 1 at byte \d+, expected 2"):
        _columns(range_read(0, 10, False), memoryview(batch_of([0, 1]) + bad), 0)


def test_corrupt_compressed_records_are_named_by_the_codec() -> None:
    bad = bytearray(batch_of([2, 3], compression=Compression.ZSTD))
    bad[HEADER_SIZE + 4 :] = b"\xff" * (len(bad) - HEADER_SIZE - 4)
    with pytest.raises(CorruptRecordError, match="zstd"):
        _columns(range_read(0, 10, False), memoryview(batch_of([0, 1]) + bad), 0)


def test_a_fault_after_end_is_not_read() -> None:
    bad = bytearray(batch_of([2, 3]))
    bad[HEADER_SIZE] = 0x7F
    assert read(batch_of([0, 1]) + bad, 0, 2, False)[1] == 2


@st.composite
def blobs(draw: st.DrawFn) -> tuple[bytes, int, int, bool]:
    """Batches of every kind at increasing (sometimes sparse) offsets, maybe a partial one
    after them, and a range that starts and ends anywhere around them."""
    parts = []
    offset = draw(st.integers(0, 5))
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.integers(0, 9)) == 0:
            last_delta = draw(st.integers(0, 3))
            parts.append(empty_batch(offset, last_delta))
            offset += last_delta + 1
            continue
        gaps = draw(st.lists(st.integers(1, 3), min_size=1, max_size=6))
        offsets = [offset + sum(gaps[:i]) - 1 for i in range(1, len(gaps) + 1)]
        parts.append(
            batch_of(
                offsets,
                compression=draw(st.sampled_from(Compression)),
                log_append=draw(st.booleans()),
                control=draw(st.integers(0, 7)) == 0,
                with_headers=draw(st.booleans()),
            )
        )
        offset = offsets[-1] + 1
    blob = b"".join(parts)
    if draw(st.booleans()):
        partial = batch_of([offset, offset + 1])
        blob += partial[: draw(st.integers(1, len(partial) - 1))]
    start = draw(st.integers(0, offset + 1))
    end = draw(st.integers(start + 1, offset + 3))
    return blob, start, end, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(blobs())
def test_columns_agree_with_the_python_walk(case: tuple[bytes, int, int, bool]) -> None:
    blob, start, end, headers = case
    assert read(blob, start, end, headers) == reference(blob, start, end, headers)


def test_rows_do_not_point_into_the_fetched_bytes() -> None:
    """fetch._Leader reuses its receive buffer for the next answer."""
    blob = bytearray(batch_of([0, 1], with_headers=True) + batch_of([2, 3]))
    batch, _ = _columns(range_read(0, 4, True), memoryview(blob), 0)
    assert batch is not None
    rows = batch.to_pylist()
    blob[:] = bytes(len(blob))
    assert batch.to_pylist() == rows
