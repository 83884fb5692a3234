"""What the confluent-style Producer and Consumer share: the rdma.* configuration keys, the
event loop thread the RDMA datapaths run on, and finding a partition's leader."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import weakref
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import KafkaException

PROVIDERS = ("auto", "shm", "tcp", "pyverbs")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RdmaConfig:
    """The rdma.* keys, taken out of a confluent configuration dict (librdkafka refuses
    keys it does not know)."""

    produce: str  # off, exclusive or shared
    consume: bool
    provider: str
    read_size: int

    @classmethod
    def take(cls, config: dict[str, Any]) -> RdmaConfig:
        produce = str(config.pop("rdma.produce", "off")).lower()
        if produce not in ("off", "exclusive", "shared"):
            raise KafkaException(f"rdma.produce must be off, exclusive or shared, not {produce}")
        consume = config.pop("rdma.consume", False)
        if isinstance(consume, str):
            if consume.lower() not in ("true", "false"):
                raise KafkaException(f"rdma.consume must be true or false, not {consume}")
            consume = consume.lower() == "true"
        provider = str(config.pop("rdma.provider", "auto"))
        if provider not in PROVIDERS:
            raise KafkaException(f"rdma.provider must be one of {', '.join(PROVIDERS)}")
        raw_size = config.pop("rdma.read.size", 2048)
        try:
            read_size = int(raw_size)
        except (TypeError, ValueError):
            message = f"rdma.read.size must be a number of bytes, not {raw_size}"
            raise KafkaException(message) from None
        if read_size < 64:
            raise KafkaException("rdma.read.size must be at least 64 bytes")
        return cls(produce, bool(consume), provider, read_size)


class LoopThread:
    """An asyncio loop on a daemon thread: the RDMA datapaths are asyncio code, while the
    confluent API the application calls is synchronous and thread-safe.

    A program may end without closing its client (confluent-kafka's Producer has no
    close; a flush and exit is its normal end): the loop's tasks are then cancelled and
    awaited at interpreter exit, so nothing is destroyed pending."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._stop = weakref.finalize(self, _stop_loop, self.loop, self._thread)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.submit(coroutine).result(timeout)

    def stop(self) -> None:
        self._stop()


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Cancel and await the loop's tasks, then stop and close it (once)."""
    if loop.is_closed():
        return
    if thread.is_alive():
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(_cancel_tasks(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    loop.close()


async def _cancel_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def leader_address(client: Any, topic: str, partition: int, timeout: float) -> str:
    """ "host:port" of the partition's leader, from a confluent client's metadata."""
    metadata = client.list_topics(topic, timeout=timeout)
    topic_metadata = metadata.topics.get(topic)
    if topic_metadata is None or topic_metadata.error is not None:
        raise KafkaException(f"no metadata for {topic}: {getattr(topic_metadata, 'error', None)}")
    found = topic_metadata.partitions.get(partition)
    if found is None or found.leader < 0 or found.leader not in metadata.brokers:
        raise KafkaException(f"{topic}-{partition} has no leader now")
    broker = metadata.brokers[found.leader]
    return f"{broker.host}:{broker.port}"
