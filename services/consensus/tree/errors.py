"""Typed failures of the data tree."""

from __future__ import annotations

from services.consensus.codes import ErrorCode


class KeeperError(Exception):
    """A request (or read) failed with a ZooKeeper error code; nothing was changed."""

    def __init__(self, code: ErrorCode, path: str = "") -> None:
        super().__init__(f"{code.name} {path}".rstrip())
        self.code = code
        self.path = path


class CorruptSnapshotError(ValueError):
    """A snapshot failed its magic, version, checksum or structural checks."""
