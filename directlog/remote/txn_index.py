"""Kafka's transaction index entries (AbortedTxn, 34 bytes), in two places: a broker's
`aborted.txnindex` per partition (services/broker/storage/txn_index.py) and the
`.txnindex` object a tiering service uploads with each copied segment, so read_committed
fetches of remote records know the aborted transactions they hold after the local index
is gone (docs/formats.md "Remote transaction index").

An entry: int16 version 0, int64 producer id, int64 first offset (the transaction's first
batch), int64 last offset (its ABORT marker), int64 the last stable offset when the marker
was written. Entries are in marker order.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

from directlog.remote.index import CorruptIndexError

PARTITION_FILE = "aborted.txnindex"  # the broker's per-partition index, in its directory
ENTRY = struct.Struct(">hqqqq")  # version, producer id, first, last, last stable offset
VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int


def encode_aborted(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(ENTRY.pack(VERSION, *entry) for entry in entries)


def valid_prefix(data: bytes | memoryview) -> list[AbortedTxn]:
    """The entries up to the first torn, foreign or out-of-order one: what a file that a
    crash may have cut mid-append holds for sure."""
    entries: list[AbortedTxn] = []
    for at in range(0, len(data) - ENTRY.size + 1, ENTRY.size):
        version, *fields = ENTRY.unpack_from(data, at)
        entry = AbortedTxn(*fields)
        if version != VERSION or (entries and entry.last_offset <= entries[-1].last_offset):
            break
        entries.append(entry)
    return entries


def decode_aborted(data: bytes | memoryview) -> list[AbortedTxn]:
    """Every entry of a whole `.txnindex` object; CorruptIndexError unless all of it is
    valid entries (version 0, first <= last, markers increasing)."""
    if len(data) % ENTRY.size:
        raise CorruptIndexError(f"a transaction index of {len(data)} bytes: a torn entry")
    entries = valid_prefix(data)
    if len(entries) * ENTRY.size != len(data):
        raise CorruptIndexError(
            f"an invalid transaction index entry at {len(entries) * ENTRY.size}"
        )
    if any(not 0 <= e.first_offset <= e.last_offset for e in entries):
        raise CorruptIndexError("a transaction index entry ending before it starts")
    return entries


def overlapping(entries: Iterable[AbortedTxn], first: int, last: int) -> list[AbortedTxn]:
    """The aborted transactions with records among offsets first..last (inclusive): started
    at or before `last`, aborted at or after `first`."""
    return [e for e in entries if e.first_offset <= last and e.last_offset >= first]
