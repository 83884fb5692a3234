"""RdmaConsume (Directlog API key 10001, versions 0-1): a consumer asks a partition's
leader for RDMA read access to the segment holding an offset, or releases a segment it
finished, as in KafkaDirect §4.4.2. Written by hand, byte by byte in docs/formats.md ("RDMA
consume"); classic (non-flexible) encoding, big-endian, like RdmaAccess (key 10000).
Version 1 adds the consumer's isolation level (Kafka's Fetch isolation_level values); a v0
consumer reads uncommitted. The response is the same in both versions.

The metadata slot the broker keeps for each mutable segment a consumer reads is defined
here too (``Slot``), since broker and client must agree on it to the byte. Every length is
bounded before it is used; anything malformed raises CorruptRecordError.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from crc32c import crc32c

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

API_KEY = 10001
MAX_VERSION = 1
ACCESS, RELEASE = 1, 2
READ_UNCOMMITTED, READ_COMMITTED = 0, 1  # isolation levels, as in Kafka's Fetch (v4+)
NEW_CONSUMER = 0  # the consumer id of a first access: the broker assigns one
NO_SLOT = -1

_REQUEST_FIXED = struct.Struct(">ibiq")  # partition, op, consumer id, offset
_ISOLATION = struct.Struct(">b")  # v1: after the providers
# consumer id, base offset, addr, rkey, length, position, readable end, mutable,
# slot region addr/rkey/length, slot index, bind addr/rkey
_RESPONSE_FIXED = struct.Struct(">iqQIIIIbQIIiQI")


@dataclass(frozen=True, slots=True)
class RdmaConsumeRequest:
    """ACCESS: the segment holding ``offset``. RELEASE: give back the segment whose base
    offset is ``offset``. ``consumer_id`` names the consumer's slot region (NEW_CONSUMER on
    its first access). ``isolation_level`` (v1): READ_COMMITTED bounds what the consumer
    may read by the last stable offset; the broker refuses any other value than the two
    (decoding keeps it, so the answer can say so)."""

    topic: str
    partition: int
    op: int
    consumer_id: int
    offset: int
    providers: tuple[str, ...] = ()
    isolation_level: int = READ_UNCOMMITTED

    @staticmethod
    def flexible_version_q(version: int) -> bool:
        """What the request header parser asks of every API: every version is classic."""
        return False

    @property
    def version(self) -> int:
        """The lowest version that carries this request: v0 cannot say read_committed."""
        return 0 if self.isolation_level == READ_UNCOMMITTED else 1

    def encode(self, version: int | None = None) -> bytes:
        """The body in ``version`` (by default ``self.version``)."""
        version = self.version if version is None else version
        if not 0 <= version <= MAX_VERSION:
            raise ValueError(f"RdmaConsume v{version} is not defined")
        if version < self.version:
            raise ValueError(f"RdmaConsume v{version} has no isolation level")
        out = bytearray(encode_string(self.topic, MAX_TOPIC))
        out += _REQUEST_FIXED.pack(self.partition, self.op, self.consumer_id, self.offset)
        out += encode_providers(self.providers)
        if version >= 1:
            out += _ISOLATION.pack(self.isolation_level)
        return bytes(out)


@dataclass(frozen=True, slots=True)
class RdmaConsumeResponse:
    """An ACCESS grant (error_code 0): bytes [``position``, ``readable_end``) of the
    segment at ``base_offset`` may be read now, at ``addr + position`` with ``rkey``;
    ``length`` bytes are registered. A ``mutable`` segment grows: its slot ``slot_index``
    in the consumer's slot region (``slot_addr``/``slot_rkey``/``slot_length``) says how
    far. ``bind_addr``/``bind_rkey``: where the consumer's queue pair writes its id once
    (WRITE_WITH_IMM) so the broker ties the slot region to it. A RELEASE answers only
    the error code and the consumer id."""

    error_code: int
    error_message: str | None = None
    conn_info: str = ""
    consumer_id: int = NEW_CONSUMER
    base_offset: int = -1
    addr: int = 0
    rkey: int = 0
    length: int = 0
    position: int = 0
    readable_end: int = 0
    mutable: bool = False
    slot_addr: int = 0
    slot_rkey: int = 0
    slot_length: int = 0
    slot_index: int = NO_SLOT
    bind_addr: int = 0
    bind_rkey: int = 0

    def encode(self) -> bytes:
        out = bytearray(I16.pack(self.error_code) + encode_message(self.error_message))
        out += encode_string(self.conn_info, MAX_CONN_INFO)
        out += _RESPONSE_FIXED.pack(
            self.consumer_id,
            self.base_offset,
            self.addr,
            self.rkey,
            self.length,
            self.position,
            self.readable_end,
            int(self.mutable),
            self.slot_addr,
            self.slot_rkey,
            self.slot_length,
            self.slot_index,
            self.bind_addr,
            self.bind_rkey,
        )
        return bytes(out)


def decode_request(body: Buffer, version: int = 0) -> RdmaConsumeRequest:
    if not 0 <= version <= MAX_VERSION:
        raise CorruptRecordError(f"RdmaConsume v{version} is not defined")
    reader = Reader(body, "RdmaConsume")
    topic = reader.string(MAX_TOPIC)
    partition, op, consumer_id, offset = reader.fixed(_REQUEST_FIXED)
    providers = reader.providers()
    (isolation_level,) = reader.fixed(_ISOLATION) if version >= 1 else (READ_UNCOMMITTED,)
    reader.end()
    return RdmaConsumeRequest(topic, partition, op, consumer_id, offset, providers, isolation_level)


def decode_response(body: Buffer) -> RdmaConsumeResponse:
    reader = Reader(body, "RdmaConsume")
    (error_code,) = reader.fixed(I16)
    message = reader.message()
    conn_info = reader.string(MAX_CONN_INFO)
    fixed = reader.fixed(_RESPONSE_FIXED)
    reader.end()
    consumer_id, base, addr, rkey, length, position, end, mutable = fixed[:8]
    slot_addr, slot_rkey, slot_length, slot_index, bind_addr, bind_rkey = fixed[8:]
    if mutable not in (0, 1):
        raise CorruptRecordError(f"mutable flag {mutable}")
    return RdmaConsumeResponse(
        error_code,
        message,
        conn_info,
        consumer_id,
        base,
        addr,
        rkey,
        length,
        position,
        end,
        bool(mutable),
        slot_addr,
        slot_rkey,
        slot_length,
        slot_index,
        bind_addr,
        bind_rkey,
    )


def request_frame(request: RdmaConsumeRequest, correlation_id: int, client_id: str) -> bytes:
    """The size-prefixed request as a client sends it (request header v1), in the lowest
    version that carries it, so a read_uncommitted consumer works with any broker."""
    version = request.version
    body = request.encode(version)
    return rdma_codec.request_frame(API_KEY, correlation_id, client_id, body, version)


def decode_response_frame(frame: Buffer, correlation_id: int) -> RdmaConsumeResponse:
    """A response frame without its size prefix: header v0 (correlation id), then body."""
    return decode_response(rdma_codec.response_body(frame, correlation_id, "RdmaConsume"))


# Metadata slots ------------------------------------------------------------------------

MUTABLE, REVOKED = 1, 2  # slot flags
_SLOT_BODY = struct.Struct("<IIqQQII")  # version, flags, base, readable end, addr, rkey, length
_SLOT_CRC = struct.Struct("<II")  # crc32c of the body, reserved
SLOT_SIZE = _SLOT_BODY.size + _SLOT_CRC.size
assert SLOT_SIZE == 48


class Slot(NamedTuple):
    """What the broker says of one segment a consumer reads: bytes before
    ``readable_end`` are readable (whole batches, all below the high watermark, and for a
    read_committed consumer below the last stable offset) through
    ``addr``/``rkey`` (``length`` bytes registered; a segment sealed by a roll is
    registered anew at its final size). MUTABLE: readable_end may still grow. REVOKED:
    the access ended (leadership moved, the segment was deleted); ask again. A named
    tuple: a consumer decodes one per poll."""

    version: int
    flags: int
    base_offset: int
    readable_end: int
    addr: int
    rkey: int
    length: int

    @property
    def mutable(self) -> bool:
        return bool(self.flags & MUTABLE)

    @property
    def revoked(self) -> bool:
        return bool(self.flags & REVOKED)


def write_slot(buf: memoryview, at: int, slot: Slot) -> None:
    """Store ``slot`` at byte ``at`` of a slot region, checksum last."""
    _SLOT_BODY.pack_into(
        buf,
        at,
        slot.version & 0xFFFFFFFF,
        slot.flags,
        slot.base_offset,
        slot.readable_end,
        slot.addr,
        slot.rkey,
        slot.length,
    )
    body = buf[at : at + _SLOT_BODY.size]
    _SLOT_CRC.pack_into(buf, at + _SLOT_BODY.size, crc32c(body), 0)


def read_slot(buf: Buffer, at: int = 0) -> Slot | None:
    """The slot at byte ``at`` of a copy of a slot region, or None when its checksum does
    not match: a read that overlapped the broker's update (read it again) or a free slot."""
    view = memoryview(buf)
    if at < 0 or at + SLOT_SIZE > len(view):
        raise CorruptRecordError(f"slot at byte {at} lies outside {len(view)} bytes")
    crc, _ = _SLOT_CRC.unpack_from(view, at + _SLOT_BODY.size)
    if crc32c(view[at : at + _SLOT_BODY.size]) != crc:
        return None
    return Slot._make(_SLOT_BODY.unpack_from(view, at))
