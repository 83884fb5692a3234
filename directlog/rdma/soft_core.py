"""What the software transports (shm and tcp) share: regions, the completion queue, and
the queue pair machinery every transport needs (bounds, local checks, error and flush).

A software context keeps its files in one directory (the region table, anonymous regions,
shm completion rings, CQ control words); see soft.py for its life cycle.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import struct
import threading
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from directlog.rdma import _atomics
from directlog.rdma.progress import ProgressEngine, wait_readable
from directlog.rdma.region_table import RegionTable
from directlog.rdma.verbs import (
    ATOMIC_SIZE,
    MAX_WR,
    Access,
    CompletionQueue,
    Doorbell,
    InvalidWorkRequestError,
    MemoryRegion,
    Opcode,
    QpCaps,
    QpState,
    QueueFullError,
    QueuePair,
    RegistrationError,
    Sge,
    WcStatus,
    WorkCompletion,
    check_access_flags,
    check_u32,
    check_u64,
)

REMOTE_WRITE = int(Access.REMOTE_WRITE)
REMOTE_READ = int(Access.REMOTE_READ)
REMOTE_ATOMIC = int(Access.REMOTE_ATOMIC)
NEEDED = {
    Opcode.WRITE: REMOTE_WRITE,
    Opcode.WRITE_WITH_IMM: REMOTE_WRITE,
    Opcode.READ: REMOTE_READ,
    Opcode.FETCH_AND_ADD: REMOTE_ATOMIC,
    Opcode.COMPARE_AND_SWAP: REMOTE_ATOMIC,
}
"""The remote right each op needs (plain ints: flag enums are slow on the hot path)."""

WRITES_LOCAL = frozenset({Opcode.READ, Opcode.FETCH_AND_ADD, Opcode.COMPARE_AND_SWAP})
ATOMICS = frozenset({Opcode.FETCH_AND_ADD, Opcode.COMPARE_AND_SWAP})
NATIVE_WORD = struct.Struct("=Q")
U32_END, U64_END = 1 << 32, 1 << 64

REVOKE_DRAIN_TIMEOUT = 1.0
CQ_CONTROL_SIZE = 64
ARMED_AT = 0


@dataclass(slots=True)
class SendWr:
    """A posted send work request."""

    wr_id: int
    opcode: Opcode
    local: Sge
    remote_addr: int
    rkey: int
    imm: int = 0
    compare_add: int = 0
    swap: int = 0


class SoftMemoryRegion(MemoryRegion):
    """A region of a mapped file, published in the context's region table."""

    def __init__(
        self,
        resources: SoftResources,
        *,
        pd: int,
        mapping: mmap.mmap,
        start: int,
        length: int,
        access: Access,
        path: str,
        file_offset: int,
        owns_mapping: bool,
        owns_file: bool,
    ) -> None:
        self.pd = pd
        self.length = length
        self.access = access
        self.local_write = bool(access & Access.LOCAL_WRITE)
        self.path = path
        self.file_offset = file_offset
        self._resources = resources
        self._mapping = mapping
        self._whole = memoryview(mapping)
        self._view = self._whole[start : start + length]
        self._owns_mapping = owns_mapping
        self._owns_file = owns_file
        self.addr = _atomics.address(self._view)
        self.rkey = resources.table.publish(
            access=access, pd=pd, addr=self.addr, length=length, path=path, file_offset=file_offset
        )
        self.lkey = self.rkey
        self._registered = True

    @property
    def buf(self) -> memoryview:
        return self._view

    @property
    def registered(self) -> bool:
        return self._registered

    def deregister(self) -> None:
        self._resources.deregister(self)

    def release(self) -> None:
        """Drop the mapping after the region was revoked (SoftResources.deregister)."""
        self._registered = False
        self._view.release()
        self._whole.release()
        if self._owns_mapping:
            # A view handed out by ``buf`` keeps the pages alive; they go with the last one.
            with contextlib.suppress(BufferError):
                self._mapping.close()
        if self._owns_file:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


class SoftResources:
    """A software context's shared state: its directory, region table, regions and
    progress engine. Registration and deregistration hold ``lock``."""

    def __init__(self, directory: Path, max_regions: int) -> None:
        self.dir = directory
        self.table = RegionTable(directory / "regions", max_regions)
        self.regions: dict[int, SoftMemoryRegion] = {}
        self.engine = ProgressEngine()
        self.lock = threading.RLock()
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    def register_file(
        self,
        pd: int,
        path: Path,
        length: int,
        access: Access,
        offset: int,
        mapping: mmap.mmap | None,
        *,
        owns_file: bool = False,
    ) -> SoftMemoryRegion:
        check_access_flags(access)
        if length < 1 or offset < 0:
            raise RegistrationError("a region needs length >= 1 at offset >= 0")
        path = path.resolve()
        try:
            size = path.stat().st_size
        except OSError as error:
            raise RegistrationError(f"cannot register {path}: {error}") from None
        if size < offset + length:
            raise RegistrationError(
                f"{path} has {size} bytes, the region needs {offset + length}: preallocate it"
            )
        if mapping is not None:
            if len(mapping) < offset + length:
                raise RegistrationError("the mapping does not cover the region")
            start, owns_mapping = offset, False
        else:
            aligned = offset - offset % mmap.ALLOCATIONGRANULARITY
            fd = os.open(path, os.O_RDWR)
            try:
                mapping = mmap.mmap(fd, offset + length - aligned, offset=aligned)
            finally:
                os.close(fd)
            start, owns_mapping = offset - aligned, True
        with self.lock:
            region = SoftMemoryRegion(
                self,
                pd=pd,
                mapping=mapping,
                start=start,
                length=length,
                access=access,
                path=str(path),
                file_offset=offset,
                owns_mapping=owns_mapping,
                owns_file=owns_file,
            )
            self.regions[region.rkey] = region
        return region

    def allocate(self, pd: int, length: int, access: Access) -> SoftMemoryRegion:
        if length < 1:
            raise RegistrationError("a region needs length >= 1")
        path = self.dir / f"mr-{self.next_id()}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, length)
        finally:
            os.close(fd)
        try:
            return self.register_file(pd, path, length, access, 0, None, owns_file=True)
        except BaseException:
            path.unlink()
            raise

    def deregister(self, region: SoftMemoryRegion) -> None:
        with self.lock:
            if self.regions.get(region.rkey) is not region:
                return
            self.table.revoke(region.rkey, REVOKE_DRAIN_TIMEOUT)
            del self.regions[region.rkey]
            region.release()

    def close(self) -> None:
        self.engine.stop()
        with self.lock:
            for region in list(self.regions.values()):
                self.deregister(region)
            self.table.close()


class SoftCompletionQueue(CompletionQueue):
    """Completions pushed by this process (deque) plus those peers leave in shm rings.

    Waiting uses a doorbell: an eventfd (shm peers get it over SCM_RIGHTS) and an ``armed``
    count in a shared control word. A waiter arms, looks once more, then sleeps on the
    eventfd; a producer publishes, then rings only when the count is nonzero. Both sides'
    accesses are sequentially consistent, so a wake-up is never lost and an idle CQ costs
    producers no system call.
    """

    def __init__(self, resources: SoftResources, depth: int) -> None:
        if not 1 <= depth <= MAX_WR:
            raise ValueError(f"CQ depth must be 1..{MAX_WR}")
        self.depth = depth
        self.control_path = resources.dir / f"cq-{resources.next_id()}"
        fd = os.open(self.control_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, CQ_CONTROL_SIZE)
            self._control = mmap.mmap(fd, CQ_CONTROL_SIZE)
        finally:
            os.close(fd)
        self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._local: deque[tuple[SoftQueuePair, WorkCompletion, bool]] = deque()
        self._rings: list[SoftQueuePair] = []
        self._reserved = 0
        self._lock = threading.Lock()
        self._watched = False  # an event loop waits on the doorbell for good

    def check_room(self, caps: QpCaps) -> None:
        """QueueFullError unless a QP with ``caps`` fits (checked again by attach)."""
        needed = caps.max_send_wr + caps.max_recv_wr
        if self._reserved + needed > self.depth:
            raise QueueFullError(
                f"CQ depth {self.depth} cannot take a QP needing {needed} more entries"
            )

    def attach(self, qp: SoftQueuePair, caps: QpCaps, ring: bool) -> None:
        """Reserve room for every completion ``qp`` can have outstanding."""
        with self._lock:
            self.check_room(caps)
            self._reserved += caps.max_send_wr + caps.max_recv_wr
            if ring:
                self._rings = [*self._rings, qp]

    def detach(self, qp: SoftQueuePair, caps: QpCaps) -> None:
        with self._lock:
            self._reserved -= caps.max_send_wr + caps.max_recv_wr
            self._rings = [r for r in self._rings if r is not qp]

    def doorbell(self) -> Doorbell:
        """The eventfd, rung for every completion from now on (a standing waiter)."""
        if not self._watched:
            self._watched = True
            _atomics.fetch_add(self._control, ARMED_AT, 1)
        return Doorbell(self.eventfd, self._heard)

    def _heard(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.eventfd)

    def push(self, qp: SoftQueuePair, completion: WorkCompletion, send: bool) -> None:
        self._local.append((qp, completion, send))
        self.ring_bell()

    def ring_bell(self) -> None:
        if _atomics.load(self._control, ARMED_AT):
            os.eventfd_write(self.eventfd, 1)

    def poll(self, max_entries: int = 16, timeout: float | None = 0.0) -> list[WorkCompletion]:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        found = self._collect(max_entries)
        if found or timeout == 0:
            return found
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.armed():
                found = self._collect(max_entries)
                if found:
                    return found
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    return found
                wait_readable([self.eventfd], wait)
                self._heard()

    @contextlib.contextmanager
    def armed(self) -> Iterator[Doorbell]:
        _atomics.fetch_add(self._control, ARMED_AT, 1)
        try:
            yield Doorbell(self.eventfd, self._heard)
        finally:
            _atomics.fetch_add(self._control, ARMED_AT, U64_END - 1)

    def _collect(self, max_entries: int) -> list[WorkCompletion]:
        found: list[WorkCompletion] = []
        local = self._local
        while local and len(found) < max_entries:
            qp, completion, send = local.popleft()
            qp.polled(send)
            found.append(completion)
        for qp in self._rings:
            if len(found) >= max_entries:
                break
            qp.drain_ring(found, max_entries)
        return found

    def close(self) -> None:
        self._control.close()
        os.close(self.eventfd)


class SoftQueuePair(QueuePair):
    """Bounds, local checks, error and flush for both software transports; a transport
    implements ``_execute`` (run or send one checked op) and ``_disconnect``."""

    def __init__(
        self,
        resources: SoftResources,
        *,
        qp_num: int,
        pd: int,
        cq: SoftCompletionQueue,
        caps: QpCaps,
        provider: str,
        ring: bool,
    ) -> None:
        self.qp_num = qp_num
        self.provider = provider
        self.caps = caps
        self._resources = resources
        self._pd = pd
        self._cq = cq
        self._state = QpState.RTS
        self._lock = threading.RLock()
        self._send_posted = 0
        self._send_polled = 0
        self._recv_posted = 0
        self._recv_polled = 0
        self._recv_wr: deque[int] = deque()
        cq.attach(self, caps, ring)

    @property
    def state(self) -> QpState:
        return self._state

    def post_write(self, wr_id: int, local: Sge, remote_addr: int, rkey: int) -> None:
        self._post(SendWr(wr_id, Opcode.WRITE, local, remote_addr, rkey))

    def post_write_with_imm(
        self, wr_id: int, local: Sge, remote_addr: int, rkey: int, imm_data: int
    ) -> None:
        check_u32("imm_data", imm_data)
        self._post(SendWr(wr_id, Opcode.WRITE_WITH_IMM, local, remote_addr, rkey, imm_data))

    def post_read(self, wr_id: int, local: Sge, remote_addr: int, rkey: int) -> None:
        self._post(SendWr(wr_id, Opcode.READ, local, remote_addr, rkey))

    def post_fetch_and_add(
        self, wr_id: int, local: Sge, remote_addr: int, rkey: int, add: int
    ) -> None:
        check_u64("add", add)
        self._post(SendWr(wr_id, Opcode.FETCH_AND_ADD, local, remote_addr, rkey, 0, add))

    def post_compare_and_swap(
        self, wr_id: int, local: Sge, remote_addr: int, rkey: int, compare: int, swap: int
    ) -> None:
        check_u64("compare", compare)
        check_u64("swap", swap)
        wr = SendWr(wr_id, Opcode.COMPARE_AND_SWAP, local, remote_addr, rkey, 0, compare, swap)
        self._post(wr)

    def post_recv(self, wr_id: int) -> None:
        check_u64("wr_id", wr_id)
        with self._lock:
            if self._state is QpState.CLOSED:
                raise InvalidWorkRequestError("queue pair closed")
            if self._recv_posted - self._recv_polled >= self.caps.max_recv_wr:
                raise QueueFullError(f"{self.caps.max_recv_wr} receives outstanding")
            self._recv_posted += 1
            if self._state is QpState.ERROR:
                self._push_recv(wr_id, WcStatus.WR_FLUSH_ERR, 0, None)
                return
            self._recv_wr.append(wr_id)
            self._recv_added()

    def close(self) -> None:
        with self._lock:
            if self._state is QpState.CLOSED:
                return
            if self._state is QpState.RTS:
                self._flush()
            self._state = QpState.CLOSED
        self._disconnect()
        self._cq.detach(self, self.caps)

    def polled(self, send: bool) -> None:
        """The CQ handed out one of this QP's completions: its queue slot is free again."""
        if send:
            self._send_polled += 1
        else:
            self._recv_polled += 1

    def drain_ring(self, found: list[WorkCompletion], max_entries: int) -> None:
        """Completions that live outside the CQ's deque (shm's receive ring)."""

    def _post(self, wr: SendWr) -> None:
        if not (
            0 <= wr.wr_id < U64_END and 0 <= wr.remote_addr < U64_END and 0 <= wr.rkey < U32_END
        ):
            check_u64("wr_id", wr.wr_id)  # one test on the hot path; these name the culprit
            check_u64("remote_addr", wr.remote_addr)
            check_u32("rkey", wr.rkey)
        local = wr.local
        if local.offset < 0 or local.length < 0:
            raise InvalidWorkRequestError("local offset and length must not be negative")
        if local.length > self.caps.max_message:
            raise InvalidWorkRequestError(f"{local.length} bytes over max_message")
        if wr.opcode in ATOMICS and local.length != ATOMIC_SIZE:
            raise InvalidWorkRequestError("atomics need an 8-byte local buffer")
        if self._state is QpState.CLOSED:
            raise InvalidWorkRequestError("queue pair closed")
        if self._send_posted - self._send_polled >= self.caps.max_send_wr:
            raise QueueFullError(f"{self.caps.max_send_wr} send work requests outstanding")
        self._send_posted += 1
        if self._state is not QpState.RTS:
            self._complete(wr, WcStatus.WR_FLUSH_ERR)
            return
        status = self._local_status(wr)
        if status is not WcStatus.SUCCESS:
            self._fail(wr, status)
            return
        self._execute(wr)

    def _local_status(self, wr: SendWr) -> WcStatus:
        mr = wr.local.mr
        if not isinstance(mr, SoftMemoryRegion) or not mr.registered or mr.pd != self._pd:
            return WcStatus.LOC_PROT_ERR
        if wr.local.offset + wr.local.length > mr.length:
            return WcStatus.LOC_PROT_ERR
        if wr.opcode in WRITES_LOCAL and not mr.local_write:
            return WcStatus.LOC_PROT_ERR
        return WcStatus.SUCCESS

    @staticmethod
    def _local_view(wr: SendWr) -> memoryview:
        local = wr.local
        assert isinstance(local.mr, SoftMemoryRegion)
        return local.mr.buf[local.offset : local.offset + local.length]

    def _complete(self, wr: SendWr, status: WcStatus) -> None:
        length = wr.local.length if status is WcStatus.SUCCESS else 0
        completion = WorkCompletion(wr.wr_id, status, wr.opcode, length, self.qp_num)
        self._cq.push(self, completion, True)

    def _fail(self, wr: SendWr, status: WcStatus) -> None:
        """Complete ``wr`` with an error, which moves the QP to ERROR (RC semantics)."""
        self._error((wr, status))

    def _push_recv(self, wr_id: int, status: WcStatus, byte_len: int, imm: int | None) -> None:
        opcode = Opcode.RECV_RDMA_WITH_IMM
        self._cq.push(
            self, WorkCompletion(wr_id, status, opcode, byte_len, self.qp_num, imm), False
        )

    def _error(self, failed: tuple[SendWr, WcStatus] | None = None) -> None:
        """RTS -> ERROR: complete ``failed``, flush, and break the connection so the peer
        goes to ERROR too. The state changes before any completion is visible."""
        with self._lock:
            was_rts = self._state is QpState.RTS
            if was_rts:
                self._state = QpState.ERROR
            if failed is not None:
                self._complete(*failed)
            if not was_rts:
                return
            self._flush()
        self._disconnect()

    def _flush(self) -> None:
        """Complete everything outstanding with WR_FLUSH_ERR (``_lock`` held)."""
        while self._recv_wr:
            self._push_recv(self._recv_wr.popleft(), WcStatus.WR_FLUSH_ERR, 0, None)

    def _recv_added(self) -> None:
        """A receive was queued (``_lock`` held)."""

    @abstractmethod
    def _execute(self, wr: SendWr) -> None:
        """Run or send a checked op on an RTS QP."""

    @abstractmethod
    def _disconnect(self) -> None:
        """Break the connection (any thread; the progress thread closes the socket)."""
