"""Dynamic reconfiguration (ZooKeeper's ``reconfig``) of a real ensemble, driven by kazoo.

Members 1-3 start from a file naming the three of them; members 4 and 5 from one naming
all five (a joining ZooKeeper server lists itself too). A super user grows the ensemble to
five and shrinks it back to three while a kazoo writer keeps writing, removes the leader
itself, and sends bad reconfigs, each answered with ZooKeeper's error code and changing
nothing; a member restarted with its stale static file rejoins with the current
membership. ``getConfig`` is a getData of /zookeeper/config, as ZooKeeper's client does it.
Every wait is bounded; nothing asserts a duration.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadArgumentsError,
    BadVersionError,
    KazooException,
    NewConfigNoQuorumError,
    NoAuthError,
    ReconfigDisabledError,
)
from kazoo.protocol.states import WatchedEvent

from services.consensus.tree.acl import digest
from tests.e2e.ensemble import Ensemble, wait_until
from tests.e2e.zk_history import connected
from tests.ports import free_port

pytestmark = pytest.mark.timeout(300)

SLOW = 60.0  # seconds: generous for elections and reconnects on a loaded 2-core machine
CONFIG_NODE = "/zookeeper/config"  # what getConfig reads (kazoo 2.x: get() it)
SUPER = "super:secret"
SETTINGS = {"reconfig_enabled": True, "super_digest": digest(SUPER)}
THREE = (1, 2, 3)
FIVE = (1, 2, 3, 4, 5)


def entry(ens: Ensemble, i: int) -> dict[str, str]:
    return {"client": ens.host(i), "peer": ens.peer_address(i)}


def ensemble(tmp_path: Path, settings: dict[str, Any] | None = None) -> Ensemble:
    ens = Ensemble(tmp_path, size=5, settings=settings if settings is not None else SETTINGS)
    three = {i: entry(ens, i) for i in THREE}
    five = {i: entry(ens, i) for i in FIVE}
    ens.member_settings = {i: {"members": three if i in THREE else five} for i in FIVE}
    return ens


def server(ens: Ensemble, i: int, role: str = "participant") -> str:
    """ZooKeeper's server string; our one peer port is its quorum and election port."""
    port = ens.peer_ports[i]
    return f"server.{i}=127.0.0.1:{port}:{port}:{role};{ens.host(i)}"


def config_text(ens: Ensemble, members: tuple[int, ...], version: int) -> str:
    lines = [server(ens, i) for i in members]
    return "\n".join([*lines, f"version={version:x}"])


def hosts(ens: Ensemble, members: tuple[int, ...]) -> str:
    return ",".join(ens.host(i) for i in members)


@contextlib.contextmanager
def admin(ens: Ensemble, members: tuple[int, ...]) -> Iterator[KazooClient]:
    with connected(hosts(ens, members), auth_data=[("digest", SUPER)]) as client:
        yield client


class Writer:
    """Creates /w/<n> in a loop until stopped; every create kazoo saw succeed is kept.
    Failures (connection loss while the membership changes) are retried with a new n."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self.acknowledged: list[str] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self.client.ensure_path("/w")
        self._thread.start()
        return self

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            path = f"/w/{n:06d}"
            try:
                self.client.create(path, str(n).encode())
            except KazooException:
                self.failures += 1
                self._stop.wait(0.05)
                continue
            self.acknowledged.append(path)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(SLOW)

    def wait_more(self, count: int) -> None:
        target = len(self.acknowledged) + count
        wait_until(lambda: len(self.acknowledged) >= target, f"{count} more writes", SLOW)


def all_acknowledged_present(ens: Ensemble, members: tuple[int, ...], paths: list[str]) -> None:
    with connected(hosts(ens, members)) as client:
        client.sync("/w")
        present = set(client.get_children("/w"))
    missing = [p for p in paths if p.rsplit("/", 1)[1] not in present]
    assert not missing, f"{len(missing)} acknowledged writes lost: {missing[:5]}"


def serving(ens: Ensemble, members: tuple[int, ...]) -> int:
    return ens.wait_serving(list(members), timeout=SLOW)


def test_grow_three_to_five_and_shrink_back_under_a_writer(tmp_path: Path) -> None:
    with ensemble(tmp_path) as ens:
        for i in FIVE:
            ens.start(i)
        serving(ens, THREE)
        with (
            connected(hosts(ens, THREE)) as writing,
            Writer(writing) as writer,
            admin(ens, THREE) as root,
        ):
            writer.wait_more(20)
            data, _ = root.get(CONFIG_NODE)
            assert data.decode() == config_text(ens, THREE, 0)
            fired: list[WatchedEvent] = []
            root.get("/zookeeper/config", watch=fired.append)

            joining = ",".join(server(ens, i) for i in (4, 5))
            data, stat = root.reconfig(joining=joining, leaving=None, new_members=None)
            grown = stat.mzxid
            assert data.decode() == config_text(ens, FIVE, grown)
            assert stat.version == -1  # a reconfig is a setData with version -1
            wait_until(lambda: fired, "the config watch to fire", SLOW)
            assert [(e.type, e.path) for e in fired] == [("CHANGED", "/zookeeper/config")]
            serving(ens, FIVE)
            for i in FIVE:
                with connected(ens.host(i)) as client:
                    assert client.get(CONFIG_NODE)[0].decode() == config_text(ens, FIVE, grown)
            assert {ens.stat(i)["zk_server_state"] for i in (4, 5)} <= {"leader", "follower"}
            writer.wait_more(20)

            data, stat = root.reconfig(joining=None, leaving="4,5", new_members=None)
            assert data.decode() == config_text(ens, THREE, stat.mzxid)
            assert stat.mzxid > grown
            writer.wait_more(20)
            # Out of the configuration, 4 and 5 serve no one.
            wait_until(
                lambda: all(ens.mode(i) == "looking" for i in (4, 5)),
                "the removed members to stop serving",
                SLOW,
            )
        all_acknowledged_present(ens, THREE, writer.acknowledged)
        assert len(writer.acknowledged) >= 60
        # Three voters again: one of them down, the other two still commit.
        leader = serving(ens, THREE)
        ens.kill(next(i for i in THREE if i != leader))
        with connected(hosts(ens, THREE)) as client:
            client.create("/after-shrink", b"x")


def test_the_leader_removes_itself(tmp_path: Path) -> None:
    with ensemble(tmp_path) as ens:
        for i in FIVE:
            ens.start(i)
        serving(ens, THREE)
        with admin(ens, THREE) as root:
            joining = ",".join(server(ens, i) for i in (4, 5))
            root.reconfig(joining=joining, leaving=None, new_members=None)
        leader = serving(ens, FIVE)
        rest = tuple(i for i in FIVE if i != leader)
        with connected(hosts(ens, rest)) as writing, Writer(writing) as writer:
            writer.wait_more(10)
            with admin(ens, rest) as root:
                data, stat = root.reconfig(joining=None, leaving=str(leader), new_members=None)
            assert data.decode() == config_text(ens, rest, stat.mzxid)
            new = serving(ens, rest)
            assert new != leader
            writer.wait_more(20)
        all_acknowledged_present(ens, rest, writer.acknowledged)
        wait_until(lambda: ens.mode(leader) == "looking", "the old leader to stop serving", SLOW)


def test_a_restarted_member_keeps_the_current_membership(tmp_path: Path) -> None:
    with ensemble(tmp_path) as ens:
        for i in FIVE:
            ens.start(i)
        serving(ens, THREE)
        with admin(ens, THREE) as root:
            _, stat = root.reconfig(
                joining=",".join(server(ens, i) for i in (4, 5)), leaving=None, new_members=None
            )
        current = config_text(ens, FIVE, stat.mzxid)
        serving(ens, FIVE)
        # Member 2 starts again from its static file (three members): its data directory
        # holds the newer dynamic configuration, which wins.
        ens.stop(2)
        assert (ens.member_dir(2) / f"zoo.cfg.dynamic.{stat.mzxid:x}").is_file()
        ens.start(2)
        serving(ens, FIVE)
        with connected(ens.host(2)) as client:
            assert client.get(CONFIG_NODE)[0].decode() == current
        # Member 5 loses its data directory: from the static file alone it learns the
        # configuration from the others.
        ens.stop(5)
        ens.wipe(5)
        ens.start(5)
        serving(ens, FIVE)
        with connected(ens.host(5)) as client:
            wait_until(
                lambda: client.get(CONFIG_NODE)[0].decode() == current,
                "member 5 to learn the configuration",
                SLOW,
            )
        # All five vote: with two down, the other three commit.
        leader = serving(ens, FIVE)
        for i in [i for i in FIVE if i != leader][:2]:
            ens.kill(i)
        with connected(hosts(ens, FIVE)) as client:
            client.create("/with-three-of-five", b"x")


def test_bad_reconfigs_get_zookeepers_codes_and_change_nothing(tmp_path: Path) -> None:
    with ensemble(tmp_path) as ens:
        for i in THREE:
            ens.start(i)
        serving(ens, THREE)
        before = config_text(ens, THREE, 0)
        four = server(ens, 4)
        bad: list[tuple[dict[str, Any], type[Exception]]] = [
            ({"joining": f"{four},{four}", "leaving": None}, BadArgumentsError),  # twice
            ({"joining": None, "leaving": "9"}, BadArgumentsError),  # unknown member
            ({"joining": None, "leaving": "2,2"}, BadArgumentsError),
            (
                {"joining": "server.4=127.0.0.1:1:2:participant;2181", "leaving": None},
                BadArgumentsError,
            ),
            ({"joining": "server.4=nonsense", "leaving": None}, BadArgumentsError),
            ({"joining": "server.x=127.0.0.1:1:1;2181", "leaving": None}, BadArgumentsError),
            ({"joining": None, "leaving": "1,2"}, BadArgumentsError),  # one voter left
            # A quorum of the new voters must be synced: 6 and 7 do not run.
            (
                {
                    "joining": ",".join(
                        f"server.{i}=127.0.0.1:{p}:{p}:participant;127.0.0.1:{free_port()}"
                        for i, p in ((6, free_port()), (7, free_port()))
                    ),
                    "leaving": "2,3",
                },
                NewConfigNoQuorumError,
            ),
        ]
        with admin(ens, THREE) as root:
            for args, error in bad:
                with pytest.raises(error):
                    root.reconfig(new_members=None, **args)
            with pytest.raises(BadVersionError):
                root.reconfig(joining=four, leaving=None, new_members=None, from_config=5)
            assert root.get(CONFIG_NODE)[0].decode() == before
        with connected(hosts(ens, THREE)) as plain:
            with pytest.raises(NoAuthError):
                plain.reconfig(joining=four, leaving=None, new_members=None)
            assert plain.get(CONFIG_NODE)[0].decode() == before
            plain.create("/still-writable", b"x")


def test_reconfig_is_off_unless_enabled(tmp_path: Path) -> None:
    settings = {k: v for k, v in SETTINGS.items() if k != "reconfig_enabled"}
    with ensemble(tmp_path, settings) as ens:
        for i in THREE:
            ens.start(i)
        serving(ens, THREE)
        with admin(ens, THREE) as root:
            with pytest.raises(ReconfigDisabledError):
                root.reconfig(joining=server(ens, 4), leaving=None, new_members=None)
            assert root.get(CONFIG_NODE)[0].decode() == config_text(ens, THREE, 0)


def test_a_reconfig_racing_a_leader_crash_ends_in_one_configuration(tmp_path: Path) -> None:
    with ensemble(tmp_path) as ens:
        for i in FIVE:
            ens.start(i)
        leader = serving(ens, THREE)
        followers = tuple(i for i in THREE if i != leader)
        with admin(ens, followers) as root:
            joining = ",".join(server(ens, i) for i in (4, 5))
            answer = root.reconfig_async(joining, None, None, -1)
            ens.kill(leader)
            with contextlib.suppress(KazooException):  # its outcome may be unknown
                answer.get(timeout=SLOW)
        ens.start(leader)
        with connected(hosts(ens, THREE)) as client:
            client.sync("/")
            config = client.get(CONFIG_NODE)[0].decode()
        grown = "server.5=" in config
        assert config.startswith(config_text(ens, FIVE if grown else THREE, 0).rsplit("\n", 1)[0])
        members = FIVE if grown else THREE
        serving(ens, members)

        def agreed() -> bool:
            texts = set()
            for i in members:
                with connected(ens.host(i)) as c:
                    texts.add(c.get(CONFIG_NODE)[0].decode())
            return texts == {config}

        wait_until(agreed, "every member in one configuration", SLOW)
        if not grown:  # 4 and 5 never joined: they serve no one
            assert all(ens.mode(i) == "looking" for i in (4, 5))


def test_an_observer_joins_by_reconfig(tmp_path: Path) -> None:
    """``:observer`` on a joining server line: it syncs and serves, and the quorum stays
    the voters'."""
    with ensemble(tmp_path) as ens:
        for i in (*THREE, 4):
            ens.start(i)
        serving(ens, THREE)
        with admin(ens, THREE) as root:
            data, stat = root.reconfig(
                joining=server(ens, 4, "observer"), leaving=None, new_members=None
            )
            assert data.decode().endswith(f"version={stat.mzxid:x}")
            root.create("/seen-by-observer", b"x")
        text = data.decode()
        assert f"server.4=127.0.0.1:{ens.peer_ports[4]}:{ens.peer_ports[4]}:observer;" in text
        wait_until(lambda: ens.mode(4) == "observer", "member 4 to observe", SLOW)
        leader = serving(ens, (*THREE, 4))
        assert ens.stat(leader)["zk_server_state"] == "leader"
        with connected(ens.host(4)) as client:
            client.sync("/")
            assert client.get("/seen-by-observer")[0] == b"x"
            assert client.get(CONFIG_NODE)[0].decode() == text
