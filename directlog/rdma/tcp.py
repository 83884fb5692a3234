"""The tcp transport: RC queue pairs emulated over a TCP connection (like soft-iWARP).

Both ends may post. A posted op becomes a request frame (tcp_framing) sent from the
posting thread when the socket takes it, else queued for the progress thread. The peer's
progress thread executes requests in arrival order on its own registered memory, checking
each against its region table exactly as a shm peer would (admit/finish, so deregistration
still revokes at once), and answers each with a RESPONSE; the initiator completes its ops
as the answers arrive, in order. WRITE payloads are received straight into the target
region and READ answers straight into the initiator's buffer (recv_into, no staging copy).

A WRITE_WITH_IMM with no receive posted at the target parks that connection (RNR): its
reading stops until a receive is posted or rnr_timeout passes, when the op fails with
RNR_RETRY_EXC_ERR. Any error answer, a broken frame or the connection's end moves the QP
to ERROR; when the peer vanished, the oldest outstanding op completes with RETRY_EXC_ERR
and the rest flush, as on an RC transport whose retries ran out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass

from directlog.rdma import _atomics
from directlog.rdma.progress import HANGUP, READ, WRITE, Connection
from directlog.rdma.region_table import Entry
from directlog.rdma.soft_core import (
    NATIVE_WORD,
    REMOTE_ATOMIC,
    REMOTE_READ,
    REMOTE_WRITE,
    SendWr,
    SoftCompletionQueue,
    SoftMemoryRegion,
    SoftQueuePair,
    SoftResources,
)
from directlog.rdma.tcp_framing import (
    ATOMICS,
    HEADER,
    HELLO,
    OPERANDS,
    WORD,
    FramingError,
    Header,
    Hello,
    Kind,
    decode_header,
    decode_hello,
    decode_operands,
    encode_atomic,
    encode_hello,
    encode_request,
    encode_response,
)
from directlog.rdma.verbs import (
    ConnectError,
    Opcode,
    QpCaps,
    QpState,
    WcStatus,
)

log = logging.getLogger(__name__)

KIND_OF = {
    Opcode.WRITE: Kind.WRITE,
    Opcode.WRITE_WITH_IMM: Kind.WRITE_IMM,
    Opcode.READ: Kind.READ,
    Opcode.FETCH_AND_ADD: Kind.FETCH_ADD,
    Opcode.COMPARE_AND_SWAP: Kind.CMP_SWAP,
}
OUT_LIMIT = 8 << 20
"""Queued outgoing bytes past which this end stops reading requests (backpressure)."""
FRAMES_PER_EVENT = 64
SCRATCH = 64 << 10
LINGER = 2.0
"""How long a closing connection may take to hand its last frames to the kernel."""


@dataclass(slots=True)
class _Pending:
    wr: SendWr
    psn: int


class TcpQueuePair(SoftQueuePair, Connection):
    def __init__(
        self,
        resources: SoftResources,
        *,
        qp_num: int,
        pd: int,
        cq: SoftCompletionQueue,
        caps: QpCaps,
    ) -> None:
        super().__init__(
            resources, qp_num=qp_num, pd=pd, cq=cq, caps=caps, provider="tcp", ring=False
        )
        self._sock: socket.socket | None = None
        self._fd = -1
        self._psn = 0
        self._outstanding: deque[_Pending] = deque()
        self._lost = False
        # Outgoing frames; _send_lock also orders every interest update.
        self._send_lock = threading.RLock()
        self._out: deque[memoryview] = deque()
        self._out_bytes = 0
        self._closing_since: float | None = None
        self._closed = False
        self._send_failed = False
        # The frame being received, and how far.
        self._header = bytearray(HEADER.size)
        self._header_got = 0
        self._frame: Header | None = None
        self._got = 0
        self._status = WcStatus.SUCCESS
        self._executing = True
        self._entry: Entry | None = None
        self._operands = bytearray(OPERANDS.size)
        self._word = bytearray(WORD.size)
        self._scratch = bytearray(SCRATCH)
        self._parked_until: float | None = None
        self._peer_rnr_timeout = caps.rnr_timeout

    def start(self, sock: socket.socket, peer: Hello) -> None:
        """Go live on a connected, handshaken socket."""
        self.caps = dataclasses.replace(
            self.caps, max_message=min(self.caps.max_message, peer.max_message)
        )
        self._peer_rnr_timeout = peer.rnr_timeout_ms / 1000
        self._sock = sock
        self._fd = sock.fileno()
        sock.setblocking(False)
        self._resources.engine.add(self)

    # -- posting (the application's thread)

    def _execute(self, wr: SendWr) -> None:
        with self._lock:
            if self._state is not QpState.RTS:
                self._complete(wr, WcStatus.WR_FLUSH_ERR)
                return
            psn = self._psn
            self._psn = (psn + 1) & 0xFFFFFFFF
            self._outstanding.append(_Pending(wr, psn))
        kind = KIND_OF[wr.opcode]
        if kind in ATOMICS:
            self._send([encode_atomic(kind, psn, wr.rkey, wr.remote_addr, wr.compare_add, wr.swap)])
            return
        header = encode_request(kind, psn, wr.rkey, wr.remote_addr, wr.local.length, wr.imm)
        if kind is Kind.READ:
            self._send([header])
        else:
            self._send([header, self._local_view(wr)])

    def _recv_added(self) -> None:
        if self._parked_until is not None:
            self._resources.engine.kick(self)

    # -- sending (any thread)

    def _send(self, parts: list[bytes | memoryview]) -> None:
        with self._send_lock:
            if self._closed or self._closing_since is not None:
                return
            views = [memoryview(part) for part in parts]
            if not self._out:
                views = self._write(views)
            if views:
                self._out.extend(views)
                self._out_bytes += sum(len(view) for view in views)
                self._update()

    def _write(self, views: list[memoryview]) -> list[memoryview]:
        """Send what the socket takes now (``_send_lock`` held); what is left."""
        assert self._sock is not None
        try:
            sent = self._sock.sendmsg(views)
        except (BlockingIOError, InterruptedError):
            return views
        except OSError:
            self._send_failed = True
            self._resources.engine.kick(self)  # the progress thread tears it down
            return []
        while views and sent >= len(views[0]):
            sent -= len(views.pop(0))
        if sent:
            views[0] = views[0][sent:]
        return views

    def _flush_out(self) -> None:
        with self._send_lock:
            while self._out and not self._closed:
                batch = [self._out.popleft() for _ in range(min(len(self._out), 64))]
                before = sum(len(view) for view in batch)
                left = self._write(batch)
                self._out_bytes -= before - sum(len(view) for view in left)
                self._out.extendleft(reversed(left))
                if left:
                    break
            if not self._out and self._closing_since is not None:
                self._shutdown()
            self._update()

    def _update(self) -> None:
        with self._send_lock:
            if not self._closed:
                self._resources.engine.update(self)

    def _shutdown(self) -> None:
        assert self._sock is not None
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def _disconnect(self) -> None:
        with self._send_lock:
            if self._closing_since is not None or self._sock is None:
                return
            self._closing_since = time.monotonic()
            if not self._out:
                self._shutdown()
            self._update()

    # -- the progress thread

    def fileno(self) -> int:
        return self._fd

    def interest(self) -> int:
        reading = self._parked_until is None and self._out_bytes < OUT_LIMIT
        return (READ if reading else 0) | (WRITE if self._out else 0)

    def deadline(self) -> float | None:
        if self._closing_since is not None:
            return self._closing_since + LINGER
        return self._parked_until

    def on_deadline(self) -> None:
        if self._closing_since is not None:
            self.fail("closing connection lingered")
        elif self._parked_until is not None:
            self._parked_until = None
            frame = self._frame
            assert frame is not None
            self._status = WcStatus.RNR_RETRY_EXC_ERR
            self._respond(frame.psn, self._status)
            self._error()
            if frame.trailing() == 0:
                self._frame = None
            self._update()  # read on: the payload goes to scratch, then EOF ends it

    def on_kick(self) -> None:
        """A send failed in another thread, or a receive was posted while parked."""
        if self._closed:
            return
        if self._send_failed:
            self.fail("send failed")
        elif self._parked_until is not None and self._recv_wr:
            self._parked_until = None
            self._update()
            self._begin_frame()
            self._read()

    def on_events(self, events: int) -> None:
        if events & HANGUP and self._parked_until is not None:
            self.fail("peer hung up")
            return
        if events & WRITE:
            self._flush_out()
        if events & (READ | HANGUP):
            self._read()

    def fail(self, reason: str) -> None:
        log.debug("tcp qp %d: %s", self.qp_num, reason)
        self._lost = self._closing_since is None
        self._error()
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
            self._out.clear()
            self._out_bytes = 0
        self._resources.engine.remove(self)
        assert self._sock is not None
        self._sock.close()

    def _flush(self) -> None:
        first = WcStatus.RETRY_EXC_ERR if self._lost else WcStatus.WR_FLUSH_ERR
        while self._outstanding:
            self._complete(self._outstanding.popleft().wr, first)
            first = WcStatus.WR_FLUSH_ERR
        super()._flush()

    def _recv_into(self, view: memoryview) -> int | None:
        """Bytes received into ``view``; None when there are none now. EOF tears down."""
        assert self._sock is not None
        try:
            received = self._sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            received = 0
        if received == 0:
            self.fail("peer closed the connection")
            return None
        return received

    def _read(self) -> None:
        for _ in range(FRAMES_PER_EVENT):
            if self._closed or self._parked_until is not None:
                return
            if self._frame is None:
                if not self._read_header():
                    return
                try:
                    self._frame = decode_header(self._header, self.caps.max_message)
                except FramingError as error:
                    self.fail(f"bad frame: {error}")
                    return
                self._got = 0
                self._begin_frame()
            elif not self._read_trailing():
                return

    def _read_header(self) -> bool:
        view = memoryview(self._header)
        while self._header_got < HEADER.size:
            received = self._recv_into(view[self._header_got :])
            if received is None:
                return False
            self._header_got += received
        self._header_got = 0
        return True

    def _begin_frame(self) -> None:
        """Act on a decoded header: finish the frame at once if nothing follows it."""
        frame = self._frame
        assert frame is not None
        self._executing = frame.kind is Kind.RESPONSE or self._state is QpState.RTS
        if not self._executing:
            self._status = WcStatus.WR_FLUSH_ERR  # after an error nothing more is executed
        elif frame.kind is Kind.RESPONSE:
            self._begin_response(frame)
        elif frame.kind is Kind.WRITE_IMM and self._park_unless_receive():
            return
        elif frame.kind in (Kind.WRITE, Kind.WRITE_IMM):
            self._status, self._entry = self._check(frame, REMOTE_WRITE, frame.length)
        elif frame.kind is Kind.READ:
            self._serve_read(frame)
        if self._frame is not None and self._frame.trailing() == 0:
            self._end_frame()

    def _park_unless_receive(self) -> bool:
        """RNR: stop reading until a receive is posted for this WRITE_IMM (True) or go on."""
        with self._lock:
            if self._recv_wr or self._state is not QpState.RTS:
                return False
            self._parked_until = time.monotonic() + self._peer_rnr_timeout
        self._update()
        return True

    def _read_trailing(self) -> bool:
        """Receive more of the current frame's trailing bytes; False when none are there."""
        frame = self._frame
        assert frame is not None
        remaining = frame.trailing() - self._got
        if not self._executing:
            received = self._recv_into(memoryview(self._scratch)[: min(remaining, SCRATCH)])
        elif frame.kind in (Kind.WRITE, Kind.WRITE_IMM) and self._status is WcStatus.SUCCESS:
            received = self._receive_into_region(frame, remaining)
        elif frame.kind in ATOMICS:
            received = self._recv_into(memoryview(self._operands)[self._got :])
        elif frame.kind is Kind.RESPONSE and self._status is WcStatus.SUCCESS:
            received = self._recv_into(self._response_target()[self._got :])
        else:
            received = self._recv_into(memoryview(self._scratch)[: min(remaining, SCRATCH)])
        if received is None:
            return False
        self._got += received
        if self._got == frame.trailing():
            self._end_frame()
        return True

    def _receive_into_region(self, frame: Header, remaining: int) -> int | None:
        """One recv straight into the target region, admitted in the table for its length."""
        entry = self._entry
        assert entry is not None
        table = self._resources.table.view
        if not table.admit(entry):
            self._status = WcStatus.REM_ACCESS_ERR
            return 0
        try:
            region = self._resources.regions[entry.rkey]
            start = frame.addr - entry.addr + self._got
            with region.buf[start : start + remaining] as target:
                received = self._recv_into(target)
        finally:
            if not table.finish(entry):
                self._status = WcStatus.REM_ACCESS_ERR
        return received

    def _end_frame(self) -> None:
        frame = self._frame
        assert frame is not None
        self._frame = None
        if not self._executing:
            return
        if frame.kind is Kind.RESPONSE:
            self._end_response()
            return
        if frame.kind in ATOMICS:
            self._serve_atomic(frame)
            return
        if frame.kind is Kind.READ:
            return  # answered in _begin_frame
        status = self._status
        self._respond(frame.psn, status)
        if status is not WcStatus.SUCCESS:
            self._error()
        elif frame.kind is Kind.WRITE_IMM:
            with self._lock:
                if self._recv_wr:
                    self._push_recv(self._recv_wr.popleft(), status, frame.length, frame.imm)

    def _check(self, frame: Header, needed: int, length: int) -> tuple[WcStatus, Entry | None]:
        entry = self._resources.table.view.lookup(frame.rkey)
        if entry is None:
            return WcStatus.REM_ACCESS_ERR, None
        return entry.check(frame.addr, length, needed, self._pd), entry

    def _region_of(self, entry: Entry) -> SoftMemoryRegion:
        return self._resources.regions[entry.rkey]

    def _serve_read(self, frame: Header) -> None:
        status, entry = self._check(frame, REMOTE_READ, frame.length)
        data = b""
        if entry is not None and status is WcStatus.SUCCESS:
            table = self._resources.table.view
            if table.admit(entry):
                start = frame.addr - entry.addr
                data = bytes(self._region_of(entry).buf[start : start + frame.length])
                if not table.finish(entry):
                    status, data = WcStatus.REM_ACCESS_ERR, b""
            else:
                status = WcStatus.REM_ACCESS_ERR
        if status is WcStatus.SUCCESS:
            self._send([encode_response(frame.psn, status, len(data)), data])
        else:
            self._respond(frame.psn, status)
            self._error()

    def _serve_atomic(self, frame: Header) -> None:
        compare_add, swap = decode_operands(self._operands)
        status, entry = self._check(frame, REMOTE_ATOMIC, WORD.size)
        if status is WcStatus.SUCCESS and frame.addr % 8:
            status = WcStatus.REM_INV_REQ_ERR
        old = 0
        if entry is not None and status is WcStatus.SUCCESS:
            table = self._resources.table.view
            if table.admit(entry):
                at = frame.addr - entry.addr
                buf = self._region_of(entry).buf
                if frame.kind is Kind.FETCH_ADD:
                    old = _atomics.fetch_add(buf, at, compare_add)
                else:
                    old = _atomics.compare_exchange(buf, at, compare_add, swap)
                if not table.finish(entry):
                    status = WcStatus.REM_ACCESS_ERR
            else:
                status = WcStatus.REM_ACCESS_ERR
        if status is WcStatus.SUCCESS:
            self._send([encode_response(frame.psn, status, WORD.size), WORD.pack(old)])
        else:
            self._respond(frame.psn, status)
            self._error()

    def _respond(self, psn: int, status: WcStatus) -> None:
        self._send([encode_response(psn, status)])

    # -- answers to this end's ops

    def _begin_response(self, frame: Header) -> None:
        if not self._outstanding or self._outstanding[0].psn != frame.psn:
            self.fail(f"answer {frame.psn} to no outstanding op")
            self._frame = None
            return
        wr = self._outstanding[0].wr
        self._status = frame.status
        if frame.status is not WcStatus.SUCCESS:
            return
        expected = {Opcode.READ: wr.local.length, Opcode.FETCH_AND_ADD: WORD.size}.get(
            wr.opcode, WORD.size if wr.opcode is Opcode.COMPARE_AND_SWAP else 0
        )
        if frame.length != expected:
            self._status = WcStatus.BAD_RESP_ERR
            self.fail(f"answer of {frame.length} bytes to an op expecting {expected}")
            self._frame = None
            return
        if wr.opcode is Opcode.READ and not wr.local.mr.registered:
            self._status = WcStatus.LOC_PROT_ERR  # the answer goes to scratch

    def _response_target(self) -> memoryview:
        wr = self._outstanding[0].wr
        if wr.opcode is Opcode.READ:
            return self._local_view(wr)
        return memoryview(self._word)

    def _end_response(self) -> None:
        with self._lock:
            if not self._outstanding:
                return  # flushed meanwhile
            wr = self._outstanding.popleft().wr
        status = self._status
        if status is WcStatus.SUCCESS and wr.opcode in (
            Opcode.FETCH_AND_ADD,
            Opcode.COMPARE_AND_SWAP,
        ):
            (old,) = WORD.unpack(self._word)
            with self._local_view(wr) as local:
                NATIVE_WORD.pack_into(local, 0, old)
        if status is WcStatus.SUCCESS:
            self._complete(wr, status)
        else:
            self._fail(wr, status)


def handshake(qp: TcpQueuePair, sock: socket.socket, timeout: float) -> None:
    """Exchange HELLOs, then start ``qp``."""
    sock.settimeout(timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    caps = qp.caps
    hello = Hello(
        qp.qp_num,
        caps.max_send_wr,
        caps.max_recv_wr,
        caps.max_message,
        min(round(caps.rnr_timeout * 1000), 0xFFFFFFFF),
    )
    try:
        sock.sendall(encode_hello(hello))
        data = bytearray()
        while len(data) < HELLO.size:
            chunk = sock.recv(HELLO.size - len(data))
            if not chunk:
                raise ConnectError("tcp handshake: peer closed")
            data += chunk
        peer = decode_hello(data)
    except FramingError as error:
        raise ConnectError(f"tcp handshake: {error}") from None
    except OSError as error:
        raise ConnectError(f"tcp handshake failed: {error}") from None
    qp.start(sock, peer)
