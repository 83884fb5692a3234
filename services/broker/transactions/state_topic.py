"""The records of `__transaction_state`, in Kafka's own formats (docs/transactions.md).

Kafka keeps each transactional id's metadata in this compacted internal topic, keyed by the
id, so compaction keeps the latest state of every id; an expired id is a tombstone. The
coordinator of an id is the leader of partition `partition_for(id)` (the same hash as
groups), so every broker finds the same one, and our bytes are the ones Kafka's tools read.

Key (TransactionLogKey v0): int16 version 0, transactional_id string.
Value (TransactionLogValue v0, what Kafka 3.7 writes): int16 version 0, producer_id int64,
producer_epoch int16, transaction_timeout_ms int32, transaction_status int8,
transaction_partitions nullable array (int32 count, -1 null) of {topic string,
partition_ids array of int32}, last_update_timestamp_ms int64, start_timestamp_ms int64.
Strings are int16-length UTF-8.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from directlog.records.errors import CorruptRecordError
from services.broker.transactions.metadata import TxnMetadata, TxnState

TRANSACTION_STATE_TOPIC = "__transaction_state"
KEY_VERSION = 0
VALUE_VERSION = 0

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_VALUE_HEAD = struct.Struct(">hqhib")  # version, producer id, epoch, timeout, status
_TIMES = struct.Struct(">qq")  # last update, start


def _string(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 0x7FFF:
        raise ValueError(f"string of {len(raw)} bytes is too long for an int16 length")
    return _INT16.pack(len(raw)) + raw


def encode_key(transactional_id: str) -> bytes:
    return _INT16.pack(KEY_VERSION) + _string(transactional_id)


def encode_value(metadata: TxnMetadata) -> bytes:
    parts = [
        _VALUE_HEAD.pack(
            VALUE_VERSION,
            metadata.producer_id,
            metadata.producer_epoch,
            metadata.timeout_ms,
            metadata.state,
        )
    ]
    by_topic = _by_topic(metadata.partitions)
    parts.append(_INT32.pack(len(by_topic)))
    for topic, indexes in by_topic:
        parts.append(_string(topic))
        parts.append(_INT32.pack(len(indexes)))
        parts.extend(_INT32.pack(i) for i in indexes)
    parts.append(_TIMES.pack(metadata.last_update_ms, metadata.start_ms))
    return b"".join(parts)


def _by_topic(partitions: Iterable[tuple[str, int]]) -> list[tuple[str, list[int]]]:
    topics: dict[str, list[int]] = {}
    for topic, index in sorted(partitions):
        topics.setdefault(topic, []).append(index)
    return list(topics.items())


class _Reader:
    """Reads a record from disk, trusting no length beyond the record's own end."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise CorruptRecordError(f"{TRANSACTION_STATE_TOPIC} record ends before {n} more bytes")
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def unpack(self, layout: struct.Struct) -> tuple[int, ...]:
        return layout.unpack(self.take(layout.size))

    def count(self) -> int:
        (n,) = self.unpack(_INT32)
        if n < -1 or n > len(self.data):
            raise CorruptRecordError(f"array of {n} entries in a {len(self.data)}-byte record")
        return n

    def string(self) -> str:
        (length,) = self.unpack(_INT16)
        if length < 0:
            raise CorruptRecordError("null where the transaction log has a string")
        return self.take(length).decode("utf-8", "replace")

    def end(self) -> None:
        if self.at != len(self.data):
            raise CorruptRecordError(f"{len(self.data) - self.at} bytes after the record")


def decode_key(data: bytes) -> str:
    reader = _Reader(data)
    (version,) = reader.unpack(_INT16)
    if version != KEY_VERSION:
        raise CorruptRecordError(f"unknown {TRANSACTION_STATE_TOPIC} key version {version}")
    transactional_id = reader.string()
    reader.end()
    return transactional_id


def decode_value(data: bytes) -> TxnMetadata:
    reader = _Reader(data)
    version, producer_id, epoch, timeout_ms, status = reader.unpack(_VALUE_HEAD)
    if version != VALUE_VERSION:
        raise CorruptRecordError(f"unknown {TRANSACTION_STATE_TOPIC} value version {version}")
    try:
        state = TxnState(status)
    except ValueError:
        raise CorruptRecordError(f"unknown transaction status {status}") from None
    partitions: set[tuple[str, int]] = set()
    for _ in range(max(reader.count(), 0)):
        topic = reader.string()
        for _ in range(max(reader.count(), 0)):
            partitions.add((topic, reader.unpack(_INT32)[0]))
    last_update_ms, start_ms = reader.unpack(_TIMES)
    reader.end()
    return TxnMetadata(
        producer_id, epoch, timeout_ms, state, frozenset(partitions), last_update_ms, start_ms
    )
