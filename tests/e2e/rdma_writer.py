"""A process that writes record batches over RDMA until it is killed, for the e2e test of
a producer dying mid-write: ``python -m tests.e2e.rdma_writer LEADER TOPIC PROVIDER``.

Batch i holds records with values ``w-<i>-<j>``; after each commit it prints the number
of batches committed so far, so the test knows how far it got."""

from __future__ import annotations

import asyncio
import sys
import time

from directlog.client.rdma_produce import RdmaProducer
from directlog.records.batch import Record, build_batch

RECORDS_PER_BATCH = 10


def writer_batch(index: int) -> bytes:
    now = int(time.time() * 1000)
    return build_batch(
        [
            Record(j, now, f"k-{index}".encode(), f"w-{index}-{j}".encode() * 20)
            for j in range(RECORDS_PER_BATCH)
        ]
    )


async def main(leader: str, topic: str, provider: str) -> None:
    producer = RdmaProducer(leader, topic, 0, provider=provider, window=4)
    await producer.start()
    index = 0
    while True:
        batches = [writer_batch(index + k) for k in range(4)]
        await producer.send(batches)
        index += len(batches)
        print(index, flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
