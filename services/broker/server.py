"""The Kafka protocol server: accepts connections and moves bytes; everything else is the
sans-I/O codec (directlog.protocol) and the handlers (apis.KafkaApis).

Requests on one connection are answered in order, one at a time, as Kafka does; Produce
requests that arrive in one read are appended together, then answered in order. Record
data of fetch responses leaves through os.sendfile straight from the segment files (for old
consumers, converted chunk by chunk as it is sent: services/broker/down_conversion.py). Bytes
that cannot be read as a Kafka request close that one connection with one log line; other
clients never notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import Any

from directlog.frames import FrameReader, FrameTooLargeError
from directlog.protocol.api import (
    Api,
    ApiKey,
    RequestHeader,
    encode_response,
    parse_request_header,
    response_header,
)
from directlog.protocol.errors import ErrorCode
from directlog.records.errors import RecordError
from directlog.security.channel import Channel, TlsChannel, TlsHandshakeError
from directlog.waits import within
from services.broker.apis import (
    LISTENER,
    NOT_THROTTLED,
    THROTTLE,
    CloseConnectionError,
    KafkaApis,
)
from services.broker.authentication import (
    NO_SASL,
    PLAINTEXT,
    SASL_KEYS,
    SESSION,
    AuthenticationClosedError,
    ListenerSecurity,
    Session,
    SessionSettings,
)
from services.broker.down_conversion import DownConversion
from services.broker.fetch_response import Part, part_size
from services.broker.metrics import BrokerMetrics
from services.broker.storage import FileSlice

log = logging.getLogger(__name__)

# Requests that may wait (long-poll fetch, a join until the rebalance completes, a sync until
# the leader's assignment): answers made before them leave first.
_WAITING_KEYS = frozenset({ApiKey.FETCH, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})
_PRODUCE_KEY = ApiKey.PRODUCE.to_bytes(2, "big")  # how a Produce frame begins


class BadRequestError(Exception):
    """Bytes that are not a request this broker can answer: the connection is closed."""


HANDSHAKE_SECONDS = 10.0  # a TLS handshake not done by then closes the connection


class KafkaServer:
    def __init__(
        self,
        apis: KafkaApis,
        metrics: BrokerMetrics,
        max_request_bytes: int,
        sessions: SessionSettings = NO_SASL,
    ) -> None:
        self.apis = apis
        self.metrics = metrics
        self.max_request_bytes = max_request_bytes
        self.sessions = sessions
        self._listeners: dict[str, tuple[socket.socket, ListenerSecurity]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def listen(
        self, host: str, port: int, name: str = "", security: ListenerSecurity = PLAINTEXT
    ) -> int:
        """Bind listener `name` to host:port (0 picks a free port) and return the port;
        connections wait in the backlog until `serve`, so the port can be registered
        before clients come."""
        listener = socket.create_server((host, port), backlog=1024, reuse_port=False)
        listener.setblocking(False)
        self._listeners[name] = (listener, security)
        return int(listener.getsockname()[1])

    def serve(self) -> None:
        assert self._listeners, "listen first"
        self.metrics.watch_event_loop()  # this thread runs the loop: its idle time is measured
        for name, (listener, security) in self._listeners.items():
            self._spawn(self._accept_loop(listener, name, security))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for listener, _ in self._listeners.values():
            listener.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept_loop(
        self, listener: socket.socket, name: str, security: ListenerSecurity
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            connection, _ = await loop.sock_accept(listener)
            connection.setblocking(False)
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._spawn(self._serve(connection, name, security))

    async def _open(self, connection: socket.socket, security: ListenerSecurity) -> Channel:
        """The connection's channel, its TLS handshake done (TlsHandshakeError if not)."""
        if security.tls is None:
            return Channel(connection)
        channel = TlsChannel(connection, security.tls.current(), server_side=True)
        try:
            await within(channel.handshake(), HANDSHAKE_SECONDS)
        except TimeoutError:
            raise TlsHandshakeError("no TLS handshake in time") from None
        return channel

    async def _serve(
        self, connection: socket.socket, listener: str, security: ListenerSecurity
    ) -> None:
        LISTENER.set(listener)  # this connection's task: its requests see their listener
        peer = _peer(connection)
        client_host = "/" + peer.rsplit(":", 1)[0]
        self.metrics.connection_opened()
        try:
            channel = await self._open(connection, security)
            session = Session(security, self.sessions, channel.peer_subject(), client_host[1:])
            SESSION.set(session)
            reader = FrameReader(session.frame_limit or self.max_request_bytes)
            while True:
                received = await channel.recv_into(reader.writable())
                if not received:
                    return
                reader.received(received)
                try:
                    outbox = await self._frames(channel, reader, session, bytearray(), client_host)
                except AuthenticationClosedError as error:
                    await asyncio.sleep(error.delay)  # a failed login is answered late
                    if error.last_words:
                        await channel.sendall(error.last_words)
                    raise
                if outbox:
                    await channel.sendall(outbox)
        except (FrameTooLargeError, BadRequestError, RecordError, TlsHandshakeError) as error:
            self.metrics.closed_for_bad_input.inc()
            log.warning("closing connection from %s: %s", peer, error)
        except AuthenticationClosedError as error:
            self.metrics.closed_for_authentication.inc()
            log.info("closing connection from %s: %s", peer, error)
        except CloseConnectionError as error:
            log.info("closing connection from %s: %s", peer, error)
        except (ConnectionError, TimeoutError):
            pass
        except Exception:
            log.exception("closing connection from %s after an internal error", peer)
        finally:
            self.metrics.connection_closed()
            connection.close()
            if (session_of_connection := SESSION.get()) is not None:
                session_of_connection.end()  # what its authority granted ends with it

    async def _frames(
        self,
        channel: Channel,
        reader: FrameReader,
        session: Session,
        outbox: bytearray,
        client_host: str,
    ) -> bytearray:
        """Answer every whole frame received, as the session admits them; returns what is
        not sent yet. A refusal that closes the connection carries everything still to send
        (Kafka answers the refused request itself, then closes)."""
        produces: list[memoryview] = []
        for frame in reader.frames():
            try:
                if session.raw_tokens:  # SASL after a v0 handshake: bare tokens
                    outbox += _frame(session.raw_token(frame))
                    reader.max_frame = session.frame_limit or self.max_request_bytes
                    continue
                session.admit(int.from_bytes(frame[:2], "big") if len(frame) >= 2 else -1)
            except AuthenticationClosedError as error:
                error.last_words = bytes(outbox) + error.last_words
                raise
            if frame[:2] == _PRODUCE_KEY:
                produces.append(frame)
                if self.apis.client_quotas is not None:  # metered and muted one by one
                    outbox = await self._produce(channel, produces, outbox, client_host)
                    produces = []
                continue
            if produces:
                outbox = await self._produce(channel, produces, outbox, client_host)
                produces = []
            if outbox and frame[0] == 0 and frame[1] in _WAITING_KEYS:
                await channel.sendall(outbox)
                outbox = bytearray()
            try:
                outbox = await self._request(channel, frame, outbox, client_host, session)
            except AuthenticationClosedError as error:
                error.last_words = bytes(outbox) + error.last_words
                raise
            reader.max_frame = session.frame_limit or self.max_request_bytes
        if produces:
            outbox = await self._produce(channel, produces, outbox, client_host)
        return outbox

    async def _request(
        self,
        channel: Channel,
        frame: memoryview,
        outbox: bytearray,
        client_host: str,
        session: Session | None = None,
    ) -> bytearray:
        """Answer one frame. Byte answers join `outbox`, so the answers to requests that
        arrived together (pipelined produces) leave in one send; returns what is unsent."""
        started = time.perf_counter()
        parts, api_name, version = await self.respond(frame, client_host, session)
        throttle_ms, carried = _taken_throttle()
        if throttle_ms and not carried:  # an answer that cannot say so is held back instead
            outbox = await self._mute(channel, outbox, throttle_ms)
        if parts is not None:
            outbox = await self._send(channel, parts, outbox)
        self.metrics.request(api_name, version, time.perf_counter() - started)
        if throttle_ms and carried:
            outbox = await self._mute(channel, outbox, throttle_ms)
        return outbox

    async def _mute(self, channel: Channel, outbox: bytearray, throttle_ms: int) -> bytearray:
        """A client over its quota (services/broker/quotas.py): send what is queued, then
        read nothing more from the connection for ``throttle_ms``, as Kafka mutes the
        channel (KIP-219); the frames already received wait too."""
        if outbox:
            await channel.sendall(outbox)
        await asyncio.sleep(throttle_ms / 1000)
        return bytearray()

    async def _produce(
        self,
        channel: Channel,
        frames: list[memoryview],
        outbox: bytearray,
        client_host: str,
    ) -> bytearray:
        """Answer Produce frames that arrived together, in order, as `_request` would one
        by one, but with their records appended together (KafkaApis.produce_all). Bytes
        that do not decode close the connection before any of them is appended."""
        started = time.perf_counter()
        requests = []
        for frame in frames:
            header = parse_request_header(frame, client_host)
            assert header.api is not None
            requests.append((header, self._decode(frame, header, header.api)))
        responses = await self.apis.produce_all(requests)
        throttle_ms, carried = _taken_throttle()
        if throttle_ms and not carried:
            outbox = await self._mute(channel, outbox, throttle_ms)
        versions: dict[int, int] = {}
        for (header, _), response in zip(requests, responses, strict=True):
            if response is not None:
                head = response_header(header)
                (body,) = response  # a Produce answer is one encoded body
                outbox += (len(head) + len(body)).to_bytes(4, "big")
                outbox += head
                outbox += body
            versions[header.api_version] = versions.get(header.api_version, 0) + 1
        seconds = time.perf_counter() - started
        for version, count in versions.items():
            self.metrics.request("produce", version, seconds, count)
        if throttle_ms and carried:
            outbox = await self._mute(channel, outbox, throttle_ms)
        return outbox

    async def respond(
        self, frame: memoryview, client_host: str = "", session: Session | None = None
    ) -> tuple[list[Part] | None, str, int]:
        """The response to one request frame (None when the request wants none, as Produce
        with acks=0), with the API's name and version. Raises BadRequestError or RecordError
        for bytes that are not a request to answer: the caller closes the connection."""
        header = parse_request_header(frame, client_host)
        api = header.api
        if api is None:
            raise BadRequestError(f"unknown API key {header.api_key}")
        name = api.key.name.lower()
        if api.key == ApiKey.API_VERSIONS and not (
            api.min_version <= header.api_version <= api.max_version
        ):
            # KIP-511: answer in v0 with UNSUPPORTED_VERSION and the ranges served.
            self.metrics.request_error(name, ErrorCode.UNSUPPORTED_VERSION)
            answer = self.apis.api_versions_response(ErrorCode.UNSUPPORTED_VERSION)
            return [response_header(header) + bytes(answer.encode(version=0))], name, 0
        request = self._decode(frame, header, api)
        if api.key in SASL_KEYS:
            session = session or Session(PLAINTEXT, self.sessions)
            try:
                response = session.handle(header, request)
            except AuthenticationClosedError as error:
                if error.last_words:
                    error.last_words = _frame(response_header(header) + error.last_words)
                raise
        else:
            response = await self.apis.handle(api, header, request)
        version = header.api_version
        if response is None:
            return None, name, version
        if isinstance(response, list):
            return [response_header(header), *response], name, version
        return [encode_response(header, response)], name, version

    @staticmethod
    def _decode(frame: memoryview, header: RequestHeader, api: Api) -> Any:
        """The request body; BadRequestError for a version not served or bytes that do
        not decode as one."""
        if not api.min_version <= header.api_version <= api.max_version:
            raise BadRequestError(
                f"{api.key.name.lower()} v{header.api_version} is not served (versions "
                f"{api.min_version}-{api.max_version})"
            )
        try:
            return api.decode(frame[header.size :], header.api_version)
        except Exception as error:
            raise BadRequestError(
                f"{api.key.name.lower()} v{header.api_version} request does not decode: {error!r}"
            ) from error

    async def _send(self, channel: Channel, parts: list[Part], outbox: bytearray) -> bytearray:
        """Queue one size-prefixed response behind `outbox`; file slices go out at once
        (sendfile on a plain connection), views (remote records) as they are, and
        conversions chunk by chunk as they are made, after what is queued. Returns the
        bytes still queued."""
        outbox += sum(part_size(p) for p in parts).to_bytes(4, "big")
        for part in parts:
            if isinstance(part, bytes):
                outbox += part
                continue
            if outbox:
                await channel.sendall(outbox)
                outbox = bytearray()
            if isinstance(part, FileSlice):
                if part.size:
                    await channel.sendfile(part.fileno(), part.position, part.size)
            elif isinstance(part, DownConversion):
                async with contextlib.aclosing(part.chunks()) as chunks:
                    async for chunk in chunks:
                        await channel.sendall(chunk)
            else:
                await channel.sendall(part)
        return outbox


def _taken_throttle() -> tuple[int, bool]:
    """The throttle the handlers just set for this connection (apis.THROTTLE), reset."""
    throttle = THROTTLE.get()
    if throttle[0]:
        THROTTLE.set(NOT_THROTTLED)
    return throttle


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def _peer(connection: socket.socket) -> str:
    try:
        host, port = connection.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "unknown peer"
