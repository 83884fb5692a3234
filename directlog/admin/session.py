"""The CLI's connection to a cluster: kafka-python's KafkaAdminClient, the cluster's
metadata as the planners want it, and Kafka error codes turned into messages.

kafka-python's public admin methods drop the server's per-item error messages for some
APIs (AlterPartitionReassignments, IncrementalAlterConfigs); those requests are built
here and sent through the client's own routing (`send`, `send_to_controller`), so a
refusal is shown with Kafka's error name and the broker's message.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from directlog.admin.client_config import ClientConfigError, read_client_config
from directlog.admin.plans import Assignment, Broker, Partition
from directlog.protocol.errors import ErrorCode

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.errors as kafka_errors
    from kafka import KafkaAdminClient

T = TypeVar("T")

# Where kafka-python's names differ from Kafka's own and ours has no entry.
_KAFKA_NAMES = {
    39: "INVALID_REPLICA_ASSIGNMENT",
    80: "PREFERRED_LEADER_NOT_AVAILABLE",
    83: "ELIGIBLE_LEADERS_NOT_AVAILABLE",
    84: "ELECTION_NOT_NEEDED",
    85: "NO_REASSIGNMENT_IN_PROGRESS",
}
RETRIABLE_GROUP_CODES = frozenset({14, 15, 16})  # coordinator loading / not available / moved


class AdminError(Exception):
    """Refused input or a refused request: the message is what the user reads."""


class ServerError(AdminError):
    def __init__(self, what: str, code: int, message: str | None = None) -> None:
        self.code = code
        self.server_message = message
        super().__init__(f"{what}: {describe_error(code, message)}")


def error_name(code: int) -> str:
    """Kafka's name for an error code (UNKNOWN_TOPIC_OR_PARTITION)."""
    try:
        return ErrorCode(code).name
    except ValueError:
        pass
    if code in _KAFKA_NAMES:
        return _KAFKA_NAMES[code]
    name = getattr(kafka_errors.for_code(code), "message", None)
    return str(name) if name and name != "UNKNOWN" else f"ERROR_{code}"


def describe_error(code: int, message: str | None = None) -> str:
    text = f"{error_name(code)} ({code})"
    return f"{text}: {message}" if message else text


def error_code_of(error: BaseException | type[BaseException] | None) -> int:
    """The Kafka error code a kafka-python error (class or instance) stands for."""
    errno = getattr(error, "errno", None)
    return int(errno) if isinstance(errno, int) else -1


@dataclass(frozen=True, slots=True)
class PartitionState:
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(slots=True)
class ClusterView:
    """One look at the cluster: its live brokers and every partition's replicas."""

    brokers: dict[int, Broker]
    addresses: dict[int, str]
    partitions: dict[Partition, PartitionState] = field(default_factory=dict)
    internal: set[str] = field(default_factory=set)
    controller: int = -1

    @property
    def assignment(self) -> Assignment:
        return {p: s.replicas for p, s in self.partitions.items()}

    @property
    def partition_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for p in self.partitions:
            counts[p.topic] = max(counts.get(p.topic, 0), p.partition + 1)
        return counts

    def topic(self, name: str) -> dict[int, PartitionState]:
        return {p.partition: s for p, s in sorted(self.partitions.items()) if p.topic == name}


class Session:
    """A KafkaAdminClient against the bootstrap servers, every request bounded by
    `timeout` seconds, logged in with `client` (kafka-python settings, from
    directlog.admin.client_config; by default the DIRECTLOG_CLIENT_* variables)."""

    def __init__(
        self, bootstrap: str, timeout: float, client: Mapping[str, Any] | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
        if not servers:
            raise AdminError("no bootstrap server given")
        timeout_ms = max(1, int(timeout * 1000))
        if client is None:
            try:
                client, _ = read_client_config(None, os.environ)
            except ClientConfigError as error:
                raise AdminError(str(error)) from None
        try:
            self.kafka: Any = KafkaAdminClient(
                bootstrap_servers=servers,
                client_id="directlog-admin",
                request_timeout_ms=timeout_ms,
                bootstrap_timeout_ms=timeout_ms,
                **client,
            )
        except kafka_errors.KafkaError as error:
            raise AdminError(f"cannot reach the cluster at {bootstrap}: {error}") from None

    def close(self) -> None:
        self.kafka.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def timeout_ms(self) -> int:
        return max(1, int(self.timeout * 1000))

    # Raw requests --------------------------------------------------------------------

    def send(self, request: Any, node_id: int | None = None) -> Any:
        """A request to one broker (any when `node_id` is None); its response, errors and
        all, for the caller to read."""
        manager = self.kafka._manager

        async def exchange() -> Any:
            return await manager.send(request, node_id=node_id)

        return self.call(request, lambda: manager.run(exchange))

    def send_to_controller(self, request: Any) -> Any:
        """A request to the controller the metadata names, retried once on NOT_CONTROLLER
        (kafka-python's own routing); the response with its errors unraised."""
        kafka = self.kafka
        return self.call(
            request,
            lambda: kafka._manager.run(kafka._send_request_to_controller, request, lambda r: ()),
        )

    def call(self, request: Any, run: Callable[[], T]) -> T:
        """`run()`, with kafka-python's "the broker does not serve this API" made a
        message that says which API."""
        try:
            return run()
        except kafka_errors.IncompatibleBrokerVersion:
            api = type(request).__name__.removesuffix("Request")
            raise AdminError(
                f"the brokers at {self.bootstrap} do not serve {api} (Kafka API key "
                f"{getattr(request, 'API_KEY', '?')}) yet"
            ) from None

    def api(self, name: str, run: Callable[[], T]) -> T:
        """A kafka-python admin call; its errors as messages naming Kafka's error code."""
        try:
            return run()
        except kafka_errors.IncompatibleBrokerVersion:
            raise AdminError(f"the brokers at {self.bootstrap} do not serve {name} yet") from None
        except kafka_errors.BrokerResponseError as error:
            message = str(error.args[0]) if error.args else None
            raise ServerError(name, error_code_of(error), message) from None

    # Metadata ------------------------------------------------------------------------

    def cluster(self, topics: Iterable[str] | None = None) -> ClusterView:
        """Live brokers (with racks) and the partitions of `topics` (all when None);
        AdminError when a named topic does not exist."""
        described = self.api("DescribeCluster", self.kafka.describe_cluster)
        brokers = {
            int(b["broker_id"]): Broker(int(b["broker_id"]), b.get("rack") or None)
            for b in described["brokers"]
        }
        addresses = {int(b["broker_id"]): f"{b['host']}:{b['port']}" for b in described["brokers"]}
        names = None if topics is None else sorted(set(topics))
        view = ClusterView(brokers, addresses, controller=int(described.get("controller_id", -1)))
        if names == []:
            return view
        listed = self.api("Metadata", lambda: self.kafka.describe_topics(names))
        missing = []
        for topic in listed:
            code = int(topic.get("error_code", 0))
            if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                missing.append(topic["name"])
                continue
            if code:
                raise ServerError(f"topic {topic['name']!r}", code)
            if topic.get("is_internal"):
                view.internal.add(topic["name"])
            for p in topic["partitions"]:
                view.partitions[Partition(topic["name"], int(p["partition_index"]))] = (
                    PartitionState(
                        leader=int(p["leader_id"]),
                        replicas=tuple(int(b) for b in p["replica_nodes"]),
                        isr=tuple(int(b) for b in p["isr_nodes"]),
                    )
                )
        if missing:
            raise AdminError(
                f"no topic {', '.join(repr(t) for t in sorted(missing))} in the cluster "
                f"({error_name(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)})"
            )
        return view


def retry(attempt: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """`attempt()`'s first answer other than None, within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        answer = attempt()
        if answer is not None:
            return answer
        if time.monotonic() >= deadline:
            raise AdminError(f"{what}: no answer within {timeout:g} s")
        time.sleep(interval)
