"""The shm transport: same-host RC queue pairs that are genuinely one-sided.

The initiator executes every op itself, in post order, on the peer's memory: it maps the
peer's region table and region files, checks the op against the table (admit), copies
or runs the CPU atomic on the shared pages, and re-checks (finish). The peer's CPU does
nothing for WRITE, READ or the atomics. A WRITE_WITH_IMM also leaves a completion in the
peer's receive ring (a file the peer owns, one per QP) and rings the peer CQ's doorbell
(an eventfd passed over the Unix socket) when a poller sleeps there.

The Unix socket that set the connection up stays open: its end (peer closed, errored or
died) moves this QP to ERROR, which the progress thread notices at once.

Receive ring file (little-endian), written by the peer, read by the owner:

    0   recv_posted u64  receives the owner posted so far (the owner writes it)
    8   produced u64     completions the peer wrote so far (the peer writes it)
    16  capacity u64     entries (the owner's max_recv_wr)
    64  entries          capacity x 16 bytes: imm u32, flags u32 (0), byte_len u64
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from directlog.rdma import _atomics
from directlog.rdma.progress import HANGUP, READ, Connection
from directlog.rdma.region_table import Entry, TableView, entry_offset
from directlog.rdma.soft_core import (
    ARMED_AT,
    ATOMICS,
    NATIVE_WORD,
    NEEDED,
    REMOTE_ATOMIC,
    REMOTE_WRITE,
    SendWr,
    SoftCompletionQueue,
    SoftQueuePair,
    SoftResources,
)
from directlog.rdma.verbs import (
    ConnectError,
    Opcode,
    QpCaps,
    QpState,
    WcStatus,
    WorkCompletion,
)

log = logging.getLogger(__name__)

RING_HEADER = 64
RECV_POSTED_AT = 0
PRODUCED_AT = 8
CAPACITY_AT = 16
RING_ENTRY = struct.Struct("<IIQ")
HELLO_MAGIC = "directlog-rdma-shm/1"
MAX_HELLO = 4096
MAX_PEER_MAPPINGS = 1024
LENGTH = struct.Struct("<I")


def host_id() -> str:
    """This kernel's boot id: equal on two processes exactly when they share a host."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


@dataclass(slots=True)
class _PeerMapping:
    """One of the peer's regions, mapped here."""

    entry: Entry
    mapping: mmap.mmap
    view: memoryview
    delta: int  # the region's start in ``view``
    table_at: int  # the entry's offset in the peer's table

    def close(self) -> None:
        self.view.release()
        self.mapping.close()


@dataclass(slots=True)
class ShmPeer:
    """What this end holds of the other: its table, ring and CQ doorbell."""

    pd: int
    table: TableView
    ring: mmap.mmap
    ring_capacity: int
    cq_control: mmap.mmap
    eventfd: int

    def close(self) -> None:
        self.table.close()
        self.ring.close()
        self.cq_control.close()
        os.close(self.eventfd)


class ShmQueuePair(SoftQueuePair, Connection):
    def __init__(
        self,
        resources: SoftResources,
        *,
        qp_num: int,
        pd: int,
        cq: SoftCompletionQueue,
        caps: QpCaps,
        ring_path: Path,
    ) -> None:
        size = RING_HEADER + RING_ENTRY.size * caps.max_recv_wr
        fd = os.open(ring_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self._ring = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        _atomics.store(self._ring, CAPACITY_AT, caps.max_recv_wr)
        self.ring_path = ring_path
        self._ring_posted = 0
        self._consumed = 0
        self._produced = 0
        self._sock: socket.socket | None = None
        self._peer: ShmPeer | None = None
        self._mappings: dict[int, _PeerMapping] = {}
        try:
            super().__init__(
                resources, qp_num=qp_num, pd=pd, cq=cq, caps=caps, provider="shm", ring=True
            )
        except BaseException:
            self._ring.close()
            ring_path.unlink()
            raise

    def start(self, sock: socket.socket, peer: ShmPeer) -> None:
        """Go live on a connected, handshaken socket."""
        self._sock = sock
        self._peer = peer
        sock.setblocking(False)
        self._resources.engine.add(self)

    # -- the initiator side: every op runs here, in post order

    def _execute(self, wr: SendWr) -> None:
        peer = self._peer
        assert peer is not None
        opcode = wr.opcode
        if opcode is Opcode.WRITE_WITH_IMM:
            status = self._wait_for_receive(peer)
            if status is not WcStatus.SUCCESS:
                self._fail(wr, status)
                return
        status = self._atomic(peer, wr) if opcode in ATOMICS else self._copy(peer, wr, cached=True)
        if status is not WcStatus.SUCCESS:
            self._fail(wr, status)
            return
        if opcode is Opcode.WRITE_WITH_IMM:
            self._deliver_immediate(peer, wr.imm, wr.local.length)
        self._complete(wr, WcStatus.SUCCESS)

    def _copy(self, peer: ShmPeer, wr: SendWr, cached: bool) -> WcStatus:
        """A READ or WRITE: the copy, admitted and finished in one C call. A mapping cached
        under a revoked registration is dropped and the rkey looked up afresh, once."""
        mapping = self._mappings.get(wr.rkey) if cached else None
        if mapping is None:
            found = self._mapping(peer, wr)
            if isinstance(found, WcStatus):
                return found
            mapping = found
        entry = mapping.entry
        local = wr.local
        length = local.length
        status = entry.check(wr.remote_addr, length, NEEDED[wr.opcode], peer.pd)
        if status is not WcStatus.SUCCESS:
            return status
        at = mapping.delta + wr.remote_addr - entry.addr
        table, table_at, ctl = peer.table.buf, mapping.table_at, entry.ctl
        if wr.opcode is Opcode.READ:
            done = _atomics.guarded_copy(
                table, table_at, ctl, local.mr.buf, local.offset, mapping.view, at, length
            )
        else:
            done = _atomics.guarded_copy(
                table, table_at, ctl, mapping.view, at, local.mr.buf, local.offset, length
            )
        if done == _atomics.COPIED:
            return WcStatus.SUCCESS
        if done == _atomics.NOT_ADMITTED and cached:
            self._forget(wr.rkey)
            return self._copy(peer, wr, cached=False)
        return WcStatus.REM_ACCESS_ERR

    def _atomic(self, peer: ShmPeer, wr: SendWr) -> WcStatus:
        """FETCH_AND_ADD or COMPARE_AND_SWAP: the CPU atomic between admit and finish."""
        grant = self._admit(peer, wr)
        if isinstance(grant, WcStatus):
            return grant
        mapping, at = grant
        try:
            if wr.opcode is Opcode.FETCH_AND_ADD:
                old = _atomics.fetch_add(mapping.view, at, wr.compare_add)
            else:
                old = _atomics.compare_exchange(mapping.view, at, wr.compare_add, wr.swap)
            local = wr.local
            NATIVE_WORD.pack_into(local.mr.buf, local.offset, old)
        finally:
            still_valid = peer.table.finish(mapping.entry)
        return WcStatus.SUCCESS if still_valid else WcStatus.REM_ACCESS_ERR

    def _wait_for_receive(self, peer: ShmPeer) -> WcStatus:
        """Until the peer has a receive for us (its RNR wait), at most rnr_timeout."""
        deadline = time.monotonic() + self.caps.rnr_timeout
        spins = 0
        while _atomics.load(peer.ring, RECV_POSTED_AT) <= self._produced:
            if self._state is not QpState.RTS:
                return WcStatus.WR_FLUSH_ERR
            if time.monotonic() > deadline:
                return WcStatus.RNR_RETRY_EXC_ERR
            spins += 1
            time.sleep(0 if spins < 100 else 0.0001)
        return WcStatus.SUCCESS

    def _deliver_immediate(self, peer: ShmPeer, imm: int, byte_len: int) -> None:
        slot = self._produced % peer.ring_capacity
        RING_ENTRY.pack_into(peer.ring, RING_HEADER + RING_ENTRY.size * slot, imm, 0, byte_len)
        self._produced += 1
        _atomics.store(peer.ring, PRODUCED_AT, self._produced)
        if _atomics.load(peer.cq_control, ARMED_AT):
            os.eventfd_write(peer.eventfd, 1)

    def _admit(self, peer: ShmPeer, wr: SendWr) -> tuple[_PeerMapping, int] | WcStatus:
        """The mapping and offset an atomic operates on, admitted in the peer's table; or
        why not."""
        mapping = self._mappings.get(wr.rkey)
        if mapping is None or not peer.table.admit(mapping.entry):
            if mapping is not None:
                self._forget(wr.rkey)
            found = self._mapping(peer, wr)
            if isinstance(found, WcStatus):
                return found
            mapping = found
            if not peer.table.admit(mapping.entry):
                return WcStatus.REM_ACCESS_ERR
        entry = mapping.entry
        status = entry.check(wr.remote_addr, wr.local.length, REMOTE_ATOMIC, peer.pd)
        if status is WcStatus.SUCCESS and wr.remote_addr % 8:
            status = WcStatus.REM_INV_REQ_ERR
        if status is not WcStatus.SUCCESS:
            peer.table.finish(entry)
            return status
        return mapping, mapping.delta + wr.remote_addr - entry.addr

    def _mapping(self, peer: ShmPeer, wr: SendWr) -> _PeerMapping | WcStatus:
        """The peer's region ``wr`` names, looked up in its table and, when ``wr`` may
        access it, mapped here."""
        entry = peer.table.lookup(wr.rkey)
        if entry is None:
            return WcStatus.REM_ACCESS_ERR
        status = entry.check(wr.remote_addr, wr.local.length, NEEDED[wr.opcode], peer.pd)
        if status is not WcStatus.SUCCESS:
            return status
        mapping = self._map(entry)
        if mapping is None:
            return WcStatus.REM_ACCESS_ERR
        self._remember(wr.rkey, mapping)
        return mapping

    def _forget(self, rkey: int) -> None:
        self._mappings.pop(rkey).close()

    def _map(self, entry: Entry) -> _PeerMapping | None:
        writable = bool(entry.access & (REMOTE_WRITE | REMOTE_ATOMIC))
        aligned = entry.file_offset - entry.file_offset % mmap.ALLOCATIONGRANULARITY
        delta = entry.file_offset - aligned
        try:
            fd = os.open(entry.path, os.O_RDWR if writable else os.O_RDONLY)
        except OSError:
            return None
        try:
            # Never map past the end of the file: touching such a page would be SIGBUS.
            if os.fstat(fd).st_size < entry.file_offset + entry.length:
                return None
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            mapping = mmap.mmap(fd, delta + entry.length, access=access, offset=aligned)
        except OSError:
            return None
        finally:
            os.close(fd)
        return _PeerMapping(entry, mapping, memoryview(mapping), delta, entry_offset(entry.slot))

    def _remember(self, rkey: int, mapping: _PeerMapping) -> None:
        if len(self._mappings) >= MAX_PEER_MAPPINGS:
            oldest = next(iter(self._mappings))
            self._mappings.pop(oldest).close()
        self._mappings[rkey] = mapping

    # -- the target side: receives and the ring

    def _recv_added(self) -> None:
        self._ring_posted += 1
        _atomics.store(self._ring, RECV_POSTED_AT, self._ring_posted)

    def drain_ring(self, found: list[WorkCompletion], max_entries: int) -> None:
        with self._lock:
            if self._ring.closed or self._state is not QpState.RTS:
                return  # _flush delivered what landed before; later writes complete nowhere
            produced = _atomics.load(self._ring, PRODUCED_AT)
            if produced > self._ring_posted:
                log.warning("shm qp %d: the peer completed receives never posted", self.qp_num)
                produced = self._consumed
                self._resources.engine.kick(self)
            while self._consumed < produced and len(found) < max_entries:
                found.append(self._take_ring_entry())
                self._recv_polled += 1

    def _take_ring_entry(self) -> WorkCompletion:
        slot = self._consumed % self.caps.max_recv_wr
        imm, _flags, byte_len = RING_ENTRY.unpack_from(self._ring, RING_HEADER + 16 * slot)
        self._consumed += 1
        wr_id = self._recv_wr.popleft()
        opcode = Opcode.RECV_RDMA_WITH_IMM
        return WorkCompletion(wr_id, WcStatus.SUCCESS, opcode, byte_len, self.qp_num, imm)

    def _flush(self) -> None:
        # What the peer completed before the error is delivered, not flushed.
        produced = min(_atomics.load(self._ring, PRODUCED_AT), self._ring_posted)
        while self._consumed < produced:
            self._cq.push(self, self._take_ring_entry(), False)
        super()._flush()

    # -- the connection: its end is the peer's end

    def _disconnect(self) -> None:
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def fileno(self) -> int:
        assert self._sock is not None
        return self._sock.fileno()

    def interest(self) -> int:
        return READ

    def on_events(self, events: int) -> None:
        assert self._sock is not None
        try:
            data = self._sock.recv(64)
        except BlockingIOError:
            if not events & HANGUP:
                return
            data = b""
        except OSError:
            data = b""
        if data:
            log.warning("shm qp %d: unexpected bytes from the peer", self.qp_num)
        self.fail("peer disconnected")

    def on_kick(self) -> None:
        self.fail("peer broke the receive ring protocol")

    def deadline(self) -> float | None:
        return None

    def on_deadline(self) -> None:
        """No deadlines: the peer does all the work."""

    def fail(self, reason: str) -> None:
        self._error()
        sock = self._sock
        if sock is not None and sock.fileno() >= 0:
            self._resources.engine.remove(self)
            sock.close()

    def close(self) -> None:
        super().close()
        with self._lock:
            self._ring.close()
            for mapping in self._mappings.values():
                mapping.close()
            self._mappings.clear()
        if self._peer is not None:
            self._peer.close()
            self._peer = None
        self.ring_path.unlink(missing_ok=True)


def handshake(
    qp: ShmQueuePair,
    sock: socket.socket,
    *,
    resources: SoftResources,
    pd: int,
    cq: SoftCompletionQueue,
    timeout: float,
) -> None:
    """Exchange what each end needs to reach the other, then start ``qp``."""
    hello = {
        "magic": HELLO_MAGIC,
        "host_id": host_id(),
        "pd": pd,
        "table": str(resources.table.path),
        "ring": str(qp.ring_path),
        "cq": str(cq.control_path),
    }
    data = json.dumps(hello).encode()
    sock.settimeout(timeout)
    try:
        socket.send_fds(sock, [LENGTH.pack(len(data)) + data], [cq.eventfd])
        message, fds, _flags, _address = socket.recv_fds(sock, LENGTH.size + MAX_HELLO, 1)
    except OSError as error:
        raise ConnectError(f"shm handshake failed: {error}") from None
    try:
        peer = _read_hello(sock, message, fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    qp.start(sock, peer)


def _read_hello(sock: socket.socket, message: bytes, fds: list[int]) -> ShmPeer:
    if len(fds) != 1 or len(message) < LENGTH.size:
        raise ConnectError("shm handshake: the peer sent no doorbell")
    (length,) = LENGTH.unpack_from(message)
    if length > MAX_HELLO:
        raise ConnectError("shm handshake: hello too long")
    data = message[LENGTH.size :]
    while len(data) < length:
        chunk = sock.recv(length - len(data))
        if not chunk:
            raise ConnectError("shm handshake: peer closed")
        data += chunk
    try:
        hello = json.loads(data)
        if hello["magic"] != HELLO_MAGIC:
            raise ConnectError("shm handshake: not a directlog shm peer, or another version")
        if hello["host_id"] != host_id():
            raise ConnectError("shm handshake: the peer runs on another host")
        table = TableView.open(str(hello["table"]))
        ring = _map_shared(str(hello["ring"]), writable=True)
        cq_control = _map_shared(str(hello["cq"]), writable=False)
        capacity = _atomics.load(ring, CAPACITY_AT)
        if len(ring) < RING_HEADER + RING_ENTRY.size * capacity or capacity < 1:
            raise ConnectError("shm handshake: malformed receive ring")
        return ShmPeer(int(hello["pd"]), table, ring, capacity, cq_control, fds[0])
    except (KeyError, TypeError, ValueError, OSError) as error:
        raise ConnectError(f"shm handshake: {error!r}") from None


def _map_shared(path: str, *, writable: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    finally:
        os.close(fd)
