"""Network namespaces for ensemble members, so a test can cut a member off its peers.

    with MemberNetworks([1, 2, 3]) as net:
        Ensemble(tmp_path, member_hosts=net.hosts, command_prefix=net.prefixes)
        net.isolate(3)   # member 3 keeps its clients but no longer reaches 1 and 2
        net.heal(3)

Each member runs in a namespace of its own with one address, 10.77.K.<id>. A veth pair
links the namespace to the root namespace (the test process and its clients); a full mesh
of veth pairs links the member namespaces to each other, each with a host route to the
peer at its other end. No bridge and no forwarding are involved, so the root namespace's
firewall never sees member traffic. ``isolate`` takes a member's mesh links down: its peer
connections go silent (no reset) exactly as across a real partition, while clients in the
root namespace still reach it. Needs root and ``ip`` (Debian's iproute2).
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import shutil
import subprocess
from types import TracebackType

import pytest

_PREFIX = "dlzk"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@functools.cache
def unavailable() -> str | None:
    """Why member namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "no `ip` command (Debian package iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"{_PREFIX}-probe-{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except (subprocess.CalledProcessError, OSError) as e:
        detail = e.stderr.decode(errors="replace").strip() if hasattr(e, "stderr") else e
        return f"cannot create a network namespace: {detail}"
    try:
        _ip("-n", name, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
    except subprocess.CalledProcessError as e:
        return f"cannot create a veth pair: {e.stderr.decode(errors='replace').strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return None


def require() -> None:
    """Skip the calling test where namespaces cannot be made, except under CI (`make test`
    runs as root and installs iproute2 there), where that is a failure: a partition test
    must not silently stop running."""
    why = unavailable()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"network namespaces unavailable under CI: {why}")
    pytest.skip(f"network namespaces unavailable here: {why}")


def _free_subnet() -> int:
    used = (
        subprocess.run(
            ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=10
        ).stdout
        + subprocess.run(
            ["ip", "-4", "route", "show"], capture_output=True, text=True, timeout=10
        ).stdout
    )
    candidates = [k for k in range(1, 255) if f"10.77.{k}." not in used]
    if not candidates:
        raise RuntimeError("no free 10.77.K.0/24 subnet")
    return random.choice(candidates)


_INSTANCES = itertools.count()


class MemberNetworks:
    def __init__(self, members: list[int]) -> None:
        assert all(1 <= i <= 99 for i in members), members
        self.members = list(members)
        # Unique per instance in this process (device names must not meet a previous
        # test's, whose namespaces the kernel may still be tearing down).
        self.tag = f"{os.getpid() % 100000:05d}{next(_INSTANCES) % 100:02d}"
        self.subnet = _free_subnet()
        self._made: list[str] = []

    def namespace(self, member: int) -> str:
        return f"{_PREFIX}-{self.tag}-{member}"

    def address(self, member: int) -> str:
        return f"10.77.{self.subnet}.{member}"

    @property
    def hosts(self) -> dict[int, str]:
        return {i: self.address(i) for i in self.members}

    @property
    def prefixes(self) -> dict[int, list[str]]:
        return {i: ["ip", "netns", "exec", self.namespace(i)] for i in self.members}

    def setup(self) -> MemberNetworks:
        try:
            for i in self.members:
                ns = self.namespace(i)
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                # The client link: root <-> member, point to point.
                outer = f"dl{self.tag}c{i}"
                root_side = f"10.77.{self.subnet}.{100 + i}"
                _ip("link", "add", outer, "type", "veth", "peer", "name", "cli", "netns", ns)
                _ip("addr", "add", root_side, "peer", f"{self.address(i)}/32", "dev", outer)
                _ip("link", "set", outer, "up")
                _ip(
                    "-n",
                    ns,
                    "addr",
                    "add",
                    self.address(i),
                    "peer",
                    f"{root_side}/32",
                    "dev",
                    "cli",
                )
                _ip("-n", ns, "link", "set", "cli", "up")
            for i, j in itertools.combinations(self.members, 2):
                ns_i, ns_j = self.namespace(i), self.namespace(j)
                _ip(
                    "link", "add", f"p{j}", "netns", ns_i, "type", "veth",
                    "peer", "name", f"p{i}", "netns", ns_j,
                )  # fmt: skip
                for here, there in ((i, j), (j, i)):
                    ns = self.namespace(here)
                    _ip("-n", ns, "link", "set", f"p{there}", "up")
                    _ip(
                        "-n", ns, "route", "add", f"{self.address(there)}/32",
                        "dev", f"p{there}", "src", self.address(here),
                    )  # fmt: skip
        except BaseException:
            self.teardown()
            raise
        return self

    def _mesh(self, member: int, state: str) -> None:
        for other in self.members:
            if other != member:
                _ip("-n", self.namespace(member), "link", "set", f"p{other}", state)
                _ip("-n", self.namespace(other), "link", "set", f"p{member}", state)

    def isolate(self, member: int) -> None:
        """Cut ``member`` off every other member; its clients still reach it."""
        self._mesh(member, "down")

    def heal(self, member: int) -> None:
        self._mesh(member, "up")
        for other in self.members:  # link up drops the device's routes: put them back
            if other != member:
                for here, there in ((member, other), (other, member)):
                    route = [f"{self.address(there)}/32", "dev", f"p{there}"]
                    route += ["src", self.address(here)]
                    _ip("-n", self.namespace(here), "route", "replace", *route)

    def teardown(self) -> None:
        for i in self.members:  # deleting a veth end removes its peer at once
            subprocess.run(["ip", "link", "del", f"dl{self.tag}c{i}"], capture_output=True)
        while self._made:
            subprocess.run(["ip", "netns", "del", self._made.pop()], capture_output=True)

    def __enter__(self) -> MemberNetworks:
        return self.setup()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.teardown()
