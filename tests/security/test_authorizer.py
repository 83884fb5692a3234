"""The broker's authorizer decides as Kafka's StandardAuthorizer does: per resource type and
operation, DENY over ALLOW, literal, wildcard and prefixed patterns, wildcard principals and
hosts, implied DESCRIBE and DESCRIBE_CONFIGS, super users, allow.everyone.if.no.acl.found,
authorizeByResourceType and KIP-430's authorized operations; and its index agrees with a
plain scan over every ACL on random ACL sets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.security.acl import (
    CLUSTER_NAME,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    operations_for,
)
from services.broker.authorizer import Authorizer

ALICE = "User:alice"
BOB = "User:bob"
HOST = "10.0.0.1"
OTHER_HOST = "10.0.0.2"

ALLOW = Permission.ALLOW
DENY = Permission.DENY
TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
LITERAL = PatternType.LITERAL
PREFIXED = PatternType.PREFIXED


def acl(
    operation: Operation,
    permission: Permission = ALLOW,
    *,
    resource_type: ResourceType = TOPIC,
    name: str = "orders",
    pattern: PatternType = LITERAL,
    principal: str = ALICE,
    host: str = WILDCARD,
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def authorizer(*bindings: AclBinding, **options: object) -> Authorizer:
    made = Authorizer(**options)  # type: ignore[arg-type]
    made.update(bindings)
    return made


def name_of(resource_type: ResourceType) -> str:
    return CLUSTER_NAME if resource_type == ResourceType.CLUSTER else "r1"


EVERY_ACTION = [
    (resource_type, operation)
    for resource_type in ResourceType
    if resource_type not in (ResourceType.ANY, ResourceType.UNKNOWN)
    for operation in sorted(operations_for(resource_type))
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("resource_type", "operation"), EVERY_ACTION)
def test_each_resource_type_and_operation(
    resource_type: ResourceType, operation: Operation
) -> None:
    name = name_of(resource_type)
    allowed = authorizer(acl(operation, resource_type=resource_type, name=name))
    assert allowed.authorize(ALICE, HOST, operation, resource_type, name)
    assert not allowed.authorize(BOB, HOST, operation, resource_type, name)
    other_types = {t for t, _ in EVERY_ACTION if t != resource_type}
    assert not any(allowed.authorize(ALICE, HOST, operation, t, name) for t in other_types)
    implied = {implied for implied, by in IMPLIED if by == operation}
    assert allowed.authorized_operations(ALICE, HOST, resource_type, name) == (
        {operation} | implied
    ) & operations_for(resource_type)

    denied = authorizer(
        acl(Operation.ALL, resource_type=resource_type, name=name),
        acl(operation, DENY, resource_type=resource_type, name=name),
    )
    assert not denied.authorize(ALICE, HOST, operation, resource_type, name)
    assert (operations_for(resource_type) - {operation}) == denied.authorized_operations(
        ALICE, HOST, resource_type, name
    )


@pytest.mark.timeout(10)
def test_deny_beats_allow_across_patterns_principals_and_hosts() -> None:
    rules = authorizer(
        acl(Operation.ALL, name=WILDCARD, principal=WILDCARD_PRINCIPAL),
        acl(Operation.READ, name="ord", pattern=PREFIXED),
        acl(Operation.READ, DENY, name="orders", host=OTHER_HOST),
    )
    assert rules.authorize(ALICE, HOST, Operation.READ, TOPIC, "orders")
    assert not rules.authorize(ALICE, OTHER_HOST, Operation.READ, TOPIC, "orders")
    assert rules.authorize(ALICE, OTHER_HOST, Operation.WRITE, TOPIC, "orders")
    assert rules.authorize(BOB, OTHER_HOST, Operation.READ, TOPIC, "orders")

    everyone_denied = authorizer(
        acl(Operation.READ), acl(Operation.ALL, DENY, principal=WILDCARD_PRINCIPAL)
    )
    assert not everyone_denied.authorize(ALICE, HOST, Operation.READ, TOPIC, "orders")
    assert not everyone_denied.authorize(ALICE, HOST, Operation.DESCRIBE, TOPIC, "orders")

    prefix_denied = authorizer(
        acl(Operation.WRITE), acl(Operation.WRITE, DENY, name="o", pattern=PREFIXED)
    )
    assert not prefix_denied.authorize(ALICE, HOST, Operation.WRITE, TOPIC, "orders")


@pytest.mark.timeout(10)
def test_prefixed_patterns() -> None:
    rules = authorizer(
        acl(Operation.READ, name="orders.", pattern=PREFIXED),
        acl(Operation.WRITE, name="orders.eu.", pattern=PREFIXED),
        acl(Operation.READ, resource_type=GROUP, name="*", pattern=PREFIXED),
    )
    assert rules.authorize(ALICE, HOST, Operation.READ, TOPIC, "orders.eu.west")
    assert rules.authorize(ALICE, HOST, Operation.READ, TOPIC, "orders.")  # the prefix itself
    assert not rules.authorize(ALICE, HOST, Operation.READ, TOPIC, "orders")
    assert not rules.authorize(ALICE, HOST, Operation.READ, TOPIC, "xorders.eu")
    assert rules.authorize(ALICE, HOST, Operation.WRITE, TOPIC, "orders.eu.west")
    assert not rules.authorize(ALICE, HOST, Operation.WRITE, TOPIC, "orders.us.east")
    # A prefixed "*" is the one-character prefix "*", not a wildcard.
    assert rules.authorize(ALICE, HOST, Operation.READ, GROUP, "*consumers")
    assert not rules.authorize(ALICE, HOST, Operation.READ, GROUP, "consumers")


@pytest.mark.timeout(10)
def test_wildcard_name_principal_and_host() -> None:
    rules = authorizer(
        acl(Operation.READ, name=WILDCARD),
        acl(Operation.WRITE, principal=WILDCARD_PRINCIPAL),
        acl(Operation.CREATE, host=HOST),
    )
    assert rules.authorize(ALICE, OTHER_HOST, Operation.READ, TOPIC, "anything")
    assert not rules.authorize(BOB, OTHER_HOST, Operation.READ, TOPIC, "anything")
    assert rules.authorize(BOB, OTHER_HOST, Operation.WRITE, TOPIC, "orders")
    # "User:*" speaks for principals of every type.
    assert rules.authorize("Group:ops", OTHER_HOST, Operation.WRITE, TOPIC, "orders")
    assert not rules.authorize(BOB, OTHER_HOST, Operation.WRITE, TOPIC, "payments")
    assert rules.authorize(ALICE, HOST, Operation.CREATE, TOPIC, "orders")
    assert not rules.authorize(ALICE, OTHER_HOST, Operation.CREATE, TOPIC, "orders")
    # A literal "*" topic name matches the wildcard and its own literal ACLs alike.
    assert rules.authorize(ALICE, OTHER_HOST, Operation.READ, TOPIC, WILDCARD)


@pytest.mark.timeout(10)
def test_principals_of_other_types_match_as_strings() -> None:
    rules = authorizer(acl(Operation.READ, principal="Group:ops"))
    assert rules.authorize("Group:ops", HOST, Operation.READ, TOPIC, "orders")
    assert not rules.authorize("User:ops", HOST, Operation.READ, TOPIC, "orders")
    assert not rules.authorize("Group:ops2", HOST, Operation.READ, TOPIC, "orders")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("granted", "implied"),
    [
        (Operation.READ, {Operation.READ, Operation.DESCRIBE}),
        (Operation.WRITE, {Operation.WRITE, Operation.DESCRIBE}),
        (Operation.DELETE, {Operation.DELETE, Operation.DESCRIBE}),
        (Operation.ALTER, {Operation.ALTER, Operation.DESCRIBE}),
        (Operation.ALTER_CONFIGS, {Operation.ALTER_CONFIGS, Operation.DESCRIBE_CONFIGS}),
        (Operation.CREATE, {Operation.CREATE}),
        (Operation.DESCRIBE, {Operation.DESCRIBE}),
        (Operation.DESCRIBE_CONFIGS, {Operation.DESCRIBE_CONFIGS}),
        (Operation.ALL, operations_for(TOPIC)),
    ],
)
def test_implied_operations(granted: Operation, implied: set[Operation]) -> None:
    rules = authorizer(acl(granted))
    assert rules.authorized_operations(ALICE, HOST, TOPIC, "orders") == implied


@pytest.mark.timeout(10)
def test_a_deny_implies_nothing() -> None:
    rules = authorizer(
        acl(Operation.DESCRIBE),
        acl(Operation.DESCRIBE_CONFIGS),
        acl(Operation.READ, DENY),
        acl(Operation.ALTER_CONFIGS, DENY),
    )
    assert rules.authorize(ALICE, HOST, Operation.DESCRIBE, TOPIC, "orders")
    assert rules.authorize(ALICE, HOST, Operation.DESCRIBE_CONFIGS, TOPIC, "orders")
    denied_describe = authorizer(acl(Operation.READ), acl(Operation.DESCRIBE, DENY))
    assert not denied_describe.authorize(ALICE, HOST, Operation.DESCRIBE, TOPIC, "orders")
    assert denied_describe.authorize(ALICE, HOST, Operation.READ, TOPIC, "orders")


@pytest.mark.timeout(10)
def test_super_users_may_do_anything() -> None:
    rules = authorizer(
        acl(Operation.ALL, DENY, name=WILDCARD, principal=WILDCARD_PRINCIPAL),
        super_users=["User:admin"],
    )
    assert rules.authorize("User:admin", HOST, Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME)
    assert rules.authorize_by_type("User:admin", HOST, Operation.WRITE, TOPIC)
    assert rules.authorized_operations("User:admin", HOST, GROUP, "g") == operations_for(GROUP)
    assert not rules.authorize(ALICE, HOST, Operation.READ, TOPIC, "orders")
    # Super users are matched on the whole principal, type included.
    assert not rules.authorize("Group:admin", HOST, Operation.READ, TOPIC, "orders")


@pytest.mark.timeout(10)
@pytest.mark.parametrize("allow_everyone", [False, True])
def test_allow_everyone_if_no_acl_found(allow_everyone: bool) -> None:
    options = {"allow_everyone_if_no_acl_found": allow_everyone}
    empty = authorizer(**options)
    assert empty.authorize(ALICE, HOST, Operation.WRITE, TOPIC, "orders") is allow_everyone

    rules = authorizer(
        acl(Operation.READ, principal=BOB),
        acl(Operation.READ, resource_type=GROUP, name="app.", pattern=PREFIXED, principal=BOB),
        **options,
    )
    # Some ACL names the resource: only the ACLs decide, for everybody.
    assert not rules.authorize(ALICE, HOST, Operation.READ, TOPIC, "orders")
    assert not rules.authorize(BOB, HOST, Operation.WRITE, TOPIC, "orders")
    assert not rules.authorize(ALICE, HOST, Operation.READ, GROUP, "app.one")
    # No ACL names these: the setting decides.
    assert rules.authorize(ALICE, HOST, Operation.READ, TOPIC, "payments") is allow_everyone
    assert rules.authorize(ALICE, HOST, Operation.READ, GROUP, "app") is allow_everyone
    assert rules.authorize(BOB, HOST, Operation.READ, GROUP, "other") is allow_everyone


@pytest.mark.timeout(10)
def test_update_replaces_the_whole_set_and_forgets_decisions() -> None:
    rules = authorizer(acl(Operation.READ))
    assert rules.authorize(ALICE, HOST, Operation.READ, TOPIC, "orders")
    assert rules.authorize_by_type(ALICE, HOST, Operation.READ, TOPIC)
    assert rules.bindings == {acl(Operation.READ)}

    rules.update([acl(Operation.WRITE, principal=BOB)])
    assert not rules.authorize(ALICE, HOST, Operation.READ, TOPIC, "orders")
    assert not rules.authorize_by_type(ALICE, HOST, Operation.READ, TOPIC)
    assert rules.authorize(BOB, HOST, Operation.WRITE, TOPIC, "orders")
    assert rules.bindings == {acl(Operation.WRITE, principal=BOB)}

    rules.update([])
    assert rules.bindings == frozenset()
    assert not rules.authorize(BOB, HOST, Operation.WRITE, TOPIC, "orders")


@pytest.mark.timeout(10)
def test_update_refuses_filter_patterns() -> None:
    rules = authorizer(acl(Operation.READ))
    with pytest.raises(ValueError, match="not a stored ACL"):
        rules.update([acl(Operation.READ, pattern=PatternType.MATCH)])
    assert rules.bindings == {acl(Operation.READ)}
    assert rules.authorize(ALICE, HOST, Operation.READ, TOPIC, "orders")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("operation", "resource_type"),
    [(Operation.ANY, TOPIC), (Operation.UNKNOWN, TOPIC), (Operation.READ, ResourceType.ANY)],
)
def test_filter_values_are_not_actions(operation: Operation, resource_type: ResourceType) -> None:
    rules = authorizer()
    with pytest.raises(ValueError, match="cannot authorize"):
        rules.authorize(ALICE, HOST, operation, resource_type, "orders")
    with pytest.raises(ValueError, match="cannot authorize"):
        rules.authorize_by_type(ALICE, HOST, operation, resource_type)


@pytest.mark.timeout(10)
def test_authorize_by_type() -> None:
    write = Operation.WRITE
    assert not authorizer().authorize_by_type(ALICE, HOST, write, TOPIC)
    assert authorizer(allow_everyone_if_no_acl_found=True).authorize_by_type(
        ALICE, HOST, write, TOPIC
    )
    some_topic = authorizer(acl(write, name="t1"))
    assert some_topic.authorize_by_type(ALICE, HOST, write, TOPIC)
    assert not some_topic.authorize_by_type(BOB, HOST, write, TOPIC)
    assert not some_topic.authorize_by_type(ALICE, HOST, Operation.READ, TOPIC)
    assert not some_topic.authorize_by_type(ALICE, HOST, write, GROUP)
    # Outside the wildcard, an operation counts only as itself or ALL: READ is no DESCRIBE.
    assert not authorizer(acl(Operation.READ)).authorize_by_type(
        ALICE, HOST, Operation.DESCRIBE, TOPIC
    )
    assert authorizer(acl(Operation.ALL)).authorize_by_type(ALICE, HOST, write, TOPIC)
    assert authorizer(acl(Operation.READ, name=WILDCARD)).authorize_by_type(
        ALICE, HOST, Operation.DESCRIBE, TOPIC
    )
    # A DENY covering every allowed resource takes it away ...
    assert not authorizer(acl(write, name="t1"), acl(write, DENY, name="t1")).authorize_by_type(
        ALICE, HOST, write, TOPIC
    )
    assert not authorizer(
        acl(write, name="t1"), acl(write, DENY, name="t", pattern=PREFIXED)
    ).authorize_by_type(ALICE, HOST, write, TOPIC)
    assert not authorizer(
        acl(write, name="t1.", pattern=PREFIXED), acl(write, DENY, name="t", pattern=PREFIXED)
    ).authorize_by_type(ALICE, HOST, write, TOPIC)
    assert not authorizer(
        acl(write, name="t1"), acl(write, DENY, name=WILDCARD, principal=WILDCARD_PRINCIPAL)
    ).authorize_by_type(ALICE, HOST, write, TOPIC)
    # ... one that does not cover it leaves it: a literal DENY stops no prefix, a longer
    # denied prefix no shorter allowed one, a DENY from another host nothing here.
    assert authorizer(
        acl(write, name="t", pattern=PREFIXED), acl(write, DENY, name="t")
    ).authorize_by_type(ALICE, HOST, write, TOPIC)
    assert authorizer(
        acl(write, name="t", pattern=PREFIXED), acl(write, DENY, name="t1", pattern=PREFIXED)
    ).authorize_by_type(ALICE, HOST, write, TOPIC)
    assert authorizer(
        acl(write, name="t1"), acl(write, DENY, name="t1", host=OTHER_HOST)
    ).authorize_by_type(ALICE, HOST, write, TOPIC)
    assert authorizer(
        acl(write, name="t1"), acl(write, name="t2"), acl(write, DENY, name="t1")
    ).authorize_by_type(ALICE, HOST, write, TOPIC)
    # An ACL on some topic does not switch allow.everyone off for the type.
    assert authorizer(
        acl(Operation.READ, principal=BOB), allow_everyone_if_no_acl_found=True
    ).authorize_by_type(ALICE, HOST, write, TOPIC)
    # A wildcard ACL for somebody else does: no topic is then free of ACLs for sure.
    assert not authorizer(
        acl(Operation.READ, name=WILDCARD, principal=BOB), allow_everyone_if_no_acl_found=True
    ).authorize_by_type(ALICE, HOST, write, TOPIC)


@pytest.mark.timeout(10)
def test_authorized_operations_per_resource() -> None:
    rules = authorizer(
        acl(Operation.READ),
        acl(Operation.WRITE, name="ord", pattern=PREFIXED),
        acl(Operation.DESCRIBE_CONFIGS, name=WILDCARD, principal=WILDCARD_PRINCIPAL),
        acl(
            Operation.IDEMPOTENT_WRITE,
            resource_type=ResourceType.CLUSTER,
            name=CLUSTER_NAME,
        ),
    )
    assert rules.authorized_operations(ALICE, HOST, TOPIC, "orders") == {
        Operation.READ,
        Operation.WRITE,
        Operation.DESCRIBE,
        Operation.DESCRIBE_CONFIGS,
    }
    assert rules.authorized_operations(BOB, HOST, TOPIC, "orders") == {Operation.DESCRIBE_CONFIGS}
    assert rules.authorized_operations(ALICE, HOST, ResourceType.CLUSTER, CLUSTER_NAME) == {
        Operation.IDEMPOTENT_WRITE
    }
    assert rules.authorized_operations(ALICE, HOST, GROUP, "g") == frozenset()


@pytest.mark.timeout(10)
def test_describe_returns_the_selected_acls_in_order() -> None:
    stored = [
        acl(Operation.WRITE, principal=BOB),
        acl(Operation.READ, name="ord", pattern=PREFIXED),
        acl(Operation.READ, resource_type=GROUP, name="g"),
        acl(Operation.READ, name=WILDCARD),
    ]
    rules = authorizer(*stored)
    everything = AclBindingFilter(
        ResourceType.ANY, None, PatternType.ANY, None, None, Operation.ANY, Permission.ANY
    )
    assert rules.describe(everything) == sorted(stored)
    applying = AclBindingFilter(
        TOPIC, "orders", PatternType.MATCH, ALICE, None, Operation.ANY, Permission.ANY
    )
    assert rules.describe(applying) == [
        acl(Operation.READ, name=WILDCARD),
        acl(Operation.READ, name="ord", pattern=PREFIXED),
    ]


# --- the index against a plain scan ----------------------------------------------------

IMPLIED = {
    (Operation.DESCRIBE, Operation.READ),
    (Operation.DESCRIBE, Operation.WRITE),
    (Operation.DESCRIBE, Operation.DELETE),
    (Operation.DESCRIBE, Operation.ALTER),
    (Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS),
}
# Names are drawn from "ab*", so this one is mentioned by no ACL and prefixed by none.
UNMENTIONED = "\x00"


def applies(binding: AclBinding, resource_type: ResourceType, name: str) -> bool:
    if binding.resource_type != resource_type:
        return False
    if binding.pattern_type == LITERAL:
        return binding.resource_name in (name, WILDCARD)
    return name.startswith(binding.resource_name)


def speaks(binding: AclBinding, principal: str, host: str, operation: Operation) -> bool:
    if binding.principal not in (principal, WILDCARD_PRINCIPAL):
        return False
    if binding.host not in (host, WILDCARD):
        return False
    if binding.operation in (operation, Operation.ALL):
        return True
    return binding.permission == ALLOW and (operation, binding.operation) in IMPLIED


def reference_authorize(
    bindings: list[AclBinding],
    super_users: set[str],
    allow_everyone: bool,
    principal: str,
    host: str,
    operation: Operation,
    resource_type: ResourceType,
    name: str,
) -> bool:
    if principal in super_users:
        return True
    applicable = [b for b in bindings if applies(b, resource_type, name)]
    if not applicable:
        return allow_everyone
    speaking = [b for b in applicable if speaks(b, principal, host, operation)]
    if any(b.permission == DENY for b in speaking):
        return False
    return any(b.permission == ALLOW for b in speaking)


def reference_authorize_by_type(
    bindings: list[AclBinding],
    super_users: set[str],
    allow_everyone: bool,
    principal: str,
    host: str,
    operation: Operation,
    resource_type: ResourceType,
) -> bool:
    """Kafka's default authorizeByResourceType, with a resource name no ACL mentions."""
    if reference_authorize(
        bindings,
        super_users,
        allow_everyone,
        principal,
        host,
        operation,
        resource_type,
        UNMENTIONED,
    ):
        return True
    wildcard_allowed = False
    deny_literal: set[str] = set()
    deny_prefixed: set[str] = set()
    allow_literal: set[str] = set()
    allow_prefixed: set[str] = set()
    for b in bindings:
        if b.resource_type != resource_type:
            continue
        if b.host not in (host, WILDCARD) or b.principal not in (principal, WILDCARD_PRINCIPAL):
            continue
        if b.operation not in (operation, Operation.ALL):
            continue
        if b.permission == DENY:
            if b.pattern_type == LITERAL and b.resource_name == WILDCARD:
                return False
            (deny_literal if b.pattern_type == LITERAL else deny_prefixed).add(b.resource_name)
        elif b.pattern_type == LITERAL and b.resource_name == WILDCARD:
            wildcard_allowed = True
        else:
            (allow_literal if b.pattern_type == LITERAL else allow_prefixed).add(b.resource_name)
    if wildcard_allowed:
        return True
    for kind, names in ((LITERAL, allow_literal), (PREFIXED, allow_prefixed)):
        for allowed in names:
            if kind == LITERAL and allowed in deny_literal:
                continue
            if not any(allowed[:i] in deny_prefixed for i in range(1, len(allowed) + 1)):
                return True
    return False


PRINCIPALS = [ALICE, BOB, "Group:ops", "User:root"]
HOSTS = [HOST, OTHER_HOST]
# Few operations, so that random ACLs and questions meet often; DESCRIBE and
# DESCRIBE_CONFIGS are asked and never granted directly, only through what implies them.
GRANTED = [
    Operation.ALL,
    Operation.READ,
    Operation.WRITE,
    Operation.ALTER,
    Operation.ALTER_CONFIGS,
    Operation.CREATE,
]
ASKED = [*GRANTED[1:], Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS]
names = st.text(alphabet="ab*", min_size=1, max_size=3)
random_bindings = st.builds(
    AclBinding,
    resource_type=st.sampled_from([TOPIC, GROUP]),
    resource_name=st.one_of(st.just(WILDCARD), names),
    pattern_type=st.sampled_from([LITERAL, PREFIXED]),
    principal=st.sampled_from([*PRINCIPALS[:3], WILDCARD_PRINCIPAL]),
    host=st.sampled_from([*HOSTS, WILDCARD]),
    operation=st.sampled_from(GRANTED),
    permission=st.sampled_from([ALLOW, DENY]),
)


@st.composite
def questions(
    draw: st.DrawFn, bindings: list[AclBinding]
) -> tuple[str, str, Operation, ResourceType, str]:
    """A question, most often one that some ACL speaks to: its principal (or anybody for
    "User:*"), its host (or any for "*"), its operation (or one it implies, or any for
    ALL), its name (extended, for a prefix; any, for the wildcard). Other ACLs may then
    speak too, or deny."""
    about = draw(st.sampled_from(bindings))
    if draw(st.integers(0, 9)) < 3:
        return (
            draw(st.sampled_from(PRINCIPALS)),
            draw(st.sampled_from(HOSTS)),
            draw(st.sampled_from(ASKED)),
            about.resource_type,
            draw(names),
        )
    principal = about.principal
    if principal == WILDCARD_PRINCIPAL:
        principal = draw(st.sampled_from(PRINCIPALS))
    host = about.host if about.host != WILDCARD else draw(st.sampled_from(HOSTS))
    implied = [asked for asked, by in IMPLIED if by == about.operation]
    operation = draw(
        st.sampled_from(ASKED if about.operation == Operation.ALL else [about.operation, *implied])
    )
    name = about.resource_name
    if about.pattern_type == PREFIXED:
        name += draw(st.text(alphabet="ab*", max_size=2))
    elif name == WILDCARD:
        name = draw(names)
    return principal, host, operation, about.resource_type, name


@pytest.mark.timeout(120)
@given(
    data=st.data(),
    bindings=st.lists(random_bindings, min_size=1, max_size=20),
    super_users=st.sampled_from([set(), {"User:root"}]),
    allow_everyone=st.booleans(),
)
def test_the_index_agrees_with_a_plain_scan(
    data: st.DataObject,
    bindings: list[AclBinding],
    super_users: set[str],
    allow_everyone: bool,
) -> None:
    asked = data.draw(st.lists(questions(bindings), min_size=1, max_size=20))
    rules = authorizer(
        *bindings, super_users=super_users, allow_everyone_if_no_acl_found=allow_everyone
    )
    for principal, host, operation, resource_type, name in asked + asked:  # again: cached
        expected = reference_authorize(
            bindings,
            super_users,
            allow_everyone,
            principal,
            host,
            operation,
            resource_type,
            name,
        )
        assert rules.authorize(principal, host, operation, resource_type, name) == expected
        assert rules.authorize_by_type(
            principal, host, operation, resource_type
        ) == reference_authorize_by_type(
            bindings, super_users, allow_everyone, principal, host, operation, resource_type
        )
        assert rules.authorized_operations(principal, host, resource_type, name) == {
            op
            for op in operations_for(resource_type)
            if reference_authorize(
                bindings, super_users, allow_everyone, principal, host, op, resource_type, name
            )
        }


cover_bindings = st.builds(
    AclBinding,
    resource_type=st.just(TOPIC),
    resource_name=st.text(alphabet="ab", min_size=1, max_size=3),
    pattern_type=st.sampled_from([LITERAL, PREFIXED]),
    principal=st.sampled_from([ALICE, WILDCARD_PRINCIPAL]),
    host=st.sampled_from([HOST, WILDCARD]),
    operation=st.sampled_from([Operation.WRITE, Operation.ALL]),
    permission=st.sampled_from([ALLOW, DENY]),
)


@pytest.mark.timeout(120)
@given(bindings=st.lists(cover_bindings, min_size=1, max_size=8))
def test_by_type_agrees_with_a_plain_scan_on_covering_denies(bindings: list[AclBinding]) -> None:
    """ACLs that all speak for one question, so that which allowed names the denied
    literals and prefixes cover is what decides."""
    rules = authorizer(*bindings)
    expected = reference_authorize_by_type(
        bindings, set(), False, ALICE, HOST, Operation.WRITE, TOPIC
    )
    assert rules.authorize_by_type(ALICE, HOST, Operation.WRITE, TOPIC) == expected
