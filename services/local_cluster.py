"""`python -m services.local_cluster`: the local cluster of `make run` in the foreground.

Three consensus members (clients on 127.0.0.1:2181-2183), two controllers (the active one
and a standby, gRPC on 127.0.0.1:9190-9191) and ``--brokers`` brokers (Kafka on
127.0.0.1:9092 and up), each its own process with its data under ``--data-dir``. The
members start first, the others once the ensemble serves; beside every broker runs its
tiering service, with the remote store in ``<data-dir>/remote`` unless
DIRECTLOG_TIERING_REMOTE names another. They are supervised the way a kubelet would
(services/supervisor.py): a process that exits, whatever its exit code or signal, is
logged and started again after a back-off (1 s, doubling up to 30 s), while the others
keep serving. Only Ctrl-C, SIGINT or SIGTERM stops them all: tiering services, brokers,
controllers, then members, each tier given 15 s before SIGKILL.

Every process serves its metrics on a fixed port (members 127.0.0.1:7181-7183, controllers
9390-9391, brokers 9308 and up, tiering services 9408 and up), and at start the cluster
writes them, by Prometheus job and labelled as the chart's pods, as file-based service
discovery files under ``<data-dir>/monitor/targets/``, which `make monitor`
(services/monitor.py) scrapes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from services.consensus.fourletter import mode_of
from services.local_security import LocalSecurity
from services.monitor import (
    JOB_BROKER,
    JOB_CONSENSUS,
    JOB_CONTROLLER,
    JOB_TIERING,
    pod_labels,
    write_targets,
)
from services.supervisor import ProcessSpec, Supervisor

CONSENSUS_MEMBERS = 3
CONTROLLERS = 2
CONTROLLER_PORT = 9190
CONTROLLER_METRICS_PORT = 9390
BROKER_PORT = 9092
BROKER_METRICS_PORT = 9308
MAX_BROKERS = 9
ENSEMBLE_WAIT = 60.0  # seconds the others wait for the ensemble to serve, then start anyway
# Tiers stop highest first: brokers, then the controllers they use, then the ensemble.
CONSENSUS_TIER = 0
CONTROLLER_TIER = 1
BROKER_TIER = 2
TIERING_TIER = 3  # stops first: it only copies, and its broker goes on serving reads
TIERING_PORT = 9393  # each broker's gRPC port for its tiering service, and up
TIERING_METRICS_PORT = 9408


def consensus_config(data_dir: Path, security: LocalSecurity | None = None) -> Path:
    """The ensemble file; secured, the members serve clients on TLS ports only."""
    client = "client" if security is None else "secure_client"
    members = {
        i: {
            client: f"127.0.0.1:{2180 + i}",
            "peer": f"127.0.0.1:{2880 + i}",
            "metrics": f"127.0.0.1:{7180 + i}",
        }
        for i in range(1, CONSENSUS_MEMBERS + 1)
    }
    path = data_dir / "consensus.yaml"
    data_dir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "members": members,
        "data_dir": str((data_dir / "consensus").resolve()),
        **(security.consensus() if security is not None else {}),
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="local_cluster", description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument(
        "--secure", action="store_true", help="every connection authenticated and encrypted"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.brokers <= MAX_BROKERS:
        sys.exit(f"--brokers {args.brokers}: between 1 and {MAX_BROKERS}")
    security = LocalSecurity.prepare(args.data_dir) if args.secure else None
    config = consensus_config(args.data_dir, security)
    python = sys.executable
    # Kafka's offsets topic wants three replicas; a smaller cluster gets what it has. The
    # RDMA datapaths are on (for topics with preallocate=true; the provider is auto: shm
    # on one host), so directlog.client's rdma.* settings work against it.
    # Tiered storage is on, with a tiering service beside every broker; the remote store is
    # a directory under the data (DIRECTLOG_TIERING_REMOTE and DIRECTLOG_TIERING_S3_* point
    # brokers and tiering services at another, S3 for one).
    remote = os.environ.get("DIRECTLOG_TIERING_REMOTE") or (
        f"file://{(args.data_dir / 'remote').resolve()}"
    )
    env = {
        **os.environ,
        "DIRECTLOG_OFFSETS_TOPIC_REPLICATION_FACTOR": str(min(args.brokers, 3)),
        "DIRECTLOG_REMOTE_LOG_STORAGE_SYSTEM_ENABLE": "true",
        "DIRECTLOG_TIERING_REMOTE": remote,
    }
    if security is None:  # RDMA moves bytes unencrypted: off when every link must be TLS
        env.update(
            DIRECTLOG_RDMA_PRODUCE="true",
            DIRECTLOG_RDMA_CONSUME="true",
            DIRECTLOG_RDMA_REPLICATION="true",
        )
    controller_env = env if security is None else {**env, **security.controller_env()}
    tiering_env = env if security is None else {**env, **security.tiering_env()}
    members = [
        ProcessSpec(
            f"consensus {i}",
            (python, "-m", "services.consensus", "--id", str(i), "--config", str(config)),
            env,
            CONSENSUS_TIER,
        )
        for i in range(1, CONSENSUS_MEMBERS + 1)
    ]
    ensemble = ",".join(f"127.0.0.1:{2180 + i}" for i in range(1, CONSENSUS_MEMBERS + 1))
    controllers = [f"127.0.0.1:{CONTROLLER_PORT + i}" for i in range(CONTROLLERS)]
    brokers = [f"127.0.0.1:{BROKER_PORT + i}" for i in range(args.brokers)]
    # Metrics addresses by Prometheus job, each labelled as the chart's pod and container
    # (a tiering service is its broker's sidecar).
    metrics = {
        JOB_CONSENSUS: {
            f"127.0.0.1:{7180 + i}": pod_labels(f"directlog-consensus-{i - 1}", "consensus")
            for i in range(1, CONSENSUS_MEMBERS + 1)
        },
        JOB_CONTROLLER: {
            f"127.0.0.1:{CONTROLLER_METRICS_PORT + i}": pod_labels(
                f"directlog-controller-{i}", "controller"
            )
            for i in range(CONTROLLERS)
        },
        JOB_BROKER: {
            f"127.0.0.1:{BROKER_METRICS_PORT + i}": pod_labels(f"directlog-broker-{i}", "broker")
            for i in range(args.brokers)
        },
        JOB_TIERING: {
            f"127.0.0.1:{TIERING_METRICS_PORT + i}": pod_labels(f"directlog-broker-{i}", "tiering")
            for i in range(args.brokers)
        },
    }
    write_targets(args.data_dir, metrics)
    # One entry per kind of process; each process is restarted by its name.
    others = [
        *(
            ProcessSpec(
                f"controller {i}",
                (
                    python, "-m", "services.controller", "--id", str(i),
                    "--host", "127.0.0.1", "--port", str(CONTROLLER_PORT + i),
                    "--metrics-port", str(CONTROLLER_METRICS_PORT + i), "--consensus", ensemble,
                ),
                controller_env,
                CONTROLLER_TIER,
            )
            for i in range(CONTROLLERS)
        ),
        *(
            ProcessSpec(
                f"broker {i}",
                (
                    python, "-m", "services.broker", "--node-id", str(i),
                    "--host", "127.0.0.1", "--port", str(BROKER_PORT + i),
                    "--metrics-port", str(BROKER_METRICS_PORT + i),
                    "--controllers", ",".join(controllers),
                    "--data-dir", str(args.data_dir / f"broker-{i}"),
                ),
                {
                    **env,
                    "DIRECTLOG_TIERING_PORT": str(TIERING_PORT + i),
                    **(security.broker_env(BROKER_PORT + i) if security is not None else {}),
                },
                BROKER_TIER,
            )
            for i in range(args.brokers)
        ),
        *(
            ProcessSpec(
                f"tiering {i}",
                (
                    python, "-m", "services.tiering",
                    "--broker", f"127.0.0.1:{TIERING_PORT + i}",
                    "--metrics-port", str(TIERING_METRICS_PORT + i),
                ),
                tiering_env,
                TIERING_TIER,
            )
            for i in range(args.brokers)
        ),
    ]  # fmt: skip
    supervisor = Supervisor()
    signal.signal(signal.SIGINT, lambda signum, frame: supervisor.request_stop())
    signal.signal(signal.SIGTERM, lambda signum, frame: supervisor.request_stop())
    supervisor.start(members)
    # The controllers start once the ensemble serves, so their first connections succeed.
    # Members that exit meanwhile are restarted like any other process.
    deadline = time.monotonic() + ENSEMBLE_WAIT
    while not supervisor.stop_requested and time.monotonic() < deadline:
        supervisor.poll_once()
        probe = security.member_probe() if security is not None else None
        if all(mode_of(2180 + i, timeout=1.0, tls=probe) for i in range(1, CONSENSUS_MEMBERS + 1)):
            break
        time.sleep(0.1)
    if not supervisor.stop_requested:
        supervisor.start(others)
    lines = [
        "Directlog local cluster",
        f"  consensus (ZooKeeper protocol)  {ensemble}",
        f"  controllers (gRPC)              {','.join(controllers)}",
        f"  Kafka bootstrap servers         {','.join(brokers)}",
    ]
    if security is None:
        lines.append(
            "  RDMA datapaths                  produce, consume, push replication "
            "(topics with preallocate=true)"
        )
    lines += [
        f"  tiered storage                  {remote} (topics with remote.storage.enable=true)",
        "  metrics                         "
        + ", ".join(f"http://{a}/metrics" for targets in metrics.values() for a in targets),
        f"  data                            {args.data_dir.resolve()}",
    ]
    if security is not None:
        lines.append("  secured (SASL_SSL, SCRAM-SHA-512, ACLs): a Kafka client connects with")
        lines.append(security.client_settings(",".join(brokers)).rstrip("\n"))
    lines.append("  stop with Ctrl-C")
    print("\n".join(lines), flush=True)
    supervisor.run()


if __name__ == "__main__":
    main()
