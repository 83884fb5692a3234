"""The broker's quota manager on an injected clock: Kafka's throttle time formula on its
sampled rate, clients that obey the throttle times holding to their quota, groups sharing
a quota, request time quotas, reconfiguration, and the bounds on what it keeps."""

from __future__ import annotations

import pytest

from directlog.security.client_quotas import (
    ANONYMOUS,
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    USER,
    QuotaEntity,
)
from services.broker.quotas import QuotaKind, QuotaManager

PRODUCE, FETCH, REQUEST = QuotaKind.PRODUCE, QuotaKind.FETCH, QuotaKind.REQUEST
QUOTA = 10_000.0  # bytes per second
SPAN = 12.0  # what the rate covers once filled: 11 samples and the one being refilled


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def user(name: str | None) -> QuotaEntity:
    return QuotaEntity(((USER, name),))


def client(name: str | None) -> QuotaEntity:
    return QuotaEntity(((CLIENT_ID, name),))


Sends = list[tuple[float, float]]  # (seconds since the start, amount)


def charged(sends: Sends, start: float, end: float) -> float:
    return sum(amount for at, amount in sends if start <= at < end)


def assert_held_to(sends: Sends, quota: float, until: float) -> None:
    """Over every span the quota is measured on, from the first full one until ``until``,
    the client got within 10% of its quota."""
    ends = [SPAN + step / 10 for step in range(int((until - SPAN) * 10) + 1)]
    rates = [charged(sends, end - SPAN, end) / SPAN for end in ends]
    assert quota * 0.9 <= min(rates) and max(rates) <= quota * 1.1, (min(rates), max(rates))


@pytest.mark.timeout(10)
def test_throttle_time_is_kafkas_formula_on_the_padded_span() -> None:
    clock = Clock()
    manager = QuotaManager(window_num=3, clock=clock)
    manager.configure({client("p"): {PRODUCER_BYTE_RATE: 50.0}})
    # a new client is measured over window_num - 1 windows: 200 B / 2 s = 100 B/s, twice
    # the quota: (100 - 50) / 50 x 2 s
    assert manager.record(PRODUCE, ANONYMOUS, "p", 200) == 2000
    clock.now += 1.0  # still young: the span stays padded to 2 s
    assert manager.throttle_ms(PRODUCE, ANONYMOUS, "p") == 2000
    clock.now += 1.5  # 200 B over 2.5 s: 80 B/s, (80 - 50) / 50 x 2.5 s
    assert manager.throttle_ms(PRODUCE, ANONYMOUS, "p") == 1500
    clock.now += 0.5  # window_num windows after its last record the sample is discarded
    assert manager.throttle_ms(PRODUCE, ANONYMOUS, "p") == 0
    assert manager.record(PRODUCE, ANONYMOUS, "p", 100) == 0  # exactly the quota passes
    assert manager.record(PRODUCE, ANONYMOUS, "p", 1) == 20  # 50.5 B/s: 0.01 x 2 s


@pytest.mark.timeout(10)
def test_byte_rate_throttles_are_not_bounded() -> None:
    clock = Clock()
    manager = QuotaManager(clock=clock)
    manager.configure({client("p"): {PRODUCER_BYTE_RATE: 100.0}})
    # 1 MB at 100 B/s over a 10 s span: (100_000 - 100) / 100 x 10 s
    assert manager.record(PRODUCE, ANONYMOUS, "p", 1_000_000) == 9_990_000


@pytest.mark.timeout(30)
def test_a_producer_at_twice_its_quota_that_obeys_the_throttles_holds_to_it() -> None:
    clock = Clock()
    start = clock.now
    manager = QuotaManager(clock=clock)
    manager.configure(
        {client("fast"): {PRODUCER_BYTE_RATE: QUOTA}, client("calm"): {PRODUCER_BYTE_RATE: QUOTA}}
    )
    batch = 1000.0
    fast: Sends = []
    calm_throttles = []
    next_fast = next_calm = start
    throttled = 0
    while clock.now - start < 30.0:
        clock.now = min(next_fast, next_calm)
        if clock.now == next_fast:
            throttle = manager.record(PRODUCE, ANONYMOUS, "fast", batch)
            fast.append((clock.now - start, batch))
            throttled += throttle > 0
            next_fast = clock.now + max(batch / (2 * QUOTA), throttle / 1000)
        else:  # the other client sends at half its own quota
            calm_throttles.append(manager.record(PRODUCE, ANONYMOUS, "calm", batch))
            next_calm = clock.now + batch / (QUOTA / 2)
    assert throttled > 20
    assert_held_to(fast, QUOTA, 30.0)
    # its first burst: Kafka lets a new client through with ten windows' worth at once
    assert charged(fast, 0, 5.0) == pytest.approx(10 * QUOTA, rel=0.1)
    assert len(calm_throttles) > 100 and set(calm_throttles) == {0}


@pytest.mark.timeout(30)
def test_over_a_longer_run_the_average_settles_on_the_quota() -> None:
    clock = Clock()
    start = clock.now
    manager = QuotaManager(clock=clock)
    manager.configure({client("fast"): {PRODUCER_BYTE_RATE: QUOTA}})
    sent = 0.0
    while clock.now - start < 120.0:
        throttle = manager.record(PRODUCE, ANONYMOUS, "fast", 1000)
        sent += 1000
        clock.now += max(1000 / (2 * QUOTA), throttle / 1000)
    assert sent / (clock.now - start) == pytest.approx(QUOTA, rel=0.02)


@pytest.mark.timeout(30)
def test_a_user_quota_is_shared_by_all_its_client_ids() -> None:
    clock = Clock()
    start = clock.now
    manager = QuotaManager(clock=clock)
    manager.configure({user("alice"): {PRODUCER_BYTE_RATE: QUOTA}})
    assert manager.quota(PRODUCE, "alice", "a1") == manager.quota(PRODUCE, "alice", "a2") == QUOTA
    assert manager.quota(PRODUCE, "bob", "a1") is None
    sends: Sends = []
    next_send = {"a1": start, "a2": start + 0.05}
    throttled = {"a1": 0, "a2": 0}
    while clock.now - start < 30.0:
        client_id = min(next_send, key=lambda c: next_send[c])
        clock.now = next_send[client_id]
        throttle = manager.record(PRODUCE, "alice", client_id, 1000)
        sends.append((clock.now - start, 1000))
        throttled[client_id] += throttle > 0
        # each alone sends at the quota: together they are at twice it
        next_send[client_id] = clock.now + max(1000 / QUOTA, throttle / 1000)
    assert throttled["a1"] > 10 and throttled["a2"] > 10
    assert_held_to(sends, QUOTA, 30.0)
    assert manager.tracked() == [(PRODUCE, user("alice"))]


@pytest.mark.timeout(30)
def test_request_percentage_meters_handler_time_and_bounds_throttles_at_a_window() -> None:
    clock = Clock()
    manager = QuotaManager(clock=clock)
    manager.configure({user("alice"): {REQUEST_PERCENTAGE: 50.0}})
    assert manager.quota(REQUEST, "alice", "x") == 50.0
    # 8 s of handler time over 10 s is 80%: 6 s to wait, bounded at one window
    assert manager.record(REQUEST, "alice", "x", 8.0) == 1000
    assert manager.record(REQUEST, "bob", "x", 8.0) == 0
    clock.now += 60.0  # the samples expire
    start = clock.now
    used: Sends = []
    throttles = []
    while clock.now - start < 30.0:
        throttle = manager.record(REQUEST, "alice", "x", 0.05)
        used.append((clock.now - start, 0.05))
        throttles.append(throttle)
        clock.now += 0.05 + throttle / 1000  # busy back to back, then obeying the throttle
    assert max(throttles) <= 1000 and sum(t > 0 for t in throttles) > 20
    assert_held_to(used, 0.5, 30.0)  # half of one thread's time


@pytest.mark.timeout(10)
def test_throttle_ms_charges_nothing_and_foresees_record() -> None:
    clock = Clock()
    manager = QuotaManager(clock=clock)
    manager.configure({client("c"): {CONSUMER_BYTE_RATE: 1000.0}})
    assert manager.throttle_ms(FETCH, ANONYMOUS, "c") == 0
    assert manager.tracked() == []  # asking creates nothing
    assert manager.record(FETCH, ANONYMOUS, "c", 8000) == 0
    clock.now += 0.5
    foreseen = manager.throttle_ms(FETCH, ANONYMOUS, "c", 4000)
    assert foreseen > 0
    for _ in range(5):  # a fetch over quota answered empty charges nothing
        assert manager.throttle_ms(FETCH, ANONYMOUS, "c", 4000) == foreseen
    assert manager.throttle_ms(FETCH, ANONYMOUS, "c") == 0
    assert manager.record(FETCH, ANONYMOUS, "c", 4000) == foreseen


@pytest.mark.timeout(10)
def test_reconfiguring_applies_at_once_and_keeps_what_was_measured() -> None:
    clock = Clock()
    manager = QuotaManager(clock=clock)
    manager.configure({client(None): {PRODUCER_BYTE_RATE: 1000.0}})
    assert manager.record(PRODUCE, ANONYMOUS, "p", 20_000) == 10_000
    manager.configure({client("p"): {PRODUCER_BYTE_RATE: 500.0}})  # same group, lower quota
    assert manager.quota(PRODUCE, ANONYMOUS, "p") == 500.0
    assert manager.throttle_ms(PRODUCE, ANONYMOUS, "p") == 30_000
    manager.configure({})
    assert manager.quota(PRODUCE, ANONYMOUS, "p") is None
    assert manager.record(PRODUCE, ANONYMOUS, "p", 20_000) == 0
    assert manager.throttle_ms(PRODUCE, ANONYMOUS, "p") == 0
    assert manager.tracked() == []


@pytest.mark.timeout(10)
def test_kinds_without_quotas_keep_nothing() -> None:
    clock = Clock()
    manager = QuotaManager(clock=clock)
    manager.configure({client("p"): {PRODUCER_BYTE_RATE: 1000.0}})
    for i in range(100):
        assert manager.record(FETCH, ANONYMOUS, f"c{i}", 10**9) == 0
        assert manager.record(REQUEST, ANONYMOUS, f"c{i}", 100.0) == 0
        assert manager.record(PRODUCE, ANONYMOUS, f"c{i}", 10**9) == 0  # no quota applies
    assert manager.tracked() == []
    assert manager.quota(FETCH, ANONYMOUS, "p") is None


@pytest.mark.timeout(10)
def test_idle_groups_expire() -> None:
    clock = Clock()
    manager = QuotaManager(clock=clock, idle_expiry_seconds=60.0)
    manager.configure({user(None): {PRODUCER_BYTE_RATE: 1000.0}})
    manager.record(PRODUCE, "alice", "a", 10)
    manager.record(PRODUCE, "bob", "b", 10)
    assert manager.tracked() == [(PRODUCE, user("alice")), (PRODUCE, user("bob"))]
    clock.now += 30.0
    manager.record(PRODUCE, "alice", "a", 10)
    assert manager.tracked() == [(PRODUCE, user("bob")), (PRODUCE, user("alice"))]
    clock.now += 30.0
    assert manager.tracked() == [(PRODUCE, user("alice"))]
    clock.now += 30.0
    assert manager.tracked() == []


@pytest.mark.timeout(10)
def test_a_client_inventing_client_ids_cannot_grow_memory_past_the_bound() -> None:
    clock = Clock()
    manager = QuotaManager(clock=clock, max_tracked=100)
    manager.configure({client(None): {PRODUCER_BYTE_RATE: 1000.0}})
    for i in range(1000):
        manager.record(PRODUCE, "mallory", f"id-{i}", 10)
        clock.now += 0.001
    assert manager.tracked() == [(PRODUCE, client(f"id-{i}")) for i in range(900, 1000)]
