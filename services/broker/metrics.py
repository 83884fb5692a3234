"""Prometheus metrics of a broker, served at http://<host>:<metrics port>/metrics.

Counters and histograms are updated on the request path; per-partition offsets and sizes
are read from the logs when Prometheus scrapes, so appends pay nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from directlog.metrics import LATENCY_BUCKETS, serve
from directlog.protocol.errors import ErrorCode
from directlog.topics import TopicPartition
from services.broker.storage.log_manager import LogManager

if TYPE_CHECKING:
    from services.broker.groups.coordinator import GroupCoordinator
    from services.broker.replica_manager import ReplicaManager


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "directlog_broker_requests",
            "Requests handled, by API and version",
            ["api", "version"],
            registry=r,
        )
        self.latency = Histogram(
            "directlog_broker_request_latency_seconds",
            "Time from a whole request frame to its response sent, by API",
            ["api"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "directlog_broker_request_errors",
            "Error codes answered, by API and Kafka error name",
            ["api", "code"],
            registry=r,
        )
        self.bytes_in = Counter(
            "directlog_broker_bytes_in", "Record bytes appended", ["topic"], registry=r
        )
        self.records_in = Counter(
            "directlog_broker_records_in", "Records appended", ["topic"], registry=r
        )
        # RDMA produce (services/broker/rdma/produce.py).
        self.rdma_writes = Counter(
            "directlog_broker_rdma_produce_writes",
            "RDMA produce writes committed (each one or more record batches)",
            ["topic"],
            registry=r,
        )
        self.rdma_revocations = Counter(
            "directlog_broker_rdma_produce_revocations",
            "RDMA produce grants revoked for a fault (a hole, a bad write, a dead writer)",
            registry=r,
        )
        # RDMA consume (services/broker/rdma/consume.py); the gauges read its state when
        # scraped (set_function).
        self.rdma_consumers = Gauge(
            "directlog_broker_rdma_consumers", "RDMA consumers known to this broker", registry=r
        )
        self.rdma_consume_registrations = Gauge(
            "directlog_broker_rdma_consume_registrations",
            "Segments registered for RDMA consumers' one-sided reads",
            registry=r,
        )
        self.rdma_slot_writes = Counter(
            "directlog_broker_rdma_consume_slot_writes",
            "Metadata slot rewrites for RDMA consumers (high watermark moves, seals, revocations)",
            ["topic"],
            registry=r,
        )
        self.rdma_consume_revocations = Counter(
            "directlog_broker_rdma_consume_revocations",
            "Segment registrations revoked under RDMA consumers (leadership moves, retention, "
            "truncation, stopping)",
            registry=r,
        )
        self.bytes_out = Counter(
            "directlog_broker_bytes_out", "Record bytes sent to fetchers", ["topic"], registry=r
        )
        self.records_out = Counter(
            "directlog_broker_records_out", "Records sent to fetchers", ["topic"], registry=r
        )
        self.connections = Gauge(
            "directlog_broker_open_connections", "Client connections open", registry=r
        )
        self.isr_shrinks = Counter(
            "directlog_broker_isr_shrinks", "ISR shrinks the controller accepted", registry=r
        )
        self.isr_expands = Counter(
            "directlog_broker_isr_expands", "ISR expansions the controller accepted", registry=r
        )
        self.leader_elections = Counter(
            "directlog_broker_leader_elections",
            "Partitions this broker became leader of (a new leader epoch)",
            registry=r,
        )
        self.closed_for_bad_input = Counter(
            "directlog_broker_connections_closed_for_bad_input",
            "Connections closed because their bytes could not be read as Kafka requests",
            registry=r,
        )

        # RDMA push replication (services/broker/rdma/replica_leader.py) and its fallback.
        self.replication_pushed_bytes = Counter(
            "directlog_broker_replication_pushed_bytes",
            "Record bytes a leader pushed to followers with RDMA writes",
            ["topic"],
            registry=r,
        )
        self.replication_pushes = Counter(
            "directlog_broker_replication_pushes",
            "RDMA writes of record batches a leader pushed to followers",
            ["topic"],
            registry=r,
        )
        self.replication_channels = Gauge(
            "directlog_broker_replication_push_channels",
            "Push channels a leader has open to followers, by topic",
            ["topic"],
            registry=r,
        )
        self.replica_pulled_bytes = Counter(
            "directlog_broker_replica_pulled_bytes",
            "Record bytes a follower appended from its pull fetches, by partition",
            ["topic", "partition"],
            registry=r,
        )

        # Tiered storage (services/broker/tiered/): reads from the remote store.
        self.remote_fetch_bytes = Counter(
            "directlog_broker_remote_fetch_bytes",
            "Record bytes read from the remote store for fetches, by topic",
            ["topic"],
            registry=r,
        )
        self.remote_fetch_requests = Counter(
            "directlog_broker_remote_fetch_requests",
            "Reads from the remote store for fetches and offset lookups, by topic",
            ["topic"],
            registry=r,
        )
        self.remote_fetch_errors = Counter(
            "directlog_broker_remote_fetch_errors",
            "Reads from the remote store that failed (unreachable, corrupt), by topic",
            ["topic"],
            registry=r,
        )
        self.remote_read_latency = Histogram(
            "directlog_broker_remote_read_latency_seconds",
            "Time to read and check one range of remote log data",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

        # Fetches of old consumers (services/broker/down_conversion.py), meaning what Kafka's
        # FetchMessageConversionsPerSec, MessageConversionsTimeMs and TemporaryMemoryBytes do.
        self.message_conversions = Counter(
            "directlog_broker_fetch_message_conversions",
            "Records converted to an older message format for old consumers, by topic",
            ["topic"],
            registry=r,
        )
        self.conversion_time = Histogram(
            "directlog_broker_message_conversion_seconds",
            "Time spent converting one partition's records of an answer to an older format",
            ["request"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.temporary_memory = Gauge(
            "directlog_broker_temporary_memory_bytes",
            "Bytes conversions in flight hold (source chunks and their converted forms)",
            ["request"],
            registry=r,
        )

        # Labelled children looked up once: labels() costs more than the increment itself.
        self._request_children: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._topic_in: dict[str, tuple[Any, Any]] = {}
        self._topic_out: dict[str, tuple[Any, Any]] = {}

    def request(self, api: str, version: int, seconds: float, count: int = 1) -> None:
        """`count` requests of one API version answered, each `seconds` after it began."""
        children = self._request_children.get((api, version))
        if children is None:
            children = (self.requests.labels(api, str(version)), self.latency.labels(api))
            self._request_children[(api, version)] = children
        children[0].inc(count)
        for _ in range(count):
            children[1].observe(seconds)

    def watch_logs(self, logs: LogManager) -> None:
        self.registry.register(_LogCollector(lambda: logs))

    def watch_replicas(self, replicas: ReplicaManager) -> None:
        self.registry.register(_ReplicaCollector(replicas))

    def watch_groups(self, coordinator: GroupCoordinator) -> None:
        self.registry.register(_GroupCollector(coordinator))

    def produced(self, topic: str, records: int, size: int) -> None:
        children = self._topic_in.get(topic)
        if children is None:
            children = self._topic_in[topic] = (
                self.records_in.labels(topic),
                self.bytes_in.labels(topic),
            )
        children[0].inc(records)
        children[1].inc(size)

    def fetched(self, topic: str, records: int, size: int) -> None:
        children = self._topic_out.get(topic)
        if children is None:
            children = self._topic_out[topic] = (
                self.records_out.labels(topic),
                self.bytes_out.labels(topic),
            )
        children[0].inc(records)
        children[1].inc(size)

    def converted(self, topic: str, records: int, seconds: float) -> None:
        """One partition's answer to an old consumer converted: `records` in `seconds`."""
        self.message_conversions.labels(topic).inc(records)
        self.conversion_time.labels("fetch").observe(seconds)

    def pulled(self, tp: TopicPartition, size: int) -> None:
        self.replica_pulled_bytes.labels(tp.topic, str(tp.partition)).inc(size)

    def request_error(self, api: str, code: ErrorCode) -> None:
        self.errors.labels(api, code.name).inc()

    def serve(self, host: str, port: int) -> int:
        return serve(self.registry, host, port)


class _LogCollector(Collector):
    def __init__(self, logs: Callable[[], LogManager]) -> None:
        self._logs = logs

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["topic", "partition"]
        end = GaugeMetricFamily(
            "directlog_broker_log_end_offset", "Next offset to be appended", labels=labels
        )
        start = GaugeMetricFamily(
            "directlog_broker_log_start_offset", "First readable offset", labels=labels
        )
        hw = GaugeMetricFamily(
            "directlog_broker_high_watermark",
            "Offset below which records are readable",
            labels=labels,
        )
        size = GaugeMetricFamily(
            "directlog_broker_log_size_bytes", "Bytes in the partition's segments", labels=labels
        )
        local_start = GaugeMetricFamily(
            "directlog_broker_local_log_start_offset",
            "First offset in a local segment (below it, a tiered log's records are remote)",
            labels=labels,
        )
        for tp, log in list(self._logs().logs.items()):
            key = [tp.topic, str(tp.partition)]
            end.add_metric(key, log.log_end_offset)
            start.add_metric(key, log.log_start_offset)
            hw.add_metric(key, log.high_watermark)
            size.add_metric(key, log.size_bytes)
            local_start.add_metric(key, log.local_log_start_offset)
        yield from (end, start, hw, size, local_start)


class _ReplicaCollector(Collector):
    def __init__(self, replicas: ReplicaManager) -> None:
        self._replicas = replicas

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["topic", "partition"]
        under = GaugeMetricFamily(
            "directlog_broker_under_replicated_partitions",
            "Partitions this broker leads whose ISR lacks some of their replicas",
        )
        leading = GaugeMetricFamily(
            "directlog_broker_leader_partitions", "Partitions this broker leads"
        )
        isr = GaugeMetricFamily(
            "directlog_broker_isr_size", "In-sync replicas of partitions led here", labels=labels
        )
        lag = GaugeMetricFamily(
            "directlog_broker_replica_lag_offsets",
            "Offsets a followed partition's log trails its leader's high watermark",
            labels=labels,
        )
        led = [p for p in list(self._replicas.partitions.values()) if p.is_leader]
        under.add_metric([], sum(1 for p in led if len(p.info.isr) < len(p.info.replicas)))
        leading.add_metric([], len(led))
        for p in led:
            isr.add_metric([p.tp.topic, str(p.tp.partition)], len(p.info.isr))
        for fetcher in list(self._replicas.fetchers.values()):
            for tp, state in list(fetcher.partitions.items()):
                lag.add_metric([tp.topic, str(tp.partition)], state.lag)
        yield from (under, leading, isr, lag)


class _GroupCollector(Collector):
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self._coordinator = coordinator

    def collect(self) -> Iterator[GaugeMetricFamily]:
        groups = GaugeMetricFamily(
            "directlog_broker_groups",
            "Consumer groups this broker coordinates, by state",
            labels=["state"],
        )
        members = GaugeMetricFamily(
            "directlog_broker_group_members", "Members of the groups this broker coordinates"
        )
        by_state: dict[str, int] = {}
        count = 0
        for group in self._coordinator.listed_groups():
            by_state[group.state.value] = by_state.get(group.state.value, 0) + 1
            count += len(group.members)
        for state, n in sorted(by_state.items()):
            groups.add_metric([state], n)
        members.add_metric([], count)
        yield from (groups, members)
