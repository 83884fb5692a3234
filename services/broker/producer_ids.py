"""Producer ids for InitProducerId: blocks of ids from the active controller (Kafka KIP-730),
handed out one at a time.

The controller gives out each block once, ever (its counter is stored and bumped in the same
fenced transactions as every other write), so ids are unique across brokers, broker
restarts and controller failovers without the broker storing anything: the ids left in a
block when the broker stops are simply never used. Once 90 % of the current block is handed
out the next one is fetched in the background, as Kafka does, so InitProducerId waits on the
controller only when ids are asked for faster than a block arrives.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.rpc import controller_pb2_grpc as rpc

log = logging.getLogger(__name__)

PREFETCH_AT = 0.9  # share of a block handed out when the next one is fetched
PREFETCH_RETRY_SECONDS = 0.2  # after a failed fetch, no prefetch before this long
MAX_WAITERS = 10_000  # next_id calls waiting for a block; more fail at once
PRODUCER_ID_LIMIT = 2**63  # producer ids are int64s from 0 up to, not including, this
Reply = TypeVar("Reply")


class Link(Protocol):
    """What the allocator needs of ControllerLink: the broker's current registration and
    unary calls on the active controller."""

    @property
    def broker_id(self) -> int: ...

    @property
    def broker_epoch(self) -> int: ...

    async def call(
        self,
        method: Callable[[rpc.ControllerStub], Callable[..., Awaitable[Reply]]],
        request: Any,
    ) -> Reply: ...


class ProducerIdAllocator:
    """One per broker. ``next_id`` may be awaited by any number of tasks at once: ids are
    taken without an await in between, and callers that find the block used up wait in
    arrival order for the next one, all on the same single fetch."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._next = 0  # the current block: ids _next to _end - 1 are left
        self._end = 0
        self._prefetch_at = 0  # once _next reaches it, the next block is fetched
        self._ready: tuple[int, int] | None = None  # the next block (first, end), fetched
        self._fetch: asyncio.Task[tuple[int, int]] | None = None  # at most one at a time
        self._no_prefetch_before = 0.0  # loop time
        self._waiters: deque[asyncio.Future[int]] = deque()

    async def next_id(self) -> int:
        """A producer id no one else gets, ever. Raises KafkaError COORDINATOR_NOT_AVAILABLE
        (clients retry InitProducerId on it) when no block can be had from the controller."""
        if not self._waiters:  # waiters come first
            producer_id = self._take()
            if producer_id is not None:
                return producer_id
        if len(self._waiters) >= MAX_WAITERS:
            raise KafkaError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"{MAX_WAITERS} requests already wait for producer ids",
            )
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if self._fetch is None:
            self._start_fetch()
        return await waiter

    async def close(self) -> None:
        """Stop a fetch in flight; its waiters get COORDINATOR_NOT_AVAILABLE."""
        if self._fetch is not None:
            self._fetch.cancel()
            await asyncio.gather(self._fetch, return_exceptions=True)

    def _take(self) -> int | None:
        """The next id of the current block (moving on to a fetched one when it is used
        up), or None when there is none; starts the prefetch once the block is 90 % used."""
        if self._next == self._end and self._ready is not None:
            first, self._end = self._ready
            self._next = first
            self._prefetch_at = first + int((self._end - first) * PREFETCH_AT)
            self._ready = None
        if self._next == self._end:
            return None
        producer_id = self._next
        self._next += 1
        if (
            self._next >= self._prefetch_at
            and self._ready is None
            and self._fetch is None
            and asyncio.get_running_loop().time() >= self._no_prefetch_before
        ):
            self._start_fetch()
        return producer_id

    def _start_fetch(self) -> None:
        task = asyncio.get_running_loop().create_task(self._request())
        task.add_done_callback(self._fetched)
        self._fetch = task

    def _fetched(self, task: asyncio.Task[tuple[int, int]]) -> None:
        """Store the block and hand ids to the waiters in order (fetching again if it was
        not enough), or fail every waiter."""
        self._fetch = None
        error: KafkaError | None = None
        if task.cancelled():
            error = KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the broker is stopping")
        elif isinstance(failure := task.exception(), KafkaError):
            error = failure
        elif failure is not None:
            log.error("fetching producer ids failed", exc_info=failure)
            error = KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"no producer ids: {failure}")
        if error is not None:
            log.warning("%s", error)
            self._no_prefetch_before = asyncio.get_running_loop().time() + PREFETCH_RETRY_SECONDS
            waiters, self._waiters = self._waiters, deque()
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(KafkaError(error.code, str(error)))
            return
        assert self._ready is None, "a block was fetched while another was waiting"
        self._ready = task.result()
        while self._waiters:
            if self._waiters[0].done():  # its caller was cancelled
                self._waiters.popleft()
                continue
            producer_id = self._take()
            if producer_id is None:
                break
            self._waiters.popleft().set_result(producer_id)
        if self._waiters and self._fetch is None:
            self._start_fetch()

    async def _request(self) -> tuple[int, int]:
        """The next block from the active controller, as (first, end)."""
        request = pb.AllocateProducerIdsRequest(
            broker_id=self._link.broker_id, broker_epoch=self._link.broker_epoch
        )
        try:
            reply: pb.AllocateProducerIdsReply = await self._link.call(
                lambda s: s.AllocateProducerIds, request
            )
        except KafkaError as error:  # no controller answered
            raise KafkaError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE, f"no producer ids: {error}"
            ) from error
        if reply.error_code != ErrorCode.NONE:
            raise KafkaError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"no producer ids: the controller answered {reply.error_code} "
                f"({reply.error_message})",
            )
        first, end = reply.first_producer_id, reply.first_producer_id + reply.count
        if not 0 <= first < end <= PRODUCER_ID_LIMIT:
            raise KafkaError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"no producer ids: the controller gave {reply.count} from {first}",
            )
        return first, end
