"""Transaction markers: the control batches that end a transaction in each of its partitions
(KIP-98; docs/transactions.md, "Markers").

A marker is a batch with the transactional and control attributes set, the producer id and
epoch of the transaction, base sequence -1 and one record whose key is the
ControlRecordType (int16 version 0, int16 type: 0 abort, 1 commit) and whose value is the
EndTransactionMarker (int16 version 0, int32 coordinator epoch).
"""

from __future__ import annotations

import struct

from directlog.records.batch import BatchHeader, Record, build_batch, decode_records, read_header
from directlog.records.errors import CorruptRecordError
from directlog.records.varint import Buffer

ABORT, COMMIT = 0, 1  # ControlRecordType
_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator epoch


def build_marker(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    base_offset: int,
    leader_epoch: int,
    timestamp: int,
) -> bytes:
    record = Record(
        base_offset,
        timestamp,
        _KEY.pack(0, COMMIT if commit else ABORT),
        _VALUE.pack(0, coordinator_epoch),
    )
    return build_batch(
        [record],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=leader_epoch,
        transactional=True,
        control=True,
    )


def control_type(key: bytes | None) -> int:
    """The ControlRecordType of a control record's key (ABORT or COMMIT; Kafka ignores
    unknown types, so any other number is returned as it is)."""
    if key is None or len(key) < _KEY.size:
        raise CorruptRecordError(f"control record key of {0 if key is None else len(key)} bytes")
    version, kind = _KEY.unpack_from(key)
    if version < 0:
        raise CorruptRecordError(f"control record key version {version}")
    return int(kind)


def marker_coordinator_epoch(buf: Buffer, position: int) -> int | None:
    """The coordinator epoch in the EndTransactionMarker of the control batch at
    buf[position] (None: its record has no such value)."""
    header = read_header(buf, position, len(buf))
    for record in decode_records(buf, position, header):
        value = record.value
        if value is not None and len(value) >= _VALUE.size:
            return int(_VALUE.unpack_from(value)[1])
    return None


class AbortedFilter:
    """Which batches a read_committed reader drops, from the aborted transactions a Fetch
    names — (producer id, first offset) — as Kafka's consumers decide it, batch by batch
    in offset order: a producer's transactional batches are dropped from its aborted
    transaction's first offset until its ABORT marker; control batches always are."""

    def __init__(self, aborted: list[tuple[int, int]]) -> None:
        self._pending = sorted(aborted, key=lambda entry: entry[1], reverse=True)
        self._aborting: set[int] = set()

    def drops(self, buf: Buffer, position: int, header: BatchHeader) -> bool:
        producer_id = header.producer_id
        if producer_id >= 0:
            while self._pending and self._pending[-1][1] <= header.last_offset:
                self._aborting.add(self._pending.pop()[0])
            if header.is_control:
                records = decode_records(buf, position, header)
                if records and control_type(records[0].key) == ABORT:
                    self._aborting.discard(producer_id)
            elif header.is_transactional and producer_id in self._aborting:
                return True
        return header.is_control
