"""Kafka's ElectLeaders, AlterPartitionReassignments and ListPartitionReassignments: what
`kafka-leader-election`, `kafka-reassign-partitions` and the `directlog` CLI send. The first
two are carried out by the controller, the answer waiting (bounded) until this broker's image
shows the outcome; the list is answered from the image, where a reassignment in progress
shows as adding and removing replicas (KIP-455)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from directlog.protocol.api import APIS, ApiKey, RequestHeader
from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.security.acl import Operation
from directlog.topics import TopicPartition
from services.broker.authorization import CLUSTER, Access, denied
from services.broker.cluster_metadata import ClusterImage
from services.broker.metrics import BrokerMetrics

log = logging.getLogger(__name__)

# Send a request to the controller, then wait until `settled(reply)` holds on the image.
ControllerCall = Callable[[Any, Any, Callable[[Any], bool]], Awaitable[Any]]


class PartitionAdmin:
    """Elections and reassignments need ALTER on the cluster, listing reassignments
    DESCRIBE, as in Kafka (``access``: None with the authorizer off)."""

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
            ApiKey.ELECT_LEADERS: self.elect_leaders,
            ApiKey.ALTER_PARTITION_REASSIGNMENTS: self.alter_partition_reassignments,
            ApiKey.LIST_PARTITION_REASSIGNMENTS: self.list_partition_reassignments,
        }

    def _refusal(self, api: str, operation: Operation) -> KafkaError | None:
        """CLUSTER_AUTHORIZATION_FAILED, counted and logged, when the requester may not
        perform the operation on the cluster."""
        if self.access is None or self.access.allowed_on_cluster(operation):
            return None
        refusal = denied(operation, CLUSTER, "")
        self.metrics.request_error(api, refusal.code)
        log.info("%s: %s", api, refusal)
        return refusal

    async def elect_leaders(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.ELECT_LEADERS].response
        refusal = self._refusal("elect_leaders", Operation.ALTER)
        if refusal is not None:  # every partition named answers it too
            return response(
                throttle_time_ms=0,
                error_code=refusal.code,
                replica_election_results=[
                    response.ReplicaElectionResult(
                        topic=t.topic,
                        partition_result=[
                            response.ReplicaElectionResult.PartitionResult(
                                partition_id=p, error_code=refusal.code, error_message=str(refusal)
                            )
                            for p in t.partitions
                        ],
                    )
                    for t in request.topic_partitions or ()
                ],
            )
        election_type = request.election_type if header.api_version >= 1 else 0
        wanted = None
        if request.topic_partitions is not None:
            wanted = [
                pb.PartitionRef(topic=t.topic, partition=p)
                for t in request.topic_partitions
                for p in t.partitions
            ]

        def elected(reply: Any) -> bool:
            return all(self._leader_shown(r) for r in reply.results)

        try:
            reply = await self.call(
                lambda s: s.ElectLeaders,
                pb.ElectLeadersRequest(
                    election_type=election_type,
                    all_partitions=wanted is None,
                    partitions=wanted or [],
                ),
                elected,
            )
        except KafkaError as error:
            return response(throttle_time_ms=0, error_code=error.code, replica_election_results=[])
        if len(reply.results) == 1 and not reply.results[0].topic:  # refused whole
            return response(
                throttle_time_ms=0,
                error_code=reply.results[0].error_code,
                replica_election_results=[],
            )
        by_topic = self._by_topic(
            "elect_leaders",
            reply,
            lambda index, code, message: response.ReplicaElectionResult.PartitionResult(
                partition_id=index, error_code=code, error_message=message
            ),
        )
        return response(
            throttle_time_ms=0,
            error_code=0,
            replica_election_results=[
                response.ReplicaElectionResult(topic=topic, partition_result=results)
                for topic, results in by_topic.items()
            ],
        )

    def _leader_shown(self, result: pb.PartitionResult) -> bool:
        """An election the controller committed shows as a leader in the image."""
        if result.error_code:
            return True
        info = self.image.partition(TopicPartition(result.topic, result.partition))
        return info is not None and info.leader >= 0

    async def alter_partition_reassignments(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.ALTER_PARTITION_REASSIGNMENTS].response
        refusal = self._refusal("alter_partition_reassignments", Operation.ALTER)
        if refusal is not None:  # every partition named answers it too
            topic_response = response.ReassignableTopicResponse
            return response(
                throttle_time_ms=0,
                allow_replication_factor_change=True,
                error_code=refusal.code,
                error_message=str(refusal),
                responses=[
                    topic_response(
                        name=t.name,
                        partitions=[
                            topic_response.ReassignablePartitionResponse(
                                partition_index=p.partition_index,
                                error_code=refusal.code,
                                error_message=str(refusal),
                            )
                            for p in t.partitions
                        ],
                    )
                    for t in request.topics
                ],
            )
        wanted = [
            pb.Reassignment(
                topic=t.name,
                partition=p.partition_index,
                cancel=p.replicas is None,
                replicas=p.replicas or [],
            )
            for t in request.topics
            for p in t.partitions
        ]
        targets = {(w.topic, w.partition): w for w in wanted}

        def shown(reply: Any) -> bool:
            return all(
                r.error_code or self._reassignment_shown(targets[(r.topic, r.partition)])
                for r in reply.results
            )

        try:
            reply = await self.call(
                lambda s: s.AlterPartitionReassignments,
                pb.AlterPartitionReassignmentsRequest(reassignments=wanted),
                shown,
            )
        except KafkaError as error:
            return response(
                throttle_time_ms=0,
                allow_replication_factor_change=True,
                error_code=error.code,
                error_message=str(error),
                responses=[],
            )
        topic_response = response.ReassignableTopicResponse
        by_topic = self._by_topic(
            "alter_partition_reassignments",
            reply,
            lambda index, code, message: topic_response.ReassignablePartitionResponse(
                partition_index=index, error_code=code, error_message=message
            ),
        )
        return response(
            throttle_time_ms=0,
            allow_replication_factor_change=True,
            error_code=0,
            error_message=None,
            responses=[
                topic_response(name=topic, partitions=partitions)
                for topic, partitions in by_topic.items()
            ],
        )

    def _reassignment_shown(self, wanted: pb.Reassignment) -> bool:
        info = self.image.partition(TopicPartition(wanted.topic, wanted.partition))
        if info is None:
            return False
        if wanted.cancel:
            return not (info.adding or info.removing)
        return info.replicas[: len(wanted.replicas)] == tuple(wanted.replicas)

    async def list_partition_reassignments(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.LIST_PARTITION_REASSIGNMENTS].response
        refusal = self._refusal("list_partition_reassignments", Operation.DESCRIBE)
        if refusal is not None:
            return response(
                throttle_time_ms=0,
                error_code=refusal.code,
                error_message=str(refusal),
                topics=[],
            )
        if request.topics is None:
            wanted = [
                (topic.name, index)
                for topic in self.image.topics.values()
                for index in sorted(topic.partitions)
            ]
        else:
            wanted = [(t.name, p) for t in request.topics for p in t.partition_indexes]
        by_topic: dict[str, list[Any]] = {}
        for name, index in wanted:
            info = self.image.partition(TopicPartition(name, index))
            if info is None or not (info.adding or info.removing):
                continue  # Kafka lists only the partitions being reassigned
            by_topic.setdefault(name, []).append(
                response.OngoingTopicReassignment.OngoingPartitionReassignment(
                    partition_index=index,
                    replicas=list(info.replicas),
                    adding_replicas=list(info.adding),
                    removing_replicas=list(info.removing),
                )
            )
        return response(
            throttle_time_ms=0,
            error_code=0,
            error_message=None,
            topics=[
                response.OngoingTopicReassignment(name=name, partitions=partitions)
                for name, partitions in by_topic.items()
            ],
        )

    def _by_topic(
        self, api: str, reply: pb.PartitionResults, result: Callable[..., Any]
    ) -> dict[str, list[Any]]:
        """The controller's per-partition answers as `result(index, error_code,
        error_message)`, by topic name; each refusal counted and logged once."""
        by_topic: dict[str, list[Any]] = {}
        for r in reply.results:
            if r.error_code:
                self.metrics.request_error(api, ErrorCode(r.error_code))
                log.info("%s %s-%d: %s", api, r.topic, r.partition, r.error_message)
            by_topic.setdefault(r.topic, []).append(
                result(r.partition, r.error_code, r.error_message or None)
            )
        return by_topic
