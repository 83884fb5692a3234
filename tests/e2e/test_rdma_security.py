"""RDMA grants under the authorizer, as an attacker who once held one would probe them: a
SASL principal asks for RDMA access on its own Kafka connection, gets it only with the ACL
the Produce or Fetch it replaces needs, and loses it — memory deregistered, queue pair
disconnected — when the ACL is deleted, its credentials are deleted, its connection closes
or its session expires. Each revocation is followed by a write (or a READ) with what the
grant had told, and the log read back through Kafka shows nothing of it. Remote keys of
successive grants tell nothing of each other. A leader's push grant goes the same way with
the brokers' CLUSTER_ACTION: replication then stops, as Kafka's does, since the follower's
Fetch needs it too, and resumes — every record once — when the ACL is back.

The harness works through the PLAINTEXT listener as User:ANONYMOUS, a super user.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclOperation,
    NewTopic,
    ResourcePatternType,
    ScramMechanism,
    UserScramCredentialDeletion,
)

from directlog.client.rdma_produce import REPLY_SIZE
from directlog.protocol import rdma_access, rdma_consume
from directlog.protocol.client import ClientSecurity, KafkaConnection, SaslLogin
from directlog.protocol.errors import ErrorCode
from directlog.protocol.rdma_access import EXCLUSIVE, RdmaAccessRequest, RdmaAccessResponse
from directlog.protocol.rdma_consume import (
    ACCESS,
    NEW_CONSUMER,
    SLOT_SIZE,
    RdmaConsumeRequest,
    RdmaConsumeResponse,
    read_slot,
)
from directlog.rdma import (
    Access,
    CompletionQueue,
    MemoryRegion,
    Opcode,
    ProtectionDomain,
    QueuePair,
    RdmaError,
    WcStatus,
    WorkCompletion,
    open_context,
)
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.conftest import Clients, _stop_checked
from tests.e2e.test_acls import (
    AUTHORIZED,
    BROKER,
    CLUSTER_NAME,
    PASSWORD,
    TOPIC,
    Secured,
    acl,
    acl_filter,
    delivery_codes,
    user_of,
)
from tests.e2e.test_rdma_consume import produce
from tests.e2e.test_rdma_produce import batches_of, values
from tests.e2e.test_rdma_replication import (
    CHANNELS,
    PULLED,
    PUSHED,
    counter,
    log_end,
    read_all,
    stored_log,
)

pytestmark = pytest.mark.timeout(180)

SETTINGS = {
    **AUTHORIZED,
    "rdma_produce": True,
    "rdma_consume": True,
    "rdma_grant_max_bytes": 1 << 20,
    "rdma_connect_timeout_ms": 10000,
}
PREALLOCATED = {"preallocate": "true"}
REPLIES = 4  # reply slots per writer
LITERAL = ResourcePatternType.LITERAL


@pytest.fixture(scope="module", params=["shm", "tcp"])
def secured_rdma(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Secured, str]]:
    provider = request.param
    settings = {**SETTINGS, "rdma_provider": provider}
    cluster = Cluster(tmp_path_factory.mktemp(f"rdma-acl-{provider}"), broker_settings=settings)
    cluster.start()
    try:
        yield Secured(cluster.brokers[0]), provider
        _stop_checked(cluster.brokers[0])
    finally:
        cluster.stop()


async def sasl_connection(
    address: str, login: dict[str, str], *, renew: bool = True
) -> KafkaConnection:
    """A Kafka connection logged in with SASL PLAIN: the session grants are held on.
    ``renew``: it logs in again before its session ends (KIP-368)."""
    host, port = address.rsplit(":", 1)
    user, password = user_of(login)
    security = ClientSecurity(
        sasl=SaslLogin("PLAIN", user, password), client_id="rdma-sec", reauthenticate=renew
    )
    return await KafkaConnection.connect(host, int(port), 10.0, security)


async def plain_connection(address: str) -> KafkaConnection:
    host, port = address.rsplit(":", 1)
    return await KafkaConnection.connect(host, int(port), 10.0)


async def ask_write(
    connection: KafkaConnection, topic: str, provider: str, replies: MemoryRegion
) -> RdmaAccessResponse:
    request = RdmaAccessRequest(
        topic, 0, EXCLUSIVE, 1, (provider,), replies.addr, replies.rkey, REPLIES * REPLY_SIZE
    )
    correlation = connection.next_correlation_id()
    frame = await connection.exchange(rdma_access.request_frame(request, correlation, "t"))
    return rdma_access.decode_response_frame(frame, correlation)


async def ask_read(
    connection: KafkaConnection, topic: str, provider: str, consumer_id: int = NEW_CONSUMER
) -> RdmaConsumeResponse:
    request = RdmaConsumeRequest(topic, 0, ACCESS, consumer_id, 0, (provider,))
    correlation = connection.next_correlation_id()
    frame = await connection.exchange(rdma_consume.request_frame(request, correlation, "t"))
    return rdma_consume.decode_response_frame(frame, correlation)


def completions(cq: CompletionQueue, count: int, timeout: float = 10.0) -> list[WorkCompletion]:
    found: list[WorkCompletion] = []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        found += cq.poll(count - len(found), timeout=0.2)
    assert len(found) == count, found
    return found


@dataclass
class Writer:
    """One exclusive grant written the way RdmaProducer writes it, by hand, so a write can
    be attempted after the broker revoked the grant."""

    pd: ProtectionDomain
    cq: CompletionQueue
    replies: MemoryRegion
    staging: MemoryRegion
    grant: RdmaAccessResponse | None = None
    qp: QueuePair | None = None
    written: int = 0
    order: int = 0
    replies_read: int = 0

    async def take_grant(self, connection: KafkaConnection, topic: str, provider: str) -> None:
        """Ask for a write grant on partition 0 of `topic`, which must be given, and
        connect to it."""
        grant = await ask_write(connection, topic, provider, self.replies)
        assert grant.error_code == 0, grant.error_message
        self.connect(grant)

    @classmethod
    def open(cls, ctx: Any) -> Writer:
        pd, cq = ctx.alloc_pd(), ctx.create_cq(256)
        replies = pd.allocate(REPLIES * REPLY_SIZE, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
        staging = pd.allocate(1 << 16, Access.LOCAL_WRITE)
        return cls(pd, cq, replies, staging)

    def connect(self, grant: RdmaAccessResponse) -> None:
        self.grant = grant
        self.qp = self.pd.connect(grant.conn_info, self.cq)
        for slot in range(REPLIES):
            self.qp.post_recv(slot)

    def post(self, batch: bytes) -> bool:
        """Post a WRITE_WITH_IMM of ``batch`` after what was written; False when the queue
        pair refuses to post at all (the broker disconnected it)."""
        assert self.qp is not None and self.grant is not None
        self.staging.buf[: len(batch)] = batch
        imm = self.grant.file_id << 16 | self.order
        try:
            self.qp.post_write_with_imm(
                100 + self.order,
                self.staging.sge(0, len(batch)),
                self.grant.addr + self.written,
                self.grant.rkey,
                imm,
            )
        except RdmaError:
            return False
        self.written += len(batch)
        self.order += 1
        return True

    def write(self, batch: bytes) -> int:
        """Write ``batch`` and return the code of the broker's reply to it."""
        assert self.post(batch)
        done = completions(self.cq, 2)
        assert all(c.ok for c in done), done
        return self.reply()

    def reply(self) -> int:
        """The code in the next reply slot (its completion was polled)."""
        slot = self.replies_read % REPLIES * REPLY_SIZE
        self.replies_read += 1
        return int.from_bytes(self.replies.buf[slot + 2 : slot + 4], "big", signed=True)

    def next_reply(self) -> int:
        """Wait for one more reply and return its code."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for wc in self.cq.poll(4, timeout=0.2):
                if wc.opcode is Opcode.RECV_RDMA_WITH_IMM and wc.ok:
                    return self.reply()
        raise AssertionError("no reply from the broker")

    def refused(self, batch: bytes) -> None:
        """A write of ``batch`` fails: not posted, or completed with an error."""
        if not self.post(batch):
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for wc in self.cq.poll(8, timeout=0.2):
                if wc.wr_id >= 100:  # the write's own completion, not a flushed receive
                    assert not wc.ok, wc
                    return
        raise AssertionError("the write after the revocation never completed")

    def disconnected(self) -> None:
        """Wait until the broker disconnected the queue pair: its receives flush."""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if any(wc.status is WcStatus.WR_FLUSH_ERR for wc in self.cq.poll(8, timeout=0.2)):
                return
        raise AssertionError("the broker kept the queue pair")


def new_topic(secured: Secured, clients: Clients, topic_name: Callable[[str], str]) -> str:
    topic = topic_name("rdma-sec")
    clients.create_topic(secured.broker.bootstrap, topic, config=PREALLOCATED)
    return topic


def only_first_batch_in_the_log(secured: Secured, clients: Clients, topic: str) -> None:
    """The log holds the five records written before the revocation and nothing of the
    write after it: the next Kafka produce lands at offset 5."""
    bootstrap = secured.broker.bootstrap
    producer = clients.producer(bootstrap, {"acks": 1})
    reports = clients.produce_all(
        producer, topic, [{"key": b"k5", "value": b"r-5", "partition": 0}]
    )
    assert [e for e, _ in reports if e is not None] == []
    assert values(clients, bootstrap, topic, 6) == [(i, f"r-{i}".encode()) for i in range(6)]
    assert secured.broker.stored_batches(topic)[:1] == [(0, 5)]


def test_a_produce_grant_needs_write_and_goes_with_the_acl(
    secured_rdma: tuple[Secured, str], clients: Clients, topic_name: Callable[[str], str]
) -> None:
    secured, provider = secured_rdma
    topic = new_topic(secured, clients, topic_name)
    principal, login = secured.login()
    first, after = batches_of(0, 2)

    async def scenario() -> None:
        connection = await sasl_connection(secured.sasl, login)
        try:
            with open_context(provider) as ctx:
                writer = Writer.open(ctx)
                refused = await ask_write(connection, topic, provider, writer.replies)
                assert refused.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
                secured.allow(acl(principal, AclOperation.WRITE, topic))
                await writer.take_grant(connection, topic, provider)
                assert writer.write(first) == 0

                deleted = secured.admin.delete_acls([acl_filter(TOPIC, topic, LITERAL, principal)])
                for future in deleted.values():
                    assert len(future.result(timeout=30)) == 1
                # DeleteAcls is answered once the broker decides by it: revoked by now.
                assert writer.next_reply() == ErrorCode.TOPIC_AUTHORIZATION_FAILED
                writer.refused(after)
                again = await ask_write(connection, topic, provider, writer.replies)
                assert again.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        finally:
            await connection.close()

    asyncio.run(scenario())
    only_first_batch_in_the_log(secured, clients, topic)


def test_a_produce_grant_goes_with_the_users_credentials(
    secured_rdma: tuple[Secured, str], clients: Clients, topic_name: Callable[[str], str]
) -> None:
    secured, provider = secured_rdma
    topic = new_topic(secured, clients, topic_name)
    principal, login = secured.login()
    secured.allow(acl(principal, AclOperation.WRITE, topic))
    first, after = batches_of(0, 2)

    async def scenario() -> None:
        connection = await sasl_connection(secured.sasl, login)
        try:
            with open_context(provider) as ctx:
                writer = Writer.open(ctx)
                await writer.take_grant(connection, topic, provider)
                assert writer.write(first) == 0

                user, _ = user_of(login)
                deletion = UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)
                for future in secured.admin.alter_user_scram_credentials([deletion]).values():
                    future.result(timeout=30)
                # Kafka would let the connection on until it re-authenticates; the grant,
                # which never re-authenticates, goes at once.
                assert writer.next_reply() == ErrorCode.SASL_AUTHENTICATION_FAILED
                writer.refused(after)
        finally:
            await connection.close()

    asyncio.run(scenario())
    only_first_batch_in_the_log(secured, clients, topic)


def test_a_grant_ends_with_the_connection_that_asked_for_it(
    secured_rdma: tuple[Secured, str], clients: Clients, topic_name: Callable[[str], str]
) -> None:
    secured, provider = secured_rdma
    topic = new_topic(secured, clients, topic_name)
    principal, login = secured.login()
    secured.allow(acl(principal, AclOperation.WRITE, topic))
    first, after = batches_of(0, 2)

    async def scenario() -> None:
        with open_context(provider) as ctx:
            writer = Writer.open(ctx)
            connection = await sasl_connection(secured.sasl, login)
            try:
                await writer.take_grant(connection, topic, provider)
                assert writer.write(first) == 0
            finally:
                await connection.close()
            writer.disconnected()  # the broker revoked first, then disconnected
            writer.refused(after)

    asyncio.run(scenario())
    only_first_batch_in_the_log(secured, clients, topic)


def test_a_consume_grant_needs_read_and_goes_with_the_acl(
    secured_rdma: tuple[Secured, str], clients: Clients, topic_name: Callable[[str], str]
) -> None:
    """Another consumer holds the same segment registration: the revoked one's rkey dies
    all the same (the segment is registered anew), and the other reads on."""
    secured, provider = secured_rdma
    topic = new_topic(secured, clients, topic_name)
    produce(clients, secured.broker.bootstrap, topic, 0, 20)
    principal, login = secured.login()

    async def scenario() -> None:
        connection = await sasl_connection(secured.sasl, login)
        other_connection = await plain_connection(secured.broker.bootstrap)
        try:
            with open_context(provider) as ctx:
                pd, cq = ctx.alloc_pd(), ctx.create_cq(1024)
                local = pd.allocate(4096, Access.LOCAL_WRITE)
                refused = await ask_read(connection, topic, provider)
                assert refused.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
                secured.allow(acl(principal, AclOperation.READ, topic))
                grant = await ask_read(connection, topic, provider)
                assert grant.error_code == 0, grant.error_message
                other = await ask_read(other_connection, topic, provider)
                assert other.error_code == 0, other.error_message
                assert (other.addr, other.rkey) == (grant.addr, grant.rkey)  # one registration

                qp = bound_queue_pair(pd, cq, grant, local)
                qp.post_read(2, local.sge(0, 61), grant.addr, grant.rkey)
                assert [c.status for c in completions(cq, 1)] == [WcStatus.SUCCESS]
                first_batch = bytes(local.buf[:61])

                deleted = secured.admin.delete_acls([acl_filter(TOPIC, topic, LITERAL, principal)])
                for future in deleted.values():
                    assert len(future.result(timeout=30)) == 1
                local.buf[:61] = bytes(61)
                assert not read_ok(qp, cq, local, grant.addr, grant.rkey)
                # A fresh queue pair, not yet bound, with the rkey it had: nothing either.
                stray = pd.connect(grant.conn_info, cq)
                assert not read_ok(stray, cq, local, grant.addr, grant.rkey)
                assert bytes(local.buf[:61]) == bytes(61)

                other_qp = bound_queue_pair(pd, cq, other, local)
                slot_at = other.slot_addr + other.slot_index * SLOT_SIZE
                assert read_ok(other_qp, cq, local, slot_at, other.slot_rkey, SLOT_SIZE)
                slot = read_slot(local.buf)
                assert slot is not None and slot.rkey != grant.rkey
                assert read_ok(other_qp, cq, local, slot.addr, slot.rkey)
                assert bytes(local.buf[:61]) == first_batch
        finally:
            await connection.close()
            await other_connection.close()

    asyncio.run(scenario())


def bound_queue_pair(
    pd: ProtectionDomain, cq: CompletionQueue, grant: RdmaConsumeResponse, local: MemoryRegion
) -> QueuePair:
    """A queue pair that named ``grant``'s consumer, as RdmaConsumer binds one."""
    qp = pd.connect(grant.conn_info, cq)
    qp.post_write_with_imm(1, local.sge(0, 8), grant.bind_addr, grant.bind_rkey, grant.consumer_id)
    assert [c.status for c in completions(cq, 1)] == [WcStatus.SUCCESS]
    return qp


def read_ok(
    qp: QueuePair, cq: CompletionQueue, local: MemoryRegion, addr: int, rkey: int, size: int = 61
) -> bool:
    """Whether a READ of ``size`` bytes into ``local`` succeeds (False when not posted)."""
    try:
        qp.post_read(3, local.sge(0, size), addr, rkey)
    except RdmaError:
        return False
    (done,) = completions(cq, 1)
    return done.ok


def test_successive_rkeys_are_not_sequential(
    secured_rdma: tuple[Secured, str], clients: Clients, topic_name: Callable[[str], str]
) -> None:
    """Each new consumer's slot region is a new registration: its rkey is a fresh random
    one, unrelated to those granted before it."""
    secured, provider = secured_rdma
    topic = new_topic(secured, clients, topic_name)
    produce(clients, secured.broker.bootstrap, topic, 0, 5)
    principal, login = secured.login()
    secured.allow(acl(principal, AclOperation.READ, topic))

    async def scenario() -> list[int]:
        connection = await sasl_connection(secured.sasl, login)
        try:
            rkeys = []
            for _ in range(12):
                grant = await ask_read(connection, topic, provider)
                assert grant.error_code == 0, grant.error_message
                rkeys.append(grant.slot_rkey)
            return rkeys
        finally:
            await connection.close()

    rkeys = asyncio.run(scenario())
    assert len(set(rkeys)) == len(rkeys)
    steps = {(b - a) % (1 << 32) for a, b in pairwise(rkeys)}
    assert len(steps) == len(rkeys) - 1  # no constant stride
    assert max(rkeys) - min(rkeys) > 1 << 24  # spread over the 32 bits, not a counter's range
    assert len({rkey >> 16 for rkey in rkeys}) >= len(rkeys) - 1  # the high half too


def test_a_grant_ends_when_its_session_expires(
    tmp_path: Path, clients: Clients, topic_name: Callable[[str], str]
) -> None:
    """connections_max_reauth_ms: a session not renewed (a client from before KIP-368) ends,
    and its grants with it, while the connection is still open."""
    settings = {**SETTINGS, "rdma_provider": "shm", "connections_max_reauth_ms": 3000}
    with Cluster(tmp_path, brokers=1, broker_settings=settings) as cluster:
        secured = Secured(cluster.brokers[0])
        topic = new_topic(secured, clients, topic_name)
        principal, login = secured.login()
        secured.allow(acl(principal, AclOperation.WRITE, topic))
        first, after = batches_of(0, 2)

        async def scenario() -> None:
            connection = await sasl_connection(secured.sasl, login, renew=False)
            try:
                with open_context("shm") as ctx:
                    writer = Writer.open(ctx)
                    await writer.take_grant(connection, topic, "shm")
                    assert writer.write(first) == 0
                    writer.disconnected()  # within the 3 s lifetime and a little
                    writer.refused(after)
            finally:
                await connection.close()

        asyncio.run(scenario())
        only_first_batch_in_the_log(secured, clients, topic)


# Push grants -------------------------------------------------------------------------------

BROKER_USER = "broker"  # the brokers' own login: not a super user, CLUSTER_ACTION by an ACL
PUSHING = {
    **AUTHORIZED,  # super users: User:ANONYMOUS (the harness) and User:admin only
    "inter_broker_listener": "SASL_PLAINTEXT",
    "inter_broker_sasl_mechanism": "PLAIN",
    "inter_broker_sasl_username": BROKER_USER,
    "inter_broker_sasl_password": PASSWORD + BROKER_USER,
    "rdma_replication": True,
    "rdma_replication_timeout_ms": 5000,
    "replica_fetch_wait_max_ms": 200,
}
PUSHED_TOPIC = {"preallocate": "true", "min.insync.replicas": "2"}
WAIT = 60  # seconds for any one outcome, on a loaded 2-core machine


def produce_numbered(
    clients: Clients, cluster: Cluster, topic: str, first: int, count: int, acks: str
) -> None:
    """Records ``first`` .. ``first + count - 1`` (as read_all reads them), all acked."""
    producer = clients.producer(cluster.bootstrap, {"acks": acks, "message.timeout.ms": 30000})
    records = [
        {"value": f"v-{n:06d}".encode() * 4, "partition": 0} for n in range(first, first + count)
    ]
    reports = clients.produce_all(producer, topic, records)
    assert [e for e, _ in reports if e is not None] == []


def isr(cluster: Cluster, clients: Clients, topic: str) -> list[int]:
    metadata = clients.admin(cluster.bootstrap).list_topics(topic, timeout=10)
    return sorted(metadata.topics[topic].partitions[0].isrs)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("provider", ["shm", "tcp"])
def test_push_replication_goes_with_the_brokers_cluster_action_and_comes_back_with_it(
    tmp_path: Path, clients: Clients, topic_name: Callable[[str], str], provider: str
) -> None:
    """The leader pushes to the follower, both logged in as User:broker, which has
    CLUSTER_ACTION by an ACL. Deleting the ACL revokes the leader's push grant on the
    follower at once (queue pair disconnected, partition pulled again). The pull is refused
    too — a follower's Fetch needs CLUSTER_ACTION, as in Kafka — so the follower gets
    nothing more and leaves the ISR, while the leader takes acks=1 records alone. With the
    ACL back the follower pulls what it missed, rejoins the ISR and is pushed again; every
    record is there exactly once and both logs are byte-identical."""
    settings = {**PUSHING, "rdma_provider": provider}
    with Cluster(tmp_path, brokers=2, broker_settings=settings) as cluster:
        secured = Secured(cluster.brokers[0])
        secured.login(BROKER_USER)  # the password the brokers' settings hold
        cluster_action = acl(
            f"User:{BROKER_USER}", AclOperation.CLUSTER_ACTION, CLUSTER_NAME, BROKER
        )
        secured.allow(cluster_action)
        topic = topic_name("pushed")
        created = secured.admin.create_topics(
            [NewTopic(topic, num_partitions=1, replication_factor=2, config=PUSHED_TOPIC)]
        )
        created[topic].result(timeout=WAIT)
        wait_for(lambda: isr(cluster, clients, topic) == [0, 1], WAIT, "the ISR of the topic")
        metadata = clients.admin(cluster.bootstrap).list_topics(topic, timeout=10)
        leader_id = metadata.topics[topic].partitions[0].leader
        leader, follower = cluster.brokers[leader_id], cluster.brokers[1 - leader_id]
        wait_for(lambda: counter(leader, CHANNELS, topic) == 1, WAIT, "the leader pushing")

        produce_numbered(clients, cluster, topic, 0, 200, "all")
        assert counter(leader, PUSHED, topic) > 0
        assert counter(follower, PULLED, topic, partition="0") == 0, "pulled, not pushed"
        pushed = counter(leader, PUSHED, topic)

        deleted = secured.admin.delete_acls(
            [acl_filter(BROKER, CLUSTER_NAME, LITERAL, f"User:{BROKER_USER}")]
        )
        for future in deleted.values():
            assert len(future.result(timeout=WAIT)) == 1
        revocation = f"{topic}-0: push channel"

        def revoked() -> bool:
            return any(
                revocation in line and "grant revoked: User:broker" in line
                for line in follower.stderr_text().splitlines()
            )

        wait_for(revoked, WAIT, "the follower revoking the push grant")
        wait_for(lambda: counter(leader, CHANNELS, topic) == 0, WAIT, "the push to end")
        produce_numbered(clients, cluster, topic, 200, 100, "1")  # the leader alone has them
        wait_for(
            lambda: isr(cluster, clients, topic) == [leader_id], WAIT, "the follower out of the ISR"
        )
        # acks=all is refused now (min.insync.replicas 2), before anything is appended.
        refused = delivery_codes(clients, cluster.bootstrap, {}, topic, acks="all", retries=0)
        assert refused == [ErrorCode.NOT_ENOUGH_REPLICAS]
        assert log_end(leader, topic) == 300
        assert log_end(follower, topic) == 200, "replicated without CLUSTER_ACTION"
        assert counter(leader, PUSHED, topic) == pushed
        assert counter(follower, PULLED, topic, partition="0") == 0
        assert "fetch answered TOPIC_AUTHORIZATION_FAILED" in follower.stderr_text()

        secured.allow(cluster_action)
        wait_for(lambda: log_end(follower, topic) == 300, WAIT, "the follower catching up")
        assert counter(follower, PULLED, topic, partition="0") > 0, "caught up without pulling"
        wait_for(
            lambda: isr(cluster, clients, topic) == [0, 1], WAIT, "the follower back in the ISR"
        )
        wait_for(lambda: counter(leader, CHANNELS, topic) == 1, WAIT, "the leader pushing again")
        pulled = counter(follower, PULLED, topic, partition="0")
        produce_numbered(clients, cluster, topic, 300, 200, "all")
        assert counter(leader, PUSHED, topic) > pushed
        assert counter(follower, PULLED, topic, partition="0") == pulled

        assert read_all(clients, cluster, topic, 500) == list(range(500))
        wait_for(lambda: log_end(follower, topic) == 500, WAIT, "the follower at the log end")
        data, _ = stored_log(leader, topic)
        assert stored_log(follower, topic)[0] == data, "the logs differ"
