"""A znode as the tree stores it: data, ACL, the persisted stat fields, child names."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.consensus.jute.records import ACL, Stat


@dataclass(slots=True)
class Node:
    data: bytes
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
            len(self.data),
            len(self.children),
            self.pzxid,
        )
