"""Whole payloads of the client protocol: a header and the body its opcode implies.

A payload is what one frame carries, without the length prefix (see frames.py). The
connect request and response have no header; every later request starts with a
RequestHeader and every reply with a ReplyHeader.
"""

from collections.abc import Callable

from services.consensus.codes import ErrorCode, OpCode, Xid
from services.consensus.jute.errors import JuteError, UnknownOpcodeError
from services.consensus.jute.primitives import DEFAULT_MAX_BUFFER, Buffer, Reader, Writer
from services.consensus.jute.records import (
    AuthPacket,
    CheckVersionRequest,
    ConnectRequest,
    ConnectResponse,
    Create2Response,
    CreateRequest,
    DeleteRequest,
    GetACLResponse,
    GetChildren2Response,
    GetChildrenResponse,
    GetDataResponse,
    MultiRequest,
    MultiResponse,
    PathRequest,
    PathResponse,
    PathWatchRequest,
    ReconfigRequest,
    ReplyHeader,
    RequestHeader,
    SaslToken,
    SetACLRequest,
    SetDataRequest,
    SetWatches,
    StatResponse,
    WatcherEvent,
)

RequestBody = (
    CreateRequest
    | DeleteRequest
    | PathWatchRequest
    | PathRequest
    | SetDataRequest
    | SetACLRequest
    | CheckVersionRequest
    | MultiRequest
    | AuthPacket
    | SaslToken
    | SetWatches
    | ReconfigRequest
)

ResponseBody = (
    PathResponse
    | Create2Response
    | StatResponse
    | GetDataResponse
    | GetACLResponse
    | GetChildrenResponse
    | GetChildren2Response
    | MultiResponse
    | SaslToken
    | WatcherEvent
)

# Opcodes whose request carries no body.
_EMPTY_REQUESTS = frozenset({OpCode.PING, OpCode.CLOSE_SESSION})

REQUEST_BODIES: dict[int, Callable[[Reader], RequestBody]] = {
    OpCode.CREATE: CreateRequest.read,
    OpCode.CREATE2: CreateRequest.read,
    OpCode.DELETE: DeleteRequest.read,
    OpCode.EXISTS: PathWatchRequest.read,
    OpCode.GET_DATA: PathWatchRequest.read,
    OpCode.SET_DATA: SetDataRequest.read,
    OpCode.GET_ACL: PathRequest.read,
    OpCode.SET_ACL: SetACLRequest.read,
    OpCode.GET_CHILDREN: PathWatchRequest.read,
    OpCode.GET_CHILDREN2: PathWatchRequest.read,
    OpCode.SYNC: PathRequest.read,
    OpCode.CHECK: CheckVersionRequest.read,
    OpCode.MULTI: MultiRequest.read,
    OpCode.AUTH: AuthPacket.read,
    OpCode.SASL: SaslToken.read,
    OpCode.SET_WATCHES: SetWatches.read,
    OpCode.RECONFIG: ReconfigRequest.read,
}

RESPONSE_BODIES: dict[int, Callable[[Reader], ResponseBody]] = {
    OpCode.CREATE: PathResponse.read,
    OpCode.CREATE2: Create2Response.read,
    OpCode.EXISTS: StatResponse.read,
    OpCode.GET_DATA: GetDataResponse.read,
    OpCode.SET_DATA: StatResponse.read,
    OpCode.GET_ACL: GetACLResponse.read,
    OpCode.SET_ACL: StatResponse.read,
    OpCode.GET_CHILDREN: GetChildrenResponse.read,
    OpCode.GET_CHILDREN2: GetChildren2Response.read,
    OpCode.SYNC: PathResponse.read,
    OpCode.MULTI: MultiResponse.read,
    OpCode.SASL: SaslToken.read,
    OpCode.RECONFIG: GetDataResponse.read,
}


def decode_connect_request(payload: Buffer, max_buffer: int = DEFAULT_MAX_BUFFER) -> ConnectRequest:
    r = Reader(payload, max_buffer)
    request = ConnectRequest.read(r)
    r.expect_end("ConnectRequest")
    return request


def encode_connect_request(request: ConnectRequest) -> bytes:
    w = Writer()
    request.write(w)
    return w.getvalue()


def decode_connect_response(
    payload: Buffer, max_buffer: int = DEFAULT_MAX_BUFFER
) -> ConnectResponse:
    r = Reader(payload, max_buffer)
    response = ConnectResponse.read(r)
    r.expect_end("ConnectResponse")
    return response


def encode_connect_response(response: ConnectResponse) -> bytes:
    w = Writer()
    response.write(w)
    return w.getvalue()


def decode_request(
    payload: Buffer, max_buffer: int = DEFAULT_MAX_BUFFER
) -> tuple[RequestHeader, RequestBody | None]:
    """Split a request payload into its header and the body its opcode names (None for
    ping and closeSession). Errors raised after the header carry its xid."""
    r = Reader(payload, max_buffer)
    header = RequestHeader.read(r)
    try:
        if header.type in _EMPTY_REQUESTS:
            body: RequestBody | None = None
        else:
            read = REQUEST_BODIES.get(header.type)
            if read is None:
                raise UnknownOpcodeError(header.xid, header.type)
            body = read(r)
        r.expect_end(f"request xid {header.xid} type {header.type}")
    except JuteError as exc:
        exc.xid = header.xid
        raise
    return header, body


def encode_request(header: RequestHeader, body: RequestBody | None = None) -> bytes:
    w = Writer()
    header.write(w)
    if body is not None:
        body.write(w)
    return w.getvalue()


def encode_response(header: ReplyHeader, body: ResponseBody | None = None) -> bytes:
    """A reply payload. A reply with a non-zero err carries no body, as ZooKeeper sends it;
    a body passed with one is a caller bug and is not written."""
    w = Writer()
    header.write(w)
    if body is not None and header.err == ErrorCode.OK:
        body.write(w)
    return w.getvalue()


def decode_response(
    payload: Buffer, opcode: int, max_buffer: int = DEFAULT_MAX_BUFFER
) -> tuple[ReplyHeader, ResponseBody | None]:
    """Decode a reply to a request of `opcode` (what a client remembers for the xid).
    Notifications (xid -1) decode as WatcherEvent whatever opcode is given; an error reply
    and the replies to ping, auth, setWatches, delete, check and closeSession have no body."""
    r = Reader(payload, max_buffer)
    header = ReplyHeader.read(r)
    body: ResponseBody | None = None
    if header.xid == Xid.NOTIFICATION:
        body = WatcherEvent.read(r)
    elif header.err == ErrorCode.OK:
        read = RESPONSE_BODIES.get(opcode)
        if read is not None:
            body = read(r)
    r.expect_end(f"reply xid {header.xid}")
    return header, body
