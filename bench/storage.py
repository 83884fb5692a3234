"""Append throughput of one partition log against the raw sequential-write limit of the
same filesystem, measured side by side in one run.

    python -m bench.storage [--dir DIR] [--rounds N] [--mib N]

For each batch size the rounds alternate: raw `os.write` of same-sized buffers, raw 1 MiB
writes (both into a file whose blocks are reserved first, as the log reserves its own ahead
of its writes), our `PartitionLog.append` (header checks, CRC32C, record framing scan,
offset stamping, index upkeep) and our reserve/commit path (copy into the mapped
preallocated head segment, validate in place). Neither side fsyncs (a sync between
measurements keeps writeback of one out of the next): the flush policy is separate, so both
measure the page-cache write path. Best round of each is reported, with ratios of ours over
each raw figure. A JSON line with every figure closes the output, and the same JSON goes to
bench/results/storage.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.processes import save_results
from directlog.records.batch import Record, build_batch
from services.broker.storage import LogConfig, PartitionLog
from services.broker.storage.log_file import reserve_blocks

# (name, batch bytes, records per batch): 1 KiB of ten ~100 B records, 32 KiB of 1 KiB records.
SHAPES = [("1KiB", 1024, 10), ("32KiB", 32 * 1024, 32)]
POOL = 64  # distinct prebuilt batches, cycled, so no two consecutive appends are identical


def make_batches(size: int, records: int) -> list[bytes]:
    per_record = (size - 61) // records - 12
    now = int(time.time() * 1000)
    pool = []
    for n in range(POOL):
        body = [
            Record(i, now + i, None, bytes([(n + i) % 256]) * per_record) for i in range(records)
        ]
        pool.append(build_batch(body))
    return pool


class Measurement:
    """A workload whose `run` writes `nbytes`; set-up and tear-down (opening and closing the
    log, which fsyncs) stay outside the timed region."""

    def __init__(
        self,
        nbytes: int,
        setup: Callable[[], object],
        run: Callable[[object], None],
        teardown: Callable[[object], None],
    ) -> None:
        self.nbytes, self.setup, self.run, self.teardown = nbytes, setup, run, teardown

    def throughput(self) -> float:
        state = self.setup()
        start = time.perf_counter()
        self.run(state)
        elapsed = time.perf_counter() - start
        self.teardown(state)
        return self.nbytes / elapsed


def raw_writes(path: Path, chunks: list[bytes], count: int) -> Measurement:
    """`count` os.write calls cycling through `chunks`: the same bytes our side writes,
    into a file whose blocks are all reserved before the clock starts (the log reserves
    its own ahead of its writes, see log_file.py, so the limit gets the same help)."""
    nbytes = sum(len(chunks[i % len(chunks)]) for i in range(count))

    def setup() -> int:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        reserve_blocks(fd, 0, nbytes)
        return fd

    def run(fd: object) -> None:
        assert isinstance(fd, int)
        for i in range(count):
            os.write(fd, chunks[i % len(chunks)])

    return Measurement(
        nbytes,
        setup,
        run,
        lambda fd: os.close(fd),  # type: ignore[arg-type]
    )


def log_appends(directory: Path, pool: list[bytes], count: int) -> Measurement:
    def run(log: object) -> None:
        assert isinstance(log, PartitionLog)
        for i in range(count):
            log.append(pool[i % POOL])

    return Measurement(
        sum(len(pool[i % POOL]) for i in range(count)),
        lambda: PartitionLog.open(directory, LogConfig()),
        run,
        lambda log: log.close(),  # type: ignore[attr-defined]
    )


def reserved_commits(directory: Path, pool: list[bytes], count: int) -> Measurement:
    def run(log: object) -> None:
        assert isinstance(log, PartitionLog)
        for i in range(count):
            data = pool[i % POOL]
            reservation = log.reserve(len(data))
            reservation.buffer[:] = data
            log.commit(reservation)

    return Measurement(
        sum(len(pool[i % POOL]) for i in range(count)),
        lambda: PartitionLog.open(directory, LogConfig(preallocate=True)),
        run,
        lambda log: log.close(),  # type: ignore[attr-defined]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("data"), help="filesystem to measure")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=256, help="MiB written per measurement")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-storage-", dir=args.dir))
    figures: dict[str, dict[str, float]] = {}
    try:
        for name, size, records in SHAPES:
            pool = make_batches(size, records)
            batch_size = len(pool[0])
            count = args.mib * (1 << 20) // batch_size
            big = b"\xab" * (1 << 20)
            best = {"raw_same_size": 0.0, "raw_1MiB": 0.0, "append": 0.0, "reserve_commit": 0.0}
            for _ in range(args.rounds):
                runs = {
                    "raw_same_size": raw_writes(work / "raw", pool, count),
                    "raw_1MiB": raw_writes(work / "raw", [big], count * batch_size // len(big)),
                    "append": log_appends(work / f"log-{name}", pool, count),
                    "reserve_commit": reserved_commits(work / f"rlog-{name}", pool, count),
                }
                for key, measurement in runs.items():
                    best[key] = max(best[key], measurement.throughput())
                    for leftover in work.iterdir():
                        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
                    os.sync()  # start each measurement without a writeback backlog
            same, large = best["raw_same_size"], best["raw_1MiB"]
            f = {
                "batch_bytes": batch_size,
                "records_per_batch": records,
                "raw_same_size_MBps": same / 1e6,
                "raw_1MiB_MBps": large / 1e6,
                "append_MBps": best["append"] / 1e6,
                "append_batches_per_s": best["append"] / batch_size,
                "append_vs_same_size": best["append"] / same,
                "append_vs_1MiB": best["append"] / large,
                "reserve_commit_MBps": best["reserve_commit"] / 1e6,
                "reserve_commit_vs_same_size": best["reserve_commit"] / same,
                "reserve_commit_vs_1MiB": best["reserve_commit"] / large,
            }
            figures[name] = f
            print(
                f"{name} batches of {records} records ({batch_size} B):\n"
                f"  raw write, same size   {f['raw_same_size_MBps']:8.1f} MB/s\n"
                f"  raw write, 1 MiB       {f['raw_1MiB_MBps']:8.1f} MB/s\n"
                f"  append                 {f['append_MBps']:8.1f} MB/s "
                f"{f['append_batches_per_s']:9.0f} batches/s  ratio {f['append_vs_same_size']:.2f}"
                f" of same-size writes, {f['append_vs_1MiB']:.2f} of 1 MiB writes\n"
                f"  reserve/commit         {f['reserve_commit_MBps']:8.1f} MB/s "
                f"{f['reserve_commit_MBps'] * 1e6 / batch_size:9.0f} batches/s  ratio "
                f"{f['reserve_commit_vs_same_size']:.2f} of same-size writes, "
                f"{f['reserve_commit_vs_1MiB']:.2f} of 1 MiB writes"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save_results("storage", figures, {"bench": "storage", **figures})


if __name__ == "__main__":
    main()
