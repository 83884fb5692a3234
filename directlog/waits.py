"""Waiting with a deadline without ever losing a cancellation.

In Python 3.11 `asyncio.wait_for` can swallow the waiting task's cancellation when what it
waits for completes at the same moment (fixed in 3.12). A loop that waits that way can run
on after it was cancelled, and a shutdown that awaits it hangs. `asyncio.timeout` has no
such race, so every deadline in directlog/ and services/ goes through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Until `event` is set (True) or `seconds` have passed (False)."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """`awaitable`'s result, or TimeoutError after `seconds` (it is then cancelled)."""
    async with asyncio.timeout(seconds):
        return await awaitable
