"""`python -m services.broker` / `directlog-broker`: run one broker in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import uuid
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import uvloop

from directlog import heap
from directlog.topics import TopicPartition
from services.broker.apis import KafkaApis
from services.broker.metrics import BrokerMetrics
from services.broker.server import KafkaServer
from services.broker.settings import BrokerSettings
from services.broker.storage import LogConfig
from services.broker.storage.log_manager import LogManager
from services.broker.topics import TopicRegistry

log = logging.getLogger("directlog.broker")


def cluster_id(data_dir: Path) -> str:
    """The cluster id kept in `meta.properties` (Kafka's file), made on first start."""
    meta = data_dir / "meta.properties"
    if meta.exists():
        for line in meta.read_text(encoding="utf-8").splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
    new_id = uuid.uuid4().hex[:22]
    meta.write_text(f"version=1\ncluster.id={new_id}\n", encoding="utf-8")
    return new_id


async def run_broker(settings: BrokerSettings, stop: asyncio.Event) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    defaults = LogConfig.from_properties(settings.log_defaults)
    topics = TopicRegistry(settings.data_dir / "topics.json", defaults)
    logs = LogManager.open(settings.data_dir, topics.config_for)
    for topic in topics.topics.values():
        for index in range(topic.partitions):
            logs.create(TopicPartition(topic.name, index), topics.config_for(topic.name))
    metrics = BrokerMetrics()
    metrics.watch_logs(logs)
    metrics_port = metrics.serve(settings.host, settings.metrics_port)
    apis = KafkaApis(settings, logs, topics, metrics, cluster_id(settings.data_dir))
    server = KafkaServer(apis, metrics, settings.socket_request_max_bytes)
    apis.port = await server.start(settings.host, settings.port)
    print(
        f"Directlog broker {settings.node_id} ready\n"
        f"  bootstrap servers  {apis.host}:{apis.port}\n"
        f"  metrics            http://{settings.host}:{metrics_port}/metrics\n"
        f"  data               {settings.data_dir.resolve()}\n"
        f"  stop with Ctrl-C",
        flush=True,
    )
    heap.settle()
    fsyncs = ThreadPoolExecutor(1, thread_name_prefix="housekeeping")
    housekeeping = asyncio.get_running_loop().create_task(_housekeeping(logs, settings, fsyncs))
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        housekeeping.cancel()
        await server.close()
        fsyncs.shutdown(wait=True)  # a flush still running must end before the logs close
        logs.close()
        log.info("stopped cleanly")


async def _housekeeping(logs: LogManager, settings: BrokerSettings, fsyncs: Executor) -> None:
    """flush.ms, retention and checkpoints, off the request path (fsyncs on their thread)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(settings.housekeeping_interval_ms / 1000)
        try:
            logs.enforce_retention()
            await loop.run_in_executor(fsyncs, logs.flush_due)
            await loop.run_in_executor(fsyncs, logs.checkpoint)
        except Exception:
            log.exception("housekeeping round failed")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="directlog-broker", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML settings file")
    parser.add_argument("--node-id", type=int)
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--metrics-port", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = BrokerSettings.load(
        args.config,
        node_id=args.node_id,
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        metrics_port=args.metrics_port,
    )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await run_broker(settings, stop)

    uvloop.run(run())
