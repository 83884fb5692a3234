"""Offset ranges read over the RDMA consume datapath: the `rdma.consume` option
(docs/spark.md "Over RDMA").

A task reads its range with directlog.client's RdmaConsumer handing out whole batches as
they are stored: one-sided READs of the leader's segment, no Fetch request. The batches go
to Arrow columns in the same C pass as a TCP fetch's (fetch.columns).

Spark reuses its Python workers, and a streaming query's next range of a partition starts
where the last one ended: the consumer is therefore kept in the worker once its range is
read, and the next range that starts at its position goes on reading on the same queue
pair, with no new grant (up to KEPT_PER_PARTITION consumers a partition, for queries that
scan a source more than once; the leader's address is kept too). A kept consumer unused
for IDLE_SECONDS is closed.

Where RDMA cannot be had (no provider in this worker, a leader without RDMA consume, or one
that refuses access to the offset: remote data, deleted offsets), the rest of the range is
read over TCP, as directlog.client's Consumer falls back; a leader that moves is followed
over RDMA.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pyarrow as pa
from confluent_kafka import KafkaException

from directlog.client.common import LoopThread, leader_address
from directlog.client.rdma_consume import RdmaConsumeError, RdmaConsumer
from directlog.spark.fetch import ATTEMPTS, TIMEOUT, RangeRead, _columns, read_over_tcp
from directlog.spark.offsets import metadata_client

WAIT_SECONDS = 0.5  # one poll's wait for readable batches
STALL_SECONDS = 30.0  # nothing readable below the range's end this long: a new queue pair
IDLE_SECONDS = 60.0  # a kept consumer unused this long is closed
# Consumers kept per partition: a query may scan one source several times a micro-batch
# (the traffic job: once for its join, once for its delays), each scan a range of its own.
KEPT_PER_PARTITION = 4

log = logging.getLogger(__name__)
T = TypeVar("T")

_Key = tuple[str, str, int, str, int]  # bootstrap, topic, partition, provider, read size


@dataclass
class _Kept:
    consumer: RdmaConsumer
    used: float  # time.monotonic() when a task last read with it


_kept: dict[_Key, list[_Kept]] = {}  # a partition's consumers not in use, oldest first
_leaders: dict[_Key, str] = {}  # a partition's leader as last found
_loop: LoopThread | None = None


def read_over_rdma(read: RangeRead) -> Iterator[pa.RecordBatch]:
    """The records of `read` in offset order, as fetch.read_over_tcp gives them."""
    assert read.rdma is not None
    key = (
        read.client["bootstrap.servers"],
        read.topic,
        read.partition,
        read.rdma.provider,
        read.rdma.read_size,
    )
    offset = read.start
    failures = 0
    progress = time.monotonic()
    consumer: RdmaConsumer | None = None
    try:
        while offset < read.end:
            try:
                if consumer is None:
                    consumer = _take(read, key, offset)
                stored = _call(consumer.poll_batches(read.end, WAIT_SECONDS))
                if not stored and time.monotonic() - progress > STALL_SECONDS:
                    raise RdmaConsumeError(
                        f"nothing readable over RDMA at {offset} for {STALL_SECONDS:g} s",
                        retriable=True,
                    )
            except (RdmaConsumeError, KafkaException, OSError) as error:
                _leaders.pop(key, None)  # look for the leader again
                progress = time.monotonic()
                if consumer is not None:
                    _call(consumer.close())
                    consumer = None
                retriable = not isinstance(error, RdmaConsumeError) or error.retriable
                if retriable and failures < ATTEMPTS:
                    failures += 1
                    time.sleep(min(0.1 * 2**failures, 2.0))
                    continue
                log.warning(
                    "%s-%d: reading over TCP from %d: %s", read.topic, read.partition, offset, error
                )
                yield from read_over_tcp(replace(read, start=offset, rdma=None))
                return
            if not stored:
                continue
            batch, offset = _columns(read, memoryview(stored), offset)
            failures = 0
            progress = time.monotonic()
            if batch is not None and batch.num_rows:
                yield batch
    except BaseException:  # a failed task, or one Spark stopped early: its consumer goes
        if consumer is not None:
            _call(consumer.close())
        raise
    if consumer is not None:
        _keep(key, consumer)


def _take(read: RangeRead, key: _Key, offset: int) -> RdmaConsumer:
    """A kept consumer of the partition that stands at `offset`, or a new one at the
    partition's leader."""
    _close_idle()
    kept = _kept.get(key, [])
    for index, candidate in enumerate(kept):
        if candidate.consumer.position == offset:
            del kept[index]
            return candidate.consumer
    assert read.rdma is not None
    leader = _leaders.get(key)
    if leader is None:
        metadata = metadata_client(read.client)
        try:
            leader = _leaders[key] = leader_address(metadata, read.topic, read.partition, TIMEOUT)
        finally:
            metadata.close()
    consumer = RdmaConsumer(
        leader,
        read.topic,
        read.partition,
        offset,
        provider=read.rdma.provider,
        read_size=read.rdma.read_size,
        timeout=TIMEOUT,
        client_id="directlog-spark",
        batches=True,
    )
    _call(consumer.start())
    return consumer


def _keep(key: _Key, consumer: RdmaConsumer) -> None:
    """Keep `consumer` for the partition's next range; the oldest beyond
    KEPT_PER_PARTITION is closed."""
    kept = _kept.setdefault(key, [])
    kept.append(_Kept(consumer, time.monotonic()))
    while len(kept) > KEPT_PER_PARTITION:
        _call(kept.pop(0).consumer.close())


def _close_idle() -> None:
    now = time.monotonic()
    for key, kept in list(_kept.items()):
        for old in [k for k in kept if now - k.used > IDLE_SECONDS]:
            kept.remove(old)
            _call(old.consumer.close())
        if not kept:
            del _kept[key]


def _call(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one of the consumer's coroutines on this worker's loop thread."""
    global _loop
    if _loop is None:
        _loop = LoopThread("directlog-spark-rdma")
    return _loop.call(coroutine, TIMEOUT + WAIT_SECONDS)
