"""Metadata updates (full images and deltas) and the bounded per-stream queues."""

from __future__ import annotations

import asyncio

import grpc

from directlog.rpc import controller_pb2 as pb
from services.controller import messages
from services.controller.streams import Subscription
from tests.controller.clusters import commit, fence, register, with_topic


def test_full_image_has_every_broker_and_partition() -> None:
    state, topic_id = with_topic([(1, 2), (2, 1)], brokers=2)
    full = messages.metadata_update(
        state, version=3, controller_id=7, controller_epoch=5, delta=None
    )
    assert full.full and full.version == 3 and full.cluster_id == "cluster"
    assert (full.controller_id, full.controller_epoch) == (7, 5)
    assert [b.broker_id for b in full.brokers] == [1, 2]
    (topic,) = full.topics
    assert topic.topic_id == topic_id and topic.name == "t"
    assert [(p.partition, list(p.replicas), p.leader) for p in topic.partitions] == [
        (0, [1, 2], 1),
        (1, [2, 1], 2),
    ]


def test_deltas_carry_only_what_changed() -> None:
    state, topic_id = with_topic([(1, 2), (2, 1), (2, 1)], brokers=2)
    (change,) = fence(state, 1)
    delta = messages.metadata_update(
        state, version=4, controller_id=1, controller_epoch=1, delta=change.delta
    )
    assert not delta.full
    assert [(b.broker_id, b.fenced) for b in delta.brokers] == [(1, True), (2, False)]
    (topic,) = delta.topics
    # Partition 0 got a new leader and partition 1 lost a follower; partition 2 too.
    assert [(p.partition, p.leader, list(p.isr)) for p in topic.partitions] == [
        (0, 2, [2]),
        (1, 2, [2]),
        (2, 2, [2]),
    ]
    register(state, 1, now=200.0)
    created = state.create_topic("new", 2, 1, {})
    commit(state, created)
    (new_topic,) = messages.metadata_update(
        state, version=5, controller_id=1, controller_epoch=1, delta=created.delta
    ).topics
    assert new_topic.name == "new" and len(new_topic.partitions) == 2
    deleted = state.delete_topic(topic_id=topic_id)
    commit(state, deleted)
    message = messages.metadata_update(
        state, version=6, controller_id=1, controller_epoch=1, delta=deleted.delta
    )
    assert list(message.deleted_topic_ids) == [topic_id] and not message.topics


def ended_with(subscription: Subscription) -> grpc.StatusCode | None:
    return None if subscription.ended is None else subscription.ended[0]


def test_a_stream_that_falls_behind_is_cut() -> None:
    async def run() -> None:
        subscription = Subscription(limit=3)
        for version in range(1, 4):
            subscription.push(pb.MetadataUpdate(version=version))
        first = await subscription.next()
        assert first is not None and first.version == 1
        subscription.push(pb.MetadataUpdate(version=4))
        assert subscription.ended is None
        subscription.push(pb.MetadataUpdate(version=5))  # a fourth unread update
        assert ended_with(subscription) is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await subscription.next() is None

    asyncio.run(run())


def test_a_waiting_reader_wakes_for_an_update_and_for_the_end() -> None:
    async def run() -> None:
        subscription = Subscription(limit=10)
        reader = asyncio.ensure_future(subscription.next())
        await asyncio.sleep(0)
        subscription.push(pb.MetadataUpdate(version=1))
        got = await asyncio.wait_for(reader, 5)
        assert got is not None and got.version == 1
        reader = asyncio.ensure_future(subscription.next())
        await asyncio.sleep(0)
        subscription.end(grpc.StatusCode.FAILED_PRECONDITION, "not the active controller")
        assert await asyncio.wait_for(reader, 5) is None

    asyncio.run(run())
