"""The check every request handler makes (`Access.allowed` and `Access.refused`): it reads
the connection's session itself, lets super users through before the decision cache is
asked (so the brokers' own traffic neither pays for the cache nor takes room in it), and
asks the authorizer's current ACL set each time, so a check after an update never answers
from the previous set's decisions."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from directlog.security.acl import (
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from services.broker.authentication import NO_SASL, PLAINTEXT, SESSION, Session
from services.broker.authorization import Access
from services.broker.authorizer import Authorizer

T = TypeVar("T")
TOPIC = ResourceType.TOPIC
ROOT, ALICE = "User:root", "User:alice"
HOST = "10.0.0.1"


def binding(
    principal: str,
    operation: Operation,
    name: str = "orders",
    permission: Permission = Permission.ALLOW,
) -> AclBinding:
    return AclBinding(TOPIC, name, PatternType.LITERAL, principal, WILDCARD, operation, permission)


def as_user(principal: str, call: Callable[[], T]) -> T:
    """`call()` while serving a connection from HOST logged in as `principal`."""
    session = Session(PLAINTEXT, NO_SASL, principal.removeprefix("User:"), HOST)

    def served() -> T:
        SESSION.set(session)
        return call()

    return contextvars.copy_context().run(served)


def cached(authorizer: Authorizer) -> int:
    """How many decisions the authorizer's current cache holds."""
    decide: Any = authorizer.authorize  # the lru_cache of the current ACL set
    return int(decide.cache_info().currsize)


@pytest.mark.timeout(10)
def test_super_users_pass_every_check_before_the_decision_cache() -> None:
    authorizer = Authorizer([ROOT])
    # Denies that would stop anyone else: a super user is let through all the same.
    authorizer.update(
        [
            binding(WILDCARD_PRINCIPAL, Operation.ALL, WILDCARD, Permission.DENY),
            binding(ALICE, Operation.WRITE),
        ]
    )
    access = Access(authorizer)
    names = ["orders", "payments", "audit"]

    assert as_user(ROOT, lambda: access.allowed(Operation.WRITE, TOPIC, "orders"))
    assert as_user(ROOT, lambda: access.refused(Operation.DELETE, TOPIC, names)) == set()
    assert cached(authorizer) == 0

    # Anyone else is decided by the ACLs, and the decisions are cached.
    assert not as_user(ALICE, lambda: access.allowed(Operation.WRITE, TOPIC, "orders"))
    assert as_user(ALICE, lambda: access.refused(Operation.DELETE, TOPIC, names)) == set(names)
    assert cached(authorizer) == 4


@pytest.mark.timeout(10)
def test_without_a_session_the_anonymous_principal_may_be_a_super_user() -> None:
    authorizer = Authorizer(["User:ANONYMOUS"])
    authorizer.update([binding(WILDCARD_PRINCIPAL, Operation.ALL, WILDCARD, Permission.DENY)])
    access = Access(authorizer)
    assert access.allowed(Operation.ALTER, TOPIC, "orders")
    assert access.refused(Operation.READ, TOPIC, ["orders"]) == set()
    assert not as_user(ALICE, lambda: access.allowed(Operation.READ, TOPIC, "orders"))


@pytest.mark.timeout(10)
def test_checks_follow_each_update_of_the_acls() -> None:
    authorizer = Authorizer([ROOT])
    authorizer.update([binding(ALICE, Operation.WRITE)])
    access = Access(authorizer)

    def writes() -> bool:
        return access.allowed(Operation.WRITE, TOPIC, "orders")

    assert as_user(ALICE, writes)
    assert as_user(ALICE, writes)  # from the cache
    authorizer.update([binding(ALICE, Operation.WRITE, permission=Permission.DENY)])
    assert cached(authorizer) == 0
    assert not as_user(ALICE, writes)
    assert as_user(ALICE, lambda: access.refused(Operation.WRITE, TOPIC, ["orders"])) == {"orders"}
    authorizer.update([binding(ALICE, Operation.WRITE), binding(ALICE, Operation.READ)])
    assert as_user(ALICE, writes)
    assert as_user(ALICE, lambda: access.allowed(Operation.DESCRIBE, TOPIC, "orders"))
    assert as_user(ROOT, writes)
