"""The remoteLogIndex entry and the RDI, byte for byte (docs/formats.md "Remote indexes")."""

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from directlog.remote.index import (
    ENTRY_OVERHEAD,
    CorruptIndexError,
    IndexEntry,
    decode_entries,
    decode_entry,
    encode_entries,
)
from directlog.remote.rdi import InvalidRdiError, RemoteDataId

URI = "s3://bucket/prefix/orders-AAAAAAAAAAAAAAAAAAAAAA/0/segments/00000000000000000000-x.log"


def entry(first: int = 100, last: int = 149, length: int = 4096, position: int = 0) -> IndexEntry:
    return IndexEntry(
        first, last, 1_700_000_000_000, 1_700_000_000_500, RemoteDataId(URI, position, length)
    )


def test_an_entry_is_the_seeds_layout():
    e = entry()
    data = e.encode()
    rdi = f"{URI}#bytes=0-4095".encode()
    assert len(data) == ENTRY_OVERHEAD + len(rdi) == 46 + len(rdi)
    magic, length, crc = struct.unpack_from(">hhI", data)
    assert (magic, length) == (0, len(data))
    assert crc == crc32c(data[8:])  # from firstOffset to the end of the entry
    fields = struct.unpack_from(">qqqqih", data, 8)
    assert fields == (100, 149, 1_700_000_000_000, 1_700_000_000_500, 4096, len(rdi))
    assert data[46:] == rdi
    assert decode_entry(data) == (e, len(data))


@given(
    first=st.integers(0, 2**62),
    span=st.integers(0, 2**20),
    timestamps=st.tuples(st.integers(-1, 2**50), st.integers(-1, 2**50)),
    position=st.integers(0, 2**40),
    length=st.integers(1, 2**31 - 1),
    key=st.text(
        st.characters(min_codepoint=33, exclude_characters="#", exclude_categories=("Cs",)),
        min_size=1,
        max_size=200,
    ),
)
def test_entries_round_trip(first, span, timestamps, position, length, key):
    e = IndexEntry(
        first, first + span, *timestamps, RemoteDataId(f"file:///{key}", position, length)
    )
    assert decode_entry(e.encode()) == (e, len(e.encode()))


@pytest.mark.parametrize(
    ("flip_at", "problem"),
    [(1, "magic"), (3, "length"), (5, "CRC"), (20, "CRC"), (-1, "CRC")],
)
def test_a_damaged_entry_is_refused(flip_at, problem):
    data = bytearray(entry().encode())
    data[flip_at] ^= 0x40
    with pytest.raises(CorruptIndexError, match=problem):
        decode_entry(bytes(data))


def test_a_torn_entry_is_refused():
    data = entry().encode()
    for cut in (1, ENTRY_OVERHEAD - 1, ENTRY_OVERHEAD + 5, len(data) - 1):
        with pytest.raises(CorruptIndexError):
            decode_entry(data[:cut])


def test_entries_in_a_row_must_follow_each_other():
    first, second = entry(0, 99), entry(100, 199, position=4096)
    assert decode_entries(encode_entries([first, second])) == [first, second]
    with pytest.raises(CorruptIndexError):
        decode_entries(encode_entries([second, first]))


def test_rdi_text_and_its_refusals():
    rdi = RemoteDataId("hdfs://nn:8020/data/x.log", 10, 5)
    assert rdi.encode() == b"hdfs://nn:8020/data/x.log#bytes=10-14"
    assert RemoteDataId.decode(rdi.encode()) == rdi and rdi.end == 15
    for raw in (
        b"file:///x",
        b"file:///x#bytes=5",
        b"file:///x#bytes=a-b",
        b"\xff#bytes=0-1",
        b"#bytes=0-1",
        b"file:///x#bytes=9-3",
    ):
        with pytest.raises(InvalidRdiError):
            RemoteDataId.decode(raw)
