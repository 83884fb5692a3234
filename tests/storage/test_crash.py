"""SIGKILL a writer mid-append, then recover: every acknowledged record is there, in order,
intact, and nothing torn is served."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from directlog.records.batch import iter_batches, verify_crc
from services.broker.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManager
from tests.storage.crash_writer import CONFIG, PARTITION, value_for
from tests.storage.helpers import read_all

ROOT = Path(__file__).resolve().parents[2]


def run_and_kill(directory: Path, seed: int, acks_before_kill: int) -> int:
    """Run the writer until it has acknowledged enough appends, SIGKILL it, and return the
    highest acknowledged offset."""
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.crash_writer", str(directory), str(seed)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked = -1
    seen = 0
    deadline = time.monotonic() + 60
    try:
        assert writer.stdout is not None
        while seen < acks_before_kill and time.monotonic() < deadline:
            line = writer.stdout.readline()
            if not line:
                break
            acked = int(line.split()[1])
            seen += 1
        time.sleep(random.Random(seed).uniform(0, 0.02))  # land anywhere in the next append
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        late, errors = writer.communicate(timeout=30)
    assert seen == acks_before_kill, f"writer stopped early: {errors}"
    for line in late.split("\n")[:-1]:  # whole lines acknowledged while we slept count too
        if line.startswith("acked "):
            acked = int(line.split()[1])
    return acked


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", range(6))
def test_acknowledged_records_survive_sigkill(tmp_path: Path, seed: int):
    directory = tmp_path / "logs"
    acked = -1
    for round_number in range(3):  # kill, recover and carry on writing, three times over
        acked = max(acked, run_and_kill(directory, seed * 10 + round_number, 40 + 37 * seed))
        assert not (directory / CLEAN_SHUTDOWN_FILE).exists()
        manager = LogManager.open(directory, lambda topic: CONFIG)
        log = manager.get(PARTITION)
        assert log is not None
        assert log.log_end_offset > acked
        records = read_all(log)
        assert [r.offset for r in records] == list(range(log.log_end_offset))
        assert all(r.value == value_for(r.offset) for r in records)
        for segment in log.segments:
            data = segment.log.read(0, segment.size)
            assert sum(h.size for _, h in iter_batches(data)) == segment.size
            for position, header in iter_batches(data):
                verify_crc(data, position, header)
        head = log.segments[-1]
        assert os.path.getsize(head.log.path) == CONFIG.segment_bytes  # preallocated again
        manager.close()
