"""An exactly-once consume-transform-produce processor, as a stream job runs one: a
read_committed consumer in a group, a transactional producer, and each batch's output and
input offsets committed in one transaction (`send_offsets_to_transaction`).

    python -m tests.e2e.eos_processor BOOTSTRAP SOURCE SINK GROUP TRANSACTIONAL_ID

It transforms `in-N` into `out-N`, a few records a transaction with a pause between
transactions, so a test can kill it, its transaction coordinator or a partition leader in
the middle. On any error it exits non-zero, as a job whose client gave up, and its
supervisor starts it again: the new instance fences the old one's epoch (InitProducerId
aborts whatever it left open) and resumes from the group's committed offsets.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer

BATCH = 5
PAUSE = 0.5  # seconds between transactions: a run long enough to kill things in
TIMEOUT = 30.0


def run(bootstrap: str, source: str, sink: str, group: str, transactional_id: str) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 10000,
            "linger.ms": 5,
        }
    )
    producer.init_transactions(TIMEOUT)
    consumer.subscribe([source])
    while True:
        batch = consumer.consume(BATCH, 1.0)
        records = [m for m in batch if m.error() is None]
        errors = [m.error() for m in batch if m.error() is not None]
        if errors:
            raise KafkaException(errors[0])
        if not records:
            continue
        producer.begin_transaction()
        for message in records:
            value = message.value()
            assert value is not None and value.startswith(b"in-"), value
            producer.produce(sink, value=b"out-" + value[3:], key=message.key())
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()),
            consumer.consumer_group_metadata(),
            TIMEOUT,
        )
        producer.commit_transaction(TIMEOUT)
        print(f"committed {len(records)}", flush=True)
        time.sleep(PAUSE)


if __name__ == "__main__":
    try:
        run(*sys.argv[1:6])
    except KafkaException as error:
        print(f"giving up: {error}", file=sys.stderr, flush=True)
        sys.exit(1)
