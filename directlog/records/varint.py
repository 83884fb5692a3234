"""Zig-zag varints as used inside Kafka record batch v2 (protobuf's encoding).

Decoders take a buffer and a position and return (value, next position). They never read
past the buffer and refuse encodings longer than the type allows, so a hostile length field
cannot make them loop or allocate.
"""

import mmap

from directlog.records.errors import CorruptRecordError

Buffer = bytes | bytearray | memoryview | mmap.mmap

MAX_VARINT_BYTES = 5  # int32
MAX_VARLONG_BYTES = 10  # int64


def encode_varint(value: int) -> bytes:
    """Encode a signed 64-bit integer as a zig-zag varint."""
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"varint value {value} outside int64")
    unsigned = ((value << 1) ^ (value >> 63)) & 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while unsigned >= 0x80:
        out.append((unsigned & 0x7F) | 0x80)
        unsigned >>= 7
    out.append(unsigned)
    return bytes(out)


def varint_size(value: int) -> int:
    """Bytes that encode_varint(value) takes."""
    unsigned = ((value << 1) ^ (value >> 63)) & 0xFFFF_FFFF_FFFF_FFFF
    size = 1
    while unsigned >= 0x80:
        unsigned >>= 7
        size += 1
    return size


def decode_varint(
    buf: Buffer, pos: int, limit: int, max_bytes: int = MAX_VARLONG_BYTES
) -> tuple[int, int]:
    """Decode a zig-zag varint at buf[pos] that must end before `limit`."""
    shift = 0
    unsigned = 0
    start = pos
    while True:
        if pos >= limit:
            raise CorruptRecordError(f"varint at byte {start} runs past its record")
        byte = buf[pos]
        pos += 1
        unsigned |= (byte & 0x7F) << shift
        if byte < 0x80:
            if unsigned >> (32 if max_bytes == MAX_VARINT_BYTES else 64):
                raise CorruptRecordError(f"varint at byte {start} overflows its type")
            return (unsigned >> 1) ^ -(unsigned & 1), pos
        shift += 7
        if pos - start >= max_bytes:
            raise CorruptRecordError(f"varint at byte {start} longer than {max_bytes} bytes")
