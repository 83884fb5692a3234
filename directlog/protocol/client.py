"""A minimal asyncio Kafka protocol connection: one request at a time, kafka-python's message
classes for the bytes. Brokers use it to fetch from partition leaders (replication)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

_SIZE = 4


class KafkaConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._correlation = itertools.count(1)
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float) -> KafkaConnection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=1 << 24), timeout
        )
        return cls(reader, writer)

    async def request(self, request: Any, response_class: Any, client_id: str) -> Any:
        """Send `request` (a kafka-python request object with its version set) and decode
        the answer with `response_class` at the same version."""
        version = request.API_VERSION
        async with self._lock:
            correlation_id = next(self._correlation)
            request.with_header(correlation_id=correlation_id, client_id=client_id)
            self._writer.write(bytes(request.encode(header=True, framed=True)))
            await self._writer.drain()
            size = int.from_bytes(await self._reader.readexactly(_SIZE), "big")
            frame = await self._reader.readexactly(size)
        response = response_class.decode(frame, version=version, header=True)
        answered = response.header.correlation_id
        if answered != correlation_id:
            raise ConnectionError(f"answer to request {answered}, expected {correlation_id}")
        return response

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
