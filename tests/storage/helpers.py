"""Helpers shared by the storage tests: an injected clock, batch builders, read-back."""

from __future__ import annotations

import hashlib
from pathlib import Path

from directlog.records.batch import Record, build_batch, decode_records, iter_batches
from directlog.records.compression import Compression
from services.broker.storage import PartitionLog

T0 = 1_700_000_000_000


class ManualClock:
    """Milliseconds that move only when a test says so."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def batch(
    values: list[bytes],
    *,
    ts: int = T0,
    compression: Compression = Compression.NONE,
    **kwargs: object,
) -> bytes:
    """A producer batch (offsets from 0) of one record per value, timestamps ts, ts+1, ..."""
    records = [Record(i, ts + i, b"key-%d" % i, value) for i, value in enumerate(values)]
    return build_batch(records, compression=compression, **kwargs)  # type: ignore[arg-type]


def read_all(log: PartitionLog, start: int = 0, upper: int | None = None) -> list[Record]:
    """Every record from `start` read back through the fetch path."""
    out: list[Record] = []
    offset = start
    end = log.log_end_offset if upper is None else upper
    while offset < end:
        data = log.read(offset, 64 * 1024, upper_offset=upper).records.read()
        if not data:
            break
        for position, header in iter_batches(data):
            out += [r for r in decode_records(data, position, header) if r.offset >= offset]
        offset = out[-1].offset + 1
    return out


def tree_digest(directory: Path) -> dict[str, str]:
    """Content hash of every file below `directory`, to prove nothing changed."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }
