"""Replication throttles without real time: the byte-rate meter (a token bucket) on an
injected clock, the quotas following the rates the image gives, and which replicas Kafka's
throttled replica lists put under them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.broker_config import FOLLOWER_RATE, LEADER_RATE
from directlog.topic_config import LogConfig
from services.broker.replication_quota import ByteRateMeter, ReplicationQuotas


class Clock:
    def __init__(self) -> None:
        self.now = 0.0  # and steps of binary fractions: exact arithmetic

    def __call__(self) -> float:
        return self.now


def test_the_meter_allows_one_seconds_worth_then_the_rate() -> None:
    clock = Clock()
    meter = ByteRateMeter(1000, clock)
    assert not meter.exceeded() and meter.allowance() == 1000
    meter.record(600)
    assert meter.allowance() == 400 and not meter.exceeded()
    meter.record(900)  # one read may go past the allowance
    assert meter.exceeded() and meter.allowance() == 0
    assert meter.seconds_until_allowed() == pytest.approx(0.501)
    clock.now += 0.5
    assert meter.exceeded()
    clock.now += 0.125
    assert not meter.exceeded() and meter.allowance() == 125
    clock.now += 60  # an idle spell saves up one second's worth, no more
    assert meter.allowance() == 1000


def test_a_new_rate_keeps_what_was_saved_up_to_its_capacity() -> None:
    clock = Clock()
    meter = ByteRateMeter(1000, clock)
    meter.set_rate(100)
    assert meter.allowance() == 100
    meter.record(150)
    meter.set_rate(10_000)
    assert meter.exceeded()
    clock.now += 0.0078125  # 1/128 s: 78.125 bytes
    assert meter.allowance() == 28


def test_rate_zero_stops_everything() -> None:
    clock = Clock()
    meter = ByteRateMeter(0, clock)
    assert meter.exceeded() and meter.allowance() == 0
    clock.now += 3600
    assert meter.exceeded() and math.isinf(meter.seconds_until_allowed())


def test_bad_meter_arguments_are_refused() -> None:
    clock = Clock()
    for rate, burst in ((-1, 1.0), (1, 0.0)):
        with pytest.raises(ValueError):
            ByteRateMeter(rate, clock, burst)
    with pytest.raises(ValueError):
        ByteRateMeter(1, clock).record(-1)


@given(
    rate=st.integers(1, 10_000_000),
    steps=st.lists(
        st.tuples(st.floats(0, 2, allow_nan=False), st.integers(1, 2_000_000)), max_size=60
    ),
)
def test_a_sender_that_waits_for_the_meter_stays_within_the_bound(
    rate: int, steps: list[tuple[float, int]]
) -> None:
    """Whoever sends only while the meter is not exceeded, and at most one read past what it
    allows, sends in any span at most rate x (span + 1 s) plus one read."""
    clock = Clock()
    meter = ByteRateMeter(rate, clock)
    sent: list[tuple[float, int]] = []
    largest = 0
    for pause, wanted in steps:
        clock.now += pause
        if meter.exceeded():
            continue
        size = min(wanted, meter.allowance() + wanted // 2)  # up to one read past it
        meter.record(size)
        sent.append((clock.now, size))
        largest = max(largest, size)
    for i, (start, _) in enumerate(sent):
        total = 0
        for when, size in sent[i:]:
            total += size
            assert total <= rate * (when - start + 1.0) + largest + 1e-6


def test_quotas_follow_the_rates_the_image_gives() -> None:
    clock = Clock()
    configs: dict[str, str] = {}
    quotas = ReplicationQuotas(1, lambda: configs, clock)
    assert quotas.leader.allowance() is None and not quotas.leader.exceeded()
    quotas.leader.record(10**9)  # not throttled: nothing counted
    configs[LEADER_RATE] = "100"
    assert quotas.leader.allowance() == 100 and quotas.follower.allowance() is None
    quotas.leader.record(150)
    assert quotas.leader.exceeded()
    configs[LEADER_RATE] = "1000"  # a new rate keeps the debt
    assert quotas.leader.exceeded()
    clock.now += 0.125
    assert quotas.leader.allowance() == 75
    configs[FOLLOWER_RATE] = "7"
    assert quotas.follower.allowance() == 7
    del configs[LEADER_RATE]  # removed: unthrottled, the meter forgotten
    assert quotas.leader.allowance() is None and quotas.leader.seconds_until_allowed() == 0
    configs[LEADER_RATE] = "10"
    assert quotas.leader.allowance() == 10


def config(leader: str = "", follower: str = "") -> LogConfig:
    return LogConfig.from_properties(
        {
            "leader.replication.throttled.replicas": leader,
            "follower.replication.throttled.replicas": follower,
        }
    )


def test_which_replicas_the_lists_throttle() -> None:
    """On broker 1: the leader list names the replicas that send from here, the follower
    list those that fetch here; in-sync replicas are never throttled."""
    quotas = ReplicationQuotas(1, dict, Clock())
    leader = config(leader="0:1,0:2,1:2")
    assert quotas.leader_throttles(leader, 0, isr=(1,), follower=3)
    assert not quotas.leader_throttles(leader, 0, isr=(1, 3), follower=3)  # in sync
    assert not quotas.leader_throttles(leader, 1, isr=(1,), follower=3)  # 1:1 not named
    assert not quotas.leader_throttles(config(), 0, isr=(1,), follower=3)
    assert quotas.leader_throttles(config(leader="*"), 5, isr=(1,), follower=2)

    follower = config(follower="0:1, 2:1")
    assert quotas.follower_throttles(follower, 2, isr=(0,))
    assert not quotas.follower_throttles(follower, 2, isr=(0, 1))  # in sync
    assert not quotas.follower_throttles(follower, 1, isr=(0,))
    assert not quotas.follower_throttles(config(leader="*"), 0, isr=(0,))
    assert quotas.follower_throttles(config(follower="*"), 9, isr=(0,))
