"""The protocol edge without sockets: framing, request headers, and every request path fed
random and mutated bytes. Whatever arrives, the broker answers, or refuses the connection
with BadRequestError / a RecordError — never another exception, never changed data."""

from __future__ import annotations

import asyncio
import struct
import tempfile
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.frames import FrameReader, FrameTooLargeError, frame
from directlog.protocol.api import APIS, ApiKey, parse_request_header
from directlog.records.batch import Record, build_batch
from directlog.records.errors import CorruptRecordError, RecordError
from directlog.rpc import controller_pb2 as pb
from directlog.topics import TopicPartition
from services.broker.apis import CloseConnectionError, KafkaApis
from services.broker.cluster_metadata import ClusterImage
from services.broker.controller_link import ControllerLink
from services.broker.groups.coordinator import CoordinatorSettings, GroupCoordinator
from services.broker.groups.handlers import GroupApis
from services.broker.metrics import BrokerMetrics
from services.broker.producer_ids import ProducerIdAllocator
from services.broker.replica_fetcher import FetchSettings
from services.broker.replica_manager import ReplicaManager
from services.broker.server import BadRequestError, KafkaServer
from services.broker.settings import BrokerSettings
from services.broker.storage import LogConfig
from services.broker.storage.log_manager import LogManager
from tests.ports import free_port
from tests.storage.helpers import tree_digest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
    from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest, MetadataResponse
    from kafka.protocol.producer import ProduceRequest


def receive_all(
    reader: FrameReader, stream: bytes, chunks: list[int], take: Callable[[memoryview], Any] = bytes
) -> list[Any]:
    """Feed `stream` the way a socket would, at most chunks[i] bytes per receive; `take`
    each frame (a copy by default: views live until writable())."""
    out: list[Any] = []
    position, turn = 0, 0
    while position < len(stream):
        view = reader.writable()
        assert len(view) > 0
        count = min(len(view), max(chunks[turn % len(chunks)], 1), len(stream) - position)
        view[:count] = stream[position : position + count]
        position += count
        turn += 1
        reader.received(count)
        views = list(reader.frames())  # every view of a pass lives until writable()
        out += [take(f) for f in views]
    return out


@given(st.lists(st.binary(max_size=200), max_size=8), st.lists(st.integers(1, 300), min_size=1))
def test_frames_survive_any_split_and_any_size(payloads, chunks):
    stream = b"".join(frame(p) for p in payloads)
    reader = FrameReader(max_frame=1024, buffer_size=64)  # many frames outgrow the buffer
    assert receive_all(reader, stream, chunks) == payloads
    assert reader.pending == 0


def test_large_frames_reuse_one_buffer_until_one_outgrows_it():
    reader = FrameReader(max_frame=1 << 20, buffer_size=64)
    (first,) = receive_all(reader, frame(b"a" * 5000), [1 << 20], memoryview)
    assert bytes(first) == b"a" * 5000
    kept = first.obj
    (second,) = receive_all(reader, frame(b"b" * 3000), [1 << 20], memoryview)
    assert bytes(second) == b"b" * 3000 and second.obj is kept  # the dead frame's buffer
    (third,) = receive_all(reader, frame(b"c" * 9000), [1 << 20], memoryview)
    assert bytes(third) == b"c" * 9000 and third.obj is not kept  # outgrown: replaced


def test_oversized_and_negative_frames_are_refused_before_buffering():
    for prefix in (struct.pack(">i", 101), struct.pack(">i", -5)):
        reader = FrameReader(max_frame=100)
        reader.writable()[:4] = prefix
        reader.received(4)
        with pytest.raises(FrameTooLargeError, match="limit is 100"):
            list(reader.frames())


def test_request_headers_parse_as_clients_write_them():
    for version, flexible in ((0, False), (9, True)):
        request = MetadataRequest(topics=None, allow_auto_topic_creation=True)
        request.API_VERSION = version
        request.with_header(correlation_id=4242, client_id="unit-test")
        raw = bytes(request.encode(header=True))
        header = parse_request_header(raw)
        assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
            ApiKey.METADATA,
            version,
            4242,
            "unit-test",
        )
        assert APIS[ApiKey.METADATA].flexible(version) is flexible
        decoded = MetadataRequest.decode(raw[header.size :], version=version)
        assert decoded.topics == ([] if version == 0 else None)  # v0 has no null: [] means all


@given(st.binary(max_size=64))
def test_header_parser_only_raises_typed_errors(raw):
    try:
        header = parse_request_header(raw)
    except CorruptRecordError:
        return
    assert header.size <= len(raw)


FUZZ_TOPIC_ID = uuid.UUID(int=77)


class InProcessBroker:
    """Handlers and the request path of broker 0 over a temporary directory, no sockets: the
    cluster image it would get from a controller is applied directly (topic "fuzz", two
    partitions led here). No controller runs, so topics are not auto-created."""

    def __init__(self, directory: Path) -> None:
        settings = BrokerSettings(
            data_dir=directory, auto_create_topics=False, controllers=[f"127.0.0.1:{free_port()}"]
        )
        self.image = ClusterImage(LogConfig())
        self.logs = LogManager.open(directory, self.image.config_for)
        metrics = BrokerMetrics()
        replicas = ReplicaManager(
            0, self.logs, self.image, FetchSettings(0, 10, 1 << 20, 10), lambda: None, metrics
        )
        update = pb.MetadataUpdate(
            version=1,
            full=True,
            cluster_id="cluster",
            controller_id=0,
            controller_epoch=1,
            brokers=[
                pb.Broker(
                    broker_id=0,
                    broker_epoch=1,
                    listeners=[pb.Listener(name="PLAINTEXT", host="127.0.0.1", port=9092)],
                )
            ],
            topics=[
                pb.TopicState(
                    name="fuzz",
                    topic_id=FUZZ_TOPIC_ID.bytes,
                    partitions=[
                        pb.PartitionState(partition=i, replicas=[0], leader=0, isr=[0])
                        for i in range(2)
                    ],
                )
            ],
        )
        change = self.image.apply(update)
        assert change is not None
        replicas.apply(change)
        log = self.logs.get(TopicPartition("fuzz", 0))
        assert log is not None
        log.append(build_batch([Record(0, 1_700_000_000_000, b"k", b"kept")]))
        log.update_high_watermark(1)
        link = ControllerLink(settings.controllers, 0, [], None, 1.0, lambda update: None)
        groups = GroupApis(GroupCoordinator(CoordinatorSettings(), lambda: 1), self.image, metrics)
        apis = KafkaApis(
            settings, self.image, replicas, link, metrics, groups, ProducerIdAllocator(link)
        )
        self.server = KafkaServer(apis, apis.metrics, max_request_bytes=1 << 20)

    def respond(self, raw: bytes):
        async def bounded():
            return await asyncio.wait_for(self.server.respond(memoryview(raw)), 1.0)

        return asyncio.run(bounded())


def valid_requests() -> list[bytes]:
    """Well-formed requests of several APIs and versions, header included."""
    records = build_batch([Record(0, 1_700_000_000_000, None, b"v")])
    messages = [
        (ApiVersionsRequest(client_software_name="fuzz", client_software_version="1"), 3),
        (MetadataRequest(topics=None, allow_auto_topic_creation=False), 12),
        (
            MetadataRequest(
                topics=[
                    MetadataRequest.MetadataRequestTopic(name="fuzz", topic_id=uuid.UUID(int=0))
                ],
                allow_auto_topic_creation=False,
            ),
            1,
        ),
        (
            ProduceRequest(
                acks=1,
                timeout_ms=100,
                topic_data=[
                    ProduceRequest.TopicProduceData(
                        name="nope",
                        partition_data=[
                            ProduceRequest.TopicProduceData.PartitionProduceData(
                                index=0, records=records
                            )
                        ],
                    )
                ],
            ),
            9,
        ),
        (
            FetchRequest(
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=1 << 20,
                isolation_level=0,
                session_id=0,
                session_epoch=-1,
                topics=[
                    FetchRequest.FetchTopic(
                        topic="fuzz",
                        topic_id=uuid.UUID(int=0),
                        partitions=[
                            FetchRequest.FetchTopic.FetchPartition(
                                partition=0, fetch_offset=0, partition_max_bytes=1 << 20
                            )
                        ],
                    )
                ],
                forgotten_topics_data=[],
                rack_id="",
            ),
            11,
        ),
        (
            ListOffsetsRequest(
                replica_id=-1,
                isolation_level=0,
                topics=[
                    ListOffsetsRequest.ListOffsetsTopic(
                        name="fuzz",
                        partitions=[
                            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                                partition_index=0, timestamp=-2
                            )
                        ],
                    )
                ],
            ),
            5,
        ),
    ]
    out = []
    for message, version in messages:
        message.API_VERSION = version
        message.with_header(correlation_id=1, client_id="fuzz")
        out.append(bytes(message.encode(header=True)))
    return out


VALID = valid_requests()


def check_only_typed_failures(broker: InProcessBroker, raw: bytes) -> None:
    try:
        broker.respond(raw)
    except (BadRequestError, RecordError):
        pass
    except TimeoutError:
        # Only a fetch may wait (long poll), and only while its max wait lasts.
        assert struct.unpack_from(">h", raw, 0)[0] == ApiKey.FETCH


@given(st.one_of(st.binary(max_size=300), st.tuples(st.sampled_from(VALID), st.data())))
def test_any_bytes_get_an_answer_or_a_typed_refusal(case):
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        broker = InProcessBroker(directory)
        before = tree_digest(directory / "fuzz-0")
        if isinstance(case, bytes):
            raw = case
        else:
            raw, data = bytearray(case[0]), case[1]
            for _ in range(data.draw(st.integers(1, 4))):
                position = data.draw(st.integers(0, len(raw) - 1))
                raw[position] = data.draw(st.integers(0, 255))
            raw = bytes(raw[: data.draw(st.integers(0, len(raw)))])
        check_only_typed_failures(broker, raw)
        assert tree_digest(directory / "fuzz-0") == before
        broker.logs.close()


def test_every_valid_request_is_answered():
    with tempfile.TemporaryDirectory() as name:
        broker = InProcessBroker(Path(name))
        for raw in VALID:
            parts, _, _ = broker.respond(raw)
            assert parts and struct.unpack_from(">i", parts[0], 0)[0] == 1  # correlation id
        broker.logs.close()


def test_unsupported_api_versions_version_gets_the_kip_511_answer():
    with tempfile.TemporaryDirectory() as name:
        broker = InProcessBroker(Path(name))
        raw = struct.pack(">hhih", ApiKey.API_VERSIONS, 99, 7, -1)
        parts, _, _ = broker.respond(raw)
        body = b"".join(parts)
        correlation, error_code, count = struct.unpack_from(">ihi", body, 0)
        assert (correlation, error_code, count) == (7, 35, len(APIS))  # UNSUPPORTED_VERSION
        with pytest.raises(BadRequestError, match="not served"):
            broker.respond(struct.pack(">hhih", ApiKey.PRODUCE, 99, 7, -1))
        with pytest.raises(BadRequestError, match="unknown API key"):
            broker.respond(struct.pack(">hhih", 999, 0, 7, -1))
        broker.logs.close()


def test_metadata_for_an_unknown_topic_id_answers_unknown_topic_id():
    with tempfile.TemporaryDirectory() as name:
        broker = InProcessBroker(Path(name))
        known = broker.image.topic("fuzz")
        assert known is not None
        missing = uuid.UUID(int=12345)
        request = MetadataRequest(
            topics=[
                MetadataRequest.MetadataRequestTopic(name=None, topic_id=i)
                for i in (known.topic_id, missing)
            ],
            allow_auto_topic_creation=True,
        )
        request.API_VERSION = 12
        request.with_header(correlation_id=3, client_id="t")
        parts, _, _ = broker.respond(bytes(request.encode(header=True)))
        body = b"".join(parts)
        response = MetadataResponse.decode(body[5:], version=12)  # v1 header: id + tag byte
        got = [(t.name, t.topic_id, t.error_code, len(t.partitions)) for t in response.topics]
        assert got == [("fuzz", known.topic_id, 0, 2), (None, missing, 100, 0)]  # UNKNOWN_TOPIC_ID
        assert sorted(broker.image.topics) == ["fuzz"]  # nothing was created for the unknown id
        broker.logs.close()


def test_failed_acks_zero_produce_closes_the_connection():
    with tempfile.TemporaryDirectory() as name:
        broker = InProcessBroker(Path(name))
        records = build_batch([Record(0, 1_700_000_000_000, None, b"v")])
        parts = ProduceRequest.TopicProduceData.PartitionProduceData
        for index, fails in ((0, False), (9, True)):
            request = ProduceRequest(
                acks=0,
                timeout_ms=100,
                topic_data=[
                    ProduceRequest.TopicProduceData(
                        name="fuzz", partition_data=[parts(index=index, records=records)]
                    )
                ],
            )
            request.API_VERSION = 9
            request.with_header(correlation_id=1, client_id="t")
            raw = bytes(request.encode(header=True))
            if fails:
                with pytest.raises(CloseConnectionError, match="fuzz"):
                    broker.respond(raw)
            else:
                assert broker.respond(raw)[0] is None  # acks=0: no response at all
        log = broker.logs.get(TopicPartition("fuzz", 0))
        assert log is not None and log.log_end_offset == 2
        broker.logs.close()
