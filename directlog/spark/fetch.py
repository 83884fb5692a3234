"""One offset range of one partition read into Arrow record batches, on a Spark executor.

The range is fetched from the partition's leader with Fetch v12 over a plain blocking
socket (a task reads one range, start to end), and each answer's batches go to Arrow column
buffers in one C pass (directlog/records/_scan.c `record_columns`): no Python object is
made per record.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from directlog.client.common import RdmaConfig, leader_address
from directlog.protocol import replica_fetch
from directlog.protocol.errors import ErrorCode
from directlog.records._scan import record_columns
from directlog.records.batch import decode_records, iter_batches, read_header, records_area
from directlog.records.varint import Buffer
from directlog.spark.offsets import OffsetRange, metadata_client
from directlog.spark.options import ReadOptions

FETCH_BYTES = 8 << 20  # one answer, at most
# An answer holds at least one whole batch, however large; past this a length prefix is
# taken for garbage (librdkafka's receive.message.max.bytes default).
MAX_ANSWER = 100_000_000
MAX_DECOMPRESSED = 64 << 20
WAIT_MS = 500
ATTEMPTS = 10  # leader changes and the like, each after a back-off
TIMEOUT = 30.0

BINARY = pa.binary()
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
)
SCHEMA_WITH_HEADERS = SCHEMA.append(pa.field("headers", HEADER_TYPE))

_RETRIABLE = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
}


class DataLossError(RuntimeError):
    """Offsets the query was to read are gone (retention, DeleteRecords) while
    failOnDataLoss is true."""


@dataclass(frozen=True)
class RangeRead:
    """What a task reads: `topic`-`partition` from `start` up to `end` (exclusive)."""

    client: dict[str, str]  # kafka.* options
    topic: str
    partition: int
    start: int
    end: int
    include_headers: bool
    fail_on_data_loss: bool
    rdma: RdmaConfig | None = None  # read over RDMA (rdma.consume), else over TCP


def range_reads(options: ReadOptions, ranges: list[OffsetRange]) -> list[RangeRead]:
    """What the tasks of a read get: its offset ranges with the options they need."""
    return [
        RangeRead(
            options.client,
            r.topic,
            r.partition,
            r.start,
            r.end,
            options.include_headers,
            options.fail_on_data_loss,
            options.rdma,
        )
        for r in ranges
    ]


def read_range(read: RangeRead) -> Iterator[pa.RecordBatch]:
    """The records of `read` in offset order, as Arrow record batches of SCHEMA (with
    headers: SCHEMA_WITH_HEADERS), over RDMA when the read asks for it."""
    if read.rdma is None:
        return read_over_tcp(read)
    # Imported here, where it is used: rdma_fetch builds on this module.
    from directlog.spark.rdma_fetch import read_over_rdma

    return read_over_rdma(read)


def read_over_tcp(read: RangeRead) -> Iterator[pa.RecordBatch]:
    """read_range's records, fetched from the partition's leader."""
    offset = read.start
    failures = 0
    while offset < read.end:
        try:
            with _Leader(read) as leader:
                while offset < read.end:
                    answer = leader.fetch(offset)
                    code = answer.error_code
                    if code == ErrorCode.OFFSET_OUT_OF_RANGE and offset < answer.log_start_offset:
                        offset = _lost(read, offset, answer.log_start_offset)
                        continue
                    if code in _RETRIABLE:
                        raise _Retry(f"{read.topic}-{read.partition}: {ErrorCode(code).name}")
                    if code != ErrorCode.NONE:
                        raise RuntimeError(
                            f"reading {read.topic}-{read.partition} at {offset}: "
                            f"{ErrorCode(code).name}"
                        )
                    batch, offset = _columns(read, answer.records, offset)
                    if batch is not None and batch.num_rows:
                        yield batch
                    failures = 0
        except (_Retry, OSError) as error:
            failures += 1
            if failures >= ATTEMPTS:
                raise RuntimeError(
                    f"reading {read.topic}-{read.partition} failed: {error}"
                ) from error
            time.sleep(min(0.1 * 2**failures, 2.0))


def _lost(read: RangeRead, offset: int, log_start: int) -> int:
    if read.fail_on_data_loss:
        raise DataLossError(
            f"{read.topic}-{read.partition}: offsets {offset} to {log_start - 1} were deleted "
            "(retention or DeleteRecords) before the query read them; set failOnDataLoss "
            "to false to skip them"
        )
    return min(log_start, read.end)


def _columns(
    read: RangeRead, records: memoryview, offset: int
) -> tuple[pa.RecordBatch | None, int]:
    """The rows of the whole batches in `records` from `offset` up to read.end, and the
    offset to fetch next.

    C walks the batches (record_columns); compressed ones need the Python codecs, so C
    names those it met and takes their records inflated on a second call."""
    found = record_columns(records, offset, read.end, read.include_headers, {})
    if isinstance(found, list):
        inflated = _inflate(records, found)
        found = record_columns(records, offset, read.end, read.include_headers, inflated)
        assert not isinstance(found, list), "record_columns had every batch it named"
    if found is None:  # not decodable in C: let the Python decoder name the fault
        for position, header in iter_batches(records):
            decode_records(records, position, header, MAX_DECOMPRESSED)
        raise RuntimeError(f"{read.topic}-{read.partition}: records at {offset} do not decode")
    next_offset, columns = found
    return (None if columns is None else _record_batch(read, columns)), next_offset


def _inflate(records: memoryview, positions: list[int]) -> dict[int, Buffer]:
    """The decompressed records of the batches at `positions`, for record_columns."""
    return {
        position: records_area(records, position, read_header(records, position), MAX_DECOMPRESSED)
        for position in positions
    }


def _record_batch(read: RangeRead, columns: tuple) -> pa.RecordBatch:  # type: ignore[type-arg]
    rows, offsets, timestamps, types, keys, values, headers = columns
    arrays = [
        _binary(rows, keys),
        _binary(rows, values),
        pa.repeat(read.topic, rows).cast(pa.string()),
        pa.repeat(pa.scalar(read.partition, pa.int32()), rows),
        pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), rows, [None, pa.py_buffer(timestamps)]),
        pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(types)]),
    ]
    if not read.include_headers:
        return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)
    list_offsets, names, header_values = headers
    count = int.from_bytes(list_offsets[-4:], "little")  # header entries in all
    entries = pa.StructArray.from_arrays(
        [_binary(count, names, pa.string()), _binary(count, header_values)], ["key", "value"]
    )
    bounds = pa.Array.from_buffers(pa.int32(), rows + 1, [None, pa.py_buffer(list_offsets)])
    # Spark's Kafka source: a record without headers has null headers, not an empty list.
    empty = pc.equal(pc.subtract(bounds[1:], bounds[:-1]), 0)
    arrays.append(pa.ListArray.from_arrays(bounds, entries, mask=empty))
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA_WITH_HEADERS)


def _binary(rows: int, column: tuple, kind: pa.DataType = BINARY) -> pa.Array:  # type: ignore[type-arg]
    valid, offsets, data, nulls = column
    buffers = [pa.py_buffer(valid) if nulls else None, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(kind, rows, buffers, null_count=nulls)


class _Retry(Exception):
    """A failure worth another attempt from a fresh look at the partition's leader."""


class _Leader:
    """A connection to the partition's current leader, fetching one offset at a time."""

    def __init__(self, read: RangeRead) -> None:
        self.read = read
        self._correlation = itertools.count(1)
        metadata = metadata_client(read.client)
        try:
            host, port = leader_address(metadata, read.topic, read.partition, TIMEOUT).rsplit(
                ":", 1
            )
        except Exception as error:
            raise _Retry(str(error)) from error
        finally:
            metadata.close()
        self._socket = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        self._buffer = bytearray()  # _receive's, reused from answer to answer

    def __enter__(self) -> _Leader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._socket.close()

    def fetch(self, offset: int) -> replica_fetch.FetchedPartition:
        position = replica_fetch.FetchPosition(
            self.read.topic, self.read.partition, -1, offset, -1, FETCH_BYTES
        )
        frame = replica_fetch.encode_request(
            next(self._correlation), "directlog-spark", -1, WAIT_MS, FETCH_BYTES, [position]
        )
        self._socket.sendall(frame)
        size = int.from_bytes(self._receive(4), "big")
        if size > MAX_ANSWER:
            raise RuntimeError(
                f"{self.read.topic}-{self.read.partition}: an answer of {size} bytes (at most "
                f"{MAX_ANSWER}): not a Fetch response"
            )
        _, code, partitions = replica_fetch.decode_response(self._receive(size))
        if code != ErrorCode.NONE or len(partitions) != 1:
            raise _Retry(f"fetch answered {code}")
        return partitions[0]

    def _receive(self, size: int) -> memoryview:
        """The next `size` bytes, in the connection's one receive buffer (a new zero-filled
        bytearray per answer, up to 8 MiB, was a cost of its own). The view holds until the
        next call: nothing made of an answer outlives it, as record_columns copies the
        records into new buffers for Arrow."""
        if size > len(self._buffer):
            # A new buffer, views of the old stay valid; an eighth more, so that answers
            # growing by a few bytes do not each allocate.
            self._buffer = bytearray(size + size // 8)
        view = memoryview(self._buffer)[:size]
        filled = 0
        while filled < size:
            received = self._socket.recv_into(view[filled:])
            if not received:
                raise ConnectionError("the leader closed the connection mid-answer")
            filled += received
        return view
