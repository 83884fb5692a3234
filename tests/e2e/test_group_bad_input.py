"""Bad group requests, sent raw (kafka-python's protocol classes encode them, directlog's
KafkaConnection carries them) to a one-broker cluster: each must get the error code Apache
Kafka's classic group coordinator answers, change nothing, and leave the group usable.

Every test works on groups of its own and records in `VALID` each commit the broker
accepted; the last test checks that each group's committed offsets are exactly those
(nothing a refused request carried was stored) and that a real consumer then joins a group
and resumes from its committed offsets.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from directlog.protocol.api import APIS
from directlog.protocol.client import KafkaConnection
from directlog.protocol.errors import ErrorCode
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster
from tests.e2e.conftest import Clients, _stop_checked

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.admin import DeleteGroupsRequest, DescribeGroupsRequest, ListGroupsRequest
    from kafka.protocol.consumer import (
        HeartbeatRequest,
        JoinGroupRequest,
        LeaveGroupRequest,
        OffsetCommitRequest,
        OffsetFetchRequest,
        SyncGroupRequest,
    )
    from kafka.protocol.metadata import FindCoordinatorRequest

pytestmark = pytest.mark.timeout(60)

TOPIC = "group-bad-input"
PARTITIONS = 3
RECORDS = 10  # per partition
SESSION_MS = 30000  # raw members do not heartbeat; they must not expire mid-test
MIN_SESSION_MS = 6000  # the broker's group_min_session_timeout_ms (Kafka's default)
MAX_SESSION_MS = 1800000  # group_max_session_timeout_ms
METADATA_MAX = 4096  # offset_metadata_max_bytes
REQUEST_TIMEOUT = 30.0

# group -> (topic, partition) -> (offset, metadata): every commit the broker accepted.
VALID: dict[str, dict[tuple[str, int], tuple[int, str]]] = {}
CREATED: list[str] = []  # every group a test made, in order


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    cluster = Cluster(
        tmp_path_factory.mktemp("group-bad-input"),
        broker_settings={"group_initial_rebalance_delay_ms": 0},
    ).start()
    try:
        running = cluster.brokers[0]
        clients = Clients()
        clients.create_topic(running.bootstrap, TOPIC, PARTITIONS)
        records = [
            {"partition": p, "key": f"p{p}-{i}", "value": f"value {p}/{i}"}
            for i in range(RECORDS)
            for p in range(PARTITIONS)
        ]
        reports = Clients.produce_all(clients.producer(running.bootstrap), TOPIC, records)
        assert all(error is None for error, _ in reports)
        asyncio.run(_wait_for_coordinator(running.bootstrap))
        yield running
        _stop_checked(running)
    finally:
        cluster.stop()


# Raw requests ------------------------------------------------------------------------------


class Raw:
    """One connection; each request waits for its answer (bounded)."""

    def __init__(self, connection: KafkaConnection) -> None:
        self.connection = connection

    @classmethod
    async def open(cls, bootstrap: str) -> Raw:
        host, port = bootstrap.rsplit(":", 1)
        return cls(await KafkaConnection.connect(host, int(port), timeout=10))

    async def send(self, request: Any, client_id: str = "group-bad-input") -> Any:
        response = APIS[request.API_KEY].response
        return await asyncio.wait_for(
            self.connection.request(request, response, client_id), REQUEST_TIMEOUT
        )

    async def close(self) -> None:
        await self.connection.close()


def run(bootstrap: str, scenario: Callable[[Raw], Awaitable[None]]) -> None:
    """Run a test's requests; then every member still in a group a test made leaves (so a
    failed test leaves no member behind for the last test to trip over)."""

    async def main() -> None:
        raw = await Raw.open(bootstrap)
        try:
            await scenario(raw)
        finally:
            for group in CREATED:
                members = (await describe(raw, group)).members
                if members:
                    identities = [
                        LeaveGroupRequest.MemberIdentity(
                            member_id=m.member_id, group_instance_id=m.group_instance_id
                        )
                        for m in members
                    ]
                    await raw.send(LeaveGroupRequest(version=4, group_id=group, members=identities))
            await raw.close()

    asyncio.run(main())


async def _wait_for_coordinator(bootstrap: str) -> None:
    """FindCoordinator creates __consumer_offsets on first use; until it is led, the
    answer is COORDINATOR_NOT_AVAILABLE."""
    raw = await Raw.open(bootstrap)
    try:
        for _ in range(300):
            answer = await raw.send(FindCoordinatorRequest(version=3, key="any", key_type=0))
            if answer.error_code == ErrorCode.NONE:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"no group coordinator: {answer}")
    finally:
        await raw.close()


def new_group(prefix: str) -> str:
    group = f"{prefix}-{uuid.uuid4().hex[:8]}"
    CREATED.append(group)
    return group


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: the topics, no user data."""
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1)


def assignment(topic: str, partitions: list[int]) -> bytes:
    """ConsumerProtocolAssignment v0."""
    out = struct.pack(">hi", 0, 1) + struct.pack(">h", len(topic)) + topic.encode()
    out += struct.pack(">i", len(partitions)) + b"".join(struct.pack(">i", p) for p in partitions)
    return out + struct.pack(">i", -1)


def join_request(
    group: str,
    member_id: str = "",
    *,
    version: int = 5,
    session_ms: int = SESSION_MS,
    rebalance_ms: int = SESSION_MS,
    protocol_type: str = "consumer",
    protocols: list[tuple[str, bytes]] | None = None,
    instance: str | None = None,
) -> Any:
    if protocols is None:
        protocols = [("range", subscription(TOPIC))]
    fields: dict[str, Any] = {
        "group_id": group,
        "session_timeout_ms": session_ms,
        "rebalance_timeout_ms": rebalance_ms,
        "member_id": member_id,
        "protocol_type": protocol_type,
        "protocols": [
            JoinGroupRequest.JoinGroupRequestProtocol(name=n, metadata=m) for n, m in protocols
        ],
    }
    if version >= 5:
        fields["group_instance_id"] = instance
    return JoinGroupRequest(version=version, **fields)


async def join_and_sync(raw: Raw, group: str) -> tuple[str, int]:
    """A member that joins (the two-phase join of v4+), leads, assigns itself every
    partition and syncs: (member id, generation), the group Stable."""
    first = await raw.send(join_request(group))
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED, first
    joined = await raw.send(join_request(group, first.member_id))
    assert joined.error_code == ErrorCode.NONE, joined
    assert joined.leader == joined.member_id == first.member_id
    synced = await raw.send(sync_request(group, joined.member_id, joined.generation_id))
    assert synced.error_code == ErrorCode.NONE, synced
    assert bytes(synced.assignment) == assignment(TOPIC, list(range(PARTITIONS)))
    return joined.member_id, joined.generation_id


def sync_request(
    group: str,
    member_id: str,
    generation: int,
    *,
    version: int = 5,
    protocol_type: str | None = "consumer",
    assign: bool = True,
    instance: str | None = None,
) -> Any:
    assignments = (
        [
            SyncGroupRequest.SyncGroupRequestAssignment(
                member_id=member_id, assignment=assignment(TOPIC, list(range(PARTITIONS)))
            )
        ]
        if assign
        else []
    )
    return SyncGroupRequest(
        version=version,
        group_id=group,
        generation_id=generation,
        member_id=member_id,
        group_instance_id=instance,
        protocol_type=protocol_type,
        protocol_name="range",
        assignments=assignments,
    )


def heartbeat_request(
    group: str, member_id: str, generation: int, instance: str | None = None
) -> Any:
    return HeartbeatRequest(
        version=4,
        group_id=group,
        generation_id=generation,
        member_id=member_id,
        group_instance_id=instance,
    )


def leave_request(
    group: str, *member_ids: str, version: int = 4, instance: str | None = None
) -> Any:
    if version >= 3:
        members = [
            LeaveGroupRequest.MemberIdentity(member_id=m, group_instance_id=instance)
            for m in member_ids
        ]
        return LeaveGroupRequest(version=version, group_id=group, members=members)
    (member_id,) = member_ids
    return LeaveGroupRequest(version=version, group_id=group, member_id=member_id)


async def commit(
    raw: Raw,
    group: str,
    member_id: str,
    generation: int,
    offsets: dict[tuple[str, int], tuple[int, str]],
    instance: str | None = None,
) -> dict[tuple[str, int], int]:
    """OffsetCommit v8: each partition's error code. What the broker accepted is recorded
    in VALID."""
    topic_type = OffsetCommitRequest.OffsetCommitRequestTopic
    partition_type = topic_type.OffsetCommitRequestPartition
    topics: dict[str, list[Any]] = {}
    for (topic, partition), (offset, metadata) in offsets.items():
        topics.setdefault(topic, []).append(
            partition_type(
                partition_index=partition,
                committed_offset=offset,
                committed_leader_epoch=-1,
                committed_metadata=metadata,
            )
        )
    request = OffsetCommitRequest(
        version=8,
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        group_instance_id=instance,
        topics=[topic_type(name=t, partitions=ps) for t, ps in topics.items()],
    )
    response = await raw.send(request)
    codes = {
        (t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions
    }
    assert set(codes) == set(offsets)
    for tp, code in codes.items():
        if code == ErrorCode.NONE:
            VALID.setdefault(group, {})[tp] = offsets[tp]
    return codes


async def fetch(raw: Raw, group: str) -> dict[tuple[str, int], tuple[int, str]]:
    """OffsetFetch v7 of every committed partition of the group."""
    response = await raw.send(OffsetFetchRequest(version=7, group_id=group, topics=None))
    assert response.error_code == ErrorCode.NONE, response
    out = {}
    for topic in response.topics:
        for p in topic.partitions:
            assert p.error_code == ErrorCode.NONE, p
            out[(topic.name, p.partition_index)] = (p.committed_offset, p.metadata or "")
    return out


async def listed_groups(raw: Raw) -> dict[str, str]:
    response = await raw.send(ListGroupsRequest(version=4, states_filter=[]))
    assert response.error_code == ErrorCode.NONE
    return {g.group_id: g.group_state for g in response.groups}


async def describe(raw: Raw, group: str) -> Any:
    # v2: the newest DescribeGroups without authorized operations, whatever those do.
    response = await raw.send(DescribeGroupsRequest(version=2, groups=[group]))
    (described,) = response.groups
    return described


async def left(raw: Raw, group: str, member_id: str) -> None:
    response = await raw.send(leave_request(group, member_id))
    assert response.error_code == ErrorCode.NONE
    assert [m.error_code for m in response.members] == [ErrorCode.NONE]


# Membership ---------------------------------------------------------------------------------


def test_a_session_timeout_out_of_bounds_is_refused(broker: BrokerProcess) -> None:
    group = new_group("session")

    async def scenario(raw: Raw) -> None:
        for session_ms in (1, MIN_SESSION_MS - 1, MAX_SESSION_MS + 1):
            for member_id in ("", "someone"):
                answer = await raw.send(join_request(group, member_id, session_ms=session_ms))
                assert answer.error_code == ErrorCode.INVALID_SESSION_TIMEOUT, answer
                assert answer.generation_id == -1
        # The bounds themselves are allowed.
        member_id, _ = await join_and_sync(raw, group)
        await left(raw, group, member_id)
        edge = new_group("session-edge")
        for session_ms in (MIN_SESSION_MS, MAX_SESSION_MS):
            first = await raw.send(join_request(edge, session_ms=session_ms))
            assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
            joined = await raw.send(join_request(edge, first.member_id, session_ms=session_ms))
            assert joined.error_code == ErrorCode.NONE, joined
            await left(raw, edge, joined.member_id)

    run(broker.bootstrap, scenario)


def test_refused_joins_create_no_group(broker: BrokerProcess) -> None:
    """Kafka checks a JoinGroup's session timeout, and that a member id it names exists,
    before it creates the group: such a refused join leaves nothing behind that ListGroups,
    DescribeGroups or DeleteGroups could see."""
    session, unknown = new_group("gone"), new_group("gone")

    async def scenario(raw: Raw) -> None:
        answer = await raw.send(join_request(session, session_ms=1))
        assert answer.error_code == ErrorCode.INVALID_SESSION_TIMEOUT
        answer = await raw.send(join_request(unknown, "made-up-member-id"))
        assert answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        groups = await listed_groups(raw)
        for group in (session, unknown):
            assert group not in groups, f"a refused join created {group}: {groups[group]}"
            described = await describe(raw, group)
            assert (described.error_code, described.group_state) == (ErrorCode.NONE, "Dead")
            assert described.members == []
        response = await raw.send(DeleteGroupsRequest(version=2, groups_names=[session, unknown]))
        assert [r.error_code for r in response.results] == [ErrorCode.GROUP_ID_NOT_FOUND] * 2

    run(broker.bootstrap, scenario)


def test_member_id_required_then_the_join_with_it_succeeds(broker: BrokerProcess) -> None:
    group = new_group("member-id")

    async def scenario(raw: Raw) -> None:
        first = await raw.send(join_request(group, version=4))
        assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
        assert first.member_id.startswith("group-bad-input-"), first.member_id
        assert first.generation_id == -1 and first.members == []
        joined = await raw.send(join_request(group, first.member_id, version=4))
        assert joined.error_code == ErrorCode.NONE, joined
        assert joined.member_id == joined.leader == first.member_id
        assert joined.generation_id == 1
        assert joined.protocol_name == "range"
        assert [(m.member_id, bytes(m.metadata)) for m in joined.members] == [
            (first.member_id, subscription(TOPIC))
        ]
        synced = await raw.send(sync_request(group, joined.member_id, 1))
        assert synced.error_code == ErrorCode.NONE
        assert bytes(synced.assignment) == assignment(TOPIC, list(range(PARTITIONS)))
        beat = await raw.send(heartbeat_request(group, joined.member_id, 1))
        assert beat.error_code == ErrorCode.NONE
        await left(raw, group, joined.member_id)
        # Before v4 there is no first round: a member without an id joins at once.
        old = await raw.send(join_request(new_group("member-id-v3"), version=3))
        assert old.error_code == ErrorCode.NONE and old.member_id and old.generation_id == 1

    run(broker.bootstrap, scenario)


def test_unknown_member_ids_are_refused(broker: BrokerProcess) -> None:
    group = new_group("unknown-member")

    async def scenario(raw: Raw) -> None:
        member_id, generation = await join_and_sync(raw, group)
        stranger = "nobody-" + uuid.uuid4().hex
        answer = await raw.send(sync_request(group, stranger, generation))
        assert answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        answer = await raw.send(heartbeat_request(group, stranger, generation))
        assert answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        answer = await raw.send(leave_request(group, stranger, version=4))
        assert answer.error_code == ErrorCode.NONE  # v3+: the code is per member
        assert [(m.member_id, m.error_code) for m in answer.members] == [
            (stranger, ErrorCode.UNKNOWN_MEMBER_ID)
        ]
        answer = await raw.send(leave_request(group, stranger, version=1))
        assert answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        answer = await raw.send(join_request(group, stranger))
        assert answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        codes = await commit(raw, group, stranger, generation, {(TOPIC, 0): (4, "stranger")})
        assert codes == {(TOPIC, 0): ErrorCode.UNKNOWN_MEMBER_ID}
        # Without member id and generation (an admin tool's commit): only to an empty group.
        codes = await commit(raw, group, "", -1, {(TOPIC, 0): (4, "no member")})
        assert codes == {(TOPIC, 0): ErrorCode.UNKNOWN_MEMBER_ID}
        # A group nobody created: the same answers.
        nowhere = new_group("no-such-group")
        answer = await raw.send(heartbeat_request(nowhere, stranger, 1))
        assert answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        answer = await raw.send(sync_request(nowhere, stranger, 1))
        assert answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        # The real member was not disturbed.
        answer = await raw.send(heartbeat_request(group, member_id, generation))
        assert answer.error_code == ErrorCode.NONE
        described = await describe(raw, group)
        assert described.group_state == "Stable"
        assert [m.member_id for m in described.members] == [member_id]
        assert await fetch(raw, group) == {}
        await left(raw, group, member_id)

    run(broker.bootstrap, scenario)


def test_a_stale_generation_is_refused(broker: BrokerProcess) -> None:
    group = new_group("generation")

    async def scenario(raw: Raw) -> None:
        member_id, generation = await join_and_sync(raw, group)
        codes = await commit(raw, group, member_id, generation, {(TOPIC, 2): (3, "gen 1")})
        assert codes == {(TOPIC, 2): ErrorCode.NONE}
        # The leader rejoins: a new generation.
        rejoined = await raw.send(join_request(group, member_id))
        assert rejoined.error_code == ErrorCode.NONE
        assert rejoined.generation_id == generation + 1
        answer = await raw.send(heartbeat_request(group, member_id, generation))
        assert answer.error_code == ErrorCode.ILLEGAL_GENERATION
        answer = await raw.send(sync_request(group, member_id, generation))
        assert answer.error_code == ErrorCode.ILLEGAL_GENERATION
        for stale in (generation, generation + 2):
            codes = await commit(raw, group, member_id, stale, {(TOPIC, 2): (9, "stale")})
            assert codes == {(TOPIC, 2): ErrorCode.ILLEGAL_GENERATION}
        current = rejoined.generation_id
        answer = await raw.send(sync_request(group, member_id, current))
        assert answer.error_code == ErrorCode.NONE
        answer = await raw.send(heartbeat_request(group, member_id, current))
        assert answer.error_code == ErrorCode.NONE
        codes = await commit(raw, group, member_id, current, {(TOPIC, 1): (6, "gen 2")})
        assert codes == {(TOPIC, 1): ErrorCode.NONE}
        assert await fetch(raw, group) == {(TOPIC, 2): (3, "gen 1"), (TOPIC, 1): (6, "gen 2")}
        await left(raw, group, member_id)

    run(broker.bootstrap, scenario)


def test_inconsistent_protocols_are_refused(broker: BrokerProcess) -> None:
    group = new_group("protocol")

    async def scenario(raw: Raw) -> None:
        member_id, generation = await join_and_sync(raw, group)
        other = await Raw.open(broker.bootstrap)
        try:
            refused = [
                join_request(group, version=3, protocol_type="connect"),
                join_request(group, version=3, protocols=[("no-such-assignor", b"")]),
                join_request(group, version=3, protocols=[]),
            ]
            for request in refused:
                answer = await other.send(request, client_id="intruder")
                assert answer.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL, request
        finally:
            await other.close()
        # SyncGroup v5 names the protocol type, which must match the group's.
        answer = await raw.send(sync_request(group, member_id, generation, protocol_type="connect"))
        assert answer.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        # A new group refuses an empty protocol type or no protocols at all.
        fresh = new_group("protocol-fresh")
        for request in (
            join_request(fresh, protocol_type=""),
            join_request(fresh, protocols=[]),
        ):
            answer = await raw.send(request)
            assert answer.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL, request
        # The member still belongs to an undisturbed, Stable group.
        answer = await raw.send(heartbeat_request(group, member_id, generation))
        assert answer.error_code == ErrorCode.NONE
        described = await describe(raw, group)
        assert (described.group_state, described.protocol_type) == ("Stable", "consumer")
        assert [m.member_id for m in described.members] == [member_id]
        await left(raw, group, member_id)

    run(broker.bootstrap, scenario)


def test_an_empty_group_id_is_invalid(broker: BrokerProcess) -> None:
    async def scenario(raw: Raw) -> None:
        answer = await raw.send(join_request(""))
        assert answer.error_code == ErrorCode.INVALID_GROUP_ID
        answer = await raw.send(sync_request("", "someone", 1))
        assert answer.error_code == ErrorCode.INVALID_GROUP_ID
        answer = await raw.send(heartbeat_request("", "someone", 1))
        assert answer.error_code == ErrorCode.INVALID_GROUP_ID
        answer = await raw.send(leave_request("", "someone", version=1))
        assert answer.error_code == ErrorCode.INVALID_GROUP_ID
        answer = await raw.send(leave_request("", "someone", version=4))
        assert answer.error_code == ErrorCode.INVALID_GROUP_ID
        assert "" not in await listed_groups(raw)

    run(broker.bootstrap, scenario)


def test_a_replaced_static_member_is_fenced(broker: BrokerProcess) -> None:
    """KIP-345: a JoinGroup with a known group.instance.id and no member id replaces the
    static member; its old member id is fenced from then on (FENCED_INSTANCE_ID)."""
    group = new_group("static")

    async def scenario(raw: Raw) -> None:
        # A static member joins without the MEMBER_ID_REQUIRED round.
        old = await raw.send(join_request(group, instance="static-1"))
        assert old.error_code == ErrorCode.NONE, old
        synced = await raw.send(
            sync_request(group, old.member_id, old.generation_id, instance="static-1")
        )
        assert synced.error_code == ErrorCode.NONE
        codes = await commit(
            raw, group, old.member_id, old.generation_id, {(TOPIC, 0): (1, "old")}, "static-1"
        )
        assert codes == {(TOPIC, 0): ErrorCode.NONE}
        # It restarts: a new incarnation takes the instance id over.
        new = await raw.send(join_request(group, instance="static-1"))
        assert new.error_code == ErrorCode.NONE, new
        assert new.member_id != old.member_id
        fenced = ErrorCode.FENCED_INSTANCE_ID
        generation = new.generation_id
        answer = await raw.send(heartbeat_request(group, old.member_id, generation, "static-1"))
        assert answer.error_code == fenced
        answer = await raw.send(sync_request(group, old.member_id, generation, instance="static-1"))
        assert answer.error_code == fenced
        answer = await raw.send(join_request(group, old.member_id, instance="static-1"))
        assert answer.error_code == fenced
        codes = await commit(
            raw, group, old.member_id, generation, {(TOPIC, 0): (9, "fenced")}, "static-1"
        )
        assert codes == {(TOPIC, 0): fenced}
        answer = await raw.send(leave_request(group, old.member_id, instance="static-1"))
        assert [m.error_code for m in answer.members] == [fenced]
        # The new incarnation is the member.
        answer = await raw.send(sync_request(group, new.member_id, generation, instance="static-1"))
        assert answer.error_code == ErrorCode.NONE
        answer = await raw.send(heartbeat_request(group, new.member_id, generation, "static-1"))
        assert answer.error_code == ErrorCode.NONE
        described = await describe(raw, group)
        assert [m.member_id for m in described.members] == [new.member_id]
        assert await fetch(raw, group) == {(TOPIC, 0): (1, "old")}
        answer = await raw.send(leave_request(group, new.member_id, instance="static-1"))
        assert [m.error_code for m in answer.members] == [ErrorCode.NONE]

    run(broker.bootstrap, scenario)


def test_a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_removed(
    broker: BrokerProcess,
) -> None:
    group = new_group("rejoin")
    rebalance_ms = 2000

    async def scenario(raw: Raw) -> None:
        first = await raw.send(join_request(group, rebalance_ms=rebalance_ms))
        assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
        a = await raw.send(join_request(group, first.member_id, rebalance_ms=rebalance_ms))
        assert a.error_code == ErrorCode.NONE
        answer = await raw.send(sync_request(group, a.member_id, a.generation_id))
        assert answer.error_code == ErrorCode.NONE
        other = await Raw.open(broker.bootstrap)
        try:
            second = await other.send(join_request(group, rebalance_ms=rebalance_ms), "late")
            assert second.error_code == ErrorCode.MEMBER_ID_REQUIRED
            joining = asyncio.ensure_future(
                other.send(join_request(group, second.member_id, rebalance_ms=rebalance_ms), "late")
            )
            # a is told to rejoin, keeps heartbeating, and never does.
            deadline = asyncio.get_running_loop().time() + REQUEST_TIMEOUT
            beat = ErrorCode.NONE
            while not joining.done():
                assert asyncio.get_running_loop().time() < deadline
                answer = await raw.send(heartbeat_request(group, a.member_id, a.generation_id))
                beat = max(beat, ErrorCode(answer.error_code))
                await asyncio.sleep(0.2)
            assert beat == ErrorCode.REBALANCE_IN_PROGRESS
            b = await joining
        finally:
            await other.close()
        assert b.error_code == ErrorCode.NONE, b
        assert b.generation_id == a.generation_id + 1
        assert b.leader == b.member_id
        assert [m.member_id for m in b.members] == [b.member_id]
        answer = await raw.send(heartbeat_request(group, a.member_id, a.generation_id))
        assert answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        codes = await commit(raw, group, a.member_id, a.generation_id, {(TOPIC, 1): (3, "a")})
        assert codes == {(TOPIC, 1): ErrorCode.UNKNOWN_MEMBER_ID}
        answer = await raw.send(sync_request(group, b.member_id, b.generation_id))
        assert answer.error_code == ErrorCode.NONE
        await left(raw, group, b.member_id)

    run(broker.bootstrap, scenario)


def test_a_static_member_that_misses_a_rebalance_stays_in_the_group(
    broker: BrokerProcess,
) -> None:
    """KIP-345: when the rebalance timeout ends the join phase, dynamic members that did not
    rejoin are removed, static ones are kept (only their session timeout removes them):
    the new generation's leader assigns partitions to them too, and they get that
    assignment when they come back."""
    group = new_group("static-late")
    rebalance_ms = 2000

    async def scenario(raw: Raw) -> None:
        a = await raw.send(join_request(group, rebalance_ms=rebalance_ms, instance="late-a"))
        assert a.error_code == ErrorCode.NONE, a
        answer = await raw.send(sync_request(group, a.member_id, 1, instance="late-a"))
        assert answer.error_code == ErrorCode.NONE
        other = await Raw.open(broker.bootstrap)
        try:
            first = await other.send(join_request(group, rebalance_ms=rebalance_ms), "b")
            assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
            b = await other.send(
                join_request(group, first.member_id, rebalance_ms=rebalance_ms), "b"
            )
            assert b.error_code == ErrorCode.NONE, b
            # a never rejoined: b leads the next generation, whose members include a.
            assert b.generation_id == 2
            assert b.leader == b.member_id
            assert sorted((m.member_id, m.group_instance_id) for m in b.members) == sorted(
                [(a.member_id, "late-a"), (b.member_id, None)]
            )
            answer = await raw.send(heartbeat_request(group, a.member_id, 1, "late-a"))
            assert answer.error_code == ErrorCode.ILLEGAL_GENERATION
            split = {a.member_id: [0], b.member_id: [1, 2]}
            request = sync_request(group, b.member_id, 2, assign=False)
            request.assignments = [
                SyncGroupRequest.SyncGroupRequestAssignment(
                    member_id=m, assignment=assignment(TOPIC, ps)
                )
                for m, ps in split.items()
            ]
            answer = await other.send(request, "b")
            assert answer.error_code == ErrorCode.NONE
            assert bytes(answer.assignment) == assignment(TOPIC, [1, 2])
            # a comes back with its member id: the current generation and its share.
            back = await raw.send(
                join_request(group, a.member_id, rebalance_ms=rebalance_ms, instance="late-a")
            )
            assert (back.error_code, back.generation_id) == (ErrorCode.NONE, 2), back
            answer = await raw.send(sync_request(group, a.member_id, 2, instance="late-a"))
            assert answer.error_code == ErrorCode.NONE
            assert bytes(answer.assignment) == assignment(TOPIC, [0])
        finally:
            await other.close()

    run(broker.bootstrap, scenario)


# Offsets ------------------------------------------------------------------------------------


def test_oversized_offset_metadata_is_refused_alone(broker: BrokerProcess) -> None:
    group = new_group("metadata")

    async def scenario(raw: Raw) -> None:
        member_id, generation = await join_and_sync(raw, group)
        first = {(TOPIC, 0): (5, "five"), (TOPIC, 1): (6, "six")}
        assert await commit(raw, group, member_id, generation, first) == dict.fromkeys(first, 0)
        mixed = {(TOPIC, 0): (9, "x" * (METADATA_MAX + 1)), (TOPIC, 1): (7, "y" * METADATA_MAX)}
        codes = await commit(raw, group, member_id, generation, mixed)
        assert codes == {
            (TOPIC, 0): ErrorCode.OFFSET_METADATA_TOO_LARGE,
            (TOPIC, 1): ErrorCode.NONE,  # exactly the limit is allowed
        }
        alone = {(TOPIC, 0): (8, "z" * 100_000)}
        codes = await commit(raw, group, member_id, generation, alone)
        assert codes == {(TOPIC, 0): ErrorCode.OFFSET_METADATA_TOO_LARGE}
        assert await fetch(raw, group) == {
            (TOPIC, 0): (5, "five"),
            (TOPIC, 1): (7, "y" * METADATA_MAX),
        }
        await left(raw, group, member_id)

    run(broker.bootstrap, scenario)


def test_commits_to_unknown_topics_or_partitions_are_refused_alone(broker: BrokerProcess) -> None:
    group = new_group("unknown-topic")

    async def scenario(raw: Raw) -> None:
        member_id, generation = await join_and_sync(raw, group)
        offsets = {
            ("no-such-topic", 0): (5, ""),
            (TOPIC, PARTITIONS): (1, "a partition too many"),
            (TOPIC, 2): (4, "fine"),
        }
        codes = await commit(raw, group, member_id, generation, offsets)
        assert codes == {
            ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            (TOPIC, PARTITIONS): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            (TOPIC, 2): ErrorCode.NONE,
        }
        assert await fetch(raw, group) == {(TOPIC, 2): (4, "fine")}
        await left(raw, group, member_id)

    run(broker.bootstrap, scenario)


def test_deleting_an_unknown_group_is_refused(broker: BrokerProcess) -> None:
    async def scenario(raw: Raw) -> None:
        unknown = new_group("never-existed")
        response = await raw.send(DeleteGroupsRequest(version=2, groups_names=[unknown]))
        assert [(r.group_id, r.error_code) for r in response.results] == [
            (unknown, ErrorCode.GROUP_ID_NOT_FOUND)
        ]
        # A group with a member is not deleted, nor its offsets.
        group = new_group("busy")
        member_id, generation = await join_and_sync(raw, group)
        await commit(raw, group, member_id, generation, {(TOPIC, 0): (2, "kept")})
        response = await raw.send(DeleteGroupsRequest(version=2, groups_names=[group]))
        assert [r.error_code for r in response.results] == [ErrorCode.NON_EMPTY_GROUP]
        assert await fetch(raw, group) == {(TOPIC, 0): (2, "kept")}
        await left(raw, group, member_id)

    run(broker.bootstrap, scenario)


# Afterwards ---------------------------------------------------------------------------------


def test_afterwards_only_valid_commits_are_stored_and_a_real_consumer_resumes(
    broker: BrokerProcess, clients: Clients
) -> None:
    """Runs last: every group the tests above used holds exactly the commits the broker
    accepted; a confluent-kafka consumer joins one of them and reads from its offsets."""

    async def scenario(raw: Raw) -> None:
        for group, valid in VALID.items():
            assert await fetch(raw, group) == valid, group
            described = await describe(raw, group)
            assert described.group_state == "Empty" and described.members == [], group

    run(broker.bootstrap, scenario)
    assert VALID, "no test committed anything"
    group = next(g for g in VALID if g.startswith("metadata-"))
    start = {p: VALID[group].get((TOPIC, p), (0, ""))[0] for p in range(PARTITIONS)}
    assert start == {0: 5, 1: 7, 2: 0}
    consumer = clients.consumer(
        broker.bootstrap,
        {"group.id": group, "auto.offset.reset": "earliest", "session.timeout.ms": 6000},
    )
    consumer.subscribe([TOPIC])
    want = sum(RECORDS - s for s in start.values())
    messages = Clients.consume(consumer, want, timeout=30)
    got = sorted((m.partition(), m.offset(), m.key().decode()) for m in messages)
    assert got == [(p, o, f"p{p}-{o}") for p in range(PARTITIONS) for o in range(start[p], RECORDS)]
    assert {tp.partition for tp in consumer.assignment()} == set(range(PARTITIONS))
