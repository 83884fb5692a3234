"""What the pipeline's runner needs of the cluster, through confluent-kafka: its topics made,
their end offsets, and the records a run added to one of them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

TIMEOUT = 30.0

# Per topic, per partition: an offset.
Offsets = dict[str, dict[int, int]]


def ensure_topics(
    bootstrap: str,
    topics: Iterable[str],
    partitions: int,
    replication: int,
    config: dict[str, str] | None = None,
) -> list[str]:
    """Create the topics that do not exist yet, with `config` (those that do are left as
    they are); returns the ones created."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=TIMEOUT).topics
    wanted = [t for t in dict.fromkeys(topics) if t not in existing]
    if not wanted:
        return []
    futures = admin.create_topics(
        [
            NewTopic(
                t, num_partitions=partitions, replication_factor=replication, config=config or {}
            )
            for t in wanted
        ],
        operation_timeout=TIMEOUT,
        request_timeout=TIMEOUT,
    )
    for future in futures.values():
        try:
            future.result(TIMEOUT)
        except KafkaException as error:  # made meanwhile by someone else: as good
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    _await_leaders(admin, wanted)
    return wanted


def _await_leaders(admin: AdminClient, topics: list[str]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        metadata = admin.list_topics(timeout=TIMEOUT).topics
        if all(
            t in metadata
            and metadata[t].error is None
            and metadata[t].partitions
            and all(p.leader >= 0 for p in metadata[t].partitions.values())
            for t in topics
        ):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {topics} have no leaders after {TIMEOUT} s")
        time.sleep(0.1)


def _client(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"traffic-{uuid.uuid4().hex[:8]}",  # never joined nor committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
        }
    )


def end_offsets(bootstrap: str, topics: Iterable[str]) -> Offsets:
    """Every partition's high watermark."""
    client = _client(bootstrap)
    try:
        found: Offsets = {}
        for topic in topics:
            meta = client.list_topics(topic, timeout=TIMEOUT).topics[topic]
            if meta.error is not None:
                raise KafkaException(meta.error)
            found[topic] = {
                p: client.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT)[1]
                for p in sorted(meta.partitions)
            }
        return found
    finally:
        client.close()


def read_since(bootstrap: str, topic: str, start: dict[int, int]) -> list[bytes]:
    """The values of the records of `topic` from `start` (per partition; a partition not
    named is read from 0) up to the high watermarks, partition after partition."""
    ends = end_offsets(bootstrap, [topic])[topic]
    client = _client(bootstrap)
    values: list[bytes] = []
    try:
        for partition, end in ends.items():
            first = start.get(partition, 0)
            if first >= end:
                continue
            client.assign([TopicPartition(topic, partition, first)])
            deadline = time.monotonic() + TIMEOUT
            position = first
            while position < end:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}-{partition}: read up to {position} of {end}")
                # consume() waits for all it asks for: ask no more than is there.
                for message in client.consume(min(1000, end - position), 1.0):
                    if message.error() is not None:
                        raise KafkaException(message.error())
                    offset, value = message.offset(), message.value()
                    assert offset is not None and value is not None, "a record, not an event"
                    if offset < end:
                        values.append(value)
                    position = offset + 1
        return values
    finally:
        client.close()
