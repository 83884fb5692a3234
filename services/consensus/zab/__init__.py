"""ZooKeeper Atomic Broadcast as a pure state machine: events in, actions out."""

from services.consensus.zab.election import Vote
from services.consensus.zab.messages import Message, ServerState, SyncMode
from services.consensus.zab.node import Node, Phase, QuorumMode
from services.consensus.zab.ready import (
    Accepted,
    Busy,
    ClientResult,
    Committed,
    NotLeader,
    Proposed,
    ProposeResult,
    Ready,
    Rejected,
    RoleChange,
    Unknown,
)
from services.consensus.zab.state import (
    EMPTY_SNAPSHOT,
    HardState,
    LogEntry,
    Membership,
    PersistedState,
    Snapshot,
)
from services.consensus.zab.sync import SyncPlan, plan_sync
from services.consensus.zab.zxid import make_zxid, zxid_counter, zxid_epoch

__all__ = [
    "EMPTY_SNAPSHOT",
    "Accepted",
    "Busy",
    "ClientResult",
    "Committed",
    "HardState",
    "LogEntry",
    "Membership",
    "Message",
    "Node",
    "NotLeader",
    "PersistedState",
    "Phase",
    "ProposeResult",
    "Proposed",
    "QuorumMode",
    "Ready",
    "Rejected",
    "RoleChange",
    "ServerState",
    "Snapshot",
    "SyncMode",
    "SyncPlan",
    "Unknown",
    "Vote",
    "make_zxid",
    "plan_sync",
    "zxid_counter",
    "zxid_epoch",
]
