"""Prometheus metrics of a tiering service, at http://<host>:<metrics port>/metrics, named
after Kafka's RemoteLogManager metrics (RemoteCopyBytesPerSec, RemoteCopyLagBytes, ...).

Beside the directlog_tiering_* series, the same numbers under the names Kafka 3.7+'s
BrokerTopicMetrics MBeans for remote copies become under Strimzi's JMX exporter rules
(kafka_server_brokertopicmetrics_remotecopybytes_total, ..._remotecopylagbytes, ...;
docs/metrics.md), read when Prometheus scrapes. As in Kafka they are per topic (gauges sum
the topic's partitions) plus one all-topics series without a topic label, and only what this
process does as a partition's leader counts: a follower's lag and remote size are in the
directlog_tiering_* gauges only, so sums over the cluster count each partition once.

Series live as long as what they describe here: a partition's gauges while its broker hosts
it (`forget`), and, in the Kafka-named ones, while it leads it (`stopped_leading`); a
topic's counters while its broker hosts a partition of it, as Kafka's
ReplicaManager.maybeRemoveTopicMetrics keeps them, and its deletion errors while its remote
data is still being deleted (`retain`). A topic created again under the same name starts from
zero. The all-topics counters keep what dropped topics had counted, so they never go down.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from directlog.metrics import LATENCY_BUCKETS, Readiness, serve


class TieringMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.copied_bytes = Counter(
            "directlog_tiering_copied_bytes",
            "Segment bytes copied to the remote store, by topic",
            ["topic"],
            registry=r,
        )
        self.copied_segments = Counter(
            "directlog_tiering_copied_segments",
            "Segments copied to the remote store, by topic",
            ["topic"],
            registry=r,
        )
        self.copy_requests = Counter(
            "directlog_tiering_copy_requests",
            "Segment copies begun (uploads started once COPY_STARTED was recorded), by topic",
            ["topic"],
            registry=r,
        )
        self.copy_errors = Counter(
            "directlog_tiering_copy_errors",
            "Segment copies that failed (and will be tried again), by topic",
            ["topic"],
            registry=r,
        )
        self.copy_latency = Histogram(
            "directlog_tiering_copy_latency_seconds",
            "Time to copy one segment, from copy-started to copy-finished",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        labels = ["topic", "partition"]
        self.copy_lag_bytes = Gauge(
            "directlog_tiering_copy_lag_bytes",
            "Bytes of closed local segments below the high watermark not yet remote",
            labels,
            registry=r,
        )
        self.copy_lag_segments = Gauge(
            "directlog_tiering_copy_lag_segments",
            "Closed local segments below the high watermark not yet remote",
            labels,
            registry=r,
        )
        self.remote_log_size_bytes = Gauge(
            "directlog_tiering_remote_log_size_bytes",
            "Bytes of the partition's finished remote segments",
            labels,
            registry=r,
        )
        self.remote_log_segments = Gauge(
            "directlog_tiering_remote_log_segments",
            "The partition's finished remote segments",
            labels,
            registry=r,
        )
        self.remote_log_records = Gauge(
            "directlog_tiering_remote_log_records",
            "The partition's remote log segment records, in any state",
            labels,
            registry=r,
        )
        self.deleted_segments = Counter(
            "directlog_tiering_deleted_segments",
            "Remote segments deleted (retention, deleted topics, cleanup of failed copies)",
            ["topic"],
            registry=r,
        )
        self.delete_errors = Counter(
            "directlog_tiering_delete_errors",
            "Remote deletions that failed (and will be tried again), by topic",
            ["topic"],
            registry=r,
        )
        self.index_syncs = Counter(
            "directlog_tiering_index_entries_fetched",
            "Remote index entries a replica took from the store to build its remote indexes",
            ["topic"],
            registry=r,
        )

        # Partitions whose gauges were last set as their leader (Kafka's names report those).
        self._leading: set[tuple[str, str]] = set()
        self._leading_lock = threading.Lock()
        # What the counters of dropped topics had counted, by counter (the all-topics series
        # keep it), changed and read under the lock so a scrape sees a count once.
        self._retired: dict[Counter, float] = {}
        self._lifetime = threading.Lock()
        r.register(_KafkaRemoteCopyCollector(self))

    def observe(
        self,
        topic: str,
        partition: int,
        *,
        leader: bool,
        lag_segments: int,
        lag_bytes: int,
        remote_segments: int,
        remote_bytes: int,
        remote_records: int,
    ) -> None:
        """A hosted partition's state after a round, as its leader or as a follower."""
        labels = (topic, str(partition))
        self.copy_lag_segments.labels(*labels).set(lag_segments)
        self.copy_lag_bytes.labels(*labels).set(lag_bytes)
        self.remote_log_segments.labels(*labels).set(remote_segments)
        self.remote_log_size_bytes.labels(*labels).set(remote_bytes)
        self.remote_log_records.labels(*labels).set(remote_records)
        with self._leading_lock:
            if leader:
                self._leading.add(labels)
            else:
                self._leading.discard(labels)

    def leading(self) -> set[tuple[str, str]]:
        with self._leading_lock:
            return set(self._leading)

    def forget(self, topic: str, partition: int) -> None:
        """Stop reporting a partition this broker no longer hosts."""
        for gauge in (
            self.copy_lag_bytes,
            self.copy_lag_segments,
            self.remote_log_size_bytes,
            self.remote_log_segments,
            self.remote_log_records,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(topic, str(partition))
        with self._leading_lock:
            self._leading.discard((topic, str(partition)))

    def stopped_leading(self, topic: str, partition: int) -> None:
        """The broker follows a partition it led: the Kafka-named gauges, which describe the
        partitions led here, leave it out from now on, not from its first round as a
        follower."""
        with self._leading_lock:
            self._leading.discard((topic, str(partition)))

    def retain(self, hosted: Collection[str], deleting: Collection[str] = ()) -> None:
        """Drop the series of every topic the broker hosts no partition of (`hosted` holds
        those it does), but the deletion errors of those whose remote data is still being
        deleted (`deleting`)."""

        def is_hosted(topic: str) -> bool:
            return topic in hosted

        def is_hosted_or_deleting(topic: str) -> bool:
            return topic in hosted or topic in deleting

        with self._lifetime:
            for metric in self._per_topic():
                keep = is_hosted_or_deleting if metric is self.delete_errors else is_hosted
                dropped = _drop_children(metric, keep)
                if dropped:
                    self._retired[metric] = self._retired.get(metric, 0.0) + dropped
            for gauge in self._per_partition():
                _drop_children(gauge, is_hosted)
        with self._leading_lock:
            self._leading = {key for key in self._leading if key[0] in hosted}

    def retired(self, counter: Counter) -> float:
        """What the dropped topics' children of `counter` had counted (under `_lifetime`)."""
        return self._retired.get(counter, 0.0)

    def _per_topic(self) -> tuple[Counter, ...]:
        return (
            self.copied_bytes,
            self.copied_segments,
            self.copy_requests,
            self.copy_errors,
            self.deleted_segments,
            self.delete_errors,
            self.index_syncs,
        )

    def _per_partition(self) -> tuple[Gauge, ...]:
        return (
            self.copy_lag_bytes,
            self.copy_lag_segments,
            self.remote_log_size_bytes,
            self.remote_log_segments,
            self.remote_log_records,
        )

    def serve(self, host: str, port: int, ready: Readiness | None = None) -> int:
        return serve(self.registry, host, port, ready)


def _drop_children(metric: Counter | Gauge, keep: Callable[[str], bool]) -> float:
    """Remove the children of `metric` whose topic (first label) `keep` does not keep;
    returns what they held (a counter's totals)."""
    dropped = 0.0
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith("_created") or keep(sample.labels["topic"]):
                continue
            with contextlib.suppress(KeyError):
                metric.remove(*sample.labels.values())
            dropped += sample.value
    return dropped


class _KafkaRemoteCopyCollector(Collector):
    """Kafka's BrokerTopicMetrics for remote copies (KIP-405, KIP-963) from the counters and
    gauges above."""

    PREFIX = "kafka_server_brokertopicmetrics_"

    def __init__(self, metrics: TieringMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        with metrics._lifetime:
            counters = self._counters(metrics)
        yield from counters
        yield from self._gauges(metrics)

    def _counters(self, metrics: TieringMetrics) -> list[Metric]:
        counters = []
        for name, counter, documentation in (
            (
                "remotecopybytes",
                metrics.copied_bytes,
                "RemoteCopyBytesPerSec: segment bytes copied to the remote store",
            ),
            (
                "remotecopyrequests",
                metrics.copy_requests,
                "RemoteCopyRequestsPerSec: segment copies begun",
            ),
            (
                "remotecopyerrors",
                metrics.copy_errors,
                "RemoteCopyErrorsPerSec: segment copies that failed",
            ),
        ):
            by_topic: dict[str, float] = {}
            for family in counter.collect():
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        topic = sample.labels["topic"]
                        by_topic[topic] = by_topic.get(topic, 0.0) + sample.value
            counters.append((name, documentation, by_topic, metrics.retired(counter)))
        copied = {topic for _, _, by_topic, _ in counters for topic in by_topic}
        families = []
        for name, documentation, by_topic, retired in counters:  # 0, not absent, if copied to
            values = {topic: by_topic.get(topic, 0.0) for topic in copied}
            families.append(
                _per_topic(CounterMetricFamily, self.PREFIX + name, documentation, values, retired)
            )
        return families

    def _gauges(self, metrics: TieringMetrics) -> Iterator[Metric]:
        leading = metrics.leading()
        for name, gauge, documentation in (
            (
                "remotecopylagbytes",
                metrics.copy_lag_bytes,
                "RemoteCopyLagBytes: bytes of closed segments below the high watermark not yet "
                "copied, of partitions led here",
            ),
            (
                "remotecopylagsegments",
                metrics.copy_lag_segments,
                "RemoteCopyLagSegments: closed segments below the high watermark not yet "
                "copied, of partitions led here",
            ),
            (
                "remotelogsizebytes",
                metrics.remote_log_size_bytes,
                "RemoteLogSizeBytes: bytes of the finished remote segments of partitions led here",
            ),
            (
                "remotelogmetadatacount",
                metrics.remote_log_records,
                "RemoteLogMetadataCount: remote log segment records (any state) of partitions "
                "led here",
            ),
        ):
            by_topic: dict[str, float] = {}
            for family in gauge.collect():
                for sample in family.samples:
                    labels = sample.labels
                    if (labels["topic"], labels["partition"]) in leading:
                        topic = labels["topic"]
                        by_topic[topic] = by_topic.get(topic, 0.0) + sample.value
            yield _per_topic(GaugeMetricFamily, self.PREFIX + name, documentation, by_topic)


def _per_topic(
    kind: type[CounterMetricFamily] | type[GaugeMetricFamily],
    name: str,
    documentation: str,
    by_topic: dict[str, float],
    retired: float = 0.0,
) -> Metric:
    """A series per topic and Kafka's all-topics one (no topic label): their sum, with what
    dropped topics had counted (`retired`)."""
    family = kind(name, documentation, labels=["topic"])
    suffix = "_total" if kind is CounterMetricFamily else ""
    family.samples.append(Sample(name + suffix, {}, sum(by_topic.values()) + retired))
    for topic, value in sorted(by_topic.items()):
        family.add_metric([topic], value)
    return family
