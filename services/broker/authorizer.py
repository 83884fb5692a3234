"""The broker's ACL authorizer, with Kafka's StandardAuthorizer semantics.

The broker receives the whole ACL set from cluster metadata on every change and hands it to
`Authorizer.update`, which builds an index and fresh decision caches; requests then ask
`authorize` once per resource they touch, so the hot path is a cache hit and a miss costs a
few dict lookups per pattern that could match, never a scan of all the ACLs:

- literal names (the wildcard "*" among them) are dict keys per resource type;
- prefixed patterns sit in a character trie per resource type, walked along the requested
  name only as far as some stored prefix goes. Probing a dict with each prefix of the name
  whose length some stored prefix has was measured too, with 10,000 ACLs: 1.6 against
  0.3 µs for the trie on names that diverge early, 0.9 against 1.05 µs on names sharing
  long dotted paths ("com.acme.team7."); the trie's cost is bounded by how far stored
  prefixes follow the name, the dict's grows with every distinct prefix length;
- under each pattern, grants are grouped by principal, then host, as two operation
  bitmasks (denied, allowed), the allowed one already holding the operations an ALLOW
  implies.

Rules, as Kafka applies them: super users may do anything; otherwise the ACLs of every
pattern matching the resource count, and an ACL speaks for the request when its principal
is the requester's or "User:*", its host the client's or "*", and its operation the
requested one or ALL, or one implying it (ALLOW of READ, WRITE, DELETE or ALTER implies
DESCRIBE; ALLOW of ALTER_CONFIGS implies DESCRIBE_CONFIGS; a DENY implies nothing). A DENY
that speaks wins over any ALLOW; without an ALLOW the answer is no, unless no ACL at all
names the resource, in which case `allow_everyone_if_no_acl_found` decides.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from directlog.security.acl import (
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

# Decisions are keyed by (principal, host, operation, resource type, name); the bound keeps
# a broker with many clients and topics from growing without limit.
_CACHE_SIZE = 32_768
_BY_TYPE_CACHE_SIZE = 4_096

_EVERY_OPERATION = sum(1 << operation for operation in Operation)
_IMPLIED_BY_ALLOW = {
    Operation.READ: Operation.DESCRIBE,
    Operation.WRITE: Operation.DESCRIBE,
    Operation.DELETE: Operation.DESCRIBE,
    Operation.ALTER: Operation.DESCRIBE,
    Operation.ALTER_CONFIGS: Operation.DESCRIBE_CONFIGS,
}
_NOT_ACTIONS = (Operation.UNKNOWN, Operation.ANY)
_NOT_RESOURCES = (ResourceType.UNKNOWN, ResourceType.ANY)

# The grants of one resource pattern: principal -> host -> [denied bits, allowed bits].
_Grants = dict[str, dict[str, list[int]]]


class _PrefixNode:
    """A trie node: the grants of the PREFIXED pattern spelled by the path to it, if any."""

    __slots__ = ("children", "grants")

    def __init__(self) -> None:
        self.children: dict[str, _PrefixNode] = {}
        self.grants: _Grants | None = None


def _grant(grants: _Grants, binding: AclBinding) -> None:
    masks = grants.setdefault(binding.principal, {}).setdefault(binding.host, [0, 0])
    bits = _EVERY_OPERATION if binding.operation == Operation.ALL else 1 << binding.operation
    if binding.permission == Permission.DENY:
        masks[0] |= bits
        return
    implied = _IMPLIED_BY_ALLOW.get(binding.operation)
    masks[1] |= bits if implied is None else bits | 1 << implied


def _verdict(grants: _Grants, principal: str, host: str, bit: int) -> bool | None:
    """False when a DENY of this pattern speaks for the request, True when only ALLOWs do,
    None when none of its ACLs does."""
    allowed = False
    for who in (principal, WILDCARD_PRINCIPAL):
        hosts = grants.get(who)
        if hosts is None:
            continue
        for where in (host, WILDCARD):
            masks = hosts.get(where)
            if masks is None:
                continue
            if masks[0] & bit:
                return False
            allowed = allowed or bool(masks[1] & bit)
    return True if allowed else None


def _check_action(operation: Operation, resource_type: ResourceType) -> None:
    if operation in _NOT_ACTIONS or resource_type in _NOT_RESOURCES:
        raise ValueError(f"cannot authorize {operation!r} on {resource_type!r}: filter values")


def _under_denied_prefix(name: str, denied_prefixes: set[str]) -> bool:
    return any(name[:length] in denied_prefixes for length in range(1, len(name) + 1))


class _Index:
    """One immutable ACL set, indexed for decisions; `update` swaps in a new one."""

    __slots__ = (
        "allow_everyone",
        "bindings",
        "by_principal",
        "literal",
        "prefixed",
        "super_users",
    )

    def __init__(
        self, bindings: frozenset[AclBinding], super_users: frozenset[str], allow_everyone: bool
    ) -> None:
        self.bindings = bindings
        self.super_users = super_users
        self.allow_everyone = allow_everyone
        self.literal: dict[ResourceType, dict[str, _Grants]] = {}
        self.prefixed: dict[ResourceType, _PrefixNode] = {}
        # For authorize_by_type: the ACLs per (resource type, principal).
        self.by_principal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        for binding in bindings:
            if binding.pattern_type == PatternType.LITERAL:
                literal = self.literal.setdefault(binding.resource_type, {})
                _grant(literal.setdefault(binding.resource_name, {}), binding)
            elif binding.pattern_type == PatternType.PREFIXED:
                node = self.prefixed.setdefault(binding.resource_type, _PrefixNode())
                for character in binding.resource_name:
                    child = node.children.get(character)
                    if child is None:
                        child = node.children[character] = _PrefixNode()
                    node = child
                if node.grants is None:
                    node.grants = {}
                _grant(node.grants, binding)
            else:
                raise ValueError(f"not a stored ACL (pattern type): {binding}")
            key = (binding.resource_type, binding.principal)
            self.by_principal.setdefault(key, []).append(binding)

    def decide(
        self,
        principal: str,
        host: str,
        operation: Operation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        _check_action(operation, resource_type)
        if principal in self.super_users:
            return True
        literal = self.literal.get(resource_type, {})
        patterns = [literal.get(name), literal.get(WILDCARD)]
        node = self.prefixed.get(resource_type)
        if node is not None:
            for character in name:
                found = node.children.get(character)
                if found is None:
                    break
                node = found
                patterns.append(node.grants)
        bit = 1 << operation
        named = allowed = False
        for grants in patterns:
            if grants is None:
                continue
            named = True
            verdict = _verdict(grants, principal, host, bit)
            if verdict is False:
                return False
            allowed = allowed or verdict is True
        return allowed if named else self.allow_everyone

    def decide_by_type(
        self, principal: str, host: str, operation: Operation, resource_type: ResourceType
    ) -> bool:
        """Kafka's authorizeByResourceType: is there at least one resource of the type the
        principal may use for the operation (implied operations do not count here, except
        through the wildcard, as in Kafka)? Kafka first authorizes a made-up resource name
        to let super users, wildcard ACLs and allow_everyone_if_no_acl_found answer; here
        that is a name no literal or prefixed ACL mentions, so only the wildcard ACLs
        count, whatever names the ACLs happen to use."""
        _check_action(operation, resource_type)
        if principal in self.super_users:
            return True
        wildcard = self.literal.get(resource_type, {}).get(WILDCARD)
        if wildcard is None:
            if self.allow_everyone:
                return True
        else:
            verdict = _verdict(wildcard, principal, host, 1 << operation)
            if verdict is not None:
                return verdict
        denied_literals: set[str] = set()
        denied_prefixes: set[str] = set()
        allowed_literals: set[str] = set()
        allowed_prefixes: set[str] = set()
        for who in {principal, WILDCARD_PRINCIPAL}:
            for binding in self.by_principal.get((resource_type, who), ()):
                if binding.host not in (host, WILDCARD):
                    continue
                if binding.operation not in (operation, Operation.ALL):
                    continue
                literal = binding.pattern_type == PatternType.LITERAL
                if binding.permission == Permission.DENY:
                    (denied_literals if literal else denied_prefixes).add(binding.resource_name)
                else:
                    (allowed_literals if literal else allowed_prefixes).add(binding.resource_name)
        # An allowed name counts unless a DENY covers it: the same literal name, or a denied
        # prefix of it. An allowed prefix counts unless a denied prefix covers it.
        if any(
            name not in denied_literals and not _under_denied_prefix(name, denied_prefixes)
            for name in allowed_literals
        ):
            return True
        return any(not _under_denied_prefix(prefix, denied_prefixes) for prefix in allowed_prefixes)


class Authorizer:
    """Decides whether a principal connected from a host may perform an operation on a
    resource. Thread-safe for readers while `update` runs: each ACL set comes with its own
    caches, so a decision made against the previous set never lands in the new set's cache.
    """

    authorize: Callable[[str, str, Operation, ResourceType, str], bool]
    """authorize(principal, host, operation, resource_type, name): may `principal`
    ("User:alice"), connected from `host` (the client's IP address as text), perform
    `operation` on the resource `resource_type`/`name`? The current ACL set's cached
    decision itself, swapped by `update`: a check that hits the cache is one call, what
    every request pays (a method around it cost a third more)."""

    def __init__(
        self, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False
    ) -> None:
        self._super_users = frozenset(super_users)
        self._allow_everyone = allow_everyone_if_no_acl_found
        self._index: _Index
        self._authorize_by_type: Callable[[str, str, Operation, ResourceType], bool]
        self.update(())

    def update(self, bindings: Iterable[AclBinding]) -> None:
        """Replace the whole ACL set, as cluster metadata delivers it; caches start empty.
        Indexing 10,000 ACLs takes some 25 ms, so a caller on an event loop may run this in
        a thread: requests keep the previous set until the new one is swapped in whole."""
        index = _Index(frozenset(bindings), self._super_users, self._allow_everyone)
        self.authorize = functools.lru_cache(maxsize=_CACHE_SIZE)(index.decide)
        self._authorize_by_type = functools.lru_cache(maxsize=_BY_TYPE_CACHE_SIZE)(
            index.decide_by_type
        )
        self._index = index

    def authorize_by_type(
        self, principal: str, host: str, operation: Operation, resource_type: ResourceType
    ) -> bool:
        """May the principal perform the operation on at least one resource of the type?
        (InitProducerId lets an idempotent producer in when it may WRITE some topic.)"""
        return self._authorize_by_type(principal, host, operation, resource_type)

    def describe(self, filter: AclBindingFilter) -> list[AclBinding]:
        """The ACLs a DescribeAcls filter selects, sorted so answers are stable."""
        return sorted(binding for binding in self._index.bindings if filter.matches(binding))

    def authorized_operations(
        self, principal: str, host: str, resource_type: ResourceType, name: str
    ) -> frozenset[Operation]:
        """KIP-430: which of the resource type's operations the principal may perform on it."""
        return frozenset(
            operation
            for operation in operations_for(resource_type)
            if self.authorize(principal, host, operation, resource_type, name)
        )

    @property
    def bindings(self) -> frozenset[AclBinding]:
        return self._index.bindings

    @property
    def super_users(self) -> frozenset[str]:
        """The principals allowed everything, whatever the ACLs say."""
        return self._super_users
