"""A drop-in for confluent_kafka.Producer that writes over RDMA (docs/client.md).

Everything a confluent Producer takes and does, it takes and does: it *is* one underneath
(librdkafka, for metadata and for every record that goes over TCP). With
``rdma.produce`` = ``exclusive`` or ``shared`` the records of each partition are batched
here (``linger.ms``, ``batch.num.messages``, ``batch.size``, ``compression.type``) and
written into the leader's head segment with an RdmaProducer on the loop thread; delivery
reports come back through ``poll``/``flush`` as confluent's do, with real
confluent_kafka.Message objects. A partition whose leader refuses RDMA access, or whose
RDMA writer fails, falls back to TCP for good. The batches of a failed write that the broker
never answered are written again as they are, with Kafka Produce requests to the
partition's leader, before any later record. With ``enable.idempotence`` the RDMA batches
carry a producer id (InitProducerId) and sequence numbers, at most 5 are in flight, and the
broker answers a batch it already has with where it landed: nothing is written twice.
Without it delivery is at least once, as with retries.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, Message

from directlog.client.common import LoopThread, RdmaConfig, leader_address
from directlog.client.rdma_produce import RdmaProduceError, RdmaProducer
from directlog.protocol.api import APIS, ApiKey
from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.records.batch import Header, Record, build_batch
from directlog.records.compression import Compression

log = logging.getLogger(__name__)

CODECS = {
    "none": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}
PARTITIONERS = ("consistent_random", "murmur2_random")  # what RDMA partitioning can follow
WINDOW = 16  # batches one partition writes before it waits for their replies
# An idempotent producer's: a broker remembers a producer's last 5 batches (Kafka's rule),
# so no more may be in doubt when a write fails.
IDEMPOTENT_WINDOW = 5
RESEND_BACKOFF = 0.1  # between attempts to write a doubtful batch again
# Answers to a Produce that another attempt (at the leader metadata names) may get past;
# POLICY_VIOLATION: an exclusive RDMA grant holds the partition, as the failed writer's own
# does until the broker sees its queue pair gone.
RETRIABLE = frozenset(
    {
        ErrorCode.POLICY_VIOLATION,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    }
)
PRODUCE_VERSION = 7  # record batches v2, producer ids; not flexible
CLIENT_ID = "directlog-producer"
Report = Callable[[KafkaError | None, Message], None]


@dataclass(slots=True)
class _Pending:
    record: Record
    report: Report | None


@dataclass(eq=False, slots=True)
class _PartitionWriter:
    """One partition's queue and its RDMA writer (None once it fell back to TCP)."""

    topic: str
    partition: int
    queue: list[_Pending] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    writer: RdmaProducer | None = None
    fallen_back: bool = False
    task: asyncio.Task[None] | None = None
    sequence: int = 0  # the next batch's base sequence (idempotent producers)


class Producer:
    """confluent_kafka.Producer, plus ``rdma.produce`` (off | exclusive | shared) and
    ``rdma.provider`` (auto | shm | tcp | pyverbs)."""

    def __init__(self, config: dict[str, Any], **kwargs: Any) -> None:
        config = {**config, **kwargs}
        self._rdma = RdmaConfig.take(config)
        self._tcp = confluent_kafka.Producer(config)
        self._linger = float(config.get("linger.ms", config.get("queue.buffering.max.ms", 5)))
        self._batch_records = int(config.get("batch.num.messages", 10000))
        self._batch_bytes = int(config.get("batch.size", 1000000))
        codec = str(config.get("compression.type", config.get("compression.codec", "none")))
        if codec not in CODECS:
            raise KafkaException(f"compression.type {codec} is not one of {sorted(CODECS)}")
        self._codec = CODECS[codec]
        partitioner = str(config.get("partitioner", "consistent_random"))
        if self._rdma.produce != "off" and partitioner not in PARTITIONERS:
            raise KafkaException(
                f"with rdma.produce, partitioner must be one of {PARTITIONERS}, not {partitioner}"
            )
        self._murmur2 = partitioner == "murmur2_random"
        self._timeout = float(config.get("message.timeout.ms", 300000)) / 1000
        acks = str(config.get("acks", config.get("request.required.acks", "all"))).lower()
        self._acks = -1 if acks in ("all", "-1") else 1  # acks=0 is answered as acks=1
        self._idempotent = str(config.get("enable.idempotence", False)).lower() in ("true", "1")
        self._producer_id: tuple[int, int] | None = None  # (id, epoch) the RDMA batches carry
        self._producer_id_lock: asyncio.Lock | None = None  # made on the loop thread
        self._reports: queue.SimpleQueue[tuple[Report, KafkaError | None, Message]] = (
            queue.SimpleQueue()
        )
        self._in_rdma = 0  # records handed to RDMA writers and not reported yet
        self._lock = threading.Lock()
        self._writers: dict[tuple[str, int], _PartitionWriter] = {}
        self._partition_counts: dict[str, int] = {}
        self._loop = LoopThread("directlog-producer") if self._rdma.produce != "off" else None

    # The confluent API -------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int = -1,
        on_delivery: Report | None = None,
        timestamp: int = 0,
        headers: dict[str, bytes | None] | list[tuple[str, bytes | None]] | None = None,
        callback: Report | None = None,
    ) -> None:
        report = on_delivery or callback
        if self._loop is None:
            self._tcp_produce(topic, value, key, partition, report, timestamp, headers)
            return
        if partition < 0:
            partition = self._partition_for(topic, _bytes(key))
        with self._lock:
            self._in_rdma += 1
        record = Record(
            0,
            timestamp or int(time.time() * 1000),
            _bytes(key),
            _bytes(value),
            tuple(Header(k, _bytes(v)) for k, v in _header_items(headers)),
        )
        self._loop.loop.call_soon_threadsafe(
            self._enqueue, topic, partition, _Pending(record, report)
        )

    def poll(self, timeout: float | None = None) -> int:
        """Serve delivery reports, waiting up to ``timeout`` seconds (None: for ever)
        for one; the number served."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            served = self._serve_reports()
            remaining = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            slice_ = 0.0 if served else min(remaining, 0.005 if self._loop else remaining)
            served += int(self._tcp.poll(slice_))
            if served or (deadline is not None and time.monotonic() >= deadline):
                return served

    def flush(self, timeout: float | None = None) -> int:
        """Wait until every record was reported (or ``timeout``); the number still queued."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._in_rdma:
            self._serve_reports()
            if deadline is not None and time.monotonic() >= deadline:
                return len(self)
            time.sleep(0.001)
        self._serve_reports()
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        left = int(self._tcp.flush(remaining) if remaining is not None else self._tcp.flush())
        return left + self._in_rdma

    def __len__(self) -> int:
        return len(self._tcp) + self._in_rdma

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        return self._tcp.list_topics(*args, **kwargs)

    def close(self) -> None:
        """Flush, then let the RDMA grants go (confluent's Producer has no close; ours
        holds queue pairs and registered memory)."""
        self.flush(self._timeout)
        if self._loop is not None:
            self._loop.call(self._close_writers(), 30)
            self._loop.stop()
            self._loop = None

    # Partitioning ----------------------------------------------------------------------

    def _partition_for(self, topic: str, key: bytes | None) -> int:
        """The partition librdkafka's `partitioner` picks: consistent_random (its default:
        CRC-32 of the key) or murmur2_random (the Java producer's: murmur2 of the key); a
        random one for records without a key."""
        count = self._partition_counts.get(topic)
        if count is None:
            metadata = self._tcp.list_topics(topic, timeout=self._timeout)
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                raise KafkaException(
                    KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"no partitions for {topic}")
                )
            count = self._partition_counts[topic] = len(found.partitions)
        if key is None:
            return random.randrange(count)
        if self._murmur2:
            return (murmur2(key) & 0x7FFFFFFF) % count
        return zlib.crc32(key) % count

    # On the loop thread ----------------------------------------------------------------

    def _enqueue(self, topic: str, partition: int, pending: _Pending) -> None:
        writer = self._writers.get((topic, partition))
        if writer is None:
            writer = self._writers[(topic, partition)] = _PartitionWriter(topic, partition)
            writer.task = asyncio.get_running_loop().create_task(self._run(writer))
        writer.queue.append(pending)
        writer.ready.set()

    async def _run(self, writer: _PartitionWriter) -> None:
        """Take a grant, then write the partition's queue in batches until closed."""
        try:
            address = await asyncio.to_thread(
                leader_address, self._tcp, writer.topic, writer.partition, self._timeout
            )
            if self._idempotent:
                await self._take_producer_id(address)
            rdma = RdmaProducer(
                address,
                writer.topic,
                writer.partition,
                mode=self._rdma.produce,
                acks=self._acks,
                provider=self._rdma.provider,
                window=IDEMPOTENT_WINDOW if self._idempotent else WINDOW,
                timeout=min(self._timeout, 30.0),
                staging_bytes=max(4 << 20, 2 * self._batch_bytes),
            )
            await rdma.start()
            writer.writer = rdma
        except (RdmaProduceError, KafkaException, OSError) as error:
            self._fall_back(writer, f"no RDMA access: {error}")
        while True:
            await writer.ready.wait()
            writer.ready.clear()
            if writer.fallen_back:
                self._to_tcp(writer, writer.queue)
                writer.queue = []
                continue
            if self._linger > 0:
                await asyncio.sleep(self._linger / 1000)
            pending, writer.queue = writer.queue, []
            await self._write(writer, pending)

    async def _write(self, writer: _PartitionWriter, pending: list[_Pending]) -> None:
        batches: list[bytes] = []
        groups: list[list[_Pending]] = []
        start = 0
        while start < len(pending):
            group: list[_Pending] = []
            size = 0
            for item in pending[start : start + self._batch_records]:
                item_size = len(item.record.value or b"") + len(item.record.key or b"") + 32
                if group and size + item_size > self._batch_bytes:
                    break
                group.append(item)
                size += item_size
            start += len(group)
            records = [
                Record(i, p.record.timestamp, p.record.key, p.record.value, p.record.headers)
                for i, p in enumerate(group)
            ]
            batches.append(self._batch(writer, records))
            groups.append(group)
        assert writer.writer is not None
        try:
            produced = await writer.writer.send(batches)
        except RdmaProduceError as error:
            self._fall_back(writer, f"RDMA write failed: {error}")
            answered = error.produced or [None] * len(batches)
            for group, batch, done in zip(groups, batches, answered, strict=True):
                if done is None:
                    await self._resend(writer, group, batch)
                else:
                    self._delivered(writer, group, done.base_offset)
            return
        for group, result in zip(groups, produced, strict=True):
            self._delivered(writer, group, result.base_offset)

    def _batch(self, writer: _PartitionWriter, records: list[Record]) -> bytes:
        if self._producer_id is None:
            return build_batch(records, compression=self._codec)
        producer_id, epoch = self._producer_id
        batch = build_batch(
            records,
            compression=self._codec,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=writer.sequence,
        )
        writer.sequence = (writer.sequence + len(records)) % (1 << 31)
        return batch

    async def _take_producer_id(self, address: str) -> None:
        """The producer id and epoch of the idempotent RDMA batches, asked for once."""
        if self._producer_id_lock is None:
            self._producer_id_lock = asyncio.Lock()
        async with self._producer_id_lock:
            if self._producer_id is not None:
                return
            api = APIS[ApiKey.INIT_PRODUCER_ID]
            request = api.request(transactional_id=None, transaction_timeout_ms=-1)
            request.API_VERSION = 0
            response = await self._ask(address, request, api.response)
            if response.error_code != ErrorCode.NONE:
                code = ErrorCode(response.error_code)
                raise KafkaException(KafkaError(code, f"InitProducerId: {code.name}"))
            self._producer_id = (response.producer_id, response.producer_epoch)

    async def _ask(self, address: str, request: Any, response_class: Any) -> Any:
        host, port = address.rsplit(":", 1)
        timeout = min(self._timeout, 30.0)
        connection = await KafkaConnection.connect(host, int(port), timeout)
        try:
            return await asyncio.wait_for(
                connection.request(request, response_class, CLIENT_ID), timeout
            )
        finally:
            await connection.close()

    async def _resend(self, writer: _PartitionWriter, group: list[_Pending], batch: bytes) -> None:
        """Write a batch whose RDMA answer never came again, as it is, with Produce
        requests to the partition's leader until one is answered or message.timeout.ms
        passes; its records are reported either way."""
        api = APIS[ApiKey.PRODUCE]
        topic_data = api.request.TopicProduceData
        request = api.request(
            transactional_id=None,
            acks=self._acks,
            timeout_ms=int(min(self._timeout, 30.0) * 1000),
            topic_data=[
                topic_data(
                    name=writer.topic,
                    partition_data=[
                        topic_data.PartitionProduceData(index=writer.partition, records=batch)
                    ],
                )
            ],
        )
        request.API_VERSION = PRODUCE_VERSION  # every attempt sends it with a new header
        deadline = time.monotonic() + self._timeout
        why = "no attempt"
        while time.monotonic() < deadline:
            try:
                address = await asyncio.to_thread(
                    leader_address, self._tcp, writer.topic, writer.partition, self._timeout
                )
                response = await self._ask(address, request, api.response)
                answer = response.responses[0].partition_responses[0]
                code = ErrorCode(answer.error_code)
                if code == ErrorCode.NONE:
                    self._delivered(writer, group, answer.base_offset)
                    return
                if code not in RETRIABLE:
                    self._delivered(writer, group, -1, KafkaError(code, code.name))
                    return
                why = code.name
            except Exception as error:  # any failure of one attempt: the next may get through
                why = str(error)
            await asyncio.sleep(RESEND_BACKOFF)
        timed_out = KafkaError(KafkaError._MSG_TIMED_OUT, f"written again in vain: {why}")
        self._delivered(writer, group, -1, timed_out)

    def _delivered(
        self,
        writer: _PartitionWriter,
        group: list[_Pending],
        base_offset: int,
        error: KafkaError | None = None,
    ) -> None:
        """Report a batch's records: at ``base_offset`` on, or failed with ``error``."""
        for i, item in enumerate(group):
            if item.report is not None:
                record = item.record
                message = Message(
                    topic=writer.topic,
                    partition=writer.partition,
                    offset=-1 if error is not None else base_offset + i,
                    key=record.key,
                    value=record.value,
                    headers=[(h.key, h.value) for h in record.headers] or None,
                    timestamp=(confluent_kafka.TIMESTAMP_CREATE_TIME, record.timestamp),
                    error=error,
                )
                self._reports.put((item.report, error, message))
        with self._lock:
            self._in_rdma -= len(group)

    def _fall_back(self, writer: _PartitionWriter, why: str) -> None:
        log.warning("%s-%d: producing over TCP: %s", writer.topic, writer.partition, why)
        writer.fallen_back = True
        writer.ready.set()

    def _to_tcp(self, writer: _PartitionWriter, pending: list[_Pending]) -> None:
        for item in pending:
            record = item.record
            self._tcp_produce(
                writer.topic,
                record.value,
                record.key,
                writer.partition,
                item.report,
                record.timestamp,
                [(h.key, h.value) for h in record.headers],
            )
            with self._lock:
                self._in_rdma -= 1

    def _tcp_produce(
        self,
        topic: str,
        value: Any,
        key: Any,
        partition: int,
        report: Report | None,
        timestamp: int,
        headers: Any,
    ) -> None:
        arguments: dict[str, Any] = {"value": value, "key": key, "timestamp": timestamp}
        if partition >= 0:
            arguments["partition"] = partition
        if report is not None:
            arguments["on_delivery"] = report
        if headers:
            arguments["headers"] = headers
        while True:
            try:
                self._tcp.produce(topic, **arguments)
                return
            except BufferError:
                self._tcp.poll(0.01)  # librdkafka's queue is full: serve reports, go again

    def _serve_reports(self) -> int:
        served = 0
        while True:
            try:
                report, error, message = self._reports.get_nowait()
            except queue.Empty:
                return served
            report(error, message)
            served += 1

    async def _close_writers(self) -> None:
        for writer in self._writers.values():
            if writer.task is not None:
                writer.task.cancel()
                await asyncio.gather(writer.task, return_exceptions=True)
            if writer.writer is not None:
                await writer.writer.close()


def _bytes(data: bytes | str | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _header_items(
    headers: dict[str, Any] | list[tuple[str, Any]] | None,
) -> list[tuple[str, Any]]:
    if headers is None:
        return []
    return list(headers.items()) if isinstance(headers, dict) else list(headers)


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of a key (the Java producer's partitioner, librdkafka's
    murmur2_random), as an unsigned 32-bit value."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[whole:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h = ((h ^ tail[0]) * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    return h ^ (h >> 15)
