"""`python -m services.monitor` (`make monitor`): Prometheus in the foreground, scraping the
local cluster of `make run` with Directlog's alert rules loaded.

Every process is scraped under the job name its kind has everywhere (JOBS): the alert rules
in deploy/helm/directlog/rules/ select their series by these names, and so must any scrape
configuration that feeds them (the Helm chart's ServiceMonitors set `job` to the same).

The targets are not written here: `make run` (services/local_cluster.py) writes them when it
starts, one Prometheus file-based service discovery file per job under
``<data-dir>/monitor/targets/``, so Prometheus scrapes the processes of the cluster that runs,
however many brokers it was started with, and follows a cluster restarted with another
count without being restarted itself. Each target carries the labels Kubernetes service
discovery gives the chart's pods (`pod_labels`: namespace, pod, container; a tiering
service shares its broker's pod, as the sidecar does), which the dashboards in
deploy/helm/directlog/dashboards/ select by. Prometheus' configuration and its data go under
``<data-dir>/monitor/`` too. Debian's `prometheus` package provides the server (`make
monitor` installs it when it is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

JOB_BROKER = "directlog-broker"
JOB_CONTROLLER = "directlog-controller"
JOB_CONSENSUS = "directlog-consensus"
JOB_TIERING = "directlog-tiering"
JOBS = (JOB_BROKER, JOB_CONTROLLER, JOB_CONSENSUS, JOB_TIERING)

RULES_DIR = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "directlog" / "rules"
# A broker's scrape may wait up to 6 s for its event loop (services/broker/kafka_exporter.py),
# so the interval, which bounds the scrape timeout, stays above that.
SCRAPE_INTERVAL = "10s"
DEFAULT_LISTEN = "127.0.0.1:9090"
LOCAL_NAMESPACE = "local"  # the `namespace` label of the local cluster's targets


def monitor_dir(data_dir: Path) -> Path:
    return data_dir / "monitor"


def targets_path(data_dir: Path, job: str) -> Path:
    return monitor_dir(data_dir) / "targets" / f"{job}.json"


def pod_labels(pod: str, container: str) -> dict[str, str]:
    """A local process's target labels: those of the chart's pod and container it stands
    for ("directlog-broker-0", "tiering")."""
    return {"namespace": LOCAL_NAMESPACE, "pod": pod, "container": container}


def write_targets(data_dir: Path, targets: Mapping[str, Mapping[str, Mapping[str, str]]]) -> None:
    """Write each job's metrics addresses ("host:port"), each with its target labels, as
    file-based service discovery files, one per job in JOBS (a job not in `targets` gets
    none). Each file is replaced whole, so Prometheus never reads half of one."""
    unknown = set(targets) - set(JOBS)
    assert not unknown, f"jobs {sorted(unknown)} are not in {JOBS}"
    for job in JOBS:
        path = targets_path(data_dir, job)
        path.parent.mkdir(parents=True, exist_ok=True)
        groups = [
            {"targets": [address], "labels": dict(labels)}
            for address, labels in targets.get(job, {}).items()
        ]
        partial = path.with_name(path.name + ".tmp")
        partial.write_text(json.dumps(groups, indent=2) + "\n", encoding="utf-8")
        os.replace(partial, path)


def prometheus_config(data_dir: Path) -> dict[str, Any]:
    """One scrape job per kind of process, its targets from the discovery files, and the
    alert rules."""
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [str(RULES_DIR / "*.yaml")],
        "scrape_configs": [
            {
                "job_name": job,
                "file_sd_configs": [{"files": [str(targets_path(data_dir, job).resolve())]}],
            }
            for job in JOBS
        ],
    }


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((host, int(port))) == 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="monitor", description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--listen", default=DEFAULT_LISTEN, help="Prometheus' web address")
    args = parser.parse_args(argv)
    binary = shutil.which("prometheus")
    if binary is None:
        sys.exit("no prometheus binary: `make monitor` installs Debian's package")
    if _listening(args.listen):
        sys.exit(
            f"{args.listen} is taken (a Prometheus already running? Debian's package starts "
            "one as a system service where systemd runs: `systemctl stop prometheus`); "
            "`make monitor MONITOR_ADDRESS=127.0.0.1:9091` listens elsewhere"
        )
    directory = monitor_dir(args.data_dir).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if not any(targets_path(args.data_dir, job).exists() for job in JOBS):
        print(
            f"no targets under {directory / 'targets'} yet: `make run` writes them when it "
            "starts, and Prometheus picks them up then",
            flush=True,
        )
    config = directory / "prometheus.yml"
    config.write_text(
        "# Written by `python -m services.monitor` (make monitor); changes are overwritten.\n"
        + yaml.safe_dump(prometheus_config(args.data_dir), sort_keys=False),
        encoding="utf-8",
    )
    print(
        "Prometheus for the local cluster\n"
        f"  UI, alerts          http://{args.listen}/ and http://{args.listen}/alerts\n"
        f"  targets             http://{args.listen}/targets\n"
        f"  rules               {RULES_DIR}/*.yaml (reload: curl -X POST "
        f"http://{args.listen}/-/reload)\n"
        f"  configuration, data {directory}\n"
        "  stop with Ctrl-C",
        flush=True,
    )
    # Prometheus takes this process's place, so Ctrl-C and signals reach it directly.
    os.execv(
        binary,
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address={args.listen}",
            "--web.enable-lifecycle",
        ],
    )


if __name__ == "__main__":
    main()
