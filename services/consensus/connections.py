"""The ZooKeeper client protocol on a member's client port.

A connection starts with a ConnectRequest (new session, or the id and password of one to
resume) or with a four-letter word. After that, every request is answered in the order it
arrived: writes are sent into ZAB at once (so one client can pipeline many), reads and
other local requests wait until every earlier request of the connection has its answer,
so a client reads its own writes. Watch notifications go out as their transactions apply,
before any later reply.

A member that is not serving (no established leader) closes new connections right after
their ConnectRequest, and drops every connection when it stops serving, so clients move to
another member at once, as ZooKeeper's do.

A member cut off from the quorum in read-only mode (``Member.read_only``) serves, as
ZooKeeper's ReadOnlyZooKeeperServer does, only clients whose ConnectRequest asked for
read-only, answering readOnly=true; others are closed right after their ConnectRequest. A
read-only connection gets a new session known to this member only (ZooKeeper's local
session) or resumes one; resuming a session of the quorum is refused by closing, as in
ZooKeeper 3.7+. Reads and watches work on the member's own, possibly stale, tree; every
write, sync included, is answered NOTREADONLY (ReadOnlyRequestProcessor) and closeSession
closes the local session. When the member finds a leader it drops these connections.

The same protocol runs on the plaintext client port and on the TLS one (secureClientPort);
a connection whose client certificate the TLS port verified starts with its ``x509`` id.
Authentication follows ZooKeeper's ZooKeeperServer.processPacket: ``addauth digest``
(AuthPacket) and SASL DIGEST-MD5 (GetSASLRequest tokens, services/consensus/sasl.py) add
``digest`` and ``sasl`` ids to the connection's session; a failed attempt is answered
AUTHFAILED and the connection closes (the session stays, to expire or be resumed). With
``sasl_required`` (zookeeper.sessionRequireClientSASLAuth) a connection that has not
completed SASL may only authenticate: any other request is answered
SESSIONCLOSEDREQUIRESASLAUTH and the connection closes.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from services.consensus.codes import (
    CreateMode,
    ErrorCode,
    EventType,
    KeeperState,
    OpCode,
    Xid,
)
from services.consensus.fourletter import FOUR_LETTER_WORDS, answer
from services.consensus.jute import (
    AuthPacket,
    CheckVersionRequest,
    ConnectResponse,
    Create2Response,
    CreateRequest,
    DeleteRequest,
    ErrorResult,
    FrameSplitter,
    GetACLResponse,
    GetChildren2Response,
    GetChildrenResponse,
    GetDataResponse,
    JuteError,
    MultiRequest,
    MultiResponse,
    PathRequest,
    PathResponse,
    PathWatchRequest,
    ReconfigRequest,
    ReplyHeader,
    RequestBody,
    ResponseBody,
    SaslToken,
    SetACLRequest,
    SetDataRequest,
    SetWatches,
    StatResponse,
    UnknownOpcodeError,
    WatcherEvent,
    decode_connect_request,
    decode_request,
    encode_connect_response,
    encode_frame,
    encode_response,
)
from services.consensus.jute.records import CheckResult as CheckReply
from services.consensus.jute.records import DeleteResult as DeleteReply
from services.consensus.member import CONFIG_NODE, Member, Outcome, SessionClients
from services.consensus.metrics import BufferStats
from services.consensus.payloads import (
    ErrorTxn,
    Reconfig,
    ReconfigTxn,
    SyncRequest,
    SyncTxn,
    Write,
)
from services.consensus.sasl import DigestMd5Server, SaslError
from services.consensus.tls import HANDSHAKE_TIMEOUT, peer_certificate, x509_id
from services.consensus.tree import (
    Applied,
    Check,
    CheckResult,
    CloseSession,
    Create,
    CreateResult,
    CreateSession,
    Delete,
    DeleteResult,
    Id,
    KeeperError,
    Multi,
    MultiResult,
    Session,
    SetACL,
    SetACLResult,
    SetData,
    SetDataResult,
    WatchEvent,
    digest_auth_id,
)
from services.consensus.tree.acl import SUPER
from services.consensus.tree.model import MultiOp, OpResult

log = logging.getLogger("directlog.consensus.clients")

_FLUSH_REPLIES = 32  # replies queued in one event-loop turn before they are written anyway

_WRITES = frozenset(
    {
        OpCode.CREATE,
        OpCode.CREATE2,
        OpCode.DELETE,
        OpCode.SET_DATA,
        OpCode.SET_ACL,
        OpCode.CHECK,
        OpCode.MULTI,
        OpCode.SYNC,
        OpCode.CLOSE_SESSION,
        OpCode.RECONFIG,
    }
)


class ClientServer(SessionClients):
    """The client port of one member and the connections on it."""

    def __init__(self, member: Member) -> None:
        self.member = member
        member.clients = self
        self.connections: set[ClientConnection] = set()
        self.by_session: dict[int, ClientConnection] = {}
        # What ZooKeeper's ServerStats and ServerMetrics count on the client port (srvr,
        # mntr and the ZooKeeper-named Prometheus series read them):
        self.received = 0  # packets: frames and four-letter words
        self.sent = 0  # packets: replies, watch events, connect replies, 4lw answers
        self.bytes_received = 0
        self.connect_requests = 0
        self.rejected = 0  # connections refused (max_client_connections)
        self.dropped = 0  # connections the client side closed
        self.response_size = BufferStats()  # replies and watch events, less the length
        self.latency = member.metrics.zk.request_latency
        settings = member.settings
        self.sasl_users = settings.sasl_credentials()
        self.sasl_required = settings.sasl_required
        self._servers: list[asyncio.Server] = []
        member.metrics.bind_clients(self)

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listen on ``host:port`` (0 picks a free port), over TLS with ``tls`` (the secure
        client port); may be called once per port. Returns the port."""
        loop = asyncio.get_running_loop()
        if tls is None:
            server = await loop.create_server(lambda: ClientConnection(self), host, port)
        else:
            server = await loop.create_server(
                lambda: ClientConnection(self),
                host,
                port,
                ssl=tls,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
            )
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        self.disconnect_all()

    # -- SessionClients ----------------------------------------------------------------

    def deliver(self, event: WatchEvent) -> None:
        conn = self.by_session.get(event.session_id)
        if conn is not None:
            conn.notify(event)

    def session_closed(self, session_id: int) -> None:
        conn = self.by_session.get(session_id)
        if conn is not None and not conn.closing_session:
            conn.close()  # expired, or closed from another connection

    def disconnect_all(self) -> None:
        for conn in list(self.connections):
            conn.close()


@dataclass(slots=True)
class _Pending:
    """One request's place in the reply order: ``reply`` once answered, or ``run`` to
    answer it when it reaches the head."""

    started: float
    reply: bytes | None = None
    run: Callable[[], bytes] | None = None
    last: bool = False  # close the connection after this reply
    write: bool = False  # becomes a transaction (ZooKeeper's update latency, not read)


class ClientConnection(asyncio.Protocol):
    def __init__(self, server: ClientServer) -> None:
        self.server = server
        self.member = server.member
        self.transport: asyncio.Transport | None = None
        self.splitter = FrameSplitter(self.member.settings.max_buffer)
        self.head = b""  # bytes held until the first four are in
        self.sniffed = False
        self.session: Session | None = None
        self.identity: frozenset[Id] = frozenset()  # what TLS proved: the x509 id, if any
        self.sasl: DigestMd5Server | None = None
        self.needs_sasl = server.sasl_required  # until this connection completes SASL
        self.timeout_ms = 0
        self.queue: deque[_Pending] = deque()
        self.closing_session = False
        self.closed = False
        self.read_only = False  # a read-only session on a member cut off from the quorum
        self._out: list[bytes] = []
        self.peer = ""

    # -- asyncio -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if len(self.server.connections) >= self.member.settings.max_client_connections:
            log.warning("refusing %s: %d connections open", self.peer, len(self.server.connections))
            transport.close()
            self.closed = True
            self.server.rejected += 1
            return
        self.server.connections.add(self)
        self.member.metrics.connections.inc()
        certificate = peer_certificate(transport.get_extra_info("ssl_object"))
        if certificate is not None:
            self.identity = frozenset({x509_id(certificate)})

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.server.dropped += 1
        self._forget()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.server.bytes_received += len(data)
        if not self.sniffed:
            # The first four bytes tell a four-letter word from a frame's length.
            self.head += data
            if len(self.head) < 4:
                return
            self.sniffed = True
            if self.head[:4] in FOUR_LETTER_WORDS:
                self.server.received += 1
                self._write(answer(self.head[:4], self.member, self.server).encode())
                self.close()
                return
            data, self.head = self.head, b""
        try:
            for frame in self.splitter.feed(data):
                self._frame(frame)
        except JuteError as exc:
            log.warning("closing %s: %s", self.peer, exc)
            self.member.metrics.bad_input.inc()
            self.close()

    # -- session -----------------------------------------------------------------------

    def _frame(self, frame: bytes) -> None:
        if self.closed:
            return  # an earlier frame of the same read closed the connection
        self.server.received += 1
        if self.session is None:
            self._connect(frame)
        else:
            self._request(frame)

    def _connect(self, frame: bytes) -> None:
        member = self.member
        request = decode_connect_request(frame, member.settings.max_buffer)
        self.server.connect_requests += 1
        if member.read_only and not request.read_only:
            log.info("closing %s: read-only member, and the client did not ask for it", self.peer)
            self.close()  # ZooKeeper: "Refusing session request for not-read-only client"
            return
        if not member.serving and not member.read_only:
            self.close()  # ZooKeeper: "not running"; the client tries another member
            return
        if request.last_zxid_seen > member.applied_zxid:
            log.info(
                "closing %s: it has seen zxid %#x, we have %#x",
                self.peer,
                request.last_zxid_seen,
                member.applied_zxid,
            )
            self.close()
            return
        settings = member.settings
        timeout = min(
            max(request.time_out, settings.min_session_timeout), settings.max_session_timeout_ms
        )
        if member.read_only:
            self._connect_read_only(request.session_id, request.passwd, timeout)
            return
        if request.session_id == 0:
            session = Session(member.new_session_id(), self.identity)
            self.session = session
            self.timeout_ms = timeout

            def created(zxid: int, outcome: Outcome) -> None:
                if isinstance(outcome, Applied):
                    self._attach(session.session_id)
                    self._connected(session.session_id, timeout)
                else:
                    self.close()

            member.submit(session, CreateSession(timeout), created)
            return
        sid = request.session_id
        known = member.tree.sessions.get(sid)
        if known is None or request.passwd != member.session_password(sid):
            self._expired()
            return
        self.session = Session(sid, self.identity)
        self.timeout_ms = known
        self._attach(sid)
        member.heard_from(sid)
        self._connected(sid, known)

    def _connect_read_only(self, sid: int, passwd: bytes | None, timeout: int) -> None:
        member = self.member
        self.read_only = True
        if sid == 0:
            sid = member.open_local_session(timeout)
        elif sid in member.tree.sessions:
            # ZooKeeper 3.7+ (ReadOnlyZooKeeperServer.validateSession): the quorum's
            # session must not be renewed here; the client keeps looking.
            log.info("closing %s: it resumes session %#x of the quorum", self.peer, sid)
            self.close()
            return
        else:
            known = member.local_sessions.get(sid)
            if known is None or passwd != member.session_password(sid):
                self._expired()
                return
            timeout = known
        self.session = Session(sid, self.identity)
        self.timeout_ms = timeout
        self._attach(sid)
        member.heard_from(sid)
        self._connected(sid, timeout)

    def _expired(self) -> None:
        """ZooKeeper answers an expired or unknown session with a zero timeout."""
        response = ConnectResponse(0, 0, 0, bytes(16), self.read_only)
        self._write(encode_frame(encode_connect_response(response)))
        self.close()

    def _attach(self, sid: int) -> None:
        old = self.server.by_session.get(sid)
        if old is not None and old is not self:
            old.close()
        self.server.by_session[sid] = self

    def _connected(self, sid: int, timeout: int) -> None:
        if self.closed:
            return
        password = self.member.session_password(sid)
        response = ConnectResponse(0, timeout, sid, password, self.read_only)
        self._write(encode_frame(encode_connect_response(response)))

    # -- requests ----------------------------------------------------------------------

    def _request(self, frame: bytes) -> None:
        member = self.member
        assert self.session is not None
        member.heard_from(self.session.session_id)
        started = time.monotonic()
        try:
            header, body = decode_request(frame, member.settings.max_buffer)
        except UnknownOpcodeError as exc:
            assert exc.xid is not None
            self._queue_error(started, exc.xid, ErrorCode.UNIMPLEMENTED)
            return
        xid, op = header.xid, header.type
        member.metrics.request(op)
        if self.needs_sasl and op != OpCode.SASL and op != OpCode.AUTH:
            log.warning("closing %s: it sent opcode %d before SASL authentication", self.peer, op)
            self._refuse(started, xid, ErrorCode.SESSIONCLOSEDREQUIRESASLAUTH)
            return
        if op == OpCode.PING:
            self._queue_local(started, lambda: self._reply(xid, ErrorCode.OK))
        elif op == OpCode.AUTH:
            assert isinstance(body, AuthPacket)
            self._auth(started, body)
        elif op in _WRITES and self.read_only:
            self._read_only_write(started, xid, op)
        elif op in _WRITES:
            self._write_request(started, xid, op, body)
        elif op == OpCode.SASL:
            assert isinstance(body, SaslToken)
            self._sasl(started, xid, body)
        else:
            self._queue_local(started, lambda: self._read(xid, op, body))

    def _auth(self, started: float, packet: AuthPacket) -> None:
        assert self.session is not None
        if packet.scheme != "digest" or not packet.auth or b":" not in packet.auth:
            log.warning("closing %s: auth with scheme %r failed", self.peer, packet.scheme)
            self._refuse(started, Xid.AUTH, ErrorCode.AUTHFAILED)
            return
        ident: Id = digest_auth_id(packet.auth.decode("utf-8", "replace"))
        self.session = self.session.with_auth(ident)
        if self.member.is_super(ident):
            self.session = self.session.with_auth(SUPER)
        self._queue_local(started, lambda: self._reply(Xid.AUTH, ErrorCode.OK))

    def _sasl(self, started: float, xid: int, packet: SaslToken) -> None:
        """One SASL token (ZooKeeper's processSasl): answered with the mechanism's next
        token; on failure AUTHFAILED (SESSIONCLOSEDREQUIRESASLAUTH when SASL is required)
        and the connection closes."""
        assert self.session is not None
        if self.sasl is None:
            self.sasl = DigestMd5Server(self.server.sasl_users)
        try:
            if not self.server.sasl_users:
                raise SaslError("this member has no SASL users")
            token = self.sasl.step(packet.token or b"")
        except SaslError as exc:
            log.warning("closing %s: SASL authentication failed: %s", self.peer, exc)
            required = self.server.sasl_required
            code = ErrorCode.SESSIONCLOSEDREQUIRESASLAUTH if required else ErrorCode.AUTHFAILED
            self._refuse(started, xid, code)
            return
        if self.sasl.complete:
            assert self.sasl.user is not None
            self.session = self.session.with_auth(Id("sasl", self.sasl.user))
            self.needs_sasl = False
        reply = self._reply(xid, ErrorCode.OK, SaslToken(token), zxid=0)
        self._queue_local(started, lambda: reply)

    def _refuse(self, started: float, xid: int, code: ErrorCode) -> None:
        """Answer ``code`` in turn, then close the connection (not the session)."""
        self.queue.append(_Pending(started, self._reply(xid, code, zxid=0), last=True))
        self._flush()

    def _write_request(self, started: float, xid: int, op: int, body: RequestBody | None) -> None:
        assert self.session is not None
        try:
            request = _to_write(op, body)
        except KeeperError as exc:
            self._queue_error(started, xid, exc.code)
            return
        pending = _Pending(started, write=op != OpCode.SYNC)
        self.queue.append(pending)
        if isinstance(request, CloseSession):
            self.closing_session = True
            pending.last = True

        def done(zxid: int, outcome: Outcome) -> None:
            if outcome is None:
                self.close()  # outcome unknown: the client sees a connection loss and retries
                return
            pending.reply = self._write_reply(xid, zxid, op, outcome)
            self._flush()

        self.member.submit(self.session, request, done)

    def _read_only_write(self, started: float, xid: int, op: int) -> None:
        """A write on a read-only session: NOTREADONLY (sync and multi too, as ZooKeeper's
        ReadOnlyRequestProcessor answers them), except closeSession, which closes the
        local session."""
        if op != OpCode.CLOSE_SESSION:
            self._queue_error(started, xid, ErrorCode.NOTREADONLY)
            return
        assert self.session is not None
        self.member.close_local_session(self.session.session_id)
        self.closing_session = True
        self.queue.append(_Pending(started, self._reply(xid, ErrorCode.OK), last=True))
        self._flush()

    def _queue_local(self, started: float, run: Callable[[], bytes]) -> None:
        self.queue.append(_Pending(started, run=run))
        self._flush()

    def _queue_error(self, started: float, xid: int, code: ErrorCode) -> None:
        self.queue.append(_Pending(started, self._reply(xid, code)))
        self._flush()

    def _flush(self) -> None:
        while self.queue and not self.closed:
            head = self.queue[0]
            if head.reply is None:
                if head.run is None:
                    return  # a write still on its way
                head.reply = head.run()
            self.queue.popleft()
            self._write(head.reply)
            server = self.server
            server.response_size.update(len(head.reply) - 4)
            now = time.monotonic()
            server.latency.add(now - head.started, head.write, now)
            if head.last:
                self.close()

    # -- replies -----------------------------------------------------------------------

    def _reply(
        self, xid: int, code: ErrorCode, body: ResponseBody | None = None, zxid: int | None = None
    ) -> bytes:
        if code != ErrorCode.OK:
            self.member.metrics.errors.labels(code.name).inc()
        z = self.member.applied_zxid if zxid is None else zxid
        return encode_frame(encode_response(ReplyHeader(xid, z, code), body))

    def _read(self, xid: int, op: int, body: RequestBody | None) -> bytes:
        tree = self.member.tree
        session = self.session
        assert session is not None
        try:
            if op == OpCode.SET_WATCHES:
                assert isinstance(body, SetWatches)
                self._set_watches(body)
                return self._reply(Xid.SET_WATCHES, ErrorCode.OK)
            if op == OpCode.GET_ACL:
                assert isinstance(body, PathRequest)
                acl, stat = tree.get_acl(body.path, session)
                return self._reply(xid, ErrorCode.OK, GetACLResponse(acl, stat))
            assert isinstance(body, PathWatchRequest)
            if body.path == CONFIG_NODE and op in (OpCode.EXISTS, OpCode.GET_DATA):
                # Served from the member's active configuration, not the tree.
                config, config_stat = self.member.config_node()
                if body.watch:
                    tree.watches.add_data(CONFIG_NODE, session.session_id)
                if op == OpCode.EXISTS:
                    return self._reply(xid, ErrorCode.OK, StatResponse(config_stat))
                return self._reply(xid, ErrorCode.OK, GetDataResponse(config, config_stat))
            if op == OpCode.EXISTS:
                found = tree.exists(body.path, session, body.watch)
                if found is None:
                    return self._reply(xid, ErrorCode.NONODE)
                return self._reply(xid, ErrorCode.OK, StatResponse(found))
            if op == OpCode.GET_DATA:
                data, stat = tree.get_data(body.path, session, body.watch)
                return self._reply(xid, ErrorCode.OK, GetDataResponse(data, stat))
            children, stat = tree.get_children(body.path, session, body.watch)
            if op == OpCode.GET_CHILDREN:
                return self._reply(xid, ErrorCode.OK, GetChildrenResponse(tuple(children)))
            return self._reply(xid, ErrorCode.OK, GetChildren2Response(tuple(children), stat))
        except KeeperError as exc:
            return self._reply(xid, exc.code)

    def _set_watches(self, request: SetWatches) -> None:
        """Re-arm watches after a reconnect, firing at once those that missed an event
        since ``relative_zxid`` (ZooKeeper's DataTree.setWatches)."""
        tree = self.member.tree
        assert self.session is not None
        sid = self.session.session_id
        since = request.relative_zxid
        fired: list[WatchEvent] = []
        for path in request.data_watches:
            node = tree.nodes.get(path)
            if node is None:
                fired.append(WatchEvent(sid, EventType.NODE_DELETED, path))
            elif node.mzxid > since:
                fired.append(WatchEvent(sid, EventType.NODE_DATA_CHANGED, path))
            else:
                tree.watches.add_data(path, sid)
        for path in request.exist_watches:
            if path in tree.nodes:
                fired.append(WatchEvent(sid, EventType.NODE_CREATED, path))
            else:
                tree.watches.add_data(path, sid)
        for path in request.child_watches:
            node = tree.nodes.get(path)
            if node is None:
                fired.append(WatchEvent(sid, EventType.NODE_DELETED, path))
            elif node.pzxid > since:
                fired.append(WatchEvent(sid, EventType.NODE_CHILDREN_CHANGED, path))
            else:
                tree.watches.add_child(path, sid)
        for event in fired:
            self.notify(event)

    def _write_reply(self, xid: int, zxid: int, op: int, outcome: Outcome) -> bytes:
        if isinstance(outcome, ErrorTxn):
            if op == OpCode.MULTI:
                results = tuple(ErrorResult(code) for code in outcome.op_codes)
                return self._reply(xid, ErrorCode.OK, MultiResponse(results), zxid)
            return self._reply(xid, outcome.code, zxid=zxid)
        if isinstance(outcome, SyncTxn):
            return self._reply(xid, ErrorCode.OK, PathResponse(outcome.path), zxid)
        if isinstance(outcome, ReconfigTxn):
            data = outcome.config.encode()
            stat = self.member.config_stat(zxid, len(data))
            return self._reply(xid, ErrorCode.OK, GetDataResponse(data, stat), zxid)
        assert isinstance(outcome, Applied)
        result = outcome.result
        if isinstance(result, MultiResult):
            replies = tuple(_multi_reply(r) for r in result.results)
            return self._reply(xid, ErrorCode.OK, MultiResponse(replies), zxid)
        body: ResponseBody | None = None
        if isinstance(result, CreateResult):
            body = (
                Create2Response(result.path, result.stat)
                if op == OpCode.CREATE2
                else PathResponse(result.path)
            )
        elif isinstance(result, SetDataResult | SetACLResult):
            body = StatResponse(result.stat)
        return self._reply(xid, ErrorCode.OK, body, zxid)

    def notify(self, event: WatchEvent) -> None:
        if self.closed:
            return
        body = WatcherEvent(event.type, KeeperState.SYNC_CONNECTED, event.path)
        frame = encode_frame(encode_response(ReplyHeader(Xid.NOTIFICATION, -1, ErrorCode.OK), body))
        self.server.response_size.update(len(frame) - 4)
        self._write(frame)

    # -- plumbing ----------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """Queue ``data``; everything queued in one event-loop turn goes out in one
        ``writelines`` (a pipelining client gets its replies in few syscalls)."""
        if self.transport is None or self.closed:
            return
        self.server.sent += 1
        if not self._out:
            asyncio.get_running_loop().call_soon(self._send_out)
        self._out.append(data)
        if len(self._out) >= _FLUSH_REPLIES:
            self._send_out()

    def _send_out(self) -> None:
        out, self._out = self._out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)

    def close(self) -> None:
        if self.closed:
            return
        self._send_out()
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        self._forget()

    def _forget(self) -> None:
        self.closed = True
        if self in self.server.connections:
            self.server.connections.discard(self)
            self.member.metrics.connections.dec()
        if self.session is not None and self.server.by_session.get(self.session.session_id) is self:
            del self.server.by_session[self.session.session_id]
            self.member.tree.session_closed_locally(self.session.session_id)


def _multi_reply(result: OpResult) -> PathResponse | StatResponse | DeleteReply | CheckReply:
    if isinstance(result, CreateResult):
        return PathResponse(result.path)
    if isinstance(result, SetDataResult):
        return StatResponse(result.stat)
    if isinstance(result, DeleteResult):
        return DeleteReply()
    if isinstance(result, CheckResult):
        return CheckReply()
    raise AssertionError(f"no multi reply for {result}")


def _mode(flags: int) -> CreateMode:
    try:
        return CreateMode(flags)
    except ValueError:
        raise KeeperError(ErrorCode.BADARGUMENTS) from None


def _op(op: int, body: RequestBody | None) -> MultiOp:
    if isinstance(body, CreateRequest):
        return Create(body.path, body.data, body.acl, _mode(body.flags))
    if isinstance(body, DeleteRequest):
        return Delete(body.path, body.version)
    if isinstance(body, SetDataRequest):
        return SetData(body.path, body.data, body.version)
    if isinstance(body, SetACLRequest):
        return SetACL(body.path, body.acl, body.version)
    if isinstance(body, CheckVersionRequest):
        return Check(body.path, body.version)
    raise KeeperError(ErrorCode.UNIMPLEMENTED)


def _to_write(op: int, body: RequestBody | None) -> Write:
    if op == OpCode.CLOSE_SESSION:
        return CloseSession()
    if op == OpCode.SYNC:
        assert isinstance(body, PathRequest)
        return SyncRequest(body.path)
    if op == OpCode.MULTI:
        assert isinstance(body, MultiRequest)
        return Multi(tuple(_op(o.type, o.body) for o in body.ops))
    if op == OpCode.RECONFIG:
        assert isinstance(body, ReconfigRequest)
        return Reconfig(
            body.joining_servers, body.leaving_servers, body.new_members, body.cur_config_id
        )
    return _op(op, body)
