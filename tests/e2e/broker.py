"""Run one Directlog broker as a subprocess for end-to-end tests.

    with BrokerProcess(tmp_path, controllers="127.0.0.1:9190") as broker:
        Producer({"bootstrap.servers": broker.bootstrap})

A broker needs a controller (tests/e2e/cluster.py starts the whole set). It runs
`python -m services.broker` (see service_process.py) on ports picked free once, so a
restarted broker keeps its address, with its data in `<work dir>/data`.
"""

from __future__ import annotations

import re
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.service_process import METRICS_LINE, ServiceProcess
from tests.ports import free_port

_BOOTSTRAP = re.compile(r"^\s*bootstrap servers\s+(\S+:\d+)\s*$", re.MULTILINE)
_LISTENER = re.compile(
    r"^\s*listener (\S+)\s+\S+:\d+, advertised (\S+:\d+)(?: \(\w+\))?\s*$", re.MULTILINE
)


class BrokerProcess(ServiceProcess):
    name = "broker"

    def __init__(
        self,
        work_dir: Path,
        *,
        controllers: str,
        node_id: int = 0,
        settings: dict[str, Any] | None = None,
        host: str = "127.0.0.1",
        command_prefix: Sequence[str] = (),
        stop_timeout: float = 10.0,
    ) -> None:
        """``settings``: BrokerSettings fields, written to a YAML file the broker reads.
        ``host``: the address it binds (Kafka and metrics ports)."""
        super().__init__(work_dir, command_prefix=command_prefix, stop_timeout=stop_timeout)
        self.node_id = node_id
        self.controllers = controllers
        self.settings = dict(settings or {})
        self.host = host
        self.data_dir = self.work_dir / "data"
        # Picked once: a restarted broker comes back at its address, as a real one does.
        self.kafka_port = free_port()  # numbers from loopback serve in a namespace too
        self.metrics_port = free_port()
        self.bootstrap = ""
        self.listeners: dict[str, str] = {}  # name: advertised host:port

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "services.broker", "--host", self.host]
        command += ["--port", str(self.kafka_port), "--metrics-port", str(self.metrics_port)]
        command += ["--data-dir", str(self.data_dir)]
        command += ["--node-id", str(self.node_id), "--controllers", self.controllers]
        if self.settings:
            config = self.work_dir / "broker.yaml"
            config.write_text(yaml.safe_dump(self.settings), encoding="utf-8")
            command += ["--config", str(config)]
        return command

    def banner_read(self, banner: str) -> bool:
        bootstrap, metrics = _BOOTSTRAP.search(banner), METRICS_LINE.search(banner)
        if bootstrap and metrics:
            self.bootstrap, self.metrics_url = bootstrap.group(1), metrics.group(1)
            self.listeners = dict(_LISTENER.findall(banner))
            return True
        return False

    @property
    def port(self) -> int:
        return int(self.bootstrap.rsplit(":", 1)[1])

    # What the broker stored -----------------------------------------------------------

    def stored_batches(self, topic: str, partition: int = 0) -> list[tuple[int, int]]:
        """(compression codec id, record count) of every record batch in the partition's
        segment files, read straight from disk (record batch v2 headers): what the broker
        wrote, whatever the clients see."""
        batches = []
        for segment in sorted((self.data_dir / f"{topic}-{partition}").glob("*.log")):
            data = segment.read_bytes()
            position = 0
            while position + 61 <= len(data):
                (length,) = struct.unpack_from(">i", data, position + 8)
                if length <= 0:
                    break  # preallocated, never written
                if data[position + 16] != 2:
                    raise AssertionError(f"{segment}@{position}: not a v2 record batch")
                (attributes,) = struct.unpack_from(">h", data, position + 21)
                (records,) = struct.unpack_from(">i", data, position + 57)
                batches.append((attributes & 0x7, records))
                position += 12 + length
        return batches
