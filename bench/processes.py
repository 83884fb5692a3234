"""Process and port helpers the benchmarks share."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any, TypeVar

STOP_SECONDS = 5.0
RESULTS = Path(__file__).resolve().parent / "results"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
Sizes = TypeVar("Sizes")


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports the kernel reports free (held together, then released)."""
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    try:
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    | " + line for line in text[-lines:])


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after STOP_SECONDS; by PID, and always reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_SECONDS)


def pin(pid: int, cpus: set[int]) -> None:
    """Run every thread of process `pid` on `cpus` only (nothing if it is gone); threads it
    starts later inherit the set from the thread that starts them."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its threads included) so far, from /proc; 0 once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def keep_freed_heap() -> None:
    """Have glibc keep the memory this process frees for its next allocations.

    The benchmarks run their Kafka clients in their own process. By default glibc returns
    the top of the heap to the kernel once 128 KiB of it is free and serves blocks of
    128 KiB and more with fresh mappings, so a client moving 32 KiB values takes a page
    fault for every page of every batch; on these VMs a fresh anonymous page costs about
    0.6 ms/MiB, ten times the copy that fills it, and the figure would be the client's
    allocator. Call before any client exists; it holds for every broker measured.
    """
    libc = ctypes.CDLL("libc.so.6")
    if not (libc.mallopt(M_TRIM_THRESHOLD, 1 << 30) and libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)):
        raise OSError("mallopt refused the heap thresholds")


def print_goals(goals: dict[str, dict[str, Any]]) -> None:
    """One line per goal of a bench: its value, what it asks, and whether it is met."""
    for goal, entry in goals.items():
        verdict = "met" if entry["met"] else "NOT met"
        print(f"goal {goal}: {entry['value']} ({entry['goal']}): {verdict}")


def save_results(name: str, figures: dict[str, Any], line: Any = None) -> None:
    """Write a bench's figures to bench/results/<name>.json and print one JSON line of
    them (or of `line`), the output's last."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures if line is None else line))


def sized_options(
    prog: str, description: str | None, quick: Sizes, full: Sizes, argv: list[str] | None
) -> tuple[Sizes, bool]:
    """The options of the benches that run sized rounds on pinned CPUs: `--quick` (`quick`
    instead of `full`, a dataclass with a `rounds` field), `--rounds N` and `--no-pin`.
    Returns the sizes to run and whether to pin."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--quick", action="store_true", help="fewer records, shorter runs")
    parser.add_argument("--rounds", type=int, help="rounds of each measurement")
    parser.add_argument(
        "--no-pin", dest="pin", action="store_false", help="leave placement to the scheduler"
    )
    args = parser.parse_args(argv)
    sizes = quick if args.quick else full
    if args.rounds:
        sizes = dataclasses.replace(sizes, rounds=args.rounds)  # type: ignore[type-var]
    return sizes, bool(args.pin)
