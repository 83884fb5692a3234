"""TCP links between consensus members: the I/O edge around the sans-I/O ZAB core.

There is exactly one link per pair of members. The member with the smaller id dials the
larger one, which only accepts, so two members can never race to build two links and lose
messages on the one they later drop. The dialer opens with a 12-byte handshake, ``MAGIC``
then its id (big-endian int32); the acceptor checks it and answers with the same handshake
carrying its own id, so the dialer also learns it reached the member it meant to (and not a
misconfigured address) before it reports the link up. After the handshake both directions
carry ZAB frames (services.consensus.zab.wire).

TCP semantics are passed to the core unchanged: ``send`` on a peer without a live link drops
the message, and ``on_link(peer)`` fires once when a link comes up and once when it breaks,
so the driver calls ``Node.link_reset`` and the core resends whatever the protocol needs.

Writes are coalesced: ``send`` only encodes and queues, and one ``writelines`` per link per
event-loop iteration moves everything the core produced in that iteration (or every
``FLUSH_FRAMES`` frames, so a long burst streams out as it is produced). A peer that stops
reading cannot make us buffer without bound: past ``WRITE_HIGH_WATER`` queued bytes the link
is dropped.

With ``tls`` (ZooKeeper's sslQuorum) every link is mutual TLS under the ensemble CA: the
acceptor takes only peers whose certificate chains to it, the dialer checks the acceptor's
(and its host name, with hostname verification), and with hostname verification the
acceptor also requires the certificate to name the address it dials the claimed member at,
so one member's certificate cannot pose as another member. The handshake above then runs
inside TLS; without ``tls`` the links are plain TCP, unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable, Mapping
from typing import Final, cast

from directlog.waits import within
from services.consensus.tls import QuorumTls, names_host, peer_certificate
from services.consensus.zab.messages import Message
from services.consensus.zab.wire import FrameDecoder, WireError, encode

__all__ = ["HANDSHAKE_TIMEOUT", "MAGIC", "WRITE_HIGH_WATER", "PeerNetwork"]

log = logging.getLogger(__name__)

# Protocol name and version; a new version is a new magic, and members of different
# versions do not link (docs/consensus.md: upgrading member by member). Version 2: a leader
# of three leaves out the Commits that followers infer from its own Acks (zab/node.py),
# which a version-1 follower would wait for. Version 3: transactions may carry null znode
# data and snapshots are tree format 2 (tree/snapshot.py), which a version-2 member would
# read as empty data or refuse. Version 4: observers, with the leader's Inform (type 16)
# and the OBSERVING state code, and the active configuration carried by Notification and
# NewLeader (zab/wire.py), all of which a version-3 member would refuse.
MAGIC: Final = b"DLZAB\x00\x00\x04"
_HANDSHAKE: Final = struct.Struct(">8si")
HANDSHAKE_TIMEOUT: Final = 5.0  # seconds to connect and finish the handshake
FLUSH_FRAMES: Final = 32  # frames queued in one event-loop turn before they are written anyway
WRITE_HIGH_WATER: Final = 64 * 1024 * 1024  # bytes queued in one link's transport
DEFAULT_MAX_FRAME: Final = 64 * 1024 * 1024  # a SNAP sync carries a whole snapshot
_I32_MAX: Final = (1 << 31) - 1


class _Link(asyncio.Protocol):
    """One TCP connection. ``peer`` is None on an accepted link until its handshake names it."""

    def __init__(self, net: PeerNetwork, peer: int | None) -> None:
        self.net = net
        self.peer = peer
        self.dialer = peer is not None
        self.up = False  # handshake done and on_link reported; cleared on the break
        self.was_up = False  # the link came up at some point (resets the dialer's backoff)
        self.dead = False  # aborted or lost; nothing more is read or written
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._transport: asyncio.Transport | None = None
        self._handshake = b""
        self._decoder = FrameDecoder(net._max_frame)
        self._pending: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None

    def itself(self) -> _Link:
        """A protocol factory for a link built before its connection (the dialer's)."""
        return self

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.net._all.add(self)
        if self.net._closed:
            self.fail(None)
            return
        self._timer = self._loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_expired)
        if self.dialer:
            self._transport.write(_HANDSHAKE.pack(MAGIC, self.net.my_id))

    def data_received(self, data: bytes) -> None:
        if self.dead:
            return
        if not self.up:
            data = self._read_handshake(data)
            if not data:
                return
        try:
            messages = self._decoder.feed(data)
        except WireError as e:
            self.fail(f"bad frame from peer {self.peer}: {e}")
            return
        on_message = self.net._on_message
        for message in messages:
            if not self.up:  # a callback closed the link: the rest is not ours to deliver
                return
            if message.sender != self.peer:
                self.fail(
                    f"{type(message).__name__} from sender {message.sender} "
                    f"on the link to peer {self.peer}"
                )
                return
            on_message(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = True
        self._pending.clear()
        self._report_down()
        if self._timer is not None:
            self._timer.cancel()
        self.net._all.discard(self)
        if not self.closed.done():
            self.closed.set_result(None)

    # --- handshake ----------------------------------------------------------------------

    def _read_handshake(self, data: bytes) -> bytes:
        """Consume handshake bytes; return what follows them (frames), or b"" if none yet."""
        need = _HANDSHAKE.size - len(self._handshake)
        self._handshake += data[:need]
        if len(self._handshake) < _HANDSHAKE.size:
            return b""
        magic, peer_id = _HANDSHAKE.unpack(self._handshake)
        rest = data[need:]
        if magic != MAGIC:
            self.fail(f"bad handshake magic {magic!r} from {self._remote()}")
            return b""
        if self.dialer:
            if peer_id != self.peer:
                self.fail(f"dialed member {self.peer} at {self._remote()}; {peer_id} answered")
                return b""
            if self.net._closed or peer_id not in self.net._peers:
                self.fail(None)  # closed or reconfigured while this handshake was in flight
                return b""
        else:
            why = self.net._refusal(peer_id) or self._certificate_refusal(peer_id)
            if why is not None:
                self.fail(f"refused member {peer_id} from {self._remote()}: {why}")
                return b""
            self.peer = peer_id
            assert self._transport is not None
            self._transport.write(_HANDSHAKE.pack(MAGIC, self.net.my_id))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.net._link_up(self)
        return rest if self.up else b""

    def _certificate_refusal(self, peer_id: int) -> str | None:
        tls = self.net._tls
        if tls is None or not tls.check_hostname:
            return None
        assert self._transport is not None
        certificate = peer_certificate(self._transport.get_extra_info("ssl_object"))
        host = self.net._peers[peer_id][0]
        if certificate is None or not names_host(certificate, host):
            return f"its certificate does not name {host}, the address of member {peer_id}"
        return None

    def _handshake_expired(self) -> None:
        self._timer = None
        if not self.up:
            self.fail(f"no handshake from {self._remote()} within {HANDSHAKE_TIMEOUT}s")

    def _remote(self) -> str:
        if self._transport is None:
            return "?"
        name = self._transport.get_extra_info("peername")
        return f"{name[0]}:{name[1]}" if isinstance(name, tuple) else str(name)

    # --- writing ------------------------------------------------------------------------

    def queue(self, frame: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(frame)
        if len(self._pending) >= FLUSH_FRAMES:
            self._flush()  # a long burst streams out instead of waiting for its end

    def _flush(self) -> None:
        if self.dead or not self._pending:
            return
        assert self._transport is not None
        pending, self._pending = self._pending, []
        self._transport.writelines(pending)
        if self._transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            self.fail(f"peer {self.peer} is not reading: over {WRITE_HIGH_WATER} bytes queued")

    # --- breaking -----------------------------------------------------------------------

    def fail(self, reason: str | None) -> None:
        """Drop the link now: report the break, discard what is queued, abort the socket."""
        if self.dead:
            return
        if reason is not None:
            log.warning("peer link closed: %s", reason)
        self.dead = True
        self._pending.clear()
        self._report_down()
        if self._transport is not None:
            self._transport.abort()

    def _report_down(self) -> None:
        if self.up:
            self.up = False
            assert self.peer is not None
            self.net._link_down(self)


class PeerNetwork:
    """The TCP transport of one consensus member to the others.

    ``on_message`` gets every decoded message, in order per link, only after the link's
    sender has been checked. ``on_link(peer)`` is called exactly once when a link to
    ``peer`` becomes usable (handshake done, on both sides) and exactly once when it breaks,
    including on ``close()``; never for a link that did not come up. Both callbacks run on
    the event loop and may call ``send``. ``tls``: mutual TLS on every link (module doc).
    """

    def __init__(
        self,
        my_id: int,
        peers: Mapping[int, tuple[str, int]],
        on_message: Callable[[Message], None],
        on_link: Callable[[int], None],
        max_frame: int = DEFAULT_MAX_FRAME,
        retry_interval: float = 0.05,
        max_retry_interval: float = 1.0,
        tls: QuorumTls | None = None,
    ) -> None:
        if not 0 <= my_id <= _I32_MAX:
            raise ValueError(f"member id {my_id} is not a non-negative int32")
        if not 0 < retry_interval <= max_retry_interval:
            raise ValueError("need 0 < retry_interval <= max_retry_interval")
        FrameDecoder(max_frame)  # validates max_frame now rather than on the first link
        self.my_id = my_id
        self._peers: dict[int, tuple[str, int]] = {}
        self._on_message = on_message
        self._on_link = on_link
        self._max_frame = max_frame
        self._retry_interval = retry_interval
        self._max_retry_interval = max_retry_interval
        self._tls = tls
        self._links: dict[int, _Link] = {}  # live links by peer
        self._all: set[_Link] = set()  # every open connection, handshaking ones included
        self._dialers: dict[int, asyncio.Task[None]] = {}
        self._server: asyncio.Server | None = None
        self._started = False
        self._closed = False
        self.set_peers(peers)

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 picks a free port) and start dialing; returns the port."""
        if self._started:
            raise RuntimeError("PeerNetwork already started")
        self._started = True
        loop = asyncio.get_running_loop()
        if self._tls is None:
            self._server = await loop.create_server(
                lambda: _Link(self, None), host, port, reuse_address=True
            )
        else:
            self._server = await loop.create_server(
                lambda: _Link(self, None),
                host,
                port,
                reuse_address=True,
                ssl=self._tls.server,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
            )
        bound: int = self._server.sockets[0].getsockname()[1]
        self._sync_dialers()
        return bound

    def set_peers(self, peers: Mapping[int, tuple[str, int]]) -> None:
        """Replace the other members' addresses: lets a test bind every member on port 0
        first and hand out the real ports afterwards. Links to members no longer listed
        are closed."""
        if self.my_id in peers:
            raise ValueError(f"peers must not include this member ({self.my_id})")
        if any(not 0 <= p <= _I32_MAX for p in peers):
            raise ValueError("peer ids must be non-negative int32")
        old, self._peers = self._peers, dict(peers)
        for peer, link in list(self._links.items()):
            if peer not in self._peers:
                link.fail(f"member {peer} left the configuration")
            elif link.dialer and self._peers[peer] != old.get(peer):
                link.fail(f"member {peer} moved to {self._peers[peer]}")
        if self._started and not self._closed:
            self._sync_dialers()

    def send(self, peer: int, message: Message) -> None:
        """Queue ``message`` for ``peer``; dropped when no link to it is up (the core learns
        of that through ``on_link``). Never blocks."""
        self.send_frame(peer, encode(message))

    def send_frame(self, peer: int, frame: bytes) -> None:
        """``send`` for a message already encoded, so a broadcast is encoded once."""
        link = self._links.get(peer)
        if link is not None:
            link.queue(frame)

    def flush(self) -> None:
        """Write every queued frame now instead of at the end of this loop turn."""
        for link in list(self._links.values()):
            link._flush()

    def connected(self) -> set[int]:
        """Peers with a live link."""
        return set(self._links)

    async def close(self) -> None:
        """Stop listening and dialing and close every link; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        dialers = list(self._dialers.values())
        self._dialers.clear()
        for task in dialers:
            task.cancel()
        links = list(self._all)
        for link in links:
            link.fail(None)
        await asyncio.gather(*dialers, return_exceptions=True)
        if links:
            await asyncio.wait([link.closed for link in links], timeout=HANDSHAKE_TIMEOUT)
        if self._server is not None:
            await self._server.wait_closed()

    # --- called by links ----------------------------------------------------------------

    def _refusal(self, peer: int) -> str | None:
        if peer not in self._peers:
            return "not a member"
        if peer >= self.my_id:
            return f"member {peer} must be dialed by {self.my_id}, not dial it"
        if self._closed:
            return "shutting down"
        return None

    def _link_up(self, link: _Link) -> None:
        peer = link.peer
        assert peer is not None and not link.up
        old = self._links.get(peer)
        if old is not None:  # the peer restarted or lost its old connection first
            old.fail(f"member {peer} connected again; closing its older link")
        self._links[peer] = link
        link.up = link.was_up = True
        self._on_link(peer)

    def _link_down(self, link: _Link) -> None:
        peer = link.peer
        assert peer is not None
        if self._links.get(peer) is link:
            del self._links[peer]
        self._on_link(peer)

    # --- dialing ------------------------------------------------------------------------

    def _sync_dialers(self) -> None:
        for peer in self._peers:
            if peer > self.my_id and peer not in self._dialers:
                self._dialers[peer] = asyncio.get_running_loop().create_task(
                    self._dial(peer), name=f"peer-dial-{self.my_id}-{peer}"
                )

    async def _dial(self, peer: int) -> None:
        """Keep one link to ``peer`` up for as long as it is a member and we are open."""
        loop = asyncio.get_running_loop()
        delay = self._retry_interval
        reported: type[BaseException] | None = None  # the cause of this outage last logged
        while not self._closed and peer in self._peers:
            host, port = self._peers[peer]
            link = _Link(self, peer)
            tls = self._tls
            connecting = (
                loop.create_connection(link.itself, host, port)
                if tls is None
                else loop.create_connection(
                    link.itself,
                    host,
                    port,
                    ssl=tls.client.current(),
                    server_hostname=host,
                    ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
                )
            )
            try:
                await within(connecting, HANDSHAKE_TIMEOUT)
            except (OSError, TimeoutError) as e:
                if type(e) is not reported:  # one line per outage and cause, not per retry
                    reported = type(e)
                    log.info("cannot reach peer %d at %s:%d: %s", peer, host, port, e)
            else:
                await asyncio.shield(link.closed)
            if link.was_up:
                delay, reported = self._retry_interval, None
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_retry_interval)
        self._dialers.pop(peer, None)
