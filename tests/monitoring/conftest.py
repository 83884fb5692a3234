"""`monitored`: a whole Directlog cluster under load, scraped by a real Prometheus, for the
monitoring tests (the dashboards' queries, the alert rules), one per test module.

What runs:

- a consensus ensemble of three members, two controllers (one active), three brokers with
  RDMA produce, consume and push replication on the shm provider, and tiered storage to a
  `file://` directory with a tiering service beside each broker;
- a Prometheus scraping every one of those processes each second, each target labelled as
  Kubernetes service discovery and Strimzi's PodMonitor relabelling would label it
  (`namespace`, `pod`, `container`, `kubernetes_pod_name`, `strimzi_io_cluster`,
  `strimzi_io_kind`, `strimzi_io_name`): a tiering service shares its broker's pod, as the
  sidecar does; the brokers' Kafka Exporter series get one `instance` (the
  `metric_relabel_configs` rule of services/broker/kafka_exporter.py);
- a load thread, until the module ends, about once a second: confluent-kafka produces to
  ORDERS (acks=all, RF 3, pull replication) and a subscribed group (ORDERS_GROUP) consumes
  and commits it; directlog.client's Producer writes RDMA_TOPIC (preallocated, RF 3, so its
  leaders push to the followers over RDMA) in shared mode and its Consumer reads it with
  one-sided RDMA reads; confluent-kafka produces to TIERED (64 KiB segments, rolled,
  copied to the remote store and deleted locally) and a reader goes back to its offset 0
  every few seconds, so the broker reads it from the remote store.

Before the load starts, LAGGED gets a fixed number of records per partition (`produced`) and
LAGGED_GROUP commits part of them (`committed`) and leaves: nothing changes there afterwards,
so its numbers can be checked exactly (`stored_bytes`: the record batch bytes its partitions
hold, read from a replica's segment files).

The fixture returns once Prometheus has scraped every target and the load has run its
first rounds; checks should still wait for what they look for (rates need two samples in
their window; RATE_WINDOW is the window to put where a dashboard says `$__rate_interval`).
Prometheus evaluates no rules unless the test module defines
`monitored_rule_files(directory: Path) -> list[Path]`: the rule files it returns (written
under `directory` if it needs copies) are loaded, and evaluated every second.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from directlog.client import Consumer as RdmaConsumer
from directlog.client import Producer as RdmaProducer
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.tiered import create_tiered_topic, tiering_settings
from tests.monitoring.prometheus import Prometheus

log = logging.getLogger(__name__)
RDKAFKA_LOG = logging.getLogger("monitoring.librdkafka")  # librdkafka's logs, not stderr


def client_config(bootstrap: str) -> dict[str, Any]:
    """A confluent-kafka client's configuration, its logs routed to Python logging."""
    return {"bootstrap.servers": bootstrap, "logger": RDKAFKA_LOG}


NAMESPACE = "directlog-test"
CLUSTER = "directlog"  # strimzi_io_cluster, and the prefix of every pod name
RATE_WINDOW = "15s"  # what the tests put for Grafana's $__rate_interval (1 s scrapes)
TIMEOUT = 90.0

ORDERS = "orders"
ORDERS_GROUP = "orders-readers"
LAGGED = "lagged"
LAGGED_GROUP = "lagged-readers"
RDMA_TOPIC = "rdma-orders"
RDMA_GROUP = "rdma-readers"
TIERED = "tiered"

PRODUCED = {0: 40, 1: 25, 2: 60}  # LAGGED: records per partition
COMMITTED = {0: 15, 1: 25, 2: 4}  # LAGGED_GROUP's committed offsets

BROKER_SETTINGS: dict[str, Any] = {
    "rdma_produce": True,
    "rdma_consume": True,
    "rdma_replication": True,
    "rdma_provider": "shm",
    "rdma_grant_max_bytes": 256 * 1024,
    "rdma_replication_timeout_ms": 3000,
    "replica_fetch_wait_max_ms": 200,
    "group_initial_rebalance_delay_ms": 300,
}
RDMA_TOPIC_CONFIG = {
    "preallocate": "true",
    "segment.bytes": str(1 << 20),
    "min.insync.replicas": "2",
}
# The Kafka Exporter's series, exported once each by some broker, under one instance
# (services/broker/kafka_exporter.py), so its dashboard can select one `instance`.
EXPORTER_RELABEL = {
    "source_labels": ["__name__"],
    "regex": "kafka_(brokers|broker_info|topic_.+|consumergroup_.+)",
    "target_label": "instance",
    "replacement": "directlog",
}


@dataclass
class Load:
    """The load thread: `rounds` done so far, `errors` it met (delivery failures, consumer
    errors), `stop()` to end it and close its clients."""

    bootstrap: str
    rounds: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="monitoring-load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def wait_rounds(self, rounds: int, timeout: float = TIMEOUT) -> None:
        wait_for(lambda: self.rounds >= rounds, timeout, f"{rounds} rounds of load")

    def _failed(self, error: Any, _: Any = None) -> None:
        if error is not None:
            self.errors.append(str(error))

    def _run(self) -> None:
        rng = random.Random(25)
        base = client_config(self.bootstrap)
        orders = Producer({**base, "acks": "all", "linger.ms": 5})
        tiered = Producer({**base, "acks": "all", "linger.ms": 5, "batch.size": 16384})
        rdma = RdmaProducer(
            {**base, "rdma.produce": "shared", "rdma.provider": "shm", "linger.ms": 5}
        )
        group = Consumer(
            {
                **base,
                "group.id": ORDERS_GROUP,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        group.subscribe([ORDERS])
        rdma_reader = RdmaConsumer(
            {
                **base,
                "group.id": RDMA_GROUP,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "rdma.consume": True,
                "rdma.provider": "shm",
            }
        )
        rdma_reader.assign([CTopicPartition(RDMA_TOPIC, p, 0) for p in range(2)])
        remote_reader = Consumer(
            {**base, "group.id": f"remote-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
        )
        try:
            while not self._stop.is_set():
                self._round(rng, orders, tiered, rdma, group, rdma_reader, remote_reader)
                self.rounds += 1
                self._stop.wait(0.5)
        except Exception as error:  # the checks report it; the thread must not die silently
            log.exception("monitoring load failed")
            self.errors.append(f"load stopped: {error!r}")
        finally:
            for producer in (orders, tiered, rdma):
                with contextlib.suppress(Exception):
                    producer.flush(10)
            with contextlib.suppress(Exception):
                rdma.close()
            for consumer in (group, rdma_reader, remote_reader):
                with contextlib.suppress(Exception):
                    consumer.close()

    def _round(
        self,
        rng: random.Random,
        orders: Producer,
        tiered: Producer,
        rdma: RdmaProducer,
        group: Consumer,
        rdma_reader: RdmaConsumer,
        remote_reader: Consumer,
    ) -> None:
        for i in range(30):
            orders.produce(
                ORDERS, rng.randbytes(rng.randint(100, 400)), partition=i % 3,
                on_delivery=self._failed,
            )  # fmt: skip
        for _ in range(20):
            tiered.produce(TIERED, rng.randbytes(1000), partition=0, on_delivery=self._failed)
        for i in range(30):
            rdma.produce(
                RDMA_TOPIC, rng.randbytes(rng.randint(100, 300)), key=b"k%d" % (i % 7),
                on_delivery=self._failed,
            )  # fmt: skip
        for producer in (orders, tiered, rdma):
            producer.poll(0)
        for consumer in (group, rdma_reader):
            for message in consumer.consume(500, 0.2):
                if message.error() is not None:
                    self.errors.append(str(message.error()))
        if group.assignment():
            with contextlib.suppress(Exception):  # a rebalance may be under way
                group.commit(asynchronous=True)
        if self.rounds % 4 == 0:  # back to the start: remote reads again
            remote_reader.assign([CTopicPartition(TIERED, 0, 0)])
        for message in remote_reader.consume(200, 0.2):
            if message.error() is not None:
                self.errors.append(str(message.error()))


@dataclass
class Monitored:
    """What `monitored` yields.

    - `cluster`: the running Cluster (tests/e2e/cluster.py); `prometheus`: the Prometheus
      scraping it (tests/monitoring/prometheus.py);
    - `pods`: each scrape target ("host:port") -> its pod label; `targets`: how many;
    - `load`: the load thread (its `errors` should stay empty);
    - LAGGED's fixed numbers: `produced` and `committed` (partition -> offset) and
      `stored_bytes` (partition -> record batch bytes in its segment files).
    """

    cluster: Cluster
    prometheus: Prometheus
    load: Load
    pods: dict[str, str]
    produced: dict[int, int]
    committed: dict[int, int]
    stored_bytes: dict[int, int]

    @property
    def targets(self) -> int:
        return len(self.pods)


def _address(url: str) -> str:
    """ "host:port" of a metrics URL."""
    return url.split("//", 1)[1].split("/", 1)[0]


def _create(admin: AdminClient, topic: NewTopic) -> None:
    admin.create_topics([topic])[topic.topic].result(TIMEOUT)


def _in_sync(cluster: Cluster, topics: list[str]) -> bool:
    admin = AdminClient(client_config(cluster.bootstrap))
    found = admin.list_topics(timeout=10).topics
    return all(
        name in found
        and bool(found[name].partitions)
        and all(
            p.leader >= 0 and sorted(p.isrs) == sorted(p.replicas)
            for p in found[name].partitions.values()
        )
        for name in topics
    )


def _segment_bytes(cluster: Cluster, topic: str, partition: int) -> list[int]:
    """Bytes of the partition's .log files on each broker holding a replica."""
    sizes = []
    for broker in cluster.brokers.values():
        directory = broker.data_dir / f"{topic}-{partition}"
        if directory.is_dir():
            sizes.append(sum(f.stat().st_size for f in directory.glob("*.log")))
    return sizes


def _prepare_lagged(cluster: Cluster) -> dict[int, int]:
    """LAGGED's records and LAGGED_GROUP's commits; the bytes each partition holds."""
    base = client_config(cluster.bootstrap)
    producer = Producer({**base, "acks": "all", "linger.ms": 5})
    failures: list[str] = []
    rng = random.Random(3)
    for partition, count in PRODUCED.items():
        for i in range(count):
            producer.produce(
                LAGGED, rng.randbytes(rng.randint(50, 500)), key=b"%d" % i, partition=partition,
                on_delivery=lambda e, _: failures.append(str(e)) if e is not None else None,
            )  # fmt: skip
    assert producer.flush(TIMEOUT) == 0 and not failures, failures
    consumer = Consumer({**base, "group.id": LAGGED_GROUP, "enable.auto.commit": False})
    try:
        consumer.assign([CTopicPartition(LAGGED, p, 0) for p in PRODUCED])
        wanted = [CTopicPartition(LAGGED, p, o) for p, o in COMMITTED.items()]
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                consumer.commit(offsets=wanted, asynchronous=False)
                break
            except Exception:
                assert time.monotonic() < deadline, "LAGGED_GROUP could not commit"
                consumer.poll(0.2)
    finally:
        consumer.close()

    def replicas_agree() -> bool:
        return all(
            len(set(sizes)) == 1 and len(sizes) == 3
            for sizes in (_segment_bytes(cluster, LAGGED, p) for p in PRODUCED)
        )

    wait_for(replicas_agree, TIMEOUT, f"{LAGGED}'s replicas holding the same bytes")
    return {p: _segment_bytes(cluster, LAGGED, p)[0] for p in PRODUCED}


def _scrape_config(cluster: Cluster) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """Jobs and each target's labels, as Kubernetes discovery and Strimzi's PodMonitor would
    give them: brokers and their tiering sidecars share a pod. The job names are those of
    services/monitor.py, which the alert rules and the dashboards select."""
    jobs: dict[str, list[str]] = {}
    labels: dict[str, dict[str, str]] = {}

    def add(job: str, address: str, pod: str, container: str, strimzi_name: str | None) -> None:
        jobs.setdefault(job, []).append(address)
        found = {"pod": pod, "container": container, "kubernetes_pod_name": pod}
        if strimzi_name is not None:
            found |= {
                "strimzi_io_cluster": CLUSTER,
                "strimzi_io_kind": "Kafka",
                "strimzi_io_name": strimzi_name,
            }
        labels[address] = found

    for node_id, broker in cluster.brokers.items():
        pod = f"{CLUSTER}-broker-{node_id}"
        add("directlog-broker", _address(broker.metrics_url), pod, "broker", f"{CLUSTER}-kafka")
        tiering = cluster.tierings[node_id]
        add("directlog-tiering", _address(tiering.metrics_url), pod, "tiering", f"{CLUSTER}-kafka")
    for i, controller in enumerate(cluster.controllers):
        pod = f"{CLUSTER}-controller-{i}"
        add(
            "directlog-controller",
            _address(controller.metrics_url),
            pod,
            "controller",
            f"{CLUSTER}-kafka",
        )
    ensemble = cluster.ensemble
    for member in ensemble.ids:
        pod = f"{CLUSTER}-consensus-{member - 1}"
        add("directlog-consensus", _address(ensemble.metrics_url(member)), pod, "consensus", None)
    return jobs, labels


@pytest.fixture(scope="module")
def monitored(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Monitored]:
    work = tmp_path_factory.mktemp("monitored")
    rules = getattr(request.module, "monitored_rule_files", None)
    rule_files: list[Path] = list(rules(work / "rules")) if rules is not None else []
    cluster = Cluster(
        work / "cluster",
        brokers=3,
        consensus_members=3,
        controllers=2,
        broker_settings=BROKER_SETTINGS,
        tiering=tiering_settings("file", work, None),
    )
    cluster.start()
    load: Load | None = None
    prometheus: Prometheus | None = None
    try:
        admin = AdminClient(client_config(cluster.bootstrap))
        _create(admin, NewTopic(ORDERS, 3, 3, config={"min.insync.replicas": "2"}))
        _create(admin, NewTopic(LAGGED, 3, 3))
        _create(admin, NewTopic(RDMA_TOPIC, 2, 3, config=RDMA_TOPIC_CONFIG))
        create_tiered_topic(cluster, TIERED)
        del admin  # a client left alive would log its reconnections after the cluster stops
        wait_for(
            lambda: _in_sync(cluster, [ORDERS, LAGGED, RDMA_TOPIC, TIERED]),
            TIMEOUT,
            "the topics' ISRs complete",
        )
        stored = _prepare_lagged(cluster)
        jobs, target_labels = _scrape_config(cluster)
        prometheus = Prometheus(
            work / "prometheus",
            jobs,
            rule_files,
            labels={job: {"namespace": NAMESPACE} for job in jobs},
            target_labels=target_labels,
            metric_relabel={"directlog-broker": [EXPORTER_RELABEL]},
        ).start()
        load = Load(cluster.bootstrap)
        load.start()
        prometheus.wait_up(len(target_labels))
        load.wait_rounds(3)
        yield Monitored(
            cluster=cluster,
            prometheus=prometheus,
            load=load,
            pods={address: found["pod"] for address, found in target_labels.items()},
            produced=dict(PRODUCED),
            committed=dict(COMMITTED),
            stored_bytes=stored,
        )
    finally:
        if load is not None:
            load.stop()
        if prometheus is not None:
            prometheus.stop()
        cluster.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """A failing test gets the services' and Prometheus' log tails."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        found = getattr(item, "funcargs", {}).get("monitored")
        if isinstance(found, Monitored):
            report.sections.append(("services", found.cluster.logs(40)))
            report.sections.append(("prometheus", found.prometheus.log_tail(40)))
            if found.load.errors:
                report.sections.append(("load errors", "\n".join(found.load.errors[-20:])))
