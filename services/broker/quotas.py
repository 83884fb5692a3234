"""Client quotas on this broker: the rate each group of clients uses, measured as Kafka
measures it, and the throttle time that brings a group back within its quota (KIP-13,
KIP-124, KIP-219).

Rates are Kafka's ``Rate`` over a ``SampledStat``: ``window_num`` samples
(quota.window.num, 11) of ``window_seconds`` (quota.window.size.seconds, 1). A sample opens
at the first record after the previous one is full, the ring keeps one sample more than
``window_num``, and a sample whose last record is ``window_num`` windows old is discarded.
The rate is the sum of the kept samples over the time since the oldest one opened, and that
span is never shorter than ``window_num - 1`` windows: a new or long-idle client is measured
as if the earlier windows were empty, so a first burst of ``window_num - 1`` windows' quota
passes (ten seconds' worth by default).

Over quota, the throttle time is how long the client must stay silent for the rate to come
back down to the quota: ``(rate - quota) / quota x span``, in ms. Kafka leaves it unbounded
for byte rates and bounds it at one window for request time; so does this module (and keeps
it within the int32 field that carries it).

The answer goes back at once with ``throttle_time_ms``; the caller then mutes the
connection for that long (KIP-219: clients back off too, old request versions that cannot
carry the field get their response held back instead).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from directlog.security.client_quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaEntity,
    resolve,
)

MAX_THROTTLE_MS = 2**31 - 1  # throttle_time_ms is an int32 on the wire
DEFAULT_MAX_TRACKED = 100_000


class QuotaKind(Enum):
    """What a quota meters; the value is its quota key."""

    PRODUCE = PRODUCER_BYTE_RATE  # bytes produced
    FETCH = CONSUMER_BYTE_RATE  # bytes fetched
    REQUEST = REQUEST_PERCENTAGE  # request handler time, as a percentage of one thread


class _Rate:
    """Kafka's sampled rate. Samples are parallel lists that grow to ``window_num + 1``
    entries only as windows fill, so a client seen once costs one sample."""

    __slots__ = ("_current", "_last", "_start", "_value", "last_used")

    def __init__(self, now: float) -> None:
        self._start = [now]
        self._last = [now]
        self._value = [0.0]
        self._current = 0
        self.last_used = now

    def copy(self) -> _Rate:
        twin = _Rate(self.last_used)
        twin._start = self._start.copy()
        twin._last = self._last.copy()
        twin._value = self._value.copy()
        twin._current = self._current
        return twin

    def record(self, amount: float, now: float, window: float, window_num: int) -> None:
        i = self._current
        if now - self._start[i] >= window:
            i = (i + 1) % (window_num + 1)
            if i == len(self._start):
                self._start.append(now)
                self._last.append(now)
                self._value.append(0.0)
            else:
                self._start[i] = now
                self._value[i] = 0.0
            self._current = i
        self._value[i] += amount
        self._last[i] = now
        self.last_used = now

    def measure(self, now: float, window: float, window_num: int) -> tuple[float, float]:
        """(rate per second, the span in seconds it is measured over)."""
        expired = now - window_num * window
        for i, last in enumerate(self._last):
            if last <= expired:
                self._start[i] = self._last[i] = now
                self._value[i] = 0.0
        span = now - min(self._start)
        full_windows = int(span // window)
        if full_windows < window_num - 1:
            span += (window_num - 1 - full_windows) * window
        span = max(span, 0.001)  # window_num 1, at a sample's first instant: count a ms
        return sum(self._value) / span, span


@dataclass(slots=True)
class _Route:
    """Where a connection's usage of one kind goes: its quota and the group sharing it, or
    None when no quota applies to the connection."""

    target: tuple[float, QuotaEntity] | None
    last_used: float


class _Meter:
    """One kind's routes, per (user, client id), and rates, per group; both ordered from the
    least recently used."""

    __slots__ = ("kind", "rates", "routes")

    def __init__(self, kind: QuotaKind) -> None:
        self.kind = kind
        self.routes: OrderedDict[tuple[str, str], _Route] = OrderedDict()
        self.rates: OrderedDict[QuotaEntity, _Rate] = OrderedDict()

    def expire(self, idle_since: float, max_tracked: int) -> None:
        routes, rates = self.routes, self.rates
        while routes and (
            len(routes) > max_tracked or next(iter(routes.values())).last_used <= idle_since
        ):
            routes.popitem(last=False)
        while rates and (
            len(rates) > max_tracked or next(iter(rates.values())).last_used <= idle_since
        ):
            rates.popitem(last=False)


class QuotaManager:
    """Meters produce bytes, fetch bytes and request handler time per client group against
    the client quotas in the cluster metadata, and says how long to throttle.

    Not thread-safe: it lives on the broker's event loop. Each call is a few dictionary
    operations and a pass over at most ``window_num + 1`` samples.

    Memory stays bounded two ways. What is kept, per kind, is a route per (user, client id)
    seen and a rate per group charged. Whenever one is added, those unused for
    ``idle_expiry_seconds`` (an hour, as in Kafka) are dropped, and so are the least
    recently used beyond ``max_tracked``: a client inventing a new client id per request
    cannot grow memory past that count (each costs under a kilobyte). A rate unused for
    ``window_num x window_seconds`` has already decayed to an empty one, so dropping it
    changes nothing; only a flood that pushes out rates used within that span lets their
    owners start afresh. Nothing is kept for a kind that has no quota at all.
    """

    def __init__(
        self,
        *,
        window_num: int = 11,
        window_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        idle_expiry_seconds: float = 3600.0,
        max_tracked: int = DEFAULT_MAX_TRACKED,
    ) -> None:
        if window_num < 1 or window_seconds <= 0:
            raise ValueError(f"{window_num} windows of {window_seconds} s: want >= 1 and > 0")
        if idle_expiry_seconds <= 0 or max_tracked < 1:
            raise ValueError(f"expiry {idle_expiry_seconds} s, {max_tracked} tracked: want > 0")
        self._window_num = window_num
        self._window = window_seconds
        self._clock = clock
        self._expiry = idle_expiry_seconds
        self._max_tracked = max_tracked
        self._quotas: dict[QuotaEntity, dict[str, float]] = {}
        self._meters = {kind: _Meter(kind) for kind in QuotaKind}
        self._active: dict[QuotaKind, _Meter] = {}  # the kinds some quota is set for

    def configure(self, quotas: Mapping[QuotaEntity, Mapping[str, float]]) -> None:
        """Replace the whole set of client quotas (the cluster metadata's, on each change).
        Rates already measured are kept: a group whose quota is unchanged stays throttled."""
        copied: dict[QuotaEntity, dict[str, float]] = {}
        for entity, values in quotas.items():
            for key, value in values.items():
                if not value > 0:
                    raise ValueError(f"quota {key}={value} for {entity}: want > 0")
            copied[entity] = dict(values)
        self._quotas = copied
        self._active = {}
        for kind, meter in self._meters.items():
            meter.routes.clear()
            if any(kind.value in values for values in copied.values()):
                self._active[kind] = meter
            else:
                meter.rates.clear()

    def quota(self, kind: QuotaKind, user: str, client_id: str) -> float | None:
        """The quota a connection of ``user`` with ``client_id`` is under (bytes per second,
        or a percentage of one request thread), None when none applies."""
        meter = self._active.get(kind)
        if meter is None:
            return None
        target = self._route(meter, user, client_id, self._clock())
        return None if target is None else target[0]

    def record(self, kind: QuotaKind, user: str, client_id: str, amount: float) -> int:
        """Charge ``amount`` (bytes, or seconds of handler time for REQUEST) to the
        connection's group and return the throttle time in ms, 0 within quota."""
        meter = self._active.get(kind)
        if meter is None:
            return 0
        now = self._clock()
        target = self._route(meter, user, client_id, now)
        if target is None:
            return 0
        quota, group = target
        rate = meter.rates.get(group)
        if rate is None:
            rate = meter.rates[group] = _Rate(now)
            meter.expire(now - self._expiry, self._max_tracked)
        else:
            meter.rates.move_to_end(group)
        rate.record(self._units(kind, amount), now, self._window, self._window_num)
        return self._throttle_ms(kind, quota, rate, now)

    def throttle_ms(self, kind: QuotaKind, user: str, client_id: str, amount: float = 0.0) -> int:
        """The throttle time ``record`` would give for ``amount``, charging nothing. With the
        size of a fetch response: Kafka answers a fetch that would go over quota with no
        data (and charges nothing for it); otherwise ``record`` the bytes sent."""
        meter = self._active.get(kind)
        if meter is None:
            return 0
        now = self._clock()
        target = self._route(meter, user, client_id, now)
        if target is None:
            return 0
        quota, group = target
        rate = meter.rates.get(group)
        probe = _Rate(now) if rate is None else rate.copy()
        if amount:
            probe.record(self._units(kind, amount), now, self._window, self._window_num)
        return self._throttle_ms(kind, quota, probe, now)

    def tracked(self) -> list[tuple[QuotaKind, QuotaEntity]]:
        """The (kind, group) pairs holding a rate now, by kind, least recently used first
        (for metrics and inspection)."""
        idle_since = self._clock() - self._expiry
        for meter in self._meters.values():
            meter.expire(idle_since, self._max_tracked)
        return [(kind, group) for kind, meter in self._meters.items() for group in meter.rates]

    @staticmethod
    def _units(kind: QuotaKind, amount: float) -> float:
        # request time is metered in percent-seconds, so its rate is a percentage
        return amount * 100.0 if kind is QuotaKind.REQUEST else amount

    def _throttle_ms(self, kind: QuotaKind, quota: float, rate: _Rate, now: float) -> int:
        observed, span = rate.measure(now, self._window, self._window_num)
        if observed <= quota:
            return 0
        throttle = math.floor((observed - quota) / quota * span * 1000.0 + 0.5)
        if kind is QuotaKind.REQUEST:
            throttle = min(throttle, math.floor(self._window * 1000.0))
        return min(throttle, MAX_THROTTLE_MS)

    def _route(
        self, meter: _Meter, user: str, client_id: str, now: float
    ) -> tuple[float, QuotaEntity] | None:
        key = (user, client_id)
        route = meter.routes.get(key)
        if route is None:
            target = resolve(self._quotas, user, client_id, meter.kind.value)
            meter.routes[key] = _Route(target, now)
            meter.expire(now - self._expiry, self._max_tracked)
            return target
        route.last_used = now
        meter.routes.move_to_end(key)
        return route.target
