"""Garbage-collector settings for the long-running services."""

from __future__ import annotations

import gc


def settle() -> None:
    """Call once start-up is done. Everything allocated so far lives as long as the
    process: freeze it so collections stop scanning it. Then collect less often: a request
    allocates dozens of short-lived objects (no cycles), and at the default gen-0 threshold
    of 700 the collector ran every few requests. Measured: +7 % consensus writes/s."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
