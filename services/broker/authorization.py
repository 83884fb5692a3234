"""Kafka's ACL authorization of the requests a broker answers (docs/security.md "ACLs").

With the authorizer off (the default) the broker has no `Access` at all: handlers see None
and skip every check, so requests cost one comparison more than before. With it on, each
handler asks once per resource a request names (a topic, a group, the cluster), and the
`Authorizer` answers from its cache; the ACLs come from the cluster image and are swapped
in whole as soon as the image holds a change, so every broker applies a new ACL within one
metadata update.

Who asks is the connection's session (services/broker/authentication.py): its principal and
the client's IP address. A request handled with no session (in-process tests) is
User:ANONYMOUS from no host, which only ACLs for the host "*" speak for.
"""

from __future__ import annotations

from collections.abc import Iterable

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.security.acl import CLUSTER_NAME, Operation, ResourceType, operations_for
from services.broker.authentication import ANONYMOUS, SESSION
from services.broker.authorizer import Authorizer
from services.broker.cluster_metadata import ClusterImage, SecurityKind
from services.broker.settings import BrokerSettings

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
TRANSACTIONAL_ID = ResourceType.TRANSACTIONAL_ID

# What a denied resource answers, per resource type (Kafka's *_AUTHORIZATION_FAILED).
_DENIED = {
    TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


def denied(operation: Operation, resource_type: ResourceType, name: str) -> KafkaError:
    """The error answering a request item the requester may not perform `operation` on."""
    what = "the cluster" if resource_type == CLUSTER else f"{resource_type.name.lower()} {name!r}"
    return KafkaError(_DENIED[resource_type], f"not authorized to {operation.name} {what}")


class Access:
    """The authorizer as request handlers use it: decisions for the current connection's
    principal and host. A super user is let through before the decision cache is asked,
    so the brokers' own traffic pays one set lookup per check."""

    __slots__ = ("_super_users", "authorizer")

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer
        self._super_users = authorizer.super_users

    @classmethod
    def from_settings(cls, settings: BrokerSettings, image: ClusterImage) -> Access | None:
        """The broker's access control, following the image's ACLs; None with the
        authorizer off."""
        if not settings.authorizer_enabled:
            return None
        access = cls(Authorizer(settings.super_users, settings.allow_everyone_if_no_acl_found))
        access.follow(image)
        return access

    def follow(self, image: ClusterImage) -> None:
        """Decide by the image's ACLs from now on, and by each new set the moment the image
        takes it."""
        self.authorizer.update(image.acls)

        def changed(kinds: frozenset[SecurityKind]) -> None:
            if SecurityKind.ACLS in kinds:
                self.authorizer.update(image.acls)

        image.on_security_change.append(changed)

    @staticmethod
    def requester() -> tuple[str, str]:
        """The principal and client address of the request being handled."""
        session = SESSION.get()
        if session is None:
            return ANONYMOUS, ""
        return session.principal, session.client_host

    def allowed(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        # Every request's check: the session read inline, then at most the cached decision.
        session = SESSION.get()
        if session is None:
            principal, host = ANONYMOUS, ""
        else:
            principal, host = session.principal, session.client_host
        if principal in self._super_users:
            return True
        return self.authorizer.authorize(principal, host, operation, resource_type, name)

    def allowed_on_cluster(self, operation: Operation) -> bool:
        return self.allowed(operation, CLUSTER, CLUSTER_NAME)

    def allowed_on_some(self, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether some resource of the type allows the operation (Kafka's
        authorizeByResourceType)."""
        principal, host = self.requester()
        return self.authorizer.authorize_by_type(principal, host, operation, resource_type)

    def check(self, operation: Operation, resource_type: ResourceType, name: str) -> None:
        """Raise the resource type's *_AUTHORIZATION_FAILED error unless allowed."""
        if not self.allowed(operation, resource_type, name):
            raise denied(operation, resource_type, name)

    def check_cluster(self, operation: Operation) -> None:
        """Raise CLUSTER_AUTHORIZATION_FAILED unless the cluster allows the operation."""
        self.check(operation, CLUSTER, CLUSTER_NAME)

    def refused(
        self, operation: Operation, resource_type: ResourceType, names: Iterable[str]
    ) -> set[str]:
        """The names among `names` the operation is not allowed on."""
        principal, host = self.requester()
        if principal in self._super_users:
            return set()
        authorize = self.authorizer.authorize
        return {n for n in names if not authorize(principal, host, operation, resource_type, n)}

    def operations(self, resource_type: ResourceType, name: str) -> frozenset[Operation]:
        """KIP-430: the operations the requester may perform on the resource."""
        principal, host = self.requester()
        return self.authorizer.authorized_operations(principal, host, resource_type, name)


def authorized_operations(
    access: Access | None, resource_type: ResourceType, name: str
) -> frozenset[Operation]:
    """KIP-430's field: without an authorizer Kafka reports every operation of the type."""
    if access is None:
        return operations_for(resource_type)
    return access.operations(resource_type, name)


def cluster_operations(access: Access | None) -> frozenset[Operation]:
    """KIP-430's cluster field: none to a requester who may not DESCRIBE the cluster."""
    if access is not None and not access.allowed_on_cluster(Operation.DESCRIBE):
        return frozenset()
    return authorized_operations(access, CLUSTER, CLUSTER_NAME)
