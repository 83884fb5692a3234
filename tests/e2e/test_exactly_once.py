"""Exactly-once consume-transform-produce across three brokers, under the faults a stream
job meets: the processor SIGKILLed mid transaction, then its transaction coordinator's
broker, then the leader of an output partition, each while it works. The processor
(tests/e2e/eos_processor.py) is restarted whenever it exits, as Kubernetes restarts a job's
pod. Afterwards the output, read with read_committed, holds every input exactly once:
no output of an aborted or fenced transaction, none lost, and no input processed twice
into committed output (its offsets commit in the same transaction as its output)."""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.service_process import REPO_ROOT
from tests.e2e.test_transactions import coordinator_of

INPUTS = 800
PARTITIONS = 3
TIMEOUT = 120.0  # for each stage, on a loaded two-core machine
SETTINGS = {
    "transaction_state_log_num_partitions": 3,
    "transaction_abort_timed_out_transaction_cleanup_interval_ms": 500,
}


class Supervisor:
    """Runs the processor, and starts it again whenever it exits, until stopped."""

    def __init__(self, work_dir: Path, args: list[str]) -> None:
        self.work_dir, self.args = work_dir, args
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._supervise, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _supervise(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self.process is None or self.process.poll() is not None:
                    with open(self.work_dir / f"processor-{self.starts}.log", "wb") as log:
                        self.process = subprocess.Popen(
                            [sys.executable, "-m", "tests.e2e.eos_processor", *self.args],
                            cwd=REPO_ROOT,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                        )
                    self.starts += 1
            time.sleep(0.2)

    def kill(self) -> None:
        with self._lock:
            assert self.process is not None
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def committed_output(bootstrap: str, sink: str) -> list[bytes]:
    """The records a read_committed consumer reads from the sink until it has been at the
    stable end of each partition once (all of them, once the processor is idle)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(sink, p, 0) for p in range(PARTITIONS)])
        values: list[bytes] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + TIMEOUT
        while len(at_end) < PARTITIONS:
            assert time.monotonic() < deadline, f"read {len(values)}, ends {at_end}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                continue
            values.append(message.value())
        return values
    finally:
        consumer.close()


def progress(bootstrap: str, sink: str, beyond: int) -> int:
    """Wait until the committed output holds more than `beyond` records; how many. The
    processor must not be done yet, or the next fault would hit nothing."""
    found = 0

    def more() -> bool:
        nonlocal found
        found = len(committed_output(bootstrap, sink))
        return found > beyond

    wait_for(more, TIMEOUT, f"committed output beyond {beyond}")
    assert found < INPUTS, "the processor finished before the faults: slow it down"
    return found


@pytest.mark.timeout(900)
def test_every_input_is_in_the_output_exactly_once_through_kills(tmp_path: Path) -> None:
    with Cluster(tmp_path, brokers=3, broker_settings=SETTINGS) as cluster:
        source, sink = "eos-in", "eos-out"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        topics = [
            NewTopic(t, num_partitions=PARTITIONS, replication_factor=3, config=c)
            for t, c in ((source, {}), (sink, {"min.insync.replicas": "2"}))
        ]
        for future in admin.create_topics(topics).values():
            future.result(timeout=TIMEOUT)
        inputs = [f"in-{i:05d}".encode() for i in range(INPUTS)]
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        for value in inputs:
            producer.produce(source, value=value, key=value)
        assert producer.flush(TIMEOUT) == 0

        transactional_id = f"eos-{uuid.uuid4().hex[:6]}"
        supervisor = Supervisor(
            tmp_path, [cluster.bootstrap, source, sink, "eos-group", transactional_id]
        )
        supervisor.start()
        try:
            done = progress(cluster.bootstrap, sink, 100)
            supervisor.kill()  # the processor, mid transaction or between two

            done = progress(cluster.bootstrap, sink, done)
            coordinator = cluster.brokers[coordinator_of(cluster.bootstrap, transactional_id)]
            coordinator.kill()
            done = progress(cluster.bootstrap, sink, done)
            coordinator.start()

            leaders = admin.list_topics(sink, timeout=10).topics[sink].partitions
            leader = cluster.brokers[leaders[0].leader]
            leader.kill()
            done = progress(cluster.bootstrap, sink, done)
            leader.start()

            wait_for(
                lambda: len(committed_output(cluster.bootstrap, sink)) >= INPUTS,
                4 * TIMEOUT,
                "every input processed",
            )
            time.sleep(2)  # a duplicate committed late would show now
            output = committed_output(cluster.bootstrap, sink)
        finally:
            supervisor.stop()
        expected = collections.Counter(b"out-" + v[3:] for v in inputs)
        got = collections.Counter(output)
        assert got == expected, (
            f"missing {sorted(expected - got)[:10]}, twice {sorted(got - expected)[:10]}, "
            f"processor starts {supervisor.starts}"
        )
        assert supervisor.starts >= 2
