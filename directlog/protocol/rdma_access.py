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

from directlog.protocol import rdma_codec
from directlog.protocol.rdma_codec import (
    I16,
    MAX_TOPIC,
    Reader,
    encode_message,
    encode_providers,
    encode_string,
)
from directlog.rdma.verbs import MAX_CONN_INFO
from directlog.records.errors import CorruptRecordError
from directlog.records.varint import Buffer

API_KEY = 10000
EXCLUSIVE, SHARED = 1, 2
MAX_IN_FLIGHT = 64  # writes a client may have unanswered: the receives a leader posts per QP

# partition, mode, acks, min_free, reply addr/rkey/length
_REQUEST_FIXED = struct.Struct(">ibbiQII")
# file id, addr, rkey, length, base, position, reservation word addr and rkey
_RESPONSE_FIXED = struct.Struct(">HQIIqiQI")


@dataclass(frozen=True, slots=True)
class RdmaAccessRequest:
    """``min_free``: bytes the client needs in one piece (the leader rolls the head segment
    when less is left). ``reply_*``: the client's registered region the leader writes its
    commit replies into (docs/formats.md "RDMA produce replies"). ``acks``: 1, a reply
    once the leader committed a write; -1, once the in-sync replicas have it too."""

    topic: str
    partition: int
    mode: int
    min_free: int
    providers: tuple[str, ...]
    reply_addr: int
    reply_rkey: int
    reply_length: int
    acks: int = 1

    @staticmethod
    def flexible_version_q(version: int) -> bool:
        """What the request header parser asks of every API: v0 is classic."""
        return False

    def encode(self) -> bytes:
        out = bytearray(encode_string(self.topic, MAX_TOPIC))
        out += _REQUEST_FIXED.pack(
            self.partition,
            self.mode,
            self.acks,
            self.min_free,
            self.reply_addr,
            self.reply_rkey,
            self.reply_length,
        )
        out += encode_providers(self.providers)
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
        out = bytearray(I16.pack(self.error_code) + encode_message(self.error_message))
        out += encode_string(self.conn_info, MAX_CONN_INFO)
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
    reader = Reader(body, "RdmaAccess")
    topic = reader.string(MAX_TOPIC)
    partition, mode, acks, min_free, reply_addr, reply_rkey, reply_length = reader.fixed(
        _REQUEST_FIXED
    )
    providers = reader.providers()
    reader.end()
    return RdmaAccessRequest(
        topic, partition, mode, min_free, providers, reply_addr, reply_rkey, reply_length, acks
    )


def decode_response(body: Buffer) -> RdmaAccessResponse:
    reader = Reader(body, "RdmaAccess")
    (error_code,) = reader.fixed(I16)
    message = reader.message()
    conn_info = reader.string(MAX_CONN_INFO)
    fixed = reader.fixed(_RESPONSE_FIXED)
    reader.end()
    return RdmaAccessResponse(error_code, message, conn_info, *fixed)


def request_frame(request: RdmaAccessRequest, correlation_id: int, client_id: str) -> bytes:
    """The size-prefixed request as a client sends it (request header v1)."""
    return rdma_codec.request_frame(API_KEY, correlation_id, client_id, request.encode())


def decode_response_frame(frame: Buffer, correlation_id: int) -> RdmaAccessResponse:
    """A response frame without its size prefix: header v0 (correlation id), then body."""
    return decode_response(rdma_codec.response_body(frame, correlation_id, "RdmaAccess"))
