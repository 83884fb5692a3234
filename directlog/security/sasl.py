"""Kafka's SASL exchange, sans-I/O: the broker's side (`SaslServer`) and a client for
Directlog's own connections (`SaslClient`).

A Kafka client names a mechanism in SaslHandshake, then sends the mechanism's tokens: in
SaslAuthenticate requests after handshake v1, as raw size-prefixed frames without a Kafka
header after handshake v0. The connection layer does that framing and maps the typed
errors to responses: each error's `code` is the Kafka error code and its message is the
SaslAuthenticate error_message. The states follow Kafka's SaslServerAuthenticator,
re-authentication (KIP-368) included.

PLAIN checks the password against the user's SCRAM credentials, so PLAIN and SCRAM share one
set of users and the cluster never stores a password.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum
from typing import Protocol

from directlog.protocol.errors import ErrorCode
from directlog.security.scram import (
    MAX_MESSAGE_BYTES,
    IllegalSaslStateError,
    SaslAuthenticationError,
    SaslError,
    ScramClient,
    ScramCredential,
    ScramMechanism,
    ScramServer,
    authzid_mismatch,
    verify_password,
)

PLAIN = "PLAIN"
SCRAM_SHA_256 = ScramMechanism.SCRAM_SHA_256.mechanism_name
SCRAM_SHA_512 = ScramMechanism.SCRAM_SHA_512.mechanism_name
MECHANISMS = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)

# PLAIN's order of preference among a user's credentials: the first one present decides.
_PLAIN_CREDENTIALS = (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256)

Credentials = Callable[[str, ScramMechanism], ScramCredential | None]


class UnsupportedSaslMechanismError(SaslError):
    """The handshake named a mechanism this listener does not enable; the SaslHandshake
    response lists `enabled`."""

    code = ErrorCode.UNSUPPORTED_SASL_MECHANISM

    def __init__(self, mechanism: str, enabled: Sequence[str]) -> None:
        super().__init__(f"Unsupported SASL mechanism {mechanism[:64]}")
        self.enabled = list(enabled)


class _Exchange(Protocol):
    """One mechanism's server side: fed client tokens, returns server tokens."""

    @property
    def username(self) -> str | None:
        """Set once the exchange has authenticated the client."""

    def evaluate(self, token: bytes) -> bytes: ...


class _PlainExchange:
    """RFC 4616: one message `authzid NUL authcid NUL passwd`, answered with nothing."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials
        self.username: str | None = None

    def evaluate(self, token: bytes) -> bytes:
        if len(token) > MAX_MESSAGE_BYTES:
            raise SaslAuthenticationError(
                f"SASL/PLAIN message is larger than {MAX_MESSAGE_BYTES} bytes"
            )
        try:
            parts = token.decode("utf-8").split("\x00")
        except UnicodeDecodeError:
            raise SaslAuthenticationError("SASL/PLAIN message is not UTF-8") from None
        if len(parts) != 3:
            raise SaslAuthenticationError(
                f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}"
            )
        authzid, username, password = parts
        if not username:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        if authzid and authzid != username:
            raise authzid_mismatch()
        credential = next(
            (
                found
                for mechanism in _PLAIN_CREDENTIALS
                if (found := self._credentials(username, mechanism)) is not None
            ),
            None,
        )
        if credential is None or not verify_password(credential, password):
            raise SaslAuthenticationError("Authentication failed: Invalid username or password")
        self.username = username
        return b""


class _ScramExchange:
    """A ScramServer behind the one-call-per-token shape: first token, then final token."""

    def __init__(self, mechanism: ScramMechanism, credentials: Credentials) -> None:
        self._server = ScramServer(mechanism, lambda user: credentials(user, mechanism))
        self._answered_first = False

    @property
    def username(self) -> str | None:
        return self._server.username

    def evaluate(self, token: bytes) -> bytes:
        if self._answered_first:
            return self._server.final(token)
        self._answered_first = True
        return self._server.first(token)


class _State(Enum):
    HANDSHAKE = "before SaslHandshake"
    AUTHENTICATE = "while SASL tokens are expected"
    COMPLETE = "after successful authentication"
    REAUTH_HANDSHAKE = "before the re-authentication SaslHandshake"
    REAUTH_BAD_MECHANISM = "after a re-authentication SaslHandshake changed the mechanism"
    FAILED = "after authentication failed"


class _Event(Enum):
    MECHANISM_CHOSEN = "handshake named an enabled mechanism"
    MECHANISM_CHANGED = "re-authentication handshake named another enabled mechanism"
    MECHANISM_REFUSED = "handshake named a mechanism that is not enabled"
    TOKEN_ANSWERED = "token answered, the exchange goes on"
    EXCHANGE_DONE = "token answered, the client is authenticated"
    EXCHANGE_FAILED = "token refused"
    REAUTHENTICATE = "an authenticated connection starts re-authentication"


_HANDSHAKE_EVENTS = frozenset(
    {_Event.MECHANISM_CHOSEN, _Event.MECHANISM_CHANGED, _Event.MECHANISM_REFUSED}
)
_TOKEN_EVENTS = frozenset({_Event.TOKEN_ANSWERED, _Event.EXCHANGE_DONE, _Event.EXCHANGE_FAILED})

# Every allowed transition; a request whose events a state lacks is ILLEGAL_SASL_STATE.
# A changed mechanism at re-authentication is answered like an accepted one and refused at
# the next token, as Kafka's REAUTH_BAD_MECHANISM does.
_TRANSITIONS: dict[_State, dict[_Event, _State]] = {
    _State.HANDSHAKE: {
        _Event.MECHANISM_CHOSEN: _State.AUTHENTICATE,
        _Event.MECHANISM_REFUSED: _State.FAILED,
    },
    _State.AUTHENTICATE: {
        _Event.TOKEN_ANSWERED: _State.AUTHENTICATE,
        _Event.EXCHANGE_DONE: _State.COMPLETE,
        _Event.EXCHANGE_FAILED: _State.FAILED,
    },
    _State.COMPLETE: {_Event.REAUTHENTICATE: _State.REAUTH_HANDSHAKE},
    _State.REAUTH_HANDSHAKE: {
        _Event.MECHANISM_CHOSEN: _State.AUTHENTICATE,
        _Event.MECHANISM_CHANGED: _State.REAUTH_BAD_MECHANISM,
        _Event.MECHANISM_REFUSED: _State.FAILED,
    },
    _State.REAUTH_BAD_MECHANISM: {_Event.EXCHANGE_FAILED: _State.FAILED},
    _State.FAILED: {},
}


class SaslServer:
    """One connection's SASL state on a SASL listener.

    The connection layer calls `handshake` for SaslHandshake, `authenticate` for each token,
    and, when an authenticated client that supports re-authentication (it sent SaslAuthenticate
    v1 or later) sends SaslHandshake again, `reset_for_reauthentication` before `handshake`.
    Without that reset, a handshake on an authenticated connection is ILLEGAL_SASL_STATE, as
    Kafka's broker answers it. After any error the connection should be closed once the
    response is sent.
    """

    def __init__(self, enabled: Sequence[str], credentials: Credentials) -> None:
        names = list(dict.fromkeys(enabled))
        if not names:
            raise ValueError("no SASL mechanism enabled")
        unknown = [name for name in names if name not in MECHANISMS]
        if unknown:
            raise ValueError(f"unknown SASL mechanisms {unknown}; known: {list(MECHANISMS)}")
        self._enabled = names
        self._credentials = credentials
        self._state = _State.HANDSHAKE
        self._mechanism: str | None = None
        self._exchange: _Exchange | None = None
        self._principal: str | None = None
        self._refusal = ""

    @property
    def enabled(self) -> list[str]:
        """The mechanisms a SaslHandshake response lists."""
        return list(self._enabled)

    @property
    def complete(self) -> bool:
        return self._state is _State.COMPLETE

    @property
    def mechanism(self) -> str | None:
        return self._mechanism

    @property
    def principal(self) -> str | None:
        """ "User:<name>" once authenticated; it stays while the connection re-authenticates,
        and is None before authentication and after any failure."""
        return self._principal

    def _accept(self, events: frozenset[_Event], request: str) -> None:
        if not events & _TRANSITIONS[self._state].keys():
            raise IllegalSaslStateError(f"{request} received {self._state.value}")

    def _fire(self, event: _Event) -> None:
        self._state = _TRANSITIONS[self._state][event]
        if self._state is _State.FAILED:
            self._principal = None
            self._exchange = None

    def handshake(self, mechanism: str) -> None:
        """SaslHandshake: choose `mechanism`, or raise UnsupportedSaslMechanismError or
        IllegalSaslStateError."""
        self._accept(_HANDSHAKE_EVENTS, "SaslHandshake")
        if mechanism not in self._enabled:
            self._fire(_Event.MECHANISM_REFUSED)
            raise UnsupportedSaslMechanismError(mechanism, self._enabled)
        if self._state is _State.REAUTH_HANDSHAKE and mechanism != self._mechanism:
            self._refusal = (
                f"SASL mechanism '{mechanism}' requested by client is not supported for "
                f"re-authentication of mechanism '{self._mechanism}'"
            )
            self._fire(_Event.MECHANISM_CHANGED)
            return
        self._mechanism = mechanism
        self._exchange = (
            _PlainExchange(self._credentials)
            if mechanism == PLAIN
            else _ScramExchange(ScramMechanism.from_name(mechanism), self._credentials)
        )
        self._fire(_Event.MECHANISM_CHOSEN)

    def authenticate(self, token: bytes) -> bytes:
        """One client token in, the server's token out (b"" when the mechanism has nothing
        to say). Raises SaslAuthenticationError or IllegalSaslStateError."""
        self._accept(_TOKEN_EVENTS, "SaslAuthenticate")
        if self._state is _State.REAUTH_BAD_MECHANISM:
            self._fire(_Event.EXCHANGE_FAILED)
            raise SaslAuthenticationError(self._refusal)
        assert self._exchange is not None
        try:
            answer = self._exchange.evaluate(token)
        except SaslError:
            self._fire(_Event.EXCHANGE_FAILED)
            raise
        if self._exchange.username is None:
            self._fire(_Event.TOKEN_ANSWERED)
            return answer
        principal = f"User:{self._exchange.username}"
        if self._principal is not None and principal != self._principal:
            previous = self._principal.replace(":", ".", 1)
            self._fire(_Event.EXCHANGE_FAILED)
            raise SaslAuthenticationError(
                "Cannot change principals during re-authentication from "
                f"{previous}: {principal.replace(':', '.', 1)}"
            )
        self._principal = principal
        self._exchange = None
        self._fire(_Event.EXCHANGE_DONE)
        return answer

    def reset_for_reauthentication(self) -> None:
        """KIP-368: an authenticated connection authenticates again, with the same mechanism
        and as the same principal; its principal stays valid meanwhile."""
        self._accept(frozenset({_Event.REAUTHENTICATE}), "re-authentication")
        self._fire(_Event.REAUTHENTICATE)


class SaslClient:
    """The client side for Directlog's own connections to SASL listeners: send `first()`,
    then feed each server token to `respond`, sending what it returns until it returns None.
    For SCRAM the last step checks the server's signature."""

    def __init__(self, mechanism: str, username: str, password: str) -> None:
        self.mechanism = mechanism
        self._scram: ScramClient | None = None
        if mechanism == PLAIN:
            if not username or not password or "\x00" in username + password:
                raise ValueError("PLAIN needs a username and a password without NUL")
            self._plain = f"\x00{username}\x00{password}".encode()
        else:
            self._scram = ScramClient(ScramMechanism.from_name(mechanism), username, password)
        self._sent = 0
        self.complete = False

    def first(self) -> bytes:
        """The first token, sent right after the handshake."""
        if self._sent:
            raise IllegalSaslStateError("SASL client first() called twice")
        self._sent = 1
        return self._scram.first() if self._scram is not None else self._plain

    def respond(self, challenge: bytes) -> bytes | None:
        """The next token for the server's `challenge`, or None when the exchange is done."""
        if not self._sent or self.complete:
            raise IllegalSaslStateError("SASL client respond() called out of turn")
        if self._scram is None:
            if challenge:
                raise SaslAuthenticationError("SASL/PLAIN server answered with a token")
        elif self._sent == 1:
            self._sent = 2
            return self._scram.final(challenge)
        else:
            self._scram.verify(challenge)
        self.complete = True
        return None
