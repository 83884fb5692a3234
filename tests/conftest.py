"""Hypothesis profiles: `ci` (the default under CI=true) keeps property tests quick and
deterministic; `dev` explores more. And the S3 server the tiered storage tests share."""

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.s3_server import S3Server

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=150, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """An S3-compatible HTTP server (moto's) for the module's tiered storage tests."""
    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server
