"""A real Prometheus server (Debian's `prometheus` package, which `make test` installs) for
the monitoring tests: it scrapes the processes of a test's cluster on loopback every
second, evaluates the shipped alert rules, and answers PromQL over its HTTP API. Started on
a free port under the test's directory, stopped by PID.

    with Prometheus(tmp_path, {"broker": ["127.0.0.1:9300"]}, rules) as prometheus:
        prometheus.wait_up(3)
        prometheus.query('sum(kafka_server_replicamanager_leadercount)')
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from tests.e2e.service_process import _terminate_with_parent
from tests.ports import free_port

SCRAPE_INTERVAL = "1s"
START_TIMEOUT = 60.0


class Prometheus:
    """`jobs` maps a job name to the "host:port" targets whose /metrics it scrapes;
    `labels` adds target labels to every target of a job (what a Kubernetes scrape config's
    relabelling would add), `target_labels` to one target ("host:port", over its job's:
    what service discovery gives each pod, such as `pod`), `metric_relabel` rules to a
    job's samples."""

    def __init__(
        self,
        work_dir: Path,
        jobs: Mapping[str, Sequence[str]],
        rule_files: Sequence[Path] = (),
        *,
        labels: Mapping[str, Mapping[str, str]] | None = None,
        metric_relabel: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        target_labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("no prometheus binary: `make test` installs Debian's package")
        self.binary = binary
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "rule_files": [str(Path(f).resolve()) for f in rule_files],
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": _static_configs(
                        targets, (labels or {}).get(job, {}), target_labels or {}
                    ),
                    "metric_relabel_configs": list((metric_relabel or {}).get(job, [])),
                }
                for job, targets in jobs.items()
            ],
        }
        self.config_path = self.work_dir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        log = open(self.work_dir / "prometheus.log", "wb")  # noqa: SIM115 (the child's)
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.work_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_terminate_with_parent,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready in {START_TIMEOUT} s: {self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        path = self.work_dir / "prometheus.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a /api/v1 answer; an error answer raises with Prometheus' words."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as answer:
            body = json.loads(answer.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result: for a vector, one {"metric", "value"} per series."""
        data = self.api("query", query=promql)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def values(self, promql: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query's series as {sorted label pairs: value}."""
        return {
            tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in self.query(promql)
        }

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert pending or firing now."""
        return list(self.api("alerts")["alerts"])

    def wait_up(self, targets: int, timeout: float = 60.0) -> None:
        """Until `targets` scrape targets are up (each scraped at least once)."""
        deadline = time.monotonic() + timeout
        while True:
            up = self.values("up == 1")
            if len(up) >= targets:
                return
            if time.monotonic() > deadline:
                states = self.api("targets")["activeTargets"]
                raise TimeoutError(
                    f"{len(up)} of {targets} targets up: "
                    + "; ".join(f"{t['scrapeUrl']} {t['health']} {t['lastError']}" for t in states)
                )
            time.sleep(0.5)


def _static_configs(
    targets: Sequence[str],
    job_labels: Mapping[str, str],
    target_labels: Mapping[str, Mapping[str, str]],
) -> list[dict[str, Any]]:
    """One static config for the job's targets, or one per target where some have labels
    of their own."""
    if not any(target in target_labels for target in targets):
        return [{"targets": list(targets), "labels": dict(job_labels)}]
    return [
        {"targets": [target], "labels": {**job_labels, **target_labels.get(target, {})}}
        for target in targets
    ]
