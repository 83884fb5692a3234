"""Codec round trips, wire-compatibility quirks, bounded output, and malformed input."""

from __future__ import annotations

import gzip
import struct
import zlib

import cramjam
import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from directlog.records.compression import Compression, _xxh32, compress, decompress
from directlog.records.errors import CorruptRecordError, UnsupportedCompressionError

ALL_CODECS = list(Compression)
REAL_CODECS = [c for c in Compression if c is not Compression.NONE]
LEGACY_CODECS = [c for c in Compression if c is not Compression.ZSTD]
XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
LZ4_MAGIC = b"\x04\x22\x4d\x18"
MIB = 1024 * 1024

payloads = st.one_of(
    st.binary(max_size=4096),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=16), st.integers(1, 5000)),
)


def lz4_hc_index(frame: bytes) -> int:
    flg = frame[4]
    return 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)


# --- codec ids --------------------------------------------------------------------------


def test_codec_ids_match_kafka() -> None:
    assert [(c.name, int(c)) for c in Compression] == [
        ("NONE", 0),
        ("GZIP", 1),
        ("SNAPPY", 2),
        ("LZ4", 3),
        ("ZSTD", 4),
    ]


@pytest.mark.parametrize("attributes", range(256))
def test_from_attributes_reads_low_three_bits(attributes: int) -> None:
    codec_id = attributes & 0x07
    if codec_id <= 4:
        assert Compression.from_attributes(attributes) is Compression(codec_id)
    else:
        with pytest.raises(UnsupportedCompressionError, match=str(codec_id)):
            Compression.from_attributes(attributes)


# --- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ALL_CODECS)
@settings(max_examples=60, deadline=None)
@given(data=payloads)
def test_round_trip_magic_2(codec: Compression, data: bytes) -> None:
    packed = compress(codec, data)
    assert decompress(codec, packed, max_size=len(data)) == data


@pytest.mark.parametrize("codec", LEGACY_CODECS)
@pytest.mark.parametrize("magic", [0, 1])
@settings(max_examples=40, deadline=None)
@given(data=payloads)
def test_round_trip_legacy_magic(codec: Compression, magic: int, data: bytes) -> None:
    packed = compress(codec, data, magic=magic)
    assert decompress(codec, memoryview(packed), max_size=len(data), magic=magic) == data


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_accepts_memoryview_input(codec: Compression) -> None:
    data = b"directlog " * 500
    packed = compress(codec, memoryview(data))
    assert decompress(codec, memoryview(packed), max_size=len(data)) == data


def test_none_is_identity() -> None:
    assert compress(Compression.NONE, b"abc") == b"abc"
    assert decompress(Compression.NONE, b"abc", max_size=3) == b"abc"


# --- gzip -------------------------------------------------------------------------------


def test_gzip_writes_gzip_format() -> None:
    packed = compress(Compression.GZIP, b"hello gzip")
    assert packed[:2] == b"\x1f\x8b"
    assert gzip.decompress(packed) == b"hello gzip"


def test_gzip_reads_stdlib_gzip_and_concatenated_members() -> None:
    packed = gzip.compress(b"first ") + gzip.compress(b"second")
    assert decompress(Compression.GZIP, packed, max_size=100) == b"first second"


def test_gzip_truncated_stream_is_corrupt() -> None:
    packed = compress(Compression.GZIP, b"x" * 1000)
    with pytest.raises(CorruptRecordError, match="GZIP"):
        decompress(Compression.GZIP, packed[:-4], max_size=10_000)


# --- snappy -----------------------------------------------------------------------------


def test_snappy_writes_xerial_framing_in_32k_blocks() -> None:
    data = bytes(range(256)) * 300  # 76,800 bytes: blocks of 32 KiB, 32 KiB, 11 KiB
    packed = compress(Compression.SNAPPY, data)
    assert packed[:16] == XERIAL_HEADER
    pos, blocks = 16, []
    while pos < len(packed):
        (length,) = struct.unpack_from(">i", packed, pos)
        blocks.append(bytes(cramjam.snappy.decompress_raw(packed[pos + 4 : pos + 4 + length])))
        pos += 4 + length
    assert pos == len(packed)
    assert [len(b) for b in blocks] == [32768, 32768, 76800 - 65536]
    assert b"".join(blocks) == data


def test_snappy_empty_payload_is_header_only() -> None:
    assert compress(Compression.SNAPPY, b"") == XERIAL_HEADER
    assert decompress(Compression.SNAPPY, XERIAL_HEADER, max_size=0) == b""


@settings(max_examples=60, deadline=None)
@given(data=payloads)
def test_snappy_reads_raw_block(data: bytes) -> None:
    raw = bytes(cramjam.snappy.compress_raw(data))
    assert decompress(Compression.SNAPPY, raw, max_size=len(data)) == data


def test_snappy_xerial_block_length_beyond_buffer_is_corrupt() -> None:
    block = bytes(cramjam.snappy.compress_raw(b"abc"))
    packed = XERIAL_HEADER + struct.pack(">i", len(block) + 1) + block
    with pytest.raises(CorruptRecordError, match="runs past"):
        decompress(Compression.SNAPPY, packed, max_size=100)
    negative = XERIAL_HEADER + struct.pack(">i", -5) + block
    with pytest.raises(CorruptRecordError, match="SNAPPY"):
        decompress(Compression.SNAPPY, negative, max_size=100)


def test_snappy_raw_preamble_checked_before_decompressing() -> None:
    # Claims 4 GiB - 1 of output in a 6-byte input: must be refused from the preamble alone.
    bomb = b"\xff\xff\xff\xff\x0f\x00"
    with pytest.raises(CorruptRecordError, match="declares 4294967295 bytes"):
        decompress(Compression.SNAPPY, bomb, max_size=MIB)


# --- lz4 --------------------------------------------------------------------------------


def test_lz4_frame_matches_java_descriptor() -> None:
    packed = compress(Compression.LZ4, b"kafka" * 100)
    # FLG 0x60: version 01, independent blocks, no checksums, no size; BD 0x40: 64 KiB blocks.
    assert packed[:6] == LZ4_MAGIC + b"\x60\x40"
    assert packed[6] == (_xxh32(packed[4:6]) >> 8) & 0xFF


@settings(max_examples=60, deadline=None)
@given(data=payloads, store_size=st.booleans(), checksum=st.booleans())
def test_lz4_reads_standard_frames(data: bytes, store_size: bool, checksum: bool) -> None:
    frame = lz4.frame.compress(data, store_size=store_size, content_checksum=checksum)
    assert decompress(Compression.LZ4, frame, max_size=len(data)) == data
    assert decompress(Compression.LZ4, frame, max_size=len(data), magic=1) == data


def test_lz4_magic_0_writes_broken_header_checksum() -> None:
    data = b"old kafka " * 1000
    packed = compress(Compression.LZ4, data, magic=0)
    hc = lz4_hc_index(packed)
    standard = (_xxh32(packed[4:hc]) >> 8) & 0xFF
    broken = (_xxh32(packed[:hc]) >> 8) & 0xFF
    assert standard != broken
    assert packed[hc] == broken
    assert decompress(Compression.LZ4, packed, max_size=len(data), magic=0) == data
    # The library alone rejects it, which is why magic 0 needs the repair.
    with pytest.raises(CorruptRecordError, match="LZ4"):
        decompress(Compression.LZ4, packed, max_size=len(data), magic=1)


@pytest.mark.parametrize("store_size", [False, True])
def test_lz4_magic_0_decodes_hand_broken_frame(store_size: bool) -> None:
    data = bytes(range(200)) * 50
    frame = bytearray(lz4.frame.compress(data, store_size=store_size))
    hc = lz4_hc_index(bytes(frame))
    assert hc == (14 if store_size else 6)
    frame[hc] = (_xxh32(bytes(frame[:hc])) >> 8) & 0xFF
    assert decompress(Compression.LZ4, bytes(frame), max_size=len(data), magic=0) == data


def test_lz4_magic_0_also_accepts_a_standard_frame_but_not_a_wrong_checksum() -> None:
    data = b"abc" * 100
    frame = lz4.frame.compress(data)
    assert decompress(Compression.LZ4, frame, max_size=len(data), magic=0) == data
    hc = lz4_hc_index(frame)
    wrong = bytearray(frame)
    for candidate in range(256):
        if candidate not in (
            (_xxh32(frame[4:hc]) >> 8) & 0xFF,
            (_xxh32(frame[:hc]) >> 8) & 0xFF,
        ):
            wrong[hc] = candidate
            break
    with pytest.raises(CorruptRecordError, match="LZ4"):
        decompress(Compression.LZ4, bytes(wrong), max_size=len(data), magic=0)


def test_lz4_truncated_frame_is_corrupt() -> None:
    packed = compress(Compression.LZ4, b"y" * 5000)
    with pytest.raises(CorruptRecordError, match="LZ4"):
        decompress(Compression.LZ4, packed[:-2], max_size=10_000)


def test_xxh32_known_answers() -> None:
    assert _xxh32(b"") == 0x02CC5D05
    assert _xxh32(b"a") == 0x550D7456
    assert _xxh32(b"abc") == 0x32D153FF
    assert _xxh32(b"Nobody inspects the spammish repetition") == 0xE2293B2F


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=64))
def test_xxh32_matches_lz4_content_checksum(data: bytes) -> None:
    # An LZ4 frame's content checksum is XXH32(content, seed 0), stored little-endian last.
    frame = lz4.frame.compress(data, content_checksum=True)
    assert _xxh32(data) == int.from_bytes(frame[-4:], "little")


# --- zstd -------------------------------------------------------------------------------


@pytest.mark.parametrize("magic", [0, 1])
def test_zstd_refused_below_magic_2(magic: int) -> None:
    with pytest.raises(UnsupportedCompressionError, match="magic 2"):
        compress(Compression.ZSTD, b"data", magic=magic)
    packed = compress(Compression.ZSTD, b"data")
    with pytest.raises(UnsupportedCompressionError, match="magic 2"):
        decompress(Compression.ZSTD, packed, max_size=100, magic=magic)


def test_zstd_reads_concatenated_frames_and_library_output() -> None:
    first = zstandard.ZstdCompressor(write_content_size=False).compress(b"one ")
    second = zstandard.ZstdCompressor(level=19).compress(b"two" * 1000)
    expected = b"one " + b"two" * 1000
    assert decompress(Compression.ZSTD, first + second, max_size=len(expected)) == expected


def test_zstd_truncated_frame_is_corrupt() -> None:
    packed = compress(Compression.ZSTD, bytes(range(256)) * 40)
    with pytest.raises(CorruptRecordError, match="ZSTD"):
        decompress(Compression.ZSTD, packed[:-3], max_size=100_000)


# --- bounded output ---------------------------------------------------------------------

TEN_MIB_OF_ZEROS = bytes(10 * MIB)


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_output_beyond_max_size_is_corrupt(codec: Compression) -> None:
    packed = compress(codec, TEN_MIB_OF_ZEROS)
    with pytest.raises(CorruptRecordError, match=codec.name):
        decompress(codec, packed, max_size=MIB)


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_max_size_is_inclusive(codec: Compression) -> None:
    data = b"z" * 1000
    packed = compress(codec, data)
    assert decompress(codec, packed, max_size=1000) == data
    with pytest.raises(CorruptRecordError):
        decompress(codec, packed, max_size=999)


@pytest.mark.parametrize(
    ("codec", "packed"),
    [
        pytest.param(Compression.GZIP, gzip.compress(TEN_MIB_OF_ZEROS), id="stdlib-gzip"),
        pytest.param(
            Compression.SNAPPY,
            bytes(cramjam.snappy.compress_raw(TEN_MIB_OF_ZEROS)),
            id="raw-snappy",
        ),
        pytest.param(Compression.LZ4, lz4.frame.compress(TEN_MIB_OF_ZEROS), id="lz4-with-size"),
        pytest.param(
            Compression.ZSTD,
            zstandard.ZstdCompressor(write_content_size=False).compress(TEN_MIB_OF_ZEROS),
            id="zstd-no-size",
        ),
    ],
)
def test_foreign_bombs_are_bounded(codec: Compression, packed: bytes) -> None:
    with pytest.raises(CorruptRecordError, match=codec.name):
        decompress(codec, packed, max_size=MIB)


def test_negative_max_size_rejected() -> None:
    with pytest.raises(ValueError, match="max_size"):
        decompress(Compression.GZIP, compress(Compression.GZIP, b""), max_size=-1)


# --- malformed input --------------------------------------------------------------------

GARBAGE = {
    Compression.GZIP: [b"", b"not gzip at all", b"\x1f\x8b\x08\x00garbage"],
    Compression.SNAPPY: [
        b"",
        b"garbage!",
        b"\x05\x00a",  # preamble says 5 bytes, body makes 1
        XERIAL_HEADER[:10],
        XERIAL_HEADER + b"\x00\x00",
        XERIAL_HEADER + b"\x00\x00\x00\x03\xff\xff\xff",
        b"\x80\x80\x80\x80\x80\x01",  # preamble longer than 5 bytes
    ],
    Compression.LZ4: [b"", b"garbage!", LZ4_MAGIC, LZ4_MAGIC + b"\x60\x40\x00\xff\xff"],
    Compression.ZSTD: [b"", b"garbage!", b"\x28\xb5\x2f\xfd", b"\x28\xb5\x2f\xfd\xff\xff\xff"],
}


@pytest.mark.parametrize(
    ("codec", "garbage", "magic"),
    [
        (codec, sample, magic)
        for codec, samples in GARBAGE.items()
        for sample in samples
        for magic in ([2] if codec is Compression.ZSTD else [0, 2])
    ],
)
def test_garbage_is_corrupt_and_names_codec(codec: Compression, garbage: bytes, magic: int) -> None:
    with pytest.raises(CorruptRecordError, match=codec.name):
        decompress(codec, garbage, max_size=MIB, magic=magic)


@pytest.mark.parametrize("codec", REAL_CODECS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_mutated_input_never_escapes_as_another_exception(
    codec: Compression, data: st.DataObject
) -> None:
    original = b"payload " * 300 + bytes(range(256))
    packed = bytearray(compress(codec, original))
    mode = data.draw(st.sampled_from(["random", "flip", "truncate"]))
    if mode == "random":
        candidate = data.draw(st.binary(max_size=200))
    elif mode == "flip":
        index = data.draw(st.integers(0, len(packed) - 1))
        packed[index] ^= data.draw(st.integers(1, 255))
        candidate = bytes(packed)
    else:
        candidate = bytes(packed[: data.draw(st.integers(0, len(packed) - 1))])
    try:
        result = decompress(codec, candidate, max_size=len(original) * 2)
    except CorruptRecordError as exc:
        assert codec.name in str(exc)
    else:
        # Some mutations stay decodable (e.g. a flipped literal byte in raw snappy); the
        # bound still holds.
        assert len(result) <= len(original) * 2


def test_zlib_errors_are_chained() -> None:
    with pytest.raises(CorruptRecordError) as info:
        decompress(Compression.GZIP, b"not gzip at all", max_size=100)
    assert isinstance(info.value.__cause__, zlib.error)
