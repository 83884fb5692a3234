"""One ensemble member at run time: the ZAB core driven by real time, disk and sockets.

The member feeds the sans-I/O ``Node`` with peer messages, ticks and client writes, and
carries out each ``Ready`` in its documented order. Disk writes go to one worker thread
(group commit: whatever the core appended while an fsync ran goes out in the next one);
the rare durable steps that must precede everything else (hard state, truncation, an
installed snapshot) run on the event loop after the worker drains.

Client writes become ``payloads.encode_write`` bytes and go to ``Node.propose``; the leader
turns each into a transaction in ``_prepare`` (ZooKeeper's PrepRequestProcessor) and every
member applies committed transactions to its ``DataTree`` in zxid order, answering its own
clients from the result. The leader also expires sessions: members report the sessions
they hear from in their PingAcks, and a session silent for its timeout is closed through
the quorum like any write.

The membership is the static ``members`` of the settings until a reconfig (ZooKeeper's,
with ``reconfig_enabled``) commits another: the leader checks it in ``_prepare_reconfig``
as ZooKeeper's PrepRequestProcessor does, the core commits it with a quorum of the old and
the new voters, and each member then makes it active (``_use_config``): it links to the
new members, keeps the configuration in its data directory (dynamic_config.py), which
wins over the static file at the next start, and fires the watches on /zookeeper/config.

With ``read_only_mode`` (ZooKeeper's readonlymode.enabled) a member that has looked for a
leader for ``READ_ONLY_GRACE`` without finding one serves read-only clients from its own
tree, on sessions only it knows (ZooKeeper's local sessions), until it finds a leader.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from directlog.busy_poll import BusyPoll
from services.consensus import dynamic_config
from services.consensus.codes import ErrorCode, EventType
from services.consensus.dynamic_config import (
    ConfigFormatError,
    DynamicConfig,
    next_members,
    parse_config,
)
from services.consensus.jute.records import Stat
from services.consensus.metrics import ConsensusMetrics
from services.consensus.payloads import (
    ErrorTxn,
    Logged,
    LoggedBody,
    Reconfig,
    ReconfigTxn,
    SyncRequest,
    SyncTxn,
    Write,
    decode_logged,
    decode_write,
    encode_logged,
    encode_write,
    reconfig_of,
)
from services.consensus.peers import PeerNetwork
from services.consensus.settings import ConsensusSettings, parse_address
from services.consensus.storage import DataDir
from services.consensus.tls import quorum_tls
from services.consensus.tree import (
    Applied,
    CloseSession,
    DataTree,
    Id,
    Preparer,
    Rejected,
    Session,
    WatchEvent,
)
from services.consensus.tree.acl import SUPER
from services.consensus.tree.model import CloseSessionTxn, CreateSessionTxn, DeleteContainer
from services.consensus.zab import (
    Accepted,
    Committed,
    LogEntry,
    Membership,
    Message,
    Node,
    Phase,
    Proposed,
    Ready,
    RoleChange,
    ServerState,
    Snapshot,
)
from services.consensus.zab.messages import PingAck
from services.consensus.zab.wire import encode

log = logging.getLogger("directlog.consensus")

# What a client write's waiter gets: the applied result, a refusal, a completed sync, or
# None when the outcome is unknown (the member lost its leader) and the client must retry.
Outcome = Applied | ErrorTxn | SyncTxn | ReconfigTxn | None
Waiter = Callable[[int, Outcome], None]  # (zxid or 0, outcome)

_CONTAINER_CHECK_TICKS = 10  # how often the leader looks for empty containers
_LOCAL_IN_FLIGHT = 1000  # writes one member has at the leader at once; more wait here
_INLINE_SYNC_ENTRIES = 8  # log writes this small are done on the event loop
_MAX_BATCH = 32  # events (client writes, peer messages) carried out as one Ready at most
_MODES = {  # ZooKeeper's names for the serving roles (srvr's Mode:, mntr's server state)
    ServerState.LEADING: "leader",
    ServerState.FOLLOWING: "follower",
    ServerState.OBSERVING: "observer",
}
# Looking this long (or a tick, if longer) means cut off from the quorum: serve read-only
# clients. ZooKeeper's QuorumPeer waits max(2000 ms, tickTime) before it starts its
# ReadOnlyZooKeeperServer.
READ_ONLY_GRACE = 2.0
CONFIG_NODE = "/zookeeper/config"  # ZooKeeper's ZooDefs.CONFIG_NODE: getConfig reads it


@dataclass(slots=True)
class _Write:
    payload: bytes  # what travels to the leader; session and request as decoded from it
    session: Session
    request: Write
    waiter: Waiter
    started: float


class SessionClients(Protocol):
    """What the member needs from the client side: deliver events, drop connections."""

    def deliver(self, event: WatchEvent) -> None: ...

    def session_closed(self, session_id: int) -> None: ...

    def disconnect_all(self) -> None: ...


class Member:
    def __init__(self, settings: ConsensusSettings, member_id: int) -> None:
        if member_id not in settings.members:
            raise ValueError(
                f"member {member_id} is not in the ensemble {sorted(settings.members)}"
            )
        self.settings = settings
        self.id = member_id
        self.metrics = ConsensusMetrics()
        self.clients: SessionClients | None = None
        self.data_dir = DataDir(
            settings.member_dir(member_id),
            segment_bytes=settings.log_segment_bytes,
            force_sync=settings.force_sync,
        )
        started = time.monotonic()
        state = self.data_dir.load()
        self.tree = _tree(state.snapshot)
        loaded = time.monotonic()
        self._zk = self.metrics.zk  # ZooKeeper's counters, bumped on the write path
        self._zk.dbinittime.observe((loaded - started) * 1000, loaded)
        self._zk.startup_txns_loaded.observe(len(state.log), loaded)
        self.preparer = Preparer(self.tree)
        self.applied_zxid = state.snapshot.zxid
        self._since_snap = 0
        members = settings.members
        # The configuration: the static one, unless a reconfig made a newer one active.
        saved = dynamic_config.load(settings.member_dir(member_id))
        static = DynamicConfig(0, dict(members))
        self.dynamic = saved if saved is not None and saved.version > 0 else static
        self._configs: dict[int, DynamicConfig] = {self.dynamic.version: self.dynamic}
        self._config_times: dict[int, int] = {}  # version -> the reconfig's time (ms)
        self.node = Node(
            member_id,
            self.dynamic.voters,
            observers=self.dynamic.observers,
            config_version=self.dynamic.version,
            config_of=self._config_of,
            quorum=settings.quorum,
            election_ticks=settings.election_ticks,
            heartbeat_ticks=settings.heartbeat_ticks,
            persisted_state=state,
            max_in_flight=len(members) * _LOCAL_IN_FLIGHT + 64,
            prepare=self._prepare,
        )
        self._durable_zxid = self.node.last_zxid
        self.peers = PeerNetwork(
            member_id,
            _peer_addresses(self.dynamic, member_id),
            self._on_peer_message,
            self._on_link,
            tls=quorum_tls(settings),
        )
        self._disk = ThreadPoolExecutor(1, thread_name_prefix=f"consensus-{member_id}-disk")
        self._disk_job: Future[int] | None = None  # the log write under way, if any
        self._disk_jobs = 0  # jobs (log writes, snapshots) submitted and not yet done
        self._synced_inline = False  # a sync ran on the loop: flush peers after _process
        self._unwritten: list[LogEntry] = []
        self._writes: dict[int, _Write] = {}  # request id -> write
        self._by_zxid: dict[int, _Write] = {}
        self._backlog: deque[_Write] = deque()
        self._proposing: _Write | None = None  # the local write Node.propose is handling
        self._heard: set[int] = set()  # sessions heard from since the last tick
        self._deadlines: dict[int, float] = {}  # leader: session -> expiry (monotonic)
        self._expiring: set[int] = set()
        self._deleting: set[str] = set()  # containers being deleted
        self._ticks = 0
        self.serving = False
        self.role = ServerState.LOOKING
        self._looking_since = time.monotonic()
        self.read_only = False  # serving read-only clients, cut off from the quorum
        self._local_deadlines: dict[int, float] = {}  # read-only session -> expiry
        self._tick_task: asyncio.Task[None] | None = None
        self._process_scheduled = False
        self._unprocessed = 0  # events since the last _process
        self._busy_poll = BusyPoll(settings.poll_spin_us / 1e6)  # the next hop's message
        self._prepared: dict[int, Logged] = {}  # leader: zxid -> what _prepare made of it
        self.pending_syncs = 0  # leader: client syncs among _prepared (ZooKeeper's gauge)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session_counter = 0
        self._session_base = (
            (member_id << 56) | ((int(time.time() * 1000) << 16) & ((1 << 56) - 1))
        ) - (1 << 64 if member_id >= 128 else 0)
        self.metrics.bind(self)

    # ------------------------------------------------------------------ lifecycle

    def readiness(self) -> str | None:
        """/readyz: a member is ready while it serves clients, in a quorum with a leader."""
        return None if self.serving else f"not serving clients ({self.role.name.lower()})"

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        host, port = parse_address(self.settings.members[self.id].peer)
        await self.peers.start(host, port)
        self._tick_task = asyncio.create_task(self._ticker())
        self._process()

    async def stop(self) -> None:
        if self._tick_task is not None:
            self._tick_task.cancel()
        await self.peers.close()
        self._disk.shutdown(wait=True)
        self.data_dir.close()

    async def _ticker(self) -> None:
        interval = self.settings.tick_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self._tick()
            except Exception:
                log.exception("member %d: tick failed", self.id)

    def _tick(self) -> None:
        if self._heard:
            if self.read_only:
                self._touch_local(self._heard)
            elif self.role == ServerState.LEADING:
                self._touch(self._heard)
            else:
                self.node.report_sessions(self._heard)
            self._heard = set()
        self.node.tick()
        if self.role == ServerState.LEADING and self.serving:
            self._expire_sessions()
            self._ticks += 1
            if self._ticks % _CONTAINER_CHECK_TICKS == 0:
                self._delete_empty_containers()
        self._process()
        self._read_only_tick(time.monotonic())

    # ------------------------------------------------------------------ peers

    def _on_peer_message(self, message: Message) -> None:
        if isinstance(message, PingAck) and message.sessions and self.role == ServerState.LEADING:
            self._touch(message.sessions)
        self.node.step(message)
        self._process_soon()

    def _on_link(self, peer: int) -> None:
        self.node.link_reset(peer)
        self._process_soon()

    # ------------------------------------------------------------------ client writes

    def submit(self, session: Session, request: Write, waiter: Waiter) -> None:
        """Send a write on its way; ``waiter`` is called once with its outcome."""
        self._heard.add(session.session_id)
        write = _Write(encode_write(session, request), session, request, waiter, time.monotonic())
        if self._backlog or len(self._writes) + len(self._by_zxid) >= _LOCAL_IN_FLIGHT:
            self._backlog.append(write)
            return
        self._propose(write)
        self._process_soon()

    def _propose(self, write: _Write) -> None:
        self._proposing = write  # _prepare, if the leader is us, need not decode the payload
        try:
            result = self.node.propose(write.payload)
        finally:
            self._proposing = None
        if isinstance(result, Accepted):
            if result.zxid is not None:
                self._by_zxid[result.zxid] = write
            else:
                self._writes[result.request_id] = write
            self.metrics.proposals.inc()
        else:
            # Not serving writes (no leader, or not yet established): the client retries.
            write.waiter(0, None)

    def heard_from(self, session_id: int) -> None:
        self._heard.add(session_id)

    def new_session_id(self) -> int:
        self._session_counter += 1
        return self._session_base + self._session_counter

    def session_password(self, session_id: int) -> bytes:
        secret = self.settings.session_secret.encode()
        return hmac.new(
            secret, session_id.to_bytes(8, "big", signed=True), hashlib.sha256
        ).digest()[:16]

    # ------------------------------------------------------------------ read-only mode

    def _read_only_tick(self, now: float) -> None:
        """Start serving read-only clients once the member has looked for a leader for the
        grace period (ZooKeeper: max(2 s, tickTime)); while read-only, expire silent
        read-only sessions."""
        if self.read_only:
            for sid, deadline in list(self._local_deadlines.items()):
                if deadline <= now:
                    log.info("member %d: read-only session %#x expired", self.id, sid)
                    self.close_local_session(sid)
                    if self.clients is not None:
                        self.clients.session_closed(sid)
            return
        grace = max(READ_ONLY_GRACE, self.settings.tick_ms / 1000)
        if (
            self.settings.read_only_mode
            and self.role == ServerState.LOOKING
            and now - self._looking_since >= grace
        ):
            self.read_only = True
            log.info("member %d: no quorum for %.1f s: serving read-only clients", self.id, grace)

    def _stop_read_only(self) -> None:
        """A leader was found: drop the read-only sessions and their connections, so their
        clients look for a read-write member (ZooKeeper closes every connection)."""
        log.info("member %d: found a leader: closing the read-only sessions", self.id)
        self.read_only = False
        self.local_sessions.clear()
        self._local_deadlines.clear()
        if self.clients is not None:
            self.clients.disconnect_all()

    @property
    def local_sessions(self) -> dict[int, int]:
        """The read-only sessions: id -> timeout (ms); the tree lets them watch."""
        return self.tree.local_sessions

    def open_local_session(self, timeout: int) -> int:
        """A new read-only session: known to this member only (a ZooKeeper local session),
        never to the quorum; it lasts until it is silent for ``timeout`` ms, is closed, or
        the member finds a leader."""
        assert self.read_only
        sid = self.new_session_id()
        self.local_sessions[sid] = timeout
        self._local_deadlines[sid] = time.monotonic() + timeout / 1000
        return sid

    def close_local_session(self, session_id: int) -> None:
        self.local_sessions.pop(session_id, None)
        self._local_deadlines.pop(session_id, None)

    def _touch_local(self, sessions: set[int]) -> None:
        now = time.monotonic()
        for sid in sessions:
            timeout = self.local_sessions.get(sid)
            if timeout is not None:
                self._local_deadlines[sid] = now + timeout / 1000

    # ------------------------------------------------------------------ leader side

    def _prepare(self, zxid: int, payload: bytes) -> bytes:
        local = self._proposing
        if local is not None and local.payload is payload:
            session, request = local.session, local.request
        else:
            session, request = decode_write(payload)
        now_ms = int(time.time() * 1000)
        body: LoggedBody
        if isinstance(request, Reconfig):
            body = self._prepare_reconfig(request, session, zxid)
        elif isinstance(request, SyncRequest):
            body = SyncTxn(request.path)
            self.pending_syncs += 1
        else:
            prepared = self.preparer.prepare(request, session, zxid, now_ms)
            if isinstance(prepared, Rejected):
                body = ErrorTxn(prepared.code, prepared.op_codes)
            else:
                body = prepared.body
        logged = Logged(now_ms, session.session_id, body)
        self._prepared[zxid] = logged
        data = encode_logged(logged)
        self._zk.proposal_size.update(len(data))
        return data

    def _prepare_reconfig(
        self, request: Reconfig, session: Session, zxid: int
    ) -> ReconfigTxn | ErrorTxn:
        """ZooKeeper's checks, in its order: the feature on, no reconfig pending, the
        version asked for, a well-formed result with two voters or more, a synced quorum
        of them (NEWCONFIGNOQUORUM), then the right to write /zookeeper/config (super
        users only). A refusal changes nothing."""

        def refuse(code: ErrorCode, why: str) -> ErrorTxn:
            log.warning("member %d: reconfig refused (%s): %s", self.id, code.name, why)
            return ErrorTxn(code)

        node = self.node
        if not self.settings.reconfig_enabled:
            return refuse(ErrorCode.RECONFIGDISABLED, "reconfig_enabled is off")
        active = self._configs.get(node.config.version)
        if node.pending_config is not None or active is None:
            return refuse(ErrorCode.RECONFIGINPROGRESS, "a configuration is not yet active")
        if request.cur_config_id not in (-1, active.version):
            return refuse(
                ErrorCode.BADVERSION,
                f"from version {request.cur_config_id:#x}, the active one is {active.version:#x}",
            )
        try:
            members = next_members(active, request.joining, request.leaving, request.new_members)
        except (ConfigFormatError, ValueError) as exc:
            return refuse(ErrorCode.BADARGUMENTS, str(exc))
        config = DynamicConfig(zxid, members)
        if len(config.voters) < 2:
            return refuse(ErrorCode.BADARGUMENTS, "a configuration needs two voters or more")
        if set(config.voters) & set(node.config.observers):
            # It acks nothing as an observer: it must leave, then join as a participant.
            return refuse(ErrorCode.BADARGUMENTS, "an observer cannot become a voter at once")
        if not node.synced_quorum(config.voters):
            return refuse(ErrorCode.NEWCONFIGNOQUORUM, "no synced quorum of the new voters")
        if SUPER not in session.auth:
            return refuse(ErrorCode.NOAUTH, f"session {session.session_id:#x} is no super user")
        return ReconfigTxn(config.text())

    def is_super(self, ident: Id) -> bool:
        """Does a session's digest auth ``ident`` match the configured super digest?"""
        secret = self.settings.super_digest
        return secret is not None and ident == Id("digest", secret.get_secret_value())

    def _config_of(self, payload: bytes) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """For the core: the (voters, observers) a log entry proposes, if it is a reconfig."""
        text = reconfig_of(payload)
        if text is None:
            return None
        config = parse_config(text)  # the leader wrote it: well-formed
        self._configs[config.version] = config
        return config.voters, config.observers

    def _config_changed(self, membership: Membership) -> None:
        """The core made ``membership`` active. Its addresses come with the reconfig's
        text; a member that adopted it from a peer before that text arrived links to the
        members it knows and completes the change when the entry is applied."""
        known = self._configs.get(membership.version)
        if known is not None:
            self._use_config(known)
            return
        log.info(
            "member %d: configuration %#x active, its addresses still to come",
            self.id,
            membership.version,
        )
        ids = set(membership.voters) | set(membership.observers)
        kept = {i: m for i, m in self.dynamic.members.items() if i in ids}
        self.peers.set_peers(_peer_addresses(DynamicConfig(membership.version, kept), self.id))

    def _use_config(self, config: DynamicConfig) -> None:
        if config.version <= self.dynamic.version:
            return
        log.info(
            "member %d: configuration %#x active: %s",
            self.id,
            config.version,
            config.text().replace("\n", ", "),
        )
        self.dynamic = config
        # Older configurations can never be active again: forget them.
        self._configs = {v: c for v, c in self._configs.items() if v >= config.version}
        self._config_times = {v: t for v, t in self._config_times.items() if v >= config.version}
        # Rare and small: written on the loop, durably, before anyone hears of it.
        dynamic_config.save(self.settings.member_dir(self.id), config)
        self.peers.set_peers(_peer_addresses(config, self.id))
        events: list[WatchEvent] = []
        self.tree.watches.trigger(CONFIG_NODE, EventType.NODE_DATA_CHANGED, events)
        if self.clients is not None:
            for event in events:
                self.clients.deliver(event)

    def config_node(self) -> tuple[bytes, Stat]:
        """/zookeeper/config: the active configuration, as getConfig reads it."""
        data = self.dynamic.text().encode()
        return data, self.config_stat(self.dynamic.version, len(data))

    def config_stat(self, version: int, length: int) -> Stat:
        """ZooKeeper's Stat of /zookeeper/config: a reconfig is a setData with version -1
        at its zxid, so the node's version reads -1 after the first one."""
        mtime = self._config_times.get(version, 0)
        return Stat(0, version, 0, mtime, -1 if version else 0, 0, 0, 0, length, 0, 0)

    def _touch(self, sessions: set[int] | tuple[int, ...]) -> None:
        now = time.monotonic()
        for sid in sessions:
            timeout = self.tree.sessions.get(sid)
            if timeout is not None:
                self._deadlines[sid] = now + timeout / 1000

    def _expire_sessions(self) -> None:
        now = time.monotonic()
        for sid, deadline in list(self._deadlines.items()):
            if deadline <= now and sid not in self._expiring:
                self._expiring.add(sid)
                log.info("member %d: session %#x expired", self.id, sid)
                self.submit(Session(sid), CloseSession(), self._expired(sid))

    def _delete_empty_containers(self) -> None:
        """ZooKeeper's ContainerManager: the leader deletes containers whose last child
        went away, through the quorum (the delete re-checks that they are still empty)."""
        for path in self.tree.containers_to_delete():
            if path not in self._deleting:
                self._deleting.add(path)
                self.submit(Session(0), DeleteContainer(path), self._container_done(path))

    def _container_done(self, path: str) -> Waiter:
        def done(zxid: int, outcome: Outcome) -> None:
            self._deleting.discard(path)

        return done

    def _expired(self, sid: int) -> Waiter:
        def done(zxid: int, outcome: Outcome) -> None:
            self._expiring.discard(sid)

        return done

    # ------------------------------------------------------------------ the Ready loop

    def _process_soon(self) -> None:
        """Carry out the core's actions once this event-loop turn is over, so that every
        message of one read and every request of one client packet share one Ready: one
        disk write, one frame per peer per message, one Commit per peer."""
        self._unprocessed += 1
        if self._unprocessed >= _MAX_BATCH:
            self._process()  # keep a long burst flowing to the peers and the disk
        elif not self._process_scheduled:
            self._process_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._process)

    def _process(self) -> None:
        self._process_scheduled = False
        self._unprocessed = 0
        while self.node.has_ready():
            ready = self.node.ready()
            self.node.advance()
            self._carry_out(ready)
        if self._synced_inline:
            # A lone write's ACK goes out now, not after the reads this sync held back.
            self._synced_inline = False
            self.peers.flush()
        self._busy_poll.touch()

    def _carry_out(self, ready: Ready) -> None:
        if ready.hard_state is not None or ready.truncate_to is not None or ready.snapshot:
            self._drain_disk()
            if ready.hard_state is not None:
                self.data_dir.save_hard_state(ready.hard_state)
            if ready.truncate_to is not None:
                self._unwritten = [e for e in self._unwritten if e.zxid <= ready.truncate_to]
                self.data_dir.truncate_to(ready.truncate_to)
                self._durable_zxid = min(self._durable_zxid, ready.truncate_to)
            if ready.snapshot is not None:
                self._install(ready.snapshot)
        self._unwritten.extend(ready.entries)
        frames: dict[int, bytes] = {}  # id(message) -> frame: a broadcast is encoded once
        for peer, message in ready.messages:
            frame = frames.get(id(message))
            if frame is None:
                frame = frames[id(message)] = encode(message)
            self.peers.send_frame(peer, frame)
        for result in ready.results:
            if isinstance(result, Proposed):
                write = self._writes.pop(result.request_id, None)
                if write is not None:
                    self._by_zxid[result.zxid] = write
            elif not isinstance(result, Committed):  # Unknown, or Rejected by the leader
                write = self._writes.pop(result.request_id, None)
                if write is not None:
                    write.waiter(0, None)
        for entry in ready.committed:
            self._apply(entry)
        if ready.config is not None:
            self._config_changed(ready.config)
        if ready.committed:
            self.metrics.commits.inc(len(ready.committed))
            if self.serving:  # not the entries a new leadership starts from
                if self.role == ServerState.LEADING:
                    self._zk.commit_count += len(ready.committed)
                else:
                    self._zk.learner_commits += len(ready.committed)
        for change in ready.role_changes:
            self._role_changed(change)
        self._write_soon()  # after the messages: peers store the entries while we do
        self._maybe_snapshot()
        while self._backlog and len(self._writes) + len(self._by_zxid) < _LOCAL_IN_FLIGHT:
            if not self.serving:
                for write in self._backlog:
                    write.waiter(0, None)
                self._backlog.clear()
                break
            self._propose(self._backlog.popleft())

    def _apply(self, entry: LogEntry) -> None:
        logged = self._prepared.pop(entry.zxid, None)
        if logged is None:
            logged = decode_logged(entry.payload)
        elif isinstance(logged.body, SyncTxn):
            self.pending_syncs -= 1
        body = logged.body
        outcome: Outcome
        if isinstance(body, ReconfigTxn):
            outcome = body
            config = self._configs.setdefault(entry.zxid, parse_config(body.config))
            self._config_times[entry.zxid] = logged.time_ms
            if self.node.config.version == entry.zxid:
                self._use_config(config)  # active before its text was known here
        elif isinstance(body, SyncTxn | ErrorTxn):
            outcome = body
        else:
            applied = self.tree.apply(logged.txn(entry.zxid))
            outcome = applied
            if isinstance(body, CreateSessionTxn) and self.role == ServerState.LEADING:
                self._touch((logged.session_id,))
            elif isinstance(body, CloseSessionTxn):
                self._deadlines.pop(logged.session_id, None)
                if self.clients is not None:
                    self.clients.session_closed(logged.session_id)
            if self.clients is not None:
                for event in applied.events:
                    self.clients.deliver(event)
        self.applied_zxid = entry.zxid
        self._since_snap += 1
        write = self._by_zxid.pop(entry.zxid, None)
        if write is not None:
            self.metrics.commit_latency.observe(time.monotonic() - write.started)
            write.waiter(entry.zxid, outcome)

    def _role_changed(self, change: RoleChange) -> None:
        now = time.monotonic()
        self.metrics.role_changed(change.role, change.established, now)
        was_serving = self.serving
        if change.role == ServerState.LOOKING and self.role != ServerState.LOOKING:
            self._looking_since = now
        elif change.role != ServerState.LOOKING and self.read_only:
            self._stop_read_only()
        self.role = change.role
        self.serving = change.established
        self.preparer = Preparer(self.tree)
        self._prepared.clear()
        self.pending_syncs = 0
        self._deadlines.clear()
        self._expiring.clear()
        if change.role == ServerState.LEADING and change.established:
            for sid, timeout in self.tree.sessions.items():
                self._deadlines[sid] = now + timeout / 1000
        if was_serving and not self.serving:
            log.info("member %d: stopped serving (%s)", self.id, change.role.value)
            for write in [*self._writes.values(), *self._by_zxid.values(), *self._backlog]:
                write.waiter(0, None)
            self._writes.clear()
            self._by_zxid.clear()
            self._backlog.clear()
            if self.clients is not None:
                self.clients.disconnect_all()
        elif self.serving and not was_serving:
            log.info(
                "member %d: serving as %s of epoch %d", self.id, change.role.value, change.epoch
            )

    # ------------------------------------------------------------------ disk

    def _write_soon(self) -> None:
        """Group commit: write what the core appended unless a write is under way (its
        completion writes the rest). A small batch with the worker idle is written here:
        a fsync of a few records is cheaper than the two thread hand-offs around it,
        and that is the latency of a lone write. Bigger ones go to the worker so the
        loop keeps serving meanwhile."""
        if self._disk_job is not None or not self._unwritten:
            return
        batch, self._unwritten = self._unwritten, []
        if len(batch) <= _INLINE_SYNC_ENTRIES and not self._disk_jobs:
            self.peers.flush()  # let the followers start on the same entries first
            zxid = self._append_and_sync(batch)
            self._durable_zxid = max(self._durable_zxid, zxid)
            self.node.persisted(zxid)  # _process picks up what this makes ready
            self._synced_inline = True
            return
        job = self._submit(self._append_and_sync, batch)
        self._disk_job = job
        assert self._loop is not None
        loop = self._loop
        job.add_done_callback(lambda f: loop.call_soon_threadsafe(self._written, f))

    def _submit(self, fn: Callable[..., int | None], *args: object) -> Future[Any]:
        """Run ``fn`` on the disk worker; counted so the loop never touches the data
        directory while a job might."""
        self._disk_jobs += 1
        job = self._disk.submit(fn, *args)
        assert self._loop is not None
        loop = self._loop
        job.add_done_callback(lambda f: loop.call_soon_threadsafe(self._job_done))
        return job

    def _job_done(self) -> None:
        self._disk_jobs -= 1
        self._write_soon()
        self._process()

    def _append_and_sync(self, batch: list[LogEntry]) -> int:
        started = time.monotonic()
        self.data_dir.append(batch)
        zxid = self.data_dir.sync()
        ended = time.monotonic()
        self.metrics.log_synced(ended - started, ended)
        return zxid

    def _written(self, job: Future[int]) -> None:
        if job is not self._disk_job:
            return  # drained synchronously already
        self._disk_job = None
        zxid = job.result()  # a failed log write or fsync is fatal: raise
        self._durable_zxid = max(self._durable_zxid, zxid)
        self.node.persisted(zxid)
        self._write_soon()
        self._process()

    def _drain_disk(self) -> None:
        """Wait for the disk worker and report what it wrote, before a durable step."""
        self._disk.submit(lambda: None).result()  # one worker: every earlier job is done
        job = self._disk_job
        if job is not None:
            self._disk_job = None
            zxid = job.result()
            self._durable_zxid = max(self._durable_zxid, zxid)
            self.node.persisted(zxid)

    def _install(self, snapshot: Snapshot) -> None:
        started = time.monotonic()
        self.data_dir.save_snapshot(snapshot.zxid, snapshot.data)
        ended = time.monotonic()
        self._zk.snapshottime.observe((ended - started) * 1000, ended)
        self.tree = _tree(snapshot)
        self.preparer = Preparer(self.tree)
        self.applied_zxid = snapshot.zxid
        self._durable_zxid = snapshot.zxid
        self._since_snap = 0
        log.info("member %d: installed the leader's snapshot at %#x", self.id, snapshot.zxid)

    def _maybe_snapshot(self) -> None:
        """Every ``snap_count`` applied transactions, snapshot the tree and compact."""
        if self._since_snap < self.settings.snap_count:
            return
        zxid = self.applied_zxid
        if zxid > self._durable_zxid or zxid <= self.node.snapshot.zxid:
            return
        started = time.monotonic()
        snapshot = Snapshot(zxid, self.tree.snapshot())
        encoding = time.monotonic() - started
        self.node.compact(snapshot)
        self._since_snap = 0
        keep = self.settings.snap_retain_count
        self._submit(self._save_snapshot, snapshot, keep, encoding)

    def _save_snapshot(self, snapshot: Snapshot, keep: int, encoding: float) -> None:
        started = time.monotonic()
        self.data_dir.save_snapshot(snapshot.zxid, snapshot.data)
        ended = time.monotonic()
        self._zk.snapshottime.observe((encoding + ended - started) * 1000, ended)
        self.data_dir.purge(keep)

    # ------------------------------------------------------------------ status

    @property
    def mode(self) -> str:
        if self.read_only:
            return "read-only"  # ZooKeeper's ReadOnlyZooKeeperServer.getState()
        if not self.serving:
            return "looking"
        if len(self.settings.members) == 1:
            return "standalone"
        return _MODES[self.role]

    @property
    def phase(self) -> Phase:
        return self.node.phase

    @property
    def outstanding(self) -> int:
        return len(self._writes) + len(self._by_zxid) + len(self._backlog)


def _peer_addresses(config: DynamicConfig, member_id: int) -> dict[int, tuple[str, int]]:
    return {i: parse_address(m.peer) for i, m in config.members.items() if i != member_id}


def _tree(snapshot: Snapshot) -> DataTree:
    return DataTree.from_snapshot(snapshot.data) if snapshot.data else DataTree()
