"""End-to-end fixtures: a real broker process and real Kafka clients against it.

`broker` is a fresh single-broker cluster per test (consensus member, controller and
broker, all under tmp_path); `module_broker` is one shared by a module's tests, which then
keep to topic names of their own (`topic_name`). At teardown each broker is stopped with
SIGTERM and must exit 0; a failing test gets the broker's stderr tail added to its report.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster
from tests.e2e.ensemble import Ensemble, KazooClients

RDKAFKA_LOG = logging.getLogger("e2e.librdkafka")


def _stop_checked(broker: BrokerProcess) -> None:
    broker.stop()
    bad = [code for code in broker.exit_codes if code != 0]
    if bad or broker.killed:
        pytest.fail(
            f"broker did not stop cleanly on SIGTERM: exit codes {broker.exit_codes}, "
            f"SIGKILL needed: {broker.killed}\n{broker.stderr_tail()}",
            pytrace=False,
        )


@contextlib.contextmanager
def single_broker(
    work_dir: Path, broker_settings: dict[str, object] | None = None
) -> Iterator[BrokerProcess]:
    """A one-broker cluster (its broker with `broker_settings`); yields its broker, checked
    to stop cleanly."""
    cluster = Cluster(work_dir, broker_settings=broker_settings).start()
    try:
        yield cluster.brokers[0]
        _stop_checked(cluster.brokers[0])
    finally:
        cluster.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with single_broker(tmp_path / "cluster") as process:
        yield process


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with single_broker(tmp_path_factory.mktemp("module-cluster")) as process:
        yield process


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, BrokerProcess):
                report.sections.append(
                    (f"broker stderr ({value.work_dir.name})", value.stderr_tail(120))
                )


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """A topic name unique to this test (and call): `topic_name("orders")`."""

    def make(prefix: str = "t") -> str:
        test = re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name).strip("-")[:80]
        return f"{prefix}-{test}-{uuid.uuid4().hex[:8]}"

    return make


# confluent-kafka clients -------------------------------------------------------------


class Clients:
    """Makes confluent-kafka clients with their librdkafka logs routed to Python logging
    (captured by pytest), and closes them when the test ends."""

    def __init__(self) -> None:
        self._consumers: list[Consumer] = []

    @staticmethod
    def config(bootstrap: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"bootstrap.servers": bootstrap, "logger": RDKAFKA_LOG, **(extra or {})}

    def producer(self, bootstrap: str, extra: dict[str, Any] | None = None) -> Producer:
        return Producer(
            self.config(
                bootstrap,
                {"enable.idempotence": False, "linger.ms": 5, **(extra or {})},
            )
        )

    def consumer(self, bootstrap: str, extra: dict[str, Any] | None = None) -> Consumer:
        consumer = Consumer(
            self.config(
                bootstrap,
                {
                    "group.id": f"e2e-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "auto.offset.reset": "error",
                    **(extra or {}),
                },
            )
        )
        self._consumers.append(consumer)
        return consumer

    def admin(self, bootstrap: str, extra: dict[str, Any] | None = None) -> AdminClient:
        return AdminClient(self.config(bootstrap, extra))

    def create_topic(
        self, bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None
    ) -> None:
        admin = self.admin(bootstrap)  # kept referenced: its futures fail once it is freed
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, config=config or {})],
            operation_timeout=10,
            request_timeout=15,
        )
        futures[name].result(timeout=20)

    @staticmethod
    def produce_all(
        producer: Producer,
        topic: str,
        records: list[dict[str, Any]],
        timeout: float = 30.0,
    ) -> list[tuple[Any, Message]]:
        """Produce each record (kwargs of Producer.produce), flush, and return the delivery
        reports (error, message) in the order they arrived."""
        reports: list[tuple[Any, Message]] = []

        def delivered(error: Any, message: Message) -> None:
            reports.append((error, message))

        for record in records:
            while True:
                try:
                    producer.produce(topic, on_delivery=delivered, **record)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        remaining = producer.flush(timeout)
        assert remaining == 0, f"{remaining} records still undelivered after {timeout} s"
        return reports

    @staticmethod
    def consume(
        consumer: Consumer, count: int, timeout: float = 30.0, batch: int = 500
    ) -> list[Message]:
        """Exactly `count` messages from the consumer's assignment (in arrival order), failing
        on any error message or when they do not all arrive within `timeout` s."""
        messages: list[Message] = []
        deadline = time.monotonic() + timeout
        while len(messages) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"received {len(messages)} of {count} records within {timeout} s"
                )
            for message in consumer.consume(min(batch, count - len(messages)), min(left, 1.0)):
                if message.error() is not None:
                    raise KafkaException(message.error())
                messages.append(message)
        return messages

    @staticmethod
    def assign_from(
        consumer: Consumer, topic: str, partitions: list[int], offset: int = OFFSET_BEGINNING
    ) -> None:
        consumer.assign([CTopicPartition(topic, p, offset) for p in partitions])

    def close(self) -> None:
        for consumer in self._consumers:
            with contextlib.suppress(RuntimeError):  # already closed by the test
                consumer.close()


@pytest.fixture
def clients() -> Iterator[Clients]:
    made = Clients()
    try:
        yield made
    finally:
        made.close()


# A consensus ensemble shared by a module's kazoo tests, clients on it, and a znode prefix of
# each test's own ------------------------------------------------------------------------

KAZOO_WAIT = 30.0  # bound of every wait of a kazoo client on the ensemble


@pytest.fixture(scope="module")
def ens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ensemble]:
    """A three-member ensemble serving; every member must exit 0 when stopped."""
    ensemble = Ensemble(tmp_path_factory.mktemp("ensemble")).start()
    try:
        ensemble.wait_serving()
        yield ensemble
    finally:
        ensemble.stop()
    assert all(codes == [0] for codes in ensemble.exit_codes.values()), ensemble.exit_codes


@pytest.fixture
def zk(ens: Ensemble) -> Iterator[KazooClients]:
    clients = KazooClients(ens.hosts, KAZOO_WAIT)
    try:
        yield clients
    finally:
        clients.close()


@pytest.fixture
def base(request: pytest.FixtureRequest) -> str:
    """A znode prefix of this test's own (not created)."""
    name = re.sub(r"[^a-zA-Z0-9_-]+", "-", request.node.name).strip("-")[:60]
    return f"/{name}-{uuid.uuid4().hex[:8]}"
