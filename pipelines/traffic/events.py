"""What the traffic sensors measure and when they publish it, with no I/O: a seeded plan
that the publisher (sensors.py) follows and a test recomputes.

A location has `lanes` lanes and a sensor on each. In every round all sensors measure
once, in order (location 0 lane 1, location 0 lane 2, ..., location 1 lane 1, ...), at the
event time `base_ms + round * period_ms`. A measurement is published as two events: its
car count in the counts topic, then its average speed in the speeds topic, both JSON:

    {"location":"loc-003","lane":2,"time":1700000000200,"cars":17,"created":1700000000213}
    {"location":"loc-003","lane":2,"time":1700000000200,"speed":87,"created":1700000000213}

`time` is the measurement's event time (ms), `created` the wall-clock time (ms) at which
the publisher built the event, from which the job's delays are taken. Keys are
"<location>/<lane>", so a sensor's events stay in order in one partition. Counts and speeds
are whole numbers (cars, km/h) drawn from `random.Random(seed)` in measurement order, so
the same plan always holds the same measurements, whatever the workload.

The workload decides only when each event is published (its due time, in seconds from
the start): `constant` publishes event i at i / rate; `burst` holds the events of every
`burst_every` seconds (rate * burst_every of them) and publishes them together when that
interval ends, a large batch every 10 s by default, as a gateway that uploads its sensors'
readings periodically would.
"""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

COUNTS_TOPIC = "traffic-counts"
SPEEDS_TOPIC = "traffic-speeds"
AGGREGATES_TOPIC = "traffic-aggregates"
DELAYS_TOPIC = "traffic-delays"

MAX_CARS = 30  # a lane's cars in one measurement: 0 to this
MIN_SPEED = 40  # km/h
MAX_SPEED = 130


class Workload(enum.StrEnum):
    CONSTANT = "constant"
    BURST = "burst"


class Kind(enum.StrEnum):
    """Which of a measurement's two events (and so which topic)."""

    COUNT = "count"
    SPEED = "speed"


@dataclass(frozen=True, slots=True)
class Plan:
    """What the sensors publish: `events` events (two per measurement, so an even number)
    at `rate` events a second in all, both topics together (the paper's 400), as the
    workload spreads them.

    `period_ms` is the event time between two rounds of measurements; None makes it the
    publishing time of a round (2 * sensors / rate seconds), so event time keeps pace
    with the wall clock. `base_ms` is the event time of the first round."""

    base_ms: int
    events: int
    rate: float = 400.0
    seed: int = 24
    locations: int = 10
    lanes: int = 4
    workload: Workload = Workload.CONSTANT
    burst_every: float = 10.0  # seconds, for the burst workload
    period_ms: int | None = None

    def __post_init__(self) -> None:
        if self.events < 0 or self.events % 2:
            raise ValueError(f"events must be even (two a measurement) and >= 0, not {self.events}")
        if self.rate <= 0:
            raise ValueError(f"rate must be above 0, not {self.rate}")
        if self.locations < 1 or self.lanes < 1:
            raise ValueError("a plan needs at least one location and one lane")
        if self.burst_every <= 0:
            raise ValueError(f"burst_every must be above 0, not {self.burst_every}")
        if self.period_ms is not None and self.period_ms < 1:
            raise ValueError(f"period_ms must be at least 1, not {self.period_ms}")

    @property
    def sensors(self) -> int:
        return self.locations * self.lanes

    @property
    def round_ms(self) -> int:
        """Event time from one round of measurements to the next."""
        if self.period_ms is not None:
            return self.period_ms
        return max(1, round(2 * self.sensors * 1000 / self.rate))

    @property
    def burst_events(self) -> int:
        """Events published together in one burst (burst workload)."""
        return max(1, round(self.rate * self.burst_every))

    def due(self, index: int) -> float:
        """When event `index` (0, 1, ...) is published, in seconds from the start."""
        if self.workload is Workload.CONSTANT:
            return index / self.rate
        return (index // self.burst_events + 1) * self.burst_every


def events_in(seconds: float, rate: float) -> int:
    """How many events a run of `seconds` at `rate` publishes (whole measurements)."""
    return int(seconds * rate) // 2 * 2


@dataclass(frozen=True, slots=True)
class Measurement:
    index: int  # 0, 1, ... in publishing order
    location: str
    lane: int  # 1 to lanes
    time_ms: int  # event time
    cars: int
    speed: int  # km/h, the average of the lane's cars

    @property
    def key(self) -> bytes:
        return f"{self.location}/{self.lane}".encode()


def location_name(number: int) -> str:
    return f"loc-{number:03d}"


def measurements(plan: Plan) -> Iterator[Measurement]:
    """The plan's measurements in publishing order; the same for the same plan."""
    rng = random.Random(plan.seed)
    for index in range(plan.events // 2):
        round_, sensor = divmod(index, plan.sensors)
        location, lane = divmod(sensor, plan.lanes)
        cars = rng.randint(0, MAX_CARS)
        speed = rng.randint(MIN_SPEED, MAX_SPEED)
        yield Measurement(
            index,
            location_name(location),
            lane + 1,
            plan.base_ms + round_ * plan.round_ms,
            cars,
            speed,
        )


def schedule(plan: Plan) -> Iterator[tuple[float, Kind, Measurement]]:
    """Every event of the plan in publishing order: (due seconds, kind, measurement)."""
    for measurement in measurements(plan):
        first = 2 * measurement.index
        yield plan.due(first), Kind.COUNT, measurement
        yield plan.due(first + 1), Kind.SPEED, measurement


def encode(kind: Kind, measurement: Measurement, created_ms: int) -> bytes:
    """The JSON value of one event."""
    event: dict[str, str | int] = {
        "location": measurement.location,
        "lane": measurement.lane,
        "time": measurement.time_ms,
    }
    if kind is Kind.COUNT:
        event["cars"] = measurement.cars
    else:
        event["speed"] = measurement.speed
    event["created"] = created_ms
    return json.dumps(event, separators=(",", ":")).encode()
