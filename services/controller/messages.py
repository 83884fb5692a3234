"""The cluster image and the remote log metadata as the protobuf messages of
proto/controller.proto."""

from __future__ import annotations

from collections.abc import Iterable

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from services.controller.cluster import ClusterState, Delta
from services.controller.model import (
    BrokerRegistration,
    Listener,
    PartitionState,
    RemotePartition,
    RemoteSegment,
    RemoteSegmentState,
    Topic,
)


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
        adding_replicas=state.adding,
        removing_replicas=state.removing,
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
    touched (only their changed partitions) and the topics it deleted. Both carry every
    cluster-wide default of topic configs and every broker's dynamic configs."""
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
        log_defaults=state.log_defaults,
        broker_configs=[
            pb.BrokerConfigs(broker_id=b, configs=c)
            for b, c in sorted(state.broker_configs.items())
        ],
    )


def remote_segment(segment: RemoteSegment) -> pb.RemoteLogSegment:
    return pb.RemoteLogSegment(
        segment_id=segment.segment_id,
        state=segment.state.name,
        base_offset=segment.base_offset,
        start_offset=segment.start_offset,
        end_offset=segment.end_offset,
        max_timestamp=segment.max_timestamp,
        size_bytes=segment.size_bytes,
        leader_epoch=segment.leader_epoch,
        broker_id=segment.broker_id,
        epochs=[pb.EpochStart(epoch=e, start_offset=o) for e, o in segment.epochs],
        event_time_ms=segment.event_time_ms,
    )


def remote_segment_record(message: pb.RemoteLogSegment) -> RemoteSegment:
    """A segment as a request carries it; INVALID_REQUEST for a state proto3 let through
    that the enum does not have."""
    try:
        state = RemoteSegmentState(message.state)
    except ValueError as exc:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, f"no remote segment state {message.state}"
        ) from exc
    return RemoteSegment(
        message.segment_id,
        state,
        message.base_offset,
        message.start_offset,
        message.end_offset,
        message.max_timestamp,
        message.size_bytes,
        message.leader_epoch,
        message.broker_id,
        tuple((e.epoch, e.start_offset) for e in message.epochs),
        message.event_time_ms,
    )


def remote_log_partition(
    topic_id: bytes, index: int, records: RemotePartition
) -> pb.RemoteLogPartition:
    return pb.RemoteLogPartition(
        topic_id=topic_id,
        partition=index,
        version=records.version,
        next_offset=records.next_offset,
        segments=[remote_segment(s) for s in records.by_start_offset()],
    )
