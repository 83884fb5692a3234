"""Length-prefixed frames of the ZooKeeper socket stream, split without I/O.

The caller feeds whatever bytes arrived and gets whole payloads back. A declared length
above max_buffer is refused as soon as its four bytes are seen, before anything is
buffered for it, as ZooKeeper's server does ("Len error").
"""

from directlog.frames import FrameReader, FrameTooLargeError
from services.consensus.jute.errors import LengthLimitError, MalformedError
from services.consensus.jute.primitives import DEFAULT_MAX_BUFFER, INT, Buffer


def encode_frame(payload: Buffer) -> bytes:
    """Prefix a payload with its int32 length."""
    return INT.pack(len(payload)) + bytes(payload)


class FrameSplitter:
    """Accumulates stream bytes and yields complete frame payloads in order.

    The splitting is directlog.frames.FrameReader's (the Kafka server's, same framing);
    this adapter takes bytes already received and answers with jute's errors. After it
    raises, the stream has no trustworthy frame boundary left: close the connection
    rather than feed it more.
    """

    __slots__ = ("_reader", "max_buffer")

    def __init__(self, max_buffer: int = DEFAULT_MAX_BUFFER) -> None:
        self._reader = FrameReader(max_buffer, buffer_size=64 * 1024)
        self.max_buffer = max_buffer

    @property
    def pending(self) -> int:
        """Bytes held for a frame not yet complete."""
        return self._reader.pending

    def feed(self, data: Buffer) -> list[bytes]:
        try:
            return self._reader.feed(data)
        except FrameTooLargeError as error:
            if error.size < 0:
                raise MalformedError(f"frame length {error.size} is negative") from error
            raise LengthLimitError(
                f"frame length {error.size} exceeds max_buffer {self.max_buffer}"
            ) from error
