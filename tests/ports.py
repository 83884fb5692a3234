"""Ports for servers started by tests."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_HANDED_OUT: set[int] = set()
_PICK = random.SystemRandom()  # not the global generator, which Hypothesis seeds


def _below_ephemeral() -> range:
    """Ports under the range the kernel takes local ports of outgoing connections from
    (ip_local_port_range). A port the kernel offers for bind(0) lies in that range, so
    between the test picking it and its server binding it, any client connecting
    anywhere could take it as its own end: a broker then fails with EADDRINUSE, the more
    often the busier the machine. Nothing takes a port below the range unasked."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    return range(10_000, max(low, 20_000))


_PORTS = _below_ephemeral()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` right now, outside the ephemeral range, drawn at random (so
    two test processes on one machine seldom meet) and never one this process handed out
    before: two servers of one test given the same port would dial each other's."""
    while True:
        port = _PICK.choice(_PORTS)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
