"""Cluster states for the controller's unit tests, built the way the controller builds
them: loaded from an image, changed through planned changes applied after "commit"."""

from __future__ import annotations

import random
from collections.abc import Mapping

from services.controller.cluster import Change, ClusterState, Image
from services.controller.layout import Layout
from services.controller.model import BrokerRegistration, Listener, PartitionState, Topic

TIMEOUT = 10.0
LISTENERS = (Listener("PLAINTEXT", "127.0.0.1", 9092),)
PATHS = Layout("/directlog")


def empty_state(now: float = 0.0) -> ClusterState:
    image = Image("cluster", {}, {}, 0, 0)
    return ClusterState(image, PATHS, now=now, session_timeout=TIMEOUT, rng=random.Random(7))


def commit(state: ClusterState, change: Change, now: float = 0.0) -> Change:
    state.apply(change, now)
    return change


def register(state: ClusterState, broker_id: int, rack: str | None = None, now: float = 0.0) -> int:
    change = state.register_broker(broker_id, f"incarnation-{broker_id}", LISTENERS, rack, now)
    commit(state, change, now)
    return change.brokers[0].broker_epoch


def with_topic(
    replicas: list[tuple[int, ...]],
    *,
    brokers: int = 4,
    configs: Mapping[str, str] | None = None,
    isr: list[tuple[int, ...]] | None = None,
) -> tuple[ClusterState, bytes]:
    """Brokers 1..``brokers`` (broker ``b`` at epoch ``b``) registered at time 0 and one
    topic "t" with these replicas (and ISRs, first replica leading), as a controller that
    just took over would load them."""
    registrations = {
        b: BrokerRegistration(b, f"incarnation-{b}", b, LISTENERS, None)
        for b in range(1, brokers + 1)
    }
    partitions = tuple(
        PartitionState(r, r[0], 0, (isr[i] if isr else r), 0) for i, r in enumerate(replicas)
    )
    topic_id = bytes(range(16))
    topic = Topic("t", topic_id, dict(configs or {}), partitions)
    state = ClusterState(
        Image("cluster", registrations, {topic_id: topic}, brokers, 0),
        PATHS,
        now=0.0,
        session_timeout=TIMEOUT,
    )
    return state, topic_id


def fence(state: ClusterState, *brokers: int, now: float = 100.0) -> list[Change]:
    """Let every other broker heartbeat, expire ``brokers``, elect until nothing is left."""
    for broker_id, registration in state.brokers.items():
        if broker_id not in brokers and broker_id not in state.fenced:
            state.heartbeat(broker_id, registration.broker_epoch, now)
    assert state.fence_expired(now + 0.5) == sorted(brokers)
    changes = []
    while (change := state.elect()) is not None:
        changes.append(commit(state, change, now))
    return changes


def partition(state: ClusterState, topic_id: bytes, index: int = 0) -> PartitionState:
    return state.topics[topic_id].partitions[index]
