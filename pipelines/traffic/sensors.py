"""The sensors: publish a plan's events (events.py) into the counts and speeds topics, each
at its due time, stamped with its creation time.

    python -m pipelines.traffic.sensors --bootstrap 127.0.0.1:9092 --rate 400 --seconds 60
    python -m pipelines.traffic.sensors --bootstrap 127.0.0.1:9092 --workload burst

The producer is directlog.client's, a drop-in for confluent-kafka's that writes over RDMA
with `--rdma-produce exclusive|shared` (docs/client.md) and is confluent-kafka's own
otherwise. Events go out with acks=all and linger.ms=1: the benchmark measures delays.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pipelines.traffic.events import (
    COUNTS_TOPIC,
    SPEEDS_TOPIC,
    Kind,
    Plan,
    Workload,
    encode,
    events_in,
    schedule,
)

FLUSH_TIMEOUT = 60.0
STOP_CHECK = 0.2  # seconds between looks at `stopping` while waiting for a due time


class EventProducer(Protocol):
    """What publishing needs of a producer (confluent-kafka's or directlog.client's)."""

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any) -> None: ...

    def poll(self, timeout: float) -> int: ...

    def flush(self, timeout: float) -> int: ...


class PublishError(RuntimeError):
    """Events the brokers did not take."""


@dataclass(frozen=True, slots=True)
class Published:
    events: int
    seconds: float  # from the start to the last acknowledgement
    behind_ms: float  # how far the publisher fell behind its schedule at worst


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def publish(
    plan: Plan,
    producer: EventProducer,
    counts_topic: str = COUNTS_TOPIC,
    speeds_topic: str = SPEEDS_TOPIC,
    clock: Callable[[], float] = time.monotonic,
    now_ms: Callable[[], int] = wall_ms,
    stopping: threading.Event | None = None,
) -> Published:
    """Publish every event of `plan` at its due time and wait until all are acknowledged;
    PublishError names the first failure. Waiting serves the producer's delivery
    reports (poll), so a slow broker shows as lateness (`behind_ms`), not as a backlog.
    Once `stopping` is set no more events are published (those sent are still awaited)."""
    topics = {Kind.COUNT: counts_topic, Kind.SPEED: speeds_topic}
    failures: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    start = clock()
    behind = 0.0
    sent = 0
    for due, kind, measurement in schedule(plan):
        while (left := start + due - clock()) > 0 and not _set(stopping):
            producer.poll(min(left, STOP_CHECK))
        if _set(stopping):
            break
        behind = max(behind, -left)
        value = encode(kind, measurement, now_ms())
        while True:
            try:
                producer.produce(topics[kind], value, measurement.key, on_delivery=delivered)
                break
            except BufferError:  # the producer's queue is full: let it drain
                producer.poll(0.01)
        producer.poll(0)
        sent += 1
    if producer.flush(FLUSH_TIMEOUT):
        raise PublishError(f"events still unacknowledged {FLUSH_TIMEOUT} s after the last")
    if failures:
        raise PublishError(f"{len(failures)} of {sent} events were not written: {failures[0]}")
    return Published(sent, clock() - start, behind * 1000)


def _set(event: threading.Event | None) -> bool:
    return event is not None and event.is_set()


def make_producer(bootstrap: str, rdma_produce: str = "off") -> Any:
    """directlog.client's Producer (confluent-kafka's, plus the RDMA datapath when asked)."""
    from directlog.client import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 1,
            "enable.idempotence": True,
            "rdma.produce": rdma_produce,
        }
    )


def close_producer(producer: Any) -> None:
    close = getattr(producer, "close", None)  # directlog.client's holds RDMA resources
    if close is not None:
        close()


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that make a Plan, shared with `python -m pipelines.traffic`."""
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    parser.add_argument("--rate", type=float, default=400.0, help="events a second, both topics")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--seconds", type=float, default=60.0, help="how long to publish")
    size.add_argument("--events", type=int, help="how many events (even), instead of --seconds")
    parser.add_argument("--workload", choices=[w.value for w in Workload], default="constant")
    parser.add_argument(
        "--burst-every", type=float, default=10.0, help="seconds between bursts (burst workload)"
    )
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--locations", type=int, default=10)
    parser.add_argument("--lanes", type=int, default=4, help="lanes (sensors) per location")
    parser.add_argument(
        "--period-ms",
        type=int,
        help="event time between measurement rounds (default: keep pace with the wall clock)",
    )
    parser.add_argument("--counts-topic", default=COUNTS_TOPIC)
    parser.add_argument("--speeds-topic", default=SPEEDS_TOPIC)
    parser.add_argument(
        "--rdma-produce",
        choices=["off", "exclusive", "shared"],
        default="off",
        help="directlog.client's RDMA produce datapath (the topics need preallocate=true)",
    )


def plan_from(args: argparse.Namespace, base_ms: int) -> Plan:
    events = args.events if args.events is not None else events_in(args.seconds, args.rate)
    return Plan(
        base_ms=base_ms,
        events=events,
        rate=args.rate,
        seed=args.seed,
        locations=args.locations,
        lanes=args.lanes,
        workload=Workload(args.workload),
        burst_every=args.burst_every,
        period_ms=args.period_ms,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.traffic.sensors")
    add_plan_arguments(parser)
    args = parser.parse_args(argv)
    try:
        plan = plan_from(args, wall_ms())
    except ValueError as error:
        parser.error(str(error))
    stopping = threading.Event()  # Ctrl-C: stop publishing, wait for what was sent
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stopping.set())
    producer = make_producer(args.bootstrap, args.rdma_produce)
    try:
        done = publish(plan, producer, args.counts_topic, args.speeds_topic, stopping=stopping)
    finally:
        close_producer(producer)
    print(
        f"published {done.events} events in {done.seconds:.1f} s "
        f"({plan.workload}, at worst {done.behind_ms:.0f} ms behind schedule)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
