"""Metadata streams: one bounded queue per watching broker.

The controller pushes each update to every queue without waiting; a broker that reads too
slowly fills its queue and loses its stream (it watches again and starts from a full
image), so no broker can hold up the controller or grow its memory without bound.
"""

from __future__ import annotations

import asyncio
from collections import deque

import grpc

from directlog.rpc.controller_pb2 import MetadataUpdate


class Subscription:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.ended: tuple[grpc.StatusCode, str] | None = None  # why the stream ends
        self._updates: deque[MetadataUpdate] = deque()
        self._wake = asyncio.Event()

    def push(self, update: MetadataUpdate) -> None:
        if self.ended is not None:
            return
        if len(self._updates) >= self.limit:
            self.end(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"more than {self.limit} metadata updates unread: watch again",
            )
            return
        self._updates.append(update)
        self._wake.set()

    def end(self, code: grpc.StatusCode, details: str) -> None:
        """End the stream now; what was not read yet is dropped."""
        if self.ended is None:
            self.ended = (code, details)
            self._updates.clear()
            self._wake.set()

    async def next(self) -> MetadataUpdate | None:
        """The next update, or None once the stream has ended (see ``ended``)."""
        while not self._updates:
            if self.ended is not None:
                return None
            self._wake.clear()
            await self._wake.wait()
        return self._updates.popleft()
