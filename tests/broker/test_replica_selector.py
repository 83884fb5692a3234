"""Kafka's rack-aware choice of the replica a consumer reads (KIP-392)."""

from __future__ import annotations

from services.broker.replica_selector import ReplicaView, candidates, rack_aware

LEADER = ReplicaView(0, "zone-a", 100, 0)


def test_the_leader_unless_a_follower_shares_the_consumers_rack_and_the_leader_does_not() -> None:
    b1, b2, c = (
        ReplicaView(1, "zone-b", 90, 50),
        ReplicaView(2, "zone-b", 95, 900),
        ReplicaView(3, "zone-c", 100, 0),
    )
    assert rack_aware("", LEADER, [b1, b2, c]) == 0  # no client.rack
    assert rack_aware("zone-a", LEADER, [b1, c]) == 0  # the leader's own rack
    assert rack_aware("zone-x", LEADER, [b1, c]) == 0  # no replica there
    assert rack_aware("zone-c", LEADER, [b1, c]) == 3
    assert rack_aware("zone-b", LEADER, [b1, b2, c]) == 2  # the most caught-up of the rack
    tied = ReplicaView(4, "zone-b", 95, 10)
    assert rack_aware("zone-b", LEADER, [b2, tied]) == 4  # then the most recently caught up


def test_only_in_sync_reachable_replicas_holding_the_offset_are_candidates() -> None:
    followers = [
        (1, 0, 100, 1000),  # in sync, holds 0..100
        (2, 0, 100, 1000),  # out of the ISR
        (3, 60, 100, 1000),  # its log starts above the offset
        (4, 0, 40, 1000),  # behind the offset
        (5, 0, 100, 1000),  # not reachable on the consumer's listener (or fenced)
        (6, -1, 100, 400),  # log start not told (RDMA pushes): taken
    ]
    racks = {1: "zone-b", 2: "zone-b", 3: "zone-b", 4: "zone-b", 6: None}
    chosen = candidates(followers, [0, 1, 3, 4, 5, 6], 50, 1500, racks)
    assert chosen == [ReplicaView(1, "zone-b", 100, 500), ReplicaView(6, None, 100, 1100)]
