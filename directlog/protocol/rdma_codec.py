"""What Directlog's own Kafka-protocol APIs (RdmaAccess 10000, RdmaConsume 10001,
RdmaReplica 10002) share: classic big-endian encoding with int16-length strings, request
header v1 and response header v0 framing, and a reader that bounds every length before
it is used (anything else raises CorruptRecordError)."""

from __future__ import annotations

import struct

from directlog.records.errors import CorruptRecordError
from directlog.records.varint import Buffer

MAX_TOPIC = 249  # Kafka's longest topic name
MAX_PROVIDERS = 8
MAX_PROVIDER_NAME = 32
MAX_MESSAGE = 1024  # characters of an error message kept; 4 bytes each at most
MAX_CLIENT_ID = 0x7FFF

I16 = struct.Struct(">h")
_HEADER = struct.Struct(">hhi")  # api key, api version, correlation id


def encode_string(text: str, limit: int) -> bytes:
    data = text.encode()
    if len(data) > limit:
        raise ValueError(f"string of {len(data)} bytes; at most {limit}")
    return I16.pack(len(data)) + data


def encode_message(message: str | None) -> bytes:
    """A nullable error message, cut to MAX_MESSAGE characters."""
    if message is None:
        return I16.pack(-1)
    return encode_string(message[:MAX_MESSAGE], MAX_MESSAGE * 4)


def encode_providers(providers: tuple[str, ...]) -> bytes:
    if len(providers) > MAX_PROVIDERS:
        raise ValueError(f"more than {MAX_PROVIDERS} providers")
    return I16.pack(len(providers)) + b"".join(
        encode_string(provider, MAX_PROVIDER_NAME) for provider in providers
    )


def request_frame(
    api_key: int, correlation_id: int, client_id: str, body: bytes, version: int = 0
) -> bytes:
    """The size-prefixed request as a client sends it (request header v1)."""
    frame = (
        _HEADER.pack(api_key, version, correlation_id)
        + encode_string(client_id, MAX_CLIENT_ID)
        + body
    )
    return len(frame).to_bytes(4, "big") + frame


def response_body(frame: Buffer, correlation_id: int, api: str) -> memoryview:
    """The body of a response frame without its size prefix (header v0: correlation id)."""
    if len(frame) < 4 or int.from_bytes(frame[:4], "big", signed=True) != correlation_id:
        raise CorruptRecordError(f"{api} answer to another request")
    return memoryview(frame)[4:]


class Reader:
    """Reads a body front to back; every read is bounded by the body's end."""

    def __init__(self, body: Buffer, api: str) -> None:
        self.body = memoryview(body).cast("B")
        self.position = 0
        self.api = api

    def fixed(self, layout: struct.Struct) -> tuple[int, ...]:
        if self.position + layout.size > len(self.body):
            raise CorruptRecordError(f"{self.api} body ends early")
        values = layout.unpack_from(self.body, self.position)
        self.position += layout.size
        return values

    def message(self) -> str | None:
        (length,) = self.fixed(I16)
        if length == -1:
            return None
        return self._text(length, MAX_MESSAGE * 4)

    def string(self, limit: int) -> str:
        (length,) = self.fixed(I16)
        return self._text(length, limit)

    def providers(self) -> tuple[str, ...]:
        (count,) = self.fixed(I16)
        if not 0 <= count <= MAX_PROVIDERS:
            raise CorruptRecordError(f"{count} providers")
        return tuple(self.string(MAX_PROVIDER_NAME) for _ in range(count))

    def _text(self, length: int, limit: int) -> str:
        if not 0 <= length <= limit or self.position + length > len(self.body):
            raise CorruptRecordError(f"string of {length} bytes")
        raw = bytes(self.body[self.position : self.position + length])
        self.position += length
        try:
            return raw.decode()
        except UnicodeDecodeError as error:
            raise CorruptRecordError(f"string is not UTF-8: {error}") from None

    def end(self) -> None:
        if self.position != len(self.body):
            raise CorruptRecordError(f"{len(self.body) - self.position} bytes after the body")
