"""A deterministic simulator for the ZAB core: one seed drives network, disks and faults.

The network models TCP: per link (unordered pair of nodes) messages are delivered in FIFO
order with random delays, so reordering happens only across links. Any loss (a random drop,
a partition, a crashed peer) breaks the link: everything in flight is discarded, later sends
on it are discarded too, and after a random delay both ends get ``link_reset`` and a fresh
connection starts. Disks write appends in order after a random delay; a crash loses what
was not yet written, keeping the hard state, the snapshot and the durable log. Nodes compact
at random: the state machine's image (the applied zxids) becomes the snapshot and the log
before it is dropped, so SNAP syncs carry real snapshots.

With ``reconfig_prob`` the leader now and then proposes a new configuration (an entry whose
payload names voters and observers among every node, ``spares`` included: those start
outside the configuration, from a stale one); each node keeps the configuration it made
active on its disk, as the driver does, and starts from it.

Checks run as the simulation goes: at most one established leader per epoch; every node's
applied sequence (per incarnation, from the start of the log) is a prefix of one common
history with strictly increasing zxids; every write reported committed to a client is in
that history with the same payload; a configuration version names one membership on every
node. ``finish()`` heals everything and demands that the ensemble converges with every
committed write applied on every node, and every node in one configuration.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

from services.consensus.zab import (
    EMPTY_SNAPSHOT,
    Accepted,
    Committed,
    HardState,
    LogEntry,
    Membership,
    Message,
    Node,
    PersistedState,
    Phase,
    ProposeResult,
    QuorumMode,
    ServerState,
    Snapshot,
    zxid_epoch,
)
from services.consensus.zab.messages import Ack

Link = tuple[int, int]


def _link(a: int, b: int) -> Link:
    return (a, b) if a < b else (b, a)


@dataclass
class SimConfig:
    nodes: int = 3  # voters, ids 1..nodes
    observers: int = 0  # ids after the voters'
    spares: int = 0  # ids after the observers': outside the starting configuration
    quorum: QuorumMode = "majority"
    ticks: int = 1000
    election_ticks: int = 10
    heartbeat_ticks: int = 3
    max_delay: int = 3
    disk_delay: int = 2
    drop_prob: float = 0.002
    crash_prob: float = 0.004
    restart_prob: float = 0.05
    partition_prob: float = 0.003
    heal_prob: float = 0.03
    propose_prob: float = 0.3
    diff_window: int = 1000
    max_in_flight: int = 64
    compact_prob: float = 0.0  # per tick: one live node snapshots its applied state
    reconfig_prob: float = 0.0  # per tick: the leader proposes a new configuration


# No faults and no client writes of its own: a test drives every event it cares about.
CALM = SimConfig(
    drop_prob=0.0,
    crash_prob=0.0,
    restart_prob=0.0,
    partition_prob=0.0,
    heal_prob=0.0,
    propose_prob=0.0,
)


CONFIG_PREFIX = b"config:"


def config_payload(voters: list[int], observers: list[int]) -> bytes:
    text = ",".join(map(str, voters)) + "|" + ",".join(map(str, observers))
    return CONFIG_PREFIX + text.encode()


def config_of(payload: bytes) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    if not payload.startswith(CONFIG_PREFIX):
        return None
    voters, observers = payload[len(CONFIG_PREFIX) :].decode().split("|")
    return (
        tuple(int(v) for v in voters.split(",") if v),
        tuple(int(o) for o in observers.split(",") if o),
    )


@dataclass
class Disk:
    hard_state: HardState = field(default_factory=HardState)
    log: list[LogEntry] = field(default_factory=list)
    pending: list[tuple[int, LogEntry]] = field(default_factory=list)  # (ready_at, entry)
    snap: Snapshot = EMPTY_SNAPSHOT
    config: Membership = field(default_factory=lambda: Membership(0, (1,)))  # Simulation sets it

    def snapshot(self) -> PersistedState:
        return PersistedState(self.hard_state, tuple(self.log), self.snap)


@dataclass(frozen=True, slots=True)
class _Delivery:
    src: int
    dst: int
    gen: int  # connection generation the message was sent on
    message: Message


@dataclass(frozen=True, slots=True)
class _Reset:
    link: Link


class InvariantViolation(AssertionError):
    pass


class Simulation:
    def __init__(
        self,
        seed: int,
        config: SimConfig,
        initial: dict[int, PersistedState] | None = None,
    ) -> None:
        self.seed = seed
        self.cfg = config
        self.rng = random.Random(seed)
        self.voters = list(range(1, config.nodes + 1))
        self.observers = list(range(config.nodes + 1, config.nodes + config.observers + 1))
        last = config.nodes + config.observers
        self.spares = list(range(last + 1, last + config.spares + 1))
        self.ids = self.voters + self.observers + self.spares
        static = Membership(0, tuple(self.voters), tuple(self.observers))
        self.disks = {i: Disk(config=static) for i in self.ids}
        for i, state in (initial or {}).items():
            self.disks[i] = Disk(state.hard_state, list(state.log), snap=state.snapshot)
            self.disks[i].config = static
        self.configs: dict[int, Membership] = {}  # version -> membership, as activated
        self.nodes: dict[int, Node | None] = {}
        self.now = 0
        self._seq = 0
        # Events: (time, seq, event); seq makes the order total and deterministic.
        self._events: list[tuple[int, int, _Delivery | _Reset]] = []
        self._gen: dict[Link, int] = {}
        self._broken: set[Link] = set()
        self._last_delivery: dict[tuple[int, int], int] = {}
        self._partitioned: set[Link] = set()
        self.faults = True
        self.clients = True
        # Checks.
        self.history: list[LogEntry] = []
        self._history_by_zxid: dict[int, bytes] = {}
        self.applied: dict[int, list[LogEntry]] = {i: [] for i in self.ids}
        self.leaders: dict[int, int] = {}
        self.acknowledged: dict[int, bytes] = {}  # zxid -> payload reported committed
        self._requests: dict[tuple[int, int, int], bytes] = {}
        self._incarnation = dict.fromkeys(self.ids, 0)
        self._payloads = 0
        self.stats = {
            "commits": 0,
            "crashes": 0,
            "resets": 0,
            "elections": 0,
            "snaps": 0,
            "inferred": 0,  # a follower's commit point moved on the leader's own Ack
        }
        for i in self.ids:
            self._start(i)

    # ---------------------------------------------------------------- failure reporting

    def fail(self, what: str) -> NoReturn:
        raise InvariantViolation(f"seed={self.seed} t={self.now}: {what}")

    # ---------------------------------------------------------------- nodes

    def _start(self, i: int) -> None:
        self._incarnation[i] += 1
        self.applied[i] = self._image(i, self.disks[i].snap)
        disk = self.disks[i]
        node = Node(
            i,
            disk.config.voters,
            observers=disk.config.observers,
            config_version=disk.config.version,
            config_of=config_of,
            quorum=self.cfg.quorum,
            election_ticks=self.cfg.election_ticks,
            heartbeat_ticks=self.cfg.heartbeat_ticks,
            persisted_state=self.disks[i].snapshot(),
            diff_window=self.cfg.diff_window,
            max_in_flight=self.cfg.max_in_flight,
        )
        self.nodes[i] = node
        self._drain(i)

    def restart(self, i: int) -> None:
        assert self.nodes[i] is None, f"node {i} is up"
        self._start(i)

    def crash(self, i: int) -> None:
        self.nodes[i] = None
        self.disks[i].pending.clear()
        self.stats["crashes"] += 1
        for j in self.ids:
            if j != i:
                self._break(_link(i, j))

    def _drain(self, i: int) -> None:
        node = self.nodes[i]
        assert node is not None
        rd = node.ready()
        disk = self.disks[i]
        if rd.hard_state is not None:
            disk.hard_state = rd.hard_state
        if rd.truncate_to is not None:
            t = rd.truncate_to
            disk.log = [e for e in disk.log if e.zxid <= t]
            disk.pending = [(at, e) for at, e in disk.pending if e.zxid <= t]
        if rd.config is not None:
            seen = self.configs.setdefault(rd.config.version, rd.config)
            if seen != rd.config:
                self.fail(f"node {i} made {rd.config} active, another node {seen}")
            if rd.config.version < disk.config.version:
                self.fail(f"node {i} went back from {disk.config} to {rd.config}")
            disk.config = rd.config
        if rd.snapshot is not None:
            disk.snap = rd.snapshot
            self.applied[i] = self._image(i, rd.snapshot)
            self.stats["snaps"] += 1
        if rd.entries:
            at = self.now + self.rng.randint(0, self.cfg.disk_delay)
            if disk.pending:
                at = max(at, disk.pending[-1][0])
            disk.pending.extend((at, e) for e in rd.entries)
        for to, message in rd.messages:
            self._send(i, to, message)
        for entry in rd.committed:
            self._apply(i, entry)
        for result in rd.results:
            if isinstance(result, Committed):
                key = (i, self._incarnation[i], result.request_id)
                payload = self._requests.get(key)
                if payload is None:
                    self.fail(f"node {i} reported an unknown request {result}")
                if self._history_payload(result.zxid) != payload:
                    self.fail(f"node {i} reported {result} but history differs")
                self.acknowledged[result.zxid] = payload
        for rc in rd.role_changes:
            if rc.role == ServerState.LEADING and rc.established:
                self.stats["elections"] += 1
                other = self.leaders.setdefault(rc.epoch, i)
                if other != i:
                    self.fail(f"two leaders for epoch {rc.epoch}: {other} and {i}")
        node.advance()

    def _image(self, i: int, snap: Snapshot) -> list[LogEntry]:
        """The applied sequence a snapshot stands for; it must be a prefix of history."""
        zxids = [int(z, 16) for z in snap.data.decode().split(",")] if snap.data else []
        if (zxids[-1] if zxids else 0) != snap.zxid:
            self.fail(f"node {i} got snapshot {snap.zxid:#x} whose image ends elsewhere")
        if [e.zxid for e in self.history[: len(zxids)]] != zxids:
            self.fail(f"node {i} got snapshot {snap.zxid:#x} that is not a prefix of history")
        return self.history[: len(zxids)]

    def compact(self, i: int) -> None:
        node = self.node(i)
        disk = self.disks[i]
        applied = self.applied[i]
        durable = {e.zxid for e in disk.log}
        if not applied or applied[-1].zxid <= node.snapshot.zxid:
            return
        if applied[-1].zxid not in durable:
            return
        snap = Snapshot(applied[-1].zxid, ",".join(f"{e.zxid:x}" for e in applied).encode())
        node.compact(snap)
        disk.snap = snap
        disk.log = [e for e in disk.log if e.zxid > snap.zxid]

    def _history_payload(self, zxid: int) -> bytes | None:
        return self._history_by_zxid.get(zxid)

    def _apply(self, i: int, entry: LogEntry) -> None:
        seq = self.applied[i]
        if seq and entry.zxid <= seq[-1].zxid:
            self.fail(f"node {i} applied zxid {entry.zxid:#x} after {seq[-1].zxid:#x}")
        k = len(seq)
        if k < len(self.history):
            if self.history[k] != entry:
                self.fail(f"node {i} applied {entry} at {k}, history has {self.history[k]}")
        else:
            self.history.append(entry)
            self._history_by_zxid[entry.zxid] = entry.payload
            self.stats["commits"] += 1
        seq.append(entry)

    # ---------------------------------------------------------------- network

    def _push(self, at: int, event: _Delivery | _Reset) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, event))

    def _break(self, link: Link) -> None:
        if link in self._broken:
            return
        self._broken.add(link)
        self._push(self.now + self.rng.randint(1, self.cfg.max_delay + 1), _Reset(link))

    def _send(self, src: int, dst: int, message: Message) -> None:
        link = _link(src, dst)
        if link in self._broken:
            return
        dropped = self.faults and self.rng.random() < self.cfg.drop_prob
        if self.nodes.get(dst) is None or link in self._partitioned or dropped:
            self._break(link)
            return
        at = self.now + self.rng.randint(0, self.cfg.max_delay)
        at = max(at, self._last_delivery.get((src, dst), 0))
        self._last_delivery[(src, dst)] = at
        self._push(at, _Delivery(src, dst, self._gen.get(link, 0), message))

    def _deliver_due(self) -> None:
        while self._events and self._events[0][0] <= self.now:
            _, _, event = heapq.heappop(self._events)
            if isinstance(event, _Reset):
                link = event.link
                a, b = link
                self._broken.discard(link)
                self._gen[link] = self._gen.get(link, 0) + 1
                self._last_delivery.pop((a, b), None)
                self._last_delivery.pop((b, a), None)
                self.stats["resets"] += 1
                for x, y in ((a, b), (b, a)):
                    node = self.nodes[x]
                    if node is not None:
                        node.link_reset(y)
                        self._drain(x)
                continue
            link = _link(event.src, event.dst)
            node = self.nodes[event.dst]
            if node is None or link in self._broken or self._gen.get(link, 0) != event.gen:
                continue
            before = node.commit_zxid
            node.step(event.message)
            following = node.role == ServerState.FOLLOWING
            if following and isinstance(event.message, Ack) and node.commit_zxid > before:
                self.stats["inferred"] += 1
            self._drain(event.dst)

    # ---------------------------------------------------------------- disks

    def _flush_disks(self) -> None:
        for i in self.ids:
            node = self.nodes[i]
            disk = self.disks[i]
            if node is None or not disk.pending:
                continue
            n = 0
            while n < len(disk.pending) and disk.pending[n][0] <= self.now:
                n += 1
            if n == 0:
                continue
            written = [e for _, e in disk.pending[:n]]
            del disk.pending[:n]
            disk.log.extend(written)
            node.persisted(written[-1].zxid)
            self._drain(i)

    # ---------------------------------------------------------------- faults and clients

    def _inject_faults(self) -> None:
        rng = self.rng
        cfg = self.cfg
        down = [i for i in self.ids if self.nodes[i] is None]
        voters_down = sum(1 for i in down if i in self.voters or i in self.spares)
        if rng.random() < cfg.crash_prob:
            # Past this many voters down, only observers crash (all of them may be down).
            up = [i for i in self.ids if self.nodes[i] is not None]
            if voters_down >= (cfg.nodes + 1) // 2:
                up = [i for i in up if i in self.observers]
            if up:
                self.crash(rng.choice(up))
        for i in down:
            if rng.random() < cfg.restart_prob:
                self._start(i)
        if not self._partitioned and rng.random() < cfg.partition_prob:
            side = set(rng.sample(self.ids, rng.randint(1, len(self.ids) // 2)))
            for a in self.ids:
                for b in self.ids:
                    if a < b and ((a in side) != (b in side)):
                        self._partitioned.add((a, b))
                        self._break((a, b))
        elif self._partitioned and rng.random() < cfg.heal_prob:
            self._partitioned.clear()
        if rng.random() < cfg.compact_prob:
            up = [i for i in self.ids if self.nodes[i] is not None]
            if up:
                self.compact(rng.choice(up))

    def _reconfigure(self) -> None:
        """The leader proposes a random configuration, as a driver would: only with no
        configuration pending, a synced quorum of the new voters (NewConfigNoQuorum), and
        no observer made a voter at once (it must leave first: it acks nothing)."""
        rng = self.rng
        # No draw without reconfiguration: seeds of the other runs replay as they did.
        if not self.cfg.reconfig_prob or rng.random() >= self.cfg.reconfig_prob:
            return
        leaders = [
            n for n in self.nodes.values() if n is not None and n.role == ServerState.LEADING
        ]
        if len(leaders) != 1 or leaders[0].pending_config is not None:
            return
        lead = leaders[0]
        ids = list(self.ids)
        rng.shuffle(ids)
        voters = sorted(ids[: rng.randint(2, len(ids))])
        observers = sorted(i for i in ids if i not in voters and rng.random() < 0.5)
        if set(voters) & set(lead.config.observers) or not lead.synced_quorum(voters):
            return
        self.reconfigure(lead.id, voters, observers)

    def reconfigure(self, i: int, voters: list[int], observers: list[int]) -> ProposeResult:
        """Node ``i`` proposes a configuration (as the leader would after its checks)."""
        node = self.node(i)
        payload = config_payload(voters, observers)
        result = node.propose(payload)
        if isinstance(result, Accepted):
            self._requests[(i, self._incarnation[i], result.request_id)] = payload
        self._drain(i)
        return result

    def _client(self) -> None:
        if self.rng.random() >= self.cfg.propose_prob:
            return
        up = [i for i in self.ids if self.nodes[i] is not None]
        if not up:
            return
        leaders = [i for i in up if self.nodes[i].role == ServerState.LEADING]  # type: ignore[union-attr]
        pick = leaders if leaders and self.rng.random() < 0.8 else up
        self.propose(self.rng.choice(pick))

    def propose(self, i: int) -> ProposeResult:
        node = self.nodes[i]
        assert node is not None
        self._payloads += 1
        payload = f"s{self.seed}-w{self._payloads}".encode()
        result = node.propose(payload)
        if isinstance(result, Accepted):
            self._requests[(i, self._incarnation[i], result.request_id)] = payload
        self._drain(i)
        return result

    # ---------------------------------------------------------------- driving

    def step(self) -> None:
        self.now += 1
        if self.faults:
            self._inject_faults()
        for i in self.ids:
            node = self.nodes[i]
            if node is not None:
                node.tick()
                self._drain(i)
        self._flush_disks()
        self._deliver_due()
        if self.clients:
            self._client()
            self._reconfigure()

    def run(self) -> None:
        for _ in range(self.cfg.ticks):
            self.step()

    def run_until(self, done: Callable[[], bool], max_ticks: int = 1000) -> None:
        for _ in range(max_ticks):
            if done():
                return
            self.step()
        self.fail(f"condition not reached within {max_ticks} ticks")

    def node(self, i: int) -> Node:
        node = self.nodes[i]
        assert node is not None, f"node {i} is down"
        return node

    def leader(self) -> int | None:
        """The established leader every node follows, if the ensemble has converged."""
        nodes = [n for n in self.nodes.values() if n is not None]
        leaders = [n for n in nodes if n.role == ServerState.LEADING]
        if len(nodes) != len(self.ids) or len(leaders) != 1:
            return None
        lead = leaders[0]
        if any(n.phase != Phase.BROADCAST or n.leader != lead.id for n in nodes):
            return None
        return lead.id

    def finish(self, max_ticks: int = 3000) -> None:
        """Heal everything, then require convergence: one leader, a last write applied
        everywhere, all nodes' applied sequences equal and holding every acknowledged
        write."""
        self.faults = False
        self.clients = False
        self._partitioned.clear()
        for i in self.ids:
            if self.nodes[i] is None:
                self._start(i)
        barrier_zxid: int | None = None
        deadline = self.now + max_ticks
        while self.now < deadline:
            self.step()
            lead = self.leader()
            if lead is None:
                continue
            # A link break still in flight from before the healing may cost the barrier's
            # leader its leadership and the barrier with it: then write another.
            if (
                barrier_zxid is not None
                and self.node(lead).epoch > zxid_epoch(barrier_zxid)
                and not any(e.zxid == barrier_zxid for e in self.history)
            ):
                barrier_zxid = None
            if barrier_zxid is None:
                result = self.propose(lead)
                if isinstance(result, Accepted):
                    barrier_zxid = result.zxid
                continue
            if all(self.applied[i] and self.applied[i][-1].zxid >= barrier_zxid for i in self.ids):
                break
        else:
            self.fail(f"no convergence within {max_ticks} ticks after healing")
        # Let forwarded writes still in flight settle; nothing new is proposed.
        for _ in range(5 * (self.cfg.max_delay + self.cfg.disk_delay + 1)):
            self.step()
        final = self.applied[self.ids[0]]
        for i in self.ids:
            if self.applied[i] != final:
                self.fail(f"node {i} applied a different sequence")
        configs = {i: self.node(i).config for i in self.ids}
        if len(set(configs.values())) != 1:
            self.fail(f"nodes ended in different configurations: {configs}")
        in_final = {e.zxid: e.payload for e in final}
        for zxid, payload in self.acknowledged.items():
            if in_final.get(zxid) != payload:
                self.fail(f"acknowledged write {zxid:#x} {payload!r} lost")


def run_seed(seed: int, config: SimConfig | None = None) -> Simulation:
    sim = Simulation(seed, config if config is not None else SimConfig())
    sim.run()
    sim.finish()
    return sim


def established(seed: int, config: SimConfig) -> tuple[Simulation, int]:
    """A simulation of `config` run until it has a leader; the leader's id."""
    sim = Simulation(seed, config)
    sim.run_until(lambda: sim.leader() is not None, max_ticks=300)
    lead = sim.leader()
    assert lead is not None
    return sim, lead
