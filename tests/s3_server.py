"""An S3-compatible HTTP server for tiered storage tests: moto's server as a subprocess on
127.0.0.1 and a free port, stopped by PID.

    with S3Server(tmp_path) as s3:
        StoreConfig(f"s3://{s3.bucket}/prefix", **s3.settings)

`outage()` makes it unreachable for a while without losing its objects (moto keeps them
in memory only): the process is stopped with SIGSTOP, so connections hang, then continued.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

import pyarrow.fs as pafs

from tests.ports import free_port

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
START_TIMEOUT = 60.0


class S3Server:
    def __init__(self, work_dir: Path, bucket: str = "directlog") -> None:
        self.work_dir = Path(work_dir)
        self.bucket = bucket
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

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

    def start(self) -> Self:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.work_dir / "s3-server.log", "wb")  # noqa: SIM115 - the child's
        with log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"},
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not _listening(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the S3 server did not start: see {self.work_dir}")
            time.sleep(0.05)
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
        """Unreachable while inside: the server is stopped (SIGSTOP), then continued."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0
