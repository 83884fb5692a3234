"""ACL bindings and filters as the controller's gRPC messages carry them
(proto/controller.proto), both ways, for the broker and the controller alike.

Reading is lenient, as Kafka reads its own wire: a code it does not know becomes UNKNOWN,
which `validate_binding` / `validate_filter` then refuse with Kafka's error.
"""

from __future__ import annotations

from typing import TypeVar

from directlog.rpc import controller_pb2 as pb
from directlog.security.acl import (
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

E = TypeVar("E", ResourceType, PatternType, Operation, Permission)


def wire_enum(kind: type[E], code: int) -> E:
    """A wire code as its enum; one Kafka does not know is UNKNOWN."""
    try:
        return kind(code)
    except ValueError:
        return kind(0)


def binding(message: pb.AclBinding) -> AclBinding:
    return AclBinding(
        wire_enum(ResourceType, message.resource_type),
        message.resource_name,
        wire_enum(PatternType, message.pattern_type),
        message.principal,
        message.host,
        wire_enum(Operation, message.operation),
        wire_enum(Permission, message.permission),
    )


def binding_filter(message: pb.AclBindingFilter) -> AclBindingFilter:
    return AclBindingFilter(
        wire_enum(ResourceType, message.resource_type),
        message.resource_name if message.HasField("resource_name") else None,
        wire_enum(PatternType, message.pattern_type),
        message.principal if message.HasField("principal") else None,
        message.host if message.HasField("host") else None,
        wire_enum(Operation, message.operation),
        wire_enum(Permission, message.permission),
    )


def binding_message(acl: AclBinding) -> pb.AclBinding:
    return pb.AclBinding(
        resource_type=acl.resource_type,
        resource_name=acl.resource_name,
        pattern_type=acl.pattern_type,
        principal=acl.principal,
        host=acl.host,
        operation=acl.operation,
        permission=acl.permission,
    )


def filter_message(acl_filter: AclBindingFilter) -> pb.AclBindingFilter:
    return pb.AclBindingFilter(
        resource_type=acl_filter.resource_type,
        resource_name=acl_filter.resource_name,
        pattern_type=acl_filter.pattern_type,
        principal=acl_filter.principal,
        host=acl_filter.host,
        operation=acl_filter.operation,
        permission=acl_filter.permission,
    )
