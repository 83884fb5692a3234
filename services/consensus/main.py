"""`python -m services.consensus --id N --config FILE` / `directlog-consensus`: run one
ensemble member in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import uvloop
from pydantic import ValidationError

from directlog import heap
from services.consensus.connections import ClientServer
from services.consensus.member import Member
from services.consensus.settings import ConsensusSettings, parse_address
from services.consensus.tls import client_port_context


async def run_member(settings: ConsensusSettings, member_id: int, stop: asyncio.Event) -> None:
    member = Member(settings, member_id)
    clients = ClientServer(member)
    addresses = settings.members[member_id]
    metrics_url = "off"
    if addresses.metrics is not None:
        host, port = parse_address(addresses.metrics)
        metrics_url = f"http://{host}:{member.metrics.serve(host, port, member.readiness)}/metrics"
    await member.start()
    heap.settle()
    plain = secure = "off"
    if addresses.client is not None:
        host, port = parse_address(addresses.client)
        plain = f"{host}:{await clients.start(host, port)}"
    if addresses.secure_client is not None:
        host, port = parse_address(addresses.secure_client)
        secure = f"{host}:{await clients.start(host, port, client_port_context(settings))}"
    print(
        f"Directlog consensus member {member_id} ready\n"
        f"  clients    {plain}\n"
        f"  secure     {secure}\n"
        f"  peers      {addresses.peer}"
        f"{' (TLS)' if settings.quorum_tls is not None else ''}\n"
        f"  metrics    {metrics_url}\n"
        f"  data       {settings.member_dir(member_id).resolve()}\n"
        f"  ensemble   {len(member.dynamic.voters)} voters, "
        f"{len(member.dynamic.observers)} observers (configuration {member.dynamic.version:#x}), "
        f"quorum {settings.quorum}, "
        f"force_sync {settings.force_sync}",
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        await clients.stop()
        await member.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="directlog-consensus", description=__doc__)
    parser.add_argument("--id", type=int, required=True, help="this member's id in the config")
    parser.add_argument("--config", type=Path, required=True, help="the ensemble's YAML file")
    parser.add_argument("--data-dir", type=Path, help="override data_dir from the config")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s member {args.id} %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = ConsensusSettings.load(args.config, data_dir=args.data_dir)
    except (FileNotFoundError, ValidationError) as exc:
        sys.exit(f"directlog-consensus: bad configuration: {exc}")
    if args.id not in settings.members:
        sys.exit(f"directlog-consensus: member {args.id} is not in {args.config}")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_member(settings, args.id, stop)

    uvloop.run(run())
