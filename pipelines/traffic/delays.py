"""The job's delay records (job.py, step 4) read back, and their percentiles."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


@dataclass(frozen=True, slots=True)
class Delay:
    """One event's: where it was read from, when it was created and read (epoch ms)."""

    topic: str
    partition: int
    offset: int
    created: int
    read: int
    delay_ms: int

    @classmethod
    def decode(cls, value: bytes) -> Delay:
        fields = json.loads(value)
        return cls(
            fields["topic"],
            fields["partition"],
            fields["offset"],
            fields["created"],
            fields["read"],
            fields["delay_ms"],
        )


def percentile(ordered: Sequence[int], point: float) -> int:
    """The nearest-rank percentile of sorted values (point in 0-100]."""
    if not ordered:
        raise ValueError("no values")
    rank = max(1, math.ceil(point / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(delays: Sequence[Delay]) -> dict[str, float]:
    """count, mean, min, the PERCENTILES (as "p50", ...) and max of the delays, in ms."""
    ordered = sorted(d.delay_ms for d in delays)
    if not ordered:
        return {"count": 0}
    found: dict[str, float] = {
        "count": len(ordered),
        "mean": sum(ordered) / len(ordered),
        "min": ordered[0],
    }
    for point in PERCENTILES:
        found[f"p{point:g}"] = percentile(ordered, point)
    found["max"] = ordered[-1]
    return found
