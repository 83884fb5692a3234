"""SCRAM: RFC 7677's exchange byte for byte, kafka-python's client against our server, our
client against our server, and hostile or malformed messages.

The client proofs for hand-made messages are computed here from RFC 5802's formulas with
hashlib and hmac, independently of directlog.security.scram.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from kafka.net.sasl.scram import SaslMechanismScram

from directlog.protocol.errors import ErrorCode
from directlog.security.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    IllegalSaslStateError,
    SaslAuthenticationError,
    ScramClient,
    ScramCredential,
    ScramMechanism,
    ScramServer,
    salted_password,
    verify_password,
)

SHA256 = ScramMechanism.SCRAM_SHA_256
SHA512 = ScramMechanism.SCRAM_SHA_512

# RFC 7677, section 3 (user "user", password "pencil").
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

SERVER_NONCE = "sErVeRnOnCe0123456789"
CREDENTIALS = {
    (mechanism, user): ScramCredential.from_password(mechanism, password)
    for mechanism in ScramMechanism
    for user, password in (("alice", "alice-secret"), ("a,b=c", "escaped"), ("zoë", "pässwörd"))
}


def server(mechanism: ScramMechanism = SHA256) -> ScramServer:
    return ScramServer(
        mechanism, lambda user: CREDENTIALS.get((mechanism, user)), nonce=lambda: SERVER_NONCE
    )


def invalid_credentials(mechanism: ScramMechanism) -> str:
    return (
        "Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mechanism.mechanism_name}"
    )


def hand_made_final(
    mechanism: ScramMechanism,
    password: str,
    gs2_header: bytes,
    client_first: bytes,
    server_first: bytes,
) -> bytes:
    """client-final-message straight from RFC 5802's definitions."""
    name = mechanism.hash_name
    fields = dict(item.split("=", 1) for item in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac(
        name, password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    without_proof = b"c=" + base64.b64encode(gs2_header) + b",r=" + fields["r"].encode()
    bare = client_first[len(gs2_header) :]
    signature = hmac.new(
        stored_key, bare + b"," + server_first + b"," + without_proof, name
    ).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return without_proof + b",p=" + base64.b64encode(proof)


@pytest.mark.timeout(30)
def test_rfc_7677_exchange_server_side() -> None:
    credential = ScramCredential.from_password(SHA256, "pencil", RFC_SALT, 4096)
    scram = ScramServer(
        SHA256, lambda user: credential if user == "user" else None, nonce=lambda: RFC_SERVER_NONCE
    )
    assert scram.first(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert (scram.complete, scram.username) == (False, None)
    assert scram.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert (scram.complete, scram.username) == (True, "user")


@pytest.mark.timeout(30)
def test_rfc_7677_exchange_client_side() -> None:
    client = ScramClient(SHA256, "user", "pencil", nonce=lambda: RFC_CLIENT_NONCE)
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    assert not client.complete
    client.verify(RFC_SERVER_FINAL)
    assert client.complete


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mechanism", list(ScramMechanism))
def test_kafka_python_client_authenticates(mechanism: ScramMechanism) -> None:
    client = SaslMechanismScram(
        sasl_plain_username="alice",
        sasl_plain_password="alice-secret",
        sasl_mechanism=mechanism.mechanism_name,
        security_protocol="SASL_SSL",
    )
    scram = server(mechanism)
    client.receive(scram.first(client.auth_bytes()))
    client.receive(scram.final(client.auth_bytes()))  # raises on a wrong server signature
    assert client.is_authenticated()
    assert scram.complete and scram.username == "alice"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mechanism", list(ScramMechanism))
def test_kafka_python_wrong_password_fails_at_the_proof_like_an_unknown_user(
    mechanism: ScramMechanism,
) -> None:
    def kafka_python(user: str, password: str) -> SaslMechanismScram:
        return SaslMechanismScram(
            sasl_plain_username=user,
            sasl_plain_password=password,
            sasl_mechanism=mechanism.mechanism_name,
            security_protocol="SASL_SSL",
        )

    wrong = kafka_python("alice", "not-her-secret")
    scram = server(mechanism)
    wrong.receive(scram.first(wrong.auth_bytes()))  # the first step passes
    with pytest.raises(SaslAuthenticationError) as at_proof:
        scram.final(wrong.auth_bytes())
    assert not scram.complete and scram.username is None

    unknown = kafka_python("mallory", "whatever")
    with pytest.raises(SaslAuthenticationError) as at_first:
        server(mechanism).first(unknown.auth_bytes())
    assert str(at_proof.value) == str(at_first.value) == invalid_credentials(mechanism)
    assert at_proof.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mechanism", list(ScramMechanism))
@pytest.mark.parametrize(
    ("user", "password"), [("alice", "alice-secret"), ("a,b=c", "escaped"), ("zoë", "pässwörd")]
)
def test_our_client_and_server_agree(mechanism: ScramMechanism, user: str, password: str) -> None:
    client, scram = ScramClient(mechanism, user, password), server(mechanism)
    first = client.first()
    if user == "a,b=c":
        assert first.startswith(b"n,,n=a=2Cb=3Dc,r=")
    client.verify(scram.final(client.final(scram.first(first))))
    assert client.complete and scram.complete and scram.username == user


def awaiting_verify() -> tuple[ScramClient, bytes]:
    """A client that has sent its proof, and the server-final-message it expects; with both
    nonces fixed, every call gives the same message."""
    client, scram = (
        ScramClient(SHA512, "alice", "alice-secret", nonce=lambda: "fixed"),
        server(SHA512),
    )
    return client, scram.final(client.final(scram.first(client.first())))


@pytest.mark.timeout(60)
def test_client_refuses_a_tampered_server_signature() -> None:
    server_final = awaiting_verify()[1]
    for index in range(len(server_final)):
        client = awaiting_verify()[0]
        tampered = bytearray(server_final)
        tampered[index] = ord("A") if tampered[index] != ord("A") else ord("B")
        with pytest.raises(SaslAuthenticationError):
            client.verify(bytes(tampered))
        assert not client.complete
        with pytest.raises(IllegalSaslStateError):
            client.verify(server_final)
    client = awaiting_verify()[0]
    client.verify(server_final)
    assert client.complete


@pytest.mark.timeout(30)
def test_client_refuses_a_server_that_does_not_know_the_password() -> None:
    impostor = ScramCredential.from_password(SHA256, "some-other-password")
    scram = ScramServer(SHA256, lambda user: impostor)
    client = ScramClient(SHA256, "alice", "alice-secret")
    # The server cannot check this proof; a server that answered anyway is caught here.
    client_final = client.final(scram.first(client.first()))
    with pytest.raises(SaslAuthenticationError):
        scram.final(client_final)
    forged = b"v=" + base64.b64encode(hmac.new(impostor.server_key, b"x", "sha256").digest())
    with pytest.raises(SaslAuthenticationError, match="server signature is wrong"):
        client.verify(forged)


@pytest.mark.timeout(30)
def test_client_reports_the_servers_error() -> None:
    client = ScramClient(SHA256, "alice", "alice-secret")
    client.final(server().first(client.first()))
    with pytest.raises(SaslAuthenticationError, match="server refused the exchange: invalid-proof"):
        client.verify(b"e=invalid-proof")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("server_first", "problem"),
    [
        (b"m=x,r=cnonceS,s=c2FsdA==,i=4096", "mandatory extension"),
        (b"r=cnonce,s=c2FsdA==,i=4096", "does not extend the client nonce"),
        (b"r=othernonce,s=c2FsdA==,i=4096", "does not extend the client nonce"),
        (b"r=cnonceS,s=c2FsdA==,i=4095", "outside"),
        (b"r=cnonceS,s=c2FsdA==,i=100000000", "outside"),
        (b"r=cnonceS,s=c2FsdA==,i=-4096", "outside"),
        (b"r=cnonceS,s=c2Fsd,i=4096", "salt is not valid base64"),
        (b"r=cnonceS,s=,i=4096", "empty salt"),
        (b"r=cnonceS,i=4096,s=c2FsdA==", "expected attribute 's='"),
        (b"r=cnonceS,s=c2FsdA==", "expected r=, s= and i="),
    ],
)
def test_client_refuses_malformed_server_first(server_first: bytes, problem: str) -> None:
    client = ScramClient(SHA256, "alice", "alice-secret", nonce=lambda: "cnonce")
    client.first()
    with pytest.raises(SaslAuthenticationError, match=problem):
        client.final(server_first)


CLIENT_FIRST_ERRORS = [
    (b"p=tls-unique,,n=alice,r=abc", "channel binding"),
    (b"x,,n=alice,r=abc", "gs2 flag must be 'n' or 'y'"),
    (b"n=alice,r=abc", "missing gs2 header"),
    (b"n,n=alice,r=abc", "gs2 header: expected attribute 'a='"),
    (b"n,b=alice,n=alice,r=abc", "expected attribute 'a='"),
    (b"n,a=bob,n=alice,r=abc", "authorization id that is different from username"),
    (b"n,,n=ali=ce,r=abc", "'=' must be escaped"),
    (b"n,,n=alice=2,r=abc", "'=' must be escaped"),
    (b"n,,m=mandatory,n=alice,r=abc", "mandatory extension 'm='"),
    (b"n,,n=alice,r=a c", "client nonce must be printable"),
    (b"n,,n=alice,r=", "client nonce must be printable"),
    (b"n,,n=alice,r=abc,tokenauth=true", "delegation token"),
    (b"n,,n=alice,r=abc,tokenauth=TRUE", "delegation token"),
    (b"n,,n=alice,r=abc,9x=y", "malformed extension"),
    (b"n,,n=alice,r=abc,noequals", "malformed extension"),
    (b"n,,n=alice", "expected username and nonce"),
    (b"n,,r=abc,n=alice", "expected attribute 'n='"),
    (b"n,,n=,r=abc", "empty username"),
    (b"n,,n=ali\x00ce,r=abc", "NUL"),
    (b"n,,n=\xff\xfe,r=abc", "not UTF-8"),
    (b"n,,n=alice,r=" + b"a" * 5000, "larger than 4096 bytes"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("client_first", "problem"), CLIENT_FIRST_ERRORS)
def test_server_names_what_is_wrong_with_client_first(client_first: bytes, problem: str) -> None:
    scram = server()
    with pytest.raises(SaslAuthenticationError, match=problem) as refused:
        scram.first(client_first)
    assert refused.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
    with pytest.raises(IllegalSaslStateError):  # a failed exchange stays failed
        scram.first(b"n,,n=alice,r=abc")


@pytest.mark.timeout(30)
def test_unknown_extensions_are_ignored_and_tokenauth_false_is_allowed() -> None:
    client_first = b"n,,n=alice,r=abc,tokenauth=false,other=1"
    scram = server()
    server_first = scram.first(client_first)
    scram.final(hand_made_final(SHA256, "alice-secret", b"n,,", client_first, server_first))
    assert scram.username == "alice"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "gs2_header",
    [b"n,,", b"y,,", b"n,a=alice,", b"y,a=alice,"],
    ids=["n", "y", "n-authzid", "y-authzid"],
)
def test_gs2_flags_and_an_authzid_equal_to_the_user_are_accepted(gs2_header: bytes) -> None:
    client_first = gs2_header + b"n=alice,r=abc"
    scram = server()
    server_first = scram.first(client_first)
    final = hand_made_final(SHA256, "alice-secret", gs2_header, client_first, server_first)
    assert scram.final(final).startswith(b"v=")
    assert scram.username == "alice"


def first_exchanged() -> tuple[ScramServer, bytes, bytes]:
    scram = server()
    client_first = b"n,,n=alice,r=abc"
    return scram, client_first, scram.first(client_first)


@pytest.mark.timeout(30)
def test_server_names_what_is_wrong_with_client_final() -> None:
    full_nonce = b"abc" + SERVER_NONCE.encode()
    good = hand_made_final(SHA256, "alice-secret", b"n,,", *first_exchanged()[1:])
    proof = good.rsplit(b",p=", 1)[1]
    cases = [
        (b"c=eSws,r=" + full_nonce + b",p=" + proof, "channel binding 'c=' does not match"),
        (b"c=biws,r=abc,p=" + proof, "nonce does not match"),
        (
            b"c=biws,r=" + full_nonce + SERVER_NONCE.encode() + b",p=" + proof,
            "nonce does not match",
        ),
        (b"c=biws,r=" + full_nonce + b",p=AAAA", "proof must be 32 bytes"),
        (b"c=biws,r=" + full_nonce + b",p=not*base64", "proof is not valid base64"),
        (b"c=bi-s,r=" + full_nonce + b",p=" + proof, "channel binding is not valid base64"),
        (b"c=biws,r=" + full_nonce + b",x=" + proof, "expected attribute 'p='"),
        (b"r=" + full_nonce + b",c=biws,p=" + proof, "expected attribute 'c='"),
        (b"c=biws,p=" + proof, "expected c=, r= and p="),
        (b"c=biws,r=" + full_nonce + b",p=" + b"A" * 5000, "larger than 4096 bytes"),
        (b"c=biws,r=" + full_nonce + b",p=\xc3\x28", "not UTF-8"),
    ]
    for final, problem in cases:
        scram = first_exchanged()[0]
        with pytest.raises(SaslAuthenticationError, match=problem):
            scram.final(final)
        assert not scram.complete and scram.username is None


@pytest.mark.timeout(30)
def test_a_wrong_proof_of_the_right_size_gets_the_generic_message() -> None:
    scram, client_first, server_first = first_exchanged()
    final = hand_made_final(SHA256, "not-the-password", b"n,,", client_first, server_first)
    with pytest.raises(SaslAuthenticationError) as refused:
        scram.final(final)
    assert str(refused.value) == invalid_credentials(SHA256)


@pytest.mark.timeout(30)
def test_a_replayed_client_final_is_refused() -> None:
    client_first = b"n,,n=alice,r=abc"
    scram = server()
    final = hand_made_final(SHA256, "alice-secret", b"n,,", client_first, scram.first(client_first))
    scram.final(final)
    with pytest.raises(IllegalSaslStateError, match="final called while complete"):
        scram.final(final)
    # Against a new exchange, whose server nonce differs, the old message is worthless.
    fresh = ScramServer(SHA256, lambda user: CREDENTIALS[(SHA256, user)])
    fresh.first(client_first)
    with pytest.raises(SaslAuthenticationError, match="nonce does not match"):
        fresh.final(final)


@pytest.mark.timeout(30)
def test_calls_out_of_order_raise() -> None:
    with pytest.raises(
        IllegalSaslStateError, match="final called while awaiting client-first"
    ) as early:
        server().final(b"c=biws,r=abc,p=AAAA")
    assert early.value.code == ErrorCode.ILLEGAL_SASL_STATE
    scram, client_first, _ = first_exchanged()
    with pytest.raises(IllegalSaslStateError, match="first called while awaiting client-final"):
        scram.first(client_first)

    client = ScramClient(SHA256, "alice", "alice-secret")
    with pytest.raises(IllegalSaslStateError):
        client.final(b"r=x,s=c2FsdA==,i=4096")
    with pytest.raises(IllegalSaslStateError):
        client.verify(b"v=AAAA")
    client.first()
    with pytest.raises(IllegalSaslStateError):
        client.first()
    with pytest.raises(IllegalSaslStateError):
        client.verify(b"v=AAAA")


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    """`valid` with up to three small splices of random bytes (often none)."""
    message = bytearray(valid)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(message)))
        message[at : at + draw(st.integers(0, 2))] = draw(st.binary(max_size=2))
    return bytes(message)


def messages(valid: bytes, *attributes: str) -> st.SearchStrategy[bytes]:
    """Random bytes, comma-joined attributes mixed with arbitrary text, and mutations of a
    valid message, so the fuzz reaches the later checks and the success path too."""
    part = st.sampled_from(attributes) | st.text(max_size=12)
    joined = st.lists(part, max_size=8).map(lambda parts: ",".join(parts).encode())
    return st.binary(max_size=300) | joined | mutated(valid)


VALID_FINAL = hand_made_final(SHA256, "alice-secret", b"n,,", *first_exchanged()[1:])


@pytest.mark.timeout(120)
@given(
    messages(
        b"n,a=alice,n=alice,r=abc,ext=1",
        "n", "y", "", "p=tls-unique", "a=alice", "a=bob", "n=alice", "n=al=2Cice", "n=a=b",
        "r=abc", "r=", "m=x", "tokenauth=true", "ext=1", "c=biws",
    )
)  # fmt: skip
def test_fuzzed_client_first_only_raises_authentication_errors(message: bytes) -> None:
    scram = ScramServer(SHA256, lambda user: CREDENTIALS.get((SHA256, "alice")))
    try:
        server_first = scram.first(message)
    except SaslAuthenticationError as refused:
        event(f"refused: {str(refused)[:50]}")
    else:
        event("accepted")
        assert server_first.startswith(b"r=") and server_first.endswith(b",i=4096")


@pytest.mark.timeout(120)
@given(
    messages(
        VALID_FINAL,
        "c=biws", "c=eSws", "r=abc", "r=abc" + SERVER_NONCE, "p=" + "A" * 43 + "=",
        "p=AAAA", "p=", "x=1", "m=x",
    )
)  # fmt: skip
def test_fuzzed_client_final_only_raises_authentication_errors(message: bytes) -> None:
    scram = first_exchanged()[0]
    try:
        server_final = scram.final(message)
    except SaslAuthenticationError as refused:
        event(f"refused: {str(refused)[:50]}")
        assert not scram.complete
    else:
        event("accepted")
        assert server_final.startswith(b"v=") and scram.username == "alice"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mechanism", list(ScramMechanism))
def test_verify_password(mechanism: ScramMechanism) -> None:
    credential = CREDENTIALS[(mechanism, "zoë")]
    assert verify_password(credential, "pässwörd")
    assert not verify_password(credential, "passwörd")
    assert not verify_password(credential, "")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mechanism", list(ScramMechanism))
def test_from_salted_password_equals_from_password(mechanism: ScramMechanism) -> None:
    salt, iterations = b"0123456789abcdef", 8192
    from_password = ScramCredential.from_password(mechanism, "secret", salt, iterations)
    salted = salted_password(mechanism, "secret", salt, iterations)
    assert salted == hashlib.pbkdf2_hmac(mechanism.hash_name, b"secret", salt, iterations)
    assert (
        ScramCredential.from_salted_password(mechanism, salted, salt, iterations) == from_password
    )
    assert len(from_password.stored_key) == len(from_password.server_key) == mechanism.digest_size


@pytest.mark.timeout(30)
def test_random_salts_differ_and_keys_stay_out_of_repr() -> None:
    one, two = (ScramCredential.from_password(SHA512, "same") for _ in range(2))
    assert len(one.salt) == 32 and one.salt != two.salt and one.stored_key != two.stored_key
    assert (
        repr(one) == "ScramCredential(mechanism=<ScramMechanism.SCRAM_SHA_512: 2>, iterations=4096)"
    )


@pytest.mark.timeout(30)
def test_credential_bounds() -> None:
    with pytest.raises(ValueError, match="outside"):
        ScramCredential.from_password(SHA256, "x", b"salt", MIN_ITERATIONS - 1)
    with pytest.raises(ValueError, match="outside"):
        ScramCredential.from_password(SHA256, "x", b"salt", MAX_ITERATIONS + 1)
    with pytest.raises(ValueError, match="outside"):  # refused before hashing, not after
        ScramCredential.from_password(SHA256, "x", b"salt", 10**12)
    with pytest.raises(ValueError, match="empty salt"):
        ScramCredential.from_password(SHA256, "x", b"", MIN_ITERATIONS)
    with pytest.raises(ValueError, match="salted password is 64 bytes"):
        ScramCredential.from_salted_password(SHA512, b"\x00" * 32, b"salt", MIN_ITERATIONS)
    with pytest.raises(ValueError, match="keys are 32 bytes"):
        ScramCredential(SHA256, b"salt", b"\x00" * 64, b"\x00" * 64, MIN_ITERATIONS)


@pytest.mark.timeout(30)
def test_mechanism_names_and_codes() -> None:
    assert [(m.value, m.mechanism_name, m.hash_name, m.digest_size) for m in ScramMechanism] == [
        (1, "SCRAM-SHA-256", "sha256", 32),
        (2, "SCRAM-SHA-512", "sha512", 64),
    ]
    assert ScramMechanism.from_name("SCRAM-SHA-512") is SHA512
    with pytest.raises(ValueError, match="not a SCRAM mechanism"):
        ScramMechanism.from_name("SCRAM-SHA-1")
    assert (MIN_ITERATIONS, MAX_ITERATIONS) == (4096, 16384)
