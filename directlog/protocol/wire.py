"""Primitive Kafka wire types for the hand-written hot paths (request headers, Produce,
Fetch).

Classic versions use int16/int32 lengths with -1 for null; flexible versions use unsigned
varints of length + 1 (0 for null) and end each struct with tagged fields.
"""

from __future__ import annotations

import struct

from directlog.records.errors import CorruptRecordError
from directlog.records.varint import Buffer

_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


class Writer:
    def __init__(self, flexible: bool) -> None:
        self.flexible = flexible
        self.buffer = bytearray()

    def int16(self, value: int) -> None:
        self.buffer += _I16.pack(value)

    def int32(self, value: int) -> None:
        self.buffer += _I32.pack(value)

    def int64(self, value: int) -> None:
        self.buffer += _I64.pack(value)

    def uvarint(self, value: int) -> None:
        while value >= 0x80:
            self.buffer.append((value & 0x7F) | 0x80)
            value >>= 7
        self.buffer.append(value)

    def length(self, count: int | None) -> None:
        """An array or bytes length: int32 (-1 null), or compact uvarint of length + 1."""
        if self.flexible:
            self.uvarint(0 if count is None else count + 1)
        else:
            self.int32(-1 if count is None else count)

    def string(self, value: str | None) -> None:
        raw = None if value is None else value.encode()
        if self.flexible:
            self.uvarint(0 if raw is None else len(raw) + 1)
        else:
            self.int16(-1 if raw is None else len(raw))
        if raw:
            self.buffer += raw

    def tags(self) -> None:
        if self.flexible:
            self.buffer.append(0)


def read_uvarint(data: Buffer, position: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes at data[position], and the position after it."""
    value = shift = 0
    for _ in range(5):
        if position >= len(data):
            raise CorruptRecordError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    raise CorruptRecordError("varint longer than 5 bytes")


def skip_tagged_fields(data: Buffer, position: int) -> int:
    """The position after a tagged-fields section (usually the single byte 0)."""
    if position < len(data) and data[position] == 0:
        return position + 1
    count, position = read_uvarint(data, position)
    for _ in range(count):
        _, position = read_uvarint(data, position)
        size, position = read_uvarint(data, position)
        position += size
        if position > len(data):
            raise CorruptRecordError("tagged field runs past its message")
    return position
