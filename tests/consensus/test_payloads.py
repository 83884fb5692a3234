"""Writes and transactions as ZAB carries them: round trips of every kind, and bytes that
are not a payload refused with PayloadError."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.consensus.codes import CreateMode, ErrorCode
from services.consensus.payloads import (
    ErrorTxn,
    Logged,
    PayloadError,
    SyncRequest,
    SyncTxn,
    Write,
    decode_logged,
    decode_logged_in_full,
    decode_write,
    encode_logged,
    encode_write,
)
from services.consensus.tree import (
    ACL,
    OPEN_ACL_UNSAFE,
    Check,
    CloseSession,
    Create,
    Delete,
    Id,
    Multi,
    Session,
    SetACL,
    SetData,
    digest_auth_id,
)
from services.consensus.tree.model import (
    CheckTxn,
    CloseSessionTxn,
    CreateSession,
    CreateSessionTxn,
    CreateTxn,
    DeleteContainer,
    DeleteTxn,
    MultiTxn,
    SetACLTxn,
    SetDataTxn,
)

DIGEST = digest_auth_id("alice:secret")
ACLS = (ACL(31, DIGEST), ACL(1, Id("world", "anyone")))

WRITES: list[Write] = [
    Create("/a", b"data", OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL_SEQUENTIAL),
    Create("/b", b"", ACLS, CreateMode.CONTAINER),
    Delete("/a", 3),
    SetData("/a", b"\x00\xff" * 100, -1),
    SetACL("/a", ACLS, 7),
    Check("/a", 2),
    Multi((Create("/m", b"1"), SetData("/m", b"2", 0), Check("/m", 1), Delete("/m"))),
    Multi(()),
    CreateSession(30_000),
    CloseSession(),
    DeleteContainer("/c"),
    SyncRequest("/"),
]

BODIES = [
    CreateTxn("/a", b"x", ACLS, 0x1234, 5),
    DeleteTxn("/a"),
    SetDataTxn("/a", b"y", 9),
    SetACLTxn("/a", OPEN_ACL_UNSAFE, 2),
    CheckTxn("/a"),
    MultiTxn((CreateTxn("/m", b"", OPEN_ACL_UNSAFE, 0, 1), CheckTxn("/m"), DeleteTxn("/m"))),
    CreateSessionTxn(4000),
    CloseSessionTxn(("/e1", "/e2")),
    SyncTxn("/s"),
    ErrorTxn(ErrorCode.NODEEXISTS),
    ErrorTxn(ErrorCode.NONODE, (ErrorCode.OK, ErrorCode.NONODE, ErrorCode.RUNTIMEINCONSISTENCY)),
]


@pytest.mark.parametrize("request_", WRITES, ids=lambda w: type(w).__name__)
def test_write_round_trip(request_: Write) -> None:
    session = Session(-0x7F00_0000_0000_0001, frozenset({DIGEST, Id("ip", "10.0.0.1")}))
    assert decode_write(encode_write(session, request_)) == (session, request_)


@pytest.mark.parametrize("body", BODIES, ids=lambda b: type(b).__name__)
def test_transaction_round_trip(body: object) -> None:
    logged = Logged(1_795_000_000_000, 0x0100_0000_0000_002A, body)  # type: ignore[arg-type]
    assert decode_logged(encode_logged(logged)) == logged


def test_txn_carries_the_entry_zxid() -> None:
    logged = Logged(5, 7, DeleteTxn("/a"))
    txn = logged.txn(0x1_0000_0003)
    assert (txn.zxid, txn.time_ms, txn.session_id, txn.body) == (
        0x1_0000_0003,
        5,
        7,
        DeleteTxn("/a"),
    )


def test_truncated_and_trailing_bytes_are_refused() -> None:
    good = encode_write(Session(1), SetData("/a", b"abc"))
    for cut in range(len(good)):
        with pytest.raises(PayloadError):
            decode_write(good[:cut])
    with pytest.raises(PayloadError):
        decode_write(good + b"\x00")
    txn = encode_logged(Logged(1, 2, SetDataTxn("/a", b"abc", 1)))
    with pytest.raises(PayloadError):
        decode_logged(txn[:-1])


def test_unknown_opcode_is_refused() -> None:
    raw = bytearray(encode_logged(Logged(1, 2, DeleteTxn("/a"))))
    raw[16:20] = (77).to_bytes(4, "big")
    with pytest.raises(PayloadError, match="77"):
        decode_logged(bytes(raw))


SET_DATA_TXNS = st.builds(
    SetDataTxn,
    st.text(max_size=40),
    st.binary(max_size=100),
    st.integers(-(2**31), 2**31 - 1),
)


@settings(max_examples=300, deadline=None)
@given(SET_DATA_TXNS, st.integers(0, 2**63 - 1), st.binary(max_size=8), st.integers(0, 200))
def test_set_data_shortcut_agrees_with_the_full_decoder(
    body: SetDataTxn, session_id: int, noise: bytes, at: int
) -> None:
    """The setData shortcut of decode_logged decodes what the field-by-field decoder does
    and refuses what it refuses: intact, cut short, extended or overwritten in places."""
    raw = encode_logged(Logged(1_795_000_000_000, session_id, body))
    assert (
        decode_logged(raw)
        == decode_logged_in_full(raw)
        == Logged(1_795_000_000_000, session_id, body)
    )
    at = min(at, len(raw))
    for variant in (raw[:at], raw + noise, raw[:at] + noise + raw[at + len(noise) :]):
        try:
            expected = decode_logged_in_full(variant)
        except PayloadError:
            with pytest.raises(PayloadError):
                decode_logged(variant)
        else:
            assert decode_logged(variant) == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_escape_as_other_errors(data: bytes) -> None:
    for decode in (decode_write, decode_logged):
        with contextlib.suppress(PayloadError):
            decode(data)
