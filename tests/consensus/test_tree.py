"""The replicated data tree: ZooKeeper semantics of prepare/apply, watches, snapshots."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.consensus.tree import (
    ACL,
    CONTAINER_OWNER,
    OPEN_ACL_UNSAFE,
    READ_ACL_UNSAFE,
    Applied,
    Check,
    CheckResult,
    CloseSession,
    CorruptSnapshotError,
    Create,
    CreateMode,
    CreateResult,
    CreateSession,
    DataTree,
    Delete,
    DeleteContainer,
    DeleteResult,
    ErrorCode,
    EventType,
    Id,
    KeeperError,
    Multi,
    MultiResult,
    Perm,
    Preparer,
    Rejected,
    Request,
    Session,
    SessionResult,
    SetACL,
    SetACLResult,
    SetData,
    SetDataResult,
    Stat,
    Txn,
    WatchEvent,
    digest,
    digest_auth_id,
)
from services.consensus.tree.model import CloseSessionTxn, CreateTxn

T0 = 1_000


@dataclass
class Harness:
    """Prepare then apply each request at once, handing out zxids and times like a leader."""

    tree: DataTree = field(default_factory=DataTree)
    zxid: int = 0
    log: list[Txn] = field(default_factory=list)

    def run(self, request: Request, session: Session) -> Applied | Rejected:
        out = self.tree.prepare(request, session, self.zxid + 1, T0 + 10 * (self.zxid + 1))
        if isinstance(out, Rejected):
            return out
        self.zxid += 1
        self.log.append(out)
        applied = self.tree.apply(out)
        self.tree.check_invariants()
        return applied

    def ok(self, request: Request, session: Session) -> Applied:
        out = self.run(request, session)
        assert isinstance(out, Applied), out
        return out

    def code(self, request: Request, session: Session) -> ErrorCode:
        out = self.run(request, session)
        assert isinstance(out, Rejected), out
        return out.code

    def session(self, sid: int) -> Session:
        s = Session(sid)
        self.ok(CreateSession(30_000), s)
        return s


@pytest.fixture
def h() -> Harness:
    return Harness()


def stat_of(h: Harness, path: str) -> Stat:
    st_ = h.tree.exists(path)
    assert st_ is not None
    return st_


# -- create / setData / delete stats ----------------------------------------------------


def test_create_stat_and_parent_updates(h: Harness) -> None:
    s = h.session(1)  # zxid 1
    res = h.ok(Create("/a", b"xyz", OPEN_ACL_UNSAFE), s).result  # zxid 2, time 1020
    assert res == CreateResult(
        "/a",
        Stat(
            czxid=2,
            mzxid=2,
            ctime=1020,
            mtime=1020,
            version=0,
            cversion=0,
            aversion=0,
            ephemeral_owner=0,
            data_length=3,
            num_children=0,
            pzxid=2,
        ),
    )
    root = stat_of(h, "/")
    assert (root.cversion, root.pzxid, root.num_children) == (1, 2, 1)
    h.ok(Create("/a/b", b"", OPEN_ACL_UNSAFE), s)  # zxid 3
    a = stat_of(h, "/a")
    assert (a.cversion, a.pzxid, a.num_children, a.mzxid, a.version) == (1, 3, 1, 2, 0)
    assert h.code(Create("/a", b"", OPEN_ACL_UNSAFE), s) == ErrorCode.NODEEXISTS
    assert h.code(Create("/x/y", b"", OPEN_ACL_UNSAFE), s) == ErrorCode.NONODE
    assert h.code(Create("/", b"", OPEN_ACL_UNSAFE), s) == ErrorCode.NODEEXISTS
    assert h.tree.last_zxid == 3


@pytest.mark.parametrize("path", ["a", "/a/", "//", "/a//b", "/a/.", "/..", "/a\0b", "/a\x01"])
def test_bad_paths_are_bad_arguments(h: Harness, path: str) -> None:
    s = h.session(1)
    assert h.code(Create(path, b"", OPEN_ACL_UNSAFE), s) == ErrorCode.BADARGUMENTS
    assert h.code(SetData(path, b""), s) == ErrorCode.BADARGUMENTS


def test_set_data_versions(h: Harness) -> None:
    s = h.session(1)
    h.ok(Create("/a", b"1", OPEN_ACL_UNSAFE), s)  # zxid 2
    res = h.ok(SetData("/a", b"22", 0), s).result  # zxid 3, time 1030
    assert isinstance(res, SetDataResult)
    assert (res.stat.version, res.stat.mzxid, res.stat.mtime, res.stat.czxid) == (1, 3, 1030, 2)
    assert res.stat.data_length == 2
    assert h.code(SetData("/a", b"x", 0), s) == ErrorCode.BADVERSION
    assert h.ok(SetData("/a", b"333", -1), s).result == SetDataResult(
        Stat(2, 4, 1020, 1040, 2, 0, 0, 0, 3, 0, 2)
    )
    assert h.code(SetData("/nope", b""), s) == ErrorCode.NONODE
    assert h.tree.get_data("/a", s) == (b"333", stat_of(h, "/a"))


def test_delete_versions_notempty_and_parent_stat(h: Harness) -> None:
    s = h.session(1)
    h.ok(Create("/a", b"", OPEN_ACL_UNSAFE), s)  # 2
    h.ok(Create("/a/b", b"", OPEN_ACL_UNSAFE), s)  # 3
    h.ok(SetData("/a/b", b"v"), s)  # 4
    assert h.code(Delete("/a"), s) == ErrorCode.NOTEMPTY
    assert h.code(Delete("/a/b", 0), s) == ErrorCode.BADVERSION
    assert h.code(Delete("/a/zz"), s) == ErrorCode.NONODE
    assert h.code(Delete("/"), s) == ErrorCode.BADARGUMENTS
    assert h.ok(Delete("/a/b", 1), s).result == DeleteResult("/a/b")  # 5
    a = stat_of(h, "/a")
    # ZooKeeper bumps cversion on create only; a delete moves pzxid.
    assert (a.num_children, a.cversion, a.pzxid) == (0, 1, 5)
    assert h.tree.exists("/a/b") is None
    h.ok(Delete("/a"), s)
    assert h.tree.get_children("/", s)[0] == []


def test_sequential_names_follow_parent_cversion(h: Harness) -> None:
    s = h.session(1)
    h.ok(Create("/q", b"", OPEN_ACL_UNSAFE), s)
    names = []
    for _ in range(2):
        res = h.ok(Create("/q/n-", b"", OPEN_ACL_UNSAFE, CreateMode.PERSISTENT_SEQUENTIAL), s)
        assert isinstance(res.result, CreateResult)
        names.append(res.result.path)
    assert names == ["/q/n-0000000000", "/q/n-0000000001"]
    h.ok(Create("/q/plain", b"", OPEN_ACL_UNSAFE), s)
    h.ok(Delete("/q/plain"), s)
    last = h.ok(Create("/q/", b"", OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL_SEQUENTIAL), s).result
    assert isinstance(last, CreateResult)
    assert last.path == "/q/0000000003"
    assert last.stat.ephemeral_owner == 1
    assert h.tree.get_children("/q", s)[0] == ["0000000003", "n-0000000000", "n-0000000001"]


# -- sessions and ephemerals ------------------------------------------------------------


def test_ephemerals_removed_on_close_with_watch_events(h: Harness) -> None:
    owner, watcher = h.session(7), h.session(8)
    h.ok(Create("/e", b"", OPEN_ACL_UNSAFE), watcher)
    h.ok(Create("/e/b", b"", OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL), owner)
    h.ok(Create("/e/a", b"", OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL), owner)
    h.ok(Create("/top", b"", OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL), owner)
    assert stat_of(h, "/e/a").ephemeral_owner == 7
    assert (
        h.code(Create("/top/c", b"", OPEN_ACL_UNSAFE), watcher) == ErrorCode.NOCHILDRENFOREPHEMERALS
    )
    h.tree.get_data("/e/a", watcher, watch=True)
    h.tree.exists("/top", watcher, watch=True)
    h.tree.get_children("/e", watcher, watch=True)
    h.tree.get_data("/e/b", owner, watch=True)  # dropped with the session
    out = h.ok(CloseSession(), owner)
    assert h.log[-1].body == CloseSessionTxn(("/e/a", "/e/b", "/top"))
    assert out.result == SessionResult(7, created=False)
    assert out.events == (
        WatchEvent(8, EventType.NODE_DELETED, "/e/a"),
        WatchEvent(8, EventType.NODE_CHILDREN_CHANGED, "/e"),
        WatchEvent(8, EventType.NODE_DELETED, "/top"),
    )
    assert h.tree.get_children("/e", watcher)[0] == []
    assert h.tree.exists("/top") is None
    assert 7 not in h.tree.sessions
    assert h.tree.watches.registrations() == []
    assert h.code(Create("/z", b"", OPEN_ACL_UNSAFE), owner) == ErrorCode.SESSIONEXPIRED
    assert h.code(CloseSession(), owner) == ErrorCode.SESSIONEXPIRED


def test_session_create_rules(h: Harness) -> None:
    h.session(5)
    assert h.code(CreateSession(30_000), Session(5)) == ErrorCode.BADARGUMENTS
    assert h.code(CreateSession(30_000), Session(0)) == ErrorCode.BADARGUMENTS
    assert h.code(CreateSession(0), Session(6)) == ErrorCode.BADARGUMENTS
    assert h.code(Create("/a", b"", OPEN_ACL_UNSAFE), Session(6)) == ErrorCode.SESSIONEXPIRED
    with pytest.raises(KeeperError) as err:
        h.tree.exists("/", Session(6), watch=True)
    assert err.value.code == ErrorCode.SESSIONEXPIRED


# -- watches ----------------------------------------------------------------------------


def test_watches_fire_once_per_registration(h: Harness) -> None:
    a, b = h.session(1), h.session(2)
    assert h.tree.exists("/w", b, watch=True) is None  # watch for creation
    h.tree.exists("/w", b, watch=True)  # same registration, fires once
    h.tree.get_children("/", a, watch=True)
    ev = h.ok(Create("/w", b"", OPEN_ACL_UNSAFE), a).events
    assert ev == (
        WatchEvent(2, EventType.NODE_CREATED, "/w"),
        WatchEvent(1, EventType.NODE_CHILDREN_CHANGED, "/"),
    )
    assert h.ok(SetData("/w", b"1"), a).events == ()  # consumed
    h.tree.get_data("/w", a, watch=True)
    h.tree.exists("/w", b, watch=True)
    assert h.ok(SetData("/w", b"2"), a).events == (
        WatchEvent(1, EventType.NODE_DATA_CHANGED, "/w"),
        WatchEvent(2, EventType.NODE_DATA_CHANGED, "/w"),
    )
    assert h.ok(SetData("/w", b"3"), a).events == ()
    h.ok(SetACL("/w", OPEN_ACL_UNSAFE), a)
    # data and child watch of one session on a deleted node: one NodeDeleted
    h.tree.get_data("/w", b, watch=True)
    h.tree.get_children("/w", b, watch=True)
    h.tree.get_children("/w", a, watch=True)
    h.tree.get_children("/", a, watch=True)
    assert h.ok(Delete("/w"), a).events == (
        WatchEvent(1, EventType.NODE_DELETED, "/w"),
        WatchEvent(2, EventType.NODE_DELETED, "/w"),
        WatchEvent(1, EventType.NODE_CHILDREN_CHANGED, "/"),
    )
    assert h.tree.watches.registrations() == []
    with pytest.raises(KeeperError) as err:
        h.tree.get_data("/w", a, watch=True)  # no watch set on a failed read
    assert err.value.code == ErrorCode.NONODE
    assert h.tree.watches.registrations() == []


def test_reads_validate_paths(h: Harness) -> None:
    s = h.session(1)
    for read in (h.tree.get_data, h.tree.get_children, h.tree.get_acl):
        with pytest.raises(KeeperError) as err:
            read("no-slash", s)
        assert err.value.code == ErrorCode.BADARGUMENTS
    with pytest.raises(KeeperError):
        h.tree.exists("/a/", s, watch=True)
    assert h.tree.watches.registrations() == []


def test_versions_wrap_like_java_ints(h: Harness) -> None:
    s = h.session(1)
    h.ok(Create("/v", b"", OPEN_ACL_UNSAFE), s)
    h.tree.nodes["/v"].version = 2**31 - 1  # as after 2^31 - 1 writes
    res = h.ok(SetData("/v", b"x", 2**31 - 1), s).result
    assert isinstance(res, SetDataResult) and res.stat.version == -(2**31)
    assert DataTree.from_snapshot(h.tree.snapshot()).digest() == h.tree.digest()


def test_session_closed_locally_drops_watches(h: Harness) -> None:
    a = h.session(1)
    h.tree.exists("/x", a, watch=True)
    h.tree.get_children("/", a, watch=True)
    h.tree.session_closed_locally(1)
    assert h.ok(Create("/x", b"", OPEN_ACL_UNSAFE), a).events == ()


def test_multi_events_in_op_order(h: Harness) -> None:
    a, b = h.session(1), h.session(2)
    h.tree.exists("/m1", b, watch=True)
    h.tree.exists("/m2", a, watch=True)
    h.tree.get_children("/", b, watch=True)
    out = h.ok(Multi((Create("/m1", b"", OPEN_ACL_UNSAFE), Create("/m2", b"", OPEN_ACL_UNSAFE))), a)
    assert out.events == (
        WatchEvent(2, EventType.NODE_CREATED, "/m1"),
        WatchEvent(2, EventType.NODE_CHILDREN_CHANGED, "/"),
        WatchEvent(1, EventType.NODE_CREATED, "/m2"),
    )


# -- containers -------------------------------------------------------------------------


def test_container_deleted_once_its_last_child_goes(h: Harness) -> None:
    s = h.session(1)
    system = Session(0)
    res = h.ok(Create("/c", b"", OPEN_ACL_UNSAFE, CreateMode.CONTAINER), s).result
    assert isinstance(res, CreateResult)
    assert res.stat.ephemeral_owner == CONTAINER_OWNER
    assert h.tree.containers_to_delete() == []  # never had a child
    h.ok(Create("/c/x", b"", OPEN_ACL_UNSAFE), s)
    assert h.tree.containers_to_delete() == []
    assert h.code(DeleteContainer("/c"), system) == ErrorCode.NOTEMPTY
    h.ok(Create("/c/e", b"", OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL), s)
    h.ok(Delete("/c/x"), s)
    h.ok(CloseSession(), s)
    assert h.tree.containers_to_delete() == ["/c"]
    out = h.ok(DeleteContainer("/c"), system)
    assert out.result == DeleteResult("/c")
    assert h.tree.exists("/c") is None
    assert h.tree.containers_to_delete() == []
    assert h.code(DeleteContainer("/c"), system) == ErrorCode.NONODE
    s2 = h.session(2)
    h.ok(Create("/p", b"", OPEN_ACL_UNSAFE), s2)
    assert h.code(DeleteContainer("/p"), system) == ErrorCode.BADARGUMENTS


# -- ACLs -------------------------------------------------------------------------------


def test_digest_matches_zookeeper_format() -> None:
    # DigestAuthenticationProvider.generateDigest("super:secret")
    assert digest("super:secret") == "super:lK75jTNcA+U9vtVEw5vB51mj/w4="
    assert digest_auth_id("bob:pw") == Id("digest", digest("bob:pw"))
    with pytest.raises(ValueError):
        digest("nocolon")


def test_acl_checks_with_digest_auth(h: Harness) -> None:
    anon = h.session(1)
    alice = h.session(2).with_auth(digest_auth_id("alice:pw"))
    mallory = h.session(3).with_auth(digest_auth_id("alice:wrong"))
    secret_acl = (ACL(int(Perm.ALL), Id("digest", digest("alice:pw"))),)
    h.ok(Create("/s", b"top", secret_acl), alice)
    for who in (anon, mallory):
        with pytest.raises(KeeperError) as err:
            h.tree.get_data("/s", who)
        assert err.value.code == ErrorCode.NOAUTH
        assert h.code(SetData("/s", b"x"), who) == ErrorCode.NOAUTH
        assert h.code(Create("/s/c", b"", OPEN_ACL_UNSAFE), who) == ErrorCode.NOAUTH
        assert h.code(SetACL("/s", OPEN_ACL_UNSAFE), who) == ErrorCode.NOAUTH
        assert h.code(Multi((Check("/s"),)), who) == ErrorCode.NOAUTH
    assert h.tree.exists("/s") is not None  # exists needs no permission
    assert h.tree.get_data("/s", alice)[0] == b"top"
    h.ok(Create("/s/c", b"", OPEN_ACL_UNSAFE), alice)
    assert h.code(Delete("/s/c"), anon) == ErrorCode.NOAUTH  # DELETE is checked on the parent
    h.ok(Delete("/s/c"), alice)
    # read-only for the world, plus the `auth` scheme expanded to the creator's ids
    h.ok(Create("/r", b"", (*READ_ACL_UNSAFE, ACL(int(Perm.ALL), Id("auth", "")))), alice)
    acl, _ = h.tree.get_acl("/r", anon)
    with pytest.raises(KeeperError) as err:
        h.tree.get_acl("/s", anon)  # neither READ nor ADMIN
    assert err.value.code == ErrorCode.NOAUTH
    assert acl == (*READ_ACL_UNSAFE, ACL(int(Perm.ALL), Id("digest", digest("alice:pw"))))
    assert h.tree.get_data("/r", anon)[0] == b""
    assert h.code(SetData("/r", b"x"), anon) == ErrorCode.NOAUTH
    h.ok(SetData("/r", b"x"), alice)


def test_invalid_acls(h: Harness) -> None:
    s = h.session(1)
    bad = [
        (),
        (ACL(31, Id("world", "someone")),),
        (ACL(31, Id("ip", "10.0.0.1")),),
        (ACL(31, Id("digest", "no-hash")),),
        (ACL(64, Id("world", "anyone")),),
        (ACL(31, Id("auth", "")),),  # no auth ids on the session
    ]
    for acl in bad:
        assert h.code(Create("/a", b"", acl), s) == ErrorCode.INVALIDACL, acl
    h.ok(Create("/a", b"", OPEN_ACL_UNSAFE + OPEN_ACL_UNSAFE), s)
    assert h.tree.get_acl("/a", s)[0] == OPEN_ACL_UNSAFE  # duplicates dropped
    assert h.code(SetACL("/a", ()), s) == ErrorCode.INVALIDACL


def test_set_acl_aversion(h: Harness) -> None:
    s = h.session(1)
    h.ok(Create("/a", b"d", OPEN_ACL_UNSAFE), s)
    before = stat_of(h, "/a")
    assert h.code(SetACL("/a", READ_ACL_UNSAFE, 3), s) == ErrorCode.BADVERSION
    assert h.code(SetACL("/none", READ_ACL_UNSAFE), s) == ErrorCode.NONODE
    out = h.ok(SetACL("/a", READ_ACL_UNSAFE, 0), s).result
    assert out == SetACLResult(before._replace(aversion=1))
    assert h.tree.get_acl("/a", s) == (READ_ACL_UNSAFE, before._replace(aversion=1))
    assert h.code(SetACL("/a", OPEN_ACL_UNSAFE, 1), s) == ErrorCode.NOAUTH  # ADMIN revoked
    assert h.code(SetData("/a", b"x"), s) == ErrorCode.NOAUTH


# -- multi ------------------------------------------------------------------------------


def test_failing_multi_changes_nothing_and_reports_per_op_codes(h: Harness) -> None:
    s = h.session(1)
    h.ok(Create("/a", b"", OPEN_ACL_UNSAFE), s)
    before, zxid = h.tree.digest(), h.zxid
    ops = (
        Create("/m", b"", OPEN_ACL_UNSAFE),
        SetData("/m", b"x", 0),
        Delete("/nope"),
        Create("/z", b"", OPEN_ACL_UNSAFE),
    )
    out = h.run(Multi(ops), s)
    assert out == Rejected(
        ErrorCode.NONODE,
        (ErrorCode.OK, ErrorCode.OK, ErrorCode.NONODE, ErrorCode.RUNTIMEINCONSISTENCY),
    )
    assert h.tree.digest() == before and h.zxid == zxid
    assert h.tree.exists("/m") is None
    # a check op failing makes the whole multi fail
    out = h.run(Multi((Check("/a", 5), Delete("/a"))), s)
    assert out == Rejected(
        ErrorCode.BADVERSION, (ErrorCode.BADVERSION, ErrorCode.RUNTIMEINCONSISTENCY)
    )
    assert h.run(Multi((Delete("/a"), Delete("/a"))), s) == Rejected(
        ErrorCode.NONODE, (ErrorCode.OK, ErrorCode.NONODE)
    )
    assert h.tree.digest() == before


def test_multi_ops_see_earlier_ops(h: Harness) -> None:
    s = h.session(1)
    ops = (
        Create("/m", b"", OPEN_ACL_UNSAFE),
        Create("/m/s-", b"", OPEN_ACL_UNSAFE, CreateMode.PERSISTENT_SEQUENTIAL),
        Create("/m/s-", b"", OPEN_ACL_UNSAFE, CreateMode.PERSISTENT_SEQUENTIAL),
        SetData("/m", b"v", 0),
        Check("/m", 1),
        Delete("/m/s-0000000000", 0),
    )
    out = h.ok(Multi(ops), s)  # zxid 2
    assert isinstance(out.result, MultiResult)
    r = out.result.results
    assert [type(x) for x in r] == [
        CreateResult,
        CreateResult,
        CreateResult,
        SetDataResult,
        CheckResult,
        DeleteResult,
    ]
    assert isinstance(r[2], CreateResult) and r[2].path == "/m/s-0000000001"
    m = stat_of(h, "/m")
    assert (m.version, m.cversion, m.num_children, m.pzxid, m.mzxid) == (1, 2, 1, 2, 2)
    assert h.tree.get_children("/m", s)[0] == ["s-0000000001"]
    assert h.ok(Multi(()), s).result == MultiResult(())


# -- proposals in flight ----------------------------------------------------------------


def test_preparer_sees_unapplied_proposals() -> None:
    tree = DataTree()
    prep = Preparer(tree)
    s = Session(1)
    t1 = prep.prepare(CreateSession(1000), s, 1, 5)
    t2 = prep.prepare(Create("/p", b"", OPEN_ACL_UNSAFE), s, 2, 5)
    t3 = prep.prepare(Create("/p/e", b"", OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL), s, 3, 5)
    assert prep.prepare(Create("/p", b"", OPEN_ACL_UNSAFE), s, 4, 5) == Rejected(
        ErrorCode.NODEEXISTS
    )
    assert prep.prepare(Delete("/p"), s, 4, 5) == Rejected(ErrorCode.NOTEMPTY)
    t4 = prep.prepare(CloseSession(), s, 4, 5)
    assert isinstance(t4, Txn) and t4.body == CloseSessionTxn(("/p/e",))
    assert prep.prepare(SetData("/p", b""), s, 5, 5) == Rejected(ErrorCode.SESSIONEXPIRED)
    # the plain tree, with nothing applied yet, knows none of it
    assert tree.prepare(Create("/p", b"", OPEN_ACL_UNSAFE), s, 5, 5) == Rejected(
        ErrorCode.SESSIONEXPIRED
    )
    for txn in (t1, t2, t3, t4):
        assert isinstance(txn, Txn)
        tree.apply(txn)
        tree.check_invariants()
    assert prep.outstanding == 0
    assert tree.get_children("/p", s)[0] == []
    prep.prepare(CreateSession(1000), Session(2), 5, 5)
    assert prep.outstanding == 1
    prep.reset()
    assert prep.outstanding == 0


# -- snapshots --------------------------------------------------------------------------


def build_sample(h: Harness) -> None:
    s = h.session(3)
    alice = s.with_auth(digest_auth_id("alice:pw"))
    h.ok(Create("/a", bytes(range(256)), OPEN_ACL_UNSAFE), s)
    h.ok(Create("/a/é", b"", (ACL(int(Perm.ALL), Id("auth", "")),)), alice)
    h.ok(Create("/a/e", b"x", OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL_SEQUENTIAL), s)
    h.ok(Create("/c", b"", OPEN_ACL_UNSAFE, CreateMode.CONTAINER), s)
    h.ok(SetData("/a", b"new"), s)


def test_snapshot_round_trip(h: Harness) -> None:
    build_sample(h)
    blob = h.tree.snapshot()
    copy = DataTree.from_snapshot(blob)
    copy.check_invariants()
    assert copy.digest() == h.tree.digest()
    assert copy.last_zxid == h.tree.last_zxid == 6
    assert copy.sessions == {3: 30_000}
    for path in ("/", "/a", "/a/é", "/a/e0000000001", "/c"):
        assert copy.exists(path) == h.tree.exists(path)
        reader = Session(3, frozenset({digest_auth_id("alice:pw")}))
        assert copy.get_acl(path, reader) == h.tree.get_acl(path, reader)
    assert copy.snapshot() == blob
    assert DataTree().digest() != h.tree.digest()


def test_corrupt_snapshots_are_rejected(h: Harness) -> None:
    build_sample(h)
    blob = bytearray(h.tree.snapshot())
    target = DataTree()
    empty = target.digest()
    flipped = bytearray(blob)
    flipped[-5] ^= 0x40
    cases = [bytes(flipped), bytes(blob[:-1]), b"XXXX" + bytes(blob[4:]), bytes(blob[:10]), b""]
    versioned = bytearray(blob)
    versioned[5] = 9
    cases.append(bytes(versioned))
    for bad in cases:
        with pytest.raises(CorruptSnapshotError):
            target.restore(bad)
        assert target.digest() == empty


# -- null data ----------------------------------------------------------------------------


def test_null_data_is_kept_apart_from_empty(h: Harness) -> None:
    """Null data (None) reads back as None, empty as b""; both have dataLength 0."""
    s = h.session(1)
    creates = {
        "/null": (None, CreateMode.PERSISTENT),
        "/empty": (b"", CreateMode.PERSISTENT),
        "/eph-null": (None, CreateMode.EPHEMERAL),
        "/seq-null-": (None, CreateMode.PERSISTENT_SEQUENTIAL),
        "/eseq-null-": (None, CreateMode.EPHEMERAL_SEQUENTIAL),
        "/container-null": (None, CreateMode.CONTAINER),
    }
    want: dict[str, bytes | None] = {}
    for path, (data, mode) in creates.items():
        result = h.ok(Create(path, data, OPEN_ACL_UNSAFE, mode), s).result
        assert isinstance(result, CreateResult) and result.stat.data_length == 0
        body = h.log[-1].body
        assert isinstance(body, CreateTxn) and body.data == data
        want[result.path] = data
    h.ok(Create("/set-null", b"abc", OPEN_ACL_UNSAFE), s)
    h.ok(Create("/set-empty", None, OPEN_ACL_UNSAFE), s)
    for path, data in (("/set-null", None), ("/set-empty", b"")):
        result = h.ok(SetData(path, data), s).result
        assert isinstance(result, SetDataResult)
        assert (result.stat.data_length, result.stat.version) == (0, 1)
        want[path] = data
    multi = Multi(
        (
            Create("/multi-null", None, OPEN_ACL_UNSAFE),
            Create("/multi-empty", b"", OPEN_ACL_UNSAFE),
            SetData("/null", b"", 0),
            SetData("/empty", None, 0),
        )
    )
    results = h.ok(multi, s).result
    assert isinstance(results, MultiResult)
    assert [r.stat.data_length for r in results.results if isinstance(r, SetDataResult)] == [0, 0]
    want |= {"/multi-null": None, "/multi-empty": b"", "/null": b"", "/empty": None}

    def check(tree: DataTree) -> None:
        tree.check_invariants()
        for path, data in want.items():
            got, stat = tree.get_data(path, s)
            assert (got, stat.data_length) == (data, 0), path
        assert tree.get_data("/", s)[0] == b""  # the root holds empty data, as ZooKeeper's

    check(h.tree)
    assert h.tree.data_size == sum(len(p) for p in h.tree.nodes)  # null counts 0 bytes
    copy = DataTree.from_snapshot(h.tree.snapshot())
    check(copy)
    assert copy.digest() == h.tree.digest()
    replica = DataTree()
    for txn in h.log:
        replica.apply(txn)
    check(replica)
    # Null and empty make different trees, so different digests and snapshots.
    h.tree.nodes["/null"].data = None
    assert h.tree.digest() != copy.digest()


# A snapshot written by the format-1 encoder (before null data was kept): a session, the
# root, /a holding b"x" and /e holding b"".
SNAPSHOT_V1 = bytes.fromhex(
    "444c5a54000100000000013f5b319ffa0000000000000003000000010000000000000001000075300000"
    "0003000000012f000000000000000000000000000000000000000000000000000000000000000000000000"
    "00000002000000000000000000000000000000000000000300000000000000010000001f00000005776f72"
    "6c6400000006616e796f6e65000000022f610000000000000002000000000000000200000000000003fc00"
    "000000000003fc00000000000000000000000000000000000000000000000000000002000000017800000001"
    "0000001f00000005776f726c6400000006616e796f6e65000000022f650000000000000003000000000000"
    "0003000000000000040600000000000004060000000000000000000000000000000000000000000000000000"
    "000300000000000000010000001f00000005776f726c6400000006616e796f6e65"
)


def test_format_1_snapshots_still_load() -> None:
    tree = DataTree.from_snapshot(SNAPSHOT_V1)
    tree.check_invariants()
    assert tree.last_zxid == 3 and tree.sessions == {1: 30_000}
    assert {p: n.data for p, n in tree.nodes.items()} == {"/": b"", "/a": b"x", "/e": b""}
    assert tree.nodes["/a"].stat().data_length == 1
    again = tree.snapshot()
    assert again[4:6] == b"\x00\x02"  # written back as format 2
    assert DataTree.from_snapshot(again).digest() == tree.digest()
    # Format 1 has no null: there an all-ones data length is a length, past the end.
    tree.nodes["/e"].data = None
    with_null = bytearray(tree.snapshot())
    with_null[4:6] = b"\x00\x01"
    with pytest.raises(CorruptSnapshotError):
        DataTree.from_snapshot(bytes(with_null))


# -- random histories -------------------------------------------------------------------

PATHS = ["/a", "/a/b", "/a/b/c", "/c", "/c/d", "/c/d/e", "/e", "/a/s-", "/c/s-"]
PATHS += ["/c/s-0000000000", "/c/s-0000000001", "/a/s-0000000001"]
USERS = ["alice:pw", "bob:pw"]
SIDS = [11, 12, 13]


def acls() -> st.SearchStrategy[tuple[ACL, ...]]:
    user = st.sampled_from(USERS).map(lambda u: ACL(int(Perm.ALL), Id("digest", digest(u))))
    world = st.sampled_from([OPEN_ACL_UNSAFE, READ_ACL_UNSAFE])
    return st.one_of(world, world.flatmap(lambda w: user.map(lambda u: (*w, u))))


def ops() -> st.SearchStrategy[Request]:
    path = st.sampled_from(PATHS)
    version = st.sampled_from([-1, -1, 0, 1])
    data = st.one_of(st.none(), st.binary(max_size=4))
    create = st.builds(Create, path, data, acls(), st.sampled_from(list(CreateMode)))
    single = st.one_of(
        create,
        create,
        st.builds(Delete, path, version),
        st.builds(SetData, path, data, version),
        st.builds(SetACL, path, acls(), version),
    )
    multi = st.builds(
        Multi,
        st.lists(st.one_of(single, st.builds(Check, path, version)), max_size=3).map(tuple),
    )
    sessions = st.sampled_from([CreateSession(10), CloseSession()])
    return st.one_of(create, create, single, single, multi, sessions)


Step = tuple[int, int, Request, int]  # session index, auth user index (-1 none), request, batch


def steps() -> st.SearchStrategy[list[Step]]:
    step = st.tuples(
        st.integers(0, len(SIDS) - 1),
        st.integers(-1, len(USERS) - 1),
        ops(),
        st.integers(1, 3),
    )
    return st.lists(step, min_size=5, max_size=50)


def run_history(history: list[Step]) -> Harness:
    """Serial prepare+apply on one tree, and batched prepare on a Preparer; must agree.

    The batched side keeps up to `batch` proposals in flight before applying them, so its
    validation runs against the overlay; every outcome must equal the serial one.
    """
    serial = Harness()
    for sid in SIDS:
        serial.session(sid)
    serial.ok(Create("/a", b"", OPEN_ACL_UNSAFE), Session(SIDS[0]))
    serial.ok(Create("/c", b"", OPEN_ACL_UNSAFE, CreateMode.CONTAINER), Session(SIDS[0]))
    batched_tree = DataTree.from_snapshot(serial.tree.snapshot())
    prep = Preparer(batched_tree)
    pending: list[Txn] = []

    def both(request: Request, session: Session, batch: int) -> None:
        zxid = serial.zxid + 1
        expected = serial.run(request, session)
        got = prep.prepare(request, session, zxid, T0 + 10 * zxid)
        if isinstance(expected, Rejected):
            assert got == expected
            return
        assert got == serial.log[-1]
        pending.append(got)
        if len(pending) >= batch:
            for txn in pending:
                batched_tree.apply(txn)
                batched_tree.check_invariants()
            pending.clear()

    for i, (si, ui, request, batch) in enumerate(history):
        if i % 2:
            for path in serial.tree.containers_to_delete():
                both(DeleteContainer(path), Session(0), batch)
        session = Session(SIDS[si])
        if ui >= 0:
            session = session.with_auth(digest_auth_id(USERS[ui]))
        both(request, session, batch)
    for txn in pending:
        batched_tree.apply(txn)
    assert batched_tree.digest() == serial.tree.digest()
    return serial


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps(), st.floats(0, 1))
def test_replicas_converge(history: list[Step], cut: float) -> None:
    serial = run_history(history)
    log = serial.log
    replica = DataTree()
    for txn in log:
        replica.apply(txn)
    assert replica.digest() == serial.tree.digest()

    midway = int(len(log) * cut)
    first = DataTree()
    for txn in log[:midway]:
        first.apply(txn)
    restored = DataTree.from_snapshot(first.snapshot())
    assert restored.digest() == first.digest()
    for txn in log[midway:]:
        restored.apply(txn)
        restored.check_invariants()
    assert restored.digest() == serial.tree.digest()
    assert restored.snapshot() == serial.tree.snapshot()


def test_txns_carry_resolved_state() -> None:
    h = Harness()
    s = h.session(1)
    h.ok(Create("/q", b"", OPEN_ACL_UNSAFE), s)
    h.ok(Create("/q/", b"d", OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL_SEQUENTIAL), s)
    assert h.log[-1].body == CreateTxn("/q/0000000000", b"d", OPEN_ACL_UNSAFE, 1, 1)
    assert (h.log[-1].zxid, h.log[-1].time_ms, h.log[-1].session_id) == (3, 1030, 1)
