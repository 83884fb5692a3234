"""A minimal asyncio ZooKeeper load client, built on the repository's jute codec, for
bench/consensus.py.

kazoo tops out near 2,800 writes/s per process, below what a ZooKeeper ensemble serves, so a
benchmark driven by it measures the client. This client does the least a session needs:
ConnectRequest/ConnectResponse, requests pipelined with up to `window` outstanding, pings
so the session stays alive, closeSession at the end, and reconnection with the same session
after a connection loss (the failover workload). It runs on uvloop.

Requests are encoded once by `services.consensus.jute` (`encode_request`, `encode_frame`)
and sent as copies of that template with the xid patched in place; a burst of N requests is
one write. Frames are split by `directlog.frames.FrameReader` straight from the socket
buffer (asyncio.BufferedProtocol). On the pipelined path only the ReplyHeader (xid, zxid,
err: the jute layout `>iqi`) is unpacked per reply, and every xid is checked to come back
in the order it was sent (ZooKeeper's per-session FIFO order); the first reply of a run and
every reply of the sequential workloads are decoded in full with `decode_response`.

Worker processes (`multiprocessing`, spawn) run one workload each and report their count,
their wall time and their own CPU time, so the benchmark can show that the client is not
the bottleneck. `NoopServer` answers every request at once with a canned reply; the
client's rate against it bounds what the client can drive.

`reconfig` sends one incremental ReconfigRequest (op code 16) from the benchmark process
and times it from the write of the request to its reply, which ZooKeeper sends once the
new configuration is committed. Its session first adds digest auth as the super user
(reconfig needs the right to write /zookeeper/config).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import uvloop

from directlog.frames import FrameReader
from services.consensus.codes import ErrorCode, OpCode, Xid
from services.consensus.jute import (
    ACL,
    DEFAULT_MAX_BUFFER,
    AuthPacket,
    ConnectRequest,
    ConnectResponse,
    CreateRequest,
    GetDataResponse,
    Id,
    JuteError,
    PathWatchRequest,
    ReconfigRequest,
    ReplyHeader,
    RequestHeader,
    SetDataRequest,
    Stat,
    StatResponse,
    decode_connect_request,
    decode_connect_response,
    decode_response,
    encode_connect_request,
    encode_connect_response,
    encode_frame,
    encode_request,
    encode_response,
)

REPLY_HEADER = struct.Struct(">iqi")  # ReplyHeader: xid, zxid, err
XID = struct.Struct(">i")
XID_OFFSET = 4  # in a frame: the int32 length, then RequestHeader.xid
OPEN_ACL = (ACL(31, Id("world", "anyone")),)
SESSION_TIMEOUT_MS = 10_000
CONNECT_SECONDS = 5.0
REQUEST_SECONDS = 5.0  # a request unanswered this long counts as a lost connection
RETRY_SECONDS = 0.02  # between reconnection attempts (failover)
RECV_BUFFER = 256 * 1024


class ConnectionLostError(Exception):
    """The server closed the connection (or refused the session handshake)."""


class SessionExpiredError(ConnectionLostError):
    """The server answered a reconnection with a zero session: the session is gone."""


class ReplyError(Exception):
    """A reply carried a non-zero err (kept in `err`)."""

    def __init__(self, message: str, err: int = 0) -> None:
        super().__init__(message)
        self.err = err


def err_name(err: int) -> str:
    """ZooKeeper's name of a reply's err, or the number when the codes do not list it."""
    try:
        return ErrorCode(err).name
    except ValueError:
        return str(err)


# --- request templates ---------------------------------------------------------------------


def request_frame(opcode: OpCode, body: Any) -> bytes:
    """A whole frame (length prefix included) with xid 0, to be patched per send."""
    return encode_frame(encode_request(RequestHeader(0, opcode), body))


def set_data_frame(path: str, data: bytes) -> bytes:
    return request_frame(OpCode.SET_DATA, SetDataRequest(path, data, -1))


def get_data_frame(path: str) -> bytes:
    return request_frame(OpCode.GET_DATA, PathWatchRequest(path, False))


def create_frame(path: str, data: bytes) -> bytes:
    return request_frame(OpCode.CREATE, CreateRequest(path, data, OPEN_ACL, 0))


def reconfig_frame(joining: str | None, leaving: str | None, config_id: int = -1) -> bytes:
    """An incremental ReconfigRequest (newMembers absent, so null on the wire); config_id -1
    skips the version check."""
    body = ReconfigRequest(joining or "", leaving or "", "", config_id)
    return request_frame(OpCode.RECONFIG, body)


def auth_frame(scheme: str, auth: bytes) -> bytes:
    return encode_frame(
        encode_request(RequestHeader(Xid.AUTH, OpCode.AUTH), AuthPacket(0, scheme, auth))
    )


CLOSE_SESSION_TYPE = XID.pack(OpCode.CLOSE_SESSION)
PING_FRAME = encode_frame(encode_request(RequestHeader(Xid.PING, OpCode.PING)))


# --- the client ----------------------------------------------------------------------------


class _Protocol(asyncio.BufferedProtocol):
    def __init__(self, client: ZkClient) -> None:
        self.client = client
        self.reader = FrameReader(DEFAULT_MAX_BUFFER, buffer_size=RECV_BUFFER)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.writable()

    def buffer_updated(self, nbytes: int) -> None:
        self.reader.received(nbytes)
        self.client._on_frames(self.reader.frames())

    def connection_lost(self, exc: Exception | None) -> None:
        self.client._on_lost(exc)


@dataclass
class _Pipeline:
    template: bytes
    opcode: OpCode
    end: float  # monotonic time after which no new request is sent
    done: asyncio.Future[None]
    completed: int = 0
    errors: int = 0
    first_error: int = 0


class ZkClient:
    """One session on one connection. Not thread-safe; one event loop."""

    def __init__(self, host: str, port: int, timeout_ms: int = SESSION_TIMEOUT_MS) -> None:
        self.host, self.port = host, port
        self.timeout_ms = timeout_ms
        self.session_id = 0
        self.passwd = b"\0" * 16
        self.last_zxid = 0
        self._transport: asyncio.Transport | None = None
        self._handshake: asyncio.Future[ConnectResponse] | None = None
        self._xid = 1
        self._expect = 1  # next xid a reply must carry
        self._waiters: deque[tuple[asyncio.Future[tuple[ReplyHeader, Any]], OpCode]] = deque()
        self._pipeline: _Pipeline | None = None
        self._pinger: asyncio.Task[None] | None = None
        self.lost = True

    # connection ---------------------------------------------------------------------------

    async def connect(self, host: str | None = None, port: int | None = None) -> None:
        """Open a connection and a session (resuming the current one, if any)."""
        self.host, self.port = host or self.host, port or self.port
        loop = asyncio.get_running_loop()
        self._handshake = loop.create_future()
        self._xid = self._expect = 1
        self.lost = False
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(lambda: _Protocol(self), self.host, self.port),
                CONNECT_SECONDS,
            )
        except (OSError, TimeoutError) as exc:
            self.lost = True
            raise ConnectionLostError(f"connect {self.host}:{self.port}: {exc}") from exc
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport = transport
        request = ConnectRequest(0, self.last_zxid, self.timeout_ms, self.session_id, self.passwd)
        transport.write(encode_frame(encode_connect_request(request)))
        try:
            response = await asyncio.wait_for(self._handshake, CONNECT_SECONDS)
        except TimeoutError as exc:
            transport.close()
            raise ConnectionLostError("no ConnectResponse") from exc
        if response.session_id == 0 or response.time_out <= 0:
            transport.close()
            self.session_id = 0
            raise SessionExpiredError(f"session expired on {self.host}:{self.port}")
        self.session_id = response.session_id
        self.passwd = response.passwd or b"\0" * 16
        interval = response.time_out / 3000
        self._pinger = asyncio.create_task(self._ping_every(interval))

    async def close(self) -> None:
        """closeSession (best effort), then close the socket."""
        if not self.lost and self._transport is not None:
            with contextlib.suppress(ConnectionLostError, ReplyError, TimeoutError):
                await asyncio.wait_for(self.call(request_frame(OpCode.CLOSE_SESSION, None)), 2.0)
        self.abort()

    def abort(self) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
            self._pinger = None
        if self._transport is not None:
            self._transport.close()

    async def _ping_every(self, interval: float) -> None:
        while not self.lost and self._transport is not None:
            await asyncio.sleep(interval)
            if not self.lost:
                self._transport.write(PING_FRAME)

    # requests -----------------------------------------------------------------------------

    def _send(self, template: bytes, count: int) -> None:
        assert self._transport is not None
        size = len(template)
        buf = bytearray(template * count)
        xid = self._xid
        for offset in range(XID_OFFSET, size * count, size):
            XID.pack_into(buf, offset, xid)
            xid += 1
        self._xid = xid
        self._transport.write(buf)

    async def call(
        self,
        template: bytes,
        reply_as: OpCode | None = None,
        seconds: float = REQUEST_SECONDS,
    ) -> tuple[ReplyHeader, Any]:
        """One request; its reply header and body decoded in full by the jute codec (as the
        reply to `reply_as` when given, for a reply laid out as another op's). Raises
        ReplyError on a non-zero err, ConnectionLostError after `seconds` without reply."""
        if self.lost:
            raise ConnectionLostError("not connected")
        assert self._pipeline is None
        opcode = OpCode(struct.unpack_from(">i", template, 8)[0])
        future: asyncio.Future[tuple[ReplyHeader, Any]] = asyncio.get_running_loop().create_future()
        self._waiters.append((future, reply_as or opcode))
        self._send(template, 1)
        try:
            header, body = await asyncio.wait_for(future, seconds)
        except TimeoutError as exc:
            self.abort()
            raise ConnectionLostError(f"no reply in {seconds:.0f} s") from exc
        if header.err != ErrorCode.OK:
            raise ReplyError(f"{opcode.name}: {err_name(header.err)}", header.err)
        return header, body

    def send_raw(self, frame: bytes) -> None:
        """A frame whose reply nobody waits for (auth: its reply has xid -4)."""
        if self.lost or self._transport is None:
            raise ConnectionLostError("not connected")
        self._transport.write(frame)

    async def pipeline(self, template: bytes, window: int, seconds: float) -> _Pipeline:
        """Keep `window` copies of the request outstanding for `seconds`, then wait for the
        rest; the returned record holds the count of replies and of errors."""
        if self.lost:
            raise ConnectionLostError("not connected")
        assert not self._waiters and self._pipeline is None
        loop = asyncio.get_running_loop()
        opcode = OpCode(struct.unpack_from(">i", template, 8)[0])
        run = _Pipeline(template, opcode, time.monotonic() + seconds, loop.create_future())
        # The first reply is decoded in full, through the ordinary path.
        await self.call(template)
        self._pipeline = run
        self._send(template, window)
        try:
            await asyncio.wait_for(run.done, seconds + REQUEST_SECONDS)
        finally:
            self._pipeline = None
        return run

    # replies ------------------------------------------------------------------------------

    def _on_frames(self, frames: Iterable[memoryview]) -> None:
        if self._handshake is not None and not self._handshake.done():
            for frame in frames:
                self._handshake.set_result(decode_connect_response(frame))
                break
            else:
                return
        run = self._pipeline
        answered = 0
        for frame in frames:
            xid, zxid, err = REPLY_HEADER.unpack_from(frame)
            if xid < 0:  # ping, notification
                continue
            if xid != self._expect:
                self._fail(ConnectionLostError(f"reply xid {xid}, expected {self._expect}"))
                return
            self._expect += 1
            if zxid > self.last_zxid:
                self.last_zxid = zxid
            if run is not None:
                answered += 1
                if err:
                    run.errors += 1
                    run.first_error = run.first_error or err
            else:
                future, opcode = self._waiters.popleft()
                if future.done():
                    continue
                try:
                    future.set_result(decode_response(frame, opcode))
                except JuteError as exc:  # a reply the codec refuses fails its request
                    future.set_exception(exc)
        if run is not None and answered:
            run.completed += answered
            if time.monotonic() < run.end:
                self._send(run.template, answered)
            elif self._xid == self._expect and not run.done.done():
                run.done.set_result(None)

    def _on_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionLostError(f"connection to {self.host}:{self.port} lost: {exc}"))

    def _fail(self, error: ConnectionLostError) -> None:
        self.lost = True
        if self._pinger is not None:
            self._pinger.cancel()
            self._pinger = None
        if self._transport is not None:
            self._transport.close()
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(error)
        while self._waiters:
            future, _ = self._waiters.popleft()
            if not future.done():
                future.set_exception(error)
        run = self._pipeline
        if run is not None and not run.done.done():
            run.done.set_exception(error)


# --- workloads run in worker processes -----------------------------------------------------


@dataclass
class Job:
    """What one worker process does. kind: write | read | seq | failover."""

    kind: str
    addresses: list[tuple[str, int]]  # the first is used; failover cycles through them all
    path: str
    value: bytes
    seconds: float
    window: int = 1


@dataclass
class Outcome:
    ops: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    errors: int = 0
    error: str | None = None
    latencies_us: list[int] = field(default_factory=list)
    failover_seconds: float | None = None
    reconnects: int = 0  # connection losses
    connect_attempts: int = 0  # connections tried after them


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _pipelined(client: ZkClient, job: Job, outcome: Outcome) -> None:
    template = set_data_frame(job.path, job.value) if job.kind == "write" else None
    template = template or get_data_frame(job.path)
    run = await client.pipeline(template, job.window, job.seconds)
    outcome.ops, outcome.errors = run.completed, run.errors
    if run.errors:
        outcome.error = f"{run.errors} replies with err {ErrorCode(run.first_error).name}"


async def _sequential(client: ZkClient, job: Job, outcome: Outcome) -> None:
    template = set_data_frame(job.path, job.value)
    end = time.monotonic() + job.seconds
    latencies = outcome.latencies_us
    while time.monotonic() < end:
        start = time.perf_counter_ns()
        _, body = await client.call(template)
        latencies.append((time.perf_counter_ns() - start) // 1000)
        if not isinstance(body, StatResponse) or body.stat.data_length != len(job.value):
            raise ReplyError(f"setData answered {body!r}")
    outcome.ops = len(latencies)


async def _failover(client: ZkClient, job: Job, outcome: Outcome, kill_times: Any) -> None:
    """Sequential writes until one sent after the leader was dead is acknowledged;
    reconnects on loss, cycling through the addresses, with the same session while the
    servers keep it. `kill_times` is a shared pair of monotonic times the benchmark sets:
    when it sent SIGKILL and when it had reaped the leader. Only a write sent after the
    second can count (none sent earlier could have been committed by the old leader), and
    the figure runs from the first."""
    template = set_data_frame(job.path, job.value)
    deadline = time.monotonic() + job.seconds
    turn = 0
    while time.monotonic() < deadline:
        sent = time.monotonic()
        try:
            await client.call(template)
        except ConnectionLostError:
            outcome.reconnects += 1
            while time.monotonic() < deadline:
                turn += 1
                host, port = job.addresses[turn % len(job.addresses)]
                outcome.connect_attempts += 1
                try:
                    await client.connect(host, port)
                    break
                except SessionExpiredError:
                    continue  # a fresh session on the next attempt (session_id is now 0)
                except ConnectionLostError:
                    await asyncio.sleep(RETRY_SECONDS)
            continue
        acked = time.monotonic()
        outcome.ops += 1
        killed, dead = kill_times[0], kill_times[1]
        if dead > 0 and sent >= dead:
            outcome.failover_seconds = acked - killed
            return
    outcome.error = f"no write acknowledged within {job.seconds:.0f} s"


async def _run_job(job: Job, start: Any, kill_times: Any) -> Outcome:
    outcome = Outcome()
    host, port = job.addresses[0]
    client = ZkClient(host, port)
    await client.connect()
    try:
        start.wait()  # every worker connected, released together with the benchmark
        cpu, wall = _cpu(), time.perf_counter()
        if job.kind in ("write", "read"):
            await _pipelined(client, job, outcome)
        elif job.kind == "seq":
            await _sequential(client, job, outcome)
        else:
            await _failover(client, job, outcome, kill_times)
        outcome.seconds = time.perf_counter() - wall
        outcome.cpu_seconds = _cpu() - cpu
    finally:
        await client.close()
    return outcome


def worker_main(job: Job, start: Any, kill_times: Any, results: Any) -> None:
    """Entry of a worker process: connect, wait at the `start` barrier (shared with the
    other workers and the benchmark), run `job` on uvloop, put an Outcome on `results`."""
    try:
        outcome = uvloop.run(_run_job(job, start, kill_times))
    except BaseException as exc:  # reported to the benchmark, which decides what it means
        outcome = Outcome(error=f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(Exception):
            start.abort()
    results.put(outcome)


# --- set-up helpers used by the benchmark process ------------------------------------------


async def _ensure_nodes(host: str, port: int, paths: list[str], value: bytes) -> None:
    client = ZkClient(host, port)
    await client.connect()
    try:
        for path in paths:
            try:
                await client.call(create_frame(path, value))
            except ReplyError as exc:
                if "NODEEXISTS" not in str(exc):
                    raise
            _, body = await client.call(get_data_frame(path))
            if not isinstance(body, GetDataResponse) or body.data != value:
                raise ReplyError(f"{path}: read back {body!r}")
    finally:
        await client.close()


def ensure_nodes(host: str, port: int, paths: list[str], value: bytes) -> None:
    """Create `paths` (parents first) holding `value`, and read each back."""
    uvloop.run(_ensure_nodes(host, port, paths, value))


@dataclass
class Reconfigured:
    err: int  # the reply's err: 0 when the new configuration was committed
    seconds: float  # from writing the request to its reply
    config: bytes | None  # the committed configuration the reply carries (err 0)


async def _reconfig(
    address: tuple[str, int],
    super_auth: bytes,
    joining: str | None,
    leaving: str | None,
    config_id: int,
) -> Reconfigured:
    client = ZkClient(*address)
    await client.connect()
    try:
        # The auth reply (xid -4) is not matched to a waiter; a refused auth closes the
        # connection. Replies come in order: once getData's is in, the auth is done.
        client.send_raw(auth_frame("digest", super_auth))
        await client.call(get_data_frame("/"))
        frame = reconfig_frame(joining, leaving, config_id)
        start = time.perf_counter()
        try:
            # The reply to a reconfig is laid out as getData's: the config node's data, Stat.
            _, body = await client.call(frame, reply_as=OpCode.GET_DATA, seconds=60.0)
        except ReplyError as exc:
            return Reconfigured(exc.err, time.perf_counter() - start, None)
        seconds = time.perf_counter() - start
        if not isinstance(body, GetDataResponse):
            raise ReplyError(f"reconfig answered {body!r}")
        return Reconfigured(0, seconds, body.data)
    finally:
        await client.close()


def reconfig(
    address: tuple[str, int],
    super_auth: bytes,
    joining: str | None,
    leaving: str | None,
    config_id: int = -1,
) -> Reconfigured:
    """One incremental reconfig through a fresh session on `address`, authenticated with
    digest `super_auth` ("super:<password>"); the connection and the auth are done before
    the clock starts. A refused reconfig comes back with its err."""
    return uvloop.run(_reconfig(address, super_auth, joining, leaving, config_id))


# --- the no-op bound ---------------------------------------------------------------------------


class _NoopProtocol(asyncio.BufferedProtocol):
    """Answers a ConnectRequest, then every request with a canned OK reply (a setData's
    Stat), one write per received chunk: the fastest server a client can meet."""

    STAT = Stat(1, 1, 0, 0, 1, 0, 0, 0, 100, 0, 1)

    def __init__(self) -> None:
        self.reader = FrameReader(DEFAULT_MAX_BUFFER, buffer_size=RECV_BUFFER)
        self.transport: asyncio.Transport | None = None
        self.connected = False
        self.reply = bytearray(
            encode_frame(encode_response(ReplyHeader(0, 1, 0), StatResponse(self.STAT)))
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.writable()

    def buffer_updated(self, nbytes: int) -> None:
        self.reader.received(nbytes)
        out = bytearray()
        reply = self.reply
        for frame in self.reader.frames():
            if not self.connected:
                request = decode_connect_request(frame)
                response = ConnectResponse(0, request.time_out, 0x1234, b"\0" * 16)
                out += encode_frame(encode_connect_response(response))
                self.connected = True
                continue
            if frame[4:8] == CLOSE_SESSION_TYPE:
                out += encode_frame(encode_response(ReplyHeader(XID.unpack_from(frame)[0], 1, 0)))
                continue
            reply[4:8] = frame[0:4]  # echo the xid
            out += reply
        if out and self.transport is not None:
            self.transport.write(out)


async def _serve_noop(port: int, stop: Any) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_NoopProtocol, "127.0.0.1", port)
    async with server:
        while not stop.is_set():
            await asyncio.sleep(0.05)


def noop_server_main(port: int, stop: Any) -> None:
    """Entry of the no-op server process; serves until `stop` (an Event) is set."""
    uvloop.run(_serve_noop(port, stop))
