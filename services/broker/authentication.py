"""Who a connection's client is: TLS and SASL on a broker's listeners (docs/security.md).

A listener's security protocol decides what its connections go through before their first
request: PLAINTEXT nothing, SSL a TLS handshake (the client certificate's subject becomes
the principal), SASL_PLAINTEXT and SASL_SSL a SASL exchange. Clients that authenticate
nothing are User:ANONYMOUS, as in Kafka.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from directlog.protocol.api import ApiKey, RequestHeader
from directlog.protocol.client import ClientSecurity, SaslLogin
from directlog.protocol.errors import ErrorCode
from directlog.rpc import controller_pb2 as pb
from directlog.security.sasl import PLAIN, Credentials, SaslServer, UnsupportedSaslMechanismError
from directlog.security.scram import (
    IllegalSaslStateError,
    SaslError,
    ScramCredential,
    ScramMechanism,
)
from directlog.security.tls import ReloadingContext, client_context, server_context
from services.broker.settings import BrokerSettings, ListenerSettings

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

log = logging.getLogger(__name__)

ANONYMOUS = "User:ANONYMOUS"
# What a connection may send before it has authenticated (Kafka's rule).
_BEFORE_AUTHENTICATION = frozenset(
    {ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}
)
SASL_KEYS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    """What a listener asks of the connections it accepts: TLS (a context reloaded when
    its files change) and SASL (the mechanisms it offers)."""

    protocol: str = "PLAINTEXT"
    tls: ReloadingContext | None = None
    sasl_mechanisms: tuple[str, ...] = ()


PLAINTEXT = ListenerSecurity()


def listener_security(settings: BrokerSettings, listener: ListenerSettings) -> ListenerSecurity:
    tls = None
    if listener.uses_ssl:
        files = settings.ssl
        assert files is not None, "checked by BrokerSettings"
        client_auth = settings.client_auth(listener)
        tls = ReloadingContext(
            files,
            lambda: server_context(files, client_auth),
            settings.ssl_files_check_interval_ms / 1000,
        )
    mechanisms = tuple(settings.sasl_mechanisms(listener)) if listener.uses_sasl else ()
    return ListenerSecurity(listener.protocol, tls, mechanisms)


def inter_broker_security(settings: BrokerSettings) -> ClientSecurity | None:
    """How this broker connects to the others' inter-broker listener: TLS checking their
    certificates against ssl.ca_file (presenting its own, for client auth), SASL with its
    own login."""
    listener = next(x for x in settings.kafka_listeners() if x.name == settings.inter_broker())
    if listener.protocol == "PLAINTEXT":
        return None
    tls = client_context(settings.ssl) if listener.uses_ssl and settings.ssl else None
    login = None
    if listener.uses_sasl:
        username, password = (
            settings.inter_broker_sasl_username,
            settings.inter_broker_sasl_password,
        )
        assert username and password, "checked by BrokerSettings"
        login = SaslLogin(
            settings.inter_broker_sasl_mechanism, username, password.get_secret_value()
        )
    return ClientSecurity(tls, login, f"directlog-broker-{settings.node_id}")


class AuthenticationClosedError(Exception):
    """The connection must close, after `last_words` (the refusal's answer, once the server
    framed it) and, for a failed authentication, after `delay` seconds (Kafka's
    connection.failed.authentication.delay.ms: it slows password guessing down without
    holding other clients up)."""

    def __init__(self, reason: str, answer: bytes = b"", delay: float = 0.0) -> None:
        super().__init__(reason)
        self.last_words = answer
        self.delay = delay


@dataclass(frozen=True, slots=True)
class SessionSettings:
    credentials: Credentials
    max_reauth_ms: int  # connections.max.reauth.ms; 0: no session lifetime
    failed_delay: float  # seconds
    max_receive_size: int  # frame limit before authentication (sasl.server.max.receive.size)


class Session:
    """One connection's identity: the principal its requests act as (User:ANONYMOUS, the
    TLS client certificate's subject, or the SASL user), and, on a SASL listener, the
    exchange that establishes it, re-authentication (KIP-368) included."""

    def __init__(
        self,
        security: ListenerSecurity,
        settings: SessionSettings,
        tls_subject: str | None = None,
        client_host: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.client_host = client_host  # the peer's address, for ACLs' host
        self.principal = f"User:{tls_subject}" if tls_subject else ANONYMOUS
        self._clock = clock
        self._sasl = (
            SaslServer(security.sasl_mechanisms, settings.credentials)
            if security.sasl_mechanisms
            else None
        )
        self.authenticated = self._sasl is None
        self.raw_tokens = False  # after SaslHandshake v0: tokens come as bare frames
        self._reauth_capable = False  # the client used SaslAuthenticate v1+
        self._expires: float | None = None  # when the session ends without re-authentication
        self._watchers: dict[object, Callable[[str], None]] = {}
        self._expiry: asyncio.TimerHandle | None = None  # armed while watchers wait
        self._closed = False

    @property
    def frame_limit(self) -> int | None:
        """The largest frame to accept now (None: the listener's usual limit)."""
        return None if self.authenticated else self.settings.max_receive_size

    @property
    def sasl(self) -> bool:
        """Whether the principal comes from a SASL login: one that can end (an expired
        lifetime, deleted credentials)."""
        return self._sasl is not None

    def credentials_exist(self) -> bool:
        """Whether the credentials the SASL login was checked against are still stored
        (PLAIN: any of the user's); True for a session without a login."""
        mechanism = self._sasl.mechanism if self._sasl is not None else None
        if mechanism is None or not self.authenticated:
            return True
        user = self.principal.removeprefix("User:")
        if mechanism == PLAIN:
            return any(self.settings.credentials(user, m) is not None for m in ScramMechanism)
        return self.settings.credentials(user, ScramMechanism.from_name(mechanism)) is not None

    def on_end(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(why)`` once, when the session ends: its connection closes, or its
        lifetime passes without a re-authentication. For what outlives a request on the
        session's authority (RDMA grants). Returns what cancels the call; needs a running
        event loop."""
        key = object()
        self._watchers[key] = callback
        if self._closed:
            asyncio.get_running_loop().call_soon(self._end, "its connection closed")
        else:
            self._arm_expiry()

        def cancel() -> None:
            self._watchers.pop(key, None)

        return cancel

    def end(self) -> None:
        """The connection closed (the server calls this once)."""
        self._closed = True
        self._end("its connection closed")

    def _arm_expiry(self) -> None:
        if self._expires is None or self._expiry is not None or not self._watchers:
            return
        delay = max(self._expires - self._clock(), 0.0)
        self._expiry = asyncio.get_running_loop().call_later(delay, self._expiry_due)

    def _expiry_due(self) -> None:
        self._expiry = None
        if self._expires is None:
            return
        if self._clock() < self._expires:
            self._arm_expiry()  # re-authenticated meanwhile
        else:
            self._end(f"its session expired ({self.principal} did not re-authenticate)")

    def _end(self, why: str) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        watchers, self._watchers = self._watchers, {}
        for callback in watchers.values():
            try:
                callback(why)
            except Exception:
                log.exception("a session end callback of %s failed", self.principal)

    def admit(self, api_key: int) -> None:
        """Raise AuthenticationClosedError for a request this connection may not send now:
        anything but ApiVersions and SASL before authentication, and anything but a
        re-authentication once the session expired."""
        if not self.authenticated:
            if api_key not in _BEFORE_AUTHENTICATION:
                raise AuthenticationClosedError(
                    f"unexpected request (API key {api_key}) before SASL authentication"
                )
        elif (
            self._expires is not None
            and self._clock() >= self._expires
            and api_key not in SASL_KEYS
        ):
            raise AuthenticationClosedError(f"session of {self.principal} expired")

    def handle(self, header: RequestHeader, request: Any) -> Any:
        """The answer to SaslHandshake or SaslAuthenticate; raises AuthenticationClosedError
        (carrying the answer) when the connection must close after it."""
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            return self._handshake(header.api_version, request.mechanism)
        return self._authenticate(header.api_version, request.auth_bytes)

    def _handshake(self, version: int, mechanism: str) -> Any:
        answer = SaslHandshakeResponse[version]
        if self._sasl is None:
            return answer(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])
        try:
            if self._sasl.complete and self._reauth_capable:
                self._sasl.reset_for_reauthentication()
            self._sasl.handshake(mechanism)
        except UnsupportedSaslMechanismError as error:
            response = answer(error_code=error.code, mechanisms=error.enabled)
            raise AuthenticationClosedError(str(error), _encode(response, version)) from None
        except IllegalSaslStateError as error:
            response = answer(error_code=error.code, mechanisms=self._sasl.enabled)
            raise AuthenticationClosedError(str(error), _encode(response, version)) from None
        self.raw_tokens = version == 0
        return answer(error_code=ErrorCode.NONE, mechanisms=self._sasl.enabled)

    def _authenticate(self, version: int, token: bytes) -> Any:
        answer = SaslAuthenticateResponse[version]
        fields: dict[str, Any] = {"session_lifetime_ms": 0} if version >= 1 else {}
        if self._sasl is None or self.raw_tokens:
            return answer(
                error_code=ErrorCode.ILLEGAL_SASL_STATE,
                error_message="SaslAuthenticate on a connection that is not authenticating",
                auth_bytes=b"",
                **fields,
            )
        try:
            server_token = self._sasl.authenticate(token or b"")
        except SaslError as error:
            response = answer(
                error_code=error.code, error_message=str(error), auth_bytes=b"", **fields
            )
            raise AuthenticationClosedError(
                str(error), _encode(response, version), self.settings.failed_delay
            ) from None
        if self._sasl.complete:
            self._reauth_capable = version >= 1
            if version >= 1:
                fields["session_lifetime_ms"] = self._authenticated()
            else:
                self._authenticated()
        return answer(
            error_code=ErrorCode.NONE, error_message=None, auth_bytes=server_token, **fields
        )

    def raw_token(self, token: bytes | memoryview) -> bytes:
        """After SaslHandshake v0: one bare token in, the bare answer out (no error path:
        a failure closes the connection)."""
        assert self._sasl is not None and self.raw_tokens
        try:
            answer = self._sasl.authenticate(bytes(token))
        except SaslError as error:
            raise AuthenticationClosedError(str(error), b"", self.settings.failed_delay) from None
        if self._sasl.complete:
            self.raw_tokens = False
            self._authenticated()
        return answer

    def _authenticated(self) -> int:
        """The exchange completed: the principal is the SASL user; the session's lifetime
        in ms (0: unbounded)."""
        assert self._sasl is not None and self._sasl.principal is not None
        self.principal = self._sasl.principal
        self.authenticated = True
        lifetime = self.settings.max_reauth_ms
        self._expires = self._clock() + lifetime / 1000 if lifetime else None
        return lifetime


def _encode(response: Any, version: int) -> bytes:
    return bytes(response.encode(version=version))


# The session of the connection whose request is being handled (set by the server for each
# connection's task): the principal and host the authorizer and quotas see.
SESSION: contextvars.ContextVar[Session | None] = contextvars.ContextVar("session", default=None)


def stored_credentials(
    lookup: Callable[[str, int], pb.ScramCredential | None],
) -> Credentials:
    """SASL's credential lookup over the cluster metadata's SCRAM credentials (the broker's
    image): what is stored there now is what the next login is checked against."""

    def credential(user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        stored = lookup(user, int(mechanism))
        if stored is None:
            return None
        return ScramCredential(
            mechanism, stored.salt, stored.stored_key, stored.server_key, stored.iterations
        )

    return credential


def session_settings(settings: BrokerSettings, credentials: Credentials) -> SessionSettings:
    return SessionSettings(
        credentials,
        settings.connections_max_reauth_ms,
        settings.connection_failed_authentication_delay_ms / 1000,
        settings.sasl_server_max_receive_size,
    )


NO_SASL = SessionSettings(lambda user, mechanism: None, 0, 0.0, 524288)  # listeners without SASL
