"""kazoo, a real ZooKeeper client, against a real 3-member consensus ensemble.

Most tests share one ensemble (`ens`) and keep to a znode prefix of their own (`base`);
the test that kills members gets an ensemble of its own. Raw-socket tests (tests/e2e/
zk_raw.py) send what kazoo never would: malformed frames, oversized lengths, invalid paths,
unknown opcodes and random bytes. Every wait is bounded; nothing asserts on durations.
"""

from __future__ import annotations

import contextlib
import random
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadArgumentsError,
    BadVersionError,
    InvalidACLError,
    NoAuthError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.states import EventType, KazooState, WatchedEvent, ZnodeStat
from kazoo.recipe.barrier import Barrier
from kazoo.recipe.counter import Counter
from kazoo.recipe.election import Election
from kazoo.recipe.lock import Lock
from kazoo.recipe.party import Party
from kazoo.recipe.queue import LockingQueue
from kazoo.recipe.watchers import DataWatch
from kazoo.retry import KazooRetry
from kazoo.security import (
    ACL,
    CREATOR_ALL_ACL,
    OPEN_ACL_UNSAFE,
    Id,
    Permissions,
    make_digest_acl,
    make_digest_acl_credential,
)
from prometheus_client.parser import text_string_to_metric_families

from services.consensus.fourletter import ask
from tests.e2e.ensemble import Ensemble, KazooClients, wait_until
from tests.e2e.service_process import REPO_ROOT
from tests.e2e.zk_raw import (
    CREATE,
    EXISTS,
    GET_DATA,
    RawSession,
    boolean,
    buffer,
    frame,
    integer,
    open_acl_unsafe,
    ustring,
)

pytestmark = pytest.mark.timeout(90)

WAIT = 20.0  # bound of every wait for something the ensemble must do


# -- fixtures ---------------------------------------------------------------------------


def members(ens: Ensemble) -> tuple[int, list[int]]:
    """(leader, followers) of the running ensemble."""
    leader = ens.wait_serving()
    return leader, [i for i in ens.running() if i != leader]


def port_of(client: KazooClient) -> int:
    """The client port of the member `client` is connected to."""
    return int(client._connection._socket.getpeername()[1])


def scrape(ens: Ensemble, member: int) -> dict[str, float]:
    """One member's /metrics, parsed by Prometheus' own parser: sample name (with labels
    rendered as name{k=v}) to value."""
    with urllib.request.urlopen(ens.metrics_url(member), timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


# -- CRUD, versions, stats ----------------------------------------------------------------


def test_create_get_set_delete_with_versions_and_stat(zk: KazooClients, base: str) -> None:
    client = zk()
    path, stat = client.create(base, b"hello", include_data=True)
    assert path == base
    assert (stat.version, stat.numChildren, stat.dataLength) == (0, 0, 5)
    assert stat.czxid == stat.mzxid and stat.ephemeralOwner == 0

    data, got = client.get(base)
    assert data == b"hello" and got == stat

    with pytest.raises(BadVersionError):
        client.set(base, b"nope", version=1)
    after = client.set(base, b"world!", version=0)
    assert (after.version, after.dataLength, after.czxid) == (1, 6, stat.czxid)
    assert after.czxid < after.mzxid
    assert after.mtime >= after.ctime
    with pytest.raises(BadVersionError):
        client.set(base, b"stale", version=0)
    assert client.get(base) == (b"world!", after)
    assert client.set(base, b"any", version=-1).version == 2

    with pytest.raises(NodeExistsError):
        client.create(base, b"again")
    with pytest.raises(NoNodeError):
        client.create(f"{base}/missing/child")
    with pytest.raises(NoNodeError):
        client.get(f"{base}/missing")
    with pytest.raises(NoNodeError):
        client.set(f"{base}/missing", b"")
    assert client.exists(f"{base}/missing") is None

    client.create(f"{base}/a", b"")
    client.create(f"{base}/b", b"")
    parent = client.exists(base)
    assert parent is not None
    assert (parent.numChildren, parent.cversion, parent.version) == (2, 2, 2)
    assert sorted(client.get_children(base)) == ["a", "b"]
    children, stat2 = client.get_children(base, include_data=True)
    assert sorted(children) == ["a", "b"] and stat2.numChildren == 2

    with pytest.raises(NotEmptyError):
        client.delete(base)
    with pytest.raises(BadVersionError):
        client.delete(f"{base}/a", version=3)
    client.delete(f"{base}/a", version=0)
    client.delete(f"{base}/b")
    parent = client.exists(base)
    assert parent is not None and parent.numChildren == 0
    assert parent.pzxid > after.mzxid

    client.create(f"{base}-eph", b"", ephemeral=True)
    with pytest.raises(NoChildrenForEphemeralsError):
        client.create(f"{base}-eph/child", b"")
    client.delete(base, version=2)
    assert client.exists(base) is None
    with pytest.raises(NoNodeError):
        client.delete(base)


def test_sequential_numbering_from_several_clients(zk: KazooClients, base: str) -> None:
    clients = [zk() for _ in range(3)]
    clients[0].create(base)
    clients[0].create(f"{base}/plain")  # the counter is the parent's cversion: 1 now
    made: dict[int, list[str]] = {i: [] for i in range(3)}

    def create(i: int) -> None:
        for _ in range(8):
            made[i].append(clients[i].create(f"{base}/s-", str(i).encode(), sequence=True))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()

    for client in clients:
        client.sync(base)  # reads below go to other members than the writes
    numbers: list[int] = []
    for i, paths in made.items():
        suffixes = [p.removeprefix(f"{base}/s-") for p in paths]
        assert all(re.fullmatch(r"\d{10}", s) for s in suffixes), suffixes
        mine = [int(s) for s in suffixes]
        assert mine == sorted(mine) and len(set(mine)) == len(mine)  # increasing per client
        numbers += mine
        for p in paths:
            assert clients[(i + 1) % 3].get(p)[0] == str(i).encode()
    assert sorted(numbers) == list(range(1, 25))

    # Another parent counts from zero; a trailing "/" makes the name all digits.
    clients[1].create(f"{base}/other")
    assert clients[1].create(f"{base}/other/", sequence=True) == f"{base}/other/0000000000"
    assert clients[1].create(f"{base}/other/x", sequence=True) == f"{base}/other/x0000000001"


# -- ephemerals and sessions ---------------------------------------------------------------


def test_ephemeral_gone_after_session_close(zk: KazooClients, base: str) -> None:
    owner, observer = zk(), zk()
    observer.create(base)
    path = owner.create(f"{base}/eph", b"mine", ephemeral=True)
    observer.sync(path)
    stat = observer.exists(path)
    assert stat is not None and stat.ephemeralOwner == owner.client_id[0]
    events: list[WatchedEvent] = []
    assert observer.exists(path, watch=events.append) is not None

    owner.stop()
    wait_until(lambda: events, "deletion event")
    assert [(e.type, e.path) for e in events] == [(EventType.DELETED, path)]
    assert observer.exists(path) is None
    assert observer.get_children(base) == []


EPHEMERAL_OWNER = """
import sys, time
from kazoo.client import KazooClient
client = KazooClient(hosts=sys.argv[1], timeout=1.0)
client.start(timeout=20)
client.create(sys.argv[2], b"short-lived", ephemeral=True)
print(client.client_id[0], flush=True)
time.sleep(120)
"""


def test_ephemeral_gone_after_session_expiry(ens: Ensemble, zk: KazooClients, base: str) -> None:
    """The owner process is SIGKILLed: no closeSession is sent, so only the session's
    expiry (1 s timeout) can remove the node."""
    observer = zk()
    observer.create(base)
    path = f"{base}/eph"
    owner = subprocess.Popen(
        [sys.executable, "-c", EPHEMERAL_OWNER, ens.hosts, path],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert owner.stdout is not None
        ready, _, _ = select.select([owner.stdout], [], [], WAIT)
        assert ready, "the owner process did not create its node"
        session_id = int(owner.stdout.readline())

        observer.sync(path)
        stat = observer.exists(path)
        assert stat is not None and stat.ephemeralOwner == session_id
        exists_events: list[WatchedEvent] = []
        assert observer.exists(path, watch=exists_events.append) is not None
        seen: list[tuple[bytes | None, ZnodeStat | None]] = []
        DataWatch(observer, path, lambda data, stat: seen.append((data, stat)))
        wait_until(lambda: seen, "DataWatch's first call")
        assert seen[0][0] == b"short-lived"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(WAIT)

    wait_until(lambda: observer.exists(path) is None, "the ephemeral to expire")
    wait_until(lambda: exists_events and len(seen) == 2, "both watchers to see the deletion")
    assert [(e.type, e.path) for e in exists_events] == [(EventType.DELETED, path)]
    assert seen[1] == (None, None)
    assert observer.get_children(base) == []
    # Every member agrees once it has caught up.
    for i in ens.ids:
        other = zk(ens.host(i))
        other.sync(path)
        assert other.exists(path) is None


def test_session_survives_member_restarts(tmp_path: Path) -> None:
    with Ensemble(tmp_path).start() as ens:
        leader = ens.wait_serving()
        follower = next(i for i in ens.ids if i != leader)
        clients = KazooClients(ens.hosts, WAIT)
        try:
            client = clients(ens.host(follower))  # pinned to the follower first
            assert port_of(client) == ens.client_ports[follower]
            session_id = client.client_id[0]
            states: list[KazooState] = []
            client.add_listener(states.append)
            path = client.create("/survivor", b"v0", ephemeral=True)
            # kazoo drops plain watches on a connection loss; DataWatch sets its again.
            seen: list[bytes | None] = []
            DataWatch(client, path, lambda data, stat: seen.append(data))
            wait_until(lambda: seen == [b"v0"], "DataWatch's first call")
            client.set_hosts(ens.hosts)  # used at the next reconnect

            ens.kill(follower)
            wait_until(
                lambda: states[-2:] == [KazooState.SUSPENDED, KazooState.CONNECTED],
                "kazoo to reconnect after the follower died",
            )
            assert port_of(client) != ens.client_ports[follower]
            assert client.client_id[0] == session_id
            stat = client.exists(path)
            assert stat is not None and stat.ephemeralOwner == session_id
            # The watch, set again on the new member, sees a change made elsewhere.
            observer = clients(ens.host(leader))
            observer.set(path, b"v1")
            wait_until(lambda: seen[-1:] == [b"v1"], "the data watch after the reconnect")
            assert client.get(path)[0] == b"v1"

            ens.start(follower)
            ens.wait_serving(ens.ids)
            pinned = clients(ens.host(follower))
            pinned.sync(path)
            assert pinned.get(path)[0] == b"v1"

            # Now the leader: a new election, and the session still lives.
            ens.kill(leader)
            wait_until(lambda: ens.leader() not in (None, leader), "a new leader")
            ens.wait_serving()
            # The client may still be between members: retry a read until it is back.
            retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5, deadline=WAIT)
            stat = retry(client.exists, path)
            assert stat is not None and stat.ephemeralOwner == session_id
            assert client.client_id[0] == session_id
            assert states[-1] == KazooState.CONNECTED
            assert states.count(KazooState.SUSPENDED) >= 2 and KazooState.LOST not in states
            assert client.set(path, b"v2").version == 2
            client.stop()
            checker = clients(ens.hosts)
            checker.sync(path)
            assert checker.exists(path) is None
        finally:
            clients.close()


# -- watches -------------------------------------------------------------------------------


def test_watches_fire_once_and_in_order(zk: KazooClients, base: str) -> None:
    watcher, writer = zk(), zk()
    writer.create(base)
    node, marker = f"{base}/node", f"{base}/marker"
    writer.create(node, b"0")
    watcher.sync(base)
    events: list[tuple[str, Any, str]] = []

    def record(kind: str) -> Callable[[WatchedEvent], None]:
        return lambda event: events.append((kind, event.type, event.path))

    # A data watch fires once for two changes, then a re-armed exists watch sees the delete.
    watcher.get(node, watch=record("data"))
    writer.set(node, b"1")
    writer.set(node, b"2")
    watcher.exists(node, watch=record("exists"))
    writer.delete(node)
    wait_until(lambda: len(events) >= 2, "two data events")
    # A child watch fires once for two creates; the exists watch on the marker comes after.
    watcher.get_children(base, watch=record("child"))
    writer.create(f"{base}/c1")
    writer.create(f"{base}/c2")
    watcher.exists(marker, watch=record("exists"))
    writer.create(marker)
    wait_until(lambda: len(events) >= 4, "child and created events")
    writer.sync(base)
    watcher.sync(base)
    assert events == [
        ("data", EventType.CHANGED, node),
        ("exists", EventType.DELETED, node),
        ("child", EventType.CHILD, base),
        ("exists", EventType.CREATED, marker),
    ]


def test_watch_events_of_several_nodes_arrive_in_write_order(zk: KazooClients, base: str) -> None:
    watcher, writers = zk(), [zk(), zk()]
    watcher.create(base)
    paths = [f"{base}/n{i}" for i in range(12)]
    for p in paths:
        watcher.create(p, b"")
    events: list[str] = []
    for p in paths:
        watcher.get(p, watch=lambda event: events.append(event.path))

    for writer in writers:
        writer.sync(base)
    order = random.Random(7).sample(paths, len(paths))
    # Two writers, each pipelining its half: the zxid order decides the event order.
    pending = [writers[i % 2].set_async(p, b"x") for i, p in enumerate(order)]
    for result in pending:
        result.get(timeout=WAIT)
    wait_until(lambda: len(events) == len(paths), "one event per node")
    by_zxid = sorted(paths, key=lambda p: watcher.exists(p).mzxid)
    assert events == by_zxid
    # One client's pipelined writes apply in the order it sent them.
    assert [p for p in by_zxid if order.index(p) % 2 == 0] == order[0::2]
    assert [p for p in by_zxid if order.index(p) % 2 == 1] == order[1::2]


# -- transactions ----------------------------------------------------------------------------


def test_failed_transaction_applies_nothing(zk: KazooClients, base: str) -> None:
    client = zk()
    client.create(base)
    client.create(f"{base}/a", b"a0")
    client.create(f"{base}/b", b"b0")
    before = {p: client.get(f"{base}/{p}") for p in ("a", "b")}

    tx = client.transaction()
    tx.create(f"{base}/new", b"n")
    tx.set_data(f"{base}/a", b"a1")
    tx.check(f"{base}/b", 5)  # fails: version is 0
    tx.delete(f"{base}/b")
    results = tx.commit()
    assert [type(r) for r in results] == [
        RolledBackError,
        RolledBackError,
        BadVersionError,
        RuntimeInconsistency,
    ]
    assert sorted(client.get_children(base)) == ["a", "b"]
    assert {p: client.get(f"{base}/{p}") for p in ("a", "b")} == before

    tx = client.transaction()
    tx.delete(f"{base}/b")
    tx.create(f"{base}/b", b"b1")
    tx.set_data(f"{base}/missing", b"")
    results = tx.commit()
    assert [type(r) for r in results] == [RolledBackError, RolledBackError, NoNodeError]
    assert client.get(f"{base}/b") == before["b"]

    tx = client.transaction()
    tx.create(f"{base}/c", b"c")
    tx.set_data(f"{base}/a", b"a1", version=0)
    tx.delete(f"{base}/b", version=0)
    results = tx.commit()
    assert results[0] == f"{base}/c" and results[1].version == 1 and results[2] is True
    assert sorted(client.get_children(base)) == ["a", "c"]
    assert client.get(f"{base}/a")[0] == b"a1"


# -- ACLs ----------------------------------------------------------------------------------


def test_digest_acl(zk: KazooClients, base: str) -> None:
    owner, stranger, impostor = zk(), zk(), zk()
    owner.add_auth("digest", "user:pw")
    impostor.add_auth("digest", "user:wrong")
    acl = make_digest_acl("user", "pw", all=True)
    owner.create(base, b"secret", acl=[acl])
    stranger.sync(base)
    impostor.sync(base)

    assert owner.get(base)[0] == b"secret"
    for client in (stranger, impostor):
        with pytest.raises(NoAuthError):
            client.get(base)
        with pytest.raises(NoAuthError):
            client.set(base, b"mine")
        with pytest.raises(NoAuthError):
            client.create(f"{base}/child")
    assert stranger.exists(base) is not None  # exists needs no permission

    acls, stat = owner.get_acls(base)
    assert stat.aversion == 0
    assert [(a.perms, a.id.scheme, a.id.id) for a in acls] == [
        (31, "digest", make_digest_acl_credential("user", "pw"))
    ]
    readable = [acl, ACL(Permissions.READ, Id("world", "anyone"))]
    with pytest.raises(BadVersionError):
        owner.set_acls(base, readable, version=3)
    with pytest.raises(NoAuthError):
        stranger.set_acls(base, OPEN_ACL_UNSAFE)
    assert owner.set_acls(base, readable, version=0).aversion == 1
    with pytest.raises(BadVersionError):
        owner.set_acls(base, OPEN_ACL_UNSAFE, version=0)

    stranger.sync(base)
    assert stranger.get(base)[0] == b"secret"  # world may read now, not write
    with pytest.raises(NoAuthError):
        stranger.set(base, b"mine")
    acls, stat = stranger.get_acls(base)
    assert stat.aversion == 1 and len(acls) == 2
    assert owner.get(base)[0] == b"secret"
    owner.delete(base)


def test_invalid_acls_and_the_auth_scheme(ens: Ensemble, zk: KazooClients, base: str) -> None:
    client = zk()
    for acl in (
        [ACL(Permissions.ALL, Id("digest", "no-colon"))],
        [ACL(Permissions.ALL, Id("no-such-scheme", "x"))],
        CREATOR_ALL_ACL,  # "auth" with no identity added yet
    ):
        with pytest.raises(InvalidACLError):
            client.create(base, b"", acl=acl)
    assert client.exists(base) is None
    client.add_auth("digest", "creator:pw")
    client.create(base, b"mine", acl=CREATOR_ALL_ACL)
    acls, _ = client.get_acls(base)
    assert [(a.perms, a.id.scheme, a.id.id) for a in acls] == [
        (31, "digest", make_digest_acl_credential("creator", "pw"))
    ]
    with RawSession.open(ens.client_ports[ens.ids[0]]) as raw:  # kazoo never sends no ACL
        raw.send_request(1, CREATE, ustring(f"{base}-none") + buffer(b"") + integer(0) + integer(0))
        reply = raw.reply()
        assert (reply.xid, reply.err) == (1, -114)  # INVALIDACL
    assert client.exists(f"{base}-none") is None


# -- followers -----------------------------------------------------------------------------


def test_write_on_a_follower_read_on_another_after_sync(
    ens: Ensemble, zk: KazooClients, base: str
) -> None:
    leader, followers = members(ens)
    first, second = followers
    writer = zk(ens.host(first))
    reader = zk(ens.host(second))
    on_leader = zk(ens.host(leader))
    assert port_of(writer) == ens.client_ports[first]
    assert ens.mode(first) == ens.mode(second) == "follower"

    stat = writer.create(base, b"via follower", include_data=True)[1]
    writer.set(base, b"updated")
    for client in (reader, on_leader):
        client.sync(base)
        data, got = client.get(base)
        assert data == b"updated" and got.czxid == stat.czxid and got.version == 1
    reader.set(base, b"from the other follower")
    writer.sync(base)
    assert writer.get(base)[0] == b"from the other follower"


# -- recipes -------------------------------------------------------------------------------


def run_threads(targets: list[Callable[[], None]], timeout: float = 60.0) -> None:
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guarded(t), daemon=True) for t in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads still running"
    assert not errors, errors


def test_lock_mutual_exclusion(zk: KazooClients, base: str) -> None:
    clients = [zk() for _ in range(3)]
    counter_path = f"{base}/counter"
    clients[0].create(counter_path, b"0", makepath=True)
    state = {"holders": 0, "max_holders": 0, "count": 0}
    guard = threading.Lock()

    def worker(i: int) -> Callable[[], None]:
        lock = Lock(clients[i], f"{base}/lock", identifier=f"worker-{i}")

        def run() -> None:
            for _ in range(10):
                with lock:
                    with guard:
                        state["holders"] += 1
                        state["max_holders"] = max(state["max_holders"], state["holders"])
                    value, stat = clients[i].get(counter_path)
                    count = state["count"]
                    time.sleep(0.002)  # widen the window a missing exclusion would need
                    clients[i].set(counter_path, str(int(value) + 1).encode(), stat.version)
                    state["count"] = count + 1
                    with guard:
                        state["holders"] -= 1

        return run

    run_threads([worker(i) for i in range(3)])
    assert state["max_holders"] == 1
    assert state["count"] == 30
    clients[1].sync(counter_path)
    assert clients[1].get(counter_path)[0] == b"30"
    clients[2].sync(base)
    assert clients[2].get_children(f"{base}/lock") == []


def test_election_one_leader_then_the_next(zk: KazooClients, base: str) -> None:
    clients = [zk() for _ in range(3)]
    elections = [Election(clients[i], base, identifier=f"c{i}") for i in range(3)]
    running: list[int] = []
    led: list[int] = []
    resign = [threading.Event() for _ in range(3)]
    guard = threading.Lock()

    def lead(i: int) -> None:
        with guard:
            running.append(i)
            led.append(i)
        resign[i].wait(WAIT)
        with guard:
            running.remove(i)

    threads = [
        threading.Thread(target=elections[i].run, args=(lead, i), daemon=True) for i in range(3)
    ]
    for t in threads:
        t.start()
    wait_until(lambda: len(led) == 1, "a first leader")
    wait_until(lambda: len(elections[0].contenders()) == 3, "all three contending")
    first = led[0]
    assert running == [first]
    assert elections[first].contenders()[0] == f"c{first}"

    # A waiting contender cancels: it never leads, and its run() returns.
    quitter = next(i for i in range(3) if i != first)
    elections[quitter].cancel()
    threads[quitter].join(WAIT)
    assert not threads[quitter].is_alive()
    wait_until(lambda: len(elections[first].contenders()) == 2, "the quitter gone")

    resign[first].set()
    wait_until(lambda: len(led) == 2, "the next leader")
    second = led[1]
    assert second not in (first, quitter)
    assert running == [second]
    assert elections[first].contenders() == [f"c{second}"]
    resign[second].set()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    assert led == [first, second] and running == []
    assert elections[0].contenders() == []


def test_counter_concurrent_increments(zk: KazooClients, base: str) -> None:
    clients = [zk() for _ in range(3)]

    def worker(i: int) -> Callable[[], None]:
        counter = Counter(clients[i], base)

        def run() -> None:
            nonlocal counter
            for _ in range(15):
                counter += 1

        return run

    run_threads([worker(i) for i in range(3)])
    reader = zk()
    reader.sync(base)
    assert Counter(reader, base).value == 45
    floats = Counter(clients[0], f"{base}-float", default=0.5)
    floats += 1.25
    clients[1].sync(f"{base}-float")
    assert Counter(clients[1], f"{base}-float", default=0.5).value == 1.75


def test_barrier_releases_waiters_when_removed(ens: Ensemble, zk: KazooClients, base: str) -> None:
    clients = [zk() for _ in range(4)]
    Barrier(clients[0], base).create()
    watches_before = sum(int(ens.stat(i)["zk_watch_count"]) for i in ens.ids)
    results: dict[int, bool] = {}

    def waiter(i: int) -> None:
        clients[i].sync(base)  # else its member may not know the barrier yet
        results[i] = Barrier(clients[i], base).wait(timeout=WAIT)

    threads = [threading.Thread(target=waiter, args=(i,), daemon=True) for i in (1, 2, 3)]
    for t in threads:
        t.start()
    wait_until(
        lambda: sum(int(ens.stat(i)["zk_watch_count"]) for i in ens.ids) >= watches_before + 3,
        "three waiters watching the barrier",
    )
    assert results == {} and all(t.is_alive() for t in threads)
    Barrier(clients[0], base).remove()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    assert results == {1: True, 2: True, 3: True}
    assert clients[0].exists(base) is None


def test_locking_queue_priority_order_and_exactly_once(zk: KazooClients, base: str) -> None:
    producer = zk()
    single = LockingQueue(producer, f"{base}/ordered")
    for value, priority in [(b"low-a", 200), (b"hi-a", 10), (b"mid-a", 50)]:
        single.put(value, priority)
    single.put_all([b"hi-b", b"hi-c"], 10)
    single.put(b"low-b", 200)
    taken = []
    for _ in range(6):
        value = single.get(timeout=5)
        assert value is not None
        taken.append(value)
        assert single.consume()
    assert taken == [b"hi-a", b"hi-b", b"hi-c", b"mid-a", b"low-a", b"low-b"]
    assert len(single) == 0 and single.get(timeout=0.1) is None

    items = [f"item-{n:02d}".encode() for n in range(24)]
    queue = LockingQueue(producer, f"{base}/shared")
    for n, item in enumerate(items):
        queue.put(item, priority=100 - n % 3)
    expected_order = sorted(items, key=lambda v: (100 - int(v[-2:]) % 3, v))
    consumers = [zk() for _ in range(3)]
    consumed: dict[int, list[bytes]] = {i: [] for i in range(3)}

    def consumer(i: int) -> Callable[[], None]:
        q = LockingQueue(consumers[i], f"{base}/shared")

        def run() -> None:
            consumers[i].sync(base)
            while (value := q.get(timeout=1.0)) is not None:
                assert q.consume()
                consumed[i].append(value)

        return run

    run_threads([consumer(i) for i in range(3)])
    everything = [v for values in consumed.values() for v in values]
    assert sorted(everything) == sorted(items)  # each exactly once
    for values in consumed.values():  # each consumer took them in queue order
        assert values == sorted(values, key=expected_order.index)
    assert len(LockingQueue(producer, f"{base}/shared")) == 0


def test_party_members(zk: KazooClients, base: str) -> None:
    clients = [zk() for _ in range(3)]
    parties = [Party(clients[i], base, identifier=f"member-{i}") for i in range(3)]
    for party in parties:
        party.join()
    viewer = zk()
    view = Party(viewer, base)
    viewer.sync(base)
    assert len(view) == 3
    assert sorted(view) == ["member-0", "member-1", "member-2"]
    parties[1].leave()
    viewer.sync(base)
    assert sorted(view) == ["member-0", "member-2"] and len(view) == 2
    clients[2].stop()  # session closed: its ephemeral membership goes with it
    viewer.sync(base)
    assert list(view) == ["member-0"] and len(view) == 1


# -- four-letter words and metrics -----------------------------------------------------------


def test_four_letter_words(ens: Ensemble, zk: KazooClients, base: str) -> None:
    leader, followers = members(ens)
    for i in ens.ids:
        assert ask(ens.client_ports[i], "ruok") == "imok"
        assert ask(ens.client_ports[i], "envi").startswith("Environment:\n")

    client = zk(ens.host(followers[0]))
    stat = client.create(base, b"", include_data=True)[1]
    modes = {}
    for i in ens.ids:
        for word in ("srvr", "stat"):
            text = ask(ens.client_ports[i], word)
            mode = re.search(r"^Mode: (\w+)$", text, re.M)
            zxid = re.search(r"^Zxid: (0x[0-9a-f]+)$", text, re.M)
            assert mode and zxid, text
            modes[i] = mode.group(1)
            if i == followers[0]:
                assert int(zxid.group(1), 16) >= stat.czxid
        assert "Clients:" in ask(ens.client_ports[i], "stat")
    assert modes == {leader: "leader", **{f: "follower" for f in followers}}

    member = followers[0]
    client.sync("/")
    mntr = ens.stat(member)
    assert mntr["zk_server_state"] == "follower"
    assert ens.stat(leader)["zk_server_state"] == "leader"
    assert int(ens.stat(leader)["zk_followers"]) == 2
    for child in range(5):
        client.create(f"{base}/{child}", b"12345")
    after = ens.stat(member)
    assert int(after["zk_znode_count"]) == int(mntr["zk_znode_count"]) + 5
    data_growth = int(after["zk_approximate_data_size"]) - int(mntr["zk_approximate_data_size"])
    assert data_growth == sum(len(f"{base}/{c}") + 5 for c in range(5))
    assert int(after["zk_last_zxid"], 16) > int(mntr["zk_last_zxid"], 16)
    assert int(after["zk_num_alive_connections"]) >= 1


def test_metrics(ens: Ensemble, zk: KazooClients, base: str) -> None:
    leader, followers = members(ens)
    target = followers[0]
    client = zk(ens.host(target))
    observer = zk(ens.host(leader))
    client.sync("/")
    observer.sync("/")
    before = {i: scrape(ens, i) for i in ens.ids}
    for n in range(5):
        client.create(f"{base}-{n}", b"m")
    znodes = "directlog_consensus_znodes"

    def applied(i: int) -> bool:
        return scrape(ens, i)[znodes] == before[i][znodes] + 5

    for i in ens.ids:  # every member applies them (no sync: a sync is a proposal too)
        wait_until(lambda: applied(i), f"member {i} to apply the creates")  # noqa: B023
    after = {i: scrape(ens, i) for i in ens.ids}

    roles = {i: after[i]["directlog_consensus_role"] for i in ens.ids}
    assert roles == {leader: 2.0, **{f: 1.0 for f in followers}}
    count = "directlog_consensus_commit_latency_seconds_count"
    proposals = "directlog_consensus_proposals_total"
    assert after[target][count] - before[target][count] == 5
    assert after[target][proposals] - before[target][proposals] == 5
    for i in ens.ids:
        if i != target:
            assert after[i][proposals] == before[i][proposals]
    for i in ens.ids:
        assert after[i]["directlog_consensus_sessions"] >= 2  # client and observer
        assert (
            after[i]["directlog_consensus_commits_total"]
            >= before[i]["directlog_consensus_commits_total"] + 5
        )
    assert after[leader]["directlog_consensus_znodes"] == float(ens.stat(leader)["zk_znode_count"])
    assert after[target]["directlog_consensus_client_connections"] >= 1
    assert after[target]["directlog_consensus_client_requests_total{op=create}"] >= 5


# -- bad input -------------------------------------------------------------------------------


@pytest.fixture
def canary(zk: KazooClients, base: str) -> Iterator[tuple[KazooClient, dict[str, bytes]]]:
    """A few nodes whose content must not change whatever a bad client sends."""
    client = zk()
    content = {base: b"root", f"{base}/a": b"alpha", f"{base}/a/b": b"\x00\xff" * 100}
    for path, data in content.items():
        client.create(path, data)
    yield client, content
    for path, data in content.items():
        client.sync(path)
        assert client.get(path)[0] == data
    assert client.get_children(base) == ["a"]


def get_data(path: str, watch: bool = False) -> bytes:
    return ustring(path) + boolean(watch)


def create_body(path: str, data: bytes = b"", flags: int = 0) -> bytes:
    return ustring(path) + buffer(data) + open_acl_unsafe() + integer(flags)


def test_malformed_frames_close_the_connection(
    ens: Ensemble, canary: tuple[KazooClient, dict[str, bytes]], base: str
) -> None:
    leader, _ = members(ens)
    port = ens.client_ports[leader]
    header = integer(5) + integer(GET_DATA)
    cases = {
        "empty frame": frame(b""),
        "truncated header": frame(b"\x00\x00\x01"),
        "string longer than the frame": frame(header + integer(100) + b"/ab"),
        "negative string length": frame(header + integer(-7) + b"/" + boolean(False)),
        "bytes after the record": frame(header + get_data(base) + b"junk"),
        "huge ACL count": frame(
            integer(6) + integer(CREATE) + ustring(f"{base}/x") + buffer(b"") + integer(2**31 - 1)
        ),
        "negative frame length": integer(-5) + b"abcdefgh",
        "garbage": b"\xde\xad\xbe\xef" * 8,
    }
    counter = "directlog_consensus_connections_closed_for_bad_input_total"
    bad_before = scrape(ens, leader)[counter]
    for name, data in cases.items():
        with RawSession.open(port) as raw:
            raw.sync(base)
            raw.send_request(1, GET_DATA, get_data(f"{base}/a"))
            reply = raw.reply()
            assert (reply.xid, reply.err) == (1, 0), name
            raw.send_raw(data)
            assert raw.is_closed_by_server(), name
        assert ask(port, "ruok") == "imok"
    assert scrape(ens, leader)[counter] == bad_before + len(cases)


def test_oversized_frame_length_closes_the_connection(
    ens: Ensemble, canary: tuple[KazooClient, dict[str, bytes]]
) -> None:
    _, followers = members(ens)
    port = ens.client_ports[followers[0]]
    for size in (1024 * 1024 + 1, 64 * 1024 * 1024, 2**31 - 1):
        with RawSession.open(port) as raw:
            raw.send_raw(integer(size))  # the length alone: refused before any body arrives
            assert raw.is_closed_by_server(), size
    # Before any ConnectRequest, too.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(integer(2 * 1024 * 1024) + bytes(1000))
        assert sock.recv(100) == b""
    assert ask(port, "ruok") == "imok"


def test_invalid_paths_are_bad_arguments(
    ens: Ensemble, zk: KazooClients, canary: tuple[KazooClient, dict[str, bytes]], base: str
) -> None:
    port = ens.client_ports[ens.ids[0]]
    with RawSession.open(port) as raw:
        raw.sync(base)
        xid = 0
        for path in ("a/b", "/a//b", "/a/", "", "/a/./b", "/a/../b", "/a\x00b", "/\x01"):
            for op, body in (
                (GET_DATA, get_data(path)),
                (EXISTS, get_data(path)),
                (CREATE, create_body(path)),
            ):
                xid += 1
                raw.send_request(xid, op, body)
                reply = raw.reply()
                assert (reply.xid, reply.err) == (xid, -8), (path, op)
        # The connection still works.
        raw.send_request(xid + 1, GET_DATA, get_data(f"{base}/a"))
        reply = raw.reply()
        assert (reply.xid, reply.err) == (xid + 1, 0)
        assert reply.body[4:9] == b"alpha"

    client = zk()
    for path in (f"{base}/nul\x00", f"{base}/\x1f", f"{base}/\ufff5"):
        with pytest.raises(BadArgumentsError):
            client.create(path)
    with pytest.raises(BadArgumentsError):
        client.get(f"{base}/\x01")


def test_unknown_opcode_is_unimplemented_and_the_connection_keeps_working(
    ens: Ensemble, canary: tuple[KazooClient, dict[str, bytes]], base: str
) -> None:
    _, followers = members(ens)
    port = ens.client_ports[followers[1]]
    with RawSession.open(port) as raw:
        raw.sync(base)
        for xid, op in ((11, 999), (12, 106), (13, -55), (14, 22)):
            raw.send_request(xid, op, b"\x00" * 12)
            reply = raw.reply()
            assert (reply.xid, reply.err) == (xid, -6), op
        raw.send_request(15, GET_DATA, get_data(f"{base}/a"))
        reply = raw.reply()
        assert (reply.xid, reply.err) == (15, 0)
        assert reply.body[:9] == integer(5) + b"alpha"
        raw.send_request(-2, 11)  # ping
        assert raw.reply().xid == -2
    assert ask(port, "ruok") == "imok"


FUZZ_OPS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 100, 101, 999]
fuzz_input = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda xid, op, body: frame(integer(xid) + integer(op) + body),
        st.integers(-(2**31), 2**31 - 1),
        st.sampled_from(FUZZ_OPS),
        st.binary(max_size=200),
    ),
)


@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=fuzz_input)
def test_fuzz_random_bytes_after_connect(
    ens: Ensemble, canary: tuple[KazooClient, dict[str, bytes]], data: bytes
) -> None:
    port = ens.client_ports[ens.ids[-1]]
    with RawSession.open(port, timeout=0.5, session_timeout_ms=1000) as raw:
        raw.send_raw(data)
        with contextlib.suppress(OSError):
            raw.send_request(-2, 11)  # a ping: its reply shows the bytes before were read
            raw.is_closed_by_server()
    assert ask(port, "ruok") == "imok"
    assert ens.mode(ens.ids[-1]) in ("leader", "follower")


def test_members_serve_after_bad_input(ens: Ensemble, zk: KazooClients) -> None:
    assert sorted(ens.running()) == ens.ids
    leader, followers = members(ens)
    for i in ens.ids:
        assert ask(ens.client_ports[i], "ruok") == "imok"
    client = zk()
    client.sync("/")
    counts = {}
    for i in ens.ids:
        zk(ens.host(i)).sync("/")
        counts[i] = int(ens.stat(i)["zk_znode_count"])
    assert len(set(counts.values())) == 1, f"members disagree on the node count: {counts}"
    assert {ens.mode(i) for i in followers} == {"follower"} and ens.mode(leader) == "leader"
