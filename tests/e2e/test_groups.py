"""Consumer groups with real clients against a real broker: confluent-kafka (eager `range`
and `cooperative-sticky`), kafka-python, kcat and both AdminClients.

Every test produces known records (keyed `p<partition>-b<batch>-<n>`, each sent to its
partition explicitly, so each partition's content is known), lets the group consume, and
checks what each member read: its partitions only, every record exactly once, in offset
order per partition, resuming exactly at the committed offsets after a handover or a
restart. Assignment changes (a member leaving, crashing, restarting) must converge within
the session timeout plus a margin; every wait is bounded.

The members of a group run in the test's thread, polled in turn (confluent-kafka), in
threads (kafka-python, whose poll blocks through a rebalance), or as processes where one
must be SIGKILLed (either client); tests/e2e/group_member.py holds those members and the
checks.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec

from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.conftest import Clients, _stop_checked
from tests.e2e.group_member import (
    CONVERGE_S,
    HEARTBEAT_MS,
    SESSION_MS,
    TIMEOUT,
    InProcessGroup,
    MemberProcess,
    Read,
    Topic,
    check_read_once_in_order,
    first_offsets,
    group_name,
    is_split,
)

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient, KafkaConsumer
    from kafka import TopicPartition as KTopicPartition
    from kafka.errors import GroupSubscribedToTopicError, NoError
    from kafka.structs import OffsetAndMetadata

PARTITIONS = 6
INITIAL_REBALANCE_DELAY_MS = 1000  # Kafka's 3000 costs every new group 2 s more
KCAT = shutil.which("kcat")  # `make test` installs Debian's kcat when it is missing


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    cluster = Cluster(
        tmp_path_factory.mktemp("groups"),
        broker_settings={"group_initial_rebalance_delay_ms": INITIAL_REBALANCE_DELAY_MS},
    ).start()
    try:
        yield cluster.brokers[0]
        _stop_checked(cluster.brokers[0])
    finally:
        cluster.stop()


# confluent-kafka ------------------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_three_members_split_the_partitions_and_two_take_over_from_a_leaver(
    broker: BrokerProcess, clients: Clients, topic_name: Callable[[str], str], strategy: str
) -> None:
    topic = Topic(clients, broker.bootstrap, topic_name("split"), PARTITIONS)
    group = InProcessGroup(
        clients, topic, group_name("split"), {"partition.assignment.strategy": strategy}
    )
    for name in ("a", "b", "c"):
        group.join(name)
    before = group.wait_split()
    assert sorted(len(a) for a in before.values()) == [2, 2, 2], before

    first = topic.produce(20)
    group.poll_until(lambda: group.read_count() >= len(first), TIMEOUT, "the first batch")
    group.keep_polling(0.5)  # nothing more may arrive
    check_read_once_in_order(group.reads(), first)
    for name, member in group.members.items():
        assert {p for p, _, _, _ in member.reads} == before[name], f"{name} read foreign data"
    assert group.committed() == topic.ends()

    # c leaves (LeaveGroup): a and b take its partitions and resume at its commits.
    seen = {name: len(group.members[name].callbacks) for name in ("a", "b")}
    group.close("c")
    after = group.wait_split()
    assert set(after) == {"a", "b"}
    if strategy == "cooperative-sticky":
        # Sticky and incremental: a and b keep what they had, only gain c's partitions,
        # and are never asked to give any up.
        assert after["a"] >= before["a"] and after["b"] >= before["b"], (before, after)
        for name in ("a", "b"):
            since = group.members[name].callbacks[seen[name] :]
            assert not [ps for kind, ps in since if kind == "revoke" and ps], (
                f"{name} had partitions revoked: {since}"
            )
    reads_before = {name: len(m.reads) for name, m in group.members.items()}
    second = topic.produce(20)
    group.poll_until(
        lambda: group.read_count() >= len(first) + len(second), TIMEOUT, "the second batch"
    )
    group.keep_polling(0.5)
    check_read_once_in_order(group.reads(), first + second)
    for name in ("a", "b"):
        later = group.members[name].reads[reads_before[name] :]
        assert {p for p, _, _, _ in later} == after[name]
        # Each partition, c's former ones included, resumed right after the last commit.
        assert first_offsets(later) == dict.fromkeys(after[name], 20)
    assert group.committed() == topic.ends()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_members_in_processes_leave_and_crash(
    broker: BrokerProcess,
    clients: Clients,
    topic_name: Callable[[str], str],
    tmp_path: Path,
    client: str,
) -> None:
    """Three member processes split the partitions; one closes (LeaveGroup) and two share
    them; one is SIGKILLed and the last takes everything once the session times out. Each
    handover resumes exactly at the committed offsets: nothing lost, nothing read twice."""
    topic = Topic(clients, broker.bootstrap, topic_name("procs"), PARTITIONS)
    group = group_name("procs")
    members = [
        MemberProcess(
            tmp_path / f"member-{i}",
            client=client,
            bootstrap=broker.bootstrap,
            group=group,
            topic=topic.name,
            client_id=f"member-{i}",
        )
        for i in range(3)
    ]

    def split(among: list[MemberProcess]) -> bool:
        return is_split({str(m.work_dir): m.assignment() for m in among}, PARTITIONS)

    def read_and_committed() -> bool:
        committed: dict[int, int] = {}
        for member in members:
            for partition, offset in member.committed().items():
                committed[partition] = max(committed.get(partition, 0), offset)
        return committed == topic.ends()

    def reads() -> dict[str, list[Read]]:
        return {f"member-{i}": m.records() for i, m in enumerate(members)}

    try:
        for member in members:
            member.start()
        wait_for(lambda: split(members), CONVERGE_S, "three members to split the partitions")
        first = topic.produce(10)
        wait_for(read_and_committed, TIMEOUT, "the first batch committed")
        check_read_once_in_order(reads(), first)

        # A clean close: LeaveGroup, the two others rebalance at once.
        assert members[2].stop() == 0
        assert members[2].events()[-1]["event"] == "closed"
        wait_for(lambda: split(members[:2]), CONVERGE_S, "two members to share the partitions")
        second = topic.produce(10)
        wait_for(read_and_committed, TIMEOUT, "the second batch committed")
        check_read_once_in_order(reads(), first + second)

        # A crash: the coordinator notices when the session times out.
        survivor_had = members[0].assignment()
        members[1].kill()
        wait_for(
            lambda: members[0].assignment() == set(range(PARTITIONS)),
            CONVERGE_S,
            "the survivor to get every partition after the session timeout",
        )
        assert survivor_had != set(range(PARTITIONS))
        third = topic.produce(10)
        wait_for(read_and_committed, TIMEOUT, "the third batch committed")
        everything = first + second + third
        check_read_once_in_order(reads(), everything)
        survivor_third = [r for r in members[0].records() if r[3].split("/")[1] == "2"]
        assert sorted(survivor_third) == sorted(third)
        assert first_offsets(survivor_third) == dict.fromkeys(range(PARTITIONS), 20)
    finally:
        for member in members:
            member.stop()


@pytest.mark.timeout(90)
def test_restarted_members_resume_exactly_at_the_committed_offsets(
    broker: BrokerProcess, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    topic = Topic(clients, broker.bootstrap, topic_name("restart"), PARTITIONS)
    name = group_name("restart")
    group = InProcessGroup(clients, topic, name, batch=7)
    for member in ("a", "b", "c"):
        group.join(member)
    group.wait_split()
    everything = topic.produce(50)
    group.poll_until(lambda: group.read_count() >= 150, TIMEOUT, "half the records")
    committed = group.committed()
    group.close_all()
    read_before = [r for reads in group.reads().values() for r in reads]
    assert {(p, o) for p, o, _, _ in read_before} == {
        (p, o) for p, end in committed.items() for o in range(end)
    }, "every member committed exactly what it read"

    # What the coordinator stored is what the members committed.
    admin = clients.admin(broker.bootstrap)
    request = [ConsumerGroupTopicPartitions(name)]
    stored = admin.list_consumer_group_offsets(request)[name].result(timeout=TIMEOUT)
    assert {tp.partition: tp.offset for tp in stored.topic_partitions} == committed

    # Restarted members read the rest, each partition from its committed offset.
    again = InProcessGroup(clients, topic, name)
    for member in ("a2", "b2", "c2"):
        again.join(member)
    again.wait_split()
    rest = len(everything) - len(read_before)
    again.poll_until(lambda: again.read_count() >= rest, TIMEOUT, "the rest of the records")
    again.keep_polling(0.5)
    read_after = [r for reads in again.reads().values() for r in reads]
    assert first_offsets(read_after) == {
        p: committed.get(p, 0) for p in range(PARTITIONS) if committed.get(p, 0) < 50
    }
    check_read_once_in_order({"before": read_before, **again.reads()}, everything)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("restarting", ["c", "a"], ids=["follower", "leader"])
def test_a_static_member_restarting_gets_its_partitions_back_without_a_rebalance(
    broker: BrokerProcess, clients: Clients, topic_name: Callable[[str], str], restarting: str
) -> None:
    """KIP-345: a member with group.instance.id that comes back within its session timeout
    takes its old identity and assignment; the other members are not rebalanced. The same
    for the group's leader (KIP-814: it rejoins without assigning anew)."""
    topic = Topic(clients, broker.bootstrap, topic_name("static"), PARTITIONS)
    name = group_name("static")
    session = {"session.timeout.ms": 15000}  # time enough to restart a consumer
    group = InProcessGroup(clients, topic, name, session)
    # a joins first and alone, so it leads the group.
    group.join("a", {"group.instance.id": "static-a"})
    group.poll_until(
        lambda: group.assignments()["a"] == set(range(PARTITIONS)), CONVERGE_S, "a alone"
    )
    group.join("b", {"group.instance.id": "static-b"})
    group.join("c", {"group.instance.id": "static-c"})
    before = group.wait_split()
    first = topic.produce(10)
    group.poll_until(lambda: group.read_count() >= len(first), TIMEOUT, "the first batch")
    group.keep_polling(1.0)
    others = sorted({"a", "b", "c"} - {restarting})
    callbacks = {n: list(group.members[n].callbacks) for n in others}

    group.close(restarting)  # a static member sends no LeaveGroup
    again = f"{restarting}-again"
    group.join(again, {"group.instance.id": f"static-{restarting}"})
    group.poll_until(
        lambda: group.assignments()[again] == before[restarting],
        CONVERGE_S,
        "the restarted static member to get its partitions back",
    )
    group.keep_polling(3 * HEARTBEAT_MS / 1000 + 1)  # a rebalance would show by now
    assert group.assignments() == {**{n: before[n] for n in others}, again: before[restarting]}
    for n in others:
        assert group.members[n].callbacks == callbacks[n], f"{n} was rebalanced"
    assert group.members[again].callbacks == [("assign", sorted(before[restarting]))]

    second = topic.produce(10)
    group.poll_until(
        lambda: group.read_count() >= len(first) + len(second), TIMEOUT, "the second batch"
    )
    group.keep_polling(0.5)
    check_read_once_in_order(group.reads(), first + second)
    assert first_offsets(group.members[again].reads) == dict.fromkeys(before[restarting], 10)


# kafka-python ---------------------------------------------------------------------------------


class KafkaPythonMember(threading.Thread):
    """A kafka-python KafkaConsumer in a group, in a thread of its own (its poll blocks
    through a rebalance). It commits synchronously after every poll that returned records;
    once `stop` is set it stops polling, waits at `barrier` until every member has, and
    closes (LeaveGroup), so no member leaves while another still reads."""

    def __init__(
        self,
        name: str,
        bootstrap: str,
        group: str,
        topic: str,
        stop: threading.Event,
        barrier: threading.Barrier,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.stop = stop
        self.barrier = barrier
        self.reads: list[Read] = []
        self.committed: dict[int, int] = {}
        self.assigned: set[int] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            client_id=self.name,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=1000,
            max_poll_records=5,
            request_timeout_ms=TIMEOUT * 1000,
        )
        try:
            consumer.subscribe([self.topic])
            while not self.stop.is_set():
                batches = consumer.poll(timeout_ms=200)
                self.assigned = {tp.partition for tp in consumer.assignment()}
                last: dict[KTopicPartition, int] = {}
                for tp, records in batches.items():
                    for r in records:
                        self.reads.append(
                            (tp.partition, r.offset, r.key.decode(), r.value.decode())
                        )
                        last[tp] = r.offset + 1
                if last:
                    consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in last.items()})
                    self.committed.update({tp.partition: o for tp, o in last.items()})
        except BaseException as error:  # reported by the test
            self.error = error
        finally:
            with contextlib.suppress(threading.BrokenBarrierError):
                self.barrier.wait(TIMEOUT)
            consumer.close(autocommit=False)


class KafkaPythonGroup:
    def __init__(self, bootstrap: str, group: str, topic: str, names: list[str]) -> None:
        self.stop = threading.Event()
        barrier = threading.Barrier(len(names))
        self.members = [
            KafkaPythonMember(n, bootstrap, group, topic, self.stop, barrier) for n in names
        ]

    def __enter__(self) -> KafkaPythonGroup:
        for member in self.members:
            member.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for member in self.members:
            member.join(TIMEOUT)
        assert not any(m.is_alive() for m in self.members), "a member did not stop"
        errors = [m.error for m in self.members if m.error is not None]
        assert not errors, errors

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        def checked() -> bool:
            errors = [m.error for m in self.members if m.error is not None]
            assert not errors, errors
            return condition()

        wait_for(checked, timeout, what)

    def split(self) -> bool:
        return is_split({m.name: m.assigned for m in self.members}, PARTITIONS)

    def read_count(self) -> int:
        return sum(len(m.reads) for m in self.members)

    def reads(self) -> dict[str, list[Read]]:
        return {m.name: m.reads for m in self.members}

    def committed(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for member in self.members:
            for partition, offset in member.committed.items():
                out[partition] = max(out.get(partition, 0), offset)
        return out


@pytest.mark.timeout(90)
def test_kafka_python_group_splits_commits_and_resumes(
    broker: BrokerProcess, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    topic = Topic(clients, broker.bootstrap, topic_name("kp-group"), PARTITIONS)
    name = group_name("kp-group")
    with KafkaPythonGroup(broker.bootstrap, name, topic.name, ["kp-a", "kp-b", "kp-c"]) as group:
        group.wait(group.split, CONVERGE_S, "three kafka-python members to split")
        first = topic.produce(40)
        group.wait(lambda: group.read_count() >= 120, TIMEOUT, "half the records")
        group.stop.set()
    committed = group.committed()
    read_before = [r for reads in group.reads().values() for r in reads]
    assert {(p, o) for p, o, _, _ in read_before} == {
        (p, o) for p, end in committed.items() for o in range(end)
    }, "every member committed exactly what it read"
    for member in group.members:
        assert {p for p, _, _, _ in member.reads} <= member.assigned, f"{member.name} strayed"

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=TIMEOUT * 1000)
    try:
        stored = admin.list_group_offsets({name: None})[name]
        assert {tp.partition: o.offset for tp, o in stored.items()} == committed
    finally:
        admin.close()

    second = topic.produce(20)
    names = ["kp-a2", "kp-b2", "kp-c2"]
    with KafkaPythonGroup(broker.bootstrap, name, topic.name, names) as again:
        rest = len(first) + len(second) - len(read_before)
        again.wait(lambda: again.read_count() >= rest, TIMEOUT, "the rest of the records")
        time.sleep(0.5)
        assert again.split()
    read_after = [r for reads in again.reads().values() for r in reads]
    assert first_offsets(read_after) == {p: committed.get(p, 0) for p in range(PARTITIONS)}
    check_read_once_in_order({"before": read_before, **again.reads()}, first + second)
    assert again.committed() == topic.ends()


# kcat ----------------------------------------------------------------------------------------


def kcat(*args: str) -> str:
    assert KCAT is not None, "kcat is not installed: run the suite through `make test`"
    done = subprocess.run([KCAT, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.timeout(90)
def test_kcat_balanced_consumer_resumes_where_its_group_committed(
    broker: BrokerProcess, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    topic = Topic(clients, broker.bootstrap, topic_name("kcat-group"), 3)
    name = group_name("kcat")
    first = topic.produce(10)

    def consume(*options: str) -> list[Read]:
        out = kcat(
            "-b", broker.bootstrap, "-G", name, "-e", "-q",
            "-X", "auto.offset.reset=earliest",  # where the group has no committed offset
            "-X", f"session.timeout.ms={SESSION_MS}",
            "-f", "%p %o %k %s\\n",
            *options,
            topic.name,
        )  # fmt: skip
        reads = []
        for line in out.splitlines():
            partition, offset, key, value = line.split(" ", 3)
            reads.append((int(partition), int(offset), key, value))
        return reads

    got = consume()
    check_read_once_in_order({"kcat": got}, first)
    admin = clients.admin(broker.bootstrap)
    request = [ConsumerGroupTopicPartitions(name)]
    stored = admin.list_consumer_group_offsets(request)[name].result(timeout=TIMEOUT)
    assert {tp.partition: tp.offset for tp in stored.topic_partitions} == topic.ends()

    assert consume() == [], "the group read committed records again"
    second = topic.produce(3)
    check_read_once_in_order({"kcat": consume()}, second)
    stored = admin.list_consumer_group_offsets(request)[name].result(timeout=TIMEOUT)
    assert {tp.partition: tp.offset for tp in stored.topic_partitions} == topic.ends()
    # kcat's -o sets the start of every partition it is assigned, committed offset or not.
    check_read_once_in_order({"kcat": consume("-o", "beginning")}, first + second)


# AdminClients ----------------------------------------------------------------------------------


def admin_error(future: Any) -> int:
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=TIMEOUT)
    error = raised.value.args[0]
    assert isinstance(error, KafkaError)
    return int(error.code())


@pytest.mark.timeout(90)
def test_admin_clients_list_describe_and_delete_groups(
    broker: BrokerProcess, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    topic = Topic(clients, broker.bootstrap, topic_name("admin"), 4)
    other = Topic(clients, broker.bootstrap, topic_name("admin-other"), 2)
    topic.produce(10)
    other.produce(5)
    name = group_name("admin")
    group = InProcessGroup(clients, topic, name, commit=False)
    group.join("admin-a")
    group.join("admin-b")
    split = group.wait_split()
    # Known commits: each member commits its own partitions; a also commits offsets of
    # `other`, which the group does not subscribe to (Kafka lets a member commit any).
    wanted = {0: 3, 1: 5, 2: 7, 3: 10}
    for member_name, partitions in split.items():
        consumer = group.members[member_name].consumer
        offsets = [TopicPartition(topic.name, p, wanted[p]) for p in sorted(partitions)]
        assert all(tp.error is None for tp in consumer.commit(offsets=offsets, asynchronous=False))
    other_offsets = [TopicPartition(other.name, 0, 2), TopicPartition(other.name, 1, 4)]
    done = group.members["admin-a"].consumer.commit(offsets=other_offsets, asynchronous=False)
    assert all(tp.error is None for tp in done)
    committed = {(topic.name, p): o for p, o in wanted.items()}
    committed |= {(other.name, 0): 2, (other.name, 1): 4}

    admin = clients.admin(broker.bootstrap)

    def listed() -> dict[str, Any]:
        result = admin.list_consumer_groups(request_timeout=TIMEOUT).result(timeout=TIMEOUT)
        assert not result.errors, result.errors
        return {g.group_id: g for g in result.valid}

    def offsets() -> dict[tuple[str, int], int]:
        request = [ConsumerGroupTopicPartitions(name)]
        result = admin.list_consumer_group_offsets(request)[name].result(timeout=TIMEOUT)
        return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}

    listing = listed()[name]
    assert not listing.is_simple_consumer_group
    assert listing.state == ConsumerGroupState.STABLE

    description = admin.describe_consumer_groups([name])[name].result(timeout=TIMEOUT)
    assert description.group_id == name
    assert description.state == ConsumerGroupState.STABLE
    assert not description.is_simple_consumer_group
    assert description.partition_assignor == "range"
    assert description.coordinator.id == 0
    members = {m.client_id: m for m in description.members}
    assert sorted(members) == ["admin-a", "admin-b"]
    for client_id, member in members.items():
        assert member.host == "/127.0.0.1"
        assert member.member_id.startswith(client_id)
        assigned = {(tp.topic, tp.partition) for tp in member.assignment.topic_partitions}
        assert assigned == {(topic.name, p) for p in split[client_id]}
    # The metrics count it (other tests' groups share this broker: at least these).
    stable = broker.sample("directlog_broker_groups", state="Stable")
    assert stable is not None and stable >= 1
    members_now = broker.sample("directlog_broker_group_members")
    assert members_now is not None and members_now >= 2

    assert offsets() == committed
    # Lag: the end offset minus the committed one, by two routes to the end offsets.
    latest = {TopicPartition(topic.name, p): OffsetSpec.latest() for p in range(4)}
    ends = {
        tp.partition: info.result(timeout=TIMEOUT).offset
        for tp, info in admin.list_offsets(latest, request_timeout=TIMEOUT).items()
    }
    assert ends == topic.ends()
    lag = {p: ends[p] - committed[(topic.name, p)] for p in range(4)}
    assert lag == {0: 7, 1: 5, 2: 3, 3: 0}
    watermarks = group.members["admin-a"].consumer.get_watermark_offsets
    assert {p: watermarks(TopicPartition(topic.name, p), timeout=TIMEOUT)[1] for p in lag} == ends

    # kafka-python's admin client sees the same.
    kadmin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=TIMEOUT * 1000)
    try:
        groups = {g["group_id"]: g for g in kadmin.list_groups()}
        assert groups[name]["protocol_type"] == "consumer"
        assert groups[name]["group_state"] == "Stable"
        described = kadmin.describe_groups([name])[name]
        assert described["group_state"] == "Stable"
        assert described["protocol_type"] == "consumer"
        assert described["protocol_data"] == "range"
        assert sorted(m["client_id"] for m in described["members"]) == ["admin-a", "admin-b"]
        stored = kadmin.list_group_offsets({name: None})[name]
        assert {(tp.topic, tp.partition): o.offset for tp, o in stored.items()} == committed

        # OffsetDelete: refused for the topic the members subscribe to, done for the other.
        results = kadmin.delete_group_offsets(name, [KTopicPartition(topic.name, 0)])
        assert results == {KTopicPartition(topic.name, 0): GroupSubscribedToTopicError}
        results = kadmin.delete_group_offsets(name, [KTopicPartition(other.name, 0)])
        assert results == {KTopicPartition(other.name, 0): NoError}
        del committed[(other.name, 0)]
        assert offsets() == committed

        # DeleteGroups: refused while the group has members.
        code = admin_error(admin.delete_consumer_groups([name], request_timeout=TIMEOUT)[name])
        assert code == KafkaError.NON_EMPTY_GROUP
        assert offsets() == committed

        group.close_all()
        wait_for(
            lambda: listed()[name].state == ConsumerGroupState.EMPTY, TIMEOUT, "an empty group"
        )
        assert offsets() == committed  # kept while the group is empty
        empty = admin.describe_consumer_groups([name])[name].result(timeout=TIMEOUT)
        assert empty.state == ConsumerGroupState.EMPTY and empty.members == []
        # Still a consumer group, not a "simple" one that only commits offsets.
        assert not empty.is_simple_consumer_group
        assert not listed()[name].is_simple_consumer_group

        admin.delete_consumer_groups([name], request_timeout=TIMEOUT)[name].result(timeout=TIMEOUT)
        assert name not in listed()
        assert name not in {g["group_id"] for g in kadmin.list_groups()}
        assert set(offsets().values()) <= {-1001}, "offsets outlived their group"
        assert kadmin.list_group_offsets({name: None})[name] == {}
        code = admin_error(admin.delete_consumer_groups([name], request_timeout=TIMEOUT)[name])
        assert code == KafkaError.GROUP_ID_NOT_FOUND
    finally:
        kadmin.close()
