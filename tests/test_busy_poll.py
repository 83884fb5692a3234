"""BusyPoll keeps the loop turning for its window after a touch, then lets it sleep, and
never holds up the loop's other work."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from directlog.busy_poll import BusyPoll

pytestmark = pytest.mark.timeout(30)

LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    return LOOPS[request.param]


@pytest.fixture
def turns(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each polling turn ran (every turn yields the CPU first)."""
    seen: list[float] = []
    real = os.sched_yield

    def counted() -> None:
        seen.append(time.monotonic())
        real()

    monkeypatch.setattr(os, "sched_yield", counted)
    return seen


def test_polls_for_its_window_then_stops(run: Any, turns: list[float]) -> None:
    poll = BusyPoll(0.05)

    async def main() -> float:
        touched = time.monotonic()
        poll.touch()
        await asyncio.sleep(0.3)
        return touched

    touched = run(main())
    assert len(turns) > 10  # it turned all through the window ...
    assert turns[-1] >= touched + 0.05 - 0.005  # ... to its end ...
    assert turns[-1] < touched + 0.25  # ... and no further while the loop slept
    assert not poll._polling


def test_a_touch_while_polling_extends_the_window(run: Any, turns: list[float]) -> None:
    poll = BusyPoll(0.05)

    async def main() -> float:
        poll.touch()
        await asyncio.sleep(0.03)
        again = time.monotonic()
        poll.touch()
        await asyncio.sleep(0.3)
        return again

    again = run(main())
    assert turns[-1] >= again + 0.05 - 0.005
    assert turns[-1] < again + 0.25


def test_zero_seconds_never_polls(run: Any, turns: list[float]) -> None:
    poll = BusyPoll(0.0)

    async def main() -> None:
        poll.touch()
        await asyncio.sleep(0.05)

    run(main())
    assert turns == []


def test_input_and_timers_are_served_while_polling(run: Any, turns: list[float]) -> None:
    """Polling is loop turns, not a loop of its own: a timer and data arriving on a socket
    are both served during the window, when they are due rather than after it."""
    poll = BusyPoll(0.5)
    events: list[str] = []
    times: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        left, right = socket.socketpair()
        left.setblocking(False)
        right.setblocking(False)
        with left, right:
            got = loop.create_future()
            loop.add_reader(left, lambda: got.set_result(left.recv(64)))
            start = time.monotonic()
            poll.touch()
            loop.call_later(0.02, lambda: (events.append("timer"), times.append(time.monotonic())))
            await asyncio.sleep(0.05)
            right.send(b"hello")
            events.append((await asyncio.wait_for(got, 5)).decode())
            times.append(time.monotonic())
            loop.remove_reader(left)
            times[:] = [t - start for t in times]

    run(main())
    assert events == ["timer", "hello"]
    assert times[1] < 0.4  # both well inside the 0.5 s window
    assert len(turns) > 10
