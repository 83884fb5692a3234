"""An S3-compatible HTTP server for tiered storage tests: moto's server as a service process
on 127.0.0.1 and a free port, stopped by PID.

    with S3Server(tmp_path) as s3:
        StoreConfig(f"s3://{s3.bucket}/prefix", **s3.settings)

`outage()` makes it unreachable for a while without losing its objects (moto keeps them
in memory only): the process is paused (SIGSTOP), so connections hang, then resumed.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

import pyarrow.fs as pafs

from tests.e2e.service_process import ServiceProcess
from tests.ports import free_port

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
START_TIMEOUT = 60.0


class S3Server(ServiceProcess):
    name = "s3"

    def __init__(self, work_dir: Path, bucket: str = "directlog") -> None:
        super().__init__(work_dir, start_timeout=START_TIMEOUT)
        self.bucket = bucket
        self.port = free_port()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def settings(self) -> dict[str, str]:
        """StoreConfig's S3 fields for this server."""
        return {
            "s3_endpoint": self.endpoint,
            "s3_region": REGION,
            "s3_access_key": ACCESS_KEY,
            "s3_secret_key": SECRET_KEY,
        }

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]

    def banner_read(self, banner: str) -> bool:
        """moto writes no banner to stdout: it is ready once its port takes connections."""
        with socket.socket() as probe:
            probe.settimeout(0.2)
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def start(self) -> Self:
        super().start()
        self.file_system().create_dir(self.bucket)
        return self

    def file_system(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            scheme="http",
            endpoint_override=f"127.0.0.1:{self.port}",
            allow_bucket_creation=True,
        )

    @contextmanager
    def outage(self) -> Iterator[None]:
        """Unreachable while inside: the server is paused, then resumed."""
        self.pause()
        try:
            yield
        finally:
            self.resume()
