"""The ACL model: what CreateAcls, DescribeAcls and DeleteAcls accept (Kafka's rules and its
INVALID_REQUEST code), how a filter selects bindings (ANY, MATCH, LITERAL, PREFIXED, None),
principals, and the operations each resource type reports."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.security.acl import (
    CLUSTER_NAME,
    WILDCARD,
    AclBinding,
    AclBindingFilter,
    InvalidAclError,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    operations_for,
    parse_principal,
    validate_binding,
    validate_filter,
)

TOPIC_READ = AclBinding(
    ResourceType.TOPIC,
    "orders",
    PatternType.LITERAL,
    "User:alice",
    "*",
    Operation.READ,
    Permission.ALLOW,
)
EVERYTHING = AclBindingFilter(
    ResourceType.ANY, None, PatternType.ANY, None, None, Operation.ANY, Permission.ANY
)


def binding(**changes: object) -> AclBinding:
    return dataclasses.replace(TOPIC_READ, **changes)  # type: ignore[arg-type]


def selecting(**changes: object) -> AclBindingFilter:
    return dataclasses.replace(EVERYTHING, **changes)  # type: ignore[arg-type]


# --- CreateAcls validation -------------------------------------------------------------

REFUSED = [
    (binding(resource_type=ResourceType.ANY), "invalid resource type ANY for an ACL"),
    (binding(resource_type=ResourceType.UNKNOWN), "invalid resource type UNKNOWN for an ACL"),
    (
        binding(pattern_type=PatternType.MATCH),
        "invalid pattern type MATCH for an ACL: it must be LITERAL or PREFIXED",
    ),
    (
        binding(pattern_type=PatternType.ANY),
        "invalid pattern type ANY for an ACL: it must be LITERAL or PREFIXED",
    ),
    (
        binding(pattern_type=PatternType.UNKNOWN),
        "invalid pattern type UNKNOWN for an ACL: it must be LITERAL or PREFIXED",
    ),
    (binding(operation=Operation.ANY), "invalid operation ANY for an ACL"),
    (binding(operation=Operation.UNKNOWN), "invalid operation UNKNOWN for an ACL"),
    (
        binding(permission=Permission.ANY),
        "invalid permission type ANY for an ACL: it must be ALLOW or DENY",
    ),
    (
        binding(permission=Permission.UNKNOWN),
        "invalid permission type UNKNOWN for an ACL: it must be ALLOW or DENY",
    ),
    (binding(resource_name=""), "an ACL's resource name must not be empty"),
    (
        binding(pattern_type=PatternType.PREFIXED, resource_name=""),
        "an ACL's resource name must not be empty",
    ),
    (
        binding(resource_type=ResourceType.CLUSTER, resource_name="my-cluster"),
        "the CLUSTER resource is named kafka-cluster",
    ),
    (
        binding(resource_type=ResourceType.CLUSTER, resource_name=WILDCARD),
        "the CLUSTER resource is named kafka-cluster",
    ),
    (
        binding(principal="alice"),
        "principal 'alice' is not of the form Type:name (no colon separates them)",
    ),
    (
        binding(principal=""),
        "principal '' is not of the form Type:name (no colon separates them)",
    ),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("refused", "message"), REFUSED)
def test_create_refuses_what_kafka_refuses_with_invalid_request(
    refused: AclBinding, message: str
) -> None:
    with pytest.raises(InvalidAclError) as caught:
        validate_binding(refused)
    assert str(caught.value) == message
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    assert int(caught.value.code) == 42
    assert isinstance(caught.value, KafkaError)


@pytest.mark.timeout(10)
def test_the_first_problem_is_the_one_reported() -> None:
    """Checks run in Kafka's order: types, operation, permission, then name and principal."""
    bad = binding(operation=Operation.ANY, resource_name="", principal="nobody")
    with pytest.raises(InvalidAclError, match=r"^invalid operation ANY for an ACL$"):
        validate_binding(bad)


ACCEPTED = [
    TOPIC_READ,
    binding(pattern_type=PatternType.PREFIXED, resource_name="orders."),
    binding(resource_name=WILDCARD),
    # Kafka stores these; only its command-line tool refuses WRITE on the cluster.
    binding(resource_type=ResourceType.CLUSTER, resource_name=CLUSTER_NAME),
    binding(
        resource_type=ResourceType.CLUSTER, resource_name=CLUSTER_NAME, operation=Operation.WRITE
    ),
    binding(resource_type=ResourceType.GROUP, operation=Operation.IDEMPOTENT_WRITE),
    # A CLUSTER pattern is judged by its name only.
    binding(
        resource_type=ResourceType.CLUSTER,
        resource_name=CLUSTER_NAME,
        pattern_type=PatternType.PREFIXED,
    ),
    # "*" as a prefix is an ordinary one-character prefix.
    binding(resource_type=ResourceType.GROUP, pattern_type=PatternType.PREFIXED, resource_name="*"),
    binding(operation=Operation.ALL, permission=Permission.DENY),
    binding(principal="Group:ops", host="10.0.0.7"),
    binding(principal="User:CN=alice,O=example:x"),
    binding(principal="User:"),
    binding(host=""),
    binding(resource_type=ResourceType.USER, operation=Operation.CREATE_TOKENS),
    binding(resource_type=ResourceType.DELEGATION_TOKEN, resource_name="token-1"),
    binding(resource_type=ResourceType.TRANSACTIONAL_ID, operation=Operation.WRITE),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("accepted", ACCEPTED)
def test_create_accepts_what_kafka_stores(accepted: AclBinding) -> None:
    validate_binding(accepted)  # no InvalidAclError


# --- DescribeAcls / DeleteAcls filters -------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("refused", "message"),
    [
        (
            selecting(resource_type=ResourceType.UNKNOWN),
            "the ACL filter holds UNKNOWN values: resource type",
        ),
        (
            selecting(pattern_type=PatternType.UNKNOWN),
            "the ACL filter holds UNKNOWN values: pattern type",
        ),
        (selecting(operation=Operation.UNKNOWN), "the ACL filter holds UNKNOWN values: operation"),
        (
            selecting(permission=Permission.UNKNOWN),
            "the ACL filter holds UNKNOWN values: permission type",
        ),
        (
            selecting(
                resource_type=ResourceType.UNKNOWN,
                operation=Operation.UNKNOWN,
                permission=Permission.UNKNOWN,
            ),
            "the ACL filter holds UNKNOWN values: resource type, operation, permission type",
        ),
    ],
)
def test_filters_with_unknown_values_are_refused(refused: AclBindingFilter, message: str) -> None:
    with pytest.raises(InvalidAclError) as caught:
        validate_filter(refused)
    assert str(caught.value) == message
    assert caught.value.code == ErrorCode.INVALID_REQUEST


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "accepted",
    [
        EVERYTHING,
        selecting(pattern_type=PatternType.MATCH, resource_name="orders"),
        selecting(pattern_type=PatternType.PREFIXED, resource_name=""),
        selecting(resource_type=ResourceType.CLUSTER, principal="nobody", host=""),
    ],
)
def test_filters_accept_any_match_and_free_strings(accepted: AclBindingFilter) -> None:
    validate_filter(accepted)  # no InvalidAclError


LITERAL_ORDERS = binding()
LITERAL_WILDCARD = binding(resource_name=WILDCARD)
PREFIXED_ORD = binding(pattern_type=PatternType.PREFIXED, resource_name="ord")
PREFIXED_ORDERS_EU = binding(pattern_type=PatternType.PREFIXED, resource_name="orders.eu")
GROUP_ORDERS = binding(resource_type=ResourceType.GROUP)
STORED = [LITERAL_ORDERS, LITERAL_WILDCARD, PREFIXED_ORD, PREFIXED_ORDERS_EU, GROUP_ORDERS]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("chosen", "selected"),
    [
        (EVERYTHING, STORED),
        (selecting(resource_type=ResourceType.GROUP), [GROUP_ORDERS]),
        # ANY with a name: every pattern type, the name compared exactly.
        (selecting(resource_name="orders"), [LITERAL_ORDERS, GROUP_ORDERS]),
        (selecting(resource_name=WILDCARD), [LITERAL_WILDCARD]),
        (
            selecting(resource_type=ResourceType.TOPIC, pattern_type=PatternType.LITERAL),
            [LITERAL_ORDERS, LITERAL_WILDCARD],
        ),
        (
            selecting(pattern_type=PatternType.LITERAL, resource_name="orders"),
            [LITERAL_ORDERS, GROUP_ORDERS],
        ),
        (selecting(pattern_type=PatternType.PREFIXED), [PREFIXED_ORD, PREFIXED_ORDERS_EU]),
        # PREFIXED with a name selects that stored prefix, not the prefixes of the name.
        (selecting(pattern_type=PatternType.PREFIXED, resource_name="ord"), [PREFIXED_ORD]),
        (selecting(pattern_type=PatternType.PREFIXED, resource_name="orders.eu.west"), []),
        # MATCH: every ACL that would apply to a resource of that name.
        (
            selecting(
                resource_type=ResourceType.TOPIC,
                pattern_type=PatternType.MATCH,
                resource_name="orders.eu.west",
            ),
            [LITERAL_WILDCARD, PREFIXED_ORD, PREFIXED_ORDERS_EU],
        ),
        (
            selecting(
                resource_type=ResourceType.TOPIC,
                pattern_type=PatternType.MATCH,
                resource_name="orders",
            ),
            [LITERAL_ORDERS, LITERAL_WILDCARD, PREFIXED_ORD],
        ),
        (
            selecting(pattern_type=PatternType.MATCH, resource_name="or"),
            [LITERAL_WILDCARD],
        ),
        (selecting(pattern_type=PatternType.MATCH), STORED),
    ],
)
def test_filter_pattern_selection(chosen: AclBindingFilter, selected: list[AclBinding]) -> None:
    assert [stored for stored in STORED if chosen.matches(stored)] == selected


ENTRIES = [
    binding(),
    binding(principal="User:*"),
    binding(host="10.0.0.1"),
    binding(operation=Operation.ALL),
    binding(permission=Permission.DENY),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("chosen", "selected"),
    [
        (selecting(principal="User:alice"), [ENTRIES[0], ENTRIES[2], ENTRIES[3], ENTRIES[4]]),
        # A filter's principal is compared as a string: "User:*" selects only wildcard ACLs.
        (selecting(principal="User:*"), [ENTRIES[1]]),
        (selecting(host="10.0.0.1"), [ENTRIES[2]]),
        (selecting(host="*"), [ENTRIES[0], ENTRIES[1], ENTRIES[3], ENTRIES[4]]),
        # READ does not select an ALL ACL, nor ALL a READ one.
        (selecting(operation=Operation.READ), [ENTRIES[0], ENTRIES[1], ENTRIES[2], ENTRIES[4]]),
        (selecting(operation=Operation.ALL), [ENTRIES[3]]),
        (selecting(permission=Permission.DENY), [ENTRIES[4]]),
        (selecting(principal="User:bob"), []),
    ],
)
def test_filter_entry_selection(chosen: AclBindingFilter, selected: list[AclBinding]) -> None:
    assert [stored for stored in ENTRIES if chosen.matches(stored)] == selected


# --- principals and operations ---------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("principal", "parts"),
    [
        ("User:alice", ("User", "alice")),
        ("Group:ops", ("Group", "ops")),
        ("User:CN=alice,O=example:x", ("User", "CN=alice,O=example:x")),
        ("User:", ("User", "")),
        (":alice", ("", "alice")),
        ("User:*", ("User", "*")),
    ],
)
def test_parse_principal_splits_at_the_first_colon(principal: str, parts: tuple[str, str]) -> None:
    assert parse_principal(principal) == parts


@pytest.mark.timeout(10)
def test_parse_principal_refuses_a_name_without_type() -> None:
    with pytest.raises(InvalidAclError) as caught:
        parse_principal("alice")
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    assert "'alice'" in str(caught.value)


@pytest.mark.timeout(10)
def test_operations_per_resource_type_are_kafkas() -> None:
    assert operations_for(ResourceType.TOPIC) == {
        Operation.READ,
        Operation.WRITE,
        Operation.CREATE,
        Operation.DELETE,
        Operation.ALTER,
        Operation.DESCRIBE,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
    }
    assert operations_for(ResourceType.GROUP) == {
        Operation.READ,
        Operation.DELETE,
        Operation.DESCRIBE,
    }
    assert operations_for(ResourceType.CLUSTER) == {
        Operation.CREATE,
        Operation.ALTER,
        Operation.DESCRIBE,
        Operation.CLUSTER_ACTION,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS,
        Operation.IDEMPOTENT_WRITE,
    }
    assert operations_for(ResourceType.TRANSACTIONAL_ID) == {Operation.WRITE, Operation.DESCRIBE}
    assert operations_for(ResourceType.DELEGATION_TOKEN) == {Operation.DESCRIBE}
    assert operations_for(ResourceType.USER) == {
        Operation.CREATE_TOKENS,
        Operation.DESCRIBE_TOKENS,
    }


@pytest.mark.timeout(10)
@pytest.mark.parametrize("resource_type", [ResourceType.ANY, ResourceType.UNKNOWN])
def test_operations_for_a_filter_type_is_an_error(resource_type: ResourceType) -> None:
    with pytest.raises(ValueError, match="not a concrete resource type"):
        operations_for(resource_type)


@pytest.mark.timeout(10)
def test_codes_are_kafkas_wire_codes() -> None:
    assert [int(t) for t in ResourceType] == list(range(8))
    assert (PatternType.MATCH, PatternType.LITERAL, PatternType.PREFIXED) == (2, 3, 4)
    assert (Operation.ALL, Operation.IDEMPOTENT_WRITE, Operation.DESCRIBE_TOKENS) == (2, 12, 14)
    assert (Permission.DENY, Permission.ALLOW) == (2, 3)


# --- properties ------------------------------------------------------------------------

names = st.text(alphabet="ab.*", min_size=1, max_size=4)
stored_bindings = st.builds(
    AclBinding,
    resource_type=st.sampled_from([ResourceType.TOPIC, ResourceType.GROUP, ResourceType.USER]),
    resource_name=names,
    pattern_type=st.sampled_from([PatternType.LITERAL, PatternType.PREFIXED]),
    principal=st.sampled_from(["User:alice", "User:bob", "User:*", "Group:ops"]),
    host=st.sampled_from(["*", "10.0.0.1"]),
    operation=st.sampled_from([op for op in Operation if op >= Operation.ALL]),
    permission=st.sampled_from([Permission.ALLOW, Permission.DENY]),
)


@pytest.mark.timeout(60)
@given(kind=st.text().filter(lambda s: ":" not in s), name=st.text())
def test_principal_round_trips(kind: str, name: str) -> None:
    assert parse_principal(f"{kind}:{name}") == (kind, name)


@pytest.mark.timeout(60)
@given(stored=stored_bindings)
def test_every_concrete_binding_is_accepted(stored: AclBinding) -> None:
    validate_binding(stored)  # no InvalidAclError


@pytest.mark.timeout(60)
@given(stored=stored_bindings, other=stored_bindings)
def test_an_exact_filter_selects_exactly_its_binding(stored: AclBinding, other: AclBinding) -> None:
    exact = AclBindingFilter(*dataclasses.astuple(stored))
    validate_filter(exact)
    assert exact.matches(stored)
    assert exact.matches(other) == (other == stored)


@pytest.mark.timeout(60)
@given(
    stored=stored_bindings,
    other=stored_bindings,
    field=st.sampled_from(dataclasses.fields(AclBindingFilter)),
)
def test_a_wildcard_field_ignores_that_field(
    stored: AclBinding, other: AclBinding, field: dataclasses.Field[object]
) -> None:
    """ANY or None in one field, every other field exact: the filter selects the bindings
    that agree on every other field."""
    wildcard = {
        "resource_type": ResourceType.ANY,
        "resource_name": None,
        "pattern_type": PatternType.ANY,
        "principal": None,
        "host": None,
        "operation": Operation.ANY,
        "permission": Permission.ANY,
    }[field.name]
    loose = dataclasses.replace(
        AclBindingFilter(*dataclasses.astuple(stored)),
        **{field.name: wildcard},  # type: ignore[arg-type]
    )
    agree = all(
        getattr(other, f.name) == getattr(stored, f.name)
        for f in dataclasses.fields(AclBinding)
        if f.name != field.name
    )
    assert loose.matches(stored)
    assert loose.matches(other) == agree


@pytest.mark.timeout(60)
@given(stored=stored_bindings, resource=names)
def test_match_selects_the_acls_that_apply_to_the_name(stored: AclBinding, resource: str) -> None:
    applies = (
        stored.resource_name in (resource, WILDCARD)
        if stored.pattern_type == PatternType.LITERAL
        else resource.startswith(stored.resource_name)
    )
    match = selecting(pattern_type=PatternType.MATCH, resource_name=resource)
    assert match.matches(stored) == applies


@pytest.mark.timeout(60)
@given(stored=st.lists(stored_bindings, max_size=12))
def test_bindings_sort_by_resource_first(stored: list[AclBinding]) -> None:
    ordered = sorted(stored)
    keys = [(b.resource_type, b.resource_name, b.pattern_type) for b in ordered]
    assert keys == sorted(keys)
