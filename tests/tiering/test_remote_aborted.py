"""The aborted transactions of remote copies: the `.txnindex` entries a copy ships (those
with records in it, taken from the broker's index) and a broker's remote read answering
them for read_committed consumers, from the copies it spans, cached, beside the local
index; tested on real segment bytes in a real (directory) store."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from directlog.records.batch import Record, build_batch
from directlog.remote import layout
from directlog.remote.index import CorruptIndexError, IndexEntry, RemoteIndex
from directlog.remote.store import RemoteStore, StoreConfig
from directlog.remote.txn_index import (
    ENTRY,
    AbortedTxn,
    decode_aborted,
    encode_aborted,
    overlapping,
    valid_prefix,
)
from directlog.topic_config import LogConfig
from directlog.topics import TopicPartition
from services.broker.metrics import BrokerMetrics
from services.broker.storage import PartitionLog
from services.broker.tiered.remote_reads import RemoteRead, RemoteReader
from services.tiering.manager import _aborted_transactions, _shipped_aborted
from services.tiering.segment_scan import scan_segment

pytestmark = pytest.mark.timeout(60)

T0 = 1_700_000_000_000
PREFIX = "t-x/0"
A = AbortedTxn(7, 40, 130, 131)  # spans both copies below (marker in the second)
B = AbortedTxn(8, 150, 160, 161)  # inside the second
C = AbortedTxn(9, 5, 12, 13)  # inside the first


def test_entries_round_trip_and_anything_else_is_refused():
    data = encode_aborted([C, A, B])
    assert len(data) == 3 * 34 and decode_aborted(data) == [C, A, B]
    assert decode_aborted(b"") == []
    with pytest.raises(CorruptIndexError):
        decode_aborted(data[:-1])  # torn
    with pytest.raises(CorruptIndexError):
        decode_aborted(b"\x00\x01" + data[2:])  # version 1
    with pytest.raises(CorruptIndexError):
        decode_aborted(encode_aborted([A, C]))  # markers out of order
    with pytest.raises(CorruptIndexError):
        decode_aborted(encode_aborted([AbortedTxn(1, 50, 40, 41)]))  # ends before it starts
    # The broker's file may end in a torn append: its whole entries count.
    assert valid_prefix(data + data[:20]) == [C, A, B]


def test_a_copy_ships_the_transactions_with_records_in_it(tmp_path):
    assert _aborted_transactions(tmp_path) == []  # no index yet: none
    (tmp_path / "aborted.txnindex").write_bytes(encode_aborted([C, A, B]) + b"\x00" * 7)
    entries = _aborted_transactions(tmp_path)
    assert entries == [C, A, B]
    assert overlapping(entries, 0, 99) == [C, A]  # A began here, aborted later
    assert overlapping(entries, 100, 199) == [A, B]  # A began before, aborted here
    assert overlapping(entries, 13, 39) == []
    assert overlapping(entries, 131, 149) == []


def test_a_copy_carries_on_what_the_copy_before_it_shipped(tmp_path):
    store = RemoteStore(StoreConfig(f"file://{tmp_path}/store"))
    before = f"{PREFIX}/segments/before.txnindex"
    store.write(before, [encode_aborted([C, A])])
    # A broker that restarted without a producer snapshot indexed B but not A, which began
    # in the copy before and was aborted in this one.
    assert _shipped_aborted(store, before, [B], 100, 199) == [A, B]
    assert _shipped_aborted(store, before, [A, B], 100, 199) == [A, B]  # once
    assert _shipped_aborted(store, None, [B], 100, 199) == [B]  # the first copy
    assert _shipped_aborted(store, before, [], 140, 199) == []  # A ended before it
    # The copy before shipped none (made before copies did), or one that fails its checks:
    # the broker's index alone.
    assert _shipped_aborted(store, f"{PREFIX}/segments/none.txnindex", [B], 100, 199) == [B]
    store.write(before, [b"\x00" * 33])
    assert _shipped_aborted(store, before, [B], 100, 199) == [B]


def segment(tmp_path: Path, base: int, count: int) -> Path:
    """A segment of batches of 5 records of 200 bytes from offset `base`."""
    data = b"".join(
        build_batch([Record(o, T0 + o, b"k", bytes([o % 251]) * 200) for o in range(b, b + 5)])
        for b in range(base, base + count, 5)
    )
    path = tmp_path / f"{base:020d}.log"
    path.write_bytes(data)
    return path


def copy(
    tmp_path: Path, store: RemoteStore, base: int, count: int, txns: bytes | None
) -> tuple[list[IndexEntry], str]:
    """Ship a segment as a copy (with `txns` as its `.txnindex`, or none) and return its
    index entries and its `.log` key."""
    path = segment(tmp_path, base, count)
    key = layout.segment_key(PREFIX, base, uuid.uuid4(), layout.LOG)
    store.write(key, [path.read_bytes()])
    if txns is not None:
        store.write(layout.sibling_key(key, layout.TXN_INDEX), [txns])
    fd = os.open(path, os.O_RDONLY)
    try:
        return scan_segment(fd, path.stat().st_size, store.uri_of(key), base, 4096).entries, key
    finally:
        os.close(fd)


@pytest.fixture
def tiered(tmp_path):
    """A partition log whose offsets 0-199 are in two remote copies and nowhere local, its
    local aborted-transaction index empty (a wiped disk), and a reader of its store."""
    store = RemoteStore(StoreConfig(f"file://{tmp_path}/store"))
    first, first_key = copy(tmp_path, store, 0, 100, encode_aborted([C, A]))
    second, second_key = copy(tmp_path, store, 100, 100, encode_aborted([A, B]))
    directory = tmp_path / "t-0"
    index = RemoteIndex.open(directory, writable=True)
    index.append(first + second, now_ms=0)
    index.close()
    config = LogConfig(remote_storage_enable=True)
    log = PartitionLog.open(directory, config, log_start_offset=0)
    log.truncate_fully_and_start_at(200)
    log.log_start_offset = 0
    reader = RemoteReader(store, 2, 8, BrokerMetrics())
    try:
        yield log, reader, store, (first_key, second_key)
    finally:
        reader.close()
        log.close()


async def read(reader: RemoteReader, log: PartitionLog, offset: int, max_bytes: int) -> RemoteRead:
    read = await reader.read(
        TopicPartition("t", 0), log, offset, max_bytes, min_one_batch=True, wait=30
    )
    assert read is not None
    return read


def test_a_remote_read_answers_the_aborted_transactions_of_the_copies_it_spans(tiered):
    log, reader, _, _ = tiered
    assert log.aborted_transactions(0, 200) == []  # nothing local to answer from

    async def reads() -> None:
        whole = await read(reader, log, 0, 1 << 20)
        assert (whole.first_offset, whole.next_offset) == (0, 200)
        assert whole.aborted == (C, A, B)  # A once, though both copies ship it
        # From inside the second copy: A began in the first but is aborted here.
        tail = await read(reader, log, 135, 1 << 20)
        assert tail.first_offset == 135 and tail.aborted == (B,)
        assert (await read(reader, log, 120, 1 << 20)).aborted == (A, B)
        # A read ending before a transaction starts, or starting after it ended, has none.
        early = await read(reader, log, 15, 1)
        assert early.next_offset <= 40 and early.aborted == ()
        assert (await read(reader, log, 165, 1)).aborted == ()

    asyncio.run(reads())


def test_copies_indexes_are_cached_and_a_copy_without_one_falls_back_to_the_local_index(
    tiered,
):
    log, reader, store, (first_key, second_key) = tiered
    fresh = RemoteReader(store, 1, 4, BrokerMetrics())

    async def reads() -> None:
        assert (await read(reader, log, 0, 1 << 20)).aborted == (C, A, B)
        # Copies never change: once read, a copy's entries come from the cache.
        keys = [layout.sibling_key(k, layout.TXN_INDEX) for k in (first_key, second_key)]
        store.delete(keys)
        assert (await read(reader, log, 0, 1 << 20)).aborted == (C, A, B)
        # A reader that finds no objects (copies made before copies shipped them): what the
        # partition's local index still holds answers.
        assert (await read(fresh, log, 0, 1 << 20)).aborted == ()
        log.aborted.append(B)
        assert (await read(fresh, log, 5, 1 << 20)).aborted == (B,)

    try:
        asyncio.run(reads())
    finally:
        fresh.close()


def test_a_corrupt_copy_index_leaves_the_aborted_transactions_unknown_never_empty(tiered):
    log, reader, store, (first_key, _) = tiered
    store.write(layout.sibling_key(first_key, layout.TXN_INDEX), [b"\x00" * (ENTRY.size - 1)])
    with pytest.raises(CorruptIndexError):
        reader.aborted_transactions(log, log.remote.entries_from(0, 1 << 20), 0)
    # The records still read (read_uncommitted consumers take them); read_committed
    # fetches are refused on `aborted` None (apis.py).
    read_ = asyncio.run(read(reader, log, 0, 1 << 20))
    assert read_.next_offset == 200 and read_.aborted is None
