"""Legacy message sets (magic 0 and 1): exact layout, round trips, offsets, and hostile bytes.

Expected bytes are assembled here with struct and zlib straight from the documented
layout, independently of the encoder under test.
"""

from __future__ import annotations

import dataclasses
import gzip
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from directlog.records.compression import Compression, compress
from directlog.records.errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordError,
    UnsupportedCompressionError,
    UnsupportedMagicError,
)
from directlog.records.legacy import LegacyMessage, decode_message_set, encode_message_set

LEGACY_CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4]
COMPRESSED_CODECS = LEGACY_CODECS[1:]
LOG_APPEND_TIME = 0x08


def entry(
    offset: int,
    magic: int,
    attributes: int,
    timestamp: int | None,
    key: bytes | None,
    value: bytes | None,
    *,
    crc: int | None = None,
) -> bytes:
    """One message-set entry, built by hand from the layout."""
    body = struct.pack(">bB", magic, attributes)
    if magic == 1:
        assert timestamp is not None
        body += struct.pack(">q", timestamp)
    for field in (key, value):
        body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    stored = zlib.crc32(body) if crc is None else crc
    return struct.pack(">qiI", offset, 4 + len(body), stored) + body


def message_lists(magic: int, *, max_size: int = 6) -> st.SearchStrategy[list[LegacyMessage]]:
    """Messages at strictly increasing offsets, with gaps, null keys and values."""
    blobs = st.none() | st.binary(max_size=40)
    timestamps = st.none() if magic == 0 else st.integers(-1, 2**50)

    @st.composite
    def build(draw: st.DrawFn) -> list[LegacyMessage]:
        offset = draw(st.integers(0, 2**40))
        messages = []
        for _ in range(draw(st.integers(1, max_size))):
            messages.append(LegacyMessage(offset, draw(timestamps), draw(blobs), draw(blobs)))
            offset += draw(st.integers(1, 3))
        return messages

    return build()


def expected_after_round_trip(
    messages: list[LegacyMessage], magic: int, codec: Compression
) -> list[LegacyMessage]:
    if magic == 0:
        return [dataclasses.replace(m, timestamp=None, timestamp_type=0) for m in messages]
    if codec is not Compression.NONE and messages[0].timestamp_type == 1:
        top = max(-1 if m.timestamp is None else m.timestamp for m in messages)
        return [dataclasses.replace(m, timestamp=top) for m in messages]
    return [dataclasses.replace(m, timestamp=-1) if m.timestamp is None else m for m in messages]


# --- exact layout -----------------------------------------------------------------------


def test_known_answer_magic_1() -> None:
    body = struct.pack(">bbq", 1, 0, 1234) + struct.pack(">i", 1) + b"k"
    body += struct.pack(">i", 1) + b"v"
    expected = struct.pack(">qi", 7, 4 + len(body)) + struct.pack(">I", zlib.crc32(body)) + body
    assert len(expected) == 12 + 4 + 1 + 1 + 8 + 5 + 5
    message = LegacyMessage(offset=7, timestamp=1234, key=b"k", value=b"v")
    assert encode_message_set([message], magic=1) == expected
    assert decode_message_set(expected) == [message]


def test_known_answer_magic_0_with_null_key() -> None:
    body = struct.pack(">bb", 0, 0) + struct.pack(">i", -1) + struct.pack(">i", 3) + b"abc"
    expected = struct.pack(">qiI", 42, 4 + len(body), zlib.crc32(body)) + body
    encoded = encode_message_set(
        [LegacyMessage(offset=42, timestamp=999, key=None, value=b"abc")], magic=0
    )
    assert encoded == expected
    assert decode_message_set(expected) == [LegacyMessage(42, None, None, b"abc")]


def test_known_answer_log_append_time_attribute_bit() -> None:
    message = LegacyMessage(offset=3, timestamp=55, key=None, value=b"v", timestamp_type=1)
    assert encode_message_set([message], magic=1) == entry(3, 1, LOG_APPEND_TIME, 55, None, b"v")


def test_known_answer_gzip_wrapper_magic_1() -> None:
    messages = [
        LegacyMessage(offset=1000, timestamp=10, key=b"a", value=b"1"),
        LegacyMessage(offset=1001, timestamp=30, key=None, value=b"2"),
        LegacyMessage(offset=1002, timestamp=20, key=b"c", value=None),
    ]
    encoded = encode_message_set(messages, magic=1, compression=Compression.GZIP)
    offset, size, crc, magic, attributes, timestamp, key_length = struct.unpack_from(
        ">qiIbBqi", encoded
    )
    assert (offset, magic, attributes, timestamp, key_length) == (1002, 1, 1, 30, -1)
    assert size == len(encoded) - 12
    assert crc == zlib.crc32(encoded[16:])
    (value_length,) = struct.unpack_from(">i", encoded, 30)
    assert value_length == len(encoded) - 34
    inner = gzip.decompress(encoded[34:])
    assert inner == (
        entry(0, 1, 0, 10, b"a", b"1")
        + entry(1, 1, 0, 30, None, b"2")
        + entry(2, 1, 0, 20, b"c", None)
    )


def test_known_answer_magic_0_wrapper_uses_absolute_inner_offsets() -> None:
    messages = [LegacyMessage(500, None, None, b"x"), LegacyMessage(501, None, b"k", b"y")]
    encoded = encode_message_set(messages, magic=0, compression=Compression.GZIP)
    offset, _size, _crc, magic, attributes, key_length = struct.unpack_from(">qiIbBi", encoded)
    assert (offset, magic, attributes, key_length) == (501, 0, 1, -1)
    assert gzip.decompress(encoded[26:]) == entry(500, 0, 0, None, None, b"x") + entry(
        501, 0, 0, None, b"k", b"y"
    )


# --- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize("codec", LEGACY_CODECS)
@pytest.mark.parametrize("magic", [0, 1])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_round_trip(magic: int, codec: Compression, data: st.DataObject) -> None:
    messages = data.draw(message_lists(magic))
    log_append = magic == 1 and data.draw(st.booleans())
    if log_append:
        messages = [dataclasses.replace(m, timestamp_type=1) for m in messages]
    encoded = encode_message_set(messages, magic=magic, compression=codec)
    assert decode_message_set(encoded) == expected_after_round_trip(messages, magic, codec)


@pytest.mark.parametrize("codec", LEGACY_CODECS)
@pytest.mark.parametrize("magic", [0, 1])
def test_null_and_empty_keys_and_values_are_distinct(magic: int, codec: Compression) -> None:
    timestamp = None if magic == 0 else 5
    messages = [
        LegacyMessage(10, timestamp, None, None),
        LegacyMessage(11, timestamp, b"", b""),
        LegacyMessage(12, timestamp, None, b""),
        LegacyMessage(13, timestamp, b"", None),
    ]
    encoded = encode_message_set(messages, magic=magic, compression=codec)
    assert decode_message_set(encoded) == messages


@pytest.mark.parametrize("codec", LEGACY_CODECS)
def test_several_wrappers_and_plain_entries_in_one_set(codec: Compression) -> None:
    first = [LegacyMessage(1000 + i, 100 + i, None, b"%d" % i) for i in range(3)]
    second = [LegacyMessage(1003, 200, b"k", b"plain")]
    third = [LegacyMessage(1004 + i, 300 + i, b"k", None) for i in range(2)]
    encoded = (
        encode_message_set(first, magic=1, compression=codec)
        + encode_message_set(second, magic=1)
        + encode_message_set(third, magic=1, compression=codec)
    )
    assert decode_message_set(encoded) == first + second + third


def test_empty_input_round_trips() -> None:
    assert encode_message_set([], magic=1, compression=Compression.GZIP) == b""
    assert decode_message_set(b"") == []


def test_magic_1_missing_timestamp_written_as_minus_one() -> None:
    encoded = encode_message_set([LegacyMessage(0, None, None, b"v")], magic=1)
    assert struct.unpack_from(">q", encoded, 18) == (-1,)
    assert decode_message_set(encoded) == [LegacyMessage(0, -1, None, b"v")]


# --- inner offsets and timestamps -------------------------------------------------------


@pytest.mark.parametrize("codec", COMPRESSED_CODECS)
def test_magic_1_relative_inner_offsets_become_absolute(codec: Compression) -> None:
    messages = [LegacyMessage(1000 + i, i, None, b"m%d" % i) for i in range(4)]
    encoded = encode_message_set(messages, magic=1, compression=codec)
    assert struct.unpack_from(">q", encoded) == (1003,)
    decoded = decode_message_set(encoded)
    assert [m.offset for m in decoded] == [1000, 1001, 1002, 1003]
    assert decoded == messages


def test_magic_1_offset_gaps_survive_compression() -> None:
    messages = [LegacyMessage(o, 1, None, b"v") for o in (1000, 1004, 1009)]
    encoded = encode_message_set(messages, magic=1, compression=Compression.GZIP)
    inner = gzip.decompress(encoded[34:])
    entry_size = 35  # 12 (offset, size) + 4 crc + 2 magic/attributes + 8 timestamp + 4 + 4 + 1
    assert len(inner) == 3 * entry_size
    offsets = [struct.unpack_from(">q", inner, i * entry_size)[0] for i in range(3)]
    assert offsets == [0, 4, 9]
    assert decode_message_set(encoded) == messages


def test_magic_1_hand_built_wrapper_uses_last_inner_offset() -> None:
    # Inner offsets need not start at 0: only the distance to the last one matters.
    inner = entry(5, 1, 0, 1, None, b"a") + entry(6, 1, 0, 2, None, b"b")
    inner += entry(7, 1, 0, 3, None, b"c")
    wrapper = entry(2002, 1, int(Compression.GZIP), 3, None, gzip.compress(inner))
    decoded = decode_message_set(wrapper)
    assert [(m.offset, m.timestamp, m.value) for m in decoded] == [
        (2000, 1, b"a"),
        (2001, 2, b"b"),
        (2002, 3, b"c"),
    ]
    assert {m.timestamp_type for m in decoded} == {0}


def test_magic_0_hand_built_wrapper_keeps_absolute_inner_offsets() -> None:
    inner = entry(70, 0, 0, None, b"k", b"a") + entry(72, 0, 0, None, None, b"b")
    wrapper = entry(72, 0, int(Compression.SNAPPY), None, None, compress(Compression.SNAPPY, inner))
    assert decode_message_set(wrapper) == [
        LegacyMessage(70, None, b"k", b"a"),
        LegacyMessage(72, None, None, b"b"),
    ]


def test_log_append_time_wrapper_timestamp_propagates() -> None:
    inner = entry(0, 1, 0, 111, None, b"a") + entry(1, 1, 0, 222, None, b"b")
    attributes = int(Compression.LZ4) | LOG_APPEND_TIME
    wrapper = entry(9, 1, attributes, 9999, None, compress(Compression.LZ4, inner, magic=1))
    assert decode_message_set(wrapper) == [
        LegacyMessage(8, 9999, None, b"a", timestamp_type=1),
        LegacyMessage(9, 9999, None, b"b", timestamp_type=1),
    ]


def test_create_time_wrapper_keeps_inner_timestamps() -> None:
    inner = entry(0, 1, 0, 111, None, b"a") + entry(1, 1, 0, 222, None, b"b")
    wrapper = entry(9, 1, int(Compression.GZIP), 222, None, gzip.compress(inner))
    assert [(m.timestamp, m.timestamp_type) for m in decode_message_set(wrapper)] == [
        (111, 0),
        (222, 0),
    ]


def test_encoder_sets_log_append_time_on_wrapper() -> None:
    messages = [LegacyMessage(20 + i, 500, None, b"v", timestamp_type=1) for i in range(3)]
    encoded = encode_message_set(messages, magic=1, compression=Compression.GZIP)
    _offset, _size, _crc, _magic, attributes, timestamp = struct.unpack_from(">qiIbBq", encoded)
    assert attributes == int(Compression.GZIP) | LOG_APPEND_TIME
    assert timestamp == 500
    assert decode_message_set(encoded) == messages


# --- encoder argument checks ------------------------------------------------------------


def test_encode_rejects_bad_arguments() -> None:
    one = [LegacyMessage(1, 1, None, b"v")]
    with pytest.raises(UnsupportedMagicError, match="magic 0 or 1"):
        encode_message_set(one, magic=2)
    with pytest.raises(UnsupportedCompressionError, match="zstd"):
        encode_message_set(one, magic=1, compression=Compression.ZSTD)
    with pytest.raises(ValueError, match="strictly increase"):
        encode_message_set(one + one, magic=1, compression=Compression.GZIP)
    mixed = [LegacyMessage(1, 1, None, b"v"), LegacyMessage(2, 1, None, b"v", timestamp_type=1)]
    with pytest.raises(ValueError, match="timestamp type"):
        encode_message_set(mixed, magic=1, compression=Compression.GZIP)
    with pytest.raises(ValueError, match="int64"):
        encode_message_set([LegacyMessage(2**63, 1, None, None)], magic=1)
    with pytest.raises(ValueError, match="timestamp_type"):
        encode_message_set([LegacyMessage(1, 1, None, None, timestamp_type=2)], magic=1)


def test_uncompressed_set_keeps_each_offset_as_given() -> None:
    messages = [LegacyMessage(9, 1, None, b"a"), LegacyMessage(4, 2, None, b"b")]
    assert decode_message_set(encode_message_set(messages, magic=1)) == messages


# --- hostile and truncated input --------------------------------------------------------


def test_trailing_partial_entry_is_ignored() -> None:
    messages = [LegacyMessage(100 + i, i, b"k", b"value") for i in range(3)]
    whole = encode_message_set(messages, magic=1)
    extra = encode_message_set([LegacyMessage(103, 3, b"k", b"value")], magic=1)
    for cut in (1, 11, 12, 20, len(extra) - 1):
        assert decode_message_set(whole + extra[:cut]) == messages


@pytest.mark.parametrize("codec", LEGACY_CODECS)
@pytest.mark.parametrize("magic", [0, 1])
def test_every_prefix_decodes_to_a_prefix(magic: int, codec: Compression) -> None:
    timestamp = None if magic == 0 else 77
    messages = [LegacyMessage(1000 + i, timestamp, b"key", b"v" * i) for i in range(4)]
    encoded = encode_message_set(messages[:2], magic=magic, compression=codec)
    encoded += encode_message_set(messages[2:], magic=magic, compression=codec)
    full = decode_message_set(encoded)
    assert full == messages
    for cut in range(len(encoded)):
        decoded = decode_message_set(encoded[:cut])  # anything but a RecordError fails here
        assert decoded == full[: len(decoded)]
        if codec is not Compression.NONE:
            assert len(decoded) in (0, 2)  # a wrapper decodes whole or not at all


@settings(max_examples=60, deadline=None)
@given(data=st.data(), cut_seed=st.integers(0, 2**16))
def test_truncated_compressed_wrapper_only_raises_record_errors(
    data: st.DataObject, cut_seed: int
) -> None:
    codec = data.draw(st.sampled_from(COMPRESSED_CODECS))
    inner = encode_message_set(data.draw(message_lists(1)), magic=1)
    packed = compress(codec, inner, magic=1)
    truncated = packed[: cut_seed % max(1, len(packed))]
    wrapper = entry(50, 1, int(codec), 0, None, truncated)
    with pytest.raises(RecordError):
        decode_message_set(wrapper)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_single_byte_flip_is_detected_or_only_moves_an_offset(data: st.DataObject) -> None:
    magic = data.draw(st.sampled_from([0, 1]))
    messages = data.draw(message_lists(magic, max_size=4))
    encoded = encode_message_set(messages, magic=magic)
    original = decode_message_set(encoded)
    index = data.draw(st.integers(0, len(encoded) - 1))
    flipped = bytearray(encoded)
    flipped[index] ^= data.draw(st.integers(1, 255))

    start, entry_no = 0, 0
    while True:
        (size,) = struct.unpack_from(">i", encoded, start + 8)
        if index < start + 12 + size:
            break
        start, entry_no = start + 12 + size, entry_no + 1
    field_at = index - start

    if field_at < 8:
        (new_offset,) = struct.unpack_from(">q", flipped, start)
        expected = list(original)
        expected[entry_no] = dataclasses.replace(original[entry_no], offset=new_offset)
        assert decode_message_set(bytes(flipped)) == expected
    elif field_at < 12:
        # A larger size can run past the end, which reads as a trailing partial entry.
        try:
            decoded = decode_message_set(bytes(flipped))
        except CorruptRecordError:
            pass
        else:
            assert decoded == original[:entry_no]
    else:
        with pytest.raises(CorruptRecordError):  # includes UnsupportedMagicError
            decode_message_set(bytes(flipped))


def test_size_below_minimum_is_corrupt() -> None:
    bad = struct.pack(">qi", 0, 13) + b"\x00" * 13
    with pytest.raises(CorruptRecordError, match="size 13"):
        decode_message_set(bad)
    negative = struct.pack(">qi", 0, -1) + b"\x00" * 30
    with pytest.raises(CorruptRecordError, match="size -1"):
        decode_message_set(negative)


def test_magic_1_size_below_its_minimum_is_corrupt() -> None:
    body = struct.pack(">bB", 1, 0) + struct.pack(">ii", -1, -1) + b"\x00\x00"  # 14 bytes
    bad = struct.pack(">qiI", 0, 4 + len(body), zlib.crc32(body)) + body
    with pytest.raises(CorruptRecordError, match="magic 1 minimum 22"):
        decode_message_set(bad)


def test_crc_mismatch_names_both_values() -> None:
    good = entry(1, 1, 0, 5, b"k", b"v")
    (stored,) = struct.unpack_from(">I", good, 12)
    bad = entry(1, 1, 0, 5, b"k", b"v", crc=stored ^ 1)
    with pytest.raises(CorruptRecordError) as info:
        decode_message_set(bad)
    assert f"{stored ^ 1:#010x}" in str(info.value)
    assert f"{stored:#010x}" in str(info.value)


@pytest.mark.parametrize("magic", [2, -1, 127])
def test_unknown_magic(magic: int) -> None:
    body = struct.pack(">bB", magic, 0) + struct.pack(">qii", 0, -1, -1)
    bad = struct.pack(">qiI", 0, 4 + len(body), zlib.crc32(body)) + body
    with pytest.raises(UnsupportedMagicError, match=f"magic {magic}"):
        decode_message_set(bad)


def raw_entry(magic: int, fields: bytes) -> bytes:
    """An entry with a valid CRC around arbitrary field bytes after the attributes."""
    body = struct.pack(">bB", magic, 0) + (struct.pack(">q", 0) if magic == 1 else b"") + fields
    return struct.pack(">qiI", 0, 4 + len(body), zlib.crc32(body)) + body


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (struct.pack(">ii", -2, -1), "key length -2"),
        (struct.pack(">ii", -1, -7), "value length -7"),
        (struct.pack(">ii", 9, -1) + b"abc", "key length 9"),
        (struct.pack(">ii", -1, 4) + b"abc", "value length 4"),
        (struct.pack(">ii", 1, -1) + b"abc", "value length"),
        (struct.pack(">ii", -1, 1) + b"abc", "2 bytes after its value"),
    ],
)
def test_bad_key_or_value_lengths_are_corrupt(magic: int, fields: bytes, match: str) -> None:
    with pytest.raises(CorruptRecordError, match=match):
        decode_message_set(raw_entry(magic, fields))


def test_nested_compression_is_invalid() -> None:
    innermost = gzip.compress(entry(0, 1, 0, 1, None, b"deep"))
    middle = entry(0, 1, int(Compression.GZIP), 1, None, innermost)
    outer = entry(0, 1, int(Compression.GZIP), 1, None, gzip.compress(middle))
    with pytest.raises(InvalidRecordError, match="nests"):
        decode_message_set(outer)


def test_wrapper_problems() -> None:
    with pytest.raises(InvalidRecordError, match="null value"):
        decode_message_set(entry(0, 1, int(Compression.GZIP), 1, None, None))
    with pytest.raises(InvalidRecordError, match="no messages"):
        decode_message_set(entry(0, 1, int(Compression.GZIP), 1, None, gzip.compress(b"")))
    magic_0_inside_1 = gzip.compress(entry(0, 0, 0, None, None, b"v"))
    with pytest.raises(InvalidRecordError, match="magic 0 inside a magic 1"):
        decode_message_set(entry(0, 1, int(Compression.GZIP), 1, None, magic_0_inside_1))
    cut_inner = gzip.compress(entry(0, 1, 0, 1, None, b"value")[:-2])
    with pytest.raises(CorruptRecordError, match="inner message size"):
        decode_message_set(entry(0, 1, int(Compression.GZIP), 1, None, cut_inner))
    with pytest.raises(CorruptRecordError, match="GZIP"):
        decode_message_set(entry(0, 1, int(Compression.GZIP), 1, None, b"not gzip"))


@pytest.mark.parametrize(
    ("attributes", "match"), [(4, "zstd"), (5, "id 5"), (6, "id 6"), (7, "id 7")]
)
def test_unsupported_codecs_in_wrapper(attributes: int, match: str) -> None:
    with pytest.raises(UnsupportedCompressionError, match=match):
        decode_message_set(entry(0, 1, attributes, 1, None, b"payload"))


def test_max_decompressed_bounds_all_wrappers_together() -> None:
    messages = [LegacyMessage(i, 1, None, bytes(1000)) for i in range(10)]
    first = encode_message_set(messages[:5], magic=1, compression=Compression.LZ4)
    second = encode_message_set(messages[5:], magic=1, compression=Compression.LZ4)
    one_inner = len(encode_message_set(messages[:5], magic=1))
    assert decode_message_set(first + second, max_decompressed=2 * one_inner) == messages
    with pytest.raises(CorruptRecordError, match="more than"):
        decode_message_set(first + second, max_decompressed=2 * one_inner - 1)
    with pytest.raises(CorruptRecordError, match="more than"):
        decode_message_set(first, max_decompressed=one_inner - 1)
