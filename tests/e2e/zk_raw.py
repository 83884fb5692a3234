"""A tiny ZooKeeper client over a raw socket, for sending what no real client would.

It encodes with `struct` rather than the server's own jute codec, so a test that uses it
does not share the codec's mistakes. Only what the bad-input tests need is here: open a
session, send any frame, read replies (notifications skipped), tell a closed connection.

    with RawSession.open(port) as zk:
        zk.send_request(xid=1, op=GET_DATA, body=ustring("/a") + boolean(False))
        assert zk.reply().err == -101
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from types import TracebackType

# Opcodes and the special notification xid, as ZooKeeper numbers them.
CREATE = 1
EXISTS = 3
GET_DATA = 4
GET_CHILDREN = 8
SYNC = 9
NOTIFICATION_XID = -1


def integer(value: int) -> bytes:
    return struct.pack(">i", value)


def long(value: int) -> bytes:
    return struct.pack(">q", value)


def boolean(value: bool) -> bytes:
    return b"\x01" if value else b"\x00"


def buffer(value: bytes | None) -> bytes:
    return integer(-1) if value is None else integer(len(value)) + value


def ustring(value: str) -> bytes:
    return buffer(value.encode())


def frame(payload: bytes) -> bytes:
    return integer(len(payload)) + payload


def open_acl_unsafe() -> bytes:
    """A vector of one ACL: all perms for world:anyone."""
    return integer(1) + integer(31) + ustring("world") + ustring("anyone")


@dataclass(frozen=True, slots=True)
class Reply:
    xid: int
    zxid: int
    err: int
    body: bytes


class ConnectionClosedError(Exception):
    """The server closed the connection (EOF or reset)."""


class RawSession:
    """One socket with an open session. After the session is open, reads block for at most
    `timeout` seconds."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.session_id = 0
        self.time_out = 0

    @classmethod
    def open(cls, port: int, timeout: float = 5.0, session_timeout_ms: int = 5000) -> RawSession:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10.0)
        session = cls(sock)
        try:
            connect = integer(0) + long(0) + integer(session_timeout_ms) + long(0)
            connect += buffer(bytes(16)) + boolean(False)
            sock.sendall(frame(connect))
            payload = session.read_frame()
            _protocol, session.time_out, session.session_id = struct.unpack_from(">iiq", payload)
        except BaseException:
            sock.close()
            raise
        assert session.time_out > 0 and session.session_id != 0, "session refused"
        sock.settimeout(timeout)
        return session

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_request(self, xid: int, op: int, body: bytes = b"") -> None:
        self.sock.sendall(frame(integer(xid) + integer(op) + body))

    def sync(self, path: str, xid: int = 1) -> None:
        """Catch this member up with the leader, as a client does before reading what
        another client wrote through another member."""
        self.send_request(xid, SYNC, ustring(path))
        reply = self.reply()
        assert (reply.xid, reply.err) == (xid, 0), reply

    def read_exact(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            try:
                chunk = self.sock.recv(size - len(chunks))
            except ConnectionResetError as exc:
                raise ConnectionClosedError("connection reset") from exc
            if not chunk:
                raise ConnectionClosedError(f"EOF after {len(chunks)} of {size} bytes")
            chunks += chunk
        return bytes(chunks)

    def read_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self.read_exact(4))
        assert 0 <= size <= 16 * 1024 * 1024, f"server sent frame length {size}"
        return self.read_exact(size)

    def reply(self) -> Reply:
        """The next reply that is not a watch notification."""
        while True:
            payload = self.read_frame()
            xid, zxid, err = struct.unpack_from(">iqi", payload)
            if xid != NOTIFICATION_XID:
                return Reply(xid, zxid, err, payload[16:])

    def is_closed_by_server(self) -> bool:
        """True when the server closes the connection within the socket timeout, reading
        and dropping whatever it sends first; False when it stays open that long."""
        try:
            while True:
                self.read_frame()
        except ConnectionClosedError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
