"""The series the Strimzi Kafka dashboard and alerts query (Kafka's MBeans under Strimzi's JMX
exporter rules), scraped from real brokers, controllers and a tiering service while
confluent-kafka produces and consumes, each checked against what Kafka means by it and
against an independent count: the bytes in the replicas' logs, the partitions and leaders
the metadata lists, the remote records the controller holds. docs/metrics.md lists the
series."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.samples import Sample

from directlog.rpc import controller_pb2 as pb
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.records import recent_base_timestamp
from tests.e2e.service_process import ServiceProcess
from tests.e2e.tiered import (
    create_tiered_topic,
    produce,
    read_confluent,
    remote_records,
    tiering_settings,
    values,
    wait_tiered,
)

TIMEOUT = 60
BTM = "kafka_server_brokertopicmetrics_"
TOPIC_COUNTERS = (
    "messagesin",
    "bytesin",
    "bytesout",
    "totalproducerequests",
    "failedproducerequests",
    "totalfetchrequests",
    "failedfetchrequests",
)


def scrape(process: ServiceProcess) -> list[Sample]:
    return [s for family in process.scrape() for s in family.samples]


def total(samples: Iterable[Sample], name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels`."""
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def exact(samples: Iterable[Sample], name: str, **labels: str) -> float | None:
    """The one sample called `name` with exactly `labels` (no other label), or None."""
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def cluster_total(cluster: Cluster, name: str, **labels: str) -> float:
    return sum(total(scrape(b), name, **labels) for b in cluster.brokers.values() if b.running)


def create(cluster: Cluster, name: str, partitions: int, replicas: int, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = NewTopic(name, partitions, replicas, config=configs)
    admin.create_topics([topic])[name].result(TIMEOUT)


def metadata(cluster: Cluster) -> dict[str, dict[int, Any]]:
    """Partitions by topic, as a live broker's Metadata answer lists them."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topics = admin.list_topics(timeout=10).topics
    return {name: dict(t.partitions) for name, t in topics.items()}


def all_in_sync(cluster: Cluster, topics: Iterable[str]) -> bool:
    found = metadata(cluster)
    return all(
        name in found
        and all(
            p.leader >= 0 and sorted(p.isrs) == sorted(p.replicas) for p in found[name].values()
        )
        for name in topics
    )


def produce_values(bootstrap: str, topic: str, sent: list[tuple[int, bytes]]) -> None:
    """(partition, value) pairs, acks=all, every one acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    for partition, value in sent:
        producer.produce(topic, value, partition=partition, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(TIMEOUT) == 0 and not failures, failures


def consume_all(bootstrap: str, topic: str, partitions: int, count: int) -> None:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "metrics-reader", "enable.auto.commit": False}
    )
    try:
        consumer.assign([CTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got = 0
        deadline_polls = 600
        while got < count and deadline_polls:
            deadline_polls -= 1
            for message in consumer.consume(500, 0.1):
                assert message.error() is None, message.error()
                got += 1
        assert got == count, f"consumed {got} of {count}"
    finally:
        consumer.close()


def log_sizes(cluster: Cluster, topic: str, partitions: int) -> dict[int, list[float]]:
    """kafka_log_log_size of each partition on every broker holding a replica."""
    sizes: dict[int, list[float]] = {p: [] for p in range(partitions)}
    for broker in cluster.brokers.values():
        samples = scrape(broker)
        for p in range(partitions):
            size = exact(samples, "kafka_log_log_size", topic=topic, partition=str(p))
            if size is not None:
                sizes[p].append(size)
    return sizes


def leaders_and_replicas_match(cluster: Cluster) -> bool:
    """LeaderCount adds up to the partitions with a leader, PartitionCount to the replicas
    on running brokers, as the metadata lists them."""
    running = {i for i, b in cluster.brokers.items() if b.running}
    found = metadata(cluster)
    led = sum(p.leader >= 0 for t in found.values() for p in t.values())
    hosted = sum(r in running for t in found.values() for p in t.values() for r in p.replicas)
    return (
        cluster_total(cluster, "kafka_server_replicamanager_leadercount") == led
        and cluster_total(cluster, "kafka_server_replicamanager_partitioncount") == hosted
    )


@pytest.mark.timeout(300)
def test_broker_and_controller_series_count_what_kafka_counts(tmp_path: Path) -> None:
    rng = random.Random(7)
    orders = [(i % 3, rng.randbytes(rng.randint(50, 400))) for i in range(600)]
    with Cluster(tmp_path, brokers=3, controllers=2) as cluster:
        create(cluster, "orders", 3, 3, **{"min.insync.replicas": "2"})
        create(cluster, "strict", 1, 3, **{"min.insync.replicas": "3"})
        create(cluster, "single", 3, 1)
        wait_for(
            lambda: all_in_sync(cluster, ["orders", "strict", "single"]), TIMEOUT, "in-sync ISRs"
        )
        produce_values(cluster.bootstrap, "orders", orders)
        produce_values(cluster.bootstrap, "strict", [(0, b"s%d" % i) for i in range(20)])
        produce_values(cluster.bootstrap, "single", [(p, b"x") for p in range(3)])
        consume_all(cluster.bootstrap, "orders", 3, len(orders))

        # Every replica holds the same bytes: the batches producers appended, once each.
        def replicated() -> bool:
            sizes = log_sizes(cluster, "orders", 3)
            return all(len(s) == 3 and len(set(s)) == 1 for s in sizes.values()) and all(
                cluster_total(
                    cluster, "kafka_log_log_logendoffset", topic="orders", partition=str(p)
                )
                == 3 * sum(1 for q, _ in orders if q == p)
                for p in range(3)
            )

        wait_for(replicated, TIMEOUT, "followers caught up")
        appended = sum(s[0] for s in log_sizes(cluster, "orders", 3).values())
        assert appended > sum(len(v) for _, v in orders)

        # BrokerTopicMetrics: producers' and consumers' bytes, not the followers'.
        assert cluster_total(cluster, BTM + "messagesin_total", topic="orders") == len(orders)
        assert cluster_total(cluster, BTM + "bytesin_total", topic="orders") == appended
        assert cluster_total(cluster, BTM + "bytesout_total", topic="orders") == appended
        replication_out = cluster_total(cluster, BTM + "replicationbytesout_total")
        assert replication_out >= 2 * appended  # two followers fetched every byte
        assert cluster_total(cluster, BTM + "replicationbytesin_total") >= 2 * appended
        ours_out = cluster_total(cluster, "directlog_broker_bytes_out_total", topic="orders")
        assert ours_out >= appended + 2 * appended  # ours counts followers' fetches too
        assert cluster_total(cluster, "directlog_broker_records_in_total", topic="orders") == len(
            orders
        )
        assert cluster_total(cluster, BTM + "totalproducerequests_total", topic="orders") >= 3
        assert cluster_total(cluster, BTM + "failedproducerequests_total", topic="orders") == 0
        assert cluster_total(cluster, BTM + "totalfetchrequests_total", topic="orders") >= 3
        assert cluster_total(cluster, BTM + "failedfetchrequests_total", topic="orders") == 0
        for broker in cluster.brokers.values():
            samples = scrape(broker)
            for counter in TOPIC_COUNTERS:  # Kafka's all-topics meter: no topic label
                name = f"{BTM}{counter}_total"
                topics = sum(s.value for s in samples if s.name == name and "topic" in s.labels)
                assert exact(samples, name) == topics, name

        # ReplicaManager and Partition gauges against the metadata.
        wait_for(lambda: leaders_and_replicas_match(cluster), TIMEOUT, "leader and replica counts")
        assert cluster_total(cluster, "kafka_server_replicamanager_underreplicatedpartitions") == 0
        for p in range(3):
            key = {"topic": "orders", "partition": str(p)}
            assert cluster_total(cluster, "kafka_cluster_partition_replicascount", **key) == 3
            assert cluster_total(cluster, "kafka_cluster_partition_insyncreplicascount", **key) == 3
            assert cluster_total(cluster, "kafka_cluster_partition_atminisr", **key) == 0
        strict = {"topic": "strict", "partition": "0"}
        assert cluster_total(cluster, "kafka_cluster_partition_atminisr", **strict) == 1
        assert cluster_total(cluster, "kafka_cluster_partition_underminisr", **strict) == 0

        # The event loop and the connections.
        for broker in cluster.brokers.values():
            samples = scrape(broker)
            for name in (
                "kafka_network_socketserver_networkprocessoravgidle_percent",
                "kafka_server_kafkarequesthandlerpool_requesthandleravgidle_percent",
            ):
                idle = exact(samples, name)
                assert idle is not None and 0.0 <= idle <= 1.0, (name, idle)
            for name in ("read_bytes", "write_bytes"):  # from /proc/self/io, as Kafka's
                io = exact(samples, f"kafka_server_kafkaserver_linux_disk_{name}")
                assert io is not None and io >= 0, name
            count = exact(
                samples,
                "kafka_server_socket_server_metrics_connection_count",
                listener="PLAINTEXT",
                networkProcessor="0",
            )
            assert count is not None and count >= 1  # the other brokers' fetchers at least
            assert count == exact(samples, "directlog_broker_open_connections")
            # A broker is no controller and no tiering service.
            assert not [s for s in samples if s.name.startswith("kafka_controller_")]

        # Controllers: one active, reporting the cluster; the standby reports 0.
        def controllers_agree() -> bool:
            states = [scrape(c) for c in cluster.controllers]
            active = [
                s
                for s in states
                if exact(s, "kafka_controller_kafkacontroller_activecontrollercount") == 1
            ]
            standby = [
                s
                for s in states
                if exact(s, "kafka_controller_kafkacontroller_activecontrollercount") == 0
            ]
            if len(active) != 1 or len(standby) != len(states) - 1:
                return False
            now = metadata(cluster)
            unpreferred = sum(p.leader != p.replicas[0] for t in now.values() for p in t.values())
            offline = sum(p.leader < 0 for t in now.values() for p in t.values())
            want = {
                "globaltopiccount": len(now),
                "globalpartitioncount": sum(len(t) for t in now.values()),
                "offlinepartitionscount": offline,
                "preferredreplicaimbalancecount": unpreferred,
            }
            return all(
                exact(active[0], f"kafka_controller_kafkacontroller_{k}") == v
                for k, v in want.items()
            ) and all(
                exact(s, f"kafka_controller_kafkacontroller_{k}") == 0
                for s in standby
                for k in want
            )

        wait_for(controllers_agree, TIMEOUT, "the controllers' counts")

        # One broker goes: its RF=1 partition is offline, the others run short of replicas.
        single = metadata(cluster)["single"]
        gone = single[0].replicas[0]
        offline = [i for i, p in single.items() if p.replicas == [gone]]
        cluster.brokers[gone].stop()
        wait_for(
            lambda: all(
                sorted(p.isrs) == sorted(r for r in p.replicas if r != gone)
                for name in ("orders", "strict")
                for p in metadata(cluster)[name].values()
            ),
            TIMEOUT,
            f"ISRs without broker {gone}",
        )

        def short_of_replicas() -> bool:
            now = metadata(cluster)
            led = [p for t in now.values() for p in t.values() if p.leader >= 0]
            under = [p for p in led if len(p.isrs) < len(p.replicas)]
            return (
                cluster_total(cluster, "kafka_server_replicamanager_leadercount") == len(led)
                and cluster_total(cluster, "kafka_server_replicamanager_underreplicatedpartitions")
                == len(under)
                and cluster_total(cluster, "kafka_cluster_partition_underreplicated") == len(under)
                and cluster_total(cluster, "kafka_cluster_partition_underminisr", **strict) == 1
                and cluster_total(cluster, "kafka_cluster_partition_atminisr", **strict) == 0
                and all(
                    cluster_total(
                        cluster,
                        "kafka_cluster_partition_atminisr",
                        topic="orders",
                        partition=str(p),
                    )
                    == 1
                    for p in range(3)
                )
            )

        wait_for(short_of_replicas, TIMEOUT, "under-replicated and min-ISR gauges")
        wait_for(lambda: leaders_and_replicas_match(cluster), TIMEOUT, "leader counts")
        assert cluster_total(cluster, "kafka_server_replicamanager_underminisrpartitioncount") == (
            cluster_total(cluster, "kafka_cluster_partition_underminisr")
        )
        assert cluster_total(cluster, "kafka_server_replicamanager_atminisrpartitioncount") == (
            cluster_total(cluster, "kafka_cluster_partition_atminisr")
        )
        wait_for(controllers_agree, TIMEOUT, "the controllers' counts with a broker gone")
        active = next(
            c
            for c in cluster.controllers
            if c.sample("kafka_controller_kafkacontroller_activecontrollercount") == 1
        )
        assert active.sample("kafka_controller_kafkacontroller_offlinepartitionscount") == len(
            offline
        )

        # acks=all below min.insync.replicas: NOT_ENOUGH_REPLICAS, a failed produce request.
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "acks": "all",
                "message.timeout.ms": 3000,
                "retry.backoff.ms": 200,
            }
        )

        # Counted on the live brokers only (the stopped one may have led "strict" before).
        def requests() -> tuple[float, float]:
            return (
                cluster_total(cluster, BTM + "totalproducerequests_total", topic="strict"),
                cluster_total(cluster, BTM + "failedproducerequests_total", topic="strict"),
            )

        total_before, failed_before = requests()
        errors: list[Any] = []
        producer.produce("strict", b"refused", on_delivery=lambda e, m: errors.append(e))
        producer.flush(10)
        assert errors and errors[0] is not None
        total, failed = requests()
        assert failed - failed_before >= 1
        assert total - total_before >= failed - failed_before  # a failed one is a request too


@pytest.mark.timeout(300)
def test_tiering_service_and_broker_report_remote_copies_and_reads(tmp_path: Path) -> None:
    sent = values(1500, seed=11)
    with Cluster(tmp_path, tiering=tiering_settings("file", tmp_path, None)) as cluster:
        create_tiered_topic(cluster, "tiered")
        produce(cluster.bootstrap, "tiered", sent, recent_base_timestamp())
        wait_tiered(cluster, 0, "tiered", at_least=len(sent) // 2)
        tiering, broker = cluster.tierings[0], cluster.brokers[0]

        def copies_reported() -> bool:
            records = remote_records(cluster, "tiered")
            finished = [r for r in records if r.state == pb.COPY_FINISHED]
            samples = scrape(tiering)
            copied = exact(samples, BTM + "remotecopybytes_total", topic="tiered")
            return (
                bool(finished)
                and copied == sum(r.size_bytes for r in finished)
                and copied == exact(samples, "directlog_tiering_copied_bytes_total", topic="tiered")
                and exact(samples, BTM + "remotelogsizebytes", topic="tiered") == copied
                and exact(samples, BTM + "remotelogmetadatacount", topic="tiered") == len(records)
                and (exact(samples, BTM + "remotecopyrequests_total", topic="tiered") or 0)
                >= len(finished)
            )

        wait_for(copies_reported, TIMEOUT, "the remote copy series")
        samples = scrape(tiering)
        assert exact(samples, BTM + "remotecopyerrors_total", topic="tiered") == 0
        for name in ("remotecopylagbytes", "remotecopylagsegments"):
            lag = exact(samples, BTM + name, topic="tiered")
            assert lag is not None and lag >= 0
        for name in ("remotecopybytes_total", "remotelogsizebytes", "remotecopylagbytes"):
            assert exact(samples, BTM + name) == total(samples, BTM + name, topic="tiered")
        # A tiering service is no broker: Strimzi's "Brokers Online" counts leadercount series.
        assert not [s for s in samples if s.name.startswith("kafka_server_replicamanager_")]

        got = read_confluent(cluster.bootstrap, "tiered", len(sent))
        assert [value for _, value, _ in got] == sent
        samples = scrape(broker)
        assert (exact(samples, BTM + "remotefetchbytes_total", topic="tiered") or 0) > 0
        requests = exact(samples, BTM + "remotefetchrequests_total", topic="tiered")
        errors = exact(samples, BTM + "remotefetcherrors_total", topic="tiered") or 0
        assert requests is not None and requests >= errors + 1
        assert not [s for s in samples if s.name.startswith(BTM + "remotecopy")]
