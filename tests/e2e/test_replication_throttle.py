"""Replication throttles (what `kafka-reassign-partitions --throttle` sets) against three
brokers and two controllers: the per-broker rates round-trip through kafka-python's and
confluent-kafka's admin clients with their source, outlive the active controller and a
broker restart, and bad values are refused; a reassignment under a low leader or follower
throttle is bound by it, and completes once the throttle is gone.

The bound is checked from the server side, as an upper bound only (a loaded machine can
only make a copy slower): the new replica's log, sampled on disk, never holds more than
rate x (time since the throttle was in force + 2 s) + slack; the copy is a few times larger
than that bound allows within the sampling, so the replica is also seen not to have it all.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from tests.e2e.cluster import Cluster, eventually, wait_for
from tests.e2e.conftest import Clients
from tests.e2e.controller import ControllerProcess

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import TopicPartition
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import KafkaAdminClient

pytestmark = pytest.mark.timeout(240)

LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
TIMEOUT = 15  # seconds, for each admin future
DYNAMIC_BROKER = 2  # Kafka's ConfigSource.DYNAMIC_BROKER_CONFIG
DEFAULT = 5  # ConfigSource.DEFAULT_CONFIG
LONG_MAX = str((1 << 63) - 1)
FETCH_MAX = 64 * 1024  # replica_fetch_max_bytes: what one follower fetch may bring
RATE = 100_000  # bytes/s
VALUE = 4096  # bytes per record
RECORDS = 750  # about 3 MB
SAMPLING = 6.0  # seconds the throttled copy is watched


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(
        tmp_path_factory.mktemp("throttle"),
        brokers=3,
        controllers=2,
        broker_settings={"replica_fetch_max_bytes": FETCH_MAX},
    ) as running:
        yield running


@pytest.fixture
def kadmin(cluster: Cluster) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
    yield admin
    admin.close()


def incremental(admin: Any, broker: int, **configs: str | None) -> None:
    """confluent-kafka's IncrementalAlterConfigs of broker ``broker``: SET each config,
    DELETE those whose value is None (names with '_' for '.')."""
    entries = [
        ConfigEntry(
            name.replace("_", "."),
            value,
            incremental_operation=AlterConfigOpType.DELETE
            if value is None
            else AlterConfigOpType.SET,
        )
        for name, value in configs.items()
    ]
    resource = ConfigResource(ResourceType.BROKER, str(broker), incremental_configs=entries)
    (future,) = admin.incremental_alter_configs([resource], request_timeout=TIMEOUT).values()
    future.result(timeout=TIMEOUT)


def described(admin: Any, broker: int) -> dict[str, tuple[str, int]]:
    """The throttle rates broker ``broker`` reports (confluent-kafka): value and source."""
    (future,) = admin.describe_configs(
        [ConfigResource(ResourceType.BROKER, str(broker))], request_timeout=TIMEOUT
    ).values()
    entries = future.result(timeout=TIMEOUT)
    return {n: (e.value, e.source) for n, e in entries.items() if n in (LEADER_RATE, FOLLOWER_RATE)}


def refused(admin: Any, resource: ConfigResource) -> KafkaError:
    (future,) = admin.incremental_alter_configs([resource], request_timeout=TIMEOUT).values()
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=TIMEOUT)
    error: KafkaError = raised.value.args[0]
    return error


def set_on(name: str, value: str) -> list[ConfigEntry]:
    return [ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)]


def test_rates_round_trip_through_both_admin_clients(cluster, clients, kadmin):
    admin = clients.admin(cluster.bootstrap)
    assert described(admin, 1) == {
        LEADER_RATE: (LONG_MAX, DEFAULT),
        FOLLOWER_RATE: (LONG_MAX, DEFAULT),
    }

    # kafka-python: IncrementalAlterConfigs (it finds the rates among the dynamic configs).
    result = kadmin.alter_configs([KConfigResource("BROKER", "1", {LEADER_RATE: "100000"})])
    assert result == {"broker": {"1": "OK"}}
    found = kadmin.describe_configs([KConfigResource("BROKER", "1")], config_filter="modified")
    assert {k: (v["value"], v["config_source"]) for k, v in found["broker"]["1"].items()} == {
        LEADER_RATE: ("100000", "DYNAMIC_BROKER_CONFIG")
    }
    # confluent-kafka: SET and DELETE; only broker 1 has them.
    incremental(admin, 1, follower_replication_throttled_rate="200000")
    assert described(admin, 1) == {
        LEADER_RATE: ("100000", DYNAMIC_BROKER),
        FOLLOWER_RATE: ("200000", DYNAMIC_BROKER),
    }
    assert described(admin, 0)[LEADER_RATE] == (LONG_MAX, DEFAULT)
    incremental(admin, 1, leader_replication_throttled_rate=None)
    assert described(admin, 1) == {
        LEADER_RATE: (LONG_MAX, DEFAULT),
        FOLLOWER_RATE: ("200000", DYNAMIC_BROKER),
    }
    # kafka-python's legacy AlterConfigs replaces them all (it sends the other set ones too).
    result = kadmin.alter_configs(
        [KConfigResource("BROKER", "1", {LEADER_RATE: "300"})], incremental=False
    )
    assert result == {"broker": {"1": "OK"}}
    assert described(admin, 1) == {
        LEADER_RATE: ("300", DYNAMIC_BROKER),
        FOLLOWER_RATE: ("200000", DYNAMIC_BROKER),
    }
    kadmin.reset_configs([KConfigResource("BROKER", "1", [LEADER_RATE, FOLLOWER_RATE])])
    assert described(admin, 1)[FOLLOWER_RATE] == (LONG_MAX, DEFAULT)


def test_bad_values_are_refused(cluster, clients):
    admin = clients.admin(cluster.bootstrap)
    for value in ("abc", "-1", "1.5"):
        error = refused(
            admin, ConfigResource("BROKER", "1", incremental_configs=set_on(LEADER_RATE, value))
        )
        assert error.code() == KafkaError.INVALID_CONFIG and LEADER_RATE in error.str()
    error = refused(
        admin, ConfigResource("BROKER", "1", incremental_configs=set_on("num.io.threads", "8"))
    )
    assert error.code() == KafkaError.INVALID_CONFIG and "num.io.threads" in error.str()
    # A broker's own log.* defaults are checked as the topic configs they stand for.
    error = refused(
        admin, ConfigResource("BROKER", "1", incremental_configs=set_on("log.retention.ms", "x"))
    )
    assert error.code() == KafkaError.INVALID_CONFIG and "log.retention.ms" in error.str()
    assert described(admin, 1)[LEADER_RATE] == (LONG_MAX, DEFAULT)

    topic = "bad-throttled-replicas"
    clients.create_topic(cluster.bootstrap, topic)
    for name in (LEADER_REPLICAS, FOLLOWER_REPLICAS):
        for value in ("0:x", "0-1", "*,0:1"):
            error = refused(
                admin, ConfigResource("TOPIC", topic, incremental_configs=set_on(name, value))
            )
            assert error.code() == KafkaError.INVALID_CONFIG and name in error.str()
    for value in ("*", "0:1,0:2"):
        resource = ConfigResource(
            "TOPIC", topic, incremental_configs=set_on(LEADER_REPLICAS, value)
        )
        (future,) = admin.incremental_alter_configs([resource], request_timeout=TIMEOUT).values()
        future.result(timeout=TIMEOUT)
        (future,) = admin.describe_configs([ConfigResource("TOPIC", topic)]).values()
        assert future.result(timeout=TIMEOUT)[LEADER_REPLICAS].value == value


def active_controller(cluster: Cluster) -> ControllerProcess:
    def active(controller: ControllerProcess) -> bool:
        return controller.running and controller.sample("directlog_controller_active") == 1

    wait_for(lambda: any(map(active, cluster.controllers)), 30, "an active controller")
    return next(filter(active, cluster.controllers))


def test_the_rates_outlive_the_active_controller_and_a_broker_restart(cluster, clients):
    """The store keeps them: the controller that takes over streams them (a change through
    it first, so the broker has its full image), and a restarted broker gets them back."""
    admin = clients.admin(cluster.bootstrap)
    incremental(admin, 1, leader_replication_throttled_rate="12345")
    first = active_controller(cluster)
    first.kill()
    wait_for(
        lambda: _ok(lambda: incremental(admin, 2, follower_replication_throttled_rate="777")),
        60,
        "a change through the new active controller",
    )
    assert active_controller(cluster) is not first
    assert described(admin, 1)[LEADER_RATE] == ("12345", DYNAMIC_BROKER)
    first.start()  # back, as the standby
    cluster.brokers[1].restart()
    cluster.wait_live({0, 1, 2})
    admin = clients.admin(cluster.bootstrap)
    assert eventually(lambda: described(admin, 1), "broker 1 described", 30)[LEADER_RATE] == (
        "12345",
        DYNAMIC_BROKER,
    )
    assert described(admin, 2)[FOLLOWER_RATE] == ("777", DYNAMIC_BROKER)
    incremental(admin, 1, leader_replication_throttled_rate=None)
    incremental(admin, 2, follower_replication_throttled_rate=None)


def _ok(action: Any) -> bool:
    try:
        action()
    except KafkaException:
        return False
    return True


# Throttled reassignments -------------------------------------------------------------------


def log_bytes(broker_dir: Path, topic: str) -> int:
    """The bytes of a replica's log on disk (its segments, not preallocated)."""
    return sum(p.stat().st_size for p in (broker_dir / f"{topic}-0").glob("*.log"))


def produced_topic(cluster: Cluster, clients: Clients, kadmin: KafkaAdminClient, topic: str) -> int:
    """A one-replica topic holding about 3 MB in batches of at most 32 KB; its leader."""
    clients.create_topic(cluster.bootstrap, topic)
    producer = clients.producer(cluster.bootstrap, {"acks": "all", "batch.size": 32768})
    payload = b"x" * VALUE
    clients.produce_all(producer, topic, [{"value": payload} for _ in range(RECORDS)], 60)
    (described_topic,) = kadmin.describe_topics([topic])
    (partition,) = described_topic["partitions"]
    return int(partition["leader_id"])


def watch_throttled_copy(cluster: Cluster, topic: str, newcomer: int, since: float) -> int:
    """Sample the new replica's log while the throttle is in force: never above the bound.
    Returns the bytes it held last."""
    folder = cluster.brokers[newcomer].data_dir
    slack = 4 * 32768 + FETCH_MAX  # batches past an allowance, one fetch past the follower's
    held = 0
    while time.monotonic() - since < SAMPLING:
        held = log_bytes(folder, topic)
        elapsed = time.monotonic() - since  # read after the size: the bound only grows
        assert held <= RATE * (elapsed + 2.0) + slack, (held, elapsed)
        time.sleep(0.2)
    return held


def reassign_throttled(
    cluster: Cluster, clients: Clients, kadmin: KafkaAdminClient, topic: str, side: str
) -> None:
    leader = produced_topic(cluster, clients, kadmin, topic)
    full = log_bytes(cluster.brokers[leader].data_dir, topic)
    assert full >= RECORDS * VALUE
    newcomer = (leader + 1) % 3
    admin = clients.admin(cluster.bootstrap)
    if side == "leader":
        # Kafka's format: the replicas that send, named on the brokers they send from.
        throttled, replicas, rate_broker = LEADER_REPLICAS, f"0:{leader}", leader
        incremental(admin, leader, leader_replication_throttled_rate=str(RATE))
    else:
        throttled, replicas, rate_broker = FOLLOWER_REPLICAS, f"0:{newcomer}", newcomer
        incremental(admin, newcomer, follower_replication_throttled_rate=str(RATE))
    resource = ConfigResource("TOPIC", topic, incremental_configs=set_on(throttled, replicas))
    (future,) = admin.incremental_alter_configs([resource], request_timeout=TIMEOUT).values()
    future.result(timeout=TIMEOUT)

    since = time.monotonic()
    target = [leader, newcomer]
    assert kadmin.alter_partition_reassignments({TopicPartition(topic, 0): target}) == {
        TopicPartition(topic, 0): None
    }
    held = watch_throttled_copy(cluster, topic, newcomer, since)
    assert held < full  # the bound is far below the whole log
    assert kadmin.list_partition_reassignments()  # still under way

    # Throttle removed: the copy completes.
    name = f"{side}_replication_throttled_rate"
    incremental(admin, rate_broker, **{name: None})
    wait_for(lambda: not kadmin.list_partition_reassignments(), 90, "the reassignment to complete")
    (described_topic,) = kadmin.describe_topics([topic])
    (partition,) = described_topic["partitions"]
    assert sorted(partition["replica_nodes"]) == sorted(target)
    assert sorted(partition["isr_nodes"]) == sorted(target)
    assert log_bytes(cluster.brokers[newcomer].data_dir, topic) >= RECORDS * VALUE


def test_a_leader_throttle_bounds_a_reassignment(cluster, clients, kadmin):
    reassign_throttled(cluster, clients, kadmin, "throttled-by-leader", "leader")


def test_a_follower_throttle_bounds_a_reassignment(cluster, clients, kadmin):
    reassign_throttled(cluster, clients, kadmin, "throttled-by-follower", "follower")
