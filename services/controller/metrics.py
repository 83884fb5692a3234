"""Prometheus metrics of a controller process, served at http://<host>:<metrics_port>/metrics.

Gauges are set on the event loop after each change (the image is not safe to walk from the
scrape thread); counters move as changes commit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from directlog.metrics import LATENCY_BUCKETS, serve
from services.controller.cluster import Change, ClusterState


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.active = Gauge(
            "directlog_controller_active",
            "1 while this process is the active controller",
            registry=r,
        )
        self.epoch = Gauge(
            "directlog_controller_epoch", "Controller epoch of this process's last term", registry=r
        )
        self.registered_brokers = Gauge(
            "directlog_controller_registered_brokers", "Brokers with a registration", registry=r
        )
        self.fenced_brokers = Gauge(
            "directlog_controller_fenced_brokers",
            "Registered brokers whose session ended",
            registry=r,
        )
        self.topics = Gauge("directlog_controller_topics", "Topics", registry=r)
        self.partitions = Gauge("directlog_controller_partitions", "Partitions", registry=r)
        self.offline_partitions = Gauge(
            "directlog_controller_offline_partitions", "Partitions without a leader", registry=r
        )
        self.leader_elections = Counter(
            "directlog_controller_leader_elections",
            "Partitions that got a new leader; unclean: from outside the ISR",
            ["kind"],
            registry=r,
        )
        self._clean = self.leader_elections.labels("clean")
        self._unclean = self.leader_elections.labels("unclean")
        self.preferred_elections = Counter(
            "directlog_controller_preferred_leader_elections",
            "Partitions whose leadership went back to their preferred replica (automatic "
            "leader rebalance; also counted as clean leader elections)",
            registry=r,
        )
        self.isr_changes = Counter(
            "directlog_controller_isr_changes", "Partition ISR changes committed", registry=r
        )
        self.controlled_shutdowns = Counter(
            "directlog_controller_controlled_shutdowns",
            "Brokers that began a controlled shutdown (repeated calls count once)",
            registry=r,
        )
        self.metadata_streams = Gauge(
            "directlog_controller_metadata_streams", "Open WatchMetadata streams", registry=r
        )
        self.streams_cut = Counter(
            "directlog_controller_metadata_streams_cut",
            "Streams ended because their broker read too slowly",
            registry=r,
        )
        self.rpc_latency = Histogram(
            "directlog_controller_rpc_latency_seconds",
            "Unary RPCs, from the request to the answer, by method",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def observe(self, state: ClusterState) -> None:
        self.registered_brokers.set(len(state.brokers))
        self.fenced_brokers.set(len(state.fenced))
        self.topics.set(len(state.topics))
        self.partitions.set(state.partition_count)
        self.offline_partitions.set(state.offline_count)

    def committed(self, change: Change) -> None:
        self._clean.inc(change.leader_elections - change.unclean_elections)
        self._unclean.inc(change.unclean_elections)
        self.preferred_elections.inc(change.preferred_elections)
        self.isr_changes.inc(change.isr_changes)

    @contextmanager
    def rpc(self, method: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.rpc_latency.labels(method).observe(time.perf_counter() - start)

    def serve(self, host: str, port: int) -> int:
        return serve(self.registry, host, port)
