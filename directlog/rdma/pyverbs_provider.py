"""The pyverbs provider: the verbs API on an RNIC or Soft-RoCE, through rdma-core's pyverbs.

pyverbs is imported lazily, so ``directlog.rdma`` imports and ``auto`` works where it is
missing. Debian ships it (python3-pyverbs) for the system Python only; when the running
interpreter cannot import it, it is loaded from Debian's directory alone (the package
needs nothing else from there), never by adding that whole directory to sys.path.

The mapping: Context -> pyverbs.device.Context, ProtectionDomain -> pd.PD, MemoryRegion ->
mr.MR over our own mapping (so files and shared memory stay ours), CompletionQueue ->
cq.CQ, QueuePair -> an RC qp.QP moved to RTS with the peer's QP number, PSN, GID and LID,
which the two ends exchange over a TCP connection (the listener's address). Ops are
SendWRs with one SGE, all signaled. The NIC enforces access, RC order and error states;
this module adds what the API promises on top: typed bounds errors before the NIC's own,
opcodes on error completions (which ibverbs leaves undefined), and the immediate in host
order (ibverbs carries it big-endian). Waiting polls with a short sleep that backs off:
this pyverbs has no file descriptor for its completion channel to select on.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import json
import mmap
import random
import socket
import struct
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, TypeVar

from directlog.rdma import _atomics
from directlog.rdma.verbs import (
    ATOMIC_SIZE,
    MAX_WR,
    Access,
    CompletionQueue,
    ConnectError,
    ConnInfo,
    Context,
    InvalidWorkRequestError,
    Listener,
    MemoryRegion,
    Opcode,
    ProtectionDomain,
    ProviderUnavailableError,
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

SYSTEM_DIRS = ("/usr/lib/python3/dist-packages",)
MODULES = ("device", "pd", "mr", "cq", "qp", "wr", "addr", "enums", "pyverbs_error")
ENDPOINT = struct.Struct("!I")
MAX_ENDPOINT = 1024
RECV_BIT = 1 << 63
RNR_TIMER_MS = (
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96,
    1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92,
    122.88, 163.84, 245.76, 327.68, 491.52,
)  # fmt: skip
"""IB's min_rnr_timer encodings, in milliseconds (code 0 is the longest)."""
ALL_QP_ACCESS = int(
    Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
)
RNR_RETRY = 6
"""The largest finite RNR retry count (7 means forever)."""

T = TypeVar("T")
_loaded: SimpleNamespace | None = None
_load_lock = threading.Lock()


def load_pyverbs() -> SimpleNamespace | None:
    """pyverbs' modules by short name (device, pd, mr, ...), or None when not installed."""
    global _loaded
    with _load_lock:
        if _loaded is None:
            package = _import_package()
            if package is None:
                return None
            modules = {name: importlib.import_module(f"pyverbs.{name}") for name in MODULES}
            _loaded = SimpleNamespace(**modules)
        return _loaded


def _import_package() -> ModuleType | None:
    try:
        return importlib.import_module("pyverbs")
    except ImportError:
        pass
    for directory in SYSTEM_DIRS:
        spec = importlib.machinery.PathFinder.find_spec("pyverbs", [directory])
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules["pyverbs"] = module
        try:
            spec.loader.exec_module(module)
            importlib.import_module("pyverbs.device")  # built for another Python? fail here
        except ImportError:
            for name in [n for n in sys.modules if n == "pyverbs" or n.startswith("pyverbs.")]:
                del sys.modules[name]
            continue
        return module
    return None


def device_names() -> list[str]:
    """RDMA devices ibv_get_device_list finds (none without pyverbs or kernel support)."""
    pv = load_pyverbs()
    if pv is None:
        return []
    try:
        devices = pv.device.get_device_list()
    except pv.pyverbs_error.PyverbsError:
        return []  # no InfiniBand support in this kernel
    return [_text(device.name) for device in devices]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def rnr_timer_code(seconds: float) -> int:
    """The smallest min_rnr_timer whose RNR_RETRY + 1 waits cover ``seconds``."""
    wanted_ms = seconds * 1000 / (RNR_RETRY + 1)
    codes = sorted(range(1, 32), key=lambda code: RNR_TIMER_MS[code])
    for code in codes:
        if RNR_TIMER_MS[code] >= wanted_ms:
            return code
    return 0


@dataclass(slots=True, frozen=True)
class Endpoint:
    """What one end of an RC connection tells the other."""

    qp_num: int
    psn: int
    gid: str
    lid: int

    def encode(self) -> bytes:
        data = json.dumps({"qpn": self.qp_num, "psn": self.psn, "gid": self.gid, "lid": self.lid})
        return ENDPOINT.pack(len(data)) + data.encode()

    @classmethod
    def receive(cls, sock: socket.socket) -> Endpoint:
        (length,) = ENDPOINT.unpack(_receive_exactly(sock, ENDPOINT.size))
        if length > MAX_ENDPOINT:
            raise ConnectError("pyverbs handshake: endpoint too long")
        try:
            fields = json.loads(_receive_exactly(sock, length))
            return cls(
                int(fields["qpn"]), int(fields["psn"]), str(fields["gid"]), int(fields["lid"])
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ConnectError(f"pyverbs handshake: {error!r}") from None


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectError("pyverbs handshake: peer closed")
        data += chunk
    return bytes(data)


SEND_OPCODES = {
    Opcode.WRITE: "IBV_WR_RDMA_WRITE",
    Opcode.WRITE_WITH_IMM: "IBV_WR_RDMA_WRITE_WITH_IMM",
    Opcode.READ: "IBV_WR_RDMA_READ",
    Opcode.FETCH_AND_ADD: "IBV_WR_ATOMIC_FETCH_AND_ADD",
    Opcode.COMPARE_AND_SWAP: "IBV_WR_ATOMIC_CMP_AND_SWP",
}


def build_send_wr(
    pv: SimpleNamespace,
    *,
    nic_wr_id: int,
    opcode: Opcode,
    sge: tuple[int, int, int],
    remote_addr: int,
    rkey: int,
    imm: int = 0,
    compare_add: int = 0,
    swap: int = 0,
) -> Any:
    """One signaled SendWR; ``sge`` is (address, length, lkey)."""
    e = pv.enums
    sg = pv.wr.SGE(*sge)
    wr = pv.wr.SendWR(
        wr_id=nic_wr_id,
        opcode=getattr(e, SEND_OPCODES[opcode]),
        num_sge=1,
        sg=[sg],
        send_flags=e.IBV_SEND_SIGNALED,
        imm_data=socket.htonl(imm),
    )
    if opcode in (Opcode.FETCH_AND_ADD, Opcode.COMPARE_AND_SWAP):
        wr.set_wr_atomic(rkey=rkey, addr=remote_addr, compare_add=compare_add, swap=swap)
    else:
        wr.set_wr_rdma(rkey, remote_addr)
    return wr


def build_init_attr(pv: SimpleNamespace, port: int) -> Any:
    """The QPAttr for RESET -> INIT: every remote right, the regions' own flags decide."""
    attr = pv.qp.QPAttr(port_num=port)
    attr.qp_access_flags = ALL_QP_ACCESS
    return attr


def build_rts_attr(
    pv: SimpleNamespace,
    *,
    port: int,
    gid_index: int,
    mtu: int,
    local_psn: int,
    remote: Endpoint,
    rnr_timeout: float,
    max_rd_atomic: int,
) -> Any:
    """The QPAttr that takes an RC QP from INIT to RTS towards ``remote``."""
    attr = pv.qp.QPAttr(port_num=port)
    attr.qp_access_flags = ALL_QP_ACCESS
    attr.path_mtu = mtu
    attr.dest_qp_num = remote.qp_num
    attr.rq_psn = remote.psn
    attr.sq_psn = local_psn
    attr.max_dest_rd_atomic = max_rd_atomic
    attr.max_rd_atomic = max_rd_atomic
    attr.min_rnr_timer = rnr_timer_code(rnr_timeout)
    attr.rnr_retry = RNR_RETRY
    attr.timeout = 14  # 4.096 us * 2**14 = 67 ms per try
    attr.retry_cnt = 7
    route = pv.addr.GlobalRoute(dgid=pv.addr.GID(remote.gid), sgid_index=gid_index)
    attr.ah_attr = pv.addr.AHAttr(port_num=port, is_global=1, gr=route, dlid=remote.lid)
    return attr


class PyverbsContext(Context):
    provider = "pyverbs"

    def __init__(self, device: str | None = None, *, port: int = 1, gid_index: int = 0) -> None:
        pv = load_pyverbs()
        if pv is None:
            raise ProviderUnavailableError("pyverbs is not installed (Debian: python3-pyverbs)")
        names = device_names()
        if not names or (device is not None and device not in names):
            raise ProviderUnavailableError(f"no RDMA device {device or ''} (found {names})")
        self.pv = pv
        self.port = port
        self.gid_index = gid_index
        try:
            self.ctx = pv.device.Context(name=device or names[0])
            self.port_attr = self.ctx.query_port(port)
            self.gid = str(self.ctx.query_gid(port, gid_index))
            self.max_rd_atomic = max(1, min(16, self.ctx.query_device().max_qp_rd_atom))
        except pv.pyverbs_error.PyverbsError as error:
            raise ProviderUnavailableError(f"cannot open RDMA device: {error}") from None
        self._pds: list[PyverbsPd] = []
        self._cqs: list[PyverbsCompletionQueue] = []

    def alloc_pd(self) -> PyverbsPd:
        pd = PyverbsPd(self)
        self._pds.append(pd)
        return pd

    def create_cq(self, depth: int = 256) -> PyverbsCompletionQueue:
        if not 1 <= depth <= MAX_WR:
            raise ValueError(f"CQ depth must be 1..{MAX_WR}")
        cq = PyverbsCompletionQueue(self, depth)
        self._cqs.append(cq)
        return cq

    def close(self) -> None:
        """QPs and MRs (with their PDs) first: a CQ with QPs on it cannot be destroyed."""
        for pd in self._pds:
            pd.close()
        for cq in self._cqs:
            cq.close()
        self._pds.clear()
        self._cqs.clear()
        self.ctx.close()


class PyverbsMemoryRegion(MemoryRegion):
    def __init__(
        self,
        pd: PyverbsPd,
        mapping: mmap.mmap,
        start: int,
        length: int,
        access: Access,
        owns_mapping: bool,
    ) -> None:
        self.pd = pd
        self.length = length
        self.access = access
        self._mapping = mapping
        self._whole = memoryview(mapping)
        self._view = self._whole[start : start + length]
        self._owns_mapping = owns_mapping
        self.addr = _atomics.address(self._view)
        pv = pd.context.pv
        try:
            self._mr = pv.mr.MR(pd.pd, length, int(access), address=self.addr)
        except pv.pyverbs_error.PyverbsError as error:
            self._release()
            raise RegistrationError(
                f"ibv_reg_mr failed: {error} (writable file mappings need a memory-backed "
                "directory on Linux >= 6.5, see ARCHITECTURE.md)"
            ) from None
        self.lkey = int(self._mr.lkey)
        self.rkey = int(self._mr.rkey)
        self._registered = True

    @property
    def buf(self) -> memoryview:
        return self._view

    @property
    def registered(self) -> bool:
        return self._registered

    def local_fetch_and_add(self, offset: int, add: int) -> int:
        """A CPU atomic is not atomic with an RNIC's (ibv IBV_ATOMIC_HCA): the owner would
        have to post the atomic to itself through a loopback queue pair, not built yet."""
        raise ProviderUnavailableError("local atomics on pyverbs need a loopback queue pair")

    def deregister(self) -> None:
        if self._registered:
            self._registered = False
            self._mr.close()  # ibv_dereg_mr: the NIC refuses the rkey from here on
            self._release()

    def close(self) -> None:
        self.deregister()

    def _release(self) -> None:
        self._view.release()
        self._whole.release()
        if self._owns_mapping:
            with contextlib.suppress(BufferError):
                self._mapping.close()


class PyverbsPd(ProtectionDomain):
    def __init__(self, context: PyverbsContext) -> None:
        self.context = context
        self.pd = context.pv.pd.PD(context.ctx)
        self._closables: list[Any] = []

    def register_file(
        self,
        path: str | Path,
        length: int,
        access: Access,
        *,
        offset: int = 0,
        mapping: mmap.mmap | None = None,
    ) -> MemoryRegion:
        check_access_flags(access)
        if length < 1 or offset < 0:
            raise RegistrationError("a region needs length >= 1 at offset >= 0")
        if mapping is None:
            aligned = offset - offset % mmap.ALLOCATIONGRANULARITY
            with open(path, "r+b") as file:
                if Path(path).stat().st_size < offset + length:
                    raise RegistrationError(f"{path} is shorter than the region: preallocate it")
                mapping = mmap.mmap(file.fileno(), offset + length - aligned, offset=aligned)
            return self.track(
                PyverbsMemoryRegion(self, mapping, offset - aligned, length, access, True)
            )
        if len(mapping) < offset + length:
            raise RegistrationError("the mapping does not cover the region")
        return self.track(PyverbsMemoryRegion(self, mapping, offset, length, access, False))

    def allocate(self, length: int, access: Access) -> MemoryRegion:
        check_access_flags(access)
        if length < 1:
            raise RegistrationError("a region needs length >= 1")
        mapping = mmap.mmap(-1, length, flags=mmap.MAP_SHARED)
        return self.track(PyverbsMemoryRegion(self, mapping, 0, length, access, True))

    def track(self, closable: T) -> T:
        """Close ``closable`` with this PD."""
        self._closables.append(closable)
        return closable

    def listen(
        self,
        cq: CompletionQueue,
        caps: QpCaps | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertised_host: str | None = None,
    ) -> Listener:
        listener = PyverbsListener(
            self, _pyverbs_cq(cq), caps or QpCaps(), host, port, advertised_host or host
        )
        return self.track(listener)

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
        if "pyverbs" not in info.providers:
            raise ProviderUnavailableError(f"the peer offers {info.providers}, not pyverbs")
        try:
            sock = socket.create_connection((info.host, info.port), timeout=timeout)
        except OSError as error:
            raise ConnectError(f"pyverbs connect to {info.host}:{info.port}: {error}") from None
        with sock:
            qp = PyverbsQueuePair(self, _pyverbs_cq(cq), caps or QpCaps())
            try:
                sock.sendall(qp.endpoint.encode())
                qp.connect_to(Endpoint.receive(sock))
            except BaseException:
                qp.close()
                raise
        return self.track(qp)

    def close(self) -> None:
        for closable in reversed(self._closables):
            closable.close()
        self._closables.clear()
        self.pd.close()


class PyverbsCompletionQueue(CompletionQueue):
    def __init__(self, context: PyverbsContext, depth: int) -> None:
        self.depth = depth
        self.cq = context.pv.cq.CQ(context.ctx, depth, None, None, 0)
        self._qps: dict[int, PyverbsQueuePair] = {}
        self._reserved = 0
        self._lock = threading.Lock()

    def check_room(self, caps: QpCaps) -> None:
        """QueueFullError unless a QP with ``caps`` fits (checked again by attach)."""
        needed = caps.max_send_wr + caps.max_recv_wr
        if self._reserved + needed > self.depth:
            raise QueueFullError(f"CQ depth {self.depth} cannot take {needed} more entries")

    def attach(self, qp: PyverbsQueuePair, caps: QpCaps) -> None:
        with self._lock:
            self.check_room(caps)
            self._reserved += caps.max_send_wr + caps.max_recv_wr
            self._qps[qp.qp_num] = qp

    def detach(self, qp: PyverbsQueuePair, caps: QpCaps) -> None:
        with self._lock:
            if self._qps.pop(qp.qp_num, None) is qp:
                self._reserved -= caps.max_send_wr + caps.max_recv_wr

    def poll(self, max_entries: int = 16, timeout: float | None = 0.0) -> list[WorkCompletion]:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 20e-6
        while True:
            count, wcs = self.cq.poll(max_entries)
            found = [c for wc in wcs[:count] if (c := self._translate(wc)) is not None]
            if found:
                return found
            if deadline is not None and time.monotonic() >= deadline:
                return []
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def _translate(self, wc: Any) -> WorkCompletion | None:
        """Our completion for the NIC's, None for a QP closed meanwhile."""
        qp = self._qps.get(wc.qp_num)
        return None if qp is None else qp.completed(wc)

    def close(self) -> None:
        self.cq.close()


@dataclass(slots=True)
class _Posted:
    wr_id: int
    opcode: Opcode
    length: int


class PyverbsQueuePair(QueuePair):
    provider = "pyverbs"

    def __init__(self, pd: PyverbsPd, cq: PyverbsCompletionQueue, caps: QpCaps) -> None:
        context = pd.context
        pv = context.pv
        cq.check_room(caps)  # before the NIC allocates anything
        self.caps = caps
        self._pd = pd
        self._cq = cq
        self._pv = pv
        cap = pv.qp.QPCap(
            max_send_wr=caps.max_send_wr,
            max_recv_wr=caps.max_recv_wr,
            max_send_sge=1,
            max_recv_sge=1,
        )
        init = pv.qp.QPInitAttr(
            qp_type=pv.enums.IBV_QPT_RC, scq=cq.cq, rcq=cq.cq, cap=cap, sq_sig_all=1
        )
        try:
            self.qp = pv.qp.QP(pd.pd, init, build_init_attr(pv, context.port))
        except pv.pyverbs_error.PyverbsError as error:
            raise ConnectError(f"cannot create an RC QP: {error}") from None
        self.qp_num = int(self.qp.qp_num)
        self.endpoint = Endpoint(
            self.qp_num, random.getrandbits(24), context.gid, int(context.port_attr.lid)
        )
        # ibv_post_recv needs an SGE even though WRITE_WITH_IMM puts nothing there.
        self._recv_scratch = pd.allocate(ATOMIC_SIZE, Access.LOCAL_WRITE)
        self._sends: deque[tuple[int, _Posted]] = deque()
        self._recvs: deque[tuple[int, int]] = deque()
        self._sequence = 0
        self._state = QpState.RTS
        cq.attach(self, caps)

    @property
    def state(self) -> QpState:
        return self._state

    def connect_to(self, remote: Endpoint) -> None:
        context = self._pd.context
        attr = build_rts_attr(
            self._pv,
            port=context.port,
            gid_index=context.gid_index,
            mtu=int(context.port_attr.active_mtu),
            local_psn=self.endpoint.psn,
            remote=remote,
            rnr_timeout=self.caps.rnr_timeout,
            max_rd_atomic=context.max_rd_atomic,
        )
        try:
            self.qp.to_rts(attr)
        except self._pv.pyverbs_error.PyverbsError as error:
            raise ConnectError(f"cannot move the QP to RTS: {error}") from None

    def post_write(self, wr_id: int, local: Sge, remote_addr: int, rkey: int) -> None:
        self._post(wr_id, Opcode.WRITE, local, remote_addr, rkey)

    def post_write_with_imm(
        self, wr_id: int, local: Sge, remote_addr: int, rkey: int, imm_data: int
    ) -> None:
        check_u32("imm_data", imm_data)
        self._post(wr_id, Opcode.WRITE_WITH_IMM, local, remote_addr, rkey, imm=imm_data)

    def post_read(self, wr_id: int, local: Sge, remote_addr: int, rkey: int) -> None:
        self._post(wr_id, Opcode.READ, local, remote_addr, rkey)

    def post_fetch_and_add(
        self, wr_id: int, local: Sge, remote_addr: int, rkey: int, add: int
    ) -> None:
        check_u64("add", add)
        self._post(wr_id, Opcode.FETCH_AND_ADD, local, remote_addr, rkey, compare_add=add)

    def post_compare_and_swap(
        self, wr_id: int, local: Sge, remote_addr: int, rkey: int, compare: int, swap: int
    ) -> None:
        check_u64("compare", compare)
        check_u64("swap", swap)
        self._post(
            wr_id,
            Opcode.COMPARE_AND_SWAP,
            local,
            remote_addr,
            rkey,
            compare_add=compare,
            swap=swap,
        )

    def post_recv(self, wr_id: int) -> None:
        check_u64("wr_id", wr_id)
        self._check_open()
        if len(self._recvs) >= self.caps.max_recv_wr:
            raise QueueFullError(f"{self.caps.max_recv_wr} receives outstanding")
        nic_wr_id = self._next_nic_wr_id() | RECV_BIT
        scratch = self._recv_scratch
        sge = self._pv.wr.SGE(scratch.addr, scratch.length, scratch.lkey)
        self._recvs.append((nic_wr_id, wr_id))
        try:
            self.qp.post_recv(self._pv.wr.RecvWR(wr_id=nic_wr_id, num_sge=1, sg=[sge]))
        except self._pv.pyverbs_error.PyverbsError as error:
            self._recvs.pop()
            raise InvalidWorkRequestError(f"ibv_post_recv: {error}") from None

    def completed(self, wc: Any) -> WorkCompletion:
        """Translate the NIC's completion of one of this QP's WRs (the CQ's poller)."""
        status = _status(wc.status)
        if status is not WcStatus.SUCCESS:
            self._state = QpState.ERROR if self._state is QpState.RTS else self._state
        if wc.wr_id & RECV_BIT:
            nic_wr_id, wr_id = self._recvs.popleft()
            assert nic_wr_id == wc.wr_id, "receive completions out of order"
            imm = socket.ntohl(wc.imm_data) if status is WcStatus.SUCCESS else None
            byte_len = int(wc.byte_len) if status is WcStatus.SUCCESS else 0
            return WorkCompletion(
                wr_id, status, Opcode.RECV_RDMA_WITH_IMM, byte_len, self.qp_num, imm
            )
        nic_wr_id, posted = self._sends.popleft()
        assert nic_wr_id == wc.wr_id, "send completions out of order"
        byte_len = posted.length if status is WcStatus.SUCCESS else 0
        return WorkCompletion(posted.wr_id, status, posted.opcode, byte_len, self.qp_num)

    def close(self) -> None:
        if self._state is QpState.CLOSED:
            return
        self._state = QpState.CLOSED
        self._cq.detach(self, self.caps)
        self.qp.close()
        self._recv_scratch.deregister()

    def _post(
        self,
        wr_id: int,
        opcode: Opcode,
        local: Sge,
        remote_addr: int,
        rkey: int,
        *,
        imm: int = 0,
        compare_add: int = 0,
        swap: int = 0,
    ) -> None:
        check_u64("wr_id", wr_id)
        check_u64("remote_addr", remote_addr)
        check_u32("rkey", rkey)
        self._check_open()
        if local.length > self.caps.max_message or local.offset < 0 or local.length < 0:
            raise InvalidWorkRequestError("local buffer out of range or over max_message")
        if opcode in (Opcode.FETCH_AND_ADD, Opcode.COMPARE_AND_SWAP) and local.length != 8:
            raise InvalidWorkRequestError("atomics need an 8-byte local buffer")
        if len(self._sends) >= self.caps.max_send_wr:
            raise QueueFullError(f"{self.caps.max_send_wr} send work requests outstanding")
        mr = local.mr
        nic_wr_id = self._next_nic_wr_id()
        wr = build_send_wr(
            self._pv,
            nic_wr_id=nic_wr_id,
            opcode=opcode,
            sge=(mr.addr + local.offset, local.length, mr.lkey),
            remote_addr=remote_addr,
            rkey=rkey,
            imm=imm,
            compare_add=compare_add,
            swap=swap,
        )
        self._sends.append((nic_wr_id, _Posted(wr_id, opcode, local.length)))
        try:
            self.qp.post_send(wr)
        except self._pv.pyverbs_error.PyverbsError as error:
            self._sends.pop()
            raise InvalidWorkRequestError(f"ibv_post_send: {error}") from None

    def _next_nic_wr_id(self) -> int:
        self._sequence += 1
        return self._sequence

    def _check_open(self) -> None:
        if self._state is QpState.CLOSED:
            raise InvalidWorkRequestError("queue pair closed")


class PyverbsListener(Listener):
    """Accepts RC connections: the QP exchange runs over a TCP connection to this port."""

    def __init__(
        self,
        pd: PyverbsPd,
        cq: PyverbsCompletionQueue,
        caps: QpCaps,
        host: str,
        port: int,
        advertised_host: str,
    ) -> None:
        self._pd = pd
        self._cq = cq
        self._caps = caps
        self._server = socket.create_server((host, port))
        self.conn_info = ConnInfo(("pyverbs",), advertised_host, self._server.getsockname()[1])

    def accept(self, timeout: float | None = None) -> QueuePair:
        self._server.settimeout(timeout)
        try:
            sock, _address = self._server.accept()
        except TimeoutError:
            raise TimeoutError("no connection within the timeout") from None
        with sock:
            sock.settimeout(5.0 if timeout is None else timeout)
            remote = Endpoint.receive(sock)
            qp = PyverbsQueuePair(self._pd, self._cq, self._caps)
            try:
                qp.connect_to(remote)
                sock.sendall(qp.endpoint.encode())
            except BaseException:
                qp.close()
                raise
        return self._pd.track(qp)

    def close(self) -> None:
        self._server.close()


def _status(value: int) -> WcStatus:
    try:
        return WcStatus(int(value))
    except ValueError:
        return WcStatus.GENERAL_ERR


def _pyverbs_cq(cq: CompletionQueue) -> PyverbsCompletionQueue:
    if not isinstance(cq, PyverbsCompletionQueue):
        raise TypeError("this CQ belongs to another provider's context")
    return cq
