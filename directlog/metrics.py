"""Prometheus helpers every service shares: latency buckets and the /metrics server."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server

# From 100 µs (a pipelined request on loopback) to 10 s (a stalled disk).
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


def serve(registry: CollectorRegistry, host: str, port: int) -> int:
    """Start the /metrics HTTP server on a thread; returns the port it listens on."""
    server, _ = start_http_server(port, addr=host, registry=registry)
    return int(server.server_address[1])
