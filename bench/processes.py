"""Process and port helpers the benchmarks share."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

STOP_SECONDS = 5.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its threads included) so far, from /proc; 0 once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
