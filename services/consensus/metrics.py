"""Prometheus metrics of a consensus member, served at http://<metrics address>/metrics.

Two sets of series. Our own, ``directlog_consensus_*``: counters and histograms move on the
write path; role, epoch, zxid and tree sizes are read from the member when Prometheus
scrapes. And ZooKeeper's, under the names, types and labels ZooKeeper 3.6-3.9 exports
through its Prometheus metrics provider (``metricsProvider.className=org.apache.zookeeper.
metrics.prometheus.PrometheusMetricsProvider``), so the common ZooKeeper dashboards (Grafana
10465, "ZooKeeper by Prometheus") and alert rules work unchanged: ``ZooKeeperCollector``,
listed in docs/consensus.md.

The scrape runs on the HTTP server's thread while the event loop (and, for fsync and
snapshot times, the disk worker) keeps changing what it reads. So the collector only reads
single attributes and ``len()``s, and copies a dict or deque in one C-level call
(``list(d.values())``) before walking it; writers are the loop, or the disk worker while
the loop does not write the same field.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from directlog.metrics import LATENCY_BUCKETS, Readiness, serve
from services.consensus.codes import OpCode
from services.consensus.zab import ServerState

if TYPE_CHECKING:
    from services.consensus.connections import ClientServer
    from services.consensus.member import Member

# A read-only member is looking for a leader too: 0, so "not serving" alerts still fire.
ROLE_CODES = {
    "looking": 0,
    "read-only": 0,
    "follower": 1,
    "leader": 2,
    "standalone": 3,
    "observer": 4,
}

# ZooKeeper's summaries (prometheus simpleclient 0.9): DetailLevel.BASIC has the median,
# ADVANCED also the 90th and 99th percentiles, each over the last 10 minutes.
BASIC = (0.5,)
ADVANCED = (0.5, 0.9, 0.99)
SUMMARY_MAX_AGE = 600.0  # seconds, simpleclient's default maxAgeSeconds
SUMMARY_WINDOW = 1024  # observations kept for quantiles, newest first


class ZkSummary:
    """One ZooKeeper summary: ``<name>_count`` and ``<name>_sum`` over every observation,
    ``<name>{quantile="q"}`` over the newest ``SUMMARY_WINDOW`` observations of the last
    ``SUMMARY_MAX_AGE`` seconds (NaN when there are none, as ZooKeeper's).

    ``observe`` is a few attribute updates and one append (callers pass the monotonic time
    they already read); sorting happens only at scrape time, on a copy."""

    __slots__ = ("_recent", "count", "doc", "name", "quantiles", "sum")

    def __init__(self, name: str, doc: str, quantiles: tuple[float, ...] = BASIC) -> None:
        assert quantiles and all(0.0 < q < 1.0 for q in quantiles), quantiles
        self.name = name
        self.doc = doc
        self.quantiles = quantiles
        self.count = 0
        self.sum = 0.0
        self._recent: deque[tuple[float, float]] = deque(maxlen=SUMMARY_WINDOW)

    def observe(self, value: float, now: float) -> None:
        self.count += 1
        self.sum += value
        self._recent.append((now, value))

    def quantile_values(self, now: float) -> list[float]:
        """Each of ``quantiles`` (nearest rank) over the recent window, or NaN."""
        cutoff = now - SUMMARY_MAX_AGE
        window = sorted(v for t, v in list(self._recent) if t >= cutoff)
        if not window:
            return [math.nan] * len(self.quantiles)
        n = len(window)
        return [window[max(0, math.ceil(q * n) - 1)] for q in self.quantiles]

    def family(self, now: float) -> Metric:
        count, total = self.count, self.sum
        metric = Metric(self.name, self.doc, "summary")
        for q, value in zip(self.quantiles, self.quantile_values(now), strict=True):
            metric.add_sample(self.name, {"quantile": str(q)}, value)
        metric.add_sample(f"{self.name}_count", {}, float(count))
        metric.add_sample(f"{self.name}_sum", {}, total)
        return metric


class BufferStats:
    """ZooKeeper's BufferStats: the last, smallest and largest of a size, -1 before any."""

    __slots__ = ("count", "last", "max", "min")

    def __init__(self) -> None:
        self.count = 0
        self.last = self.min = self.max = -1

    def update(self, size: int) -> None:
        self.count += 1
        self.last = size
        if self.min == -1 or size < self.min:
            self.min = size
        if size > self.max:
            self.max = size


class RequestLatency:
    """Client request latency, one observation per answered request feeding both of
    ZooKeeper's views: ServerStats' min/avg/max in ms since start (``srvr``, ``mntr`` and
    the ``min_latency``/``avg_latency``/``max_latency`` gauges) and the ``readlatency``
    and ``updatelatency`` summaries (writes, that is requests that become transactions,
    against everything else)."""

    __slots__ = ("count", "max", "min", "read", "total", "update")

    def __init__(self) -> None:
        self.min = self.max = self.total = 0.0
        self.count = 0
        self.read = ZkSummary(
            "readlatency",
            "Milliseconds from receiving a read (or ping) to answering it",
            ADVANCED,
        )
        self.update = ZkSummary(
            "updatelatency",
            "Milliseconds from receiving a write to answering it (its transaction applied)",
            ADVANCED,
        )

    def add(self, seconds: float, write: bool, now: float) -> None:
        ms = seconds * 1000
        if ms < self.min or self.count == 0:  # comparisons: cheaper than min()/max() calls
            self.min = ms
        if ms > self.max:
            self.max = ms
        self.total += ms
        self.count += 1
        (self.update if write else self.read).observe(ms, now)

    @property
    def avg(self) -> float:
        count = self.count
        return self.total / count if count else 0.0


class ZooKeeperStats:
    """What the member and its client port count for ZooKeeper's series (the client port's
    own counters live on ``ClientServer``). Plain fields, written by the event loop except
    where noted."""

    __slots__ = (
        "commit_count",
        "dbinittime",
        "election_time",
        "follower_sync_time",
        "fsynctime",
        "leader_since",
        "learner_commits",
        "looking_count",
        "looking_since",
        "proposal_size",
        "request_latency",
        "role_since",
        "snapshottime",
        "startup_txns_loaded",
        "sync_started",
    )

    def __init__(self) -> None:
        self.looking_count = 0
        self.commit_count = 0  # transactions this member committed as an established leader
        self.learner_commits = 0  # ... and as an established follower
        self.proposal_size = BufferStats()  # leader: every proposal's transaction bytes
        self.request_latency = RequestLatency()
        # Monotonic times: LOOKING began (None once a leader is chosen), the current role
        # was taken (elected), the leader was established, a follower began its sync.
        self.looking_since: float | None = None
        self.role_since: float | None = None
        self.leader_since: float | None = None
        self.sync_started: float | None = None
        self.fsynctime = ZkSummary(  # disk worker or loop, never both at once
            "fsynctime",
            "Milliseconds to write and fsync one group of transaction log records",
        )
        self.snapshottime = ZkSummary(  # disk worker
            "snapshottime", "Milliseconds to serialize and write one snapshot"
        )
        self.election_time = ZkSummary(
            "election_time", "Milliseconds from starting to look for a leader to choosing one"
        )
        self.follower_sync_time = ZkSummary(
            "follower_sync_time",
            "Milliseconds a follower took from choosing its leader to being in sync with it",
        )
        self.dbinittime = ZkSummary(
            "dbinittime", "Milliseconds to load the data directory at startup"
        )
        self.startup_txns_loaded = ZkSummary(
            "startup_txns_loaded", "Log transactions after the snapshot, loaded at startup"
        )

    def summaries(self) -> tuple[ZkSummary, ...]:
        lat = self.request_latency
        return (
            self.fsynctime,
            self.snapshottime,
            self.election_time,
            self.follower_sync_time,
            self.dbinittime,
            self.startup_txns_loaded,
            lat.read,
            lat.update,
        )


class ConsensusMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.zk = ZooKeeperStats()
        self.clients: ClientServer | None = None
        self.force_sync = True
        self.standalone = False
        r = self.registry
        self.proposals = Counter(
            "directlog_consensus_proposals",
            "Client writes this member sent into ZAB (rate() gives proposals/s)",
            registry=r,
        )
        self.commits = Counter(
            "directlog_consensus_commits", "Transactions applied to the data tree", registry=r
        )
        self.commit_latency = Histogram(
            "directlog_consensus_commit_latency_seconds",
            "From a client write taken here to its transaction applied here",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.fsync_latency = Histogram(
            "directlog_consensus_log_sync_latency_seconds",
            "Writing and fsyncing one group of log entries",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.connections = Gauge(
            "directlog_consensus_client_connections", "Client connections open", registry=r
        )
        self.requests = Counter(
            "directlog_consensus_client_requests",
            "Client requests received, by opcode name",
            ["op"],
            registry=r,
        )
        self.errors = Counter(
            "directlog_consensus_client_errors",
            "Error codes answered, by ZooKeeper error name",
            ["code"],
            registry=r,
        )
        self._request_counters: dict[int, Counter] = {}  # labels() once per opcode
        self.bad_input = Counter(
            "directlog_consensus_connections_closed_for_bad_input",
            "Client connections closed because their bytes were not valid jute",
            registry=r,
        )

    def request(self, op: int) -> None:
        counter = self._request_counters.get(op)
        if counter is None:
            try:
                name = OpCode(op).name.lower()
            except ValueError:
                name = str(op)
            counter = self._request_counters[op] = self.requests.labels(name)
        counter.inc()

    def log_synced(self, seconds: float, now: float) -> None:
        """One group of log records written and synced: feeds our histogram and, when the
        log fsyncs (ZooKeeper records fsynctime only with forceSync), ZooKeeper's summary."""
        self.fsync_latency.observe(seconds)
        if self.force_sync:
            self.zk.fsynctime.observe(seconds * 1000, now)

    def role_changed(self, role: ServerState, established: bool, now: float) -> None:
        """ZooKeeper's election bookkeeping (QuorumPeer, Leader.lead, Follower.followLeader)
        from the core's role changes; a one-member ensemble runs standalone, no election."""
        zk = self.zk
        if role == ServerState.LOOKING:
            zk.role_since = zk.leader_since = zk.sync_started = None
            if not self.standalone:
                zk.looking_count += 1
                if zk.looking_since is None:
                    zk.looking_since = now
            return
        if not established:  # a leader is chosen: ZooKeeper makes a new server here
            zk.role_since = now
            zk.leader_since = None
            if zk.looking_since is not None:
                zk.election_time.observe((now - zk.looking_since) * 1000, now)
                zk.looking_since = None
            learning = role in (ServerState.FOLLOWING, ServerState.OBSERVING)
            zk.sync_started = now if learning else None
        elif role == ServerState.LEADING:
            zk.leader_since = now
        elif zk.sync_started is not None:
            zk.follower_sync_time.observe((now - zk.sync_started) * 1000, now)
            zk.sync_started = None

    def bind(self, member: Member) -> None:
        """Gauges read from ``member`` at scrape time."""
        r = self.registry
        self.force_sync = member.settings.force_sync
        self.standalone = len(member.settings.members) == 1

        def gauge(name: str, doc: str, read: object) -> None:
            Gauge(name, doc, registry=r).set_function(read)  # type: ignore[arg-type]

        gauge(
            "directlog_consensus_role",
            "0 looking (or read-only), 1 follower, 2 leader, 3 standalone, 4 observer",
            lambda: ROLE_CODES[member.mode],
        )
        gauge(
            "directlog_consensus_epoch",
            "Epoch this member leads or follows",
            lambda: member.node.epoch,
        )
        gauge(
            "directlog_consensus_last_zxid",
            "Last zxid in this member's log",
            lambda: member.node.last_zxid,
        )
        gauge(
            "directlog_consensus_applied_zxid",
            "Last zxid applied to the tree",
            lambda: member.applied_zxid,
        )
        gauge(
            "directlog_consensus_outstanding_requests",
            "Client writes taken here and not yet applied",
            lambda: member.outstanding,
        )
        gauge(
            "directlog_consensus_sessions",
            "Live sessions in the tree",
            lambda: len(member.tree.sessions),
        )
        gauge(
            "directlog_consensus_znodes", "Nodes in the data tree", lambda: len(member.tree.nodes)
        )
        r.register(ZooKeeperCollector(self, member))

    def bind_clients(self, clients: ClientServer) -> None:
        """The client port whose connections and packets ZooKeeper's gauges count."""
        self.clients = clients

    def serve(self, host: str, port: int, ready: Readiness | None = None) -> int:
        return serve(self.registry, host, port, ready)


def _gauge(name: str, doc: str, value: float) -> Metric:
    metric = Metric(name, doc, "gauge")
    metric.add_sample(name, {}, float(value))
    return metric


def _counter(name: str, doc: str, value: float) -> Metric:
    """ZooKeeper 3.6-3.9 exposes its counters without ``_total`` (``# TYPE commit_count
    counter`` / ``commit_count 5.0``, simpleclient 0.9). prometheus_client would append
    ``_total`` to a counter, and OpenMetrics (which Prometheus asks for) forbids a counter
    sample without it, so these are untyped: the samples, hence every PromQL query, are
    ZooKeeper's, in both exposition formats."""
    metric = Metric(name, doc, "unknown")
    metric.add_sample(name, {}, float(value))
    return metric


def _open_fds() -> int:
    """Like the JVM's OperatingSystemMXBean: entries of /proc/self/fd, less the one the
    listing itself holds open."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1
    except OSError:
        return -1


class ZooKeeperCollector(Collector):
    """The series a ZooKeeper 3.6-3.9 member exports to Prometheus, with values that mean
    what they mean there, and present when they are present there:

    - ServerMetrics' summaries and counters: always (from process start);
    - ZooKeeperServer's gauges (tree, connections, latency, packets...): while the member
      serves, as ZooKeeper registers them when its server starts and drops them when it
      goes back to LOOKING; ``quorum_size`` and ``synced_observers`` likewise in an
      ensemble (not standalone);
    - LeaderZooKeeperServer's (``leader_uptime``, ``learners``, ``synced_followers``...):
      only on the serving leader, which is how dashboards tell the leader.
    """

    def __init__(self, metrics: ConsensusMetrics, member: Member) -> None:
        self.metrics = metrics
        self.member = member

    def collect(self) -> Iterator[Metric]:
        now = time.monotonic()
        zk = self.metrics.zk
        for summary in zk.summaries():
            yield summary.family(now)
        node = self.member.node
        clients = self.metrics.clients
        counters: list[tuple[str, str, float]] = [
            ("looking_count", "Times this member started looking for a leader", zk.looking_count),
            ("commit_count", "Transactions committed by this member as leader", zk.commit_count),
            (
                "proposal_count",
                "Transactions proposed by this member as leader",
                zk.proposal_size.count,
            ),
            (
                "learner_commit_received_count",
                "Transactions this member learned were committed, as follower",
                zk.learner_commits,
            ),
            ("snap_count", "Followers this leader synced with a snapshot", node.snap_syncs),
            ("diff_count", "Followers this leader synced with a diff", node.diff_syncs),
        ]
        if clients is not None:
            counters += [
                (
                    "connection_request_count",
                    "Session (connect) requests received on the client port",
                    clients.connect_requests,
                ),
                (
                    "connection_rejected",
                    "Client connections refused (max_client_connections)",
                    clients.rejected,
                ),
                (
                    "connection_drop_count",
                    "Client connections closed by the client side",
                    clients.dropped,
                ),
                (
                    "bytes_received_count",
                    "Bytes received on client connections",
                    clients.bytes_received,
                ),
            ]
        for name, doc, value in counters:
            yield _counter(name, doc, value)
        if self.member.serving and clients is not None:
            yield from self._server_gauges(clients, now)

    def _server_gauges(self, clients: ClientServer, now: float) -> Iterable[Metric]:
        member = self.member
        zk = self.metrics.zk
        tree = member.tree
        lat = zk.request_latency
        responses = clients.response_size
        connections = list(clients.connections)
        role_since = zk.role_since
        nofile_soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        gauges: list[tuple[str, str, float]] = [
            ("avg_latency", "Mean client request latency since start, ms", lat.avg),
            ("min_latency", "Smallest client request latency since start, ms", lat.min),
            ("max_latency", "Largest client request latency since start, ms", lat.max),
            ("packets_received", "Packets received from clients", clients.received),
            ("packets_sent", "Packets sent to clients (replies, events, ...)", clients.sent),
            ("num_alive_connections", "Client connections open", len(connections)),
            (
                "outstanding_requests",
                "Client requests received and not yet answered",
                sum(len(c.queue) for c in connections),
            ),
            (
                "uptime",
                "Milliseconds since this member took its current role",
                0.0 if role_since is None else (now - role_since) * 1000,
            ),
            ("znode_count", "Nodes in the data tree", len(tree.nodes)),
            (
                "watch_count",
                "Watches set by this member's clients (data and child)",
                tree.watches.count(),
            ),
            (
                "ephemerals_count",
                "Ephemeral nodes in the data tree",
                sum(map(len, list(tree.ephemerals.values()))),
            ),
            (
                "approximate_data_size",
                "Sum of every node's path length and data size, bytes",
                tree.data_size,
            ),
            ("global_sessions", "Live sessions in the ensemble", len(tree.sessions)),
            ("local_sessions", "Local sessions (none: every session is global)", 0),
            ("open_file_descriptor_count", "File descriptors open", _open_fds()),
            ("max_file_descriptor_count", "File descriptor limit (soft)", nofile_soft),
            ("connection_drop_probability", "Connection throttling (none)", 0),
            ("last_client_response_size", "Bytes of the last reply or event", responses.last),
            ("min_client_response_size", "Bytes of the smallest reply or event", responses.min),
            ("max_client_response_size", "Bytes of the largest reply or event", responses.max),
            ("outstanding_tls_handshake", "TLS handshakes under way (no TLS here)", 0),
        ]
        if not self.metrics.standalone:
            learners, synced, observers = member.node.learner_counts()
            gauges += [
                ("quorum_size", "Voting members in the ensemble", len(member.node.config.voters)),
                ("synced_observers", "Observers in sync with this leader", observers),
            ]
            leader_since = zk.leader_since
            if member.role == ServerState.LEADING and leader_since is not None:
                proposals = zk.proposal_size
                gauges += [
                    ("learners", "Followers and observers syncing with this leader", learners),
                    ("synced_followers", "Followers in sync with this leader", synced),
                    ("synced_non_voting_followers", "Non-voting followers (none)", 0),
                    (
                        "pending_syncs",
                        "Client syncs proposed, not yet committed",
                        member.pending_syncs,
                    ),
                    (
                        "leader_uptime",
                        "Milliseconds since this leader was established",
                        (now - leader_since) * 1000,
                    ),
                    ("last_proposal_size", "Bytes of the last proposal", proposals.last),
                    ("min_proposal_size", "Bytes of the smallest proposal", proposals.min),
                    ("max_proposal_size", "Bytes of the largest proposal", proposals.max),
                ]
        for name, doc, value in gauges:
            yield _gauge(name, doc, value)
