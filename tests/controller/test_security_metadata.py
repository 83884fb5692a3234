"""The security metadata the controller keeps, without a store process: SCRAM credentials
(AlterUserScramCredentials), ACLs (CreateAcls, DeleteAcls) and client quotas
(AlterClientQuotas) planned as Kafka's controller plans them, written one znode per user,
resource pattern and quota entity, committed in transactions the store can take, read back
by the next controller, and streamed to brokers only in full images and in the deltas that
changed them.

The store here is a dict that applies committed ops with ZooKeeper's rules (a parent must
exist, a node is created once, only a leaf is deleted), so a missing container or a
transaction that would be refused fails the test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.security import acl_messages
from directlog.security.acl import (
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from directlog.security.client_quotas import QuotaEntity
from directlog.security.scram import ScramCredential, ScramMechanism
from services.controller import layout, messages
from services.controller.cluster import (
    STORE_OPS_LIMIT,
    TRANSACTION_BYTES,
    Change,
    ClusterState,
    Delta,
    Image,
    ScramUpsertion,
)
from services.controller.layout import Create, Delete, SetData
from services.controller.model import AclResource
from tests.controller.clusters import PATHS, TIMEOUT, commit, with_topic

pytestmark = pytest.mark.timeout(60)

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
READ, WRITE, DESCRIBE = Operation.READ, Operation.WRITE, Operation.DESCRIBE
ALLOW, DENY = Permission.ALLOW, Permission.DENY


class FakeStore:
    """Znodes by path, changed by committed ops with ZooKeeper's rules."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {PATHS.root: b""}

    def commit(self, change: Change) -> None:
        data = dict(self.data)  # a transaction applies whole or not at all
        children = Counter(path.rsplit("/", 1)[0] for path in data)
        for op in change.ops:
            parent = op.path.rsplit("/", 1)[0]
            if isinstance(op, Create):
                assert op.path not in data and parent in data, op
                data[op.path] = op.data
                children[parent] += 1
            elif isinstance(op, SetData):
                assert op.path in data, op
                data[op.path] = op.data
            else:
                assert isinstance(op, Delete)
                assert op.path in data and not children[op.path], op
                del data[op.path]
                children[parent] -= 1
        self.data = data

    def children(self, path: str) -> list[str]:
        return [p.removeprefix(path + "/") for p in self.data if p.rsplit("/", 1)[0] == path]

    def load(self, state: ClusterState) -> ClusterState:
        """A new controller's state, the security znodes read back as Store.load reads
        them (the rest of the image taken from ``state``)."""
        scram = {
            layout.decode_name(name): layout.decode_scram(self.data[f"{PATHS.scram}/{name}"])
            for name in self.children(PATHS.scram)
        }
        acls = {}
        for kind in self.children(PATHS.acls):
            for pattern in self.children(f"{PATHS.acls}/{kind}"):
                for name in self.children(f"{PATHS.acls}/{kind}/{pattern}"):
                    resource = AclResource(
                        ResourceType[kind], PatternType[pattern], layout.decode_name(name)
                    )
                    acls[resource] = layout.decode_acls(
                        resource, self.data[PATHS.acl_resource(resource)]
                    )
        quotas = {}
        for name in self.children(PATHS.client_quotas):
            entity = layout.decode_quota_entity(name)
            quotas[entity] = layout.decode_client_quotas(
                entity, self.data[f"{PATHS.client_quotas}/{name}"]
            )
        containers = {
            p
            for p in self.data
            if p.startswith((PATHS.scram, PATHS.acls, PATHS.client_quotas)) and not self.data[p]
        }
        image = Image(
            state.cluster_id,
            state.brokers,
            state.topics,
            state.last_broker_epoch,
            state.next_producer_id,
            scram=scram,
            acls=acls,
            client_quotas=quotas,
            containers=frozenset(containers),
        )
        return ClusterState(image, PATHS, now=0.0, session_timeout=TIMEOUT)


def commit_all(state: ClusterState, store: FakeStore, changes: list[Change]) -> None:
    for change in changes:
        store.commit(change)
        commit(state, change)


def credential(mechanism: ScramMechanism, password: str = "secret") -> ScramCredential:
    return ScramCredential.from_password(mechanism, password, salt=b"salt" + password.encode())


def upsertion(user: str, mechanism: int, password: str = "secret", **fields: Any) -> ScramUpsertion:
    """A valid upsertion (any mechanism number), with ``fields`` replaced."""
    made = credential(ScramMechanism(mechanism) if mechanism in (1, 2) else SHA256, password)
    valid = ScramUpsertion(
        user, mechanism, made.salt, made.stored_key, made.server_key, made.iterations
    )
    return replace(valid, **fields)


def acl(
    name: str,
    principal: str = "User:alice",
    operation: Operation = READ,
    *,
    kind: ResourceType = TOPIC,
    pattern: PatternType = LITERAL,
    permission: Permission = ALLOW,
    host: str = "*",
) -> AclBinding:
    return AclBinding(kind, name, pattern, principal, host, operation, permission)


def acl_filter(
    name: str | None = None,
    pattern: PatternType = PatternType.ANY,
    *,
    kind: ResourceType = ResourceType.ANY,
    principal: str | None = None,
    operation: Operation = Operation.ANY,
    permission: Permission = Permission.ANY,
) -> AclBindingFilter:
    return AclBindingFilter(kind, name, pattern, principal, None, operation, permission)


def update(state: ClusterState, delta: Delta | None) -> pb.MetadataUpdate:
    return messages.metadata_update(
        state, version=2, controller_id=1, controller_epoch=1, delta=delta
    )


def codes(results: Sequence[tuple[str, KafkaError | None]]) -> dict[str, int]:
    return {user: 0 if error is None else error.code for user, error in results}


# SCRAM credentials ----------------------------------------------------------------------


def test_scram_credentials_are_one_znode_per_user_holding_keys_only() -> None:
    state, _ = with_topic([(1,)])
    store = FakeStore()
    results, changes = state.alter_scram_credentials(
        [upsertion("alice", SHA256), upsertion("bob/ops", SHA512, "other")], []
    )
    assert codes(results) == {"alice": 0, "bob/ops": 0}
    (change,) = changes
    assert [type(op).__name__ for op in change.ops] == ["Create", "Create", "Create"]
    assert [op.path for op in change.ops] == [
        "/directlog/scram",  # the container, made by its first write
        "/directlog/scram/alice",
        "/directlog/scram/bob%2Fops",  # any name is one znode
    ]
    assert change.touches_image and change.delta.scram_credentials
    assert state.scram == {}  # nothing until it commits
    commit_all(state, store, changes)
    stored = store.data["/directlog/scram/alice"].decode()
    assert '"SCRAM-SHA-256"' in stored and '"iterations":4096' in stored
    assert "secret" not in stored  # never the password
    assert state.scram == {
        "alice": {SHA256: credential(SHA256)},
        "bob/ops": {SHA512: credential(SHA512, "other")},
    }

    # A second mechanism for alice rewrites her znode; the container exists now.
    results, changes = state.alter_scram_credentials([upsertion("alice", SHA512)], [])
    assert codes(results) == {"alice": 0}
    assert [type(op) for op in changes[0].ops] == [SetData]
    commit_all(state, store, changes)
    assert set(state.scram["alice"]) == {SHA256, SHA512}

    # The same credential again writes nothing; deleting the last one deletes the znode.
    assert state.alter_scram_credentials([upsertion("alice", SHA512)], [])[1] == []
    results, changes = state.alter_scram_credentials([], [("bob/ops", 2)])
    assert codes(results) == {"bob/ops": 0}
    assert changes[0].ops == (Delete("/directlog/scram/bob%2Fops"),)
    commit_all(state, store, changes)
    assert set(state.scram) == {"alice"}
    successor = store.load(state)
    assert successor.scram == state.scram


def test_every_scram_refusal_code_and_the_rest_of_the_request_still_applies() -> None:
    state, _ = with_topic([(1,)])
    commit(state, state.alter_scram_credentials([upsertion("carol", SHA256)], [])[1][0])
    results, changes = state.alter_scram_credentials(
        [
            upsertion("ok", SHA256),
            upsertion("twice", SHA256),
            upsertion("twice", SHA256),  # the same user and mechanism twice
            upsertion("both", SHA256),
            upsertion("both", SHA512),  # both mechanisms of one user: kafka-configs does it
            upsertion("carol", SHA256),  # carol's SHA-256 is deleted below in this request too
            upsertion("", SHA256),
            upsertion("mech", 3),
            upsertion("few", SHA256, iterations=4095),
            upsertion("many", SHA256, iterations=16385),
            upsertion("short", SHA512, stored_key=b"x" * 32),
            upsertion("bound", SHA512, iterations=16384),
        ],
        [("carol", 1), ("nobody", 1), ("nomech", 0)],
    )
    assert codes(results) == {
        "carol": ErrorCode.DUPLICATE_RESOURCE,
        "nobody": ErrorCode.RESOURCE_NOT_FOUND,
        "nomech": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
        "ok": 0,
        "twice": ErrorCode.DUPLICATE_RESOURCE,
        "both": 0,
        "": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "mech": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
        "few": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "many": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "short": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "bound": 0,
    }
    assert list(codes(results)) == [
        "carol", "nobody", "nomech", "ok", "twice", "both", "", "mech", "few", "many", "short",
        "bound",
    ]  # fmt: skip
    messages_by_user = {user: str(error) for user, error in results if error is not None}
    assert messages_by_user["few"] == "Too few iterations"
    assert messages_by_user["many"] == "Too many iterations"
    assert messages_by_user[""] == "Username must not be empty"
    for change in changes:
        commit(state, change)
    assert set(state.scram) == {"carol", "ok", "both", "bound"}
    assert set(state.scram["both"]) == {SHA256, SHA512}
    assert set(state.scram["carol"]) == {SHA256}  # neither deleted nor set again


def test_user_names_become_znode_names_that_read_back_exactly() -> None:
    for name, text in [
        ("alice", "alice"),
        ("CN=a,O=b", "CN%3Da%2CO%3Db"),
        ("a/b", "a%2Fb"),
        (".", "%2E"),
        ("..", "%2E%2E"),
        ("...", "..."),
        ("<default>", "%3Cdefault%3E"),
        ("zoë 1", "zo%C3%AB%201"),
    ]:
        assert layout.encode_name(name) == text
        assert layout.decode_name(text) == name
    for bad in ["", "a%2fb", "a%2", "%ZZ", "a b", "%FF"]:
        with pytest.raises(ValueError):
            layout.decode_name(bad)


@pytest.mark.parametrize(
    "data",
    [
        b'{"credentials":{}}',
        b'{"credentials":{"SCRAM-SHA-1":{"salt":"c2FsdA==","stored_key":"","server_key":"",'
        b'"iterations":4096}}}',
        b'{"credentials":{"SCRAM-SHA-256":{"salt":"c2FsdA==","stored_key":"AAAA",'
        b'"server_key":"AAAA","iterations":4096}}}',
        b'{"credentials":{"SCRAM-SHA-256":{"salt":"!!","stored_key":"AAAA",'
        b'"server_key":"AAAA","iterations":4096}}}',
    ],
)
def test_a_damaged_scram_znode_stops_a_takeover(data: bytes) -> None:
    with pytest.raises((ValueError, KeyError)):
        layout.decode_scram(data)


# ACLs ----------------------------------------------------------------------------------


def test_acls_are_one_znode_per_resource_pattern_and_creating_one_twice_is_a_success() -> None:
    state, _ = with_topic([(1,)])
    store = FakeStore()
    bindings = [
        acl("orders"),
        acl("orders", "User:bob", WRITE, permission=DENY),
        acl("orders-", pattern=PREFIXED),
        acl("app", "User:alice", READ, kind=GROUP),
        acl("orders"),  # the same binding twice in one request
    ]
    results, changes = state.create_acls(bindings)
    assert results == [None] * 5
    (change,) = changes
    assert [op.path for op in change.ops] == [
        "/directlog/acls",
        "/directlog/acls/TOPIC",
        "/directlog/acls/TOPIC/LITERAL",
        "/directlog/acls/TOPIC/LITERAL/orders",
        "/directlog/acls/TOPIC/PREFIXED",
        "/directlog/acls/TOPIC/PREFIXED/orders-",
        "/directlog/acls/GROUP",
        "/directlog/acls/GROUP/LITERAL",
        "/directlog/acls/GROUP/LITERAL/app",
    ]
    assert change.delta.acls and change.touches_image
    commit_all(state, store, changes)
    assert store.data["/directlog/acls/TOPIC/LITERAL/orders"] == (
        b'{"acls":[["User:alice","*","READ","ALLOW"],["User:bob","*","WRITE","DENY"]]}'
    )
    assert state.acls[AclResource(TOPIC, LITERAL, "orders")] == {bindings[0], bindings[1]}

    # Kafka answers a binding that exists with success, and writes nothing.
    results, changes = state.create_acls([acl("orders"), acl("orders-", pattern=PREFIXED)])
    assert results == [None, None] and changes == []
    # A new binding on a known resource rewrites that resource's znode only.
    results, changes = state.create_acls([acl("orders", "User:carol")])
    assert [type(op) for op in changes[0].ops] == [SetData]
    assert changes[0].ops[0].path == "/directlog/acls/TOPIC/LITERAL/orders"
    commit_all(state, store, changes)
    assert store.load(state).acls == state.acls


@pytest.mark.parametrize(
    ("binding", "why"),
    [
        (acl("t", kind=ResourceType.ANY), "resource type"),
        (acl("t", kind=ResourceType.UNKNOWN), "resource type"),
        (acl("t", pattern=PatternType.MATCH), "pattern type"),
        (acl("t", pattern=PatternType.ANY), "pattern type"),
        (acl("t", operation=Operation.ANY), "operation"),
        (acl("t", permission=Permission.ANY), "permission"),
        (acl(""), "empty"),
        (acl("t", "alice"), "principal"),
        (acl("other-cluster", kind=CLUSTER, operation=DESCRIBE), "kafka-cluster"),
    ],
)
def test_a_binding_kafka_refuses_is_invalid_request_and_the_others_are_created(
    binding: AclBinding, why: str
) -> None:
    state, _ = with_topic([(1,)])
    results, changes = state.create_acls([acl("kept"), binding])
    assert results[0] is None
    error = results[1]
    assert error is not None and error.code is ErrorCode.INVALID_REQUEST
    assert why in str(error)
    for change in changes:
        commit(state, change)
    assert state.acls == {AclResource(TOPIC, LITERAL, "kept"): {acl("kept")}}


def test_unknown_wire_codes_are_refused_as_kafka_refuses_them() -> None:
    message = pb.AclBinding(
        resource_type=99, resource_name="t", pattern_type=3, principal="User:a", host="*",
        operation=3, permission=3,
    )  # fmt: skip
    state, _ = with_topic([(1,)])
    (error,), _changes = state.create_acls([acl_messages.binding(message)])
    assert error is not None and error.code is ErrorCode.INVALID_REQUEST
    (result,), _changes = state.delete_acls(
        [acl_messages.binding_filter(pb.AclBindingFilter(resource_type=1, pattern_type=1))]
    )
    assert result[0] is not None and result[0].code is ErrorCode.INVALID_REQUEST  # UNKNOWN op


def test_delete_acls_by_literal_prefixed_any_and_match_filters_returns_what_it_deleted() -> None:
    state, _ = with_topic([(1,)])
    store = FakeStore()
    stored = [
        acl("orders"),
        acl("orders", "User:bob", WRITE),
        acl("orders-", pattern=PREFIXED),
        acl("ord", "User:bob", pattern=PREFIXED),
        acl("*", "User:carol"),
        acl("payments", "User:bob"),
        acl("app", kind=GROUP),
        acl("kafka-cluster", "User:bob", DESCRIBE, kind=CLUSTER),
    ]
    commit_all(state, store, state.create_acls(stored)[1])

    def delete(*filters: AclBindingFilter) -> list[list[AclBinding]]:
        results, changes = state.delete_acls(list(filters))
        commit_all(state, store, changes)
        assert all(error is None for error, _ in results)
        return [deleted for _, deleted in results]

    # LITERAL: that literal name only, not the prefixed pattern of the same name.
    assert delete(acl_filter("orders", LITERAL, kind=TOPIC, principal="User:bob")) == [
        [acl("orders", "User:bob", WRITE)]
    ]
    # MATCH: every pattern that applies to the name "orders-eu": the prefixes and the
    # literal wildcard, not the literal "orders".
    applying = [acl("*", "User:carol"), acl("ord", "User:bob", pattern=PREFIXED)]
    applying.append(acl("orders-", pattern=PREFIXED))
    assert delete(acl_filter("orders-eu", PatternType.MATCH, kind=TOPIC)) == [applying]
    # Two filters matching one binding both list it; it is deleted once.
    bobs = [acl("payments", "User:bob"), acl("kafka-cluster", "User:bob", DESCRIBE, kind=CLUSTER)]
    assert delete(
        acl_filter(principal="User:bob"), acl_filter("payments", LITERAL, kind=TOPIC)
    ) == [bobs, [acl("payments", "User:bob")]]
    assert delete(acl_filter("nothing", PREFIXED)) == [[]]
    assert (
        store.load(state).acls
        == state.acls
        == {
            AclResource(TOPIC, LITERAL, "orders"): {acl("orders")},
            AclResource(GROUP, LITERAL, "app"): {acl("app", kind=GROUP)},
        }
    )
    # ANY: everything; the emptied resources' znodes go, the containers stay.
    assert sorted(delete(acl_filter())[0]) == sorted([acl("orders"), acl("app", kind=GROUP)])
    assert state.acls == {}
    assert not any(path.count("/") == 5 for path in store.data if path.startswith(PATHS.acls))
    assert store.load(state).acls == {}


def test_ten_thousand_acls_go_in_transactions_the_store_takes_and_load_back() -> None:
    state, _ = with_topic([(1,)])
    store = FakeStore()
    batches = [
        [
            acl(f"topic-{i:05d}", f"User:app-{i % 7}", Operation(3 + i % 9))
            for i in range(n, n + 2500)
        ]
        for n in range(0, 10_000, 2500)
    ]
    for batch in batches:
        results, changes = state.create_acls(batch)
        assert results == [None] * len(batch)
        assert len(changes) > 1  # 2,500 znodes: more than one transaction takes
        for change in changes:
            size = sum(len(op.path) + len(getattr(op, "data", b"")) for op in change.ops)
            assert len(change.ops) <= STORE_OPS_LIMIT and size <= TRANSACTION_BYTES
        # Only the last part of a request tells the brokers, who then get it whole.
        assert [c.delta.acls for c in changes] == [False] * (len(changes) - 1) + [True]
        commit_all(state, store, changes)
    assert sum(len(b) for b in state.acls.values()) == 10_000
    assert len(update(state, changes[-1].delta).acls) == 10_000
    successor = store.load(state)
    assert successor.acls == state.acls
    # Deleting them all by one filter: every one listed, every znode deleted.
    deletions, changes = successor.delete_acls([acl_filter(kind=TOPIC)])
    assert len(deletions[0][1]) == 10_000
    commit_all(successor, store, changes)
    assert store.load(successor).acls == {}


def test_a_resource_whose_acls_would_outgrow_one_znode_refuses_more() -> None:
    state, _ = with_topic([(1,)])
    store = FakeStore()
    principals = [f"User:{'p' * 200}-{i}" for i in range(3000)]
    results, changes = state.create_acls([acl("busy", p) for p in principals])
    refused = [e for e in results if e is not None]
    assert refused and all(e.code is ErrorCode.POLICY_VIOLATION for e in refused)
    assert "busy" in str(refused[0])
    commit_all(state, store, changes)
    stored = store.data[PATHS.acl_resource(AclResource(TOPIC, LITERAL, "busy"))]
    assert len(stored) <= layout.ACL_ZNODE_BYTES
    assert len(state.acls[AclResource(TOPIC, LITERAL, "busy")]) == len(results) - len(refused)
    assert store.load(state).acls == state.acls


@pytest.mark.parametrize(
    "data",
    [
        b'{"acls":[]}',
        b'{"acls":[["alice","*","READ","ALLOW"]]}',  # not Type:name
        b'{"acls":[["User:a","*","ANY","ALLOW"]]}',
        b'{"acls":[["User:a","*","READ","MAYBE"]]}',
        b'{"acls":[["User:a","*","READ"]]}',
    ],
)
def test_a_damaged_acls_znode_stops_a_takeover(data: bytes) -> None:
    with pytest.raises((ValueError, KeyError)):
        layout.decode_acls(AclResource(TOPIC, LITERAL, "t"), data)


# Client quotas -------------------------------------------------------------------------

ALICE = [("user", "alice")]
ALICE_APP = [("client-id", "app"), ("user", "alice")]
DEFAULT_USER = [("user", None)]


def test_client_quotas_are_one_znode_per_entity() -> None:
    state, _ = with_topic([(1,)])
    store = FakeStore()
    results, changes = state.alter_client_quotas(
        [
            (ALICE, [("producer_byte_rate", 1024.0), ("consumer_byte_rate", 2048.0)]),
            (ALICE_APP, [("request_percentage", 12.5)]),
            (DEFAULT_USER, [("producer_byte_rate", 100.0)]),
        ]
    )
    assert results == [None, None, None]
    (change,) = changes
    assert [op.path for op in change.ops] == [
        "/directlog/client_quotas",
        "/directlog/client_quotas/user=alice",
        "/directlog/client_quotas/client-id=app,user=alice",
        "/directlog/client_quotas/user=<default>",
    ]
    assert change.delta.client_quotas and change.touches_image
    commit_all(state, store, changes)
    alice = QuotaEntity((("user", "alice"),))
    assert state.client_quotas[alice] == {
        "producer_byte_rate": 1024.0,
        "consumer_byte_rate": 2048.0,
    }
    assert state.client_quotas[QuotaEntity((("user", None),))] == {"producer_byte_rate": 100.0}

    # A removal of a key not set does nothing; removing the last key deletes the znode.
    results, changes = state.alter_client_quotas(
        [(ALICE, [("consumer_byte_rate", None), ("request_percentage", None)])]
    )
    assert results == [None]
    assert [type(op) for op in changes[0].ops] == [SetData]
    commit_all(state, store, changes)
    results, changes = state.alter_client_quotas([(DEFAULT_USER, [("producer_byte_rate", None)])])
    assert changes[0].ops == (Delete("/directlog/client_quotas/user=<default>"),)
    commit_all(state, store, changes)
    assert state.alter_client_quotas([(ALICE, [("producer_byte_rate", 1024.0)])])[1] == []
    assert (
        store.load(state).client_quotas
        == state.client_quotas
        == {
            alice: {"producer_byte_rate": 1024.0},
            QuotaEntity((("client-id", "app"), ("user", "alice"))): {"request_percentage": 12.5},
        }
    )


@pytest.mark.parametrize(
    ("entity", "ops", "why"),
    [
        ([], [("producer_byte_rate", 1.0)], "empty"),
        ([("ip", "10.0.0.1")], [("connection_creation_rate", 1.0)], "ip"),
        ([("group", "g")], [("producer_byte_rate", 1.0)], "group"),
        ([("user", "a"), ("user", "b")], [("producer_byte_rate", 1.0)], "duplicate"),
        ([("user", "")], [("producer_byte_rate", 1.0)], "Empty user"),
        (ALICE, [("producer_byte_rate", 1.0), ("producer_byte_rate", 2.0)], "Duplicate"),
        (ALICE, [("fetch_rate", 1.0)], "fetch_rate"),
        (ALICE, [("producer_byte_rate", 1.5)], "fractional"),
        (ALICE, [("request_percentage", -1.0)], "greater than 0"),
        (ALICE, [("consumer_byte_rate", float("nan"))], "finite"),
        (ALICE, [("controller_mutation_rate", 1.0)], "controller_mutation_rate"),
    ],
)
def test_a_quota_kafka_refuses_is_invalid_request_and_the_others_are_altered(
    entity: list[tuple[str, str | None]], ops: list[tuple[str, float | None]], why: str
) -> None:
    state, _ = with_topic([(1,)])
    results, changes = state.alter_client_quotas(
        [(DEFAULT_USER, [("producer_byte_rate", 5.0)]), (entity, ops)]
    )
    assert results[0] is None
    error = results[1]
    assert error is not None and error.code is ErrorCode.INVALID_REQUEST
    assert why in str(error)
    for change in changes:
        commit(state, change)
    assert state.client_quotas == {QuotaEntity((("user", None),)): {"producer_byte_rate": 5.0}}


def test_an_entity_named_twice_in_one_request_is_altered_once() -> None:
    state, _ = with_topic([(1,)])
    results, changes = state.alter_client_quotas(
        [(ALICE, [("producer_byte_rate", 1.0)]), (ALICE, [("producer_byte_rate", 2.0)])]
    )
    assert results[0] is None
    assert results[1] is not None and results[1].code is ErrorCode.INVALID_REQUEST
    for change in changes:
        commit(state, change)
    assert state.client_quotas == {QuotaEntity((("user", "alice"),)): {"producer_byte_rate": 1.0}}


@pytest.mark.parametrize(
    "name", ["user", "user=alice,client-id=app", "user=%61lice", "user=alice,", "ip=1.2.3.4"]
)
def test_a_quota_znode_name_nothing_here_writes_stops_a_takeover(name: str) -> None:
    with pytest.raises(ValueError):
        layout.decode_quota_entity(name)


@pytest.mark.parametrize(
    "data",
    [b'{"quotas":{}}', b'{"quotas":{"fetch_rate":1.0}}', b'{"quotas":{"producer_byte_rate":-1}}'],
)
def test_a_damaged_quota_znode_stops_a_takeover(data: bytes) -> None:
    with pytest.raises(ValueError):
        layout.decode_client_quotas(QuotaEntity((("user", "alice"),)), data)


# Streaming to brokers ------------------------------------------------------------------


def test_each_kind_goes_to_brokers_in_full_images_and_in_the_deltas_that_changed_it() -> None:
    state, topic_id = with_topic([(1, 2)])
    commit(state, state.alter_scram_credentials([upsertion("alice", SHA256)], [])[1][0])
    commit(state, state.create_acls([acl("orders")])[1][0])
    commit(state, state.alter_client_quotas([(ALICE, [("producer_byte_rate", 9.0)])])[1][0])

    full = update(state, None)
    assert full.has_scram_credentials and full.has_acls and full.has_client_quotas
    assert [(c.user, c.mechanism) for c in full.scram_credentials] == [("alice", 1)]
    assert full.scram_credentials[0].stored_key == credential(SHA256).stored_key
    assert [acl_messages.binding(b) for b in full.acls] == [acl("orders")]
    assert [
        ([(c.entity_type, c.name) for c in q.entity], dict(q.values)) for q in full.client_quotas
    ] == [([("user", "alice")], {"producer_byte_rate": 9.0})]

    # An ISR change says nothing of them: the brokers keep what they have.
    unrelated = update(state, Delta({topic_id: frozenset({0})}))
    assert not (
        unrelated.has_scram_credentials or unrelated.has_acls or unrelated.has_client_quotas
    )
    assert not (unrelated.scram_credentials or unrelated.acls or unrelated.client_quotas)

    # A change of one kind sends that kind whole, and only it.
    (change,) = state.create_acls([acl("payments")])[1]
    commit(state, change)
    delta = update(state, change.delta)
    assert delta.has_acls and not delta.has_scram_credentials and not delta.has_client_quotas
    assert sorted(acl_messages.binding(b) for b in delta.acls) == [
        acl("orders"),
        acl("payments"),
    ]
    # Emptied: the flag with nothing in the list.
    (change,) = state.delete_acls([acl_filter()])[1]
    commit(state, change)
    emptied = update(state, change.delta)
    assert emptied.has_acls and list(emptied.acls) == []
    (change,) = state.alter_scram_credentials([], [("alice", 1)])[1]
    commit(state, change)
    emptied = update(state, change.delta)
    assert emptied.has_scram_credentials and list(emptied.scram_credentials) == []
    assert not emptied.has_acls
