"""Kafka's SASL exchange on the broker side: handshake errors and their codes, PLAIN against
SCRAM credentials (with kafka-python's PLAIN and SCRAM clients too), SCRAM through the
server, and KIP-368 re-authentication."""

from __future__ import annotations

import pytest
from kafka.net.sasl.plain import SaslMechanismPlain
from kafka.net.sasl.scram import SaslMechanismScram

from directlog.protocol.errors import ErrorCode
from directlog.security.sasl import (
    MECHANISMS,
    PLAIN,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    SaslClient,
    SaslServer,
    UnsupportedSaslMechanismError,
)
from directlog.security.scram import (
    IllegalSaslStateError,
    SaslAuthenticationError,
    ScramCredential,
    ScramMechanism,
)

SHA256 = ScramMechanism.SCRAM_SHA_256
SHA512 = ScramMechanism.SCRAM_SHA_512

STORE = {
    ("alice", SHA512): ScramCredential.from_password(SHA512, "alice-secret"),
    ("alice", SHA256): ScramCredential.from_password(SHA256, "alice-secret"),
    ("bob", SHA512): ScramCredential.from_password(SHA512, "bob-secret"),
    ("bob", SHA256): ScramCredential.from_password(SHA256, "bob-secret"),
    ("old", SHA256): ScramCredential.from_password(SHA256, "only-256"),
    # Two passwords, one per mechanism, as Kafka's per-mechanism credentials allow.
    ("split", SHA512): ScramCredential.from_password(SHA512, "for-512"),
    ("split", SHA256): ScramCredential.from_password(SHA256, "for-256"),
}
ALL = [PLAIN, SCRAM_SHA_256, SCRAM_SHA_512]


def credentials(user: str, mechanism: ScramMechanism) -> ScramCredential | None:
    return STORE.get((user, mechanism))


def log_in(server: SaslServer, mechanism: str, user: str, password: str) -> None:
    """Drive `server` through handshake and tokens with our own client."""
    client = SaslClient(mechanism, user, password)
    server.handshake(mechanism)
    token: bytes | None = client.first()
    while token is not None:
        token = client.respond(server.authenticate(token))
    assert client.complete


@pytest.mark.timeout(30)
def test_mechanism_names() -> None:
    assert MECHANISMS == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
    assert SaslServer([SCRAM_SHA_512, PLAIN, SCRAM_SHA_512], credentials).enabled == [
        SCRAM_SHA_512,
        PLAIN,
    ]
    with pytest.raises(ValueError, match="no SASL mechanism enabled"):
        SaslServer([], credentials)
    with pytest.raises(ValueError, match=r"unknown SASL mechanisms \['GSSAPI'\]"):
        SaslServer([PLAIN, "GSSAPI"], credentials)


@pytest.mark.timeout(30)
def test_unsupported_mechanism_lists_the_enabled_ones_and_fails_the_connection() -> None:
    server = SaslServer([SCRAM_SHA_512, PLAIN], credentials)
    with pytest.raises(UnsupportedSaslMechanismError) as refused:
        server.handshake(SCRAM_SHA_256)
    assert refused.value.code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert refused.value.enabled == [SCRAM_SHA_512, PLAIN]
    assert str(refused.value) == "Unsupported SASL mechanism SCRAM-SHA-256"
    with pytest.raises(IllegalSaslStateError, match="received after authentication failed") as late:
        server.handshake(PLAIN)
    assert late.value.code == ErrorCode.ILLEGAL_SASL_STATE
    assert server.principal is None and not server.complete


@pytest.mark.timeout(30)
def test_requests_at_the_wrong_time_are_illegal_sasl_state() -> None:
    server = SaslServer(ALL, credentials)
    with pytest.raises(
        IllegalSaslStateError, match="SaslAuthenticate received before SaslHandshake"
    ):
        server.authenticate(b"\x00alice\x00alice-secret")
    with pytest.raises(
        IllegalSaslStateError, match="re-authentication received before SaslHandshake"
    ):
        server.reset_for_reauthentication()
    server.handshake(PLAIN)
    with pytest.raises(IllegalSaslStateError, match="SaslHandshake received while SASL tokens"):
        server.handshake(PLAIN)
    assert server.authenticate(b"\x00alice\x00alice-secret") == b""
    assert server.complete and server.mechanism == PLAIN
    with pytest.raises(
        IllegalSaslStateError, match="SaslAuthenticate received after successful authentication"
    ):
        server.authenticate(b"\x00alice\x00alice-secret")
    # Without the connection layer starting re-authentication, a handshake is illegal.
    with pytest.raises(IllegalSaslStateError, match="SaslHandshake received after successful"):
        server.handshake(PLAIN)
    assert server.principal == "User:alice"  # an illegal request does not end the session


@pytest.mark.timeout(30)
def test_plain_with_kafka_python_client() -> None:
    client = SaslMechanismPlain(
        sasl_plain_username="alice",
        sasl_plain_password="alice-secret",
        security_protocol="SASL_SSL",
    )
    server = SaslServer(ALL, credentials)
    server.handshake(PLAIN)
    client.receive(server.authenticate(client.auth_bytes()))  # kafka-python sends authzid too
    assert client.is_authenticated()
    assert server.complete and server.principal == "User:alice"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("user", "password"), [("alice", "alice-secret"), ("old", "only-256"), ("split", "for-512")]
)
def test_plain_checks_the_password_against_scram_credentials(user: str, password: str) -> None:
    server = SaslServer([PLAIN], credentials)
    log_in(server, PLAIN, user, password)
    assert server.complete and server.principal == f"User:{user}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("token", "message"),
    [
        (b"\x00alice\x00wrong", "Authentication failed: Invalid username or password"),
        (b"\x00mallory\x00alice-secret", "Authentication failed: Invalid username or password"),
        # The SHA-512 credential decides; its SHA-256 sibling's password does not count.
        (b"\x00split\x00for-256", "Authentication failed: Invalid username or password"),
        (b"\x00\x00alice-secret", "Authentication failed: username not specified"),
        (b"\x00alice\x00", "Authentication failed: password not specified"),
        (b"bob\x00alice\x00alice-secret", "authorization id that is different from username"),
        (b"alice\x00alice-secret", "expected 3 tokens, got 2"),
        (b"\x00alice\x00alice\x00secret", "expected 3 tokens, got 4"),
        (b"\x00alice\x00\xff\xfe", "SASL/PLAIN message is not UTF-8"),
        (b"\x00alice\x00" + b"p" * 5000, "larger than 4096 bytes"),
    ],
)
def test_plain_refusals(token: bytes, message: str) -> None:
    server = SaslServer([PLAIN], credentials)
    server.handshake(PLAIN)
    with pytest.raises(SaslAuthenticationError, match=message) as refused:
        server.authenticate(token)
    assert refused.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert not server.complete and server.principal is None
    with pytest.raises(IllegalSaslStateError):
        server.authenticate(b"\x00alice\x00alice-secret")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
def test_scram_through_the_server(mechanism: str) -> None:
    server = SaslServer(ALL, credentials)
    log_in(server, mechanism, "bob", "bob-secret")
    assert server.complete and server.principal == "User:bob" and server.mechanism == mechanism


@pytest.mark.timeout(30)
def test_scram_with_kafka_python_client_through_the_server() -> None:
    client = SaslMechanismScram(
        sasl_plain_username="bob",
        sasl_plain_password="bob-secret",
        sasl_mechanism=SCRAM_SHA_512,
        security_protocol="SASL_SSL",
    )
    server = SaslServer(ALL, credentials)
    server.handshake(SCRAM_SHA_512)
    client.receive(server.authenticate(client.auth_bytes()))
    assert not server.complete and server.principal is None
    client.receive(server.authenticate(client.auth_bytes()))
    assert client.is_authenticated() and server.principal == "User:bob"


@pytest.mark.timeout(30)
def test_scram_wrong_password_and_user_without_that_mechanism() -> None:
    server = SaslServer(ALL, credentials)
    with pytest.raises(SaslAuthenticationError) as wrong:
        log_in(server, SCRAM_SHA_512, "alice", "wrong")
    assert str(wrong.value) == (
        "Authentication failed during authentication due to invalid credentials "
        "with SASL mechanism SCRAM-SHA-512"
    )
    assert server.principal is None
    server = SaslServer(ALL, credentials)
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        log_in(server, SCRAM_SHA_512, "old", "only-256")  # "old" has SHA-256 only
    server = SaslServer(ALL, credentials)
    log_in(server, SCRAM_SHA_256, "old", "only-256")
    assert server.principal == "User:old"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mechanism", ALL)
def test_reauthentication_as_the_same_user(mechanism: str) -> None:
    server = SaslServer(ALL, credentials)
    log_in(server, mechanism, "alice", "alice-secret")
    server.reset_for_reauthentication()
    assert (server.complete, server.principal) == (False, "User:alice")  # still serving
    log_in(server, mechanism, "alice", "alice-secret")
    assert (server.complete, server.principal) == (True, "User:alice")
    server.reset_for_reauthentication()
    log_in(server, mechanism, "alice", "alice-secret")
    assert server.complete


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mechanism", ALL)
def test_reauthentication_as_another_user_is_refused(mechanism: str) -> None:
    server = SaslServer(ALL, credentials)
    log_in(server, mechanism, "alice", "alice-secret")
    server.reset_for_reauthentication()
    with pytest.raises(SaslAuthenticationError) as refused:
        log_in(server, mechanism, "bob", "bob-secret")
    assert refused.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert str(refused.value) == (
        "Cannot change principals during re-authentication from User.alice: User.bob"
    )
    assert not server.complete and server.principal is None
    with pytest.raises(IllegalSaslStateError):
        server.handshake(mechanism)


@pytest.mark.timeout(30)
def test_reauthentication_with_another_mechanism_is_refused_at_the_first_token() -> None:
    server = SaslServer(ALL, credentials)
    log_in(server, SCRAM_SHA_512, "alice", "alice-secret")
    server.reset_for_reauthentication()
    server.handshake(PLAIN)  # answered like an accepted one, as Kafka does
    with pytest.raises(SaslAuthenticationError) as refused:
        server.authenticate(b"\x00alice\x00alice-secret")
    assert str(refused.value) == (
        "SASL mechanism 'PLAIN' requested by client is not supported for re-authentication "
        "of mechanism 'SCRAM-SHA-512'"
    )
    assert not server.complete and server.principal is None


@pytest.mark.timeout(30)
def test_reauthentication_with_a_disabled_mechanism_or_a_bad_password() -> None:
    server = SaslServer([PLAIN, SCRAM_SHA_256], credentials)
    log_in(server, PLAIN, "alice", "alice-secret")
    server.reset_for_reauthentication()
    with pytest.raises(UnsupportedSaslMechanismError):
        server.handshake(SCRAM_SHA_512)
    assert server.principal is None

    server = SaslServer([PLAIN], credentials)
    log_in(server, PLAIN, "alice", "alice-secret")
    server.reset_for_reauthentication()
    with pytest.raises(SaslAuthenticationError, match="Invalid username or password"):
        log_in(server, PLAIN, "alice", "stale")
    assert server.principal is None and not server.complete


@pytest.mark.timeout(30)
def test_client_checks_and_order() -> None:
    with pytest.raises(ValueError, match="not a SCRAM mechanism"):
        SaslClient("GSSAPI", "alice", "x")
    with pytest.raises(ValueError, match="without NUL"):
        SaslClient(PLAIN, "al\x00ice", "x")
    with pytest.raises(ValueError, match="username and a password"):
        SaslClient(PLAIN, "alice", "")

    plain = SaslClient(PLAIN, "alice", "alice-secret")
    with pytest.raises(IllegalSaslStateError):
        plain.respond(b"")
    assert plain.first() == b"\x00alice\x00alice-secret"
    with pytest.raises(IllegalSaslStateError):
        plain.first()
    with pytest.raises(SaslAuthenticationError, match="PLAIN server answered with a token"):
        plain.respond(b"unexpected")
    assert not plain.complete

    plain = SaslClient(PLAIN, "alice", "alice-secret")
    plain.first()
    assert plain.respond(b"") is None and plain.complete
    with pytest.raises(IllegalSaslStateError):
        plain.respond(b"")


@pytest.mark.timeout(30)
def test_scram_client_checks_the_server_signature() -> None:
    client = SaslClient(SCRAM_SHA_256, "bob", "bob-secret")
    server = SaslServer([SCRAM_SHA_256], credentials)
    server.handshake(SCRAM_SHA_256)
    final = client.respond(server.authenticate(client.first()))
    assert final is not None and final.startswith(b"c=biws,r=")
    answer = server.authenticate(final)
    assert server.complete  # the server is satisfied; the client is not fooled
    with pytest.raises(SaslAuthenticationError, match="server signature is wrong"):
        client.respond(answer[:-3] + (b"AAA" if answer[-3:] != b"AAA" else b"BBB"))
    assert not client.complete
    with pytest.raises(IllegalSaslStateError):
        client.respond(answer)
