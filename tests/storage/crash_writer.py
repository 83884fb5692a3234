"""Writer process for the crash test: appends numbered records until it is killed.

Half the batches go through `append`, half through reserve/commit with the region filled in
small slices, so a SIGKILL often lands mid-write and leaves a torn batch in the preallocated
head segment. After each append returns, it prints `acked <last offset>` and flushes stdout:
those offsets must survive the kill."""

from __future__ import annotations

import random
import sys
from pathlib import Path

from directlog.records.batch import Record, build_batch
from directlog.topics import TopicPartition
from services.broker.storage import LogConfig
from services.broker.storage.log_manager import LogManager

CONFIG = LogConfig(preallocate=True, segment_bytes=256 * 1024, index_interval_bytes=1024)
PARTITION = TopicPartition("crash", 0)


def value_for(offset: int) -> bytes:
    return b"record-%08d-" % offset + bytes([offset % 251]) * (offset * 7919 % 4000)


def main(directory: Path, seed: int) -> None:
    rng = random.Random(seed)
    manager = LogManager.open(directory, lambda topic: CONFIG)
    log = manager.create(PARTITION)
    while True:
        first = log.log_end_offset
        count = rng.randint(1, 8)
        data = build_batch(
            [
                Record(i, 1_700_000_000_000 + first + i, None, value_for(first + i))
                for i in range(count)
            ]
        )
        if rng.random() < 0.5:
            result = log.append(data)
        else:
            reservation = log.reserve(len(data))
            for start in range(0, len(data), 16):
                reservation.buffer[start : start + 16] = data[start : start + 16]
            result = log.commit(reservation)
        sys.stdout.write(f"acked {result.last_offset}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
