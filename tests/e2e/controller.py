"""Run one Directlog controller as a subprocess for end-to-end tests.

    with Ensemble(tmp_path, size=1) as ens:
        ens.start().wait_serving()
        with ControllerProcess(tmp_path, ens.hosts, settings={"broker_session_timeout_ms": 1500}):
            ...

The controller runs `python -m services.controller --id N --config <dir>/controller.yaml`
from the repository root, with its settings in that YAML file and its stdout and stderr in
files of its directory (`<work dir>/controller-<id>`). Its gRPC and metrics ports are picked
free once, when the object is made: `address` is known before `start()` (to put in a
broker's config) and stays the same across restarts.
It is stopped by PID (SIGTERM, then SIGKILL after a timeout), can be SIGKILLed or paused on
purpose (`kill()`, `pause()` / `resume()`), and dies with the test process if that dies
first.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import yaml

from directlog.rpc.controller_pb2_grpc import ControllerStub
from tests.e2e.service_process import METRICS_LINE, ServiceProcess
from tests.ports import free_port

_ADDRESS = re.compile(r"^\s*controller\s+(\S+:\d+)\s*$", re.MULTILINE)

# Quick failover on loopback, with room for a loaded test machine.
TEST_SETTINGS: dict[str, Any] = {"consensus_session_timeout_ms": 2000}


class ControllerProcess(ServiceProcess):
    name = "controller"

    def __init__(
        self,
        work_dir: Path,
        consensus: str,
        *,
        controller_id: int = 1,
        settings: dict[str, Any] | None = None,
        host: str = "127.0.0.1",
        command_prefix: Sequence[str] = (),
    ) -> None:
        """``consensus``: the ensemble's connect string (``Ensemble.hosts``). ``settings``:
        ControllerSettings overrides (e.g. ``broker_session_timeout_ms``, ``root``), over
        TEST_SETTINGS. ``host``: the address it binds."""
        super().__init__(
            Path(work_dir) / f"controller-{controller_id}", command_prefix=command_prefix
        )
        self.controller_id = controller_id
        self.host = host
        self.config_path = self.work_dir / "controller.yaml"
        self.settings = {**TEST_SETTINGS, **(settings or {}), "consensus": consensus}
        self.port = free_port()
        self.metrics_port = free_port()
        self.address = f"{host}:{self.port}"  # its gRPC server
        self.metrics_url = f"http://{host}:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        self.config_path.write_text(yaml.safe_dump(self.settings), encoding="utf-8")
        return [
            sys.executable, "-m", "services.controller", "--id", str(self.controller_id),
            "--config", str(self.config_path), "--host", self.host,
            "--port", str(self.port), "--metrics-port", str(self.metrics_port),
        ]  # fmt: skip

    def banner_read(self, banner: str) -> bool:
        address, metrics = _ADDRESS.search(banner), METRICS_LINE.search(banner)
        if address and metrics:
            assert (address.group(1), metrics.group(1)) == (self.address, self.metrics_url)
            return True
        return False

    def channel(self) -> grpc.Channel:
        """A new channel to its gRPC server; the caller closes it."""
        return grpc.insecure_channel(self.address)

    def stub(self, channel: grpc.Channel) -> ControllerStub:
        return ControllerStub(channel)  # type: ignore[no-untyped-call]
