"""A minimal asyncio Kafka protocol connection: one request at a time. Brokers use it to
fetch from partition leaders (replication).

`exchange` sends a ready-made request frame and returns the response frame, received with
recv_into straight into one buffer of its size (no stream-buffer copies: fetch responses
carry megabytes of records); `request` does the same for kafka-python message objects.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from typing import Any

from directlog.waits import within

_SIZE = 4
MAX_RESPONSE_BYTES = 1 << 30


class KafkaConnection:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._correlation = itertools.count(1)
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, host: str, port: int, timeout: float) -> KafkaConnection:
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await within(loop.sock_connect(sock, (host, port)), timeout)
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    def next_correlation_id(self) -> int:
        return next(self._correlation)

    async def exchange(self, frame: bytes) -> memoryview:
        """Send one size-prefixed request; the response frame (size prefix stripped)."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            await loop.sock_sendall(self._sock, frame)
            size = int.from_bytes(await self._receive(_SIZE), "big")
            if not 0 <= size <= MAX_RESPONSE_BYTES:
                raise ConnectionError(f"response of {size} bytes")
            return await self._receive(size)

    async def _receive(self, size: int) -> memoryview:
        loop = asyncio.get_running_loop()
        buffer = memoryview(bytearray(size))
        filled = 0
        while filled < size:
            received = await loop.sock_recv_into(self._sock, buffer[filled:])
            if not received:
                raise ConnectionError("connection closed mid-response")
            filled += received
        return buffer

    async def request(self, request: Any, response_class: Any, client_id: str) -> Any:
        """Send `request` (a kafka-python request object with its version set) and decode
        the answer with `response_class` at the same version."""
        correlation_id = self.next_correlation_id()
        request.with_header(correlation_id=correlation_id, client_id=client_id)
        frame = await self.exchange(bytes(request.encode(header=True, framed=True)))
        response = response_class.decode(frame, version=request.API_VERSION, header=True)
        answered = response.header.correlation_id
        if answered != correlation_id:
            raise ConnectionError(f"answer to request {answered}, expected {correlation_id}")
        return response

    async def close(self) -> None:
        self._sock.close()
