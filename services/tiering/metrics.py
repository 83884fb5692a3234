"""Prometheus metrics of a tiering service, at http://<host>:<metrics port>/metrics, named
after Kafka's RemoteLogManager metrics (RemoteCopyBytesPerSec, RemoteCopyLagBytes, ...)."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from directlog.metrics import LATENCY_BUCKETS, serve


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

    def forget(self, topic: str, partition: int) -> None:
        """Stop reporting a partition this broker no longer hosts."""
        for gauge in (
            self.copy_lag_bytes,
            self.copy_lag_segments,
            self.remote_log_size_bytes,
            self.remote_log_segments,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(topic, str(partition))

    def serve(self, host: str, port: int) -> int:
        return serve(self.registry, host, port)
