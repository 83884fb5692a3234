"""The data directory of one consensus member: hard state, transaction log, snapshots.

    <dir>/hardstate                  see ``hard_state``
    <dir>/log.<zxid as 16 hex>       see ``txn_log``
    <dir>/snapshot.<zxid as 16 hex>  see ``snapshots``

``DataDir`` is what a driver of the ZAB core uses for a ``Ready``: ``save_hard_state`` and
``truncate_to`` first (both durable on return), then ``append`` + ``sync``, reporting the
returned zxid with ``Node.persisted``. ``load`` rebuilds what a restarting member needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from directlog.durable_files import remove_temporaries
from services.consensus.storage.hard_state import CorruptHardStateError, HardStateFile
from services.consensus.storage.snapshots import Snapshots
from services.consensus.storage.txn_log import DEFAULT_SEGMENT_BYTES, TxnLog
from services.consensus.zab.state import EMPTY_SNAPSHOT, HardState, LogEntry, PersistedState


class DataDir:
    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        force_sync: bool = True,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        remove_temporaries(directory)
        self.directory = directory
        self.hard_state_file = HardStateFile(directory)
        self.snapshots = Snapshots(directory)
        self.log = TxnLog(directory, segment_bytes=segment_bytes, force_sync=force_sync)

    def load(self) -> PersistedState:
        """What ``Node(persisted_state=...)`` needs: the hard state, the newest valid
        snapshot (the empty one when there is none) and the log entries after it.

        Raises ``CorruptHardStateError`` if the hard state file is unreadable, or missing
        while the log or snapshots are not empty (it is written before either)."""
        hard_state = self.hard_state_file.read()
        if hard_state is None:
            if self.log.segments() or self.snapshots.zxids():
                raise CorruptHardStateError(
                    f"{self.hard_state_file.path} is missing but the data directory has data"
                )
            hard_state = HardState()
        snapshot = self.snapshots.latest_valid() or EMPTY_SNAPSHOT
        entries = tuple(self.log.read_from(snapshot.zxid))
        return PersistedState(hard_state, entries, snapshot)

    def save_hard_state(self, state: HardState) -> None:
        self.hard_state_file.write(state)

    def append(self, entries: Iterable[LogEntry]) -> None:
        self.log.append(entries)

    def sync(self) -> int:
        return self.log.sync()

    def truncate_to(self, zxid: int) -> None:
        """Drop log entries above ``zxid`` and the snapshots that include them."""
        self.log.truncate_to(zxid)
        self.snapshots.remove_above(zxid)

    def save_snapshot(self, zxid: int, data: bytes) -> None:
        """Store the data tree's snapshot bytes taken at ``zxid`` (whose entries must
        already be durable in the log, so a corrupt snapshot can fall back to an older
        one plus the log)."""
        self.snapshots.write(zxid, data)

    def purge(self, keep: int) -> tuple[list[int], list[Path]]:
        """Keep the ``keep`` newest valid snapshots; delete older snapshot files and the
        log segments wholly at or below the oldest kept snapshot's zxid. Corrupt snapshots
        newer than that are left alone, and nothing is deleted while fewer than ``keep``
        snapshots are valid. Returns the deleted snapshot zxids and segments."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        kept = self.snapshots.valid(limit=keep)
        if len(kept) < keep:
            return [], []
        oldest = kept[-1].zxid
        doomed = [z for z in self.snapshots.zxids() if z < oldest]
        self.snapshots.remove(doomed)
        return doomed, self.log.remove_segments_through(oldest)

    def close(self) -> None:
        self.log.close()

    def __enter__(self) -> DataDir:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def load(directory: Path) -> PersistedState:
    """What a member restarting from ``directory`` needs (an empty directory loads as a
    fresh member)."""
    with DataDir(directory) as data_dir:
        return data_dir.load()
