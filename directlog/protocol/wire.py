"""Primitive Kafka wire types for the hand-written hot paths (Produce, Fetch).

Classic versions use int16/int32 lengths with -1 for null; flexible versions use unsigned
varints of length + 1 (0 for null) and end each struct with tagged fields. The reader
bounds every length by the bytes it has before slicing.
"""

from __future__ import annotations

import struct

from directlog.records.errors import CorruptRecordError

_I8, _I16, _I32, _I64 = (
    struct.Struct(">b"),
    struct.Struct(">h"),
    struct.Struct(">i"),
    struct.Struct(">q"),
)


class Reader:
    def __init__(self, data: memoryview, flexible: bool) -> None:
        self.data = data
        self.flexible = flexible
        self.position = 0

    def _take(self, size: int) -> int:
        start = self.position
        if size < 0 or start + size > len(self.data):
            raise CorruptRecordError(f"field of {size} bytes at {start} runs past the request")
        self.position = start + size
        return start

    def int8(self) -> int:
        return int(_I8.unpack_from(self.data, self._take(1))[0])

    def int16(self) -> int:
        return int(_I16.unpack_from(self.data, self._take(2))[0])

    def int32(self) -> int:
        return int(_I32.unpack_from(self.data, self._take(4))[0])

    def uvarint(self) -> int:
        value = shift = 0
        for _ in range(5):
            byte = self.data[self._take(1)]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
        raise CorruptRecordError("varint longer than 5 bytes")

    def length(self) -> int:
        """An array or bytes length; -1 for null."""
        return self.uvarint() - 1 if self.flexible else self.int32()

    def string(self) -> str | None:
        size = self.uvarint() - 1 if self.flexible else self.int16()
        if size < 0:
            return None
        start = self._take(size)
        try:
            return bytes(self.data[start : start + size]).decode()
        except UnicodeDecodeError as exc:
            raise CorruptRecordError("string is not UTF-8") from exc

    def bytes_view(self) -> memoryview | None:
        size = self.length()
        if size < 0:
            return None
        start = self._take(size)
        return self.data[start : start + size]

    def tags(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()
                self._take(self.uvarint())

    def array_length(self, limit: int) -> int:
        """An array count, bounded: each element needs at least one byte."""
        count = self.length()
        if count > len(self.data) - self.position or count > limit:
            raise CorruptRecordError(f"array of {count} elements cannot fit the request")
        return count


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
