"""Kafka API handlers of a broker: request objects in, response objects out.

The server decodes a request with its header and calls `handle`; every handler answers
per-item failures (a missing topic, a corrupt batch, a partition led elsewhere) with the
item's Kafka error code and goes on with the rest, so one bad partition never fails a whole
request. What the cluster looks like comes from the controller's image; topic admin
requests are carried out by the controller.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any, NamedTuple

from directlog.broker_config import (
    BROKER_CONFIG_NAMES,
    CLUSTER_DEFAULT,
    LONG_MAX,
    STATIC_CONFIGS,
    InvalidBrokerConfigError,
    log_overrides,
    static_refusal,
    validate_broker_configs,
)
from directlog.protocol.api import APIS, Api, ApiKey, RequestHeader
from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.protocol.produce import PartitionData as ProducePartitionData
from directlog.protocol.produce import PartitionResult, ProduceRequest, encode_produce_response
from directlog.protocol.rdma_access import RdmaAccessRequest, RdmaAccessResponse
from directlog.protocol.rdma_consume import RdmaConsumeRequest, RdmaConsumeResponse
from directlog.protocol.rdma_replica import RdmaReplicaRequest, RdmaReplicaResponse
from directlog.records.batch import (
    LOG_OVERHEAD,
    MAGIC,
    NO_TIMESTAMP,
    Record,
    build_batch,
    read_header,
)
from directlog.records.errors import RecordError
from directlog.records.legacy import decode_message_set
from directlog.records.varint import Buffer
from directlog.rpc import controller_pb2 as pb
from directlog.security.acl import Operation
from directlog.security.client_quotas import ANONYMOUS as ANONYMOUS_USER
from directlog.topic_config import (
    BROKER_DEFAULT_NAMES,
    DEFAULT_NAMES,
    LIST_CONFIGS,
    LogConfig,
    altered_list,
    config_type,
    default_name,
    flag,
)
from directlog.topic_config import LONG as LONG_TYPE  # a ConfigType id, not a bound
from directlog.topics import NO_LEADER, TopicPartition
from directlog.waits import wait_event
from services.broker.acl_admin import AclAdmin
from services.broker.authentication import SESSION
from services.broker.authorization import (
    CLUSTER,
    GROUP,
    TOPIC,
    TRANSACTIONAL_ID,
    Access,
    authorized_operations,
    cluster_operations,
    denied,
)
from services.broker.cluster_metadata import ClusterImage
from services.broker.controller_link import ControllerLink
from services.broker.down_conversion import DownConversion, holds_zstd, legacy_magic, overflow
from services.broker.error_codes import error_code_for
from services.broker.fetch_response import (
    Part,
    PartitionData,
    TopicData,
    encode_fetch_response,
    part_size,
)
from services.broker.groups.coordinator import Commit
from services.broker.groups.handlers import GroupApis
from services.broker.groups.offsets_topic import OFFSETS_TOPIC, partition_for
from services.broker.metrics import BrokerMetrics
from services.broker.partition import Partition
from services.broker.partition_admin import PartitionAdmin
from services.broker.producer_ids import ProducerIdAllocator
from services.broker.quota_admin import QuotaAdmin
from services.broker.quotas import QuotaKind, QuotaManager
from services.broker.rdma.consume import RdmaConsume
from services.broker.rdma.produce import RdmaProduce
from services.broker.rdma.replication import RdmaReplication
from services.broker.replica_manager import ReplicaManager, now_ms
from services.broker.replica_selector import (
    RACK_AWARE_SELECTOR,
    ReplicaView,
    candidates,
    rack_aware,
)
from services.broker.scram_admin import ScramAdmin
from services.broker.settings import BrokerSettings
from services.broker.storage import AppendResult, FileSlice, PartitionLog
from services.broker.storage.errors import OffsetMovedToTieredStorageError
from services.broker.tiered.remote_reads import RemoteReader
from services.broker.transactions.coordinator import TransactionCoordinator, TransactionSettings
from services.broker.transactions.marker_writer import MarkerWriter
from services.broker.transactions.metadata import TxnState
from services.broker.transactions.state_topic import TRANSACTION_STATE_TOPIC
from services.broker.transactions.verification import TransactionVerifier, produce_refusal

log = logging.getLogger(__name__)
# Kafka's Topic.isInternal: flagged so in Metadata, written only by their coordinators.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})

LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL = -1, -2, -3, -4
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
# The config resource types Kafka 3.7 knows (TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS);
# any other, GROUP (32) among them, is its UNKNOWN.
KAFKA_RESOURCE_TYPES = frozenset({2, 4, 8, 16})
INVALID_REQUEST_MESSAGE = (  # Kafka's Errors.INVALID_REQUEST.message()
    "This most likely occurs because of a request being malformed by the client library or "
    "the message was sent to an incompatible broker. See the broker logs for more details."
)
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs' operations
CONFIG_SOURCE_TOPIC = 1  # Kafka's ConfigSource: a topic's override
CONFIG_SOURCE_DYNAMIC_BROKER = 2  # one broker's own (AlterConfigs of broker "<id>")
CONFIG_SOURCE_DYNAMIC_DEFAULT = 3  # the cluster-wide default (AlterConfigs of broker "")
CONFIG_SOURCE_STATIC = 4  # the broker's settings (log_defaults)
CONFIG_SOURCE_DEFAULT = 5  # built in
IMAGE_WAIT_SECONDS = 5.0  # how long an admin answer waits for the image to show its effect
GROUP_KEY, TRANSACTION_KEY = 0, 1  # FindCoordinator key types
Response = Any  # a kafka-python response object, fetch parts, or None (acks=0)
_LOG_NAMES = frozenset(DEFAULT_NAMES)  # the topic configs' cluster-wide defaults
_LIST_LOG_NAMES = frozenset(default_name(name) for name in BROKER_DEFAULT_NAMES & LIST_CONFIGS)


# The listener the request being handled came in through (set by the server for each
# connection's task): Metadata, FindCoordinator and DescribeCluster answer with the brokers'
# addresses on it. Empty: the inter-broker listener.
LISTENER: contextvars.ContextVar[str] = contextvars.ContextVar("listener", default="")

# How long to throttle the client of the connection whose answer was just made, in ms, and
# whether that answer carries the time (throttle_time_ms): set by the handlers when a client
# quota is exceeded, taken (and reset) by the server, which mutes the connection that long
# after sending the answer, or holds back an answer that cannot say so (KIP-219).
NOT_THROTTLED = (0, True)
THROTTLE: contextvars.ContextVar[tuple[int, bool]] = contextvars.ContextVar(
    "throttle", default=NOT_THROTTLED
)
# Not metered by request time: how a client finds the broker's versions, and the followers'
# replication (Kafka exempts inter-broker traffic; Produce and Fetch meter themselves).
_REQUEST_TIME_EXEMPT = frozenset(
    {ApiKey.API_VERSIONS, ApiKey.RDMA_REPLICA, ApiKey.PRODUCE, ApiKey.FETCH}
)
_FOLLOWER_KEYS = frozenset({ApiKey.LIST_OFFSETS, ApiKey.OFFSET_FOR_LEADER_EPOCH})


class CloseConnectionError(Exception):
    """A request whose failure can only be signalled by closing the connection."""


# acks=-1: a partition's answer, the partition, the last offset to replicate, and its name.
_Replicating = tuple[PartitionResult, Partition, int, str]


class _Append(NamedTuple):
    """One partition's records of one produce request, on their way into its log."""

    result: PartitionResult  # the answer, filled in once appended
    records: Buffer
    topic: str
    replicating: list[_Replicating] | None  # the request's acks=-1 waits, if it has acks=-1

    @property
    def item(self) -> str:
        """topic-partition, for errors and logs"""
        return f"{self.topic}-{self.result.index}"


class _RemoteFetch(NamedTuple):
    """A partition of a fetch to be answered from the remote store."""

    data: PartitionData
    tp: TopicPartition
    log: PartitionLog
    offset: int
    max_bytes: int
    min_one_batch: bool
    read_committed: bool  # answers the aborted transactions in what it reads


class _FetchRead(NamedTuple):
    """One pass of a fetch over its partitions."""

    topics: list[TopicData]
    total: int  # bytes read
    failed: bool  # a partition answers an error
    remote: list[_RemoteFetch]  # partitions to read from the remote store
    throttled: int  # bytes read under the leader's replication throttle


class KafkaApis:
    def __init__(
        self,
        settings: BrokerSettings,
        image: ClusterImage,
        replicas: ReplicaManager,
        link: ControllerLink,
        metrics: BrokerMetrics,
        groups: GroupApis,
        producer_ids: ProducerIdAllocator,
        access: Access | None = None,
    ) -> None:
        """``access``: ACL authorization (services/broker/authorization.py); None with the
        authorizer off, when no request is checked."""
        self.settings = settings
        self.access = access
        self.image = image
        self.replicas = replicas
        self.link = link
        self.metrics = metrics
        self.producer_ids = producer_ids
        self.groups = groups
        self.markers = MarkerWriter(
            settings.node_id,
            replicas,
            image,
            replicas.fetch_settings.security,
            settings.transaction_marker_timeout_ms,
            groups.coordinator.transaction_ended,
        )
        self.transactions = TransactionCoordinator(
            TransactionSettings(
                max_timeout_ms=settings.transaction_max_timeout_ms,
                abort_check_interval_ms=(
                    settings.transaction_abort_timed_out_transaction_cleanup_interval_ms
                ),
                id_expiration_ms=settings.transactional_id_expiration_ms,
                id_removal_interval_ms=(
                    settings.transaction_remove_expired_transaction_cleanup_interval_ms
                ),
            ),
            self._transaction_partitions,
            producer_ids,
            self.markers,
        )
        self.verifier = (
            TransactionVerifier(
                settings.node_id, image, self.transactions, replicas.fetch_settings.security
            )
            if settings.transaction_partition_verification_enable
            else None
        )
        self.rdma: RdmaProduce | None = None  # set when rdma_produce is on
        self.rdma_reads: RdmaConsume | None = None  # set when rdma_consume is on
        self.rdma_replication: RdmaReplication | None = None  # set when rdma_replication is on
        self.remote_reads: RemoteReader | None = None  # set when tiered storage is on
        # Set while some client quota is configured (main.py follows the image): with none,
        # requests pay one None check.
        self.client_quotas: QuotaManager | None = None
        self._data_arrived = asyncio.Event()
        self._image_changed = asyncio.Event()
        self._handlers: dict[int, Callable[[Any, RequestHeader], Awaitable[Response]]] = {
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.fetch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.DELETE_RECORDS: self.delete_records,
            ApiKey.METADATA: self.metadata,
            ApiKey.FIND_COORDINATOR: self.find_coordinator,
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.CREATE_TOPICS: self.create_topics,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.DESCRIBE_CONFIGS: self.describe_configs,
            ApiKey.CREATE_PARTITIONS: self.create_partitions,
            ApiKey.ALTER_CONFIGS: self.alter_configs,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            ApiKey.DESCRIBE_CLUSTER: self.describe_cluster,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            ApiKey.ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn,
            ApiKey.END_TXN: self.end_txn,
            ApiKey.TXN_OFFSET_COMMIT: self.txn_offset_commit,
            ApiKey.DESCRIBE_TRANSACTIONS: self.describe_transactions,
            ApiKey.LIST_TRANSACTIONS: self.list_transactions,
            ApiKey.WRITE_TXN_MARKERS: self.write_txn_markers,
            ApiKey.RDMA_ACCESS: self.rdma_access,
            ApiKey.RDMA_CONSUME: self.rdma_consume,
            ApiKey.RDMA_REPLICA: self.rdma_replica,
            **groups.handlers(),
            **PartitionAdmin(image, self._controller_topics, metrics, access).handlers(),
            **ScramAdmin(image, self._controller_topics, access).handlers(),
            **AclAdmin(image, self._controller_topics, access, metrics).handlers(),
            **QuotaAdmin(image, self._controller_topics, metrics, access).handlers(),
        }

    async def handle(self, api: Api, header: RequestHeader, request: Any) -> Response:
        quotas = self.client_quotas
        if quotas is None or api.key in _REQUEST_TIME_EXEMPT:
            return await self._handlers[api.key](request, header)
        user, client_id = _quota_client(header)
        if quotas.quota(QuotaKind.REQUEST, user, client_id) is None or (
            api.key in _FOLLOWER_KEYS and getattr(request, "replica_id", -1) >= 0
        ):
            return await self._handlers[api.key](request, header)
        timed = _Timed(self._handlers[api.key](request, header))
        response = await timed
        throttle = quotas.record(QuotaKind.REQUEST, user, client_id, timed.seconds)
        if throttle:
            self.metrics.quota_throttled("request", throttle)
            carried = _carries_throttle(api, header.api_version, response)
            if carried:
                response.throttle_time_ms = max(response.throttle_time_ms, throttle)
            _throttle(throttle, carried)
        return response

    def data_arrived(self) -> None:
        """Wake long-polling fetches: new records, or a high watermark that moved."""
        self._data_arrived.set()
        self._data_arrived = asyncio.Event()

    def image_changed(self) -> None:
        self._image_changed.set()
        self._image_changed = asyncio.Event()

    # ApiVersions -----------------------------------------------------------------------

    async def api_versions(self, request: Any, header: RequestHeader) -> Response:
        return self.api_versions_response(ErrorCode.NONE)

    @staticmethod
    def api_versions_response(code: ErrorCode) -> Response:
        response = APIS[ApiKey.API_VERSIONS].response
        return response(
            error_code=code,
            api_keys=[
                response.ApiVersion(
                    api_key=api.key, min_version=api.min_version, max_version=api.max_version
                )
                for api in APIS.values()
            ],
            throttle_time_ms=0,
        )

    # Produce ---------------------------------------------------------------------------

    async def produce(self, request: ProduceRequest, header: RequestHeader) -> Response:
        (response,) = await self.produce_all([(header, request)])
        return response

    async def produce_all(
        self, requests: list[tuple[RequestHeader, ProduceRequest]]
    ) -> list[Response]:
        """Answer Produce requests that arrived together (a producer pipelines them), in
        order. Each partition's records from all of them go into its log in one write
        (Partition.append_produced); each request is then answered as it would be alone,
        acks=-1 waiting for its own partitions. With RDMA produce on, records go through
        its reservations one partition at a time. Under client quotas each request is
        metered on its record bytes and its share of the time taken to append them, before
        any wait for replication."""
        started = time.perf_counter()
        answers: list[list[tuple[str, list[PartitionResult]]]] = []
        replicating: list[list[_Replicating]] = []
        appends: dict[Partition, list[_Append]] = {}
        access = self.access
        unverified = await self._verify_transactions(requests) if self.verifier else {}
        for header, request in requests:
            acks = request.acks
            results = []
            waits: list[_Replicating] = []
            # A transactional producer also needs WRITE on its transactional id (KIP-98).
            txn_refused = (
                access is not None
                and request.transactional_id is not None
                and not access.allowed(Operation.WRITE, TRANSACTIONAL_ID, request.transactional_id)
            )
            for topic in request.topic_data:
                partitions = []
                refused = access is not None and not access.allowed(
                    Operation.WRITE, TOPIC, topic.name
                )
                for data in topic.partition_data:
                    result = PartitionResult(data.index, ErrorCode.NONE)
                    try:
                        if txn_refused:
                            assert request.transactional_id is not None
                            raise denied(
                                Operation.WRITE, TRANSACTIONAL_ID, request.transactional_id
                            )
                        if refused:
                            raise denied(Operation.WRITE, TOPIC, topic.name)
                        partition, records = self._producible(header, acks, topic.name, data)
                        if unverified and request.transactional_id is not None:
                            refusal = unverified.get(
                                (request.transactional_id, topic.name, data.index)
                            )
                            if refusal is not None:
                                raise refusal
                        pending = _Append(
                            result, records, topic.name, waits if acks == -1 else None
                        )
                        if self.rdma is None:
                            partition.check_appendable(acks)
                            appends.setdefault(partition, []).append(pending)
                        else:
                            appended = await self.rdma.append(partition, records, acks)
                            self._produced(pending, partition, appended)
                            if not appended.duplicate:
                                self.metrics.produced(topic.name, appended.records, appended.size)
                    except Exception as error:
                        self._produce_failed(result, error, f"{topic.name}-{data.index}")
                    partitions.append(result)
                results.append((topic.name, partitions))
            answers.append(results)
            replicating.append(waits)
        for partition, pending_appends in appends.items():
            outcomes = partition.append_produced([pending.records for pending in pending_appends])
            new_records = new_bytes = 0
            for pending, outcome in zip(pending_appends, outcomes, strict=True):
                if isinstance(outcome, Exception):
                    self._produce_failed(pending.result, outcome, pending.item)
                else:
                    self._produced(pending, partition, outcome)
                    if not outcome.duplicate:
                        new_records += outcome.records
                        new_bytes += outcome.size
            if new_records:
                self.metrics.produced(partition.tp.topic, new_records, new_bytes)
        for results in answers:  # appended or refused; replication is not waited for yet
            for name, partition_results in results:
                self.metrics.produce_answered(name, partition_results)
        throttles = [0] * len(requests)
        if self.client_quotas is not None:
            share = (time.perf_counter() - started) / len(requests)
            throttles = [self._produce_throttle(header, r, share) for header, r in requests]
        responses: list[Response] = []
        for (header, request), results, waits, throttle in zip(
            requests, answers, replicating, throttles, strict=True
        ):
            if waits:
                await self._wait_replicated(waits, request.timeout_ms / 1000)
            if request.acks == 0:
                failed = [(name, p.index) for name, parts in results for p in parts if p.error_code]
                if failed:
                    # No response to carry the error: closing is how Kafka tells such a producer.
                    raise CloseConnectionError(f"acks=0 produce failed for {failed}")
                responses.append(None)
            else:
                responses.append([encode_produce_response(header.api_version, results, throttle)])
        return responses

    async def _verify_transactions(
        self, requests: list[tuple[RequestHeader, ProduceRequest]]
    ) -> dict[tuple[str, str, int], KafkaError]:
        """KIP-890: ask the coordinators about each partition that is to take the first
        batch of a producer's transaction here (services/broker/transactions/verification.py);
        the refusals, by transactional id, topic and partition."""
        assert self.verifier is not None
        asks: dict[tuple[str, int, int], set[tuple[str, int]]] = {}
        for _, request in requests:
            transactional_id = request.transactional_id
            if transactional_id is None:
                continue
            for topic in request.topic_data:
                for data in topic.partition_data:
                    producer = _transactional_producer(data.records)
                    if producer is None:
                        continue
                    try:
                        partition = self.replicas.leader_partition(topic.name, data.index)
                    except KafkaError:
                        continue  # the produce itself answers that
                    if not partition.log.producers.has_open_transaction(producer[0]):
                        asks.setdefault((transactional_id, *producer), set()).add(
                            (topic.name, data.index)
                        )
        if not asks:
            return {}
        verifier = self.verifier
        answers = await asyncio.gather(
            *(verifier.verify(*ask, partitions) for ask, partitions in asks.items())
        )
        refusals: dict[tuple[str, str, int], KafkaError] = {}
        for (transactional_id, _, _), verdicts in zip(asks, answers, strict=True):
            for (topic_name, index), code in verdicts.items():
                refusal = produce_refusal(code)
                if refusal is not None:
                    refusals[(transactional_id, topic_name, index)] = refusal
        return refusals

    def _produce_throttle(
        self, header: RequestHeader, request: ProduceRequest, seconds: float
    ) -> int:
        """Charge a produce request to its client's byte rate and request time quotas; the
        longer throttle, which the connection is muted for (Kafka mutes an acks=0
        producer's connection too, though no answer tells it)."""
        quotas = self.client_quotas
        assert quotas is not None
        user, client_id = _quota_client(header)
        # The whole request, as Kafka charges it: header, names and framing with the records.
        by_bytes = quotas.record(QuotaKind.PRODUCE, user, client_id, header.size + request.size)
        by_time = quotas.record(QuotaKind.REQUEST, user, client_id, seconds)
        if by_bytes:
            self.metrics.quota_throttled("produce", by_bytes)
        if by_time:
            self.metrics.quota_throttled("request", by_time)
        throttle = max(by_bytes, by_time)
        if throttle:
            _throttle(throttle, header.api_version >= 1)
        return throttle

    def _producible(
        self, header: RequestHeader, acks: int, topic: str, data: ProducePartitionData
    ) -> tuple[Partition, Buffer]:
        """The partition this broker leads and the records (v2 batches) to append to it;
        raises KafkaError with the code answering a produce it may not take."""
        if acks not in (0, 1, -1):
            raise KafkaError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks={acks}")
        if topic in INTERNAL_TOPICS:
            raise KafkaError(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"{topic} is internal: only its coordinators write it",
            )
        partition = self.replicas.leader_partition(topic, data.index)
        records: Buffer = data.records if data.records is not None else b""
        if len(records) > 16 and records[16] < MAGIC:
            if header.api_version >= 3:
                raise KafkaError(
                    ErrorCode.INVALID_RECORD, "produce v3 and later carry only record batches v2"
                )
            records = _up_convert(bytes(records))
        return partition, records

    def _produced(self, pending: _Append, partition: Partition, appended: AppendResult) -> None:
        result = pending.result
        result.base_offset = appended.first_offset
        result.log_append_time_ms = appended.log_append_time
        result.log_start_offset = partition.log.log_start_offset
        if appended.duplicate:
            log.info(
                "produce to %s: a retried batch, already at offset %d",
                pending.item,
                appended.first_offset,
            )
        if pending.replicating is not None:
            pending.replicating.append((result, partition, appended.last_offset, pending.item))

    # RdmaAccess ------------------------------------------------------------------------

    async def rdma_access(self, request: RdmaAccessRequest, header: RequestHeader) -> Response:
        """Grant RDMA write access to a partition's head segment (services/broker/rdma)."""
        if self.rdma is None:
            answer = RdmaAccessResponse(
                ErrorCode.INVALID_REQUEST, "RDMA produce is off on this broker (rdma_produce)"
            )
        else:
            try:
                if self.access is not None:
                    self.access.check(Operation.WRITE, TOPIC, request.topic)
                answer = await self.rdma.grant(request)
            except Exception as error:
                code, message = self._item_error(
                    error, "rdma_access", f"{request.topic}-{request.partition}"
                )
                answer = RdmaAccessResponse(code, message)
        return [answer.encode()]

    # RdmaConsume -----------------------------------------------------------------------

    async def rdma_consume(self, request: RdmaConsumeRequest, header: RequestHeader) -> Response:
        """Grant or release RDMA read access to a segment (services/broker/rdma/consume.py)."""
        if self.rdma_reads is None:
            answer = RdmaConsumeResponse(
                ErrorCode.INVALID_REQUEST, "RDMA consume is off on this broker (rdma_consume)"
            )
        else:
            try:
                if self.access is not None:
                    self.access.check(Operation.READ, TOPIC, request.topic)
                answer = self.rdma_reads.handle(request)
            except Exception as error:
                code, message = self._item_error(
                    error, "rdma_consume", f"{request.topic}-{request.partition}"
                )
                answer = RdmaConsumeResponse(code, message, consumer_id=request.consumer_id)
        return [answer.encode()]

    # RdmaReplica -----------------------------------------------------------------------

    async def rdma_replica(self, request: RdmaReplicaRequest, header: RequestHeader) -> Response:
        """A leader asks for a push grant of our replica's head segment
        (services/broker/rdma/replication.py); refused, it keeps being pulled."""
        if self.rdma_replication is None:
            answer = RdmaReplicaResponse(
                ErrorCode.INVALID_REQUEST,
                "RDMA replication is off on this broker (rdma_replication)",
            )
            return [answer.encode()]
        if self.access is not None and not self.access.allowed_on_cluster(Operation.CLUSTER_ACTION):
            code, message = self._item_error(
                denied(Operation.CLUSTER_ACTION, CLUSTER, ""),
                "rdma_replica",
                f"{request.topic}-{request.partition}",
            )
            return [RdmaReplicaResponse(code, message).encode()]
        return await self.rdma_replication.handle(request, header)

    async def _wait_replicated(self, waiting: list[_Replicating], timeout: float) -> None:
        """acks=-1: every appended partition's records reach its ISR, or the partition's
        answer becomes the reason they did not. Partitions already replicated (a single
        in-sync replica) are answered without suspending the request."""
        pending = []
        for entry in waiting:
            result, partition, last, item = entry
            try:
                if not partition.replicated(last):
                    pending.append(entry)
            except KafkaError as error:
                self._replication_failed(result, item, error)
        if not pending:
            return
        outcomes = await asyncio.gather(
            *(partition.wait_replicated(last, timeout) for _, partition, last, _ in pending),
            return_exceptions=True,
        )
        for (result, _, _, item), outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self._replication_failed(result, item, outcome)

    def _replication_failed(self, result: PartitionResult, item: str, error: BaseException) -> None:
        self._produce_failed(result, error, item)
        result.base_offset = -1

    def _produce_failed(self, result: PartitionResult, error: BaseException, item: str) -> None:
        """A partition's produce refused: its error code and message, and the records at
        fault when a rule refused single records of its batch (KIP-467)."""
        result.error_code, result.error_message = self._item_error(error, "produce", item)
        if isinstance(error, RecordError):
            result.record_errors = error.record_errors

    def _item_error(self, error: BaseException, api: str, item: str) -> tuple[ErrorCode, str]:
        """The Kafka error code answering one failed item (a partition, a topic, a config
        resource), counted and logged once; a traceback only for what no code describes."""
        code = error_code_for(error)
        self.metrics.request_error(api, code)
        if code is ErrorCode.UNKNOWN_SERVER_ERROR:
            log.exception("%s for %s failed", api, item)
        else:
            log.info("%s for %s: %s: %s", api, item, code.name, error)
        return code, str(error)

    # Fetch -----------------------------------------------------------------------------

    async def fetch(self, request: Any, header: RequestHeader) -> list[Part]:
        version = header.api_version
        deadline = time.monotonic() + max(request.max_wait_ms, 0) / 1000
        max_bytes = request.max_bytes if version >= 3 else 0x7FFFFFFF
        handled = 0.0  # seconds spent reading, for a request time quota
        while True:
            waiter = self._data_arrived
            started = time.perf_counter()
            read = self._read_fetch(request, version, max_bytes)
            handled += time.perf_counter() - started
            remaining = deadline - time.monotonic()
            if read.failed or read.remote or read.total >= request.min_bytes or remaining <= 0:
                break
            if not await wait_event(waiter, remaining):
                started = time.perf_counter()
                read = self._read_fetch(request, version, max_bytes)
                handled += time.perf_counter() - started
                break
        # Counted once the answer is final, before anything else may read (no await since).
        self.replicas.quotas.leader.record(read.throttled)
        topics, remote = read.topics, read.remote
        if remote:
            await self._read_remote(remote, version)
        follower = _replica_id(request, version) >= 0
        if self.client_quotas is not None and not follower:
            throttle = self._fetch_throttle(header, topics, handled)
            if throttle:  # Kafka's answer over quota: no data at all, nothing charged
                return encode_fetch_response(version, ErrorCode.NONE, [], throttle)
        if version < 10 and not follower:
            await asyncio.to_thread(self._for_old_consumer, topics, version)
        for topic in topics:
            self.metrics.fetch_answered(topic.name, topic.partitions, follower)
        return encode_fetch_response(version, ErrorCode.NONE, topics)

    def _fetch_throttle(
        self, header: RequestHeader, topics: list[TopicData], seconds: float
    ) -> int:
        """A consumer's fetch against its byte rate and request time quotas: the longer
        throttle the answer would earn, the bytes charged only when there is none (Kafka
        answers a fetch over quota with no data, so it costs nothing)."""
        quotas = self.client_quotas
        assert quotas is not None
        user, client_id = _quota_client(header)
        size = sum(p.records_size for topic in topics for p in topic.partitions)
        by_bytes = quotas.throttle_ms(QuotaKind.FETCH, user, client_id, size)
        by_time = quotas.record(QuotaKind.REQUEST, user, client_id, seconds)
        if by_bytes:
            self.metrics.quota_throttled("fetch", by_bytes)
        if by_time:
            self.metrics.quota_throttled("request", by_time)
        throttle = max(by_bytes, by_time)
        if throttle:
            _throttle(throttle, header.api_version >= 1)
        else:
            quotas.record(QuotaKind.FETCH, user, client_id, size)
        return throttle

    def _read_fetch(self, request: Any, version: int, max_bytes: int) -> _FetchRead:
        """One pass over the partitions a fetch asks for. A follower outside the ISR of a
        partition this broker's leader throttle covers gets its data only while the leader
        quota allows, at most what it allows plus one batch (Kafka leaves it out of the
        answer; the follower fetches again)."""
        replica = _replica_id(request, version)
        # KIP-98: read_committed consumers read up to the last stable offset, and are told
        # which transactions there were aborted. So do consumers older than Fetch v4, which
        # cannot tell aborted records apart: their answer is converted without them.
        read_committed = replica < 0 and (version < 4 or request.isolation_level == 1)
        quotas = self.replicas.quotas
        now = now_ms()
        topics: list[TopicData] = []
        remote: list[_RemoteFetch] = []
        total = throttled = 0
        failed = False
        access = self.access
        # A follower needs CLUSTER_ACTION on the cluster, a consumer READ on each topic;
        # either way a refused partition answers TOPIC_AUTHORIZATION_FAILED, as in Kafka.
        follower_refused = (
            replica >= 0
            and access is not None
            and not access.allowed_on_cluster(Operation.CLUSTER_ACTION)
        )
        for fetch_topic in request.topics:
            if version >= 13:
                known = self.image.topic_by_id(fetch_topic.topic_id)
                name = known.name if known else ""
                topic_id = fetch_topic.topic_id
            else:
                name = fetch_topic.topic
                known = self.image.topic(name)
                topic_id = known.topic_id if known else uuid.UUID(int=0)
            refused = follower_refused or (
                replica < 0
                and access is not None
                and (known is not None or version < 13)  # an unknown id answers so first
                and not access.allowed(Operation.READ, TOPIC, name)
            )
            partitions = []
            for wanted in fetch_topic.partitions:
                data = PartitionData(wanted.partition, ErrorCode.NONE)
                budget = 0
                try:
                    if refused:
                        raise KafkaError(
                            ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            "not authorized to CLUSTER_ACTION the cluster (a follower's fetch)"
                            if follower_refused
                            else f"not authorized to READ topic {name!r}",
                        )
                    if known is None:
                        code = (
                            ErrorCode.UNKNOWN_TOPIC_ID
                            if version >= 13
                            else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                        )
                        raise KafkaError(code, f"unknown topic {name or topic_id}")
                    epoch = wanted.current_leader_epoch if version >= 9 else -1
                    # Consumers from Fetch v11 (KIP-392) may read a follower too.
                    partition = (
                        self.replicas.readable_partition(name, wanted.partition, epoch)
                        if replica < 0 and version >= 11
                        else self.replicas.leader_partition(name, wanted.partition, epoch)
                    )
                    partition_log = partition.log
                    throttle = False
                    if replica >= 0:
                        partition.follower_fetched(
                            replica,
                            wanted.fetch_offset,
                            now,
                            wanted.log_start_offset if version >= 5 else -1,
                        )
                        upper = partition_log.log_end_offset
                        throttle = quotas.leader_throttles(
                            partition.config, wanted.partition, partition.info.isr, replica
                        )
                    elif version < 4:
                        self._check_down_conversion(name, version)
                    data.high_watermark = partition_log.high_watermark
                    data.last_stable_offset = partition_log.last_stable_offset
                    data.log_start_offset = partition_log.log_start_offset
                    if replica < 0:
                        upper = data.last_stable_offset if read_committed else data.high_watermark
                        preferred = self._preferred_read_replica(
                            request, version, partition, wanted.fetch_offset, now
                        )
                        if preferred is not None:
                            data.preferred_read_replica = preferred
                        # No records when the consumer should read elsewhere, or reads a
                        # follower past its end without a leader epoch, so maybe on stale
                        # metadata: not an out of range its reset policy would act on (as
                        # Kafka answers).
                        if preferred is not None or (
                            not partition.is_leader
                            and epoch < 0
                            and wanted.fetch_offset > partition_log.log_end_offset
                        ):
                            data.records = b""
                            partitions.append(data)
                            continue
                    budget = max(min(wanted.partition_max_bytes, max_bytes - total), 0)
                    # KIP-74 (Fetch v3+): the first partition's first batch goes even past
                    # the limits; before v3 the limits hold.
                    min_one_batch = total == 0 and version >= 3
                    allowance = quotas.leader.allowance() if throttle else None
                    if allowance is not None:
                        allowance -= throttled  # what this answer took already
                        if allowance <= 0:
                            data.records = b""
                            partitions.append(data)
                            continue
                        # At least one batch, so a batch above the allowance still goes.
                        min_one_batch = min_one_batch or budget > 0
                        budget = min(budget, allowance)
                    read = partition_log.read(
                        wanted.fetch_offset,
                        budget,
                        upper_offset=upper,
                        min_one_batch=min_one_batch,
                    )
                    data.offsets = read.offsets
                    data.records = read.records
                    if read_committed:
                        data.aborted = [
                            (txn.producer_id, txn.first_offset)
                            for txn in partition_log.aborted_transactions(
                                wanted.fetch_offset, upper
                            )
                        ]
                    if not read.records.size and version < 3 and wanted.fetch_offset < upper:
                        # Its first batch is above the limit: before KIP-74 the client is
                        # told with a message cut off, and raises its record-too-large error.
                        data.records = overflow(LOG_OVERHEAD)
                    total += read.records.size
                    if throttle:
                        throttled += read.records.size
                except OffsetMovedToTieredStorageError as moved:
                    if replica < 0 and self.remote_reads is not None:
                        tp = TopicPartition(name, wanted.partition)
                        remote.append(
                            _RemoteFetch(
                                data,
                                tp,
                                partition_log,
                                moved.offset,
                                budget,
                                min_one_batch,
                                read_committed,
                            )
                        )
                        total += budget
                    else:  # a follower restarts from the leader's local log start (KIP-405)
                        problem = (
                            moved
                            if replica >= 0
                            else KafkaError(
                                ErrorCode.KAFKA_STORAGE_ERROR, f"{moved}; no remote store set"
                            )
                        )
                        data.error_code, _ = self._item_error(
                            problem, "fetch", f"{name}-{wanted.partition}"
                        )
                        data.records = b""
                        failed = True
                except Exception as error:
                    data.error_code, _ = self._item_error(
                        error, "fetch", f"{name}-{wanted.partition}"
                    )
                    # Empty, never null, as Kafka answers: librdkafka and old consumers
                    # take a null message set for a malformed answer.
                    data.records = b""
                    failed = True
                partitions.append(data)
            topics.append(TopicData(name, topic_id, partitions))
        return _FetchRead(topics, total, failed, remote, throttled)

    def _preferred_read_replica(
        self, request: Any, version: int, partition: Partition, fetch_offset: int, now: int
    ) -> int | None:
        """The follower a consumer's Fetch (v11+, with its client.rack) should go to instead
        of this leader, under a rack-aware replica.selector.class; None: read here."""
        if (
            version < 11
            or not request.rack_id
            or not partition.is_leader
            or self.settings.replica_selector_class != RACK_AWARE_SELECTOR
        ):
            return None
        image = self.image
        listener = LISTENER.get()
        racks = {
            b.broker_id: b.rack
            for b in image.brokers.values()
            if not b.fenced and b.address(listener) is not None
        }
        leader = ReplicaView(self.settings.node_id, racks.get(self.settings.node_id), 0, 0)
        followers = (
            (r, p.log_start_offset, p.log_end_offset, p.last_caught_up_ms)
            for r, p in partition.followers.items()
        )
        chosen = rack_aware(
            request.rack_id,
            leader,
            candidates(followers, partition.info.isr, fetch_offset, now, racks),
        )
        return None if chosen == leader.broker_id else chosen

    async def _read_remote(self, remote: list[_RemoteFetch], version: int) -> None:
        """Fill in the partitions below their local log start from the remote store, waiting
        at most remote_fetch_max_wait_ms; a read not done by then answers no records (the
        client fetches again and takes it), a failed one its error code. A read_committed
        fetch gets the aborted transactions of what it reads from the remote copies'
        transaction indexes (the local index may no longer hold them)."""
        reader = self.remote_reads
        assert reader is not None
        wait = self.settings.remote_fetch_max_wait_ms / 1000
        results = await asyncio.gather(
            *(
                reader.read(
                    r.tp, r.log, r.offset, r.max_bytes, min_one_batch=r.min_one_batch, wait=wait
                )
                for r in remote
            ),
            return_exceptions=True,
        )
        for fetch, result in zip(remote, results, strict=True):
            data = fetch.data
            if isinstance(result, BaseException):
                data.error_code, _ = self._item_error(result, "fetch", str(fetch.tp))
                data.records = None
            elif result is None or not result.records:
                data.records = b""
            elif fetch.read_committed and result.aborted is None:
                # A copy's aborted transactions are unknown: never serve its records as
                # committed (KAFKA_STORAGE_ERROR, retriable; read_uncommitted still reads).
                problem = KafkaError(
                    ErrorCode.KAFKA_STORAGE_ERROR,
                    f"{fetch.tp}: the aborted transactions of remote records unreadable",
                )
                data.error_code, _ = self._item_error(problem, "fetch", str(fetch.tp))
                data.records = None
            else:
                data.records = memoryview(result.records)
                data.offsets = result.offsets
                if fetch.read_committed:
                    assert result.aborted is not None
                    data.aborted = [(txn.producer_id, txn.first_offset) for txn in result.aborted]

    def _check_down_conversion(self, topic: str, version: int) -> None:
        """A Fetch below v4 needs conversion, which the topic may refuse (Kafka's
        message.downconversion.enable): UNSUPPORTED_VERSION."""
        if not self.image.config_for(topic).message_downconversion_enable:
            raise KafkaError(
                ErrorCode.UNSUPPORTED_VERSION,
                f"Fetch v{version} needs records converted to an older format, and "
                f"message.downconversion.enable is false for {topic}",
            )

    def _for_old_consumer(self, topics: list[TopicData], version: int) -> None:
        """Records read for a consumer's Fetch below v10 (on a worker thread: it reads
        batch headers and converts first batches): zstd batches, which it cannot carry, get
        UNSUPPORTED_COMPRESSION_TYPE; below v4 the records are converted as they are sent,
        their size committed here (or converted at once with down_conversion_chunk_bytes 0)."""
        chunk_bytes = self.settings.down_conversion_chunk_bytes
        for topic in topics:
            for data in topic.partitions:
                records = data.records
                if not isinstance(records, FileSlice | memoryview) or not part_size(records):
                    continue  # nothing read, or an answer already made (an error, a cut-off)
                if holds_zstd(records):
                    problem = KafkaError(
                        ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                        f"zstd batches, which Fetch v{version} cannot carry (v10+ can)",
                    )
                    item = f"{topic.name}-{data.index}"
                    data.error_code, _ = self._item_error(problem, "fetch", item)
                    data.records = b""
                elif version < 4:
                    magic = legacy_magic(version)
                    conversion = DownConversion.plan(
                        records, magic, chunk_bytes, topic.name, self.metrics, data.aborted
                    )
                    data.records = conversion if chunk_bytes else conversion.eager()

    # ListOffsets -----------------------------------------------------------------------

    async def list_offsets(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.LIST_OFFSETS].response
        topics = []
        access = self.access
        for topic in request.topics:
            partitions = []
            refused = access is not None and not access.allowed(
                Operation.DESCRIBE, TOPIC, topic.name
            )
            for wanted in topic.partitions:
                code, offset, timestamp, epoch = ErrorCode.NONE, -1, -1, -1
                try:
                    if refused:
                        raise denied(Operation.DESCRIBE, TOPIC, topic.name)
                    partition = self.replicas.leader_partition(
                        topic.name,
                        wanted.partition_index,
                        wanted.current_leader_epoch if header.api_version >= 4 else -1,
                    )
                    if (
                        wanted.timestamp == LATEST
                        and header.api_version >= 2
                        and request.isolation_level == 1
                    ):  # read_committed (KIP-98): the latest a consumer may read
                        offset, timestamp = partition.log.last_stable_offset, -1
                    else:
                        offset, timestamp = await self._offset_for(partition, wanted.timestamp)
                    epoch = partition.leader_epoch
                    if wanted.timestamp == EARLIEST_LOCAL:
                        epoch = partition.log.leader_epochs.epoch_for(offset)
                except Exception as error:
                    code, _ = self._item_error(
                        error, "list_offsets", f"{topic.name}-{wanted.partition_index}"
                    )
                partitions.append(
                    response.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                        partition_index=wanted.partition_index,
                        error_code=code,
                        old_style_offsets=[offset] if offset >= 0 else [],
                        timestamp=timestamp,
                        offset=offset,
                        leader_epoch=epoch,
                    )
                )
            topics.append(response.ListOffsetsTopicResponse(name=topic.name, partitions=partitions))
        return response(throttle_time_ms=0, topics=topics)

    # DeleteRecords ---------------------------------------------------------------------

    async def delete_records(self, request: Any, header: RequestHeader) -> Response:
        """Records below each offset go (-1: the high watermark). Each partition answers its
        low watermark once no replica in its ISR serves a record below the offset, or
        REQUEST_TIMED_OUT after timeout_ms; the new log starts are checkpointed first."""
        response = APIS[ApiKey.DELETE_RECORDS].response
        topic_type = response.DeleteRecordsTopicResult
        partition_type = topic_type.DeleteRecordsPartitionResult
        timeout = max(request.timeout_ms, 0) / 1000
        access = self.access
        refused = (
            set()
            if access is None
            else access.refused(Operation.DELETE, TOPIC, (t.name for t in request.topics))
        )

        async def delete(topic: str, wanted: Any) -> Any:
            low, code = -1, ErrorCode.NONE
            try:
                if topic in refused:
                    raise denied(Operation.DELETE, TOPIC, topic)
                if topic in INTERNAL_TOPICS:
                    raise KafkaError(
                        ErrorCode.INVALID_TOPIC_EXCEPTION, f"{topic} is internal: not deleted"
                    )
                partition = self.replicas.leader_partition(topic, wanted.partition_index)
                low = await partition.delete_records(wanted.offset, timeout)
            except Exception as error:
                code, _ = self._item_error(
                    error, "delete_records", f"{topic}-{wanted.partition_index}"
                )
            return partition_type(
                partition_index=wanted.partition_index, low_watermark=low, error_code=code
            )

        answers = [
            asyncio.gather(*(delete(t.name, p) for p in t.partitions)) for t in request.topics
        ]
        topics = [
            topic_type(name=t.name, partitions=list(await answer))
            for t, answer in zip(request.topics, answers, strict=True)
        ]
        await asyncio.to_thread(self.replicas.logs.checkpoint_log_starts)
        return response(throttle_time_ms=0, topics=topics)

    async def _offset_for(self, partition: Partition, timestamp: int) -> tuple[int, int]:
        """ListOffsets' (offset, timestamp) for one partition. By timestamp, a tiered log's
        remote records are searched first (they come first), through the remote indexes'
        time entries; the largest timestamp (-3) is looked up in local segments only, as in
        Kafka 3.7."""
        partition_log = partition.log
        if timestamp == LATEST:
            return partition_log.high_watermark, -1
        if timestamp == EARLIEST:
            return partition_log.log_start_offset, -1
        if timestamp == EARLIEST_LOCAL:  # KIP-405: where a follower starts its local log
            return partition_log.local_log_start_offset, -1
        if timestamp == MAX_TIMESTAMP:
            best = max(partition_log.segments, key=lambda s: s.max_timestamp)
            if best.max_timestamp == NO_TIMESTAMP:
                return -1, -1
            return best.offset_of_max_timestamp, best.max_timestamp
        if partition_log.remote is not None and self.remote_reads is not None:
            found = await self.remote_reads.offset_for_timestamp(
                partition.tp,
                partition_log,
                timestamp,
                self.settings.remote_list_offsets_request_timeout_ms / 1000,
            )
            if found is not None:
                return found
        found = partition_log.offset_for_timestamp(
            timestamp, upper_offset=partition_log.high_watermark
        )
        return (found[0], found[1]) if found else (-1, -1)

    # Metadata --------------------------------------------------------------------------

    async def metadata(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.METADATA].response
        version = header.api_version
        access = self.access
        every_topic = request.topics is None or (version == 0 and not request.topics)
        by_id: dict[str, uuid.UUID] = {}  # the topics asked for by id
        if every_topic:
            wanted_topics: list[str | uuid.UUID] = sorted(self.image.topics)
        else:
            wanted_topics = []
            for wanted in request.topics:
                if wanted.name is None and version >= 10:
                    known = self.image.topic_by_id(wanted.topic_id)
                    wanted_topics.append(known.name if known else wanted.topic_id)
                    if known is not None:
                        by_id[known.name] = wanted.topic_id
                else:
                    wanted_topics.append(wanted.name)
        # Topics without DESCRIBE: left out of a listing of every topic, refused when
        # named, whether they exist or not (Kafka does not tell).
        hidden: set[str] = set()
        if access is not None:
            names = [n for n in wanted_topics if isinstance(n, str)]
            hidden = access.refused(Operation.DESCRIBE, TOPIC, names)
            if every_topic:
                wanted_topics = [n for n in names if n not in hidden]
                hidden = set()
        allow_create = self.settings.auto_create_topics and (
            version < 4 or request.allow_auto_topic_creation
        )
        missing = [
            n
            for n in wanted_topics
            if isinstance(n, str) and n not in hidden and self.image.topic(n) is None
        ]
        not_created: set[str] = set()  # auto-creation needs CREATE, on the cluster or topic
        if (
            allow_create
            and missing
            and access is not None
            and not access.allowed_on_cluster(Operation.CREATE)
        ):
            not_created = access.refused(Operation.CREATE, TOPIC, missing)
            missing = [n for n in missing if n not in not_created]
        created: dict[str, ErrorCode] = {}
        if allow_create and missing:
            created = await self._auto_create(missing)
        with_operations = version >= 8 and request.include_topic_authorized_operations
        topics = []
        for name in wanted_topics:
            if not isinstance(name, str):
                topics.append(
                    response.MetadataResponseTopic(  # an id no topic has (any more)
                        error_code=ErrorCode.UNKNOWN_TOPIC_ID,
                        name=None,
                        topic_id=name,
                        is_internal=False,
                        partitions=[],
                        authorized_operations=None,
                    )
                )
            elif name in hidden or name in not_created:
                self.metrics.request_error("metadata", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                topics.append(
                    response.MetadataResponseTopic(
                        error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                        name=None if name in by_id else name,  # an id is no secret, a name is
                        topic_id=by_id.get(name, uuid.UUID(int=0)),
                        is_internal=name in INTERNAL_TOPICS and name in not_created,
                        partitions=[],
                        authorized_operations=None,
                    )
                )
            else:
                operations = authorized_operations(access, TOPIC, name) if with_operations else None
                topics.append(self._topic_metadata(response, name, created, operations))
        live = self._live_addresses()
        return response(
            throttle_time_ms=0,
            brokers=[
                response.MetadataResponseBroker(node_id=b_id, host=host, port=port, rack=rack)
                for b_id, host, port, rack in live
            ],
            cluster_id=self.image.cluster_id,
            controller_id=self._controller_id(live),
            topics=topics,
            authorized_operations=cluster_operations(access)
            if 8 <= version <= 10 and request.include_cluster_authorized_operations
            else None,
            error_code=0,
        )

    async def _auto_create(self, names: list[str]) -> dict[str, ErrorCode]:
        """Create topics a client asked about (auto.create.topics.enable): LEADER_NOT_AVAILABLE
        while they come up, as Kafka answers, or the reason they cannot exist."""
        outcome: dict[str, ErrorCode] = {}
        try:
            reply = await self._controller_topics(
                lambda s: s.CreateTopics,
                pb.CreateTopicsRequest(
                    topics=[
                        pb.NewTopic(name=n, partitions=-1, replication_factor=-1) for n in names
                    ]
                ),
                self._created,
            )
        except KafkaError as error:
            self.metrics.request_error("metadata", error.code)
            return dict.fromkeys(names, ErrorCode.LEADER_NOT_AVAILABLE)
        for result in reply.results:
            code = ErrorCode(result.error_code)
            if code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                log.info("created topic %s on first use", result.name)
                outcome[result.name] = ErrorCode.NONE
            else:
                self.metrics.request_error("metadata", code)
                outcome[result.name] = code
        return outcome

    def _topic_metadata(
        self,
        response: Any,
        name: str,
        created: dict[str, ErrorCode],
        operations: frozenset[Operation] | None,
    ) -> Any:
        topic = self.image.topic(name)
        code = ErrorCode.NONE
        if topic is None:
            code = created.get(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            if code is ErrorCode.NONE:
                code = ErrorCode.LEADER_NOT_AVAILABLE
            if code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                self.metrics.request_error("metadata", code)
        live = {b.broker_id for b in self.image.live_brokers()}
        partitions = []
        for index, info in sorted(topic.partitions.items()) if topic else ():
            partitions.append(
                response.MetadataResponseTopic.MetadataResponsePartition(
                    error_code=ErrorCode.LEADER_NOT_AVAILABLE
                    if info.leader == NO_LEADER
                    else ErrorCode.NONE,
                    partition_index=index,
                    leader_id=info.leader,
                    leader_epoch=info.leader_epoch,
                    replica_nodes=list(info.replicas),
                    isr_nodes=list(info.isr),
                    offline_replicas=[r for r in info.replicas if r not in live],
                )
            )
        return response.MetadataResponseTopic(
            error_code=code,
            name=name,
            topic_id=topic.topic_id if topic else uuid.UUID(int=0),
            is_internal=name in INTERNAL_TOPICS,
            partitions=partitions,
            authorized_operations=operations,  # None: not asked for (KIP-430)
        )

    async def find_coordinator(self, request: Any, header: RequestHeader) -> Response:
        """A group's coordinator is the leader of its __consumer_offsets partition, a
        transactional id's the leader of its __transaction_state partition (each topic
        created on first use)."""
        version = header.api_version
        response = APIS[ApiKey.FIND_COORDINATOR].response
        keys = request.coordinator_keys if version >= 4 else [request.key]
        key_type = request.key_type if version >= 1 else GROUP_KEY
        found = [await self._coordinator(key, key_type) for key in keys]
        for code, message, _ in found:
            if code is not ErrorCode.NONE:
                self.metrics.request_error("find_coordinator", code)
                log.info("find_coordinator: %s: %s", code.name, message)
        code, message, node = found[0] if found else (ErrorCode.NONE, None, None)
        node_id, host, port = node or (-1, "", -1)
        return response(
            throttle_time_ms=0,
            error_code=code,
            error_message=message,
            node_id=node_id,
            host=host,
            port=port,
            coordinators=[
                response.Coordinator(
                    key=key,
                    node_id=n[0] if n else -1,
                    host=n[1] if n else "",
                    port=n[2] if n else -1,
                    error_code=c,
                    error_message=m,
                )
                for key, (c, m, n) in zip(keys, found, strict=True)
            ],
        )

    async def _coordinator(
        self, key: str, key_type: int
    ) -> tuple[ErrorCode, str | None, tuple[int, str, int] | None]:
        """The coordinator's node id, host and port on the request's listener."""
        access = self.access
        if access is not None and key_type in (GROUP_KEY, TRANSACTION_KEY):
            resource = GROUP if key_type == GROUP_KEY else TRANSACTIONAL_ID
            if not access.allowed(Operation.DESCRIBE, resource, key):
                refusal = denied(Operation.DESCRIBE, resource, key)
                return refusal.code, str(refusal), None
        if key_type == GROUP_KEY:
            name = OFFSETS_TOPIC
        elif key_type == TRANSACTION_KEY:
            name = TRANSACTION_STATE_TOPIC
        else:
            return ErrorCode.INVALID_REQUEST, f"unknown coordinator key type {key_type}", None
        if not key:
            what = "group id" if key_type == GROUP_KEY else "transactional id"
            return ErrorCode.INVALID_REQUEST, f"the {what} is empty", None
        topic = self.image.topic(name)
        if topic is None:
            await self._create_internal_topic(name)
            topic = self.image.topic(name)
            if topic is None:
                return ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{name} is not ready", None
        index = partition_for(key, len(topic.partitions))
        info = topic.partitions.get(index)
        broker = self.image.brokers.get(info.leader) if info is not None else None
        address = broker.address(LISTENER.get()) if broker is not None else None
        if broker is None or address is None or address[1] <= 0 or broker.fenced:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{name}-{index} has no leader", None
        return ErrorCode.NONE, None, (broker.broker_id, *address)

    def _controller_id(self, live: list[tuple[int, str, int, str | None]]) -> int:
        """The "controller" clients send admin requests to: any broker hands them to the
        controller, so this one — unless the brokers it lists leave it out (fenced while it
        restarts, or without the request's listener), where a client would find no such
        broker: then the first it lists."""
        ids = [node_id for node_id, *_ in live]
        if not ids:
            return -1
        return self.settings.node_id if self.settings.node_id in ids else ids[0]

    def _live_addresses(self) -> list[tuple[int, str, int, str | None]]:
        """Live brokers as (id, host, port, rack) on the request's listener."""
        listener = LISTENER.get()
        return [
            (b.broker_id, *address, b.rack)
            for b in self.image.live_brokers()
            if (address := b.address(listener)) is not None
        ]

    async def _create_internal_topic(self, name: str) -> None:
        """Create __consumer_offsets or __transaction_state as Kafka does: compacted, the
        configured partitions and replication factor; until enough brokers are registered
        the controller refuses it and clients are told COORDINATOR_NOT_AVAILABLE, which they
        retry."""
        settings = self.settings
        if name == OFFSETS_TOPIC:
            partitions = settings.offsets_topic_num_partitions
            replication_factor = settings.offsets_topic_replication_factor
            segment_bytes = settings.offsets_topic_segment_bytes
        else:
            partitions = settings.transaction_state_log_num_partitions
            replication_factor = settings.transaction_state_log_replication_factor
            segment_bytes = settings.transaction_state_log_segment_bytes
        try:
            reply = await self._controller_topics(
                lambda s: s.CreateTopics,
                pb.CreateTopicsRequest(
                    topics=[
                        pb.NewTopic(
                            name=name,
                            partitions=partitions,
                            replication_factor=replication_factor,
                            configs={
                                "cleanup.policy": "compact",
                                "segment.bytes": str(segment_bytes),
                            },
                        )
                    ]
                ),
                self._created,
            )
        except KafkaError as error:
            log.info("cannot create %s yet: %s", name, error)
            return
        for result in reply.results:
            if result.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                log.warning(
                    "cannot create %s: %s: %s",
                    name,
                    ErrorCode(result.error_code).name,
                    result.error_message,
                )
            elif result.error_code == ErrorCode.NONE:
                log.info("created %s", name)

    def _transaction_partitions(self) -> int:
        """Partitions of __transaction_state: as created, or as it will be created."""
        topic = self.image.topic(TRANSACTION_STATE_TOPIC)
        return (
            len(topic.partitions) if topic else self.settings.transaction_state_log_num_partitions
        )

    async def init_producer_id(self, request: Any, header: RequestHeader) -> Response:
        """A producer id and epoch. Without a transactional id: a new id, epoch 0 — Kafka
        always hands out a fresh id, also to a producer that names its old one (KIP-360):
        its sequences start again at 0 under the new id. With one: the id's coordinator
        bumps its epoch, fencing the id's older producers (services/broker/transactions)."""
        response = APIS[ApiKey.INIT_PRODUCER_ID].response
        code, producer_id, epoch = ErrorCode.NONE, -1, -1
        transactional_id = request.transactional_id
        refusal = self._producer_id_refusal(transactional_id)
        try:
            if refusal is not None:
                raise refusal
            if transactional_id is None:
                producer_id, epoch = await self.producer_ids.next_id(), 0
            else:
                expected = None
                if header.api_version >= 3 and request.producer_id >= 0:
                    expected = (request.producer_id, request.producer_epoch)
                producer_id, epoch = await self.transactions.init_producer_id(
                    transactional_id, request.transaction_timeout_ms, expected
                )
        except KafkaError as error:
            code = _fenced_as(error.code, header.api_version < 4)
            log.info("init_producer_id: %s", error)
        if code is not ErrorCode.NONE:
            self.metrics.request_error("init_producer_id", code)
        return response(
            throttle_time_ms=0, error_code=code, producer_id=producer_id, producer_epoch=epoch
        )

    async def add_partitions_to_txn(self, request: Any, header: RequestHeader) -> Response:
        """The partitions join the producer's open transaction: v0-3 a client's request,
        one transaction; v4 (Kafka 3.7's brokers, CLUSTER_ACTION) several, each to join or,
        with verify_only, to be checked (KIP-890: services/broker/transactions/verification.py).
        Every partition of a transaction gets the one outcome, as in Kafka: the
        coordinator's code, or for a partition that does not exist
        UNKNOWN_TOPIC_OR_PARTITION and for the others OPERATION_NOT_ATTEMPTED."""
        response = APIS[ApiKey.ADD_PARTITIONS_TO_TXN].response
        version = header.api_version
        if version < 4:
            codes = await self._add_partitions(
                request.v3_and_below_transactional_id,
                request.v3_and_below_producer_id,
                request.v3_and_below_producer_epoch,
                {(t.name, p) for t in request.v3_and_below_topics for p in t.partitions},
                version,
            )
            return response(
                throttle_time_ms=0, results_by_topic_v3_and_below=_txn_partition_results(codes)
            )
        if self.access is not None and not self.access.allowed_on_cluster(Operation.CLUSTER_ACTION):
            self.metrics.request_error(
                "add_partitions_to_txn", ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            )
            return response(
                throttle_time_ms=0,
                error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                results_by_transaction=[],
            )
        result_type = response.AddPartitionsToTxnResult
        results = []
        for txn in request.transactions:
            codes = await self._add_partitions(
                txn.transactional_id,
                txn.producer_id,
                txn.producer_epoch,
                {(t.name, p) for t in txn.topics for p in t.partitions},
                version,
                verify_only=txn.verify_only,
            )
            results.append(
                result_type(
                    transactional_id=txn.transactional_id,
                    topic_results=_txn_partition_results(codes),
                )
            )
        return response(throttle_time_ms=0, error_code=0, results_by_transaction=results)

    async def _add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        wanted: set[tuple[str, int]],
        version: int,
        *,
        verify_only: bool = False,
    ) -> dict[tuple[str, int], ErrorCode]:
        """One transaction's partitions added (or verified): the code of each. A client's
        request (v0-3) needs WRITE on the transactional id and on each topic."""
        codes: dict[tuple[str, int], ErrorCode] = {}
        access = self.access if version < 4 else None
        refused_topics = (
            set()
            if access is None
            else access.refused(Operation.WRITE, TOPIC, {t for t, _ in wanted})
        )
        if access is not None and not access.allowed(
            Operation.WRITE, TRANSACTIONAL_ID, transactional_id
        ):
            codes = dict.fromkeys(wanted, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        elif refused_topics:
            codes = {
                tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED
                if tp[0] in refused_topics
                else ErrorCode.OPERATION_NOT_ATTEMPTED
                for tp in wanted
            }
        else:
            bad = {
                tp: ErrorCode.INVALID_TOPIC_EXCEPTION  # an internal topic is no producer's
                if tp[0] in INTERNAL_TOPICS
                else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                for tp in wanted
                if tp[0] in INTERNAL_TOPICS or self.image.partition(TopicPartition(*tp)) is None
            }
            if bad:
                codes = {tp: bad.get(tp, ErrorCode.OPERATION_NOT_ATTEMPTED) for tp in wanted}
            elif verify_only:
                codes = self.transactions.verify_partitions(
                    transactional_id, producer_id, producer_epoch, wanted
                )
            else:
                code = ErrorCode.NONE
                try:
                    await self.transactions.add_partitions(
                        transactional_id, producer_id, producer_epoch, wanted
                    )
                except KafkaError as error:
                    code = _fenced_as(error.code, version < 2)
                    log.info("add_partitions_to_txn: %s", error)
                codes = dict.fromkeys(wanted, code)
        for code in set(codes.values()):
            if code is not ErrorCode.NONE:
                self.metrics.request_error("add_partitions_to_txn", code)
        return codes

    async def add_offsets_to_txn(self, request: Any, header: RequestHeader) -> Response:
        """The group's `__consumer_offsets` partition joins the producer's open transaction,
        so its TxnOffsetCommits take effect with the transaction (sent to the group
        coordinator next)."""
        response = APIS[ApiKey.ADD_OFFSETS_TO_TXN].response
        code = ErrorCode.NONE
        access = self.access
        try:
            if access is not None:
                access.check(Operation.WRITE, TRANSACTIONAL_ID, request.transactional_id)
                access.check(Operation.READ, GROUP, request.group_id)
            if not request.group_id:
                raise KafkaError(ErrorCode.INVALID_GROUP_ID, "the group id is empty")
            offsets_partition = self.groups.coordinator.partition_of(request.group_id)
            await self.transactions.add_partitions(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                {(OFFSETS_TOPIC, offsets_partition)},
            )
        except KafkaError as error:
            code = self._txn_refused("add_offsets_to_txn", error, header.api_version < 2)
        return response(throttle_time_ms=0, error_code=code)

    def _txn_refused(self, api: str, error: KafkaError, before_kip_588: bool) -> ErrorCode:
        """The code a transaction request refused with `error` gets, logged and counted."""
        code = _fenced_as(error.code, before_kip_588)
        log.info("%s: %s", api, error)
        self.metrics.request_error(api, code)
        return code

    async def txn_offset_commit(self, request: Any, header: RequestHeader) -> Response:
        """Offsets committed in a transaction, at the group's coordinator: written now,
        in effect once the transaction commits (services/broker/groups/coordinator.py)."""
        response = APIS[ApiKey.TXN_OFFSET_COMMIT].response
        topic_type = response.TxnOffsetCommitResponseTopic
        partition_type = topic_type.TxnOffsetCommitResponsePartition
        version = header.api_version
        commits = [
            Commit(
                t.name,
                p.partition_index,
                p.committed_offset,
                p.committed_leader_epoch if version >= 2 else -1,
                p.committed_metadata,
            )
            for t in request.topics
            for p in t.partitions
        ]
        access = self.access
        refused_topics: set[str] = set()
        code: ErrorCode = ErrorCode.NONE
        codes: list[ErrorCode]
        if access is not None:
            if not access.allowed(Operation.WRITE, TRANSACTIONAL_ID, request.transactional_id):
                code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            elif not access.allowed(Operation.READ, GROUP, request.group_id):
                code = ErrorCode.GROUP_AUTHORIZATION_FAILED
            else:
                refused_topics = access.refused(Operation.READ, TOPIC, {c.topic for c in commits})
        if code is not ErrorCode.NONE:
            codes = [code] * len(commits)
        else:
            allowed = [c for c in commits if c.topic not in refused_topics]
            done = await self.groups.coordinator.txn_commit(
                request.group_id,
                request.producer_id,
                request.producer_epoch,
                request.member_id if version >= 3 else "",
                request.generation_id if version >= 3 else -1,
                allowed,
            )
            answered = iter(done)
            codes = [
                ErrorCode.TOPIC_AUTHORIZATION_FAILED
                if c.topic in refused_topics
                else next(answered)
                for c in commits
            ]
        by_topic: dict[str, list[Any]] = {}
        for commit, commit_code in zip(commits, codes, strict=True):
            if commit_code is not ErrorCode.NONE:
                self.metrics.request_error("txn_offset_commit", commit_code)
            by_topic.setdefault(commit.topic, []).append(
                partition_type(partition_index=commit.partition, error_code=commit_code)
            )
        return response(
            throttle_time_ms=0,
            topics=[topic_type(name=t, partitions=p) for t, p in by_topic.items()],
        )

    async def end_txn(self, request: Any, header: RequestHeader) -> Response:
        """Commit or abort the producer's open transaction."""
        response = APIS[ApiKey.END_TXN].response
        code = ErrorCode.NONE
        access = self.access
        try:
            if access is not None:
                access.check(Operation.WRITE, TRANSACTIONAL_ID, request.transactional_id)
            await self.transactions.end_txn(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.committed,
            )
        except KafkaError as error:
            code = self._txn_refused("end_txn", error, header.api_version < 2)
        return response(throttle_time_ms=0, error_code=code)

    async def describe_transactions(self, request: Any, header: RequestHeader) -> Response:
        """KIP-664: the state of each transactional id this broker coordinates (DESCRIBE on
        the id, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED)."""
        response = APIS[ApiKey.DESCRIBE_TRANSACTIONS].response
        state_type = response.TransactionState
        topic_type = state_type.TopicData
        access = self.access
        states = []
        for transactional_id in request.transactional_ids:
            code, metadata = ErrorCode.NONE, None
            try:
                if access is not None:
                    access.check(Operation.DESCRIBE, TRANSACTIONAL_ID, transactional_id)
                metadata = self.transactions.describe(transactional_id)
            except KafkaError as error:
                code = error.code
                self.metrics.request_error("describe_transactions", code)
            topics: dict[str, list[int]] = {}
            for topic, index in sorted(metadata.partitions if metadata else ()):
                topics.setdefault(topic, []).append(index)
            states.append(
                state_type(
                    error_code=code,
                    transactional_id=transactional_id,
                    transaction_state=metadata.state.kafka_name if metadata else "",
                    transaction_timeout_ms=metadata.timeout_ms if metadata else 0,
                    transaction_start_time_ms=metadata.start_ms if metadata else -1,
                    producer_id=metadata.producer_id if metadata else -1,
                    producer_epoch=metadata.producer_epoch if metadata else -1,
                    topics=[topic_type(topic=t, partitions=p) for t, p in topics.items()],
                )
            )
        return response(throttle_time_ms=0, transaction_states=states)

    async def list_transactions(self, request: Any, header: RequestHeader) -> Response:
        """KIP-664: the transactional ids this broker coordinates, filtered by state and
        producer id; ids without DESCRIBE are left out, as in Kafka."""
        response = APIS[ApiKey.LIST_TRANSACTIONS].response
        known = {state.kafka_name for state in TxnState}
        wanted_states = set(request.state_filters)
        wanted_producers = set(request.producer_id_filters)
        access = self.access
        listed = [
            response.TransactionState(
                transactional_id=transactional_id,
                producer_id=metadata.producer_id,
                transaction_state=metadata.state.kafka_name,
            )
            for transactional_id, metadata in self.transactions.listed()
            if (not wanted_states or metadata.state.kafka_name in wanted_states)
            and (not wanted_producers or metadata.producer_id in wanted_producers)
            and (
                access is None
                or access.allowed(Operation.DESCRIBE, TRANSACTIONAL_ID, transactional_id)
            )
        ]
        code = (
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
            if self.transactions.loading()
            else ErrorCode.NONE
        )
        return response(
            throttle_time_ms=0,
            error_code=code,
            unknown_state_filters=sorted(wanted_states - known),
            transaction_states=listed,
        )

    async def write_txn_markers(self, request: Any, header: RequestHeader) -> Response:
        """A transaction coordinator on another broker asks for markers in partitions this
        broker leads (inter-broker: CLUSTER_ACTION on the cluster)."""
        response = APIS[ApiKey.WRITE_TXN_MARKERS].response
        marker_type = response.WritableTxnMarkerResult
        topic_type = marker_type.WritableTxnMarkerTopicResult
        partition_type = topic_type.WritableTxnMarkerPartitionResult
        access = self.access
        allowed = access is None or access.allowed_on_cluster(Operation.CLUSTER_ACTION)
        markers = []
        for marker in request.markers:
            marker_args = (
                marker.producer_id,
                marker.producer_epoch,
                bool(marker.transaction_result),
                marker.coordinator_epoch,
            )
            topics = []
            for topic in marker.topics:
                if allowed:
                    codes = await asyncio.gather(
                        *(
                            self.markers.write_local((topic.name, index), *marker_args)
                            for index in topic.partition_indexes
                        )
                    )
                else:
                    codes = [ErrorCode.CLUSTER_AUTHORIZATION_FAILED] * len(topic.partition_indexes)
                topics.append(
                    topic_type(
                        name=topic.name,
                        partitions=[
                            partition_type(partition_index=index, error_code=code)
                            for index, code in zip(topic.partition_indexes, codes, strict=True)
                        ],
                    )
                )
            markers.append(marker_type(producer_id=marker.producer_id, topics=topics))
        return response(markers=markers)

    def _producer_id_refusal(self, transactional_id: str | None) -> KafkaError | None:
        """Kafka's rule for a new producer id: a transactional producer needs WRITE on its
        transactional id, an idempotent one IDEMPOTENT_WRITE on the cluster or WRITE on
        some topic (KIP-679)."""
        access = self.access
        if access is None:
            return None
        if transactional_id is not None:
            if access.allowed(Operation.WRITE, TRANSACTIONAL_ID, transactional_id):
                return None
            return denied(Operation.WRITE, TRANSACTIONAL_ID, transactional_id)
        if access.allowed_on_cluster(Operation.IDEMPOTENT_WRITE) or access.allowed_on_some(
            Operation.WRITE, TOPIC
        ):
            return None
        return denied(Operation.IDEMPOTENT_WRITE, CLUSTER, "")

    async def describe_cluster(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.DESCRIBE_CLUSTER].response
        live = self._live_addresses()
        # No permission is needed to describe the cluster; KIP-430's field tells what may be
        # done with it (nothing to one who may not DESCRIBE it).
        operations = (
            cluster_operations(self.access)
            if request.include_cluster_authorized_operations
            else None
        )
        return response(
            throttle_time_ms=0,
            error_code=0,
            error_message=None,
            endpoint_type=1,
            cluster_id=self.image.cluster_id,
            controller_id=self._controller_id(live),
            brokers=[
                response.DescribeClusterBroker(broker_id=b_id, host=host, port=port, rack=rack)
                for b_id, host, port, rack in live
            ],
            authorized_operations=operations,
        )

    # OffsetForLeaderEpoch --------------------------------------------------------------

    async def offset_for_leader_epoch(self, request: Any, header: RequestHeader) -> Response:
        """Where a leader epoch ends in the leader's log: followers cut a divergent tail with
        it, consumers check their position after a leader change."""
        response = APIS[ApiKey.OFFSET_FOR_LEADER_EPOCH].response
        answer = response.OffsetForLeaderTopicResult.EpochEndOffset
        topics = []
        # A follower's request needs CLUSTER_ACTION on the cluster; without it, a consumer's
        # (KIP-320) needs DESCRIBE on each topic.
        access = self.access
        any_topic = access is None or access.allowed_on_cluster(Operation.CLUSTER_ACTION)
        for topic in request.topics:
            partitions = []
            refused = (
                access is not None
                and not any_topic
                and not access.allowed(Operation.DESCRIBE, TOPIC, topic.topic)
            )
            for wanted in topic.partitions:
                code, epoch, end = ErrorCode.NONE, -1, -1
                try:
                    if refused:
                        raise denied(Operation.DESCRIBE, TOPIC, topic.topic)
                    partition = self.replicas.leader_partition(
                        topic.topic,
                        wanted.partition,
                        wanted.current_leader_epoch if header.api_version >= 2 else -1,
                    )
                    epoch, end = partition.log.end_offset_for_epoch(wanted.leader_epoch)
                except Exception as error:
                    code, _ = self._item_error(
                        error, "offset_for_leader_epoch", f"{topic.topic}-{wanted.partition}"
                    )
                partitions.append(
                    answer(
                        error_code=code,
                        partition=wanted.partition,
                        leader_epoch=epoch,
                        end_offset=end,
                    )
                )
            topics.append(
                response.OffsetForLeaderTopicResult(topic=topic.topic, partitions=partitions)
            )
        return response(throttle_time_ms=0, topics=topics)

    # Topic administration: carried out by the controller ---------------------------------

    async def _controller_topics(
        self, method: Any, request: Any, settled: Callable[[Any], bool]
    ) -> Any:
        """Send an admin request to the controller; once it answers, wait (bounded) until
        the image shows the outcome, so the client's next Metadata request sees it."""
        reply = await self.link.call(method, request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + IMAGE_WAIT_SECONDS
        while not settled(reply):
            changed = self._image_changed
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if not await wait_event(changed, remaining):
                break
        return reply

    def _created(self, reply: Any) -> bool:
        return all(
            r.error_code or self.image.topic_by_id(uuid.UUID(bytes=r.topic_id)) is not None
            for r in reply.results
        )

    def _deleted(self, reply: Any) -> bool:
        return all(
            r.error_code or self.image.topic_by_id(uuid.UUID(bytes=r.topic_id)) is None
            for r in reply.results
        )

    def _answers(self, reply: Any, api: str) -> dict[str, tuple[ErrorCode, str | None, Any]]:
        """Per topic name: (error code, message, result), each error counted and logged once."""
        out = {}
        for result in reply.results:
            code = ErrorCode(result.error_code)
            message = result.error_message or None
            if code is not ErrorCode.NONE:
                self._item_error(KafkaError(code, message or code.name), api, result.name)
            out[result.name] = (code, message, result)
        return out

    async def create_topics(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.CREATE_TOPICS].response
        validate_only = bool(header.api_version >= 1 and request.validate_only)
        results = []
        answers: dict[str, tuple[ErrorCode, str | None, Any]] = {}
        wanted_topics = []
        # CREATE on the cluster, or else on each topic; without DESCRIBE_CONFIGS on a topic
        # its config error code says so (Kafka's rules).
        access = self.access
        names = [t.name for t in request.topics]
        not_created: set[str] = set()
        hidden_configs: set[str] = set()
        if access is not None:
            if not access.allowed_on_cluster(Operation.CREATE):
                not_created = access.refused(Operation.CREATE, TOPIC, names)
            hidden_configs = access.refused(Operation.DESCRIBE_CONFIGS, TOPIC, names)
        for wanted in request.topics:
            if wanted.name in not_created:
                refusal = denied(Operation.CREATE, TOPIC, wanted.name)
                self._item_error(refusal, "create_topics", wanted.name)
                answers[wanted.name] = (refusal.code, str(refusal), None)
                continue
            configs = {c.name: c.value for c in wanted.configs if c.value is not None}
            try:
                self._check_remote_storage(configs)
            except KafkaError as error:
                answers[wanted.name] = (error.code, str(error), None)
                self._item_error(error, "create_topics", wanted.name)
                continue
            wanted_topics.append(
                pb.NewTopic(
                    name=wanted.name,
                    partitions=wanted.num_partitions,
                    replication_factor=wanted.replication_factor,
                    configs=configs,
                    assignments=[
                        pb.ReplicaAssignment(partition=a.partition_index, replicas=a.broker_ids)
                        for a in wanted.assignments or ()
                    ],
                )
            )
        if wanted_topics:
            reply = await self._admin(
                lambda s: s.CreateTopics,
                pb.CreateTopicsRequest(topics=wanted_topics, validate_only=validate_only),
                self._created,
                [t.name for t in wanted_topics],
            )
            answers.update(self._answers(reply, "create_topics"))
        for wanted in request.topics:
            code, message, result = answers[wanted.name]
            ok = code is ErrorCode.NONE and result is not None
            results.append(
                response.CreatableTopicResult(
                    name=wanted.name,
                    topic_id=uuid.UUID(bytes=result.topic_id)
                    if ok and len(result.topic_id) == 16
                    else uuid.UUID(int=0),
                    error_code=code,
                    error_message=message,
                    topic_config_error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    if wanted.name in hidden_configs
                    and (ok or code is ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                    else ErrorCode.NONE,
                    num_partitions=result.partitions if ok else -1,
                    replication_factor=result.replication_factor if ok else -1,
                    configs=[],
                )
            )
        return response(throttle_time_ms=0, topics=results)

    async def _admin(
        self, method: Any, request: Any, settled: Callable[[Any], bool], names: list[str]
    ) -> Any:
        """`_controller_topics`, with a controller that cannot be reached answered for every
        topic of the request (REQUEST_TIMED_OUT; clients retry)."""
        try:
            return await self._controller_topics(method, request, settled)
        except KafkaError as error:
            return pb.TopicsReply(
                results=[
                    pb.TopicResult(name=n, error_code=error.code, error_message=str(error))
                    for n in names
                ]
            )

    async def delete_topics(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.DELETE_TOPICS].response
        if header.api_version >= 6:
            wanted = [(t.name, t.topic_id) for t in request.topics]
        else:
            wanted = [(name, None) for name in request.topic_names]
        refusals = self._delete_refusals(wanted)
        sent = [index for index in range(len(wanted)) if index not in refusals]
        replies: dict[int, pb.TopicResult] = {}
        if sent:
            reply = await self._admin(
                lambda s: s.DeleteTopics,
                pb.DeleteTopicsRequest(
                    topics=[
                        pb.TopicRef(
                            name=name or "", topic_id=topic_id.bytes if name is None else b""
                        )
                        for name, topic_id in (wanted[index] for index in sent)
                    ]
                ),
                self._deleted,
                [name or str(topic_id) for name, topic_id in (wanted[index] for index in sent)],
            )
            replies = dict(zip(sent, reply.results, strict=True))
        results = []
        for index, (name, topic_id) in enumerate(wanted):
            if index in refusals:
                shown, refusal = refusals[index]
                self._item_error(refusal, "delete_topics", shown or str(topic_id))
                results.append(
                    response.DeletableTopicResult(
                        name=shown,
                        topic_id=topic_id or uuid.UUID(int=0),
                        error_code=refusal.code,
                        error_message=str(refusal),
                    )
                )
                continue
            result = replies[index]
            code = ErrorCode(result.error_code)
            if code is not ErrorCode.NONE:
                self._item_error(
                    KafkaError(code, result.error_message), "delete_topics", result.name
                )
            results.append(
                response.DeletableTopicResult(
                    name=result.name or name,
                    topic_id=uuid.UUID(bytes=result.topic_id)
                    if len(result.topic_id) == 16
                    else (topic_id or uuid.UUID(int=0)),
                    error_code=code,
                    error_message=result.error_message or None,
                )
            )
        return response(throttle_time_ms=0, responses=results)

    def _delete_refusals(
        self, wanted: list[tuple[str | None, uuid.UUID | None]]
    ) -> dict[int, tuple[str | None, KafkaError]]:
        """The topics of a DeleteTopics the requester may not delete, by position: the name
        to answer with and the refusal. A topic named by id whose name the requester may not
        DESCRIBE is answered without its name, as Kafka does; an id unknown here is left to
        the controller (UNKNOWN_TOPIC_ID)."""
        access = self.access
        refusals: dict[int, tuple[str | None, KafkaError]] = {}
        if access is None:
            return refusals
        for index, (name, topic_id) in enumerate(wanted):
            if name is None:
                known = self.image.topic_by_id(topic_id) if topic_id is not None else None
                if known is None:
                    continue
                if not access.allowed(Operation.DESCRIBE, TOPIC, known.name):
                    refusals[index] = (
                        None,
                        KafkaError(
                            ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            f"not authorized to DESCRIBE topic id {topic_id}",
                        ),
                    )
                    continue
                name = known.name
            if not access.allowed(Operation.DELETE, TOPIC, name):
                refusals[index] = name, denied(Operation.DELETE, TOPIC, name)
        return refusals

    async def create_partitions(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.CREATE_PARTITIONS].response
        wanted = {t.name: t.count for t in request.topics}
        # Kafka's manual assignment of the new partitions (None: placed by the controller).
        assigned = {t.name: t.assignments for t in request.topics}

        def grown(reply: Any) -> bool:
            return all(
                r.error_code
                or len(getattr(self.image.topic(r.name), "partitions", {})) >= wanted[r.name]
                for r in reply.results
            )

        answers: dict[str, tuple[ErrorCode, str | None, Any]] = {}
        if self.access is not None:  # ALTER on each topic
            for name in self.access.refused(Operation.ALTER, TOPIC, wanted):
                refusal = denied(Operation.ALTER, TOPIC, name)
                self._item_error(refusal, "create_partitions", name)
                answers[name] = (refusal.code, str(refusal), None)
        allowed = {n: c for n, c in wanted.items() if n not in answers}
        if allowed:
            reply = await self._admin(
                lambda s: s.CreatePartitions,
                pb.CreatePartitionsRequest(
                    topics=[
                        pb.PartitionIncrease(
                            name=n,
                            count=c,
                            assigned=assigned[n] is not None,
                            assignments=[
                                pb.ReplicaAssignment(replicas=a.broker_ids)
                                for a in assigned[n] or ()
                            ],
                        )
                        for n, c in allowed.items()
                    ],
                    validate_only=bool(request.validate_only),
                ),
                grown,
                list(allowed),
            )
            answers.update(self._answers(reply, "create_partitions"))
        return response(
            throttle_time_ms=0,
            results=[
                response.CreatePartitionsTopicResult(
                    name=t.name, error_code=answers[t.name][0], error_message=answers[t.name][1]
                )
                for t in request.topics
            ],
        )

    # Configs ---------------------------------------------------------------------------

    async def describe_configs(self, request: Any, header: RequestHeader) -> Response:
        """Topic and broker resources. A resource type Kafka 3.7 does not know (GROUP, 32,
        is Kafka 3.9's) fails the whole request, as Kafka's ConfigHelper throws before any is
        described: every resource INVALID_REQUEST with the error's default message."""
        response = APIS[ApiKey.DESCRIBE_CONFIGS].response
        entry = response.DescribeConfigsResult.DescribeConfigsResourceResult
        if any(r.resource_type not in KAFKA_RESOURCE_TYPES for r in request.resources):
            return response(
                throttle_time_ms=0,
                results=[
                    response.DescribeConfigsResult(
                        error_code=ErrorCode.INVALID_REQUEST,
                        error_message=INVALID_REQUEST_MESSAGE,
                        resource_type=r.resource_type,
                        resource_name=r.resource_name,
                        configs=[],
                    )
                    for r in request.resources
                ],
            )
        results = []
        for resource in request.resources:
            code, message, configs = ErrorCode.NONE, None, []
            try:
                self._check_configs(
                    Operation.DESCRIBE_CONFIGS, resource.resource_type, resource.resource_name
                )
                values = self._config_values(resource.resource_type, resource.resource_name)
                keys = resource.configuration_keys
                for name, (value, source) in sorted(values.items()):
                    if keys is not None and name not in keys:
                        continue
                    configs.append(
                        entry(
                            name=name,
                            value=value,
                            read_only=resource.resource_type == BROKER_RESOURCE
                            and name not in _LOG_NAMES
                            and name not in BROKER_CONFIG_NAMES,
                            config_source=source,
                            is_default=source == CONFIG_SOURCE_DEFAULT,
                            is_sensitive=False,
                            synonyms=[],
                            config_type=_config_type(resource.resource_type, name),
                            documentation=None,
                        )
                    )
            except Exception as error:
                code, message = self._item_error(
                    error, "describe_configs", f"resource {resource.resource_name!r}"
                )
            results.append(
                response.DescribeConfigsResult(
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=configs,
                )
            )
        return response(throttle_time_ms=0, results=results)

    def _check_configs(self, operation: Operation, resource_type: int, name: str) -> None:
        """A topic's configs need the operation on the topic, the brokers' on the cluster;
        raises the *_AUTHORIZATION_FAILED error."""
        access = self.access
        if access is None:
            return
        if resource_type == TOPIC_RESOURCE:
            access.check(operation, TOPIC, name)
        elif resource_type == BROKER_RESOURCE:
            access.check_cluster(operation)

    def _config_values(self, resource_type: int, name: str) -> dict[str, tuple[str, int]]:
        """Each config's value and its source."""
        if resource_type == TOPIC_RESOURCE:
            topic = self.image.topic(name)
            if topic is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
            return {
                k: (v, CONFIG_SOURCE_TOPIC if k in topic.configs else self._default_source(k))
                for k, v in self.image.config_for(name).to_properties().items()
            }
        if resource_type == BROKER_RESOURCE:
            if name and _broker_id(name) != self.settings.node_id:
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST,
                    f"Unexpected broker id, expected {self.settings.node_id} or empty string, "
                    f"but received {name}",
                )
            values = {
                default_name(k): (v, self._default_source(k, mine=bool(name)))
                for k, v in (self.image.log_defaults if name else self._cluster_log_defaults())
                .to_properties()
                .items()
                if k in BROKER_DEFAULT_NAMES
            }
            own = self.image.configs_of_broker(self.settings.node_id) if name else {}
            cluster_wide = self.image.configs_of_broker(CLUSTER_DEFAULT)
            for key in BROKER_CONFIG_NAMES:  # unset: Kafka's default
                if key in own:
                    values[key] = (own[key], CONFIG_SOURCE_DYNAMIC_BROKER)
                elif key in cluster_wide:
                    values[key] = (cluster_wide[key], CONFIG_SOURCE_DYNAMIC_DEFAULT)
                else:
                    values[key] = (str(LONG_MAX), CONFIG_SOURCE_DEFAULT)
            given = self.settings.model_fields_set
            for key, field in STATIC_CONFIGS.items():
                source = CONFIG_SOURCE_STATIC if field in given else CONFIG_SOURCE_DEFAULT
                values[key] = (_setting_value(getattr(self.settings, field)), source)
            return values
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, f"resource type {resource_type} is not supported"
        )

    def _cluster_log_defaults(self) -> LogConfig:
        """The defaults of topic configs on a broker without dynamic ones of its own."""
        image = self.image
        if not image.broker_defaults:
            return image.log_defaults
        return LogConfig.from_properties(image.dynamic_defaults, image.static_defaults)

    def _default_source(self, name: str, *, mine: bool = True) -> int:
        """Where the default of topic config ``name`` comes from (``mine``: on this broker,
        its own dynamic default counted; else cluster-wide)."""
        if mine and name in self.image.broker_defaults:
            return CONFIG_SOURCE_DYNAMIC_BROKER
        if name in self.image.dynamic_defaults:
            return CONFIG_SOURCE_DYNAMIC_DEFAULT
        if name in self.settings.log_defaults:
            return CONFIG_SOURCE_STATIC
        return CONFIG_SOURCE_DEFAULT

    async def alter_configs(self, request: Any, header: RequestHeader) -> Response:
        """Kafka's legacy AlterConfigs (KafkaJS's and kafka-python's admin clients send it):
        each topic's overrides (or the cluster-wide defaults) become exactly the ones named;
        a null value resets one."""

        def alteration(resource: Any) -> pb.ConfigAlteration:
            wanted = {c.name: c.value for c in resource.configs if c.value is not None}
            return pb.ConfigAlteration(name=resource.resource_name, set=wanted, replace=True)

        return await self._alter_configs(ApiKey.ALTER_CONFIGS, request, alteration)

    async def incremental_alter_configs(self, request: Any, header: RequestHeader) -> Response:
        """SET, DELETE, and APPEND and SUBTRACT of list configs, which the controller carries
        out on the value it stores (ConfigAlteration). Refused as Kafka's broker refuses them
        before its controller sees them: a key named twice or a null value (but for DELETE)
        INVALID_REQUEST; APPEND or SUBTRACT of a broker resource's config that is not a list
        INVALID_CONFIG (a topic's: the controller's INVALID_CONFIG)."""

        def alteration(resource: Any) -> pb.ConfigAlteration:
            names = [change.name for change in resource.configs]
            if len(set(names)) != len(names):
                raise KafkaError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
            nulls = [
                c.name for c in resource.configs if c.config_operation != DELETE and c.value is None
            ]
            if nulls:
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls)
                )
            alteration = pb.ConfigAlteration(name=resource.resource_name)
            for change in resource.configs:
                operation = change.config_operation
                if operation == SET:
                    alteration.set[change.name] = change.value
                elif operation == DELETE:
                    alteration.delete.append(change.name)
                elif operation in (APPEND, SUBTRACT):
                    if (
                        resource.resource_type == BROKER_RESOURCE
                        and change.name not in _LIST_LOG_NAMES
                    ):
                        verb = "append" if operation == APPEND else "subtract"
                        raise KafkaError(
                            ErrorCode.INVALID_CONFIG,
                            f"Config value {verb} is not allowed for config key: {change.name}",
                        )
                    lists = alteration.append if operation == APPEND else alteration.subtract
                    lists[change.name] = change.value
                else:
                    raise KafkaError(
                        ErrorCode.INVALID_REQUEST, f"Unknown operations type {operation}"
                    )
            return alteration

        return await self._alter_configs(ApiKey.INCREMENTAL_ALTER_CONFIGS, request, alteration)

    async def _alter_configs(
        self, key: ApiKey, request: Any, alteration: Callable[[Any], pb.ConfigAlteration]
    ) -> Response:
        """Topic config changes and the cluster-wide defaults (the broker resource "")
        through the controller, each resource's all or none; answered once this broker's
        image shows them."""
        response = APIS[key].response
        metric = key.name.lower()
        validate_only = bool(request.validate_only)
        answers: dict[tuple[int, str], tuple[ErrorCode, str | None]] = {}
        alterations = []
        for resource in request.resources:
            item = (resource.resource_type, resource.resource_name)
            try:
                if resource.resource_type not in KAFKA_RESOURCE_TYPES:
                    raise KafkaError(
                        ErrorCode.INVALID_REQUEST,
                        f"Unknown resource type {resource.resource_type}",
                    )
                if resource.resource_type not in (TOPIC_RESOURCE, BROKER_RESOURCE):
                    raise KafkaError(
                        ErrorCode.INVALID_REQUEST,
                        "only topic configs and the brokers' log.* defaults can be altered",
                    )
                self._check_configs(
                    Operation.ALTER_CONFIGS, resource.resource_type, resource.resource_name
                )
                altered = alteration(resource)
                if resource.resource_type == BROKER_RESOURCE and resource.resource_name:
                    await self._alter_broker_configs(resource.resource_name, altered, validate_only)
                    answers[item] = (ErrorCode.NONE, None)
                    continue
                if resource.resource_type == BROKER_RESOURCE:
                    await self._alter_log_defaults(resource.resource_name, altered, validate_only)
                    answers[item] = (ErrorCode.NONE, None)
                    continue
                self._check_remote_storage(altered.set)
                alterations.append(altered)
            except Exception as error:
                answers[item] = self._item_error(
                    error, metric, f"resource {resource.resource_name!r}"
                )
        if alterations:
            expected = {a.name: a for a in alterations}

            def applied(reply: Any) -> bool:
                return all(r.error_code or self._shows(expected[r.name]) for r in reply.results)

            reply = await self._admin(
                lambda s: s.AlterConfigs,
                pb.AlterConfigsRequest(topics=alterations, validate_only=validate_only),
                applied if not validate_only else (lambda reply: True),
                list(expected),
            )
            for name, (code, message, _) in self._answers(reply, metric).items():
                answers[TOPIC_RESOURCE, name] = (code, message)
        return response(
            throttle_time_ms=0,
            responses=[
                response.AlterConfigsResourceResponse(
                    error_code=answers[r.resource_type, r.resource_name][0],
                    error_message=answers[r.resource_type, r.resource_name][1],
                    resource_type=r.resource_type,
                    resource_name=r.resource_name,
                )
                for r in request.resources
            ],
        )

    async def _alter_broker_configs(
        self, broker: str, alteration: pb.ConfigAlteration, validate_only: bool
    ) -> None:
        """This broker's dynamic configs (Kafka's per-broker dynamic configs, broker
        resource "<id>"): the replication throttle rates, stored by the controller; answered
        once this broker's image shows them. As Kafka 3.7, only the broker named takes them
        (INVALID_REQUEST on another). The log.* defaults are cluster-wide only
        (INVALID_REQUEST), other names are no per-broker config here (INVALID_CONFIG, from
        the controller). Raises KafkaError."""
        if _broker_id(broker, "Node id") != self.settings.node_id:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"Unexpected broker id, expected {self.settings.node_id}, but received {broker}",
            )
        refusal = static_refusal(_named(alteration))
        if refusal is not None:
            raise KafkaError(ErrorCode.INVALID_REQUEST, refusal)
        own = self.image.configs_of_broker(self.settings.node_id)
        for lists, subtract in ((alteration.append, False), (alteration.subtract, True)):
            for name, values in lists.items():  # log.cleanup.policy, from this broker's value
                alteration.set[name] = altered_list(
                    DEFAULT_NAMES[name], own.get(name), values, subtract=subtract
                )
        self._check_remote_storage(log_overrides(alteration.set))
        await self._store_broker_configs(int(broker), alteration, validate_only)

    async def _store_broker_configs(
        self, broker_id: int, alteration: pb.ConfigAlteration, validate_only: bool
    ) -> None:
        """The throttle rates of broker ``broker_id`` (CLUSTER_DEFAULT: the cluster-wide
        ones) altered by the controller; back once this broker's image shows them."""
        request = pb.AlterBrokerConfigsRequest(
            broker_id=broker_id,
            set=dict(alteration.set),
            delete=list(alteration.delete),
            replace=alteration.replace,
            validate_only=validate_only,
        )
        reply = await self._controller_topics(
            lambda s: s.AlterBrokerConfigs,
            request,
            lambda reply: (
                reply.error_code
                or validate_only
                or _holds(self.image.configs_of_broker(broker_id), request)
            ),
        )
        if reply.error_code:
            code = ErrorCode(reply.error_code)
            raise KafkaError(code, reply.error_message or code.name)

    async def _alter_log_defaults(
        self, broker: str, alteration: pb.ConfigAlteration, validate_only: bool
    ) -> None:
        """Kafka's dynamic default broker configs (``--entity-default``): the cluster-wide
        defaults of topic configs, ``log.<topic config>`` as DescribeConfigs of a broker
        shows them, and the replication throttle rates of every broker without its own.
        The rates are checked before either is stored. Raises KafkaError, the controller's
        refusals included."""
        assert not broker, "per-broker configs go to _alter_broker_configs"
        refusal = static_refusal(_named(alteration))
        if refusal is not None:
            raise KafkaError(ErrorCode.INVALID_REQUEST, refusal)
        fixed = sorted(
            name
            for name in _named(alteration)
            if name not in BROKER_CONFIG_NAMES and name not in _LOG_NAMES
        )
        if fixed:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"Cannot update these configs dynamically: {', '.join(fixed)} "
                "(only the log.* defaults of topic configs and the replication throttle "
                "rates can be)",
            )
        rates = pb.ConfigAlteration(
            set={k: v for k, v in alteration.set.items() if k in BROKER_CONFIG_NAMES},
            delete=[k for k in alteration.delete if k in BROKER_CONFIG_NAMES],
            replace=alteration.replace,
        )
        try:
            validate_broker_configs(rates.set)
        except InvalidBrokerConfigError as error:
            raise KafkaError(ErrorCode.INVALID_CONFIG, str(error)) from None
        logs = {k: v for k, v in alteration.set.items() if k not in BROKER_CONFIG_NAMES}
        request = pb.AlterLogDefaultsRequest(
            set={DEFAULT_NAMES[k]: v for k, v in logs.items()},
            delete=[DEFAULT_NAMES[k] for k in alteration.delete if k not in rates.delete],
            replace=alteration.replace,
            validate_only=validate_only,
            append={DEFAULT_NAMES[k]: v for k, v in alteration.append.items()},
            subtract={DEFAULT_NAMES[k]: v for k, v in alteration.subtract.items()},
        )
        self._check_remote_storage(request.set)
        if request.replace or len(_named(rates)) < len(_named(alteration)):
            reply = await self._controller_topics(
                lambda s: s.AlterLogDefaults,
                request,
                lambda reply: (
                    reply.error_code
                    or validate_only
                    or _holds(self.image.dynamic_defaults, request)
                ),
            )
            if reply.error_code:
                code = ErrorCode(reply.error_code)
                raise KafkaError(code, reply.error_message or code.name)
        if rates.replace or _named(rates):
            await self._store_broker_configs(CLUSTER_DEFAULT, rates, validate_only)

    def _check_remote_storage(self, configs: Mapping[str, str]) -> None:
        """Kafka's rule: remote.storage.enable only on a broker with
        remote.log.storage.system.enable."""
        if (
            flag(configs, "remote.storage.enable")
            and not self.settings.remote_log_storage_system_enable
        ):
            raise KafkaError(
                ErrorCode.INVALID_CONFIG,
                "Tiered Storage functionality is disabled in the broker "
                "(remote.log.storage.system.enable): remote.storage.enable cannot be turned on",
            )

    def _partition_count(self, name: str) -> int:
        topic = self.image.topic(name)
        return len(topic.partitions) if topic is not None else 0

    def _shows(self, alteration: pb.ConfigAlteration) -> bool:
        topic = self.image.topic(alteration.name)
        return topic is not None and _holds(topic.configs, alteration)


def _config_type(resource_type: int, name: str) -> int:
    """A described config's Kafka type: a topic config's, a broker's cluster-wide default
    of one (that topic config's) or throttle rate's (LONG); 0 (UNKNOWN) for the static
    ones."""
    if resource_type == TOPIC_RESOURCE:
        return config_type(name)
    if name in BROKER_CONFIG_NAMES:
        return LONG_TYPE
    topic_name = DEFAULT_NAMES.get(name)
    return 0 if topic_name is None else config_type(topic_name)


def _broker_id(name: str, what: str = "Broker id") -> int:
    """A broker resource's name read as Kafka reads it (Java's Integer.parseInt); Kafka's
    DescribeConfigs calls it the broker id, its AlterConfigs the node id."""
    if re.fullmatch(r"[+-]?[0-9]+", name) is None or not -(1 << 31) <= int(name) < 1 << 31:
        raise KafkaError(ErrorCode.INVALID_REQUEST, f"{what} must be an integer, but it is: {name}")
    return int(name)


def _setting_value(value: object) -> str:
    """A broker setting as Kafka writes a config value (null written empty)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return str(value)


def _named(alteration: pb.ConfigAlteration) -> tuple[str, ...]:
    """Every config name an alteration sets, deletes, appends to or subtracts from."""
    return (*alteration.set, *alteration.delete, *alteration.append, *alteration.subtract)


def _holds(
    configs: Mapping[str, str],
    alteration: pb.ConfigAlteration | pb.AlterLogDefaultsRequest | pb.AlterBrokerConfigsRequest,
) -> bool:
    """Whether ``configs`` show the alteration made: an APPEND or a SUBTRACT once doing it
    again would change nothing."""
    if alteration.replace:
        return configs == dict(alteration.set)
    if not all(configs.get(k) == v for k, v in alteration.set.items()) or any(
        k in configs for k in alteration.delete
    ):
        return False
    if isinstance(alteration, pb.AlterBrokerConfigsRequest):
        return True
    return all(
        name in configs
        and altered_list(name, configs[name], values, subtract=subtract) == configs[name]
        for changes, subtract in ((alteration.append, False), (alteration.subtract, True))
        for name, values in changes.items()
    )


def _quota_client(header: RequestHeader) -> tuple[str, str]:
    """Who a request is metered as: the principal's name (ANONYMOUS unauthenticated) and
    the client id of its header."""
    session = SESSION.get()
    user = ANONYMOUS_USER if session is None else session.principal.partition(":")[2]
    return user, header.client_id or ""


def _throttle(throttle_ms: int, carried: bool) -> None:
    """Tell the server to throttle this connection (THROTTLE): the longest throttle of the
    answers made, which carry it only if they all do."""
    held_ms, all_carried = THROTTLE.get()
    THROTTLE.set((max(held_ms, throttle_ms), all_carried and carried))


def _carries_throttle(api: Api, version: int, response: Response) -> bool:
    """Whether the answer has a throttle_time_ms field in its version."""
    if response is None or isinstance(response, list):
        return False
    field = api.response.fields.get("throttle_time_ms")
    return field is not None and bool(field.for_version_q(version))


class _Timed:
    """Awaits a handler and adds up the time it runs, leaving out the time it waits (for
    a rebalance, the controller, a replication): Kafka's request handler time, which a
    request_percentage quota meters. Each resumption is timed, so a handler that
    interleaves with other connections' is charged for its own steps only."""

    __slots__ = ("_handler", "seconds")

    def __init__(self, handler: Awaitable[Response]) -> None:
        self._handler = handler
        self.seconds = 0.0

    def __await__(self) -> Generator[Any, Any, Response]:
        steps = self._handler.__await__()
        clock = time.perf_counter
        sent: Any = None
        thrown: BaseException | None = None
        try:
            while True:
                started = clock()
                try:
                    waiting = steps.send(sent) if thrown is None else steps.throw(thrown)
                except StopIteration as done:
                    return done.value
                finally:
                    self.seconds += clock() - started
                sent, thrown = None, None
                try:
                    sent = yield waiting
                except GeneratorExit:
                    raise
                except BaseException as error:  # a cancellation goes on into the handler
                    thrown = error
        finally:
            steps.close()


def _replica_id(request: Any, version: int) -> int:
    """The broker id of a follower's fetch; -1 for a consumer."""
    if version >= 15:
        state = request.replica_state
        return int(state.replica_id) if state is not None else -1
    return int(request.replica_id)


def _txn_partition_results(codes: dict[tuple[str, int], ErrorCode]) -> list[Any]:
    """AddPartitionsToTxn's per-topic results of one transaction."""
    topic_type = APIS[ApiKey.ADD_PARTITIONS_TO_TXN].response.AddPartitionsToTxnTopicResult
    partition_type = topic_type.AddPartitionsToTxnPartitionResult
    by_topic: dict[str, list[Any]] = {}
    for (topic, index), code in sorted(codes.items()):
        by_topic.setdefault(topic, []).append(
            partition_type(partition_index=index, partition_error_code=code)
        )
    return [topic_type(name=t, results_by_partition=p) for t, p in by_topic.items()]


def _transactional_producer(records: Buffer | None) -> tuple[int, int] | None:
    """The producer id and epoch of a produced partition's first batch when it is
    transactional (a transaction's batches all are), else None; malformed records are
    left to the append to refuse."""
    if records is None or len(records) <= 16 or records[16] != MAGIC:
        return None
    try:
        header = read_header(records, 0)
    except Exception:
        return None
    if not header.is_transactional:
        return None
    return header.producer_id, header.producer_epoch


def _up_convert(message_set: bytes) -> bytes:
    """A v2 batch holding the records of a legacy (magic 0/1) message set from an old producer.

    Timestamps are kept as they came, as Kafka's LogValidator up-converts: magic 0 has none,
    so its records get NO_TIMESTAMP (-1), as does a magic 1 message sent with -1; a CreateTime
    topic keeps them so (consumers read -1, ListOffsets by time passes them by), a
    LogAppendTime topic stamps the batch with the append time as any other."""
    messages = decode_message_set(message_set)
    if not messages:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "message set holds no whole message")
    records = [
        Record(i, NO_TIMESTAMP if m.timestamp is None else m.timestamp, m.key, m.value)
        for i, m in enumerate(messages)
    ]
    return build_batch(records)


def _fenced_as(code: ErrorCode, before_kip_588: bool) -> ErrorCode:
    """PRODUCER_FENCED for clients that know it (KIP-588), INVALID_PRODUCER_EPOCH for the
    request versions before it."""
    if code is ErrorCode.PRODUCER_FENCED and before_kip_588:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code
