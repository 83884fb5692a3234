"""Kafka's ACL model, shared by the broker's authorizer and the controller that stores ACLs.

The enums carry Kafka's wire codes (CreateAcls, DescribeAcls and DeleteAcls send them as
int8), so a binding read off the wire or out of cluster metadata needs no translation.
Validation follows what a Kafka 3.7 cluster accepts, so ACLs that tools such as
kafka-acls.sh, Strimzi or Terraform providers create on Kafka are accepted here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from directlog.protocol.errors import ErrorCode, KafkaError


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    """LITERAL and PREFIXED are stored; ANY and MATCH exist only in filters (KIP-290)."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"  # a LITERAL resource named "*" matches every name; also the any-host value
WILDCARD_PRINCIPAL = "User:*"  # matches every principal, whatever its type


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    """One stored ACL: a resource pattern and the access entry attached to it."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """What DescribeAcls and DeleteAcls select with: ANY and None match every value, and a
    MATCH pattern type selects the ACLs that would apply to the named resource (the literal
    name, the literal wildcard and every prefix of the name)."""

    resource_type: ResourceType
    resource_name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    def matches(self, binding: AclBinding) -> bool:
        return self._matches_pattern(binding) and self._matches_entry(binding)

    def _matches_pattern(self, binding: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, binding.resource_type):
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH, binding.pattern_type):
            return False
        if self.resource_name is None:
            return True
        if self.pattern_type in (PatternType.ANY, binding.pattern_type):
            return self.resource_name == binding.resource_name
        # MATCH: would this stored pattern apply to a resource with the filter's name?
        if binding.pattern_type == PatternType.LITERAL:
            return binding.resource_name in (self.resource_name, WILDCARD)
        return self.resource_name.startswith(binding.resource_name)

    def _matches_entry(self, binding: AclBinding) -> bool:
        return (
            self.principal in (None, binding.principal)
            and self.host in (None, binding.host)
            and self.operation in (Operation.ANY, binding.operation)
            and self.permission in (Permission.ANY, binding.permission)
        )


class InvalidAclError(KafkaError):
    """A binding or filter a client may not use; the message is what the client is told.
    Kafka answers each of these refusals with INVALID_REQUEST, per binding or filter."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, message)


_FILTER_ONLY_RESOURCE_TYPES = (ResourceType.UNKNOWN, ResourceType.ANY)
_STORED_PATTERN_TYPES = (PatternType.LITERAL, PatternType.PREFIXED)
_FILTER_ONLY_OPERATIONS = (Operation.UNKNOWN, Operation.ANY)
_STORED_PERMISSIONS = (Permission.ALLOW, Permission.DENY)


def validate_binding(binding: AclBinding) -> None:
    """Refuse what CreateAcls may not store. As in Kafka, an operation that no request ever
    checks on the resource type (WRITE on the cluster, say) is accepted (only kafka-acls.sh
    refuses it), a CLUSTER pattern is judged by its name alone, a PREFIXED "*" is an
    ordinary prefix rather than a wildcard, and the host is not checked."""
    if binding.resource_type in _FILTER_ONLY_RESOURCE_TYPES:
        raise InvalidAclError(f"invalid resource type {binding.resource_type.name} for an ACL")
    if binding.pattern_type not in _STORED_PATTERN_TYPES:
        raise InvalidAclError(
            f"invalid pattern type {binding.pattern_type.name} for an ACL: "
            "it must be LITERAL or PREFIXED"
        )
    if binding.operation in _FILTER_ONLY_OPERATIONS:
        raise InvalidAclError(f"invalid operation {binding.operation.name} for an ACL")
    if binding.permission not in _STORED_PERMISSIONS:
        raise InvalidAclError(
            f"invalid permission type {binding.permission.name} for an ACL: "
            "it must be ALLOW or DENY"
        )
    if not binding.resource_name:
        raise InvalidAclError("an ACL's resource name must not be empty")
    if binding.resource_type == ResourceType.CLUSTER and binding.resource_name != CLUSTER_NAME:
        raise InvalidAclError(f"the CLUSTER resource is named {CLUSTER_NAME}")
    parse_principal(binding.principal)


def validate_filter(filter: AclBindingFilter) -> None:
    """Refuse a DescribeAcls or DeleteAcls filter holding a value Kafka does not know."""
    unknown = [
        label
        for label, is_unknown in (
            ("resource type", filter.resource_type == ResourceType.UNKNOWN),
            ("pattern type", filter.pattern_type == PatternType.UNKNOWN),
            ("operation", filter.operation == Operation.UNKNOWN),
            ("permission type", filter.permission == Permission.UNKNOWN),
        )
        if is_unknown
    ]
    if unknown:
        raise InvalidAclError(f"the ACL filter holds UNKNOWN values: {', '.join(unknown)}")


def parse_principal(principal: str) -> tuple[str, str]:
    """Split "Type:name" at its first colon, as Kafka does: "User:CN=a:b" is the User
    "CN=a:b", and either side may be empty; only a principal without a colon is refused."""
    kind, colon, name = principal.partition(":")
    if not colon:
        raise InvalidAclError(
            f"principal {principal!r} is not of the form Type:name (no colon separates them)"
        )
    return kind, name


_OPERATIONS = {
    ResourceType.TOPIC: frozenset(
        {
            Operation.READ,
            Operation.WRITE,
            Operation.CREATE,
            Operation.DELETE,
            Operation.ALTER,
            Operation.DESCRIBE,
            Operation.DESCRIBE_CONFIGS,
            Operation.ALTER_CONFIGS,
        }
    ),
    ResourceType.GROUP: frozenset({Operation.READ, Operation.DELETE, Operation.DESCRIBE}),
    ResourceType.CLUSTER: frozenset(
        {
            Operation.CREATE,
            Operation.ALTER,
            Operation.DESCRIBE,
            Operation.CLUSTER_ACTION,
            Operation.DESCRIBE_CONFIGS,
            Operation.ALTER_CONFIGS,
            Operation.IDEMPOTENT_WRITE,
        }
    ),
    ResourceType.TRANSACTIONAL_ID: frozenset({Operation.WRITE, Operation.DESCRIBE}),
    ResourceType.DELEGATION_TOKEN: frozenset({Operation.DESCRIBE}),
    ResourceType.USER: frozenset({Operation.CREATE_TOKENS, Operation.DESCRIBE_TOKENS}),
}


def operations_for(resource_type: ResourceType) -> frozenset[Operation]:
    """The operations some request checks on a resource of this type: the set KIP-430's
    authorized-operations fields report from (Kafka 3.7's; groups gain the config
    operations only in later releases)."""
    operations = _OPERATIONS.get(resource_type)
    if operations is None:
        raise ValueError(f"{resource_type.name} is not a concrete resource type")
    return operations
