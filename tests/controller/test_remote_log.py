"""Remote log metadata (KIP-405) without a store: who may record a copy, the moves a record
may make, next_offset and version, topic deletion and the chunked removal of what is left,
and the KIP-950 rule for turning remote storage off.

Changes are committed to ``Znodes``, an in-memory tree with ZooKeeper's checks, and applied
the way the controller applies them after a commit; a new controller's state is then
rebuilt from that tree the way ``Store`` reads it.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable
from typing import Any

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from services.controller import layout
from services.controller.cluster import (
    KIP_950_MESSAGE,
    NO_RECORDS,
    REMOTE_MOVES,
    Change,
    ClusterState,
    Image,
)
from services.controller.layout import Create, Delete, SetData
from services.controller.model import (
    RemotePartition,
    RemoteSegment,
    RemoteSegmentState,
    RemoteTopic,
)
from tests.controller.clusters import PATHS, TIMEOUT, commit, fence, partition, register, with_topic

pytestmark = pytest.mark.timeout(30)

STARTED = RemoteSegmentState.COPY_STARTED
FINISHED = RemoteSegmentState.COPY_FINISHED
DELETING = RemoteSegmentState.DELETE_STARTED
DELETED = RemoteSegmentState.DELETE_FINISHED


def code(error: pytest.ExceptionInfo[KafkaError]) -> ErrorCode:
    return ErrorCode(error.value.code)


def seg_id(n: int) -> bytes:
    return bytes([n]) * 16


def segment(
    state: RemoteSegmentState = STARTED,
    *,
    n: int = 1,
    base: int = 0,
    start: int | None = None,
    end: int = 99,
    size: int = 1000,
    max_timestamp: int = 5,
    epochs: tuple[tuple[int, int], ...] = ((0, 0),),
) -> RemoteSegment:
    """A segment as a broker sends it; broker_id, leader_epoch and event_time_ms are the
    controller's to fill in."""
    return RemoteSegment(
        seg_id(n),
        state,
        base,
        base if start is None else start,
        end,
        max_timestamp,
        size,
        leader_epoch=99,
        broker_id=99,
        epochs=epochs,
        event_time_ms=0,
    )


class Znodes:
    """A ZooKeeper tree in memory: a change commits all or nothing, with ZooKeeper's checks
    (the parent exists, no create over a znode, versions, no delete of a znode with
    children)."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[bytes, int]] = {PATHS.root: (b"", 0)}
        self.nodes[PATHS.remote_log] = (b"", 0)

    def commit(self, change: Change) -> None:
        nodes = dict(self.nodes)
        for op in change.ops:
            if isinstance(op, Create):
                assert op.path not in nodes, f"exists: {op}"
                assert op.path.rsplit("/", 1)[0] in nodes, f"no parent: {op}"
                nodes[op.path] = (op.data, 0)
            elif isinstance(op, SetData):
                _, version = nodes[op.path]
                assert op.version in (-1, version), f"bad version {version}: {op}"
                nodes[op.path] = (op.data, version + 1)
            else:
                assert op.path in nodes and not self._children(nodes, op.path), op
                assert op.version in (-1, nodes[op.path][1]), op
                del nodes[op.path]
        self.nodes = nodes

    def children(self, path: str) -> list[str]:
        return self._children(self.nodes, path)

    @staticmethod
    def _children(nodes: dict[str, tuple[bytes, int]], path: str) -> list[str]:
        return sorted(p[len(path) + 1 :] for p in nodes if p.rsplit("/", 1)[0] == path)

    def remote_topics(self) -> dict[bytes, RemoteTopic]:
        """As Store.load reads them."""
        return {
            layout.uuid_bytes(name): layout.decode_remote_topic(
                self.nodes[f"{PATHS.remote_log}/{name}"][0]
            )
            for name in self.children(PATHS.remote_log)
        }

    def remote_partition(self, topic_id: bytes, index: int) -> RemotePartition:
        """As Store.load_remote_partition reads it."""
        path = PATHS.remote_partition(topic_id, index)
        if path not in self.nodes:
            return RemotePartition()
        segments = [
            layout.decode_remote_segment(layout.uuid_bytes(name), self.nodes[f"{path}/{name}"][0])
            for name in self.children(path)
        ]
        return layout.decode_remote_partition(self.nodes[path][0], segments)

    def tree(self, topic_id: bytes) -> dict[str, list[str]]:
        """As Store.remote_tree reads it."""
        path = PATHS.remote_topic(topic_id)
        return {p: self.children(f"{path}/{p}") for p in self.children(path)}


class Cluster:
    """Topic "t" with partitions led by brokers 1 and 2 (replicas (1, 2, 3) and (2, 3, 1),
    broker ``b`` at epoch ``b``), its changes committed to ``znodes``."""

    def __init__(self, **configs: str) -> None:
        self.state, self.topic_id = with_topic([(1, 2, 3), (2, 3, 1)], configs=configs)
        self.znodes = Znodes()
        self.znodes.nodes[PATHS.topics] = (b"", 0)
        self.znodes.nodes[PATHS.topic(self.topic_id)] = (b"", 0)  # its data is not read here
        self.now_ms = 1000

    def plan(
        self,
        item: RemoteSegment,
        *,
        index: int = 0,
        broker_id: int | None = None,
        broker_epoch: int | None = None,
        leader_epoch: int | None = None,
        topic_id: bytes | None = None,
    ) -> tuple[RemotePartition, Change]:
        """UpdateRemoteLogSegment from the partition's leader, as the service plans it: the
        partition's records loaded first."""
        topic_id = self.topic_id if topic_id is None else topic_id
        if broker_id is None or leader_epoch is None:
            leader = partition(self.state, self.topic_id, index)
            broker_id = leader.leader if broker_id is None else broker_id
            leader_epoch = leader.leader_epoch if leader_epoch is None else leader_epoch
        if broker_epoch is None:
            broker_epoch = self.state.brokers[broker_id].broker_epoch
        self.load([(topic_id, index)])
        self.now_ms += 10
        return self.state.update_remote_segment(
            broker_id,
            broker_epoch,
            topic_id,
            index,
            leader_epoch,
            item,
            self.now_ms,
        )

    def update(self, item: RemoteSegment, **kwargs: Any) -> RemotePartition:
        records, change = self.plan(item, **kwargs)
        self.commit(change)
        return records

    def refused(self, item: RemoteSegment, **kwargs: Any) -> ErrorCode:
        with pytest.raises(KafkaError) as refused:
            self.plan(item, **kwargs)
        return code(refused)

    def commit(self, change: Change) -> None:
        self.znodes.commit(change)
        commit(self.state, change)

    def load(self, keys: Iterable[tuple[bytes, int]]) -> None:
        for topic_id, index in self.state.remote_unloaded(keys):
            self.state.remote_loaded(topic_id, index, self.znodes.remote_partition(topic_id, index))

    def records(self, index: int = 0) -> RemotePartition:
        self.load([(self.topic_id, index)])
        return self.state.remote_partition(self.topic_id, index)

    def takeover(self) -> None:
        """A new active controller: the image as loaded, remote topics read from the tree,
        no partition's records read yet."""
        old = self.state
        self.state = ClusterState(
            Image(
                old.cluster_id,
                old.brokers,
                old.topics,
                old.last_broker_epoch,
                old.next_producer_id,
                self.znodes.remote_topics(),
            ),
            PATHS,
            now=0.0,
            session_timeout=TIMEOUT,
        )


# Recording copies ---------------------------------------------------------------------


def test_the_first_record_creates_its_topic_and_partition_znodes() -> None:
    cluster = Cluster()
    records, change = cluster.plan(segment(base=0, end=99))
    topic_id = cluster.topic_id
    new = RemoteSegment(seg_id(1), STARTED, 0, 0, 99, 5, 1000, 0, 1, ((0, 0),), 1010)
    assert change.ops == (
        Create(PATHS.remote_topic(topic_id), b'{"deleted":false,"name":"t"}'),
        Create(PATHS.remote_partition(topic_id, 0), b'{"next_offset":-1,"version":1}'),
        Create(PATHS.remote_segment(topic_id, 0, seg_id(1)), layout.encode_remote_segment(new)),
    )
    # The copier is the requester, in its leader epoch, at the controller's clock.
    assert records == RemotePartition(1, -1, {seg_id(1): new})
    assert not change.touches_image  # brokers' images do not change
    # Until it commits nothing moves: planned again, the same ops.
    assert cluster.plan(segment(base=0, end=99))[1].ops[0] == change.ops[0]
    cluster.commit(change)
    assert cluster.state.remote_topics == {topic_id: RemoteTopic("t")}
    assert cluster.records() == records
    # The next partition's first record finds the topic znode there.
    _, other = cluster.plan(segment(n=2), index=1)
    assert [type(op) for op in other.ops] == [Create, Create]
    assert other.ops[0].path == PATHS.remote_partition(topic_id, 1)


def test_copy_finished_moves_next_offset_and_keeps_what_copy_started_recorded() -> None:
    cluster = Cluster()
    cluster.update(segment(base=0, start=10, end=99, size=900, max_timestamp=5))
    finished = segment(
        FINISHED, base=7, start=8, end=200, size=1234, max_timestamp=77, epochs=((0, 10), (1, 50))
    )
    records, change = cluster.plan(finished)
    topic_id = cluster.topic_id
    record = records.segments[seg_id(1)]
    # Offsets as recorded at COPY_STARTED; the final size, timestamp and epochs.
    assert (record.base_offset, record.start_offset, record.end_offset) == (0, 10, 99)
    assert (record.size_bytes, record.max_timestamp) == (1234, 77)
    assert record.epochs == ((0, 10), (1, 50))
    assert record.state is FINISHED and record.event_time_ms == cluster.now_ms
    assert (records.version, records.next_offset) == (2, 100)
    assert change.ops == (
        SetData(PATHS.remote_partition(topic_id, 0), b'{"next_offset":100,"version":2}', version=0),
        SetData(PATHS.remote_segment(topic_id, 0, seg_id(1)), layout.encode_remote_segment(record)),
    )
    cluster.commit(change)
    assert cluster.records() == records


def test_a_new_copy_starts_at_or_after_next_offset() -> None:
    cluster = Cluster()
    cluster.update(segment(n=1, base=0, end=99))
    cluster.update(segment(FINISHED, n=1))
    assert cluster.refused(segment(n=2, base=50, end=150)) is ErrorCode.INVALID_REQUEST
    # A segment whose first batches were copied already serves from next_offset on.
    records = cluster.update(segment(n=2, base=50, start=100, end=150))
    assert (records.version, records.next_offset) == (3, 100)
    assert cluster.update(segment(FINISHED, n=2)).next_offset == 151


def test_no_offset_is_held_by_two_finished_copies() -> None:
    """Two copies started before either finished (a leader change between them): the
    second to finish overlaps the first and is refused."""
    cluster = Cluster()
    cluster.update(segment(n=1, base=0, end=99))
    cluster.update(segment(n=2, base=50, end=149))
    assert cluster.update(segment(FINISHED, n=2)).next_offset == 150
    assert cluster.refused(segment(FINISHED, n=1)) is ErrorCode.INVALID_REQUEST
    # The loser can only be given up.
    records = cluster.update(segment(DELETING, n=1))
    assert records.segments[seg_id(1)].state is DELETING
    assert records.next_offset == 150


@pytest.mark.parametrize(
    "item",
    [
        segment(FINISHED),  # a new record starts in COPY_STARTED
        segment(DELETING),
        segment(base=10, start=5, end=99),  # base <= start
        segment(base=0, start=100, end=99),  # start <= end
        segment(base=-1, end=99),
        segment(size=-1),
        RemoteSegment(bytes(15), STARTED, 0, 0, 9, 0, 0, 0, 0, (), 0),  # 16-byte ids only
        RemoteSegment(bytes(17), STARTED, 0, 0, 9, 0, 0, 0, 0, (), 0),
    ],
)
def test_bad_new_records_are_invalid_requests(item: RemoteSegment) -> None:
    cluster = Cluster()
    assert cluster.refused(item) is ErrorCode.INVALID_REQUEST
    assert cluster.records() is NO_RECORDS


def test_a_finished_copy_with_a_negative_size_is_refused() -> None:
    cluster = Cluster()
    cluster.update(segment())
    assert cluster.refused(segment(FINISHED, size=-5)) is ErrorCode.INVALID_REQUEST


# The moves of a record ------------------------------------------------------------------


def reach(cluster: Cluster, state: RemoteSegmentState) -> None:
    """Record segment 1 and move it along the usual path up to ``state``."""
    path = [STARTED, FINISHED, DELETING]
    for step in path[: path.index(state) + 1]:
        cluster.update(segment(step))


MOVES = [(a, b) for a in (STARTED, FINISHED, DELETING) for b in RemoteSegmentState if a != b]


@pytest.mark.parametrize(("old", "new"), MOVES, ids=[f"{a.name}-{b.name}" for a, b in MOVES])
def test_moves(old: RemoteSegmentState, new: RemoteSegmentState) -> None:
    cluster = Cluster()
    reach(cluster, old)
    before = cluster.records()
    allowed = {
        (STARTED, FINISHED),
        (STARTED, DELETING),
        (FINISHED, DELETING),
        (DELETING, DELETED),
    }
    assert {(a, b) for a, moves in REMOTE_MOVES.items() for b in moves} == allowed
    if (old, new) not in allowed:
        assert cluster.refused(segment(new)) is ErrorCode.INVALID_REQUEST
        assert cluster.records() == before
        return
    after = cluster.update(segment(new))
    assert after.version == before.version + 1
    if new is DELETED:
        assert seg_id(1) not in after.segments
    else:
        assert after.segments[seg_id(1)].state is new


@pytest.mark.parametrize("state", [STARTED, FINISHED, DELETING])
def test_repeating_the_current_state_writes_nothing(state: RemoteSegmentState) -> None:
    cluster = Cluster()
    reach(cluster, state)
    before = cluster.records()
    # A retry whose first reply was lost: even with other values, nothing changes.
    records, change = cluster.plan(segment(state, end=5000, size=1))
    assert change.ops == () and records == before


def test_delete_finished_removes_the_record_and_keeps_the_partition() -> None:
    cluster = Cluster()
    reach(cluster, DELETING)
    topic_id = cluster.topic_id
    records, change = cluster.plan(segment(DELETED))
    assert change.ops == (
        SetData(PATHS.remote_partition(topic_id, 0), b'{"next_offset":100,"version":4}', version=2),
        Delete(PATHS.remote_segment(topic_id, 0, seg_id(1))),
    )
    assert records == RemotePartition(4, 100, {})
    cluster.commit(change)
    # The partition znode keeps next_offset and the version: a reader that knew version 3
    # still sees that something changed, and no new copy reaches below offset 100.
    assert cluster.znodes.children(PATHS.remote_partition(topic_id, 0)) == []
    assert cluster.records() == RemotePartition(4, 100, {})
    assert cluster.refused(segment(n=2, base=0, end=99)) is ErrorCode.INVALID_REQUEST
    # A retry of the removal (its reply was lost) is answered as done, writing nothing;
    # any other move of an unknown id is no move a record can make.
    again, change = cluster.plan(segment(DELETED))
    assert change.ops == () and again == cluster.records()
    assert cluster.refused(segment(DELETING)) is ErrorCode.INVALID_REQUEST


def test_records_are_listed_by_start_offset() -> None:
    cluster = Cluster()
    for n, base in ((1, 300), (2, 0), (3, 100)):
        cluster.update(segment(n=n, base=base, end=base + 99))
    listed = cluster.records().by_start_offset()
    assert [(s.segment_id, s.start_offset) for s in listed] == [
        (seg_id(2), 0),
        (seg_id(3), 100),
        (seg_id(1), 300),
    ]


# Fencing ------------------------------------------------------------------------------


def test_only_the_current_leader_in_its_epoch_may_write() -> None:
    cluster = Cluster()
    item = segment()
    assert cluster.refused(item, broker_epoch=7) is ErrorCode.STALE_BROKER_EPOCH
    assert cluster.refused(item, broker_id=9, broker_epoch=9) is (
        ErrorCode.BROKER_ID_NOT_REGISTERED
    )
    assert cluster.refused(item, broker_id=2) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert cluster.refused(item, leader_epoch=-1) is ErrorCode.FENCED_LEADER_EPOCH
    assert cluster.refused(item, leader_epoch=1) is ErrorCode.UNKNOWN_LEADER_EPOCH
    leader = {"broker_id": 1, "leader_epoch": 0}
    assert cluster.refused(item, index=2, **leader) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert cluster.refused(item, topic_id=seg_id(9), **leader) is ErrorCode.UNKNOWN_TOPIC_ID
    assert cluster.records() is NO_RECORDS


def test_a_deposed_leaders_copy_never_becomes_visible() -> None:
    cluster = Cluster()
    cluster.update(segment())  # broker 1 leads partition 0 in epoch 0
    fence(cluster.state, 1)
    assert partition(cluster.state, cluster.topic_id).leader == 2
    # The fenced broker's session is over; once back, it is no longer the leader; and the
    # new leader's epoch is what counts.
    assert cluster.refused(segment(FINISHED), broker_id=1) is ErrorCode.STALE_BROKER_EPOCH
    epoch = register(cluster.state, 1, now=200.0)
    assert cluster.refused(segment(FINISHED), broker_id=1, broker_epoch=epoch) is (
        ErrorCode.NOT_LEADER_OR_FOLLOWER
    )
    assert cluster.refused(segment(FINISHED), leader_epoch=0) is ErrorCode.FENCED_LEADER_EPOCH
    # The new leader gives the copy up.
    records = cluster.update(segment(DELETING))
    assert records.segments[seg_id(1)].state is DELETING
    assert records.segments[seg_id(1)].broker_id == 1  # still the copier
    assert records.next_offset == -1


# Loading ------------------------------------------------------------------------------


def test_a_new_controller_loads_what_was_committed() -> None:
    cluster = Cluster()
    cluster.update(segment(n=1, base=0, end=99))
    cluster.update(segment(FINISHED, n=1))
    cluster.update(segment(n=2, base=100, end=199))
    cluster.update(segment(n=3, base=0, end=9), index=1)
    before = [cluster.records(0), cluster.records(1)]
    cluster.takeover()
    topic_id = cluster.topic_id
    assert cluster.state.remote_topics == {topic_id: RemoteTopic("t")}
    keys = [(topic_id, 1), (topic_id, 0), (topic_id, 0), (topic_id, 5), (seg_id(9), 0)]
    # Only partitions that exist, of a topic with records, are read; each once.
    assert cluster.state.remote_unloaded(keys) == [(topic_id, 0), (topic_id, 1)]
    assert [cluster.records(0), cluster.records(1)] == before
    assert cluster.state.remote_unloaded(keys) == []
    # And the next change carries on from the stored version.
    assert cluster.update(segment(FINISHED, n=2)).version == before[0].version + 1


def test_a_topic_without_records_needs_no_read() -> None:
    cluster = Cluster()
    assert cluster.state.remote_unloaded([(cluster.topic_id, 0)]) == []
    assert cluster.state.remote_partition(cluster.topic_id, 0) is NO_RECORDS
    assert (NO_RECORDS.version, NO_RECORDS.next_offset) == (0, -1)


# Topic deletion -----------------------------------------------------------------------


def test_deleting_a_topic_marks_its_records_deleted() -> None:
    cluster = Cluster()
    cluster.update(segment())
    topic_id = cluster.topic_id
    change = cluster.state.delete_topic("t")
    assert change.ops[-1] == SetData(PATHS.remote_topic(topic_id), b'{"deleted":true,"name":"t"}')
    assert change.touches_image
    cluster.commit(change)
    assert cluster.state.remote_deletions() == [(topic_id, "t")]
    assert cluster.znodes.children(PATHS.remote_partition(topic_id, 0)) == [
        layout.uuid_text(seg_id(1))
    ]
    # Nothing reads or writes a deleted topic's records.
    with pytest.raises(KafkaError) as refused:
        cluster.state.remote_partition(topic_id, 0)
    assert code(refused) is ErrorCode.UNKNOWN_TOPIC_ID
    assert cluster.state.remote_unloaded([(topic_id, 0)]) == []
    assert topic_id not in cluster.state.remote_partitions
    # A new controller finds the mark.
    cluster.takeover()
    assert cluster.state.remote_deletions() == [(topic_id, "t")]


def test_deleting_a_topic_without_records_writes_no_mark() -> None:
    cluster = Cluster()
    change = cluster.state.delete_topic("t")
    assert not any(op.path.startswith(PATHS.remote_log) for op in change.ops)
    assert change.remote_topics == {}


def test_finishing_a_deletion_removes_the_subtree_in_chunks_deepest_first() -> None:
    cluster = Cluster()
    topic_id = cluster.topic_id
    for n in range(1, 8):
        cluster.update(segment(n=n, base=n * 100, end=n * 100 + 99), index=n % 2)
    cluster.commit(cluster.state.delete_topic("t"))
    changes = cluster.state.finish_remote_deletion(topic_id, cluster.znodes.tree(topic_id), 4)
    ops = [op for change in changes for op in change.ops]
    assert [len(change.ops) for change in changes] == [4, 4, 2]  # 7 records, 2 partitions, 1
    assert all(isinstance(op, Delete) for op in ops)
    depths = [op.path.count("/") for op in ops]
    assert depths == sorted(depths, reverse=True)
    assert ops[-1].path == PATHS.remote_topic(topic_id)
    # Only the last transaction forgets the topic: one cut short leaves it to finish again.
    assert [change.remote_topics for change in changes] == [{}, {}, {topic_id: None}]
    for change in changes[:2]:
        cluster.commit(change)
    assert cluster.state.remote_deletions() == [(topic_id, "t")]
    rest = cluster.state.finish_remote_deletion(topic_id, cluster.znodes.tree(topic_id), 4)
    assert [len(change.ops) for change in rest] == [2]
    cluster.commit(rest[0])
    assert not any(p.startswith(PATHS.remote_topic(topic_id)) for p in cluster.znodes.nodes)
    assert cluster.state.remote_deletions() == []
    assert topic_id not in cluster.state.remote_topics
    with pytest.raises(KafkaError) as refused:
        cluster.state.deleted_remote_topic(topic_id)
    assert code(refused) is ErrorCode.UNKNOWN_TOPIC_ID


def test_a_large_subtree_goes_in_transactions_of_at_most_500_ops() -> None:
    cluster = Cluster()
    topic_id = cluster.topic_id
    cluster.update(segment())
    cluster.commit(cluster.state.delete_topic("t"))
    tree = {str(p): [f"s{i}" for i in range(700)] for p in range(2)}
    changes = cluster.state.finish_remote_deletion(topic_id, tree)
    assert [len(change.ops) for change in changes] == [500, 500, 403]


def test_only_a_deleted_topics_records_can_be_removed() -> None:
    cluster = Cluster()
    cluster.update(segment())
    with pytest.raises(KafkaError) as refused:
        cluster.state.finish_remote_deletion(cluster.topic_id, {})
    assert code(refused) is ErrorCode.INVALID_REQUEST
    with pytest.raises(KafkaError) as refused:
        cluster.state.deleted_remote_topic(seg_id(9))
    assert code(refused) is ErrorCode.UNKNOWN_TOPIC_ID


class Draws(random.Random):
    """Random bytes from a list, for topic ids chosen by the test."""

    def __init__(self, *draws: bytes) -> None:
        super().__init__(0)
        self.draws = list(draws)

    def randbytes(self, n: int) -> bytes:
        return self.draws.pop(0)


def test_a_new_topic_never_takes_the_id_of_deleted_records() -> None:
    cluster = Cluster()
    cluster.update(segment())
    cluster.commit(cluster.state.delete_topic("t"))
    state = cluster.state
    taken = uuid.UUID(bytes=seg_id(5), version=4).bytes
    state.remote_topics[taken] = state.remote_topics.pop(cluster.topic_id)
    state.rng = Draws(seg_id(5), seg_id(6))
    change = state.create_topic("t", 1, 1, {})
    assert change.topics[0].topic_id == uuid.UUID(bytes=seg_id(6), version=4).bytes


# KIP-950 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("set_configs", "delete", "replace_all"),
    [
        ({"remote.storage.enable": "false"}, (), False),
        ({"remote.storage.enable": "FALSE", "remote.log.copy.disable": "true"}, (), False),
        ({}, ("remote.storage.enable",), False),  # back to the default, false
        ({"retention.ms": "1000"}, (), True),  # a replacement without it
    ],
)
def test_turning_remote_storage_off_must_delete_remote_data(
    set_configs: dict[str, str], delete: tuple[str, ...], replace_all: bool
) -> None:
    cluster = Cluster(**{"remote.storage.enable": "true"})
    with pytest.raises(KafkaError) as refused:
        cluster.state.alter_configs("t", set_configs, delete, replace_all=replace_all)
    assert code(refused) is ErrorCode.INVALID_CONFIG
    assert str(refused.value) == KIP_950_MESSAGE
    allowed = cluster.state.alter_configs(
        "t",
        {**set_configs, "remote.log.delete.on.disable": "true"},
        delete,
        replace_all=replace_all,
    )
    assert allowed.topics[0].configs.get("remote.log.delete.on.disable") == "true"


def test_other_remote_storage_changes_are_free() -> None:
    cluster = Cluster()
    state = cluster.state
    assert state.alter_configs("t", {"remote.storage.enable": "false"}, ()).ops
    commit(state, state.alter_configs("t", {"remote.storage.enable": "true"}, ()))
    assert state.alter_configs("t", {"remote.log.copy.disable": "true"}, ()).ops
    assert state.alter_configs("t", {"local.retention.ms": "10"}, ()).ops
    # The combination rules of directlog.topic_config still apply.
    with pytest.raises(KafkaError) as refused:
        state.alter_configs("t", {"cleanup.policy": "compact"}, ())
    assert code(refused) is ErrorCode.INVALID_CONFIG
