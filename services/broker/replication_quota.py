"""Replication throttles: Kafka's replication quotas, set by kafka-reassign-partitions
--throttle (docs/broker.md "Replication throttles").

A broker's dynamic configs ``leader.replication.throttled.rate`` and
``follower.replication.throttled.rate`` (bytes/s) limit, together, the replication traffic
of the replicas a topic's ``leader.replication.throttled.replicas`` and
``follower.replication.throttled.replicas`` name:

- as a leader, the bytes it sends to followers outside the ISR of a partition whose
  leader list names this broker's replica (``partition:this broker`` or ``*``): while the
  leader quota is used up, such a partition's data is left out of a follower's fetch
  response, and the follower simply fetches again;
- as a follower, the bytes it fetches for a partition it is not in the ISR of and whose
  follower list names its replica: while the follower quota is used up, the partition is
  left out of its fetch requests.

In-sync replicas are never throttled, so throttling cannot hold back the high watermark;
consumers never are.

Kafka measures each rate over eleven one-second windows, which lets ten seconds of quota
through at once after an idle spell. Here a token bucket holds one second's worth: it
refills at the rate, a send is allowed while it has tokens and may take it below zero by
what one read returns, so in any interval the bytes sent are at most
``rate x (interval + 1 s)`` plus one read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping

from directlog.broker_config import FOLLOWER_RATE, LEADER_RATE, throttle_rate
from directlog.topic_config import LogConfig, throttled_replicas

BURST_SECONDS = 1.0  # how much quota an idle throttle saves up


class ByteRateMeter:
    """A token bucket of bytes: ``rate`` per second, at most ``rate x burst`` saved up. The
    clock (seconds, monotonic) is injected."""

    def __init__(
        self, rate: int, clock: Callable[[], float], burst_seconds: float = BURST_SECONDS
    ) -> None:
        if rate < 0 or burst_seconds <= 0:
            raise ValueError(f"rate {rate} and burst {burst_seconds} s: want >= 0 and > 0")
        self._clock = clock
        self._burst_seconds = burst_seconds
        self.rate = rate
        self._tokens = float(rate) * burst_seconds  # starts full
        self._updated = clock()

    @property
    def capacity(self) -> float:
        return self.rate * self._burst_seconds

    def set_rate(self, rate: int) -> None:
        """A new rate from now on; what was saved up is kept, up to the new capacity."""
        if rate < 0:
            raise ValueError(f"rate {rate} < 0")
        self._refill()
        self.rate = rate
        self._tokens = min(self._tokens, self.capacity)

    def _refill(self) -> float:
        now = self._clock()
        elapsed = max(now - self._updated, 0.0)
        self._updated = now
        self._tokens = min(self._tokens + elapsed * self.rate, self.capacity)
        return self._tokens

    def exceeded(self) -> bool:
        """Whether nothing may be sent now (the bucket is empty or in debt)."""
        return self._refill() <= 0

    def allowance(self) -> int:
        """The bytes that may be sent now, one read may go past them."""
        return max(math.floor(self._refill()), 0)

    def record(self, size: int) -> None:
        """``size`` bytes were sent."""
        if size < 0:
            raise ValueError(f"size {size} < 0")
        self._refill()
        self._tokens -= size

    def seconds_until_allowed(self) -> float:
        """How long until something may be sent again (inf at rate 0 once spent)."""
        tokens = self._refill()
        if tokens > 0:
            return 0.0
        if self.rate == 0:
            return math.inf
        return (1 - tokens) / self.rate


class ReplicationQuota:
    """One direction's throttle on this broker: its rate as the image says now (None: not
    throttled) and the meter of what was sent under it."""

    def __init__(self, rate: Callable[[], int | None], clock: Callable[[], float]) -> None:
        self._rate = rate
        self._clock = clock
        self._meter: ByteRateMeter | None = None

    def meter(self) -> ByteRateMeter | None:
        """The meter at the rate in force; None while no rate is set."""
        rate = self._rate()
        if rate is None:
            self._meter = None
        elif self._meter is None:
            self._meter = ByteRateMeter(rate, self._clock)
        elif self._meter.rate != rate:
            self._meter.set_rate(rate)
        return self._meter

    def exceeded(self) -> bool:
        meter = self.meter()
        return meter is not None and meter.exceeded()

    def allowance(self) -> int | None:
        """Bytes that may be sent now; None: no limit."""
        meter = self.meter()
        return None if meter is None else meter.allowance()

    def record(self, size: int) -> None:
        meter = self.meter()
        if meter is not None and size:
            meter.record(size)

    def seconds_until_allowed(self) -> float:
        meter = self.meter()
        return 0.0 if meter is None else meter.seconds_until_allowed()


class ReplicationQuotas:
    """Both throttles of broker ``broker_id``; ``configs`` gives its dynamic configs as the
    controller last streamed them."""

    def __init__(
        self,
        broker_id: int,
        configs: Callable[[], Mapping[str, str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.broker_id = broker_id
        self.leader = ReplicationQuota(lambda: throttle_rate(configs(), LEADER_RATE), clock)
        self.follower = ReplicationQuota(lambda: throttle_rate(configs(), FOLLOWER_RATE), clock)

    def leader_throttles(
        self, config: LogConfig, partition: int, isr: Collection[int], follower: int
    ) -> bool:
        """Whether this leader's sends of ``partition`` to ``follower`` count against (and
        wait for) the leader quota: the topic's leader list names this broker's replica and
        the follower is not in the ISR (Kafka's shouldLeaderThrottle, less the quota)."""
        value = config.leader_replication_throttled_replicas
        return (
            bool(value)
            and follower not in isr
            and throttled_replicas(value).throttles(partition, self.broker_id)
        )

    def follower_throttles(self, config: LogConfig, partition: int, isr: Collection[int]) -> bool:
        """Whether this follower's fetches of ``partition`` count against (and wait for) the
        follower quota: the topic's follower list names this broker's replica, which is not
        in the ISR."""
        value = config.follower_replication_throttled_replicas
        return (
            bool(value)
            and self.broker_id not in isr
            and throttled_replicas(value).throttles(partition, self.broker_id)
        )
