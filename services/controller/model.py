"""The records of the cluster image: broker registrations, topics and partition states, the
remote log metadata of tiered storage (KIP-405), and the resource patterns ACLs are kept by
(the security records themselves are directlog.security's, shared with the brokers).

Immutable values: a change replaces a record, so an image handed to a stream or a test is
never modified behind its back.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from directlog.security.acl import PatternType, ResourceType


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    incarnation_id: str
    broker_epoch: int
    listeners: tuple[Listener, ...]
    rack: str | None


@dataclass(frozen=True, slots=True)
class PartitionState:
    """During a reassignment (KIP-455) ``replicas`` is the target followed by the replicas
    being removed; ``adding`` are the target's new ones, which have yet to join the ISR."""

    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def target(self) -> tuple[int, ...]:
        """The replicas a reassignment moves to (the replicas when none runs)."""
        return tuple(b for b in self.replicas if b not in self.removing)

    @property
    def original(self) -> tuple[int, ...]:
        """The replicas before the reassignment that runs (the replicas when none runs)."""
        return tuple(b for b in self.replicas if b not in self.adding)

    @classmethod
    def initial(cls, replicas: tuple[int, ...]) -> PartitionState:
        """A new partition: the first replica leads, every replica is in sync."""
        return cls(replicas, replicas[0], 0, replicas, 0)


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    topic_id: bytes
    configs: Mapping[str, str]  # the overrides only, Kafka names
    partitions: tuple[PartitionState, ...]

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].target)


class RemoteSegmentState(enum.IntEnum):
    """Where a copy of a segment to the remote store stands; the numbers of
    proto/controller.proto's RemoteSegmentState."""

    COPY_STARTED = 0
    COPY_FINISHED = 1
    DELETE_STARTED = 2
    DELETE_FINISHED = 3


@dataclass(frozen=True, slots=True)
class RemoteSegment:
    """One copy of a segment to the remote store (proto RemoteLogSegment)."""

    segment_id: bytes  # 16 bytes
    state: RemoteSegmentState
    base_offset: int
    start_offset: int
    end_offset: int
    max_timestamp: int
    size_bytes: int
    leader_epoch: int  # of the leader that copied it
    broker_id: int  # that leader
    epochs: tuple[tuple[int, int], ...]  # (leader epoch, its first offset), oldest first
    event_time_ms: int  # wall clock of its last change


@dataclass(frozen=True, slots=True)
class RemotePartition:
    """The remote log records of one partition. ``version`` grows with every change of
    them (0: there never were any); ``next_offset`` is the first offset no finished copy
    holds (-1: none yet)."""

    version: int = 0
    next_offset: int = -1
    segments: Mapping[bytes, RemoteSegment] = field(default_factory=dict)

    def by_start_offset(self) -> list[RemoteSegment]:
        return sorted(self.segments.values(), key=lambda s: (s.start_offset, s.segment_id))


@dataclass(frozen=True, slots=True)
class RemoteTopic:
    """A topic that has remote log records. ``deleted``: the topic is gone and its records
    wait for a tiering service to delete its remote objects."""

    name: str
    deleted: bool = False


class AclResource(NamedTuple):
    """A resource pattern: the ACLs attached to it are stored together, in one znode."""

    resource_type: ResourceType
    pattern_type: PatternType
    name: str
