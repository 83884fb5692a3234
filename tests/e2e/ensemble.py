"""Run a Directlog consensus ensemble as subprocesses for end-to-end tests.

    with Ensemble(tmp_path, size=3) as ens:
        ens.wait_serving()
        KazooClient(hosts=ens.hosts)

Each member runs `python -m services.consensus --id N --config <work dir>/ensemble.yaml`
from the repository root, on ports picked free, with its stdout and stderr in files of the
work directory. Members are stopped by PID (SIGTERM, then SIGKILL after a timeout) and die
with the test process if it dies first.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kazoo.client import KazooClient

from services.consensus.fourletter import ask
from tests.e2e.service_process import REPO_ROOT, _terminate_with_parent
from tests.ports import free_port


class Ensemble:
    def __init__(
        self,
        work_dir: Path,
        size: int = 3,
        *,
        settings: dict[str, Any] | None = None,
        stop_timeout: float = 10.0,
        member_hosts: Mapping[int, str] | None = None,
        command_prefix: Mapping[int, Sequence[str]] | None = None,
        peer_route: Callable[[int, int], str] | None = None,
        secure_client: bool = False,
        member_settings: Mapping[int, dict[str, Any]] | None = None,
        observers: Sequence[int] = (),
    ) -> None:
        """``member_hosts``: the address each member binds (client, peer and metrics ports),
        127.0.0.1 when not given. ``command_prefix``: argv put before a member's command
        (e.g. ``ip netns exec NS``). ``peer_route(i, j)``: the ``host:port`` member ``i``
        dials to reach member ``j`` (e.g. a proxy). ``secure_client``: every member also
        serves a TLS client port (``secure_ports``; ``settings`` must hold client_tls).
        ``member_settings``: settings of one member over ``settings``. With ``peer_route``
        or ``member_settings`` each member gets a config file of its own
        (``ensemble-<i>.yaml``). ``observers``: ids (among 1..size) that run as observers
        (``role: observer``)."""
        self.work_dir = Path(work_dir)
        self.ids = list(range(1, size + 1))
        self.client_ports = {i: free_port() for i in self.ids}
        self.peer_ports = {i: free_port() for i in self.ids}
        self.metrics_ports = {i: free_port() for i in self.ids}
        self.secure_ports = {i: free_port() for i in self.ids} if secure_client else {}
        self.data_dir = self.work_dir / "consensus"
        self.config_path = self.work_dir / "ensemble.yaml"
        self.settings = {
            "data_dir": str(self.data_dir),
            "tick_ms": 50,
            "log_segment_bytes": 4 * 1024 * 1024,
            **(settings or {}),
        }
        self.stop_timeout = stop_timeout
        self.member_hosts = dict(member_hosts or {})
        self.command_prefix = {i: list(p) for i, p in (command_prefix or {}).items()}
        self.peer_route = peer_route
        self.member_settings = {i: dict(m) for i, m in (member_settings or {}).items()}
        self.observers = list(observers)
        assert set(self.observers) < set(self.ids), (observers, self.ids)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.exit_codes: dict[int, list[int]] = {i: [] for i in self.ids}

    # -- addresses ---------------------------------------------------------------------

    @property
    def hosts(self) -> str:
        """The kazoo/ZooKeeper connect string of every member."""
        return ",".join(self.host(i) for i in self.ids)

    def host(self, member: int) -> str:
        return f"{self.address(member)}:{self.client_ports[member]}"

    @property
    def secure_hosts(self) -> str:
        """The connect string of every member's TLS client port."""
        return ",".join(f"{self.address(i)}:{self.secure_ports[i]}" for i in self.ids)

    def address(self, member: int) -> str:
        """The IP address member ``member`` binds."""
        return self.member_hosts.get(member, "127.0.0.1")

    def peer_address(self, member: int) -> str:
        """``host:port`` where member ``member`` accepts its peers."""
        return f"{self.address(member)}:{self.peer_ports[member]}"

    def metrics_url(self, member: int) -> str:
        return f"http://{self.address(member)}:{self.metrics_ports[member]}/metrics"

    def member_config_path(self, member: int) -> Path:
        """The config file member ``member`` is started with."""
        if self.peer_route is None and not self.member_settings:
            return self.config_path
        return self.work_dir / f"ensemble-{member}.yaml"

    def member_dir(self, member: int) -> Path:
        return self.data_dir / str(member)

    # -- lifecycle ---------------------------------------------------------------------

    def write_config(self) -> None:
        members = {
            i: {
                "client": self.host(i),
                "peer": self.peer_address(i),
                "metrics": f"{self.address(i)}:{self.metrics_ports[i]}",
            }
            for i in self.ids
        }
        for i, port in self.secure_ports.items():
            members[i]["secure_client"] = f"{self.address(i)}:{port}"
        for i in self.observers:
            members[i]["role"] = "observer"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump({"members": members, **self.settings}))
        if self.member_config_path(self.ids[0]) != self.config_path:
            route = self.peer_route
            for i in self.ids:
                routed = {
                    j: {**m, "peer": m["peer"] if j == i or route is None else route(i, j)}
                    for j, m in members.items()
                }
                own = {**self.settings, **self.member_settings.get(i, {})}
                self.member_config_path(i).write_text(yaml.safe_dump({"members": routed, **own}))

    def start(self, member: int | None = None) -> Ensemble:
        self.write_config()
        for i in [member] if member is not None else self.ids:
            if i in self.processes:
                raise RuntimeError(f"member {i} already running")
            n = len(self.exit_codes[i]) + 1
            out = open(self.work_dir / f"member-{i}-{n}.log", "wb")  # noqa: SIM115
            command = [*self.command_prefix.get(i, [])]
            command += [sys.executable, "-m", "services.consensus", "--id", str(i)]
            command += ["--config", str(self.member_config_path(i))]
            with out:
                self.processes[i] = subprocess.Popen(
                    command,
                    cwd=REPO_ROOT,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_terminate_with_parent,
                )
        return self

    def stop(self, member: int | None = None, sig: signal.Signals = signal.SIGTERM) -> None:
        for i in [member] if member is not None else list(self.processes):
            process = self.processes.pop(i, None)
            if process is None:
                continue
            process.send_signal(sig)
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(self.stop_timeout)
            self.exit_codes[i].append(process.returncode)

    def kill(self, member: int) -> None:
        self.stop(member, signal.SIGKILL)

    def wipe(self, member: int) -> None:
        """Delete a stopped member's data directory."""
        assert member not in self.processes, "stop the member first"
        shutil.rmtree(self.member_dir(member), ignore_errors=True)

    def running(self) -> list[int]:
        return [i for i, p in self.processes.items() if p.poll() is None]

    # -- state -------------------------------------------------------------------------

    def mode(self, member: int) -> str | None:
        """`leader`, `follower`, `observer`, `looking`, or None when the member does not
        answer."""
        try:
            answer = ask(self.client_ports[member], "mntr", host=self.address(member))
        except OSError:
            return None
        for line in answer.splitlines():
            key, _, value = line.partition("\t")
            if key == "zk_server_state":
                return value
        return None

    def stat(self, member: int) -> dict[str, str]:
        """`mntr` as a dict."""
        answer = ask(self.client_ports[member], "mntr", host=self.address(member))
        return dict(line.split("\t", 1) for line in answer.splitlines() if "\t" in line)

    def wait_serving(self, members: list[int] | None = None, timeout: float = 30.0) -> int:
        """Wait until every given member (default: all running) serves, with exactly one
        leader among them (observers observe); returns the leader's id."""
        deadline = time.monotonic() + timeout
        modes: dict[int, str | None] = {}
        while time.monotonic() < deadline:
            wanted = members if members is not None else self.running()
            modes = {i: self.mode(i) for i in wanted}
            leaders = [i for i, m in modes.items() if m == "leader"]
            serving = ("leader", "follower", "observer")
            if len(leaders) == 1 and all(m in serving for m in modes.values()):
                return leaders[0]
            if len(wanted) == 1 and modes.get(wanted[0]) == "standalone":
                return wanted[0]
            time.sleep(0.05)
        raise TimeoutError(f"ensemble not serving after {timeout}s: {modes}\n{self.logs()}")

    def leader(self) -> int | None:
        for i in self.running():
            if self.mode(i) == "leader":
                return i
        return None

    def logs(self, lines: int = 30) -> str:
        out = []
        for path in sorted(self.work_dir.glob("member-*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    def __enter__(self) -> Ensemble:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll `condition` until it returns something truthy, and return that; on timeout
    the last value goes into the failure message."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout} s: {what} (last: {value!r})")


class KazooClients:
    """Starts KazooClients (on `hosts` unless told others) and stops every one of them,
    closing its session, when the test ends (`close`)."""

    def __init__(self, hosts: str, start_timeout: float = 30.0) -> None:
        self.hosts = hosts
        self.start_timeout = start_timeout
        self.made: list[KazooClient] = []

    def __call__(self, hosts: str | None = None, **kwargs: Any) -> KazooClient:
        client = KazooClient(hosts=hosts or self.hosts, **{"timeout": 10.0, **kwargs})
        self.made.append(client)
        client.start(timeout=self.start_timeout)
        return client

    def close(self) -> None:
        for client in self.made:
            with contextlib.suppress(Exception):
                client.stop()
            client.close()
