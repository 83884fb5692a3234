"""A process that writes record batches over RDMA, for the e2e tests of writers dying
mid-write and of writers sharing a partition:
``python -m tests.e2e.rdma_writer LEADER TOPIC PROVIDER [MODE NAME BATCHES]``.

Batch i holds records with values ``<NAME>-<i>-<j>`` (NAME "w" by default) written 4
batches at a time, in MODE ("exclusive" by default); after each commit it prints the
number of batches committed so far. It stops after BATCHES batches (0, the default:
never; it is killed)."""

from __future__ import annotations

import asyncio
import sys
import time

from directlog.client.rdma_produce import RdmaProducer
from directlog.records.batch import Record, build_batch

RECORDS_PER_BATCH = 10


def writer_batch(index: int, name: str = "w") -> bytes:
    now = int(time.time() * 1000)
    return build_batch(
        [
            Record(j, now, f"k-{index}".encode(), f"{name}-{index}-{j}".encode() * 20)
            for j in range(RECORDS_PER_BATCH)
        ]
    )


async def main(
    leader: str,
    topic: str,
    provider: str,
    mode: str = "exclusive",
    name: str = "w",
    stop: str = "0",
) -> None:
    producer = RdmaProducer(leader, topic, 0, provider=provider, mode=mode, window=4)
    await producer.start()
    index = 0
    try:
        while not int(stop) or index < int(stop):
            batches = [writer_batch(index + k, name) for k in range(4)]
            await producer.send(batches)
            index += len(batches)
            print(index, flush=True)
    finally:
        await producer.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
