"""Tiered storage under faults: a tiering service killed mid-upload, a remote store that
cannot be reached for a while, corrupt remote data and indexes, and bad requests on the
broker's tiering gRPC service. Nothing acknowledged is lost, nothing corrupt is served."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from directlog.protocol.errors import ErrorCode
from directlog.remote import layout
from directlog.remote.index import RemoteIndex
from directlog.remote.rdi import RemoteDataId
from directlog.remote.store import RemoteStore, StoreConfig
from directlog.rpc import controller_pb2 as pb
from directlog.rpc import tiering_pb2 as tpb
from directlog.rpc import tiering_pb2_grpc
from directlog.topics import uuid_text
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.records import fetch_partition, recent_base_timestamp
from tests.e2e.tiered import (
    TIMEOUT,
    contiguous,
    create_tiered_topic,
    finished_ranges,
    leader_of,
    local_log_start,
    produce,
    read_confluent,
    remote_records,
    tiering_settings,
    topic_id_of,
    values,
    wait_tiered,
)
from tests.s3_server import S3Server

pytestmark = pytest.mark.timeout(300)


def store_of(settings: dict, s3: S3Server | None) -> RemoteStore:
    extra = s3.settings if s3 is not None and settings["remote"].startswith("s3") else {}
    return RemoteStore(StoreConfig(settings["remote"], **extra))


def test_a_tiering_service_killed_mid_upload_redoes_the_copy_and_loses_nothing(tmp_path, s3):
    sent = values(2000, seed=4)
    settings = tiering_settings("s3", tmp_path, s3, remote_timeout_ms=60_000)
    with Cluster(tmp_path, tiering=settings) as cluster:
        create_tiered_topic(cluster, "ledger")
        with s3.outage():  # uploads hang: the copy is caught after COPY_STARTED
            produce(cluster.bootstrap, "ledger", sent, recent_base_timestamp())
            wait_for(
                lambda: any(r.state == pb.COPY_STARTED for r in remote_records(cluster, "ledger")),
                TIMEOUT,
                "a copy started",
            )
            cluster.tierings[0].kill()
        (cut,) = [r for r in remote_records(cluster, "ledger") if r.state == pb.COPY_STARTED]
        assert local_log_start(cluster, 0, "ledger") == 0  # nothing deleted meanwhile
        cluster.tierings[0].start()
        wait_tiered(cluster, 0, "ledger", at_least=len(sent) // 2)
        wait_for(
            lambda: all(r.state == pb.COPY_FINISHED for r in remote_records(cluster, "ledger")),
            TIMEOUT,
            "every copy finished",
        )
        records = remote_records(cluster, "ledger")
        assert cut.segment_id not in {r.segment_id for r in records}  # redone under a new id
        ranges = finished_ranges(cluster, "ledger")
        assert ranges[0][0] == 0 and contiguous(ranges)
        # Every object left belongs to a finished copy: the cut one's were cleaned up.
        store = store_of(settings, s3)
        ids = {uuid_text(uuid.UUID(bytes=r.segment_id)) for r in records}
        prefix = layout.partition_prefix("ledger", topic_id_of(cluster, "ledger"), 0)
        for found in store.list(f"{prefix}/segments"):
            name = found.key.rsplit("/", 1)[1]  # <20-digit base>-<22-character id><suffix>
            assert name[21:43] in ids, found.key
        got = read_confluent(cluster.bootstrap, "ledger", len(sent))
        assert [value for _, value, _ in got] == sent


def test_an_unreachable_store_keeps_local_data_answers_fetches_and_copying_resumes(tmp_path, s3):
    first, second = values(1500, seed=5), values(1500, seed=6)
    base = recent_base_timestamp()
    settings = tiering_settings("s3", tmp_path, s3, remote_timeout_ms=1000)
    brokers = {"tiering_remote_timeout_ms": 1000, "remote_fetch_max_wait_ms": 200}
    with Cluster(tmp_path, tiering=settings, broker_settings=brokers) as cluster:
        create_tiered_topic(cluster, "stock")
        produce(cluster.bootstrap, "stock", first, base)
        wait_tiered(cluster, 0, "stock", at_least=len(first) // 2)
        with s3.outage():
            produce(cluster.bootstrap, "stock", second, base + len(first))
            broker = cluster.brokers[0]
            segments = broker.data_dir / "stock-0"
            wait_for(
                lambda: len(list(segments.glob("*.log"))) >= 5, TIMEOUT, "closed local segments"
            )
            # Remote data cannot be read: a retriable error comes back, never a hang.
            answers = set()
            deadline = time.monotonic() + TIMEOUT
            while ErrorCode.KAFKA_STORAGE_ERROR not in answers and time.monotonic() < deadline:
                answer = fetch_partition(cluster.bootstrap, "stock", 0)
                assert answer.error_code != ErrorCode.NONE or not answer.records  # nothing yet
                answers.add(answer.error_code)
            assert ErrorCode.KAFKA_STORAGE_ERROR in answers
            # Meanwhile other clients of the broker are served as usual: remote reads wait
            # on their own threads, never on the broker's event loop.
            fetch_partition(cluster.bootstrap, "stock", 0)  # one more read in flight
            local = values(300, seed=11)
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            admin.create_topics([NewTopic("plain", 1, 1)])["plain"].result(TIMEOUT)
            produce(cluster.bootstrap, "plain", local, base)
            assert [v for _, v, _ in read_confluent(cluster.bootstrap, "plain", 300)] == local
            tiering = cluster.tierings[0]
            wait_for(
                lambda: tiering.total("directlog_tiering_copy_errors_total", topic="stock") > 0,
                TIMEOUT,
                "a failed copy counted",
            )
            # Nothing that is not remote was deleted (read now: copies that began before the
            # outage may have finished since the topic was first tiered).
            remote_end = finished_ranges(cluster, "stock")[-1][1] + 1
            assert (local_log_start(cluster, 0, "stock") or 0) <= remote_end
        wait_tiered(cluster, 0, "stock", at_least=len(first) + len(second) // 2)
        ranges = finished_ranges(cluster, "stock")
        assert ranges[0][0] == 0 and contiguous(ranges)
        got = read_confluent(cluster.bootstrap, "stock", len(first) + len(second))
        assert [value for _, value, _ in got] == first + second


def test_corrupt_remote_data_and_indexes_are_never_served(tmp_path):
    sent = values(2000, seed=7)
    settings = tiering_settings("file", tmp_path, None)
    with Cluster(tmp_path, tiering=settings) as cluster:
        create_tiered_topic(cluster, "audit")
        produce(cluster.bootstrap, "audit", sent, recent_base_timestamp())
        wait_tiered(cluster, 0, "audit", at_least=len(sent) // 2)
        first, second = [r for r in remote_records(cluster, "audit")][:2]
        store = store_of(settings, None)
        prefix = layout.partition_prefix("audit", topic_id_of(cluster, "audit"), 0)

        # One bit of a record in the first copy's object: its batch fails its CRC.
        key = layout.segment_key(
            prefix, first.base_offset, uuid.UUID(bytes=first.segment_id), layout.LOG
        )
        data_path = tmp_path / "remote" / key
        assert store.size(key) > 200
        original = data_path.read_bytes()
        damaged = bytearray(original)
        damaged[200] ^= 0x01
        data_path.write_bytes(bytes(damaged))
        answer = _until_error(cluster, "audit", first.start_offset)
        assert answer.error_code == ErrorCode.CORRUPT_MESSAGE
        # A truncated object: a retriable storage error, nothing served.
        data_path.write_bytes(original[: len(original) // 2])
        answer = _until_error(cluster, "audit", first.end_offset)
        assert answer.error_code == ErrorCode.KAFKA_STORAGE_ERROR and not answer.records
        data_path.write_bytes(original)
        assert fetch_partition(cluster.bootstrap, "audit", first.start_offset).records

        # A bad entry in the broker's remote index: the second copy's entry fails its CRC.
        cluster.tierings[0].stop()  # the index's writer, so it does not repair it meanwhile
        directory = cluster.brokers[0].data_dir / "audit-0"
        (log_index,) = sorted(directory.glob("*.remoteLogIndex"))[:1]
        index = RemoteIndex.open(directory)
        entries = list(index)
        index.close()
        position = sum(len(e.encode()) for e in entries if e.last_offset < second.start_offset)
        whole = log_index.read_bytes()
        bad = bytearray(whole)
        bad[position + 20] ^= 0x01
        log_index.write_bytes(bytes(bad))
        answer = fetch_partition(cluster.bootstrap, "audit", second.start_offset)
        assert answer.error_code != ErrorCode.NONE and not answer.records
        # An entry whose RDI names an object outside the store.
        log_index.write_bytes(whole)
        moved = [
            e.__class__(
                e.first_offset,
                e.last_offset,
                e.first_timestamp,
                e.last_timestamp,
                RemoteDataId("file:///etc/passwd", e.rdi.position, e.rdi.length),
            )
            for e in entries
        ]
        writer = RemoteIndex.open(directory, writable=True)
        writer.replace(writer.files[0].base_offset, moved, now_ms=0)
        writer.close()
        answer = _after_refresh(cluster, "audit", first.start_offset)
        assert answer.error_code == ErrorCode.KAFKA_STORAGE_ERROR and not answer.records
        assert "outside" in cluster.brokers[0].stderr_text() or "not under" in (
            cluster.brokers[0].stderr_text()
        )
        assert data_path.read_bytes() == original  # stored data untouched


def _until_error(cluster: Cluster, topic: str, offset: int):
    """Fetch until an error comes back (the first fetch may find the read still running);
    no answer before it may carry records."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        answer = fetch_partition(cluster.bootstrap, topic, offset)
        if answer.error_code != ErrorCode.NONE or time.monotonic() > deadline:
            return answer
        assert not answer.records, "corrupt remote data was served"


def _after_refresh(cluster: Cluster, topic: str, offset: int):
    """A fetch once the broker has read its remote indexes again (it is told to by its
    tiering service, started again for that)."""
    cluster.tierings[0].start()
    deadline = time.monotonic() + TIMEOUT
    while True:
        answer = fetch_partition(cluster.bootstrap, topic, offset)
        if answer.error_code != ErrorCode.NONE or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def test_bad_requests_on_the_tiering_service_are_refused(tmp_path):
    settings = tiering_settings("file", tmp_path, None)
    with Cluster(tmp_path, brokers=2, tiering=settings) as cluster:
        create_tiered_topic(cluster, "guarded", replicas=2)
        produce(cluster.bootstrap, "guarded", [b"x" * 100] * 10, recent_base_timestamp())
        topic_id = topic_id_of(cluster, "guarded")
        follower = 1 - leader_of(cluster, "guarded")
        port = cluster.brokers[follower].settings["tiering_port"]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = tiering_pb2_grpc.BrokerTieringStub(channel)
            segment = pb.RemoteLogSegment(
                segment_id=uuid.uuid4().bytes, state=pb.COPY_STARTED, end_offset=5
            )
            reply = stub.UpdateRemoteLogSegment(
                pb.UpdateRemoteLogSegmentRequest(
                    topic_id=topic_id.bytes, partition=0, leader_epoch=0, segment=segment
                ),
                timeout=10,
            )
            assert reply.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
            reply = stub.RemoteLogChanged(
                tpb.RemoteLogChangedRequest(topic="nothing", partition=0), timeout=10
            )
            assert reply.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert remote_records(cluster, "guarded") == []
