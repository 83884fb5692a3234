"""`__transaction_state` records byte by byte as Kafka writes them (TransactionLogKey v0,
TransactionLogValue v0), and decoding that trusts no length."""

from __future__ import annotations

import struct

import pytest

from directlog.records.errors import CorruptRecordError
from services.broker.transactions.metadata import TxnMetadata, TxnState
from services.broker.transactions.state_topic import (
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)

METADATA = TxnMetadata(
    producer_id=0x0102030405060708,
    producer_epoch=3,
    timeout_ms=60_000,
    state=TxnState.ONGOING,
    partitions=frozenset({("orders", 2), ("orders", 0), ("audit", 5)}),
    last_update_ms=1_700_000_000_123,
    start_ms=1_700_000_000_000,
)


def test_key_bytes() -> None:
    assert encode_key("tx-1") == b"\x00\x00" + b"\x00\x04tx-1"
    assert decode_key(encode_key("tx-é")) == "tx-é"


def test_value_bytes_are_kafkas_v0() -> None:
    expected = (
        struct.pack(">hqhib", 0, 0x0102030405060708, 3, 60_000, 1)
        + struct.pack(">i", 2)  # two topics, sorted by name
        + b"\x00\x05audit"
        + struct.pack(">ii", 1, 5)
        + b"\x00\x06orders"
        + struct.pack(">iii", 2, 0, 2)
        + struct.pack(">qq", 1_700_000_000_123, 1_700_000_000_000)
    )
    assert encode_value(METADATA) == expected
    assert decode_value(expected) == METADATA


def test_null_partitions_read_as_none() -> None:
    value = struct.pack(">hqhib", 0, 9, 0, 1000, 4) + struct.pack(">i", -1) + bytes(16)
    decoded = decode_value(value)
    assert decoded.partitions == frozenset()
    assert decoded.state is TxnState.COMPLETE_COMMIT


@pytest.mark.parametrize(
    "data",
    [
        encode_value(METADATA)[:-1],  # cut short
        encode_value(METADATA) + b"\x00",  # trailing byte
        struct.pack(">h", 1) + encode_value(METADATA)[2:],  # a version we do not write
        encode_value(METADATA)[:17] + struct.pack(">i", 1 << 30),  # count past the end
        encode_value(METADATA)[:16] + b"\x09" + encode_value(METADATA)[17:],  # no such status
    ],
)
def test_corrupt_values_are_refused(data: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        decode_value(data)


def test_corrupt_keys_are_refused() -> None:
    with pytest.raises(CorruptRecordError):
        decode_key(b"\x00\x01\x00\x01x")
    with pytest.raises(CorruptRecordError):
        decode_key(b"\x00\x00\x00\x09x")
