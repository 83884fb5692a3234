"""One Directlog service process for end-to-end tests: started from the repository root,
ready when its banner names its addresses, stopped by PID, and killed with the test process
if that dies first.

Its stdout (the banner) and stderr go to files in its work directory (never to pipes a test
could forget to drain), so a failing test can show `stderr_tail()`. Subclasses say how the
service is started (`command`) and what to read from the banner (`banner_read`).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[2]

PR_SET_PDEATHSIG = 1
METRICS_LINE = re.compile(r"^\s*metrics\s+(http://\S+)\s*$", re.MULTILINE)


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM it if the test process dies without stopping it
    (a hard pytest timeout, a crash), so no service outlives its tests (Linux only)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class StartError(RuntimeError):
    """The service exited, or printed no banner in time."""


class ServiceProcess(ABC):
    name = "service"

    def __init__(
        self,
        work_dir: Path,
        *,
        command_prefix: Sequence[str] = (),
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        """``command_prefix``: argv put before its command (e.g. ``ip netns exec NS``)."""
        self.work_dir = Path(work_dir)
        self.stderr_path = self.work_dir / "stderr.log"
        self.command_prefix = list(command_prefix)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.metrics_url = ""
        self.starts = 0
        self.exit_codes: list[int] = []  # one per stop, in order; negative: killed by signal
        self.killed = False  # a stop had to fall back to SIGKILL

    @abstractmethod
    def command(self) -> list[str]:
        """The service's argv (after the prefix); files it needs are written here."""

    @abstractmethod
    def banner_read(self, banner: str) -> bool:
        """Take what the service printed so far; True once it names all it must."""

    # Lifecycle ------------------------------------------------------------------------

    def start(self) -> Self:
        if self.process is not None:
            raise RuntimeError(f"{self.name} already running")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        stdout_path = self.work_dir / f"stdout-{self.starts}.log"
        command = [*self.command_prefix, *self.command()]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(stdout_path, "wb") as stdout, open(self.stderr_path, "ab") as stderr:
            stderr.write(f"----- {self.name} start {self.starts}: {' '.join(command)}\n".encode())
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
            if self.banner_read(banner):
                return self
            code = self.process.poll()
            if code is not None:
                self.process = None
                self.exit_codes.append(code)
                raise StartError(
                    f"{self.name} exited with code {code} before its banner\n"
                    f"stdout:\n{banner}\nstderr:\n{self.stderr_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise StartError(
                    f"{self.name}: no banner within {self.start_timeout} s\n"
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
        """SIGKILL: a crash, nothing cleaned up."""
        return self.stop(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: alive but silent, as in a long GC pause or a frozen VM."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def restart(self) -> Self:
        self.stop()
        return self.start()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # Metrics and logs -------------------------------------------------------------------

    def scrape(self) -> list[Metric]:
        """The /metrics page, parsed by Prometheus' own text-format parser."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text = response.read().decode("utf-8")
        return list(text_string_to_metric_families(text))

    def sample(self, name: str, **labels: str) -> float | None:
        """The value of the one sample called `name` (as exposed: counters end in _total)
        whose labels include `labels`; None if there is none."""
        found = self._samples(name, labels)
        if len(found) > 1:
            raise AssertionError(f"{len(found)} samples {name} with labels {labels}")
        return found[0] if found else None

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples called `name` whose labels include `labels`."""
        return sum(self._samples(name, labels))

    def _samples(self, name: str, labels: dict[str, str]) -> list[float]:
        return [
            s.value
            for family in self.scrape()
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def stderr_tail(self, lines: int = 80) -> str:
        return "\n".join(self.stderr_text().splitlines()[-lines:])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
