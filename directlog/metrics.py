"""Prometheus helpers every service shares: latency buckets and the HTTP server that answers
/metrics and the health checks a kubelet (or `make run`'s supervisor) probes."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

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


# A readiness check, run on the service's event loop: None when ready, else why not (the 503
# answer's body).
Readiness = Callable[[], str | None]
LOOP_ANSWER_SECONDS = 5.0  # a probe fails when the event loop takes longer to answer it


def serve(
    registry: CollectorRegistry,
    host: str,
    port: int,
    ready: Readiness | None = None,
) -> int:
    """Start the HTTP server on a thread; returns the port it listens on.

    - ``/metrics``: the registry, in Prometheus' text format;
    - ``/healthz``: liveness, 200 while the event loop still runs callbacks (a process whose
      loop is stuck serves nothing and had better be restarted);
    - ``/readyz``: readiness, 200 when ``ready`` finds nothing missing, else 503 and why.
    Called on the event loop whose health it reports."""
    loop = asyncio.get_running_loop()
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            return _answer(start_response, _on_loop(loop, lambda: None))
        if path == "/readyz":
            return _answer(start_response, _on_loop(loop, ready or (lambda: None)))
        result: Iterable[bytes] = metrics(environ, start_response)
        return result

    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    server = make_server(host, port, app, server_class, _QuietHandler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return int(server.server_address[1])


def _on_loop(loop: asyncio.AbstractEventLoop, check: Readiness) -> str | None:
    """Run `check` on the loop (where the state it reads changes) and wait for its answer."""
    answer: Future[str | None] = Future()

    def run() -> None:
        try:
            answer.set_result(check())
        except Exception as error:  # a check that fails says so rather than hanging the probe
            answer.set_result(f"readiness check failed: {error!r}")

    try:
        loop.call_soon_threadsafe(run)
        return answer.result(LOOP_ANSWER_SECONDS)
    except RuntimeError:
        return "the event loop is closed"
    except TimeoutError:
        return f"the event loop did not answer within {LOOP_ANSWER_SECONDS:g} s"


def _answer(start_response: Callable[..., Any], reason: str | None) -> list[bytes]:
    status = "200 OK" if reason is None else "503 Service Unavailable"
    start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
    return [b"ok\n" if reason is None else reason.encode() + b"\n"]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per request, so a slow scrape never holds up a probe."""

    daemon_threads = True
    allow_reuse_address = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes and scrapes every few seconds would flood the log."""
