"""The classic group membership protocol (services/broker/groups/group.py), driven without
I/O: joins, syncs, heartbeats and leaves at chosen times, checked against Kafka's rules."""

from __future__ import annotations

import dataclasses
import itertools

from directlog.protocol.errors import ErrorCode
from services.broker.groups.group import (
    Group,
    GroupLimits,
    GroupState,
    JoinReply,
    JoinRequest,
    SyncReply,
)
from services.broker.groups.offsets_topic import GroupValue, MemberValue

SESSION = 10_000
REBALANCE = 30_000
DELAY = 3_000
RANGE = [("range", b"range-meta")]


def new_group(delay: int = DELAY) -> Group:
    counter = itertools.count(1)
    return Group(
        "g", 0, GroupLimits(initial_rebalance_delay_ms=delay), lambda p: f"{p}-{next(counter)}"
    )


def request(
    member_id: str = "",
    *,
    instance: str | None = None,
    protocols: list[tuple[str, bytes]] | None = None,
    protocol_type: str = "consumer",
    session: int = SESSION,
    known_id_required: bool = True,
) -> JoinRequest:
    return JoinRequest(
        member_id,
        instance,
        "client",
        "/127.0.0.1",
        session,
        REBALANCE,
        protocol_type,
        protocols if protocols is not None else RANGE,
        known_id_required,
    )


def join_new(group: Group, now: int, **kwargs: object) -> str:
    """The two-phase join of a new member: MEMBER_ID_REQUIRED, then the join that waits."""
    first = group.join(request(**kwargs), now)  # type: ignore[arg-type]
    assert isinstance(first, JoinReply) and first.error is ErrorCode.MEMBER_ID_REQUIRED
    waiting = group.join(request(first.member_id, **kwargs), now)  # type: ignore[arg-type]
    assert waiting == first.member_id
    return first.member_id


def replies(group: Group) -> dict[str, JoinReply | SyncReply]:
    return {r.member_id: r for r in group.take_replies()}


def stable_pair(group: Group) -> tuple[str, str]:
    """Two members through join and sync: a at t=0 (the leader), b at t=100."""
    a = join_new(group, 0)
    b = join_new(group, 100)
    assert group.state is GroupState.PREPARING_REBALANCE
    group.tick(DELAY + 99)
    assert group.take_replies() == []  # the new group waits DELAY after the last join
    group.tick(DELAY + 100)
    joined = replies(group)
    assert {joined[a].error, joined[b].error} == {ErrorCode.NONE}
    assert joined[a].generation == joined[b].generation == 1
    assert joined[a].leader == a and [m[0] for m in joined[a].members] == [a, b]
    assert joined[b].members == []
    assert group.sync(b, None, 1, "consumer", "range", DELAY + 200) is None
    assert group.sync(a, None, 1, "consumer", "range", DELAY + 200) is None
    group.assignment_stored(1, {a: b"A", b: b"B"}, ErrorCode.NONE, DELAY + 300)
    synced = replies(group)
    assert synced[a] == SyncReply(a, ErrorCode.NONE, "consumer", "range", b"A")
    assert synced[b] == SyncReply(b, ErrorCode.NONE, "consumer", "range", b"B")
    assert group.state is GroupState.STABLE
    return a, b


def test_two_members_form_a_generation_and_get_their_assignments() -> None:
    group = new_group()
    a, b = stable_pair(group)
    now = DELAY + 400
    assert group.heartbeat(a, None, 1, now) is ErrorCode.NONE
    assert group.heartbeat(b, None, 0, now) is ErrorCode.ILLEGAL_GENERATION
    assert group.heartbeat("nobody", None, 1, now) is ErrorCode.UNKNOWN_MEMBER_ID
    # A follower asking again in Stable gets its assignment at once.
    assert group.sync(b, None, 1, None, None, now) == SyncReply(
        b, ErrorCode.NONE, "consumer", "range", b"B"
    )


def test_a_silent_member_is_removed_and_the_rest_rebalance() -> None:
    group = new_group()
    a, b = stable_pair(group)
    t = DELAY + 300
    for step in range(1, 5):  # only a heartbeats
        assert group.heartbeat(a, None, 1, t + step * 3000) is ErrorCode.NONE
        group.tick(t + step * 3000)
    assert b not in group.members
    assert group.state is GroupState.PREPARING_REBALANCE
    now = t + 12_000
    assert group.heartbeat(a, None, 1, now) is ErrorCode.REBALANCE_IN_PROGRESS
    assert group.join(request(a), now) == a  # every remaining member rejoined: done at once
    joined = replies(group)
    assert joined[a].generation == 2 and [m[0] for m in joined[a].members] == [a]


def test_leaving_member_triggers_a_rebalance_and_the_last_one_empties_the_group() -> None:
    group = new_group()
    a, b = stable_pair(group)
    now = DELAY + 500
    results = group.leave([(b, None), ("ghost", None)], now)
    assert [r.error for r in results] == [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID]
    assert group.state is GroupState.PREPARING_REBALANCE
    group.leave([(a, None)], now)
    assert group.state is GroupState.EMPTY and group.generation == 2
    assert group.take_store() is True and group.take_store() is False
    assert group.to_value().members == []
    # Still a consumer group (Kafka lists it so), and one of another type may take it over.
    assert group.protocol_type == group.to_value().protocol_type == "consumer"
    assert group.protocol is None
    join_new(group, now, protocol_type="connect")
    assert group.protocol_type == "connect"


def test_a_member_that_does_not_rejoin_in_time_is_dropped() -> None:
    group = new_group()
    a, b = stable_pair(group)
    now = DELAY + 1000
    assert group.join(request(a, protocols=[("range", b"new")]), now) == a  # metadata changed
    assert group.state is GroupState.PREPARING_REBALANCE
    group.heartbeat(b, None, 1, now + REBALANCE - 1)
    group.tick(now + REBALANCE - 1)
    assert group.take_replies() == []
    group.tick(now + REBALANCE)
    joined = replies(group)
    assert joined[a].error is ErrorCode.NONE and joined[a].generation == 2
    assert list(group.members) == [a]


def test_a_follower_rejoining_a_stable_group_unchanged_does_not_rebalance() -> None:
    group = new_group()
    _, b = stable_pair(group)
    reply = group.join(request(b), DELAY + 500)
    assert isinstance(reply, JoinReply) and reply.generation == 1 and reply.error is ErrorCode.NONE
    assert group.state is GroupState.STABLE


def test_static_member_restart_keeps_its_assignment_and_fences_the_old_id() -> None:
    group = new_group()
    a = group.join(request(instance="i-a", known_id_required=False), 0)
    b = group.join(request(instance="i-b", known_id_required=False), 0)
    assert isinstance(a, str) and isinstance(b, str)
    group.tick(DELAY)
    group.take_replies()
    group.sync(a, "i-a", 1, None, None, DELAY)
    group.sync(b, "i-b", 1, None, None, DELAY)
    group.assignment_stored(1, {a: b"A", b: b"B"}, ErrorCode.NONE, DELAY)
    group.take_replies()
    restarted = group.join(request(instance="i-b"), DELAY + 100)
    assert isinstance(restarted, JoinReply) and restarted.error is ErrorCode.NONE
    new_b = restarted.member_id
    assert new_b != b and restarted.generation == 1 and group.state is GroupState.STABLE
    assert group.sync(new_b, "i-b", 1, None, None, DELAY + 150) == SyncReply(
        new_b, ErrorCode.NONE, "consumer", "range", b"B"
    )
    assert group.heartbeat(b, "i-b", 1, DELAY + 200) is ErrorCode.FENCED_INSTANCE_ID
    assert group.leave([(b, "i-b")], DELAY + 200)[0].error is ErrorCode.FENCED_INSTANCE_ID


def stable_static_pair(group: Group) -> tuple[str, str]:
    """Static members i-a (the leader, assigned b"A") and i-b (b"B"), stable in generation 1."""
    a = group.join(request(instance="i-a", known_id_required=False), 0)
    b = group.join(request(instance="i-b", known_id_required=False), 0)
    assert isinstance(a, str) and isinstance(b, str)
    group.tick(DELAY)
    assert replies(group)[a].leader == a
    group.sync(a, "i-a", 1, None, None, DELAY)
    group.sync(b, "i-b", 1, None, None, DELAY)
    group.assignment_stored(1, {a: b"A", b: b"B"}, ErrorCode.NONE, DELAY)
    group.take_replies()
    assert group.take_store() is False
    return a, b


def test_a_static_leader_restarting_skips_the_assignment() -> None:
    """KIP-814 (JoinGroup v9+): the restarted leader is told it leads, with every member's
    metadata to watch, and that it must not assign; nothing rebalances and the new member id
    is stored with the assignments as they are."""
    group = new_group()
    a, b = stable_static_pair(group)
    again = dataclasses.replace(request(instance="i-a"), can_skip_assignment=True)
    reply = group.join(again, DELAY + 100)
    assert isinstance(reply, JoinReply) and reply.error is ErrorCode.NONE
    new_a = reply.member_id
    assert new_a != a and reply.leader == new_a and reply.skip_assignment
    assert reply.generation == 1 and [m[:2] for m in reply.members] == [(b, "i-b"), (new_a, "i-a")]
    assert group.state is GroupState.STABLE and group.take_store() is True
    assert {m.member_id: m.assignment for m in group.to_value().members} == {b: b"B", new_a: b"A"}
    # Its SyncGroup (no assignments: it skipped them) gets its old assignment back.
    assert group.sync(new_a, "i-a", 1, None, None, DELAY + 150) == SyncReply(
        new_a, ErrorCode.NONE, "consumer", "range", b"A"
    )
    assert group.heartbeat(b, "i-b", 1, DELAY + 200) is ErrorCode.NONE
    assert group.heartbeat(a, "i-a", 1, DELAY + 200) is ErrorCode.FENCED_INSTANCE_ID


def test_a_static_leader_on_an_older_join_group_is_told_the_old_id_leads() -> None:
    """Before JoinGroup v9 a client cannot skip assigning, so the answer names the old
    member id as leader: the restarted leader acts as a follower and the group stays."""
    group = new_group()
    a, _ = stable_static_pair(group)
    reply = group.join(request(instance="i-a"), DELAY + 100)
    assert isinstance(reply, JoinReply) and reply.error is ErrorCode.NONE
    assert reply.leader == a != reply.member_id and reply.members == []
    assert not reply.skip_assignment and group.state is GroupState.STABLE
    assert group.leader == reply.member_id  # the group itself knows its leader's new id
    assert group.sync(reply.member_id, "i-a", 1, None, None, DELAY + 150) == SyncReply(
        reply.member_id, ErrorCode.NONE, "consumer", "range", b"A"
    )


def test_a_static_member_restarting_with_another_protocol_rebalances() -> None:
    group = new_group()
    stable_static_pair(group)
    both = [("roundrobin", b"rr"), ("range", b"r")]
    # a now prefers roundrobin, b still only range: range stays chosen, no rebalance.
    kept = group.join(request(instance="i-a", protocols=both), DELAY + 100)
    assert isinstance(kept, JoinReply) and group.state is GroupState.STABLE
    # b restarted preferring roundrobin too: the choice changes, so the group rebalances.
    moved = group.join(request(instance="i-b", protocols=both), DELAY + 200)
    assert isinstance(moved, str) and group.state is GroupState.PREPARING_REBALANCE


def test_protocol_choice_and_inconsistent_protocols() -> None:
    group = new_group(delay=0)
    both = [("range", b"r"), ("roundrobin", b"rr")]
    a = join_new(group, 0, protocols=both)
    bad = group.join(request(protocols=[("sticky", b"s")]), 0)
    assert isinstance(bad, JoinReply) and bad.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    other_type = group.join(request(protocol_type="connect"), 0)
    assert isinstance(other_type, JoinReply)
    assert other_type.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    b = join_new(group, 0, protocols=[("roundrobin", b"rr2"), ("range", b"r2")])
    c = join_new(group, 0, protocols=[("roundrobin", b"rr3")])
    group.tick(1)
    joined = replies(group)
    assert {joined[m].protocol for m in (a, b, c)} == {"roundrobin"}
    assert dict((m, meta) for m, _, meta in joined[a].members) == {a: b"rr", b: b"rr2", c: b"rr3"}


def test_session_timeout_bounds() -> None:
    group = new_group()
    reply = group.join(request(session=100), 0)
    assert isinstance(reply, JoinReply) and reply.error is ErrorCode.INVALID_SESSION_TIMEOUT


def test_sync_errors() -> None:
    group = new_group()
    a, b = stable_pair(group)
    now = DELAY + 500
    assert group.sync("x", None, 1, None, None, now).error is ErrorCode.UNKNOWN_MEMBER_ID  # type: ignore[union-attr]
    assert group.sync(a, None, 7, None, None, now).error is ErrorCode.ILLEGAL_GENERATION  # type: ignore[union-attr]
    assert (
        group.sync(a, None, 1, "connect", None, now).error  # type: ignore[union-attr]
        is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    )
    group.join(request(a, protocols=[("range", b"changed")]), now)
    assert group.sync(b, None, 1, None, None, now).error is ErrorCode.REBALANCE_IN_PROGRESS  # type: ignore[union-attr]


def test_a_failed_store_fails_the_syncs_and_rebalances() -> None:
    group = new_group(delay=0)
    a = join_new(group, 0)
    group.tick(1)
    group.take_replies()
    assert group.sync(a, None, 1, None, None, 2) is None
    group.assignment_stored(1, {a: b"A"}, ErrorCode.COORDINATOR_NOT_AVAILABLE, 3)
    assert replies(group)[a] == SyncReply(a, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    assert group.state is GroupState.PREPARING_REBALANCE
    assert all(m.assignment == b"" for m in group.members.values())


def test_who_may_commit() -> None:
    group = new_group()
    assert group.validate_commit("", None, -1, 0) is ErrorCode.NONE  # no members: anyone
    a, b = stable_pair(group)
    now = DELAY + 500
    assert group.validate_commit(a, None, 1, now) is ErrorCode.NONE
    assert group.validate_commit(a, None, 0, now) is ErrorCode.ILLEGAL_GENERATION
    assert group.validate_commit("x", None, 1, now) is ErrorCode.UNKNOWN_MEMBER_ID
    assert group.validate_commit("", None, -1, now) is ErrorCode.UNKNOWN_MEMBER_ID
    group.join(request(a, protocols=[("range", b"changed")]), now)
    assert group.validate_commit(b, None, 1, now) is ErrorCode.NONE  # preparing: still valid
    group.join(request(b), now)
    assert group.state is GroupState.COMPLETING_REBALANCE
    assert group.validate_commit(b, None, 2, now) is ErrorCode.REBALANCE_IN_PROGRESS


def test_a_loaded_group_is_stable_with_its_members() -> None:
    group = new_group()
    group.load(
        GroupValue(
            "consumer",
            4,
            "range",
            "m1",
            123,
            [MemberValue("m1", "i1", "c", "/h", REBALANCE, SESSION, b"sub", b"asg")],
        ),
        1000,
    )
    assert group.state is GroupState.STABLE and group.generation == 4
    assert group.heartbeat("m1", "i1", 4, 2000) is ErrorCode.NONE
    assert group.sync("m1", "i1", 4, None, None, 2000) == SyncReply(
        "m1", ErrorCode.NONE, "consumer", "range", b"asg"
    )
    group.tick(2000 + SESSION - 1)
    assert group.state is GroupState.STABLE
    group.tick(2000 + SESSION)  # its last member went silent: a new, empty generation
    assert group.state is GroupState.EMPTY and group.generation == 5
    assert group.take_store() is True
