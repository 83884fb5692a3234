"""What ZAB carries for the data tree: client writes on their way to the leader, and the
transactions the leader turns them into (the log entries every member applies).

Both use jute's primitives (big-endian ints and longs, length-prefixed buffers and
strings, counted vectors). A write travelling to the leader::

    session_id:long  auth:vector<scheme:ustring id:ustring>  op:int  body

A transaction, as stored in the log and applied in zxid order::

    time_ms:long  session_id:long  op:int  body

``op`` is ZooKeeper's opcode for the operation (create 1, delete 2, setData 5, setACL 7,
sync 9, check 13, multi 14, reconfig 16, deleteContainer 20, createSession -10,
closeSession -11) or
-1 for an error transaction: a write the leader refused still travels through ZAB, so the
member that took it answers its client in order with the others, as ZooKeeper does.

Znode data (of create and setData, alone or in a multi) is a jute buffer, whose length -1
is null: null data is carried as null and kept apart from empty data (length 0), as
ZooKeeper keeps it. Payloads written before null was kept never hold -1 there (null was
stored as empty), so they read as they always did.
"""

from __future__ import annotations

import struct

from directlog.record import record
from services.consensus.codes import CreateMode, ErrorCode, OpCode
from services.consensus.jute.errors import JuteError, MalformedError
from services.consensus.jute.primitives import Reader, Writer
from services.consensus.jute.records import ACL, Id
from services.consensus.tree.model import (
    Check,
    CheckTxn,
    CloseSession,
    CloseSessionTxn,
    Create,
    CreateSession,
    CreateSessionTxn,
    CreateTxn,
    Delete,
    DeleteContainer,
    DeleteTxn,
    Multi,
    MultiOp,
    MultiTxn,
    Request,
    Session,
    SetACL,
    SetACLTxn,
    SetData,
    SetDataTxn,
    SubTxn,
    Txn,
    TxnBody,
)

# Payloads come from members, not clients; the bound only stops a corrupt length.
_MAX_PAYLOAD = 1 << 30


@record
class SyncRequest:
    """``sync``: a no-op through the leader, so a follower's reply comes after every write
    the leader had taken before it."""

    path: str


@record
class SyncTxn:
    path: str


@record
class Reconfig:
    """``reconfig`` on its way to the leader (the fields of ZooKeeper's ReconfigRequest):
    only the leader can check it against the configuration and its synced followers."""

    joining: str
    leaving: str
    new_members: str
    cur_config_id: int


@record
class ReconfigTxn:
    """A new configuration, in ZooKeeper's text (dynamic_config.py) with its version,
    the zxid of this transaction. Committed, it becomes the active configuration."""

    config: str


@record
class ErrorTxn:
    """A refused write: ``op_codes`` has one code per op of a refused multi."""

    code: ErrorCode
    op_codes: tuple[ErrorCode, ...] = ()


Write = Request | SyncRequest | Reconfig
LoggedBody = TxnBody | SyncTxn | ErrorTxn | ReconfigTxn


@record
class Logged:
    """A decoded log entry: the time the leader took it, who asked, and what it does."""

    time_ms: int
    session_id: int
    body: LoggedBody

    def txn(self, zxid: int) -> Txn:
        assert not isinstance(self.body, SyncTxn | ErrorTxn | ReconfigTxn)
        return Txn(zxid, self.time_ms, self.session_id, self.body)


class PayloadError(Exception):
    """A payload that does not decode: a peer runs different code, or memory went bad."""


# -- shared pieces -----------------------------------------------------------------------


def _write_acl(w: Writer, acl: tuple[ACL, ...]) -> None:
    w.write_vector(acl, lambda a: a.write(w))


def _read_acl(r: Reader) -> tuple[ACL, ...]:
    return r.read_vector("acl", lambda: ACL.read(r), 12)


def _read_codes(r: Reader) -> tuple[ErrorCode, ...]:
    return r.read_vector("codes", lambda: ErrorCode(r.read_int("code")), 4)


# setData is the commonest write: every member encodes or decodes each one on its way
# (the write to the leader, its transaction to every member), so its body -- path:ustring
# data:buffer version:int -- has a few-unpack path of its own in each direction. Anything
# else, or anything not well-formed, takes the field-by-field code and its errors.
_WRITE_HEAD = struct.Struct(">qii")  # session id, auth count, op
_LOGGED_HEAD = struct.Struct(">qqi")  # time, session id, op
_INT = struct.Struct(">i")
_NULL = _INT.pack(-1)  # the length of a null buffer


def _pack_set_data(head: bytes, path: str, data: bytes | None, version: int) -> bytes | None:
    """None when a field does not fit its type (the field-by-field writer then says why)."""
    try:
        raw_path = path.encode()
        return b"".join(
            (
                head,
                _INT.pack(len(raw_path)),
                raw_path,
                _NULL if data is None else _INT.pack(len(data)),
                data or b"",
                _INT.pack(version),
            )
        )
    except (struct.error, UnicodeEncodeError):
        return None


def _unpack_set_data(payload: bytes, start: int) -> tuple[str, bytes | None, int] | None:
    """path, data (None for null) and version of a setData body from ``start`` to exactly
    the end."""
    if len(payload) < start + 12:
        return None
    (path_length,) = _INT.unpack_from(payload, start)
    path_end = start + 4 + path_length
    if path_length < 0 or path_end + 8 > len(payload):
        return None
    (data_length,) = _INT.unpack_from(payload, path_end)
    null = data_length == -1
    data_end = path_end + 4 + (0 if null else data_length)
    if (data_length < 0 and not null) or data_end + 4 != len(payload):
        return None
    try:
        path = payload[start + 4 : path_end].decode()
    except UnicodeDecodeError:
        return None
    (version,) = _INT.unpack_from(payload, data_end)
    return path, None if null else payload[path_end + 4 : data_end], version


# -- writes ------------------------------------------------------------------------------


def _write_op(w: Writer, op: MultiOp) -> None:
    if isinstance(op, Create):
        w.write_int(OpCode.CREATE)
        w.write_ustring(op.path)
        w.write_buffer(op.data)
        _write_acl(w, op.acl)
        w.write_int(op.mode)
    elif isinstance(op, Delete):
        w.write_int(OpCode.DELETE)
        w.write_ustring(op.path)
        w.write_int(op.version)
    elif isinstance(op, SetData):
        w.write_int(OpCode.SET_DATA)
        w.write_ustring(op.path)
        w.write_buffer(op.data)
        w.write_int(op.version)
    elif isinstance(op, SetACL):
        w.write_int(OpCode.SET_ACL)
        w.write_ustring(op.path)
        _write_acl(w, op.acl)
        w.write_int(op.version)
    else:
        w.write_int(OpCode.CHECK)
        w.write_ustring(op.path)
        w.write_int(op.version)


def _read_op(r: Reader, op: int) -> MultiOp:
    path = r.read_ustring("path")
    if op == OpCode.CREATE:
        data = r.read_buffer("data")
        acl = _read_acl(r)
        return Create(path, data, acl, CreateMode(r.read_int("mode")))
    if op == OpCode.DELETE:
        return Delete(path, r.read_int("version"))
    if op == OpCode.SET_DATA:
        data = r.read_buffer("data")
        return SetData(path, data, r.read_int("version"))
    if op == OpCode.SET_ACL:
        acl = _read_acl(r)
        return SetACL(path, acl, r.read_int("version"))
    if op == OpCode.CHECK:
        return Check(path, r.read_int("version"))
    raise MalformedError(f"op {op} is not a multi op")


def encode_write(session: Session, request: Write) -> bytes:
    if type(request) is SetData and not session.auth:
        quick = _pack_set_data(
            _WRITE_HEAD.pack(session.session_id, 0, OpCode.SET_DATA),
            request.path,
            request.data,
            request.version,
        )
        if quick is not None:
            return quick
    return encode_write_in_full(session, request)


def encode_write_in_full(session: Session, request: Write) -> bytes:
    """Any write, field by field."""
    w = Writer()
    w.write_long(session.session_id)
    w.write_vector(tuple(sorted(session.auth)), lambda ident: ident.write(w))
    if isinstance(request, Multi):
        w.write_int(OpCode.MULTI)
        w.write_vector(request.ops, lambda op: _write_op(w, op))
    elif isinstance(request, CreateSession):
        w.write_int(OpCode.CREATE_SESSION)
        w.write_int(request.timeout_ms)
    elif isinstance(request, CloseSession):
        w.write_int(OpCode.CLOSE_SESSION)
    elif isinstance(request, DeleteContainer):
        w.write_int(OpCode.DELETE_CONTAINER)
        w.write_ustring(request.path)
    elif isinstance(request, SyncRequest):
        w.write_int(OpCode.SYNC)
        w.write_ustring(request.path)
    elif isinstance(request, Reconfig):
        w.write_int(OpCode.RECONFIG)
        w.write_ustring(request.joining)
        w.write_ustring(request.leaving)
        w.write_ustring(request.new_members)
        w.write_long(request.cur_config_id)
    else:
        _write_op(w, request)
    return w.getvalue()


def decode_write(payload: bytes) -> tuple[Session, Write]:
    if len(payload) >= _WRITE_HEAD.size:
        session_id, auth_count, op = _WRITE_HEAD.unpack_from(payload)
        if auth_count == 0 and op == OpCode.SET_DATA:
            body = _unpack_set_data(payload, _WRITE_HEAD.size)
            if body is not None:
                return Session(session_id), SetData(*body)
    return decode_write_in_full(payload)


def decode_write_in_full(payload: bytes) -> tuple[Session, Write]:
    """Any write, field by field; PayloadError for what does not decode."""
    try:
        r = Reader(payload, _MAX_PAYLOAD)
        session_id = r.read_long("session_id")
        auth = r.read_vector("auth", lambda: Id.read(r), 8)
        op = r.read_int("op")
        request: Write
        if op == OpCode.MULTI:
            request = Multi(r.read_vector("ops", lambda: _read_op(r, r.read_int("op")), 8))
        elif op == OpCode.CREATE_SESSION:
            request = CreateSession(r.read_int("timeout"))
        elif op == OpCode.CLOSE_SESSION:
            request = CloseSession()
        elif op == OpCode.DELETE_CONTAINER:
            request = DeleteContainer(r.read_ustring("path"))
        elif op == OpCode.SYNC:
            request = SyncRequest(r.read_ustring("path"))
        elif op == OpCode.RECONFIG:
            request = Reconfig(
                r.read_ustring("joining"),
                r.read_ustring("leaving"),
                r.read_ustring("new_members"),
                r.read_long("cur_config_id"),
            )
        else:
            request = _read_op(r, op)
        r.expect_end("write")
    except (JuteError, ValueError) as exc:
        raise PayloadError(f"undecodable write: {exc}") from exc
    return Session(session_id, frozenset(auth)), request


# -- transactions ------------------------------------------------------------------------


def _write_sub(w: Writer, txn: SubTxn) -> None:
    if isinstance(txn, CreateTxn):
        w.write_int(OpCode.CREATE)
        w.write_ustring(txn.path)
        w.write_buffer(txn.data)
        _write_acl(w, txn.acl)
        w.write_long(txn.ephemeral_owner)
        w.write_int(txn.parent_cversion)
    elif isinstance(txn, DeleteTxn):
        w.write_int(OpCode.DELETE)
        w.write_ustring(txn.path)
    elif isinstance(txn, SetDataTxn):
        w.write_int(OpCode.SET_DATA)
        w.write_ustring(txn.path)
        w.write_buffer(txn.data)
        w.write_int(txn.version)
    elif isinstance(txn, SetACLTxn):
        w.write_int(OpCode.SET_ACL)
        w.write_ustring(txn.path)
        _write_acl(w, txn.acl)
        w.write_int(txn.aversion)
    else:
        w.write_int(OpCode.CHECK)
        w.write_ustring(txn.path)


def _read_sub(r: Reader, op: int) -> SubTxn:
    path = r.read_ustring("path")
    if op == OpCode.CREATE:
        data = r.read_buffer("data")
        acl = _read_acl(r)
        return CreateTxn(path, data, acl, r.read_long("owner"), r.read_int("parent_cversion"))
    if op == OpCode.DELETE:
        return DeleteTxn(path)
    if op == OpCode.SET_DATA:
        data = r.read_buffer("data")
        return SetDataTxn(path, data, r.read_int("version"))
    if op == OpCode.SET_ACL:
        acl = _read_acl(r)
        return SetACLTxn(path, acl, r.read_int("aversion"))
    if op == OpCode.CHECK:
        return CheckTxn(path)
    raise MalformedError(f"op {op} is not a transaction")


def encode_logged(entry: Logged) -> bytes:
    body = entry.body
    if type(body) is SetDataTxn:
        head = _LOGGED_HEAD.pack(entry.time_ms, entry.session_id, OpCode.SET_DATA)
        quick = _pack_set_data(head, body.path, body.data, body.version)
        if quick is not None:
            return quick
    return encode_logged_in_full(entry)


def encode_logged_in_full(entry: Logged) -> bytes:
    """Any transaction, field by field."""
    w = Writer()
    w.write_long(entry.time_ms)
    w.write_long(entry.session_id)
    body = entry.body
    if isinstance(body, MultiTxn):
        w.write_int(OpCode.MULTI)
        w.write_vector(body.ops, lambda op: _write_sub(w, op))
    elif isinstance(body, CreateSessionTxn):
        w.write_int(OpCode.CREATE_SESSION)
        w.write_int(body.timeout_ms)
    elif isinstance(body, CloseSessionTxn):
        w.write_int(OpCode.CLOSE_SESSION)
        w.write_ustrings(body.ephemerals)
    elif isinstance(body, SyncTxn):
        w.write_int(OpCode.SYNC)
        w.write_ustring(body.path)
    elif isinstance(body, ReconfigTxn):
        w.write_int(OpCode.RECONFIG)
        w.write_ustring(body.config)
    elif isinstance(body, ErrorTxn):
        w.write_int(OpCode.ERROR)
        w.write_int(body.code)
        w.write_vector(body.op_codes, w.write_int)
    else:
        _write_sub(w, body)
    return w.getvalue()


def _decode_set_data(payload: bytes) -> Logged | None:
    if len(payload) < _LOGGED_HEAD.size:
        return None
    time_ms, session_id, op = _LOGGED_HEAD.unpack_from(payload)
    body = _unpack_set_data(payload, _LOGGED_HEAD.size) if op == OpCode.SET_DATA else None
    return None if body is None else Logged(time_ms, session_id, SetDataTxn(*body))


def reconfig_of(payload: bytes) -> str | None:
    """The configuration a transaction proposes, or None; a look at the opcode first, so
    other transactions cost no decoding."""
    if len(payload) < _LOGGED_HEAD.size or _LOGGED_HEAD.unpack_from(payload)[2] != OpCode.RECONFIG:
        return None
    body = decode_logged_in_full(payload).body
    return body.config if isinstance(body, ReconfigTxn) else None


def decode_logged(payload: bytes) -> Logged:
    return _decode_set_data(payload) or decode_logged_in_full(payload)


def decode_logged_in_full(payload: bytes) -> Logged:
    """Any transaction, field by field; PayloadError for what does not decode."""
    try:
        r = Reader(payload, _MAX_PAYLOAD)
        time_ms = r.read_long("time_ms")
        session_id = r.read_long("session_id")
        op = r.read_int("op")
        body: LoggedBody
        if op == OpCode.MULTI:
            body = MultiTxn(r.read_vector("ops", lambda: _read_sub(r, r.read_int("op")), 8))
        elif op == OpCode.CREATE_SESSION:
            body = CreateSessionTxn(r.read_int("timeout"))
        elif op == OpCode.CLOSE_SESSION:
            body = CloseSessionTxn(r.read_vector("paths", lambda: r.read_ustring("path"), 4))
        elif op == OpCode.SYNC:
            body = SyncTxn(r.read_ustring("path"))
        elif op == OpCode.RECONFIG:
            body = ReconfigTxn(r.read_ustring("config"))
        elif op == OpCode.ERROR:
            body = ErrorTxn(ErrorCode(r.read_int("code")), _read_codes(r))
        else:
            body = _read_sub(r, op)
        r.expect_end("transaction")
    except (JuteError, ValueError) as exc:
        raise PayloadError(f"undecodable transaction: {exc}") from exc
    return Logged(time_ms, session_id, body)
