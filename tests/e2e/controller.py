"""Run one Directlog controller as a subprocess for end-to-end tests.

    with Ensemble(tmp_path, size=1) as ens:
        ens.start().wait_serving()
        with ControllerProcess(tmp_path, ens.hosts, settings={"broker_session_timeout_ms": 1500}):
            ...

The controller runs `python -m services.controller --id N --config <dir>/controller.yaml`
from the repository root, with its settings in that YAML file and its stdout and stderr in
files of its directory (`<work dir>/controller-<id>`). Its gRPC and metrics ports are picked
free once, when the object is made: `address` is known before `start()` (to put in a
broker's config) and stays the same across restarts.
It is stopped by PID (SIGTERM, then SIGKILL after a timeout), can be SIGKILLed or paused on
purpose (`kill()`, `pause()` / `resume()`), and dies with the test process if that dies
first.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import yaml
from prometheus_client.parser import text_string_to_metric_families

from directlog.rpc.controller_pb2_grpc import ControllerStub
from tests.e2e.broker import REPO_ROOT, _terminate_with_parent
from tests.ports import free_port

_ADDRESS = re.compile(r"^\s*controller\s+(\S+:\d+)\s*$", re.MULTILINE)
_METRICS = re.compile(r"^\s*metrics\s+(http://\S+)\s*$", re.MULTILINE)

# Quick failover on loopback, with room for a loaded test machine.
TEST_SETTINGS: dict[str, Any] = {"consensus_session_timeout_ms": 2000}


class ControllerStartError(RuntimeError):
    """The controller exited, or printed no banner in time."""


class ControllerProcess:
    def __init__(
        self,
        work_dir: Path,
        consensus: str,
        *,
        controller_id: int = 1,
        settings: dict[str, Any] | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        """``consensus``: the ensemble's connect string (``Ensemble.hosts``). ``settings``:
        ControllerSettings overrides (e.g. ``broker_session_timeout_ms``, ``root``), over
        TEST_SETTINGS."""
        self.controller_id = controller_id
        self.work_dir = Path(work_dir) / f"controller-{controller_id}"
        self.config_path = self.work_dir / "controller.yaml"
        self.stderr_path = self.work_dir / "stderr.log"
        self.settings = {**TEST_SETTINGS, **(settings or {}), "consensus": consensus}
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.port = free_port()
        self.metrics_port = free_port()
        self.address = f"127.0.0.1:{self.port}"  # its gRPC server
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.starts = 0
        self.exit_codes: list[int] = []  # one per stop, in order; negative: killed by signal
        self.killed = False  # a stop had to fall back to SIGKILL

    # Lifecycle ------------------------------------------------------------------------

    def start(self) -> ControllerProcess:
        if self.process is not None:
            raise RuntimeError("controller already running")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.settings), encoding="utf-8")
        self.starts += 1
        stdout_path = self.work_dir / f"stdout-{self.starts}.log"
        command = [
            sys.executable,
            "-m",
            "services.controller",
            "--id",
            str(self.controller_id),
            "--config",
            str(self.config_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--metrics-port",
            str(self.metrics_port),
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("DIRECTLOG_CONTROLLER_CONFIG", None)
        with open(stdout_path, "wb") as stdout, open(self.stderr_path, "ab") as stderr:
            stderr.write(f"----- controller start {self.starts}: {' '.join(command)}\n".encode())
            stderr.flush()
            self.process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                preexec_fn=_terminate_with_parent,
            )
        deadline = time.monotonic() + self.start_timeout
        while True:
            banner = stdout_path.read_text(encoding="utf-8", errors="replace")
            address, metrics = _ADDRESS.search(banner), _METRICS.search(banner)
            if address and metrics:
                assert (address.group(1), metrics.group(1)) == (self.address, self.metrics_url)
                return self
            code = self.process.poll()
            if code is not None:
                self.process = None
                self.exit_codes.append(code)
                raise ControllerStartError(
                    f"controller exited with code {code} before its banner\n"
                    f"stdout:\n{banner}\nstderr:\n{self.stderr_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ControllerStartError(
                    f"no banner within {self.start_timeout} s\n"
                    f"stdout:\n{banner}\nstderr:\n{self.stderr_tail()}"
                )
            time.sleep(0.02)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int | None:
        """``sig`` by PID, up to stop_timeout s to exit, then SIGKILL. The exit code (None
        if it was not running)."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            os.kill(process.pid, sig)
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.killed = True
                os.kill(process.pid, signal.SIGKILL)
                process.wait(self.stop_timeout)
        code = process.returncode
        self.exit_codes.append(code)
        return code

    def kill(self) -> int | None:
        """SIGKILL: no clean step-down, its consensus session has to expire."""
        return self.stop(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: it stays alive but silent, as in a long GC pause or a frozen VM."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def restart(self) -> ControllerProcess:
        """Stop cleanly and start again, on the same ports."""
        self.stop()
        return self.start()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def channel(self) -> grpc.Channel:
        """A new channel to its gRPC server; the caller closes it."""
        return grpc.insecure_channel(self.address)

    def stub(self, channel: grpc.Channel) -> ControllerStub:
        return ControllerStub(channel)  # type: ignore[no-untyped-call]

    # Metrics and logs -------------------------------------------------------------------

    def sample(self, name: str, **labels: str) -> float | None:
        """The value of the one sample called ``name`` whose labels include ``labels``."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text = response.read().decode("utf-8")
        found = [
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        if len(found) > 1:
            raise AssertionError(f"{len(found)} samples {name} with labels {labels}")
        return found[0] if found else None

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def stderr_tail(self, lines: int = 80) -> str:
        return "\n".join(self.stderr_text().splitlines()[-lines:])

    def __enter__(self) -> ControllerProcess:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
