"""A drop-in for confluent_kafka.Consumer that reads over RDMA (docs/client.md).

It is a confluent Consumer underneath (librdkafka), which keeps doing everything but the
fetching: group membership and rebalances, committed offsets, watermarks, metadata. With
``rdma.consume`` = true, each assigned partition stays assigned but *paused* in librdkafka,
and an RdmaConsumer on the loop thread reads it one-sidedly from the leader's segments
(``rdma.read.size`` bytes per READ, 2 KiB by default); ``poll``/``consume`` hand out its
records as real confluent_kafka.Message objects, and the offsets handed out are stored and
committed through librdkafka as its own would be. ``isolation.level`` applies to both
paths: read_committed (librdkafka's default) RDMA readers return only committed and
non-transactional records, as librdkafka does. When leadership moves, the reader finds
the new leader and goes on over RDMA; a partition whose leader refuses RDMA access (or
none answers for FOLLOW_SECONDS) is resumed in librdkafka and read over TCP from the same
offset.

``seek``, ``pause`` and ``resume`` act on the RDMA reader of a partition read over RDMA (a
paused partition is not read at all; it resumes from the next offset not handed out), and
on librdkafka for the others. Every method not defined here is confluent's own.

Rebalances: eager (range, roundrobin) and cooperative (cooperative-sticky: partitions are
added and taken away one by one, and the others keep their readers).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import confluent_kafka
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    KafkaException,
    Message,
    TopicPartition,
)

from directlog.client.common import LoopThread, RdmaConfig, leader_address
from directlog.client.rdma_consume import RdmaConsumeError, RdmaConsumer

log = logging.getLogger(__name__)

QUEUED_MESSAGES = 10000  # read ahead of the application at most, over all partitions
READ_WAIT = 0.05  # how long one reader poll waits for new records
FOLLOW_SECONDS = 10.0  # how long a reader looks for a partition's new leader over RDMA
FOLLOW_RETRY_SECONDS = 0.2


@dataclass(eq=False, slots=True)
class _Reader:
    topic: str
    partition: int
    task: asyncio.Task[None] | None = None


class Consumer:
    """confluent_kafka.Consumer, plus ``rdma.consume`` (true | false),
    ``rdma.provider`` (auto | shm | tcp | pyverbs) and ``rdma.read.size``."""

    def __init__(self, config: dict[str, Any], **kwargs: Any) -> None:
        config = {**config, **kwargs}
        self._rdma = RdmaConfig.take(config)
        self._auto_store = _flag(config.get("enable.auto.offset.store", True))
        self._reset = str(config.get("auto.offset.reset", "latest"))
        # librdkafka's key and default; librdkafka refuses other values when it is made.
        self._isolation = str(config.get("isolation.level", "read_committed"))
        self._timeout = float(config.get("socket.timeout.ms", 60000)) / 1000
        # librdkafka's rule: a cooperative assignor makes the whole group's protocol so.
        self._cooperative = "cooperative" in str(config.get("partition.assignment.strategy", ""))
        if self._rdma.consume:
            config["enable.auto.offset.store"] = False  # we store what RDMA hands out
        self._tcp = confluent_kafka.Consumer(config)
        self._loop = LoopThread("directlog-consumer") if self._rdma.consume else None
        self._readers: dict[tuple[str, int], _Reader] = {}  # reading now, over RDMA
        self._positions: dict[tuple[str, int], int] = {}  # next offset handed out
        self._paused: set[tuple[str, int]] = set()  # read over RDMA, paused by the application
        # What readers read ahead, with the reader: one no longer in _readers is stale.
        self._messages: queue.Queue[tuple[_Reader, Message]] = queue.Queue(QUEUED_MESSAGES)
        self._pausing: list[TopicPartition] = []  # assigned, not yet paused in librdkafka
        self._over_tcp: set[tuple[str, int]] = set()  # refused RDMA: librdkafka reads them

    # Assignment ------------------------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: Any = None,
        on_revoke: Any = None,
        on_lost: Any = None,
    ) -> None:
        if self._loop is None:
            arguments = {
                k: v
                for k, v in (
                    ("on_assign", on_assign),
                    ("on_revoke", on_revoke),
                    ("on_lost", on_lost),
                )
                if v is not None
            }
            self._tcp.subscribe(topics, **arguments)
            return

        def assigned(_: Any, partitions: list[TopicPartition]) -> None:
            if on_assign is not None:
                on_assign(self, partitions)
            if self._cooperative:
                added = [p for p in partitions if (p.topic, p.partition) not in self._positions]
                if added:
                    self.incremental_assign(added)
            elif not self._readers:
                self.assign(partitions)

        def taken(partitions: list[TopicPartition]) -> None:
            if not self._cooperative:
                self._stop_readers()
            elif any((p.topic, p.partition) in self._positions for p in partitions):
                self.incremental_unassign(partitions)

        def revoked(_: Any, partitions: list[TopicPartition]) -> None:
            taken(partitions)
            if on_revoke is not None:
                on_revoke(self, partitions)

        def lost(_: Any, partitions: list[TopicPartition]) -> None:
            taken(partitions)
            if on_lost is not None:
                on_lost(self, partitions)

        self._tcp.subscribe(topics, on_assign=assigned, on_revoke=revoked, on_lost=lost)

    def assign(self, partitions: list[TopicPartition]) -> None:
        if self._loop is None:
            self._tcp.assign(partitions)
            return
        self._stop_readers()
        self._read_assigned(partitions, self._tcp.assign)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """As confluent's: ``partitions`` join the assignment, the others read on."""
        if self._loop is None:
            self._tcp.incremental_assign(partitions)
            return
        self._read_assigned(partitions, self._tcp.incremental_assign)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        """As confluent's: ``partitions`` leave the assignment, the others read on."""
        if self._loop is not None:
            for partition in partitions:
                key = (partition.topic, partition.partition)
                self._stop_reader(key)
                self._positions.pop(key, None)
                self._paused.discard(key)
                self._over_tcp.discard(key)
            gone = {(p.topic, p.partition) for p in partitions}
            self._pausing = [p for p in self._pausing if (p.topic, p.partition) not in gone]
        self._tcp.incremental_unassign(partitions)

    def _read_assigned(
        self, partitions: list[TopicPartition], assign: Callable[[list[TopicPartition]], None]
    ) -> None:
        """Hand ``partitions`` to librdkafka through ``assign`` and read them over RDMA."""
        starts = [TopicPartition(p.topic, p.partition, self._start_offset(p)) for p in partitions]
        # librdkafka keeps them assigned (for commits and rebalances) but paused, and
        # starting at the end, so it fetches nothing even before the pause took hold.
        assign([TopicPartition(p.topic, p.partition, OFFSET_END) for p in starts])
        self._pausing += [TopicPartition(p.topic, p.partition) for p in starts]
        self._pause_assigned()
        for start in starts:
            key = (start.topic, start.partition)
            self._positions[key] = start.offset
            self._read_from(key, start.offset)

    def _pause_assigned(self) -> None:
        """Pause the partitions read over RDMA once librdkafka has them (an assign made in
        a rebalance callback takes effect after it returns)."""
        if not self._pausing:
            return
        assigned = {(p.topic, p.partition) for p in self._tcp.assignment()}
        self._tcp.pause(self._pausing)
        if all((p.topic, p.partition) in assigned for p in self._pausing):
            self._pausing = []

    def unassign(self) -> None:
        self._stop_readers()
        self._tcp.unassign()

    def assignment(self) -> list[TopicPartition]:
        return list(self._tcp.assignment())

    def _start_offset(self, partition: TopicPartition) -> int:
        """Where reading starts: the given offset, else the committed one, else
        auto.offset.reset."""
        offset = partition.offset
        if offset >= 0:
            return int(offset)
        if offset not in (OFFSET_BEGINNING, OFFSET_END):
            committed = self._tcp.committed([partition], timeout=self._timeout)[0]
            if committed.offset >= 0:
                return int(committed.offset)
            if self._reset == "error":
                raise KafkaException(f"{partition.topic}-{partition.partition}: no offset")
            earliest = self._reset in ("earliest", "smallest", "beginning")
            offset = OFFSET_BEGINNING if earliest else OFFSET_END
        low, high = self._tcp.get_watermark_offsets(partition, timeout=self._timeout)
        return int(low if offset == OFFSET_BEGINNING else high)

    def _stop_readers(self) -> None:
        if self._loop is not None and self._readers:
            self._loop.call(self._cancel_readers(list(self._readers.values())), 30)
        self._readers.clear()
        self._positions.clear()
        self._paused.clear()
        self._over_tcp.clear()
        self._pausing = []
        while True:  # records read ahead for partitions no longer ours
            try:
                self._messages.get_nowait()
            except queue.Empty:
                break

    def _over_rdma(self, key: tuple[str, int]) -> bool:
        """Assigned here and read over RDMA (not refused by its leader)."""
        return self._loop is not None and key in self._positions and key not in self._over_tcp

    def _read_from(self, key: tuple[str, int], offset: int) -> None:
        """(Re)start the RDMA reader of ``key`` at ``offset``; what an earlier reader read
        ahead is dropped by ``poll``."""
        assert self._loop is not None
        self._stop_reader(key)
        reader = self._readers[key] = _Reader(*key)
        self._loop.loop.call_soon_threadsafe(self._start_reader, reader, offset)

    def _stop_reader(self, key: tuple[str, int]) -> None:
        reader = self._readers.pop(key, None)
        if reader is not None and self._loop is not None:
            self._loop.call(self._cancel_readers([reader]), 30)

    def seek(self, partition: TopicPartition) -> None:
        """As confluent's: the next record handed out for the partition is at the offset
        (OFFSET_BEGINNING and OFFSET_END included)."""
        key = (partition.topic, partition.partition)
        if not self._over_rdma(key):
            self._tcp.seek(partition)
            return
        offset = self._start_offset(partition)
        self._positions[key] = offset
        if key not in self._paused:
            self._read_from(key, offset)

    def pause(self, partitions: list[TopicPartition]) -> None:
        over_tcp = []
        for partition in partitions:
            key = (partition.topic, partition.partition)
            if self._over_rdma(key):
                self._paused.add(key)
                self._stop_reader(key)
            else:
                over_tcp.append(partition)
        if over_tcp:
            self._tcp.pause(over_tcp)

    def resume(self, partitions: list[TopicPartition]) -> None:
        over_tcp = []
        for partition in partitions:
            key = (partition.topic, partition.partition)
            if key in self._paused:
                self._paused.discard(key)
                self._read_from(key, self._positions[key])
            elif not self._over_rdma(key):  # librdkafka must never fetch an RDMA partition
                over_tcp.append(partition)
        if over_tcp:
            self._tcp.resume(over_tcp)

    # Consuming -------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        if self._loop is None:
            return self._tcp.poll(-1 if timeout is None else timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            message = self._tcp.poll(0)  # rebalance callbacks, errors, TCP partitions
            self._pause_assigned()
            if message is not None and (
                message.error() is not None
                or (message.topic(), message.partition()) not in self._readers
                or (message.topic(), message.partition()) in self._over_tcp
            ):
                return message
            remaining = 1.0 if deadline is None else deadline - time.monotonic()
            try:
                reader, message = self._messages.get(timeout=max(0.0, min(remaining, 0.005)))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            key = (reader.topic, reader.partition)
            if self._readers.get(key) is not reader:
                continue  # read before its partition was revoked, paused or sought
            if message.error() is None:
                following = int(message.offset() or 0) + 1
                self._positions[key] = following
                if self._auto_store:
                    self._tcp.store_offsets(offsets=[TopicPartition(key[0], key[1], following)])
            return message

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        if self._loop is None:
            return list(self._tcp.consume(num_messages, timeout))
        deadline = None if timeout < 0 else time.monotonic() + timeout
        messages: list[Message] = []
        while len(messages) < num_messages:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            message = self.poll(remaining if not messages else 0)
            if message is None:
                break
            messages.append(message)
        return messages

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        if self._loop is None:
            return list(self._tcp.position(partitions))
        return [
            TopicPartition(p.topic, p.partition, self._positions[(p.topic, p.partition)])
            if (p.topic, p.partition) in self._positions
            else self._tcp.position([p])[0]
            for p in partitions
        ]

    def commit(
        self,
        message: Message | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> Any:
        """As confluent's; with neither argument, the positions of every assigned
        partition (RDMA ones included)."""
        if self._loop is None or message is not None or offsets is not None:
            arguments: dict[str, Any] = {"asynchronous": asynchronous}
            if message is not None:
                arguments["message"] = message
            if offsets is not None:
                arguments["offsets"] = offsets
            return self._tcp.commit(**arguments)
        positions = [p for p in self.position(self.assignment()) if p.offset >= 0]
        if not positions:
            raise KafkaException(confluent_kafka.KafkaError(confluent_kafka.KafkaError._NO_OFFSET))
        arguments = {"offsets": positions, "asynchronous": asynchronous}
        return self._tcp.commit(**arguments)

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> Any:
        return self._tcp.committed(partitions, timeout=timeout or self._timeout)

    def get_watermark_offsets(self, partition: TopicPartition, **kwargs: Any) -> Any:
        return self._tcp.get_watermark_offsets(partition, **kwargs)

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        return self._tcp.list_topics(*args, **kwargs)

    def store_offsets(self, *args: Any, **kwargs: Any) -> None:
        self._tcp.store_offsets(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """Everything not defined here is confluent's own (memberid, offsets_for_times,
        consumer_group_metadata, ...)."""
        if name == "_tcp":  # not set yet: __init__ failed before it
            raise AttributeError(name)
        return getattr(self._tcp, name)

    def close(self) -> None:
        """Stop reading, then close as confluent's does (committing stored offsets when
        enable.auto.commit is on)."""
        self._stop_readers()
        if self._loop is not None:
            self._loop.stop()
            self._loop = None
        self._tcp.close()

    # On the loop thread ----------------------------------------------------------------

    def _start_reader(self, reader: _Reader, offset: int) -> None:
        reader.task = asyncio.get_running_loop().create_task(self._read(reader, offset))

    async def _read(self, reader: _Reader, offset: int) -> None:
        """Read one partition over RDMA into the message queue, following its leader when
        leadership moves (or the leader goes away); over TCP when a leader refuses RDMA or
        none can be reached for ``FOLLOW_SECONDS``."""
        following_until: float | None = None  # set while looking for a new leader
        while True:
            try:
                rdma = await self._open(reader, offset)
            except (RdmaConsumeError, KafkaException, OSError) as error:
                retriable = not isinstance(error, RdmaConsumeError) or error.retriable
                following = following_until is not None and time.monotonic() < following_until
                if retriable and following:
                    await asyncio.sleep(FOLLOW_RETRY_SECONDS)
                    continue
                log.warning("%s-%d: consuming over TCP: %s", reader.topic, reader.partition, error)
                self._over_tcp.add((reader.topic, reader.partition))
                await self._resume_over_tcp(TopicPartition(reader.topic, reader.partition, offset))
                return
            try:
                await self._hand_out(reader, rdma)
            except RdmaConsumeError as error:
                if not error.retriable:
                    log.error(
                        "%s-%d: RDMA consume failed: %s", reader.topic, reader.partition, error
                    )
                    failure = confluent_kafka.KafkaError(
                        error.code or confluent_kafka.KafkaError._TRANSPORT, str(error)
                    )
                    message = Message(topic=reader.topic, partition=reader.partition, error=failure)
                    self._messages.put((reader, message))
                    return
                offset = rdma.position
                log.info(
                    "%s-%d: %s; reading from the leader now, at offset %d",
                    reader.topic,
                    reader.partition,
                    error,
                    offset,
                )
                following_until = time.monotonic() + FOLLOW_SECONDS
            finally:
                await rdma.close()

    async def _open(self, reader: _Reader, offset: int) -> RdmaConsumer:
        """An RdmaConsumer on the partition's leader (as metadata names it now)."""
        address = await asyncio.to_thread(
            leader_address, self._tcp, reader.topic, reader.partition, self._timeout
        )
        rdma = RdmaConsumer(
            address,
            reader.topic,
            reader.partition,
            offset,
            provider=self._rdma.provider,
            read_size=self._rdma.read_size,
            isolation_level=self._isolation,
        )
        await rdma.start()
        return rdma

    async def _hand_out(self, reader: _Reader, rdma: RdmaConsumer) -> None:
        """Queue what ``rdma`` reads as confluent Messages, until it fails."""
        while True:
            for record in await rdma.poll(READ_WAIT):
                message = Message(
                    topic=reader.topic,
                    partition=reader.partition,
                    offset=record.offset,
                    key=record.key,
                    value=record.value,
                    headers=[(h.key, h.value) for h in record.headers] or None,
                    timestamp=(confluent_kafka.TIMESTAMP_CREATE_TIME, record.timestamp),
                    error=None,
                )
                while True:
                    try:
                        self._messages.put_nowait((reader, message))
                        break
                    except queue.Full:
                        await asyncio.sleep(0.001)

    async def _resume_over_tcp(self, tp: TopicPartition) -> None:
        """Let librdkafka fetch ``tp`` from ``tp.offset``: seek (refused until it holds
        the partition), then resume."""
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                self._tcp.seek(tp)
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)
        self._tcp.resume([TopicPartition(tp.topic, tp.partition)])

    async def _cancel_readers(self, readers: list[_Reader]) -> None:
        tasks = [reader.task for reader in readers if reader.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _flag(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1")
