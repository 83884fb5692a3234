"""Jute primitives: big-endian int and long, one-byte boolean, length-prefixed buffer and
ustring, counted vector.

The Reader checks every declared length against max_buffer and against the bytes that
remain before it slices anything, so a hostile length costs a comparison, not memory.
"""

import struct
from collections.abc import Callable
from typing import TypeVar

from services.consensus.jute.errors import (
    EncodeError,
    LengthLimitError,
    MalformedError,
    TruncatedError,
)

Buffer = bytes | bytearray | memoryview

# ZooKeeper's jute.maxbuffer default (BinaryInputArchive.maxBuffer = 0xfffff).
DEFAULT_MAX_BUFFER = 0xFFFFF

INT = struct.Struct(">i")
LONG = struct.Struct(">q")
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1

T = TypeVar("T")


class Reader:
    """Cursor over one decoded payload; every read names its field for the error message."""

    __slots__ = ("_buf", "_pos", "max_buffer")

    def __init__(self, buf: Buffer, max_buffer: int = DEFAULT_MAX_BUFFER) -> None:
        self._buf = memoryview(buf).cast("B") if isinstance(buf, memoryview) else buf
        self._pos = 0
        self.max_buffer = max_buffer

    @property
    def remaining(self) -> int:
        return len(self._buf) - self._pos

    def _need(self, size: int, field: str) -> int:
        """Claim `size` bytes and return where they start."""
        pos = self._pos
        end = pos + size
        if end > len(self._buf):
            raise TruncatedError(
                f"{field}: needs {size} bytes at offset {pos}, {self.remaining} remain"
            )
        self._pos = end
        return pos

    def read_int(self, field: str) -> int:
        value: int = INT.unpack_from(self._buf, self._need(4, field))[0]
        return value

    def read_long(self, field: str) -> int:
        value: int = LONG.unpack_from(self._buf, self._need(8, field))[0]
        return value

    def read_struct(self, layout: struct.Struct, field: str) -> tuple[int, ...]:
        """Several fixed-size fields at once (a header, a Stat): one unpack, one check."""
        values: tuple[int, ...] = layout.unpack_from(self._buf, self._need(layout.size, field))
        return values

    def read_bool(self, field: str) -> bool:
        """Any non-zero byte is true, as java.io.DataInput.readBoolean has it."""
        return self._buf[self._need(1, field)] != 0

    def _read_length(self, field: str) -> int | None:
        """A length prefix: None for -1 (null), otherwise checked against both bounds."""
        length = self.read_int(field)
        if length == -1:
            return None
        if length < 0:
            raise MalformedError(f"{field}: negative length {length}")
        if length > self.max_buffer:
            raise LengthLimitError(f"{field}: length {length} exceeds max_buffer {self.max_buffer}")
        return length

    def read_buffer(self, field: str) -> bytes | None:
        length = self._read_length(field)
        if length is None:
            return None
        start = self._need(length, field)
        return bytes(self._buf[start : start + length])

    def read_ustring(self, field: str) -> str:
        """A UTF-8 string; null (-1) reads as "" because kazoo writes "" as null."""
        raw = self.read_buffer(field)
        if raw is None:
            return ""
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedError(f"{field}: invalid UTF-8 at byte {exc.start}") from None

    def read_vector(self, field: str, item: Callable[[], T], min_item_size: int) -> tuple[T, ...]:
        """A counted vector; null (-1) reads as empty. The count is checked against the bytes
        left, at `min_item_size` each, before any element is decoded."""
        count = self._read_length(field)
        if count is None:
            return ()
        if count * min_item_size > self.remaining:
            raise TruncatedError(
                f"{field}: {count} elements need at least {count * min_item_size} bytes, "
                f"{self.remaining} remain"
            )
        return tuple(item() for _ in range(count))

    def expect_end(self, what: str) -> None:
        """Refuse bytes left over after a complete record."""
        if self.remaining:
            raise MalformedError(f"{what}: {self.remaining} bytes after the end of the record")


class Writer:
    """Appends jute primitives to one bytearray; range errors raise EncodeError."""

    __slots__ = ("_out",)

    def __init__(self) -> None:
        self._out = bytearray()

    def getvalue(self) -> bytes:
        return bytes(self._out)

    def write_int(self, value: int) -> None:
        if not _INT_MIN <= value <= _INT_MAX:
            raise EncodeError(f"int value {value} outside int32")
        self._out += INT.pack(value)

    def write_long(self, value: int) -> None:
        if not _LONG_MIN <= value <= _LONG_MAX:
            raise EncodeError(f"long value {value} outside int64")
        self._out += LONG.pack(value)

    def write_struct(self, layout: struct.Struct, *values: int) -> None:
        """Several fixed-size fields at once; out-of-range values raise EncodeError."""
        try:
            self._out += layout.pack(*values)
        except struct.error as exc:
            raise EncodeError(f"{layout.format}: {exc}") from None

    def write_bool(self, value: bool) -> None:
        self._out.append(1 if value else 0)

    def write_buffer(self, value: bytes | None) -> None:
        if value is None:
            self._out += INT.pack(-1)
            return
        self.write_int(len(value))
        self._out += value

    def write_ustring(self, value: str) -> None:
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise EncodeError(f"string has an unencodable character at {exc.start}") from None
        self.write_buffer(raw)

    def write_vector(self, items: tuple[T, ...], item: Callable[[T], None]) -> None:
        self.write_int(len(items))
        for element in items:
            item(element)

    def write_ustrings(self, items: tuple[str, ...]) -> None:
        self.write_vector(items, self.write_ustring)
