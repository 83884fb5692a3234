"""A broker's /readyz answer, decided from its registration and its cluster image: not ready
before it registered, while fenced, or while it is out of the ISR of a partition it
replicates that has a leader (a rolling restart waits for it to catch up)."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

from directlog.rpc import controller_pb2 as pb
from directlog.topic_config import LogConfig
from services.broker.cluster_metadata import ClusterImage
from services.broker.main import readiness


def image_with(partitions: list[pb.PartitionState], *, fenced: bool = False) -> ClusterImage:
    image = ClusterImage(LogConfig.from_properties({}))
    image.apply(
        pb.MetadataUpdate(
            version=1,
            full=True,
            controller_epoch=1,
            brokers=[
                pb.Broker(broker_id=1, broker_epoch=5, fenced=fenced),
                pb.Broker(broker_id=2, broker_epoch=6),
            ],
            topics=[
                pb.TopicState(name="orders", topic_id=uuid.UUID(int=7).bytes, partitions=partitions)
            ],
        )
    )
    return image


def link(epoch: int, has_image: bool) -> SimpleNamespace:
    first_image = asyncio.Event()
    if has_image:
        first_image.set()
    return SimpleNamespace(broker_epoch=epoch, first_image=first_image)


def test_ready_only_once_registered_unfenced_and_in_every_isr() -> None:
    caught_up = [pb.PartitionState(partition=0, replicas=[1, 2], leader=2, isr=[2, 1])]
    behind = [
        pb.PartitionState(partition=0, replicas=[1, 2], leader=2, isr=[2]),
        pb.PartitionState(partition=1, replicas=[2, 1], leader=2, isr=[2]),
        pb.PartitionState(partition=2, replicas=[2], leader=2, isr=[2]),  # not ours
    ]
    assert readiness(link(-1, False), image_with(caught_up), 1) == (
        "not registered with a controller yet"
    )
    assert readiness(link(5, False), image_with(caught_up), 1) == (
        "not registered with a controller yet"
    )
    assert readiness(link(5, True), image_with(caught_up, fenced=True), 1) == (
        "fenced by the controller"
    )
    assert readiness(link(5, True), image_with(caught_up), 3) == "fenced by the controller"
    assert readiness(link(5, True), image_with(behind), 1) == (
        "not yet in the ISR of 2 partitions: orders-0, orders-1"
    )
    assert readiness(link(5, True), image_with(caught_up), 1) is None


def test_an_offline_partition_does_not_hold_readiness_back() -> None:
    """Without a leader there is nothing to catch up with: waiting would stall a restart of
    the very broker that can bring the partition back."""
    offline = [pb.PartitionState(partition=0, replicas=[1], leader=-1, isr=[])]
    assert readiness(link(5, True), image_with(offline), 1) is None


def test_many_partitions_behind_are_counted_and_a_few_named() -> None:
    behind = [pb.PartitionState(partition=i, replicas=[1, 2], leader=2, isr=[2]) for i in range(8)]
    reason = readiness(link(5, True), image_with(behind), 1)
    assert reason == (
        "not yet in the ISR of 8 partitions: orders-0, orders-1, orders-2, orders-3, orders-4, ..."
    )
