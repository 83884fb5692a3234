"""The records of the cluster image: broker registrations, topics and partition states.

Immutable values: a change replaces a record, so an image handed to a stream or a test is
never modified behind its back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


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
    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int

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
        return len(self.partitions[0].replicas)
