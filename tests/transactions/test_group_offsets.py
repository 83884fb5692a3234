"""TxnOffsetCommit at the group coordinator over a real `__consumer_offsets` log: offsets
written in a transaction count from its COMMIT marker on, never after an ABORT, and a
successor loading the partition sees the same, holding the still open ones back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from directlog.protocol.errors import ErrorCode
from services.broker.groups.coordinator import Commit, GroupCoordinator
from tests.broker.test_coordinator import Clock, leading, loaded

pytestmark = pytest.mark.timeout(60)
GROUP = "etl"


def offsets(coordinator: GroupCoordinator) -> dict[tuple[str, int], int]:
    found = coordinator.fetch_offsets(GROUP, None)
    return {tp: o.offset for tp, o in found.items() if o is not None}


def test_transactional_offsets_follow_their_markers_across_a_reload(tmp_path: Path) -> None:
    async def run() -> None:
        clock = Clock()
        partition = leading(tmp_path)
        first = await loaded(partition, clock)

        async def commit(producer_id: int, index: int, offset: int) -> None:
            codes = await first.txn_commit(
                GROUP, producer_id, 0, "", -1, [Commit("t", index, offset, -1, "m")]
            )
            assert codes == [ErrorCode.NONE]

        def marker(producer_id: int, commit: bool) -> None:
            partition.log.append_marker(producer_id, 0, commit, 0, partition.leader_epoch)
            first.transaction_ended(0, producer_id, commit)

        await commit(7, 0, 10)
        assert offsets(first) == {}  # not before the marker
        marker(7, True)
        assert offsets(first) == {("t", 0): 10}
        await commit(8, 1, 20)
        marker(8, False)
        await commit(9, 2, 30)  # left open
        assert offsets(first) == {("t", 0): 10}
        # A member id the group does not have, or a generation it is not in, is refused.
        assert await first.txn_commit(GROUP, 9, 0, "ghost", -1, [Commit("t", 0, 1, -1, "")]) == [
            ErrorCode.UNKNOWN_MEMBER_ID
        ]
        assert await first.txn_commit(GROUP, 9, 0, "", 4, [Commit("t", 0, 1, -1, "")]) == [
            ErrorCode.ILLEGAL_GENERATION
        ]
        await first.close()
        partition.log.close()

        successor_partition = leading(tmp_path, epoch=1)
        successor = await loaded(successor_partition, clock)
        assert offsets(successor) == {("t", 0): 10}
        successor_partition.log.append_marker(9, 0, True, 0, successor_partition.leader_epoch)
        successor.transaction_ended(0, 9, True)
        assert offsets(successor) == {("t", 0): 10, ("t", 2): 30}

    asyncio.run(run())
