"""Read-only mode (``read_only_mode``, ZooKeeper's readonlymode.enabled) in a real
3-member ensemble, with kazoo's read-only client (``KazooClient(read_only=True)``).

A member is cut off from the other two by network namespaces (tests/e2e/netns.py): its
peer links go down while clients in the root namespace still reach it, as in a real
partition. With the mode on, the cut-off member serves read-only sessions from its own
(stale) tree, answers every write NOTREADONLY and refuses clients that did not ask for
read-only; once healed it rejoins, drops those sessions, and its clients reconnect read-write
and see what the majority wrote meanwhile. With the mode off it serves nothing.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.exceptions import NotReadOnlyCallError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KeeperState
from kazoo.security import OPEN_ACL_UNSAFE

from services.consensus.fourletter import ask
from tests.e2e import netns
from tests.e2e.ensemble import Ensemble, wait_until
from tests.e2e.zk_history import connected, kazoo_client

PREFIX = "/ro"
SLOW = 60.0  # seconds: generous for elections and reconnects on a loaded 2-core machine


@contextlib.contextmanager
def partitionable(
    tmp_path: Path, settings: dict[str, Any] | None
) -> Iterator[tuple[Ensemble, netns.MemberNetworks]]:
    netns.require()
    with (
        netns.MemberNetworks([1, 2, 3]) as net,
        Ensemble(
            tmp_path, settings=settings, member_hosts=net.hosts, command_prefix=net.prefixes
        ) as ens,
    ):
        ens.start()
        ens.wait_serving(timeout=SLOW)
        yield ens, net
        ens.stop()  # before the namespaces go


def isro(ens: Ensemble, member: int) -> str | None:
    try:
        return ask(ens.client_ports[member], "isro", host=ens.address(member))
    except OSError:
        return None


def closed_without_answer(ens: Ensemble, member: int, read_only: bool) -> bool:
    """Send a ConnectRequest (jute by hand: version, last zxid, timeout, session id,
    password, readOnly) and tell whether the member closed the connection without a
    ConnectResponse."""
    request = struct.pack(">iqiqi", 0, 0, 10_000, 0, 16) + bytes(16) + bytes([read_only])
    with socket.create_connection((ens.address(member), ens.client_ports[member]), 10) as sock:
        sock.settimeout(SLOW)
        sock.sendall(struct.pack(">i", len(request)) + request)
        return sock.recv(4096) == b""


def prepare(ens: Ensemble, victim: int) -> None:
    """/ro/a and /ro/kids/k0 written, and applied by ``victim`` (a sync through it)."""
    with connected(ens.hosts) as client:
        client.create(f"{PREFIX}/a", b"before", makepath=True)
        client.create(f"{PREFIX}/kids/k0", b"", makepath=True)
    with connected(ens.host(victim)) as client:
        client.sync(PREFIX)
        assert client.get(f"{PREFIX}/a")[0] == b"before"


def cut(ens: Ensemble, net: netns.MemberNetworks, which: str) -> tuple[int, list[int]]:
    leader = ens.wait_serving(timeout=SLOW)
    victim = leader if which == "leader" else next(i for i in ens.ids if i != leader)
    majority = [i for i in ens.ids if i != victim]
    prepare(ens, victim)
    net.isolate(victim)
    ens.wait_serving(majority, timeout=SLOW)
    return victim, majority


def write_meanwhile(ens: Ensemble, majority: list[int]) -> None:
    with connected(",".join(ens.host(i) for i in majority)) as client:
        client.set(f"{PREFIX}/a", b"during")
        client.create(f"{PREFIX}/kids/k1", b"")


@pytest.mark.parametrize("which", ["follower", "leader"])
def test_cut_off_member_serves_read_only_sessions_until_it_rejoins(
    tmp_path: Path, which: str
) -> None:
    with partitionable(tmp_path, {"read_only_mode": True}) as (ens, net):
        victim, majority = cut(ens, net, which)
        wait_until(lambda: isro(ens, victim) == "ro", "the cut-off member to be read-only", SLOW)
        assert ens.mode(victim) == "read-only"
        srvr = ask(ens.client_ports[victim], "srvr", host=ens.address(victim))
        assert "\nMode: read-only\n" in srvr
        assert all(isro(ens, i) == "rw" for i in majority)
        write_meanwhile(ens, majority)

        # A client that did not ask for read-only is refused, kazoo's and by hand.
        assert closed_without_answer(ens, victim, read_only=False)
        refused = kazoo_client(ens.host(victim))
        try:
            with pytest.raises(KazooTimeoutError):
                refused.start(timeout=5)
        finally:
            refused.stop()
            refused.close()

        with connected(ens.host(victim), start_timeout=SLOW, read_only=True) as ro:
            assert ro.client_state == KeeperState.CONNECTED_RO
            # Reads and watches on the member's own tree: the majority's writes are not
            # there yet.
            fired: list[Any] = []
            assert ro.get(f"{PREFIX}/a", watch=fired.append)[0] == b"before"
            assert ro.get_children(f"{PREFIX}/kids", watch=fired.append) == ["k0"]
            assert ro.exists(f"{PREFIX}/missing", watch=fired.append) is None
            assert ens.stat(victim)["zk_watch_count"] == "3"

            def multi() -> None:
                transaction = ro.transaction()
                transaction.create(f"{PREFIX}/t", b"")
                transaction.commit()

            writes: list[Callable[[], object]] = [
                lambda: ro.create(f"{PREFIX}/new", b"x"),
                lambda: ro.set(f"{PREFIX}/a", b"x"),
                lambda: ro.delete(f"{PREFIX}/kids/k0"),
                lambda: ro.set_acls(f"{PREFIX}/a", OPEN_ACL_UNSAFE),
                lambda: ro.sync(f"{PREFIX}/a"),
                multi,
            ]
            for write in writes:
                with pytest.raises(NotReadOnlyCallError):
                    write()
            assert ro.get(f"{PREFIX}/a")[0] == b"before"  # the session lives on

            net.heal(victim)
            ens.wait_serving(timeout=SLOW)
            wait_until(lambda: isro(ens, victim) == "rw", "the member to serve read-write", SLOW)
            # The member dropped the read-only session: kazoo reconnects, learns that the
            # session is unknown to the quorum and opens a read-write one.
            wait_until(
                lambda: ro.client_state == KeeperState.CONNECTED,
                "the read-only client to move to a read-write session",
                SLOW,
            )
            assert ro.get(f"{PREFIX}/a")[0] == b"during"
            assert sorted(ro.get_children(f"{PREFIX}/kids")) == ["k0", "k1"]
            ro.create(f"{PREFIX}/after", b"rw")
        with connected(",".join(ens.host(i) for i in majority)) as client:
            client.sync(PREFIX)
            assert client.get(f"{PREFIX}/after")[0] == b"rw"
            assert not client.exists(f"{PREFIX}/new") and not client.exists(f"{PREFIX}/t")


def test_without_read_only_mode_a_cut_off_member_serves_nothing(tmp_path: Path) -> None:
    with partitionable(tmp_path, None) as (ens, net):
        victim, majority = cut(ens, net, "follower")
        wait_until(lambda: ens.mode(victim) == "looking", "the cut-off member to look", SLOW)
        write_meanwhile(ens, majority)
        ro = kazoo_client(ens.host(victim), read_only=True)
        try:
            with pytest.raises(KazooTimeoutError):
                ro.start(timeout=10)  # well past the 2 s after which it would be read-only
        finally:
            ro.stop()
            ro.close()
        assert closed_without_answer(ens, victim, read_only=True)
        assert isro(ens, victim) == "null"
        assert ens.mode(victim) == "looking"
        net.heal(victim)
        ens.wait_serving(timeout=SLOW)
        with connected(ens.host(victim), read_only=True) as client:
            assert client.client_state == KeeperState.CONNECTED
            client.sync(PREFIX)
            assert client.get(f"{PREFIX}/a")[0] == b"during"
