"""Request validation and resolution, against applied state plus proposals in flight.

ZooKeeper's PrepRequestProcessor validates a request against the tree *as it will be*
once every outstanding proposal commits, and records the request's effects as change
records for the next request to see. `Preparer` does the same: it keeps a small overlay of
per-path records (and session liveness) tagged with the zxid that last touched them, and
drops records the tree has caught up with (zxid <= tree.last_zxid) before each prepare.

A leader keeps one Preparer for its epoch, prepares requests in zxid order, and calls
`reset()` when proposals are abandoned (leadership lost), since the overlay then no longer
predicts the tree. Only the validation-relevant part of a node is tracked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from services.consensus.codes import CONTAINER_OWNER, CreateMode, ErrorCode, Perm
from services.consensus.jute.records import ACL
from services.consensus.tree.acl import check_acl, fixup_acl
from services.consensus.tree.errors import KeeperError
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
    Rejected,
    Request,
    Session,
    SetACL,
    SetACLTxn,
    SetData,
    SetDataTxn,
    SubTxn,
    Txn,
    TxnBody,
    inc32,
    parent_of,
    validate_path,
)

if TYPE_CHECKING:
    from services.consensus.tree.datatree import DataTree


class _Rec(NamedTuple):
    """What validation needs to know about a node (ZooKeeper's ChangeRecord). A named
    tuple: every write makes a changed copy, and _replace is several times cheaper than
    dataclasses.replace."""

    version: int
    cversion: int
    aversion: int
    ephemeral_owner: int
    num_children: int
    acl: tuple[ACL, ...]

    @property
    def ephemeral(self) -> bool:
        return self.ephemeral_owner not in (0, CONTAINER_OWNER)


class _View:
    """Scratch changes of one request layered over the preparer's overlay and the tree."""

    def __init__(self, prep: Preparer) -> None:
        self._prep = prep
        self.nodes: dict[str, _Rec | None] = {}
        self.sessions: dict[int, bool] = {}

    def node(self, path: str) -> _Rec | None:
        if path in self.nodes:
            return self.nodes[path]
        return self._prep.node(path)

    def put(self, path: str, rec: _Rec | None) -> None:
        self.nodes[path] = rec

    def session_live(self, sid: int) -> bool:
        if sid in self.sessions:
            return self.sessions[sid]
        return self._prep.session_live(sid)

    def owned_by(self, sid: int) -> list[str]:
        paths = set(self._prep.tree.ephemerals.get(sid, ()))
        for layer in (self._prep.overlay_nodes(), self.nodes):
            for path, rec in layer.items():
                if rec is not None and rec.ephemeral_owner == sid:
                    paths.add(path)
                else:
                    paths.discard(path)
        return sorted(paths)


def _version_after(expected: int, current: int, path: str) -> int:
    if expected != -1 and expected != current:
        raise KeeperError(ErrorCode.BADVERSION, path)
    return inc32(current)


def _checked_path(path: str) -> str:
    try:
        validate_path(path)
    except ValueError:
        raise KeeperError(ErrorCode.BADARGUMENTS, path) from None
    return path


class Preparer:
    def __init__(self, tree: DataTree) -> None:
        self.tree = tree
        self._nodes: dict[str, tuple[int, _Rec | None]] = {}
        self._sessions: dict[int, tuple[int, bool]] = {}
        self._last_zxid = tree.last_zxid

    def reset(self) -> None:
        """Forget every outstanding proposal (they will not commit)."""
        self._nodes.clear()
        self._sessions.clear()
        self._last_zxid = self.tree.last_zxid

    @property
    def outstanding(self) -> int:
        """Overlay records not yet reflected in the tree."""
        self._prune()
        return len(self._nodes) + len(self._sessions)

    def node(self, path: str) -> _Rec | None:
        if path in self._nodes:
            return self._nodes[path][1]
        n = self.tree.nodes.get(path)
        if n is None:
            return None
        return _Rec(n.version, n.cversion, n.aversion, n.ephemeral_owner, len(n.children), n.acl)

    def overlay_nodes(self) -> dict[str, _Rec | None]:
        return {path: rec for path, (_, rec) in self._nodes.items()}

    def session_live(self, sid: int) -> bool:
        if sid in self._sessions:
            return self._sessions[sid][1]
        return sid in self.tree.sessions

    def _prune(self) -> None:
        applied = self.tree.last_zxid
        self._nodes = {p: v for p, v in self._nodes.items() if v[0] > applied}
        self._sessions = {s: v for s, v in self._sessions.items() if v[0] > applied}

    def prepare(
        self, request: Request, session: Session, zxid: int, time_ms: int
    ) -> Txn | Rejected:
        """Validate and resolve `request` as proposal `zxid`; on success, remember it.

        Returns the txn to propose, or Rejected with ZooKeeper's code(s); a rejected
        request leaves no trace, so `zxid` may be reused for the next request.
        """
        assert zxid > self._last_zxid and zxid > self.tree.last_zxid, zxid
        self._prune()
        view = _View(self)
        try:
            body = self._prepare(view, request, session)
        except KeeperError as exc:
            return Rejected(exc.code)
        except _MultiFailed as failed:
            return failed.rejected
        for path, rec in view.nodes.items():
            self._nodes[path] = (zxid, rec)
        for sid, live in view.sessions.items():
            self._sessions[sid] = (zxid, live)
        self._last_zxid = zxid
        return Txn(zxid, time_ms, session.session_id, body)

    def _prepare(self, view: _View, request: Request, session: Session) -> TxnBody:
        sid = session.session_id
        if isinstance(request, CreateSession):
            if sid in (0, CONTAINER_OWNER) or request.timeout_ms <= 0 or view.session_live(sid):
                raise KeeperError(ErrorCode.BADARGUMENTS)
            view.sessions[sid] = True
            return CreateSessionTxn(request.timeout_ms)
        if isinstance(request, DeleteContainer):
            return self._delete_container(view, request.path)
        if not view.session_live(sid):
            raise KeeperError(ErrorCode.SESSIONEXPIRED)
        if isinstance(request, CloseSession):
            owned = view.owned_by(sid)
            for path in owned:
                self._remove(view, path)
            view.sessions[sid] = False
            return CloseSessionTxn(tuple(owned))
        if isinstance(request, Multi):
            return self._multi(view, request, session)
        return self._op(view, request, session)

    def _multi(self, view: _View, request: Multi, session: Session) -> MultiTxn:
        """All ops or none: each op sees the effects of the ones before it."""
        subs: list[SubTxn] = []
        codes: list[ErrorCode] = []
        failure: ErrorCode | None = None
        for op in request.ops:
            if failure is not None:
                codes.append(ErrorCode.RUNTIMEINCONSISTENCY)
                continue
            try:
                subs.append(self._op(view, op, session))
                codes.append(ErrorCode.OK)
            except KeeperError as exc:
                failure = exc.code
                codes.append(exc.code)
        if failure is not None:
            raise _MultiFailed(Rejected(failure, tuple(codes)))
        return MultiTxn(tuple(subs))

    def _op(self, view: _View, op: MultiOp, session: Session) -> SubTxn:
        if isinstance(op, Create):
            return self._create(view, op, session)
        if isinstance(op, Delete):
            path = _checked_path(op.path)
            if path == "/":
                raise KeeperError(ErrorCode.BADARGUMENTS, path)
            parent = view.node(parent_of(path))
            node = view.node(path)
            if parent is None or node is None:
                raise KeeperError(ErrorCode.NONODE, path)
            check_acl(parent.acl, Perm.DELETE, session.auth, path)
            _version_after(op.version, node.version, path)
            if node.num_children:
                raise KeeperError(ErrorCode.NOTEMPTY, path)
            self._remove(view, path)
            return DeleteTxn(path)
        if isinstance(op, SetData):
            path = _checked_path(op.path)
            node = view.node(path)
            if node is None:
                raise KeeperError(ErrorCode.NONODE, path)
            check_acl(node.acl, Perm.WRITE, session.auth, path)
            version = _version_after(op.version, node.version, path)
            view.put(path, node._replace(version=version))
            return SetDataTxn(path, op.data, version)
        if isinstance(op, SetACL):
            path = _checked_path(op.path)
            acl = fixup_acl(op.acl, session.auth)
            node = view.node(path)
            if node is None:
                raise KeeperError(ErrorCode.NONODE, path)
            check_acl(node.acl, Perm.ADMIN, session.auth, path)
            aversion = _version_after(op.version, node.aversion, path)
            view.put(path, node._replace(aversion=aversion, acl=acl))
            return SetACLTxn(path, acl, aversion)
        if isinstance(op, Check):
            path = _checked_path(op.path)
            node = view.node(path)
            if node is None:
                raise KeeperError(ErrorCode.NONODE, path)
            check_acl(node.acl, Perm.READ, session.auth, path)
            _version_after(op.version, node.version, path)
            return CheckTxn(path)
        raise KeeperError(ErrorCode.UNIMPLEMENTED)

    def _create(self, view: _View, op: Create, session: Session) -> CreateTxn:
        try:
            mode = CreateMode(op.mode)
        except ValueError:
            raise KeeperError(ErrorCode.BADARGUMENTS, op.path) from None
        path = op.path
        _checked_path(path + "0" if mode.sequential else path)
        if path == "/":
            raise KeeperError(ErrorCode.NODEEXISTS, path)
        parent_path = parent_of(path + "0" if mode.sequential else path)
        acl = fixup_acl(op.acl, session.auth)
        parent = view.node(parent_path)
        if parent is None:
            raise KeeperError(ErrorCode.NONODE, path)
        check_acl(parent.acl, Perm.CREATE, session.auth, path)
        if mode.sequential:
            path = _checked_path(f"{path}{parent.cversion:010d}")
        if view.node(path) is not None:
            raise KeeperError(ErrorCode.NODEEXISTS, path)
        if parent.ephemeral:
            raise KeeperError(ErrorCode.NOCHILDRENFOREPHEMERALS, path)
        if mode.ephemeral:
            owner = session.session_id
        elif mode is CreateMode.CONTAINER:
            owner = CONTAINER_OWNER
        else:
            owner = 0
        cversion = inc32(parent.cversion)
        view.put(
            parent_path, parent._replace(cversion=cversion, num_children=parent.num_children + 1)
        )
        view.put(path, _Rec(0, 0, 0, owner, 0, acl))
        return CreateTxn(path, op.data, acl, owner, cversion)

    def _delete_container(self, view: _View, path: str) -> DeleteTxn:
        node = view.node(path)
        if node is None:
            raise KeeperError(ErrorCode.NONODE, path)
        if node.ephemeral_owner != CONTAINER_OWNER:
            raise KeeperError(ErrorCode.BADARGUMENTS, path)
        if node.num_children:
            raise KeeperError(ErrorCode.NOTEMPTY, path)
        self._remove(view, path)
        return DeleteTxn(path)

    @staticmethod
    def _remove(view: _View, path: str) -> None:
        parent_path = parent_of(path)
        parent = view.node(parent_path)
        assert parent is not None and parent.num_children > 0, path
        view.put(parent_path, parent._replace(num_children=parent.num_children - 1))
        view.put(path, None)


class _MultiFailed(Exception):
    def __init__(self, rejected: Rejected) -> None:
        super().__init__(rejected)
        self.rejected = rejected
