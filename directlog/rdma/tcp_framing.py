"""The tcp transport's wire format: a pure codec (sans-I/O), documented in docs/rdma.md.

A connection starts with one HELLO each way, then carries frames in both directions, since
either end may post ops: requests (WRITE, WRITE_IMM, READ, FETCH_ADD, CMP_SWAP) and the
RESPONSE to each, in request order. Every frame opens with the same 32-byte header
(big-endian):

    0  kind u8      1 WRITE, 2 WRITE_IMM, 3 READ, 4 FETCH_ADD, 5 CMP_SWAP, 128 RESPONSE
    1  status u8    a WcStatus (responses), 0 in requests
    2  reserved u16 0
    4  psn u32      the request's sequence number; a response repeats it
    8  rkey u32     requests; 0 in responses
    12 length u32   WRITE*: payload bytes that follow; READ: bytes asked for;
                    atomics: 8; RESPONSE: payload bytes that follow
    16 addr u64     the remote address (requests); 0 in responses
    24 imm u32      WRITE_IMM's immediate, 0 otherwise
    28 reserved u32 0

What follows the header: WRITE and WRITE_IMM carry ``length`` payload bytes; FETCH_ADD
and CMP_SWAP carry 16 bytes of operands (compare_add u64, swap u64); READ nothing; a
RESPONSE carries the data read (``length`` bytes, READ) or the old word (8 bytes,
big-endian, atomics), or nothing (writes, and every error).

Decoding never trusts a length it has not bounded: ``max_message`` (agreed in HELLO) caps
every length, and an unknown kind, a nonzero reserved field or a field that does not
belong to its kind is a FramingError, which ends the connection.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from directlog.rdma.verbs import WcStatus

HEADER = struct.Struct("!BBHIIIQII")
OPERANDS = struct.Struct("!QQ")
WORD = struct.Struct("!Q")
HELLO = struct.Struct("!8sHHIIIII")
HELLO_MAGIC = b"DLRDMAW1"
VERSION = 1
ATOMIC_LENGTH = 8
MAX_LENGTH = (1 << 31) - 1


class FramingError(ValueError):
    """The peer sent bytes that are not a valid frame: the connection is broken."""


class Kind(enum.IntEnum):
    WRITE = 1
    WRITE_IMM = 2
    READ = 3
    FETCH_ADD = 4
    CMP_SWAP = 5
    RESPONSE = 128


ATOMICS = frozenset({Kind.FETCH_ADD, Kind.CMP_SWAP})
STATUSES = frozenset(int(s) for s in WcStatus)


@dataclass(slots=True, frozen=True)
class Header:
    kind: Kind
    psn: int
    length: int
    status: WcStatus = WcStatus.SUCCESS
    rkey: int = 0
    addr: int = 0
    imm: int = 0

    def trailing(self) -> int:
        """Bytes that follow this header on the wire."""
        if self.kind in (Kind.WRITE, Kind.WRITE_IMM, Kind.RESPONSE):
            return self.length
        if self.kind in ATOMICS:
            return OPERANDS.size
        return 0


@dataclass(slots=True, frozen=True)
class Hello:
    qp_num: int
    max_send_wr: int
    max_recv_wr: int
    max_message: int
    rnr_timeout_ms: int


def encode_header(header: Header) -> bytes:
    return HEADER.pack(
        header.kind,
        header.status,
        0,
        header.psn,
        header.rkey,
        header.length,
        header.addr,
        header.imm,
        0,
    )


def decode_header(data: bytes | bytearray | memoryview, max_message: int) -> Header:
    """The header in the first 32 bytes of ``data``; FramingError if it is not valid."""
    if len(data) < HEADER.size:
        raise FramingError("truncated header")
    kind_value, status_value, reserved, psn, rkey, length, addr, imm, reserved2 = (
        HEADER.unpack_from(data, 0)
    )
    if reserved or reserved2:
        raise FramingError("reserved header fields must be zero")
    try:
        kind = Kind(kind_value)
    except ValueError:
        raise FramingError(f"unknown frame kind {kind_value}") from None
    if length > min(max_message, MAX_LENGTH):
        raise FramingError(f"frame length {length} over the agreed maximum {max_message}")
    if kind is Kind.RESPONSE:
        if status_value not in STATUSES:
            raise FramingError(f"unknown status {status_value}")
        if rkey or addr or imm:
            raise FramingError("a response carries no rkey, address or immediate")
        if status_value != WcStatus.SUCCESS and length:
            raise FramingError("an error response carries no payload")
        return Header(kind, psn, length, WcStatus(status_value))
    if status_value:
        raise FramingError("a request carries no status")
    if imm and kind is not Kind.WRITE_IMM:
        raise FramingError("only WRITE_IMM carries an immediate")
    if kind in ATOMICS and length != ATOMIC_LENGTH:
        raise FramingError("atomics operate on 8 bytes")
    return Header(kind, psn, length, WcStatus.SUCCESS, rkey, addr, imm)


def encode_request(kind: Kind, psn: int, rkey: int, addr: int, length: int, imm: int = 0) -> bytes:
    return encode_header(Header(kind, psn, length, WcStatus.SUCCESS, rkey, addr, imm))


def encode_atomic(kind: Kind, psn: int, rkey: int, addr: int, compare_add: int, swap: int) -> bytes:
    """A whole atomic request: header and operands."""
    return encode_request(kind, psn, rkey, addr, ATOMIC_LENGTH) + OPERANDS.pack(compare_add, swap)


def decode_operands(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    compare_add, swap = OPERANDS.unpack_from(data, 0)
    return int(compare_add), int(swap)


def encode_response(psn: int, status: WcStatus, length: int = 0) -> bytes:
    return encode_header(Header(Kind.RESPONSE, psn, length, status))


def encode_hello(hello: Hello) -> bytes:
    return HELLO.pack(
        HELLO_MAGIC,
        VERSION,
        0,
        hello.qp_num,
        hello.max_send_wr,
        hello.max_recv_wr,
        hello.max_message,
        hello.rnr_timeout_ms,
    )


def decode_hello(data: bytes | bytearray | memoryview) -> Hello:
    if len(data) < HELLO.size:
        raise FramingError("truncated hello")
    magic, version, flags, qp_num, max_send_wr, max_recv_wr, max_message, rnr_timeout_ms = (
        HELLO.unpack_from(data, 0)
    )
    if magic != HELLO_MAGIC or version != VERSION or flags:
        raise FramingError("not a directlog rdma tcp peer, or another version")
    if not (1 <= max_send_wr <= 1 << 16 and 1 <= max_recv_wr <= 1 << 16):
        raise FramingError("peer queue depths out of range")
    if not 1 <= max_message <= MAX_LENGTH:
        raise FramingError("peer max_message out of range")
    return Hello(qp_num, max_send_wr, max_recv_wr, max_message, rnr_timeout_ms)
