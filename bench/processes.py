"""Process and port helpers the benchmarks share."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

STOP_SECONDS = 5.0


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
