"""Requests, transactions, results and events of the data tree.

A request is what a client asks; `prepare` resolves it against the tree into a transaction
carrying everything `apply` needs (sequential names, new versions, fixed-up ACLs, the
ephemerals a closing session owns), so applying is a pure function of tree and txn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from directlog.record import record
from services.consensus.codes import CreateMode, ErrorCode, EventType
from services.consensus.jute.records import ACL, Id, Stat


@record
class Session:
    """Who sends a request: the session id and the auth ids its connection proved."""

    session_id: int
    auth: frozenset[Id] = frozenset()

    def with_auth(self, ident: Id) -> Session:
        return Session(self.session_id, self.auth | {ident})


# -- requests -------------------------------------------------------------------------


@record
class Create:
    path: str
    data: bytes | None = b""  # None: null data (a jute buffer of length -1), not b""
    acl: tuple[ACL, ...] = ()
    mode: CreateMode = CreateMode.PERSISTENT


@record
class Delete:
    path: str
    version: int = -1


@record
class SetData:
    path: str
    data: bytes | None
    version: int = -1


@record
class SetACL:
    path: str
    acl: tuple[ACL, ...]
    version: int = -1


@record
class Check:
    path: str
    version: int = -1


@record
class DeleteContainer:
    """System request a leader makes from `containers_to_delete()`; no ACL or session."""

    path: str


MultiOp = Create | Delete | SetData | SetACL | Check


@record
class Multi:
    ops: tuple[MultiOp, ...]


@record
class CreateSession:
    timeout_ms: int


@record
class CloseSession:
    pass


Request = MultiOp | Multi | DeleteContainer | CreateSession | CloseSession

# -- transactions ---------------------------------------------------------------------


@record
class CreateTxn:
    path: str
    data: bytes | None
    acl: tuple[ACL, ...]
    ephemeral_owner: int  # 0, a session id, or CONTAINER_OWNER
    parent_cversion: int  # the parent's cversion after this create


@record
class DeleteTxn:
    path: str


@record
class SetDataTxn:
    path: str
    data: bytes | None
    version: int  # the node's version after this write


@record
class SetACLTxn:
    path: str
    acl: tuple[ACL, ...]
    aversion: int  # the node's aversion after this write


@record
class CheckTxn:
    path: str


SubTxn = CreateTxn | DeleteTxn | SetDataTxn | SetACLTxn | CheckTxn


@record
class MultiTxn:
    ops: tuple[SubTxn, ...]


@record
class CreateSessionTxn:
    timeout_ms: int


@record
class CloseSessionTxn:
    ephemerals: tuple[str, ...]  # sorted; every node the session owns at apply time


TxnBody = SubTxn | MultiTxn | CreateSessionTxn | CloseSessionTxn


@record
class Txn:
    """One proposal: header (zxid, leader's clock, session) and body."""

    zxid: int
    time_ms: int
    session_id: int
    body: TxnBody


@record
class Rejected:
    """A request that failed validation: nothing to propose, nothing applied.

    For a multi, `op_codes` has one code per op in ZooKeeper's convention: OK for ops
    before the failing one, its code for it, RUNTIMEINCONSISTENCY for the ones after.
    """

    code: ErrorCode
    op_codes: tuple[ErrorCode, ...] = ()


# -- results --------------------------------------------------------------------------


@record
class CreateResult:
    path: str
    stat: Stat


@record
class DeleteResult:
    path: str


@record
class SetDataResult:
    stat: Stat


@record
class SetACLResult:
    stat: Stat


@record
class CheckResult:
    path: str


OpResult = CreateResult | DeleteResult | SetDataResult | SetACLResult | CheckResult


@record
class MultiResult:
    results: tuple[OpResult, ...]


@record
class SessionResult:
    session_id: int
    created: bool  # False for a close


Result = OpResult | MultiResult | SessionResult


@dataclass(frozen=True, slots=True, order=True)
class WatchEvent:
    session_id: int
    type: EventType
    path: str


@record
class Applied:
    zxid: int
    result: Result
    events: tuple[WatchEvent, ...] = field(default=())


# -- paths ----------------------------------------------------------------------------


# Characters PathUtils.validatePath refuses anywhere in a path (NUL included).
_BAD_PATH_CHAR = re.compile(r"[\u0000-\u001f\u007f-\u009f\ud800-\uf8ff\ufff0-\uffff]")


def validate_path(path: str) -> None:
    """PathUtils.validatePath: absolute, no empty, '.' or '..' segments, no refused character."""
    if not path.startswith("/") or _BAD_PATH_CHAR.search(path):
        raise ValueError(path)
    if path == "/":
        return
    if path.endswith("/"):
        raise ValueError(path)
    for segment in path[1:].split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(path)


def inc32(value: int) -> int:
    """`value + 1` with Java int wrap-around, as ZooKeeper's int32 versions behave."""
    return (value + 1 + (1 << 31)) % (1 << 32) - (1 << 31)


def parent_of(path: str) -> str:
    assert path != "/" and path.startswith("/")
    head = path[: path.rindex("/")]
    return head or "/"


def name_of(path: str) -> str:
    return path[path.rindex("/") + 1 :]
