"""RDMA push replication across three real brokers on the shm and tcp providers:
confluent-kafka produces acks=all to an RF=3 preallocated topic whose leader pushes every
batch into its followers' head segments; the records read back complete and in order, the
followers pulled no record bytes of it, their logs are byte-identical to the leader's, head
segments roll on every replica, and a follower killed and restarted pulls to catch up and
is pushed again, with nothing lost or duplicated; an RDMA producer with acks=-1 is answered
only once the followers have its records."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from directlog.client.rdma_produce import Produced, RdmaProducer
from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from directlog.protocol.rdma_replica import (
    KIND_RECORDS,
    OPEN,
    REPLY,
    RdmaReplicaRequest,
    RdmaReplicaResponse,
    decode_response_frame,
    immediate,
    request_frame,
)
from directlog.rdma import Access, open_context
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.conftest import Clients
from tests.e2e.test_rdma_produce import batches_of

pytestmark = pytest.mark.timeout(90)

SEGMENT_BYTES = 32 * 1024
TOPIC_CONFIG = {
    "preallocate": "true",
    "segment.bytes": str(SEGMENT_BYTES),
    "min.insync.replicas": "2",
}
PUSHED = "directlog_broker_replication_pushed_bytes_total"
PULLED = "directlog_broker_replica_pulled_bytes_total"
CHANNELS = "directlog_broker_replication_push_channels"
TIMEOUT = 30


@pytest.fixture(scope="module", params=["shm", "tcp"])
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def cluster(provider: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    settings = {
        "rdma_replication": True,
        "rdma_produce": True,
        "rdma_provider": provider,
        "rdma_replication_credits": 8,
        "rdma_replication_timeout_ms": 3000,
        "replica_fetch_wait_max_ms": 200,
    }
    with Cluster(
        tmp_path_factory.mktemp(f"push-{provider}"), brokers=3, broker_settings=settings
    ) as running:
        yield running


def create(clients: Clients, cluster: Cluster, topic: str) -> tuple[int, list[int]]:
    """The topic, RF=3, its ISR complete; (leader, followers) of partition 0."""
    admin = clients.admin(cluster.bootstrap)
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=3, config=TOPIC_CONFIG)]
    )
    futures[topic].result(timeout=TIMEOUT)
    wait_for(lambda: in_sync(cluster, topic), TIMEOUT, "the ISR of the new topic")
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=10)
    partition = metadata.topics[topic].partitions[0]
    leader = cluster.brokers[partition.leader]
    wait_for(lambda: counter(leader, CHANNELS, topic) == 2, TIMEOUT, "push channels open")
    return partition.leader, [r for r in partition.replicas if r != partition.leader]


def in_sync(cluster: Cluster, topic: str) -> bool:
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=5)
    found = metadata.topics[topic].partitions
    return bool(found) and all(sorted(p.isrs) == sorted(p.replicas) for p in found.values())


def produce(clients: Clients, cluster: Cluster, topic: str, first: int, count: int) -> None:
    producer = clients.producer(
        cluster.bootstrap, {"acks": "all", "linger.ms": 2, "batch.size": 4096}
    )
    reports = clients.produce_all(
        producer,
        topic,
        [{"value": f"v-{n:06d}".encode() * 4, "partition": 0} for n in range(first, first + count)],
    )
    assert [e for e, _ in reports if e is not None] == []


def produce_pushed_to_both(
    clients: Clients, cluster: Cluster, topic: str, leader: int, first: int, count: int
) -> None:
    """Once `leader` has push channels to both followers, produce; they are pushed."""
    wait_for(
        lambda: counter(cluster.brokers[leader], CHANNELS, topic) == 2,
        TIMEOUT,
        "the leader pushing to both followers",
    )
    pushed = counter(cluster.brokers[leader], PUSHED, topic)
    produce(clients, cluster, topic, first, count)
    assert counter(cluster.brokers[leader], PUSHED, topic) > pushed


def read_all(clients: Clients, cluster: Cluster, topic: str, count: int) -> list[int]:
    consumer = clients.consumer(cluster.bootstrap)
    clients.assign_from(consumer, topic, [0])
    messages = clients.consume(consumer, count)
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    assert (low, high) == (0, count)
    assert [m.offset() for m in messages] == list(range(count))
    return [int(m.value()[2:8]) for m in messages]


def counter(broker: BrokerProcess, name: str, topic: str, **labels: str) -> float:
    return broker.sample(name, topic=topic, **labels) or 0.0


def log_end(broker: BrokerProcess, topic: str) -> float | None:
    return broker.sample("directlog_broker_log_end_offset", topic=topic, partition="0")


def stored_log(broker: BrokerProcess, topic: str) -> tuple[bytes, int]:
    """The partition's batches as stored, segment files concatenated up to the log end, and
    how many segment files hold them."""
    data = bytearray()
    segments = sorted((broker.data_dir / f"{topic}-0").glob("*.log"))
    for segment in segments:
        raw = segment.read_bytes()
        position = 0
        while position + 61 <= len(raw):
            (length,) = struct.unpack_from(">i", raw, position + 8)
            if length <= 0:
                break  # preallocated, not written
            data += raw[position : position + 12 + length]
            position += 12 + length
    return bytes(data), len(segments)


def check_identical(
    cluster: Cluster, topic: str, leader: int, records: int, *, rolled: bool = True
) -> None:
    """Every replica holds the leader's bytes; each has rolled its head segment."""
    wait_for(
        lambda: all(log_end(b, topic) == records for b in cluster.brokers.values()),
        TIMEOUT,
        "every replica at the log end",
    )
    wait_for(lambda: in_sync(cluster, topic), TIMEOUT, "the ISR complete")
    expected, segments = stored_log(cluster.brokers[leader], topic)
    assert segments > 1 or not rolled, "the leader's head segment never rolled"
    for node_id, broker in cluster.brokers.items():
        data, segments = stored_log(broker, topic)
        assert segments > 1 or not rolled, f"broker {node_id}: the head segment never rolled"
        assert data == expected, f"broker {node_id}: {len(data)} bytes, leader {len(expected)}"


def test_pushed_records_read_back_and_replicas_identical(
    cluster: Cluster, clients: Clients, topic_name
) -> None:
    topic = topic_name("push")
    leader, followers = create(clients, cluster, topic)
    produce(clients, cluster, topic, 0, 1500)
    assert read_all(clients, cluster, topic, 1500) == list(range(1500))
    check_identical(cluster, topic, leader, 1500)
    assert counter(cluster.brokers[leader], PUSHED, topic) > 0
    for follower in followers:
        assert counter(cluster.brokers[follower], PULLED, topic, partition="0") == 0


def test_follower_killed_and_restarted_pulls_then_is_pushed_again(
    cluster: Cluster, clients: Clients, topic_name
) -> None:
    topic = topic_name("restart")
    leader, followers = create(clients, cluster, topic)
    produce(clients, cluster, topic, 0, 300)
    victim = cluster.brokers[followers[0]]
    victim.kill()
    produce(clients, cluster, topic, 300, 600)
    victim.start()
    wait_for(lambda: log_end(victim, topic) == 900, TIMEOUT, "the restarted follower caught up")
    wait_for(lambda: in_sync(cluster, topic), TIMEOUT, "the restarted follower back in the ISR")
    assert counter(victim, PULLED, topic, partition="0") > 0, "caught up without pulling"
    sent = 900

    def pushed_again() -> bool:
        """Produce a few more: True once they reached the follower by push alone."""
        nonlocal sent
        pushed = counter(cluster.brokers[leader], PUSHED, topic)
        pulled = counter(victim, PULLED, topic, partition="0")
        produce(clients, cluster, topic, sent, 50)
        sent += 50
        wait_for(lambda: log_end(victim, topic) == sent, TIMEOUT, "the follower at the end")
        return (
            counter(cluster.brokers[leader], PUSHED, topic) > pushed
            and counter(victim, PULLED, topic, partition="0") == pulled
        )

    wait_for(pushed_again, TIMEOUT, "pushes to the restarted follower")
    assert read_all(clients, cluster, topic, sent) == list(range(sent))
    check_identical(cluster, topic, leader, sent)
    # The other follower stayed pushed throughout, ISR changes included.
    assert counter(cluster.brokers[followers[1]], PULLED, topic, partition="0") == 0


def test_leader_killed_the_new_leader_pushes_and_the_old_one_rejoins(
    cluster: Cluster, clients: Clients, topic_name
) -> None:
    """A leader change ends every channel: the followers truncate by leader epoch through
    pull, the new leader pushes to them, and the old leader, restarted, catches up and is
    pushed too; every replica ends byte-identical."""
    topic = topic_name("failover")
    old, _ = create(clients, cluster, topic)
    produce(clients, cluster, topic, 0, 300)
    cluster.brokers[old].kill()

    def new_leader() -> int:
        metadata = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, 5)
        return int(metadata.topics[topic].partitions[0].leader)

    wait_for(lambda: new_leader() not in (-1, old), TIMEOUT, "a new leader")
    leader = new_leader()
    produce(clients, cluster, topic, 300, 300)
    cluster.brokers[old].start()
    wait_for(lambda: in_sync(cluster, topic), TIMEOUT, "the old leader back in the ISR")
    produce_pushed_to_both(clients, cluster, topic, leader, 600, 300)
    assert read_all(clients, cluster, topic, 900) == list(range(900))
    check_identical(cluster, topic, leader, 900)


def test_delete_records_reaches_pushed_followers_and_pushes_resume(
    cluster: Cluster, clients: Clients, topic_name
) -> None:
    """A pushed follower learns a new log start only by a pull fetch: DeleteRecords ends
    its channel, it pulls, moves its log start (and the answer comes), and is pushed again."""
    topic = topic_name("purge")
    leader, followers = create(clients, cluster, topic)
    produce(clients, cluster, topic, 0, 1500)
    wait_for(
        lambda: all(log_end(b, topic) == 1500 for b in cluster.brokers.values()),
        TIMEOUT,
        "every replica at the log end",
    )
    admin = clients.admin(cluster.bootstrap)
    (future,) = admin.delete_records(
        [TopicPartition(topic, 0, 1000)], request_timeout=TIMEOUT, operation_timeout=TIMEOUT
    ).values()
    assert future.result(timeout=TIMEOUT).low_watermark == 1000
    for follower in followers:
        assert counter(cluster.brokers[follower], PULLED, topic, partition="0") == 0
    produce_pushed_to_both(clients, cluster, topic, leader, 1500, 300)
    consumer = clients.consumer(cluster.bootstrap)
    clients.assign_from(consumer, topic, [0])
    messages = clients.consume(consumer, 800)
    assert [m.offset() for m in messages] == list(range(1000, 1800))
    assert [int(m.value()[2:8]) for m in messages] == list(range(1000, 1800))
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (1000, 1800)


@pytest.mark.parametrize("fault", ["corrupt-batch", "order-out-of-sequence"])
def test_a_bad_push_ends_the_channel_and_leaves_the_follower_log_intact(
    cluster: Cluster, clients: Clients, topic_name, provider: str, fault: str
) -> None:
    """A writer posing as the leader gets a grant, then writes a corrupt batch or an
    immediate out of order: the follower ends the channel, zeroes what was written, keeps
    its log, and the real leader's push (or the pull) carries on from its log end."""
    topic = topic_name("bad")
    leader, followers = create(clients, cluster, topic)
    produce(clients, cluster, topic, 0, 100)
    target = cluster.brokers[followers[0]]
    wait_for(lambda: log_end(target, topic) == 100, TIMEOUT, "the follower at the log end")
    before, _ = stored_log(target, topic)
    grant = asyncio.run(pose_as_leader(target, topic, leader, provider, fault))
    marker = f"{topic}-0: push channel {grant.channel_id} closed"

    def closed() -> list[str]:
        return [line for line in target.stderr_text().splitlines() if marker in line]

    wait_for(lambda: bool(closed()), TIMEOUT, "the follower ending the channel")
    reason = "(CORRUPT_MESSAGE)" if fault == "corrupt-batch" else "order 5, expected"
    assert reason in closed()[-1]
    assert stored_log(target, topic)[0] == before
    head = target.data_dir / f"{topic}-0" / f"{grant.base_offset:020d}.log"
    written = head.read_bytes()[grant.position : grant.position + 512]
    assert written == bytes(len(written)), "the bad write was not zeroed"
    produce(clients, cluster, topic, 100, 200)
    assert read_all(clients, cluster, topic, 300) == list(range(300))
    check_identical(cluster, topic, leader, 300, rolled=False)


async def pose_as_leader(
    follower: BrokerProcess, topic: str, leader: int, provider: str, fault: str
) -> RdmaReplicaResponse:
    """Ask ``follower`` for a grant as broker ``leader`` (epoch 0) and write one bad push."""
    with open_context(provider) as context:
        pd = context.alloc_pd()
        cq = context.create_cq()
        replies = pd.allocate(REPLY.size * 4, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        request = RdmaReplicaRequest(
            topic,
            0,
            leader,
            0,
            OPEN,
            -1,
            0,
            replies.addr,
            replies.rkey,
            replies.length,
            (provider,),
        )
        host, port = follower.bootstrap.rsplit(":", 1)
        connection = await KafkaConnection.connect(host, int(port), 5.0)
        try:
            frame = await connection.exchange(request_frame(request, 1, "impostor"))
        finally:
            await connection.close()
        grant = decode_response_frame(frame, 1)
        assert grant.error_code == ErrorCode.NONE, grant.error_message
        qp = pd.connect(grant.conn_info, cq)
        qp.post_recv(0)
        staging = pd.allocate(512, Access.LOCAL_WRITE)
        if fault == "corrupt-batch":
            staging.buf[:512] = b"\x00" * 8 + (500).to_bytes(4, "big") + b"\xee" * 500
            order = 0
        else:
            staging.buf[:512] = bytes(512)
            order = 5
        qp.post_write_with_imm(
            1,
            staging.sge(0, 512),
            grant.addr,
            grant.rkey,
            immediate(KIND_RECORDS, grant.channel_id, order),
        )
        deadline = asyncio.get_running_loop().time() + 10
        while asyncio.get_running_loop().time() < deadline:  # until the follower hangs up
            done = cq.poll(4, timeout=0.2)
            if any(not wc.ok for wc in done):
                break
        qp.close()
        return grant


def test_rdma_produce_with_acks_all_is_answered_once_the_followers_have_it(
    cluster, provider, clients, topic_name
):
    topic = topic_name("acks")
    leader_id, followers = create(clients, cluster, topic)
    leader = cluster.brokers[leader_id]

    async def run() -> None:
        producer = RdmaProducer(leader.bootstrap, topic, 0, provider=provider, acks=-1)
        await producer.start()
        try:
            assert await producer.send(batches_of(0, 3)) == [Produced(5 * i, 5) for i in range(3)]
            for follower in followers:
                cluster.brokers[follower].pause()
            try:
                sending = asyncio.ensure_future(producer.send(batches_of(15, 1)))
                await asyncio.sleep(1.0)
                assert not sending.done()  # committed on the leader, not yet replicated
            finally:
                for follower in followers:
                    cluster.brokers[follower].resume()
            assert await sending == [Produced(15, 5)]
        finally:
            await producer.close()

    asyncio.run(run())
    assert all(log_end(cluster.brokers[b], topic) == 20 for b in (leader_id, *followers))
