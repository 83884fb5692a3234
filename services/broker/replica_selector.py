"""Which replica a consumer reads a partition from (KIP-392, fetching from the closest replica).

Across zones on Kubernetes, a consumer that always reads from the leader sends most of its
bytes across a zone. With Kafka's `replica.selector.class` set to its rack-aware selector, the
leader answers a consumer's Fetch (v11+, which carries the consumer's `client.rack`) with the
preferred read replica: a follower in the consumer's rack when the leader is not in it. The
consumer then fetches from that follower, which serves it up to its own high watermark.

Kafka's choice, kept here: without a rack, or when the leader shares the consumer's rack or no
replica does, the leader; otherwise the most caught-up replica of that rack among those that
can serve the offset asked for — in the ISR, holding it (log start <= offset <= log end) and
in a broker reachable on the consumer's listener — ties going to the one caught up most
recently. Out-of-sync followers are never chosen: one that falls out of the ISR is dropped at
the consumer's next return to the leader.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

Selector = Literal[
    "org.apache.kafka.common.replica.LeaderSelector",
    "org.apache.kafka.common.replica.RackAwareReplicaSelector",
]
LEADER_SELECTOR, RACK_AWARE_SELECTOR = get_args(Selector)


@dataclass(frozen=True, slots=True)
class ReplicaView:
    broker_id: int
    rack: str | None
    log_end_offset: int
    since_caught_up_ms: int  # 0 for the leader


def rack_aware(client_rack: str, leader: ReplicaView, followers: Iterable[ReplicaView]) -> int:
    """The broker id a consumer in `client_rack` should read from (the leader's when in doubt)."""
    if not client_rack or leader.rack == client_rack:
        return leader.broker_id
    same_rack = [f for f in followers if f.rack == client_rack]
    if not same_rack:
        return leader.broker_id
    best = max(same_rack, key=lambda f: (f.log_end_offset, -f.since_caught_up_ms))
    return best.broker_id


def candidates(
    followers: Iterable[tuple[int, int, int, int]],
    isr: Iterable[int],
    fetch_offset: int,
    now_ms: int,
    racks: Mapping[int, str | None],
) -> list[ReplicaView]:
    """The followers that may serve `fetch_offset`, from (id, log start, log end, last caught
    up ms) as the leader last saw them (a log start of -1: not told, as after RDMA pushes);
    `racks` holds the rack of every broker the consumer can reach."""
    in_sync = set(isr)
    return [
        ReplicaView(broker_id, racks[broker_id], log_end, max(now_ms - caught_up_ms, 0))
        for broker_id, log_start, log_end, caught_up_ms in followers
        if broker_id in in_sync and broker_id in racks and log_start <= fetch_offset <= log_end
    ]
