"""Kafka record compression codecs, byte-compatible with the Java client and librdkafka.

Every decompressor is bounded: it stops and raises ``CorruptRecordError`` as soon as the
output would pass ``max_size``, so a small malicious payload cannot make the broker
allocate gigabytes. Library failures on malformed input surface as ``CorruptRecordError``
naming the codec, never as the library's own exception types.
"""

from __future__ import annotations

import enum
import struct
import zlib

import cramjam
import lz4.frame
import zstandard

from directlog.records.errors import CorruptRecordError, UnsupportedCompressionError


class Compression(enum.IntEnum):
    """Codec ids as carried in the low 3 bits of a batch's or message's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_attributes(cls, attributes: int) -> Compression:
        """Codec named by the low 3 bits of ``attributes``; ids 5..7 are not codecs."""
        codec_id = attributes & 0x07
        try:
            return cls(codec_id)
        except ValueError:
            raise UnsupportedCompressionError(
                f"compression codec id {codec_id} is not a Kafka codec (0..4)"
            ) from None


def compress(codec: Compression, data: bytes | memoryview, *, magic: int = 2) -> bytes:
    """Compress ``data`` the way Kafka's Java producer would for this message format."""
    _check_codec_for_magic(codec, magic)
    if codec is Compression.NONE:
        return bytes(data)
    if codec is Compression.GZIP:
        gz = zlib.compressobj(wbits=31)
        return gz.compress(data) + gz.flush()
    if codec is Compression.SNAPPY:
        return _xerial_compress(data)
    if codec is Compression.LZ4:
        return _lz4_compress(data, magic)
    return bytes(zstandard.ZstdCompressor().compress(data))


def decompress(
    codec: Compression, data: bytes | memoryview, *, max_size: int, magic: int = 2
) -> bytes:
    """Decompress ``data``, refusing (``CorruptRecordError``) output beyond ``max_size``."""
    _check_codec_for_magic(codec, magic)
    if max_size < 0:
        raise ValueError(f"max_size must be >= 0, got {max_size}")
    if codec is Compression.NONE:
        if len(data) > max_size:
            raise _too_big(codec, max_size)
        return bytes(data)
    if codec is Compression.GZIP:
        return _gzip_decompress(data, max_size)
    if codec is Compression.SNAPPY:
        return _snappy_decompress(data, max_size)
    if codec is Compression.LZ4:
        return _lz4_decompress(data, max_size, magic)
    return _zstd_decompress(data, max_size)


def _check_codec_for_magic(codec: Compression, magic: int) -> None:
    if codec is Compression.ZSTD and magic < 2:
        raise UnsupportedCompressionError(
            f"zstd compression needs message format magic 2, got magic {magic}"
        )


def _too_big(codec: Compression, max_size: int) -> CorruptRecordError:
    return CorruptRecordError(f"{codec.name} data decompresses to more than {max_size} bytes")


def _corrupt(codec: Compression, detail: object) -> CorruptRecordError:
    return CorruptRecordError(f"malformed {codec.name} data: {detail}")


# --- gzip -------------------------------------------------------------------------------


def _gzip_decompress(data: bytes | memoryview, max_size: int) -> bytes:
    """Inflate gzip members one after another (Java's GZIPInputStream reads concatenated
    members), asking zlib for at most one byte past the budget per call."""
    out = bytearray()
    rest: bytes | memoryview = data
    try:
        while True:
            inflater = zlib.decompressobj(wbits=31)
            out += inflater.decompress(rest, max_size - len(out) + 1)
            if len(out) > max_size:
                raise _too_big(Compression.GZIP, max_size)
            if not inflater.eof:
                raise _corrupt(Compression.GZIP, "stream ends before the end of the member")
            rest = inflater.unused_data
            if not rest:
                return bytes(out)
    except zlib.error as exc:
        raise _corrupt(Compression.GZIP, exc) from exc


# --- snappy -----------------------------------------------------------------------------

# snappy-java's stream header: magic, then int32 version and int32 minimum-compatible version.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_SIZE = 32 * 1024  # snappy-java's default block size, which Kafka keeps
_INT32 = struct.Struct(">i")


def _xerial_compress(data: bytes | memoryview) -> bytes:
    view = memoryview(data).cast("B")
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_SIZE]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes | memoryview, max_size: int) -> bytes:
    """Accept xerial framing (Java client) and a bare raw block (librdkafka)."""
    view = memoryview(data).cast("B")
    if view[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        return _snappy_raw_block(view, max_size)
    if len(view) < len(_XERIAL_HEADER):
        raise _corrupt(Compression.SNAPPY, "xerial stream header is truncated")
    out = bytearray()
    pos = len(_XERIAL_HEADER)
    while pos < len(view):
        if len(view) - pos < _INT32.size:
            raise _corrupt(Compression.SNAPPY, "xerial block length is truncated")
        (length,) = _INT32.unpack_from(view, pos)
        pos += _INT32.size
        if length < 0 or length > len(view) - pos:
            raise _corrupt(
                Compression.SNAPPY,
                f"xerial block length {length} runs past the {len(view) - pos} bytes left",
            )
        out += _snappy_raw_block(view[pos : pos + length], max_size - len(out))
        pos += length
    return bytes(out)


def _snappy_raw_block(block: memoryview, budget: int) -> bytes:
    """Check the block's varint length preamble against the budget before decompressing,
    since the library allocates whatever the preamble claims."""
    declared = 0
    for index in range(5):
        if index >= len(block):
            raise _corrupt(Compression.SNAPPY, "block length preamble is truncated")
        byte = block[index]
        declared |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            break
    else:
        raise _corrupt(Compression.SNAPPY, "block length preamble is longer than 5 bytes")
    if declared > budget:
        raise CorruptRecordError(
            f"SNAPPY block declares {declared} bytes, more than the {budget} bytes allowed"
        )
    try:
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as exc:
        raise _corrupt(Compression.SNAPPY, exc) from exc


# --- lz4 --------------------------------------------------------------------------------

_LZ4_MAGIC = b"\x04\x22\x4d\x18"


def _lz4_compress(data: bytes | memoryview, magic: int) -> bytes:
    # What Kafka's Java producer writes: 64 KiB independent blocks, no content size or checksum.
    frame = lz4.frame.compress(
        data,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,
        content_checksum=False,
        store_size=False,
    )
    if magic != 0:
        return bytes(frame)
    broken = bytearray(frame)
    hc_pos = _lz4_hc_position(broken)
    broken[hc_pos] = _lz4_hc(broken[:hc_pos])  # pre-KIP-57 Kafka hashed the magic too
    return bytes(broken)


def _lz4_decompress(data: bytes | memoryview, max_size: int, magic: int) -> bytes:
    """Decode LZ4 frames (concatenated frames allowed) with at most one byte past the
    budget requested per call; a frame without its end mark is truncated."""
    out = bytearray()
    rest = bytes(data)
    try:
        while True:
            if magic == 0:
                rest = _lz4_repair_v0_header(rest)
            decoder = lz4.frame.LZ4FrameDecompressor()
            out += decoder.decompress(rest, max_length=max_size - len(out) + 1)
            if len(out) > max_size:
                raise _too_big(Compression.LZ4, max_size)
            if not decoder.eof:
                raise _corrupt(Compression.LZ4, "frame ends before its end mark")
            rest = decoder.unused_data or b""
            if not rest:
                return bytes(out)
    except RuntimeError as exc:  # python-lz4 reports every LZ4F error as RuntimeError
        raise _corrupt(Compression.LZ4, exc) from exc


def _lz4_hc_position(frame: bytes | bytearray) -> int:
    """Index of the header checksum byte: after magic, FLG, BD and the optional fields."""
    if len(frame) < 7 or frame[:4] != _LZ4_MAGIC:
        raise _corrupt(Compression.LZ4, "missing LZ4 frame header")
    flg = frame[4]
    pos = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    if len(frame) <= pos:
        raise _corrupt(Compression.LZ4, "frame descriptor is truncated")
    return pos


def _lz4_repair_v0_header(frame: bytes) -> bytes:
    """Magic-0 writers hashed the 4 magic bytes into HC. Accept that form by rewriting HC to
    the standard value; any other wrong HC is left for the library to reject."""
    hc_pos = _lz4_hc_position(frame)
    if frame[hc_pos] != _lz4_hc(frame[:hc_pos]):
        return frame
    fixed = bytearray(frame)
    fixed[hc_pos] = _lz4_hc(frame[4:hc_pos])
    return bytes(fixed)


def _lz4_hc(header: bytes | bytearray) -> int:
    return (_xxh32(bytes(header)) >> 8) & 0xFF


_P1, _P2, _P3, _P4, _P5 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1
_U32 = 0xFFFFFFFF


def _rotl32(value: int, shift: int) -> int:
    return ((value << shift) | (value >> (32 - shift))) & _U32


def _xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32, for LZ4 header checksums only (under 20 bytes, so plain Python is enough and
    avoids a dependency)."""
    length = len(data)
    pos = 0
    if length >= 16:
        lanes = [(seed + _P1 + _P2) & _U32, (seed + _P2) & _U32, seed, (seed - _P1) & _U32]
        while pos + 16 <= length:
            for i in range(4):
                word = int.from_bytes(data[pos : pos + 4], "little")
                lanes[i] = _rotl32((lanes[i] + word * _P2) & _U32, 13) * _P1 & _U32
                pos += 4
        acc = _rotl32(lanes[0], 1) + _rotl32(lanes[1], 7)
        acc += _rotl32(lanes[2], 12) + _rotl32(lanes[3], 18)
    else:
        acc = seed + _P5
    acc = (acc + length) & _U32
    while pos + 4 <= length:
        word = int.from_bytes(data[pos : pos + 4], "little")
        acc = _rotl32((acc + word * _P3) & _U32, 17) * _P4 & _U32
        pos += 4
    while pos < length:
        acc = _rotl32((acc + data[pos] * _P5) & _U32, 11) * _P1 & _U32
        pos += 1
    acc = (acc ^ (acc >> 15)) * _P2 & _U32
    acc = (acc ^ (acc >> 13)) * _P3 & _U32
    return acc ^ (acc >> 16)


# --- zstd -------------------------------------------------------------------------------

# A zstd block yields at most 128 KiB and takes at least 4 input bytes (an RLE block), so
# feeding N input bytes yields at most about N * 32 KiB plus one block. Sizing each input
# step from the remaining budget keeps the overshoot to a few blocks.
_ZSTD_MAX_RATIO = 32 * 1024
_ZSTD_MIN_STEP = 16


def _zstd_decompress(data: bytes | memoryview, max_size: int) -> bytes:
    view = memoryview(data).cast("B")
    out = bytearray()
    pos = 0
    try:
        decoder = zstandard.ZstdDecompressor().decompressobj()
        while pos < len(view):
            step = max(_ZSTD_MIN_STEP, (max_size - len(out)) // _ZSTD_MAX_RATIO)
            out += decoder.decompress(view[pos : pos + step])
            pos += step
            if len(out) > max_size:
                raise _too_big(Compression.ZSTD, max_size)
            if decoder.eof:
                pos = min(pos, len(view)) - len(decoder.unused_data)
                if pos < len(view):  # another frame follows
                    decoder = zstandard.ZstdDecompressor().decompressobj()
    except zstandard.ZstdError as exc:
        raise _corrupt(Compression.ZSTD, exc) from exc
    if not decoder.eof:
        raise _corrupt(Compression.ZSTD, "frame ends before its last block")
    return bytes(out)
