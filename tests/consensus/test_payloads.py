"""Writes and transactions as ZAB carries them: round trips of every kind, and bytes that
are not a payload refused with PayloadError."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.consensus.codes import CreateMode, ErrorCode
from services.consensus.payloads import (
    ErrorTxn,
    Logged,
    PayloadError,
    Reconfig,
    ReconfigTxn,
    SyncRequest,
    SyncTxn,
    Write,
    decode_logged,
    decode_logged_in_full,
    decode_write,
    decode_write_in_full,
    encode_logged,
    encode_logged_in_full,
    encode_write,
    encode_write_in_full,
    reconfig_of,
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
    Create("/null", None, OPEN_ACL_UNSAFE, CreateMode.PERSISTENT_SEQUENTIAL),
    SetData("/null", None, 4),
    Multi((Create("/m", None), SetData("/m", None, 0), Create("/e", b""), SetData("/e", b""))),
    CreateSession(30_000),
    CloseSession(),
    DeleteContainer("/c"),
    SyncRequest("/"),
    Reconfig("server.4=h:1:1;2181", "2,3", "", 0x1_0000_0007),
    Reconfig("", "", "server.1=h:1:1;2181,server.2=h:2:2:observer;2182", -1),
]

BODIES = [
    CreateTxn("/a", b"x", ACLS, 0x1234, 5),
    DeleteTxn("/a"),
    SetDataTxn("/a", b"y", 9),
    SetACLTxn("/a", OPEN_ACL_UNSAFE, 2),
    CheckTxn("/a"),
    MultiTxn((CreateTxn("/m", b"", OPEN_ACL_UNSAFE, 0, 1), CheckTxn("/m"), DeleteTxn("/m"))),
    CreateTxn("/null", None, OPEN_ACL_UNSAFE, 0, 1),
    SetDataTxn("/null", None, 2),
    MultiTxn((CreateTxn("/n", None, ACLS, 0, 3), SetDataTxn("/n", None, 1))),
    CreateSessionTxn(4000),
    CloseSessionTxn(("/e1", "/e2")),
    SyncTxn("/s"),
    ErrorTxn(ErrorCode.NODEEXISTS),
    ReconfigTxn("server.1=h:1:1:participant;h:2181\nversion=100000007"),
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


def test_reconfig_of_names_only_reconfig_transactions() -> None:
    text = "server.1=h:1:1:participant;h:2181\nversion=100000007"
    assert reconfig_of(encode_logged(Logged(1, 2, ReconfigTxn(text)))) == text
    for body in BODIES:
        if not isinstance(body, ReconfigTxn):
            assert reconfig_of(encode_logged(Logged(1, 2, body))) is None  # type: ignore[arg-type]
    assert reconfig_of(b"") is None


def test_null_data_is_a_null_buffer_and_empty_an_empty_one() -> None:
    """Null data travels as a jute buffer of length -1, empty data as one of length 0, on
    both the setData shortcut and the field-by-field path; each reads back as itself."""
    version = b"\x00\x00\x00\x07"
    for data, buffer in ((None, b"\xff\xff\xff\xff"), (b"", b"\x00\x00\x00\x00")):
        body = SetDataTxn("/a", data, 7)
        for encode in (encode_logged, encode_logged_in_full):
            raw = encode(Logged(1, 2, body))
            assert raw.endswith(b"/a" + buffer + version)
            assert decode_logged(raw).body == body
            assert decode_logged_in_full(raw).body == body
        raw = encode_write(Session(1), SetData("/a", data, 7))
        assert raw.endswith(b"/a" + buffer + version)
        assert decode_write(raw)[1] == SetData("/a", data, 7)
        create = encode_logged(Logged(1, 2, CreateTxn("/a", data, (), 0, 1)))
        assert b"/a" + buffer + b"\x00\x00\x00\x00" in create  # data, then no ACL entries
        assert decode_logged(create).body == CreateTxn("/a", data, (), 0, 1)


# Transactions as members logged them before null data was kept (empty data, length 0):
# they read as they did.
OLD_SET_DATA = bytes.fromhex("0000000000000001000000000000000200000005000000022f610000000000000003")
OLD_CREATE = bytes.fromhex(
    "0000000000000001000000000000000200000001000000022f610000000000000000000000000000000000000001"
)


def test_transactions_logged_before_null_data_read_as_before() -> None:
    assert decode_logged(OLD_SET_DATA) == Logged(1, 2, SetDataTxn("/a", b"", 3))
    assert decode_logged(OLD_CREATE) == Logged(1, 2, CreateTxn("/a", b"", (), 0, 1))


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
    st.one_of(st.none(), st.binary(max_size=100)),
    st.integers(-(2**31), 2**31 - 1),
)


def variants(raw: bytes, noise: bytes, at: int) -> tuple[bytes, ...]:
    """``raw`` intact, cut short, extended, and overwritten in places."""
    at = min(at, len(raw))
    return raw, raw[:at], raw + noise, raw[:at] + noise + raw[at + len(noise) :]


def same_outcome(
    quick: Callable[[bytes], object], full: Callable[[bytes], object], raw: bytes
) -> None:
    try:
        expected = full(raw)
    except PayloadError:
        with pytest.raises(PayloadError):
            quick(raw)
    else:
        assert quick(raw) == expected


@settings(max_examples=300, deadline=None)
@given(SET_DATA_TXNS, st.integers(0, 2**63 - 1), st.binary(max_size=8), st.integers(0, 200))
def test_set_data_shortcuts_agree_with_the_full_codec(
    body: SetDataTxn, session_id: int, noise: bytes, at: int
) -> None:
    """setData writes and transactions take shortcuts both ways: they encode to the same
    bytes as the field-by-field encoders, and decode what the field-by-field decoders do
    and refuse what they refuse."""
    logged = Logged(1_795_000_000_000, session_id, body)
    raw = encode_logged(logged)
    assert raw == encode_logged_in_full(logged)
    assert decode_logged(raw) == logged
    session, write = Session(session_id), SetData(body.path, body.data, body.version)
    raw_write = encode_write(session, write)
    assert raw_write == encode_write_in_full(session, write)
    assert decode_write(raw_write) == (session, write)
    for variant in variants(raw, noise, at):
        same_outcome(decode_logged, decode_logged_in_full, variant)
    for variant in variants(raw_write, noise, at):
        same_outcome(decode_write, decode_write_in_full, variant)


@pytest.mark.parametrize(
    "write", [SetData("/a", b"", 2**31), SetData("/\ud800", b"", 1)], ids=["version", "path"]
)
def test_set_data_shortcut_leaves_refusals_to_the_full_encoder(write: SetData) -> None:
    with pytest.raises(Exception) as full:
        encode_write_in_full(Session(1), write)
    with pytest.raises(full.type):
        encode_write(Session(1), write)
    with pytest.raises(full.type):
        encode_logged(Logged(1, 1, SetDataTxn(write.path, write.data, write.version)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_escape_as_other_errors(data: bytes) -> None:
    for decode in (decode_write, decode_logged):
        with contextlib.suppress(PayloadError):
            decode(data)
