"""Keeps named processes running, the way a kubelet does with ``restartPolicy: Always``.

`make run` (services/local_cluster.py) runs every Directlog service as a local process. When
one exits (it crashed, or a user killed a broker to watch a failover) the others keep serving
and it starts again with the same command after a back-off: the kubelet's CrashLoopBackOff
scaled for a laptop, 1 s doubling per consecutive crash up to 30 s, starting over once a
process has run for 60 s. Only `Supervisor.stop` ends them, tier by tier.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

INITIAL_BACKOFF = 1.0  # seconds before the first restart
MAX_BACKOFF = 30.0  # the back-off doubles with each consecutive crash up to this
RESET_AFTER = 60.0  # a process that ran this long starts over at INITIAL_BACKOFF
STOP_TIMEOUT = 15.0  # seconds a tier gets between SIGTERM and SIGKILL
POLL_INTERVAL = 0.2  # seconds between two looks at the processes in Supervisor.run


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """One supervised process: the name its log lines use, what it runs, and its tier.

    Processes stop tier by tier, highest first, so a process's tier is above the tiers of
    the processes it depends on. ``env`` None inherits the supervisor's environment.
    """

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] | None = None
    tier: int = 0


@dataclass(slots=True)
class _Supervised:
    spec: ProcessSpec
    backoff: float  # the delay before its next restart
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None  # set while it waits out its back-off


def describe_exit(returncode: int) -> str:
    """How a process ended, as Popen's returncode says it: negative is the killing signal."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def _log_to_stderr(line: str) -> None:
    print(f"supervisor: {line}", file=sys.stderr, flush=True)


class Supervisor:
    """Starts processes, restarts each one that exits after its back-off, stops them all.

    A process is known by its name, so its restart never depends on the others. ``clock``
    times back-offs and uptimes (tests step a fake one); stopping always waits in real time.
    """

    def __init__(
        self,
        *,
        initial_backoff: float = INITIAL_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        reset_after: float = RESET_AFTER,
        stop_timeout: float = STOP_TIMEOUT,
        poll_interval: float = POLL_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] = _log_to_stderr,
    ) -> None:
        if not 0 < initial_backoff <= max_backoff:
            raise ValueError(f"back-off {initial_backoff} s up to {max_backoff} s")
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._reset_after = reset_after
        self._stop_timeout = stop_timeout
        self._poll_interval = poll_interval
        self._clock = clock
        self._log = log
        self._supervised: dict[str, _Supervised] = {}
        self._stop_requested = False

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def request_stop(self) -> None:
        """Makes `run` stop everything. Safe in a signal handler: it only sets a flag."""
        self._stop_requested = True

    def start(self, specs: Iterable[ProcessSpec]) -> None:
        """Starts each process now, in the order given, and keeps it running from then on."""
        for spec in specs:
            if spec.name in self._supervised:
                raise ValueError(f"{spec.name!r} is already supervised")
            supervised = _Supervised(spec, backoff=self._initial_backoff)
            self._supervised[spec.name] = supervised
            self._spawn(supervised)

    def poll_once(self) -> None:
        """Notes every process that exited and restarts every one whose back-off is over."""
        for supervised in self._supervised.values():
            process = supervised.process
            if process is not None:
                returncode = process.poll()
                if returncode is not None:
                    self._ended(supervised, f"(pid {process.pid}) {describe_exit(returncode)}")
            elif supervised.restart_at is not None and self._clock() >= supervised.restart_at:
                self._spawn(supervised)

    def run(self) -> None:
        """Keeps the processes running until `request_stop`, then stops them all."""
        while not self._stop_requested:
            self.poll_once()
            time.sleep(self._poll_interval)
        self.stop()

    def stop(self) -> None:
        """Stops every process, highest tier first, and cancels every pending restart.

        A tier gets SIGTERM, then up to ``stop_timeout`` seconds to exit, then SIGKILL; the
        next tier is signalled once it is gone, so nothing loses what it depends on while it
        shuts down. Every process is reaped before this returns.
        """
        self._stop_requested = True
        for tier in sorted({s.spec.tier for s in self._supervised.values()}, reverse=True):
            processes = []
            for supervised in self._supervised.values():
                if supervised.spec.tier == tier:
                    supervised.restart_at = None
                    if supervised.process is not None:
                        processes.append(supervised.process)
                        supervised.process = None
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self._stop_timeout
            for process in processes:
                try:
                    process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    def _spawn(self, supervised: _Supervised) -> None:
        supervised.restart_at = None
        supervised.started_at = self._clock()
        try:
            # In a process group of its own: a Ctrl-C at the terminal reaches only the
            # supervisor, which then stops the processes in tier order.
            supervised.process = subprocess.Popen(
                supervised.spec.command,
                stdin=subprocess.DEVNULL,
                env=supervised.spec.env,
                process_group=0,
            )
        except OSError as error:  # no such program, or fork failed: back off as on a crash
            self._ended(supervised, f"could not start ({error})")

    def _ended(self, supervised: _Supervised, how: str) -> None:
        now = self._clock()
        supervised.process = None
        if now - supervised.started_at >= self._reset_after:
            supervised.backoff = self._initial_backoff
        delay = supervised.backoff
        supervised.backoff = min(delay * 2, self._max_backoff)
        supervised.restart_at = now + delay
        self._log(f"{supervised.spec.name} {how}; restarting in {delay:.1f} s")
