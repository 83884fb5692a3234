"""The images, built once per session by `make images`: the same entry point as CI's and a
developer's, so a test run builds what it checks (a second build reuses the layer cache)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.images.engine import REPO, engine_answers

BUILD_TIMEOUT = 1800  # a cold build from an empty engine, with room for a slow mirror


@pytest.fixture(scope="session")
def images() -> None:
    try:
        done = subprocess.run(
            ["make", "-C", str(REPO), "--no-print-directory", "images"],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"make images did not finish within {BUILD_TIMEOUT} s: {error}")
    if done.returncode == 0:
        return
    output = f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    message = f"make images failed (exit {done.returncode}):\n{output}"
    if not engine_answers() and not os.environ.get("CI"):
        pytest.skip(f"no container engine runs on this machine; {message}")
    pytest.fail(message)
