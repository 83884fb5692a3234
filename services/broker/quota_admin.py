"""Kafka's DescribeClientQuotas and AlterClientQuotas (KIP-546): what `kafka-configs.sh
--entity-type users|clients` and admin clients send to read and set client quotas.

Describing is answered from this broker's image. An alteration is checked here by the rules
the controller applies (``directlog.security.client_quotas``), so a bad entry is answered
without a round trip; the rest go to the controller, and the answer waits (bounded) until
this broker's image shows them, so the client's next request here is metered by the new
quotas. As in Kafka, describing needs DESCRIBE_CONFIGS on the cluster and altering
ALTER_CONFIGS; every entry answers one error of its own, in the order of the request.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from directlog.protocol.api import APIS, ApiKey, RequestHeader
from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.security.acl import Operation
from directlog.security.client_quotas import QuotaEntity, describe, validate_alteration
from services.broker.authorization import CLUSTER, Access, denied
from services.broker.cluster_metadata import ClusterImage
from services.broker.metrics import BrokerMetrics
from services.broker.partition_admin import ControllerCall

log = logging.getLogger(__name__)

_Outcome = tuple[ErrorCode, str | None]
_Changes = dict[str, float | None]


class QuotaAdmin:
    def __init__(
        self,
        image: ClusterImage,
        call: ControllerCall,
        metrics: BrokerMetrics,
        access: Access | None = None,
    ) -> None:
        self.image = image
        self.call = call
        self.metrics = metrics
        self.access = access

    def handlers(self) -> dict[int, Callable[[Any, RequestHeader], Awaitable[Any]]]:
        return {
            ApiKey.DESCRIBE_CLIENT_QUOTAS: self.describe,
            ApiKey.ALTER_CLIENT_QUOTAS: self.alter,
        }

    def _refusal(self, api: str, operation: Operation) -> KafkaError | None:
        """CLUSTER_AUTHORIZATION_FAILED, counted and logged, unless the requester may
        perform ``operation`` on the cluster."""
        if self.access is None or self.access.allowed_on_cluster(operation):
            return None
        refusal = denied(operation, CLUSTER, "")
        self._counted(api, refusal.code, str(refusal))
        return refusal

    def _counted(self, api: str, code: ErrorCode, message: str) -> None:
        self.metrics.request_error(api, code)
        log.info("%s: %s: %s", api, code.name, message)

    # DescribeClientQuotas ----------------------------------------------------------------

    async def describe(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.DESCRIBE_CLIENT_QUOTAS].response
        error = self._refusal("describe_client_quotas", Operation.DESCRIBE_CONFIGS)
        if error is None:
            components = [(c.entity_type, c.match_type, c.match) for c in request.components]
            try:
                found = describe(self.image.client_quotas, components, request.strict)
            except KafkaError as refused:
                self._counted("describe_client_quotas", refused.code, str(refused))
                error = refused
            else:
                return response(
                    throttle_time_ms=0,
                    error_code=ErrorCode.NONE,
                    error_message=None,
                    entries=[_entry(response, entity, found[entity]) for entity in _sorted(found)],
                )
        return response(
            throttle_time_ms=0, error_code=error.code, error_message=str(error), entries=None
        )

    # AlterClientQuotas -------------------------------------------------------------------

    async def alter(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.ALTER_CLIENT_QUOTAS].response
        refusal = self._refusal("alter_client_quotas", Operation.ALTER_CONFIGS)
        outcomes: list[_Outcome | None] = []
        checked: list[tuple[QuotaEntity, _Changes]] = []
        named: set[QuotaEntity] = set()
        for entry in request.entries:
            if refusal is not None:
                outcomes.append((refusal.code, str(refusal)))
                continue
            try:
                entity = QuotaEntity(tuple((e.entity_type, e.entity_name) for e in entry.entity))
                if entity in named:  # as the controller refuses it
                    raise KafkaError(
                        ErrorCode.INVALID_REQUEST, f"Ignoring duplicate entity {entity}"
                    )
                named.add(entity)
                changes = validate_alteration(
                    entity, [(op.key, None if op.remove else op.value) for op in entry.ops]
                )
            except KafkaError as error:
                self._counted("alter_client_quotas", error.code, str(error))
                outcomes.append((error.code, str(error)))
                continue
            outcomes.append(None)
            checked.append((entity, changes))
        answers = iter(await self._alter(checked, request.validate_only) if checked else [])
        return response(
            throttle_time_ms=0,
            entries=[
                response.EntryData(
                    error_code=code,
                    error_message=message,
                    entity=[
                        response.EntryData.EntityData(
                            entity_type=e.entity_type, entity_name=e.entity_name
                        )
                        for e in entry.entity
                    ],
                )
                for entry, (code, message) in zip(
                    request.entries,
                    (outcome if outcome is not None else next(answers) for outcome in outcomes),
                    strict=True,
                )
            ],
        )

    async def _alter(
        self, checked: list[tuple[QuotaEntity, _Changes]], validate_only: bool
    ) -> list[_Outcome]:
        """The controller's outcome per alteration, once the image shows the accepted ones
        (at once for validate_only, which changes nothing)."""
        alterations = [
            pb.QuotaAlteration(
                entity=[
                    pb.QuotaEntityComponent(entity_type=entity_type, name=name)
                    for entity_type, name in entity.components
                ],
                ops=[pb.QuotaOp(key=key, value=value) for key, value in changes.items()],
            )
            for entity, changes in checked
        ]

        def shown(reply: pb.AlterClientQuotasReply) -> bool:
            if validate_only:
                return True
            quotas = self.image.client_quotas
            return all(
                result.error_code or _holds(quotas.get(entity, {}), changes)
                for (entity, changes), result in zip(checked, reply.results, strict=True)
            )

        try:
            reply = await self.call(
                lambda s: s.AlterClientQuotas,
                pb.AlterClientQuotasRequest(alterations=alterations, validate_only=validate_only),
                shown,
            )
        except KafkaError as error:
            self._counted("alter_client_quotas", error.code, str(error))
            return [(error.code, str(error))] * len(checked)
        outcomes: list[_Outcome] = []
        for (entity, changes), result in zip(checked, reply.results, strict=True):
            code = ErrorCode(result.error_code)
            if code is not ErrorCode.NONE:
                self._counted("alter_client_quotas", code, result.error_message)
            elif not validate_only:
                log.info("client quotas of %s altered: %s", entity, changes)
            outcomes.append((code, result.error_message or None))
        return outcomes


def _holds(values: dict[str, float], changes: _Changes) -> bool:
    """Whether an entity's quotas show the changes (None: the key removed)."""
    return all(values.get(key) == value for key, value in changes.items())


def _sorted(found: dict[QuotaEntity, dict[str, float]]) -> list[QuotaEntity]:
    """A stable order for the answer: by entity types, then names (defaults first)."""
    return sorted(
        found, key=lambda e: [(t, name is not None, name or "") for t, name in e.components]
    )


def _entry(response: Any, entity: QuotaEntity, values: dict[str, float]) -> Any:
    entry = response.EntryData
    return entry(
        entity=[
            entry.EntityData(entity_type=entity_type, entity_name=name)
            for entity_type, name in entity.components
        ],
        values=[entry.ValueData(key=key, value=values[key]) for key in sorted(values)],
    )
