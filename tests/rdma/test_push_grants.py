"""A leader's push grant is held like every RDMA grant (docs/security.md, "RDMA grants"),
on the shm and tcp providers: a real follower end (ReplicaFollower on its RdmaEndpoint)
grants its head segment to a leader played by the test, which pushes through real verbs.
The grant goes — region deregistered, queue pair disconnected, the partition pulled again,
the log holding exactly what was committed — when the leader's principal loses
CLUSTER_ACTION, its login's credentials are deleted, or the session that asked for it ends;
a super user, or a grant made on no session (no authorizer, no SASL), keeps it. The leader
end keeps the Kafka connection a grant was asked on while the channel lives and hangs it
up when the channel ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from directlog.protocol.api import ApiKey, parse_request_header
from directlog.protocol.errors import ErrorCode
from directlog.protocol.rdma_replica import (
    KIND_RECORDS,
    OPEN,
    REPLY,
    RdmaReplicaRequest,
    RdmaReplicaResponse,
    immediate,
)
from directlog.rdma import (
    Access,
    CompletionQueue,
    MemoryRegion,
    Opcode,
    ProtectionDomain,
    QpCaps,
    QueuePair,
    RdmaError,
    WorkCompletion,
    open_context,
)
from directlog.records.batch import Record, build_batch
from directlog.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from directlog.security.scram import ScramCredential, ScramMechanism
from directlog.topic_config import LogConfig
from directlog.topics import TopicPartition
from services.broker.authentication import (
    NO_SASL,
    PLAINTEXT,
    SESSION,
    ListenerSecurity,
    Session,
    SessionSettings,
)
from services.broker.authorizer import Authorizer
from services.broker.metrics import BrokerMetrics
from services.broker.partition import Partition
from services.broker.rdma.endpoint import RdmaEndpoint
from services.broker.rdma.replica_follower import ReplicaFollower
from services.broker.rdma.replica_leader import LeaderChannel, ReplicaLeader
from services.broker.replica_fetcher import FetchSettings, FollowState, ReplicaFetcher
from services.broker.replica_manager import ReplicaManager
from services.broker.settings import BrokerSettings
from services.broker.storage import PartitionLog

pytestmark = pytest.mark.timeout(60)

TP = TopicPartition("pushed", 0)
LEADER, FOLLOWER, EPOCH = 0, 1, 3
CREDITS = 4
PRINCIPAL = "User:broker"
PASSWORD = "secret-of-broker"
CAPS = QpCaps(max_send_wr=2 * CREDITS, max_recv_wr=CREDITS)
WAIT = 15.0  # seconds any one completion may take on a loaded machine
CLUSTER_ACTION = AclBinding(
    ResourceType.CLUSTER,
    CLUSTER_NAME,
    PatternType.LITERAL,
    PRINCIPAL,
    "*",
    Operation.CLUSTER_ACTION,
    Permission.ALLOW,
)


def authorizer(*bindings: AclBinding, super_users: tuple[str, ...] = ()) -> Authorizer:
    made = Authorizer(super_users)
    made.update(bindings)
    return made


def batch(offset: int) -> bytes:
    return build_batch(
        [Record(offset, 1_700_000_000_000, None, b"v%d" % offset)], partition_leader_epoch=EPOCH
    )


@dataclass
class Follower:
    """The follower end: a ReplicaFollower on a real endpoint, one partition it follows."""

    follower: ReplicaFollower
    endpoint: RdmaEndpoint
    plog: PartitionLog
    state: FollowState

    def grant(self, request: RdmaReplicaRequest, session: Session | None) -> RdmaReplicaResponse:
        """``request`` handled on ``session``'s connection, as the Kafka server would."""
        token = SESSION.set(session)
        try:
            return self.follower.grant(request)
        finally:
            SESSION.reset(token)

    @property
    def pushed(self) -> bool:
        return self.follower.pushed(TP) and self.state.pushed


@dataclass
class Leader:
    """The leader end, played by the test: its verbs and the grant it holds."""

    pd: ProtectionDomain
    cq: CompletionQueue
    replies: MemoryRegion
    staging: MemoryRegion
    provider: str
    grant: RdmaReplicaResponse | None = None
    qp: QueuePair | None = None
    written: int = 0
    order: int = 0
    seen: list[WorkCompletion] = field(default_factory=list)

    def request(self, channel_id: int = OPEN, log_end_offset: int = -1) -> RdmaReplicaRequest:
        replies = self.replies
        return RdmaReplicaRequest(
            TP.topic,
            TP.partition,
            LEADER,
            EPOCH,
            channel_id,
            log_end_offset,
            0,
            replies.addr,
            replies.rkey,
            replies.length,
            (self.provider,),
        )

    async def connect(self, grant: RdmaReplicaResponse) -> None:
        assert grant.error_code == ErrorCode.NONE, grant.error_message
        self.grant = grant
        self.qp = await asyncio.to_thread(self.pd.connect, grant.conn_info, self.cq, CAPS)
        for credit in range(CREDITS):
            self.qp.post_recv(credit)

    async def post(self, data: bytes) -> bool:
        """WRITE_WITH_IMM ``data`` after what was pushed; False when the queue pair
        refuses to post at all (disconnected). Posted from a thread, as from another
        process: shm's post waits for the peer's receive, which the loop posts."""
        assert self.qp is not None and self.grant is not None
        self.staging.buf[: len(data)] = data
        try:
            await asyncio.to_thread(
                self.qp.post_write_with_imm,
                100 + self.order,
                self.staging.sge(0, len(data)),
                self.grant.addr + self.written,
                self.grant.rkey,
                immediate(KIND_RECORDS, self.grant.channel_id, self.order),
            )
        except RdmaError:
            return False
        self.written += len(data)
        self.order += 1
        return True

    async def until(self, found: Callable[[list[WorkCompletion]], bool], what: str) -> None:
        """Poll (without blocking the loop the follower runs on) until ``found`` is true of
        the completions seen so far."""
        deadline = time.monotonic() + WAIT
        while not found(self.seen):
            assert time.monotonic() < deadline, f"{what}: not within {WAIT} s ({self.seen})"
            self.seen += self.cq.poll(16, timeout=0)
            await asyncio.sleep(0.005)

    async def push(self, data: bytes) -> int:
        """Push ``data`` and wait for the follower's reply: the log end it reports."""
        order, slot = self.order, self.order % CREDITS * REPLY.size
        assert await self.post(data)
        wr_id = 100 + order

        def answered(seen: list[WorkCompletion]) -> bool:
            return any(c.wr_id == wr_id for c in seen) and any(
                c.opcode is Opcode.RECV_RDMA_WITH_IMM and c.imm_data == order for c in seen
            )

        await self.until(answered, f"the reply to push {order}")
        assert all(c.ok for c in self.seen), self.seen
        echoed, code, log_end_offset = REPLY.unpack_from(self.replies.buf, slot)
        assert (echoed, code) == (order, ErrorCode.NONE)
        return int(log_end_offset)

    async def refused(self, data: bytes) -> None:
        """A push of ``data`` fails: not posted, or completed with an error."""
        order = self.order
        if not await self.post(data):
            return
        wr_id = 100 + order
        await self.until(lambda seen: any(c.wr_id == wr_id for c in seen), "the refused push")
        (done,) = [c for c in self.seen if c.wr_id == wr_id]
        assert not done.ok, done


@asynccontextmanager
async def pushing(
    tmp_path: Path, provider: str, authorizer_enabled: bool = True
) -> AsyncIterator[tuple[Follower, Leader]]:
    settings = BrokerSettings.model_validate(
        {
            "rdma_provider": provider,
            "authorizer_enabled": authorizer_enabled,
            "rdma_replication_credits": CREDITS,
            "rdma_replication_timeout_ms": 60_000,
            "data_dir": tmp_path,
        }
    )
    plog = PartitionLog.open(tmp_path / str(TP), LogConfig(preallocate=True, segment_bytes=1 << 16))
    partition = SimpleNamespace(
        tp=TP,
        is_leader=False,
        info=SimpleNamespace(leader=LEADER),
        leader_epoch=EPOCH,
        config=plog.config,
        log=plog,
    )
    fetcher = ReplicaFetcher(LEADER, lambda _: None, FetchSettings(FOLLOWER, 100, 1 << 20, 100))
    state = FollowState(cast(Partition, partition), EPOCH, truncating=False)
    fetcher.partitions[TP] = state
    replicas = SimpleNamespace(partitions={TP: partition}, fetchers={LEADER: fetcher})
    ends: list[ReplicaFollower] = []
    endpoint = RdmaEndpoint(
        "push grants",
        settings,
        0,
        CAPS,
        256,
        lambda qp: ends[0].accepted(qp),
        lambda wc: ends[0].completed(wc),
    )
    follower = ReplicaFollower(
        settings, cast(ReplicaManager, replicas), endpoint.pd, endpoint.listener
    )
    ends.append(follower)
    try:
        with open_context(provider) as context:
            pd = context.alloc_pd()
            leader = Leader(
                pd,
                context.create_cq(64),
                pd.allocate(CREDITS * REPLY.size, Access.LOCAL_WRITE | Access.REMOTE_WRITE),
                pd.allocate(4096, Access.LOCAL_WRITE),
                provider,
            )
            yield Follower(follower, endpoint, plog, state), leader
    finally:
        follower.close()
        await endpoint.close()
        plog.close()


def as_broker() -> Session:
    """A session whose principal is User:broker (from a TLS client certificate)."""
    return Session(PLAINTEXT, NO_SASL, tls_subject="broker")


def sasl_login(stored: dict[str, ScramCredential]) -> Session:
    """A session logged in with SASL PLAIN as User:broker, against ``stored``."""
    session = Session(
        ListenerSecurity("SASL_PLAINTEXT", None, ("PLAIN",)),
        SessionSettings(lambda user, mechanism: stored.get(user), 0, 0.0, 524288),
    )

    def header(key: ApiKey, version: int) -> Any:
        return SimpleNamespace(api_key=key, api_version=version)

    handshake = session.handle(header(ApiKey.SASL_HANDSHAKE, 1), SimpleNamespace(mechanism="PLAIN"))
    assert handshake.error_code == ErrorCode.NONE
    token = b"\0broker\0" + PASSWORD.encode()
    answer = session.handle(header(ApiKey.SASL_AUTHENTICATE, 2), SimpleNamespace(auth_bytes=token))
    assert answer.error_code == ErrorCode.NONE and session.principal == PRINCIPAL
    return session


async def granted_and_pushed(follower: Follower, leader: Leader, session: Session | None) -> None:
    """Open a channel on ``session`` and push two batches through it."""
    await leader.connect(follower.grant(leader.request(), session))
    assert follower.pushed
    assert await leader.push(batch(0)) == 1
    assert await leader.push(batch(1)) == 2


async def revoked(follower: Follower, leader: Leader, committed: int = 2) -> None:
    """The channel is gone: the partition is pulled again, a push after it lands nowhere,
    and the log holds the ``committed`` batches pushed before it and nothing past them."""
    assert not follower.pushed
    await leader.refused(batch(committed))
    plog = follower.plog
    assert plog.log_end_offset == committed
    expected = b"".join(batch(offset) for offset in range(committed))
    assert plog.read(0, 1 << 20).records.read() == expected
    head = plog.segments[-1]
    after = head.log.path.read_bytes()[head.size : head.size + 512]
    assert after == bytes(len(after)), "bytes past the committed end"


def test_a_push_grant_goes_when_its_principal_loses_cluster_action(
    tmp_path: Path, provider: str
) -> None:
    async def scenario() -> None:
        async with pushing(tmp_path, provider) as (follower, leader):
            await granted_and_pushed(follower, leader, as_broker())
            follower.follower.recheck(authorizer(CLUSTER_ACTION))
            follower.follower.recheck(authorizer(super_users=(PRINCIPAL,)))  # needs no ACL
            assert follower.pushed
            assert await leader.push(batch(2)) == 3

            follower.follower.recheck(authorizer())  # the ACL deleted
            await revoked(follower, leader, committed=3)

    asyncio.run(scenario())


def test_a_push_grant_goes_with_its_logins_credentials(tmp_path: Path, provider: str) -> None:
    """Kafka lets the login's connection on until it re-authenticates; a grant, which never
    re-authenticates, goes as the image takes the deletion (ACLs checked or not)."""

    async def scenario() -> None:
        stored = {"broker": ScramCredential.from_password(ScramMechanism.SCRAM_SHA_512, PASSWORD)}
        async with pushing(tmp_path, provider, authorizer_enabled=False) as (follower, leader):
            await granted_and_pushed(follower, leader, sasl_login(stored))
            follower.follower.recheck(None)
            assert follower.pushed
            del stored["broker"]
            follower.follower.recheck(None)
            await revoked(follower, leader)

    asyncio.run(scenario())


def test_a_push_grant_ends_with_the_session_that_asked_for_it(
    tmp_path: Path, provider: str
) -> None:
    async def scenario() -> None:
        async with pushing(tmp_path, provider) as (follower, leader):
            session = as_broker()
            await granted_and_pushed(follower, leader, session)
            session.end()  # the leader's connection closed
            await revoked(follower, leader)

    asyncio.run(scenario())


def test_a_renewed_grant_is_held_on_the_session_that_renewed_it(
    tmp_path: Path, provider: str
) -> None:
    async def scenario() -> None:
        async with pushing(tmp_path, provider) as (follower, leader):
            first, second = as_broker(), as_broker()
            await granted_and_pushed(follower, leader, first)
            assert leader.grant is not None
            renewal = leader.request(leader.grant.channel_id, follower.plog.log_end_offset)
            renewed = follower.grant(renewal, second)
            assert renewed.error_code == ErrorCode.NONE, renewed.error_message
            first.end()
            assert follower.pushed
            second.end()
            assert not follower.pushed

    asyncio.run(scenario())


def test_a_grant_on_no_session_outlives_the_connection(tmp_path: Path, provider: str) -> None:
    """Without the authorizer and SASL there is no authority to lose: the grant stays, as
    it always has, whatever happens to the connection that asked for it."""

    async def scenario() -> None:
        async with pushing(tmp_path, provider, authorizer_enabled=False) as (follower, leader):
            session = Session(PLAINTEXT, NO_SASL)
            await granted_and_pushed(follower, leader, session)
            session.end()
            follower.follower.recheck(None)
            await asyncio.sleep(0)  # an end scheduled for later would have run by now
            assert follower.pushed
            assert await leader.push(batch(2)) == 3

    asyncio.run(scenario())


# The leader's end: the connection the grant is held on -----------------------------------


@dataclass
class FakeFollower:
    """A Kafka port that grants every RdmaReplica; counts connections and requests and
    notes when a connection is hung up."""

    connections: int = 0
    requests: int = 0
    hung_up: int = 0
    refuse_next: bool = False

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                frame = await reader.readexactly(size)
                header = parse_request_header(frame)
                assert header.api_key == ApiKey.RDMA_REPLICA
                self.requests += 1
                if self.refuse_next:
                    self.refuse_next = False
                    writer.close()  # mid-exchange: the leader must not use it again
                    return
                body = RdmaReplicaResponse(ErrorCode.NONE, None, "{}", 7, CREDITS).encode()
                answer = header.correlation_id.to_bytes(4, "big") + body
                writer.write(len(answer).to_bytes(4, "big") + answer)
                await writer.drain()
        except asyncio.IncompleteReadError:
            self.hung_up += 1
        finally:
            writer.close()

    async def hung_up_on(self, count: int) -> None:
        deadline = time.monotonic() + WAIT
        while self.hung_up < count:
            assert time.monotonic() < deadline, f"{self.hung_up} of {count} hang-ups"
            await asyncio.sleep(0.01)


@asynccontextmanager
async def leading(
    tmp_path: Path, provider: str
) -> AsyncIterator[tuple[ReplicaLeader, FakeFollower, Callable[[], LeaderChannel]]]:
    fake = FakeFollower()
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = BrokerSettings.model_validate({"rdma_provider": provider, "data_dir": tmp_path})
    replicas = SimpleNamespace(
        broker_id=LEADER,
        image=SimpleNamespace(brokers={FOLLOWER: SimpleNamespace(host="127.0.0.1", port=port)}),
        fetch_settings=SimpleNamespace(security=None),
        partitions={},
    )
    try:
        with open_context(provider) as context:
            pd, cq = context.alloc_pd(), context.create_cq(16)
            leader = ReplicaLeader(
                settings, cast(ReplicaManager, replicas), pd, cq, (provider,), BrokerMetrics()
            )

            def channel() -> LeaderChannel:
                partition = cast(Partition, SimpleNamespace(tp=TP, leader_epoch=EPOCH))
                made = LeaderChannel(partition, FOLLOWER, EPOCH)
                access = Access.LOCAL_WRITE | Access.REMOTE_WRITE
                made.replies = pd.allocate(CREDITS * REPLY.size, access)
                leader._channels[(TP, FOLLOWER)] = made
                return made

            try:
                yield leader, fake, channel
            finally:
                await leader.close()
    finally:
        server.close()
        await server.wait_closed()


def test_the_leader_keeps_the_grants_connection_until_the_channel_ends(
    tmp_path: Path, provider: str
) -> None:
    async def scenario() -> None:
        async with leading(tmp_path, provider) as (leader, fake, channel):
            pushing_to = channel()
            opened = await leader._ask(pushing_to, OPEN)
            await leader._ask(pushing_to, opened.channel_id)  # a renewal, on the same session
            assert (fake.connections, fake.requests, fake.hung_up) == (1, 2, 0)
            leader._fail(pushing_to, "ended by the test", quiet=True)
            await fake.hung_up_on(1)

            # A failed exchange hangs up; the next channel asks on a new connection, and
            # stopping the leader hangs that one up too.
            again = channel()
            fake.refuse_next = True
            with pytest.raises(ConnectionError):
                await leader._ask(again, OPEN)
            assert again.connection is None
            await leader._ask(again, OPEN)
            assert (fake.connections, fake.requests) == (3, 4)
            await leader.close()
            await fake.hung_up_on(2)

    asyncio.run(scenario())
