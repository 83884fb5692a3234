"""ZooKeeper's wire constants the data tree speaks: error codes, event types, modes, perms.

Kept in one small module so they can be unified with the jute codec's constants later;
the numeric values are ZooKeeper's and must not change.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class Code(IntEnum):
    """KeeperException.Code values a request can end with."""

    OK = 0
    SYSTEMERROR = -1
    RUNTIMEINCONSISTENCY = -2
    UNIMPLEMENTED = -6
    BADARGUMENTS = -8
    NONODE = -101
    NOAUTH = -102
    BADVERSION = -103
    NOCHILDRENFOREPHEMERALS = -108
    NODEEXISTS = -110
    NOTEMPTY = -111
    SESSIONEXPIRED = -112
    INVALIDACL = -114


class EventType(IntEnum):
    """Watcher.Event.EventType values of the events a transaction triggers."""

    NODE_CREATED = 1
    NODE_DELETED = 2
    NODE_DATA_CHANGED = 3
    NODE_CHILDREN_CHANGED = 4


class CreateMode(IntEnum):
    """CreateMode flags as the create request carries them."""

    PERSISTENT = 0
    EPHEMERAL = 1
    PERSISTENT_SEQUENTIAL = 2
    EPHEMERAL_SEQUENTIAL = 3
    CONTAINER = 4

    @property
    def ephemeral(self) -> bool:
        return self in (CreateMode.EPHEMERAL, CreateMode.EPHEMERAL_SEQUENTIAL)

    @property
    def sequential(self) -> bool:
        return self in (CreateMode.PERSISTENT_SEQUENTIAL, CreateMode.EPHEMERAL_SEQUENTIAL)


class Perm(IntFlag):
    """ZooDefs.Perms bits of an ACL entry."""

    READ = 1
    WRITE = 2
    CREATE = 4
    DELETE = 8
    ADMIN = 16
    ALL = 31


# ephemeralOwner of a container node (EphemeralType.CONTAINER_EPHEMERAL_OWNER).
CONTAINER_OWNER = -(1 << 63)
