"""The broker's access control as request handlers see it: decisions for the principal and
host of the connection being served, taken from the cluster image's ACLs the moment the
image holds them; nothing at all with the authorizer off, where KIP-430's fields report
every operation, as Kafka without an authorizer does."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.security.acl import (
    CLUSTER_NAME,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    operations_for,
)
from directlog.topic_config import LogConfig
from services.broker.authentication import NO_SASL, PLAINTEXT, SESSION, Session
from services.broker.authorization import Access, authorized_operations, cluster_operations
from services.broker.cluster_metadata import ClusterImage
from services.broker.settings import BrokerSettings

T = TypeVar("T")
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER


def acl(
    principal: str,
    operation: Operation,
    resource_type: ResourceType = TOPIC,
    name: str = "orders",
    *,
    pattern: PatternType = PatternType.LITERAL,
    host: str = "*",
    permission: Permission = Permission.ALLOW,
) -> pb.AclBinding:
    return pb.AclBinding(
        resource_type=resource_type,
        resource_name=name,
        pattern_type=pattern,
        principal=principal,
        host=host,
        operation=operation,
        permission=permission,
    )


def acls_update(version: int, *bindings: pb.AclBinding) -> pb.MetadataUpdate:
    """A delta that sets the cluster's ACLs to `bindings`."""
    message = pb.MetadataUpdate(version=version, controller_epoch=1, has_acls=True)
    message.acls.extend(bindings)
    return message


def as_client(subject: str | None, host: str, call: Callable[[], T]) -> T:
    """`call()` while serving a connection from `host` whose TLS client certificate has
    `subject` (None: no certificate, User:ANONYMOUS)."""
    session = Session(PLAINTEXT, NO_SASL, tls_subject=subject, client_host=host)

    def served() -> T:
        SESSION.set(session)
        return call()

    return contextvars.copy_context().run(served)


def secured(tmp_path: Path, **settings: object) -> tuple[ClusterImage, Access]:
    image = ClusterImage(LogConfig())
    access = Access.from_settings(
        BrokerSettings.model_validate(
            {"data_dir": tmp_path, "authorizer_enabled": True, **settings}
        ),
        image,
    )
    assert access is not None
    return image, access


@pytest.mark.timeout(30)
def test_decisions_follow_the_images_acls_for_the_connections_principal(tmp_path: Path) -> None:
    image, access = secured(tmp_path)
    alice = "CN=alice"

    def reads_orders() -> bool:
        return access.allowed(Operation.READ, TOPIC, "orders")

    assert not as_client(alice, "10.0.0.1", reads_orders)
    image.apply(acls_update(1, acl("User:CN=alice", Operation.READ)))
    assert as_client(alice, "10.0.0.1", reads_orders)
    assert not as_client("CN=bob", "10.0.0.1", reads_orders)
    assert not as_client(None, "10.0.0.1", reads_orders)  # User:ANONYMOUS
    # ALLOW READ implies DESCRIBE; other operations stay denied
    for operation, allowed in ((Operation.DESCRIBE, True), (Operation.WRITE, False)):
        decided = as_client(alice, "10.0.0.1", partial(access.allowed, operation, TOPIC, "orders"))
        assert decided is allowed, operation
    # a DENY for alice's host beats the ALLOW; from another host the ALLOW holds
    image.apply(
        acls_update(
            2,
            acl("User:CN=alice", Operation.READ),
            acl("User:CN=alice", Operation.READ, host="10.0.0.1", permission=Permission.DENY),
        )
    )
    assert not as_client(alice, "10.0.0.1", reads_orders)
    assert as_client(alice, "10.0.0.2", reads_orders)
    image.apply(acls_update(3))  # every ACL deleted
    assert not as_client(alice, "10.0.0.2", reads_orders)


@pytest.mark.timeout(30)
def test_without_a_session_the_request_is_anonymous_from_no_host(tmp_path: Path) -> None:
    image, access = secured(tmp_path)
    image.apply(
        acls_update(
            1,
            acl("User:ANONYMOUS", Operation.WRITE, host="127.0.0.1"),
            acl("User:ANONYMOUS", Operation.READ),
        )
    )
    assert access.requester() == ("User:ANONYMOUS", "")
    assert access.allowed(Operation.READ, TOPIC, "orders")
    assert not access.allowed(Operation.WRITE, TOPIC, "orders")  # only "*" hosts speak


@pytest.mark.timeout(30)
def test_refusals_carry_the_resource_types_error_code(tmp_path: Path) -> None:
    image, access = secured(tmp_path)
    image.apply(acls_update(1, acl("User:*", Operation.DESCRIBE, pattern=PatternType.PREFIXED)))
    expected = {
        TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
        CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
    for resource_type, code in expected.items():
        with pytest.raises(KafkaError) as refusal:
            access.check(Operation.WRITE, resource_type, "orders-eu")
        assert refusal.value.code is code
    with pytest.raises(KafkaError) as cluster:
        access.check_cluster(Operation.ALTER)
    assert cluster.value.code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    # the prefixed DESCRIBE for User:* covers "orders..." topics only
    access.check(Operation.DESCRIBE, TOPIC, "orders-eu")
    names = ["orders-eu", "orders-us", "payments"]
    assert access.refused(Operation.DESCRIBE, TOPIC, names) == {"payments"}


@pytest.mark.timeout(30)
def test_authorized_operations_and_super_users(tmp_path: Path) -> None:
    image, access = secured(tmp_path, super_users="User:CN=admin;User:CN=ops")
    image.apply(
        acls_update(
            1,
            acl("User:CN=alice", Operation.READ),
            acl("User:CN=alice", Operation.ALTER_CONFIGS),
            acl("User:CN=alice", Operation.IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME),
            acl("User:CN=bob", Operation.ALTER, CLUSTER, CLUSTER_NAME),
        )
    )

    def topic_operations() -> frozenset[Operation]:
        return authorized_operations(access, TOPIC, "orders")

    assert as_client("CN=alice", "h", topic_operations) == {
        Operation.READ,
        Operation.DESCRIBE,
        Operation.ALTER_CONFIGS,
        Operation.DESCRIBE_CONFIGS,
    }
    # the cluster's operations only for who may DESCRIBE it (ALTER implies DESCRIBE)
    assert as_client("CN=alice", "h", lambda: cluster_operations(access)) == frozenset()
    assert as_client("CN=bob", "h", lambda: cluster_operations(access)) == {
        Operation.ALTER,
        Operation.DESCRIBE,
    }
    for admin in ("CN=admin", "CN=ops"):
        assert as_client(admin, "h", topic_operations) == operations_for(TOPIC)
        assert as_client(admin, "h", lambda: cluster_operations(access)) == operations_for(CLUSTER)
    # idempotence: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic
    assert not as_client("CN=bob", "h", lambda: access.allowed_on_some(Operation.WRITE, TOPIC))
    image.apply(acls_update(2, acl("User:CN=bob", Operation.WRITE, name="logs-")))
    assert as_client("CN=bob", "h", lambda: access.allowed_on_some(Operation.WRITE, TOPIC))


@pytest.mark.timeout(30)
def test_with_the_authorizer_off_nothing_is_checked(tmp_path: Path) -> None:
    image = ClusterImage(LogConfig())
    assert (
        Access.from_settings(BrokerSettings.model_validate({"data_dir": tmp_path}), image) is None
    )
    assert image.on_security_change == []  # nothing follows the ACLs either
    # KIP-430 without an authorizer: every operation of the resource type
    assert authorized_operations(None, GROUP, "g") == operations_for(GROUP)
    assert cluster_operations(None) == operations_for(CLUSTER)
