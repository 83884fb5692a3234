"""The traffic pipeline (pipelines/traffic, the KafkaDirect paper's §5.4) end to end on a
real broker: `run` (pipelines/traffic/__main__.py, what `python -m pipelines.traffic`
does) starts the job, the sensors publish a small seeded plan while it runs, and the job
is stopped once it has processed everything (processAllAvailable), for a constant-rate
workload and for bursts.

The counts and speeds topics have one partition each: within a partition the events come
in event-time order, so however a micro-batch cuts the two topics, no event falls behind
the watermark (its policy is the minimum over both sources) and the totals are exact.
With several partitions a cut can leave one partition behind another by more than the
watermark delay, and the job then rightly drops the late events: job.py's docstring.

The test recomputes the plan's measurements from its seed, reads the input topics back to
check they hold exactly those (and to learn each event's creation time), computes the
joined per-location window totals itself, and compares them exactly with the records the
job wrote, read back with confluent-kafka: the windows whose end the final watermark
(the last event time less the watermark delay) passed, and only those. Every event read
has exactly one delay record, with its creation time, and a delay >= 0.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from pipelines.traffic.__main__ import RunResult, run
from pipelines.traffic.events import Plan, Workload, measurements
from pipelines.traffic.job import JobSettings
from pipelines.traffic.sensors import close_producer, make_producer
from tests.e2e.conftest import Clients

pytestmark = pytest.mark.timeout(240)

BASE_MS = 1_700_000_000_000  # event time of the first round, a multiple of every window
INPUT_PARTITIONS = 1
OUTPUT_PARTITIONS = 2


def read_topic(clients: Clients, bootstrap: str, topic: str, partitions: int) -> list[Any]:
    """Every record of `topic` (all partitions, from 0 to the high watermark)."""
    consumer = clients.consumer(bootstrap)
    assigned = [TopicPartition(topic, p, 0) for p in range(partitions)]
    total = sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in assigned)
    consumer.assign(assigned)
    return clients.consume(consumer, total) if total else []


def expected_totals(plan: Plan, window_ms: int, watermark_ms: int) -> list[dict[str, Any]]:
    """The job's output, computed here: per location and window, the measurements, their
    cars and the cars' mean speed, for the windows the final watermark closed."""
    sums: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    last = BASE_MS
    for m in measurements(plan):
        start = m.time_ms - m.time_ms % window_ms
        totals = sums[(m.location, start)]
        totals[0] += 1
        totals[1] += m.cars
        totals[2] += m.cars * m.speed
        last = max(last, m.time_ms)
    watermark = last - watermark_ms
    return sorted(
        (
            {
                "location": location,
                "window_start": start,
                "window_end": start + window_ms,
                "measurements": count,
                "cars": cars,
                "avg_speed": car_speed / cars if cars else None,
            }
            for (location, start), (count, cars, car_speed) in sums.items()
            if start + window_ms <= watermark
        ),
        key=lambda row: (row["window_start"], row["location"]),
    )


@pytest.fixture
def pipeline(
    spark: Any, module_broker: Any, clients: Clients, topic_name: Any, tmp_path: Path
) -> Iterator[Any]:
    """Runs the pipeline on fresh topics; yields run_pipeline(plan, window, watermark)."""
    bootstrap = module_broker.bootstrap
    producer = make_producer(bootstrap)

    def run_pipeline(plan: Plan, window_s: int, watermark_s: int) -> tuple[JobSettings, RunResult]:
        settings = JobSettings(
            bootstrap=bootstrap,
            checkpoint=str(tmp_path / "checkpoint"),
            counts_topic=topic_name("counts"),
            speeds_topic=topic_name("speeds"),
            aggregates_topic=topic_name("totals"),
            delays_topic=topic_name("delays"),
            window=f"{window_s} seconds",
            watermark=f"{watermark_s} seconds",
        )
        for topic in (settings.counts_topic, settings.speeds_topic):
            clients.create_topic(bootstrap, topic, INPUT_PARTITIONS)
        for topic in (settings.aggregates_topic, settings.delays_topic):
            clients.create_topic(bootstrap, topic, OUTPUT_PARTITIONS)
        return settings, run(spark, settings, plan, producer)

    try:
        yield run_pipeline
    finally:
        close_producer(producer)


def check_run(
    clients: Clients,
    settings: JobSettings,
    result: RunResult,
    plan: Plan,
    window_s: int,
    watermark_s: int,
) -> None:
    bootstrap = settings.bootstrap
    # The input topics hold the plan's measurements, each count and speed once.
    created: dict[tuple[str, int, int], int] = {}
    sent: dict[str, list[tuple[str, int, int, int]]] = {"cars": [], "speed": []}
    for topic, measure in ((settings.counts_topic, "cars"), (settings.speeds_topic, "speed")):
        for message in read_topic(clients, bootstrap, topic, INPUT_PARTITIONS):
            event = json.loads(message.value())
            assert message.key() == f"{event['location']}/{event['lane']}".encode()
            sent[measure].append((event["location"], event["lane"], event["time"], event[measure]))
            created[(topic, message.partition(), message.offset())] = event["created"]
    for measure in sent:
        wanted = [(m.location, m.lane, m.time_ms, getattr(m, measure)) for m in measurements(plan)]
        assert sorted(sent[measure]) == sorted(wanted), measure
    assert result.published.events == plan.events == len(created)

    # The joined window totals, exactly.
    found = []
    for message in read_topic(clients, bootstrap, settings.aggregates_topic, OUTPUT_PARTITIONS):
        row = json.loads(message.value())
        assert message.key() == row["location"].encode()
        found.append(row)
    found.sort(key=lambda row: (row["window_start"], row["location"]))
    wanted_totals = expected_totals(plan, window_s * 1000, watermark_s * 1000)
    assert len(wanted_totals) >= 9  # the plan spans enough event time to close windows
    assert found == wanted_totals
    assert result.aggregates == len(wanted_totals)

    # One delay record per event read, with the event's creation time.
    delays = [
        json.loads(m.value())
        for m in read_topic(clients, bootstrap, settings.delays_topic, OUTPUT_PARTITIONS)
    ]
    where = [(d["topic"], d["partition"], d["offset"]) for d in delays]
    assert sorted(where) == sorted(created), "not one delay record per event"
    for delay in delays:
        assert delay["created"] == created[(delay["topic"], delay["partition"], delay["offset"])]
        assert delay["delay_ms"] == delay["read"] - delay["created"] >= 0, delay
    assert len(result.delays) == len(delays)


def test_constant_rate(pipeline: Any, clients: Clients) -> None:
    """400 events/s for 0.9 s: 30 rounds of 6 sensors, 300 ms of event time apart (ten
    times the publishing pace, so windows close within the run)."""
    plan = Plan(base_ms=BASE_MS, events=360, rate=400, seed=7, locations=3, lanes=2, period_ms=300)
    settings, result = pipeline(plan, window_s=2, watermark_s=2)
    check_run(clients, settings, result, plan, 2, 2)


def test_bursts(pipeline: Any, clients: Clients) -> None:
    """Three bursts of 200 events, 0.5 s apart, each 5 s of event time."""
    plan = Plan(
        base_ms=BASE_MS,
        events=600,
        rate=400,
        seed=11,
        locations=3,
        lanes=2,
        workload=Workload.BURST,
        burst_every=0.5,
        period_ms=300,
    )
    assert plan.burst_events == 200
    settings, result = pipeline(plan, window_s=2, watermark_s=3)
    check_run(clients, settings, result, plan, 2, 3)
