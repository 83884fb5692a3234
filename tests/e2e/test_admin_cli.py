"""The `directlog` admin command line, run as the console script it is installed as,
against real local clusters; each test checks what it printed and then reads the
cluster's state back with Kafka clients.

Reassignments, `brokers drain --wait`, `rebalance --execute` and `elect-leaders` need the
brokers to serve ElectLeaders, AlterPartitionReassignments and ListPartitionReassignments
(API keys 43, 45, 46).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.e2e.cluster import Cluster, eventually

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource

pytestmark = pytest.mark.timeout(240)

DIRECTLOG = Path(sys.executable).with_name("directlog")
RACKS = {0: "a", 1: "b", 2: "c"}
THROTTLE_RATES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
# __consumer_offsets with 2 replicas, so a 3-broker cluster can drain a broker.
SETTINGS = {"offsets_topic_replication_factor": 2}


def directlog(bootstrap: str, *args: str, expect: int | None = 0, timeout: float = 120) -> Any:
    """`directlog --bootstrap-server ... ARGS`; its completed process, having exited
    with `expect` (unless None)."""
    assert DIRECTLOG.exists(), f"{DIRECTLOG} is missing: pip install -e . installs it"
    done = subprocess.run(
        [str(DIRECTLOG), "--bootstrap-server", bootstrap, "--timeout", "20", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert expect is None or done.returncode == expect, (
        f"directlog {' '.join(args)} exited {done.returncode}, not {expect}\n"
        f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    )
    return done


def as_json(bootstrap: str, *args: str, expect: int = 0) -> Any:
    return json.loads(directlog(bootstrap, "--output", "json", *args, expect=expect).stdout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(
        tmp_path_factory.mktemp("cli-cluster"), brokers=3, racks=RACKS, broker_settings=SETTINGS
    ) as running:
        yield running


@pytest.fixture
def kadmin(cluster: Cluster) -> Iterator[Any]:
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        yield admin
    finally:
        admin.close()


def replicas_of(admin: Any, topic: str) -> dict[int, list[int]]:
    (described,) = admin.describe_topics([topic])
    return {p["partition_index"]: list(p["replica_nodes"]) for p in described["partitions"]}


def topic_configs(admin: Any, topic: str) -> dict[str, str]:
    found = admin.describe_configs([ConfigResource("TOPIC", topic)])["topic"][topic]
    return {k: v["value"] for k, v in found.items() if v["config_source"] == "DYNAMIC_TOPIC_CONFIG"}


def produce(clients: Any, bootstrap: str, topic: str, partitions: int, count: int) -> list[bytes]:
    producer = clients.producer(bootstrap, {"acks": "all"})
    values = [f"record {i}".encode() for i in range(count)]
    clients.produce_all(
        producer, topic, [{"value": v, "partition": i % partitions} for i, v in enumerate(values)]
    )
    return values


def read_all(clients: Any, bootstrap: str, topic: str, partitions: int, count: int) -> list[bytes]:
    consumer = clients.consumer(bootstrap)
    clients.assign_from(consumer, topic, list(range(partitions)))
    return sorted(m.value() for m in clients.consume(consumer, count, timeout=60))


# Topics ---------------------------------------------------------------------------------


def test_topics_create_list_describe_alter_delete(cluster, kadmin, topic_name):
    topic = topic_name("orders")
    done = directlog(
        cluster.bootstrap,
        "topics", "create", topic, "--partitions", "3", "--replication-factor", "2",
        "--config", "retention.ms=3600000", "--config", "cleanup.policy=delete",
    )  # fmt: skip
    assert f"Created topic {topic}." in done.stdout
    assert {p: len(r) for p, r in replicas_of(kadmin, topic).items()} == {0: 2, 1: 2, 2: 2}
    assert topic_configs(kadmin, topic) == {"retention.ms": "3600000", "cleanup.policy": "delete"}
    # Again: refused, unless it may exist already.
    again = ["topics", "create", topic, "--partitions", "3", "--replication-factor", "2"]
    refused = directlog(cluster.bootstrap, *again, expect=1)
    assert "TOPIC_ALREADY_EXISTS (36)" in refused.stderr
    assert "already exists" in directlog(cluster.bootstrap, *again, "--if-not-exists").stdout

    listed = directlog(cluster.bootstrap, "topics", "list").stdout
    assert any(line.split()[:3] == [topic, "3", "2"] for line in listed.splitlines())
    assert {"topic": topic, "partitions": 3, "replication_factor": 2, "internal": False} in (
        as_json(cluster.bootstrap, "topics", "list")
    )

    (described,) = as_json(cluster.bootstrap, "topics", "describe", topic)
    metadata = replicas_of(kadmin, topic)
    assert [(p["partition"], p["replicas"]) for p in described["partitions"]] == sorted(
        metadata.items()
    )
    for p in described["partitions"]:
        assert p["leader"] in p["replicas"] and set(p["isr"]) <= set(p["replicas"])
    assert described["configs"] == {"retention.ms": "3600000", "cleanup.policy": "delete"}
    text = directlog(cluster.bootstrap, "topics", "describe", topic).stdout
    assert f"Topic: {topic}  PartitionCount: 3  ReplicationFactor: 2" in text
    assert "retention.ms=3600000" in text

    done = directlog(
        cluster.bootstrap,
        "topics", "alter", topic, "--config", "segment.bytes=1048576",
        "--delete-config", "retention.ms", "--partitions", "5",
    )  # fmt: skip
    assert "now has 5 partitions (was 3)" in done.stdout
    assert len(replicas_of(kadmin, topic)) == 5
    assert topic_configs(kadmin, topic) == {"segment.bytes": "1048576", "cleanup.policy": "delete"}

    done = directlog(cluster.bootstrap, "topics", "delete", topic)
    assert f"Deleted topic {topic}." in done.stdout
    assert topic not in kadmin.list_topics()
    assert (
        "does not exist"
        in directlog(cluster.bootstrap, "topics", "delete", topic, "--if-exists").stdout
    )


def test_topic_commands_refuse_bad_input_and_change_nothing(cluster, kadmin, topic_name):
    topic = topic_name("kept")
    directlog(cluster.bootstrap, "topics", "create", topic, "--partitions", "2",
              "--replication-factor", "1")  # fmt: skip
    too_wide = topic_name("wide")
    refused = directlog(
        cluster.bootstrap, "topics", "create", too_wide, "--partitions", "1",
        "--replication-factor", "4", expect=1,
    )  # fmt: skip
    assert "INVALID_REPLICATION_FACTOR (38)" in refused.stderr
    refused = directlog(
        cluster.bootstrap, "topics", "create", too_wide, "--partitions", "-1",
        "--replication-factor", "1", expect=1,
    )  # fmt: skip
    assert "--partitions must be at least 1" in refused.stderr
    assert too_wide not in kadmin.list_topics()

    missing = topic_name("missing")
    refused = directlog(cluster.bootstrap, "topics", "describe", missing, expect=1)
    assert "UNKNOWN_TOPIC_OR_PARTITION" in refused.stderr and missing in refused.stderr
    # Fewer partitions, or a bad value beside a good one: the topic stays as it was.
    refused = directlog(cluster.bootstrap, "topics", "alter", topic, "--partitions", "1", expect=1)
    assert "can only raise" in refused.stderr
    refused = directlog(
        cluster.bootstrap, "topics", "alter", topic, "--config", "retention.ms=abc",
        "--partitions", "4", expect=1,
    )  # fmt: skip
    assert "INVALID_CONFIG (40)" in refused.stderr
    assert len(replicas_of(kadmin, topic)) == 2 and topic_configs(kadmin, topic) == {}
    refused = directlog(
        cluster.bootstrap, "topics", "alter", topic, "--config", "novalue", expect=1
    )
    assert "expected NAME=VALUE" in refused.stderr
    # A missing topic among those to delete: nothing is deleted.
    refused = directlog(cluster.bootstrap, "topics", "delete", topic, missing, expect=1)
    assert "nothing deleted" in refused.stderr
    assert topic in kadmin.list_topics()
    # A bad command line is argparse's exit 2.
    directlog(cluster.bootstrap, "topics", "create", topic, expect=2)


def test_unreachable_cluster_is_a_clear_error():
    done = subprocess.run(
        [str(DIRECTLOG), "--bootstrap-server", "127.0.0.1:1", "--timeout", "2", "topics", "list"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "cannot reach the cluster at 127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr


# Groups ---------------------------------------------------------------------------------


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Offsets committed for `group` by a consumer that then leaves (the group is Empty)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def committed(admin: Any, group: str) -> dict[int, int]:
    offsets = admin.list_group_offsets({group: None})[group]
    return {tp.partition: o.offset for tp, o in offsets.items()}


def test_groups_describe_shows_the_lag_after_a_commit(cluster, clients, topic_name):
    topic, group = topic_name("lagging"), topic_name("readers")
    directlog(cluster.bootstrap, "topics", "create", topic, "--partitions", "2",
              "--replication-factor", "2")  # fmt: skip
    produce(clients, cluster.bootstrap, topic, 2, 20)  # 10 records per partition
    commit(cluster.bootstrap, group, topic, {0: 4, 1: 10})

    listed = as_json(cluster.bootstrap, "groups", "list")
    assert any(g["group"] == group and g["state"] == "Empty" for g in listed), listed
    (described,) = as_json(cluster.bootstrap, "groups", "describe", group)
    assert described["state"] == "Empty" and described["members"] == []
    assert [
        (p["partition"], p["current_offset"], p["log_end_offset"], p["lag"])
        for p in described["partitions"]
    ] == [(0, 4, 10, 6), (1, 10, 10, 0)]
    text = directlog(cluster.bootstrap, "groups", "describe", group).stdout
    assert "CURRENT-OFFSET  LOG-END-OFFSET  LAG" in text
    assert any(line.split()[:5] == [topic, "0", "4", "10", "6"] for line in text.splitlines())

    missing = directlog(cluster.bootstrap, "groups", "describe", topic_name("nobody"), expect=1)
    assert "does not exist" in missing.stdout


def test_reset_offsets_dry_run_then_execute_and_refused_while_active(
    cluster, clients, kadmin, topic_name
):
    topic, group = topic_name("replay"), topic_name("replayers")
    directlog(cluster.bootstrap, "topics", "create", topic, "--partitions", "2",
              "--replication-factor", "2")  # fmt: skip
    produce(clients, cluster.bootstrap, topic, 2, 20)
    commit(cluster.bootstrap, group, topic, {0: 8, 1: 9})

    reset = ["groups", "reset-offsets", group, "--topic", f"{topic}:0,1"]
    dry = directlog(cluster.bootstrap, *reset, "--shift-by", "-5")
    assert "Dry run" in dry.stdout
    assert any(line.split()[1:] == [topic, "0", "8", "3"] for line in dry.stdout.splitlines())
    assert committed(kadmin, group) == {0: 8, 1: 9}  # nothing committed

    plan = as_json(cluster.bootstrap, *reset, "--shift-by", "-5", "--execute")
    assert plan["executed"] is True
    assert [(p["partition"], p["new_offset"]) for p in plan["partitions"]] == [(0, 3), (1, 4)]
    assert committed(kadmin, group) == {0: 3, 1: 4}
    directlog(cluster.bootstrap, "groups", "reset-offsets", group, "--topic", topic,
              "--to-earliest", "--execute")  # fmt: skip
    assert committed(kadmin, group) == {0: 0, 1: 0}
    # Beyond the log end: kept at the log end, as Kafka's tool does.
    directlog(cluster.bootstrap, *reset, "--to-offset", "1000", "--execute")
    assert committed(kadmin, group) == {0: 10, 1: 10}
    directlog(cluster.bootstrap, *reset, "--to-datetime", "2000-01-01T00:00:00Z", "--execute")
    assert committed(kadmin, group) == {0: 0, 1: 0}

    # A live member: refused, dry run or not, and nothing changes.
    consumer = clients.consumer(
        cluster.bootstrap, {"group.id": group, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert consumer.assignment()
    for extra in ([], ["--execute"]):
        refused = directlog(cluster.bootstrap, *reset, "--to-latest", *extra, expect=1)
        assert "active member" in refused.stderr and "inactive" in refused.stderr
    assert committed(kadmin, group) == {0: 0, 1: 0}
    refused = directlog(cluster.bootstrap, "groups", "delete", group, expect=1)
    assert "NON_EMPTY_GROUP" in refused.stdout
    consumer.close()

    done = directlog(cluster.bootstrap, "groups", "delete", group)
    assert f"Deleted group {group}." in done.stdout
    assert committed(kadmin, group) == {}


# Brokers --------------------------------------------------------------------------------


def test_brokers_list(cluster, kadmin, topic_name):
    topic = topic_name("spread")
    directlog(cluster.bootstrap, "topics", "create", topic, "--partitions", "3",
              "--replication-factor", "2")  # fmt: skip
    listed = as_json(cluster.bootstrap, "brokers", "list")
    assert [(b["id"], b["address"], b["rack"], b["live"]) for b in listed] == [
        (i, cluster.brokers[i].bootstrap, RACKS[i], True) for i in range(3)
    ]
    partitions = [p for t in kadmin.describe_topics() for p in t["partitions"]]
    for broker in listed:
        assert broker["replicas"] == sum(broker["id"] in p["replica_nodes"] for p in partitions)
        assert broker["leaders"] == sum(broker["id"] == p["leader_id"] for p in partitions)
    text = directlog(cluster.bootstrap, "brokers", "list").stdout
    assert text.splitlines()[0].split() == [
        "ID",
        "HOST:PORT",
        "RACK",
        "LIVE",
        "LEADERS",
        "REPLICAS",
    ]
    assert cluster.brokers[1].bootstrap in text


def test_drain_refused_when_it_would_leave_a_partition_short(cluster, kadmin, topic_name):
    topic = topic_name("everywhere")
    directlog(cluster.bootstrap, "topics", "create", topic, "--partitions", "2",
              "--replication-factor", "3")  # fmt: skip
    before = replicas_of(kadmin, topic)
    refused = directlog(cluster.bootstrap, "brokers", "drain", "0", expect=1)
    assert f"{topic}-0" in refused.stderr and f"{topic}-1" in refused.stderr
    assert "nothing was submitted" in refused.stderr
    assert replicas_of(kadmin, topic) == before
    refused = directlog(cluster.bootstrap, "brokers", "drain", "7", expect=1)
    assert "broker 7 is not in the cluster" in refused.stderr
    directlog(cluster.bootstrap, "topics", "delete", topic)


# Reassignment plans ---------------------------------------------------------------------


def test_bad_plans_are_refused_whole_and_nothing_moves(cluster, kadmin, topic_name, tmp_path):
    topic = topic_name("planned")
    directlog(cluster.bootstrap, "topics", "create", topic, "--partitions", "2",
              "--replication-factor", "2")  # fmt: skip
    before = replicas_of(kadmin, topic)
    good = {"topic": topic, "partition": 0, "replicas": [0, 1]}
    cases = {
        "unknown broker": ([good, {"topic": topic, "partition": 1, "replicas": [1, 9]}],
                           "broker(s) [9] are not live"),
        "unknown topic": ([good, {"topic": topic_name("nope"), "partition": 0, "replicas": [0]}],
                          "no topic"),
        "unknown partition": ([good, {"topic": topic, "partition": 7, "replicas": [0]}],
                              "has 2 partition(s)"),
        "duplicate replicas": ([good, {"topic": topic, "partition": 1, "replicas": [2, 2]}],
                               "more than once"),
        "empty replicas": ([good, {"topic": topic, "partition": 1, "replicas": []}],
                           "replica list is empty"),
        "negative partition": ([good, {"topic": topic, "partition": -1, "replicas": [0]}],
                               "integer >= 0"),
    }  # fmt: skip
    for name, (partitions, message) in cases.items():
        plan = tmp_path / f"{name.replace(' ', '-')}.json"
        plan.write_text(json.dumps({"version": 1, "partitions": partitions}))
        refused = directlog(cluster.bootstrap, "reassign", "execute", str(plan), expect=1)
        assert message in refused.stderr, name
        assert "nothing was submitted" in refused.stderr, name
    malformed = tmp_path / "malformed.json"
    malformed.write_text('{"version": 1, "partitions": [')
    refused = directlog(cluster.bootstrap, "reassign", "execute", str(malformed), expect=1)
    assert "not valid JSON" in refused.stderr
    refused = directlog(
        cluster.bootstrap, "reassign", "execute", str(tmp_path / "absent.json"), expect=1
    )
    assert "cannot read the plan" in refused.stderr
    assert replicas_of(kadmin, topic) == before


def test_reassign_generate_prints_a_balanced_plan_in_kafkas_format(cluster, kadmin, topic_name):
    topic = topic_name("generated")
    directlog(cluster.bootstrap, "topics", "create", topic, "--partitions", "4",
              "--replication-factor", "2")  # fmt: skip
    before = replicas_of(kadmin, topic)
    done = directlog(cluster.bootstrap, "reassign", "generate", "--brokers", "0,1",
                     "--topics", topic)  # fmt: skip
    plan = json.loads(done.stdout)
    assert plan["version"] == 1
    after = {**before, **{e["partition"]: e["replicas"] for e in plan["partitions"]}}
    assert all(e["topic"] == topic for e in plan["partitions"])
    assert all(sorted(r) == [0, 1] for r in after.values())
    assert sorted(r[0] for r in after.values()) == [0, 0, 1, 1]  # leaders even
    # Only what changes is listed, and nothing was submitted.
    assert {e["partition"] for e in plan["partitions"]} == {
        p for p, r in before.items() if r != after[p]
    }
    assert replicas_of(kadmin, topic) == before
    refused = directlog(cluster.bootstrap, "reassign", "generate", "--brokers", "0,8", expect=1)
    assert "[8]" in refused.stderr


def test_reassign_execute_verify_list(cluster, clients, kadmin, topic_name, tmp_path):
    topic = topic_name("moved")
    directlog(cluster.bootstrap, "topics", "create", topic, "--partitions", "2",
              "--replication-factor", "2")  # fmt: skip
    values = produce(clients, cluster.bootstrap, topic, 2, 200)
    before = replicas_of(kadmin, topic)
    target = {p: [b for b in (0, 1, 2) if b not in r] + [r[0]] for p, r in before.items()}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "version": 1,
        "partitions": [{"topic": topic, "partition": p, "replicas": r} for p, r in target.items()],
    }))  # fmt: skip

    # A throttle that is not a positive number is refused before anything is submitted.
    directlog(cluster.bootstrap, "reassign", "execute", str(plan), "--throttle", "0", expect=2)
    assert replicas_of(kadmin, topic) == before
    assert directlog(cluster.bootstrap, "reassign", "list").stdout.strip() == (
        "No reassignment is in progress."
    )

    done = directlog(cluster.bootstrap, "reassign", "execute", str(plan), "--throttle", "50000000")
    assert (
        "Started the reassignment of 2 partition(s), replication throttled to 50000000 bytes/s."
        in done.stdout
    )
    # The current assignment is printed, to roll back with.
    rollback = json.loads(done.stdout.strip().splitlines()[-1])
    assert {e["partition"]: e["replicas"] for e in rollback["partitions"]} == before
    # What kafka-reassign-partitions --throttle sets: the rates on every broker a moving
    # partition has or gets, the current replicas as leader-throttled and the added ones as
    # follower-throttled; they stay until verify finds the reassignment done.
    configs = topic_configs(kadmin, topic)
    leaders = {f"{p}:{b}" for p, r in before.items() for b in r}
    followers = {f"{p}:{b}" for p, r in target.items() for b in r if b not in before[p]}
    assert set(configs["leader.replication.throttled.replicas"].split(",")) == leaders
    assert set(configs["follower.replication.throttled.replicas"].split(",")) == followers
    for broker in range(3):
        resource = ConfigResource("BROKER", str(broker), list(THROTTLE_RATES))
        found = kadmin.describe_configs([resource], config_filter="modified")["broker"]
        assert {k: (v["value"], v["config_source"]) for k, v in found[str(broker)].items()} == {
            name: ("50000000", "DYNAMIC_BROKER_CONFIG") for name in THROTTLE_RATES
        }

    listed = as_json(cluster.bootstrap, "reassign", "list")
    for entry in listed:  # while it runs: target and current together, as KIP-455 says
        if entry["topic"] == topic:
            wanted = target[entry["partition"]]
            assert set(entry["replicas"]) >= set(wanted)
            assert set(entry["adding"]) <= set(wanted)

    def verified() -> Any:
        done = directlog(cluster.bootstrap, "reassign", "verify", str(plan), expect=None)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    done = eventually(verified, "the reassignment to complete", timeout=90, interval=1)
    assert "Every partition has its target replicas." in done.stdout
    assert "Removed the replication throttles" in done.stdout
    assert replicas_of(kadmin, topic) == target
    # verify removed the throttles once done
    assert not any(k.endswith("throttled.replicas") for k in topic_configs(kadmin, topic))
    for broker in range(3):
        resource = ConfigResource("BROKER", str(broker), list(THROTTLE_RATES))
        found = kadmin.describe_configs([resource], config_filter="modified")
        assert not found.get("broker", {}).get(str(broker)), found
    assert directlog(cluster.bootstrap, "reassign", "list").stdout.strip() == (
        "No reassignment is in progress."
    )
    assert read_all(clients, cluster.bootstrap, topic, 2, len(values)) == sorted(values)
    # Cancelling a finished plan cancels nothing.
    cancelled = as_json(cluster.bootstrap, "reassign", "cancel", str(plan))
    assert {c["result"] for c in cancelled} == {"no reassignment in progress"}


def test_elect_leaders(cluster, kadmin, topic_name):
    topic = topic_name("elected")
    directlog(cluster.bootstrap, "topics", "create", topic, "--partitions", "2",
              "--replication-factor", "2")  # fmt: skip
    results = as_json(cluster.bootstrap, "elect-leaders", "--topic", topic)
    # Fresh partitions are led by their preferred replica already.
    assert [(r["partition"], r["result"]) for r in results] == [
        (0, "already led by its preferred replica"),
        (1, "already led by its preferred replica"),
    ]
    (described,) = kadmin.describe_topics([topic])
    assert all(p["leader_id"] == p["replica_nodes"][0] for p in described["partitions"])
    one = as_json(cluster.bootstrap, "elect-leaders", "--topic", topic, "--partition", "1")
    assert [r["partition"] for r in one] == [1]
    refused = directlog(
        cluster.bootstrap, "elect-leaders", "--topic", topic, "--partition", "5", expect=1
    )
    assert "has 2 partition(s)" in refused.stderr


# Draining and rebalancing ---------------------------------------------------------------


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path / "cluster", brokers=3, racks=RACKS, broker_settings=SETTINGS) as c:
        yield c


def test_drain_moves_every_replica_off_a_broker_and_records_stay_readable(own_cluster, clients):
    cluster = own_cluster
    bootstrap = cluster.bootstrap
    topics = {"drained-a": 3, "drained-b": 2}
    values = {}
    for topic, partitions in topics.items():
        directlog(bootstrap, "topics", "create", topic, "--partitions", str(partitions),
                  "--replication-factor", "2")  # fmt: skip
        values[topic] = produce(clients, bootstrap, topic, partitions, 300)
    commit(bootstrap, "drain-readers", "drained-a", {0: 1})  # __consumer_offsets moves too
    held = {b["id"]: b["replicas"] for b in as_json(bootstrap, "brokers", "list")}
    assert held[1] > 0

    done = directlog(bootstrap, "brokers", "drain", "1", "--wait", timeout=200)
    assert "Broker 1 holds no replicas any more." in done.stdout

    listed = {b["id"]: b for b in as_json(bootstrap, "brokers", "list")}
    assert listed[1]["replicas"] == 0 and listed[1]["leaders"] == 0
    assert sum(b["replicas"] for b in listed.values()) == sum(held.values())
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        for topic in [*topics, "__consumer_offsets"]:
            for replicas in replicas_of(admin, topic).values():
                assert 1 not in replicas and len(replicas) == 2 and len(set(replicas)) == 2
        for topic in topics:
            throttles = [k for k in topic_configs(admin, topic) if "throttled" in k]
            assert throttles == []
        assert admin.list_partition_reassignments() == {}
    finally:
        admin.close()
    for topic, partitions in topics.items():
        got = read_all(clients, bootstrap, topic, partitions, len(values[topic]))
        assert got == sorted(values[topic])
    # Nothing left to move the second time.
    again = directlog(bootstrap, "brokers", "drain", "1")
    assert "holds no replicas: nothing to move" in again.stdout


def test_rebalance_spreads_replicas_onto_a_broker_just_added(own_cluster, clients):
    cluster = own_cluster
    topic = "rebalanced"
    directlog(cluster.bootstrap, "topics", "create", topic, "--partitions", "6",
              "--replication-factor", "2")  # fmt: skip
    values = produce(clients, cluster.bootstrap, topic, 6, 120)
    cluster.add_broker(3)
    cluster.wait_live({0, 1, 2, 3})
    bootstrap = cluster.bootstrap

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        before = replicas_of(admin, topic)
        plan = as_json(bootstrap, "rebalance")
        moved = [e for e in plan["partitions"] if 3 in e["replicas"]]
        assert moved, plan
        assert replicas_of(admin, topic) == before  # only printed
        directlog(bootstrap, "rebalance", "--execute", "--wait", timeout=200)
        held = {b["id"]: b["replicas"] for b in as_json(bootstrap, "brokers", "list")}
        assert held[3] > 0
        assert max(held.values()) - min(held.values()) <= 1
        assert as_json(bootstrap, "rebalance")["partitions"] == []  # balanced now
        described = {t["name"]: t for t in admin.describe_topics()}
        leaders = [p["leader_id"] for t in described.values() for p in t["partitions"]]
        assert 3 in leaders
    finally:
        admin.close()
    assert read_all(clients, bootstrap, topic, 6, len(values)) == sorted(values)
