"""RdmaReplica (Directlog API key 10002, version 0): a partition's leader asks a follower
for exclusive RDMA write access to the follower's own head segment, to push new batches
into it (KafkaDirect §4.3.2, push replication). Byte by byte in docs/formats.md ("RDMA
replication"); classic (non-flexible) encoding, big-endian, like RdmaAccess (10000).

Also here: the 32-bit immediate of the leader's writes, the follower's reply slot and the
high watermark word, so both ends share one definition of every byte.
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

API_KEY = 10002
OPEN = 0  # channel_id of a request that opens a new channel
MAX_CHANNELS = 1 << 15  # channel ids are 15 bits of the immediate, 0 is never used
ORDERS = 1 << 16
MAX_CREDITS = 1024

KIND_RECORDS = 0  # the write placed record batches at the grant's next byte
KIND_HIGH_WATERMARK = 1  # the write replaced the high watermark word

REPLY = struct.Struct(">Hhq")  # order, error code, follower's log end offset
HIGH_WATERMARK = struct.Struct(">q")

_REQUEST_FIXED = struct.Struct(">iiiHqiQII")
_RESPONSE_FIXED = struct.Struct(">HHqiQIIqiQI")


def immediate(kind: int, channel_id: int, order: int) -> int:
    """The leader's 32-bit immediate: kind (1 bit), channel id (15 bits), order (16 bits)."""
    if kind not in (KIND_RECORDS, KIND_HIGH_WATERMARK) or not 0 < channel_id < MAX_CHANNELS:
        raise ValueError(f"kind {kind}, channel {channel_id}")
    return kind << 31 | channel_id << 16 | order % ORDERS


def parse_immediate(imm: int) -> tuple[int, int, int]:
    """(kind, channel id, order) of an immediate."""
    return imm >> 31 & 1, imm >> 16 & (MAX_CHANNELS - 1), imm & (ORDERS - 1)


@dataclass(frozen=True, slots=True)
class RdmaReplicaRequest:
    """``channel_id`` 0 opens a channel (the follower pauses its pull fetches of the
    partition and grants its head segment from its log end); another asks that channel for
    its next grant, which starts at ``log_end_offset`` (what the leader has pushed and the
    follower answered). ``min_free``: bytes the next push needs in one piece. ``reply_*``:
    the leader's registered region the follower writes its replies into."""

    topic: str
    partition: int
    leader_id: int
    leader_epoch: int
    channel_id: int
    log_end_offset: int
    min_free: int
    reply_addr: int
    reply_rkey: int
    reply_length: int
    providers: tuple[str, ...]

    @staticmethod
    def flexible_version_q(version: int) -> bool:
        return False

    def encode(self) -> bytes:
        out = bytearray(encode_string(self.topic, MAX_TOPIC))
        out += _REQUEST_FIXED.pack(
            self.partition,
            self.leader_id,
            self.leader_epoch,
            self.channel_id,
            self.log_end_offset,
            self.min_free,
            self.reply_addr,
            self.reply_rkey,
            self.reply_length,
        )
        out += encode_providers(self.providers)
        return bytes(out)


@dataclass(frozen=True, slots=True)
class RdmaReplicaResponse:
    """A grant (error_code 0): the leader's next push goes to ``addr``, which is file
    position ``position`` of the follower's segment based at ``base_offset`` and holds
    offset ``log_end_offset`` (the follower's log end; ``last_epoch`` is its latest leader
    epoch, for the leader to check the logs agree). ``length`` bytes are writable; at most
    ``credits`` writes may be unanswered. The high watermark goes to ``hw_addr``."""

    error_code: int
    error_message: str | None = None
    conn_info: str = ""
    channel_id: int = 0
    credits: int = 0
    log_end_offset: int = -1
    last_epoch: int = -1
    addr: int = 0
    rkey: int = 0
    length: int = 0
    base_offset: int = -1
    position: int = 0
    hw_addr: int = 0
    hw_rkey: int = 0

    def encode(self) -> bytes:
        out = bytearray(I16.pack(self.error_code) + encode_message(self.error_message))
        out += encode_string(self.conn_info, MAX_CONN_INFO)
        out += _RESPONSE_FIXED.pack(
            self.channel_id,
            self.credits,
            self.log_end_offset,
            self.last_epoch,
            self.addr,
            self.rkey,
            self.length,
            self.base_offset,
            self.position,
            self.hw_addr,
            self.hw_rkey,
        )
        return bytes(out)


def decode_request(body: Buffer, version: int = 0) -> RdmaReplicaRequest:
    if version != 0:
        raise CorruptRecordError(f"RdmaReplica v{version} is not defined")
    reader = Reader(body, "RdmaReplica")
    topic = reader.string(MAX_TOPIC)
    fields = reader.fixed(_REQUEST_FIXED)
    providers = reader.providers()
    reader.end()
    partition, leader_id, leader_epoch, channel_id, end, min_free, addr, rkey, length = fields
    return RdmaReplicaRequest(
        topic,
        partition,
        leader_id,
        leader_epoch,
        channel_id,
        end,
        min_free,
        addr,
        rkey,
        length,
        providers,
    )


def decode_response(body: Buffer) -> RdmaReplicaResponse:
    reader = Reader(body, "RdmaReplica")
    (error_code,) = reader.fixed(I16)
    message = reader.message()
    conn_info = reader.string(MAX_CONN_INFO)
    fields = reader.fixed(_RESPONSE_FIXED)
    reader.end()
    channel_id, credits, end, last_epoch, addr, rkey, length, base, position, hw, hw_rkey = fields
    return RdmaReplicaResponse(
        error_code,
        message,
        conn_info,
        channel_id,
        credits,
        end,
        last_epoch,
        addr,
        rkey,
        length,
        base,
        position,
        hw,
        hw_rkey,
    )


def request_frame(request: RdmaReplicaRequest, correlation_id: int, client_id: str) -> bytes:
    """The size-prefixed request as the leader sends it (request header v1)."""
    return rdma_codec.request_frame(API_KEY, correlation_id, client_id, request.encode())


def decode_response_frame(frame: Buffer, correlation_id: int) -> RdmaReplicaResponse:
    """A response frame without its size prefix: header v0 (correlation id), then body."""
    return decode_response(rdma_codec.response_body(frame, correlation_id, "RdmaReplica"))
