"""Scrapes while processes start and stop (issue 25, bad input): a scraper polls the
/metrics of a broker, a controller and a tiering service without pause while each is
stopped and started again under produce load. A scrape may fail while its process is down
or going down (refused, or cut off before its whole answer: Prometheus counts both as a
failed scrape), but every whole answer is valid exposition text for both of Prometheus'
parsers (its classic text format and OpenMetrics, which Prometheus asks for first), and no
process logs a traceback."""

from __future__ import annotations

import http.client
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.cluster import Cluster, wait_for

pytestmark = pytest.mark.timeout(240)

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class Scraper:
    """Polls `urls` on a thread until stopped, in both formats; keeps what every answer
    parsed to, and the parse failures."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.answers = 0
        self.refused = 0  # refused, or cut off before the whole answer
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            for url in self.urls:
                for accept in ("text/plain", OPENMETRICS):
                    self._scrape(url, accept)

    def _scrape(self, url: str, accept: str) -> None:
        request = urllib.request.Request(url, headers={"Accept": accept})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                body = answer.read()
                kind = answer.headers.get("Content-Type", "")
                length = answer.headers.get("Content-Length")
        except urllib.error.HTTPError as error:  # an answer, but not the metrics
            self.failures.append(f"{url}: HTTP {error.code}")
            return
        except (urllib.error.URLError, http.client.HTTPException, OSError):
            self.refused += 1  # the process is down, or not listening yet
            return
        if not kind or length is None or len(body) != int(length):
            self.refused += 1  # the process went away in the middle of its answer
            return
        text = body.decode()
        try:
            if kind.startswith("application/openmetrics-text"):
                families = list(openmetrics_families(text))
            else:
                families = list(text_string_to_metric_families(text))
            assert families, "an empty exposition"
            self.answers += 1
        except Exception as error:  # handed to the test's thread through `failures`
            self.failures.append(f"{url} ({kind}): {error!r}")


def test_scrapes_while_processes_stop_and_start(tmp_path: Path, clients) -> None:
    tiering = {"remote": f"file://{tmp_path / 'remote'}", "interval_ms": 200}
    with Cluster(tmp_path / "cluster", brokers=2, tiering=tiering) as cluster:
        clients.create_topic(
            cluster.bootstrap,
            "scraped",
            partitions=4,
            config={"remote.storage.enable": "true", "segment.bytes": str(64 << 10)},
        )
        broker, controller = cluster.brokers[1], cluster.controllers[0]
        sidecar = cluster.tierings[1]
        producer = clients.producer(cluster.bootstrap, {"acks": 1})
        urls = [broker.metrics_url, controller.metrics_url, sidecar.metrics_url]
        with Scraper(urls) as scraper:
            for process in (broker, sidecar, controller):
                for i in range(200):
                    producer.produce("scraped", b"%d" % i + bytes(500))
                producer.flush(30)
                process.stop()
                process.start()
                answered = scraper.answers
                wait_for(lambda a=answered: scraper.answers > a + 4, 60, "scrapes answered")
            assert producer.flush(30) == 0
        assert scraper.failures == []
        assert scraper.answers > 0 and scraper.refused > 0  # it scraped across the restarts
        for process in (broker, sidecar, controller):
            assert "Traceback" not in process.stderr_text(), process.stderr_tail()
