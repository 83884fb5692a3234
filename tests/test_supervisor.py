"""The supervisor of `make run` against real, tiny child processes (no services, no ports).

Each child appends its PID to a "starts" file when it starts, so a test counts starts and
knows every PID. Back-off tests step a fake clock, so they assert on exact delays without
timing anything; waits for real processes have generous deadlines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from services.supervisor import ProcessSpec, Supervisor

ROOT = Path(__file__).resolve().parents[1]
DEADLINE = 15.0  # seconds to wait for a child to start or exit on a loaded machine

CHILD = """\
import os, signal, sys, time
starts, mode = sys.argv[1], sys.argv[2]
if mode in ("term-log", "stubborn"):  # note SIGTERM in a file; a stubborn child then stays
    stops, name = sys.argv[3], sys.argv[4]
    def on_term(signum, frame):
        with open(stops, "a") as f:
            f.write(name + "\\n")
        if mode == "term-log":
            sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
with open(starts, "a") as f:
    f.write(f"{os.getpid()}\\n")
if mode == "exit":
    sys.exit(int(sys.argv[3]))
time.sleep(60)  # bounded, so a failed test leaks nothing for long
"""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Children:
    """Builds child specs under one directory and reads back what the children wrote."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.script = directory / "child.py"
        self.script.write_text(CHILD, encoding="utf-8")
        self.stops = directory / "stops"

    def spec(self, name: str, mode: str, *args: str, tier: int = 0) -> ProcessSpec:
        if mode in ("term-log", "stubborn"):
            args = (str(self.stops), name)
        command = (sys.executable, str(self.script), str(self._starts(name)), mode, *args)
        return ProcessSpec(name, command, tier=tier)

    def starts(self, name: str) -> list[int]:
        """The PID of each start of ``name`` so far (complete lines only)."""
        path = self._starts(name)
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        return [int(line) for line in text.split("\n")[:-1]]

    def stopped(self) -> list[str]:
        """The names of the children that got SIGTERM, in order."""
        return self.stops.read_text(encoding="utf-8").splitlines() if self.stops.exists() else []

    def _starts(self, name: str) -> Path:
        return self.directory / f"{name.replace(' ', '-')}.starts"


_BEFORE: set[int] = set()  # children alive when the test began (another fixture's)


@pytest.fixture(autouse=True)
def _others_first() -> None:
    """Children other tests left running (a session-wide JVM, say) are not the test's."""
    _BEFORE.clear()
    _BEFORE.update(children())


def children() -> set[int]:
    """Our child processes the test made, zombies included: a reaped child is gone from
    this set."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                found.add(int(entry.name))
    return found - _BEFORE


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_until(supervisor: Supervisor, condition: Callable[[], bool]) -> None:
    """Polls the supervisor until ``condition`` holds."""
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        supervisor.poll_once()
        time.sleep(0.02)


def wait_for_count(supervisor: Supervisor, count: Callable[[], int], expected: int) -> None:
    wait_until(supervisor, lambda: count() == expected)


@pytest.fixture
def kids(tmp_path: Path) -> Children:
    return Children(tmp_path)


Make = Callable[..., tuple[Supervisor, list[str]]]


@pytest.fixture
def make_supervisor() -> Iterator[Make]:
    """Supervisors with the log lines they wrote, stopped after the test, pass or fail."""
    made: list[Supervisor] = []

    def make(**options: Any) -> tuple[Supervisor, list[str]]:
        lines: list[str] = []
        supervisor = Supervisor(log=lines.append, **{"stop_timeout": 2.0, **options})
        made.append(supervisor)
        return supervisor, lines

    yield make
    for supervisor in made:
        supervisor.stop()


def test_a_crashed_process_restarts_after_its_backoff_and_the_others_keep_running(
    kids: Children, make_supervisor: Make
) -> None:
    clock = FakeClock()
    supervisor, lines = make_supervisor(clock=clock)
    supervisor.start(
        [
            kids.spec("consensus 1", "sleep"),
            kids.spec("controller 0", "sleep", tier=1),
            kids.spec("broker 1", "exit", "3", tier=2),
        ]
    )
    wait_until(supervisor, lambda: len(lines) == 1)
    [crashed] = kids.starts("broker 1")
    assert lines == [f"broker 1 (pid {crashed}) exited with code 3; restarting in 1.0 s"]
    steady = {*kids.starts("consensus 1"), *kids.starts("controller 0")}
    assert children() == steady  # the crashed one is reaped and waits out its back-off

    clock.advance(0.9)
    supervisor.poll_once()
    assert children() == steady
    clock.advance(0.1)
    wait_until(supervisor, lambda: len(kids.starts("broker 1")) == 2)
    assert kids.starts("broker 1")[1] != crashed
    assert {*kids.starts("consensus 1"), *kids.starts("controller 0")} == steady
    assert steady <= children()


def test_backoff_doubles_with_each_consecutive_crash_up_to_the_cap(
    kids: Children, make_supervisor: Make
) -> None:
    clock = FakeClock()
    supervisor, lines = make_supervisor(clock=clock)  # the defaults: 1 s doubling up to 30 s
    supervisor.start([kids.spec("broker 0", "exit", "1")])
    for crash, delay in enumerate([1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0], start=1):
        wait_for_count(supervisor, lambda: len(lines), crash)
        assert lines[-1].endswith(f"exited with code 1; restarting in {delay:.1f} s")
        clock.advance(delay - 0.01)
        supervisor.poll_once()
        assert children() == set()
        assert len(kids.starts("broker 0")) == crash
        clock.advance(0.01)
        wait_for_count(supervisor, lambda: len(kids.starts("broker 0")), crash + 1)


def test_backoff_starts_over_once_a_process_ran_long_enough(
    kids: Children, make_supervisor: Make
) -> None:
    clock = FakeClock()
    supervisor, lines = make_supervisor(clock=clock, initial_backoff=1.0, reset_after=60.0)
    supervisor.start([kids.spec("broker 0", "sleep")])
    # (how long it runs before it is killed, the back-off that follows)
    for run, (uptime, delay) in enumerate(
        [(0.0, 1.0), (0.0, 2.0), (59.0, 4.0), (60.0, 1.0), (0.0, 2.0)], start=1
    ):
        wait_for_count(supervisor, lambda: len(kids.starts("broker 0")), run)
        clock.advance(uptime)
        os.kill(kids.starts("broker 0")[-1], signal.SIGKILL)
        wait_for_count(supervisor, lambda: len(lines), run)
        assert lines[-1].endswith(f"killed by SIGKILL; restarting in {delay:.1f} s")
        clock.advance(delay)


def test_a_process_killed_by_sigkill_is_restarted_and_the_log_names_the_signal(
    kids: Children, make_supervisor: Make
) -> None:
    supervisor, lines = make_supervisor(initial_backoff=0.1, max_backoff=0.4)  # the real clock
    supervisor.start([kids.spec("broker 0", "sleep"), kids.spec("broker 1", "sleep")])
    wait_until(supervisor, lambda: bool(kids.starts("broker 0") and kids.starts("broker 1")))
    [victim] = kids.starts("broker 1")
    bystander = kids.starts("broker 0")
    os.kill(victim, signal.SIGKILL)
    wait_until(supervisor, lambda: len(kids.starts("broker 1")) == 2)
    assert lines == [f"broker 1 (pid {victim}) killed by SIGKILL; restarting in 0.1 s"]
    assert gone(victim)
    assert kids.starts("broker 0") == bystander
    assert children() == {*bystander, kids.starts("broker 1")[1]}


def test_stop_goes_tier_by_tier_kills_the_stubborn_and_cancels_pending_restarts(
    kids: Children, make_supervisor: Make
) -> None:
    clock = FakeClock()
    supervisor, lines = make_supervisor(clock=clock, stop_timeout=0.5)
    names = ["consensus 1", "controller 0", "broker 0", "broker 1", "crasher"]
    supervisor.start(
        [
            kids.spec("consensus 1", "term-log", tier=0),
            kids.spec("controller 0", "term-log", tier=1),
            kids.spec("broker 0", "stubborn", tier=2),  # ignores SIGTERM: gets SIGKILL
            kids.spec("broker 1", "term-log", tier=2),
            kids.spec("crasher", "exit", "1", tier=2),
        ]
    )
    wait_until(supervisor, lambda: all(kids.starts(name) for name in names) and bool(lines))
    pids = [pid for name in names for pid in kids.starts(name)]

    supervisor.stop()
    assert children() == set()
    assert all(gone(pid) for pid in pids)
    stopped = kids.stopped()
    assert sorted(stopped[:2]) == ["broker 0", "broker 1"]
    assert stopped[2:] == ["controller 0", "consensus 1"]

    clock.advance(100.0)  # far past the crasher's back-off: its restart was cancelled
    supervisor.poll_once()
    assert children() == set()
    assert len(kids.starts("crasher")) == 1
    assert len(lines) == 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_supervisor_stops_everything_and_it_exits_0(
    kids: Children, signum: signal.Signals
) -> None:
    """Drives `Supervisor.run` as `services.local_cluster` does, in a process of its own."""
    code = (
        "import signal, sys\n"
        "from services.supervisor import ProcessSpec, Supervisor\n"
        "supervisor = Supervisor(poll_interval=0.05, stop_timeout=2.0)\n"
        "signal.signal(signal.SIGINT, lambda signum, frame: supervisor.request_stop())\n"
        "signal.signal(signal.SIGTERM, lambda signum, frame: supervisor.request_stop())\n"
        f"supervisor.start([{kids.spec('a', 'sleep')!r}, {kids.spec('b', 'sleep', tier=1)!r}])\n"
        "supervisor.run()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        deadline = time.monotonic() + DEADLINE
        while not (kids.starts("a") and kids.starts("b")):
            assert process.poll() is None, "the supervisor exited early"
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.02)
        pids = kids.starts("a") + kids.starts("b")
        process.send_signal(signum)
        assert process.wait(DEADLINE) == 0
        assert all(gone(pid) for pid in pids)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_command_that_cannot_start_backs_off_like_a_crash(
    kids: Children, make_supervisor: Make
) -> None:
    clock = FakeClock()
    supervisor, lines = make_supervisor(clock=clock)
    missing = str(kids.directory / "no-such-program")
    supervisor.start([ProcessSpec("ghost", (missing,)), kids.spec("broker 0", "sleep")])
    assert lines[0].startswith("ghost could not start (")
    assert lines[0].endswith("; restarting in 1.0 s")
    clock.advance(1.0)
    supervisor.poll_once()
    assert lines[1].endswith("; restarting in 2.0 s")
    wait_until(supervisor, lambda: bool(kids.starts("broker 0")))
    assert children() == set(kids.starts("broker 0"))


def test_names_are_unique(kids: Children, make_supervisor: Make) -> None:
    supervisor, _ = make_supervisor()
    with pytest.raises(ValueError, match="already supervised"):
        supervisor.start([kids.spec("broker 0", "exit", "0"), kids.spec("broker 0", "exit", "0")])
