"""Jute codec: known answers built byte by byte, round trips, kazoo cross-checks, fuzzing
and znode path rules."""

import re
import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kazoo import exceptions as kazoo_exceptions  # type: ignore[import-untyped]
from kazoo import security as kazoo_security
from kazoo.protocol import serialization as kazoo_ser  # type: ignore[import-untyped]

from services.consensus.jute import (
    ACL,
    DEFAULT_MAX_BUFFER,
    ROLLED_BACK,
    AuthPacket,
    CheckResult,
    CheckVersionRequest,
    ConnectRequest,
    ConnectResponse,
    Create2Response,
    CreateRequest,
    DeleteRequest,
    DeleteResult,
    EncodeError,
    ErrorCode,
    ErrorResult,
    EventType,
    FrameSplitter,
    GetACLResponse,
    GetChildren2Response,
    GetChildrenResponse,
    GetDataResponse,
    Id,
    InvalidPathError,
    JuteError,
    KeeperState,
    LengthLimitError,
    MalformedError,
    MultiOp,
    MultiRequest,
    MultiResponse,
    OpCode,
    PathRequest,
    PathResponse,
    PathWatchRequest,
    Perm,
    ReconfigRequest,
    ReplyHeader,
    RequestBody,
    RequestHeader,
    ResponseBody,
    SetACLRequest,
    SetDataRequest,
    SetWatches,
    Stat,
    StatResponse,
    TruncatedError,
    UnknownOpcodeError,
    WatcherEvent,
    Xid,
    decode_connect_request,
    decode_connect_response,
    decode_request,
    decode_response,
    encode_connect_request,
    encode_connect_response,
    encode_frame,
    encode_request,
    encode_response,
    validate_path,
)

EXAMPLES = settings(max_examples=60, deadline=None)


def ustr(value: str | None) -> bytes:
    if value is None:
        return struct.pack(">i", -1)
    raw = value.encode()
    return struct.pack(">i", len(raw)) + raw


STAT_FIELDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
STAT = Stat(*STAT_FIELDS)
STAT_BYTES = struct.pack(">qqqqiiiqiiq", *STAT_FIELDS)
OPEN_ACL = (ACL(Perm.ALL, Id("world", "anyone")),)

# --- known answers -----------------------------------------------------------------------


def test_connect_request_known_answer() -> None:
    passwd = bytes(range(16))
    wire = struct.pack(">iqiqi", 0, 0x1234, 30000, 0x7E57, 16) + passwd + b"\x01"
    request = decode_connect_request(wire)
    assert request == ConnectRequest(0, 0x1234, 30000, 0x7E57, passwd, True)
    assert encode_connect_request(request) == wire
    # An old client stops before the readOnly byte.
    assert decode_connect_request(wire[:-1]).read_only is False


def test_connect_response_known_answer() -> None:
    wire = struct.pack(">iiqi", 0, 10000, 0x55, 16) + b"\x00" * 16 + b"\x00"
    response = ConnectResponse(0, 10000, 0x55, b"\x00" * 16, False)
    assert encode_connect_response(response) == wire
    assert decode_connect_response(wire) == response


def test_create_request_known_answer() -> None:
    wire = (
        struct.pack(">ii", 5, OpCode.CREATE)
        + ustr("/app/lock-")
        + struct.pack(">i", 2)
        + b"hi"
        + struct.pack(">i", 1)
        + struct.pack(">i", 31)
        + ustr("world")
        + ustr("anyone")
        + struct.pack(">i", 3)
    )
    header, body = decode_request(wire)
    assert header == RequestHeader(5, OpCode.CREATE)
    assert body == CreateRequest("/app/lock-", b"hi", OPEN_ACL, 3)
    assert encode_request(header, body) == wire


def test_get_data_response_known_answer() -> None:
    wire = struct.pack(">iqi", 9, 0x1_0000_0002, 0) + struct.pack(">i", 3) + b"abc" + STAT_BYTES
    header, body = decode_response(wire, OpCode.GET_DATA)
    assert header == ReplyHeader(9, 0x1_0000_0002, 0)
    assert body == GetDataResponse(b"abc", STAT)
    assert encode_response(header, body) == wire
    null_data = struct.pack(">iqi", 9, 1, 0) + struct.pack(">i", -1) + STAT_BYTES
    assert decode_response(null_data, OpCode.GET_DATA)[1] == GetDataResponse(None, STAT)


def test_multi_known_answer() -> None:
    request_wire = (
        struct.pack(">ii", 3, OpCode.MULTI)
        + struct.pack(">i?i", OpCode.CREATE, False, -1)
        + ustr("/a")
        + struct.pack(">i", -1)
        + struct.pack(">i", 1)
        + struct.pack(">i", 31)
        + ustr("world")
        + ustr("anyone")
        + struct.pack(">i", 0)
        + struct.pack(">i?i", OpCode.CHECK, False, -1)
        + ustr("/b")
        + struct.pack(">i", 4)
        + struct.pack(">i?i", OpCode.DELETE, False, -1)
        + ustr("/c")
        + struct.pack(">i", -1)
        + struct.pack(">i?i", OpCode.SET_DATA, False, -1)
        + ustr("/d")
        + ustr("x")
        + struct.pack(">i", 7)
        + struct.pack(">i?i", -1, True, -1)
    )
    header, body = decode_request(request_wire)
    expected = MultiRequest(
        (
            MultiOp(OpCode.CREATE, CreateRequest("/a", None, OPEN_ACL, 0)),
            MultiOp(OpCode.CHECK, CheckVersionRequest("/b", 4)),
            MultiOp(OpCode.DELETE, DeleteRequest("/c", -1)),
            MultiOp(OpCode.SET_DATA, SetDataRequest("/d", b"x", 7)),
        )
    )
    assert header == RequestHeader(3, OpCode.MULTI)
    assert body == expected
    assert encode_request(header, body) == request_wire

    response_wire = (
        struct.pack(">iqi", 3, 77, 0)
        + struct.pack(">i?i", OpCode.CREATE, False, 0)
        + ustr("/a")
        + struct.pack(">i?i", OpCode.CHECK, False, 0)
        + struct.pack(">i?i", OpCode.DELETE, False, 0)
        + struct.pack(">i?i", OpCode.SET_DATA, False, 0)
        + STAT_BYTES
        + struct.pack(">i?i", OpCode.CREATE2, False, 0)
        + ustr("/e")
        + STAT_BYTES
        + struct.pack(">i?i", -1, False, ErrorCode.NONODE)
        + struct.pack(">i", ErrorCode.NONODE)
        + struct.pack(">i?i", -1, True, -1)
    )
    results = MultiResponse(
        (
            PathResponse("/a"),
            CheckResult(),
            DeleteResult(),
            StatResponse(STAT),
            Create2Response("/e", STAT),
            ErrorResult(ErrorCode.NONODE),
        )
    )
    assert encode_response(ReplyHeader(3, 77, 0), results) == response_wire
    assert decode_response(response_wire, OpCode.MULTI) == (ReplyHeader(3, 77, 0), results)


def test_headerless_and_bodyless_messages() -> None:
    ping = struct.pack(">ii", Xid.PING, OpCode.PING)
    assert decode_request(ping) == (RequestHeader(-2, 11), None)
    close = struct.pack(">ii", 8, OpCode.CLOSE_SESSION)
    assert decode_request(close) == (RequestHeader(8, -11), None)
    # An error reply carries only the header, even when a body is handed over.
    error = encode_response(ReplyHeader(4, 10, ErrorCode.NONODE), PathResponse("/x"))
    assert error == struct.pack(">iqi", 4, 10, -101)
    assert decode_response(error, OpCode.CREATE) == (ReplyHeader(4, 10, -101), None)
    notification = struct.pack(">iqi", -1, -1, 0) + struct.pack(">ii", 3, 3) + ustr("/n")
    assert decode_response(notification, OpCode.GET_DATA) == (
        ReplyHeader(-1, -1, 0),
        WatcherEvent(EventType.NODE_DATA_CHANGED, KeeperState.SYNC_CONNECTED, "/n"),
    )


def test_codes_match_zookeeper() -> None:
    assert [int(c) for c in (OpCode.NOTIFICATION, OpCode.CREATE, OpCode.SYNC, OpCode.PING)] == [
        0,
        1,
        9,
        11,
    ]
    assert (OpCode.CREATE2, OpCode.AUTH, OpCode.SET_WATCHES) == (15, 100, 101)
    assert (OpCode.CLOSE_SESSION, OpCode.CREATE_SESSION, OpCode.ERROR) == (-11, -10, -1)
    assert (ErrorCode.NODEEXISTS, ErrorCode.NOTEMPTY, ErrorCode.NOWATCHER) == (-110, -111, -121)
    assert (Xid.NOTIFICATION, Xid.PING, Xid.AUTH, Xid.SET_WATCHES) == (-1, -2, -4, -8)


# --- errors ------------------------------------------------------------------------------


def test_unknown_opcode_carries_xid() -> None:
    with pytest.raises(UnknownOpcodeError) as caught:
        decode_request(struct.pack(">ii", 42, 99))
    assert (caught.value.xid, caught.value.opcode) == (42, 99)
    assert caught.value.error_code == ErrorCode.UNIMPLEMENTED


def test_body_error_carries_xid() -> None:
    with pytest.raises(TruncatedError) as caught:
        decode_request(struct.pack(">ii", 17, OpCode.DELETE) + ustr("/a"))
    assert caught.value.xid == 17
    assert "DeleteRequest.version" in str(caught.value)
    assert caught.value.error_code == ErrorCode.MARSHALLINGERROR


def test_malformed_fields() -> None:
    header = struct.pack(">ii", 1, OpCode.SYNC)
    with pytest.raises(MalformedError, match="negative length -2"):
        decode_request(header + struct.pack(">i", -2))
    with pytest.raises(MalformedError, match="invalid UTF-8"):
        decode_request(header + struct.pack(">i", 2) + b"\xff\xfe")
    with pytest.raises(MalformedError, match="3 bytes after"):
        decode_request(header + ustr("/a") + b"xyz")
    multi = struct.pack(">ii", 1, OpCode.MULTI) + struct.pack(">i?i", OpCode.SYNC, False, -1)
    with pytest.raises(MalformedError, match="unsupported type 9"):
        decode_request(multi)
    with pytest.raises(EncodeError):
        encode_request(RequestHeader(1 << 31, OpCode.PING))
    with pytest.raises(EncodeError, match="cannot carry"):
        wrong = MultiOp(OpCode.DELETE, PathRequest("/"))  # type: ignore[arg-type]
        encode_request(RequestHeader(1, OpCode.MULTI), MultiRequest((wrong,)))


def test_length_above_max_buffer_is_refused_before_allocating() -> None:
    wire = struct.pack(">ii", 1, OpCode.SYNC) + struct.pack(">i", DEFAULT_MAX_BUFFER + 1)
    with pytest.raises(LengthLimitError, match="exceeds max_buffer"):
        decode_request(wire)
    huge_vector = struct.pack(">iqi", 1, 1, 0) + struct.pack(">i", 0x7FFF_FFFF)
    tracemalloc.start()
    try:
        with pytest.raises(TruncatedError, match="2147483647 elements"):
            decode_response(huge_vector, OpCode.GET_CHILDREN, max_buffer=0x7FFF_FFFF)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    splitter = FrameSplitter()
    with pytest.raises(LengthLimitError, match="frame length 1048576"):
        splitter.feed(struct.pack(">i", DEFAULT_MAX_BUFFER + 1))


def test_frame_splitter_reassembles_split_stream() -> None:
    payloads = [b"", b"a", b"bc" * 50, struct.pack(">ii", Xid.PING, OpCode.PING)]
    stream = b"".join(encode_frame(p) for p in payloads)
    splitter = FrameSplitter()
    out: list[bytes] = []
    for i in range(0, len(stream), 3):
        out += splitter.feed(stream[i : i + 3])
    assert out == payloads
    assert splitter.pending == 0
    assert splitter.feed(b"\x00\x00") == []
    assert splitter.pending == 2
    with pytest.raises(MalformedError, match="negative"):
        FrameSplitter().feed(struct.pack(">i", -1))


# --- round trips -------------------------------------------------------------------------

int32 = st.integers(-(1 << 31), (1 << 31) - 1)
int64 = st.integers(-(1 << 63), (1 << 63) - 1)
text = st.text(st.characters(codec="utf-8"), max_size=12)
data = st.none() | st.binary(max_size=24)
stats = st.builds(Stat, *([int64] * 4 + [int32] * 3 + [int64] + [int32] * 2 + [int64]))
acls = st.lists(st.builds(ACL, int32, st.builds(Id, text, text)), max_size=3).map(tuple)
names = st.lists(text, max_size=4).map(tuple)
creates = st.builds(CreateRequest, text, data, acls, int32)
multi_ops = st.one_of(
    st.builds(MultiOp, st.sampled_from([OpCode.CREATE, OpCode.CREATE2]), creates),
    st.builds(MultiOp, st.just(OpCode.DELETE), st.builds(DeleteRequest, text, int32)),
    st.builds(MultiOp, st.just(OpCode.SET_DATA), st.builds(SetDataRequest, text, data, int32)),
    st.builds(MultiOp, st.just(OpCode.CHECK), st.builds(CheckVersionRequest, text, int32)),
)

requests: st.SearchStrategy[tuple[int, RequestBody | None]] = st.one_of(
    st.tuples(st.sampled_from([OpCode.CREATE, OpCode.CREATE2]), creates),
    st.tuples(st.just(OpCode.DELETE), st.builds(DeleteRequest, text, int32)),
    st.tuples(
        st.sampled_from(
            [OpCode.EXISTS, OpCode.GET_DATA, OpCode.GET_CHILDREN, OpCode.GET_CHILDREN2]
        ),
        st.builds(PathWatchRequest, text, st.booleans()),
    ),
    st.tuples(st.sampled_from([OpCode.GET_ACL, OpCode.SYNC]), st.builds(PathRequest, text)),
    st.tuples(st.just(OpCode.SET_DATA), st.builds(SetDataRequest, text, data, int32)),
    st.tuples(st.just(OpCode.SET_ACL), st.builds(SetACLRequest, text, acls, int32)),
    st.tuples(st.just(OpCode.CHECK), st.builds(CheckVersionRequest, text, int32)),
    st.tuples(
        st.just(OpCode.MULTI), st.builds(MultiRequest, st.lists(multi_ops, max_size=4).map(tuple))
    ),
    st.tuples(st.just(OpCode.AUTH), st.builds(AuthPacket, int32, text, data)),
    st.tuples(st.just(OpCode.SET_WATCHES), st.builds(SetWatches, int64, names, names, names)),
    st.tuples(st.just(OpCode.RECONFIG), st.builds(ReconfigRequest, text, text, text, int64)),
    st.tuples(st.sampled_from([OpCode.PING, OpCode.CLOSE_SESSION]), st.none()),
)

multi_results = st.one_of(
    st.builds(PathResponse, text),
    st.builds(Create2Response, text, stats),
    st.builds(StatResponse, stats),
    st.just(DeleteResult()),
    st.just(CheckResult()),
    st.builds(ErrorResult, int32),
)

responses: st.SearchStrategy[tuple[int, ResponseBody]] = st.one_of(
    st.tuples(st.sampled_from([OpCode.CREATE, OpCode.SYNC]), st.builds(PathResponse, text)),
    st.tuples(st.just(OpCode.CREATE2), st.builds(Create2Response, text, stats)),
    st.tuples(
        st.sampled_from([OpCode.EXISTS, OpCode.SET_DATA, OpCode.SET_ACL]),
        st.builds(StatResponse, stats),
    ),
    st.tuples(st.just(OpCode.GET_DATA), st.builds(GetDataResponse, data, stats)),
    st.tuples(st.just(OpCode.GET_ACL), st.builds(GetACLResponse, acls, stats)),
    st.tuples(st.just(OpCode.GET_CHILDREN), st.builds(GetChildrenResponse, names)),
    st.tuples(st.just(OpCode.GET_CHILDREN2), st.builds(GetChildren2Response, names, stats)),
    st.tuples(
        st.just(OpCode.MULTI),
        st.builds(MultiResponse, st.lists(multi_results, max_size=4).map(tuple)),
    ),
)


@EXAMPLES
@given(st.integers(0, (1 << 31) - 1), requests)
def test_request_round_trip(xid: int, request: tuple[int, RequestBody | None]) -> None:
    opcode, body = request
    header = RequestHeader(xid, opcode)
    wire = encode_request(header, body)
    assert decode_request(wire) == (header, body)
    assert FrameSplitter().feed(encode_frame(wire)) == [wire]


@EXAMPLES
@given(st.integers(0, (1 << 31) - 1), int64, responses)
def test_response_round_trip(xid: int, zxid: int, response: tuple[int, ResponseBody]) -> None:
    opcode, body = response
    header = ReplyHeader(xid, zxid, 0)
    assert decode_response(encode_response(header, body), opcode) == (header, body)


@EXAMPLES
@given(int64, st.builds(WatcherEvent, int32, int32, text))
def test_notification_round_trip(zxid: int, event: WatcherEvent) -> None:
    header = ReplyHeader(Xid.NOTIFICATION, zxid, 0)
    assert decode_response(encode_response(header, event), OpCode.NOTIFICATION) == (header, event)


@EXAMPLES
@given(
    st.builds(ConnectRequest, int32, int64, int32, int64, data, st.booleans()),
    st.builds(ConnectResponse, int32, int32, int64, data, st.booleans()),
)
def test_connect_round_trip(request: ConnectRequest, response: ConnectResponse) -> None:
    assert decode_connect_request(encode_connect_request(request)) == request
    assert decode_connect_response(encode_connect_response(response)) == response


# --- kazoo cross-checks ------------------------------------------------------------------


def kazoo_request(xid: int, request: object) -> bytes:
    """Frame a kazoo request the way its connection does: xid, type, serialize()."""
    payload = struct.pack(">ii", xid, request.type) + bytes(request.serialize())  # type: ignore[attr-defined]
    return struct.pack(">i", len(payload)) + payload


def kazoo_stat(stat: Stat) -> tuple[int, ...]:
    return (
        stat.czxid,
        stat.mzxid,
        stat.ctime,
        stat.mtime,
        stat.version,
        stat.cversion,
        stat.aversion,
        stat.ephemeral_owner,
        stat.data_length,
        stat.num_children,
        stat.pzxid,
    )


def test_kazoo_requests_decode() -> None:
    k = kazoo_ser
    k_acl = [kazoo_security.ACL(31, kazoo_security.Id("digest", "u:hash"))]
    acl = (ACL(31, Id("digest", "u:hash")),)
    cases: list[tuple[object, int, RequestBody]] = [
        (k.Create("/a", b"v", k_acl, 1), OpCode.CREATE, CreateRequest("/a", b"v", acl, 1)),
        (k.Create2("/b", b"", k_acl, 2), OpCode.CREATE2, CreateRequest("/b", b"", acl, 2)),
        (k.Delete("/a", 3), OpCode.DELETE, DeleteRequest("/a", 3)),
        (k.Exists("/a", True), OpCode.EXISTS, PathWatchRequest("/a", True)),
        (k.GetData("/a", False), OpCode.GET_DATA, PathWatchRequest("/a", False)),
        (k.SetData("/a", b"n", -1), OpCode.SET_DATA, SetDataRequest("/a", b"n", -1)),
        (k.GetACL("/a"), OpCode.GET_ACL, PathRequest("/a")),
        (k.SetACL("/a", k_acl, 5), OpCode.SET_ACL, SetACLRequest("/a", acl, 5)),
        (k.GetChildren("/a", True), OpCode.GET_CHILDREN, PathWatchRequest("/a", True)),
        (k.GetChildren2("/a", False), OpCode.GET_CHILDREN2, PathWatchRequest("/a", False)),
        (k.Sync("/a"), OpCode.SYNC, PathRequest("/a")),
        (k.CheckVersion("/a", 9), OpCode.CHECK, CheckVersionRequest("/a", 9)),
        (k.Auth(0, "digest", "u:p"), OpCode.AUTH, AuthPacket(0, "digest", b"u:p")),
        # kazoo writes an absent string as null: it reads as "".
        (
            k.Reconfig("server.4=h:1:1;2181", None, None, -1),
            OpCode.RECONFIG,
            ReconfigRequest("server.4=h:1:1;2181", "", "", -1),
        ),
        (
            k.Transaction([k.Create("/t", b"d", k_acl, 0), k.Delete("/u", -1)]),
            OpCode.MULTI,
            MultiRequest(
                (
                    MultiOp(OpCode.CREATE, CreateRequest("/t", b"d", acl, 0)),
                    MultiOp(OpCode.DELETE, DeleteRequest("/u", -1)),
                )
            ),
        ),
    ]
    splitter = FrameSplitter()
    stream = b"".join(kazoo_request(xid, req) for xid, (req, _, _) in enumerate(cases, 1))
    payloads = splitter.feed(stream)
    assert len(payloads) == len(cases)
    for xid, (payload, (_, opcode, body)) in enumerate(zip(payloads, cases, strict=True), 1):
        assert decode_request(payload) == (RequestHeader(xid, opcode), body)
    connect = k.Connect(0, 0x10, 30000, 0x20, b"\x00" * 16, True).serialize()
    assert decode_connect_request(bytes(connect)) == ConnectRequest(
        0, 0x10, 30000, 0x20, b"\x00" * 16, True
    )


def test_kazoo_decodes_our_responses() -> None:
    k = kazoo_ser
    connect = encode_connect_response(ConnectResponse(0, 4000, 0x77, b"p" * 16, True))
    parsed, end = k.Connect.deserialize(connect, 0)
    assert (parsed.time_out, parsed.session_id, parsed.passwd, parsed.read_only) == (
        4000,
        0x77,
        b"p" * 16,
        True,
    )
    assert end == len(connect)

    def body(header: ReplyHeader, response: ResponseBody) -> bytes:
        wire = encode_response(header, response)
        k_header, offset = k.ReplyHeader.deserialize(wire, 0)
        assert tuple(k_header) == (header.xid, header.zxid, header.err)
        assert offset == 16
        return wire

    h = ReplyHeader(5, 99, 0)
    assert tuple(k.Exists.deserialize(body(h, StatResponse(STAT)), 16)) == STAT_FIELDS
    data, stat = k.GetData.deserialize(body(h, GetDataResponse(b"zz", STAT)), 16)
    assert (data, tuple(stat)) == (b"zz", STAT_FIELDS)
    assert tuple(k.SetData.deserialize(body(h, StatResponse(STAT)), 16)) == STAT_FIELDS
    acls, stat = k.GetACL.deserialize(body(h, GetACLResponse(OPEN_ACL, STAT)), 16)
    assert [(a.perms, a.id.scheme, a.id.id) for a in acls] == [(31, "world", "anyone")]
    assert k.GetChildren.deserialize(body(h, GetChildrenResponse(("x", "y"))), 16) == ["x", "y"]
    children, stat = k.GetChildren2.deserialize(body(h, GetChildren2Response(("é",), STAT)), 16)
    assert (children, tuple(stat)) == (["é"], STAT_FIELDS)
    assert k.Sync.deserialize(body(h, PathResponse("/s")), 16) == "/s"
    assert k.Create.deserialize(body(h, PathResponse("/c")), 16) == "/c"
    path, stat = k.Create2.deserialize(body(h, Create2Response("/c2", STAT)), 16)
    assert (path, tuple(stat)) == ("/c2", STAT_FIELDS)
    multi = MultiResponse(
        (PathResponse("/m"), DeleteResult(), StatResponse(STAT), CheckResult(), ROLLED_BACK)
    )
    results = k.Transaction.deserialize(body(h, multi), 16)
    assert results[0] == "/m"
    assert results[1] is True
    assert tuple(results[2]) == STAT_FIELDS
    assert results[3] is True
    assert isinstance(results[4], kazoo_exceptions.RolledBackError)
    failed = MultiResponse((ErrorResult(ErrorCode.NODEEXISTS),))
    (error,) = k.Transaction.deserialize(body(h, failed), 16)
    assert isinstance(error, kazoo_exceptions.NodeExistsError)
    event = encode_response(
        ReplyHeader(-1, -1, 0),
        WatcherEvent(EventType.NODE_CREATED, KeeperState.SYNC_CONNECTED, "/w"),
    )
    watch, end = k.Watch.deserialize(event, 16)
    assert (tuple(watch), end) == ((1, 3, "/w"), len(event))


def test_error_codes_match_kazoo() -> None:
    kazoo_codes = {code: cls.__name__ for code, cls in kazoo_exceptions.EXCEPTIONS.items()}
    for code in ErrorCode:
        assert code.value in kazoo_codes, code
    assert kazoo_codes[ErrorCode.NONODE] == "NoNodeError"
    assert kazoo_codes[ErrorCode.SESSIONMOVED] == "SessionMovedError"


# --- fuzzing -----------------------------------------------------------------------------

RESPONSE_OPCODES = (OpCode.GET_DATA, OpCode.GET_ACL, OpCode.GET_CHILDREN2, OpCode.MULTI)


def decode_everything(payload: bytes) -> None:
    """Run every decoder over one payload; each may only raise a JuteError."""
    for decode in (decode_request, decode_connect_request, decode_connect_response):
        try:
            decode(payload)
        except JuteError as exc:
            assert str(exc)
    for opcode in RESPONSE_OPCODES:
        try:
            decode_response(payload, opcode)
        except JuteError as exc:
            assert str(exc)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_raise_only_jute_errors(payload: bytes) -> None:
    decode_everything(payload)
    try:
        frames = FrameSplitter(max_buffer=32).feed(payload)
    except JuteError as exc:
        assert str(exc)
    else:
        assert all(len(f) <= 32 for f in frames)


@settings(max_examples=150, deadline=None)
@given(requests, st.data())
def test_mutated_requests_raise_only_jute_errors(
    request: tuple[int, RequestBody | None], draw: st.DataObject
) -> None:
    opcode, body = request
    wire = bytearray(encode_request(RequestHeader(1, opcode), body))
    position = draw.draw(st.integers(0, len(wire) - 1))
    action = draw.draw(st.sampled_from(["flip", "truncate", "insert"]))
    if action == "flip":
        wire[position] ^= draw.draw(st.integers(1, 255))
    elif action == "truncate":
        del wire[position:]
    else:
        wire[position:position] = draw.draw(st.binary(min_size=1, max_size=4))
    try:
        header, decoded = decode_request(bytes(wire))
    except JuteError as exc:
        assert str(exc)
    else:
        # Whatever survives decoding is a well-formed request that re-encodes stably.
        assert decode_request(encode_request(header, decoded)) == (header, decoded)


# --- paths -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/", "/a", "/a/b", "/a.b", "/...", "/a/.b", "/a/b..", "/zookeeper/quota", "/é"]
)
def test_valid_paths(path: str) -> None:
    validate_path(path)
    validate_path(path.rstrip("/") + "/child")


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("", "empty"),
        ("a/b", "start with /"),
        ("/a/", "end with /"),
        ("//", "end with /"),
        ("/a//b", "empty node name"),
        ("/.", "relative"),
        ("/..", "relative"),
        ("/a/./b", "relative"),
        ("/a/../b", "relative"),
        ("/a\0b", "null character"),
        ("/a\x01", "U+0001"),
        ("/\x7f", "U+007F"),
        ("/\x9f", "U+009F"),
        ("/\ud800", "U+D800"),
        ("/\ue000", "U+E000"),
        ("/\ufff0", "U+FFF0"),
        ("/\U0001f600", "U+1F600"),
    ],
)
def test_invalid_paths(path: str, reason: str) -> None:
    with pytest.raises(InvalidPathError, match=re.escape(reason)) as caught:
        validate_path(path)
    assert caught.value.error_code == ErrorCode.BADARGUMENTS


def test_sequential_paths_validate_with_suffix() -> None:
    validate_path("/locks/lock-", sequential=True)
    validate_path("/locks/", sequential=True)
    with pytest.raises(InvalidPathError, match="empty node name"):
        validate_path("/locks//", sequential=True)
    with pytest.raises(InvalidPathError, match="end with /"):
        validate_path("/locks/")
