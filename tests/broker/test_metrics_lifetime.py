"""How long per-topic series live: a broker's while its cluster image has the topic and it
hosts a replica of it, a tiering service's while its broker hosts the topic, a topic created
again under the same name from zero, and the all-topics series never going down. The request
path's counting is driven directly, the cluster image through a real ReplicaManager;
tests/e2e/test_metrics_deleted_topics.py checks the same on a real cluster."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from directlog.protocol.errors import ErrorCode
from directlog.protocol.produce import PartitionResult
from directlog.rpc import controller_pb2 as pb
from directlog.topic_config import LogConfig
from directlog.topics import TopicPartition
from services.broker.cluster_metadata import ClusterImage
from services.broker.fetch_response import PartitionData
from services.broker.metrics import BrokerMetrics
from services.broker.replica_fetcher import FetchSettings
from services.broker.replica_manager import ReplicaManager
from services.broker.storage.log_manager import LogManager
from services.tiering.metrics import TieringMetrics

BTM = "kafka_server_brokertopicmetrics_"
ALL_TOPICS = [  # Kafka's all-topics counters: never down
    f"{BTM}{name}_total"
    for name in (
        "messagesin",
        "bytesin",
        "bytesout",
        "totalproducerequests",
        "totalfetchrequests",
        "replicationbytesout",
        "replicationbytesin",
        "remotefetchbytes",
        "remotefetchrequests",
    )
]


def samples(metrics: BrokerMetrics | TieringMetrics) -> list[Sample]:
    text = generate_latest(metrics.registry).decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def topics_in(found: list[Sample]) -> set[str]:
    return {s.labels["topic"] for s in found if "topic" in s.labels}


def of_topic(found: list[Sample], topic: str) -> dict[tuple[str, str], float]:
    """The topic's samples, (name, partition label) -> value, _created ones aside."""
    return {
        (s.name, s.labels.get("partition", "")): s.value
        for s in found
        if s.labels.get("topic") == topic and not s.name.endswith("_created")
    }


def counters(found: list[Sample], topic: str) -> dict[tuple[str, str], float]:
    """The topic's counters."""
    return {
        key: value for key, value in of_topic(found, topic).items() if key[0].endswith("_total")
    }


def all_topics(found: list[Sample]) -> dict[str, float]:
    return {s.name: s.value for s in found if s.name in ALL_TOPICS and "topic" not in s.labels}


class Cluster:
    """Broker 0's cluster image and ReplicaManager, fed metadata updates as a controller
    would send them; topics get their partitions all led by broker 0."""

    def __init__(self, directory: Path) -> None:
        self.image = ClusterImage(LogConfig())
        self.logs = LogManager.open(directory, self.image.config_for)
        self.metrics = BrokerMetrics()
        self.metrics.watch_logs(self.logs)
        self.replicas = ReplicaManager(
            0, self.logs, self.image, FetchSettings(0, 10, 1 << 20, 10), lambda: None, self.metrics
        )
        self.metrics.watch_replicas(self.replicas)
        self.version = 0
        self.ids: dict[str, uuid.UUID] = {}

    def update(
        self,
        topics: list[pb.TopicState] | None = None,
        deleted: list[str] | None = None,
        full: bool = False,
    ) -> None:
        self.version += 1
        change = self.image.apply(
            pb.MetadataUpdate(
                version=self.version,
                full=full,
                cluster_id="c",
                controller_id=0,
                controller_epoch=1,
                topics=topics or [],
                deleted_topic_ids=[self.ids.pop(name).bytes for name in deleted or []],
            )
        )
        assert change is not None
        self.replicas.apply(change)

    def create(self, name: str, partitions: int = 2) -> None:
        topic_id = self.ids[name] = uuid.uuid4()
        self.update([state(name, topic_id, {p: [0] for p in range(partitions)})])

    def delete(self, name: str) -> None:
        self.update(deleted=[name])

    def close(self) -> None:
        self.logs.close()


def state(name: str, topic_id: uuid.UUID, replicas: dict[int, list[int]]) -> pb.TopicState:
    return pb.TopicState(
        name=name,
        topic_id=topic_id.bytes,
        partitions=[
            pb.PartitionState(partition=p, replicas=r, leader=r[0], isr=r, leader_epoch=1)
            for p, r in replicas.items()
        ],
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    yield made
    made.close()


def traffic(metrics: BrokerMetrics, topic: str, n: int = 1) -> None:
    """Some of everything a broker counts per topic and per replica."""
    metrics.produced(topic, records=10 * n, size=700 * n)
    metrics.produce_answered(topic, [PartitionResult(0, ErrorCode.NONE)])
    metrics.fetch_answered(
        topic, [PartitionData(0, ErrorCode.NONE, records=b"x" * 30, offsets=3)], False
    )
    metrics.fetch_answered(
        topic, [PartitionData(1, ErrorCode.NONE, records=b"y" * 50, offsets=5)], True
    )
    metrics.pulled(TopicPartition(topic, 0), 100 * n)
    metrics.pulled(TopicPartition(topic, 1), 20 * n)
    metrics.remote_fetch_requests.labels(topic).inc(3 * n)
    metrics.remote_fetch_bytes.labels(topic).inc(4096 * n)
    metrics.remote_fetch_errors.labels(topic).inc(n)
    metrics.replication_pushed_bytes.labels(topic).inc(7 * n)
    metrics.replication_pushes.labels(topic).inc(n)
    metrics.rdma_writes.labels(topic).inc(n)
    metrics.rdma_slot_writes.labels(topic).inc(n)
    metrics.converted(topic, 4 * n, 0.001)


def test_a_deleted_topic_leaves_no_series_and_the_others_keep_theirs(cluster: Cluster) -> None:
    cluster.create("A")
    cluster.create("B")
    traffic(cluster.metrics, "A")
    traffic(cluster.metrics, "B", 2)
    before = samples(cluster.metrics)
    a, b = of_topic(before, "A"), of_topic(before, "B")
    assert ("directlog_broker_replica_pulled_bytes_total", "1") in a
    assert ("kafka_log_log_size", "0") in a  # from the log
    assert (f"{BTM}messagesin_total", "") in a
    assert a.keys() == b.keys()

    cluster.delete("A")
    after = samples(cluster.metrics)
    assert topics_in(after) == {"B"}
    assert of_topic(after, "B") == b
    assert all_topics(after) == all_topics(before)  # not down: A's counts kept in them


def test_a_topic_created_again_counts_from_zero(cluster: Cluster) -> None:
    cluster.create("A")
    kept = cluster.metrics.rdma_slot_writes.labels("A")  # as RDMA consume keeps it
    traffic(cluster.metrics, "A", 5)
    kept.inc(100)
    cluster.delete("A")
    # Work under way when the topic went still counts for it: not exported.
    traffic(cluster.metrics, "A", 7)
    kept.inc(1000)
    assert "A" not in topics_in(samples(cluster.metrics))

    cluster.create("A")
    traffic(cluster.metrics, "A")
    kept.inc()
    once = BrokerMetrics()  # what one round of counting alone makes
    traffic(once, "A")
    once.rdma_slot_writes.labels("A").inc()
    assert counters(samples(cluster.metrics), "A") == counters(samples(once), "A")
    assert (
        counters(samples(once), "A")[("directlog_broker_rdma_consume_slot_writes_total", "")] == 2
    )


def test_same_name_deleted_and_created_in_one_update_counts_from_zero(cluster: Cluster) -> None:
    cluster.create("A")
    traffic(cluster.metrics, "A", 3)
    cluster.update(full=True, topics=[state("A", uuid.uuid4(), {0: [0], 1: [0]})])
    assert counters(samples(cluster.metrics), "A") == {}
    assert ("kafka_log_log_size", "1") in of_topic(samples(cluster.metrics), "A")


def test_a_replica_moved_away_takes_its_series_and_the_last_one_the_topics(
    cluster: Cluster,
) -> None:
    cluster.create("A")
    traffic(cluster.metrics, "A")
    topic_id = cluster.ids["A"]
    cluster.update([state("A", topic_id, {0: [0], 1: [1]})])  # partition 1 went to broker 1
    found = of_topic(samples(cluster.metrics), "A")
    assert ("directlog_broker_replica_pulled_bytes_total", "0") in found
    assert ("directlog_broker_replica_pulled_bytes_total", "1") not in found
    assert (f"{BTM}messagesin_total", "") in found  # still hosts partition 0

    before = all_topics(samples(cluster.metrics))
    cluster.update([state("A", topic_id, {0: [1], 1: [1]})])  # none of A here
    after = samples(cluster.metrics)
    assert "A" not in topics_in(after)
    assert all_topics(after) == before


def test_scrapes_parse_and_all_topics_counters_never_go_down_while_topics_come_and_go(
    cluster: Cluster,
) -> None:
    """A scrape thread reads while this thread (the event loop's part) counts, creates and
    deletes topics."""
    stop = threading.Event()
    failures: list[BaseException] = []
    scrapes = [0]

    def scrape() -> None:
        last: dict[str, float] = {}
        try:
            while not stop.is_set():
                now = all_topics(samples(cluster.metrics))
                for name, value in now.items():
                    assert value >= last.get(name, 0.0), (name, value, last[name])
                last = now
                scrapes[0] += 1
                stop.wait(0.001)  # let the other thread have the GIL back after its fsyncs
        except BaseException as error:
            failures.append(error)

    reader = threading.Thread(target=scrape)
    reader.start()
    try:
        cluster.create("B")
        for round_ in range(30):
            name = f"t{round_ % 3}"
            cluster.create(name, partitions=3)
            for _ in range(5):
                traffic(cluster.metrics, name)
                traffic(cluster.metrics, "B")
            cluster.delete(name)
    finally:
        stop.set()
        reader.join(60)
    assert not failures, failures[0]
    assert scrapes[0] > 0
    assert topics_in(samples(cluster.metrics)) == {"B"}


def test_tiering_series_go_with_the_topics_the_broker_hosts() -> None:
    metrics = TieringMetrics()
    for topic in ("A", "B"):
        metrics.copied_bytes.labels(topic).inc(1000)
        metrics.copy_requests.labels(topic).inc(2)
        metrics.copy_errors.labels(topic).inc(1)
        metrics.copied_segments.labels(topic).inc(2)
        metrics.index_syncs.labels(topic).inc(3)
        for partition in (0, 1):
            metrics.observe(
                topic, partition, leader=True, lag_segments=1, lag_bytes=10, remote_segments=2,
                remote_bytes=1000, remote_records=2,
            )  # fmt: skip
    metrics.delete_errors.labels("gone").inc()
    before = samples(metrics)
    b = of_topic(before, "B")
    totals = {s.name: s.value for s in before if s.name.endswith("_total") and not s.labels}

    metrics.forget("A", 0)
    metrics.forget("A", 1)
    metrics.retain({"B"}, deleting={"gone"})
    after = samples(metrics)
    assert topics_in(after) == {"B", "gone"}  # gone: its remote data still being deleted
    assert of_topic(after, "B") == b
    assert {s.name: s.value for s in after if s.name.endswith("_total") and not s.labels} == totals
    metrics.retain({"B"})
    assert topics_in(samples(metrics)) == {"B"}

    # Kafka's names count the partitions led here: a leadership lost leaves them at once.
    metrics.stopped_leading("B", 1)
    after = samples(metrics)
    assert of_topic(after, "B")[(f"{BTM}remotelogsizebytes", "")] == 1000
    assert of_topic(after, "B")[("directlog_tiering_remote_log_size_bytes", "1")] == 1000
