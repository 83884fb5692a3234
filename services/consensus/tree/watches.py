"""One-shot watch registrations of the sessions connected to this server.

Watches are local state: every member applies the same txns and fires the watches its own
clients set, so the registry is neither replicated nor snapshotted. Events come out sorted
by session id within one trigger so a txn's events are deterministic.
"""

from __future__ import annotations

from services.consensus.codes import EventType
from services.consensus.tree.model import WatchEvent


class WatchManager:
    def __init__(self) -> None:
        self._data: dict[str, set[int]] = {}
        self._child: dict[str, set[int]] = {}

    def add_data(self, path: str, session_id: int) -> None:
        self._data.setdefault(path, set()).add(session_id)

    def add_child(self, path: str, session_id: int) -> None:
        self._child.setdefault(path, set()).add(session_id)

    def trigger(self, path: str, event: EventType, out: list[WatchEvent]) -> None:
        """Fire and remove the registrations `event` on `path` consumes.

        A deletion consumes both data and child watches on the path, but a session
        watching both gets one NodeDeleted (ZooKeeper suppresses the duplicate).
        """
        data = None if event is EventType.NODE_CHILDREN_CHANGED else self._data.pop(path, None)
        child = None
        if event is EventType.NODE_CHILDREN_CHANGED or event is EventType.NODE_DELETED:
            child = self._child.pop(path, None)
        if data is None and child is None:
            return  # the usual case: nobody watches
        fired = (data or set()) | (child or set())
        out.extend(WatchEvent(sid, event, path) for sid in sorted(fired))

    def remove_session(self, session_id: int) -> None:
        for table in (self._data, self._child):
            for path in [p for p, sids in table.items() if session_id in sids]:
                table[path].discard(session_id)
                if not table[path]:
                    del table[path]

    def count(self) -> int:
        """Registrations (path and session, data and child apart): ZooKeeper's watch
        count. Safe to call from another thread: each table is copied in one C-level call
        before its sets are measured."""
        return sum(map(len, list(self._data.values()))) + sum(map(len, list(self._child.values())))

    def registrations(self) -> list[tuple[str, str, int]]:
        """Every (kind, path, session) registered, sorted; for tests and diagnostics."""
        out = [("data", p, s) for p, sids in self._data.items() for s in sids]
        out += [("child", p, s) for p, sids in self._child.items() for s in sids]
        return sorted(out)
