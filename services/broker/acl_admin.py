"""Kafka's CreateAcls, DescribeAcls and DeleteAcls: what `kafka-acls.sh`, the admin clients'
create_acls / describe_acls / delete_acls, Strimzi's user operator and Terraform providers
send to manage ACLs.

Creating and deleting are carried out by the controller, which stores the ACLs in cluster
metadata; the answer waits (bounded) until this broker's image shows the change, so the
client's next request here is decided by the new ACLs. Describing is answered from this
broker's authorizer. As in Kafka, the three need the cluster's ALTER (create, delete) or
DESCRIBE (describe) permission, and a broker without an authorizer answers them with
SECURITY_DISABLED. A binding or filter Kafka refuses (directlog.security.acl) gets
INVALID_REQUEST and a message saying why, and the others of the request go on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from directlog.protocol.api import APIS, ApiKey, RequestHeader
from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.security import acl_messages
from directlog.security.acl import (
    AclBinding,
    AclBindingFilter,
    InvalidAclError,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    validate_binding,
    validate_filter,
)
from directlog.security.acl_messages import binding_message, filter_message, wire_enum
from services.broker.authorization import Access
from services.broker.cluster_metadata import ClusterImage
from services.broker.metrics import BrokerMetrics
from services.broker.partition_admin import ControllerCall

log = logging.getLogger(__name__)

NO_AUTHORIZER = "No Authorizer is configured."  # Kafka's words for SECURITY_DISABLED
NO_AUTHORIZER_ON_BROKER = "No Authorizer is configured on the broker"  # DescribeAcls'

_Outcome = tuple[ErrorCode, str | None]


class AclAdmin:
    def __init__(
        self,
        image: ClusterImage,
        call: ControllerCall,
        access: Access | None,
        metrics: BrokerMetrics,
    ) -> None:
        self.image = image
        self.call = call
        self.access = access
        self.metrics = metrics

    def handlers(self) -> dict[int, Callable[[Any, RequestHeader], Awaitable[Any]]]:
        return {
            ApiKey.CREATE_ACLS: self.create,
            ApiKey.DESCRIBE_ACLS: self.describe,
            ApiKey.DELETE_ACLS: self.delete,
        }

    def _refusal(self, api: str, operation: Operation) -> _Outcome | None:
        """What answers the whole request when the requester may not make it, or a broker
        without an authorizer gets it: None when it goes on."""
        access = self.access
        if access is None:
            outcome = ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER
        elif not access.allowed_on_cluster(operation):
            outcome = (
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"not authorized to {operation.name} the cluster's ACLs",
            )
        else:
            return None
        self._counted(api, outcome[0], outcome[1] or "")
        return outcome

    def _counted(self, api: str, code: ErrorCode, message: str) -> None:
        self.metrics.request_error(api, code)
        log.info("%s: %s: %s", api, code.name, message)

    # CreateAcls --------------------------------------------------------------------------

    async def create(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.CREATE_ACLS].response
        refusal = self._refusal("create_acls", Operation.ALTER)
        if refusal is not None:
            return response(
                throttle_time_ms=0,
                results=[
                    response.AclCreationResult(error_code=refusal[0], error_message=refusal[1])
                    for _ in request.creations
                ],
            )
        outcomes: list[_Outcome | None] = []
        valid: list[AclBinding] = []
        for creation in request.creations:
            binding = AclBinding(
                wire_enum(ResourceType, creation.resource_type),
                creation.resource_name,
                wire_enum(PatternType, creation.resource_pattern_type),
                creation.principal,
                creation.host,
                wire_enum(Operation, creation.operation),
                wire_enum(Permission, creation.permission_type),
            )
            try:
                validate_binding(binding)
            except InvalidAclError as error:
                self._counted("create_acls", error.code, str(error))
                outcomes.append((error.code, str(error)))
                continue
            outcomes.append(None)
            valid.append(binding)
        answers = iter(await self._create(valid) if valid else [])
        return response(
            throttle_time_ms=0,
            results=[
                response.AclCreationResult(error_code=code, error_message=message)
                for code, message in (
                    outcome if outcome is not None else next(answers) for outcome in outcomes
                )
            ],
        )

    async def _create(self, bindings: list[AclBinding]) -> list[_Outcome]:
        """The controller's outcome per binding, once the image holds the created ones."""

        def shown(reply: pb.CreateAclsReply) -> bool:
            acls = self.image.acls
            return all(
                result.error_code or binding in acls
                for binding, result in zip(bindings, reply.results, strict=True)
            )

        try:
            reply = await self.call(
                lambda s: s.CreateAcls,
                pb.CreateAclsRequest(creations=[binding_message(b) for b in bindings]),
                shown,
            )
        except KafkaError as error:
            self._counted("create_acls", error.code, str(error))
            return [(error.code, str(error))] * len(bindings)
        outcomes: list[_Outcome] = []
        for binding, result in zip(bindings, reply.results, strict=True):
            code = ErrorCode(result.error_code)
            if code is ErrorCode.NONE:
                log.info("ACL created: %s", binding)
            else:
                self._counted("create_acls", code, result.error_message)
            outcomes.append((code, result.error_message or None))
        return outcomes

    # DescribeAcls ------------------------------------------------------------------------

    async def describe(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.DESCRIBE_ACLS].response
        refusal = self._refusal("describe_acls", Operation.DESCRIBE)
        if refusal is None:
            assert self.access is not None, "without an authorizer _refusal answers"
            acl_filter = _request_filter(request)
            try:
                validate_filter(acl_filter)
            except InvalidAclError as error:
                self._counted("describe_acls", error.code, str(error))
                refusal = error.code, str(error)
            else:
                return self._described(response, self.access.authorizer.describe(acl_filter))
        code, message = refusal
        if code is ErrorCode.SECURITY_DISABLED:
            message = NO_AUTHORIZER_ON_BROKER
        return response(throttle_time_ms=0, error_code=code, error_message=message, resources=[])

    @staticmethod
    def _described(response: Any, bindings: list[AclBinding]) -> Any:
        """DescribeAcls' answer: the bindings grouped by resource pattern."""
        resource = response.DescribeAclsResource
        by_pattern: dict[tuple[int, str, int], list[Any]] = {}
        for binding in bindings:
            key = (binding.resource_type, binding.resource_name, binding.pattern_type)
            by_pattern.setdefault(key, []).append(
                resource.AclDescription(
                    principal=binding.principal,
                    host=binding.host,
                    operation=binding.operation,
                    permission_type=binding.permission,
                )
            )
        return response(
            throttle_time_ms=0,
            error_code=ErrorCode.NONE,
            error_message=None,
            resources=[
                resource(
                    resource_type=resource_type,
                    resource_name=name,
                    pattern_type=pattern_type,
                    acls=acls,
                )
                for (resource_type, name, pattern_type), acls in by_pattern.items()
            ],
        )

    # DeleteAcls --------------------------------------------------------------------------

    async def delete(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.DELETE_ACLS].response
        result = response.DeleteAclsFilterResult
        refusal = self._refusal("delete_acls", Operation.ALTER)
        if refusal is not None:
            return response(
                throttle_time_ms=0,
                filter_results=[
                    result(error_code=refusal[0], error_message=refusal[1], matching_acls=[])
                    for _ in request.filters
                ],
            )
        outcomes: list[tuple[ErrorCode, str | None, list[AclBinding]] | None] = []
        valid: list[AclBindingFilter] = []
        for item in request.filters:
            acl_filter = _request_filter(item)
            try:
                validate_filter(acl_filter)
            except InvalidAclError as error:
                self._counted("delete_acls", error.code, str(error))
                outcomes.append((error.code, str(error), []))
                continue
            outcomes.append(None)
            valid.append(acl_filter)
        answers = iter(await self._delete(valid) if valid else [])
        matching = result.DeleteAclsMatchingAcl
        results = []
        for outcome in outcomes:
            code, message, deleted = outcome if outcome is not None else next(answers)
            results.append(
                result(
                    error_code=code,
                    error_message=message,
                    matching_acls=[
                        matching(
                            error_code=ErrorCode.NONE,
                            error_message=None,
                            resource_type=b.resource_type,
                            resource_name=b.resource_name,
                            pattern_type=b.pattern_type,
                            principal=b.principal,
                            host=b.host,
                            operation=b.operation,
                            permission_type=b.permission,
                        )
                        for b in deleted
                    ],
                )
            )
        return response(throttle_time_ms=0, filter_results=results)

    async def _delete(
        self, filters: list[AclBindingFilter]
    ) -> list[tuple[ErrorCode, str | None, list[AclBinding]]]:
        """The controller's outcome per filter with the ACLs it deleted, once the image no
        longer holds them."""

        def gone(reply: pb.DeleteAclsReply) -> bool:
            acls = self.image.acls
            return not any(
                acl_messages.binding(deleted) in acls
                for result in reply.results
                for deleted in result.deleted
            )

        try:
            reply = await self.call(
                lambda s: s.DeleteAcls,
                pb.DeleteAclsRequest(filters=[filter_message(f) for f in filters]),
                gone,
            )
        except KafkaError as error:
            self._counted("delete_acls", error.code, str(error))
            return [(error.code, str(error), [])] * len(filters)
        outcomes: list[tuple[ErrorCode, str | None, list[AclBinding]]] = []
        for acl_filter, result in zip(filters, reply.results, strict=True):
            code = ErrorCode(result.error_code)
            deleted = [acl_messages.binding(message) for message in result.deleted]
            if code is ErrorCode.NONE:
                log.info("ACLs deleted by %s: %s", acl_filter, deleted)
            else:
                self._counted("delete_acls", code, result.error_message)
            outcomes.append((code, result.error_message or None, deleted))
        return outcomes


def _request_filter(item: Any) -> AclBindingFilter:
    """The filter a DescribeAcls request or a DeleteAcls filter carries (the same fields)."""
    return AclBindingFilter(
        wire_enum(ResourceType, item.resource_type_filter),
        item.resource_name_filter,
        wire_enum(PatternType, item.pattern_type_filter),
        item.principal_filter,
        item.host_filter,
        wire_enum(Operation, item.operation),
        wire_enum(Permission, item.permission_type),
    )
