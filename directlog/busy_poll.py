"""Keep an event loop polling for a while after work instead of sleeping at once.

A process that sleeps in `epoll_wait` pays for a wake-up when its next message comes: an
interrupt to an idle CPU (on a VM, a halted vCPU the hypervisor must resume) and caches
gone cold meanwhile. A write through a consensus ensemble crosses several processes in
turn and pays that at every hop. After `touch()`, BusyPoll keeps the loop turning with
zero-timeout polls for `seconds`, so a message that arrives in that window is read
without a wake-up; each turn first yields the CPU (`sched_yield`), so the polling takes
only time that no other runnable process on that CPU wants. It is halt polling (the
kernel's cpuidle-haltpoll) done by the process, at the cost of up to `seconds` of CPU
after each burst of work.
"""

from __future__ import annotations

import asyncio
import os
import time


class BusyPoll:
    """Touched on the event loop it keeps polling."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._until = 0.0
        self._polling = False

    def touch(self) -> None:
        """Work was done: poll for `seconds` from now before the loop may sleep."""
        if self._seconds <= 0:
            return
        self._until = time.monotonic() + self._seconds
        if not self._polling:
            self._polling = True
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        # A ready callback makes the loop's next poll a zero-timeout one.
        if time.monotonic() < self._until:
            os.sched_yield()
            asyncio.get_running_loop().call_soon(self._turn)
        else:
            self._polling = False
