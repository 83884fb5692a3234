"""KafkaJS (Node.js) against a three-broker cluster: its transactional producer commits and
aborts transactions spanning partitions of two topics, and read_committed consumers of
three clients (confluent-kafka, kafka-python, KafkaJS) see exactly the committed records
in offset order while read_uncommitted ones see them all; its consume-transform-produce
loop puts the group's offsets in the transaction (sendOffsets); and a KafkaJS group
consumer reads what confluent-kafka produced.

The KafkaJS side runs as the small programs of tests/kafkajs/ (request as JSON on stdin,
result as JSON on stdout); `make test` installs Node.js and the pinned KafkaJS."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.cimpl import NewTopic  # what confluent_kafka.admin re-exports, typed

from directlog.records.markers import ABORT, COMMIT
from tests.e2e.cluster import Cluster, eventually
from tests.e2e.conftest import Clients
from tests.e2e.test_transactions import WAIT, raw_log, read_committed, three_brokers

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

pytestmark = pytest.mark.timeout(300)

PROGRAMS = Path(__file__).resolve().parents[1] / "kafkajs"
NODE_WAIT = 120.0  # deadline of one KafkaJS program, group joins and retries included

Partition = tuple[str, int]  # (topic, partition)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with three_brokers(tmp_path_factory.mktemp("kafkajs-cluster")) as started:
        yield started


def kafkajs(program: str, request: dict[str, Any]) -> Any:
    """Runs tests/kafkajs/<program>.js with `request` on stdin: the JSON it prints."""
    node = shutil.which("node")
    assert node is not None, "node is not on PATH (`make test` installs Debian's nodejs)"
    assert (PROGRAMS / "node_modules" / "kafkajs").is_dir(), (
        "KafkaJS is not installed (`make test` runs npm ci in tests/kafkajs)"
    )
    done = subprocess.run(
        [node, str(PROGRAMS / f"{program}.js")],
        input=json.dumps({**request, "deadline_ms": int(NODE_WAIT * 1000)}),
        capture_output=True,
        text=True,
        cwd=PROGRAMS,
        timeout=NODE_WAIT + 30,
        check=False,
    )
    assert done.returncode == 0, f"{program}.js exited {done.returncode}:\n{done.stderr[-6000:]}"
    return json.loads(done.stdout)


def create_topics(clients: Clients, cluster: Cluster, partitions: dict[str, int]) -> None:
    """The topics, every partition on all three brokers (leaders spread over them)."""
    admin = clients.admin(cluster.bootstrap)
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=n, replication_factor=3) for t, n in partitions.items()],
        operation_timeout=20,
    )
    for future in futures.values():
        future.result(timeout=WAIT)


def leaders(clients: Clients, cluster: Cluster, topic: str) -> dict[int, str]:
    """The address of each partition's leader."""
    found = clients.admin(cluster.bootstrap).list_topics(topic, timeout=WAIT).topics[topic]
    return {p: cluster.brokers[m.leader].bootstrap for p, m in found.partitions.items()}


def kafka_python_read(
    bootstrap: str, ends: dict[Partition, int], isolation: str
) -> dict[Partition, list[tuple[int, bytes]]]:
    """(offset, value) of every record a kafka-python consumer with `isolation` gets from
    each partition before its position reaches the partition's end."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False
    )
    try:
        partitions = {KTopicPartition(t, p): (t, p) for t, p in ends}
        consumer.assign(list(partitions))
        consumer.seek_to_beginning(*partitions)
        got: dict[Partition, list[tuple[int, bytes]]] = {name: [] for name in ends}
        deadline = time.monotonic() + WAIT
        while True:
            positions = {n: consumer.position(tp) for tp, n in partitions.items()}
            short = {n: at for n, at in positions.items() if at < ends[n]}
            if not short:
                return got
            assert time.monotonic() < deadline, f"positions short of the end: {short}"
            for tp, records in consumer.poll(timeout_ms=500).items():
                got[partitions[tp]].extend((r.offset, r.value) for r in records)
    finally:
        consumer.close()


def high_watermarks(bootstrap: str, partitions: list[Partition]) -> dict[Partition, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        ends = consumer.end_offsets([KTopicPartition(t, p) for t, p in partitions])
        return {(tp.topic, tp.partition): int(end) for tp, end in ends.items()}
    finally:
        consumer.close()


def by_partition(records: list[dict[str, Any]]) -> dict[Partition, list[tuple[int, bytes]]]:
    """A KafkaJS program's records, (offset, value) per partition in the order it got them."""
    got: dict[Partition, list[tuple[int, bytes]]] = {}
    for r in records:
        got.setdefault((r["topic"], r["partition"]), []).append((r["offset"], r["value"].encode()))
    return got


def test_kafkajs_transactions_over_partitions_of_two_topics(
    cluster: Cluster, clients: Clients
) -> None:
    """A committed, an aborted and a committed transaction, each over all seven partitions
    of two topics with a different record count per partition (every partition ends at
    offset 9: six records and three markers)."""
    tag = uuid.uuid4().hex[:6]
    first, second = f"kjs-a-{tag}", f"kjs-b-{tag}"
    partitions = {first: 4, second: 3}
    create_topics(clients, cluster, partitions)
    # Records of each partition in the three transactions, in order.
    counts = {
        **{(first, p): (1 + p, 4 - p, 1) for p in range(4)},
        **{(second, p): (3 - p, 1 + p, 2) for p in range(3)},
    }
    ends = ("commit", "abort", "commit")
    labels = ("c1", "ab", "c2")
    transactions = [
        {
            "end": end,
            "messages": [
                {"topic": t, "partition": p, "key": f"k{i}", "value": f"{label}-{t}-{p}-{i}"}
                for (t, p), n in counts.items()
                for i in range(n[number])
            ],
        }
        for number, (end, label) in enumerate(zip(ends, labels, strict=True))
    ]
    result = kafkajs(
        "transactional_produce",
        {
            "brokers": cluster.bootstrap.split(","),
            "transactional_id": f"kjs-tx-{tag}",
            "transactions": transactions,
        },
    )

    # The layout each partition must have: the records of each transaction, then its marker.
    stored: dict[Partition, list[tuple[int, bool, int | None, bytes | None]]] = {}
    base_offsets: list[dict[Partition, int]] = [{}, {}, {}]
    committed: dict[Partition, list[tuple[int, bytes]]] = {}
    for name, per_transaction in counts.items():
        layout: list[tuple[int, bool, int | None, bytes | None]] = []
        for number, n in enumerate(per_transaction):
            base_offsets[number][name] = len(layout)
            for i in range(n):
                value = f"{labels[number]}-{name[0]}-{name[1]}-{i}".encode()
                layout.append((len(layout), False, None, value))
            marker = COMMIT if ends[number] == "commit" else ABORT
            layout.append((len(layout), True, marker, None))
        stored[name] = layout
        committed[name] = [
            (o, v)
            for o, control, _, v in layout
            if not control and v is not None and not v.startswith(b"ab-")
        ]
        assert len(layout) == 9
    everything = {
        name: [(o, v) for o, c, _, v in layout if not c] for name, layout in stored.items()
    }

    assert [t["end"] for t in result["transactions"]] == list(ends)
    for number, transaction in enumerate(result["transactions"]):
        sent = {(s["topic"], s["partition"]): s["base_offset"] for s in transaction["sent"]}
        assert sent == base_offsets[number], f"transaction {number}"

    # As stored on each leader (a raw read_uncommitted Fetch): records and markers, the
    # last marker once the coordinator wrote it (after answering the commit).
    for topic, count in partitions.items():
        addresses = leaders(clients, cluster, topic)
        assert len(set(addresses.values())) == min(count, 3), addresses
        for p in range(count):

            def check(address: str = addresses[p], name: Partition = (topic, p)) -> None:
                got = [(o, c, m, None if c else v) for o, c, m, v in raw_log(address, *name)]
                assert got == stored[name]

            eventually(check, f"the log of {topic}/{p}", WAIT)

    for topic, count in partitions.items():
        seen = read_committed(clients, cluster.bootstrap, topic, count, 9)
        assert {(topic, p): records for p, records in seen.items()} == {
            (topic, p): committed[(topic, p)] for p in range(count)
        }
    ends_at = dict.fromkeys(counts, 9)
    assert kafka_python_read(cluster.bootstrap, ends_at, "read_committed") == committed
    assert kafka_python_read(cluster.bootstrap, ends_at, "read_uncommitted") == everything

    for isolation, expected in (("committed", committed), ("uncommitted", everything)):
        got = kafkajs(
            "group_consume",
            {
                "brokers": cluster.bootstrap.split(","),
                "group_id": f"kjs-read-{isolation}-{tag}",
                "topics": list(partitions),
                "count": sum(len(records) for records in expected.values()),
                "read_uncommitted": isolation == "uncommitted",
            },
        )
        assert by_partition(got["records"]) == expected, f"KafkaJS read_{isolation}"


def test_kafkajs_consume_transform_produce_commits_offsets_with_the_transaction(
    cluster: Cluster, clients: Clients
) -> None:
    """KafkaJS reads a topic in a group and writes each batch, transformed, in a
    transaction carrying the group's offsets (sendOffsets); its first batch goes once in a
    transaction it aborts, whose offsets the group never gets. read_committed sees each
    source record transformed exactly once, read_uncommitted the aborted copies too, and
    the group's committed offsets end as the source's ends."""
    tag = uuid.uuid4().hex[:6]
    source, sink, group = f"kjs-in-{tag}", f"kjs-out-{tag}", f"kjs-ctp-{tag}"
    create_topics(clients, cluster, {source: 2, sink: 2})
    values = {p: [f"s-{p}-{i}" for i in range(5)] for p in range(2)}
    clients.produce_all(
        clients.producer(cluster.bootstrap, {"acks": "all"}),
        source,
        [{"value": v.encode(), "partition": p} for p in values for v in values[p]],
    )

    result = kafkajs(
        "consume_transform_produce",
        {
            "brokers": cluster.bootstrap.split(","),
            "group_id": group,
            "transactional_id": f"kjs-ctp-tx-{tag}",
            "source": source,
            "sink": sink,
            "count": 10,
        },
    )
    assert result["aborted"] == 1 and result["committed"] >= 1, result
    consumed: dict[int, list[tuple[int, str]]] = {0: [], 1: []}
    for record in result["consumed"]:
        consumed[record["partition"]].append((record["offset"], record["value"]))
    assert consumed == {p: list(enumerate(values[p])) for p in range(2)}
    aborted_values = result["aborted_values"]
    # Read once the abort was complete: its offsets never became the group's.
    assert sorted((o["partition"], o["offset"]) for o in result["offsets_after_abort"]) == [
        (0, -1),
        (1, -1),
    ]
    assert aborted_values and any(
        aborted_values == values[p][: len(aborted_values)] for p in range(2)
    ), aborted_values

    sink_partitions = [(sink, 0), (sink, 1)]
    ends = high_watermarks(cluster.bootstrap, sink_partitions)
    committed = kafka_python_read(cluster.bootstrap, ends, "read_committed")
    assert {name: [v for _, v in got] for name, got in committed.items()} == {
        (sink, p): [f"out({v})".encode() for v in values[p]] for p in range(2)
    }
    uncommitted = kafka_python_read(cluster.bootstrap, ends, "read_uncommitted")
    assert sorted(
        v for got in uncommitted.values() for _, v in got if v.startswith(b"aborted(")
    ) == sorted(f"aborted({v})".encode() for v in aborted_values)
    assert {
        name: [v for _, v in got if not v.startswith(b"aborted(")]
        for name, got in uncommitted.items()
    } == {name: [v for _, v in got] for name, got in committed.items()}

    consumer = clients.consumer(cluster.bootstrap, {"group.id": group})
    deadline = time.monotonic() + WAIT
    while True:  # the offsets take effect once the commit's markers are written
        offsets = consumer.committed([CTopicPartition(source, p) for p in range(2)], timeout=WAIT)
        if [tp.offset for tp in offsets] == [5, 5]:
            break
        assert time.monotonic() < deadline, [tp.offset for tp in offsets]
        time.sleep(0.2)


def test_a_kafkajs_group_consumer_reads_what_confluent_kafka_produced(
    cluster: Cluster, clients: Clients
) -> None:
    """An idempotent confluent-kafka producer writes keyed records over three partitions;
    a KafkaJS group member gets each exactly once, in offset order per partition, and the
    offsets it commits are the group's for confluent-kafka too."""
    tag = uuid.uuid4().hex[:6]
    topic, group = f"kjs-group-{tag}", f"kjs-group-{tag}"
    create_topics(clients, cluster, {topic: 3})
    producer = clients.producer(cluster.bootstrap, {"enable.idempotence": True})
    reports = clients.produce_all(
        producer,
        topic,
        [{"key": f"key-{i % 7}".encode(), "value": f"value-{i}".encode()} for i in range(60)],
    )
    produced: dict[Partition, list[tuple[int, bytes]]] = {}
    keys: dict[tuple[int, int], str] = {}
    for error, message in reports:
        assert error is None, error
        partition, offset, key, value = (
            message.partition(),
            message.offset(),
            message.key(),
            message.value(),
        )
        assert partition is not None and offset is not None and key and value
        produced.setdefault((topic, partition), []).append((offset, value))
        keys[(partition, offset)] = key.decode()
    produced = {name: sorted(records) for name, records in produced.items()}
    assert len(produced) == 3, produced.keys()

    got = kafkajs(
        "group_consume",
        {
            "brokers": cluster.bootstrap.split(","),
            "group_id": group,
            "topics": [topic],
            "count": 60,
        },
    )
    assert by_partition(got["records"]) == produced
    assert {(r["partition"], r["offset"]): r["key"] for r in got["records"]} == keys
    committed = {(c["topic"], c["partition"]): c["offset"] for c in got["committed"]}
    assert committed == {name: records[-1][0] + 1 for name, records in produced.items()}
    consumer = clients.consumer(cluster.bootstrap, {"group.id": group})
    offsets = consumer.committed([CTopicPartition(topic, p) for p in range(3)], timeout=WAIT)
    assert {(tp.topic, tp.partition): tp.offset for tp in offsets} == committed
