"""Reads and writes the `directlog` data source refuses while Spark plans them, before any
Spark job runs, with an error naming the option or column at fault; and failOnDataLoss
over records removed by DeleteRecords (refused when true, skipped when false).

The topic `bad` has 2 partitions of 10 records each; `bad-writes` stays empty.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from confluent_kafka import TopicPartition

from tests.e2e.broker import BrokerProcess
from tests.e2e.conftest import Clients
from tests.e2e.records import recent_base_timestamp
from tests.spark.frames import Record, load, read_cases, refused

pytestmark = pytest.mark.timeout(120)

TOPIC = "bad"
WRITES = "bad-writes"
PER_PARTITION = 10
FUTURE = 4_102_444_800_000  # 2100-01-01, after every record


def _produce(clients: Clients, bootstrap: str, topic: str) -> list[Record]:
    base = recent_base_timestamp()
    records = [
        Record(topic, p, i, b"k%d" % i, b"%s/%d/%d" % (topic.encode(), p, i), base + 10 * i, 0)
        for p in range(2)
        for i in range(PER_PARTITION)
    ]
    clients.create_topic(bootstrap, topic, 2)
    reports = clients.produce_all(
        clients.producer(bootstrap),
        topic,
        [
            {"key": r.key, "value": r.value, "partition": r.partition, "timestamp": r.timestamp_ms}
            for r in records
        ],
    )
    assert sorted((e, m.partition(), m.offset()) for e, m in reports) == [
        (None, r.partition, r.offset) for r in records
    ]
    return records


@pytest.fixture(scope="module")
def topics(module_broker: BrokerProcess) -> Iterator[list[Record]]:
    clients = Clients()
    records = _produce(clients, module_broker.bootstrap, TOPIC)
    clients.create_topic(module_broker.bootstrap, WRITES, 1)
    yield records


def offsets(by_partition: dict[int, int], topic: str = TOPIC) -> str:
    return json.dumps({topic: {str(p): o for p, o in by_partition.items()}})


EXACTLY_ONE = (
    r"exactly one of the options 'subscribe', 'subscribePattern' and 'assign' must be given "
)

READS = {
    "unknown option": (
        {"subscribe": TOPIC, "startingOffset": "earliest"},  # startingOffsets, mistyped
        r"unknown option 'startingoffset' for the directlog data source",
    ),
    "no subscription": ({}, EXACTLY_ONE + r"\(got 0\)"),
    "subscribe and assign": (
        {"subscribe": TOPIC, "assign": '{"bad": [0]}'},
        EXACTLY_ONE + r"\(got 2\)",
    ),
    "subscribe and subscribePattern": (
        {"subscribe": TOPIC, "subscribePattern": "ba.*"},
        EXACTLY_ONE + r"\(got 2\)",
    ),
    "assign not JSON": ({"assign": '{"bad": [0,'}, r"option 'assign' is not valid JSON: "),
    "assign a list": ({"assign": '["bad"]'}, r"option 'assign' must be JSON like "),
    "assign partitions not a list": (
        {"assign": '{"bad": 0}'},
        r"option 'assign': partitions of 'bad' must be a list of ints",
    ),
    "startingOffsets not JSON": (
        {"subscribe": TOPIC, "startingOffsets": '{"bad": {"0": }}'},
        r"option 'startingOffsets' is not valid JSON: ",
    ),
    "startingOffsets a string offset": (
        {"subscribe": TOPIC, "startingOffsets": '{"bad": {"0": "3", "1": 0}}'},
        r"option 'startingOffsets': bad-0 has '3', not an int >= -2",
    ),
    "startingOffsets latest": (
        {"subscribe": TOPIC, "startingOffsets": "latest"},
        r"option 'startingOffsets' may not be 'latest' for batch queries",
    ),
    "startingOffsets -1": (
        {"subscribe": TOPIC, "startingOffsets": offsets({0: -1, 1: 0})},
        r"option 'startingOffsets' may not use -1 \(latest\) for batch queries",
    ),
    "endingOffsets earliest": (
        {"subscribe": TOPIC, "endingOffsets": "earliest"},
        r"option 'endingOffsets' may not be earliest \(-2\)",
    ),
    "subscribed topic missing": (
        {"subscribe": f"{TOPIC},no-such-topic"},
        r"option 'subscribe': topic 'no-such-topic' does not exist",
    ),
    "assigned topic missing": (
        {"assign": '{"no-such-topic": [0]}'},
        r"option 'assign': topic 'no-such-topic' does not exist",
    ),
    "assigned partition missing": (
        {"assign": '{"bad": [0, 2]}'},
        r"option 'assign': no partitions \[\('bad', 2\)\]",
    ),
    "startingOffsets beyond the log end": (
        {"subscribe": TOPIC, "startingOffsets": offsets({0: 11, 1: 0})},
        r"option 'startingOffsets': offset 11 of bad-0 is beyond the log end 10",
    ),
    "endingOffsets beyond the log end": (
        {"subscribe": TOPIC, "endingOffsets": offsets({0: 10, 1: 12})},
        r"option 'endingOffsets': offset 12 of bad-1 is beyond the log end 10",
    ),
    "endingOffsets before the start": (
        {
            "subscribe": TOPIC,
            "startingOffsets": offsets({0: 6, 1: 0}),
            "endingOffsets": offsets({0: 5, 1: -1}),
        },
        r"option 'endingOffsets': bad-0 would end at 5, before its start 6",
    ),
    "endingTimestamp before the start": (
        {
            "subscribe": TOPIC,
            "startingOffsets": offsets({0: 0, 1: 8}),
            "endingTimestamp": "0",  # every partition ends at its first record
        },
        r"option 'endingOffsets': bad-1 would end at 0, before its start 8",
    ),
    "startingOffsets leave out a partition": (
        {"subscribe": TOPIC, "startingOffsets": offsets({0: 1})},
        r"option 'startingOffsets' leaves out partitions read: \[\('bad', 1\)\]",
    ),
    "endingOffsets leave out a partition": (
        {"subscribe": TOPIC, "endingOffsets": offsets({1: 1})},
        r"option 'endingOffsets' leaves out partitions read: \[\('bad', 0\)\]",
    ),
    "startingOffsetsByTimestamp leave out a partition": (
        {"subscribe": TOPIC, "startingOffsetsByTimestamp": offsets({0: 0})},
        r"option 'startingOffsetsByTimestamp' leaves out partitions read: \[\('bad', 1\)\]",
    ),
    "startingOffsets name a partition not read": (
        {"assign": '{"bad": [0]}', "startingOffsets": offsets({0: 0, 1: 0})},
        r"option 'startingOffsets' names partitions not read: \[\('bad', 1\)\]",
    ),
    "startingTimestamp after every record": (
        {"subscribe": TOPIC, "startingTimestamp": str(FUTURE)},
        rf"option 'startingTimestamp': bad-0 has no record at or after timestamp {FUTURE} ",
    ),
    "startingOffsetsByTimestampStrategy unknown": (
        {"subscribe": TOPIC, "startingOffsetsByTimestampStrategy": "earliest"},
        r"option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', not 'earliest'",
    ),
    "minPartitions 0": (
        {"subscribe": TOPIC, "minPartitions": "0"},
        r"option 'minPartitions' must be >= 1, not 0",
    ),
    "failOnDataLoss not a flag": (
        {"subscribe": TOPIC, "failOnDataLoss": "yes"},
        r"option 'failOnDataLoss' must be true or false, not 'yes'",
    ),
    "no bootstrap servers": (
        {"subscribe": TOPIC, "kafka.bootstrap.servers": ""},
        r"option 'kafka.bootstrap.servers' must be given",
    ),
    "kafka.auto.offset.reset": (
        {"subscribe": TOPIC, "kafka.auto.offset.reset": "earliest"},
        r"option 'kafka.auto.offset.reset' is not supported",
    ),
}


@pytest.mark.parametrize("case", list(READS))
def test_bad_read_fails_while_planning(spark, module_broker, topics, case):
    options, message = READS[case]
    got = refused(spark, lambda: load(spark, module_broker.bootstrap, options).collect())
    assert re.match(message, got), got


WRITES_REFUSED = {
    "value an int": (
        "value int",
        {"topic": WRITES},
        r"column 'value' is int; it must be binary or string",
    ),
    "no value column": (
        "key string",
        {"topic": WRITES},
        r"a DataFrame written to directlog needs a 'value' column",
    ),
    "no topic at all": (
        "key string, value string",
        {},
        r"give the 'topic' option or a 'topic' column",
    ),
    "key an int": (
        "key int, value string",
        {"topic": WRITES},
        r"column 'key' is int; it must be binary or string",
    ),
    "topic an int": ("value string, topic int", {}, r"column 'topic' is int; it must be string"),
    "partition a bigint": (
        "value string, partition bigint",
        {"topic": WRITES},
        r"column 'partition' is bigint; it must be int",
    ),
    "headers of strings": (
        "value string, headers array<struct<key:string,value:string>>",
        {"topic": WRITES},
        r"column 'headers' is array<struct<key:string,value:string>>; it must be "
        r"array<struct<key:string,value:binary>>",
    ),
}


@pytest.mark.parametrize("case", list(WRITES_REFUSED))
def test_bad_write_fails_while_planning(spark, module_broker, topics, clients, case):
    schema, options, message = WRITES_REFUSED[case]
    frame = spark.createDataFrame([], schema)
    writer = (
        frame.write.format("directlog")
        .option("kafka.bootstrap.servers", module_broker.bootstrap)
        .options(**options)
        .mode("append")
    )
    got = refused(spark, writer.save)
    assert re.match(message, got), got
    consumer = clients.consumer(module_broker.bootstrap)
    assert consumer.get_watermark_offsets(TopicPartition(WRITES, 0), timeout=10) == (0, 0)


def test_fail_on_data_loss_after_delete_records(spark, module_broker, clients):
    """Offsets 0-3 of purged-0 deleted: a start at 1 is refused while failOnDataLoss is true
    (the default) and starts at 4 when false; earliest starts at 4 either way."""
    bootstrap = module_broker.bootstrap
    topic = "purged"
    records = _produce(clients, bootstrap, topic)
    admin = clients.admin(bootstrap)
    (future,) = admin.delete_records([TopicPartition(topic, 0, 4)], request_timeout=15).values()
    assert future.result(timeout=20).low_watermark == 4

    below = {"subscribe": topic, "startingOffsets": offsets({0: 1, 1: 0}, topic)}
    message = (
        "option 'startingOffsets': offsets 1 to 3 of purged-0 were deleted (retention or "
        "DeleteRecords); set failOnDataLoss to false to start at the earliest offset left"
    )
    for options in (below, {**below, "failOnDataLoss": "true"}):
        assert refused(spark, lambda o=options: load(spark, bootstrap, o).collect()) == message

    got = read_cases(
        spark,
        bootstrap,
        {
            "skip": {**below, "failOnDataLoss": "false"},
            "earliest": {"subscribe": topic},
            "earliest-strict": {"subscribe": topic, "failOnDataLoss": "true"},
        },
    )

    left = [r for r in records if r.partition == 1 or r.offset >= 4]
    assert len(left) == 16
    assert got == {"skip": left, "earliest": left, "earliest-strict": left}


def test_overwrite_is_refused(spark, module_broker, topics, clients):
    """A log is only appended to: Spark's Kafka writer refuses mode overwrite, and so does
    this one, before anything is sent."""
    frame = spark.createDataFrame([("v",)], "value string")
    writer = (
        frame.write.format("directlog")
        .option("kafka.bootstrap.servers", module_broker.bootstrap)
        .option("topic", WRITES)
        .mode("overwrite")
    )
    got = refused(spark, writer.save)
    assert "a topic cannot be overwritten" in got, got
    consumer = clients.consumer(module_broker.bootstrap)
    assert consumer.get_watermark_offsets(TopicPartition(WRITES, 0), timeout=10) == (0, 0)
