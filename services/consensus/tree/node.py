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
        return Stat(
            czxid=self.czxid,
            mzxid=self.mzxid,
            ctime=self.ctime,
            mtime=self.mtime,
            version=self.version,
            cversion=self.cversion,
            aversion=self.aversion,
            ephemeral_owner=self.ephemeral_owner,
            data_length=len(self.data),
            num_children=len(self.children),
            pzxid=self.pzxid,
        )
