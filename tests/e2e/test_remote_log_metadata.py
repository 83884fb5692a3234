"""Remote log metadata (KIP-405) through real controllers and a real consensus ensemble,
with this test playing the brokers' tiering over gRPC: copies recorded by the partition
leader, listed, carried across a SIGKILLed active controller to its standby (which reads
them from the store, and survives a record it cannot read), the deposed leader and its
epoch refused after it is fenced, and a deleted topic's records listed for deletion and
removed from the store.

Every wait is bounded; nothing asserts on durations.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from kazoo.client import KazooClient

from directlog.protocol.errors import ErrorCode
from directlog.rpc import controller_pb2 as pb
from services.controller import layout
from tests.e2e.controller import ControllerProcess
from tests.e2e.ensemble import Ensemble
from tests.e2e.test_controller import (
    WAIT,
    Brokers,
    Heartbeats,
    active_hint,
    full_image,
    rpc_error,
    wait_active,
)

pytestmark = pytest.mark.timeout(120)

ROOT = "/remote-log-metadata"


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[Ensemble]:
    with Ensemble(tmp_path / "ensemble", size=1) as ens:
        ens.start()
        ens.wait_serving()
        yield ens


@pytest.fixture
def controllers(ensemble: Ensemble, tmp_path: Path) -> Iterator[list[ControllerProcess]]:
    """Two controllers on one root; at teardown each must stop cleanly on SIGTERM unless
    the test SIGKILLed it."""
    processes = [
        ControllerProcess(
            tmp_path,
            ensemble.hosts,
            controller_id=i,
            settings={"root": ROOT, "broker_session_timeout_ms": 3000},
        )
        for i in (1, 2)
    ]
    for process in processes:
        process.start()
    yield processes
    for process in processes:
        process.stop()
    for process in processes:
        unclean = [c for c in process.exit_codes if c not in (0, -signal.SIGKILL)]
        assert not unclean and not process.killed, (
            f"controller {process.controller_id} did not stop cleanly: {process.exit_codes}\n"
            f"{process.stderr_tail()}"
        )


@pytest.fixture
def zk(ensemble: Ensemble) -> Iterator[KazooClient]:
    client = KazooClient(hosts=ensemble.hosts)
    client.start(timeout=WAIT)
    yield client
    client.stop()
    client.close()


def segment(
    n: int,
    state: pb.RemoteSegmentState,
    base: int,
    end: int,
    size: int = 1000,
    epochs: tuple[int, ...] = (0,),
) -> pb.RemoteLogSegment:
    return pb.RemoteLogSegment(
        segment_id=bytes([n]) * 16,
        state=state,
        base_offset=base,
        start_offset=base,
        end_offset=end,
        max_timestamp=1_700_000_000_000 + end,
        size_bytes=size,
        epochs=[pb.EpochStart(epoch=e, start_offset=base) for e in epochs],
    )


def test_remote_log_metadata_across_a_failover_and_a_topic_deletion(
    controllers: list[ControllerProcess], zk: KazooClient
) -> None:
    active = wait_active(*controllers)
    standby = next(c for c in controllers if c is not active)
    brokers = Brokers(active, standby)
    epochs = {b: brokers.register(b).broker_epoch for b in (1, 2)}
    heartbeats = Heartbeats(brokers, epochs)
    try:
        created = brokers.create_topic("tiered", 2, 2)
        assert created.error_code == 0, created.error_message
        topic_id = created.topic_id
        states = {p.partition: p for p in full_image(brokers, 1, epochs[1]).topics[0].partitions}
        state = states[0]
        leader, follower = state.leader, next(b for b in state.replicas if b != state.leader)

        def update(
            item: pb.RemoteLogSegment,
            broker_id: int = leader,
            leader_epoch: int = 0,
            index: int = 0,
        ) -> pb.UpdateRemoteLogSegmentReply:
            request = pb.UpdateRemoteLogSegmentRequest(
                broker_id=broker_id,
                broker_epoch=epochs[broker_id],
                topic_id=topic_id,
                partition=index,
                leader_epoch=leader_epoch,
                segment=item,
            )
            reply: pb.UpdateRemoteLogSegmentReply = brokers.call("UpdateRemoteLogSegment", request)
            return reply

        def listing(known_version: int = -1, index: int = 0) -> list[pb.RemoteLogPartition]:
            request = pb.ListRemoteLogSegmentsRequest(
                partitions=[
                    pb.PartitionVersion(
                        topic_id=topic_id, partition=index, known_version=known_version
                    )
                ]
            )
            return list(brokers.call("ListRemoteLogSegments", request).partitions)

        (empty,) = listing()
        assert (empty.error_code, empty.version, empty.next_offset) == (0, 0, -1)
        assert listing(known_version=0) == []

        before_ms = int(time.time() * 1000)
        replies = [
            update(segment(1, pb.COPY_STARTED, 0, 99)),
            update(segment(1, pb.COPY_FINISHED, 0, 99, size=2048, epochs=(0,))),
            update(segment(2, pb.COPY_STARTED, 100, 199)),
        ]
        after_ms = int(time.time() * 1000)
        assert [(r.error_code, r.version, r.next_offset) for r in replies] == [
            (0, 1, -1),
            (0, 2, 100),
            (0, 3, 100),
        ]
        (partition,) = listing()
        assert (partition.error_code, partition.version, partition.next_offset) == (0, 3, 100)
        first, second = partition.segments
        assert (first.segment_id, first.state, first.size_bytes) == (
            bytes([1]) * 16,
            pb.COPY_FINISHED,
            2048,
        )
        assert (first.broker_id, first.leader_epoch) == (leader, 0)
        assert before_ms <= first.event_time_ms <= after_ms
        assert (second.segment_id, second.state, second.start_offset) == (
            bytes([2]) * 16,
            pb.COPY_STARTED,
            100,
        )
        assert listing(known_version=3) == []
        other = update(segment(9, pb.COPY_STARTED, 0, 9), states[1].leader, index=1)
        assert (other.error_code, other.version) == (0, 1)

        # In the store: the partition's version and next offset, one znode per record.
        partition_path = f"{ROOT}/remote_log/{layout.uuid_text(topic_id)}/0"
        data, _ = zk.get(partition_path)
        assert data == b'{"next_offset":100,"version":3}'
        assert sorted(zk.get_children(partition_path)) == sorted(
            layout.uuid_text(bytes([n]) * 16) for n in (1, 2)
        )

        # A standby answers nothing and names the active controller.
        with standby.channel() as channel:
            refused = rpc_error(
                lambda: standby.stub(channel).ListRemoteLogSegments(
                    pb.ListRemoteLogSegmentsRequest(), timeout=5
                )
            )
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert active_hint(refused) == active.address

        active.kill()
        assert wait_active(standby) is standby
        # The new controller reads the records from the store, each partition when first
        # asked for. One it cannot read fails the requests that need it, and nothing else.
        topic_path = f"{ROOT}/remote_log/{layout.uuid_text(topic_id)}"
        zk.set(f"{topic_path}/1/{layout.uuid_text(bytes([9]) * 16)}", b"{")
        (unreadable,) = listing(index=1)
        assert unreadable.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
        assert listing() == [partition]
        assert standby.sample("directlog_controller_active") == 1
        # A retry of a move already made is answered without a change.
        again = update(segment(1, pb.COPY_FINISHED, 0, 99, size=2048))
        assert (again.error_code, again.version, again.next_offset) == (0, 3, 100)

        # Only the leader, in its current epoch. The leader goes silent and is fenced: the
        # follower leads in epoch 1, and the old epoch is refused.
        assert (
            update(segment(2, pb.COPY_FINISHED, 100, 199), broker_id=follower).error_code
            == ErrorCode.NOT_LEADER_OR_FOLLOWER
        )
        del heartbeats.epochs[leader]
        deadline = time.monotonic() + WAIT
        while full_image(brokers, follower, epochs[follower]).topics[0].partitions[0].leader != (
            follower
        ):
            assert time.monotonic() < deadline, "the follower never took over"
            time.sleep(0.1)
        assert update(segment(2, pb.COPY_FINISHED, 100, 199)).error_code == (
            ErrorCode.STALE_BROKER_EPOCH  # fenced: its session is over
        )
        stale = update(segment(2, pb.COPY_FINISHED, 100, 199), broker_id=follower)
        assert stale.error_code == ErrorCode.FENCED_LEADER_EPOCH
        assert (stale.version, stale.next_offset) == (3, 100)
        overlapping = update(segment(3, pb.COPY_STARTED, 50, 150), follower, leader_epoch=1)
        assert overlapping.error_code == ErrorCode.INVALID_REQUEST
        assert "next offset 100" in overlapping.error_message
        assert listing() == [partition]

        finished = update(segment(2, pb.COPY_FINISHED, 100, 199), follower, leader_epoch=1)
        assert (finished.error_code, finished.version, finished.next_offset) == (0, 4, 200)

        # Deleting the topic keeps its records, marked, for a tiering service to clean up.
        deleted = brokers.call(
            "DeleteTopics", pb.DeleteTopicsRequest(topics=[pb.TopicRef(topic_id=topic_id)])
        )
        assert deleted.results[0].error_code == 0
        deletions = brokers.call("ListRemoteLogDeletions", pb.ListRemoteLogDeletionsRequest())
        assert [(t.topic_id, t.name) for t in deletions.topics] == [(topic_id, "tiered")]
        (gone,) = listing()
        assert gone.error_code == ErrorCode.UNKNOWN_TOPIC_ID
        assert zk.get(topic_path)[0] == b'{"deleted":true,"name":"tiered"}'
        assert len(zk.get_children(partition_path)) == 2

        # Every record goes, the unreadable one too.
        finish = pb.FinishRemoteLogDeletionRequest(topic_id=topic_id)
        done = brokers.call("FinishRemoteLogDeletion", finish)
        assert done.error_code == 0, done.error_message
        assert zk.exists(topic_path) is None
        assert zk.get_children(f"{ROOT}/remote_log") == []
        deletions = brokers.call("ListRemoteLogDeletions", pb.ListRemoteLogDeletionsRequest())
        assert list(deletions.topics) == []
        assert brokers.call("FinishRemoteLogDeletion", finish).error_code == (
            ErrorCode.UNKNOWN_TOPIC_ID
        )
    finally:
        heartbeats.stop()
        brokers.close()
