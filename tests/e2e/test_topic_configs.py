"""Configs as Kafka 3.7 has them, through confluent-kafka's and kafka-python's admin clients
against one broker. Every topic config Kafka 3.7 accepts is accepted at CreateTopics and
Alter/IncrementalAlterConfigs, validated as Kafka validates it and described with its default
and source; compression.type other than "producer" makes the leader store batches in that
codec, which both clients' consumers read back. A broker describes its static configs and
refuses to change them dynamically as Kafka does; group config resources get Kafka 3.7's
errors."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from directlog.protocol.errors import ErrorCode
from directlog.records.batch import decode_records, iter_batches
from directlog.records.compression import Compression
from tests.e2e.broker import BrokerProcess
from tests.e2e.conftest import Clients
from tests.e2e.records import raw_request
from tests.e2e.test_admin import incremental as raw_incremental
from tests.e2e.test_old_consumers import old_fetch

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import ConfigResource as KpConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.protocol.admin import DescribeConfigsRequest

pytestmark = pytest.mark.timeout(180)

TIMEOUT = 20  # seconds, for each admin future and client call
TOPIC_SOURCE = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
DEFAULT_SOURCE = ConfigSource.DEFAULT_CONFIG.value
# The configs Kafka 3.7 accepts that Directlog refused before, a value for each other than
# its default, and the default DescribeConfigs reports without one.
DEPRECATED_AND_NEW = {
    "compression.type": ("lz4", "producer"),
    "message.format.version": ("2.8", "3.0-IV1"),
    "file.delete.delay.ms": ("1000", "60000"),
    "segment.jitter.ms": ("5000", "0"),
    "message.timestamp.difference.max.ms": ("86400000", str((1 << 63) - 1)),
    "message.downconversion.enable": ("false", "true"),
}
CODECS = {
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


@pytest.fixture
def kp_admin(module_broker: BrokerProcess) -> Iterator[Any]:
    admin = KafkaAdminClient(
        bootstrap_servers=module_broker.bootstrap, request_timeout_ms=TIMEOUT * 1000
    )
    try:
        yield admin
    finally:
        admin.close()


def new_topic(clients: Clients, bootstrap: str, label: str, **config: str) -> str:
    name = f"{label}-{uuid.uuid4().hex[:8]}"
    clients.create_topic(bootstrap, name, config=config or None)
    return name


def described(admin: Any, topic: str) -> dict[str, Any]:
    (future,) = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, topic)], request_timeout=TIMEOUT
    ).values()
    return future.result(timeout=TIMEOUT)


def value_and_source(admin: Any, topic: str) -> dict[str, tuple[str, int]]:
    found = described(admin, topic)
    return {name: (found[name].value, found[name].source) for name in DEPRECATED_AND_NEW}


def refusal(future: Any) -> KafkaError:
    with pytest.raises(KafkaException) as refused:
        future.result(timeout=TIMEOUT)
    error = refused.value.args[0]
    assert isinstance(error, KafkaError)
    return error


def test_confluent_create_describe_and_alter_every_kafka_config(module_broker, clients):
    bootstrap = module_broker.bootstrap
    admin = clients.admin(bootstrap)
    values = {name: value for name, (value, _) in DEPRECATED_AND_NEW.items()}
    topic = new_topic(clients, bootstrap, "every", **values)
    plain = new_topic(clients, bootstrap, "plain")
    assert value_and_source(admin, topic) == {
        name: (value, TOPIC_SOURCE) for name, value in values.items()
    }
    assert value_and_source(admin, plain) == {
        name: (default, DEFAULT_SOURCE) for name, (_, default) in DEPRECATED_AND_NEW.items()
    }

    resource = ConfigResource(
        ResourceType.TOPIC,
        plain,
        incremental_configs=[
            ConfigEntry("compression.type", "zstd", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.jitter.ms", "7", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry(
                "message.format.version", "0.10.2-IV0", incremental_operation=AlterConfigOpType.SET
            ),
        ],
    )
    admin.incremental_alter_configs([resource], request_timeout=TIMEOUT)[resource].result(
        timeout=TIMEOUT
    )
    found = described(admin, plain)
    assert found["compression.type"].value == "zstd"
    assert found["segment.jitter.ms"].value == "7"
    assert found["message.format.version"].value == "0.10.2-IV0"
    assert found["file.delete.delay.ms"].source == DEFAULT_SOURCE

    # DELETE goes back to Kafka's default.
    resource = ConfigResource(
        ResourceType.TOPIC,
        plain,
        incremental_configs=[
            ConfigEntry("compression.type", None, incremental_operation=AlterConfigOpType.DELETE)
        ],
    )
    admin.incremental_alter_configs([resource], request_timeout=TIMEOUT)[resource].result(
        timeout=TIMEOUT
    )
    found = described(admin, plain)["compression.type"]
    assert (found.value, found.source, found.is_default) == ("producer", DEFAULT_SOURCE, True)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "compression.type",
            "brotli",
            "Invalid value brotli for configuration compression.type: String must be one of: "
            "uncompressed, zstd, lz4, snappy, gzip, producer",
        ),
        (
            "message.format.version",
            "4.0",
            "Invalid value 4.0 for configuration message.format.version: Version 4.0 is not "
            "a valid version",
        ),
        ("segment.jitter.ms", "-1", "segment.jitter.ms"),
        ("file.delete.delay.ms", "soon", "file.delete.delay.ms"),
    ],
)
def test_confluent_bad_values_get_invalid_config(module_broker, clients, name, value, message):
    bootstrap = module_broker.bootstrap
    admin = clients.admin(bootstrap)
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    futures = admin.create_topics(
        [NewTopic(topic, 1, config={name: value})], request_timeout=TIMEOUT
    )
    error = refusal(futures[topic])
    assert error.code() == KafkaError.INVALID_CONFIG and message in error.str()
    existing = new_topic(clients, bootstrap, "alter-bad")
    resource = ConfigResource(
        ResourceType.TOPIC,
        existing,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    error = refusal(admin.incremental_alter_configs([resource], request_timeout=TIMEOUT)[resource])
    assert error.code() == KafkaError.INVALID_CONFIG and message in error.str()
    assert described(admin, existing)[name].source == DEFAULT_SOURCE  # nothing changed


def test_kafka_python_alters_and_describes_them(module_broker, clients, kp_admin):
    topic = new_topic(clients, module_broker.bootstrap, "kp")
    # The legacy AlterConfigs (the client fills in the other overrides) and the incremental.
    for incremental, configs in (
        (False, {"compression.type": "gzip", "message.format.version": "3.7-IV4"}),
        (True, {"file.delete.delay.ms": "0", "segment.jitter.ms": "100"}),
    ):
        answer = kp_admin.alter_configs(
            [KpConfigResource(ConfigResourceType.TOPIC, topic, configs)], incremental=incremental
        )
        assert answer == {"topic": {topic: "OK"}}
    found = kp_admin.describe_configs(
        [KpConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all"
    )["topic"][topic]
    assert {
        name: (found[name]["value"], found[name]["config_source"]) for name in DEPRECATED_AND_NEW
    } == {
        "compression.type": ("gzip", "DYNAMIC_TOPIC_CONFIG"),
        "message.format.version": ("3.7-IV4", "DYNAMIC_TOPIC_CONFIG"),
        "file.delete.delay.ms": ("0", "DYNAMIC_TOPIC_CONFIG"),
        "segment.jitter.ms": ("100", "DYNAMIC_TOPIC_CONFIG"),
        "message.timestamp.difference.max.ms": (str((1 << 63) - 1), "DEFAULT_CONFIG"),
        "message.downconversion.enable": ("true", "DEFAULT_CONFIG"),
    }
    assert {
        name: found[name]["config_type"]
        for name in (
            "compression.type",
            "segment.jitter.ms",
            "segment.bytes",
            "cleanup.policy",
            "preallocate",
            "min.cleanable.dirty.ratio",
        )
    } == {
        "compression.type": "STRING",
        "segment.jitter.ms": "LONG",
        "segment.bytes": "INT",
        "cleanup.policy": "LIST",
        "preallocate": "BOOLEAN",
        "min.cleanable.dirty.ratio": "DOUBLE",
    }
    answer = kp_admin.alter_configs(
        [KpConfigResource(ConfigResourceType.TOPIC, topic, {"compression.type": "bzip2"})],
        incremental=True,
    )
    assert answer["topic"][topic].startswith("[Error 40] InvalidConfigurationError")
    assert "compression.type" in answer["topic"][topic]


def stored_codecs(bootstrap: str, topic: str) -> tuple[list[Compression], list[bytes]]:
    """The codec of every batch the partition holds, and the values, from a raw Fetch."""
    (answer,) = old_fetch(bootstrap, 11, [(topic, 0)]).values()
    assert answer.error_code == ErrorCode.NONE
    codecs, values = [], []
    for position, header in iter_batches(answer.records):
        codecs.append(header.compression)
        values += [r.value or b"" for r in decode_records(answer.records, position, header)]
    return codecs, values


@pytest.mark.parametrize("target", sorted(CODECS))
def test_compression_type_recompresses_on_the_leader(module_broker, clients, target):
    bootstrap = module_broker.bootstrap
    topic = new_topic(clients, bootstrap, f"codec-{target}", **{"compression.type": target})
    sent = "snappy" if target == "gzip" else "gzip"  # a codec other than the topic's
    values = [b"%s-%d-" % (target.encode(), i) + b"v" * (i * 37) for i in range(60)]
    producer = clients.producer(bootstrap, {"compression.type": sent, "linger.ms": 20})
    reports = clients.produce_all(producer, topic, [{"value": v} for v in values[:30]])
    assert all(error is None for error, _ in reports)
    kp_producer = KafkaProducer(
        bootstrap_servers=bootstrap, compression_type="zstd" if target != "zstd" else "lz4"
    )
    try:
        for value in values[30:]:
            kp_producer.send(topic, value=value, partition=0)
        kp_producer.flush(timeout=TIMEOUT)
    finally:
        kp_producer.close(timeout=5)

    codecs, stored = stored_codecs(bootstrap, topic)
    assert codecs and set(codecs) == {CODECS[target]}
    assert stored == values

    consumer = clients.consumer(bootstrap)
    clients.assign_from(consumer, topic, [0])
    assert [m.value() for m in clients.consume(consumer, len(values))] == values
    kp_consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    try:
        kp_consumer.assign([TopicPartition(topic, 0)])
        got: list[bytes] = []
        for _ in range(60):
            for batch in kp_consumer.poll(timeout_ms=500).values():
                got += [record.value for record in batch]
            if len(got) >= len(values):
                break
        assert got == values
    finally:
        kp_consumer.close()


def test_producer_keeps_each_producers_codec(module_broker, clients):
    bootstrap = module_broker.bootstrap
    topic = new_topic(clients, bootstrap, "as-produced")
    for codec in ("gzip", "lz4"):
        producer = clients.producer(bootstrap, {"compression.type": codec})
        reports = clients.produce_all(producer, topic, [{"value": codec.encode() * 20}])
        assert reports[0][0] is None
    codecs, stored = stored_codecs(bootstrap, topic)
    assert codecs == [Compression.GZIP, Compression.LZ4]
    assert stored == [b"gzip" * 20, b"lz4" * 20]


def test_a_topic_switched_to_a_codec_stores_later_batches_in_it(module_broker, clients):
    bootstrap = module_broker.bootstrap
    admin = clients.admin(bootstrap)
    topic = new_topic(clients, bootstrap, "switched")
    # librdkafka sends a batch uncompressed when compressing does not shrink it
    producer = clients.producer(bootstrap, {"compression.type": "gzip"})
    assert clients.produce_all(producer, topic, [{"value": b"before" * 50}])[0][0] is None
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"compression.type": "zstd"})
    with warnings.catch_warnings():  # the legacy AlterConfigs is what this test sends
        warnings.simplefilter("ignore", DeprecationWarning)
        futures = admin.alter_configs([resource], request_timeout=TIMEOUT)
    futures[resource].result(timeout=TIMEOUT)
    assert described(admin, topic)["compression.type"].value == "zstd"
    assert clients.produce_all(producer, topic, [{"value": b"after" * 50}])[0][0] is None
    codecs, stored = stored_codecs(bootstrap, topic)
    assert (codecs, stored) == (
        [Compression.GZIP, Compression.ZSTD],
        [b"before" * 50, b"after" * 50],
    )


# Broker configs ---------------------------------------------------------------------------

BROKER_RESOURCE, GROUP_RESOURCE = 4, 32
STATIC_SOURCE = ConfigSource.STATIC_BROKER_CONFIG.value


def test_a_broker_describes_its_static_configs_with_their_source(module_broker, clients, kp_admin):
    admin = clients.admin(module_broker.bootstrap)
    (future,) = admin.describe_configs(
        [ConfigResource(ResourceType.BROKER, "0")], request_timeout=TIMEOUT
    ).values()
    found = future.result(timeout=TIMEOUT)

    def seen(name: str) -> tuple[str, int, bool, bool]:
        entry = found[name]
        return entry.value, entry.source, entry.is_read_only, entry.is_default

    # Given to the broker (its flags and the test cluster's settings file): static.
    assert seen("broker.id") == ("0", STATIC_SOURCE, True, False)
    assert seen("offsets.topic.num.partitions") == ("10", STATIC_SOURCE, True, False)
    # Not given: Kafka's default, built in.
    assert seen("group.max.size") == (str((1 << 31) - 1), DEFAULT_SOURCE, True, True)
    assert seen("auto.create.topics.enable") == ("true", DEFAULT_SOURCE, True, True)
    # The dynamic ones stay writable.
    assert seen("leader.replication.throttled.rate")[2:] == (False, True)
    # The cluster-wide defaults of topic configs, under Kafka's broker names.
    assert seen("compression.type") == ("producer", DEFAULT_SOURCE, False, True)
    assert seen("log.message.format.version") == ("3.0-IV1", DEFAULT_SOURCE, False, True)
    assert "log.compression.type" not in found

    described = kp_admin.describe_configs(
        [KpConfigResource(ConfigResourceType.BROKER, "0")], config_filter="all"
    )["broker"]["0"]
    assert described["broker.id"]["config_source"] == "STATIC_BROKER_CONFIG"
    assert described["broker.id"]["read_only"] is True
    assert described["replica.lag.time.max.ms"]["config_source"] in (
        "STATIC_BROKER_CONFIG",
        "DEFAULT_CONFIG",
    )
    assert described["log.roll.jitter.ms"]["value"] == "0"


def raw_describe(bootstrap: str, resources: list[tuple[int, str]]) -> list[Any]:
    request = DescribeConfigsRequest(
        version=4,
        resources=[
            DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=kind, resource_name=name, configuration_keys=None
            )
            for kind, name in resources
        ],
        include_synonyms=False,
        include_documentation=False,
    )
    return list(raw_request(bootstrap, request).results)


def test_static_broker_configs_cannot_be_updated_dynamically(module_broker, clients, kp_admin):
    """Kafka's DynamicBrokerConfig refusal, INVALID_REQUEST naming the configs as a Set, per
    broker (confluent-kafka, kafka-python) and cluster-wide (raw: both clients refuse to
    name the default entity "")."""
    admin = clients.admin(module_broker.bootstrap)
    resource = ConfigResource(
        ResourceType.BROKER,
        "0",
        incremental_configs=[
            ConfigEntry("broker.id", "5", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    error = refusal(admin.incremental_alter_configs([resource], request_timeout=TIMEOUT)[resource])
    assert error.code() == KafkaError.INVALID_REQUEST
    assert error.str() == "Cannot update these configs dynamically: Set(broker.id)"

    answer = kp_admin.alter_configs(
        [
            KpConfigResource(
                ConfigResourceType.BROKER,
                "0",
                {"auto.create.topics.enable": "false", "log.dirs": "/elsewhere"},
            )
        ],
        raise_on_unknown=False,
        incremental=True,
    )
    assert answer["broker"]["0"] == (
        "[Error 42] InvalidRequestError: Cannot update these configs dynamically: "
        "Set(auto.create.topics.enable, log.dirs)"
    )
    cluster_wide = raw_incremental(
        module_broker.bootstrap, BROKER_RESOURCE, "", ("group.max.size", 0, "10")
    )
    assert cluster_wide == (
        ErrorCode.INVALID_REQUEST,
        "Cannot update these configs dynamically: Set(group.max.size)",
    )
    (found,) = raw_describe(module_broker.bootstrap, [(BROKER_RESOURCE, "0")])
    values = {c.name: c.value for c in found.configs}
    assert values["broker.id"] == "0" and values["auto.create.topics.enable"] == "true"


def test_altering_another_brokers_configs_is_kafkas_invalid_request(module_broker):
    """Kafka 3.7 takes a per-broker change only on the broker it names."""
    bootstrap = module_broker.bootstrap
    assert raw_change(bootstrap, "1", {"leader.replication.throttled.rate": "10"}) == (
        ErrorCode.INVALID_REQUEST,
        "Unexpected broker id, expected 0, but received 1",
    )
    assert raw_change(bootstrap, "x", {"leader.replication.throttled.rate": "10"}) == (
        ErrorCode.INVALID_REQUEST,
        "Node id must be an integer, but it is: x",
    )


def test_describing_another_brokers_configs_is_kafkas_invalid_request(module_broker):
    answers = raw_describe(
        module_broker.bootstrap, [(BROKER_RESOURCE, "7"), (BROKER_RESOURCE, "x")]
    )
    assert [(a.error_code, a.error_message) for a in answers] == [
        (
            ErrorCode.INVALID_REQUEST,
            "Unexpected broker id, expected 0 or empty string, but received 7",
        ),
        (ErrorCode.INVALID_REQUEST, "Broker id must be an integer, but it is: x"),
    ]


# Group configs: Kafka 3.7 has no GROUP config resource (KIP-848's group configs came in 3.9);
# its ConfigResource.Type reads 32 as UNKNOWN. -----------------------------------------------

KAFKA_INVALID_REQUEST = (
    "This most likely occurs because of a request being malformed by the client library or "
    "the message was sent to an incompatible broker. See the broker logs for more details."
)


def test_group_configs_are_refused_as_kafka_3_7_refuses_them(module_broker, clients, kp_admin):
    bootstrap = module_broker.bootstrap
    admin = clients.admin(bootstrap)
    topic = new_topic(clients, bootstrap, "beside-group")
    # DescribeConfigs: the unknown type fails the whole request, the topic beside it too.
    group = ConfigResource(ResourceType.GROUP, "g1")
    futures = admin.describe_configs(
        [group, ConfigResource(ResourceType.TOPIC, topic)], request_timeout=TIMEOUT
    )
    for future in futures.values():
        error = refusal(future)
        assert (error.code(), error.str()) == (KafkaError.INVALID_REQUEST, KAFKA_INVALID_REQUEST)
    # Incremental and legacy AlterConfigs: that resource alone, "Unknown resource type 32".
    change = ConfigEntry(
        "consumer.session.timeout.ms", "50000", incremental_operation=AlterConfigOpType.SET
    )
    group = ConfigResource(ResourceType.GROUP, "g1", incremental_configs=[change])
    error = refusal(admin.incremental_alter_configs([group], request_timeout=TIMEOUT)[group])
    assert (error.code(), error.str()) == (KafkaError.INVALID_REQUEST, "Unknown resource type 32")

    answer = kp_admin.alter_configs(
        [
            KpConfigResource(ConfigResourceType.GROUP, "g1", {"consumer.session.timeout.ms": "1"}),
            KpConfigResource(ConfigResourceType.TOPIC, topic, {"segment.jitter.ms": "3"}),
        ],
        raise_on_unknown=False,
        incremental=False,
    )
    assert answer == {
        "group": {"g1": "[Error 42] InvalidRequestError: Unknown resource type 32"},
        "topic": {topic: "OK"},
    }
    assert described(admin, topic)["segment.jitter.ms"].value == "3"
    answers = raw_describe(bootstrap, [(GROUP_RESOURCE, "g1"), (BROKER_RESOURCE, "0")])
    assert [(a.error_code, a.error_message, list(a.configs)) for a in answers] == [
        (ErrorCode.INVALID_REQUEST, KAFKA_INVALID_REQUEST, [])
    ] * 2


def raw_change(bootstrap: str, name: str, configs: dict[str, str | None]) -> tuple[int, Any]:
    """IncrementalAlterConfigs of broker resource ``name``: SET each, DELETE those None."""
    changes = ((k, int(v is None), v) for k, v in configs.items())
    return raw_incremental(bootstrap, BROKER_RESOURCE, name, *changes)


LEADER_RATE = "leader.replication.throttled.rate"
DYNAMIC_BROKER_SOURCE = ConfigSource.DYNAMIC_BROKER_CONFIG.value
DYNAMIC_DEFAULT_SOURCE = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value


def test_throttle_rates_set_cluster_wide_and_per_broker(module_broker, clients, kp_admin):
    """Kafka's --entity-default rate applies to every broker without its own."""
    bootstrap = module_broker.bootstrap
    admin = clients.admin(bootstrap)

    def rate() -> tuple[str, int, bool]:
        (future,) = admin.describe_configs(
            [ConfigResource(ResourceType.BROKER, "0")], request_timeout=TIMEOUT
        ).values()
        entry = future.result(timeout=TIMEOUT)[LEADER_RATE]
        return entry.value, entry.source, entry.is_read_only

    try:
        assert raw_change(bootstrap, "", {LEADER_RATE: "5000"}) == (ErrorCode.NONE, None)
        assert rate() == ("5000", DYNAMIC_DEFAULT_SOURCE, False)
        (cluster_wide,) = raw_describe(bootstrap, [(BROKER_RESOURCE, "")])
        assert {c.name: (c.value, c.config_source) for c in cluster_wide.configs}[LEADER_RATE] == (
            "5000",
            DYNAMIC_DEFAULT_SOURCE,
        )

        answer = kp_admin.alter_configs(
            [KpConfigResource(ConfigResourceType.BROKER, "0", {LEADER_RATE: "9000"})],
            incremental=True,
        )
        assert answer == {"broker": {"0": "OK"}}
        assert rate() == ("9000", DYNAMIC_BROKER_SOURCE, False)
        found = kp_admin.describe_configs(
            [KpConfigResource(ConfigResourceType.BROKER, "0")], config_filter="all"
        )["broker"]["0"][LEADER_RATE]
        assert (found["value"], found["config_source"]) == ("9000", "DYNAMIC_BROKER_CONFIG")
        assert raw_change(bootstrap, "0", {LEADER_RATE: None}) == (ErrorCode.NONE, None)
        assert rate() == ("5000", DYNAMIC_DEFAULT_SOURCE, False)

        # A bad rate refuses the whole resource before anything of it is stored.
        code, message = raw_change(bootstrap, "", {"log.retention.ms": "1000", LEADER_RATE: "-3"})
        assert code == ErrorCode.INVALID_CONFIG and LEADER_RATE in message
        (cluster_wide,) = raw_describe(bootstrap, [(BROKER_RESOURCE, "")])
        values = {c.name: (c.value, c.config_source) for c in cluster_wide.configs}
        assert values["log.retention.ms"] == ("604800000", DEFAULT_SOURCE)
        assert values[LEADER_RATE] == ("5000", DYNAMIC_DEFAULT_SOURCE)
    finally:
        assert raw_change(bootstrap, "", {LEADER_RATE: None}) == (ErrorCode.NONE, None)
    assert rate() == (str((1 << 63) - 1), DEFAULT_SOURCE, False)


def test_the_cluster_wide_compression_type_recompresses_every_topic_without_one(
    module_broker, clients
):
    """Kafka's broker config compression.type (no log. prefix), set for the cluster."""
    bootstrap = module_broker.bootstrap
    admin = clients.admin(bootstrap)
    own = new_topic(clients, bootstrap, "own-codec", **{"compression.type": "lz4"})
    try:
        assert raw_change(bootstrap, "", {"compression.type": "gzip"}) == (ErrorCode.NONE, None)
        plain = new_topic(clients, bootstrap, "cluster-codec")
        found = described(admin, plain)["compression.type"]
        assert (found.value, found.source) == ("gzip", DYNAMIC_DEFAULT_SOURCE)
        producer = clients.producer(bootstrap, {"compression.type": "zstd"})
        for topic in (plain, own):
            reports = clients.produce_all(producer, topic, [{"value": b"cluster" * 40}])
            assert reports[0][0] is None
        assert stored_codecs(bootstrap, plain) == ([Compression.GZIP], [b"cluster" * 40])
        assert stored_codecs(bootstrap, own) == ([Compression.LZ4], [b"cluster" * 40])
        code, message = raw_change(bootstrap, "", {"compression.type": "brotli"})
        assert code == ErrorCode.INVALID_CONFIG and "compression.type" in message
    finally:
        assert raw_change(bootstrap, "", {"compression.type": None}) == (ErrorCode.NONE, None)
    assert described(admin, plain)["compression.type"].value == "producer"
