"""The cluster image, the remote log metadata and the security metadata as the protobuf
messages of proto/controller.proto, and the records the controller plans with out of the
requests' messages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.security.acl_messages import binding_message
from directlog.security.client_quotas import QuotaEntity
from directlog.security.scram import ScramCredential
from services.controller.cluster import ClusterState, Delta, QuotaAlteration, ScramUpsertion
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
    cluster-wide default of topic configs and every broker's dynamic configs; each kind of
    security metadata comes whole in the image, and in a delta only when it changed."""
    if delta is None:
        topics = [topic(item) for item in state.topics.values()]
        deleted: tuple[bytes, ...] = ()
    else:
        topics = [topic(state.topics[t], indexes) for t, indexes in delta.topics.items()]
        deleted = delta.deleted_topic_ids
    has_scram = delta is None or delta.scram_credentials
    has_acls = delta is None or delta.acls
    has_quotas = delta is None or delta.client_quotas
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
        has_scram_credentials=has_scram,
        scram_credentials=[
            scram_credential(user, credential)
            for user, credentials in state.scram.items()
            for credential in credentials.values()
        ]
        if has_scram
        else [],
        has_acls=has_acls,
        acls=[binding_message(b) for bindings in state.acls.values() for b in bindings]
        if has_acls
        else [],
        has_client_quotas=has_quotas,
        client_quotas=[client_quota(e, v) for e, v in state.client_quotas.items()]
        if has_quotas
        else [],
    )


def scram_credential(user: str, credential: ScramCredential) -> pb.ScramCredential:
    return pb.ScramCredential(
        user=user,
        mechanism=credential.mechanism,
        salt=credential.salt,
        stored_key=credential.stored_key,
        server_key=credential.server_key,
        iterations=credential.iterations,
    )


def scram_upsertion(message: pb.ScramCredential) -> ScramUpsertion:
    return ScramUpsertion(
        message.user,
        message.mechanism,
        message.salt,
        message.stored_key,
        message.server_key,
        message.iterations,
    )


def client_quota(entity: QuotaEntity, values: Mapping[str, float]) -> pb.ClientQuota:
    return pb.ClientQuota(
        entity=[pb.QuotaEntityComponent(entity_type=t, name=n) for t, n in entity.components],
        values=values,
    )


def quota_alteration(message: pb.QuotaAlteration) -> QuotaAlteration:
    return (
        [(c.entity_type, c.name if c.HasField("name") else None) for c in message.entity],
        [(op.key, op.value if op.HasField("value") else None) for op in message.ops],
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
