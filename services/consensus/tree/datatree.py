"""The data tree: a deterministic state machine over committed transactions.

`prepare` validates a request and resolves it into a `Txn` (see prep.py); `apply` executes
a prepared txn. Apply reads no clock and draws no randomness (time and zxid come in the
txn), so members applying the same txns in zxid order hold identical trees, which
`digest()` lets tests and simulators check.

Invariants (asserted by `check_invariants`): the root exists; every other node's parent
exists and lists it; ephemerals have no children and are owned by live sessions; the
ephemeral and container indexes match the nodes; zxids of applied txns strictly increase.
"""

from __future__ import annotations

import hashlib

from services.consensus.codes import CONTAINER_OWNER, ErrorCode, EventType, Perm
from services.consensus.jute.records import ACL, Stat
from services.consensus.tree.acl import OPEN_ACL_UNSAFE, check_acl
from services.consensus.tree.errors import CorruptSnapshotError, KeeperError
from services.consensus.tree.model import (
    Applied,
    CheckResult,
    CheckTxn,
    CloseSessionTxn,
    CreateResult,
    CreateSessionTxn,
    CreateTxn,
    DeleteResult,
    DeleteTxn,
    MultiResult,
    MultiTxn,
    OpResult,
    Rejected,
    Request,
    Result,
    Session,
    SessionResult,
    SetACLResult,
    SetACLTxn,
    SetDataResult,
    SetDataTxn,
    SubTxn,
    Txn,
    WatchEvent,
    inc32,
    name_of,
    parent_of,
    validate_path,
)
from services.consensus.tree.node import Node, data_length
from services.consensus.tree.prep import Preparer
from services.consensus.tree.snapshot import decode, encode, encode_body
from services.consensus.tree.watches import WatchManager


def _root() -> Node:
    return Node(b"", OPEN_ACL_UNSAFE, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def _valid(path: str) -> None:
    try:
        validate_path(path)
    except ValueError:
        raise KeeperError(ErrorCode.BADARGUMENTS, path) from None


def _data_size(nodes: dict[str, Node]) -> int:
    return sum(len(path) + data_length(node.data) for path, node in nodes.items())


def is_ephemeral_owner(owner: int) -> bool:
    """True for a session-owned node (not persistent, not a container)."""
    return owner not in (0, CONTAINER_OWNER)


class DataTree:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {"/": _root()}
        self.sessions: dict[int, int] = {}  # live session id -> timeout ms
        # Sessions only this server knows (read-only mode; ZooKeeper's local sessions):
        # they may set watches, and are in no transaction and no snapshot.
        self.local_sessions: dict[int, int] = {}  # session id -> timeout ms
        self.ephemerals: dict[int, set[str]] = {}  # session id -> paths it owns
        self.containers: set[str] = set()
        self.last_zxid = 0
        self.watches = WatchManager()
        # ZooKeeper's approximate data size, kept up to date as nodes change (metrics read
        # it): the sum of every node's path length and data length.
        self.data_size = _data_size(self.nodes)

    # -- validation ------------------------------------------------------------------

    def prepare(
        self, request: Request, session: Session, zxid: int, time_ms: int
    ) -> Txn | Rejected:
        """Validate `request` against the applied state only (no proposals in flight).

        A leader with uncommitted proposals keeps one `Preparer` instead, which also
        sees the effects of everything it prepared but this tree has not applied yet.
        """
        return Preparer(self).prepare(request, session, zxid, time_ms)

    def containers_to_delete(self) -> list[str]:
        """Containers that once had children and now have none, in path order.

        ZooKeeper's ContainerManager finds these on a timer; here a leader asks and
        turns each into a `DeleteContainer` request, which re-validates it.
        """
        return sorted(
            p for p in self.containers if self.nodes[p].cversion > 0 and not self.nodes[p].children
        )

    # -- apply -----------------------------------------------------------------------

    def apply(self, txn: Txn) -> Applied:
        """Execute a prepared txn; returns its result and the watch events it fired."""
        assert txn.zxid > self.last_zxid, (txn.zxid, self.last_zxid)
        events: list[WatchEvent] = []
        body = txn.body
        result: Result
        if isinstance(body, MultiTxn):
            result = MultiResult(tuple(self._apply_op(op, txn, events) for op in body.ops))
        elif isinstance(body, CreateSessionTxn):
            assert txn.session_id not in self.sessions
            self.sessions[txn.session_id] = body.timeout_ms
            result = SessionResult(txn.session_id, created=True)
        elif isinstance(body, CloseSessionTxn):
            result = self._close_session(txn, body, events)
        else:
            result = self._apply_op(body, txn, events)
        self.last_zxid = txn.zxid
        return Applied(txn.zxid, result, tuple(events))

    def _apply_op(self, op: SubTxn, txn: Txn, events: list[WatchEvent]) -> OpResult:
        if isinstance(op, CreateTxn):
            return self._create(op, txn, events)
        if isinstance(op, DeleteTxn):
            self._delete(op.path, txn.zxid, events)
            return DeleteResult(op.path)
        if isinstance(op, SetDataTxn):
            node = self.nodes[op.path]
            assert op.version == inc32(node.version), (op, node.version)
            self.data_size += data_length(op.data) - data_length(node.data)
            node.data = op.data
            node.version = op.version
            node.mzxid = txn.zxid
            node.mtime = txn.time_ms
            self.watches.trigger(op.path, EventType.NODE_DATA_CHANGED, events)
            return SetDataResult(node.stat())
        if isinstance(op, SetACLTxn):
            node = self.nodes[op.path]
            assert op.aversion == inc32(node.aversion), (op, node.aversion)
            node.acl = op.acl
            node.aversion = op.aversion
            return SetACLResult(node.stat())
        assert isinstance(op, CheckTxn)
        assert op.path in self.nodes
        return CheckResult(op.path)

    def _create(self, op: CreateTxn, txn: Txn, events: list[WatchEvent]) -> CreateResult:
        path, parent_path = op.path, parent_of(op.path)
        parent = self.nodes[parent_path]
        assert path not in self.nodes, path
        assert not is_ephemeral_owner(parent.ephemeral_owner), parent_path
        assert op.parent_cversion == inc32(parent.cversion), (op, parent.cversion)
        node = Node(
            op.data,
            op.acl,
            czxid=txn.zxid,
            mzxid=txn.zxid,
            ctime=txn.time_ms,
            mtime=txn.time_ms,
            version=0,
            cversion=0,
            aversion=0,
            ephemeral_owner=op.ephemeral_owner,
            pzxid=txn.zxid,
        )
        self.nodes[path] = node
        self.data_size += len(path) + data_length(op.data)
        parent.children.add(name_of(path))
        parent.cversion = op.parent_cversion
        parent.pzxid = txn.zxid
        if op.ephemeral_owner == CONTAINER_OWNER:
            self.containers.add(path)
        elif op.ephemeral_owner != 0:
            assert op.ephemeral_owner in self.sessions, op
            self.ephemerals.setdefault(op.ephemeral_owner, set()).add(path)
        self.watches.trigger(path, EventType.NODE_CREATED, events)
        self.watches.trigger(parent_path, EventType.NODE_CHILDREN_CHANGED, events)
        return CreateResult(path, node.stat())

    def _delete(self, path: str, zxid: int, events: list[WatchEvent]) -> None:
        """Remove a childless node; like ZooKeeper, the parent's cversion stays put."""
        node = self.nodes.pop(path)
        assert not node.children, path
        self.data_size -= len(path) + data_length(node.data)
        parent_path = parent_of(path)
        parent = self.nodes[parent_path]
        parent.children.remove(name_of(path))
        parent.pzxid = max(parent.pzxid, zxid)
        owner = node.ephemeral_owner
        if owner == CONTAINER_OWNER:
            self.containers.remove(path)
        elif owner != 0:
            owned = self.ephemerals[owner]
            owned.remove(path)
            if not owned:
                del self.ephemerals[owner]
        self.watches.trigger(path, EventType.NODE_DELETED, events)
        self.watches.trigger(parent_path, EventType.NODE_CHILDREN_CHANGED, events)

    def _close_session(self, txn: Txn, body: CloseSessionTxn, events: list[WatchEvent]) -> Result:
        sid = txn.session_id
        assert sid in self.sessions, sid
        assert set(body.ephemerals) == self.ephemerals.get(sid, set()), body
        self.watches.remove_session(sid)
        for path in body.ephemerals:
            self._delete(path, txn.zxid, events)
        del self.sessions[sid]
        return SessionResult(sid, created=False)

    # -- reads (local, against applied state) ----------------------------------------

    def _watcher(self, session: Session | None, watch: bool) -> int | None:
        if not watch:
            return None
        if session is None or (
            session.session_id not in self.sessions
            and session.session_id not in self.local_sessions
        ):
            raise KeeperError(ErrorCode.SESSIONEXPIRED)
        return session.session_id

    def exists(self, path: str, session: Session | None = None, watch: bool = False) -> Stat | None:
        """Stat of `path` or None; a watch set on a missing node waits for its creation."""
        _valid(path)
        sid = self._watcher(session, watch)
        if sid is not None:
            self.watches.add_data(path, sid)
        node = self.nodes.get(path)
        return None if node is None else node.stat()

    def get_data(
        self, path: str, session: Session, watch: bool = False
    ) -> tuple[bytes | None, Stat]:
        """The node's data (None for null data, apart from b"") and its Stat."""
        node = self._readable(path, session)
        sid = self._watcher(session, watch)
        if sid is not None:
            self.watches.add_data(path, sid)
        return node.data, node.stat()

    def get_children(
        self, path: str, session: Session, watch: bool = False
    ) -> tuple[list[str], Stat]:
        node = self._readable(path, session)
        sid = self._watcher(session, watch)
        if sid is not None:
            self.watches.add_child(path, sid)
        return sorted(node.children), node.stat()

    def get_acl(self, path: str, session: Session) -> tuple[tuple[ACL, ...], Stat]:
        """Like ZooKeeper 3.6+, reading an ACL takes READ or ADMIN on the node."""
        node = self._readable(path, session, Perm.READ | Perm.ADMIN)
        return node.acl, node.stat()

    def _readable(self, path: str, session: Session, perm: Perm = Perm.READ) -> Node:
        _valid(path)
        node = self.nodes.get(path)
        if node is None:
            raise KeeperError(ErrorCode.NONODE, path)
        check_acl(node.acl, perm, session.auth, path)
        return node

    def session_closed_locally(self, session_id: int) -> None:
        """Drop a session's watches when its connection to this server goes away."""
        self.watches.remove_session(session_id)

    # -- replica identity and persistence --------------------------------------------

    def digest(self) -> str:
        """SHA-256 over last zxid, sessions and every node's path, data, stat and ACL."""
        return hashlib.sha256(encode_body(self.last_zxid, self.sessions, self.nodes)).hexdigest()

    def snapshot(self) -> bytes:
        return encode(self.last_zxid, self.sessions, self.nodes)

    def restore(self, blob: bytes) -> None:
        """Replace the whole state with a snapshot's; watches are dropped.

        Raises CorruptSnapshotError (and leaves the tree untouched) on a bad snapshot.
        """
        last_zxid, sessions, nodes = decode(blob)
        ephemerals: dict[int, set[str]] = {}
        containers: set[str] = set()
        for path, node in nodes.items():
            if node.ephemeral_owner == CONTAINER_OWNER:
                containers.add(path)
            elif node.ephemeral_owner != 0:
                if node.ephemeral_owner not in sessions or node.children:
                    raise CorruptSnapshotError(f"ephemeral {path} is orphaned or has children")
                ephemerals.setdefault(node.ephemeral_owner, set()).add(path)
        self.nodes, self.sessions, self.last_zxid = nodes, sessions, last_zxid
        self.ephemerals, self.containers = ephemerals, containers
        self.watches = WatchManager()
        self.local_sessions = {}
        self.data_size = _data_size(nodes)

    @classmethod
    def from_snapshot(cls, blob: bytes) -> DataTree:
        tree = cls()
        tree.restore(blob)
        return tree

    def check_invariants(self) -> None:
        assert "/" in self.nodes
        ephemerals: dict[int, set[str]] = {}
        for path, node in self.nodes.items():
            if path != "/":
                assert name_of(path) in self.nodes[parent_of(path)].children, path
            for child in node.children:
                assert f"{path.rstrip('/')}/{child}" in self.nodes, (path, child)
            if is_ephemeral_owner(node.ephemeral_owner):
                assert not node.children, path
                assert node.ephemeral_owner in self.sessions, path
                ephemerals.setdefault(node.ephemeral_owner, set()).add(path)
        assert ephemerals == self.ephemerals
        assert self.data_size == _data_size(self.nodes), (self.data_size, _data_size(self.nodes))
        assert self.containers == {
            p for p, n in self.nodes.items() if n.ephemeral_owner == CONTAINER_OWNER
        }
