"""Remote keys of the software providers (region_table.py): random, unique among the live
regions, never the slot's previous one, and a revoked or made-up key finds nothing."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from directlog.rdma import Access, RegistrationError
from directlog.rdma.region_table import RegionTable

pytestmark = pytest.mark.timeout(60)

CAPACITY = 64


def publish(table: RegionTable) -> int:
    return table.publish(
        access=Access.REMOTE_READ, pd=1, addr=0x1000, length=64, path="/x", file_offset=0
    )


def test_live_keys_are_unique_random_and_found(tmp_path: Path) -> None:
    table = RegionTable(tmp_path / "regions", CAPACITY)
    try:
        keys = [publish(table) for _ in range(CAPACITY)]
        assert len(set(keys)) == CAPACITY
        assert all(0 < key < 1 << 32 for key in keys)
        assert sorted(key % CAPACITY for key in keys) == list(range(CAPACITY))
        for key in keys:
            entry = table.view.lookup(key)
            assert entry is not None and entry.rkey == key
        # Neither the order of slots nor the keys above them follow from earlier keys.
        assert [key % CAPACITY for key in keys] != list(range(CAPACITY))
        assert len({b - a for a, b in pairwise(keys)}) > CAPACITY // 2
        assert len({key >> 16 for key in keys}) > CAPACITY // 2
        with pytest.raises(RegistrationError, match="region table full"):
            publish(table)
    finally:
        table.close()


def test_a_revoked_key_finds_nothing_and_its_slot_gets_a_new_one(tmp_path: Path) -> None:
    table = RegionTable(tmp_path / "regions", 1)
    try:
        seen: list[int] = []
        for _ in range(200):
            key = publish(table)
            assert not seen or key != seen[-1]
            assert table.revoke(key, 1.0)
            assert table.view.lookup(key) is None
            seen.append(key)
        assert len(set(seen)) > 190  # one slot, yet keys drawn from 2**32
        live = publish(table)
        assert table.view.lookup(live ^ (1 << 20)) is None  # same slot, made-up key
    finally:
        table.close()
