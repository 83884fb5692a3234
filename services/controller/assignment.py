"""Replica placement for new partitions: Kafka's AdminUtils algorithm.

Without racks, partition ``p``'s first replica (its leader) is broker ``p + start`` in id
order and the followers follow at a shift that grows once per round of brokers, so leaders
and followers spread evenly. With racks, the brokers are first interleaved rack by rack
(``a1 b1 c1 a2 b2 …``) and a follower is skipped while its rack, or the broker itself,
already holds a replica of the partition and some other one does not. Racks are used only
when every broker has one, as Kafka's "safe" mode does.
"""

from __future__ import annotations

from collections.abc import Mapping


def assign_replicas(
    brokers: Mapping[int, str | None],
    partitions: int,
    replication_factor: int,
    *,
    start_index: int,
    replica_shift: int,
    first_partition: int = 0,
) -> list[tuple[int, ...]]:
    """Replica lists for partitions ``first_partition ..`` over ``brokers`` (id -> rack).

    ``start_index`` and ``replica_shift`` are Kafka's random start points (the caller draws
    them, so a test can fix them)."""
    if not 1 <= replication_factor <= len(brokers):
        raise ValueError(f"replication factor {replication_factor} over {len(brokers)} brokers")
    racks = {broker: rack for broker, rack in brokers.items() if rack is not None}
    if len(racks) == len(brokers) and len(set(racks.values())) > 1:
        return _rack_aware(
            racks, partitions, replication_factor, start_index, replica_shift, first_partition
        )
    return _rack_unaware(
        sorted(brokers), partitions, replication_factor, start_index, replica_shift, first_partition
    )


def rack_alternated(racks: Mapping[int, str]) -> list[int]:
    """Brokers taken one per rack in turn (racks and brokers in sorted order)."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(racks):
        by_rack.setdefault(racks[broker], []).append(broker)
    columns = [by_rack[rack] for rack in sorted(by_rack)]
    depth = max(len(column) for column in columns)
    return [column[row] for row in range(depth) for column in columns if row < len(column)]


def _replica_index(first: int, shift: int, index: int, count: int) -> int:
    return (first + 1 + (shift + index) % (count - 1)) % count


def _rack_unaware(
    brokers: list[int],
    partitions: int,
    replication_factor: int,
    start_index: int,
    replica_shift: int,
    first_partition: int,
) -> list[tuple[int, ...]]:
    count = len(brokers)
    shift = replica_shift % count
    assignment = []
    for partition in range(first_partition, first_partition + partitions):
        if partition > 0 and partition % count == 0:
            shift += 1
        first = (partition + start_index) % count
        followers = (
            brokers[_replica_index(first, shift, j, count)] for j in range(replication_factor - 1)
        )
        assignment.append((brokers[first], *followers))
    return assignment


def _rack_aware(
    racks: Mapping[int, str],
    partitions: int,
    replication_factor: int,
    start_index: int,
    replica_shift: int,
    first_partition: int,
) -> list[tuple[int, ...]]:
    arranged = rack_alternated(racks)
    count = len(arranged)
    rack_count = len(set(racks.values()))
    shift = replica_shift % count
    assignment = []
    for partition in range(first_partition, first_partition + partitions):
        if partition > 0 and partition % count == 0:
            shift += 1
        first = (partition + start_index) % count
        replicas = [arranged[first]]
        used_racks = {racks[arranged[first]]}
        k = 0
        while len(replicas) < replication_factor:
            # Every broker but the first comes up within count - 1 steps, and one of them
            # is always acceptable, so each follower is found within that bound.
            assert k < count * replication_factor, "no acceptable follower"
            broker = arranged[_replica_index(first, shift * rack_count, k, count)]
            k += 1
            rack = racks[broker]
            if (rack not in used_racks or len(used_racks) == rack_count) and (
                broker not in replicas
            ):
                replicas.append(broker)
                used_racks.add(rack)
        assignment.append(tuple(replicas))
    return assignment
