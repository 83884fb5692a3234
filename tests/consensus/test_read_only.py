"""Read-only mode (ZooKeeper's readonlymode.enabled) on one member, without peers: a real,
unstarted Member whose role changes and ticks the test drives, and its client port on
loopback, spoken to with the server's jute codec.

What ZooKeeper 3.9 does and these tests hold us to: a member looking for a leader for
max(2 s, tickTime) (QuorumPeer's roZkMgr) serves clients that asked for read-only
(ConnectRequest.readOnly) and closes the others ("Refusing session request for
not-read-only client"); the ConnectResponse says readOnly; reads and watches work; create,
create2, delete, setData, setACL, check, multi and sync are answered NOTREADONLY
(ReadOnlyRequestProcessor); sessions are local to the member, a session of the quorum is
not renewed there (ReadOnlyZooKeeperServer.validateSession); ``isro`` answers ro, rw or
null (IsroCommand) and srvr/mntr say "read-only" (ReadOnlyZooKeeperServer.getState); when
the member finds a leader, every connection closes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from services.consensus.codes import CreateMode, ErrorCode, OpCode
from services.consensus.connections import ClientServer
from services.consensus.fourletter import NOT_SERVING, answer
from services.consensus.jute import (
    ConnectRequest,
    ConnectResponse,
    CreateRequest,
    DeleteRequest,
    MultiOp,
    MultiRequest,
    PathRequest,
    PathWatchRequest,
    ReplyHeader,
    RequestBody,
    RequestHeader,
    ResponseBody,
    SetACLRequest,
    SetDataRequest,
    decode_connect_response,
    decode_response,
    encode_connect_request,
    encode_frame,
    encode_request,
)
from services.consensus.jute.records import CheckVersionRequest, GetDataResponse
from services.consensus.member import READ_ONLY_GRACE, Member
from services.consensus.settings import ConsensusSettings
from services.consensus.tree import OPEN_ACL_UNSAFE, Create, CreateSession, Session
from services.consensus.zab import RoleChange, ServerState

HOST = "127.0.0.1"
DEADLINE = 10.0  # seconds any one network wait may take (a loaded machine)


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 6 * DEADLINE))


def make_settings(tmp_path: Path, **extra: Any) -> ConsensusSettings:
    members = {
        i: {"client": f"127.0.0.1:{2180 + i}", "peer": f"127.0.0.1:{2880 + i}"} for i in (1, 2, 3)
    }
    return ConsensusSettings.model_validate({"members": members, "data_dir": tmp_path, **extra})


def apply(member: Member, request: Any, session: Session) -> None:
    """Commit ``request`` on the member's tree as if the quorum had."""
    zxid = member.applied_zxid + 1
    txn = member.tree.prepare(request, session, zxid, int(time.time() * 1000))
    member.tree.apply(txn)
    member.applied_zxid = zxid


def cut_off(member: Member) -> None:
    """The member has looked for a leader for the grace period."""
    member._read_only_tick(time.monotonic() + READ_ONLY_GRACE)


@asynccontextmanager
async def served(settings: ConsensusSettings) -> AsyncIterator[tuple[Member, ClientServer, int]]:
    member = Member(settings, 1)
    server = ClientServer(member)
    port = await server.start(HOST, 0)
    try:
        yield member, server, port
    finally:
        await server.stop()
        await member.stop()


class Client:
    """One connection to the client port, speaking jute."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.xid = 0

    @classmethod
    async def connect(
        cls,
        port: int,
        *,
        read_only: bool = True,
        session_id: int = 0,
        passwd: bytes = bytes(16),
        timeout_ms: int = 5000,
    ) -> tuple[Client, ConnectResponse | None]:
        """Open a connection and send a ConnectRequest; the response, or None when the
        member closed the connection without one."""
        reader, writer = await asyncio.open_connection(HOST, port)
        client = cls(reader, writer)
        request = ConnectRequest(0, 0, timeout_ms, session_id, passwd, read_only)
        writer.write(encode_frame(encode_connect_request(request)))
        payload = await client.frame()
        return client, None if payload is None else decode_connect_response(payload)

    async def frame(self) -> bytes | None:
        try:
            head = await asyncio.wait_for(self.reader.readexactly(4), DEADLINE)
            return await asyncio.wait_for(
                self.reader.readexactly(int.from_bytes(head, "big")), DEADLINE
            )
        except asyncio.IncompleteReadError:
            return None

    async def call(
        self, op: int, body: RequestBody | None = None
    ) -> tuple[ReplyHeader, ResponseBody | None]:
        self.xid += 1
        self.writer.write(encode_frame(encode_request(RequestHeader(self.xid, op), body)))
        payload = await self.frame()
        assert payload is not None, f"connection closed instead of answering opcode {op}"
        header, reply = decode_response(payload, op)
        assert header.xid == self.xid
        return header, reply

    async def closed(self) -> bool:
        """True once the member closed the connection (EOF before any further frame)."""
        return await self.frame() is None

    def close(self) -> None:
        self.writer.close()


async def wait_until(what: str, check: Callable[[], bool]) -> None:
    end = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


# -- when a member is read-only ------------------------------------------------------------


def test_read_only_mode_is_off_by_default_and_a_cut_off_member_then_serves_nothing(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path)
    assert settings.read_only_mode is False

    async def scenario() -> None:
        async with served(settings) as (member, server, port):
            member._read_only_tick(time.monotonic() + 3600)  # looking for an hour
            assert not member.read_only
            assert member.mode == "looking"
            assert answer(b"isro", member, server) == "null"
            assert answer(b"srvr", member, server) == NOT_SERVING
            client, response = await Client.connect(port, read_only=True)
            assert response is None  # closed right after the ConnectRequest
            client.close()

    run(scenario())


def test_read_only_starts_after_the_grace_period_of_looking_only(tmp_path: Path) -> None:
    member = Member(make_settings(tmp_path, read_only_mode=True), 1)
    try:
        start = time.monotonic()
        member._read_only_tick(start)
        assert not member.read_only  # just started looking
        member._role_changed(RoleChange(ServerState.FOLLOWING, 2, 1, False))
        member._read_only_tick(start + 3600)
        assert not member.read_only  # found a leader: syncing, not cut off
        member._role_changed(RoleChange(ServerState.LOOKING, None, 0, False))
        looking_again = time.monotonic()
        member._read_only_tick(looking_again + READ_ONLY_GRACE / 2)
        assert not member.read_only  # the grace period starts again with each election
        member._read_only_tick(looking_again + READ_ONLY_GRACE)
        assert member.read_only
        assert member.mode == "read-only"
        assert member.readiness() is not None  # not ready: it is not in a quorum
    finally:
        asyncio.run(member.stop())


def test_four_letter_words_say_read_only_as_zookeeper_does(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with served(make_settings(tmp_path, read_only_mode=True)) as (member, server, _):
            assert answer(b"isro", member, server) == "null"  # looking: no server runs
            cut_off(member)
            assert answer(b"isro", member, server) == "ro"
            assert "\nMode: read-only\n" in answer(b"srvr", member, server)
            assert "\nMode: read-only\n" in answer(b"stat", member, server)
            assert "zk_server_state\tread-only\n" in answer(b"mntr", member, server)
            member._role_changed(RoleChange(ServerState.FOLLOWING, 2, 1, False))
            assert answer(b"isro", member, server) == "null"
            member._role_changed(RoleChange(ServerState.FOLLOWING, 2, 1, True))
            assert answer(b"isro", member, server) == "rw"
            assert "\nMode: follower\n" in answer(b"srvr", member, server)

    run(scenario())


# -- the client port of a read-only member --------------------------------------------------


def test_a_client_that_did_not_ask_for_read_only_is_closed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with served(make_settings(tmp_path, read_only_mode=True)) as (member, _, port):
            cut_off(member)
            client, response = await Client.connect(port, read_only=False)
            assert response is None
            client.close()
            assert not member.local_sessions

    run(scenario())


def test_read_only_session_reads_and_watches_and_every_write_is_notreadonly(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with served(make_settings(tmp_path, read_only_mode=True)) as (member, _, port):
            writer = Session(member.new_session_id())
            apply(member, CreateSession(6000), writer)
            apply(member, Create("/a", b"old", OPEN_ACL_UNSAFE, CreateMode.PERSISTENT), writer)
            zxid = member.applied_zxid
            cut_off(member)
            client, response = await Client.connect(port, timeout_ms=4000)
            assert response is not None and response.read_only
            sid = response.session_id
            assert sid != 0 and response.time_out == 4000
            assert response.passwd == member.session_password(sid)
            assert sid in member.local_sessions and sid not in member.tree.sessions

            header, body = await client.call(OpCode.GET_DATA, PathWatchRequest("/a", True))
            assert header.err == ErrorCode.OK and header.zxid == zxid
            assert isinstance(body, GetDataResponse) and body.data == b"old"
            header, _ = await client.call(OpCode.EXISTS, PathWatchRequest("/b", True))
            assert header.err == ErrorCode.NONODE
            header, _ = await client.call(OpCode.GET_CHILDREN, PathWatchRequest("/", True))
            assert header.err == ErrorCode.OK
            assert member.tree.watches.registrations() == [
                ("child", "/", sid),
                ("data", "/a", sid),
                ("data", "/b", sid),
            ]

            acl = tuple(OPEN_ACL_UNSAFE)
            create = CreateRequest("/c", b"x", acl, 0)
            writes: list[tuple[int, RequestBody]] = [
                (OpCode.CREATE, create),
                (OpCode.CREATE2, create),
                (OpCode.DELETE, DeleteRequest("/a", -1)),
                (OpCode.SET_DATA, SetDataRequest("/a", b"new", -1)),
                (OpCode.SET_ACL, SetACLRequest("/a", acl, -1)),
                (OpCode.CHECK, CheckVersionRequest("/a", 0)),
                (OpCode.SYNC, PathRequest("/a")),
                (
                    OpCode.MULTI,
                    MultiRequest((MultiOp(OpCode.CHECK, CheckVersionRequest("/a", 0)),)),
                ),
                (OpCode.MULTI, MultiRequest((MultiOp(OpCode.CREATE, create),))),
                (OpCode.SET_DATA, SetDataRequest("no/t a path", b"", -1)),  # refused first
            ]
            for op, request in writes:
                header, body = await client.call(op, request)
                assert (header.err, header.zxid, body) == (ErrorCode.NOTREADONLY, zxid, None), op
            header, body = await client.call(OpCode.GET_DATA, PathWatchRequest("/a", False))
            assert isinstance(body, GetDataResponse) and body.data == b"old"
            assert member.outstanding == 0  # nothing went towards the quorum
            assert member.applied_zxid == zxid and "/c" not in member.tree.nodes

            header, _ = await client.call(OpCode.CLOSE_SESSION)
            assert header.err == ErrorCode.OK
            assert await client.closed()
            client.close()
            assert sid not in member.local_sessions
            await wait_until(
                "the closed session's watches to go", lambda: member.tree.watches.count() == 0
            )

    run(scenario())


def test_read_only_sessions_resume_on_the_member_but_the_quorums_do_not(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with served(make_settings(tmp_path, read_only_mode=True)) as (member, _, port):
            quorum_sid = member.new_session_id()
            apply(member, CreateSession(6000), Session(quorum_sid))
            assert quorum_sid in member.tree.sessions
            cut_off(member)

            first, response = await Client.connect(port)
            assert response is not None
            sid, passwd = response.session_id, response.passwd
            assert passwd is not None
            first.close()
            again, response = await Client.connect(port, session_id=sid, passwd=passwd)
            assert response is not None and response.read_only
            assert (response.session_id, response.time_out) == (sid, 5000)
            header, _ = await again.call(OpCode.PING)
            assert header.err == ErrorCode.OK
            again.close()

            # A session of the quorum is not renewed here: closed without an answer.
            password = member.session_password(quorum_sid)
            client, response = await Client.connect(port, session_id=quorum_sid, passwd=password)
            assert response is None
            client.close()
            # An unknown session, or a wrong password: expired (zero timeout), read-only.
            for unknown, pw in (
                (sid + 1000, member.session_password(sid + 1000)),
                (sid, bytes(16)),
            ):
                client, response = await Client.connect(port, session_id=unknown, passwd=pw)
                assert response is not None
                assert (response.time_out, response.session_id, response.read_only) == (0, 0, True)
                assert await client.closed()
                client.close()

    run(scenario())


def test_a_silent_read_only_session_expires(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with served(make_settings(tmp_path, read_only_mode=True)) as (member, _, port):
            cut_off(member)
            client, response = await Client.connect(port, timeout_ms=2000)
            assert response is not None
            member._read_only_tick(time.monotonic() + 1.0)
            assert response.session_id in member.local_sessions
            member._read_only_tick(time.monotonic() + 2.0)
            assert response.session_id not in member.local_sessions
            assert await client.closed()
            client.close()

    run(scenario())


def test_finding_a_leader_closes_the_read_only_connections(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with served(make_settings(tmp_path, read_only_mode=True)) as (member, server, port):
            cut_off(member)
            client, response = await Client.connect(port)
            assert response is not None and response.read_only
            await wait_until("the session to attach", lambda: bool(server.by_session))
            member._role_changed(RoleChange(ServerState.FOLLOWING, 2, 1, False))
            assert not member.read_only and not member.local_sessions
            assert await client.closed()
            client.close()
            # Syncing with the leader: nobody is served, read-only or not.
            client, response = await Client.connect(port)
            assert response is None
            client.close()

    run(scenario())


def test_a_serving_member_answers_a_read_only_client_read_write(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with served(make_settings(tmp_path, read_only_mode=True)) as (member, _, port):
            sid = member.new_session_id()
            apply(member, CreateSession(6000), Session(sid))
            member._role_changed(RoleChange(ServerState.FOLLOWING, 2, 1, True))
            password = member.session_password(sid)
            client, response = await Client.connect(port, session_id=sid, passwd=password)
            assert response is not None
            assert (response.session_id, response.read_only) == (sid, False)
            client.close()

    run(scenario())


@pytest.mark.parametrize("mode", [True, False])
def test_a_member_in_a_quorum_never_turns_read_only(tmp_path: Path, mode: bool) -> None:
    member = Member(make_settings(tmp_path, read_only_mode=mode), 1)
    try:
        member._role_changed(RoleChange(ServerState.LEADING, 1, 1, True))
        member._read_only_tick(time.monotonic() + 3600)
        assert not member.read_only and member.mode == "leader"
    finally:
        asyncio.run(member.stop())
