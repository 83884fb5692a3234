"""Fixtures of the storage tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from services.broker.storage import LogConfig, PartitionLog
from tests.storage.helpers import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def open_log(tmp_path: Path, clock: ManualClock) -> Callable[..., PartitionLog]:
    """Open the test's log directory with a LogConfig built from keyword arguments."""

    def opener(config: LogConfig | None = None, **kwargs: object) -> PartitionLog:
        return PartitionLog.open(tmp_path / "topic-0", config or LogConfig(), clock=clock, **kwargs)  # type: ignore[arg-type]

    return opener
