"""The cluster image as the protobuf messages of proto/controller.proto."""

from __future__ import annotations

from collections.abc import Iterable

from directlog.rpc import controller_pb2 as pb
from services.controller.cluster import ClusterState, Delta
from services.controller.model import BrokerRegistration, Listener, PartitionState, Topic


def listener(item: Listener) -> pb.Listener:
    return pb.Listener(name=item.name, host=item.host, port=item.port)


def broker(registration: BrokerRegistration, fenced: bool) -> pb.Broker:
    return pb.Broker(
        broker_id=registration.broker_id,
        broker_epoch=registration.broker_epoch,
        listeners=[listener(item) for item in registration.listeners],
        rack=registration.rack or "",
        fenced=fenced,
    )


def partition(index: int, state: PartitionState) -> pb.PartitionState:
    return pb.PartitionState(
        partition=index,
        replicas=state.replicas,
        leader=state.leader,
        leader_epoch=state.leader_epoch,
        isr=state.isr,
        partition_epoch=state.partition_epoch,
    )


def topic(item: Topic, indexes: Iterable[int] | None = None) -> pb.TopicState:
    """The topic with the partitions at ``indexes`` (None: all of them)."""
    chosen = range(len(item.partitions)) if indexes is None else sorted(indexes)
    return pb.TopicState(
        name=item.name,
        topic_id=item.topic_id,
        configs=dict(item.configs),
        partitions=[partition(i, item.partitions[i]) for i in chosen],
    )


def metadata_update(
    state: ClusterState,
    *,
    version: int,
    controller_id: int,
    controller_epoch: int,
    delta: Delta | None,
) -> pb.MetadataUpdate:
    """The whole image when ``delta`` is None, else the delta: every broker, the topics it
    touched (only their changed partitions) and the topics it deleted."""
    if delta is None:
        topics = [topic(item) for item in state.topics.values()]
        deleted: tuple[bytes, ...] = ()
    else:
        topics = [topic(state.topics[t], indexes) for t, indexes in delta.topics.items()]
        deleted = delta.deleted_topic_ids
    return pb.MetadataUpdate(
        version=version,
        full=delta is None,
        cluster_id=state.cluster_id,
        controller_id=controller_id,
        controller_epoch=controller_epoch,
        brokers=[broker(r, b in state.fenced) for b, r in sorted(state.brokers.items())],
        topics=topics,
        deleted_topic_ids=deleted,
    )
