"""The container engine for the image tests: `docker` commands, and containers that are
removed when their test ends.

Images are built by `make images` (deploy/images/build.py), the same entry point CI uses;
containers run the images' own entrypoints, either offline (`--network none`, for content
checks) or on the host's network bound to 127.0.0.1 (no bridge exists, and no test traffic
goes anywhere but loopback).
"""

from __future__ import annotations

import os
import subprocess
import time
import tomllib
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

REPO = Path(__file__).resolve().parents[2]
DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")
SERVICES = ("broker", "controller", "consensus", "tiering")
IMAGES = (*SERVICES, "spark")
# Waits that only bound a test which would otherwise hang: a busy engine may be slow, so
# they are generous, and nothing asserts on how long anything took.
COMMAND_TIMEOUT = 300.0
START_TIMEOUT = 180.0


def version() -> str:
    with open(REPO / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def image(name: str) -> str:
    return f"directlog/{name}:{version()}"


def docker(
    *args: str, check: bool = True, timeout: float = COMMAND_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DOCKER, *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def engine_answers() -> bool:
    try:
        return docker("info", check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run(
    name: str, *command: str, entrypoint: str | None = None, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`docker run --rm` of image ``name`` offline: its entrypoint, or ``entrypoint``, with
    ``command`` as arguments. Not checked: tests look at the exit code and the output."""
    options = ["--rm", "--network", "none"]
    if entrypoint is not None:
        options += ["--entrypoint", entrypoint]
    if user is not None:
        options += ["--user", user]
    return docker("run", *options, image(name), *command, check=False)


class Container:
    """A detached container of a Directlog image on the host's network, ready once its
    banner (``ready``) is in its output; removed (``docker rm -f``) on exit."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        ready: str,
        volumes: Sequence[tuple[Path, str]] = (),
    ) -> None:
        self.image = image(name)
        self.command = list(command)
        self.ready = ready
        self.volumes = list(volumes)
        self.name = f"directlog-test-{name}-{uuid.uuid4().hex[:8]}"

    def __enter__(self) -> Self:
        options = ["--detach", "--name", self.name, "--network", "host"]
        options += ["--label", "directlog.test=images"]
        for source, target in self.volumes:
            options += ["--volume", f"{source}:{target}:ro"]
        docker("run", *options, self.image, *self.command)
        try:
            self.wait_ready()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.remove()

    def logs(self) -> str:
        done = docker("logs", self.name, check=False)
        return done.stdout + done.stderr

    def running(self) -> bool:
        done = docker("inspect", "--format", "{{.State.Running}}", self.name, check=False)
        return done.stdout.strip() == "true"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            logs = self.logs()
            if self.ready in logs:
                return
            if not self.running():
                raise AssertionError(f"{self.name} exited before {self.ready!r}:\n{logs}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {self.ready!r} in time:\n{logs}")
            time.sleep(0.2)

    def remove(self) -> None:
        docker("rm", "--force", "--volumes", self.name, check=False)
