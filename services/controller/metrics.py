"""Prometheus metrics of a controller process, served at http://<host>:<metrics_port>/metrics.

Gauges are set on the event loop after each change; counters move as changes commit.

Beside them, the series Kafka's controller MBeans become under Strimzi's JMX exporter rules
(docs/metrics.md): kafka_controller_kafkacontroller_* and
kafka_controller_controllerstats_uncleanleaderelections_total. They mean what they mean on a
ZooKeeper-based Kafka controller: the active controller reports the cluster's counts, a
standby reports 0 for all of them, so the dashboards' sum() over every controller process
counts each once. They are read when Prometheus scrapes: the counts from the active term's
state, the preferred replica imbalance from a snapshot of its topics (each Topic is frozen,
and list() of the dict is taken whole under the GIL).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from directlog.metrics import LATENCY_BUCKETS, Readiness, serve
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
        self._state: ClusterState | None = None  # of the current or the last term
        r.register(_KafkaControllerCollector(self))

    @property
    def is_active(self) -> bool:
        return _gauge_value(self.active) == 1

    def observe(self, state: ClusterState) -> None:
        self._state = state
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

    def serve(self, host: str, port: int, ready: Readiness | None = None) -> int:
        return serve(self.registry, host, port, ready)


def _gauge_value(gauge: Gauge) -> float:
    return next(s.value for family in gauge.collect() for s in family.samples)


class _KafkaControllerCollector(Collector):
    """Kafka's kafka.controller:type=KafkaController gauges and ControllerStats meter."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        active = metrics.is_active
        state = metrics._state if active else None
        topics = list(state.topics.values()) if state is not None else []
        counts = {
            "activecontrollercount": (
                "ActiveControllerCount: 1 on the active controller, 0 on a standby",
                int(active),
            ),
            "globaltopiccount": ("GlobalTopicCount: topics (0 on a standby)", len(topics)),
            "globalpartitioncount": (
                "GlobalPartitionCount: partitions (0 on a standby)",
                state.partition_count if state is not None else 0,
            ),
            "offlinepartitionscount": (
                "OfflinePartitionsCount: partitions without a leader (0 on a standby)",
                state.offline_count if state is not None else 0,
            ),
            "preferredreplicaimbalancecount": (
                "PreferredReplicaImbalanceCount: partitions not led by their preferred (first) "
                "replica, offline ones included (0 on a standby)",
                sum(p.leader != p.replicas[0] for t in topics for p in t.partitions),
            ),
            "activebrokercount": (
                "ActiveBrokerCount: registered brokers not fenced (0 on a standby)",
                len(state.brokers) - len(state.fenced) if state is not None else 0,
            ),
            "fencedbrokercount": (
                "FencedBrokerCount: registered brokers whose session ended (0 on a standby)",
                len(state.fenced) if state is not None else 0,
            ),
        }
        for name, (documentation, value) in counts.items():
            yield GaugeMetricFamily(
                f"kafka_controller_kafkacontroller_{name}", documentation, value=value
            )
        unclean = CounterMetricFamily(
            "kafka_controller_controllerstats_uncleanleaderelections",
            "UncleanLeaderElectionsPerSec: partitions this process, as the active controller, "
            "gave a leader from outside the ISR",
        )
        unclean.add_metric(
            [],
            sum(
                s.value
                for family in metrics.leader_elections.collect()
                for s in family.samples
                if s.name.endswith("_total") and s.labels.get("kind") == "unclean"
            ),
        )
        yield unclean
