"""RdmaAccess (Directlog API key 10000, version 0): a client asks a partition's leader for
RDMA write access to its head segment, as in KafkaDirect §4.2.2. Written by hand, byte by
byte in docs/formats.md ("RDMA access"); classic (non-flexible) encoding, big-endian.

The key lies far above Kafka's own (which end below 100), so no Kafka release will ever
collide with it; ApiVersions advertises it, and clients that do not know it ignore it.
Every length is bounded before it is used; anything else raises CorruptRecordError.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from directlog.rdma.verbs import MAX_CONN_INFO
from directlog.records.errors import CorruptRecordError
from directlog.records.varint import Buffer

API_KEY = 10000
EXCLUSIVE, SHARED = 1, 2
MAX_TOPIC = 249  # Kafka's longest topic name
MAX_PROVIDERS = 8
MAX_PROVIDER_NAME = 32
MAX_MESSAGE = 1024
MAX_IN_FLIGHT = 64  # writes a client may have unanswered: the receives a leader posts per QP

_I16 = struct.Struct(">h")
_HEADER = struct.Struct(">hhi")  # api key, api version, correlation id
_REQUEST_FIXED = struct.Struct(">ibiQII")  # partition, mode, min_free, reply addr/rkey/length
# file id, addr, rkey, length, base, position, reservation word addr and rkey
_RESPONSE_FIXED = struct.Struct(">HQIIqiQI")


@dataclass(frozen=True, slots=True)
class RdmaAccessRequest:
    """``min_free``: bytes the client needs in one piece (the leader rolls the head segment
    when less is left). ``reply_*``: the client's registered region the leader writes its
    commit replies into (docs/formats.md "RDMA produce replies")."""

    topic: str
    partition: int
    mode: int
    min_free: int
    providers: tuple[str, ...]
    reply_addr: int
    reply_rkey: int
    reply_length: int

    @staticmethod
    def flexible_version_q(version: int) -> bool:
        """What the request header parser asks of every API: v0 is classic."""
        return False

    def encode(self) -> bytes:
        out = bytearray(_string(self.topic, MAX_TOPIC))
        out += _REQUEST_FIXED.pack(
            self.partition,
            self.mode,
            self.min_free,
            self.reply_addr,
            self.reply_rkey,
            self.reply_length,
        )
        if len(self.providers) > MAX_PROVIDERS:
            raise ValueError(f"more than {MAX_PROVIDERS} providers")
        out += _I16.pack(len(self.providers))
        for provider in self.providers:
            out += _string(provider, MAX_PROVIDER_NAME)
        return bytes(out)


@dataclass(frozen=True, slots=True)
class RdmaAccessResponse:
    """A grant (error_code 0): where to connect and which bytes to write. ``addr`` is
    file position ``position`` of the segment whose base offset is ``base_offset``;
    ``length`` bytes are writable. Exclusive: the client writes from ``addr`` on. Shared:
    the client reserves each write with FETCH_AND_ADD on the 8-byte word at ``word_addr``
    (docs/formats.md "RDMA produce, shared mode"); 0 in exclusive grants."""

    error_code: int
    error_message: str | None = None
    conn_info: str = ""
    file_id: int = 0
    addr: int = 0
    rkey: int = 0
    length: int = 0
    base_offset: int = -1
    position: int = 0
    word_addr: int = 0
    word_rkey: int = 0

    def encode(self) -> bytes:
        out = bytearray(_I16.pack(self.error_code))
        if self.error_message is None:
            out += _I16.pack(-1)
        else:
            out += _string(self.error_message[:MAX_MESSAGE], MAX_MESSAGE * 4)
        out += _string(self.conn_info, MAX_CONN_INFO)
        out += _RESPONSE_FIXED.pack(
            self.file_id,
            self.addr,
            self.rkey,
            self.length,
            self.base_offset,
            self.position,
            self.word_addr,
            self.word_rkey,
        )
        return bytes(out)


def decode_request(body: Buffer, version: int = 0) -> RdmaAccessRequest:
    if version != 0:
        raise CorruptRecordError(f"RdmaAccess v{version} is not defined")
    reader = _Reader(body)
    topic = reader.string(MAX_TOPIC)
    partition, mode, min_free, reply_addr, reply_rkey, reply_length = reader.fixed(_REQUEST_FIXED)
    count = reader.fixed(_I16)[0]
    if not 0 <= count <= MAX_PROVIDERS:
        raise CorruptRecordError(f"{count} providers")
    providers = tuple(reader.string(MAX_PROVIDER_NAME) for _ in range(count))
    reader.end()
    return RdmaAccessRequest(
        topic, partition, mode, min_free, providers, reply_addr, reply_rkey, reply_length
    )


def decode_response(body: Buffer) -> RdmaAccessResponse:
    reader = _Reader(body)
    (error_code,) = reader.fixed(_I16)
    message = reader.nullable_string(MAX_MESSAGE * 4)
    conn_info = reader.string(MAX_CONN_INFO)
    fixed = reader.fixed(_RESPONSE_FIXED)
    reader.end()
    return RdmaAccessResponse(error_code, message, conn_info, *fixed)


def request_frame(request: RdmaAccessRequest, correlation_id: int, client_id: str) -> bytes:
    """The size-prefixed request as a client sends it (request header v1)."""
    body = _HEADER.pack(API_KEY, 0, correlation_id) + _string(client_id, 0x7FFF) + request.encode()
    return len(body).to_bytes(4, "big") + body


def decode_response_frame(frame: Buffer, correlation_id: int) -> RdmaAccessResponse:
    """A response frame without its size prefix: header v0 (correlation id), then body."""
    if len(frame) < 4 or int.from_bytes(frame[:4], "big", signed=True) != correlation_id:
        raise CorruptRecordError("RdmaAccess answer to another request")
    return decode_response(memoryview(frame)[4:])


def _string(text: str, limit: int) -> bytes:
    data = text.encode()
    if len(data) > limit:
        raise ValueError(f"string of {len(data)} bytes; at most {limit}")
    return _I16.pack(len(data)) + data


class _Reader:
    """Reads a body front to back; every read is bounded by the body's end."""

    def __init__(self, body: Buffer) -> None:
        self.body = memoryview(body).cast("B")
        self.position = 0

    def fixed(self, layout: struct.Struct) -> tuple[int, ...]:
        if self.position + layout.size > len(self.body):
            raise CorruptRecordError("RdmaAccess body ends early")
        values = layout.unpack_from(self.body, self.position)
        self.position += layout.size
        return values

    def nullable_string(self, limit: int) -> str | None:
        (length,) = self.fixed(_I16)
        if length == -1:
            return None
        return self._text(length, limit)

    def string(self, limit: int) -> str:
        (length,) = self.fixed(_I16)
        return self._text(length, limit)

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
