"""Consumer group members for the end-to-end tests, and what they read.

In the test's process: `Topic` (a topic and every record produced to it, keyed
`p<partition>-b<batch>-<n>` and sent to its partition explicitly, so each partition's content
is known) and `InProcessGroup` (confluent-kafka consumers of one group, polled in turn from
the test's thread), with the checks of what a group read.

In a process of its own, so that a test can SIGKILL it (a crash: no LeaveGroup, no final
commit) or SIGTERM it (a clean `close()`: LeaveGroup), a confluent-kafka or kafka-python
member:

    python -m tests.e2e.group_member --client confluent-kafka|kafka-python \
        --bootstrap HOST:PORT --group G --topic T [--client-id ID] \
        [--config '{"fetch.min.bytes": 1}']    (more settings, in the client's own spelling)

It subscribes to the topic (session timeout SESSION_MS, heartbeats every HEARTBEAT_MS, no
auto-commit, `earliest` where the group has no offset), consumes, commits synchronously after
every batch it reads (the offset after the last record of each partition), and prints what
happened on stdout, one JSON object a line, flushed at once; both clients run one loop
(`run`) behind the four calls of `MemberClient`:

    {"event": "ready"}                                   subscribed (the banner)
    {"event": "assigned", "partitions": [0, 3]}          its whole assignment, on each change
    {"event": "record", "partition": 0, "offset": 7, "key": "...", "value": "..."}
    {"event": "committed", "offsets": {"0": 8}}          a commit the coordinator acknowledged
    {"event": "commit_failed", "error": "..."}
    {"event": "closed"}                                  after SIGTERM, once close() returned

A test starts it through `MemberProcess` (tests/e2e/service_process.py: stdout to a file,
stopped by PID, killed with the test process) and reads those events back.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from tests.e2e.conftest import Clients
from tests.e2e.service_process import ServiceProcess

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import ConsumerRebalanceListener, KafkaConsumer
    from kafka import TopicPartition as KTopicPartition
    from kafka.errors import KafkaError as KafkaPythonError
    from kafka.structs import OffsetAndMetadata

SESSION_MS = 6000  # the broker's group_min_session_timeout_ms (Kafka's default)
HEARTBEAT_MS = 500
# An assignment change must settle within the session timeout plus this margin.
CONVERGE_S = SESSION_MS / 1000 + 10
TIMEOUT = 30  # seconds, for reading what was produced
POLL_SECONDS = 0.2  # of a member process
BATCH = 500  # records a member process reads at most before it commits

Read = tuple[int, int, str, str]  # partition, offset, key, value


# Records ------------------------------------------------------------------------------------


class Topic:
    """A topic created for one test and everything produced to it: per partition, the
    (offset, key, value) of each record in offset order."""

    def __init__(
        self, clients: Clients, bootstrap: str, name: str, partitions: int, *, create: bool = True
    ) -> None:
        self.clients = clients
        self.bootstrap = bootstrap
        self.name = name
        self.partitions = partitions
        self.batches = 0
        self.stored: dict[int, list[tuple[int, str, str]]] = {p: [] for p in range(partitions)}
        if create:  # else the caller created it (with replicas, say)
            clients.create_topic(bootstrap, name, partitions)
        self._producer = clients.producer(bootstrap, {"acks": "all"})

    def produce(self, per_partition: int) -> list[Read]:
        """`per_partition` more records to each partition; they are checked to be stored
        at the offsets that follow the ones before. Returns them."""
        batch = self.batches
        self.batches += 1
        records = [
            {"partition": p, "key": f"p{p}-b{batch}-{i:03d}", "value": f"value {p}/{batch}/{i}"}
            for i in range(per_partition)
            for p in range(self.partitions)
        ]
        reports = Clients.produce_all(self._producer, self.name, records)
        assert [e for e, _ in reports if e is not None] == []
        added: list[Read] = []
        for _, message in sorted(reports, key=lambda r: (r[1].partition(), r[1].offset())):
            partition, offset = message.partition(), message.offset()
            assert offset == len(self.stored[partition]), "offsets are dense from 0"
            key, value = message.key().decode(), message.value().decode()
            self.stored[partition].append((offset, key, value))
            added.append((partition, offset, key, value))
        assert len(added) == per_partition * self.partitions
        return added

    def ends(self) -> dict[int, int]:
        return {p: len(records) for p, records in self.stored.items()}


def check_read_once_in_order(reads: dict[str, list[Read]], expected: list[Read]) -> None:
    """`reads` (per member, in the order each read them) hold every expected record exactly
    once; each member read each partition in increasing offset order."""
    everything = [r for member in reads.values() for r in member]
    seen: dict[tuple[int, int], int] = {}
    for partition, offset, _, _ in everything:
        seen[(partition, offset)] = seen.get((partition, offset), 0) + 1
    duplicates = sorted(tp for tp, n in seen.items() if n > 1)
    assert not duplicates, f"read more than once: {duplicates[:10]}"
    missing = sorted({(p, o) for p, o, _, _ in expected} - set(seen))
    assert not missing, f"never read: {missing[:10]}"
    assert sorted(everything) == sorted(expected), "records read differ from those stored"
    for name, member in reads.items():
        for partition in {p for p, _, _, _ in member}:
            offsets = [o for p, o, _, _ in member if p == partition]
            assert offsets == sorted(offsets), f"{name} read partition {partition} out of order"


def first_offsets(reads: list[Read]) -> dict[int, int]:
    out: dict[int, int] = {}
    for partition, offset, _, _ in reads:
        out.setdefault(partition, offset)
    return out


def is_split(assignments: dict[str, set[int]], partitions: int) -> bool:
    """Every member holds some partitions, no partition twice, all of them held."""
    owned = [p for a in assignments.values() for p in a]
    return (
        all(assignments.values())
        and len(owned) == len(set(owned))
        and set(owned) == set(range(partitions))
    )


# confluent-kafka members, polled in turn ---------------------------------------------------


class Member:
    def __init__(self, name: str, consumer: Any) -> None:
        self.name = name
        self.consumer = consumer
        self.reads: list[Read] = []
        self.committed: dict[int, int] = {}
        self.callbacks: list[tuple[str, list[int]]] = []  # ("assign"/"revoke", partitions)
        self.open = True

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()} if self.open else set()


class InProcessGroup:
    """confluent-kafka consumers of one group, polled in turn from the test's thread. With
    `commit`, each member commits synchronously after every batch it reads (the offset after
    its last record of each partition), before it reads more."""

    def __init__(
        self,
        clients: Clients,
        topic: Topic,
        group: str,
        config: dict[str, Any] | None = None,
        *,
        commit: bool = True,
        batch: int = 500,
    ) -> None:
        self.clients = clients
        self.topic = topic
        self.group = group
        self.config = {
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            **(config or {}),
        }
        self.commit = commit
        self.batch = batch
        self.members: dict[str, Member] = {}

    def join(self, name: str, extra: dict[str, Any] | None = None) -> Member:
        consumer = self.clients.consumer(
            self.topic.bootstrap, {**self.config, "client.id": name, **(extra or {})}
        )
        member = Member(name, consumer)

        def on_assign(_consumer: Any, partitions: list[TopicPartition]) -> None:
            member.callbacks.append(("assign", sorted(tp.partition for tp in partitions)))

        def on_revoke(_consumer: Any, partitions: list[TopicPartition]) -> None:
            member.callbacks.append(("revoke", sorted(tp.partition for tp in partitions)))

        consumer.subscribe([self.topic.name], on_assign=on_assign, on_revoke=on_revoke)
        self.members[name] = member
        return member

    def close(self, name: str) -> None:
        member = self.members[name]
        member.consumer.close()
        member.open = False

    def close_all(self) -> None:
        for name, member in self.members.items():
            if member.open:
                self.close(name)

    def live(self) -> dict[str, Member]:
        return {n: m for n, m in self.members.items() if m.open}

    def poll(self, timeout: float = 0.05) -> None:
        for member in self.live().values():
            messages = member.consumer.consume(self.batch, timeout)
            last: dict[int, int] = {}
            for message in messages:
                if message.error() is not None:
                    raise KafkaException(message.error())
                partition, offset = message.partition(), message.offset()
                member.reads.append(
                    (partition, offset, message.key().decode(), message.value().decode())
                )
                last[partition] = offset + 1
            if self.commit and last:
                offsets = [TopicPartition(self.topic.name, p, o) for p, o in sorted(last.items())]
                done = member.consumer.commit(offsets=offsets, asynchronous=False)
                assert all(tp.error is None for tp in done), done
                member.committed.update(last)

    def assignments(self) -> dict[str, set[int]]:
        return {name: m.assignment() for name, m in self.live().items()}

    def reads(self) -> dict[str, list[Read]]:
        return {name: m.reads for name, m in self.members.items()}

    def read_count(self) -> int:
        return sum(len(m.reads) for m in self.members.values())

    def committed(self) -> dict[int, int]:
        """Per partition, the highest offset any member committed."""
        out: dict[int, int] = {}
        for member in self.members.values():
            for partition, offset in member.committed.items():
                out[partition] = max(out.get(partition, 0), offset)
        return out

    def poll_until(self, condition: Callable[[], bool], timeout: float, what: str) -> float:
        """Poll every member until `condition`; the seconds it took."""
        started = time.monotonic()
        while not condition():
            if time.monotonic() - started > timeout:
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what}; "
                    f"assignments {self.assignments()}, {self.read_count()} records read"
                )
            self.poll()
        return time.monotonic() - started

    def wait_split(self, timeout: float = CONVERGE_S) -> dict[str, set[int]]:
        names = set(self.live())
        self.poll_until(
            lambda: (
                set(self.assignments()) == names
                and is_split(self.assignments(), self.topic.partitions)
            ),
            timeout,
            f"the {self.topic.partitions} partitions split between {sorted(names)}",
        )
        return self.assignments()

    def keep_polling(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll()


def group_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# A member in a process of its own ----------------------------------------------------------


class MemberProcess(ServiceProcess):
    name = "group-member"

    def __init__(
        self,
        work_dir: Path,
        *,
        client: str,
        bootstrap: str,
        group: str,
        topic: str,
        client_id: str,
        config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(work_dir, start_timeout=30.0, stop_timeout=15.0)
        assert client in CLIENTS, client
        self.client = client
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.client_id = client_id
        self.config = dict(config or {})

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "tests.e2e.group_member",
            "--client",
            self.client,
            "--bootstrap",
            self.bootstrap,
            "--group",
            self.group,
            "--topic",
            self.topic,
            "--client-id",
            self.client_id,
            "--config",
            json.dumps(self.config),
        ]

    def banner_read(self, banner: str) -> bool:
        return '"event": "ready"' in banner

    def events(self) -> list[dict[str, Any]]:
        """Every complete line printed by its current (or last) run."""
        path = self.work_dir / f"stdout-{self.starts}.log"
        text = path.read_text(encoding="utf-8", errors="replace")
        return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]

    def assignment(self) -> set[int]:
        """Its assignment as last printed (empty before the first one)."""
        assigned = [e["partitions"] for e in self.events() if e["event"] == "assigned"]
        return set(assigned[-1]) if assigned else set()

    def records(self) -> list[tuple[int, int, str, str]]:
        """(partition, offset, key, value) of every record it printed, in order read."""
        return [
            (e["partition"], e["offset"], e["key"], e["value"])
            for e in self.events()
            if e["event"] == "record"
        ]

    def committed(self) -> dict[int, int]:
        """Per partition, the last offset a commit of it was acknowledged with."""
        out: dict[int, int] = {}
        for event in self.events():
            if event["event"] == "committed":
                out.update({int(p): o for p, o in event["offsets"].items()})
        return out


# In the member process: one client each, behind the same four calls.

Fetched = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value


class MemberClient(Protocol):
    def poll(self) -> list[Fetched]:
        """Up to BATCH records, waiting up to POLL_SECONDS (longer through a rebalance)."""

    def assignment(self) -> list[int]: ...

    def commit(self, offsets: dict[int, int]) -> str | None:
        """Commit synchronously; None once acknowledged, else why not."""

    def close(self) -> None:
        """Leave the group (LeaveGroup), committing nothing."""


class ConfluentKafkaClient:
    def __init__(
        self, bootstrap: str, group: str, topic: str, client_id: str, config: dict[str, Any]
    ) -> None:
        self.topic = topic
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "client.id": client_id,
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **config,
            }
        )
        self.consumer.subscribe([topic])

    def poll(self) -> list[Fetched]:
        messages = self.consumer.consume(BATCH, POLL_SECONDS)
        for m in messages:
            if m.error() is not None:
                _emit(event="error", error=str(m.error()))
        return [(m.partition(), m.offset(), m.key(), m.value()) for m in messages if not m.error()]  # type: ignore[misc]

    def assignment(self) -> list[int]:
        return sorted(tp.partition for tp in self.consumer.assignment())

    def commit(self, offsets: dict[int, int]) -> str | None:
        wanted = [TopicPartition(self.topic, p, o) for p, o in sorted(offsets.items())]
        try:
            done = self.consumer.commit(offsets=wanted, asynchronous=False)
        except KafkaException as error:
            return str(error)
        failed = [str(tp.error) for tp in done or [] if tp.error is not None]
        return str(failed) if failed else None

    def close(self) -> None:
        self.consumer.close()


class KafkaPythonClient(ConsumerRebalanceListener):  # type: ignore[misc]
    """Its assignment is what its rebalance listener was told (kafka-python's poll runs the
    rebalance and calls the listener)."""

    def __init__(
        self, bootstrap: str, group: str, topic: str, client_id: str, config: dict[str, Any]
    ) -> None:
        self.topic = topic
        self.assigned: set[int] = set()
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            client_id=client_id,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=BATCH,
            **config,
        )
        self.consumer.subscribe([topic], listener=self)

    def on_partitions_revoked(self, revoked: Any) -> None:
        self.assigned -= {tp.partition for tp in revoked}

    def on_partitions_assigned(self, assigned: Any) -> None:
        self.assigned |= {tp.partition for tp in assigned}

    def poll(self) -> list[Fetched]:
        batches = self.consumer.poll(timeout_ms=int(POLL_SECONDS * 1000))
        return [(r.partition, r.offset, r.key, r.value) for rs in batches.values() for r in rs]

    def assignment(self) -> list[int]:
        return sorted(self.assigned)

    def commit(self, offsets: dict[int, int]) -> str | None:
        try:
            self.consumer.commit(
                {KTopicPartition(self.topic, p): OffsetAndMetadata(o) for p, o in offsets.items()}
            )
        except KafkaPythonError as error:
            return repr(error)
        return None

    def close(self) -> None:
        self.consumer.close()


CLIENTS: dict[str, Callable[[str, str, str, str, dict[str, Any]], MemberClient]] = {
    "confluent-kafka": ConfluentKafkaClient,
    "kafka-python": KafkaPythonClient,
}


def _emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def run(client: str, bootstrap: str, group: str, topic: str, client_id: str, config: Any) -> int:
    stopping = False

    def on_sigterm(_signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_sigterm)
    member = CLIENTS[client](bootstrap, group, topic, client_id, config)
    _emit(event="ready")
    assigned: list[int] | None = None
    while not stopping:
        fetched = member.poll()
        now = member.assignment()
        if now != assigned:
            assigned = now
            _emit(event="assigned", partitions=now, at=time.time())
        last: dict[int, int] = {}
        for partition, offset, key, value in fetched:
            _emit(
                event="record",
                partition=partition,
                offset=offset,
                key=_text(key),
                value=_text(value),
            )
            last[partition] = offset + 1
        if last:
            error = member.commit(last)
            if error is None:
                _emit(event="committed", offsets={str(p): o for p, o in last.items()})
            else:
                _emit(event="commit_failed", error=error)
    member.close()
    _emit(event="closed")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="A consumer group member (see the module)")
    parser.add_argument("--client", choices=sorted(CLIENTS), default="confluent-kafka")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--client-id", default="group-member")
    parser.add_argument("--config", default="{}", help="more client settings, as JSON")
    args = parser.parse_args()
    config = json.loads(args.config)
    return run(args.client, args.bootstrap, args.group, args.topic, args.client_id, config)


if __name__ == "__main__":
    sys.exit(main())
