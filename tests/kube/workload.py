"""Clients that run through a rolling restart, and the check of what they saw, in the way
of Jepsen's Kafka workload (jepsen/tests/kafka.clj): an acks=all idempotent producer sends
numbered values and a consumer group reads them, both for the whole run; every delivery
report, every consumed record and every error a client reports goes into a history, which
is checked afterwards against the log as read back at the end.

    python -m tests.kube.workload BOOTSTRAP TOPIC GROUP HISTORY    # until SIGTERM

On SIGTERM the producer stops sending and flushes, the group reads on until it reaches the
end of every partition, then the process exits 0.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PARTITIONS = 3
RATE = 200  # values per second: steady load, and a history that stays small
FLUSH_TIMEOUT = 180.0  # seconds for the last sends after SIGTERM
CATCH_UP_TIMEOUT = 180.0  # seconds for the group to read to the end after them
# Errors librdkafka reports while it reconnects to a broker that is restarting; it retries
# by itself. Any other error that is not retriable is a failure the client saw.
TRANSIENT = {"_TRANSPORT", "_ALL_BROKERS_DOWN"}


def run(bootstrap: str, topic: str, group: str, path: Path) -> None:
    from confluent_kafka import Consumer, KafkaError, Producer

    stop, consuming = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lock = threading.Lock()
    history = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (closed below)

    def write(**event: Any) -> None:
        with lock:
            history.write(json.dumps(event) + "\n")

    def on_error(client: str) -> Any:
        def report(error: KafkaError) -> None:
            write(
                kind="error",
                client=client,
                code=error.name(),
                fatal=error.fatal(),
                retriable=error.retriable(),
                text=error.str(),
            )

        return report

    def delivered(error: KafkaError | None, message: Any) -> None:
        value = message.value().decode()
        if error is None:
            write(kind="ack", p=message.partition(), o=message.offset(), v=value)
        else:
            write(
                kind="fail",
                p=message.partition(),
                v=value,
                code=error.name(),
                fatal=error.fatal(),
                retriable=error.retriable(),
                text=error.str(),
            )

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 120000,  # retried through leader moves, not given up
            "error_cb": on_error("producer"),
        }
    )
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "auto.commit.interval.ms": 500,
            "error_cb": on_error("consumer"),
        }
    )

    def consume() -> None:
        consumer.subscribe([topic])
        ends: dict[int, int] | None = None
        positions: dict[int, int] = {}
        deadline = float("inf")
        while True:
            if consuming.is_set() and ends is None:  # the producer is done: read to the end
                ends = {
                    p: consumer.get_watermark_offsets(_tp(topic, p), timeout=30)[1]
                    for p in range(PARTITIONS)
                }
                deadline = time.monotonic() + CATCH_UP_TIMEOUT
            if ends is not None and all(positions.get(p, 0) >= e for p, e in ends.items()):
                write(kind="caught-up", ends=ends)
                break
            if time.monotonic() > deadline:
                write(kind="behind", ends=ends, positions=positions)
                break
            message: Any = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                error = message.error()
                write(
                    kind="error",
                    client="consumer",
                    code=error.name(),
                    fatal=error.fatal(),
                    retriable=error.retriable(),
                    text=error.str(),
                )
                continue
            p, o = message.partition(), message.offset()
            write(kind="read", p=p, o=o, v=message.value().decode())
            positions[p] = max(positions.get(p, 0), o + 1)
        consumer.close()

    reader = threading.Thread(target=consume, name="group")
    reader.start()
    sent = 0
    started = time.monotonic()
    while not stop.is_set():
        producer.produce(
            topic, value=b"%08d" % sent, partition=sent % PARTITIONS, on_delivery=delivered
        )
        sent += 1
        producer.poll(max(0.0, started + sent / RATE - time.monotonic()))
    left = producer.flush(FLUSH_TIMEOUT)
    write(kind="flushed", sent=sent, unflushed=left)
    consuming.set()
    reader.join()
    history.close()


def _tp(topic: str, partition: int) -> Any:
    from confluent_kafka import TopicPartition

    return TopicPartition(topic, partition)


# The check --------------------------------------------------------------------------------


@dataclass
class History:
    acked: dict[int, dict[int, str]] = field(default_factory=lambda: defaultdict(dict))
    failed: list[dict[str, Any]] = field(default_factory=list)
    read: list[tuple[int, int, str]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    ends: list[dict[str, Any]] = field(default_factory=list)  # flushed, caught-up, behind

    @classmethod
    def load(cls, path: Path) -> History:
        history = cls()
        for line in path.read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            kind = event["kind"]
            if kind == "ack":
                history.acked[event["p"]][event["o"]] = event["v"]
            elif kind == "read":
                history.read.append((event["p"], event["o"], event["v"]))
            elif kind == "fail":
                history.failed.append(event)
            elif kind == "error":
                history.errors.append(event)
            else:
                history.ends.append(event)
        return history

    def acknowledged(self) -> int:
        return sum(len(offsets) for offsets in self.acked.values())


def check(history: History, log: dict[int, dict[int, str]]) -> dict[str, int]:
    """What the clients saw against `log` (partition -> offset -> value, read back at the
    end): no send failed, no error a client could not retry, nothing acknowledged lost or
    moved, values in send order and each once (idempotence), and the group read every
    acknowledged record and never a value the log does not hold at that offset."""
    assert not history.failed, f"{len(history.failed)} sends failed: {history.failed[:3]}"
    bad = [
        e for e in history.errors if e["fatal"] or not (e["retriable"] or e["code"] in TRANSIENT)
    ]
    assert not bad, f"clients were told of errors they cannot retry: {bad[:5]}"
    kinds = [e["kind"] for e in history.ends]
    assert kinds == ["flushed", "caught-up"], history.ends
    assert history.ends[0]["unflushed"] == 0, history.ends[0]
    lost = [
        (p, o, v)
        for p, offsets in history.acked.items()
        for o, v in offsets.items()
        if log.get(p, {}).get(o) != v
    ]
    assert not lost, f"{len(lost)} acknowledged records lost or moved, e.g. {lost[:5]}"
    for p, offsets in log.items():
        values = [int(offsets[o]) for o in sorted(offsets)]
        assert values == sorted(set(values)), f"partition {p}: values duplicated or reordered"
    diverged = [(p, o, v) for p, o, v in history.read if log.get(p, {}).get(o) != v]
    assert not diverged, f"the group read what the log does not hold: {diverged[:5]}"
    seen = {(p, o) for p, o, _ in history.read}
    unread = [(p, o) for p, offsets in history.acked.items() for o in offsets if (p, o) not in seen]
    assert not unread, f"{len(unread)} acknowledged records never read by the group: {unread[:5]}"
    return {
        "acknowledged": history.acknowledged(),
        "read": len(history.read),
        "read again": len(history.read) - len(set(history.read)),
        **{f"error {code}": n for code, n in Counter(e["code"] for e in history.errors).items()},
    }


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]))
