"""Consumers older than the v2 record format against a real broker, which converts its v2
batches to magic 0 (Fetch v0-1) and magic 1 (Fetch v2-3) message sets while it sends them
(KIP-283; docs/broker.md, "Old consumers").

The old consumers are kafka-python pinned to `api_version` (0, 8, 2), (0, 9), (0, 10) and
(0, 10, 1) (Fetch v0, v1, v2, v3), librdkafka (confluent-kafka and kcat) with
`api.version.request=false` and `broker.version.fallback` 0.8.2 or 0.9.0 (Fetch v0, v1), and
raw Fetch requests whose answers the tests parse byte by byte. Records are produced once per
codec by confluent-kafka (keys, values, explicit timestamps, headers; text only, so kcat's
lines can be compared) and every test checks what each consumer read against them: offsets,
keys, values, timestamps and their type, headers (none before v2), in order. Which Fetch
versions the broker served is read from `directlog_broker_requests_total`.

Besides the shared broker, three brokers of their own: one converting in small chunks, one
converting each answer whole before sending it (`down_conversion_chunk_bytes: 0`), and one
whose `log_defaults` turn `message.downconversion.enable` off.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import random
import shutil
import socket
import struct
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.conftest import Clients, _stop_checked
from tests.e2e.records import produce_raw, raw_request, recent_base_timestamp

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, OffsetAndMetadata, codec
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.consumer.fetcher import RecordTooLargeError
    from kafka.errors import (
        OffsetOutOfRangeError,
        UnsupportedCompressionTypeError,
        UnsupportedVersionError,
    )
    from kafka.protocol.consumer import FetchRequest, FetchResponse
    from kafka.record import MemoryRecords

pytestmark = pytest.mark.timeout(120)

N = 300  # records per codec topic
TIMEOUT = 30  # seconds, for a consumer to read what was produced (a loaded 2-core machine)
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
OLD_CODECS = ["none", "gzip", "snappy", "lz4"]  # what magic 0 and 1 can carry
REQUESTS = "directlog_broker_requests_total"
CONVERSIONS = "directlog_broker_fetch_message_conversions_total"
CONVERSION_COUNT = "directlog_broker_message_conversion_seconds_count"
TEMPORARY_MEMORY = "directlog_broker_temporary_memory_bytes"
DOWN_CONVERSION = "message.downconversion.enable"
# What a partition answers an old Fetch whose first message is above its byte limit: a
# message header cut off (offset -1, the largest size), which old clients report as a
# record too large for their fetch size.
CUT_OFF_HEADER = struct.pack(">qi", -1, 0x7FFFFFFF)
SMALL_CHUNK = 32 * 1024  # the small-chunk broker's down_conversion_chunk_bytes
KCAT = shutil.which("kcat")  # `make test` installs Debian's kcat when it is missing

# kafka-python decodes snappy through python-snappy and magic-0 lz4 (Kafka 0.8/0.9's framing)
# through xxhash, and imports them only if they are there: both are test dependencies
# (pyproject.toml), so their absence fails here rather than thinning the codec cases.
assert codec.has_snappy(), "python-snappy is missing: kafka-python cannot read snappy"
assert importlib.util.find_spec("xxhash") is not None, "xxhash is missing: no magic-0 lz4"

# kafka-python's api_version, the Fetch version it then sends, the message format it gets.
KAFKA_PYTHON_OLD = [((0, 8, 2), 0, 0), ((0, 9), 1, 0), ((0, 10), 2, 1), ((0, 10, 1), 3, 1)]


# Records --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Produced:
    topic: str
    codec: str
    records: list[dict[str, Any]]  # Producer.produce kwargs, offsets 0..len-1


def make_records(count: int, label: str, seed: int) -> list[dict[str, Any]]:
    """Producer.produce kwargs: keys (some null), values (some null, some empty, text of
    varied length), explicit timestamps out of order, and headers on most records."""
    rng = random.Random(seed)
    base = recent_base_timestamp()
    records = []
    for i in range(count):
        key = None if i % 97 == 13 else f"{label}-{i:05d}".encode()
        value: bytes | None
        if i % 101 == 7:
            value = None
        elif i % 89 == 3:
            value = b""
        else:
            value = (f"{label} record {i}; " * rng.randint(1, 60)).encode()
        record: dict[str, Any] = {
            "key": key,
            "value": value,
            "timestamp": base + (i * 37) % 1000,
            "partition": 0,
        }
        if i % 50 != 0:
            record["headers"] = [("seq", str(i).encode()), ("label", label.encode())]
        records.append(record)
    return records


# (offset, key, value, timestamp, timestamp type (0 CreateTime, 1 LogAppendTime), headers)
Seen = tuple[int, bytes | None, bytes | None, int | None, int | None, list[tuple[str, bytes]]]


def expected(records: list[dict[str, Any]], magic: int | None, first: int = 0) -> list[Seen]:
    """What a consumer reading message format `magic` sees (None: the v2 format as stored):
    magic 0 has no timestamps, neither magic headers."""
    out: list[Seen] = []
    for i, r in enumerate(records):
        if magic == 0:
            out.append((first + i, r["key"], r["value"], None, None, []))
        elif magic == 1:
            out.append((first + i, r["key"], r["value"], r["timestamp"], 0, []))
        else:
            headers = list(r.get("headers") or [])
            out.append((first + i, r["key"], r["value"], r["timestamp"], 0, headers))
    return out


def seen_kafka_python(record: Any) -> Seen:
    """A kafka-python ConsumerRecord or a LegacyRecord from MemoryRecords."""
    headers = [(k, v) for k, v in record.headers]
    return (
        record.offset,
        record.key,
        record.value,
        record.timestamp,
        record.timestamp_type,
        headers,
    )


def seen_confluent(message: Message) -> Seen:
    kind, timestamp = message.timestamp()
    if kind == TIMESTAMP_NOT_AVAILABLE:
        when: tuple[int | None, int | None] = (None, None)
    else:
        when = (timestamp, 0 if kind == TIMESTAMP_CREATE_TIME else 1)
    headers = list(message.headers() or [])
    return (message.offset(), message.key(), message.value(), *when, headers)


def assert_same(got: list[Seen], want: list[Seen]) -> None:
    assert len(got) == len(want), f"{len(got)} records, {len(want)} expected"
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"record {index} differs"


def produce(clients: Clients, bootstrap: str, produced: Produced, **extra: Any) -> None:
    """Produce `produced.records` with confluent-kafka in batches of 40 records (the last
    one fewer), compressed with its codec; every delivery at its expected offset. A batch
    leaves when full or at the flush, never by linger: on a busy machine this thread may
    enqueue slower than a short linger, and librdkafka sends a batch of one record, which
    compression does not shrink, uncompressed."""
    producer = clients.producer(
        bootstrap,
        {
            "compression.type": produced.codec,
            "batch.num.messages": 40,
            "linger.ms": 60_000,
            **extra,
        },
    )
    reports = clients.produce_all(producer, produced.topic, produced.records)
    assert [e for e, _ in reports] == [None] * len(produced.records)
    assert [(m.offset(), m.key()) for _, m in reports] == [
        (i, r["key"]) for i, r in enumerate(produced.records)
    ]


# Brokers ---------------------------------------------------------------------------------


@contextlib.contextmanager
def broker_with(work_dir: Path, settings: dict[str, Any]) -> Iterator[BrokerProcess]:
    """A one-broker cluster whose broker has `settings` on top of the tests' own; checked
    to stop cleanly, as conftest's brokers are."""
    cluster = Cluster(work_dir, broker_settings=settings).start()
    try:
        yield cluster.brokers[0]
        _stop_checked(cluster.brokers[0])
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def small_chunk_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    work_dir = tmp_path_factory.mktemp("small-chunks")
    with broker_with(work_dir, {"down_conversion_chunk_bytes": SMALL_CHUNK}) as broker:
        yield broker


@pytest.fixture(scope="module")
def eager_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    work_dir = tmp_path_factory.mktemp("eager")
    with broker_with(work_dir, {"down_conversion_chunk_bytes": 0}) as broker:
        yield broker


@pytest.fixture(scope="module")
def codec_topics(module_broker: BrokerProcess) -> dict[str, Produced]:
    """A topic per codec (zstd too) on the shared broker, N records each, stored as the
    producer compressed them."""
    clients = Clients()
    made = {}
    for seed, name in enumerate(CODEC_IDS):
        produced = Produced(
            f"old-{name}-{uuid.uuid4().hex[:8]}", name, make_records(N, f"old-{name}", seed)
        )
        clients.create_topic(module_broker.bootstrap, produced.topic)
        produce(clients, module_broker.bootstrap, produced)
        batches = module_broker.stored_batches(produced.topic)
        assert {c for c, _ in batches} == {CODEC_IDS[name]}, batches
        assert sum(n for _, n in batches) == N and len(batches) >= N // 40
        made[name] = produced
    clients.close()
    return made


@pytest.fixture
def kp_consumers() -> Iterator[list[KafkaConsumer]]:
    """kafka-python consumers the test appends; closed at its end."""
    made: list[KafkaConsumer] = []
    try:
        yield made
    finally:
        for consumer in made:
            consumer.close(autocommit=False)


# Clients ---------------------------------------------------------------------------------


def old_kafka_python(
    bootstrap: str,
    made: list[KafkaConsumer],
    api_version: tuple[int, ...],
    topic: str,
    offset: int = 0,
    **config: Any,
) -> KafkaConsumer:
    """A kafka-python consumer that believes the broker is `api_version`, assigned
    partition 0 of `topic` at `offset`."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        api_version=api_version,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        fetch_max_wait_ms=100,
        request_timeout_ms=TIMEOUT * 1000,
        **config,
    )
    made.append(consumer)
    tp = KTopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, offset)
    return consumer


def consume_kafka_python(consumer: KafkaConsumer, count: int) -> list[Seen]:
    records: list[Any] = []
    deadline = time.monotonic() + TIMEOUT
    while len(records) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"received {len(records)} of {count} records in {TIMEOUT} s")
        for batch in consumer.poll(timeout_ms=300, max_records=500).values():
            records.extend(batch)
    return [seen_kafka_python(r) for r in records]


def poll_until_raises(consumer: KafkaConsumer, error: type[Exception]) -> Exception:
    """Poll until kafka-python raises `error` (records read before it are fine)."""
    deadline = time.monotonic() + TIMEOUT
    with pytest.raises(error) as raised:
        while time.monotonic() < deadline:
            consumer.poll(timeout_ms=300)
    return raised.value


def old_librdkafka(fallback: str) -> dict[str, Any]:
    """librdkafka settings that make it speak to the broker as to Kafka `fallback`."""
    return {
        "api.version.request": False,
        "broker.version.fallback": fallback,
        "fetch.wait.max.ms": 100,
    }


def kcat(*args: str) -> subprocess.CompletedProcess[str]:
    assert KCAT is not None, "kcat is not installed: run the suite through `make test`"
    return subprocess.run([KCAT, *args], capture_output=True, text=True, timeout=60)


KCAT_FORMAT = "%o|%K|%k|%S|%T|%h|%s\n"


def kcat_lines(records: list[dict[str, Any]], magic: int | None) -> list[str]:
    """kcat's KCAT_FORMAT lines for `records` read in message format `magic` (None: v2):
    key and value lengths (-1 for null), timestamp (0 when there is none), headers."""
    lines = []
    for offset, key, value, timestamp, _, headers in expected(records, magic):
        shown = ",".join(f"{name}={v.decode()}" for name, v in headers)
        lines.append(
            f"{offset}|{-1 if key is None else len(key)}|{(key or b'').decode()}|"
            f"{-1 if value is None else len(value)}|{timestamp or 0}|{shown}|"
            f"{(value or b'').decode()}"
        )
    return lines


def kcat_consume(bootstrap: str, topic: str, *settings: str) -> subprocess.CompletedProcess[str]:
    args = ["-C", "-b", bootstrap, "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q"]
    for setting in settings:
        args += ["-X", setting]
    return kcat(*args, "-f", KCAT_FORMAT)


# Raw requests ----------------------------------------------------------------------------


def fetch_request(
    version: int,
    wanted: list[tuple[str, int]],
    *,
    partition_max_bytes: int = 16 << 20,
    max_bytes: int = 64 << 20,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
) -> Any:
    """A consumer's Fetch of partition 0 of each (topic, offset)."""
    partition = FetchRequest.FetchTopic.FetchPartition
    return FetchRequest(
        version=version,
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            FetchRequest.FetchTopic(
                topic=topic,
                partitions=[
                    partition(
                        partition=0, fetch_offset=offset, partition_max_bytes=partition_max_bytes
                    )
                ],
            )
            for topic, offset in wanted
        ],
        forgotten_topics_data=[],
        rack_id="",
    )


def old_fetch(
    bootstrap: str, version: int, wanted: list[tuple[str, int]], **limits: Any
) -> dict[str, Any]:
    """One raw Fetch; each topic's partition-0 answer, by topic."""
    response = raw_request(bootstrap, fetch_request(version, wanted, **limits))
    answers = {}
    for topic in response.responses:
        (partition,) = topic.partitions
        assert partition.partition_index == 0
        answers[topic.topic] = partition
    assert list(answers) == [topic for topic, _ in wanted]
    return answers


def raw_frames(bootstrap: str, requests: list[Any]) -> list[bytes]:
    """The response frames (size prefix stripped) to `requests`, sent one after another on
    one connection with correlation ids 1, 2, ... and one client id: byte for byte what the
    broker sent."""

    async def exchange() -> list[bytes]:
        host, port = bootstrap.rsplit(":", 1)
        connection = await KafkaConnection.connect(host, int(port), timeout=10)
        try:
            frames = []
            for correlation_id, request in enumerate(requests, 1):
                request.with_header(correlation_id=correlation_id, client_id="old-consumers")
                frame = bytes(request.encode(header=True, framed=True))
                frames.append(bytes(await asyncio.wait_for(connection.exchange(frame), 30)))
            return frames
        finally:
            await connection.close()

    return asyncio.run(exchange())


def split_message_set(data: bytes) -> tuple[bytes, bytes]:
    """A legacy message set's whole top-level messages, and what follows the last of them."""
    at = 0
    while len(data) - at >= len(CUT_OFF_HEADER):
        _, size = struct.unpack_from(">qi", data, at)
        if size > len(data) - at - len(CUT_OFF_HEADER):
            break
        at += len(CUT_OFF_HEADER) + size
    return data[:at], data[at:]


def legacy_records(data: bytes, magic: int) -> list[Seen]:
    """The records of an old Fetch answer, decoded by kafka-python (not the broker's code),
    each top-level message of format `magic`; after them only the broker's padding may
    follow: a cut-off message header (offset -1, size 0x7FFFFFFF), then zeros."""
    whole, tail = split_message_set(data)
    assert tail[: len(CUT_OFF_HEADER)] == CUT_OFF_HEADER[: len(tail)], tail[:12].hex()
    assert not any(tail[len(CUT_OFF_HEADER) :]), "padding after the cut-off header is not zeros"
    records: list[Seen] = []
    for batch in MemoryRecords(whole):
        assert batch.magic == magic
        records.extend(seen_kafka_python(r) for r in batch)
    return records


def read_old(
    bootstrap: str, topic: str, version: int, end: int, partition_max_bytes: int = 1 << 20
) -> list[Seen]:
    """Every record of partition 0 of `topic` from offset 0 up to `end`, read with raw
    Fetch requests of `version` (each answer must make progress)."""
    magic = 0 if version < 2 else 1
    records: list[Seen] = []
    offset = 0
    while offset < end:
        (answer,) = old_fetch(
            bootstrap, version, [(topic, offset)], partition_max_bytes=partition_max_bytes
        ).values()
        assert answer.error_code == ErrorCode.NONE
        got = [r for r in legacy_records(answer.records, magic) if r[0] >= offset]
        assert got, f"no progress at offset {offset}"
        records += got
        offset = got[-1][0] + 1
    return records


# Metrics ---------------------------------------------------------------------------------


def request_counts(broker: BrokerProcess, api: str = "fetch") -> dict[int, float]:
    """Requests of `api` answered so far, by version."""
    return {
        int(sample.labels["version"]): sample.value
        for family in broker.scrape()
        for sample in family.samples
        if sample.name == REQUESTS and sample.labels["api"] == api
    }


GROUP_APIS = ("join_group", "offset_commit", "offset_fetch", "fetch")


def group_counts(broker: BrokerProcess) -> dict[str, dict[int, float]]:
    return {api: request_counts(broker, api) for api in GROUP_APIS}


def more(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    return {v: n - before.get(v, 0) for v, n in after.items() if n != before.get(v, 0)}


def temporary_memory(broker: BrokerProcess) -> float:
    return broker.sample(TEMPORARY_MEMORY, request="fetch") or 0.0


def wait_memory_released(broker: BrokerProcess) -> None:
    """The gauge drops once the broker has sent a conversion's last chunk, which the client
    may have read a moment before."""
    wait_for(lambda: temporary_memory(broker) == 0, 15, "no conversion holding memory")


# 1. kafka-python, every codec ------------------------------------------------------------


@pytest.mark.parametrize("compression", OLD_CODECS)
@pytest.mark.parametrize(
    ("api_version", "fetch_version", "magic"),
    KAFKA_PYTHON_OLD,
    ids=["0.8.2", "0.9", "0.10", "0.10.1"],
)
def test_kafka_python_reads_every_codec(
    module_broker, codec_topics, kp_consumers, api_version, fetch_version, magic, compression
):
    produced = codec_topics[compression]
    before = request_counts(module_broker)
    consumer = old_kafka_python(module_broker.bootstrap, kp_consumers, api_version, produced.topic)
    assert_same(consume_kafka_python(consumer, N), expected(produced.records, magic))
    assert consumer.poll(timeout_ms=300) == {}  # nothing past the end
    served = more(before, request_counts(module_broker))
    assert served.get(fetch_version, 0) >= 1, served


def test_log_append_time_reaches_magic_1(module_broker, clients, kp_consumers, topic_name):
    """A LogAppendTime topic: magic 1 carries the broker's append time and says so; magic 0
    has no timestamp at all."""
    produced = Produced(topic_name("append-time"), "gzip", make_records(120, "append", 7))
    clients.create_topic(
        module_broker.bootstrap, produced.topic, config={"message.timestamp.type": "LogAppendTime"}
    )
    started = int(time.time() * 1000)
    produce(clients, module_broker.bootstrap, produced)
    finished = int(time.time() * 1000)
    for api_version, _, magic in KAFKA_PYTHON_OLD:
        consumer = old_kafka_python(
            module_broker.bootstrap, kp_consumers, api_version, produced.topic
        )
        got = consume_kafka_python(consumer, len(produced.records))
        want = expected(produced.records, magic)
        assert [g[:3] for g in got] == [w[:3] for w in want]
        assert [g[5] for g in got] == [[]] * len(got)
        if magic == 0:
            assert {g[3:5] for g in got} == {(None, None)}
        else:
            assert {g[4] for g in got} == {1}
            appended = {g[3] for g in got}  # one per batch, all within the produce
            assert all(t is not None and started <= t <= finished for t in appended), appended


# 2. zstd ---------------------------------------------------------------------------------


def test_zstd_is_refused_below_fetch_v10(module_broker, codec_topics, clients, kp_consumers):
    """zstd has no legacy form and Fetch below v10 cannot carry it: that partition gets
    UNSUPPORTED_COMPRESSION_TYPE, the others of the same request are served."""
    zstd, gzip = codec_topics["zstd"], codec_topics["gzip"]
    for version in (0, 1, 2, 3, 4, 9):
        answers = old_fetch(module_broker.bootstrap, version, [(zstd.topic, 0), (gzip.topic, 0)])
        refused, served = answers[zstd.topic], answers[gzip.topic]
        assert refused.error_code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, version
        # Old clients read a null message set as malformed: theirs is empty.
        assert refused.records == b"" if version < 4 else not refused.records, version
        assert served.error_code == ErrorCode.NONE
        if version < 4:
            got = legacy_records(served.records, 0 if version < 2 else 1)
            assert got == expected(gzip.records, 0 if version < 2 else 1)[: len(got)]
            assert got, version
    # Fetch v10 carries the v2 batches as they are stored: zstd (codec id 4).
    (answer,) = old_fetch(module_broker.bootstrap, 10, [(zstd.topic, 0)]).values()
    assert answer.error_code == ErrorCode.NONE
    records = bytes(answer.records)
    assert records[16] == 2 and records[22] & 0x07 == CODEC_IDS["zstd"]

    consumer = old_kafka_python(module_broker.bootstrap, kp_consumers, (0, 10, 1), zstd.topic)
    poll_until_raises(consumer, UnsupportedCompressionTypeError)
    old = clients.consumer(module_broker.bootstrap, old_librdkafka("0.9.0"))
    old.assign([TopicPartition(zstd.topic, 0, OFFSET_BEGINNING)])
    with pytest.raises(KafkaException) as raised:
        clients.consume(old, 1, timeout=TIMEOUT)
    assert raised.value.args[0].code() == KafkaError.UNSUPPORTED_COMPRESSION_TYPE

    current = clients.consumer(module_broker.bootstrap)
    current.assign([TopicPartition(zstd.topic, 0, OFFSET_BEGINNING)])
    got = [seen_confluent(m) for m in clients.consume(current, N, timeout=TIMEOUT)]
    assert_same(got, expected(zstd.records, None))


# 3. librdkafka and kcat ------------------------------------------------------------------


LIBRDKAFKA_OLD = [("0.8.2", 0), ("0.9.0", 1)]  # fallback, the Fetch version it sends


@pytest.mark.parametrize(("fallback", "fetch_version"), LIBRDKAFKA_OLD)
def test_librdkafka_with_an_old_fallback(
    module_broker, codec_topics, clients, fallback, fetch_version
):
    """confluent-kafka told the broker is 0.8.2 or 0.9.0 reads all four codecs' topics in
    one assignment (magic 0: no timestamps, no headers)."""
    topics = [codec_topics[name] for name in OLD_CODECS]
    before = request_counts(module_broker)
    consumer = clients.consumer(module_broker.bootstrap, old_librdkafka(fallback))
    consumer.assign([TopicPartition(p.topic, 0, OFFSET_BEGINNING) for p in topics])
    messages = clients.consume(consumer, N * len(topics), timeout=TIMEOUT * 2)
    for produced in topics:
        got = [seen_confluent(m) for m in messages if m.topic() == produced.topic]
        assert_same(got, expected(produced.records, 0))
    served = more(before, request_counts(module_broker))
    assert served.get(fetch_version, 0) >= 1, served


@pytest.mark.parametrize(("fallback", "fetch_version"), LIBRDKAFKA_OLD)
def test_kcat_with_an_old_fallback(module_broker, codec_topics, fallback, fetch_version):
    for name in OLD_CODECS:
        produced = codec_topics[name]
        before = request_counts(module_broker)
        done = kcat_consume(
            module_broker.bootstrap,
            produced.topic,
            "api.version.request=false",
            f"broker.version.fallback={fallback}",
            "fetch.wait.max.ms=100",
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == kcat_lines(produced.records, 0), name
        served = more(before, request_counts(module_broker))
        assert served.get(fetch_version, 0) >= 1, (name, served)


def test_librdkafka_fallback_0_10_asks_for_api_versions(module_broker, codec_topics, clients):
    """broker.version.fallback 0.10.0 does not make librdkafka an old consumer: from 0.10 on
    it sends ApiVersions whatever api.version.request says, and fetches with the newest
    version both serve (v11 for kcat's librdkafka 2.0.2, v16 for confluent-kafka 2.16's),
    so it reads the v2 batches, headers included, with nothing converted."""
    produced = codec_topics["gzip"]
    conversions = module_broker.total(CONVERSIONS, topic=produced.topic)
    asked = module_broker.total(REQUESTS, api="api_versions")
    before = request_counts(module_broker)
    consumer = clients.consumer(module_broker.bootstrap, old_librdkafka("0.10.0"))
    consumer.assign([TopicPartition(produced.topic, 0, OFFSET_BEGINNING)])
    got = [seen_confluent(m) for m in clients.consume(consumer, N, timeout=TIMEOUT)]
    assert_same(got, expected(produced.records, None))
    done = kcat_consume(
        module_broker.bootstrap,
        produced.topic,
        "api.version.request=false",
        "broker.version.fallback=0.10.0",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == kcat_lines(produced.records, None)
    assert module_broker.total(REQUESTS, api="api_versions") >= asked + 2
    served = more(before, request_counts(module_broker))
    assert sum(n for version, n in served.items() if version >= 4) >= 2, served
    assert module_broker.total(CONVERSIONS, topic=produced.topic) == conversions


# 4. Old consumers in a group -------------------------------------------------------------


GROUP_SESSION_MS = 6000  # the broker's group_min_session_timeout_ms


def test_kafka_python_0_10_group_resumes_after_its_commit(
    module_broker, clients, kp_consumers, topic_name
):
    """JoinGroup v0, OffsetCommit v2, OffsetFetch v1 and Fetch v2: a member reads part of
    two partitions, commits where it is and leaves; the next member of the group starts
    exactly there and reads the rest."""
    topic = topic_name("kp-group")
    clients.create_topic(module_broker.bootstrap, topic, partitions=2)
    records = make_records(200, "kp-group", 40)
    for i, record in enumerate(records):
        record["partition"] = i % 2
    producer = clients.producer(module_broker.bootstrap, {"compression.type": "gzip"})
    assert [e for e, _ in clients.produce_all(producer, topic, records)] == [None] * 200
    by_partition = {p: records[p::2] for p in (0, 1)}  # offsets 0..99 each
    group = f"old-kp-{uuid.uuid4().hex[:8]}"
    before = group_counts(module_broker)

    def member(reset: str) -> KafkaConsumer:
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=module_broker.bootstrap,
            api_version=(0, 10),
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset=reset,
            session_timeout_ms=GROUP_SESSION_MS,
            heartbeat_interval_ms=500,
            fetch_max_wait_ms=100,
            max_poll_records=15,
        )
        kp_consumers.append(consumer)
        return consumer

    def read(consumer: KafkaConsumer, count: int) -> dict[int, list[Seen]]:
        got: dict[int, list[Seen]] = {0: [], 1: []}
        deadline = time.monotonic() + TIMEOUT
        while sum(map(len, got.values())) < count:
            assert time.monotonic() < deadline, f"read {got} of {count} records"
            for tp, batch in consumer.poll(timeout_ms=300).items():
                got[tp.partition] += [seen_kafka_python(r) for r in batch]
        return got

    first = member("earliest")
    part = read(first, 60)
    committed = {p: len(part[p]) for p in (0, 1)}
    for p, offset in committed.items():
        assert_same(part[p], expected(by_partition[p][:offset], 1))
    first.commit(
        {KTopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in committed.items()}
    )
    first.close(autocommit=False)

    second = member("none")  # without a committed offset it would raise
    rest = read(second, sum(100 - o for o in committed.values()))
    for p, offset in committed.items():
        assert_same(rest[p], expected(by_partition[p][offset:], 1, first=offset))
    assert second.poll(timeout_ms=300) == {}
    after = group_counts(module_broker)
    served = {api: more(before[api], after[api]) for api in GROUP_APIS}
    assert served["join_group"].get(0, 0) >= 2, served
    assert served["offset_commit"].get(2, 0) >= 1, served
    assert served["offset_fetch"].get(1, 0) >= 2, served
    assert served["fetch"].get(2, 0) >= 2, served


def test_librdkafka_0_9_group_resumes_after_its_commit(module_broker, clients, topic_name):
    """librdkafka told the broker is 0.9.0 (JoinGroup v0, OffsetCommit v2, Fetch v1): a
    member reads part of two partitions, commits where it is and leaves; the next member
    starts exactly there."""
    topic = topic_name("rd-group")
    clients.create_topic(module_broker.bootstrap, topic, partitions=2)
    records = make_records(200, "rd-group", 41)
    for i, record in enumerate(records):
        record["partition"] = i % 2
    producer = clients.producer(module_broker.bootstrap, {"compression.type": "snappy"})
    assert [e for e, _ in clients.produce_all(producer, topic, records)] == [None] * 200
    by_partition = {p: records[p::2] for p in (0, 1)}
    settings = {
        **old_librdkafka("0.9.0"),
        "group.id": f"old-rd-{uuid.uuid4().hex[:8]}",
        "session.timeout.ms": GROUP_SESSION_MS,
        "heartbeat.interval.ms": 500,
    }
    before = group_counts(module_broker)

    def read(consumer: Consumer, count: int) -> dict[int, list[Seen]]:
        got: dict[int, list[Seen]] = {0: [], 1: []}
        for message in clients.consume(consumer, count, timeout=TIMEOUT, batch=15):
            got[message.partition()].append(seen_confluent(message))
        return got

    first = clients.consumer(module_broker.bootstrap, {**settings, "auto.offset.reset": "earliest"})
    first.subscribe([topic])
    part = read(first, 60)
    committed = {p: len(part[p]) for p in (0, 1)}
    for p, offset in committed.items():
        assert_same(part[p], expected(by_partition[p][:offset], 0))
    first.commit(
        offsets=[TopicPartition(topic, p, o) for p, o in committed.items()], asynchronous=False
    )
    first.close()

    second = clients.consumer(module_broker.bootstrap, {**settings, "auto.offset.reset": "error"})
    second.subscribe([topic])
    rest = read(second, sum(100 - o for o in committed.values()))
    for p, offset in committed.items():
        assert_same(rest[p], expected(by_partition[p][offset:], 0, first=offset))
    assert second.consume(10, 0.5) == []
    after = group_counts(module_broker)
    served = {api: more(before[api], after[api]) for api in GROUP_APIS}
    assert served["join_group"].get(0, 0) >= 2, served
    assert served["offset_commit"].get(2, 0) >= 1, served
    assert served["offset_fetch"].get(1, 0) >= 2, served
    assert served["fetch"].get(1, 0) >= 2, served


# 5. message.downconversion.enable --------------------------------------------------------


def describe(admin: Any, kind: ResourceType, name: str) -> dict[str, Any]:
    (future,) = admin.describe_configs([ConfigResource(kind, name)], request_timeout=15).values()
    return future.result(timeout=15)


def assert_refused_and_served(
    bootstrap: str, refused: Produced, served: Produced, versions: tuple[int, ...] = (0, 1, 2, 3)
) -> None:
    """Raw old Fetches of both topics: `refused`'s partition gets UNSUPPORTED_VERSION, the
    other one its records from the first on."""
    for version in versions:
        answers = old_fetch(bootstrap, version, [(refused.topic, 0), (served.topic, 0)])
        no = answers[refused.topic]
        assert (no.error_code, no.records) == (ErrorCode.UNSUPPORTED_VERSION, b""), version
        yes = answers[served.topic]
        assert yes.error_code == ErrorCode.NONE, version
        magic = 0 if version < 2 else 1
        got = legacy_records(yes.records, magic)  # all, or cut where conversion grew
        assert got and got == expected(served.records, magic)[: len(got)], version


def test_down_conversion_switch_per_topic(module_broker, clients, kp_consumers, topic_name):
    """AlterConfigs message.downconversion.enable=false on one topic: old Fetches of it get
    UNSUPPORTED_VERSION, a second topic in the same request is still served, a current
    consumer still reads it; IncrementalAlterConfigs true serves it again."""
    bootstrap = module_broker.bootstrap
    switched = Produced(topic_name("switched"), "gzip", make_records(150, "switched", 60))
    other = Produced(topic_name("other"), "none", make_records(40, "other", 61))
    for produced in (switched, other):
        clients.create_topic(bootstrap, produced.topic)
        produce(clients, bootstrap, produced)
    admin = clients.admin(bootstrap)
    assert describe(admin, ResourceType.TOPIC, switched.topic)[DOWN_CONVERSION].value == "true"

    kadmin = KafkaAdminClient(bootstrap_servers=bootstrap)  # its alter_configs: AlterConfigs
    try:
        change = KConfigResource("TOPIC", switched.topic, {DOWN_CONVERSION: "false"})
        kadmin.alter_configs([change], incremental=False)
    finally:
        kadmin.close()
    entry = describe(admin, ResourceType.TOPIC, switched.topic)[DOWN_CONVERSION]
    assert (entry.value, entry.is_default) == ("false", False)
    assert describe(admin, ResourceType.TOPIC, other.topic)[DOWN_CONVERSION].value == "true"

    assert_refused_and_served(bootstrap, switched, other)
    (answer,) = old_fetch(bootstrap, 4, [(switched.topic, 0)]).values()  # nothing to convert
    assert answer.error_code == ErrorCode.NONE and bytes(answer.records)[16] == 2
    consumer = old_kafka_python(bootstrap, kp_consumers, (0, 10, 1), switched.topic)
    poll_until_raises(consumer, UnsupportedVersionError)
    current = clients.consumer(bootstrap)
    current.assign([TopicPartition(switched.topic, 0, OFFSET_BEGINNING)])
    got = [seen_confluent(m) for m in clients.consume(current, 150, timeout=TIMEOUT)]
    assert_same(got, expected(switched.records, None))

    on = ConfigEntry(DOWN_CONVERSION, "true", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, switched.topic, incremental_configs=[on])
    (future,) = admin.incremental_alter_configs([resource], request_timeout=15).values()
    assert future.result(timeout=15) is None
    assert describe(admin, ResourceType.TOPIC, switched.topic)[DOWN_CONVERSION].value == "true"
    assert read_old(bootstrap, switched.topic, 3, 150) == expected(switched.records, 1)
    consumer = old_kafka_python(bootstrap, kp_consumers, (0, 9), switched.topic)
    assert_same(consume_kafka_python(consumer, 150), expected(switched.records, 0))


@pytest.fixture(scope="module")
def refusing_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    work_dir = tmp_path_factory.mktemp("no-down-conversion")
    with broker_with(work_dir, {"log_defaults": {DOWN_CONVERSION: "false"}}) as broker:
        yield broker


def test_broker_default_turns_down_conversion_off(refusing_broker, clients, kp_consumers):
    """log_defaults message.downconversion.enable=false: DescribeConfigs of the broker shows
    log.message.downconversion.enable=false, a topic without an override refuses old
    Fetches, one whose override is true serves them."""
    bootstrap = refusing_broker.bootstrap
    plain = Produced(f"plain-{uuid.uuid4().hex[:8]}", "lz4", make_records(80, "plain", 70))
    allowed = Produced(f"allowed-{uuid.uuid4().hex[:8]}", "gzip", make_records(90, "allowed", 71))
    clients.create_topic(bootstrap, plain.topic)
    clients.create_topic(bootstrap, allowed.topic, config={DOWN_CONVERSION: "true"})
    for produced in (plain, allowed):
        produce(clients, bootstrap, produced)
    admin = clients.admin(bootstrap)
    static = ("false", ConfigSource.STATIC_BROKER_CONFIG.value, False)
    entry = describe(admin, ResourceType.BROKER, "0")[f"log.{DOWN_CONVERSION}"]
    assert (entry.value, entry.source, entry.is_default) == static
    entry = describe(admin, ResourceType.TOPIC, plain.topic)[DOWN_CONVERSION]
    assert (entry.value, entry.source, entry.is_default) == static
    entry = describe(admin, ResourceType.TOPIC, allowed.topic)[DOWN_CONVERSION]
    assert (entry.value, entry.is_default) == ("true", False)

    assert_refused_and_served(bootstrap, plain, allowed)
    consumer = old_kafka_python(bootstrap, kp_consumers, (0, 10), plain.topic)
    poll_until_raises(consumer, UnsupportedVersionError)
    consumer = old_kafka_python(bootstrap, kp_consumers, (0, 10), allowed.topic)
    assert_same(consume_kafka_python(consumer, 90), expected(allowed.records, 1))
    current = clients.consumer(bootstrap)
    current.assign([TopicPartition(plain.topic, 0, OFFSET_BEGINNING)])
    got = [seen_confluent(m) for m in clients.consume(current, 80, timeout=TIMEOUT)]
    assert_same(got, expected(plain.records, None))


# 6. Metrics ------------------------------------------------------------------------------


def test_conversion_metrics(module_broker, clients, kp_consumers, topic_name):
    """Each record an old consumer reads is converted (and counted) once; a current
    consumer converts nothing; conversions hold no memory once they are sent."""
    bootstrap = module_broker.bootstrap
    produced = Produced(topic_name("metrics"), "gzip", make_records(250, "metrics", 80))
    clients.create_topic(bootstrap, produced.topic)
    produce(clients, bootstrap, produced)
    histogram = module_broker.total(CONVERSION_COUNT, request="fetch")

    def converted() -> float:
        return module_broker.sample(CONVERSIONS, topic=produced.topic) or 0.0

    def read_and_count(read: Callable[[], list[Seen]], magic: int, total: int) -> None:
        assert_same(read(), expected(produced.records, magic))
        wait_for(lambda: converted() >= total, 15, f"{total} records converted")
        assert converted() == total

    current = clients.consumer(bootstrap)
    current.assign([TopicPartition(produced.topic, 0, OFFSET_BEGINNING)])
    assert len(clients.consume(current, 250, timeout=TIMEOUT)) == 250
    assert converted() == 0

    new = old_kafka_python(bootstrap, kp_consumers, (0, 10), produced.topic)
    read_and_count(lambda: consume_kafka_python(new, 250), 1, 250)
    new = old_kafka_python(bootstrap, kp_consumers, (0, 9), produced.topic)
    read_and_count(lambda: consume_kafka_python(new, 250), 0, 500)
    read_and_count(lambda: read_old(bootstrap, produced.topic, 3, 250), 1, 750)
    assert module_broker.total(CONVERSION_COUNT, request="fetch") >= histogram + 3
    wait_memory_released(module_broker)


# 7. Bad input ----------------------------------------------------------------------------


def test_old_fetch_out_of_range(module_broker, codec_topics, kp_consumers):
    produced = codec_topics["none"]
    for version in (0, 1, 2, 3):
        for offset in (N + 10, N + 1, -5):
            (answer,) = old_fetch(
                module_broker.bootstrap, version, [(produced.topic, offset)]
            ).values()
            assert (answer.error_code, answer.records, answer.high_watermark) == (
                ErrorCode.OFFSET_OUT_OF_RANGE,
                b"",
                N,
            ), (version, offset)
        # At the log end: nothing yet, and no error.
        (answer,) = old_fetch(module_broker.bootstrap, version, [(produced.topic, N)]).values()
        assert (answer.error_code, answer.records) == (ErrorCode.NONE, b"")
    consumer = old_kafka_python(
        module_broker.bootstrap, kp_consumers, (0, 10), produced.topic, offset=N + 10
    )
    poll_until_raises(consumer, OffsetOutOfRangeError)


def test_record_above_the_limit_for_fetch_v0_to_v2(
    module_broker, clients, kp_consumers, topic_name
):
    """Before KIP-74 (Fetch v0-2) the partition byte limit holds: a first message above it
    comes as a cut-off message header, which kafka-python raises as RecordTooLargeError;
    Fetch v3 hands it over whole."""
    limit = 8192
    produced = Produced(topic_name("too-large"), "none", make_records(6, "too-large", 90))
    produced.records[3]["value"] = b"big " * 5000
    clients.create_topic(module_broker.bootstrap, produced.topic)
    producer = clients.producer(module_broker.bootstrap, {"linger.ms": 0})
    for record in produced.records:  # each its own batch
        clients.produce_all(producer, produced.topic, [record])
    assert [n for _, n in module_broker.stored_batches(produced.topic)] == [1] * 6
    bootstrap = module_broker.bootstrap

    for version in (0, 1, 2):
        answers = old_fetch(bootstrap, version, [(produced.topic, 3)], partition_max_bytes=limit)
        assert (answers[produced.topic].error_code, answers[produced.topic].records) == (
            ErrorCode.NONE,
            CUT_OFF_HEADER,
        ), version
        # From offset 0 the three small ones come, and then nothing of the large one.
        (answer,) = old_fetch(
            bootstrap, version, [(produced.topic, 0)], partition_max_bytes=limit
        ).values()
        magic = 0 if version < 2 else 1
        assert legacy_records(answer.records, magic) == expected(produced.records[:3], magic)
    (answer,) = old_fetch(bootstrap, 3, [(produced.topic, 3)], partition_max_bytes=limit).values()
    assert legacy_records(answer.records, 1) == expected(produced.records, 1)[3:4]
    assert len(answer.records) > limit

    consumer = old_kafka_python(
        bootstrap, kp_consumers, (0, 10), produced.topic, max_partition_fetch_bytes=limit
    )
    assert_same(consume_kafka_python(consumer, 3), expected(produced.records[:3], 1))
    raised = poll_until_raises(consumer, RecordTooLargeError)
    assert raised.args[1] == {KTopicPartition(produced.topic, 0): 3}
    consumer = old_kafka_python(
        bootstrap, kp_consumers, (0, 10, 1), produced.topic, max_partition_fetch_bytes=limit
    )
    assert_same(consume_kafka_python(consumer, 6), expected(produced.records, 1))


def test_client_gone_mid_conversion(small_chunk_broker, clients):
    """A client asks an old Fetch of 8 MiB and hangs up after 4 KiB: the broker, converting
    32 KiB at a time, holds about a chunk while the client does not read, serves other
    connections meanwhile, lets go of everything once the socket is gone, and a full read
    afterwards returns every record."""
    bootstrap = small_chunk_broker.bootstrap
    rng = random.Random(100)
    count = 1024
    large = Produced(
        f"large-{uuid.uuid4().hex[:8]}",
        "none",
        [
            {"key": f"large-{i:05d}".encode(), "value": rng.randbytes(8192), "partition": 0}
            for i in range(count)
        ],
    )
    small = Produced(f"small-{uuid.uuid4().hex[:8]}", "gzip", make_records(30, "small", 101))
    clients.create_topic(bootstrap, large.topic)
    clients.create_topic(bootstrap, small.topic)
    produce(clients, bootstrap, large, **{"batch.size": 24 * 1024})
    produce(clients, bootstrap, small)
    source = small_chunk_broker.sample(
        "directlog_broker_log_size_bytes", topic=large.topic, partition="0"
    )
    assert source is not None and source > count * 8192

    host, port = bootstrap.rsplit(":", 1)
    request = fetch_request(3, [(large.topic, 0)], partition_max_bytes=64 << 20)
    request.with_header(correlation_id=1, client_id="old-consumers")
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # the broker cannot run ahead
    client.settimeout(TIMEOUT)
    try:
        client.connect((host, int(port)))
        client.sendall(bytes(request.encode(header=True, framed=True)))
        head = b""
        while len(head) < 4096:
            received = client.recv(4096 - len(head))
            assert received, f"the broker closed the connection after {len(head)} bytes"
            head += received
        (size,) = struct.unpack_from(">i", head)
        assert size > source  # S_pre: at least the batches read, plus the header
        wait_for(lambda: temporary_memory(small_chunk_broker) > 0, 15, "a conversion under way")
        held = temporary_memory(small_chunk_broker)
        assert held <= 3 * SMALL_CHUNK, f"{held} bytes held for a {SMALL_CHUNK}-byte chunk"

        # Others are served meanwhile.
        (answer,) = old_fetch(bootstrap, 1, [(small.topic, 0)]).values()
        assert legacy_records(answer.records, 0) == expected(small.records, 0)
    finally:
        client.close()  # unread bytes: the broker gets a reset
    wait_memory_released(small_chunk_broker)

    got = read_old(bootstrap, large.topic, 3, count, partition_max_bytes=64 << 20)
    assert [(r[0], r[1], r[2]) for r in got] == [
        (i, r["key"], r["value"]) for i, r in enumerate(large.records)
    ]
    wait_memory_released(small_chunk_broker)
    assert "Traceback" not in small_chunk_broker.stderr_text()


# 8. Eager and lazy conversion ------------------------------------------------------------


def test_eager_and_lazy_answers_are_byte_identical(
    module_broker, small_chunk_broker, eager_broker, codec_topics, clients
):
    """The same batches on three brokers, converting in 128 KiB chunks, in 32 KiB chunks and
    whole before sending (down_conversion_chunk_bytes 0): every old Fetch, whole or cut by
    its limit, is answered with the same bytes."""
    copies = [small_chunk_broker, eager_broker]
    for name in OLD_CODECS:
        produced = codec_topics[name]
        (stored,) = old_fetch(module_broker.bootstrap, 11, [(produced.topic, 0)]).values()
        data = bytes(stored.records)
        batches = []
        while data:
            (length,) = struct.unpack_from(">i", data, 8)
            batches.append(data[: 12 + length])
            data = data[12 + length :]
        for broker in copies:
            clients.create_topic(broker.bootstrap, produced.topic)
            for batch in batches:
                (base_offset,) = struct.unpack_from(">q", batch)
                assert produce_raw(broker.bootstrap, produced.topic, batch) == (
                    ErrorCode.NONE,
                    base_offset,
                )

        source = len(stored.records)
        requests = [
            fetch_request(3, [(produced.topic, 0)]),
            fetch_request(3, [(produced.topic, 0)], partition_max_bytes=3000),
            fetch_request(2, [(produced.topic, 41)], partition_max_bytes=100_000),
            fetch_request(1, [(produced.topic, 0)]),
            fetch_request(0, [(produced.topic, 150)], partition_max_bytes=5000),
        ]
        lazy = raw_frames(module_broker.bootstrap, requests)
        assert raw_frames(small_chunk_broker.bootstrap, requests) == lazy, name
        assert raw_frames(eager_broker.bootstrap, requests) == lazy, name

        # And what they say is right: records from the fetch offset on, cut after a whole
        # message (then padded), or the cut-off header alone where Fetch v0-2's limit is
        # below the first batch.
        starts = [0, 0, 41, 0, 150]
        for index, (request, frame, start) in enumerate(zip(requests, lazy, starts, strict=True)):
            version = request.API_VERSION
            answer = FetchResponse.decode(frame, version=version, header=True)
            (partition,) = answer.responses[0].partitions
            assert partition.error_code == ErrorCode.NONE
            records = bytes(partition.records)
            magic = 0 if version < 2 else 1
            got = [r[:4] for r in legacy_records(records, magic) if r[0] >= start]
            want = [r[:4] for r in expected(produced.records, magic)]
            if not got:
                assert version < 3 and records == CUT_OFF_HEADER, (name, index)
            assert got == want[start : start + len(got)], (name, index)
            if start == 0 and request.topics[0].partitions[0].partition_max_bytes > source:
                # The whole log read: S_pre is its size (its first batch converted is less).
                assert len(records) == source, (name, index)
