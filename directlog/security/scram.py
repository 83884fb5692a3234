"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka uses them, sans-I/O.

`ScramCredential` is what cluster metadata stores for a user (salt, StoredKey, ServerKey,
iterations; never the password). `ScramServer` runs one exchange on a broker, `ScramClient`
the other end for Directlog's own connections. Both are fed message bytes and return
message bytes; framing (SaslAuthenticate or raw size-prefixed tokens) is the caller's.

Passwords are UTF-8 encoded without SASLprep normalisation: Kafka's Java ScramFormatter
(`normalize` is `getBytes(UTF_8)`) does the same, so a credential created by either side
verifies on the other even for non-ASCII passwords.

Channel binding is not offered (Kafka has no SCRAM-*-PLUS mechanism): a client may send the
gs2 flag "n" or "y", never "p=".
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import ClassVar

from directlog.protocol.errors import ErrorCode

# Kafka's AlterUserScramCredentials refuses iteration counts outside these bounds, and its
# SCRAM server and client refuse fewer than the minimum.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384

# No legitimate SCRAM message comes near this (a 64-byte SHA-512 proof is 88 base64
# characters); it bounds what an unauthenticated peer can make us decode and hash.
MAX_MESSAGE_BYTES = 4096

# NIST SP 800-132 asks for at least 128 random bits of salt; 32 bytes matches the larger
# digest we use and costs nothing. (Kafka's own generator uses ~130 random bits as text.)
SALT_BYTES = 32

# ScramLoginModule.TOKEN_AUTH_CONFIG: the client-first extension that asks for delegation
# token authentication.
TOKEN_AUTH_EXTENSION = "tokenauth"


class ScramMechanism(IntEnum):
    """Kafka's ScramMechanism codes, as DescribeUserScramCredentials and
    AlterUserScramCredentials carry them."""

    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2

    @property
    def mechanism_name(self) -> str:
        return "SCRAM-SHA-256" if self is ScramMechanism.SCRAM_SHA_256 else "SCRAM-SHA-512"

    @property
    def hash_name(self) -> str:
        """The hashlib name of H() and of HMAC's digest."""
        return "sha256" if self is ScramMechanism.SCRAM_SHA_256 else "sha512"

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size

    @classmethod
    def from_name(cls, name: str) -> ScramMechanism:
        """The mechanism a SASL mechanism name denotes; ValueError for any other name."""
        for mechanism in cls:
            if mechanism.mechanism_name == name:
                return mechanism
        raise ValueError(f"not a SCRAM mechanism: {name!r}")


class SaslError(Exception):
    """A failure of a SASL exchange; `code` is the Kafka error code to answer with and the
    message is what the client is told."""

    code: ClassVar[ErrorCode]


class SaslAuthenticationError(SaslError):
    """The client's credentials or messages were refused."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED


class IllegalSaslStateError(SaslError):
    """A request or token came when the exchange did not expect one."""

    code = ErrorCode.ILLEGAL_SASL_STATE


def invalid_credentials(mechanism_name: str) -> SaslAuthenticationError:
    """Kafka's one message for an unknown user and a wrong password, so the two cannot be
    told apart from the text."""
    return SaslAuthenticationError(
        "Authentication failed during authentication due to invalid credentials "
        f"with SASL mechanism {mechanism_name}"
    )


def authzid_mismatch() -> SaslAuthenticationError:
    """Kafka's text when a client asks to act as a user other than the one it proves."""
    return SaslAuthenticationError(
        "Authentication failed: "
        "Client requested an authorization id that is different from username"
    )


def salted_password(
    mechanism: ScramMechanism, password: str, salt: bytes, iterations: int
) -> bytes:
    """SaltedPassword = Hi(Normalize(password), salt, i); Hi is PBKDF2 with HMAC-H."""
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode("utf-8"), salt, iterations)


def _hmac(mechanism: ScramMechanism, key: bytes, message: bytes) -> bytes:
    return hmac.digest(key, message, mechanism.hash_name)


def _hash(mechanism: ScramMechanism, data: bytes) -> bytes:
    return hashlib.new(mechanism.hash_name, data).digest()


def _xor(left: bytes, right: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(left, right, strict=True))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _check_iterations(iterations: int) -> None:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations {iterations} outside [{MIN_ITERATIONS}, {MAX_ITERATIONS}]")


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """One user's credential for one mechanism, as cluster metadata stores it. Salt and keys
    stay out of repr: ServerKey lets its holder pose as the server, and StoredKey plus one
    sniffed exchange lets its holder pose as the user (RFC 5802, section 9)."""

    mechanism: ScramMechanism
    salt: bytes = field(repr=False)
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int

    def __post_init__(self) -> None:
        _check_iterations(self.iterations)
        if not self.salt:
            raise ValueError("empty salt")
        size = self.mechanism.digest_size
        if len(self.stored_key) != size or len(self.server_key) != size:
            raise ValueError(f"{self.mechanism.mechanism_name} keys are {size} bytes")

    @classmethod
    def from_salted_password(
        cls, mechanism: ScramMechanism, salted_password: bytes, salt: bytes, iterations: int
    ) -> ScramCredential:
        """From what AlterUserScramCredentials carries: the client computes SaltedPassword,
        so the password itself never reaches the cluster."""
        if len(salted_password) != mechanism.digest_size:
            raise ValueError(
                f"a {mechanism.mechanism_name} salted password is {mechanism.digest_size} bytes"
            )
        client_key = _hmac(mechanism, salted_password, b"Client Key")
        return cls(
            mechanism=mechanism,
            salt=salt,
            stored_key=_hash(mechanism, client_key),
            server_key=_hmac(mechanism, salted_password, b"Server Key"),
            iterations=iterations,
        )

    @classmethod
    def from_password(
        cls,
        mechanism: ScramMechanism,
        password: str,
        salt: bytes | None = None,
        iterations: int = MIN_ITERATIONS,
    ) -> ScramCredential:
        """A new credential; without `salt`, a random one of SALT_BYTES, so two users with
        one password get unrelated credentials."""
        _check_iterations(iterations)  # before PBKDF2 runs that many rounds
        if salt is None:
            salt = secrets.token_bytes(SALT_BYTES)
        return cls.from_salted_password(
            mechanism, salted_password(mechanism, password, salt, iterations), salt, iterations
        )


def verify_password(credential: ScramCredential, password: str) -> bool:
    """Whether `password` is the one `credential` was made from, compared in constant time.
    This lets SASL/PLAIN authenticate against the SCRAM credentials, so there is one set of
    users whichever mechanism a client picks."""
    mechanism = credential.mechanism
    salted = salted_password(mechanism, password, credential.salt, credential.iterations)
    stored_key = _hash(mechanism, _hmac(mechanism, salted, b"Client Key"))
    return hmac.compare_digest(stored_key, credential.stored_key)


def random_nonce() -> str:
    """24 random bytes as URL-safe base64: 32 printable characters, none of them a comma."""
    return secrets.token_urlsafe(24)


def _text(message: bytes, what: str) -> str:
    if len(message) > MAX_MESSAGE_BYTES:
        raise SaslAuthenticationError(f"SCRAM {what} is larger than {MAX_MESSAGE_BYTES} bytes")
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslAuthenticationError(f"SCRAM {what} is not UTF-8") from None
    if "\x00" in text:
        raise SaslAuthenticationError(f"SCRAM {what} contains a NUL character")
    return text


def _value(attribute: str, key: str, what: str) -> str:
    if not attribute.startswith(f"{key}="):
        raise SaslAuthenticationError(
            f"SCRAM {what}: expected attribute '{key}=', got {attribute[:32]!r}"
        )
    return attribute[2:]


def _decode_base64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise SaslAuthenticationError(f"SCRAM {what} is not valid base64") from None


def _is_nonce(text: str) -> bool:
    """RFC 5802: a nonce is printable ASCII other than ','."""
    return bool(text) and all("\x21" <= c <= "\x7e" and c != "," for c in text)


def _check_nonce(nonce: str, what: str) -> None:
    if not _is_nonce(nonce):
        raise SaslAuthenticationError(f"SCRAM {what} nonce must be printable ASCII, not empty")


def _check_extensions(attributes: list[str], what: str) -> dict[str, str]:
    extensions: dict[str, str] = {}
    for attribute in attributes:
        name, equals, value = attribute.partition("=")
        if not equals or not name.isascii() or not name.isalpha():
            raise SaslAuthenticationError(f"SCRAM {what}: malformed extension {attribute[:32]!r}")
        extensions[name] = value
    return extensions


def _decode_saslname(name: str, what: str) -> str:
    """RFC 5802 saslname: ',' travels as '=2C' and '=' as '=3D'; any other '=' is invalid."""
    if name.replace("=2C", "").replace("=3D", "").count("="):
        raise SaslAuthenticationError(f"SCRAM {what}: '=' must be escaped as '=3D' or '=2C'")
    return name.replace("=2C", ",").replace("=3D", "=")


def _encode_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


@dataclass(frozen=True, slots=True)
class _ClientFirst:
    gs2_header: str
    authzid: str
    username: str
    nonce: str
    bare: str
    extensions: dict[str, str]


def _parse_client_first(message: bytes) -> _ClientFirst:
    text = _text(message, "client-first-message")
    parts = text.split(",", 2)
    if len(parts) != 3:
        raise SaslAuthenticationError("SCRAM client-first-message: missing gs2 header")
    flag, authzid_part, bare = parts
    if flag.startswith("p="):
        raise SaslAuthenticationError("SCRAM channel binding ('p=' gs2 flag) is not supported")
    # "y" says the client could bind but thinks we cannot, which is true: RFC 5802 fails it
    # only on a server that supports channel binding.
    if flag not in ("n", "y"):
        raise SaslAuthenticationError("SCRAM client-first-message: gs2 flag must be 'n' or 'y'")
    authzid = ""
    if authzid_part:
        authzid = _decode_saslname(_value(authzid_part, "a", "gs2 header"), "authzid")
    attributes = bare.split(",")
    if attributes[0].startswith("m="):
        raise SaslAuthenticationError("SCRAM mandatory extension 'm=' is not supported")
    if len(attributes) < 2:
        raise SaslAuthenticationError("SCRAM client-first-message: expected username and nonce")
    username = _decode_saslname(_value(attributes[0], "n", "client-first-message"), "username")
    if not username:
        raise SaslAuthenticationError("SCRAM client-first-message: empty username")
    nonce = _value(attributes[1], "r", "client-first-message")
    _check_nonce(nonce, "client")
    return _ClientFirst(
        gs2_header=f"{flag},{authzid_part},",
        authzid=authzid,
        username=username,
        nonce=nonce,
        bare=bare,
        extensions=_check_extensions(attributes[2:], "client-first-message"),
    )


class _Step(Enum):
    FIRST = "awaiting client-first-message"
    FINAL = "awaiting client-final-message"
    COMPLETE = "complete"
    FAILED = "failed"


class ScramServer:
    """The server side of one SCRAM exchange: `first` then `final`, each fed the client's
    message and returning the server's. Any failure raises SaslAuthenticationError and ends
    the exchange; a call out of turn raises IllegalSaslStateError.

    An unknown user fails at the first message, with the same text a wrong password gets at
    the proof. This follows Kafka's ScramSaslServer (its failed credential lookup throws a
    SaslException, which the broker answers with the generic text) rather than answering
    with a made-up salt: a client can tell the two cases apart by the step that fails, here
    as against Kafka, but not by the text.
    """

    def __init__(
        self,
        mechanism: ScramMechanism,
        lookup: Callable[[str], ScramCredential | None],
        nonce: Callable[[], str] = random_nonce,
    ) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        self._nonce = nonce
        self._step = _Step.FIRST
        self._client_first: _ClientFirst | None = None
        self._credential: ScramCredential | None = None
        self._server_first = ""
        self._full_nonce = ""
        self.username: str | None = None

    @property
    def complete(self) -> bool:
        return self._step is _Step.COMPLETE

    def _expect(self, step: _Step, call: str) -> None:
        if self._step is not step:
            raise IllegalSaslStateError(f"SCRAM {call} called while {self._step.value}")

    def first(self, client_first: bytes) -> bytes:
        """Take client-first-message, answer server-first-message (nonce, salt, iterations)."""
        self._expect(_Step.FIRST, "first")
        try:
            return self._first(client_first)
        except SaslError:
            self._step = _Step.FAILED
            raise

    def _first(self, client_first: bytes) -> bytes:
        message = _parse_client_first(client_first)
        # Checked before the lookup (Kafka checks after), so this answer does not reveal
        # whether the user exists.
        if message.authzid and message.authzid != message.username:
            raise authzid_mismatch()
        if message.extensions.get(TOKEN_AUTH_EXTENSION, "").lower() == "true":
            raise SaslAuthenticationError(
                "SCRAM delegation token authentication (tokenauth=true) is not supported"
            )
        credential = self._lookup(message.username)
        if credential is None:
            raise invalid_credentials(self.mechanism.mechanism_name)
        if credential.mechanism is not self.mechanism:
            raise ValueError(f"lookup returned a {credential.mechanism.mechanism_name} credential")
        server_nonce = self._nonce()
        if not _is_nonce(server_nonce):
            raise ValueError(f"not a SCRAM nonce: {server_nonce!r}")
        self._full_nonce = message.nonce + server_nonce
        self._server_first = (
            f"r={self._full_nonce},s={_b64(credential.salt)},i={credential.iterations}"
        )
        self._client_first = message
        self._credential = credential
        self._step = _Step.FINAL
        return self._server_first.encode("utf-8")

    def final(self, client_final: bytes) -> bytes:
        """Take client-final-message, check its proof, answer server-final-message (v=...)."""
        self._expect(_Step.FINAL, "final")
        try:
            return self._final(client_final)
        except SaslError:
            self._step = _Step.FAILED
            raise
        finally:
            self._credential = None

    def _final(self, client_final: bytes) -> bytes:
        assert self._client_first is not None and self._credential is not None
        text = _text(client_final, "client-final-message")
        attributes = text.split(",")
        if len(attributes) < 3:
            raise SaslAuthenticationError("SCRAM client-final-message: expected c=, r= and p=")
        binding = _decode_base64(
            _value(attributes[0], "c", "client-final-message"), "channel binding"
        )
        nonce = _value(attributes[1], "r", "client-final-message")
        _check_extensions(attributes[2:-1], "client-final-message")
        proof = _decode_base64(_value(attributes[-1], "p", "client-final-message"), "proof")
        if binding != self._client_first.gs2_header.encode("utf-8"):
            raise SaslAuthenticationError(
                "SCRAM channel binding 'c=' does not match the gs2 header"
            )
        # Kafka accepts a nonce that ends with the exchange's: some librdkafka releases (kcat
        # 1.7 on Debian 12 among them) send their own nonce again in front of it. The proof,
        # computed over the message as sent, is what authenticates.
        if not nonce.endswith(self._full_nonce):
            raise SaslAuthenticationError(
                "SCRAM client-final-message nonce does not match the exchange's nonce"
            )
        mechanism, credential = self.mechanism, self._credential
        if len(proof) != mechanism.digest_size:
            raise SaslAuthenticationError(f"SCRAM proof must be {mechanism.digest_size} bytes")
        without_proof = ",".join(attributes[:-1])
        auth_message = f"{self._client_first.bare},{self._server_first},{without_proof}".encode()
        client_key = _xor(proof, _hmac(mechanism, credential.stored_key, auth_message))
        if not hmac.compare_digest(_hash(mechanism, client_key), credential.stored_key):
            raise invalid_credentials(mechanism.mechanism_name)
        signature = _hmac(mechanism, credential.server_key, auth_message)
        self.username = self._client_first.username
        self._step = _Step.COMPLETE
        return f"v={_b64(signature)}".encode("ascii")


class _ClientStep(Enum):
    FIRST = "first"
    FINAL = "final"
    VERIFY = "verify"
    COMPLETE = "complete"
    FAILED = "failed"


class ScramClient:
    """The client side of one SCRAM exchange, for Directlog's own connections to SASL
    listeners: `first()`, then `final(server_first)`, then `verify(server_final)`, which
    checks that the server knew the credential too (mutual authentication)."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        username: str,
        password: str,
        nonce: Callable[[], str] = random_nonce,
    ) -> None:
        if not username:
            raise ValueError("empty username")
        self.mechanism = mechanism
        self._username = username
        self._password = password
        self._nonce = nonce()
        if not _is_nonce(self._nonce):
            raise ValueError(f"not a SCRAM nonce: {self._nonce!r}")
        self._step = _ClientStep.FIRST
        self._bare = ""
        self._server_signature = b""

    @property
    def complete(self) -> bool:
        return self._step is _ClientStep.COMPLETE

    def _advance(self, step: _ClientStep, call: str) -> None:
        if self._step is not step:
            raise IllegalSaslStateError(f"SCRAM client {call}() called at step {self._step.value}")

    def first(self) -> bytes:
        """client-first-message: no channel binding, no authzid."""
        self._advance(_ClientStep.FIRST, "first")
        self._bare = f"n={_encode_saslname(self._username)},r={self._nonce}"
        self._step = _ClientStep.FINAL
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        """client-final-message with the proof, from server-first-message."""
        self._advance(_ClientStep.FINAL, "final")
        try:
            message = self._final(server_first)
        except SaslError:
            self._step = _ClientStep.FAILED
            raise
        self._step = _ClientStep.VERIFY
        return message

    def _final(self, server_first: bytes) -> bytes:
        text = _text(server_first, "server-first-message")
        attributes = text.split(",")
        if attributes[0].startswith("m="):
            raise SaslAuthenticationError("SCRAM mandatory extension 'm=' is not supported")
        if len(attributes) < 3:
            raise SaslAuthenticationError("SCRAM server-first-message: expected r=, s= and i=")
        nonce = _value(attributes[0], "r", "server-first-message")
        _check_nonce(nonce, "server")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise SaslAuthenticationError("SCRAM server nonce does not extend the client nonce")
        salt = _decode_base64(_value(attributes[1], "s", "server-first-message"), "salt")
        if not salt:
            raise SaslAuthenticationError("SCRAM server-first-message: empty salt")
        count = _value(attributes[2], "i", "server-first-message")
        # Bounded both ways: fewer weakens what an eavesdropper must brute-force, more lets a
        # hostile server make us burn CPU.
        if not (
            count.isascii() and count.isdigit() and MIN_ITERATIONS <= int(count) <= MAX_ITERATIONS
        ):
            raise SaslAuthenticationError(
                f"SCRAM iterations {count[:16]!r} outside [{MIN_ITERATIONS}, {MAX_ITERATIONS}]"
            )
        _check_extensions(attributes[3:], "server-first-message")
        mechanism = self.mechanism
        salted = salted_password(mechanism, self._password, salt, int(count))
        client_key = _hmac(mechanism, salted, b"Client Key")
        without_proof = f"c={_b64(b'n,,')},r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        signature = _hmac(mechanism, _hash(mechanism, client_key), auth_message)
        self._server_signature = _hmac(
            mechanism, _hmac(mechanism, salted, b"Server Key"), auth_message
        )
        return f"{without_proof},p={_b64(_xor(client_key, signature))}".encode()

    def verify(self, server_final: bytes) -> None:
        """Check server-final-message: an `e=` error or a wrong ServerSignature raises."""
        self._advance(_ClientStep.VERIFY, "verify")
        try:
            self._verify(server_final)
        except SaslError:
            self._step = _ClientStep.FAILED
            raise
        self._step = _ClientStep.COMPLETE

    def _verify(self, server_final: bytes) -> None:
        text = _text(server_final, "server-final-message")
        attribute = text.split(",")[0]
        if attribute.startswith("e="):
            raise SaslAuthenticationError(f"SCRAM server refused the exchange: {attribute[2:66]}")
        signature = _value(attribute, "v", "server-final-message")
        # Compared as text: base64 leaves a few bits unused before '=' padding, and a changed
        # byte must never pass.
        if not hmac.compare_digest(signature.encode(), _b64(self._server_signature).encode()):
            raise SaslAuthenticationError(
                "SCRAM server signature is wrong: the server does not hold our credential"
            )
