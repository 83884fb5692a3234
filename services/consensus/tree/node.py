"""A znode as the tree stores it: data, ACL, the persisted stat fields, child names.

Data is None for a znode created or last set with null data (a jute buffer of length -1),
which ZooKeeper keeps apart from empty data: getData returns null for it, and its Stat's
dataLength is 0 like an empty znode's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.consensus.jute.records import ACL, Stat


def data_length(data: bytes | None) -> int:
    """The Stat's dataLength: 0 for null data, as ZooKeeper's DataNode.copyStat has it."""
    return 0 if data is None else len(data)


@dataclass(slots=True)
class Node:
    data: bytes | None
    acl: tuple[ACL, ...]
    czxid: int
    mzxid: int
    ctime: int
    mtime: int
    version: int
    cversion: int
    aversion: int
    ephemeral_owner: int
    pzxid: int
    children: set[str] = field(default_factory=set)

    def stat(self) -> Stat:
        return Stat(  # positional: the tree builds one per write applied and read answered
            self.czxid,
            self.mzxid,
            self.ctime,
            self.mtime,
            self.version,
            self.cversion,
            self.aversion,
            self.ephemeral_owner,
            0 if self.data is None else len(self.data),  # data_length, inline
            len(self.children),
            self.pzxid,
        )
