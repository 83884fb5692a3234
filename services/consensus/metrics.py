"""Prometheus metrics of a consensus member, served at http://<metrics address>/metrics.

Counters and histograms move on the write path; role, epoch, zxid and tree sizes are read
from the member when Prometheus scrapes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from directlog.metrics import LATENCY_BUCKETS, serve
from services.consensus.codes import OpCode

if TYPE_CHECKING:
    from services.consensus.member import Member

ROLE_CODES = {"looking": 0, "follower": 1, "leader": 2, "standalone": 3}


class ConsensusMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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

    def bind(self, member: Member) -> None:
        """Gauges read from ``member`` at scrape time."""
        r = self.registry

        def gauge(name: str, doc: str, read: object) -> None:
            Gauge(name, doc, registry=r).set_function(read)  # type: ignore[arg-type]

        gauge(
            "directlog_consensus_role",
            "0 looking, 1 follower, 2 leader, 3 standalone",
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

    def serve(self, host: str, port: int) -> int:
        return serve(self.registry, host, port)
