"""The TCP transport between consensus members, over real loopback sockets.

Every test runs under both plain asyncio and uvloop (what the service runs), binds port 0
and hands the real ports out afterwards with ``set_peers``. Waits poll the observable state
with a deadline, so a broken transport fails in seconds rather than at the global timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import uvloop

from services.consensus import peers as peers_module
from services.consensus.peers import MAGIC, PeerNetwork
from services.consensus.zab.messages import Ack, Message, Ping, Proposal
from services.consensus.zab.state import LogEntry
from services.consensus.zab.wire import encode
from tests.ports import free_port

HOST = "127.0.0.1"
DEADLINE = 5.0  # seconds any single wait may take
MIB = 1024 * 1024


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Iterator[Callable[[Coroutine[Any, Any, None]], None]]:
    factory = uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop

    def run(coro: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(asyncio.wait_for(coro, 4 * DEADLINE))

    yield run


class Member:
    """A PeerNetwork plus everything its callbacks saw, in order."""

    def __init__(self, my_id: int) -> None:
        self.id = my_id
        self.received: list[Message] = []
        self.links: list[tuple[int, bool]] = []  # (peer, up?) per on_link call
        self.net = PeerNetwork(
            my_id,
            {},
            self.received.append,
            self._on_link,
            retry_interval=0.01,
            max_retry_interval=0.1,
        )
        self.port = 0

    def _on_link(self, peer: int) -> None:
        self.links.append((peer, peer in self.net.connected()))

    async def start(self, port: int = 0) -> Member:
        self.port = await self.net.start(HOST, port)
        return self

    def from_(self, sender: int) -> list[Message]:
        return [m for m in self.received if m.sender == sender]


async def wait_until(what: str, check: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def cluster(ids: tuple[int, ...]) -> dict[int, Member]:
    members = {i: await Member(i).start() for i in ids}
    for m in members.values():
        m.net.set_peers({j: (HOST, o.port) for j, o in members.items() if j != m.id})
    for m in members.values():
        others = set(members) - {m.id}
        await wait_until(f"{m.id} linked to {others}", lambda m=m, o=others: m.net.connected() == o)
    return members


def handshake(member_id: int, magic: bytes = MAGIC) -> bytes:
    return magic + struct.pack(">i", member_id)


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the other side sent before it closed (a reset counts as closed)."""
    data = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), DEADLINE):
            data += chunk
    except ConnectionResetError:
        pass
    return data


async def close_all(members: dict[int, Member]) -> None:
    for m in members.values():
        await m.net.close()


def payload(n: int, seed: int) -> bytes:
    return bytes((seed + i) % 251 for i in range(256)) * (n // 256) + os.urandom(n % 256)


# --- connecting and delivering --------------------------------------------------------


def test_three_members_link_pairwise_and_deliver_everything_in_order(run: Any) -> None:
    async def main() -> None:
        members = await cluster((1, 2, 3))
        sent: dict[tuple[int, int], list[Message]] = {}
        for a in members.values():
            for b in members:
                if b == a.id:
                    continue
                batch: list[Message] = []
                for i in range(300):
                    batch.append(Ping(a.id, i))
                    if i % 100 == 0:  # three 1 MiB proposals among the pings
                        entry = LogEntry((a.id << 32) | i, payload(MIB, a.id * 7 + b + i))
                        batch.append(Proposal(a.id, 5, entry))
                for message in batch:
                    a.net.send(b, message)
                sent[a.id, b] = batch
        for m in members.values():
            await wait_until(f"{m.id} got everything", lambda m=m: len(m.received) == 2 * 303)
        for (a, b), batch in sent.items():
            assert members[b].from_(a) == batch  # all of them, intact, in send order
        for m in members.values():  # one up per peer, no flapping
            assert sorted(m.links) == [(p, True) for p in sorted(set(members) - {m.id})]
        await close_all(members)
        for m in members.values():  # close() reports every break, exactly once
            assert sorted(m.links) == sorted(
                [(p, True) for p in set(members) - {m.id}]
                + [(p, False) for p in set(members) - {m.id}]
            )
            assert m.net.connected() == set()
        await members[1].net.close()  # idempotent

    run(main())


def test_callbacks_can_reply_from_inside_on_message(run: Any) -> None:
    """The pipelined PROPOSAL/ACK exchange: the follower answers while being called."""

    async def main() -> None:
        members = await cluster((1, 2))
        leader, follower = members[1], members[2]
        follower.net._on_message = lambda m: follower.net.send(  # type: ignore[assignment]
            1, Ack(2, 3, m.entry.zxid if isinstance(m, Proposal) else -1)
        )
        for zxid in range(1, 2001):
            leader.net.send(2, Proposal(1, 3, LogEntry(zxid, b"x" * 128)))
        await wait_until("all acks", lambda: len(leader.received) == 2000)
        assert leader.received == [Ack(2, 3, z) for z in range(1, 2001)]
        await close_all(members)

    run(main())


def test_restarted_member_is_relinked_on_the_same_port(run: Any) -> None:
    async def main() -> None:
        members = await cluster((1, 2, 3))
        addresses = {i: (HOST, m.port) for i, m in members.items()}
        for victim in (3, 1):  # an acceptor-only member, then a dialer-only one
            await members[victim].net.close()
            others = [m for i, m in members.items() if i != victim]
            for m in others:
                await wait_until(
                    f"{m.id} sees {victim} break", lambda m=m, v=victim: v not in m.net.connected()
                )
                assert m.links.count((victim, False)) == 1
            new = Member(victim)
            new.net.set_peers({i: a for i, a in addresses.items() if i != victim})
            await new.start(addresses[victim][1])
            members[victim] = new
            for m in others:
                await wait_until(
                    f"{m.id} relinked to {victim}", lambda m=m, v=victim: v in m.net.connected()
                )
                assert [e for e in m.links if e[0] == victim] == [
                    (victim, True),
                    (victim, False),
                    (victim, True),
                ]
            await wait_until(f"{victim} linked", lambda n=new: len(n.net.connected()) == 2)
            for m in others:
                new.net.send(m.id, Ping(victim, 42))
                m.net.send(victim, Ping(m.id, 43))
            await wait_until("pings", lambda n=new: len(n.received) == 2)
            for m in others:
                await wait_until("ping", lambda m=m, v=victim: m.from_(v)[-1:] == [Ping(v, 42)])
            assert sorted(new.received, key=lambda m: m.sender) == [
                Ping(m.id, 43) for m in sorted(others, key=lambda m: m.id)
            ]
        await close_all(members)

    run(main())


def test_send_without_a_link_is_dropped_and_the_dialer_keeps_retrying(run: Any) -> None:
    async def main() -> None:
        port = free_port()
        a = await Member(1).start()
        a.net.set_peers({2: (HOST, port)})  # nobody listens there yet
        a.net.send(2, Ping(1, 1))  # no link: dropped, no error
        a.net.send(7, Ping(1, 1))  # not even a member: dropped too
        await asyncio.sleep(0.2)  # several failed dials (backoff capped at 0.1 s)
        assert a.net.connected() == set() and a.links == []
        b = Member(2)
        b.net.set_peers({1: (HOST, a.port)})
        await b.start(port)
        await wait_until("link", lambda: a.net.connected() == {2} and b.net.connected() == {1})
        a.net.send(2, Ping(1, 2))
        await wait_until("ping", lambda: b.received != [])
        assert b.received == [Ping(1, 2)]  # the ping sent while down never arrives
        assert a.links == [(2, True)] and b.links == [(1, True)]
        await close_all({1: a, 2: b})

    run(main())


# --- strangers and misbehaving peers ---------------------------------------------------


def test_strangers_are_refused_and_good_links_keep_working(
    run: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        caplog.set_level(logging.WARNING, logger=peers_module.__name__)
        members = await cluster((1, 2))
        # Member 0 is in member 2's configuration but never runs: strangers may claim it.
        members[2].net.set_peers({0: (HOST, free_port()), 1: (HOST, members[1].port)})
        port2 = members[2].port

        async def refused(data: bytes, port: int = port2) -> None:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(data)
            assert await read_until_closed(reader) == b""  # no handshake answer, just closed
            writer.close()

        await refused(handshake(1, magic=b"DLZAB\x00\x00\x01") + encode(Ping(1, 0)))  # v1
        await refused(handshake(1, magic=b"DLZAB\x00\x00\x02") + encode(Ping(1, 0)))  # v2
        await refused(handshake(1, magic=b"DLZAB\x00\x00\x03") + encode(Ping(1, 0)))  # v3
        await refused(handshake(9))  # not a member
        await refused(handshake(2))  # its own id
        await refused(handshake(2), port=members[1].port)  # 2 > 1: 1 must dial 2, not accept
        await refused(os.urandom(64))  # garbage
        refusals = 7
        await wait_until("refusal logs", lambda: len(caplog.records) == refusals)

        async def accepted_then_dropped(frames: bytes) -> None:
            reader, writer = await asyncio.open_connection(HOST, port2)
            writer.write(handshake(0) + frames)
            assert await read_until_closed(reader) == handshake(2)
            writer.close()

        await accepted_then_dropped(encode(Ping(0, 1)) + encode(Ping(1, 2)))  # wrong sender
        await accepted_then_dropped(b"\x00\x00\x00\x05\xee\x00\x00\x00\x00")  # unknown type
        await accepted_then_dropped(b"\xff\xff\xff\xf0" + b"\x00" * 32)  # length over max_frame
        # The frame before the wrong sender was delivered; nothing after it was.
        assert members[2].from_(0) == [Ping(0, 1)]
        assert members[2].from_(1) == []
        assert members[2].links == [(1, True)] + [(0, True), (0, False)] * 3
        await wait_until("drop logs", lambda: len(caplog.records) == refusals + 3)
        assert all(r.levelno == logging.WARNING for r in caplog.records)

        members[1].net.send(2, Ping(1, 99))  # the real link never noticed any of it
        members[2].net.send(1, Ping(2, 98))
        await wait_until("pings", lambda: members[2].from_(1) != [] and members[1].received != [])
        assert members[2].from_(1) == [Ping(1, 99)] and members[1].received == [Ping(2, 98)]
        assert members[1].links == [(2, True)]
        await close_all(members)

    run(main())


def test_a_newer_link_from_the_same_member_replaces_the_older(run: Any) -> None:
    async def main() -> None:
        b = await Member(2).start()
        b.net.set_peers({1: (HOST, free_port())})  # 1 dials 2: the address is never used
        old_reader, old_writer = await asyncio.open_connection(HOST, b.port)
        old_writer.write(handshake(1))
        assert await old_reader.readexactly(12) == handshake(2)
        await wait_until("first link", lambda: b.links == [(1, True)])
        new_reader, new_writer = await asyncio.open_connection(HOST, b.port)
        new_writer.write(handshake(1))
        assert await new_reader.readexactly(12) == handshake(2)
        assert await read_until_closed(old_reader) == b""  # the older link is closed
        assert b.links == [(1, True), (1, False), (1, True)]
        new_writer.write(encode(Ping(1, 7)))
        await wait_until("ping", lambda: b.received != [])
        b.net.send(1, Ping(2, 8))
        assert await new_reader.readexactly(len(encode(Ping(2, 8)))) == encode(Ping(2, 8))
        assert b.received == [Ping(1, 7)]
        for w in (old_writer, new_writer):
            w.close()
        await wait_until("break", lambda: b.net.connected() == set())
        assert b.links == [(1, True), (1, False), (1, True), (1, False)]
        await b.net.close()

    run(main())


def test_dialer_refuses_an_acceptor_that_is_not_the_member_it_dialed(run: Any) -> None:
    async def main() -> None:
        attempts = 0

        async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal attempts
            attempts += 1
            assert await reader.readexactly(12) == handshake(1)
            writer.write(handshake(5))  # "I am member 5"
            await read_until_closed(reader)
            writer.close()

        server = await asyncio.start_server(impostor, HOST, 0)
        a = Member(1)
        a.net.set_peers({2: (HOST, server.sockets[0].getsockname()[1])})
        await a.start()
        await wait_until("redials", lambda: attempts >= 3)
        assert a.links == [] and a.net.connected() == set()
        await a.net.close()
        server.close()

    run(main())


def test_a_peer_that_stops_reading_is_dropped(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers_module, "WRITE_HIGH_WATER", MIB)

    async def main() -> None:
        release = asyncio.Event()

        async def stuck(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(12)
            writer.write(handshake(2))
            await release.wait()  # never reads again until the test is over
            writer.close()

        server = await asyncio.start_server(stuck, HOST, 0)
        a = Member(1)
        a.net.set_peers({2: (HOST, server.sockets[0].getsockname()[1])})
        await a.start()
        await wait_until("link", lambda: a.net.connected() == {2})
        sent = 0
        while a.net.connected() and sent < 256:  # socket buffers take a few MiB first
            a.net.send(2, Proposal(1, 1, LogEntry(sent, bytes(MIB))))
            sent += 1
            await asyncio.sleep(0)
        assert a.links[:2] == [(2, True), (2, False)]
        assert sent < 256
        await a.net.close()
        release.set()
        server.close()
        await asyncio.sleep(0.01)  # let the handlers close their sockets

    run(main())


def test_constructor_checks_its_arguments() -> None:
    on_message: Callable[[Message], None] = lambda m: None  # noqa: E731
    on_link: Callable[[int], None] = lambda p: None  # noqa: E731
    with pytest.raises(ValueError):
        PeerNetwork(1, {1: (HOST, 1)}, on_message, on_link)  # itself among its peers
    with pytest.raises(ValueError):
        PeerNetwork(1, {}, on_message, on_link, retry_interval=2.0, max_retry_interval=1.0)
    with pytest.raises(ValueError):
        PeerNetwork(1, {}, on_message, on_link, max_frame=1)
