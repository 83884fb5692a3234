"""`python -m services.local_cluster`: the local cluster of `make run` in the foreground.

Three consensus members (clients on 127.0.0.1:2181-2183), two controllers (the active one
and a standby, gRPC on 127.0.0.1:9190-9191) and ``--brokers`` brokers (Kafka on
127.0.0.1:9092 and up), each its own process with its data under ``--data-dir``. The
members start first, the others once the ensemble serves. Ctrl-C,
SIGINT or SIGTERM stops them all; if any of them exits, the others are stopped too and the
exit code says so.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from services.consensus.fourletter import mode_of

CONSENSUS_MEMBERS = 3
CONTROLLERS = 2
CONTROLLER_PORT = 9190
CONTROLLER_METRICS_PORT = 9390
BROKER_PORT = 9092
BROKER_METRICS_PORT = 9308
MAX_BROKERS = 9
ENSEMBLE_WAIT = 60.0  # seconds the others wait for the ensemble to serve, then start anyway


def consensus_config(data_dir: Path) -> Path:
    members = {
        i: {
            "client": f"127.0.0.1:{2180 + i}",
            "peer": f"127.0.0.1:{2880 + i}",
            "metrics": f"127.0.0.1:{7180 + i}",
        }
        for i in range(1, CONSENSUS_MEMBERS + 1)
    }
    path = data_dir / "consensus.yaml"
    data_dir.mkdir(parents=True, exist_ok=True)
    config = {"members": members, "data_dir": str((data_dir / "consensus").resolve())}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="local_cluster", description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--brokers", type=int, default=3)
    args = parser.parse_args(argv)
    if not 1 <= args.brokers <= MAX_BROKERS:
        sys.exit(f"--brokers {args.brokers}: between 1 and {MAX_BROKERS}")
    config = consensus_config(args.data_dir)
    python = sys.executable
    commands = [
        [python, "-m", "services.consensus", "--id", str(i), "--config", str(config)]
        for i in range(1, CONSENSUS_MEMBERS + 1)
    ]
    ensemble = ",".join(f"127.0.0.1:{2180 + i}" for i in range(1, CONSENSUS_MEMBERS + 1))
    controllers = [f"127.0.0.1:{CONTROLLER_PORT + i}" for i in range(CONTROLLERS)]
    commands += [
        [
            python, "-m", "services.controller", "--id", str(i),
            "--host", "127.0.0.1", "--port", str(CONTROLLER_PORT + i),
            "--metrics-port", str(CONTROLLER_METRICS_PORT + i), "--consensus", ensemble,
        ]
        for i in range(CONTROLLERS)
    ]  # fmt: skip
    brokers = [f"127.0.0.1:{BROKER_PORT + i}" for i in range(args.brokers)]
    commands += [
        [
            python, "-m", "services.broker", "--node-id", str(i),
            "--host", "127.0.0.1", "--port", str(BROKER_PORT + i),
            "--metrics-port", str(BROKER_METRICS_PORT + i),
            "--controllers", ",".join(controllers),
            "--data-dir", str(args.data_dir / f"broker-{i}"),
        ]
        for i in range(args.brokers)
    ]  # fmt: skip
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    # Kafka's offsets topic wants three replicas; a smaller cluster gets what it has. The
    # RDMA datapaths are on (for topics with preallocate=true; the provider is auto: shm
    # on one host), so directlog.client's rdma.* settings work against it.
    env = {
        **os.environ,
        "DIRECTLOG_OFFSETS_TOPIC_REPLICATION_FACTOR": str(min(args.brokers, 3)),
        "DIRECTLOG_RDMA_PRODUCE": "true",
        "DIRECTLOG_RDMA_CONSUME": "true",
        "DIRECTLOG_RDMA_REPLICATION": "true",
    }

    def start(command: list[str]) -> subprocess.Popen[bytes]:
        # In a process group of its own: Ctrl-C reaches only us, and we stop them in order.
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env, process_group=0)

    processes = [start(c) for c in commands[:CONSENSUS_MEMBERS]]
    # The controllers start once the ensemble serves, so their first connections succeed.
    deadline = time.monotonic() + ENSEMBLE_WAIT
    while not stopping and time.monotonic() < deadline and all(p.poll() is None for p in processes):
        if all(mode_of(2180 + i, timeout=1.0) for i in range(1, CONSENSUS_MEMBERS + 1)):
            break
        time.sleep(0.1)
    if not stopping:
        processes += [start(c) for c in commands[CONSENSUS_MEMBERS:]]
    print(
        "Directlog local cluster\n"
        f"  consensus (ZooKeeper protocol)  {ensemble}\n"
        f"  controllers (gRPC)              {','.join(controllers)}\n"
        f"  Kafka bootstrap servers         {','.join(brokers)}\n"
        "  RDMA datapaths                  produce, consume, push replication "
        "(topics with preallocate=true)\n"
        "  metrics                         "
        + ", ".join(
            f"http://127.0.0.1:{port}/metrics"
            for port in [
                *(7180 + i for i in range(1, CONSENSUS_MEMBERS + 1)),
                *(CONTROLLER_METRICS_PORT + i for i in range(CONTROLLERS)),
                *(BROKER_METRICS_PORT + i for i in range(args.brokers)),
            ]
        )
        + "\n"
        f"  data                            {args.data_dir.resolve()}\n"
        "  stop with Ctrl-C",
        flush=True,
    )
    failed = None
    while not stopping and failed is None:
        time.sleep(0.2)
        failed = next((p for p in processes if p.poll() is not None), None)
    # Brokers first, then controllers, then the ensemble they use: nothing loses what it
    # depends on while it shuts down.
    services = CONSENSUS_MEMBERS + CONTROLLERS
    for tier in (
        processes[services:],
        processes[CONSENSUS_MEMBERS:services],
        processes[:CONSENSUS_MEMBERS],
    ):
        for p in tier:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in tier:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if failed is not None and not stopping:
        name = " ".join(str(a) for a in commands[processes.index(failed)][2:5])
        sys.exit(f"local cluster: {name} exited with {failed.returncode}")


if __name__ == "__main__":
    main()
