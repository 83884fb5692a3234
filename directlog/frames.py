"""Size-prefixed frames (int32 length, then that many bytes), read without I/O or copies.

Both client protocols Directlog serves frame this way: Kafka's and ZooKeeper's (jute).

The caller receives into `writable()` and reports the count with `received(n)`; `frames()`
then yields each complete frame as a view into the receive buffer, valid until the next
`writable()` call. A frame larger than the buffer gets a buffer of its own, received into
directly, so a 1 MiB produce request is never copied in user space. Every length is bounded
(socket.request.max.bytes) before anything is allocated for it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

_SIZE = struct.Struct(">i")


class FrameTooLargeError(Exception):
    """A frame length above the limit (socket.request.max.bytes), or a negative one."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes; the limit is {limit}")
        self.size = size
        self.limit = limit


class FrameReader:
    def __init__(self, max_frame: int, buffer_size: int = 256 * 1024) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray(buffer_size)
        self._start = 0  # first unconsumed byte in _buffer
        self._end = 0  # end of received bytes in _buffer
        self._large: bytearray | None = None  # payload of a frame bigger than _buffer
        self._large_filled = 0

    def writable(self) -> memoryview:
        """Where the next receive should write (never empty)."""
        if self._large is not None:
            return memoryview(self._large)[self._large_filled :]
        if self._start:
            pending = self._end - self._start
            self._buffer[:pending] = self._buffer[self._start : self._end]
            self._start, self._end = 0, pending
        return memoryview(self._buffer)[self._end :]

    def received(self, count: int) -> None:
        if self._large is not None:
            self._large_filled += count
        else:
            self._end += count

    def frames(self) -> Iterator[memoryview]:
        """Every complete frame received so far (payload without the size prefix)."""
        if self._large is not None:
            if self._large_filled < len(self._large):
                return
            frame, self._large = self._large, None
            yield memoryview(frame)
        buffer = self._buffer
        while self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(buffer, self._start)
            if size < 0 or size > self.max_frame:
                raise FrameTooLargeError(size, self.max_frame)
            available = self._end - self._start - 4
            if size > len(buffer) - 4:
                # Too big for the buffer: move what arrived into a buffer of its own size.
                self._large = bytearray(size)
                part = min(available, size)
                self._large[:part] = buffer[self._start + 4 : self._start + 4 + part]
                self._large_filled = part
                self._start += 4 + part
                if part == size:
                    frame, self._large = self._large, None
                    yield memoryview(frame)
                    continue
                return
            if available < size:
                return
            begin = self._start + 4
            self._start = begin + size
            yield memoryview(buffer)[begin : begin + size]

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """For callers holding bytes already received: every frame they complete, copied
        out (the zero-copy path is writable/received/frames)."""
        incoming = memoryview(data).cast("B")
        out: list[bytes] = []
        taken = 0
        while taken < len(incoming):
            room = self.writable()
            count = min(len(room), len(incoming) - taken)
            room[:count] = incoming[taken : taken + count]
            taken += count
            self.received(count)
            out += [bytes(frame) for frame in self.frames()]
        return out

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        if self._large is not None:
            return self._large_filled + (self._end - self._start)
        return self._end - self._start


def frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload
