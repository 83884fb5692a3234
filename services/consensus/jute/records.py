"""Jute records of the ZooKeeper client protocol (zookeeper.jute, org.apache.zookeeper.proto
and .data), one frozen dataclass each, fields in wire order.

Every record has `write(Writer)` and `read(Reader)`. ustrings are `str` (null reads as "");
buffers are `bytes | None` because a znode's data may really be null; vectors are tuples
(null reads as empty).
"""

import struct
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Self

from directlog.record import record
from services.consensus.codes import ErrorCode, OpCode
from services.consensus.jute.errors import EncodeError, MalformedError
from services.consensus.jute.primitives import Reader, Writer

# Smallest encodings, used to bound a vector's count before decoding its elements.
USTRING_MIN = 4
ACL_MIN = 4 + USTRING_MIN + USTRING_MIN


@dataclass(frozen=True, slots=True, order=True)
class Id:
    scheme: str
    id: str

    def write(self, w: Writer) -> None:
        w.write_ustring(self.scheme)
        w.write_ustring(self.id)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(r.read_ustring("Id.scheme"), r.read_ustring("Id.id"))


@record
class ACL:
    perms: int
    id: Id

    def write(self, w: Writer) -> None:
        w.write_int(self.perms)
        self.id.write(w)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(r.read_int("ACL.perms"), Id.read(r))


def _write_acls(w: Writer, acl: tuple[ACL, ...]) -> None:
    w.write_vector(acl, lambda a: a.write(w))


def _read_acls(r: Reader, field: str) -> tuple[ACL, ...]:
    return r.read_vector(field, lambda: ACL.read(r), ACL_MIN)


# czxid mzxid ctime mtime: long; version cversion aversion: int; ephemeralOwner: long;
# dataLength numChildren: int; pzxid: long.
_STAT_LAYOUT = struct.Struct(">qqqqiiiqiiq")


class Stat(NamedTuple):
    """A named tuple, unlike the other records: the tree makes one for every write it
    applies and every read it answers, and a tuple of eleven fields builds several times
    faster than a frozen dataclass."""

    czxid: int
    mzxid: int
    ctime: int
    mtime: int
    version: int
    cversion: int
    aversion: int
    ephemeral_owner: int
    data_length: int
    num_children: int
    pzxid: int

    def write(self, w: Writer) -> None:
        w.write_struct(_STAT_LAYOUT, *self)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(*r.read_struct(_STAT_LAYOUT, "Stat"))


# --- session ---------------------------------------------------------------------------


@record
class ConnectRequest:
    """First packet of a connection, sent without a RequestHeader. read_only is the trailing
    boolean 3.4+ clients append; an older client's packet ends before it and reads False."""

    protocol_version: int
    last_zxid_seen: int
    time_out: int
    session_id: int
    passwd: bytes | None
    read_only: bool = False

    def write(self, w: Writer) -> None:
        w.write_int(self.protocol_version)
        w.write_long(self.last_zxid_seen)
        w.write_int(self.time_out)
        w.write_long(self.session_id)
        w.write_buffer(self.passwd)
        w.write_bool(self.read_only)

    @classmethod
    def read(cls, r: Reader) -> Self:
        protocol_version = r.read_int("ConnectRequest.protocolVersion")
        last_zxid_seen = r.read_long("ConnectRequest.lastZxidSeen")
        time_out = r.read_int("ConnectRequest.timeOut")
        session_id = r.read_long("ConnectRequest.sessionId")
        passwd = r.read_buffer("ConnectRequest.passwd")
        read_only = r.read_bool("ConnectRequest.readOnly") if r.remaining else False
        return cls(protocol_version, last_zxid_seen, time_out, session_id, passwd, read_only)


@record
class ConnectResponse:
    """Answer to ConnectRequest; servers append read_only after the jute record, and a
    response from a server that does not reads False."""

    protocol_version: int
    time_out: int
    session_id: int
    passwd: bytes | None
    read_only: bool = False

    def write(self, w: Writer) -> None:
        w.write_int(self.protocol_version)
        w.write_int(self.time_out)
        w.write_long(self.session_id)
        w.write_buffer(self.passwd)
        w.write_bool(self.read_only)

    @classmethod
    def read(cls, r: Reader) -> Self:
        protocol_version = r.read_int("ConnectResponse.protocolVersion")
        time_out = r.read_int("ConnectResponse.timeOut")
        session_id = r.read_long("ConnectResponse.sessionId")
        passwd = r.read_buffer("ConnectResponse.passwd")
        read_only = r.read_bool("ConnectResponse.readOnly") if r.remaining else False
        return cls(protocol_version, time_out, session_id, passwd, read_only)


@record
class RequestHeader:
    xid: int
    type: int

    LAYOUT: ClassVar[struct.Struct] = struct.Struct(">ii")

    def write(self, w: Writer) -> None:
        w.write_struct(self.LAYOUT, self.xid, self.type)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(*r.read_struct(cls.LAYOUT, "RequestHeader"))


@record
class ReplyHeader:
    xid: int
    zxid: int
    err: int

    LAYOUT: ClassVar[struct.Struct] = struct.Struct(">iqi")

    def write(self, w: Writer) -> None:
        w.write_struct(self.LAYOUT, self.xid, self.zxid, self.err)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(*r.read_struct(cls.LAYOUT, "ReplyHeader"))


@record
class AuthPacket:
    type: int
    scheme: str
    auth: bytes | None

    def write(self, w: Writer) -> None:
        w.write_int(self.type)
        w.write_ustring(self.scheme)
        w.write_buffer(self.auth)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(
            r.read_int("AuthPacket.type"),
            r.read_ustring("AuthPacket.scheme"),
            r.read_buffer("AuthPacket.auth"),
        )


@record
class SaslToken:
    """GetSASLRequest (opcode 102) and SetSASLResponse, its reply: one SASL token each way
    until the mechanism completes."""

    token: bytes | None

    def write(self, w: Writer) -> None:
        w.write_buffer(self.token)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(r.read_buffer("SASL.token"))


GetSASLRequest = SetSASLResponse = SaslToken


@record
class SetWatches:
    """Sent on reconnect (xid -8) to re-arm the watches a client held."""

    relative_zxid: int
    data_watches: tuple[str, ...]
    exist_watches: tuple[str, ...]
    child_watches: tuple[str, ...]

    def write(self, w: Writer) -> None:
        w.write_long(self.relative_zxid)
        w.write_ustrings(self.data_watches)
        w.write_ustrings(self.exist_watches)
        w.write_ustrings(self.child_watches)

    @classmethod
    def read(cls, r: Reader) -> Self:
        relative_zxid = r.read_long("SetWatches.relativeZxid")
        return cls(
            relative_zxid,
            _read_ustrings(r, "SetWatches.dataWatches"),
            _read_ustrings(r, "SetWatches.existWatches"),
            _read_ustrings(r, "SetWatches.childWatches"),
        )


def _read_ustrings(r: Reader, field: str) -> tuple[str, ...]:
    return r.read_vector(field, lambda: r.read_ustring(field), USTRING_MIN)


@record
class WatcherEvent:
    """Body of a notification (ReplyHeader xid -1)."""

    type: int
    state: int
    path: str

    def write(self, w: Writer) -> None:
        w.write_int(self.type)
        w.write_int(self.state)
        w.write_ustring(self.path)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(
            r.read_int("WatcherEvent.type"),
            r.read_int("WatcherEvent.state"),
            r.read_ustring("WatcherEvent.path"),
        )


# --- requests --------------------------------------------------------------------------


@record
class CreateRequest:
    """Body of create (1) and create2 (15); the header's type tells them apart."""

    path: str
    data: bytes | None
    acl: tuple[ACL, ...]
    flags: int

    def write(self, w: Writer) -> None:
        w.write_ustring(self.path)
        w.write_buffer(self.data)
        _write_acls(w, self.acl)
        w.write_int(self.flags)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(
            r.read_ustring("CreateRequest.path"),
            r.read_buffer("CreateRequest.data"),
            _read_acls(r, "CreateRequest.acl"),
            r.read_int("CreateRequest.flags"),
        )


@record
class DeleteRequest:
    path: str
    version: int

    def write(self, w: Writer) -> None:
        w.write_ustring(self.path)
        w.write_int(self.version)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(r.read_ustring("DeleteRequest.path"), r.read_int("DeleteRequest.version"))


@record
class CheckVersionRequest:
    path: str
    version: int

    def write(self, w: Writer) -> None:
        w.write_ustring(self.path)
        w.write_int(self.version)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(
            r.read_ustring("CheckVersionRequest.path"),
            r.read_int("CheckVersionRequest.version"),
        )


@record
class PathWatchRequest:
    """Body of exists (3), getData (4), getChildren (8) and getChildren2 (12): the four
    share one layout (ExistsRequest, GetDataRequest, GetChildrenRequest, GetChildren2Request)."""

    path: str
    watch: bool

    def write(self, w: Writer) -> None:
        w.write_ustring(self.path)
        w.write_bool(self.watch)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(r.read_ustring("request.path"), r.read_bool("request.watch"))


ExistsRequest = GetDataRequest = GetChildrenRequest = GetChildren2Request = PathWatchRequest


@record
class PathRequest:
    """Body of getACL (6) and sync (9): GetACLRequest and SyncRequest are a lone path."""

    path: str

    def write(self, w: Writer) -> None:
        w.write_ustring(self.path)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(r.read_ustring("request.path"))


GetACLRequest = SyncRequest = PathRequest


@record
class SetDataRequest:
    path: str
    data: bytes | None
    version: int

    def write(self, w: Writer) -> None:
        w.write_ustring(self.path)
        w.write_buffer(self.data)
        w.write_int(self.version)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(
            r.read_ustring("SetDataRequest.path"),
            r.read_buffer("SetDataRequest.data"),
            r.read_int("SetDataRequest.version"),
        )


@record
class ReconfigRequest:
    """Body of reconfig (16). Incremental: ``joining_servers`` (comma-separated
    ``server.N=...`` strings) and ``leaving_servers`` (comma-separated ids); or a whole
    new configuration in ``new_members``. Absent strings read as ""."""

    joining_servers: str
    leaving_servers: str
    new_members: str
    cur_config_id: int

    def write(self, w: Writer) -> None:
        # An empty string goes out null, as clients send it: ZooKeeper takes any non-null
        # newMembers, even "", for a whole new configuration.
        for text in (self.joining_servers, self.leaving_servers, self.new_members):
            w.write_buffer(text.encode("utf-8") if text else None)
        w.write_long(self.cur_config_id)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(
            r.read_ustring("ReconfigRequest.joiningServers"),
            r.read_ustring("ReconfigRequest.leavingServers"),
            r.read_ustring("ReconfigRequest.newMembers"),
            r.read_long("ReconfigRequest.curConfigId"),
        )


@record
class SetACLRequest:
    path: str
    acl: tuple[ACL, ...]
    version: int

    def write(self, w: Writer) -> None:
        w.write_ustring(self.path)
        _write_acls(w, self.acl)
        w.write_int(self.version)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(
            r.read_ustring("SetACLRequest.path"),
            _read_acls(r, "SetACLRequest.acl"),
            r.read_int("SetACLRequest.version"),
        )


@record
class MultiHeader:
    """Precedes each op of a multi and each of its results; type -1 with done ends the list."""

    type: int
    done: bool
    err: int

    def write(self, w: Writer) -> None:
        w.write_int(self.type)
        w.write_bool(self.done)
        w.write_int(self.err)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(
            r.read_int("MultiHeader.type"),
            r.read_bool("MultiHeader.done"),
            r.read_int("MultiHeader.err"),
        )


MULTI_END = MultiHeader(-1, True, -1)

MultiOpBody = CreateRequest | DeleteRequest | SetDataRequest | CheckVersionRequest

_MULTI_OP_BODIES: dict[int, type[MultiOpBody]] = {
    OpCode.CREATE: CreateRequest,
    OpCode.CREATE2: CreateRequest,
    OpCode.DELETE: DeleteRequest,
    OpCode.SET_DATA: SetDataRequest,
    OpCode.CHECK: CheckVersionRequest,
}


@record
class MultiOp:
    """One op of a multi: its opcode (create and create2 share a body) and its body."""

    type: int
    body: MultiOpBody


@record
class MultiRequest:
    """Body of multi (14), as MultiOperationRecord writes it: each op is MultiHeader(type,
    false, -1) then its body, and MULTI_END closes the list."""

    ops: tuple[MultiOp, ...]

    def write(self, w: Writer) -> None:
        for op in self.ops:
            if _MULTI_OP_BODIES.get(op.type) is not type(op.body):
                raise EncodeError(f"multi op type {op.type} cannot carry {type(op.body).__name__}")
            MultiHeader(op.type, False, -1).write(w)
            op.body.write(w)
        MULTI_END.write(w)

    @classmethod
    def read(cls, r: Reader) -> Self:
        ops: list[MultiOp] = []
        while True:
            header = MultiHeader.read(r)
            if header.done:
                return cls(tuple(ops))
            body_type = _MULTI_OP_BODIES.get(header.type)
            if body_type is None:
                raise MalformedError(f"multi op {len(ops)} has unsupported type {header.type}")
            ops.append(MultiOp(header.type, body_type.read(r)))


# --- responses -------------------------------------------------------------------------


@record
class PathResponse:
    """Body of the create (1) and sync (9) replies: CreateResponse and SyncResponse."""

    path: str

    def write(self, w: Writer) -> None:
        w.write_ustring(self.path)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(r.read_ustring("response.path"))


CreateResponse = SyncResponse = PathResponse


@record
class Create2Response:
    path: str
    stat: Stat

    def write(self, w: Writer) -> None:
        w.write_ustring(self.path)
        self.stat.write(w)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(r.read_ustring("Create2Response.path"), Stat.read(r))


@record
class StatResponse:
    """Body of the exists (3), setData (5) and setACL (7) replies: ExistsResponse,
    SetDataResponse and SetACLResponse are a lone Stat."""

    stat: Stat

    def write(self, w: Writer) -> None:
        self.stat.write(w)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(Stat.read(r))


ExistsResponse = SetDataResponse = SetACLResponse = StatResponse


@record
class GetDataResponse:
    data: bytes | None
    stat: Stat

    def write(self, w: Writer) -> None:
        w.write_buffer(self.data)
        self.stat.write(w)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(r.read_buffer("GetDataResponse.data"), Stat.read(r))


@record
class GetACLResponse:
    acl: tuple[ACL, ...]
    stat: Stat

    def write(self, w: Writer) -> None:
        _write_acls(w, self.acl)
        self.stat.write(w)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(_read_acls(r, "GetACLResponse.acl"), Stat.read(r))


@record
class GetChildrenResponse:
    children: tuple[str, ...]

    def write(self, w: Writer) -> None:
        w.write_ustrings(self.children)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(_read_ustrings(r, "GetChildrenResponse.children"))


@record
class GetChildren2Response:
    children: tuple[str, ...]
    stat: Stat

    def write(self, w: Writer) -> None:
        w.write_ustrings(self.children)
        self.stat.write(w)

    @classmethod
    def read(cls, r: Reader) -> Self:
        return cls(_read_ustrings(r, "GetChildren2Response.children"), Stat.read(r))


@record
class DeleteResult:
    """A delete inside a multi succeeded; it has no body on the wire."""


@record
class CheckResult:
    """A check inside a multi succeeded; it has no body on the wire."""


@record
class ErrorResult:
    """An op of a multi failed (or was rolled back, err 0, because another op failed)."""

    err: int


MultiResult = (
    PathResponse | Create2Response | StatResponse | DeleteResult | CheckResult | ErrorResult
)


@record
class MultiResponse:
    """Reply to multi, as MultiResponse.serialize writes it: each result is MultiHeader(type,
    false, err) then its body, where type is the op's opcode, or -1 with ErrorResponse(err)
    for a failed op; MULTI_END closes the list. A create result is a PathResponse, create2's
    a Create2Response, setData's a StatResponse."""

    results: tuple[MultiResult, ...]

    def write(self, w: Writer) -> None:
        for result in self.results:
            match result:
                case PathResponse():
                    MultiHeader(OpCode.CREATE, False, 0).write(w)
                    result.write(w)
                case Create2Response():
                    MultiHeader(OpCode.CREATE2, False, 0).write(w)
                    result.write(w)
                case StatResponse():
                    MultiHeader(OpCode.SET_DATA, False, 0).write(w)
                    result.write(w)
                case DeleteResult():
                    MultiHeader(OpCode.DELETE, False, 0).write(w)
                case CheckResult():
                    MultiHeader(OpCode.CHECK, False, 0).write(w)
                case ErrorResult(err=err):
                    MultiHeader(OpCode.ERROR, False, err).write(w)
                    w.write_int(err)
        MULTI_END.write(w)

    @classmethod
    def read(cls, r: Reader) -> Self:
        results: list[MultiResult] = []
        while True:
            header = MultiHeader.read(r)
            if header.done:
                return cls(tuple(results))
            result: MultiResult
            match header.type:
                case OpCode.CREATE:
                    result = PathResponse.read(r)
                case OpCode.CREATE2:
                    result = Create2Response.read(r)
                case OpCode.SET_DATA:
                    result = StatResponse.read(r)
                case OpCode.DELETE:
                    result = DeleteResult()
                case OpCode.CHECK:
                    result = CheckResult()
                case OpCode.ERROR:
                    result = ErrorResult(r.read_int("ErrorResponse.err"))
                case _:
                    raise MalformedError(
                        f"multi result {len(results)} has unsupported type {header.type}"
                    )
            results.append(result)


ROLLED_BACK = ErrorResult(ErrorCode.OK)
