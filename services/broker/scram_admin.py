"""Kafka's DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): how Kafka's
admin clients (`kafka-configs --alter --add-config 'SCRAM-SHA-512=[password=...]'`,
AdminClient.alter_user_scram_credentials) add and remove SASL/SCRAM users.

The client sends a salt and its SaltedPassword, never the password; this broker turns them
into the StoredKey and ServerKey that cluster metadata keeps, so the controller and the
consensus store never hold anything a client could log in with. Describing is answered from
this broker's image, and an alteration is answered once the image shows it, so the user can
log in here as soon as the answer arrives.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from directlog.protocol.api import APIS, ApiKey, RequestHeader
from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.security.acl import Operation
from directlog.security.scram import MAX_ITERATIONS, MIN_ITERATIONS, ScramCredential, ScramMechanism
from services.broker.authorization import CLUSTER, Access, denied
from services.broker.cluster_metadata import ClusterImage
from services.broker.partition_admin import ControllerCall

_Refusal = tuple[ErrorCode, str]


class ScramAdmin:
    """Describing credentials needs DESCRIBE on the cluster, altering them ALTER, as in Kafka
    (``access``: None with the authorizer off)."""

    def __init__(
        self, image: ClusterImage, call: ControllerCall, access: Access | None = None
    ) -> None:
        self.image = image
        self.call = call
        self.access = access

    def _refusal(self, operation: Operation) -> KafkaError | None:
        if self.access is None or self.access.allowed_on_cluster(operation):
            return None
        return denied(operation, CLUSTER, "")

    def handlers(self) -> dict[int, Callable[[Any, RequestHeader], Awaitable[Any]]]:
        return {
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: self.describe,
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: self.alter,
        }

    async def describe(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS].response
        named = [user.name for user in request.users or []]
        refusal = self._refusal(Operation.DESCRIBE)
        if refusal is not None:  # Kafka's answer: the error, and in a result per user named
            return response(
                throttle_time_ms=0,
                error_code=refusal.code,
                error_message=str(refusal),
                results=[
                    response.DescribeUserScramCredentialsResult(
                        user="",  # as Kafka: not saying which users exist
                        error_code=refusal.code,
                        error_message=str(refusal),
                        credential_infos=[],
                    )
                    for _ in named
                ],
            )
        stored = self.image.scram_users()
        results = []
        if not named:  # null or empty: every user
            named = sorted(stored)
        counts = {name: named.count(name) for name in named}
        for name in dict.fromkeys(named):
            code, message, infos = ErrorCode.NONE, None, []
            if counts[name] > 1:
                code = ErrorCode.DUPLICATE_RESOURCE
                message = (
                    "Cannot describe SCRAM credentials for the same user twice in a single request"
                )
            elif name not in stored:
                code = ErrorCode.RESOURCE_NOT_FOUND
                message = "Attempt to describe a user credential that does not exist"
            else:
                infos = [
                    response.DescribeUserScramCredentialsResult.CredentialInfo(
                        mechanism=credential.mechanism, iterations=credential.iterations
                    )
                    for credential in stored[name]
                ]
            results.append(
                response.DescribeUserScramCredentialsResult(
                    user=name, error_code=code, error_message=message, credential_infos=infos
                )
            )
        return response(throttle_time_ms=0, error_code=0, error_message=None, results=results)

    async def alter(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.ALTER_USER_SCRAM_CREDENTIALS].response
        users = list(dict.fromkeys(item.name for item in [*request.deletions, *request.upsertions]))
        refusal = self._refusal(Operation.ALTER)
        if refusal is not None:
            return response(
                throttle_time_ms=0,
                results=[
                    response.AlterUserScramCredentialsResult(
                        user=user, error_code=refusal.code, error_message=str(refusal)
                    )
                    for user in users
                ],
            )
        refused = self._refusals(request)
        upsertions = [
            self._credential(item) for item in request.upsertions if item.name not in refused
        ]
        deletions = [
            pb.ScramDeletion(user=item.name, mechanism=item.mechanism)
            for item in request.deletions
            if item.name not in refused
        ]
        outcome: dict[str, _Refusal] = dict(refused)
        if upsertions or deletions:
            try:
                reply = await self.call(
                    lambda s: s.AlterUserScramCredentials,
                    pb.AlterUserScramCredentialsRequest(upsertions=upsertions, deletions=deletions),
                    lambda reply: self._shown(reply, upsertions, deletions),
                )
            except KafkaError as error:
                for user in users:
                    outcome.setdefault(user, (error.code, str(error)))
            else:
                for result in reply.results:
                    outcome.setdefault(
                        result.user, (ErrorCode(result.error_code), result.error_message)
                    )
        results = []
        for user in users:
            code, message = outcome.get(user, (ErrorCode.NONE, ""))
            results.append(
                response.AlterUserScramCredentialsResult(
                    user=user, error_code=code, error_message=message or None
                )
            )
        return response(throttle_time_ms=0, results=results)

    @staticmethod
    def _refusals(request: Any) -> dict[str, _Refusal]:
        """Users whose alteration this broker refuses before the controller sees it: each
        with Kafka's error for the first problem found."""
        refused: dict[str, _Refusal] = {}
        seen: set[tuple[str, int]] = set()
        for item in [*request.deletions, *request.upsertions]:
            key = (item.name, item.mechanism)
            problem: _Refusal | None = None
            if key in seen:
                problem = (
                    ErrorCode.DUPLICATE_RESOURCE,
                    "A user credential cannot be altered twice in the same request",
                )
            elif not item.name:
                problem = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
            elif item.mechanism not in tuple(ScramMechanism):
                problem = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
            elif hasattr(item, "salted_password"):
                problem = _upsertion_problem(item)
            seen.add(key)
            if problem is not None:
                refused.setdefault(item.name, problem)
        return refused

    @staticmethod
    def _credential(item: Any) -> pb.ScramCredential:
        credential = ScramCredential.from_salted_password(
            ScramMechanism(item.mechanism), item.salted_password, item.salt, item.iterations
        )
        return pb.ScramCredential(
            user=item.name,
            mechanism=item.mechanism,
            salt=credential.salt,
            stored_key=credential.stored_key,
            server_key=credential.server_key,
            iterations=credential.iterations,
        )

    def _shown(
        self,
        reply: Any,
        upsertions: list[pb.ScramCredential],
        deletions: list[pb.ScramDeletion],
    ) -> bool:
        """Whether the image shows every change the controller accepted."""
        accepted = {r.user for r in reply.results if r.error_code == 0}
        for item in upsertions:
            if item.user in accepted:
                held = self.image.scram_credential(item.user, item.mechanism)
                if held is None or held.stored_key != item.stored_key:
                    return False
        return all(
            self.image.scram_credential(item.user, item.mechanism) is None
            for item in deletions
            if item.user in accepted
        )


def _upsertion_problem(item: Any) -> _Refusal | None:
    if item.iterations < MIN_ITERATIONS:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, f"Too few iterations: {item.iterations}"
    if item.iterations > MAX_ITERATIONS:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, f"Too many iterations: {item.iterations}"
    if not item.salt:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Salt must not be empty"
    if len(item.salted_password) != ScramMechanism(item.mechanism).digest_size:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Salted password has the wrong length"
    return None
