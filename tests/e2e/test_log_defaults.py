"""Cluster-wide defaults of topic configs (Kafka's dynamic broker defaults, what
`kafka-configs --alter --entity-type brokers --entity-default` sets) against a cluster of one
broker and two controllers: they switch old consumers off and on without a restart, show in
DescribeConfigs with their source, are refused when bad, and outlive the active controller.

librdkafka (so confluent-kafka's AdminClient) and kafka-python's admin refuse to name the
default entity, the broker resource "", so its AlterConfigs, IncrementalAlterConfigs and
DescribeConfigs go raw (kafka-python's protocol classes); confluent-kafka's AdminClient
describes broker "0" and topics and is refused a per-broker change.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from directlog.protocol.errors import ErrorCode
from directlog.records.batch import Record, build_batch
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.conftest import Clients, _stop_checked
from tests.e2e.controller import ControllerProcess
from tests.e2e.records import produce_raw, raw_request, recent_base_timestamp
from tests.e2e.test_old_consumers import (
    DOWN_CONVERSION,
    Produced,
    assert_refused_and_served,
    describe,
    expected,
    legacy_records,
    make_records,
    old_fetch,
    produce,
)

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.admin import (
        AlterConfigsRequest,
        DescribeConfigsRequest,
        IncrementalAlterConfigsRequest,
    )

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 15  # seconds, for each admin future
DEFAULT = ConfigSource.DEFAULT_CONFIG.value
DYNAMIC_DEFAULT = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
TOPIC = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
SWITCH = f"log.{DOWN_CONVERSION}"
BROKER = 4  # the broker config resource type; named "", the cluster-wide default entity
SET, DELETE = 0, 1
Answer = tuple[int, str | None]  # a resource's error code and message
OK: Answer = (ErrorCode.NONE, None)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("log-defaults"), controllers=2).start()
    try:
        yield running
        _stop_checked(running.brokers[0])
    finally:
        running.stop()


@pytest.fixture
def admin(cluster: Cluster, clients: Clients) -> Iterator[Any]:
    """An AdminClient; the cluster-wide defaults a test set are gone after it."""
    yield clients.admin(cluster.bootstrap)
    assert replace_defaults(cluster.bootstrap, {}) == OK


def alter_defaults(
    bootstrap: str, configs: Mapping[str, str | None], validate_only: bool = False
) -> Answer:
    """IncrementalAlterConfigs of the default entity: SET each config, DELETE those whose
    value is None."""
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    entries = [
        resource.AlterableConfig(
            name=name, config_operation=DELETE if value is None else SET, value=value
        )
        for name, value in configs.items()
    ]
    request = IncrementalAlterConfigsRequest(
        version=1,
        resources=[resource(resource_type=BROKER, resource_name="", configs=entries)],
        validate_only=validate_only,
    )
    (answer,) = raw_request(bootstrap, request).responses
    return answer.error_code, answer.error_message


def replace_defaults(bootstrap: str, configs: Mapping[str, str]) -> Answer:
    """The legacy AlterConfigs of the default entity: ``configs`` become the only ones."""
    resource = AlterConfigsRequest.AlterConfigsResource
    entries = [resource.AlterableConfig(name=n, value=v) for n, v in configs.items()]
    request = AlterConfigsRequest(
        version=1,
        resources=[resource(resource_type=BROKER, resource_name="", configs=entries)],
        validate_only=False,
    )
    (answer,) = raw_request(bootstrap, request).responses
    return answer.error_code, answer.error_message


def describe_default(bootstrap: str, name: str) -> tuple[str, int, bool]:
    """DescribeConfigs of the default entity: a config's value, source and read_only."""
    request = DescribeConfigsRequest(
        version=3,
        resources=[
            DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=BROKER, resource_name="", configuration_keys=[name]
            )
        ],
        include_synonyms=False,
        include_documentation=False,
    )
    (result,) = raw_request(bootstrap, request).results
    assert result.error_code == ErrorCode.NONE
    (found,) = result.configs
    return found.value, found.config_source, found.read_only


def source(admin: Any, kind: ResourceType, name: str, key: str) -> tuple[str, int, bool]:
    """A config's value, source and is_default as DescribeConfigs answers them."""
    found = describe(admin, kind, name)[key]
    return found.value, found.source, found.is_default


def produced(clients: Clients, cluster: Cluster, label: str, **config: str) -> Produced:
    topic = f"{label}-{uuid.uuid4().hex[:8]}"
    clients.create_topic(cluster.bootstrap, topic, config=config or None)
    records = Produced(topic, "gzip", make_records(40, label, len(label)))
    produce(clients, cluster.bootstrap, records)
    return records


def served_v3(bootstrap: str, topic: Produced) -> bool:
    """Whether a raw Fetch v3 of the topic gets its records. NOT_LEADER_OR_FOLLOWER is
    retried, as a client retries it: right after a controller failover the broker
    registers again and takes a full image, and may answer it for a moment."""
    deadline = time.monotonic() + 30
    while True:
        (answer,) = old_fetch(bootstrap, 3, [(topic.topic, 0)]).values()
        if answer.error_code != ErrorCode.NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if answer.error_code == ErrorCode.UNSUPPORTED_VERSION:
        return False
    assert answer.error_code == ErrorCode.NONE
    got = legacy_records(answer.records, 1)
    assert got and got == expected(topic.records, 1)[: len(got)]
    return True


def test_the_default_switches_old_consumers_off_and_on(cluster, admin, clients):
    bootstrap = cluster.bootstrap
    plain = produced(clients, cluster, "plain")
    allowed = produced(clients, cluster, "allowed", **{DOWN_CONVERSION: "true"})
    assert served_v3(bootstrap, plain)

    assert alter_defaults(bootstrap, {SWITCH: "false"}) == OK
    assert describe_default(bootstrap, SWITCH) == ("false", DYNAMIC_DEFAULT, False)
    found = describe(admin, ResourceType.BROKER, "0")[SWITCH]
    assert (found.value, found.source, found.is_default, found.is_read_only) == (
        "false",
        DYNAMIC_DEFAULT,
        False,
        False,
    )
    assert source(admin, ResourceType.TOPIC, plain.topic, DOWN_CONVERSION) == (
        "false",
        DYNAMIC_DEFAULT,
        False,
    )
    assert source(admin, ResourceType.TOPIC, allowed.topic, DOWN_CONVERSION) == (
        "true",
        TOPIC,
        False,
    )
    assert_refused_and_served(bootstrap, plain, allowed)
    (answer,) = old_fetch(bootstrap, 4, [(plain.topic, 0)]).values()  # nothing to convert
    assert answer.error_code == ErrorCode.NONE

    assert alter_defaults(bootstrap, {SWITCH: None}) == OK
    assert describe_default(bootstrap, SWITCH) == ("true", DEFAULT, False)
    assert source(admin, ResourceType.TOPIC, plain.topic, DOWN_CONVERSION) == (
        "true",
        DEFAULT,
        True,
    )
    assert served_v3(bootstrap, plain) and served_v3(bootstrap, allowed)


def test_a_retention_default_reaches_topics_without_an_override(cluster, admin, clients):
    bootstrap = cluster.bootstrap
    plain, custom, later = (f"{label}-{uuid.uuid4().hex[:8]}" for label in "pcl")
    clients.create_topic(bootstrap, plain)
    clients.create_topic(bootstrap, custom, config={"retention.ms": "7200000"})

    assert alter_defaults(bootstrap, {"log.retention.ms": "3600000"}) == OK
    assert source(admin, ResourceType.BROKER, "0", "log.retention.ms") == (
        "3600000",
        DYNAMIC_DEFAULT,
        False,
    )
    assert source(admin, ResourceType.TOPIC, plain, "retention.ms") == (
        "3600000",
        DYNAMIC_DEFAULT,
        False,
    )
    assert source(admin, ResourceType.TOPIC, custom, "retention.ms") == ("7200000", TOPIC, False)
    clients.create_topic(bootstrap, later)  # topics created later inherit it too
    assert source(admin, ResourceType.TOPIC, later, "retention.ms")[:2] == (
        "3600000",
        DYNAMIC_DEFAULT,
    )

    # validate_only changes nothing; the legacy AlterConfigs replaces the defaults whole.
    assert alter_defaults(bootstrap, {"log.retention.ms": "1000"}, validate_only=True) == OK
    assert source(admin, ResourceType.TOPIC, plain, "retention.ms")[0] == "3600000"
    assert replace_defaults(bootstrap, {"log.roll.ms": "600000"}) == OK
    assert source(admin, ResourceType.TOPIC, plain, "retention.ms") == ("604800000", DEFAULT, True)
    assert source(admin, ResourceType.TOPIC, plain, "segment.ms")[:2] == ("600000", DYNAMIC_DEFAULT)


def test_bad_defaults_are_refused(cluster, admin):
    bootstrap = cluster.bootstrap
    code, message = alter_defaults(bootstrap, {"log.retention.ms": "abc"})
    assert code == ErrorCode.INVALID_CONFIG and "log.retention.ms" in str(message)
    for name in ("num.io.threads", "log.no.such.config"):
        code, message = alter_defaults(bootstrap, {name: "8"})
        assert code == ErrorCode.INVALID_REQUEST and name in str(message)
    # remote.storage.enable needs remote.log.storage.system.enable on the broker.
    code, _ = alter_defaults(bootstrap, {"log.remote.storage.enable": "true"})
    assert code == ErrorCode.INVALID_CONFIG
    # A failed change leaves the others of the same resource undone too.
    code, _ = alter_defaults(bootstrap, {"log.roll.ms": "600000", "log.retention.ms": "-5"})
    assert code == ErrorCode.INVALID_CONFIG
    assert describe_default(bootstrap, "log.roll.ms")[1] == DEFAULT


def alter_broker(admin: Any, changes: Mapping[str, tuple[AlterConfigOpType, str | None]]) -> None:
    """IncrementalAlterConfigs of broker "0" with confluent-kafka's admin client."""
    entries = [ConfigEntry(n, v, incremental_operation=op) for n, (op, v) in changes.items()]
    one_broker = ConfigResource(ResourceType.BROKER, "0", incremental_configs=entries)
    (future,) = admin.incremental_alter_configs([one_broker], request_timeout=TIMEOUT).values()
    future.result(timeout=TIMEOUT)


def test_a_brokers_own_defaults_hold_for_its_partitions(cluster, admin, clients):
    """Kafka's per-broker log.* configs (kafka-configs --entity-type brokers --entity-name 0):
    over the cluster-wide default, under a topic's override, shown with their source."""
    bootstrap = cluster.bootstrap
    topic = f"own-{uuid.uuid4().hex[:8]}"
    clients.create_topic(bootstrap, topic)
    big = build_batch([Record(0, recent_base_timestamp(), b"k", b"v" * 2000)])
    assert alter_defaults(bootstrap, {"message.max.bytes": "5000"}) == OK
    set_ = AlterConfigOpType.SET
    try:
        alter_broker(
            admin,
            {
                "message.max.bytes": (set_, "1000"),
                "log.cleanup.policy": (AlterConfigOpType.APPEND, "compact"),
            },
        )
        dynamic_broker = ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert source(admin, ResourceType.BROKER, "0", "message.max.bytes") == (
            "1000",
            dynamic_broker,
            False,
        )
        assert source(admin, ResourceType.BROKER, "0", "log.cleanup.policy")[:2] == (
            "delete,compact",
            dynamic_broker,
        )
        assert describe_default(bootstrap, "message.max.bytes")[:2] == ("5000", DYNAMIC_DEFAULT)
        assert source(admin, ResourceType.TOPIC, topic, "max.message.bytes") == (
            "1000",
            dynamic_broker,
            False,
        )
        assert produce_raw(bootstrap, topic, big)[0] == ErrorCode.MESSAGE_TOO_LARGE

        alter_broker(admin, {"message.max.bytes": (AlterConfigOpType.DELETE, None)})
        assert source(admin, ResourceType.TOPIC, topic, "max.message.bytes")[:2] == (
            "5000",
            DYNAMIC_DEFAULT,
        )
        assert produce_raw(bootstrap, topic, big) == (ErrorCode.NONE, 0)

        # A bad value is refused with Kafka's code, and nothing of the request is applied.
        entries = {"log.retention.ms": (set_, "60000"), "log.roll.ms": (set_, "soon")}
        with pytest.raises(KafkaException) as refused:
            alter_broker(admin, entries)
        assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
        assert source(admin, ResourceType.BROKER, "0", "log.retention.ms")[1] == DEFAULT
    finally:
        alter_broker(admin, {"log.cleanup.policy": (AlterConfigOpType.DELETE, None)})


def active_controller(cluster: Cluster) -> ControllerProcess:
    def active(controller: ControllerProcess) -> bool:
        return controller.running and controller.sample("directlog_controller_active") == 1

    wait_for(lambda: any(map(active, cluster.controllers)), 30, "an active controller")
    return next(filter(active, cluster.controllers))


def test_the_defaults_outlive_the_active_controller(cluster, admin, clients):
    """The store keeps them: the standby that takes over after a SIGKILL, and the restarted
    controller that takes over after a SIGTERM, stream them to the broker (one that had lost
    them would stream none with its first change)."""
    bootstrap = cluster.bootstrap
    plain = produced(clients, cluster, "failover")
    wanted = {SWITCH: "false", "log.retention.ms": "3600000"}
    assert alter_defaults(bootstrap, wanted) == OK
    for stop, segment_ms in ((ControllerProcess.kill, "60000"), (ControllerProcess.stop, "120000")):
        first = active_controller(cluster)
        stop(first)
        # The broker answers REQUEST_TIMED_OUT until the other controller has taken over.
        change = {"log.roll.ms": segment_ms}
        wait_for(
            lambda: alter_defaults(bootstrap, change) == OK,  # noqa: B023
            60,
            "a change through the new active controller",
        )
        assert active_controller(cluster) is not first
        for name, value in wanted.items():
            assert source(admin, ResourceType.BROKER, "0", name) == (value, DYNAMIC_DEFAULT, False)
        assert source(admin, ResourceType.TOPIC, plain.topic, "segment.ms")[0] == segment_ms
        assert not served_v3(bootstrap, plain)
        first.start()  # back, as the standby
