"""`python -m services.tiering` / `directlog-tiering`: the tiering service beside one broker,
in the foreground until SIGINT or SIGTERM.

It reaches its broker over gRPC (``--broker``, the broker's tiering_port, localhost in a
pod), reads the broker's log directories on the volume both share, and writes to the
remote store (``--remote``: file://, s3:// or hdfs://). A store that cannot be reached is
tried again every round; nothing local is deleted meanwhile, since only the broker deletes
local segments, and only once they are remote.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import uvloop

from directlog import heap
from directlog.remote.store import RemoteStore
from services.tiering.broker_link import BrokerLink
from services.tiering.manager import RemoteLogManager
from services.tiering.metrics import TieringMetrics
from services.tiering.settings import TieringSettings

log = logging.getLogger("directlog.tiering")


async def run_tiering(settings: TieringSettings, stop: asyncio.Event) -> None:
    os.nice(settings.niceness)
    store = RemoteStore(settings.store_config())
    metrics = TieringMetrics()
    link = BrokerLink(settings.broker, settings.broker_tls, settings.broker_tls_server_name)
    manager = RemoteLogManager(settings, link, store, metrics)
    metrics_port = metrics.serve(settings.metrics_host, settings.metrics_port, manager.readiness)
    print(
        "Directlog tiering service ready\n"
        f"  broker             {settings.broker}\n"
        f"  remote store       {store.root_uri}\n"
        f"  metrics            http://{settings.metrics_host}:{metrics_port}/metrics\n"
        "  stop with Ctrl-C",
        flush=True,
    )
    heap.settle()
    try:
        await manager.run(stop)
    finally:
        log.info("stopping")
        manager.close()
        await link.close()
        log.info("stopped cleanly")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="directlog-tiering", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML settings file")
    parser.add_argument("--broker", help="host:port of the broker's tiering gRPC service")
    parser.add_argument("--remote", help="the remote store: file:///dir, s3://bucket/prefix, ...")
    parser.add_argument("--metrics-host")
    parser.add_argument("--metrics-port", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = TieringSettings.load(
        args.config,
        broker=args.broker,
        remote=args.remote,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
    )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await run_tiering(settings, stop)

    uvloop.run(run())
