"""/healthz and /readyz on the metrics port of every process (what the chart's probes ask):
200 once a process serves, 503 with the reason while it is not ready, and liveness that
stays 200 when only readiness is lost (a member without a quorum must not be restarted
for it)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, wait_for

pytestmark = pytest.mark.timeout(240)


def probe(metrics_url: str, path: str) -> tuple[int, str]:
    url = metrics_url.removesuffix("/metrics") + path
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def answers(url: str, path: str, expected: tuple[int, str], what: str, timeout: float) -> None:
    """Wait until `path` answers `expected` (status, body)."""
    wait_for(lambda: probe(url, path) == expected, timeout, what)


def test_every_process_reports_live_and_ready(tmp_path: Path, clients) -> None:
    tiering = {"remote": f"file://{tmp_path / 'remote'}", "interval_ms": 200}
    with Cluster(tmp_path / "cluster", brokers=2, consensus_members=3, tiering=tiering) as c:
        clients.create_topic(c.bootstrap, "probed", partitions=2)
        urls = {
            **{f"broker {i}": b.metrics_url for i, b in c.brokers.items()},
            **{f"tiering {i}": t.metrics_url for i, t in c.tierings.items()},
            "controller": c.controllers[0].metrics_url,
            **{f"member {m}": c.ensemble.metrics_url(m) for m in c.ensemble.ids},
        }
        for name, url in urls.items():
            assert probe(url, "/healthz") == (200, "ok\n"), name
            answers(url, "/readyz", (200, "ok\n"), f"{name} ready", 60)
        # /metrics is still the exposition, beside the probes
        status, exposition = probe(urls["broker 0"], "/metrics")
        assert status == 200 and "directlog_broker_" in exposition

        # Two of three members gone: the last one has no quorum, so it and the controller
        # (whose session it served) are not ready, yet alive.
        last = f"member {c.ensemble.ids[-1]}"
        for member in c.ensemble.ids[:-1]:
            c.ensemble.stop(member)
        wait_for(lambda: probe(urls[last], "/readyz")[0] == 503, 60, "member not ready")
        assert probe(urls[last], "/readyz")[1].startswith("not serving clients (")
        assert probe(urls[last], "/healthz") == (200, "ok\n")
        answers(
            urls["controller"],
            "/readyz",
            (503, "not connected to the consensus service\n"),
            "the controller without consensus reports not ready",
            60,
        )
        assert probe(urls["controller"], "/healthz") == (200, "ok\n")

        # Quorum back: ready again.
        for member in c.ensemble.ids[:-1]:
            c.ensemble.start(member)
        for name in ("controller", last):
            answers(urls[name], "/readyz", (200, "ok\n"), f"{name} ready again", 90)


def test_the_tiering_sidecar_is_not_ready_without_its_broker(tmp_path: Path) -> None:
    tiering = {"remote": f"file://{tmp_path / 'remote'}", "interval_ms": 200}
    with Cluster(tmp_path / "cluster", brokers=1, tiering=tiering) as c:
        sidecar = c.tierings[0].metrics_url
        answers(sidecar, "/readyz", (200, "ok\n"), "sidecar ready", 60)
        c.brokers[0].stop()
        answers(
            sidecar,
            "/readyz",
            (503, "the broker does not answer\n"),
            "the sidecar without its broker reports not ready",
            60,
        )
        assert probe(sidecar, "/healthz") == (200, "ok\n")
