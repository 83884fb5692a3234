"""Null znode data, apart from empty data, with kazoo against real ensembles.

A jute buffer of length -1 is null, and ZooKeeper keeps it so: a znode created or set with
null data reads back as null (kazoo: ``None``), one created or set with ``b""`` reads back
as ``b""``, and the Stat's dataLength is 0 for both. Applications and recipes tell "never
set" from "set to empty" by it. kazoo sends null for ``create(path, None)`` and
``set(path, None)``; its plain ``create(path)`` sends ``b""``. Its transaction builder
refuses None, and its ``create`` has no container mode, so ``multi`` and ``create_request``
below hand kazoo's own request records to its connection.

What Apache ZooKeeper 3.8 does, and these assertions expect, was checked by hand running
``write_cases``, ``check_reads``, ``check_root`` and the data-watch test against a
three-member ensemble of Debian's zookeeper 3.8.0 (the one ``bench/consensus.py`` starts,
with ``snapCount=4``): null and empty apart in every reply and on every member, after its
leader was killed and after the whole ensemble restarted; its root, ``/zookeeper`` and
``/zookeeper/quota`` hold empty data, not null. (TTL modes answer UNIMPLEMENTED there by
default, as here.)

Every wait is bounded; nothing asserts on durations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.serialization import Create, Create2, SetData
from kazoo.protocol.states import ZnodeStat
from kazoo.security import OPEN_ACL_UNSAFE

from services.consensus.storage.snapshots import Snapshots
from services.consensus.tree import DataTree
from tests.e2e.ensemble import Ensemble, KazooClients, wait_until

pytestmark = pytest.mark.timeout(300)

WAIT = 30.0  # bound of every wait for something a member or the ensemble must do

# ZooKeeper's CreateMode flags.
PERSISTENT, EPHEMERAL, SEQUENTIAL, EPHEMERAL_SEQUENTIAL, CONTAINER = 0, 1, 2, 3, 4

Data = bytes | None


def label(data: Data) -> str:
    return "null" if data is None else "empty" if data == b"" else "full"


def create_request(
    client: KazooClient, path: str, data: Data, flags: int, *, create2: bool
) -> tuple[str, ZnodeStat | None]:
    """create (or create2, which also returns the Stat) in any mode, container included,
    with any data; the created path, and the Stat or None."""
    result = client.handler.async_result()
    client._call((Create2 if create2 else Create)(path, data, OPEN_ACL_UNSAFE, flags), result)
    if create2:
        created: tuple[str, ZnodeStat] = result.get(timeout=WAIT)
        return created
    return result.get(timeout=WAIT), None


def multi(client: KazooClient, *ops: Any) -> list[Any]:
    """One multi of kazoo request records (Create, SetData, ...), which may carry null."""
    transaction = client.transaction()
    for op in ops:
        transaction._add(op)
    results: list[Any] = transaction.commit_async().get(timeout=WAIT)
    return results


def write_cases(client: KazooClient, parent: str, ephemerals: bool = True) -> dict[str, Data]:
    """Under ``parent`` (created here, with kazoo's default data, ``b""``), znodes given
    null and empty data through every call that carries data: create and create2 in each
    mode, setData, and creates and setData inside a multi. Asserts the dataLength of every
    Stat the writes return; returns the data each znode must read back."""
    want: dict[str, Data] = {}

    def wrote(path: str, data: Data, stat: ZnodeStat | None = None) -> None:
        if stat is not None:
            assert stat.dataLength == len(data or b""), (path, stat)
        want[path] = data

    wrote(client.create(parent), b"")
    modes = {"persistent": PERSISTENT, "sequential": SEQUENTIAL, "container": CONTAINER}
    if ephemerals:
        modes |= {"ephemeral": EPHEMERAL, "ephemeral-sequential": EPHEMERAL_SEQUENTIAL}
    for name, flags in modes.items():
        for data in (None, b""):
            for create2 in (False, True):
                prefix = f"{parent}/{name}{'2' if create2 else ''}-{label(data)}-"
                path, stat = create_request(client, prefix, data, flags, create2=create2)
                wrote(path, data, stat)
    wrote(client.create(f"{parent}/create-null", None), None)
    wrote(client.create(f"{parent}/create-default"), b"")
    path, stat = client.create(f"{parent}/create2-null", None, include_data=True)
    wrote(path, None, stat)

    for start, end in ((b"x", None), (None, b""), (b"", None), (None, b"y"), (None, None)):
        path = client.create(f"{parent}/set-{label(start)}-to-{label(end)}", start)
        stat = client.set(path, end)
        assert stat.version == 1
        wrote(path, end, stat)
    path = client.create(f"{parent}/set-twice", None)
    client.set(path, b"z")
    wrote(path, None, client.set(path, None))

    path = client.create(f"{parent}/multi-set-null", b"before")
    other = client.create(f"{parent}/multi-set-empty", None)
    results = multi(
        client,
        Create(f"{parent}/multi-null", None, OPEN_ACL_UNSAFE, PERSISTENT),
        Create(f"{parent}/multi-empty", b"", OPEN_ACL_UNSAFE, PERSISTENT),
        Create(f"{parent}/multi-sequential-null-", None, OPEN_ACL_UNSAFE, SEQUENTIAL),
        SetData(path, None, -1),
        SetData(other, b"", -1),
    )
    assert not [r for r in results if isinstance(r, Exception)], results
    created, empty, sequential, set_null, set_empty = results
    wrote(created, None)
    wrote(empty, b"")
    wrote(sequential, None)
    wrote(path, None, set_null)
    wrote(other, b"", set_empty)
    if ephemerals:
        (made,) = multi(client, Create(f"{parent}/multi-eph-null", None, OPEN_ACL_UNSAFE, 1))
        wrote(made, None)
    return want


def check_reads(client: KazooClient, want: dict[str, Data]) -> None:
    """getData returns each znode's data, null as None; every Stat (getData, exists,
    getChildren2) says dataLength 0 for null and for empty."""
    pending = {
        path: (
            client.get_async(path),
            client.exists_async(path),
            client.get_children_async(path, include_data=True),
        )
        for path in want
    }
    for path, (got, exists, children) in pending.items():
        data, stat = got.get(timeout=WAIT)
        assert (label(data), data) == (label(want[path]), want[path]), path
        length = len(want[path] or b"")
        assert stat.dataLength == length, (path, stat)
        assert exists.get(timeout=WAIT).dataLength == length, path
        assert children.get(timeout=WAIT)[1].dataLength == length, path


def check_member(ens: Ensemble, member: int, want: dict[str, Data], parent: str) -> None:
    """Read ``want`` from ``member`` alone, after a sync so a follower has caught up."""
    client = KazooClient(hosts=ens.host(member), timeout=10.0)
    client.start(timeout=WAIT)
    try:
        client.sync_async(parent).get(timeout=WAIT)
        check_reads(client, want)
    finally:
        client.stop()
        client.close()


def check_root(client: KazooClient) -> None:
    """The root holds empty data, not null, as ZooKeeper's does."""
    data, stat = client.get("/")
    assert (data, stat.dataLength) == (b"", 0)


# -- one shared ensemble ------------------------------------------------------------------


def test_null_and_empty_read_back_apart_on_every_member(
    ens: Ensemble, zk: KazooClients, base: str
) -> None:
    client = zk()
    check_root(client)
    want = write_cases(client, base)
    assert sum(d is None for d in want.values()) >= 15
    assert sum(d == b"" for d in want.values()) >= 15
    check_reads(client, want)
    for member in ens.ids:
        check_member(ens, member, want, base)


def test_a_data_watch_sees_null_and_empty(zk: KazooClients, base: str) -> None:
    writer, watcher = zk(), zk()
    writer.create(base, None)
    seen: list[Data] = []

    def watch(event: object) -> None:
        seen.append(watcher.get(base)[0])

    def more_than(count: int) -> Callable[[], bool]:
        return lambda: len(seen) > count

    for data in (b"", None, b"x", None):
        watcher.get(base, watch=watch)
        fired = more_than(len(seen))
        writer.set(base, data)
        wait_until(fired, "the data watch")
        assert (label(seen[-1]), seen[-1]) == (label(data), data)


# -- through leader changes, follower syncs and restarts ----------------------------------


@pytest.fixture(params=["log", "snapshot"])
def ensemble(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ensemble]:
    """``log``: no snapshot is taken, so followers catch up by DIFF and a restart replays
    the log; ``snapshot``: one every ten transactions, so a member that is behind gets the
    leader's snapshot (SNAP) and a restart loads a snapshot, then the log after it."""
    settings = {"snap_count": 10} if request.param == "snapshot" else None
    with Ensemble(tmp_path, settings=settings) as ens:
        ens.start()
        ens.wait_serving()
        yield ens


def newest_snapshot_nulls(ens: Ensemble, member: int) -> list[str]:
    """The paths of null znodes in the newest snapshot a member wrote."""
    snapshot = Snapshots(ens.member_dir(member)).latest_valid()
    assert snapshot is not None, f"member {member} wrote no snapshot"
    tree = DataTree.from_snapshot(snapshot.data)
    return sorted(path for path, node in tree.nodes.items() if node.data is None)


def test_null_survives_leader_changes_syncs_and_restarts(ensemble: Ensemble) -> None:
    ens = ensemble
    want: dict[str, Data] = {}
    clients = KazooClients(ens.hosts, WAIT)
    try:
        writer = clients()
        writer.create("/nulls")
        want |= write_cases(writer, "/nulls/first", ephemerals=False)

        # The leader dies: every survivor serves what the old leader committed.
        leader = ens.wait_serving()
        ens.kill(leader)
        survivors = [i for i in ens.ids if i != leader]
        new_leader = ens.wait_serving(survivors)
        assert new_leader != leader
        for member in survivors:
            check_member(ens, member, want, "/nulls")

        # The old leader comes back behind the new one (DIFF, or SNAP from a snapshot).
        want |= write_cases(clients(), "/nulls/second", ephemerals=False)
        ens.start(leader)
        ens.wait_serving(ens.ids)
        check_member(ens, leader, want, "/nulls")

        # A follower with an empty data directory gets everything from the leader.
        follower = next(i for i in ens.ids if i != ens.wait_serving())
        ens.stop(follower)
        ens.wipe(follower)
        want |= write_cases(clients(), "/nulls/third", ephemerals=False)
        ens.start(follower)
        ens.wait_serving(ens.ids)
        check_member(ens, follower, want, "/nulls")
        if "snap_count" in ens.settings:  # the leader's log starts after its snapshot
            run = len(ens.exit_codes[follower]) + 1
            log = (ens.work_dir / f"member-{follower}-{run}.log").read_text()
            assert "installed the leader's snapshot" in log, log[-3000:]
        want |= write_cases(clients(), "/nulls/fourth", ephemerals=False)
    finally:
        clients.close()

    # The whole ensemble restarts: each member loads its snapshot and log again.
    ens.stop()
    assert all(codes[-1] == 0 for codes in ens.exit_codes.values()), ens.exit_codes
    if "snap_count" in ens.settings:
        for member in ens.ids:
            assert newest_snapshot_nulls(ens, member), f"member {member}: no null in its snapshot"
    else:
        assert not list(ens.data_dir.glob("*/snapshot.*"))
    ens.start()
    ens.wait_serving()
    for member in ens.ids:
        check_member(ens, member, want, "/nulls")
