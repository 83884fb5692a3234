"""Run one Directlog broker as a subprocess for end-to-end tests.

    with BrokerProcess(tmp_path, controllers="127.0.0.1:9190") as broker:
        Producer({"bootstrap.servers": broker.bootstrap})

A broker needs a controller (tests/e2e/cluster.py starts the whole set). It runs
`python -m services.broker` from the repository root on free ports, with its data in
`<work dir>/data`; its stdout and stderr go to files in the work directory (never to pipes
a test could forget to drain), so a failing test can show `stderr_tail()`.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[2]

PR_SET_PDEATHSIG = 1
_BOOTSTRAP = re.compile(r"^\s*bootstrap servers\s+(\S+:\d+)\s*$", re.MULTILINE)
_METRICS = re.compile(r"^\s*metrics\s+(http://\S+)\s*$", re.MULTILINE)


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM it if the test process dies without stopping it
    (a hard pytest timeout, a crash), so no broker outlives its tests (Linux only)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class BrokerStartError(RuntimeError):
    """The broker exited, or printed no banner in time."""


class BrokerProcess:
    def __init__(
        self,
        work_dir: Path,
        *,
        controllers: str,
        node_id: int = 0,
        settings: dict[str, Any] | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """``settings``: BrokerSettings fields, written to a YAML file the broker reads."""
        self.work_dir = Path(work_dir)
        self.node_id = node_id
        self.controllers = controllers
        self.settings = dict(settings or {})
        self.data_dir = self.work_dir / "data"
        self.stderr_path = self.work_dir / "broker-stderr.log"
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self.bootstrap = ""
        self.metrics_url = ""
        self.starts = 0
        self.exit_codes: list[int] = []  # one per stop, in order; negative: killed by signal
        self.killed = False  # a stop had to fall back to SIGKILL

    # Lifecycle ------------------------------------------------------------------------

    def start(self) -> BrokerProcess:
        if self.process is not None:
            raise RuntimeError("broker already running")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        stdout_path = self.work_dir / f"broker-stdout-{self.starts}.log"
        command = [
            sys.executable,
            "-m",
            "services.broker",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--data-dir",
            str(self.data_dir),
            "--node-id",
            str(self.node_id),
            "--controllers",
            self.controllers,
            *self.extra_args,
        ]
        if self.settings:
            config = self.work_dir / "broker.yaml"
            config.write_text(yaml.safe_dump(self.settings), encoding="utf-8")
            command += ["--config", str(config)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with (
            open(stdout_path, "wb") as stdout,
            open(self.stderr_path, "ab") as stderr,
        ):
            stderr.write(f"----- broker start {self.starts}: {' '.join(command)}\n".encode())
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
            bootstrap, metrics = _BOOTSTRAP.search(banner), _METRICS.search(banner)
            if bootstrap and metrics:
                self.bootstrap, self.metrics_url = bootstrap.group(1), metrics.group(1)
                return self
            code = self.process.poll()
            if code is not None:
                self.process = None
                self.exit_codes.append(code)
                raise BrokerStartError(
                    f"broker exited with code {code} before its banner\n"
                    f"stdout:\n{banner}\nstderr:\n{self.stderr_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerStartError(
                    f"no banner within {self.start_timeout} s\n"
                    f"stdout:\n{banner}\nstderr:\n{self.stderr_tail()}"
                )
            time.sleep(0.02)

    def stop(self) -> int | None:
        """SIGTERM by PID, up to stop_timeout s to exit, then SIGKILL. The exit code (None
        if it was not running)."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.killed = True
                os.kill(process.pid, signal.SIGKILL)
                process.wait(self.stop_timeout)
        code = process.returncode
        self.exit_codes.append(code)
        return code

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send `sig`: SIGKILL (a crash) reaps the process; SIGSTOP and SIGCONT pause and
        resume it."""
        process = self.process
        if process is None:
            return
        os.kill(process.pid, sig)
        if sig in (signal.SIGSTOP, signal.SIGCONT):
            return
        self.process = None
        process.wait(self.stop_timeout)
        self.exit_codes.append(process.returncode)

    def restart(self) -> BrokerProcess:
        """Stop cleanly and start again on the same data dir (the ports may change)."""
        self.stop()
        return self.start()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def port(self) -> int:
        return int(self.bootstrap.rsplit(":", 1)[1])

    # Metrics --------------------------------------------------------------------------

    def scrape(self) -> list[Metric]:
        """The /metrics page, parsed by Prometheus' own text-format parser."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text = response.read().decode("utf-8")
        return list(text_string_to_metric_families(text))

    def sample(self, name: str, **labels: str) -> float | None:
        """The value of the one sample called `name` (as exposed: counters end in _total)
        whose labels include `labels`; None if there is none."""
        found = [
            s.value
            for family in self.scrape()
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        if len(found) > 1:
            raise AssertionError(f"{len(found)} samples {name} with labels {labels}")
        return found[0] if found else None

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples called `name` whose labels include `labels`."""
        return sum(
            s.value
            for family in self.scrape()
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    # What the broker stored -----------------------------------------------------------

    def stored_batches(self, topic: str, partition: int = 0) -> list[tuple[int, int]]:
        """(compression codec id, record count) of every record batch in the partition's
        segment files, read straight from disk (record batch v2 headers): what the broker
        wrote, whatever the clients see."""
        batches = []
        for segment in sorted((self.data_dir / f"{topic}-{partition}").glob("*.log")):
            data = segment.read_bytes()
            position = 0
            while position + 61 <= len(data):
                (length,) = struct.unpack_from(">i", data, position + 8)
                if length <= 0:
                    break  # preallocated, never written
                if data[position + 16] != 2:
                    raise AssertionError(f"{segment}@{position}: not a v2 record batch")
                (attributes,) = struct.unpack_from(">h", data, position + 21)
                (records,) = struct.unpack_from(">i", data, position + 57)
                batches.append((attributes & 0x7, records))
                position += 12 + length
        return batches

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def stderr_tail(self, lines: int = 80) -> str:
        return "\n".join(self.stderr_text().splitlines()[-lines:])

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
