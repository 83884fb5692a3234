"""How the leader brings one follower's log in line with its own: DIFF, TRUNC or SNAP.

Within one epoch every log holds a prefix of that epoch's proposals (the epoch's single
leader numbers them 1, 2, ... and they travel in order), so a log is summarised exactly by
the last zxid it holds in each epoch. Comparing two summaries epoch by epoch gives the
longest common prefix.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from directlog.record import record
from services.consensus.zab.messages import SyncMode
from services.consensus.zab.state import EMPTY_SNAPSHOT, LogEntry, Snapshot
from services.consensus.zab.zxid import zxid_epoch


@record
class SyncPlan:
    mode: SyncMode
    truncate_to: int
    entries: tuple[LogEntry, ...]
    snapshot: Snapshot | None = None  # set for SNAP only


def epoch_ends(zxids: Sequence[int]) -> tuple[int, ...]:
    """The last zxid of each epoch present in an ascending zxid sequence."""
    ends: list[int] = []
    for z in zxids:
        if ends and zxid_epoch(ends[-1]) == zxid_epoch(z):
            ends[-1] = z
        else:
            ends.append(z)
    return tuple(ends)


def common_prefix(leader_ends: Sequence[int], follower_ends: Sequence[int]) -> int:
    """The last zxid of the longest common prefix of two logs (0 when none)."""
    leader_by_epoch = {zxid_epoch(z): z for z in leader_ends}
    follower_by_epoch = {zxid_epoch(z): z for z in follower_ends}
    common = 0
    for epoch in sorted(leader_by_epoch.keys() | follower_by_epoch.keys()):
        lz = leader_by_epoch.get(epoch)
        fz = follower_by_epoch.get(epoch)
        if lz is None or fz is None:
            break
        if lz != fz:
            return min(lz, fz)
        common = lz
    return common


def plan_sync(
    leader_log: Sequence[LogEntry],
    follower_ends: Sequence[int],
    follower_last_zxid: int,
    diff_window: int,
    snapshot: Snapshot = EMPTY_SNAPSHOT,
) -> SyncPlan:
    """Pick the cheapest correct way to make the follower's history equal the leader's,
    which is ``snapshot`` followed by ``leader_log``.

    SNAP when the follower is behind the snapshot (the leader no longer has the entries
    it lacks), when nothing is shared but the follower holds entries, or when more than
    ``diff_window`` entries are missing (ZooKeeper's "too far behind the committed log"
    rule); TRUNC when the follower holds entries past the common prefix; DIFF otherwise.

    A follower whose last zxid is at or past the snapshot agrees with it up to there:
    the snapshot is committed history, and every later epoch's log extends it. The same
    holds for the follower's own snapshot, whose epoch starts ``follower_ends`` (a node
    reports its snapshot's zxid as the first epoch end when its log has nothing of that
    epoch). So only epochs from the later of the two snapshots on are compared.
    """
    assert diff_window >= 0
    base = snapshot.zxid
    zxids = [e.zxid for e in leader_log]
    snap = SyncPlan(SyncMode.SNAP, 0, tuple(leader_log), snapshot)
    if follower_last_zxid < base:
        return snap
    floor = max(zxid_epoch(base), zxid_epoch(follower_ends[0]) if follower_ends else 0)
    leader_ends = epoch_ends([base, *zxids] if base else zxids)
    common = common_prefix(
        [z for z in leader_ends if zxid_epoch(z) >= floor],
        [z for z in follower_ends if zxid_epoch(z) >= floor],
    )
    common = max(common, base)
    start = bisect_right(zxids, common)
    missing = len(leader_log) - start
    if (common == 0 and follower_last_zxid != 0) or missing > diff_window:
        return snap
    if follower_last_zxid == common:
        return SyncPlan(SyncMode.DIFF, common, tuple(leader_log[start:]))
    assert follower_last_zxid > common, (follower_last_zxid, common)
    return SyncPlan(SyncMode.TRUNC, common, tuple(leader_log[start:]))
