"""Topic administration, configs, offsets by timestamp, cluster description and the
Prometheus metrics page, through confluent-kafka's AdminClient against a real broker; list
configs' APPEND and SUBTRACT, manual replica assignments (on three brokers) and old
producers' records without timestamps, through confluent-kafka and kafka-python as Kafka 3.7
answers them."""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from directlog.protocol.errors import ErrorCode
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.records import raw_request

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import AlterConfigOp as KAlterConfigOp
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType as KConfigResourceType
    from kafka.admin import NewPartitions as KNewPartitions
    from kafka.admin import NewTopic as KNewTopic
    from kafka.protocol.admin import DeleteRecordsRequest, IncrementalAlterConfigsRequest

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 15  # seconds, for each admin future
RETENTION_MS_DEFAULT = "604800000"
SEGMENT_BYTES_DEFAULT = "1073741824"


def fails_with(future: Future[Any]) -> int:
    """The Kafka error code a future failed with (it must fail)."""
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=TIMEOUT)
    error = raised.value.args[0]
    assert isinstance(error, KafkaError)
    return int(error.code())


def partition_counts(admin: Any) -> dict[str, int]:
    """Every topic the broker lists, with its partition count (no auto-creation)."""
    metadata = admin.list_topics(timeout=TIMEOUT)
    for topic in metadata.topics.values():
        assert topic.error is None, topic.error
    return {name: len(t.partitions) for name, t in metadata.topics.items()}


def create(admin: Any, *topics: NewTopic) -> dict[str, Future[Any]]:
    return admin.create_topics(list(topics), operation_timeout=10, request_timeout=TIMEOUT)


def describe_topic(admin: Any, topic: str) -> dict[str, Any]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    (future,) = admin.describe_configs([resource], request_timeout=TIMEOUT).values()
    return future.result(timeout=TIMEOUT)


def alter_topic(admin: Any, topic: str, *entries: ConfigEntry) -> Future[Any]:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=list(entries))
    (future,) = admin.incremental_alter_configs([resource], request_timeout=TIMEOUT).values()
    return future


# Topics -------------------------------------------------------------------------------


def test_create_topics(module_broker, clients, topic_name):
    admin = clients.admin(module_broker.bootstrap)
    wanted = {topic_name("one"): 1, topic_name("three"): 3, topic_name("eight"): 8}
    futures = create(admin, *(NewTopic(t, num_partitions=n) for t, n in wanted.items()))
    assert sorted(futures) == sorted(wanted)
    for future in futures.values():
        assert future.result(timeout=TIMEOUT) is None
    listed = partition_counts(admin)
    assert {t: listed.get(t) for t in wanted} == wanted
    # validate_only checks and creates nothing.
    dry = topic_name("dry-run")
    futures = admin.create_topics(
        [NewTopic(dry, num_partitions=2)], validate_only=True, request_timeout=TIMEOUT
    )
    assert futures[dry].result(timeout=TIMEOUT) is None
    assert dry not in partition_counts(admin)
    # Partition ids are 0..n-1, each led by the one broker.
    metadata = admin.list_topics(timeout=TIMEOUT)
    for topic, count in wanted.items():
        partitions = metadata.topics[topic].partitions
        assert sorted(partitions) == list(range(count))
        assert {(p.leader, tuple(p.replicas), tuple(p.isrs)) for p in partitions.values()} == {
            (0, (0,), (0,))
        }


def test_create_existing_topic_fails(module_broker, clients, topic_name):
    admin = clients.admin(module_broker.bootstrap)
    topic = topic_name("twice")
    create(admin, NewTopic(topic, num_partitions=2))[topic].result(timeout=TIMEOUT)
    again = create(admin, NewTopic(topic, num_partitions=5))[topic]
    assert fails_with(again) == KafkaError.TOPIC_ALREADY_EXISTS
    assert partition_counts(admin)[topic] == 2  # unchanged


@pytest.mark.parametrize(
    "name",
    ["has space", "slash/ed", "star*", "a" * 250, "..", "."],
    ids=["space", "slash", "star", "too-long", "dotdot", "dot"],
)
def test_invalid_topic_name_fails(module_broker, clients, name):
    admin = clients.admin(module_broker.bootstrap)
    future = create(admin, NewTopic(name, num_partitions=1))[name]
    assert fails_with(future) == KafkaError.TOPIC_EXCEPTION  # INVALID_TOPIC_EXCEPTION, 17
    assert name not in partition_counts(admin)


def test_replication_factor_3_fails_on_one_broker(module_broker, clients, topic_name):
    admin = clients.admin(module_broker.bootstrap)
    topic = topic_name("rf3")
    future = create(admin, NewTopic(topic, num_partitions=1, replication_factor=3))[topic]
    assert fails_with(future) == KafkaError.INVALID_REPLICATION_FACTOR
    assert topic not in partition_counts(admin)


def test_delete_topics(module_broker, clients, topic_name):
    admin = clients.admin(module_broker.bootstrap)
    doomed, kept = [topic_name("doomed-a"), topic_name("doomed-b")], topic_name("kept")
    for future in create(admin, *(NewTopic(t, 2) for t in [*doomed, kept])).values():
        future.result(timeout=TIMEOUT)
    assert set(doomed) | {kept} <= set(partition_counts(admin))

    futures = admin.delete_topics(doomed, operation_timeout=10, request_timeout=TIMEOUT)
    for future in futures.values():
        assert future.result(timeout=TIMEOUT) is None
    listed = partition_counts(admin)
    assert not set(doomed) & set(listed)
    assert listed[kept] == 2

    missing = topic_name("never-was")
    for name in (missing, doomed[0]):
        (future,) = admin.delete_topics([name], request_timeout=TIMEOUT).values()
        assert fails_with(future) == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_recreated_topic_starts_empty(module_broker, clients, topic_name):
    admin = clients.admin(module_broker.bootstrap)
    topic = topic_name("reborn")
    create(admin, NewTopic(topic, 1))[topic].result(timeout=TIMEOUT)
    producer = clients.producer(module_broker.bootstrap)
    old = [{"value": f"old {i}".encode()} for i in range(50)]
    assert [m.offset() for _, m in clients.produce_all(producer, topic, old)] == list(range(50))

    (future,) = admin.delete_topics([topic], request_timeout=TIMEOUT).values()
    future.result(timeout=TIMEOUT)
    create(admin, NewTopic(topic, 2))[topic].result(timeout=TIMEOUT)
    assert partition_counts(admin)[topic] == 2

    new = [{"value": f"new {i}".encode(), "partition": 0} for i in range(5)]
    reports = clients.produce_all(clients.producer(module_broker.bootstrap), topic, new)
    assert [(e, m.offset()) for e, m in reports] == [(None, i) for i in range(5)]
    consumer = clients.consumer(module_broker.bootstrap)
    clients.assign_from(consumer, topic, [0])
    got = [(m.offset(), m.value()) for m in clients.consume(consumer, 5)]
    assert got == [(i, f"new {i}".encode()) for i in range(5)]
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT) == (0, 5)


def test_create_partitions(module_broker, clients, topic_name):
    admin = clients.admin(module_broker.bootstrap)
    topic = topic_name("grow")
    create(admin, NewTopic(topic, num_partitions=1))[topic].result(timeout=TIMEOUT)

    (future,) = admin.create_partitions(
        [NewPartitions(topic, 4)], validate_only=True, request_timeout=TIMEOUT
    ).values()
    assert future.result(timeout=TIMEOUT) is None
    assert partition_counts(admin)[topic] == 1  # only validated

    (future,) = admin.create_partitions([NewPartitions(topic, 4)], request_timeout=TIMEOUT).values()
    assert future.result(timeout=TIMEOUT) is None
    assert partition_counts(admin)[topic] == 4

    # The new partitions take records.
    producer = clients.producer(module_broker.bootstrap)
    records = [{"value": f"p{p}".encode(), "partition": p} for p in range(4)]
    reports = clients.produce_all(producer, topic, records)
    assert sorted((e, m.partition(), m.offset()) for e, m in reports) == [
        (None, p, 0) for p in range(4)
    ]

    for count in (2, 4):  # fewer, or as many: not an increase
        (future,) = admin.create_partitions(
            [NewPartitions(topic, count)], request_timeout=TIMEOUT
        ).values()
        assert fails_with(future) == KafkaError.INVALID_PARTITIONS
    assert partition_counts(admin)[topic] == 4


# Configs ------------------------------------------------------------------------------


def test_describe_configs_defaults_and_overrides(module_broker, clients, topic_name):
    admin = clients.admin(module_broker.bootstrap)
    plain, custom = topic_name("plain"), topic_name("custom")
    overrides = {"retention.ms": "3600000", "segment.bytes": "1048576", "preallocate": "true"}
    futures = create(admin, NewTopic(plain, 1), NewTopic(custom, 1, config=overrides))
    for future in futures.values():
        future.result(timeout=TIMEOUT)

    configs = describe_topic(admin, plain)
    for name, value in (
        ("retention.ms", RETENTION_MS_DEFAULT),
        ("segment.bytes", SEGMENT_BYTES_DEFAULT),
    ):
        entry = configs[name]
        assert (entry.value, entry.is_default, entry.source) == (
            value,
            True,
            ConfigSource.DEFAULT_CONFIG.value,
        ), name

    configs = describe_topic(admin, custom)
    for name, value in overrides.items():
        entry = configs[name]
        assert (entry.value, entry.is_default, entry.source) == (
            value,
            False,
            ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
        ), name
    # What was not overridden is still the default.
    assert configs["segment.ms"].is_default
    assert (
        configs["max.message.bytes"].value
        == describe_topic(admin, plain)["max.message.bytes"].value
    )


def test_incremental_alter_configs(module_broker, clients, topic_name):
    admin = clients.admin(module_broker.bootstrap)
    topic = topic_name("alter")
    create(admin, NewTopic(topic, 1))[topic].result(timeout=TIMEOUT)

    set_op = ConfigEntry("retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET)
    assert alter_topic(admin, topic, set_op).result(timeout=TIMEOUT) is None
    entry = describe_topic(admin, topic)["retention.ms"]
    assert (entry.value, entry.is_default, entry.source) == (
        "86400000",
        False,
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
    )

    delete_op = ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)
    assert alter_topic(admin, topic, delete_op).result(timeout=TIMEOUT) is None
    entry = describe_topic(admin, topic)["retention.ms"]
    assert (entry.value, entry.is_default, entry.source) == (
        RETENTION_MS_DEFAULT,
        True,
        ConfigSource.DEFAULT_CONFIG.value,
    )

    bad = ConfigEntry("retention.ms", "abc", incremental_operation=AlterConfigOpType.SET)
    assert fails_with(alter_topic(admin, topic, bad)) == KafkaError.INVALID_CONFIG
    assert describe_topic(admin, topic)["retention.ms"].value == RETENTION_MS_DEFAULT

    # validate_only checks and changes nothing.
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    (future,) = admin.incremental_alter_configs(
        [resource], validate_only=True, request_timeout=TIMEOUT
    ).values()
    assert future.result(timeout=TIMEOUT) is None
    assert describe_topic(admin, topic)["retention.ms"].value == RETENTION_MS_DEFAULT

    # A failed change leaves the other changes of the same resource undone too.
    good = ConfigEntry("segment.bytes", "2097152", incremental_operation=AlterConfigOpType.SET)
    assert fails_with(alter_topic(admin, topic, good, bad)) == KafkaError.INVALID_CONFIG
    assert describe_topic(admin, topic)["segment.bytes"].value == SEGMENT_BYTES_DEFAULT


def replace_configs(
    admin: Any, topic: str, configs: dict[str, str], validate_only: bool = False
) -> Future[Any]:
    """The legacy AlterConfigs (key 33): the topic's overrides become `configs`."""
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config=configs)
    with warnings.catch_warnings():  # deprecated for IncrementalAlterConfigs, still sent
        warnings.simplefilter("ignore", DeprecationWarning)
        (future,) = admin.alter_configs(
            [resource], validate_only=validate_only, request_timeout=TIMEOUT
        ).values()
    return future


def overrides(admin: Any, topic: str) -> dict[str, str]:
    return {
        name: entry.value
        for name, entry in describe_topic(admin, topic).items()
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    }


def test_legacy_alter_configs_replaces_the_overrides(module_broker, clients, topic_name):
    """AlterConfigs, which KafkaJS and older admin clients send: the configs named become the
    topic's only overrides, the others return to their defaults; all or nothing."""
    admin = clients.admin(module_broker.bootstrap)
    topic = topic_name("legacy")
    first = {"retention.ms": "86400000", "segment.bytes": "2097152"}
    create(admin, NewTopic(topic, 1, config=first))[topic].result(timeout=TIMEOUT)
    assert overrides(admin, topic) == first

    wanted = {"retention.ms": "3600000", "segment.ms": "600000"}
    assert replace_configs(admin, topic, wanted).result(timeout=TIMEOUT) is None
    assert overrides(admin, topic) == wanted
    entry = describe_topic(admin, topic)["segment.bytes"]
    assert (entry.value, entry.is_default) == (SEGMENT_BYTES_DEFAULT, True)

    # Refused or only validated: nothing changes.
    bad = {"retention.ms": "abc", "segment.ms": "1000"}
    assert fails_with(replace_configs(admin, topic, bad)) == KafkaError.INVALID_CONFIG
    assert replace_configs(admin, topic, {}, validate_only=True).result(timeout=TIMEOUT) is None
    assert overrides(admin, topic) == wanted
    missing = topic_name("legacy-missing")
    assert fails_with(replace_configs(admin, missing, {})) == KafkaError.UNKNOWN_TOPIC_OR_PART

    # kafka-python's admin sends AlterConfigs when told not to use the incremental API, and
    # carries the other overrides over itself.
    kadmin = KafkaAdminClient(bootstrap_servers=module_broker.bootstrap)
    try:
        change = KConfigResource("TOPIC", topic, {"retention.ms": "7200000"})
        kadmin.alter_configs([change], incremental=False)
    finally:
        kadmin.close()
    assert overrides(admin, topic) == {"retention.ms": "7200000", "segment.ms": "600000"}

    assert replace_configs(admin, topic, {}).result(timeout=TIMEOUT) is None
    assert overrides(admin, topic) == {}


def test_configs_of_a_missing_topic(module_broker, clients, topic_name):
    admin = clients.admin(module_broker.bootstrap)
    missing = topic_name("missing")
    resource = ConfigResource(ResourceType.TOPIC, missing)
    (future,) = admin.describe_configs([resource], request_timeout=TIMEOUT).values()
    assert fails_with(future) == KafkaError.UNKNOWN_TOPIC_OR_PART
    change = ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
    assert fails_with(alter_topic(admin, missing, change)) == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert missing not in partition_counts(admin)


def test_altered_retention_applies_to_the_log(module_broker, clients, topic_name):
    """retention.ms lowered below the records' age: the broker deletes them (its
    housekeeping runs every second) and the log start moves to the log end."""
    admin = clients.admin(module_broker.bootstrap)
    topic = topic_name("expire")
    create(admin, NewTopic(topic, 1))[topic].result(timeout=TIMEOUT)
    hour_ago = int(time.time() * 1000) - 3_600_000
    records = [{"value": b"v", "timestamp": hour_ago + i, "partition": 0} for i in range(10)]
    clients.produce_all(clients.producer(module_broker.bootstrap), topic, records)
    tp = TopicPartition(topic, 0)

    def earliest() -> int:
        (future,) = admin.list_offsets({tp: OffsetSpec.earliest()}).values()
        return int(future.result(timeout=TIMEOUT).offset)

    time.sleep(1.5)  # a housekeeping round or more, under the default 7-day retention
    assert earliest() == 0
    change = ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)
    alter_topic(admin, topic, change).result(timeout=TIMEOUT)
    deadline = time.monotonic() + 10
    while earliest() != 10 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert earliest() == 10
    (future,) = admin.list_offsets({tp: OffsetSpec.latest()}).values()
    assert future.result(timeout=TIMEOUT).offset == 10


# DeleteRecords ------------------------------------------------------------------------


def delete_records(admin: Any, topic: str, partition: int, offset: int) -> Future[Any]:
    (future,) = admin.delete_records(
        [TopicPartition(topic, partition, offset)], request_timeout=TIMEOUT
    ).values()
    return future


def test_delete_records(module_broker, clients, topic_name):
    """Records below the offset are no longer served: consumers from the beginning, offsets
    by timestamp and the earliest offset all start there; -1 deletes up to the high
    watermark; past it is OFFSET_OUT_OF_RANGE and deletes nothing."""
    admin = clients.admin(module_broker.bootstrap)
    topic = topic_name("purge")
    create(admin, NewTopic(topic, 2))[topic].result(timeout=TIMEOUT)
    base = int(time.time() * 1000) - 60_000
    records = [{"value": b"r%d" % i, "partition": i % 2, "timestamp": base + i} for i in range(40)]
    clients.produce_all(clients.producer(module_broker.bootstrap), topic, records)
    tp0 = TopicPartition(topic, 0)

    def offsets(spec: OffsetSpec) -> int:
        (future,) = admin.list_offsets({tp0: spec}).values()
        return int(future.result(timeout=TIMEOUT).offset)

    assert delete_records(admin, topic, 0, 7).result(timeout=TIMEOUT).low_watermark == 7
    assert offsets(OffsetSpec.earliest()) == 7 and offsets(OffsetSpec.latest()) == 20
    assert offsets(OffsetSpec.for_timestamp(base)) == 7  # r0's time, but r0 is gone
    consumer = clients.consumer(module_broker.bootstrap, {"auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, -2) for p in (0, 1)])  # OFFSET_BEGINNING
    got = clients.consume(consumer, 33)
    by_partition = {p: [(m.offset(), m.value()) for m in got if m.partition() == p] for p in (0, 1)}
    assert by_partition[0] == [(o, b"r%d" % (2 * o)) for o in range(7, 20)]
    assert by_partition[1] == [(o, b"r%d" % (2 * o + 1)) for o in range(20)]

    # Lower than the log start: nothing moves; past the high watermark: refused.
    assert delete_records(admin, topic, 0, 3).result(timeout=TIMEOUT).low_watermark == 7
    assert fails_with(delete_records(admin, topic, 0, 21)) == KafkaError.OFFSET_OUT_OF_RANGE
    assert offsets(OffsetSpec.earliest()) == 7
    # Sent raw: librdkafka refuses these itself, finding no leader or an internal topic.
    missing = topic_name("purge-missing")
    asked = {missing: 1, "__consumer_offsets": 0}
    request = DeleteRecordsRequest(
        version=2,
        topics=[
            DeleteRecordsRequest.DeleteRecordsTopic(
                name=name,
                partitions=[
                    DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(
                        partition_index=0, offset=offset
                    )
                ],
            )
            for name, offset in asked.items()
        ],
        timeout_ms=5000,
    )
    answer = raw_request(module_broker.bootstrap, request)
    codes = {t.name: [p.error_code for p in t.partitions] for t in answer.topics}
    assert codes == {
        missing: [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION],
        "__consumer_offsets": [ErrorCode.INVALID_TOPIC_EXCEPTION],
    }

    # -1: everything up to the high watermark.
    assert delete_records(admin, topic, 1, -1).result(timeout=TIMEOUT).low_watermark == 20
    (future,) = admin.list_offsets({TopicPartition(topic, 1): OffsetSpec.earliest()}).values()
    assert future.result(timeout=TIMEOUT).offset == 20

    # kafka-python's admin client sends the same request.
    kadmin = KafkaAdminClient(bootstrap_servers=module_broker.bootstrap)
    try:
        result = kadmin.delete_records({KTopicPartition(topic, 0): 12})
    finally:
        kadmin.close()
    assert result[KTopicPartition(topic, 0)]["low_watermark"] == 12
    assert offsets(OffsetSpec.earliest()) == 12


# Offsets by timestamp -----------------------------------------------------------------


def offset_for(admin: Any, tp: TopicPartition, spec: OffsetSpec) -> tuple[int, int]:
    """ListOffsets for one partition: (offset, timestamp)."""
    (future,) = admin.list_offsets({tp: spec}, request_timeout=TIMEOUT).values()
    result = future.result(timeout=TIMEOUT)
    return result.offset, result.timestamp


def test_list_offsets_by_timestamp(module_broker, clients, topic_name):
    topic = topic_name("times")
    base = int(time.time() * 1000) - 600_000
    stamps = [base + 10 * i for i in range(20)]
    producer = clients.producer(module_broker.bootstrap, {"linger.ms": 50})
    # Offsets 0-9 in one batch, then 10-19 in a batch each.
    records = [{"value": f"r{i}".encode(), "timestamp": stamps[i]} for i in range(10)]
    reports = clients.produce_all(producer, topic, records)
    for i in range(10, 20):
        record = {"value": f"r{i}".encode(), "timestamp": stamps[i]}
        reports += clients.produce_all(producer, topic, [record])
    assert [(e, m.offset()) for e, m in reports] == [(None, i) for i in range(20)]

    admin = clients.admin(module_broker.bootstrap)

    def lookup(spec: OffsetSpec) -> tuple[int, int]:
        return offset_for(admin, TopicPartition(topic, 0), spec)

    cases = [
        (base + 15, (2, base + 20)),  # inside the first batch: the next record at or after
        (base + 20, (2, base + 20)),  # an exact match
        (base - 5, (0, base)),  # before everything: the first record
        (base + 125, (13, base + 130)),  # among the one-record batches
        (base + 190, (19, base + 190)),  # the last record
    ]
    for timestamp, want in cases:
        assert lookup(OffsetSpec.for_timestamp(timestamp)) == want, timestamp
    offset, _ = lookup(OffsetSpec.for_timestamp(base + 191))  # after everything
    assert offset == -1
    assert lookup(OffsetSpec.earliest())[0] == 0
    assert lookup(OffsetSpec.latest())[0] == 20
    assert lookup(OffsetSpec.max_timestamp()) == (19, base + 190)


# Cluster ------------------------------------------------------------------------------


def test_describe_cluster(module_broker, clients):
    admin = clients.admin(module_broker.bootstrap)
    cluster = admin.describe_cluster(request_timeout=TIMEOUT).result(timeout=TIMEOUT)
    meta = (module_broker.data_dir / "meta.properties").read_text(encoding="utf-8")
    cluster_id = next(
        line.split("=", 1)[1] for line in meta.splitlines() if line.startswith("cluster.id=")
    )
    assert cluster.cluster_id == cluster_id
    assert cluster.cluster_id
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, "127.0.0.1", module_broker.port)]
    assert cluster.controller is not None and cluster.controller.id == 0
    # Metadata agrees.
    metadata = admin.list_topics(timeout=TIMEOUT)
    assert metadata.cluster_id == cluster_id
    assert metadata.controller_id == 0
    assert [(b.id, b.host, b.port) for b in metadata.brokers.values()] == [
        (0, "127.0.0.1", module_broker.port)
    ]


# Metrics ------------------------------------------------------------------------------


def test_metrics(module_broker, clients, topic_name):
    topic = topic_name("metered")
    count = 1234
    producer = clients.producer(module_broker.bootstrap, {"linger.ms": 20})
    records = [{"key": str(i).encode(), "value": b"x" * (i % 100)} for i in range(count)]
    reports = clients.produce_all(producer, topic, records)
    assert [(e, m.offset()) for e, m in reports] == [(None, i) for i in range(count)]
    consumer = clients.consumer(module_broker.bootstrap)
    clients.assign_from(consumer, topic, [0])
    assert [m.offset() for m in clients.consume(consumer, count)] == list(range(count))

    families = {f.name: f for f in module_broker.scrape()}
    assert families["directlog_broker_records_in"].type == "counter"
    assert families["directlog_broker_log_end_offset"].type == "gauge"
    assert families["directlog_broker_request_latency_seconds"].type == "histogram"

    def value(family: str, sample: str, **labels: str) -> float | None:
        found = [
            s.value
            for s in families[family].samples
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        assert len(found) <= 1, found
        return found[0] if found else None

    assert value(
        "directlog_broker_records_in", "directlog_broker_records_in_total", topic=topic
    ) == (count)
    bytes_in = value("directlog_broker_bytes_in", "directlog_broker_bytes_in_total", topic=topic)
    assert bytes_in is not None and bytes_in > sum(len(r["value"]) for r in records)
    end = value(
        "directlog_broker_log_end_offset",
        "directlog_broker_log_end_offset",
        topic=topic,
        partition="0",
    )
    assert end == count
    hw = value(
        "directlog_broker_high_watermark",
        "directlog_broker_high_watermark",
        topic=topic,
        partition="0",
    )
    assert hw == count
    records_out = value(
        "directlog_broker_records_out", "directlog_broker_records_out_total", topic=topic
    )
    assert records_out == count

    latency = "directlog_broker_request_latency_seconds"
    for api in ("produce", "fetch"):
        requests = value(latency, f"{latency}_count", api=api)
        assert requests is not None and requests >= 1, api
        assert value(latency, f"{latency}_bucket", api=api, le="+Inf") == requests
        assert value(latency, f"{latency}_sum", api=api) is not None


# APPEND and SUBTRACT of list configs (IncrementalAlterConfigs) ------------------------

APPEND, SUBTRACT = AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT
FOLLOWERS = "follower.replication.throttled.replicas"


def refusal(future: Future[Any]) -> tuple[int, str]:
    """The Kafka error code and the broker's message a future failed with."""
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=TIMEOUT)
    error = raised.value.args[0]
    assert isinstance(error, KafkaError)
    return int(error.code()), error.str()


def test_append_and_subtract_list_configs(module_broker, clients, topic_name):
    admin = clients.admin(module_broker.bootstrap)
    topic = topic_name("lists")
    create(admin, NewTopic(topic, 1))[topic].result(timeout=TIMEOUT)

    def entry(name: str, value: str, operation: AlterConfigOpType) -> ConfigEntry:
        return ConfigEntry(name, value, incremental_operation=operation)

    def value(name: str) -> tuple[str, int]:
        found = describe_topic(admin, topic)[name]
        return found.value, found.source

    # From Kafka's default (delete) when the topic has no override; then from the override.
    assert (
        alter_topic(admin, topic, entry("cleanup.policy", "compact", APPEND)).result(
            timeout=TIMEOUT
        )
        is None
    )
    assert value("cleanup.policy") == ("delete,compact", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert (
        alter_topic(admin, topic, entry("cleanup.policy", "delete", SUBTRACT)).result(
            timeout=TIMEOUT
        )
        is None
    )
    assert value("cleanup.policy")[0] == "compact"
    # Values already there are not added twice; several at once, with other operations.
    changes = [
        entry("cleanup.policy", "compact,delete", APPEND),
        entry(FOLLOWERS, "0:0,1:0", APPEND),
        entry("retention.ms", "3600000", AlterConfigOpType.SET),
    ]
    assert alter_topic(admin, topic, *changes).result(timeout=TIMEOUT) is None
    assert value("cleanup.policy")[0] == "compact,delete"
    assert value(FOLLOWERS)[0] == "0:0,1:0"
    assert value("retention.ms")[0] == "3600000"

    # kafka-python's admin sends the same operations.
    kadmin = KafkaAdminClient(bootstrap_servers=module_broker.bootstrap, request_timeout_ms=15000)
    try:
        resource = KConfigResource(
            KConfigResourceType.TOPIC,
            topic,
            configs={
                FOLLOWERS: (KAlterConfigOp.SUBTRACT, "0:0"),
                "cleanup.policy": (KAlterConfigOp.SUBTRACT, "compact"),
            },
        )
        result = kadmin.alter_configs([resource], raise_on_unknown=False, incremental=True)
        assert result == {"topic": {topic: "OK"}}
    finally:
        kadmin.close()
    assert value(FOLLOWERS)[0] == "1:0"
    assert value("cleanup.policy")[0] == "delete"

    # Refused, in Kafka's words, each leaving the whole resource unchanged.
    bad = [
        (
            [entry("retention.ms", "1000", APPEND)],
            KafkaError.INVALID_CONFIG,
            "Can't APPEND to key retention.ms because its type is not LIST.",
        ),
        (
            [entry("segment.ms", "1000", SUBTRACT)],
            KafkaError.INVALID_CONFIG,
            "Can't SUBTRACT to key segment.ms because its type is not LIST.",
        ),
        ([entry("cleanup.policy", "compress", APPEND)], KafkaError.INVALID_CONFIG, "compress"),
        ([entry(FOLLOWERS, "x:y", APPEND)], KafkaError.INVALID_CONFIG, FOLLOWERS),
        # The last policy subtracted: an empty value, refused as setting it is.
        ([entry("cleanup.policy", "delete", SUBTRACT)], KafkaError.INVALID_CONFIG, "cleanup"),
        (
            [
                entry("segment.bytes", "2097152", AlterConfigOpType.SET),
                entry("cleanup.policy", "compact", APPEND),
                entry("max.message.bytes", "1", APPEND),
            ],
            KafkaError.INVALID_CONFIG,
            "max.message.bytes",
        ),
    ]
    for changes, code, message in bad:
        got_code, got_message = refusal(alter_topic(admin, topic, *changes))
        assert (got_code, message in got_message) == (code, True), (changes, got_message)
    configs = describe_topic(admin, topic)
    assert configs["cleanup.policy"].value == "delete"
    assert configs[FOLLOWERS].value == "1:0"
    assert configs["segment.bytes"].value == SEGMENT_BYTES_DEFAULT


def incremental(
    bootstrap: str, resource_type: int, name: str, *changes: tuple[str, int, str | None]
) -> tuple[int, str | None]:
    """A raw IncrementalAlterConfigs of one resource: (error code, message)."""
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    request = IncrementalAlterConfigsRequest(
        version=1,
        resources=[
            resource(
                resource_type=resource_type,
                resource_name=name,
                configs=[
                    resource.AlterableConfig(name=n, config_operation=op, value=v)
                    for n, op, v in changes
                ],
            )
        ],
        validate_only=False,
    )
    (answer,) = raw_request(bootstrap, request).responses
    return answer.error_code, answer.error_message


def test_list_operations_on_brokers_and_bad_requests(module_broker, clients, topic_name):
    """The cluster-wide default log.cleanup.policy (the broker resource "", which only raw
    requests name) takes APPEND and SUBTRACT; a per-broker rate is no list; a key named
    twice, a null value and an unknown operation are bad requests, as Kafka's broker says."""
    bootstrap = module_broker.bootstrap
    broker, topic_type = 4, 2
    append, subtract, delete = 2, 3, 1
    try:
        assert incremental(bootstrap, broker, "", ("log.cleanup.policy", append, "compact")) == (
            0,
            None,
        )
        admin = clients.admin(bootstrap)
        resource = ConfigResource(ResourceType.BROKER, "0")
        (future,) = admin.describe_configs([resource], request_timeout=TIMEOUT).values()
        entry = future.result(timeout=TIMEOUT)["log.cleanup.policy"]
        assert (entry.value, entry.source) == (
            "delete,compact",
            ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value,
        )
        assert incremental(bootstrap, broker, "", ("log.cleanup.policy", subtract, "delete")) == (
            0,
            None,
        )
        (future,) = admin.describe_configs([resource], request_timeout=TIMEOUT).values()
        assert future.result(timeout=TIMEOUT)["log.cleanup.policy"].value == "compact"
        assert incremental(bootstrap, broker, "", ("log.retention.ms", append, "1")) == (
            ErrorCode.INVALID_CONFIG,
            "Config value append is not allowed for config key: log.retention.ms",
        )
    finally:
        assert incremental(bootstrap, broker, "", ("log.cleanup.policy", delete, None)) == (0, None)
    rate = "leader.replication.throttled.rate"
    assert incremental(bootstrap, broker, "0", (rate, subtract, "1")) == (
        ErrorCode.INVALID_CONFIG,
        f"Config value subtract is not allowed for config key: {rate}",
    )

    topic = topic_name("bad")
    clients.create_topic(bootstrap, topic)
    assert incremental(
        bootstrap,
        topic_type,
        topic,
        ("cleanup.policy", append, "compact"),
        ("cleanup.policy", delete, None),
    ) == (ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    assert incremental(bootstrap, topic_type, topic, ("cleanup.policy", append, None)) == (
        ErrorCode.INVALID_REQUEST,
        "Null value not supported for : cleanup.policy",
    )
    assert incremental(bootstrap, topic_type, topic, ("cleanup.policy", 7, "compact")) == (
        ErrorCode.INVALID_REQUEST,
        "Unknown operations type 7",
    )
    assert "cleanup.policy" not in overrides(clients.admin(bootstrap), topic)


# Manual replica assignments (CreateTopics, CreatePartitions) --------------------------


@pytest.fixture(scope="module")
def three_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("assignments"), brokers=3) as running:
        yield running


def layout_of(admin: Any, topic: str) -> list[tuple[list[int], int]]:
    """Each partition's replicas and leader, in partition order, as Metadata answers."""
    metadata = admin.list_topics(topic, timeout=TIMEOUT)
    partitions = metadata.topics[topic].partitions
    assert sorted(partitions) == list(range(len(partitions)))
    return [(list(partitions[p].replicas), partitions[p].leader) for p in sorted(partitions)]


def kafka_python_admin(bootstrap: str) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)


@pytest.mark.timeout(180)  # a cluster of three starts first
def test_create_topics_with_a_manual_assignment(three_brokers, clients, topic_name):
    admin = clients.admin(three_brokers.bootstrap)
    topic = topic_name("placed")
    wanted = [[2, 0, 1], [0, 1, 2], [1, 2, 0], [2, 1, 0]]
    futures = create(admin, NewTopic(topic, len(wanted), replica_assignment=wanted))
    assert futures[topic].result(timeout=TIMEOUT) is None
    # Exactly as asked, each partition led by its first replica.
    assert layout_of(admin, topic) == [(r, r[0]) for r in wanted]

    other = topic_name("placed-kp")
    kadmin = kafka_python_admin(three_brokers.bootstrap)
    try:
        kadmin.create_topics([KNewTopic(other, replica_assignments={0: [1, 2], 1: [2, 0]})])
    finally:
        kadmin.close()
    wait_for(lambda: layout_of(admin, other) == [([1, 2], 1), ([2, 0], 2)], 30, "kp topic")


@pytest.mark.timeout(180)  # a cluster of three starts first
def test_bad_manual_assignments_create_nothing(three_brokers, clients, topic_name):
    kadmin = kafka_python_admin(three_brokers.bootstrap)
    admin = clients.admin(three_brokers.bootstrap)
    bad: list[tuple[dict[str, Any], int, str]] = [
        (
            {"replica_assignments": {0: [0, 0, 1]}},
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes the broker 0 more than once.",
        ),
        (
            {"replica_assignments": {0: [0, 7]}},
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes broker 7, but no such broker is registered.",
        ),
        (
            {"replica_assignments": {0: [0, 1], 1: [0, 1, 2]}},
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes a partition with 3 replica(s), but "
            "this is not consistent with previous partitions, which have 2 replica(s).",
        ),
        (
            {"replica_assignments": {0: [0], 2: [1]}},
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "partitions should be a consecutive 0-based integer sequence",
        ),
        (
            {"replica_assignments": {0: []}},
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "The manual partition assignment includes an empty replica list.",
        ),
        (
            {"num_partitions": 2, "replica_assignments": {0: [0], 1: [1]}},
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but numPartitions was not set to -1.",
        ),
        (
            {"replication_factor": 1, "replica_assignments": {0: [0]}},
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but replication factor was not set "
            "to -1.",
        ),
    ]
    try:
        names = []
        for options, code, message in bad:
            name = topic_name("refused")
            names.append(name)
            response = kadmin.create_topics([KNewTopic(name, **options)], raise_errors=False)
            (result,) = response["topics"]
            assert (result["error_code"], result["error_message"]) == (code, message), options
    finally:
        kadmin.close()
    listed = partition_counts(admin)
    assert not set(names) & set(listed)
    # confluent-kafka's refusal carries the same code.
    topic = topic_name("refused-ck")
    future = create(admin, NewTopic(topic, 2, replica_assignment=[[0, 1], [1, 1]]))[topic]
    assert refusal(future) == (
        KafkaError.INVALID_REPLICA_ASSIGNMENT,
        "The manual partition assignment includes the broker 1 more than once.",
    )
    assert topic not in partition_counts(admin)


@pytest.mark.timeout(180)  # a cluster of three starts first
def test_create_partitions_with_a_manual_assignment(three_brokers, clients, topic_name):
    admin = clients.admin(three_brokers.bootstrap)
    topic = topic_name("grown")
    create(admin, NewTopic(topic, 1, replication_factor=3))[topic].result(timeout=TIMEOUT)
    (future,) = admin.create_partitions(
        [NewPartitions(topic, 3, replica_assignment=[[2, 0, 1], [0, 1, 2]])],
        request_timeout=TIMEOUT,
    ).values()
    assert future.result(timeout=TIMEOUT) is None
    assert layout_of(admin, topic)[1:] == [([2, 0, 1], 2), ([0, 1, 2], 0)]

    kadmin = kafka_python_admin(three_brokers.bootstrap)
    try:
        kadmin.create_partitions({topic: KNewPartitions(5, new_assignments=[[1, 2, 0], [2, 1, 0]])})
        wait_for(lambda: len(layout_of(admin, topic)) == 5, 30, "five partitions")
        assert layout_of(admin, topic)[3:] == [([1, 2, 0], 1), ([2, 1, 0], 2)]

        bad = [
            (
                [[1, 2, 0]],
                "Attempted to add 2 additional partition(s), but only 1 assignment(s) were "
                "specified.",
            ),
            (
                [[1, 2], [2, 0]],
                "The manual partition assignment includes a partition with 2 replica(s), but "
                "this is not consistent with previous partitions, which have 3 replica(s).",
            ),
            (
                [[1, 2, 9], [2, 1, 0]],
                "The manual partition assignment includes broker 9, but no such broker is "
                "registered.",
            ),
            (
                [[1, 1, 0], [2, 1, 0]],
                "The manual partition assignment includes the broker 1 more than once.",
            ),
        ]
        for assignments, message in bad:
            response = kadmin.create_partitions(
                {topic: KNewPartitions(7, new_assignments=assignments)}, raise_errors=False
            )
            (result,) = response.results
            assert (result.error_code, result.error_message) == (
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                message,
            ), assignments
    finally:
        kadmin.close()
    (future,) = admin.create_partitions(
        [NewPartitions(topic, 6, replica_assignment=[[0, 1, 7]])], request_timeout=TIMEOUT
    ).values()
    assert refusal(future)[0] == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert partition_counts(admin)[topic] == 5


@pytest.mark.timeout(180)  # a cluster of three starts first
def test_a_manual_assignment_may_name_a_fenced_broker(tmp_path, clients, topic_name):
    """As in Kafka: the fenced replica is outside the ISR and does not lead; a partition
    whose every replica is fenced is refused."""
    with Cluster(tmp_path, brokers=3) as cluster:
        cluster.brokers[2].stop()
        cluster.wait_live({0, 1})
        admin = clients.admin(cluster.bootstrap)
        topic = topic_name("fenced")
        futures = create(admin, NewTopic(topic, 2, replica_assignment=[[2, 1], [0, 2]]))
        assert futures[topic].result(timeout=TIMEOUT) is None
        metadata = admin.list_topics(topic, timeout=TIMEOUT).topics[topic].partitions
        assert [(m.replicas, m.leader, m.isrs) for _, m in sorted(metadata.items())] == [
            ([2, 1], 1, [1]),
            ([0, 2], 0, [0]),
        ]
        refused = topic_name("all-fenced")
        future = create(admin, NewTopic(refused, 1, replica_assignment=[[2]]))[refused]
        assert refusal(future) == (
            KafkaError.INVALID_REPLICA_ASSIGNMENT,
            "All brokers specified in the manual partition assignment for partition 0 are "
            "fenced or in controlled shutdown.",
        )
        assert refused not in partition_counts(admin)


# Produce v0/v1 without timestamps -----------------------------------------------------


def old_producer(bootstrap: str, api_version: tuple[int, ...]) -> KafkaProducer:
    """kafka-python pinned to an old broker version: magic 0 message sets for (0, 9), magic
    1 for (0, 10, 0), in Produce v0-2."""
    return KafkaProducer(bootstrap_servers=bootstrap, api_version=api_version, acks=1)


def test_old_produce_without_timestamps_reads_back_without(module_broker, clients, topic_name):
    topic = topic_name("no-time")
    clients.create_topic(module_broker.bootstrap, topic)
    before = int(time.time() * 1000)
    for api_version, stamp in [((0, 9), None), ((0, 10, 0), -1), ((0, 10, 0), before - 5000)]:
        producer = old_producer(module_broker.bootstrap, api_version)
        try:
            producer.send(topic, b"v", partition=0, timestamp_ms=stamp).get(timeout=TIMEOUT)
        finally:
            producer.close(timeout=TIMEOUT)
    consumer = clients.consumer(module_broker.bootstrap)
    clients.assign_from(consumer, topic, [0])
    seen = [m.timestamp() for m in clients.consume(consumer, 3)]
    # Kafka keeps no timestamp on a CreateTime topic: librdkafka reads -1 (CreateTime type).
    assert seen == [
        (TIMESTAMP_CREATE_TIME, -1),
        (TIMESTAMP_CREATE_TIME, -1),
        (TIMESTAMP_CREATE_TIME, before - 5000),
    ]
    # kafka-python's current consumer reads the same.
    reader = KafkaConsumer(
        bootstrap_servers=module_broker.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10000,
    )
    try:
        reader.assign([KTopicPartition(topic, 0)])
        assert [r.timestamp for r in itertools.islice(reader, 3)] == [-1, -1, before - 5000]
    finally:
        reader.close()

    # ListOffsets by timestamp passes the records without one by, as Kafka's does.
    admin = clients.admin(module_broker.bootstrap)

    def lookup(spec: OffsetSpec) -> tuple[int, int]:
        return offset_for(admin, TopicPartition(topic, 0), spec)

    assert lookup(OffsetSpec.for_timestamp(0)) == (2, before - 5000)
    assert lookup(OffsetSpec.for_timestamp(before))[0] == -1  # none at or after it
    assert lookup(OffsetSpec.max_timestamp()) == (2, before - 5000)


def test_old_produce_to_a_log_append_time_topic_gets_the_append_time(
    module_broker, clients, topic_name
):
    topic = topic_name("append-time")
    clients.create_topic(
        module_broker.bootstrap, topic, config={"message.timestamp.type": "LogAppendTime"}
    )
    before = int(time.time() * 1000)
    producer = old_producer(module_broker.bootstrap, (0, 9))
    try:
        producer.send(topic, b"v", partition=0).get(timeout=TIMEOUT)
    finally:
        producer.close(timeout=TIMEOUT)
    consumer = clients.consumer(module_broker.bootstrap)
    clients.assign_from(consumer, topic, [0])
    ((kind, stamp),) = [m.timestamp() for m in clients.consume(consumer, 1)]
    assert kind == TIMESTAMP_LOG_APPEND_TIME
    assert before <= stamp <= int(time.time() * 1000)
