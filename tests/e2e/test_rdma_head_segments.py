"""RDMA produce into head segments kept in a memory-backed head directory
(rdma_head_segments_dir; docs/broker.md "Head segments in memory") against real brokers on
the shm provider: records written over RDMA read back over TCP across rolls and the sealed
segments are written back to the log directory; a clean stop writes back the head too; a
crash that loses the head directory (a pod restarted: its emptyDir is new) leaves the log
at its written-back part, served as it is; a follower that lost it refetches the rest from
its leader, and once it leads, every acknowledged (acks=all) record is there. And
rdma_advertised_host is the address RDMA answers carry."""

from __future__ import annotations

import asyncio
import shutil
import struct
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from directlog.client.rdma_consume import RdmaConsumer
from directlog.client.rdma_produce import REPLY_SIZE, Produced
from directlog.rdma import Access, ConnInfo, open_context
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster, eventually, wait_for
from tests.e2e.conftest import Clients, single_broker
from tests.e2e.test_rdma_consume import poll_until
from tests.e2e.test_rdma_produce import batches_of, raw_grant, rdma_send, values

pytestmark = pytest.mark.timeout(180)

PROVIDER = "shm"
RDMA = {
    "rdma_produce": True,
    "rdma_provider": PROVIDER,
    "rdma_grant_max_bytes": 1 << 20,
    "rdma_connect_timeout_ms": 5000,
}
SEGMENT_BYTES = 8192
TOPIC_CONFIG = {"preallocate": "true", "segment.bytes": str(SEGMENT_BYTES)}
RECORDS = 1000  # in batches of 10: several segments of SEGMENT_BYTES
TIMEOUT = 30


@pytest.fixture
def heads_root(tmp_path: Path) -> Iterator[Path]:
    """Where the brokers' head directories go: a tmpfs (/dev/shm) where there is one, as
    an emptyDir with medium Memory is; removed after the test."""
    shm = Path("/dev/shm")
    root = shm / f"directlog-heads-{uuid.uuid4().hex[:8]}" if shm.is_dir() else tmp_path / "heads"
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


class HeadDirCluster(Cluster):
    """A cluster whose brokers each have a head directory of their own."""

    def __init__(self, work_dir: Path, heads_root: Path, **kwargs: Any) -> None:
        super().__init__(work_dir, **kwargs)
        self.heads_root = heads_root

    def head_dir(self, node_id: int) -> Path:
        return self.heads_root / f"broker-{node_id}"

    def add_broker(self, node_id: int) -> BrokerProcess:
        self.broker_settings["rdma_head_segments_dir"] = str(self.head_dir(node_id))
        return super().add_broker(node_id)


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log")) if directory.exists() else []


def records_in(files: Iterable[Path]) -> int:
    """Records of the v2 batches in these segment files (a preallocated tail ends one)."""
    records = 0
    for path in files:
        data = path.read_bytes()
        position = 0
        while position + 61 <= len(data):
            (length,) = struct.unpack_from(">i", data, position + 8)
            if length <= 0:
                break
            records += struct.unpack_from(">i", data, position + 57)[0]
            position += 12 + length
    return records


def places(cluster: HeadDirCluster, node_id: int, topic: str) -> tuple[Path, Path]:
    """(log directory, head directory) of partition 0 on broker `node_id`."""
    partition = f"{topic}-0"
    return cluster.brokers[node_id].data_dir / partition, cluster.head_dir(node_id) / partition


def written_back(cluster: HeadDirCluster, node_id: int, topic: str, records: int) -> None:
    """Every sealed segment is in the log directory; only the head, holding records, is
    in memory; together they hold `records`."""
    disk, memory = places(cluster, node_id, topic)
    on_disk, in_memory = segment_files(disk), segment_files(memory)
    assert len(in_memory) == 1, f"in memory: {[p.name for p in in_memory]}"
    assert len(on_disk) >= 2, f"on disk: {[p.name for p in on_disk]}"
    assert on_disk[-1].name < in_memory[0].name  # the newest segment is the one in memory
    assert records_in(in_memory) > 0
    assert records_in(on_disk) + records_in(in_memory) == records


def expected(count: int) -> list[tuple[int, bytes]]:
    return [(i, f"r-{i}".encode()) for i in range(count)]


def test_records_roll_through_memory_and_a_clean_stop_writes_back_the_head(
    heads_root: Path, tmp_path: Path, clients: Clients, topic_name
) -> None:
    with HeadDirCluster(tmp_path / "cluster", heads_root, broker_settings=RDMA) as cluster:
        broker = cluster.brokers[0]
        topic = topic_name("roll")
        clients.create_topic(broker.bootstrap, topic, config=TOPIC_CONFIG)
        produced = rdma_send(broker.bootstrap, topic, PROVIDER, batches_of(0, RECORDS // 10, 10))
        assert produced == [Produced(10 * i, 10) for i in range(RECORDS // 10)]
        assert values(clients, broker.bootstrap, topic, RECORDS) == expected(RECORDS)
        eventually(lambda: written_back(cluster, 0, topic, RECORDS), "write-backs", TIMEOUT)

        assert broker.stop() == 0
        disk, memory = places(cluster, 0, topic)
        assert segment_files(memory) == []
        assert records_in(segment_files(disk)) == RECORDS
        shutil.rmtree(cluster.head_dir(0))  # a pod restart: nothing was left there
        broker.start()
        assert "lost with the head directory" not in broker.stderr_text()
        assert values(clients, broker.bootstrap, topic, RECORDS) == expected(RECORDS)
        more = rdma_send(broker.bootstrap, topic, PROVIDER, batches_of(RECORDS, 2, 10))
        assert more == [Produced(RECORDS, 10), Produced(RECORDS + 10, 10)]
        assert values(clients, broker.bootstrap, topic, RECORDS + 20) == expected(RECORDS + 20)
        assert len(segment_files(memory)) == 1  # the next head is in memory again


def test_a_lost_head_directory_leaves_the_written_back_log(
    heads_root: Path, tmp_path: Path, clients: Clients, topic_name
) -> None:
    """One replica, acks=1: what the head held is gone with it (replication is what keeps
    it, test below); everything written back is served, and appends go on after it."""
    with HeadDirCluster(tmp_path / "cluster", heads_root, broker_settings=RDMA) as cluster:
        broker = cluster.brokers[0]
        topic = topic_name("lost")
        clients.create_topic(broker.bootstrap, topic, config=TOPIC_CONFIG)
        rdma_send(broker.bootstrap, topic, PROVIDER, batches_of(0, RECORDS // 10, 10))
        eventually(lambda: written_back(cluster, 0, topic, RECORDS), "write-backs", TIMEOUT)

        broker.kill()
        disk, _ = places(cluster, 0, topic)
        durable = records_in(segment_files(disk))
        assert 0 < durable < RECORDS
        shutil.rmtree(cluster.head_dir(0))
        broker.start()
        assert "lost with the head directory" in broker.stderr_text()
        assert values(clients, broker.bootstrap, topic, durable) == expected(durable)
        more = rdma_send(broker.bootstrap, topic, PROVIDER, batches_of(durable, 1, 10))
        assert more == [Produced(durable, 10)]
        assert values(clients, broker.bootstrap, topic, durable + 10) == expected(durable + 10)


def test_an_rdma_consumer_reads_on_while_its_segment_is_written_back(
    heads_root: Path, tmp_path: Path, clients: Clients, topic_name
) -> None:
    """The consumer holds the head when it rolls and is written back: its registration
    moves to the written-back file (no revocation) and it reads on there."""
    settings = {**RDMA, "rdma_consume": True}
    with HeadDirCluster(tmp_path / "cluster", heads_root, broker_settings=settings) as cluster:
        broker = cluster.brokers[0]
        topic = topic_name("consume")
        clients.create_topic(broker.bootstrap, topic, config=TOPIC_CONFIG)
        rdma_send(broker.bootstrap, topic, PROVIDER, batches_of(0, 10, 10))

        async def run() -> list[tuple[int, bytes]]:
            async with RdmaConsumer(broker.bootstrap, topic, 0, 0, provider=PROVIDER) as reader:
                records = await poll_until(reader, 100)
                rest = batches_of(100, (RECORDS - 100) // 10, 10)
                await asyncio.to_thread(rdma_send, broker.bootstrap, topic, PROVIDER, rest)
                await asyncio.to_thread(
                    eventually,
                    lambda: written_back(cluster, 0, topic, RECORDS),
                    "write-backs",
                    TIMEOUT,
                )
                records += await poll_until(reader, RECORDS - 100)
                assert await reader.poll(0.2) == []
                return [(r.offset, r.value or b"") for r in records]

        assert asyncio.run(run()) == expected(RECORDS)
        assert not broker.sample("directlog_broker_rdma_consume_revocations_total")
        assert f"{topic}-0: segment 0 registered anew, written back" in broker.stderr_text()


def leader_of(cluster: Cluster, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=5)
    return int(metadata.topics[topic].partitions[0].leader)


def in_sync(cluster: Cluster, topic: str) -> bool:
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(topic, timeout=5)
    partition = metadata.topics[topic].partitions[0]
    return sorted(partition.isrs) == sorted(partition.replicas)


def log_end(broker: BrokerProcess, topic: str) -> float | None:
    return broker.sample("directlog_broker_log_end_offset", topic=topic, partition="0")


def test_a_follower_that_lost_its_head_directory_refetches_from_the_leader(
    heads_root: Path, tmp_path: Path, clients: Clients, topic_name
) -> None:
    settings = {**RDMA, "rdma_replication": True, "replica_fetch_wait_max_ms": 200}
    with HeadDirCluster(
        tmp_path / "cluster", heads_root, brokers=2, broker_settings=settings
    ) as cluster:
        topic = topic_name("refetch")
        admin = clients.admin(cluster.bootstrap)
        config = {**TOPIC_CONFIG, "min.insync.replicas": "2"}
        futures = admin.create_topics([NewTopic(topic, 1, 2, config=config)])
        futures[topic].result(timeout=TIMEOUT)
        wait_for(lambda: in_sync(cluster, topic), TIMEOUT, "the ISR of the new topic")
        leader_id = leader_of(cluster, topic)
        (follower_id,) = set(cluster.brokers) - {leader_id}
        leader, follower = cluster.brokers[leader_id], cluster.brokers[follower_id]

        batches = batches_of(0, RECORDS // 10, 10)
        produced = rdma_send(leader.bootstrap, topic, PROVIDER, batches, acks=-1)
        assert produced == [Produced(10 * i, 10) for i in range(RECORDS // 10)]  # acknowledged
        wait_for(lambda: log_end(follower, topic) == RECORDS, TIMEOUT, "the follower at the end")
        eventually(lambda: written_back(cluster, follower_id, topic, RECORDS), "write-backs", 30)

        follower.kill()
        disk, _ = places(cluster, follower_id, topic)
        assert records_in(segment_files(disk)) < RECORDS  # the head's records are gone
        shutil.rmtree(cluster.head_dir(follower_id))
        follower.start()
        assert "lost with the head directory" in follower.stderr_text()
        wait_for(lambda: log_end(follower, topic) == RECORDS, TIMEOUT, "the follower refilled")
        wait_for(lambda: in_sync(cluster, topic), TIMEOUT, "the follower back in the ISR")

        # The leader goes: the follower leads, with every acknowledged record.
        leader.kill()
        wait_for(lambda: leader_of(cluster, topic) == follower_id, TIMEOUT, "the new leader")
        assert values(clients, follower.bootstrap, topic, RECORDS) == expected(RECORDS)


def test_rdma_answers_carry_the_rdma_advertised_host(tmp_path: Path, clients, topic_name) -> None:
    settings = {
        "rdma_produce": True,
        "rdma_provider": "tcp",
        "rdma_advertised_host": "rdma-0.directlog.test",
        "rdma_connect_timeout_ms": 2000,
    }
    with single_broker(tmp_path / "cluster", settings) as broker:
        topic = topic_name("advertised")
        clients.create_topic(broker.bootstrap, topic, config=TOPIC_CONFIG)
        with open_context("tcp") as context:
            pd = context.alloc_pd()
            replies = pd.allocate(4 * REPLY_SIZE, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
            grant = asyncio.run(
                raw_grant(broker.bootstrap, topic, "tcp", replies.addr, replies.rkey)
            )
        assert grant.error_code == 0, grant.error_message
        assert ConnInfo.decode(grant.conn_info).host == "rdma-0.directlog.test"
