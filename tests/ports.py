"""Ports for servers started by tests."""

from __future__ import annotations

import socket

_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel reports free on ``host`` right now, and never one this process
    handed out before: the kernel may offer a port again as soon as it is released, and
    two servers of one test given the same port would dial each other's."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
