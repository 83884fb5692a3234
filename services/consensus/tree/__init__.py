"""The replicated data tree with ZooKeeper semantics, applied transaction by transaction.

Two steps, as in ZooKeeper: `prepare` (on the leader, via `DataTree.prepare` or a
`Preparer` that also sees proposals in flight) validates a request and resolves it into a
`Txn`, or `Rejected`; `apply` (on every member, in zxid order) executes the txn and returns
its result and watch events. Reads, watches and auth are local to the serving member.
"""

from services.consensus.codes import CONTAINER_OWNER, CreateMode, ErrorCode, EventType, Perm
from services.consensus.jute.records import ACL, Id, Stat
from services.consensus.tree.acl import (
    ANYONE,
    OPEN_ACL_UNSAFE,
    READ_ACL_UNSAFE,
    digest,
    digest_auth_id,
)
from services.consensus.tree.datatree import DataTree
from services.consensus.tree.errors import CorruptSnapshotError, KeeperError
from services.consensus.tree.model import (
    Applied,
    Check,
    CheckResult,
    CloseSession,
    Create,
    CreateResult,
    CreateSession,
    Delete,
    DeleteContainer,
    DeleteResult,
    Multi,
    MultiResult,
    Rejected,
    Request,
    Session,
    SessionResult,
    SetACL,
    SetACLResult,
    SetData,
    SetDataResult,
    Txn,
    WatchEvent,
)
from services.consensus.tree.prep import Preparer

__all__ = [
    "ACL",
    "ANYONE",
    "CONTAINER_OWNER",
    "OPEN_ACL_UNSAFE",
    "READ_ACL_UNSAFE",
    "Applied",
    "Check",
    "CheckResult",
    "CloseSession",
    "CorruptSnapshotError",
    "Create",
    "CreateMode",
    "CreateResult",
    "CreateSession",
    "DataTree",
    "Delete",
    "DeleteContainer",
    "DeleteResult",
    "ErrorCode",
    "EventType",
    "Id",
    "KeeperError",
    "Multi",
    "MultiResult",
    "Perm",
    "Preparer",
    "Rejected",
    "Request",
    "Session",
    "SessionResult",
    "SetACL",
    "SetACLResult",
    "SetData",
    "SetDataResult",
    "Stat",
    "Txn",
    "WatchEvent",
    "digest",
    "digest_auth_id",
]
