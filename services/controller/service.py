"""The Controller gRPC service (proto/controller.proto): requests in, planned changes
committed through the active term, answers out.

Domain errors are Kafka error codes in the replies. Not being the active controller is a
gRPC status, FAILED_PRECONDITION, with the active controller's address in the
``active-controller`` trailing metadata when known, so a broker moves on at once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, NoReturn

import grpc

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc import controller_pb2 as pb
from directlog.rpc import controller_pb2_grpc
from directlog.security import acl_messages
from services.controller import layout, messages
from services.controller.cluster import (
    NO_RECORDS,
    Change,
    ClusterState,
    Delta,
    IsrChange,
    PartitionResult,
)
from services.controller.controller import NOT_ACTIVE, Controller, NotActiveError, Term
from services.controller.model import Listener, Topic

log = logging.getLogger("directlog.controller.service")

ACTIVE_CONTROLLER_KEY = "active-controller"  # trailing metadata: host:port of the active one
ERROR_CODE_KEY = "kafka-error-code"  # trailing metadata of a refused WatchMetadata

Context = grpc.aio.ServicerContext[Any, Any]
TopicPlan = Callable[[ClusterState], tuple[Topic, Change]]


class ControllerService(controller_pb2_grpc.ControllerServicer):
    def __init__(self, controller: Controller) -> None:
        self._controller = controller
        self._metrics = controller.metrics

    # Brokers ----------------------------------------------------------------------------

    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: Context
    ) -> pb.RegisterBrokerReply:
        with self._metrics.rpc("RegisterBroker"):
            try:
                term = self._controller.require_term()
                listeners = [Listener(i.name, i.host, i.port) for i in request.listeners]
                async with term.lock:
                    try:
                        change = term.state.register_broker(
                            request.broker_id,
                            request.incarnation_id,
                            listeners,
                            request.rack or None,
                            self._controller.clock(),
                        )
                    except KafkaError as exc:
                        log.info("RegisterBroker %d refused: %s", request.broker_id, exc)
                        return pb.RegisterBrokerReply(error_code=exc.code, error_message=str(exc))
                    await term.commit(change)
            except NotActiveError:
                await self._not_active(context)
        epoch = change.brokers[0].broker_epoch
        log.info("broker %d registered, epoch %d", request.broker_id, epoch)
        term.kick()  # partitions waiting for this broker may get their leader back
        return pb.RegisterBrokerReply(broker_epoch=epoch)

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Context) -> pb.HeartbeatReply:
        with self._metrics.rpc("Heartbeat"):
            try:
                term = self._controller.require_term()
            except NotActiveError:
                await self._not_active(context)
            if request.stopping:
                await self._fence_stopped(term, request.broker_id, request.broker_epoch)
                return pb.HeartbeatReply()
            error = term.state.heartbeat(
                request.broker_id, request.broker_epoch, self._controller.clock()
            )
            if error is ErrorCode.NONE:
                return pb.HeartbeatReply()
            return pb.HeartbeatReply(
                error_code=error,
                error_message=f"broker {request.broker_id} epoch {request.broker_epoch}: "
                f"{error.name}, register again",
            )

    async def _fence_stopped(self, term: Term, broker_id: int, broker_epoch: int) -> None:
        try:
            async with term.lock:
                if not term.state.fence_stopped(broker_id, broker_epoch):
                    return
                term.publish(Delta())
                await term.elect()
        except NotActiveError:
            return  # the broker stops anyway; the next controller fences it by its session
        log.info("broker %d stopped: fenced", broker_id)

    async def WatchMetadata(
        self, request: pb.WatchMetadataRequest, context: Context
    ) -> AsyncIterator[pb.MetadataUpdate]:
        try:
            term = self._controller.require_term()
        except NotActiveError:
            await self._not_active(context)
        error = term.state.broker_error(request.broker_id, request.broker_epoch)
        if error is not ErrorCode.NONE:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{error.name}: broker {request.broker_id} epoch {request.broker_epoch} "
                "is not current, register again",
                ((ERROR_CODE_KEY, str(int(error))),),
            )
        subscription = term.subscribe()
        try:
            while (update := await subscription.next()) is not None:
                yield update
        finally:
            term.unsubscribe(subscription)
        assert subscription.ended is not None
        code, details = subscription.ended
        if details == NOT_ACTIVE:
            await self._not_active(context)
        await context.abort(code, details)

    async def AlterPartition(
        self, request: pb.AlterPartitionRequest, context: Context
    ) -> pb.AlterPartitionReply:
        changes = [
            IsrChange(c.topic_id, c.partition, c.leader_epoch, c.partition_epoch, tuple(c.new_isr))
            for c in request.changes
        ]
        with self._metrics.rpc("AlterPartition"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    try:
                        results, change = term.state.alter_partition(
                            request.broker_id, request.broker_epoch, changes
                        )
                    except KafkaError as exc:
                        log.info("AlterPartition from broker %d: %s", request.broker_id, exc)
                        return pb.AlterPartitionReply(error_code=exc.code)
                    await term.commit(change)
            except NotActiveError:
                await self._not_active(context)
        moving = any(r.state is not None and r.state.reassigning for r in results)
        if change.ops and (term.state.shutting_down or moving):
            # A shutting-down leader that was its partition's only ISR member may just have
            # let a follower in: that follower can take the partition over now. A replica
            # being added may have joined the ISR: its reassignment may be complete.
            term.kick()
        return pb.AlterPartitionReply(
            results=[
                pb.PartitionChangeResult(
                    topic_id=r.topic_id,
                    partition=r.partition,
                    error_code=r.error,
                    state=None if r.state is None else messages.partition(r.partition, r.state),
                )
                for r in results
            ]
        )

    async def ControlledShutdown(
        self, request: pb.ControlledShutdownRequest, context: Context
    ) -> pb.ControlledShutdownReply:
        """Mark the broker as shutting down and commit every move that calls for before
        answering, so the broker only has to wait for its image to show them."""
        broker_id = request.broker_id
        with self._metrics.rpc("ControlledShutdown"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    try:
                        first = term.state.begin_controlled_shutdown(
                            broker_id, request.broker_epoch
                        )
                    except KafkaError as exc:
                        log.info("ControlledShutdown of broker %d refused: %s", broker_id, exc)
                        return pb.ControlledShutdownReply(
                            error_code=exc.code, error_message=str(exc)
                        )
                    led = term.state.leaderships(broker_id)
                    await term.elect()
                    remaining = term.state.leaderships(broker_id)
            except NotActiveError:
                await self._not_active(context)
        if first:
            self._metrics.controlled_shutdowns.inc()
        log.info(
            "broker %d shutting down%s: %d leaderships moved, %d kept (sole ISR member)",
            broker_id,
            "" if first else " (asked again)",
            led - remaining,
            remaining,
        )
        return pb.ControlledShutdownReply(remaining_leaderships=remaining)

    async def AlterPartitionReassignments(
        self, request: pb.AlterPartitionReassignmentsRequest, context: Context
    ) -> pb.PartitionResults:
        """Committed before the answer; the reconciler finishes each once its target
        caught up."""
        wanted = [
            (r.topic, r.partition, None if r.cancel else tuple(r.replicas))
            for r in request.reassignments
        ]
        with self._metrics.rpc("AlterPartitionReassignments"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    results, change = term.state.reassign(wanted)
                    await term.commit(change)
            except NotActiveError:
                await self._not_active(context)
        for (topic, partition, target), result in zip(wanted, results, strict=True):
            if result.error is ErrorCode.NONE:
                log.info("reassigning %s-%d to %s", topic, partition, target or "its original")
            else:
                log.info("reassignment of %s-%d refused: %s", topic, partition, result.message)
        term.kick()  # a target already in the ISR finishes at once
        return _partition_results(results)

    async def ElectLeaders(
        self, request: pb.ElectLeadersRequest, context: Context
    ) -> pb.PartitionResults:
        partitions = (
            None if request.all_partitions else [(p.topic, p.partition) for p in request.partitions]
        )
        with self._metrics.rpc("ElectLeaders"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    try:
                        results, change = term.state.elect_leaders(
                            request.election_type, partitions, self._controller.clock()
                        )
                    except KafkaError as exc:
                        return pb.PartitionResults(
                            results=[
                                pb.PartitionResult(error_code=exc.code, error_message=str(exc))
                            ]
                        )
                    await term.commit(change)
            except NotActiveError:
                await self._not_active(context)
        if change.leader_elections:
            log.info("ElectLeaders: %d partitions have a new leader", change.leader_elections)
        return _partition_results(results)

    async def AllocateProducerIds(
        self, request: pb.AllocateProducerIdsRequest, context: Context
    ) -> pb.AllocateProducerIdsReply:
        """The block is committed before the reply, so no later block can overlap it."""
        with self._metrics.rpc("AllocateProducerIds"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    try:
                        block, change = term.state.allocate_producer_ids(
                            request.broker_id, request.broker_epoch
                        )
                    except KafkaError as exc:
                        log.info("AllocateProducerIds %d refused: %s", request.broker_id, exc)
                        return pb.AllocateProducerIdsReply(
                            error_code=exc.code, error_message=str(exc)
                        )
                    await term.commit(change)
            except NotActiveError:
                await self._not_active(context)
        log.info(
            "producer ids %d to %d for broker %d", block.first, block.end - 1, request.broker_id
        )
        return pb.AllocateProducerIdsReply(first_producer_id=block.first, count=block.count)

    # Topics -----------------------------------------------------------------------------

    async def CreateTopics(
        self, request: pb.CreateTopicsRequest, context: Context
    ) -> pb.TopicsReply:
        def plan(new: pb.NewTopic) -> TopicPlan:
            def run(state: ClusterState) -> tuple[Topic, Change]:
                change = state.create_topic(
                    new.name,
                    new.partitions,
                    new.replication_factor,
                    dict(new.configs),
                    [(a.partition, list(a.replicas)) for a in new.assignments],
                )
                return change.topics[0], change

            return run

        names = [new.name for new in request.topics]
        plans = [(new.name, b"", plan(new)) for new in request.topics]
        for index, name in enumerate(names):
            if name in names[:index]:
                plans[index] = (name, b"", _refuse(name, "named twice in the request"))
        # A manual assignment may name fenced brokers: elected away before the answer.
        manual = any(new.assignments for new in request.topics)
        return await self._topics(
            "CreateTopics", context, plans, request.validate_only, reelect=manual
        )

    async def DeleteTopics(
        self, request: pb.DeleteTopicsRequest, context: Context
    ) -> pb.TopicsReply:
        def plan(ref: pb.TopicRef) -> TopicPlan:
            def run(state: ClusterState) -> tuple[Topic, Change]:
                if not ref.name and not ref.topic_id:
                    raise KafkaError(ErrorCode.INVALID_REQUEST, "neither a name nor an id")
                topic = state.find_topic(ref.name, ref.topic_id)
                return topic, state.delete_topic(topic_id=topic.topic_id)

            return run

        plans = [(ref.name, ref.topic_id, plan(ref)) for ref in request.topics]
        return await self._topics("DeleteTopics", context, plans, validate_only=False)

    async def CreatePartitions(
        self, request: pb.CreatePartitionsRequest, context: Context
    ) -> pb.TopicsReply:
        def plan(increase: pb.PartitionIncrease) -> TopicPlan:
            def run(state: ClusterState) -> tuple[Topic, Change]:
                manual = None
                if increase.assigned:
                    manual = [list(a.replicas) for a in increase.assignments]
                change = state.create_partitions(increase.name, increase.count, manual)
                return change.topics[0], change

            return run

        plans = [(item.name, b"", plan(item)) for item in request.topics]
        manual = any(item.assigned for item in request.topics)
        return await self._topics(
            "CreatePartitions", context, plans, request.validate_only, reelect=manual
        )

    async def AlterConfigs(
        self, request: pb.AlterConfigsRequest, context: Context
    ) -> pb.TopicsReply:
        def plan(alteration: pb.ConfigAlteration) -> TopicPlan:
            def run(state: ClusterState) -> tuple[Topic, Change]:
                change = state.alter_configs(
                    alteration.name,
                    dict(alteration.set),
                    alteration.delete,
                    replace_all=alteration.replace,
                    lists=(dict(alteration.append), dict(alteration.subtract)),
                )
                topic = change.topics[0] if change.topics else state.find_topic(alteration.name)
                return topic, change

            return run

        plans = [(item.name, b"", plan(item)) for item in request.topics]
        # unclean.leader.election.enable may have changed: leaderless partitions may lead.
        return await self._topics("AlterConfigs", context, plans, request.validate_only, kick=True)

    async def AlterLogDefaults(
        self, request: pb.AlterLogDefaultsRequest, context: Context
    ) -> pb.AlterLogDefaultsReply:
        with self._metrics.rpc("AlterLogDefaults"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    try:
                        change = term.state.alter_log_defaults(
                            dict(request.set),
                            request.delete,
                            replace_all=request.replace,
                            lists=(dict(request.append), dict(request.subtract)),
                        )
                    except KafkaError as exc:
                        log.info("AlterLogDefaults refused: %s", exc)
                        return pb.AlterLogDefaultsReply(error_code=exc.code, error_message=str(exc))
                    if not request.validate_only:
                        await term.commit(change)
            except NotActiveError:
                await self._not_active(context)
        if change.ops and not request.validate_only:
            log.info("cluster-wide log defaults now %s", term.state.log_defaults)
            term.kick()  # unclean.leader.election.enable may have changed
        return pb.AlterLogDefaultsReply()

    async def AlterBrokerConfigs(
        self, request: pb.AlterBrokerConfigsRequest, context: Context
    ) -> pb.AlterBrokerConfigsReply:
        with self._metrics.rpc("AlterBrokerConfigs"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    try:
                        change = term.state.alter_broker_configs(
                            request.broker_id,
                            dict(request.set),
                            request.delete,
                            replace_all=request.replace,
                        )
                    except KafkaError as exc:
                        log.info("AlterBrokerConfigs refused: %s", exc)
                        return pb.AlterBrokerConfigsReply(
                            error_code=exc.code, error_message=str(exc)
                        )
                    if not request.validate_only:
                        await term.commit(change)
            except NotActiveError:
                await self._not_active(context)
        if change.ops and not request.validate_only:
            log.info(
                "broker %d's dynamic configs now %s",
                request.broker_id,
                term.state.broker_configs.get(request.broker_id, {}),
            )
        return pb.AlterBrokerConfigsReply()

    # Security metadata ------------------------------------------------------------------

    async def AlterUserScramCredentials(
        self, request: pb.AlterUserScramCredentialsRequest, context: Context
    ) -> pb.AlterUserScramCredentialsReply:
        """Every change committed before the reply; only users are logged, never keys."""
        upsertions = [messages.scram_upsertion(item) for item in request.upsertions]
        deletions = [(item.user, item.mechanism) for item in request.deletions]
        with self._metrics.rpc("AlterUserScramCredentials"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    results, changes = term.state.alter_scram_credentials(upsertions, deletions)
                    await _commit_all(term, changes)
            except NotActiveError:
                await self._not_active(context)
        for user, refusal in results:
            if refusal is None:
                log.info("SCRAM credentials of user %r altered", user)
            else:
                log.info("SCRAM credentials of user %r not altered: %s", user, refusal)
        return pb.AlterUserScramCredentialsReply(
            results=[
                pb.UserResult(
                    user=user,
                    error_code=0 if refusal is None else refusal.code,
                    error_message="" if refusal is None else str(refusal),
                )
                for user, refusal in results
            ]
        )

    async def CreateAcls(
        self, request: pb.CreateAclsRequest, context: Context
    ) -> pb.CreateAclsReply:
        bindings = [acl_messages.binding(item) for item in request.creations]
        with self._metrics.rpc("CreateAcls"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    results, changes = term.state.create_acls(bindings)
                    await _commit_all(term, changes)
            except NotActiveError:
                await self._not_active(context)
        refused = [(b, e) for b, e in zip(bindings, results, strict=True) if e is not None]
        for binding, error in refused:
            log.info("CreateAcls of %s refused: %s", binding, error)
        log.info(
            "CreateAcls: %d ACLs created or present, %d refused",
            len(bindings) - len(refused),
            len(refused),
        )
        return pb.CreateAclsReply(results=[_acl_result(e) for e in results])

    async def DeleteAcls(
        self, request: pb.DeleteAclsRequest, context: Context
    ) -> pb.DeleteAclsReply:
        filters = [acl_messages.binding_filter(item) for item in request.filters]
        with self._metrics.rpc("DeleteAcls"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    results, changes = term.state.delete_acls(filters)
                    await _commit_all(term, changes)
            except NotActiveError:
                await self._not_active(context)
        for acl_filter, (error, deleted) in zip(filters, results, strict=True):
            if error is None:
                log.info("DeleteAcls %s: %d ACLs deleted", acl_filter, len(deleted))
            else:
                log.info("DeleteAcls %s refused: %s", acl_filter, error)
        return pb.DeleteAclsReply(
            results=[
                pb.DeleteAclsFilterResult(
                    error_code=0 if error is None else error.code,
                    error_message="" if error is None else str(error),
                    deleted=[acl_messages.binding_message(b) for b in deleted],
                )
                for error, deleted in results
            ]
        )

    async def AlterClientQuotas(
        self, request: pb.AlterClientQuotasRequest, context: Context
    ) -> pb.AlterClientQuotasReply:
        alterations = [messages.quota_alteration(item) for item in request.alterations]
        with self._metrics.rpc("AlterClientQuotas"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    results, changes = term.state.alter_client_quotas(alterations)
                    if not request.validate_only:
                        await _commit_all(term, changes)
            except NotActiveError:
                await self._not_active(context)
        for (components, _ops), error in zip(alterations, results, strict=True):
            if error is not None:
                log.info("AlterClientQuotas of %s refused: %s", components, error)
        if not request.validate_only:
            for change in changes:
                for entity, values in change.client_quotas.items():
                    log.info("client quotas of %s now %s", entity, dict(values))
        return pb.AlterClientQuotasReply(
            results=[
                pb.QuotaResult(
                    error_code=0 if error is None else error.code,
                    error_message="" if error is None else str(error),
                )
                for error in results
            ]
        )

    async def _topics(
        self,
        method: str,
        context: Context,
        plans: Iterable[tuple[str, bytes, TopicPlan]],
        validate_only: bool,
        *,
        kick: bool = False,
        reelect: bool = False,
    ) -> pb.TopicsReply:
        """Each topic planned and committed on its own: one transaction per topic. With
        ``reelect``, each commit is followed by the elections it calls for (``Term.elect``)
        before the next topic and the answer."""
        results = []
        with self._metrics.rpc(method):
            try:
                term = self._controller.require_term()
                for name, topic_id, plan in plans:
                    results.append(
                        await self._topic(
                            term, method, name, topic_id, plan, validate_only, reelect
                        )
                    )
            except NotActiveError:
                await self._not_active(context)
        if kick and not validate_only:
            term.kick()
        return pb.TopicsReply(results=results)

    async def _topic(
        self,
        term: Term,
        method: str,
        name: str,
        topic_id: bytes,
        plan: TopicPlan,
        validate_only: bool,
        reelect: bool = False,
    ) -> pb.TopicResult:
        async with term.lock:
            try:
                topic, change = plan(term.state)
            except KafkaError as exc:
                log.info("%s %r refused: %s", method, name or topic_id.hex(), exc)
                return pb.TopicResult(
                    name=name, topic_id=topic_id, error_code=exc.code, error_message=str(exc)
                )
            if not validate_only:
                await term.commit(change)
                if reelect:
                    await term.elect()
                log.info("%s %r done", method, topic.name)
        return pb.TopicResult(
            name=topic.name,
            topic_id=topic.topic_id,
            partitions=len(topic.partitions),
            replication_factor=topic.replication_factor,
        )

    # Remote log metadata ----------------------------------------------------------------

    async def ListRemoteLogSegments(
        self, request: pb.ListRemoteLogSegmentsRequest, context: Context
    ) -> pb.ListRemoteLogSegmentsReply:
        """Any caller may read. Partitions not read since the takeover are loaded first,
        under the write lock, so what is answered is what was last committed; when all are
        loaded (the usual case: tiering services poll) the lock is not needed, as nothing
        awaits between reading the records and answering."""
        answers = []
        keys = [(item.topic_id, item.partition) for item in request.partitions]
        failed: Mapping[tuple[bytes, int], str] = {}
        with self._metrics.rpc("ListRemoteLogSegments"):
            try:
                term = self._controller.require_term()
                if term.state.remote_unloaded(keys):
                    async with term.lock:
                        failed = await term.load_remote(keys)
                for item in request.partitions:
                    answer = _remote_listing(term.state, item, failed)
                    if answer is not None:
                        answers.append(answer)
            except NotActiveError:
                await self._not_active(context)
        return pb.ListRemoteLogSegmentsReply(partitions=answers)

    async def UpdateRemoteLogSegment(
        self, request: pb.UpdateRemoteLogSegmentRequest, context: Context
    ) -> pb.UpdateRemoteLogSegmentReply:
        """Committed before the reply, so a tiering service that is told a copy finished
        can rely on every controller after this one knowing it."""
        topic_id, index = request.topic_id, request.partition
        with self._metrics.rpc("UpdateRemoteLogSegment"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    failed = await term.load_remote([(topic_id, index)])
                    try:
                        if (topic_id, index) in failed:
                            raise KafkaError(
                                ErrorCode.UNKNOWN_SERVER_ERROR, failed[topic_id, index]
                            )
                        records, change = term.state.update_remote_segment(
                            request.broker_id,
                            request.broker_epoch,
                            topic_id,
                            index,
                            request.leader_epoch,
                            messages.remote_segment_record(request.segment),
                            int(self._controller.wall_clock() * 1000),
                        )
                    except KafkaError as exc:
                        log.info(
                            "UpdateRemoteLogSegment of %s-%d from broker %d refused: %s",
                            layout.uuid_text(topic_id),
                            index,
                            request.broker_id,
                            exc,
                        )
                        known = term.state.remote_partitions.get(topic_id, {})
                        current = known.get(index, NO_RECORDS)
                        return pb.UpdateRemoteLogSegmentReply(
                            error_code=exc.code,
                            error_message=str(exc),
                            version=current.version,
                            next_offset=current.next_offset,
                        )
                    await term.commit(change)
            except NotActiveError:
                await self._not_active(context)
        if change.ops:
            log.info(
                "remote segment %s of %s-%d: %s",
                layout.uuid_text(request.segment.segment_id),
                layout.uuid_text(topic_id),
                index,
                pb.RemoteSegmentState.Name(request.segment.state),
            )
        return pb.UpdateRemoteLogSegmentReply(
            version=records.version, next_offset=records.next_offset
        )

    async def ListRemoteLogDeletions(
        self, request: pb.ListRemoteLogDeletionsRequest, context: Context
    ) -> pb.ListRemoteLogDeletionsReply:
        with self._metrics.rpc("ListRemoteLogDeletions"):
            try:
                term = self._controller.require_term()
            except NotActiveError:
                await self._not_active(context)
            return pb.ListRemoteLogDeletionsReply(
                topics=[
                    pb.RemoteLogDeletion(topic_id=topic_id, name=name)
                    for topic_id, name in term.state.remote_deletions()
                ]
            )

    async def FinishRemoteLogDeletion(
        self, request: pb.FinishRemoteLogDeletionRequest, context: Context
    ) -> pb.FinishRemoteLogDeletionReply:
        """A tiering service deleted the topic's remote objects: its records go too."""
        topic_id = request.topic_id
        with self._metrics.rpc("FinishRemoteLogDeletion"):
            try:
                term = self._controller.require_term()
                async with term.lock:
                    try:
                        removed = await term.finish_remote_deletion(topic_id)
                    except KafkaError as exc:
                        log.info(
                            "FinishRemoteLogDeletion %s refused: %s",
                            layout.uuid_text(topic_id),
                            exc,
                        )
                        return pb.FinishRemoteLogDeletionReply(
                            error_code=exc.code, error_message=str(exc)
                        )
            except NotActiveError:
                await self._not_active(context)
        log.info(
            "remote log records of deleted topic %s removed (%d znodes)",
            layout.uuid_text(topic_id),
            removed,
        )
        return pb.FinishRemoteLogDeletionReply()

    async def _not_active(self, context: Context) -> NoReturn:
        address = self._controller.active_address
        metadata = ((ACTIVE_CONTROLLER_KEY, address),) if address else ()
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, NOT_ACTIVE, metadata)


def _remote_listing(
    state: ClusterState, item: pb.PartitionVersion, failed: Mapping[tuple[bytes, int], str]
) -> pb.RemoteLogPartition | None:
    """One partition of a ListRemoteLogSegments reply; None when the caller knows its
    version already."""
    key = (item.topic_id, item.partition)
    try:
        if key in failed:
            raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, failed[key])
        records = state.remote_partition(*key)
    except KafkaError as exc:
        return pb.RemoteLogPartition(
            topic_id=item.topic_id, partition=item.partition, error_code=exc.code, next_offset=-1
        )
    if item.known_version == records.version:
        return None
    return messages.remote_log_partition(item.topic_id, item.partition, records)


async def _commit_all(term: Term, changes: Iterable[Change]) -> None:
    """Commit, in order, the changes one request was planned as. The caller holds the lock."""
    for change in changes:
        await term.commit(change)


def _acl_result(error: KafkaError | None) -> pb.AclResult:
    if error is None:
        return pb.AclResult()
    return pb.AclResult(error_code=error.code, error_message=str(error))


def _refuse(name: str, why: str) -> TopicPlan:
    def run(state: ClusterState) -> tuple[Topic, Change]:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"topic {name!r} {why}")

    return run


def _partition_results(results: Iterable[PartitionResult]) -> pb.PartitionResults:
    return pb.PartitionResults(
        results=[
            pb.PartitionResult(
                topic=r.topic,
                partition=r.partition,
                error_code=r.error,
                error_message=r.message or "",
            )
            for r in results
        ]
    )
