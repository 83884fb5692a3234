"""__consumer_offsets record formats (Kafka's) and the group -> partition mapping."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.records.errors import CorruptRecordError
from services.broker.groups.offsets_topic import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
    partition_for,
    subscribed_topics,
)


def test_partition_for_follows_java_string_hash_code() -> None:
    assert partition_for("", 50) == 0
    assert partition_for("hello", 1 << 30) == 99162322  # "hello".hashCode()
    assert partition_for("hello", 50) == 99162322 % 50
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE: Kafka's Utils.abs makes it 0.
    assert partition_for("polygenelubricants", 50) == 0
    # A negative hash: "Aa-negative" style strings wrap; the result is still in range.
    assert all(0 <= partition_for(f"group-{i}-é😀", 7) < 7 for i in range(200))


def test_offset_commit_key_and_value_are_kafkas_bytes() -> None:
    key = encode_offset_key(OffsetKey("g", "t", 3))
    assert key == struct.pack(">hh1sh1si", 1, 1, b"g", 1, b"t", 3)
    value = encode_offset_value(OffsetValue(42, 7, "meta", 1000))
    assert value == struct.pack(">hqih4sq", 3, 42, 7, 4, b"meta", 1000)
    assert decode_key(key) == OffsetKey("g", "t", 3)
    assert decode_offset_value(value) == OffsetValue(42, 7, "meta", 1000)


def test_older_offset_value_versions_decode() -> None:
    v1 = struct.pack(">hqh1sqq", 1, 5, 1, b"m", 100, 200)  # with expire timestamp
    assert decode_offset_value(v1) == OffsetValue(5, -1, "m", 100)
    v0 = struct.pack(">hqhq", 0, 9, -1, 50)  # null metadata
    assert decode_offset_value(v0) == OffsetValue(9, -1, "", 50)
    v0_key = struct.pack(">hh1sh1si", 0, 1, b"g", 1, b"t", 0)
    assert decode_key(v0_key) == OffsetKey("g", "t", 0)


members = st.builds(
    MemberValue,
    st.text(max_size=20),
    st.none() | st.text(max_size=10),
    st.text(max_size=10),
    st.text(max_size=10),
    st.integers(0, 1 << 31 - 1),
    st.integers(0, 1 << 31 - 1),
    st.binary(max_size=50),
    st.binary(max_size=50),
)


@given(
    st.builds(
        GroupValue,
        st.text(max_size=10),
        st.integers(-1, 1 << 30),
        st.none() | st.text(max_size=10),
        st.none() | st.text(max_size=10),
        st.integers(-1, 1 << 50),
        st.lists(members, max_size=4),
    )
)
def test_group_metadata_round_trips(value: GroupValue) -> None:
    assert decode_group_value(encode_group_value(value)) == value


def test_group_key() -> None:
    assert decode_key(encode_group_key(GroupKey("grp"))) == GroupKey("grp")


@given(st.binary(max_size=80))
def test_garbage_raises_only_corrupt_record(data: bytes) -> None:
    for decode in (decode_key, decode_offset_value, decode_group_value):
        with contextlib.suppress(CorruptRecordError):
            decode(data)


def test_unknown_versions_are_refused() -> None:
    with pytest.raises(CorruptRecordError):
        decode_key(struct.pack(">hh1s", 9, 1, b"g"))
    with pytest.raises(CorruptRecordError):
        decode_offset_value(struct.pack(">hq", 4, 0))


def test_subscribed_topics_of_a_consumer_subscription() -> None:
    subscription = struct.pack(">hih2sh3si", 1, 2, 2, b"t1", 3, b"abc", -1)
    assert subscribed_topics(subscription) == {"t1", "abc"}
    assert subscribed_topics(b"\x00") is None
    assert subscribed_topics(struct.pack(">hi", 0, 1_000_000)) is None
