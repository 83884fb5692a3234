"""Tiered storage end to end (KIP-405): brokers with a tiering service each, against a local
directory and a real S3 HTTP server (moto's), read by confluent-kafka and kafka-python."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from directlog.remote import layout
from directlog.remote.index import RemoteIndex
from directlog.remote.store import RemoteStore, StoreConfig
from directlog.rpc import controller_pb2 as pb
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.records import recent_base_timestamp
from tests.e2e.tiered import (
    TIMEOUT,
    contiguous,
    create_tiered_topic,
    finished_ranges,
    leader_of,
    local_log_start,
    produce,
    read_confluent,
    read_kafka_python,
    remote_records,
    tiering_settings,
    topic_id_of,
    values,
    wait_tiered,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTopicPartition

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_consumers_read_everything_from_offset_0_after_local_segments_are_gone(kind, tmp_path, s3):
    sent = values(2500, seed=1)
    base = recent_base_timestamp()
    with Cluster(tmp_path, tiering=tiering_settings(kind, tmp_path, s3)) as cluster:
        create_tiered_topic(cluster, "orders")
        produce(cluster.bootstrap, "orders", sent, base)
        wait_tiered(cluster, 0, "orders", at_least=len(sent) // 2)
        ranges = finished_ranges(cluster, "orders")
        assert ranges and ranges[0][0] == 0 and contiguous(ranges)
        broker = cluster.brokers[0]
        local = sorted(p.name for p in (broker.data_dir / "orders-0").glob("*.log"))
        assert int(local[0][:20]) > 0  # the first local segment starts past offset 0

        for read in (read_confluent, read_kafka_python):
            got = read(cluster.bootstrap, "orders", len(sent))
            assert [offset for offset, _, _ in got] == list(range(len(sent)))
            assert [value for _, value, _ in got] == sent  # byte for byte
            assert [ts for _, _, ts in got] == [base + i for i in range(len(sent))]

        consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap)
        tp = KTopicPartition("orders", 0)
        try:
            early = consumer.offsets_for_times({tp: base + 10})[tp]
            assert early.offset == 10 and early.timestamp == base + 10  # in remote data
            assert consumer.beginning_offsets([tp])[tp] == 0
        finally:
            consumer.close()
        assert broker.total("directlog_broker_remote_fetch_bytes_total", topic="orders") > 0
        tiering = cluster.tierings[0]
        copied = tiering.total("directlog_tiering_copied_segments_total", topic="orders")
        assert len(ranges) <= copied <= len(finished_ranges(cluster, "orders"))

        def size_reported() -> bool:
            reported = tiering.sample(
                "directlog_tiering_remote_log_size_bytes", topic="orders", partition="0"
            )
            records = remote_records(cluster, "orders")
            return reported == sum(r.size_bytes for r in records if r.state == pb.COPY_FINISHED)

        wait_for(size_reported, TIMEOUT, "the remote log size metric")


def test_a_killed_leaders_successor_serves_remote_data_and_copies_on(tmp_path):
    first, second = values(1500, seed=2), values(1500, seed=3)
    base = recent_base_timestamp()
    settings = tiering_settings("file", tmp_path, None)
    with Cluster(tmp_path, brokers=3, tiering=settings) as cluster:
        create_tiered_topic(cluster, "events", replicas=3, **{"min.insync.replicas": "2"})
        produce(cluster.bootstrap, "events", first, base)
        leader = leader_of(cluster, "events")
        wait_tiered(cluster, leader, "events", at_least=len(first) // 2)
        before = finished_ranges(cluster, "events")
        cluster.brokers[leader].kill()
        cluster.tierings[leader].kill()
        wait_for(
            lambda: leader_of(cluster, "events") not in (leader, -1),
            TIMEOUT,
            "a new leader",
        )
        successor = leader_of(cluster, "events")
        got = read_confluent(cluster.bootstrap, "events", len(first))
        assert [value for _, value, _ in got] == first
        produce(cluster.bootstrap, "events", second, base + len(first))
        wait_tiered(cluster, successor, "events", at_least=len(first) + len(second) // 2)
        after = finished_ranges(cluster, "events")
        assert after[: len(before)] == before  # what the old leader copied stays as it was
        assert len(after) > len(before) and contiguous(after)  # no gap, no offset twice
        assert {r.broker_id for r in remote_records(cluster, "events")[len(before) :]} == {
            successor
        }
        got = read_kafka_python(cluster.bootstrap, "events", len(first) + len(second))
        assert [value for _, value, _ in got] == first + second


def test_a_wiped_follower_rejoins_fetching_only_the_local_part(tmp_path):
    sent = values(3000, seed=8)
    total = sum(len(v) for v in sent)
    with Cluster(
        tmp_path, brokers=2, tiering=tiering_settings("file", tmp_path, None, index_rotate_bytes=64)
    ) as cluster:
        create_tiered_topic(cluster, "metrics", replicas=2)
        produce(cluster.bootstrap, "metrics", sent, recent_base_timestamp())
        leader = leader_of(cluster, "metrics")
        follower = 1 - leader
        # Every closed segment copied: the leader keeps only its active segment's records.
        wait_tiered(cluster, leader, "metrics", at_least=len(sent) * 9 // 10)
        wait_tiered(cluster, follower, "metrics", at_least=len(sent) // 2)  # followers too
        broker = cluster.brokers[follower]
        cluster.tierings[follower].stop()
        broker.stop()
        shutil.rmtree(broker.data_dir)  # a replaced disk
        broker.start()
        cluster.tierings[follower].start()
        wait_for(lambda: in_sync(cluster, "metrics", follower), TIMEOUT, "the follower in sync")
        pulled = broker.total("directlog_broker_replica_pulled_bytes_total", topic="metrics")
        local_start = local_log_start(cluster, follower, "metrics") or 0
        assert local_start >= len(sent) // 2 and 0 < pulled < total / 4, (local_start, pulled)
        assert (
            broker.sample("directlog_broker_log_start_offset", topic="metrics", partition="0") == 0
        )
        # Its tiering service builds its remote indexes from the store: once it leads, it
        # serves the remote records.
        wait_for(
            lambda: remote_index_end(broker.data_dir / "metrics-0") >= local_start,
            TIMEOUT,
            "the follower's remote indexes",
        )
        cluster.tierings[leader].kill()
        cluster.brokers[leader].kill()
        wait_for(lambda: leader_of(cluster, "metrics") == follower, TIMEOUT, "the follower leads")
        got = read_confluent(cluster.bootstrap, "metrics", len(sent))
        assert [value for _, value, _ in got] == sent


def in_sync(cluster: Cluster, topic: str, node: int) -> bool:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    return node in admin.list_topics(topic, timeout=10).topics[topic].partitions[0].isrs


def remote_index_end(directory: Path) -> int:
    index = RemoteIndex.open(directory)
    try:
        return index.end_offset
    finally:
        index.close()


def test_retention_delete_records_and_deletion_reach_the_remote_store(tmp_path):
    sent = values(2000, seed=9)
    settings = tiering_settings("file", tmp_path, None)
    store = RemoteStore(StoreConfig(settings["remote"]))
    an_hour_ago = recent_base_timestamp()
    with Cluster(tmp_path, tiering=settings) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        for topic in ("aging", "trimmed", "dropped", "disabled"):
            create_tiered_topic(cluster, topic)
            produce(cluster.bootstrap, topic, sent, an_hour_ago)
            wait_tiered(cluster, 0, topic, at_least=len(sent) // 2)
        prefix = {
            t: layout.partition_prefix(t, topic_id_of(cluster, t), 0)
            for t in ("aging", "trimmed", "dropped", "disabled")
        }

        # retention.ms: every remote segment is older than ten minutes.
        alter(admin, "aging", {"retention.ms": "600000"})
        wait_for(lambda: not remote_records(cluster, "aging"), TIMEOUT, "remote retention")
        assert store.list(f"{prefix['aging']}/segments") == []
        assert earliest(cluster, "aging") == local_log_start(cluster, 0, "aging") > 0

        # DeleteRecords into the remote part: the copies wholly below it go.
        cut = finished_ranges(cluster, "trimmed")[2][0] + 5
        result = admin.delete_records([CTopicPartition("trimmed", 0, cut)])
        assert result[CTopicPartition("trimmed", 0, cut)].result(TIMEOUT).low_watermark == cut
        wait_for(
            lambda: finished_ranges(cluster, "trimmed")[0][1] >= cut, TIMEOUT, "trimmed copies"
        )
        assert earliest(cluster, "trimmed") == cut
        got = read_confluent(cluster.bootstrap, "trimmed", len(sent) - cut, start=cut)
        assert got[0][0] == cut and [v for _, v, _ in got] == sent[cut:]

        # Deleting the topic deletes its remote data.
        admin.delete_topics(["dropped"])["dropped"].result(TIMEOUT)
        wait_for(
            lambda: store.list(prefix["dropped"].rsplit("/", 1)[0]) == [],
            TIMEOUT,
            "the deleted topic's remote data gone",
        )

        # Turning remote storage off needs remote.log.delete.on.disable (KIP-950), which
        # deletes the remote data; the log then starts at its local part.
        with pytest.raises(KafkaException) as refused:
            alter(admin, "disabled", {"remote.storage.enable": "false"})
        assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
        alter(
            admin,
            "disabled",
            {"remote.storage.enable": "false", "remote.log.delete.on.disable": "true"},
        )
        wait_for(lambda: not remote_records(cluster, "disabled"), TIMEOUT, "remote data deleted")
        assert store.list(f"{prefix['disabled']}/segments") == []
        wait_for(
            lambda: earliest(cluster, "disabled") == local_log_start(cluster, 0, "disabled"),
            TIMEOUT,
            "the log start at the local part",
        )


def alter(admin: AdminClient, topic: str, configs: dict[str, str]) -> None:
    """Set `configs` on `topic`, leaving its other overrides (IncrementalAlterConfigs)."""
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in configs.items()
    ]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    (future,) = admin.incremental_alter_configs([resource]).values()
    future.result(TIMEOUT)


def earliest(cluster: Cluster, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap)
    tp = KTopicPartition(topic, 0)
    try:
        return int(consumer.beginning_offsets([tp])[tp])
    finally:
        consumer.close()


def test_remote_storage_settings_are_checked_as_kafka_checks_them(tmp_path):
    with Cluster(tmp_path / "plain") as plain:
        admin = AdminClient({"bootstrap.servers": plain.bootstrap})
        refused = admin.create_topics(
            [NewTopic("tiered", 1, 1, config={"remote.storage.enable": "true"})]
        )["tiered"]
        with pytest.raises(KafkaException) as error:
            refused.result(TIMEOUT)
        assert error.value.args[0].code() == KafkaError.INVALID_CONFIG
        assert "remote.log.storage.system.enable" in error.value.args[0].str()
    settings = tiering_settings("file", tmp_path, None)
    with Cluster(tmp_path / "tiered", tiering=settings) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        for configs in (
            {"remote.storage.enable": "true", "cleanup.policy": "compact"},
            {"remote.storage.enable": "true", "retention.ms": "1000", "local.retention.ms": "5000"},
            {
                "remote.storage.enable": "true",
                "retention.bytes": "100",
                "local.retention.bytes": "-1",
            },
        ):
            future = admin.create_topics([NewTopic("bad", 1, 1, config=configs)])["bad"]
            with pytest.raises(KafkaException) as error:
                future.result(TIMEOUT)
            assert error.value.args[0].code() == KafkaError.INVALID_CONFIG, configs
        admin.create_topics([NewTopic("compacted", 1, 1, config={"cleanup.policy": "compact"})])[
            "compacted"
        ].result(TIMEOUT)
        with pytest.raises(KafkaException) as error:
            alter(
                admin, "compacted", {"cleanup.policy": "compact", "remote.storage.enable": "true"}
            )
        assert error.value.args[0].code() == KafkaError.INVALID_CONFIG
