"""`python -m services.controller --id N --config FILE` / `directlog-controller`: run one
controller process (active or standby) in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import grpc
import uvloop
from pydantic import ValidationError

from directlog import heap
from directlog.rpc import controller_pb2_grpc
from directlog.security import grpc_tls
from services.controller.controller import Controller
from services.controller.metrics import ControllerMetrics
from services.controller.service import ControllerService
from services.controller.settings import ControllerSettings

log = logging.getLogger("directlog.controller")

STOP_GRACE = 1.0  # seconds for in-flight RPCs when stopping


async def run_controller(settings: ControllerSettings, stop: asyncio.Event) -> None:
    metrics = ControllerMetrics()
    controller = Controller(settings, metrics)
    metrics_port = metrics.serve(settings.host, settings.metrics_port, controller.readiness)
    server = grpc.aio.server()
    controller_pb2_grpc.add_ControllerServicer_to_server(  # type: ignore[no-untyped-call]
        ControllerService(controller), server
    )
    port = grpc_tls.add_port(server, f"{settings.host}:{settings.port}", settings.grpc_tls)
    if port == 0:
        raise OSError(f"cannot listen on {settings.host}:{settings.port}")
    await server.start()
    address = f"{settings.advertised_host or settings.host}:{port}"
    controller.start(address)
    print(
        f"Directlog controller {settings.controller_id} ready (active or standby)\n"
        f"  controller        {address}\n"
        f"  metrics           http://{settings.host}:{metrics_port}/metrics\n"
        f"  consensus         {settings.consensus}\n"
        f"  root              {settings.root}\n"
        f"  stop with Ctrl-C",
        flush=True,
    )
    heap.settle()
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        await controller.stop()  # resigns first: a standby takes over, streams end now
        await server.stop(STOP_GRACE)
        log.info("stopped cleanly")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="directlog-controller", description=__doc__)
    parser.add_argument("--id", type=int, help="this controller's id (controller_id)")
    parser.add_argument("--config", type=Path, help="YAML settings file")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument("--consensus", help="ZooKeeper connect string of the ensemble")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s controller {args.id} %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kazoo").setLevel(logging.WARNING)  # it logs every reconnect attempt
    try:
        settings = ControllerSettings.load(
            args.config,
            controller_id=args.id,
            host=args.host,
            port=args.port,
            metrics_port=args.metrics_port,
            consensus=args.consensus,
        )
    except ValidationError as exc:
        sys.exit(f"directlog-controller: bad configuration: {exc}")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await run_controller(settings, stop)

    uvloop.run(run())
