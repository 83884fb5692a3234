"""Binary framing for ZAB peer messages over TCP: a small fixed header, then a per-type body.

Every frame is ``length:uint32 | type:uint8 | sender:int32 | body`` (big-endian). ``length``
counts the bytes after itself (type + sender + body), so a frame is ``4 + length`` bytes and
the smallest legal ``length`` is 5. A reader knows a frame's size from its first four bytes,
so an oversized or hostile length is refused before any of the body is buffered.

Field encodings: ``i32``/``i64`` signed, ``u8``/``u32`` unsigned; ``opt i64`` is a presence
byte (0 absent, 1 present) followed by the i64 only when present; ``[T]`` is a ``u32`` count
followed by that many ``T``; ``bytes`` is ``u32`` length then the bytes; ``entry`` is
``zxid:i64 | payload:bytes``; ``opt snapshot`` is a presence byte, then
``zxid:i64 | data:bytes``. Enums travel as a u8 code, fixed here rather than derived from
the enum's string values so renaming a member cannot change the wire:
ServerState LOOKING=0 FOLLOWING=1 LEADING=2 OBSERVING=3; SyncMode DIFF=0 TRUNC=1 SNAP=2.

====  ============  ==============================================================
type  message       body
====  ============  ==============================================================
1     Notification  leader:i32 zxid:i64 peer_epoch:i64 election_epoch:i64 state:u8
                    config_version:i64 voters:[i64] observers:[i64]
2     FollowerInfo  accepted_epoch:i64 accepted_leader:i32
3     NewEpoch      epoch:i64
4     AckEpoch      epoch:i64 current_epoch:i64 last_zxid:i64 epoch_ends:[i64]
5     Sync          epoch:i64 mode:u8 truncate_to:i64 entries:[entry] snapshot:opt snapshot
6     NewLeader     epoch:i64 zxid:i64 config_version:i64 voters:[i64] observers:[i64]
7     AckNewLeader  epoch:i64 zxid:i64
8     UpToDate      epoch:i64 commit_zxid:i64
9     Proposal      epoch:i64 entry:entry
10    Ack           epoch:i64 zxid:i64
11    Commit        epoch:i64 zxid:i64
12    Ping          epoch:i64
13    PingAck       epoch:i64 sessions:[i64]
14    Forward       epoch:i64 request_id:i64 payload:bytes
15    ForwardReply  epoch:i64 request_id:i64 zxid:opt i64
16    Inform        epoch:i64 entry:entry
====  ============  ==============================================================

Decoding is bounded: every length and count is checked against the bytes actually left in
the frame before it is used, and every failure is a :class:`WireError` naming the problem.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import fields
from typing import Final, Literal

from directlog.frames import FrameReader, FrameTooLargeError
from directlog.record import record
from services.consensus.zab.messages import (
    Ack,
    AckEpoch,
    AckNewLeader,
    Commit,
    FollowerInfo,
    Forward,
    ForwardReply,
    Inform,
    Message,
    NewEpoch,
    NewLeader,
    Notification,
    Ping,
    PingAck,
    Proposal,
    ServerState,
    Sync,
    SyncMode,
    UpToDate,
)
from services.consensus.zab.state import LogEntry, Snapshot

__all__ = ["DEFAULT_MAX_FRAME", "HEADER_SIZE", "FrameDecoder", "WireError", "encode"]

HEADER_SIZE: Final = 9  # length:u32 type:u8 sender:i32
_MIN_LENGTH: Final = 5  # type + sender, empty body
DEFAULT_MAX_FRAME: Final = 64 * 1024 * 1024  # a SNAP sync carries a whole log

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_HEADER = struct.Struct(">IBi")

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_U32_MAX = (1 << 32) - 1

_STATES: Final = (
    ServerState.LOOKING,
    ServerState.FOLLOWING,
    ServerState.LEADING,
    ServerState.OBSERVING,
)
_MODES: Final = (SyncMode.DIFF, SyncMode.TRUNC, SyncMode.SNAP)
_STATE_CODES: Final = {s: i for i, s in enumerate(_STATES)}
_MODE_CODES: Final = {m: i for i, m in enumerate(_MODES)}

_ENTRY_MIN: Final = 12  # zxid:i64 + payload length:u32


class WireError(Exception):
    """A frame that cannot be encoded or decoded; the connection carrying it is unusable."""


Kind = Literal[
    "i32", "i64", "opt_i64", "i64s", "state", "mode", "entry", "entries", "bytes", "opt_snapshot"
]


@record
class _Codec:
    type_code: int
    cls: type
    make: Callable[..., Message]
    name: str
    body: tuple[tuple[str, Kind], ...]  # every field but ``sender``, in wire order


def _codec(code: int, cls: type[Message], *body: tuple[str, Kind]) -> _Codec:
    # Fail at import if the table and the dataclass ever disagree on the fields.
    names = tuple(f.name for f in fields(cls))
    assert names == ("sender", *(n for n, _ in body)), (cls.__name__, names)
    return _Codec(code, cls, cls, cls.__name__, body)


_EPOCH: Final[tuple[str, Kind]] = ("epoch", "i64")
_ZXID: Final[tuple[str, Kind]] = ("zxid", "i64")

_CODECS: Final = (
    _codec(
        1,
        Notification,
        ("leader", "i32"),
        _ZXID,
        ("peer_epoch", "i64"),
        ("election_epoch", "i64"),
        ("state", "state"),
        ("config_version", "i64"),
        ("voters", "i64s"),
        ("observers", "i64s"),
    ),
    _codec(2, FollowerInfo, ("accepted_epoch", "i64"), ("accepted_leader", "i32")),
    _codec(3, NewEpoch, _EPOCH),
    _codec(
        4,
        AckEpoch,
        _EPOCH,
        ("current_epoch", "i64"),
        ("last_zxid", "i64"),
        ("epoch_ends", "i64s"),
    ),
    _codec(
        5,
        Sync,
        _EPOCH,
        ("mode", "mode"),
        ("truncate_to", "i64"),
        ("entries", "entries"),
        ("snapshot", "opt_snapshot"),
    ),
    _codec(
        6,
        NewLeader,
        _EPOCH,
        _ZXID,
        ("config_version", "i64"),
        ("voters", "i64s"),
        ("observers", "i64s"),
    ),
    _codec(7, AckNewLeader, _EPOCH, _ZXID),
    _codec(8, UpToDate, _EPOCH, ("commit_zxid", "i64")),
    _codec(9, Proposal, _EPOCH, ("entry", "entry")),
    _codec(10, Ack, _EPOCH, _ZXID),
    _codec(11, Commit, _EPOCH, _ZXID),
    _codec(12, Ping, _EPOCH),
    _codec(13, PingAck, _EPOCH, ("sessions", "i64s")),
    _codec(14, Forward, _EPOCH, ("request_id", "i64"), ("payload", "bytes")),
    _codec(15, ForwardReply, _EPOCH, ("request_id", "i64"), ("zxid", "opt_i64")),
    _codec(16, Inform, _EPOCH, ("entry", "entry")),
)
_BY_CLASS: Final = {c.cls: c for c in _CODECS}
_BY_CODE: Final = {c.type_code: c for c in _CODECS}


# --- encoding ---------------------------------------------------------------------------


def _put_int(out: bytearray, packer: struct.Struct, lo: int, hi: int, v: int, what: str) -> None:
    if not lo <= v <= hi:
        raise WireError(f"{what}={v} out of range [{lo}, {hi}]")
    out += packer.pack(v)


def _put_bytes(out: bytearray, data: bytes, what: str) -> None:
    if len(data) > _U32_MAX:
        raise WireError(f"{what}: {len(data)} bytes exceed a u32 length")
    out += _U32.pack(len(data))
    out += data


def _put_entry(out: bytearray, entry: LogEntry, what: str) -> None:
    _put_int(out, _I64, _I64_MIN, _I64_MAX, entry.zxid, f"{what}.zxid")
    _put_bytes(out, entry.payload, f"{what}.payload")


def _put_count(out: bytearray, n: int, what: str) -> None:
    if n > _U32_MAX:
        raise WireError(f"{what}: {n} items exceed a u32 count")
    out += _U32.pack(n)


def _put(out: bytearray, kind: Kind, value: object, what: str) -> None:
    if kind == "i64":
        assert isinstance(value, int)
        _put_int(out, _I64, _I64_MIN, _I64_MAX, value, what)
    elif kind == "i32":
        assert isinstance(value, int)
        _put_int(out, _I32, _I32_MIN, _I32_MAX, value, what)
    elif kind == "opt_i64":
        if value is None:
            out.append(0)
        else:
            assert isinstance(value, int)
            out.append(1)
            _put_int(out, _I64, _I64_MIN, _I64_MAX, value, what)
    elif kind == "i64s":
        assert isinstance(value, tuple)
        _put_count(out, len(value), what)
        for i, v in enumerate(value):
            _put_int(out, _I64, _I64_MIN, _I64_MAX, v, f"{what}[{i}]")
    elif kind == "state":
        assert isinstance(value, ServerState)
        out.append(_STATE_CODES[value])
    elif kind == "mode":
        assert isinstance(value, SyncMode)
        out.append(_MODE_CODES[value])
    elif kind == "entry":
        assert isinstance(value, LogEntry)
        _put_entry(out, value, what)
    elif kind == "opt_snapshot":
        if value is None:
            out.append(0)
        else:
            assert isinstance(value, Snapshot)
            out.append(1)
            _put_int(out, _I64, _I64_MIN, _I64_MAX, value.zxid, f"{what}.zxid")
            _put_bytes(out, value.data, f"{what}.data")
    elif kind == "entries":
        assert isinstance(value, tuple)
        _put_count(out, len(value), what)
        for i, e in enumerate(value):
            _put_entry(out, e, f"{what}[{i}]")
    else:  # "bytes"
        assert isinstance(value, bytes)
        _put_bytes(out, value, what)


# The messages sent for every write (Proposal, Ack, Commit, Forward, ForwardReply) are
# encoded with one pack and decoded with one unpack each. Proposal and Forward share a
# layout: epoch, an i64, then a payload. Bodies first; a frame's struct is its length and
# type byte, then the body.
_PAYLOAD = struct.Struct(">iqqI")  # Proposal, Forward: sender epoch i64 payload-length
_EPOCH_ZXID = struct.Struct(">iqq")  # Ack, Commit: sender epoch zxid
_REPLY = struct.Struct(">iqqB")  # ForwardReply: sender epoch request_id presence
_REPLY_ZXID = struct.Struct(_REPLY.format + "q")  # ... presence=1, then the zxid


def _framed(body: struct.Struct) -> struct.Struct:
    return struct.Struct(">IB" + body.format.lstrip(">"))


_HEADER_PAYLOAD = _framed(_PAYLOAD)
_PAYLOAD_REST: Final = _HEADER_PAYLOAD.size - 4  # what ``length`` counts, but the payload
_HEADER_EPOCH_ZXID = _framed(_EPOCH_ZXID)
_HEADER_REPLY = _framed(_REPLY)
_HEADER_REPLY_ZXID = _framed(_REPLY_ZXID)
_PROPOSAL, _ACK, _COMMIT, _FORWARD, _FORWARD_REPLY = (
    _BY_CLASS[cls].type_code for cls in (Proposal, Ack, Commit, Forward, ForwardReply)
)


def _encode_quick(message: Message) -> bytes | None:
    """A per-write message in one pack; None for any other type, or for a value out of
    its field's range, which the general path then refuses with a precise error."""
    try:
        if isinstance(message, Proposal | Forward):
            if isinstance(message, Proposal):
                code, number, payload = _PROPOSAL, message.entry.zxid, message.entry.payload
            else:
                code, number, payload = _FORWARD, message.request_id, message.payload
            size = _PAYLOAD_REST + len(payload)
            head = _HEADER_PAYLOAD.pack(
                size, code, message.sender, message.epoch, number, len(payload)
            )
            return head + payload
        if isinstance(message, Ack | Commit):
            code = _ACK if isinstance(message, Ack) else _COMMIT
            size = _HEADER_EPOCH_ZXID.size - 4
            return _HEADER_EPOCH_ZXID.pack(size, code, message.sender, message.epoch, message.zxid)
        if isinstance(message, ForwardReply):
            ids = (message.sender, message.epoch, message.request_id)
            if message.zxid is None:
                return _HEADER_REPLY.pack(_HEADER_REPLY.size - 4, _FORWARD_REPLY, *ids, 0)
            size = _HEADER_REPLY_ZXID.size - 4
            return _HEADER_REPLY_ZXID.pack(size, _FORWARD_REPLY, *ids, 1, message.zxid)
    except struct.error:
        pass
    return None


def encode(message: Message) -> bytes:
    """The full frame for ``message``: header included, ready to write to the socket."""
    quick = _encode_quick(message)
    if quick is not None:
        return quick
    codec = _BY_CLASS.get(type(message))
    if codec is None:
        raise WireError(f"not a ZAB message: {type(message).__name__}")
    out = bytearray(HEADER_SIZE)
    for name, kind in codec.body:
        _put(out, kind, getattr(message, name), f"{codec.name}.{name}")
    length = len(out) - 4
    if length > _U32_MAX:
        raise WireError(f"{codec.name}: frame of {length} bytes exceeds a u32 length")
    sender = message.sender
    if not _I32_MIN <= sender <= _I32_MAX:
        raise WireError(f"{codec.name}.sender={sender} out of range for i32")
    _HEADER.pack_into(out, 0, length, codec.type_code, sender)
    return bytes(out)


# --- decoding ---------------------------------------------------------------------------


class _Reader:
    """A cursor over one frame's body; every read checks the bytes left first."""

    __slots__ = ("buf", "end", "pos", "what")

    def __init__(self, buf: bytes | bytearray, pos: int, end: int, what: str) -> None:
        self.buf, self.pos, self.end, self.what = buf, pos, end, what

    def _need(self, n: int, field: str) -> int:
        pos = self.pos
        if self.end - pos < n:
            raise WireError(
                f"{self.what}.{field}: body too short, needs {n} bytes, {self.end - pos} left"
            )
        self.pos = pos + n
        return pos

    def u8(self, field: str) -> int:
        return self.buf[self._need(1, field)]

    def i32(self, field: str) -> int:
        v: int = _I32.unpack_from(self.buf, self._need(4, field))[0]
        return v

    def i64(self, field: str) -> int:
        v: int = _I64.unpack_from(self.buf, self._need(8, field))[0]
        return v

    def count(self, field: str, item_size: int) -> int:
        n: int = _U32.unpack_from(self.buf, self._need(4, field))[0]
        left = self.end - self.pos
        if n * item_size > left:
            raise WireError(
                f"{self.what}.{field}: {n} items need at least {n * item_size} bytes, {left} left"
            )
        return n

    def raw(self, field: str) -> bytes:
        n = self.count(field, 1)
        pos = self._need(n, field)
        return bytes(self.buf[pos : pos + n])

    def presence(self, field: str) -> bool:
        flag = self.u8(field)
        if flag > 1:
            raise WireError(f"{self.what}.{field}: presence byte {flag}, expected 0 or 1")
        return flag == 1

    def entry(self, field: str) -> LogEntry:
        return LogEntry(self.i64(f"{field}.zxid"), self.raw(f"{field}.payload"))

    def read(self, kind: Kind, field: str) -> object:
        if kind == "i64":
            return self.i64(field)
        if kind == "i32":
            return self.i32(field)
        if kind == "opt_i64":
            return self.i64(field) if self.presence(field) else None
        if kind == "i64s":
            return tuple(self.i64(field) for _ in range(self.count(field, 8)))
        if kind == "state":
            code = self.u8(field)
            if code >= len(_STATES):
                raise WireError(f"{self.what}.{field}: unknown ServerState code {code}")
            return _STATES[code]
        if kind == "mode":
            code = self.u8(field)
            if code >= len(_MODES):
                raise WireError(f"{self.what}.{field}: unknown SyncMode code {code}")
            return _MODES[code]
        if kind == "entry":
            return self.entry(field)
        if kind == "opt_snapshot":
            if not self.presence(field):
                return None
            return Snapshot(self.i64(f"{field}.zxid"), self.raw(f"{field}.data"))
        if kind == "entries":
            n = self.count(field, _ENTRY_MIN)
            return tuple(self.entry(f"{field}[{i}]") for i in range(n))
        return self.raw(field)  # "bytes"


_EPOCH_ZXID_TYPES: Final[dict[int, type[Ack | Commit]]] = {_ACK: Ack, _COMMIT: Commit}


def _decode_quick(buf: bytes | bytearray, start: int, end: int) -> Message | None:
    """A per-write message the quick way; None for any other type. Sizes and presence
    bytes are checked exactly, so a frame that does not fit takes the general path and
    its error."""
    type_code = buf[start]
    size = end - start - 1
    if type_code in (_PROPOSAL, _FORWARD):
        if size >= _PAYLOAD.size:
            sender, epoch, number, length = _PAYLOAD.unpack_from(buf, start + 1)
            body = start + 1 + _PAYLOAD.size
            if body + length == end:
                payload = bytes(buf[body:end])
                if type_code == _PROPOSAL:
                    return Proposal(sender, epoch, LogEntry(number, payload))
                return Forward(sender, epoch, number, payload)
    elif type_code in _EPOCH_ZXID_TYPES:
        if size == _EPOCH_ZXID.size:
            return _EPOCH_ZXID_TYPES[type_code](*_EPOCH_ZXID.unpack_from(buf, start + 1))
    elif type_code == _FORWARD_REPLY and size in (_REPLY.size, _REPLY_ZXID.size):
        sender, epoch, request_id, present = _REPLY.unpack_from(buf, start + 1)
        if present == 0 and size == _REPLY.size:
            return ForwardReply(sender, epoch, request_id, None)
        if present == 1 and size == _REPLY_ZXID.size:
            zxid = _REPLY_ZXID.unpack_from(buf, start + 1)[-1]
            return ForwardReply(sender, epoch, request_id, zxid)
    return None


def _decode_frame(buf: bytes | bytearray, start: int, end: int) -> Message:
    """Decode the frame whose type byte is at ``start`` and whose last byte is ``end - 1``."""
    quick = _decode_quick(buf, start, end)
    if quick is not None:
        return quick
    type_code = buf[start]
    codec = _BY_CODE.get(type_code)
    if codec is None:
        raise WireError(f"unknown message type {type_code}")
    sender: int = _I32.unpack_from(buf, start + 1)[0]
    reader = _Reader(buf, start + 5, end, codec.name)
    values = [sender, *(reader.read(kind, name) for name, kind in codec.body)]
    if reader.pos != end:
        raise WireError(f"{codec.name}: {end - reader.pos} trailing bytes after the body")
    return codec.make(*values)


class FrameDecoder:
    """Splits a TCP byte stream into frames and decodes them.

    The splitting is directlog.frames.FrameReader's: ``max_frame`` bounds a frame's
    ``length`` field and a larger one is refused as soon as its four length bytes arrive,
    so a peer cannot make us buffer it. After a :class:`WireError` the stream has lost
    framing, so the decoder refuses all further input.
    """

    __slots__ = ("_failed", "_max_frame", "_reader")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if not _MIN_LENGTH <= max_frame <= _U32_MAX:
            raise ValueError(f"max_frame must be in [{_MIN_LENGTH}, {_U32_MAX}], got {max_frame}")
        self._max_frame = max_frame
        self._reader = FrameReader(max_frame, buffer_size=64 * 1024)
        self._failed: WireError | None = None

    def feed(self, data: bytes) -> list[Message]:
        """Buffer ``data`` and return every message completed by it, in stream order."""
        if self._failed is not None:
            raise WireError(f"decoder already failed: {self._failed}")
        try:
            try:
                frames = self._reader.feed(data)
            except FrameTooLargeError as error:
                length = error.size % (1 << 32)  # the field is unsigned on this wire
                raise WireError(
                    f"frame length {length} exceeds max_frame {self._max_frame}"
                ) from error
            out = []
            for frame in frames:
                if len(frame) < _MIN_LENGTH:
                    raise WireError(
                        f"frame length {len(frame)} is below the {_MIN_LENGTH}-byte header"
                    )
                out.append(_decode_frame(frame, 0, len(frame)))
        except WireError as e:
            self._failed = e
            self._reader = FrameReader(self._max_frame, buffer_size=64 * 1024)  # drop the rest
            raise
        return out

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return self._reader.pending
