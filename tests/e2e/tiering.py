"""Run one tiering service (services/tiering) as a subprocess for end-to-end tests, beside
one broker whose tiering gRPC port it is given.

    TieringProcess(tmp_path / "tiering-0", broker="127.0.0.1:40123", settings={...})
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.service_process import METRICS_LINE, ServiceProcess
from tests.ports import free_port


class TieringProcess(ServiceProcess):
    name = "tiering"

    def __init__(self, work_dir: Path, *, broker: str, settings: dict[str, Any]) -> None:
        """``settings``: TieringSettings fields (remote, s3_*, intervals), in a YAML file."""
        super().__init__(work_dir)
        self.broker = broker
        self.settings = dict(settings)
        self.metrics_port = free_port()

    def command(self) -> list[str]:
        config = self.work_dir / "tiering.yaml"
        config.write_text(yaml.safe_dump(self.settings), encoding="utf-8")
        return [
            sys.executable, "-m", "services.tiering", "--broker", self.broker,
            "--metrics-host", "127.0.0.1", "--metrics-port", str(self.metrics_port),
            "--config", str(config),
        ]  # fmt: skip

    def banner_read(self, banner: str) -> bool:
        metrics = METRICS_LINE.search(banner)
        if metrics:
            self.metrics_url = metrics.group(1)
            return True
        return False
