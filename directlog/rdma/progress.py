"""The software providers' progress thread: one per context, over every connection.

It serves the tcp transport (reads frames, executes the peer's ops on local memory, sends
answers, completes local ops as answers arrive) and watches shm connections' sockets, whose
end means the peer is gone. One epoll, level-triggered; other threads change a connection's
interest with epoll.modify (safe while the loop waits) and hand work to the loop with kick().
Only this thread closes a registered socket, so a file descriptor is never reused under it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

READ = select.EPOLLIN
WRITE = select.EPOLLOUT
HANGUP = select.EPOLLHUP | select.EPOLLERR


def wait_readable(files: Sequence[int | socket.socket], timeout: float | None) -> set[int]:
    """The descriptors among `files` readable within `timeout` seconds (None: no limit).
    poll, not select: select refuses descriptors above 1023, and a broker holding many
    segment files and connections passes that soon."""
    poller = select.poll()
    for file in files:
        poller.register(file, select.POLLIN)
    return {fd for fd, _ in poller.poll(None if timeout is None else max(timeout, 0) * 1000)}


class Connection(ABC):
    """What the engine drives. Every method runs on the progress thread."""

    @abstractmethod
    def fileno(self) -> int: ...

    @abstractmethod
    def interest(self) -> int:
        """The epoll events wanted now (READ, WRITE or both; 0 pauses the connection)."""

    @abstractmethod
    def on_events(self, events: int) -> None: ...

    @abstractmethod
    def on_kick(self) -> None:
        """Another thread asked for attention (see ProgressEngine.kick)."""

    @abstractmethod
    def deadline(self) -> float | None:
        """A monotonic time at which on_deadline() must run, if any."""

    @abstractmethod
    def on_deadline(self) -> None:
        """The deadline passed."""

    @abstractmethod
    def fail(self, reason: str) -> None:
        """Tear the connection down after an unexpected error."""


class ProgressEngine:
    """The loop. Started on the first add(); stop() joins it."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake, READ)
        self._connections: dict[int, Connection] = {}
        self._kicks: deque[Connection] = deque()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def add(self, connection: Connection) -> None:
        with self._lock:
            if self._stopping:
                raise RuntimeError("progress engine stopped")
            fd = connection.fileno()
            self._connections[fd] = connection
            self._epoll.register(fd, connection.interest())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="directlog-rdma-progress", daemon=True
                )
                self._thread.start()

    def update(self, connection: Connection) -> None:
        """Re-read the connection's interest (call with the connection's own lock held, so
        two updates cannot land in the wrong order)."""
        fd = connection.fileno()
        if self._connections.get(fd) is connection:
            self._epoll.modify(fd, connection.interest())

    def remove(self, connection: Connection) -> None:
        """Unregister (progress thread only, before it closes the socket)."""
        fd = connection.fileno()
        if self._connections.get(fd) is connection:
            with self._lock:
                del self._connections[fd]
            self._epoll.unregister(fd)

    def kick(self, connection: Connection) -> None:
        """Have the loop call connection.on_kick() soon."""
        self._kicks.append(connection)
        os.eventfd_write(self._wake, 1)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            thread = self._thread
        os.eventfd_write(self._wake, 1)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        for connection in list(self._connections.values()):
            connection.fail("context closed")
        self._epoll.close()
        os.close(self._wake)

    def _timeout(self) -> float:
        deadlines = [d for c in list(self._connections.values()) if (d := c.deadline())]
        if not deadlines:
            return -1
        return max(0.0, min(deadlines) - time.monotonic())

    def _run(self) -> None:
        while not self._stopping:
            events = self._epoll.poll(self._timeout())
            for fd, mask in events:
                if fd == self._wake:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake)
                    continue
                connection = self._connections.get(fd)
                if connection is not None:
                    self._guarded(connection, functools.partial(connection.on_events, mask))
            while self._kicks:
                connection = self._kicks.popleft()
                self._guarded(connection, connection.on_kick)
            now = time.monotonic()
            for connection in list(self._connections.values()):
                deadline = connection.deadline()
                if deadline is not None and deadline <= now:
                    self._guarded(connection, connection.on_deadline)

    @staticmethod
    def _guarded(connection: Connection, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as error:  # a bug must not stop every other connection's progress
            log.exception("rdma progress: connection failed")
            connection.fail(f"internal error: {error!r}")
