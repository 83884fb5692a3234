"""Length-prefixed frames of the ZooKeeper socket stream, split without I/O.

The caller feeds whatever bytes arrived and gets whole payloads back. A declared length
above max_buffer is refused as soon as its four bytes are seen, before anything is
buffered for it, as ZooKeeper's server does ("Len error").
"""

from services.consensus.jute.errors import LengthLimitError, MalformedError
from services.consensus.jute.primitives import DEFAULT_MAX_BUFFER, INT, Buffer


def encode_frame(payload: Buffer) -> bytes:
    """Prefix a payload with its int32 length."""
    return INT.pack(len(payload)) + bytes(payload)


class FrameSplitter:
    """Accumulates stream bytes and yields complete frame payloads in order.

    After it raises, the stream has no trustworthy frame boundary left: close the
    connection rather than feed it more.
    """

    __slots__ = ("_buf", "max_buffer")

    def __init__(self, max_buffer: int = DEFAULT_MAX_BUFFER) -> None:
        self._buf = bytearray()
        self.max_buffer = max_buffer

    @property
    def pending(self) -> int:
        """Bytes held for a frame not yet complete."""
        return len(self._buf)

    def feed(self, data: Buffer) -> list[bytes]:
        self._buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(self._buf)
        try:
            while end - pos >= 4:
                (length,) = INT.unpack_from(self._buf, pos)
                if length < 0:
                    raise MalformedError(f"frame length {length} is negative")
                if length > self.max_buffer:
                    raise LengthLimitError(
                        f"frame length {length} exceeds max_buffer {self.max_buffer}"
                    )
                if end - pos - 4 < length:
                    break
                frames.append(bytes(self._buf[pos + 4 : pos + 4 + length]))
                pos += 4 + length
        finally:
            del self._buf[:pos]
        return frames
