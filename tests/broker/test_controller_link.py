"""The broker's link to the controllers keeps it registered: a refused heartbeat (the session
ended, the broker was fenced) makes it register again under a new epoch — but never once it
is stopping, or a broker fenced while it shuts down would come back, and be given
partitions, moments before it exits."""

from __future__ import annotations

import asyncio

import pytest

from services.broker.controller_link import ControllerLink

pytestmark = pytest.mark.timeout(30)


class Scripted(ControllerLink):
    """Heartbeats answered from a script (True: accepted, False: refused); registrations
    counted. No controller is reached."""

    def __init__(self, answers: list[bool]) -> None:
        super().__init__(["127.0.0.1:1"], 0, [], None, 0.001, lambda update: None)
        self.answers = answers
        self.registrations = 0

    async def _register(self) -> None:
        self.registrations += 1
        self.broker_epoch = self.registrations
        self.registered.set()

    async def _heartbeat(self) -> bool:
        if not self.answers:
            await asyncio.Event().wait()  # no more answers: heartbeating on
        return self.answers.pop(0)


def run(link: Scripted, stop_after: int | None) -> int:
    async def drive() -> int:
        task = asyncio.create_task(link._stay_registered())
        if stop_after is not None:
            while link.registrations < stop_after:
                await asyncio.sleep(0)
            link.stopping()
        while link.answers and not task.done():
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return link.registrations

    return asyncio.run(drive())


def test_a_refused_heartbeat_registers_again() -> None:
    assert run(Scripted([True, False, True, False, True]), None) == 3


def test_a_stopping_broker_does_not_register_again() -> None:
    link = Scripted([True, True, False, True])
    assert run(link, stop_after=1) == 1
    assert not link.registered.is_set()
    assert link.answers == [True]  # no heartbeat after the refusal
