"""What the confluent-style Producer and Consumer share: the rdma.* configuration keys, the
event loop thread the RDMA datapaths run on, and finding a partition's leader."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
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
        read_size = int(config.pop("rdma.read.size", 2048))
        if read_size < 64:
            raise KafkaException("rdma.read.size must be at least 64 bytes")
        return cls(produce, bool(consume), provider, read_size)


class LoopThread:
    """An asyncio loop on a daemon thread: the RDMA datapaths are asyncio code, while the
    confluent API the application calls is synchronous and thread-safe."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.submit(coroutine).result(timeout)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


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
