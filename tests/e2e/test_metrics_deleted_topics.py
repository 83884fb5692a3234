"""Issue 25, bad input: a topic deleted while Prometheus scrapes. On a real cluster, every
broker's, controller's and tiering service's /metrics keeps parsing while topics are deleted;
once deleted, no series of any process carries the topic, the other topics' series keep their
values, the all-topics counters never go down, and a topic created again under the same name
counts from zero: what was produced after it was created again, checked against the
replicas' logs and the remote records."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from functools import partial
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from prometheus_client.samples import Sample

from directlog.remote import layout
from directlog.remote.store import RemoteStore, StoreConfig
from directlog.rpc import controller_pb2 as pb
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.records import recent_base_timestamp
from tests.e2e.service_process import ServiceProcess
from tests.e2e.test_kafka_metric_names import (
    BTM,
    all_in_sync,
    cluster_total,
    consume_all,
    create,
    exact,
    log_sizes,
    produce_values,
    scrape,
)
from tests.e2e.tiered import (
    create_tiered_topic,
    produce,
    read_confluent,
    remote_records,
    tiering_settings,
    topic_id_of,
    values,
    wait_tiered,
)

TIMEOUT = 60
# Kafka's all-topics counters (no topic label): what deleted topics counted stays in them.
ALL_TOPICS = tuple(
    f"{BTM}{name}_total"
    for name in (
        "messagesin",
        "bytesin",
        "bytesout",
        "totalproducerequests",
        "totalfetchrequests",
        "replicationbytesin",
        "replicationbytesout",
        "remotefetchbytes",
        "remotefetchrequests",
        "remotecopybytes",
        "remotecopyrequests",
    )
)
# A topic's series that move with no traffic: followers keep fetching (and counting).
MOVING = (f"{BTM}totalfetchrequests_total",)


def processes(cluster: Cluster) -> list[ServiceProcess]:
    return [*cluster.brokers.values(), *cluster.controllers, *cluster.tierings.values()]


def of_topic(samples: Iterable[Sample], topic: str) -> dict[tuple[str, str], float]:
    """The topic's samples that stay put without traffic, by (name, partition)."""
    return {
        (s.name, s.labels.get("partition", "")): s.value
        for s in samples
        if s.labels.get("topic") == topic
        and not s.name.endswith("_created")
        and s.name not in MOVING
    }


def carrying(cluster: Cluster, topic: str) -> list[str]:
    """'process: series' of every series of any process labelled with `topic`."""
    return [
        f"{process.name} {process.metrics_url}: {s.name}"
        for process in processes(cluster)
        for s in scrape(process)
        if s.labels.get("topic") == topic
    ]


class Scraper:
    """Scrapes every process over and over on a thread, as Prometheus would while topics are
    deleted: each page must be served and parse, and no all-topics counter may go down."""

    def __init__(self, cluster: Cluster) -> None:
        self._targets = processes(cluster)
        self._stop = threading.Event()
        self.failures: list[str] = []
        self.rounds = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT)

    def _run(self) -> None:
        last: dict[tuple[str, str], float] = {}
        while not self._stop.is_set():
            for process in self._targets:
                try:
                    samples = scrape(process)
                except Exception as error:
                    self.failures.append(f"{process.name} {process.metrics_url}: {error!r}")
                    continue
                for name in ALL_TOPICS:
                    value = exact(samples, name)
                    if value is None:
                        continue
                    key = (process.metrics_url, name)
                    if value < last.get(key, 0.0):
                        self.failures.append(f"{key} went down: {last[key]} -> {value}")
                    last[key] = value
            self.rounds += 1
            self._stop.wait(0.05)


def wait_gone(cluster: Cluster, topic: str) -> None:
    """Until no process has a series of `topic`."""
    deadline = time.monotonic() + TIMEOUT
    while left := carrying(cluster, topic):
        assert time.monotonic() < deadline, f"series of deleted {topic} left: {left[:10]}"
        time.sleep(0.2)


def assert_unchanged(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]
) -> None:
    changed = {
        key: (before.get(key), after.get(key))
        for key in before.keys() | after.keys()
        if before.get(key) != after.get(key)
    }
    assert not changed, changed


def no_exception_logged(cluster: Cluster) -> None:
    for process in processes(cluster):
        text = process.stderr_text()
        assert "Traceback" not in text, f"{process.name}:\n{process.stderr_tail(120)}"


def delete(cluster: Cluster, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.delete_topics(list(names), operation_timeout=30).values():
        future.result(TIMEOUT)


@pytest.mark.timeout(400)
def test_deleted_topics_leave_no_series_and_come_back_from_zero(tmp_path: Path) -> None:
    with Cluster(tmp_path, brokers=3) as cluster:
        churn = [f"churn-{i}" for i in range(4)]
        for name in ("A", "B", *churn):
            create(cluster, name, 3, 3)
        wait_for(lambda: all_in_sync(cluster, ["A", "B", *churn]), TIMEOUT, "in-sync ISRs")
        for name, count in (("A", 300), ("B", 200)):
            sent = [(i % 3, b"%s-%d" % (name.encode(), i)) for i in range(count)]
            produce_values(cluster.bootstrap, name, sent)
            consume_all(cluster.bootstrap, name, 3, count)
        for name in churn:
            produce_values(cluster.bootstrap, name, [(p, b"c") for p in range(3)])

        def replicated(topic: str) -> bool:
            return all(
                len(sizes) == 3 and len(set(sizes)) == 1 and sizes[0] > 0
                for sizes in log_sizes(cluster, topic, 3).values()
            )

        for name in ("A", "B", *churn):
            wait_for(partial(replicated, name), TIMEOUT, f"{name} replicated")
        # Followers' pulled bytes are counted once they appended: as much as the leaders hold.
        wait_for(
            lambda: (
                cluster_total(cluster, "directlog_broker_replica_pulled_bytes_total", topic="B")
                == 2 * sum(s[0] for s in log_sizes(cluster, "B", 3).values())
            ),
            TIMEOUT,
            "B's pulled bytes",
        )

        a_series = {s.split(": ", 1)[1] for s in carrying(cluster, "A")}
        for name in (
            f"{BTM}messagesin_total",
            f"{BTM}bytesin_total",
            f"{BTM}bytesout_total",
            "directlog_broker_records_in_total",
            "directlog_broker_replica_pulled_bytes_total",
            "kafka_log_log_size",
            "kafka_cluster_partition_insyncreplicascount",
        ):
            assert name in a_series, name
        b_before = {b: of_topic(scrape(b), "B") for b in cluster.brokers.values()}

        with Scraper(cluster) as scraper:
            delete(cluster, "A", *churn)
            for name in ("A", *churn):
                wait_gone(cluster, name)
            for broker, before in b_before.items():
                assert_unchanged(before, of_topic(scrape(broker), "B"))

            # A again: its counts are what is produced from now on.
            create(cluster, "A", 3, 3)
            wait_for(lambda: all_in_sync(cluster, ["A"]), TIMEOUT, "A's ISRs again")
            produce_values(cluster.bootstrap, "A", [(i % 3, b"again-%d" % i) for i in range(60)])
            consume_all(cluster.bootstrap, "A", 3, 60)
            wait_for(lambda: replicated("A"), TIMEOUT, "A replicated again")
            appended = sum(s[0] for s in log_sizes(cluster, "A", 3).values())
            assert cluster_total(cluster, f"{BTM}messagesin_total", topic="A") == 60
            assert cluster_total(cluster, "directlog_broker_records_in_total", topic="A") == 60
            assert cluster_total(cluster, f"{BTM}bytesin_total", topic="A") == appended
            assert cluster_total(cluster, f"{BTM}bytesout_total", topic="A") == appended
            wait_for(
                lambda: (
                    cluster_total(cluster, "directlog_broker_replica_pulled_bytes_total", topic="A")
                    == 2 * appended
                ),
                TIMEOUT,
                "A's pulled bytes, from zero",
            )
        assert not scraper.failures, scraper.failures[:10]
        assert scraper.rounds > 0
        for broker, before in b_before.items():
            assert_unchanged(before, of_topic(scrape(broker), "B"))
        no_exception_logged(cluster)


@pytest.mark.timeout(400)
def test_a_deleted_tiered_topic_leaves_no_series_on_the_tiering_service(tmp_path: Path) -> None:
    sent = values(1500, seed=25)
    settings = tiering_settings("file", tmp_path, None)
    store = RemoteStore(StoreConfig(settings["remote"]))
    with Cluster(tmp_path, tiering=settings) as cluster:
        tiering, broker = cluster.tierings[0], cluster.brokers[0]
        for name in ("doomed", "kept"):
            create_tiered_topic(cluster, name)
            produce(cluster.bootstrap, name, sent, recent_base_timestamp())
            wait_tiered(cluster, 0, name, at_least=len(sent) // 2)

        def settled(topic: str) -> bool:
            """Every closed segment copied, counted, and deleted here."""
            finished = [r for r in remote_records(cluster, topic) if r.state == pb.COPY_FINISHED]
            samples = scrape(tiering)
            return (
                bool(finished)
                and exact(samples, f"{BTM}remotecopybytes_total", topic=topic)
                == sum(r.size_bytes for r in finished)
                and exact(samples, f"{BTM}remotecopylagsegments", topic=topic) == 0
                # and local retention done: the active segment alone is left here
                and broker.sample("kafka_log_log_numlogsegments", topic=topic, partition="0") == 1
            )

        for name in ("doomed", "kept"):
            wait_for(partial(settled, name), TIMEOUT, f"{name}'s copies")
        assert len(read_confluent(cluster.bootstrap, "doomed", len(sent))) == len(sent)
        assert (broker.sample(f"{BTM}remotefetchbytes_total", topic="doomed") or 0) > 0
        assert tiering.sample("directlog_tiering_copied_bytes_total", topic="doomed")
        kept_before = {p.name: of_topic(scrape(p), "kept") for p in (broker, tiering)}
        prefix = layout.topic_prefix("doomed", topic_id_of(cluster, "doomed"))

        with Scraper(cluster) as scraper:
            delete(cluster, "doomed")
            wait_gone(cluster, "doomed")
            for process in (broker, tiering):
                assert_unchanged(kept_before[process.name], of_topic(scrape(process), "kept"))
            wait_for(lambda: store.list(prefix) == [], TIMEOUT, "doomed's remote data deleted")

            # The name again: the tiering service counts the new topic's copies only.
            create_tiered_topic(cluster, "doomed")
            again = sent[:900]
            produce(cluster.bootstrap, "doomed", again, recent_base_timestamp())
            wait_tiered(cluster, 0, "doomed", at_least=len(again) // 2)
            wait_for(lambda: settled("doomed"), TIMEOUT, "the new topic's copies")
            assert broker.sample(f"{BTM}messagesin_total", topic="doomed") == len(again)
        assert not scraper.failures, scraper.failures[:10]
        assert scraper.rounds > 0
        no_exception_logged(cluster)
