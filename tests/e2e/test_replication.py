"""Replication across three real brokers under failures, with confluent-kafka producing
acks=all to a topic with RF=3 and min.insync.replicas=2.

Every test records each acknowledged send, then reads the partitions back: every
acknowledged record must be there, in send order per partition (duplicates only from
retried sends, counted), and all replicas must hold byte-identical batches up to the high
watermark. Waits are bounded; nothing asserts on durations.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
)

from directlog.protocol.errors import ErrorCode
from directlog.records.batch import Record, build_batch
from tests.e2e import netns
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.records import produce_raw
from tests.e2e.replicated import (
    PARTITIONS,
    TIMEOUT,
    TOPIC,
    Load,
    check_no_acknowledged_record_lost,
    check_replicas_identical,
    create_topic,
    leader_of,
    read_back,
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, brokers=3, controllers=2) as running:
        create_topic(running)
        yield running


@pytest.mark.timeout(240)
def test_leader_killed_and_restarted_under_load_loses_nothing(cluster: Cluster) -> None:
    with Load(cluster.bootstrap) as load:
        load.wait_acked(300)
        victim = leader_of(cluster, 0)
        cluster.brokers[victim].kill()
        wait_for_new_leader(cluster, victim)
        load.wait_acked(300)
        cluster.brokers[victim].start()
        load.wait_acked(300)
    stored = read_back(cluster)
    duplicates = check_no_acknowledged_record_lost(load, stored)
    check_replicas_identical(cluster, stored)
    assert load.count() >= 900
    print(f"acknowledged {load.count()}, failed {load.failed}, duplicates {duplicates}")


@pytest.mark.timeout(240)
def test_active_controller_killed_under_load_loses_nothing(cluster: Cluster) -> None:
    """The brokers keep their sessions through the failover: the standby loads their
    registrations, so none registers again (a new epoch and a full image each)."""
    active = next(c for c in cluster.controllers if c.sample("directlog_controller_active") == 1)
    with Load(cluster.bootstrap) as load:
        load.wait_acked(300)
        active.kill()
        load.wait_acked(300)
        # Leadership still moves: the standby took over.
        victim = leader_of(cluster, 1)
        cluster.brokers[victim].kill()
        wait_for_new_leader(cluster, victim, partition=1)
        load.wait_acked(300)
        cluster.brokers[victim].start()
    stored = read_back(cluster)
    check_no_acknowledged_record_lost(load, stored)
    check_replicas_identical(cluster, stored)
    for broker in cluster.brokers.values():  # once per start, the failover in between
        registrations = broker.stderr_text().count("registered as broker")
        assert registrations == broker.starts, broker.stderr_tail()


@pytest.mark.timeout(240)
def test_broker_with_an_empty_data_dir_rebuilds_from_its_peers(cluster: Cluster) -> None:
    with Load(cluster.bootstrap) as load:
        load.wait_acked(500)
        victim = 2
        cluster.brokers[victim].stop()
        for path in sorted(cluster.brokers[victim].data_dir.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        load.wait_acked(200)
        cluster.brokers[victim].start()
        load.wait_acked(200)
    stored = read_back(cluster)
    check_no_acknowledged_record_lost(load, stored)
    check_replicas_identical(cluster, stored)


@pytest.mark.timeout(240)
def test_a_follower_behind_by_more_than_a_segment_catches_up(cluster: Cluster) -> None:
    """One replica fetch brings up to replica_fetch_max_bytes (1 MiB) from one leader
    segment, more than segment.bytes holds once it has been made smaller: the follower
    appends it a segment at a time and comes back into the ISR with the same bytes."""
    behind = cluster.brokers[2]
    behind.stop()
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 20, "batch.size": 8192}
    )
    failures: list[str] = []
    for i in range(300 * PARTITIONS):
        producer.produce(
            TOPIC,
            value=b"%08d" % i + bytes(1016),
            partition=i % PARTITIONS,
            on_delivery=lambda error, _: error is None or failures.append(str(error)),
        )
        producer.poll(0)
    assert producer.flush(TIMEOUT) == 0 and not failures, failures[:3]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    smaller = ConfigResource(
        "topic",
        TOPIC,
        incremental_configs=[
            ConfigEntry("segment.bytes", "16384", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for future in admin.incremental_alter_configs([smaller]).values():
        future.result(TIMEOUT)
    behind.start()
    stored = read_back(cluster)
    assert all(len(records) == 300 for records in stored.values()), stored.keys()
    check_replicas_identical(cluster, stored)
    segments = sorted((behind.data_dir / f"{TOPIC}-0").glob("*.log"))
    assert len(segments) >= 300 * 1024 // 16384


@pytest.mark.timeout(240)
def test_a_paused_leader_is_fenced_and_cannot_acknowledge_writes(cluster: Cluster) -> None:
    """SIGSTOP the leader of partition 0 past its session: the controller fences it and
    elects another. Resumed, the old leader must not acknowledge an acks=all produce."""
    with Load(cluster.bootstrap) as load:
        load.wait_acked(200)
        victim = leader_of(cluster, 0)
        stale = cluster.brokers[victim]
        stale.pause()
        try:
            wait_for_new_leader(cluster, victim)
        finally:
            stale.resume()
        assert produce_directly(stale.bootstrap, SPLIT_BRAIN) != ErrorCode.NONE
        load.wait_acked(200)
    check_after_split(cluster, load)


@pytest.mark.timeout(240)
def test_a_partitioned_leader_is_fenced_and_cannot_acknowledge_writes(tmp_path: Path) -> None:
    """Cut the leader of partition 0 off the controller and the other brokers (its own
    network namespace loses its links to theirs) while clients still reach it: the
    controller fences it and elects another, and it must not acknowledge an acks=all
    produce. Healed, it rejoins as a follower, without what it took meanwhile."""
    netns.require()
    with (
        netns.MemberNetworks([1, 2, 3, 4]) as net,
        Cluster(tmp_path, brokers=3, networks=net) as cluster,
    ):
        create_topic(cluster)
        with Load(cluster.bootstrap) as load:
            load.wait_acked(200)
            victim = leader_of(cluster, 0)
            net.isolate(victim + 1)
            try:
                wait_for_new_leader(cluster, victim)
                code = produce_directly(cluster.brokers[victim].bootstrap, SPLIT_BRAIN)
                assert code != ErrorCode.NONE
                load.wait_acked(200)
            finally:
                net.heal(victim + 1)
            load.wait_acked(200)
        check_after_split(cluster, load)


SPLIT_BRAIN = b"split-brain"


@pytest.mark.timeout(240)
def test_deleted_records_stay_deleted_when_the_leader_dies(cluster: Cluster) -> None:
    """DeleteRecords with RF=3 is answered once the ISR moved its log start: a new leader
    serves nothing below it, and every replica's checkpoint keeps it across restarts."""
    with Load(cluster.bootstrap) as load:
        load.wait_acked(300)
    records = read_back(cluster)[0]
    cut = records[len(records) // 2][0]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    (future,) = admin.delete_records(
        [TopicPartition(TOPIC, 0, cut)], request_timeout=TIMEOUT, operation_timeout=TIMEOUT
    ).values()
    assert future.result(timeout=TIMEOUT).low_watermark == cut

    def earliest() -> int:
        """The leader's log start, asked by a new client (an old one may keep asking a dead
        leader); -1001 while metadata still names none."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            fresh = AdminClient({"bootstrap.servers": cluster.bootstrap})
            wanted = {TopicPartition(TOPIC, 0): OffsetSpec.earliest()}
            (answer,) = fresh.list_offsets(wanted, request_timeout=10).values()
            offset = int(answer.result(timeout=TIMEOUT).offset)
            if offset >= 0 or time.monotonic() > deadline:
                return offset
            time.sleep(0.2)

    def checkpointed(broker: BrokerProcess) -> int:
        lines = (broker.data_dir / "log-start-offset-checkpoint").read_text().splitlines()
        return next(int(line.split()[2]) for line in lines if line.startswith(f"{TOPIC} 0 "))

    victim = leader_of(cluster, 0)
    cluster.brokers[victim].kill()
    wait_for_new_leader(cluster, victim)
    assert earliest() == cut
    cluster.brokers[victim].start()
    after = read_back(cluster)[0]
    assert after == [r for r in records if r[0] >= cut]
    wait_for(
        lambda: all(checkpointed(b) == cut for b in cluster.brokers.values()),
        TIMEOUT,
        "every replica's log start checkpoint",
    )


def wait_for_new_leader(cluster: Cluster, old: int, partition: int = 0) -> None:
    """Until a broker other than `old` reports another leader for `partition`."""
    other = next(b for n, b in cluster.brokers.items() if n != old)
    wait_for(
        lambda: _leader_seen_by(other.bootstrap, partition) not in (old, -1),
        TIMEOUT,
        f"the controller to move leadership away from broker {old}",
    )


def produce_directly(bootstrap: str, value: bytes) -> ErrorCode:
    """One acks=all Produce of `value` to partition 0 at `bootstrap`, whatever its
    metadata says; the partition's error code."""
    batch = build_batch([Record(0, int(time.time() * 1000), None, value)])
    return produce_raw(bootstrap, TOPIC, batch)[0]


def check_after_split(cluster: Cluster, load: Load) -> None:
    stored = read_back(cluster)
    assert all(v != SPLIT_BRAIN for _, v in stored[0]), "an unacknowledged write survived"
    check_no_acknowledged_record_lost(load, stored)
    check_replicas_identical(cluster, stored)


def _leader_seen_by(bootstrap: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return int(admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions[partition].leader)
