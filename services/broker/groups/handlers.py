"""The group APIs of the Kafka protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete): request
objects in, the coordinator's answers out, in each version's shape."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from directlog.protocol.api import APIS, ApiKey, RequestHeader
from directlog.protocol.errors import ErrorCode
from directlog.security.acl import Operation
from services.broker.authorization import GROUP, TOPIC, Access, authorized_operations, denied
from services.broker.cluster_metadata import ClusterImage
from services.broker.error_codes import error_code_for
from services.broker.groups.coordinator import Commit, GroupCoordinator
from services.broker.groups.group import CommittedOffset, Group, GroupState, JoinRequest
from services.broker.groups.offsets_topic import subscribed_topics
from services.broker.metrics import BrokerMetrics

log = logging.getLogger(__name__)

Handler = Callable[[Any, RequestHeader], Awaitable[Any]]
CONSUMER = "consumer"


class GroupApis:
    """``access``: ACL authorization, None with the authorizer off. As in Kafka, a group's
    members need READ on it, describing it DESCRIBE, deleting it (or its offsets) DELETE;
    committing offsets needs READ on each topic too, fetching them DESCRIBE."""

    def __init__(
        self,
        coordinator: GroupCoordinator,
        image: ClusterImage,
        metrics: BrokerMetrics,
        access: Access | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.image = image
        self.metrics = metrics
        self.access = access

    def handlers(self) -> dict[int, Handler]:
        return {
            ApiKey.JOIN_GROUP: self.join_group,
            ApiKey.SYNC_GROUP: self.sync_group,
            ApiKey.HEARTBEAT: self.heartbeat,
            ApiKey.LEAVE_GROUP: self.leave_group,
            ApiKey.OFFSET_COMMIT: self.offset_commit,
            ApiKey.OFFSET_FETCH: self.offset_fetch,
            ApiKey.LIST_GROUPS: self.list_groups,
            ApiKey.DESCRIBE_GROUPS: self.describe_groups,
            ApiKey.DELETE_GROUPS: self.delete_groups,
            ApiKey.OFFSET_DELETE: self.offset_delete,
        }

    def _counted(self, api: str, code: ErrorCode) -> ErrorCode:
        if code is not ErrorCode.NONE:
            self.metrics.request_error(api, code)
        return code

    def _refused(self, api: str, operation: Operation, group_id: str) -> bool:
        """Whether the requester may not perform the operation on the group (logged; the
        caller counts the GROUP_AUTHORIZATION_FAILED it answers)."""
        if self.access is None or self.access.allowed(operation, GROUP, group_id):
            return False
        log.info("%s: %s", api, denied(operation, GROUP, group_id))
        return True

    # Membership -------------------------------------------------------------------------

    async def join_group(self, request: Any, header: RequestHeader) -> Any:
        version = header.api_version
        response = APIS[ApiKey.JOIN_GROUP].response
        if self._refused("join_group", Operation.READ, request.group_id):
            return response(
                throttle_time_ms=0,
                error_code=self._counted("join_group", ErrorCode.GROUP_AUTHORIZATION_FAILED),
                generation_id=-1,
                protocol_type=None,
                protocol_name=None if version >= 7 else "",
                leader="",
                skip_assignment=False,
                member_id="",
                members=[],
            )
        join = JoinRequest(
            member_id=request.member_id,
            group_instance_id=request.group_instance_id if version >= 5 else None,
            client_id=header.client_id or "",
            client_host=header.client_host,
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms
            if version >= 1
            else request.session_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
            require_known_member_id=version >= 4,
            can_skip_assignment=version >= 9,
        )
        reply = await self.coordinator.join(request.group_id, join)
        code = self._counted("join_group", reply.error)
        if code is ErrorCode.NONE:
            log.info(
                "group %s: %s joined generation %d (%s)",
                request.group_id,
                reply.member_id,
                reply.generation,
                reply.protocol,
            )
        return response(
            throttle_time_ms=0,
            error_code=code,
            generation_id=reply.generation,
            protocol_type=reply.protocol_type,
            protocol_name=reply.protocol if reply.protocol is not None or version >= 7 else "",
            leader=reply.leader,
            skip_assignment=reply.skip_assignment,
            member_id=reply.member_id,
            members=[
                response.JoinGroupResponseMember(
                    member_id=member_id, group_instance_id=instance, metadata=metadata
                )
                for member_id, instance, metadata in reply.members
            ],
        )

    async def sync_group(self, request: Any, header: RequestHeader) -> Any:
        version = header.api_version
        response = APIS[ApiKey.SYNC_GROUP].response
        if self._refused("sync_group", Operation.READ, request.group_id):
            return response(
                throttle_time_ms=0,
                error_code=self._counted("sync_group", ErrorCode.GROUP_AUTHORIZATION_FAILED),
                protocol_type=None,
                protocol_name=None,
                assignment=b"",
            )
        reply = await self.coordinator.sync(
            request.group_id,
            request.member_id,
            request.group_instance_id if version >= 3 else None,
            request.generation_id,
            request.protocol_type if version >= 5 else None,
            request.protocol_name if version >= 5 else None,
            {a.member_id: bytes(a.assignment) for a in request.assignments},
        )
        return response(
            throttle_time_ms=0,
            error_code=self._counted("sync_group", reply.error),
            protocol_type=reply.protocol_type,
            protocol_name=reply.protocol,
            assignment=reply.assignment,
        )

    async def heartbeat(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.HEARTBEAT].response
        if self._refused("heartbeat", Operation.READ, request.group_id):
            code = ErrorCode.GROUP_AUTHORIZATION_FAILED
        else:
            code = self.coordinator.heartbeat(
                request.group_id,
                request.member_id,
                request.group_instance_id if header.api_version >= 3 else None,
                request.generation_id,
            )
        return response(throttle_time_ms=0, error_code=self._counted("heartbeat", code))

    async def leave_group(self, request: Any, header: RequestHeader) -> Any:
        version = header.api_version
        response = APIS[ApiKey.LEAVE_GROUP].response
        if self._refused("leave_group", Operation.READ, request.group_id):
            return response(
                throttle_time_ms=0,
                error_code=self._counted("leave_group", ErrorCode.GROUP_AUTHORIZATION_FAILED),
                members=[],
            )
        if version >= 3:
            leaving = [(m.member_id, m.group_instance_id) for m in request.members]
        else:
            leaving = [(request.member_id, None)]
        code, results = self.coordinator.leave(request.group_id, leaving)
        if version < 3 and code is ErrorCode.NONE and results:
            code = results[0].error  # one member: its outcome is the answer
        for result in results:
            self._counted("leave_group", result.error)
            if result.error is ErrorCode.NONE:
                log.info("group %s: %s left", request.group_id, result.member_id)
        return response(
            throttle_time_ms=0,
            error_code=self._counted("leave_group", code),
            members=[
                response.MemberResponse(
                    member_id=r.member_id, group_instance_id=r.group_instance_id, error_code=r.error
                )
                for r in results
            ],
        )

    # Offsets -------------------------------------------------------------------------------

    async def offset_commit(self, request: Any, header: RequestHeader) -> Any:
        version = header.api_version
        response = APIS[ApiKey.OFFSET_COMMIT].response
        topic_type = response.OffsetCommitResponseTopic
        partition_type = topic_type.OffsetCommitResponsePartition
        commits: list[Commit] = []
        answers: dict[tuple[str, int], ErrorCode] = {}
        group_refused = self._refused("offset_commit", Operation.READ, request.group_id)
        topics_refused: set[str] = set()
        if self.access is not None and not group_refused:
            topics_refused = self.access.refused(
                Operation.READ, TOPIC, (t.name for t in request.topics)
            )
        for topic in request.topics:
            known = self.image.topic(topic.name)
            for p in topic.partitions:
                if group_refused:
                    answers[(topic.name, p.partition_index)] = ErrorCode.GROUP_AUTHORIZATION_FAILED
                    continue
                if topic.name in topics_refused:
                    answers[(topic.name, p.partition_index)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    continue
                if known is None or p.partition_index not in known.partitions:
                    answers[(topic.name, p.partition_index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                commits.append(
                    Commit(
                        topic.name,
                        p.partition_index,
                        p.committed_offset,
                        p.committed_leader_epoch if version >= 6 else -1,
                        p.committed_metadata,
                    )
                )
        if commits:
            codes = await self.coordinator.commit(
                request.group_id,
                request.member_id,
                request.group_instance_id if version >= 7 else None,
                request.generation_id_or_member_epoch,
                commits,
            )
            for commit, code in zip(commits, codes, strict=True):
                answers[(commit.topic, commit.partition)] = code
        return response(
            throttle_time_ms=0,
            topics=self._per_partition(
                "offset_commit", topic_type, partition_type, request.topics, answers.__getitem__
            ),
        )

    def _per_partition(
        self,
        api: str,
        topic_type: Any,
        partition_type: Any,
        topics: Any,
        code_of: Callable[[tuple[str, int]], ErrorCode],
    ) -> list[Any]:
        """The request's topics and partitions, each partition answered with its code."""
        return [
            topic_type(
                name=t.name,
                partitions=[
                    partition_type(
                        partition_index=p.partition_index,
                        error_code=self._counted(api, code_of((t.name, p.partition_index))),
                    )
                    for p in t.partitions
                ],
            )
            for t in topics
        ]

    async def offset_fetch(self, request: Any, header: RequestHeader) -> Any:
        """OffsetFetch. With RequireStable (v7+: librdkafka and the Java consumer set it
        for read_committed), a partition whose commit is not settled yet answers
        UNSTABLE_OFFSET_COMMIT at partition level, in each group for v8+, and the client
        retries (KIP-447)."""
        version = header.api_version
        response = APIS[ApiKey.OFFSET_FETCH].response
        stable = version >= 7 and bool(request.require_stable)
        if version >= 8:
            groups = [
                response.OffsetFetchResponseGroup(
                    group_id=g.group_id,
                    **self._fetch_group(g.group_id, g.topics, version, stable),
                )
                for g in request.groups
            ]
            return response(throttle_time_ms=0, groups=groups)
        answer = self._fetch_group(request.group_id, request.topics, version, stable)
        return response(
            throttle_time_ms=0, topics=answer["topics"], error_code=answer["error_code"]
        )

    def _fetch_group(
        self, group_id: str, topics: Any, version: int, require_stable: bool
    ) -> dict[str, Any]:
        response = APIS[ApiKey.OFFSET_FETCH].response
        if version >= 8:
            topic_type = response.OffsetFetchResponseGroup.OffsetFetchResponseTopics
            partition_type = topic_type.OffsetFetchResponsePartitions
        else:
            topic_type = response.OffsetFetchResponseTopic
            partition_type = topic_type.OffsetFetchResponsePartition
        wanted = None if topics is None else [(t.name, list(t.partition_indexes)) for t in topics]
        # Topics without DESCRIBE: refused when named, left out of "every offset".
        hidden: set[str] = set()
        if self.access is not None and wanted is not None:
            hidden = self.access.refused(Operation.DESCRIBE, TOPIC, (t for t, _ in wanted))
        try:
            if self._refused("offset_fetch", Operation.DESCRIBE, group_id):
                raise denied(Operation.DESCRIBE, GROUP, group_id)
            offsets = self.coordinator.fetch_offsets(
                group_id,
                None if wanted is None else [w for w in wanted if w[0] not in hidden],
                require_stable,
            )
            if wanted is None and self.access is not None:
                shown = {t for t, _ in offsets} - self.access.refused(
                    Operation.DESCRIBE, TOPIC, {t for t, _ in offsets}
                )
                offsets = {tp: c for tp, c in offsets.items() if tp[0] in shown}
            group_code = ErrorCode.NONE
        except Exception as error:
            group_code = self._counted("offset_fetch", error_code_for(error))
            offsets = {} if wanted is None else {(t, p): None for t, ps in wanted for p in ps}
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), found in offsets.items():
            committed = found if isinstance(found, CommittedOffset) else None
            if isinstance(found, ErrorCode):
                code = self._counted("offset_fetch", found)
            else:
                # Before v2 there is no group-level code: each partition carries it.
                code = group_code if version < 2 else ErrorCode.NONE
            by_topic.setdefault(topic, []).append(
                partition_type(
                    partition_index=partition,
                    committed_offset=committed.offset if committed else -1,
                    committed_leader_epoch=committed.leader_epoch if committed else -1,
                    metadata=committed.metadata if committed else "",
                    error_code=code,
                )
            )
        if group_code is ErrorCode.NONE:
            for topic, partitions in wanted or ():
                if topic in hidden:
                    by_topic[topic] = [
                        partition_type(
                            partition_index=partition,
                            committed_offset=-1,
                            committed_leader_epoch=-1,
                            metadata="",
                            error_code=self._counted(
                                "offset_fetch", ErrorCode.TOPIC_AUTHORIZATION_FAILED
                            ),
                        )
                        for partition in partitions
                    ]
        return {
            "topics": [
                topic_type(name=name, partitions=parts) for name, parts in sorted(by_topic.items())
            ],
            "error_code": group_code,
        }

    async def offset_delete(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.OFFSET_DELETE].response
        topic_type = response.OffsetDeleteResponseTopic
        partition_type = topic_type.OffsetDeleteResponsePartition
        if self._refused("offset_delete", Operation.DELETE, request.group_id):
            return response(
                error_code=self._counted("offset_delete", ErrorCode.GROUP_AUTHORIZATION_FAILED),
                throttle_time_ms=0,
                topics=[],
            )
        refused: set[str] = set()  # topics without READ
        if self.access is not None:
            refused = self.access.refused(Operation.READ, TOPIC, (t.name for t in request.topics))
        wanted = [
            (t.name, p.partition_index)
            for t in request.topics
            if t.name not in refused
            for p in t.partitions
        ]
        group = self._group_or_none(request.group_id)
        subscribed: set[str] = set()
        if group is not None and group.protocol_type == CONSUMER:
            for metadata in group.subscribed_protocol_metadata():
                subscribed |= subscribed_topics(metadata) or set()
        code, results = await self.coordinator.delete_offsets(request.group_id, wanted, subscribed)
        for t in request.topics:
            if t.name in refused:
                for p in t.partitions:
                    results[(t.name, p.partition_index)] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        return response(
            error_code=self._counted("offset_delete", code),
            throttle_time_ms=0,
            topics=self._per_partition(
                "offset_delete",
                topic_type,
                partition_type,
                request.topics,
                lambda tp: results.get(tp, ErrorCode.NONE),
            )
            if code is ErrorCode.NONE
            else [],
        )

    def _group_or_none(self, group_id: str) -> Group | None:
        try:
            return self.coordinator.lookup(group_id)
        except Exception:
            return None

    # Listing and deleting ----------------------------------------------------------------

    async def list_groups(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.LIST_GROUPS].response
        states = (
            {s.lower() for s in request.states_filter or ()} if header.api_version >= 4 else set()
        )
        groups = [
            g
            for g in self.coordinator.listed_groups()
            if not states or g.state.value.lower() in states
        ]
        # DESCRIBE on the cluster lists every group; without it, those it may DESCRIBE.
        access = self.access
        if access is not None and not access.allowed_on_cluster(Operation.DESCRIBE):
            groups = [g for g in groups if access.allowed(Operation.DESCRIBE, GROUP, g.group_id)]
        code = (
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if self.coordinator.loading() else ErrorCode.NONE
        )
        return response(
            throttle_time_ms=0,
            error_code=self._counted("list_groups", code),
            groups=[
                response.ListedGroup(
                    group_id=g.group_id,
                    protocol_type=g.protocol_type or "",
                    group_state=g.state.value,
                    group_type="classic",
                )
                for g in groups
            ],
        )

    async def describe_groups(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.DESCRIBE_GROUPS].response
        described = response.DescribedGroup
        with_operations = header.api_version >= 3 and request.include_authorized_operations
        out = []
        for group_id in request.groups:
            if self._refused("describe_groups", Operation.DESCRIBE, group_id):
                out.append(  # Kafka's answer for a refused group: nothing about it
                    described(
                        error_code=self._counted(
                            "describe_groups", ErrorCode.GROUP_AUTHORIZATION_FAILED
                        ),
                        error_message=None,
                        group_id=group_id,
                        group_state="",
                        protocol_type="",
                        protocol_data="",
                        members=[],
                        authorized_operations=None,
                    )
                )
                continue
            try:
                group = self.coordinator.lookup(group_id)
                code = ErrorCode.NONE
            except Exception as error:
                group = None
                code = self._counted("describe_groups", error_code_for(error))
            stable = group is not None and group.state is GroupState.STABLE
            protocol = group.protocol if group is not None else None
            out.append(
                described(
                    error_code=code,
                    error_message=None,
                    group_id=group_id,
                    group_state=group.state.value if group else GroupState.DEAD.value,
                    protocol_type=(group.protocol_type or "") if group else "",
                    protocol_data=(group.protocol or "") if stable and group else "",
                    members=[
                        described.DescribedGroupMember(
                            member_id=m.member_id,
                            group_instance_id=m.group_instance_id,
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=m.metadata(protocol) if stable else b"",
                            member_assignment=m.assignment if stable else b"",
                        )
                        for m in (group.members.values() if group else ())
                    ],
                    # KIP-430, when asked for; None: Kafka's -2^31
                    authorized_operations=authorized_operations(self.access, GROUP, group_id)
                    if with_operations and code is ErrorCode.NONE
                    else None,
                )
            )
        return response(throttle_time_ms=0, groups=out)

    async def delete_groups(self, request: Any, header: RequestHeader) -> Any:
        response = APIS[ApiKey.DELETE_GROUPS].response
        results = []
        for group_id in request.groups_names:
            if self._refused("delete_groups", Operation.DELETE, group_id):
                code = ErrorCode.GROUP_AUTHORIZATION_FAILED
            else:
                code = await self.coordinator.delete_group(group_id)
            if code is ErrorCode.NONE:
                log.info("group %s deleted", group_id)
            results.append(
                response.DeletableGroupResult(
                    group_id=group_id, error_code=self._counted("delete_groups", code)
                )
            )
        return response(throttle_time_ms=0, results=results)
