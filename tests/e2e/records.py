"""Record contents shared by the client tests, and raw requests (a Produce, any other) for
tests that choose every field themselves."""

from __future__ import annotations

import asyncio
import random
import time
import warnings
from typing import Any

from directlog.protocol.api import APIS
from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer import FetchRequest
    from kafka.protocol.producer import ProduceRequest, ProduceResponse


def varied_keys_and_values(
    count: int, seed: int, label: str
) -> list[tuple[bytes | None, bytes | None]]:
    """Keys and values of every shape clients send: null keys, null and empty values,
    random bytes and repetitive (compressible) text."""
    rng = random.Random(seed)
    pairs: list[tuple[bytes | None, bytes | None]] = []
    for i in range(count):
        key = None if i % 97 == 13 else f"{label}-{seed}-{i:05d}".encode()
        value: bytes | None
        if i % 101 == 7:
            value = None
        elif i % 89 == 3:
            value = b""
        elif i % 3 == 0:
            value = rng.randbytes(rng.randint(1, 700))
        else:
            value = (f"{label} {i} of seed {seed}; " * rng.randint(1, 40)).encode()
        pairs.append((key, value))
    return pairs


def recent_base_timestamp() -> int:
    """An hour ago: records older than retention.ms (7 days) could be deleted at once."""
    return int(time.time() * 1000) - 3_600_000


def produce_raw(
    bootstrap: str,
    topic: str,
    batch: bytes,
    *,
    partition: int = 0,
    transactional_id: str | None = None,
) -> tuple[ErrorCode, int]:
    """One acks=all Produce v9 of `batch` to `partition` of `topic` at `bootstrap`,
    whatever its metadata says: (the partition's error code, base offset)."""

    async def produce() -> tuple[int, int]:
        host, port = bootstrap.rsplit(":", 1)
        connection = await KafkaConnection.connect(host, int(port), timeout=10)
        try:
            data = ProduceRequest.TopicProduceData.PartitionProduceData
            request = ProduceRequest(
                version=9,
                transactional_id=transactional_id,
                acks=-1,
                timeout_ms=5000,
                topic_data=[
                    ProduceRequest.TopicProduceData(
                        name=topic, partition_data=[data(index=partition, records=batch)]
                    )
                ],
            )
            response = await connection.request(request, ProduceResponse, "raw-produce-test")
            answer = response.responses[0].partition_responses[0]
            return int(answer.error_code), int(answer.base_offset)
        finally:
            await connection.close()

    code, base_offset = asyncio.run(produce())
    return ErrorCode(code), base_offset


def raw_request(bootstrap: str, message: Any) -> Any:
    """One request to one broker, whatever it leads; its decoded answer."""

    async def send() -> Any:
        host, port = bootstrap.rsplit(":", 1)
        connection = await KafkaConnection.connect(host, int(port), timeout=10)
        try:
            response = APIS[message.API_KEY].response
            return await asyncio.wait_for(connection.request(message, response, "raw-test"), 30)
        finally:
            await connection.close()

    return asyncio.run(send())


def fetch_partition(
    bootstrap: str,
    topic: str,
    offset: int,
    *,
    partition: int = 0,
    version: int = 11,
    rack: str = "",
    epoch: int = -1,
    isolation_level: int = 0,
) -> Any:
    """One consumer Fetch of one partition from `offset` (no long poll), sent to the broker
    at `bootstrap` whatever it leads: its partition answer."""
    wanted: dict[str, Any] = {
        "partition": partition,
        "fetch_offset": offset,
        "partition_max_bytes": 1 << 20,
    }
    if version >= 9:
        wanted["current_leader_epoch"] = epoch
    request = FetchRequest(
        version=version,
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=isolation_level,
        session_id=0,
        session_epoch=-1,
        topics=[
            FetchRequest.FetchTopic(
                topic=topic, partitions=[FetchRequest.FetchTopic.FetchPartition(**wanted)]
            )
        ],
        forgotten_topics_data=[],
        rack_id=rack,
    )
    return raw_request(bootstrap, request).responses[0].partitions[0]
