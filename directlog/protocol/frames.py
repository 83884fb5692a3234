"""Size-prefixed frames (int32 length, then that many bytes), decoded without I/O.

The length is bounded before anything is buffered for it, so a hostile or corrupt prefix
can never make a reader allocate more than the limit.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

_SIZE = struct.Struct(">i")


class FrameTooLargeError(Exception):
    """A frame length above the limit (socket.request.max.bytes), or a negative one."""


class FrameDecoder:
    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    def feed(self, data: bytes | memoryview) -> Iterator[memoryview]:
        """Add received bytes; yield every frame now complete (payload without the prefix)."""
        self._buffer += data
        start = 0
        buffered = len(self._buffer)
        frames = []
        while buffered - start >= 4:
            (size,) = _SIZE.unpack_from(self._buffer, start)
            if size < 0 or size > self.max_frame:
                raise FrameTooLargeError(f"frame of {size} bytes; the limit is {self.max_frame}")
            if buffered - start - 4 < size:
                break
            frames.append(bytes(self._buffer[start + 4 : start + 4 + size]))
            start += 4 + size
        if start:
            del self._buffer[:start]
        for frame in frames:
            yield memoryview(frame)

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buffer)


def frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload
