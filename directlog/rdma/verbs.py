"""The provider-neutral verbs API: what the RDMA datapaths program against.

Modelled on ibverbs, small: a Context (one open device or software provider) hands out
protection domains; a protection domain registers memory regions and connects reliable
(RC) queue pairs; a queue pair posts one-sided operations on a peer's registered memory;
a completion queue reports them. The datapaths never learn which provider runs them
(pyverbs on an RNIC, shm on this host, tcp across hosts); docs/rdma.md says what each
provider guarantees.

Semantics every provider keeps:

* Ops on one QP execute and complete in order (RC). A local buffer named by a posted op
  must stay untouched until its completion is polled.
* A refused op (unknown or revoked rkey, out of bounds, a missing access right, another PD)
  never touches remote memory; it completes with an error status and moves the QP to
  ERROR, after which every outstanding and later op completes with WR_FLUSH_ERR.
* Every queue is bounded: a QP holds at most ``max_send_wr`` send WRs and ``max_recv_wr``
  receive WRs not yet polled, and the QPs of one CQ together never exceed its depth, so a
  CQ cannot overflow. Posting past a bound raises QueueFullError; nothing grows.
"""

from __future__ import annotations

import asyncio
import enum
import json
import mmap
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NamedTuple, Self

from directlog.rdma import _atomics

MAX_WR = 1 << 16
"""Upper bound on any queue depth (send, receive, CQ), as RNICs have."""

DEFAULT_MAX_MESSAGE = 16 << 20
"""Largest single op by default: what one tcp frame may carry and what a peer must buffer."""

MAX_CONN_INFO = 4096
"""Longest encoded connection info accepted (it travels inside a Kafka-protocol answer)."""

ATOMIC_SIZE = 8


class RdmaError(Exception):
    """Base of every error the verbs layer raises (completions carry statuses instead)."""


class ProviderUnavailableError(RdmaError):
    """The requested provider cannot run here (no pyverbs, no device, peer not on this host)."""


class RegistrationError(RdmaError):
    """A memory region could not be registered (bad range, bad flags, table full)."""


class ConnectError(RdmaError):
    """Queue pair connection setup failed (refused, timed out, handshake mismatch)."""


class QueueFullError(RdmaError):
    """A bounded queue is full: poll completions before posting more."""


class InvalidWorkRequestError(RdmaError, ValueError):
    """A work request is malformed (bad immediate, size over max_message, closed QP)."""


class Access(enum.IntFlag):
    """Memory region access rights; the values are ibv_access_flags'."""

    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8


class Opcode(enum.IntEnum):
    """What a work completion reports."""

    WRITE = 0
    WRITE_WITH_IMM = 1
    READ = 2
    FETCH_AND_ADD = 3
    COMPARE_AND_SWAP = 4
    RECV_RDMA_WITH_IMM = 5


class WcStatus(enum.IntEnum):
    """Work completion status; the values (and meanings) are ibv_wc_status'."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    BAD_RESP_ERR = 7
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    GENERAL_ERR = 21


class QpState(enum.Enum):
    """RTS: ops flow. ERROR: everything flushes. CLOSED: close() was called."""

    RTS = "rts"
    ERROR = "error"
    CLOSED = "closed"


class WorkCompletion(NamedTuple):
    """One completed work request. ``imm_data`` is set on RECV_RDMA_WITH_IMM only;
    ``byte_len`` is the bytes moved (for a receive: the bytes the peer wrote). A named
    tuple, like Sge: one is made per op, and a frozen dataclass costs 4x more to make."""

    wr_id: int
    status: WcStatus
    opcode: Opcode
    byte_len: int
    qp_num: int
    imm_data: int | None = None

    @property
    def ok(self) -> bool:
        return self.status is WcStatus.SUCCESS


@dataclass(slots=True, frozen=True)
class QpCaps:
    """A queue pair's bounds. ``rnr_timeout``: how long a WRITE_WITH_IMM waits for the
    peer to post a receive before it fails with RNR_RETRY_EXC_ERR."""

    max_send_wr: int = 64
    max_recv_wr: int = 64
    max_message: int = DEFAULT_MAX_MESSAGE
    rnr_timeout: float = 1.0

    def __post_init__(self) -> None:
        if not (1 <= self.max_send_wr <= MAX_WR and 1 <= self.max_recv_wr <= MAX_WR):
            raise ValueError(f"queue depths must be 1..{MAX_WR}")
        if not 1 <= self.max_message < 1 << 31:
            raise ValueError("max_message must be 1..2**31-1")
        if self.rnr_timeout < 0:
            raise ValueError("rnr_timeout must not be negative")


@dataclass(slots=True, frozen=True)
class ConnInfo:
    """How to reach a listener: what a broker hands a client (``encode()`` is a str).

    ``providers`` are those the listener accepts ("pyverbs", "shm", "tcp"); ``host`` and
    ``port`` reach its TCP endpoint (the tcp transport, or pyverbs' QP exchange); ``path``
    is its Unix socket (shm) and ``host_id`` this kernel's boot id, so a client can tell it
    runs on the same host."""

    providers: tuple[str, ...]
    host: str = ""
    port: int = 0
    path: str = ""
    host_id: str = ""

    def encode(self) -> str:
        return json.dumps(
            {
                "providers": list(self.providers),
                "host": self.host,
                "port": self.port,
                "path": self.path,
                "host_id": self.host_id,
            },
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: str | bytes) -> ConnInfo:
        """Parse ``encode()``'s output, trusting nothing: ValueError on anything else."""
        if len(text) > MAX_CONN_INFO:
            raise ValueError("connection info too long")
        try:
            fields = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"connection info is not JSON: {error}") from None
        if not isinstance(fields, dict):
            raise ValueError("connection info must be an object")
        providers = fields.get("providers")
        port = fields.get("port", 0)
        strings = [fields.get(name, "") for name in ("host", "path", "host_id")]
        if (
            not isinstance(providers, list)
            or not providers
            or not all(isinstance(p, str) for p in providers)
            or not isinstance(port, int)
            or not 0 <= port <= 65535
            or not all(isinstance(s, str) for s in strings)
        ):
            raise ValueError("malformed connection info")
        host, path, host_id = strings
        return cls(tuple(providers), host, port, path, host_id)


class MemoryRegion(ABC):
    """Registered memory: ``addr``/``rkey``/``length`` are what a peer needs to reach it,
    ``buf`` is the owner's own view. Registration pins the mapping it was given (closing
    that mmap raises BufferError until deregister())."""

    addr: int
    length: int
    lkey: int
    rkey: int
    access: Access

    @property
    @abstractmethod
    def buf(self) -> memoryview:
        """The region's bytes, for the owner's local reads and writes."""

    @property
    @abstractmethod
    def registered(self) -> bool: ...

    @abstractmethod
    def deregister(self) -> None:
        """Revoke remote access at once: no op admitted after this returns; ops admitted
        before it have finished when it returns (see docs/rdma.md for the shm bound)."""

    def local_fetch_and_add(self, offset: int, add: int) -> int:
        """FETCH_AND_ADD by the owner on its own word at ``offset``, atomic with the
        peers' FETCH_AND_ADD and COMPARE_AND_SWAP on it; returns the old value. A CPU
        atomic, which is what remote atomics are on shm and tcp (pyverbs overrides)."""
        if offset % ATOMIC_SIZE or not 0 <= offset <= self.length - ATOMIC_SIZE:
            raise InvalidWorkRequestError(f"no aligned 8-byte word at offset {offset}")
        return int(_atomics.fetch_add(self.buf, offset, add % (1 << 64)))

    def sge(self, offset: int = 0, length: int | None = None) -> Sge:
        """A local buffer inside this region, for posting."""
        return Sge(self, offset, self.length - offset if length is None else length)


class Sge(NamedTuple):
    """A local buffer: ``length`` bytes at ``offset`` of a registered region."""

    mr: MemoryRegion
    offset: int
    length: int


class CompletionQueue(ABC):
    """Completions of every QP created on it. Bounded by ``depth`` (see module doc)."""

    depth: int

    @abstractmethod
    def poll(self, max_entries: int = 16, timeout: float | None = 0.0) -> list[WorkCompletion]:
        """Up to ``max_entries`` completions. ``timeout`` 0 returns at once, a number waits
        up to that many seconds for the first one, None waits as long as it takes. Waiting
        blocks (a doorbell or a condition), it does not spin."""

    def doorbell(self) -> Doorbell | None:
        """What an event loop can wait on instead of a thread in ``poll`` (ibverbs'
        completion channel), rung for every completion from now on; None when the provider
        has none."""
        return None

    def armed(self) -> AbstractContextManager[Doorbell | None]:
        """A doorbell rung only for completions added while the context lasts (None when
        the provider has none): a poster that seldom waits pays no system call per op,
        as it does once ``doorbell()`` was called."""
        return nullcontext()

    async def poll_async(self, max_entries: int, timeout: float) -> list[WorkCompletion]:
        """``poll`` for an event loop: waits up to ``timeout`` seconds on the armed doorbell
        without a thread, or (no doorbell) in a thread."""
        found = self.poll(max_entries, timeout=0)
        if found or timeout <= 0:
            return found
        with self.armed() as bell:
            if bell is None:
                return await asyncio.to_thread(self.poll, max_entries, timeout)
            found = self.poll(max_entries, timeout=0)  # added before the arming: no ring
            if found:
                return found
            loop = asyncio.get_running_loop()
            rung = loop.create_future()
            loop.add_reader(bell.fd, _settle, rung)
            try:
                async with asyncio.timeout(timeout):
                    await rung
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(bell.fd)
            bell.heard()
        return self.poll(max_entries, timeout=0)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@dataclass(frozen=True, slots=True)
class Doorbell:
    """``fd`` turns readable whenever a completion is added; call ``heard()`` when it did,
    before polling, to reset it."""

    fd: int
    heard: Callable[[], None]


class QueuePair(ABC):
    """One end of a reliable connection. Post from one thread at a time."""

    qp_num: int
    provider: str

    @property
    @abstractmethod
    def state(self) -> QpState: ...

    @abstractmethod
    def post_write(self, wr_id: int, local: Sge, remote_addr: int, rkey: int) -> None:
        """Copy ``local`` to the peer's memory at ``remote_addr`` (needs REMOTE_WRITE)."""

    @abstractmethod
    def post_write_with_imm(
        self, wr_id: int, local: Sge, remote_addr: int, rkey: int, imm_data: int
    ) -> None:
        """A WRITE whose arrival consumes one of the peer's posted receives and completes it
        with ``imm_data`` (32 bits) after the data is in place."""

    @abstractmethod
    def post_read(self, wr_id: int, local: Sge, remote_addr: int, rkey: int) -> None:
        """Copy the peer's memory into ``local`` (needs REMOTE_READ, and LOCAL_WRITE here)."""

    @abstractmethod
    def post_fetch_and_add(
        self, wr_id: int, local: Sge, remote_addr: int, rkey: int, add: int
    ) -> None:
        """Atomically add ``add`` to the peer's 8-byte aligned native-endian word; the old
        value lands in ``local`` (8 bytes). Needs REMOTE_ATOMIC."""

    @abstractmethod
    def post_compare_and_swap(
        self, wr_id: int, local: Sge, remote_addr: int, rkey: int, compare: int, swap: int
    ) -> None:
        """Atomically replace the peer's word with ``swap`` if it equals ``compare``; the
        old value lands in ``local`` either way."""

    @abstractmethod
    def post_recv(self, wr_id: int) -> None:
        """A receive for one incoming WRITE_WITH_IMM (no buffer: the data goes where the
        peer wrote it)."""

    @abstractmethod
    def close(self) -> None:
        """Disconnect: outstanding WRs flush, the peer's QP goes to ERROR."""


class Listener(ABC):
    """The passive side of connection setup."""

    conn_info: ConnInfo

    @abstractmethod
    def accept(self, timeout: float | None = None) -> QueuePair:
        """The next connecting peer's QP; TimeoutError when none came in time."""

    @abstractmethod
    def close(self) -> None: ...


class ProtectionDomain(ABC):
    """Owns memory regions and queue pairs: a QP reaches only regions of its peer's PD."""

    @abstractmethod
    def register_file(
        self,
        path: str | Path,
        length: int,
        access: Access,
        *,
        offset: int = 0,
        mapping: mmap.mmap | None = None,
    ) -> MemoryRegion:
        """Register ``length`` bytes at ``offset`` of a file that already has them (a
        preallocated segment). ``mapping``, if given, is the caller's MAP_SHARED mmap of
        that file from byte 0, so the region and the caller see the same pages."""

    @abstractmethod
    def allocate(self, length: int, access: Access) -> MemoryRegion:
        """Register fresh zeroed memory the provider allocates (shared, for shm peers)."""

    @abstractmethod
    def listen(
        self,
        cq: CompletionQueue,
        caps: QpCaps | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertised_host: str | None = None,
    ) -> Listener:
        """Accept RC connections; QPs accepted get ``caps`` and report to ``cq``."""

    @abstractmethod
    def connect(
        self,
        info: ConnInfo | str,
        cq: CompletionQueue,
        caps: QpCaps | None = None,
        *,
        timeout: float = 5.0,
    ) -> QueuePair:
        """The active side: connect to a listener's ``conn_info``."""


class Context(ABC):
    """An open provider: the root every other object hangs from."""

    provider: str

    @abstractmethod
    def alloc_pd(self) -> ProtectionDomain: ...

    @abstractmethod
    def create_cq(self, depth: int = 256) -> CompletionQueue: ...

    @abstractmethod
    def close(self) -> None:
        """Close every QP and deregister every region of this context."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def check_access_flags(access: Access) -> None:
    """ibverbs' rule: remote write or atomic rights need LOCAL_WRITE too."""
    remote_mutation = Access.REMOTE_WRITE | Access.REMOTE_ATOMIC
    if access & remote_mutation and not access & Access.LOCAL_WRITE:
        raise RegistrationError("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE")


def check_u32(name: str, value: int) -> None:
    if not 0 <= value < 1 << 32:
        raise InvalidWorkRequestError(f"{name} must be a 32-bit unsigned value")


def check_u64(name: str, value: int) -> None:
    if not 0 <= value < 1 << 64:
        raise InvalidWorkRequestError(f"{name} must be a 64-bit unsigned value")
