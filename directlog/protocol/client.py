"""A minimal asyncio Kafka protocol connection: one request at a time. Brokers use it to
fetch from partition leaders (replication).

`exchange` sends a ready-made request frame and returns the response frame, received with
recv_into straight into one buffer of its size (no stream-buffer copies: fetch responses
carry megabytes of records); `request` does the same for kafka-python message objects.
With `ClientSecurity` the connection is TLS and/or SASL-authenticated first, as a Kafka
client on an SSL, SASL_PLAINTEXT or SASL_SSL listener, and when the broker gives the login a
lifetime (connections.max.reauth.ms) it logs in again on the same connection before the
lifetime ends, as Kafka's clients do (KIP-368): held connections outlive their sessions.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import socket
import ssl
import warnings
from dataclasses import dataclass
from typing import Any

from directlog.security.channel import Channel, TlsChannel
from directlog.security.sasl import SaslClient
from directlog.waits import within

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.sasl import (
        SaslAuthenticateRequest,
        SaslAuthenticateResponse,
        SaslHandshakeRequest,
        SaslHandshakeResponse,
    )

log = logging.getLogger(__name__)

_SIZE = 4
MAX_RESPONSE_BYTES = 1 << 30
# When, within a session's lifetime, a client logs in again: at random in this span, as
# Kafka's clients do, so that many connections of one client do not renew at once.
REAUTH_SPAN = (0.85, 0.95)


class AuthenticationFailedError(ConnectionError):
    """The broker refused the SASL login (the broker's message says why)."""


@dataclass(frozen=True, slots=True)
class SaslLogin:
    mechanism: str  # PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    username: str
    password: str


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How to reach a listener: TLS with this context (SSL, SASL_SSL), SASL with this
    login (SASL_PLAINTEXT, SASL_SSL)."""

    tls: ssl.SSLContext | None = None
    sasl: SaslLogin | None = None
    client_id: str = "directlog"
    reauthenticate: bool = True  # False: as a client from before KIP-368, never renew


class KafkaConnection:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._correlation = itertools.count(1)
        self._lock = asyncio.Lock()
        self._renewal: asyncio.TimerHandle | None = None
        self._renewing: asyncio.Task[None] | None = None

    @classmethod
    async def connect(
        cls, host: str, port: int, timeout: float, security: ClientSecurity | None = None
    ) -> KafkaConnection:
        """Connected, with the TLS handshake and SASL login `security` asks for done, all
        within `timeout`; AuthenticationFailedError when the login is refused."""
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await within(loop.sock_connect(sock, (host, port)), timeout)
            if security is None:
                return cls(Channel(sock))
            return await within(cls._secure(sock, host, security), timeout)
        except BaseException:
            sock.close()
            raise

    @classmethod
    async def _secure(
        cls, sock: socket.socket, host: str, security: ClientSecurity
    ) -> KafkaConnection:
        channel: Channel = Channel(sock)
        if security.tls is not None:
            channel = TlsChannel(sock, security.tls, server_side=False, server_hostname=host)
            await channel.handshake()
        connection = cls(channel)
        if security.sasl is not None:
            async with connection._lock:
                lifetime_ms = await connection._login(security.sasl, security.client_id)
            if security.reauthenticate:
                connection._renew_within(lifetime_ms, security.sasl, security.client_id)
        return connection

    async def _login(self, login: SaslLogin, client_id: str) -> int:
        """SaslHandshake v1, then SaslAuthenticate v2 until the mechanism is done (the lock
        held); the session's lifetime in ms, 0 when it has none."""
        handshake = await self._request(
            SaslHandshakeRequest[1](mechanism=login.mechanism), SaslHandshakeResponse, client_id
        )
        if handshake.error_code:
            raise AuthenticationFailedError(
                f"SASL mechanism {login.mechanism} refused (error {handshake.error_code}); "
                f"the broker offers {handshake.mechanisms}"
            )
        client = SaslClient(login.mechanism, login.username, login.password)
        token: bytes | None = client.first()
        lifetime_ms = 0
        while token is not None:
            answer = await self._request(
                SaslAuthenticateRequest[2](auth_bytes=token), SaslAuthenticateResponse, client_id
            )
            if answer.error_code:
                raise AuthenticationFailedError(
                    f"SASL {login.mechanism} login of {login.username} failed "
                    f"(error {answer.error_code}): {answer.error_message}"
                )
            lifetime_ms = answer.session_lifetime_ms
            token = client.respond(answer.auth_bytes or b"")
        return int(lifetime_ms)

    def _renew_within(self, lifetime_ms: int, login: SaslLogin, client_id: str) -> None:
        """Log in again before a session of `lifetime_ms` ends, idle or not (KIP-368)."""
        if lifetime_ms <= 0:
            return
        delay = lifetime_ms / 1000 * random.uniform(*REAUTH_SPAN)
        self._renewal = asyncio.get_running_loop().call_later(
            delay, self._start_renewal, login, client_id
        )

    def _start_renewal(self, login: SaslLogin, client_id: str) -> None:
        self._renewal = None
        self._renewing = asyncio.get_running_loop().create_task(self._renew(login, client_id))

    async def _renew(self, login: SaslLogin, client_id: str) -> None:
        try:
            async with self._lock:  # between two requests
                lifetime_ms = await self._login(login, client_id)
        except (OSError, AuthenticationFailedError) as error:
            # The broker ends the session; this connection's next use fails and its owner
            # reconnects, as after any lost connection.
            log.warning("re-authentication of %s failed: %s", login.username, error)
            self._channel.close()
            return
        self._renew_within(lifetime_ms, login, client_id)

    def next_correlation_id(self) -> int:
        return next(self._correlation)

    async def exchange(self, frame: bytes) -> memoryview:
        """Send one size-prefixed request; the response frame (size prefix stripped)."""
        async with self._lock:
            return await self._exchange(frame)

    async def _exchange(self, frame: bytes) -> memoryview:
        await self._channel.sendall(frame)
        size = int.from_bytes(await self._receive(_SIZE), "big")
        if not 0 <= size <= MAX_RESPONSE_BYTES:
            raise ConnectionError(f"response of {size} bytes")
        return await self._receive(size)

    async def _receive(self, size: int) -> memoryview:
        buffer = memoryview(bytearray(size))
        filled = 0
        while filled < size:
            received = await self._channel.recv_into(buffer[filled:])
            if not received:
                raise ConnectionError("connection closed mid-response")
            filled += received
        return buffer

    async def request(self, request: Any, response_class: Any, client_id: str) -> Any:
        """Send `request` (a kafka-python request object with its version set) and decode
        the answer with `response_class` at the same version."""
        async with self._lock:
            return await self._request(request, response_class, client_id)

    async def _request(self, request: Any, response_class: Any, client_id: str) -> Any:
        correlation_id = self.next_correlation_id()
        request.with_header(correlation_id=correlation_id, client_id=client_id)
        frame = await self._exchange(bytes(request.encode(header=True, framed=True)))
        response = response_class.decode(frame, version=request.API_VERSION, header=True)
        answered = response.header.correlation_id
        if answered != correlation_id:
            raise ConnectionError(f"answer to request {answered}, expected {correlation_id}")
        return response

    async def close(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
        if self._renewing is not None:
            self._renewing.cancel()
        self._channel.close()
