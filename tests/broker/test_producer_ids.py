"""The broker's producer id allocator against a fake controller link: ids in block order,
the next block fetched in the background at 90 %, concurrent callers never sharing an id,
and every failure to get a block turned into an error clients retry."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from services.broker.controller_link import ControllerUnavailableError
from services.broker.producer_ids import ProducerIdAllocator

pytestmark = pytest.mark.timeout(30)

WAIT = 5.0  # bound of every await in these tests


class FakeController:
    """The link and the controller stub in one: ``call`` hands the allocator's method
    selector this object as the stub. Blocks of ``size`` ids follow each other from 0;
    ``gate`` (when set) holds every answer until it opens; ``refuse`` / ``unavailable``
    make the next answers fail."""

    def __init__(self, size: int = 10) -> None:
        self.broker_id = 3
        self.broker_epoch = 12
        self.size = size
        self.next_first = 0
        self.requests: list[pb.AllocateProducerIdsRequest] = []
        self.gate: asyncio.Event | None = None
        self.refuse: ErrorCode | None = None
        self.unavailable = False
        self.reply: pb.AllocateProducerIdsReply | None = None  # answered as is

    async def call(
        self, method: Callable[[Any], Callable[..., Awaitable[Any]]], request: Any
    ) -> Any:
        return await method(self)(request, timeout=10.0)

    async def AllocateProducerIds(
        self, request: pb.AllocateProducerIdsRequest, timeout: float
    ) -> pb.AllocateProducerIdsReply:
        self.requests.append(request)
        if self.gate is not None:
            await self.gate.wait()
        if self.unavailable:
            raise ControllerUnavailableError("no active controller among [...]")
        if self.reply is not None:
            return self.reply
        if self.refuse is not None:
            return pb.AllocateProducerIdsReply(
                error_code=self.refuse, error_message=f"{self.refuse.name}, register again"
            )
        first, self.next_first = self.next_first, self.next_first + self.size
        return pb.AllocateProducerIdsReply(first_producer_id=first, count=self.size)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(WAIT):
            await scenario()

    asyncio.run(bounded())


async def settle() -> None:
    """Let background fetches run to completion (the fake answers without delay)."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_ids_come_from_consecutive_blocks_with_the_current_broker_epoch() -> None:
    async def scenario() -> None:
        link = FakeController(size=10)
        allocator = ProducerIdAllocator(link)
        ids = [await allocator.next_id() for _ in range(5)]
        link.broker_epoch = 13  # registered again
        ids += [await allocator.next_id() for _ in range(20)]
        await settle()
        assert ids == list(range(25))
        assert [(r.broker_id, r.broker_epoch) for r in link.requests] == [
            (3, 12),
            (3, 13),  # the prefetch at 90 % of the first block, after the new registration
            (3, 13),  # at 90 % of the second
        ]
        await allocator.close()

    run(scenario)


def test_the_next_block_is_fetched_at_90_percent_so_no_caller_waits() -> None:
    async def scenario() -> None:
        link = FakeController(size=1000)
        allocator = ProducerIdAllocator(link)
        for expected in range(899):
            assert await allocator.next_id() == expected
        await settle()
        assert len(link.requests) == 1
        assert await allocator.next_id() == 899  # the 900th: 90 % handed out
        await settle()
        assert len(link.requests) == 2  # fetched in the background
        link.gate = asyncio.Event()  # from now on the controller would keep callers waiting
        for expected in range(900, 1900):
            assert await allocator.next_id() == expected  # never waited on the gate
        await settle()
        assert len(link.requests) == 3  # the third block is on its way, held at the gate
        link.gate.set()
        assert await allocator.next_id() == 1900
        await allocator.close()

    run(scenario)


def test_odd_block_sizes_and_offsets_are_taken_as_given() -> None:
    async def scenario() -> None:
        link = FakeController(size=1)
        link.next_first = 5000
        allocator = ProducerIdAllocator(link)
        assert [await allocator.next_id() for _ in range(3)] == [5000, 5001, 5002]
        await allocator.close()

    run(scenario)


def test_concurrent_callers_never_share_an_id() -> None:
    async def scenario() -> None:
        link = FakeController(size=10)
        link.gate = asyncio.Event()
        allocator = ProducerIdAllocator(link)
        callers = [asyncio.create_task(allocator.next_id()) for _ in range(250)]
        await settle()
        assert len(link.requests) == 1  # all of them wait on the one fetch
        link.gate.set()
        ids = await asyncio.gather(*callers)
        assert sorted(ids) == list(range(250))  # unique, and no block wasted
        assert ids[:10] == list(range(10))  # served in arrival order
        assert len(link.requests) <= 26
        await allocator.close()

    run(scenario)


def test_a_cancelled_caller_does_not_stall_the_others() -> None:
    async def scenario() -> None:
        link = FakeController(size=10)
        link.gate = asyncio.Event()
        allocator = ProducerIdAllocator(link)
        first, second = (asyncio.create_task(allocator.next_id()) for _ in range(2))
        await settle()
        first.cancel()
        link.gate.set()
        assert await second == 0
        assert first.cancelled()
        await allocator.close()

    run(scenario)


@pytest.mark.parametrize(
    "failure", ["unavailable", "stale epoch", "not registered", "exhausted", "bad block"]
)
def test_failures_are_coordinator_not_available_to_every_waiter(failure: str) -> None:
    async def scenario() -> None:
        link = FakeController(size=10)
        if failure == "unavailable":
            link.unavailable = True
        elif failure == "stale epoch":
            link.refuse = ErrorCode.STALE_BROKER_EPOCH
        elif failure == "not registered":
            link.refuse = ErrorCode.BROKER_ID_NOT_REGISTERED
        elif failure == "exhausted":
            link.refuse = ErrorCode.UNKNOWN_SERVER_ERROR
        else:
            link.reply = pb.AllocateProducerIdsReply(first_producer_id=2**63 - 5, count=10)
        allocator = ProducerIdAllocator(link)
        results = await asyncio.gather(
            *(allocator.next_id() for _ in range(3)), return_exceptions=True
        )
        assert len(link.requests) == 1
        for result in results:
            assert isinstance(result, KafkaError), result
            assert result.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
            assert "no producer ids" in str(result)
        # The controller answers again: the next call fetches anew.
        link.unavailable, link.refuse, link.reply = False, None, None
        assert await allocator.next_id() == 0
        await allocator.close()

    run(scenario)


def test_a_failed_prefetch_leaves_the_current_block_usable_and_is_retried() -> None:
    async def scenario() -> None:
        link = FakeController(size=10)
        allocator = ProducerIdAllocator(link)
        assert [await allocator.next_id() for _ in range(8)] == list(range(8))
        link.unavailable = True
        assert await allocator.next_id() == 8  # starts the prefetch, which fails
        await settle()
        assert len(link.requests) == 2
        link.unavailable = False
        assert await allocator.next_id() == 9  # within the retry back-off: no new prefetch
        await settle()
        assert len(link.requests) == 2
        assert await allocator.next_id() == 10  # used up: fetched now, back-off or not
        await allocator.close()

    run(scenario)


def test_close_fails_the_waiters() -> None:
    async def scenario() -> None:
        link = FakeController()
        link.gate = asyncio.Event()
        allocator = ProducerIdAllocator(link)
        waiter = asyncio.create_task(allocator.next_id())
        await settle()
        await allocator.close()
        with pytest.raises(KafkaError) as error:
            await waiter
        assert error.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE

    run(scenario)
