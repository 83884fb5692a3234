"""The software context: the shm and tcp transports over one set of registered regions.

A context lives in a directory of its own, ``<region_dir>/directlog-rdma-<pid>-<n>/``
(region_dir is /dev/shm when it exists): the region table, anonymous regions, CQ control
words, shm receive rings and the listeners' Unix sockets. An flock on its ``lock`` file
marks it live; a context that opens later removes directories whose lock nobody holds, so
a killed process leaves nothing behind for long.

One context serves both transports (provider "shm+tcp", what ``auto`` opens without an
RNIC): a listener then accepts shm peers on its Unix socket and tcp peers on its TCP port,
and every region is reachable over both. A connecting context picks shm when the listener
runs on the same host (same boot id, its socket reachable), tcp otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from directlog.rdma import shm, tcp
from directlog.rdma.progress import wait_readable
from directlog.rdma.soft_core import SoftCompletionQueue, SoftQueuePair, SoftResources
from directlog.rdma.verbs import (
    Access,
    CompletionQueue,
    ConnectError,
    ConnInfo,
    Context,
    Listener,
    MemoryRegion,
    ProtectionDomain,
    ProviderUnavailableError,
    QpCaps,
    QpState,
    QueuePair,
)

log = logging.getLogger(__name__)

TRANSPORTS = ("shm", "tcp")
DIR_PREFIX = "directlog-rdma-"
STALE_UNLOCKED_AGE = 60.0
LISTEN_BACKLOG = 64


def default_region_dir() -> Path:
    shm_dir = Path("/dev/shm")
    if shm_dir.is_dir() and os.access(shm_dir, os.W_OK):
        return shm_dir
    return Path(tempfile.gettempdir())


def sweep_stale(base: Path) -> None:
    """Remove context directories of processes that are gone (their lock is free)."""
    for directory in base.glob(DIR_PREFIX + "*"):
        lock = directory / "lock"
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            # Between mkdir and the first lock, or left half-made: only old ones go.
            with contextlib.suppress(OSError):
                if time.time() - directory.stat().st_mtime > STALE_UNLOCKED_AGE:
                    shutil.rmtree(directory, ignore_errors=True)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # live
        finally:
            os.close(fd)
        shutil.rmtree(directory, ignore_errors=True)


class SoftContext(Context):
    def __init__(
        self,
        transports: tuple[str, ...],
        *,
        region_dir: str | Path | None = None,
        max_regions: int = 1024,
    ) -> None:
        if not transports or any(t not in TRANSPORTS for t in transports):
            raise ValueError(f"transports must be among {TRANSPORTS}")
        self.provider = "+".join(transports)
        self.transports = transports
        base = Path(region_dir) if region_dir is not None else default_region_dir()
        sweep_stale(base)
        directory = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-", dir=base))
        # Lock before the name appears: a sweeper must never find it unlocked.
        self._lock_fd = os.open(directory / "lock.new", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        os.rename(directory / "lock.new", directory / "lock")
        self.resources = SoftResources(directory, max_regions)
        self._cqs: list[SoftCompletionQueue] = []
        self._qps: list[SoftQueuePair] = []
        self.listeners: list[SoftListener] = []
        self._closed = False

    @property
    def directory(self) -> Path:
        return self.resources.dir

    def alloc_pd(self) -> SoftPd:
        return SoftPd(self, self.resources.next_id())

    def create_cq(self, depth: int = 256) -> SoftCompletionQueue:
        cq = SoftCompletionQueue(self.resources, depth)
        self._cqs.append(cq)
        return cq

    def track(self, qp: SoftQueuePair) -> SoftQueuePair:
        self._qps = [q for q in self._qps if q.state is not QpState.CLOSED]
        self._qps.append(qp)
        return qp

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for listener in self.listeners:
            listener.close()
        for qp in self._qps:
            qp.close()
        self.resources.close()
        for cq in self._cqs:
            cq.close()
        shutil.rmtree(self.resources.dir, ignore_errors=True)
        os.close(self._lock_fd)


class SoftPd(ProtectionDomain):
    def __init__(self, context: SoftContext, handle: int) -> None:
        self.context = context
        self.handle = handle

    def register_file(
        self,
        path: str | Path,
        length: int,
        access: Access,
        *,
        offset: int = 0,
        mapping: mmap.mmap | None = None,
    ) -> MemoryRegion:
        resources = self.context.resources
        return resources.register_file(self.handle, Path(path), length, access, offset, mapping)

    def allocate(self, length: int, access: Access) -> MemoryRegion:
        return self.context.resources.allocate(self.handle, length, access)

    def listen(
        self,
        cq: CompletionQueue,
        caps: QpCaps | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertised_host: str | None = None,
    ) -> Listener:
        listener = SoftListener(
            self, _soft_cq(cq), caps or QpCaps(), host, port, advertised_host or host
        )
        self.context.listeners.append(listener)
        return listener

    def connect(
        self,
        info: ConnInfo | str,
        cq: CompletionQueue,
        caps: QpCaps | None = None,
        *,
        timeout: float = 5.0,
    ) -> QueuePair:
        if isinstance(info, str):
            info = ConnInfo.decode(info)
        soft_cq = _soft_cq(cq)
        caps = caps or QpCaps()
        soft_cq.check_room(caps)  # before anything reaches the peer
        transports = self.context.transports
        if "shm" in transports and "shm" in info.providers and _same_host(info):
            try:
                return self._connect_shm(info, soft_cq, caps, timeout)
            except (ConnectError, OSError):
                if "tcp" not in transports or "tcp" not in info.providers:
                    raise
                log.info("shm connection to %s failed, using tcp", info.path, exc_info=True)
        if "tcp" in transports and "tcp" in info.providers:
            return self._connect_tcp(info, soft_cq, caps, timeout)
        raise ProviderUnavailableError(
            f"no common transport: this context has {transports}, the peer {info.providers}"
            + (" (shm needs the same host)" if "shm" in transports else "")
        )

    def _connect_shm(
        self, info: ConnInfo, cq: SoftCompletionQueue, caps: QpCaps, timeout: float
    ) -> QueuePair:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(info.path)
            return self.accept_shm(sock, cq, caps, timeout)
        except BaseException:
            sock.close()
            raise

    def _connect_tcp(
        self, info: ConnInfo, cq: SoftCompletionQueue, caps: QpCaps, timeout: float
    ) -> QueuePair:
        try:
            sock = socket.create_connection((info.host, info.port), timeout=timeout)
        except OSError as error:
            raise ConnectError(f"tcp connect to {info.host}:{info.port}: {error}") from None
        try:
            return self.accept_tcp(sock, cq, caps, timeout)
        except BaseException:
            sock.close()
            raise

    def accept_shm(
        self, sock: socket.socket, cq: SoftCompletionQueue, caps: QpCaps, timeout: float
    ) -> QueuePair:
        """Either side of shm setup once the Unix socket is connected."""
        resources = self.context.resources
        qp_num = resources.next_id()
        qp = shm.ShmQueuePair(
            resources,
            qp_num=qp_num,
            pd=self.handle,
            cq=cq,
            caps=caps,
            ring_path=resources.dir / f"qp-{qp_num}",
        )
        try:
            shm.handshake(qp, sock, resources=resources, pd=self.handle, cq=cq, timeout=timeout)
        except BaseException:
            qp.close()
            raise
        return self.context.track(qp)

    def accept_tcp(
        self, sock: socket.socket, cq: SoftCompletionQueue, caps: QpCaps, timeout: float
    ) -> QueuePair:
        """Either side of tcp setup once the TCP connection is up."""
        resources = self.context.resources
        qp = tcp.TcpQueuePair(
            resources, qp_num=resources.next_id(), pd=self.handle, cq=cq, caps=caps
        )
        try:
            tcp.handshake(qp, sock, timeout)
        except BaseException:
            qp.close()
            raise
        return self.context.track(qp)


class SoftListener(Listener):
    """Listens on a Unix socket (shm), a TCP port (tcp), or both."""

    def __init__(
        self,
        pd: SoftPd,
        cq: SoftCompletionQueue,
        caps: QpCaps,
        host: str,
        port: int,
        advertised_host: str,
    ) -> None:
        self._pd = pd
        self._cq = cq
        self._caps = caps
        self._unix: socket.socket | None = None
        self._tcp: socket.socket | None = None
        transports = pd.context.transports
        path = ""
        if "shm" in transports:
            path = str(pd.context.directory / f"listen-{pd.context.resources.next_id()}.sock")
            self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._unix.bind(path)
            self._unix.listen(LISTEN_BACKLOG)
            self._unix.setblocking(False)
        if "tcp" in transports:
            self._tcp = socket.create_server((host, port), backlog=LISTEN_BACKLOG)
            self._tcp.setblocking(False)
            port = self._tcp.getsockname()[1]
        self.conn_info = ConnInfo(
            transports, advertised_host, port if self._tcp else 0, path, shm.host_id()
        )

    def accept(self, timeout: float | None = None) -> QueuePair:
        sockets = [s for s in (self._unix, self._tcp) if s is not None]
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = timeout
        while True:
            ready = wait_readable(sockets, wait)
            for listening in (s for s in sockets if s.fileno() in ready):
                try:
                    sock, _address = listening.accept()
                except BlockingIOError:
                    continue
                remaining = 5.0 if deadline is None else max(0.1, deadline - time.monotonic())
                try:
                    if listening is self._unix:
                        return self._pd.accept_shm(sock, self._cq, self._caps, remaining)
                    return self._pd.accept_tcp(sock, self._cq, self._caps, remaining)
                except ConnectError:
                    sock.close()
                    log.warning("rdma listener: a connection failed its handshake", exc_info=True)
                except BaseException:
                    sock.close()
                    raise
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise TimeoutError("no connection within the timeout")

    def close(self) -> None:
        for listening in (self._unix, self._tcp):
            if listening is not None:
                listening.close()
        if self.conn_info.path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.conn_info.path)


def _soft_cq(cq: CompletionQueue) -> SoftCompletionQueue:
    if not isinstance(cq, SoftCompletionQueue):
        raise TypeError("this CQ belongs to another provider's context")
    return cq


def _same_host(info: ConnInfo) -> bool:
    return info.host_id == shm.host_id() and bool(info.path) and os.path.exists(info.path)
