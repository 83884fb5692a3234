"""Record contents shared by the client tests."""

from __future__ import annotations

import random
import time


def varied_keys_and_values(
    count: int, seed: int, label: str
) -> list[tuple[bytes | None, bytes | None]]:
    """Keys and values of every shape clients send: null keys, null and empty values,
    random bytes and repetitive (compressible) text."""
    rng = random.Random(seed)
    pairs: list[tuple[bytes | None, bytes | None]] = []
    for i in range(count):
        key = None if i % 97 == 13 else f"{label}-{seed}-{i:05d}".encode()
        value: bytes | None
        if i % 101 == 7:
            value = None
        elif i % 89 == 3:
            value = b""
        elif i % 3 == 0:
            value = rng.randbytes(rng.randint(1, 700))
        else:
            value = (f"{label} {i} of seed {seed}; " * rng.randint(1, 40)).encode()
        pairs.append((key, value))
    return pairs


def recent_base_timestamp() -> int:
    """An hour ago: records older than retention.ms (7 days) could be deleted at once."""
    return int(time.time() * 1000) - 3_600_000
