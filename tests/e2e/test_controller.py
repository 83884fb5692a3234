"""Controllers against a real consensus ensemble, with this test playing the brokers over
gRPC: registration and heartbeats, topics, fencing seen on the metadata stream,
AlterPartition, producer id blocks, a SIGKILLed active controller replaced by its standby,
and bad input.

The tests share one 3-member ensemble; each keeps its cluster under a root znode of its own
and starts its own controllers. Every wait is bounded; nothing asserts on durations.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError

from directlog.protocol.errors import ErrorCode
from directlog.rpc import controller_pb2 as pb
from directlog.rpc.controller_pb2_grpc import ControllerStub
from tests.e2e.controller import ControllerProcess
from tests.e2e.ensemble import Ensemble

pytestmark = pytest.mark.timeout(120)

BROKER_SESSION_MS = 1500
HEARTBEAT_INTERVAL = 0.2
WAIT = 20.0  # bound of every wait for the cluster to get somewhere


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ensemble]:
    with Ensemble(tmp_path_factory.mktemp("ensemble"), size=3) as ens:
        ens.start()
        ens.wait_serving()
        yield ens


@pytest.fixture
def root(request: pytest.FixtureRequest) -> str:
    return "/" + re.sub(r"[^a-zA-Z0-9_-]+", "-", request.node.name).strip("-")


StartController = Callable[..., ControllerProcess]


@pytest.fixture
def start_controller(ensemble: Ensemble, tmp_path: Path, root: str) -> Iterator[StartController]:
    """Starts controllers on this test's root; at teardown each is stopped with SIGTERM and
    must exit 0 (unless the test SIGKILLed it)."""
    started: list[ControllerProcess] = []

    def start(controller_id: int = 1, **settings: Any) -> ControllerProcess:
        process = ControllerProcess(
            tmp_path,
            ensemble.hosts,
            controller_id=controller_id,
            settings={"root": root, "broker_session_timeout_ms": BROKER_SESSION_MS, **settings},
        )
        started.append(process.start())
        return process

    yield start
    for process in started:
        process.stop()
    for process in started:
        unclean = [c for c in process.exit_codes if c not in (0, -signal.SIGKILL)]
        assert not unclean and not process.killed, (
            f"controller {process.controller_id} did not stop cleanly: {process.exit_codes}\n"
            f"{process.stderr_tail()}"
        )


class Brokers:
    """The brokers' side of the contract: each call goes to the active controller, found
    by following a standby's ``active-controller`` hint, retried until WAIT runs out."""

    def __init__(self, *controllers: ControllerProcess) -> None:
        self.controllers = controllers
        self.active = controllers[0].address
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def stub(self, address: str) -> ControllerStub:
        with self._lock:
            if address not in self._channels:
                self._channels[address] = grpc.insecure_channel(address)
            return ControllerStub(self._channels[address])  # type: ignore[no-untyped-call]

    def call(self, method: str, request: Any) -> Any:
        deadline = time.monotonic() + WAIT
        last: grpc.RpcError | None = None
        while time.monotonic() < deadline:
            candidates = [self.active] + [c.address for c in self.controllers if c.running]
            for address in candidates:
                try:
                    reply = getattr(self.stub(address), method)(request, timeout=5)
                except grpc.RpcError as exc:
                    last = exc
                    hint = active_hint(exc)
                    if hint is not None:
                        self.active = hint
                    if exc.code() not in (
                        grpc.StatusCode.FAILED_PRECONDITION,
                        grpc.StatusCode.UNAVAILABLE,
                    ):
                        raise
                    continue
                self.active = address
                return reply
            time.sleep(0.05)
        raise AssertionError(f"no controller answered {method} within {WAIT} s: {last}")

    def register(
        self, broker_id: int, incarnation: str = "", rack: str = ""
    ) -> pb.RegisterBrokerReply:
        request = pb.RegisterBrokerRequest(
            broker_id=broker_id,
            incarnation_id=incarnation or f"incarnation-{broker_id}",
            listeners=[pb.Listener(name="PLAINTEXT", host="127.0.0.1", port=9000 + broker_id)],
            rack=rack,
        )
        reply: pb.RegisterBrokerReply = self.call("RegisterBroker", request)
        return reply

    def heartbeat(self, broker_id: int, epoch: int) -> int:
        reply = self.call("Heartbeat", pb.HeartbeatRequest(broker_id=broker_id, broker_epoch=epoch))
        return int(reply.error_code)

    def create_topic(self, name: str, partitions: int, replication_factor: int) -> pb.TopicResult:
        reply = self.call(
            "CreateTopics",
            pb.CreateTopicsRequest(
                topics=[
                    pb.NewTopic(
                        name=name, partitions=partitions, replication_factor=replication_factor
                    )
                ]
            ),
        )
        result: pb.TopicResult
        (result,) = reply.results
        return result

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


def active_hint(exc: grpc.RpcError) -> str | None:
    metadata = exc.trailing_metadata() or ()
    return next((str(m.value) for m in metadata if m.key == "active-controller"), None)


class Heartbeats:
    """A thread heartbeating for the registered brokers, as each broker would."""

    def __init__(self, brokers: Brokers, epochs: dict[int, int]) -> None:
        self.brokers = brokers
        self.epochs = dict(epochs)  # the test removes a broker to silence it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL):
            for broker_id, epoch in list(self.epochs.items()):
                with contextlib.suppress(AssertionError):  # no controller for a while
                    self.brokers.heartbeat(broker_id, epoch)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT + 10)


class Watch:
    """A WatchMetadata stream read on a thread, so the test waits with a bound."""

    def __init__(self, stub: ControllerStub, broker_id: int, epoch: int) -> None:
        request = pb.WatchMetadataRequest(broker_id=broker_id, broker_epoch=epoch)
        self._call = stub.WatchMetadata(request, timeout=120)
        self._updates: queue.Queue[pb.MetadataUpdate | grpc.RpcError] = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for update in self._call:
                self._updates.put(update)
        except grpc.RpcError as exc:
            self._updates.put(exc)

    def next(self) -> pb.MetadataUpdate:
        item = self._updates.get(timeout=WAIT)
        if isinstance(item, grpc.RpcError):
            raise item
        return item

    def until(self, predicate: Callable[[pb.MetadataUpdate], bool]) -> pb.MetadataUpdate:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            update = self.next()
            if predicate(update):
                return update
        raise AssertionError("no such metadata update")

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(WAIT)


def wait_active(*controllers: ControllerProcess) -> ControllerProcess:
    """The one controller whose metrics say it is active."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        active = [c for c in controllers if c.sample("directlog_controller_active") == 1]
        if len(active) == 1:
            return active[0]
        time.sleep(0.05)
    tails = "\n".join(c.stderr_tail(30) for c in controllers)
    raise AssertionError(f"no single active controller within {WAIT} s\n{tails}")


def full_image(brokers: Brokers, broker_id: int, epoch: int) -> pb.MetadataUpdate:
    watch = Watch(brokers.stub(brokers.active), broker_id, epoch)
    try:
        image = watch.next()
    finally:
        watch.close()
    assert image.full
    return image


def rpc_error(call: Callable[[], Any]) -> grpc.RpcError:
    try:
        call()
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the call succeeded")


# Tests ----------------------------------------------------------------------------------


def test_register_heartbeat_and_duplicate_registration(start_controller: StartController) -> None:
    controller = start_controller()
    brokers = Brokers(controller)
    try:
        first = brokers.register(1)
        assert first.error_code == 0 and first.broker_epoch > 0
        assert brokers.heartbeat(1, first.broker_epoch) == 0
        assert brokers.heartbeat(1, first.broker_epoch + 100) == ErrorCode.STALE_BROKER_EPOCH
        assert brokers.heartbeat(9, first.broker_epoch) == ErrorCode.BROKER_ID_NOT_REGISTERED
        # Another process with the same id, while the first one's session lives.
        duplicate = brokers.register(1, incarnation="someone-else")
        assert duplicate.error_code == ErrorCode.DUPLICATE_BROKER_REGISTRATION
        assert "session" in duplicate.error_message
        # The same incarnation registering again gets a newer epoch; the old one is stale.
        again = brokers.register(1)
        assert again.error_code == 0 and again.broker_epoch > first.broker_epoch
        assert brokers.heartbeat(1, first.broker_epoch) == ErrorCode.STALE_BROKER_EPOCH
        second = brokers.register(2)
        assert second.broker_epoch > again.broker_epoch
        assert controller.sample("directlog_controller_registered_brokers") == 2
    finally:
        brokers.close()


def test_topic_image_and_fencing(start_controller: StartController) -> None:
    controller = start_controller()
    brokers = Brokers(controller)
    epochs = {b: brokers.register(b, rack=f"rack-{b}").broker_epoch for b in (1, 2, 3)}
    heartbeats = Heartbeats(brokers, epochs)
    watch: Watch | None = None
    try:
        result = brokers.create_topic("orders", 3, 3)
        assert (result.error_code, result.partitions, result.replication_factor) == (0, 3, 3)
        assert len(result.topic_id) == 16
        watch = Watch(brokers.stub(brokers.active), 1, epochs[1])
        image = watch.next()
        assert image.full and image.cluster_id and image.controller_id == 1
        assert image.controller_epoch >= 1
        assert [(b.broker_id, b.broker_epoch, b.rack, b.fenced) for b in image.brokers] == [
            (b, epochs[b], f"rack-{b}", False) for b in (1, 2, 3)
        ]
        (topic,) = image.topics
        assert (topic.name, topic.topic_id) == ("orders", result.topic_id)
        partitions = {p.partition: p for p in topic.partitions}
        assert sorted(partitions) == [0, 1, 2]
        for p in partitions.values():
            assert sorted(p.replicas) == [1, 2, 3]
            assert p.leader == p.replicas[0] and list(p.isr) == list(p.replicas)
            assert p.leader_epoch == 0 and p.partition_epoch == 0
        assert sorted(p.leader for p in partitions.values()) == [1, 2, 3]  # leaders spread

        victim = partitions[0].leader
        del heartbeats.epochs[victim]  # the broker goes silent
        fenced = watch.until(lambda u: any(b.broker_id == victim and b.fenced for b in u.brokers))
        assert not fenced.full and fenced.version > image.version
        moved = watch.until(lambda u: bool(u.topics))
        (changed,) = moved.topics
        assert changed.topic_id == result.topic_id
        for p in changed.partitions:
            before = partitions[p.partition]
            assert victim not in p.isr and p.partition_epoch == 1
            if before.leader == victim:
                survivors = [b for b in before.replicas if b != victim]
                assert p.leader == survivors[0] and p.leader_epoch == 1
            else:
                assert p.leader == before.leader and p.leader_epoch == 0
        assert {p.partition for p in changed.partitions} == {0, 1, 2}  # all had it in ISR
        assert controller.sample("directlog_controller_fenced_brokers") == 1
        assert controller.sample("directlog_controller_offline_partitions") == 0
        elections = controller.sample("directlog_controller_leader_elections_total", kind="clean")
        assert elections == 1
        assert brokers.heartbeat(victim, epochs[victim]) == ErrorCode.STALE_BROKER_EPOCH

        # It registers again: unfenced, with a new epoch (the leader adds it back to ISRs).
        back = brokers.register(victim, rack=f"rack-{victim}")
        heartbeats.epochs[victim] = back.broker_epoch
        update = watch.until(
            lambda u: any(b.broker_id == victim and not b.fenced for b in u.brokers)
        )
        (entry,) = [b for b in update.brokers if b.broker_id == victim]
        assert entry.broker_epoch == back.broker_epoch > epochs[victim]
    finally:
        if watch is not None:
            watch.close()
        heartbeats.stop()
        brokers.close()


def test_alter_partition(start_controller: StartController) -> None:
    controller = start_controller()
    brokers = Brokers(controller)
    epochs = {b: brokers.register(b).broker_epoch for b in (1, 2, 3)}
    heartbeats = Heartbeats(brokers, epochs)
    try:
        topic_id = brokers.create_topic("isr", 1, 3).topic_id
        (topic,) = full_image(brokers, 1, epochs[1]).topics
        (state,) = topic.partitions
        leader, follower = state.leader, state.replicas[1]
        shrunk = [b for b in state.replicas if b != follower]

        def alter(broker: int, leader_epoch: int, partition_epoch: int, isr: list[int]) -> Any:
            change = pb.PartitionChange(
                topic_id=topic_id,
                partition=0,
                leader_epoch=leader_epoch,
                partition_epoch=partition_epoch,
                new_isr=isr,
            )
            request = pb.AlterPartitionRequest(
                broker_id=broker, broker_epoch=epochs[broker], changes=[change]
            )
            return brokers.call("AlterPartition", request)

        (good,) = alter(leader, 0, 0, shrunk).results
        assert good.error_code == 0
        assert (list(good.state.isr), good.state.partition_epoch) == (shrunk, 1)
        assert good.state.leader == leader and good.state.leader_epoch == 0

        refusals = [
            (alter(leader, 0, 0, list(state.replicas)), ErrorCode.INVALID_UPDATE_VERSION),
            (alter(leader, 3, 1, list(state.replicas)), ErrorCode.FENCED_LEADER_EPOCH),
            (alter(follower, 0, 1, list(state.replicas)), ErrorCode.NOT_LEADER_OR_FOLLOWER),
            (alter(leader, 0, 1, [leader, 77]), ErrorCode.INELIGIBLE_REPLICA),
            (alter(leader, 0, 1, [follower]), ErrorCode.INELIGIBLE_REPLICA),
        ]
        for reply, error in refusals:
            (result,) = reply.results
            assert result.error_code == error
            assert (list(result.state.isr), result.state.partition_epoch) == (shrunk, 1)

        (expanded,) = alter(leader, 0, 1, list(state.replicas)).results
        assert expanded.error_code == 0 and expanded.state.partition_epoch == 2

        stale = pb.AlterPartitionRequest(
            broker_id=leader,
            broker_epoch=epochs[leader] + 100,
            changes=[pb.PartitionChange(topic_id=topic_id, partition=0, new_isr=[leader])],
        )
        assert brokers.call("AlterPartition", stale).error_code == ErrorCode.STALE_BROKER_EPOCH
        unknown = pb.AlterPartitionRequest(
            broker_id=leader,
            broker_epoch=epochs[leader],
            changes=[pb.PartitionChange(topic_id=b"\x01" * 16, partition=0, new_isr=[leader])],
        )
        (result,) = brokers.call("AlterPartition", unknown).results
        assert result.error_code == ErrorCode.UNKNOWN_TOPIC_ID
        assert controller.sample("directlog_controller_isr_changes_total") == 2
    finally:
        heartbeats.stop()
        brokers.close()


def test_standby_takes_over_from_a_killed_controller(
    start_controller: StartController, ensemble: Ensemble, root: str
) -> None:
    first, second = start_controller(1), start_controller(2)
    active = wait_active(first, second)
    standby = second if active is first else first
    brokers = Brokers(active, standby)
    epochs = {b: brokers.register(b).broker_epoch for b in (1, 2, 3)}
    heartbeats = Heartbeats(brokers, epochs)
    try:
        topic_id = brokers.create_topic("ha", 2, 3).topic_id
        (topic,) = full_image(brokers, 1, epochs[1]).topics
        state = topic.partitions[0]
        change = pb.PartitionChange(
            topic_id=topic_id, partition=0, new_isr=[state.leader, state.replicas[1]]
        )
        request = pb.AlterPartitionRequest(
            broker_id=state.leader, broker_epoch=epochs[state.leader], changes=[change]
        )
        assert brokers.call("AlterPartition", request).results[0].error_code == 0
        before = full_image(brokers, 1, epochs[1])

        # A standby refuses every call and names the active controller.
        with standby.channel() as channel:
            refused = rpc_error(
                lambda: standby.stub(channel).Heartbeat(
                    pb.HeartbeatRequest(broker_id=1, broker_epoch=epochs[1]), timeout=5
                )
            )
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.details() == "not the active controller"
        assert active_hint(refused) == active.address
        assert standby.sample("directlog_controller_active") == 0

        active.kill()
        assert wait_active(standby) is standby
        # Brokers keep their epochs: heartbeats and watches go on at the new controller.
        assert brokers.heartbeat(1, epochs[1]) == 0
        after = full_image(brokers, 1, epochs[1])
        assert after.controller_id == standby.controller_id
        assert after.controller_epoch > before.controller_epoch
        assert after.cluster_id == before.cluster_id
        assert [(b.broker_id, b.broker_epoch) for b in after.brokers] == [
            (b.broker_id, b.broker_epoch) for b in before.brokers
        ]
        assert list(after.topics) == list(before.topics)  # names, ids, configs, every state

        # The killed controller's epoch can write nothing any more: every write checks the
        # controller epoch znode's version, which the takeover moved on.
        zk = KazooClient(hosts=ensemble.hosts)
        zk.start(timeout=WAIT)
        try:
            _, stat = zk.get(f"{root}/controller_epoch")
            stale_write = zk.transaction()
            stale_write.check(f"{root}/controller_epoch", stat.version - 1)
            stale_write.set_data(f"{root}/broker_epoch", b'{"last":0}')
            assert isinstance(stale_write.commit()[0], BadVersionError)
        finally:
            zk.stop()
            zk.close()

        # Restarted, the old controller stands by and points at the new one.
        active.start()
        deadline = time.monotonic() + WAIT
        hint = None
        while hint != standby.address and time.monotonic() < deadline:
            with active.channel() as channel:
                hint = active_hint(
                    rpc_error(
                        lambda: active.stub(channel).Heartbeat(
                            pb.HeartbeatRequest(broker_id=1, broker_epoch=epochs[1]), timeout=5
                        )
                    )
                )
            time.sleep(0.05)
        assert hint == standby.address
        assert brokers.create_topic("after-failover", 1, 3).error_code == 0
    finally:
        heartbeats.stop()
        brokers.close()


def test_producer_id_blocks_never_overlap_across_a_failover(
    start_controller: StartController,
) -> None:
    first, second = start_controller(1), start_controller(2)
    active = wait_active(first, second)
    standby = second if active is first else first
    brokers = Brokers(active, standby)
    epochs = {b: brokers.register(b).broker_epoch for b in (1, 2, 3)}
    heartbeats = Heartbeats(brokers, epochs)

    def allocate(broker_id: int) -> range:
        request = pb.AllocateProducerIdsRequest(broker_id=broker_id, broker_epoch=epochs[broker_id])
        reply = brokers.call("AllocateProducerIds", request)
        assert reply.error_code == 0, reply.error_message
        return range(reply.first_producer_id, reply.first_producer_id + reply.count)

    try:
        with ThreadPoolExecutor(6) as pool:  # concurrent requests from every broker
            before = list(pool.map(allocate, [1, 2, 3] * 4))
        assert sorted(b.start for b in before) == [i * 1000 for i in range(12)]
        assert all(len(b) == 1000 for b in before)

        stale = pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=epochs[1] + 100)
        unknown = pb.AllocateProducerIdsRequest(broker_id=9, broker_epoch=epochs[1])
        assert brokers.call("AllocateProducerIds", stale).error_code == (
            ErrorCode.STALE_BROKER_EPOCH
        )
        assert brokers.call("AllocateProducerIds", unknown).error_code == (
            ErrorCode.BROKER_ID_NOT_REGISTERED
        )
        with standby.channel() as channel:
            request = pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=epochs[1])
            refused = rpc_error(
                lambda: standby.stub(channel).AllocateProducerIds(request, timeout=5)
            )
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert active_hint(refused) == active.address

        active.kill()
        assert wait_active(standby) is standby
        with ThreadPoolExecutor(3) as pool:
            after = list(pool.map(allocate, [1, 2, 3] * 2))
        assert min(b.start for b in after) >= max(b.stop for b in before)
        blocks = sorted(before + after, key=lambda b: b.start)
        for earlier, later in itertools.pairwise(blocks):
            assert earlier.stop <= later.start, (earlier, later)
    finally:
        heartbeats.stop()
        brokers.close()


def test_a_paused_controller_wakes_up_deposed(start_controller: StartController) -> None:
    first, second = start_controller(1), start_controller(2)
    active = wait_active(first, second)
    standby = second if active is first else first
    brokers = Brokers(standby, active)
    active.pause()
    try:
        assert wait_active(standby) is standby
        assert brokers.register(1).error_code == 0
    finally:
        active.resume()
    # Whatever it still believes on waking, it must not write: the call is refused, and
    # the registration it was asked for never happens.
    request = pb.RegisterBrokerRequest(
        broker_id=7,
        incarnation_id="to-the-old-one",
        listeners=[pb.Listener(name="PLAINTEXT", host="127.0.0.1", port=9007)],
    )
    with active.channel() as channel:
        refused = rpc_error(lambda: active.stub(channel).RegisterBroker(request, timeout=10))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    image = full_image(brokers, 1, brokers.register(1).broker_epoch)
    assert [b.broker_id for b in image.brokers] == [1]
    assert image.controller_id == standby.controller_id
    brokers.close()


def test_a_stopped_controller_hands_over_at_once(start_controller: StartController) -> None:
    first, second = start_controller(1), start_controller(2)
    active = wait_active(first, second)
    standby = second if active is first else first
    assert active.stop() == 0
    assert wait_active(standby) is standby


def test_bad_input(start_controller: StartController) -> None:
    controller = start_controller()
    brokers = Brokers(controller)
    epochs = {b: brokers.register(b).broker_epoch for b in (1, 2)}
    heartbeats = Heartbeats(brokers, epochs)
    try:
        assert brokers.create_topic("taken", 1, 1).error_code == 0
        new_topics = [
            pb.NewTopic(name="bad name", partitions=1, replication_factor=1),
            pb.NewTopic(name="x" * 250, partitions=1, replication_factor=1),
            pb.NewTopic(name="too-many-replicas", partitions=1, replication_factor=3),
            pb.NewTopic(name="no-partitions", partitions=0, replication_factor=1),
            pb.NewTopic(
                name="bad-config", partitions=1, replication_factor=1, configs={"retention.ms": "x"}
            ),
            pb.NewTopic(name="taken", partitions=1, replication_factor=1),
            pb.NewTopic(name="twice", partitions=1, replication_factor=1),
            pb.NewTopic(name="twice", partitions=1, replication_factor=1),
        ]
        reply = brokers.call("CreateTopics", pb.CreateTopicsRequest(topics=new_topics))
        assert [(r.name, r.error_code) for r in reply.results] == [
            ("bad name", ErrorCode.INVALID_TOPIC_EXCEPTION),
            ("x" * 250, ErrorCode.INVALID_TOPIC_EXCEPTION),
            ("too-many-replicas", ErrorCode.INVALID_REPLICATION_FACTOR),
            ("no-partitions", ErrorCode.INVALID_PARTITIONS),
            ("bad-config", ErrorCode.INVALID_CONFIG),
            ("taken", ErrorCode.TOPIC_ALREADY_EXISTS),
            ("twice", ErrorCode.NONE),
            ("twice", ErrorCode.INVALID_REQUEST),
        ]
        assert all(r.error_message for r in reply.results if r.error_code)

        validate = pb.CreateTopicsRequest(
            topics=[pb.NewTopic(name="dry", partitions=2, replication_factor=2)],
            validate_only=True,
        )
        (dry,) = brokers.call("CreateTopics", validate).results
        assert (dry.error_code, dry.partitions, dry.replication_factor) == (0, 2, 2)
        deletes = pb.DeleteTopicsRequest(
            topics=[pb.TopicRef(name="dry"), pb.TopicRef(topic_id=b"\x02" * 16), pb.TopicRef()]
        )
        assert [r.error_code for r in brokers.call("DeleteTopics", deletes).results] == [
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,  # validate_only wrote nothing
            ErrorCode.UNKNOWN_TOPIC_ID,
            ErrorCode.INVALID_REQUEST,
        ]
        fewer = pb.CreatePartitionsRequest(topics=[pb.PartitionIncrease(name="taken", count=1)])
        (result,) = brokers.call("CreatePartitions", fewer).results
        assert result.error_code == ErrorCode.INVALID_PARTITIONS
        bad_config = pb.AlterConfigsRequest(
            topics=[pb.ConfigAlteration(name="taken", set={"min.insync.replicas": "0"})]
        )
        (result,) = brokers.call("AlterConfigs", bad_config).results
        assert result.error_code == ErrorCode.INVALID_CONFIG

        assert brokers.register(1, incarnation="impostor").error_code == (
            ErrorCode.DUPLICATE_BROKER_REGISTRATION
        )
        assert brokers.register(-4).error_code == ErrorCode.INVALID_REQUEST
        refused = rpc_error(
            lambda: next(
                brokers.stub(brokers.active).WatchMetadata(
                    pb.WatchMetadataRequest(broker_id=1, broker_epoch=epochs[1] + 7), timeout=5
                )
            )
        )
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (refused.details() or "").startswith("STALE_BROKER_EPOCH")
        metadata = {m.key: str(m.value) for m in refused.trailing_metadata() or ()}
        assert metadata["kafka-error-code"] == str(int(ErrorCode.STALE_BROKER_EPOCH))

        # The good topic went through all of it untouched, and the controller still serves.
        (topic,) = [t for t in full_image(brokers, 1, epochs[1]).topics if t.name == "taken"]
        assert len(topic.partitions) == 1 and topic.configs == {}
    finally:
        heartbeats.stop()
        brokers.close()
