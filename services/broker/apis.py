"""Kafka API handlers of a single broker: request objects in, response objects out.

The server decodes a request with its header and calls `handle`; every handler answers
per-item failures (a missing topic, a corrupt batch) with the item's Kafka error code and
goes on with the rest, so one bad partition never fails a whole request.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from directlog.protocol.api import APIS, Api, ApiKey, RequestHeader
from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.protocol.produce import PartitionResult, ProduceRequest, encode_produce_response
from directlog.records.batch import (
    MAGIC,
    NO_TIMESTAMP,
    Record,
    build_batch,
    decode_records,
    iter_batches,
)
from directlog.records.compression import Compression
from directlog.records.legacy import LegacyMessage, decode_message_set, encode_message_set
from directlog.records.varint import Buffer
from directlog.topics import TopicPartition
from services.broker.error_codes import error_code_for
from services.broker.fetch_response import Part, PartitionData, TopicData, encode_fetch_response
from services.broker.metrics import BrokerMetrics
from services.broker.settings import BrokerSettings
from services.broker.storage import LogConfig, OffsetOutOfRangeError, PartitionLog
from services.broker.storage.log_manager import LogManager
from services.broker.topics import TopicRegistry

log = logging.getLogger(__name__)

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
SET, DELETE = 0, 1
CONFIG_SOURCE_TOPIC, CONFIG_SOURCE_DEFAULT = 1, 5
Response = Any  # a kafka-python response object, fetch parts, or None (acks=0)


class CloseConnectionError(Exception):
    """A request whose failure can only be signalled by closing the connection."""


class KafkaApis:
    def __init__(
        self,
        settings: BrokerSettings,
        logs: LogManager,
        topics: TopicRegistry,
        metrics: BrokerMetrics,
        cluster_id: str,
    ) -> None:
        self.settings = settings
        self.logs = logs
        self.topics = topics
        self.metrics = metrics
        self.cluster_id = cluster_id
        self.host = settings.advertised_host or settings.host
        self.port = settings.port
        self._data_arrived = asyncio.Event()
        self._handlers: dict[int, Callable[[Any, RequestHeader], Awaitable[Response]]] = {
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.fetch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.METADATA: self.metadata,
            ApiKey.FIND_COORDINATOR: self.find_coordinator,
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.CREATE_TOPICS: self.create_topics,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.DESCRIBE_CONFIGS: self.describe_configs,
            ApiKey.CREATE_PARTITIONS: self.create_partitions,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            ApiKey.DESCRIBE_CLUSTER: self.describe_cluster,
        }

    async def handle(self, api: Api, header: RequestHeader, request: Any) -> Response:
        return await self._handlers[api.key](request, header)

    def log_for(self, topic: str, partition: int) -> PartitionLog:
        found = self.logs.get(TopicPartition(topic, partition))
        if found is None:
            raise KafkaError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {partition} of topic {topic!r}"
            )
        return found

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
        acks = request.acks
        results = []
        appended = False
        for topic in request.topic_data:
            partitions = []
            for data in topic.partition_data:
                result = PartitionResult(data.index, ErrorCode.NONE)
                try:
                    if acks not in (0, 1, -1):
                        raise KafkaError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks={acks}")
                    partition_log = self.log_for(topic.name, data.index)
                    records: Buffer = data.records if data.records is not None else b""
                    if len(records) > 16 and records[16] < MAGIC:
                        if header.api_version >= 3:
                            raise KafkaError(
                                ErrorCode.INVALID_RECORD,
                                "produce v3 and later carry only record batches v2",
                            )
                        records = _up_convert(bytes(records))
                    appended_result = partition_log.append(records)
                    partition_log.update_high_watermark(partition_log.log_end_offset)
                    result.base_offset = appended_result.first_offset
                    result.log_append_time_ms = appended_result.log_append_time
                    result.log_start_offset = partition_log.log_start_offset
                    appended = True
                    self.metrics.produced(topic.name, appended_result.records, appended_result.size)
                except Exception as error:
                    result.error_code, result.error_message = self._item_error(
                        error, "produce", f"{topic.name}-{data.index}"
                    )
                partitions.append(result)
            results.append((topic.name, partitions))
        if appended:
            self._data_arrived.set()
            self._data_arrived = asyncio.Event()
        if acks == 0:
            failed = [(name, p.index) for name, parts in results for p in parts if p.error_code]
            if failed:
                # No response to carry the error: closing is how Kafka tells such a producer.
                raise CloseConnectionError(f"acks=0 produce failed for {failed}")
            return None
        return [encode_produce_response(header.api_version, results)]

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
        while True:
            waiter = self._data_arrived
            topics, total, failed = self._read_fetch(request, version, max_bytes)
            remaining = deadline - time.monotonic()
            if failed or total >= request.min_bytes or remaining <= 0:
                break
            try:
                await asyncio.wait_for(waiter.wait(), remaining)
            except TimeoutError:
                topics, total, failed = self._read_fetch(request, version, max_bytes)
                break
        for topic in topics:
            for partition in topic.partitions:
                if partition.records_size:
                    self.metrics.fetched(topic.name, partition.offsets, partition.records_size)
        return encode_fetch_response(version, ErrorCode.NONE, topics)

    def _read_fetch(
        self, request: Any, version: int, max_bytes: int
    ) -> tuple[list[TopicData], int, bool]:
        topics: list[TopicData] = []
        total = 0
        failed = False
        for fetch_topic in request.topics:
            if version >= 13:
                known = self.topics.by_id(fetch_topic.topic_id)
                name = known.name if known else ""
                topic_id = fetch_topic.topic_id
            else:
                name = fetch_topic.topic
                known = self.topics.get(name)
                topic_id = known.topic_id if known else uuid.UUID(int=0)
            partitions = []
            for wanted in fetch_topic.partitions:
                data = PartitionData(wanted.partition, ErrorCode.NONE)
                try:
                    if known is None:
                        code = (
                            ErrorCode.UNKNOWN_TOPIC_ID
                            if version >= 13
                            else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                        )
                        raise KafkaError(code, f"unknown topic {name or topic_id}")
                    partition_log = self.log_for(name, wanted.partition)
                    data.high_watermark = data.last_stable_offset = partition_log.high_watermark
                    data.log_start_offset = partition_log.log_start_offset
                    budget = min(wanted.partition_max_bytes, max_bytes - total)
                    read = partition_log.read(
                        wanted.fetch_offset,
                        max(budget, 0),
                        upper_offset=partition_log.high_watermark,
                        min_one_batch=total == 0,
                    )
                    data.records = read.records
                    data.offsets = read.offsets
                    if version < 4 and read.records.size:
                        data.records = _down_convert(read.records.read(), 0 if version < 2 else 1)
                    total += data.records_size
                except Exception as error:
                    data.error_code, _ = self._item_error(
                        error, "fetch", f"{name}-{wanted.partition}"
                    )
                    data.records = None if not isinstance(error, OffsetOutOfRangeError) else b""
                    failed = True
                partitions.append(data)
            topics.append(TopicData(name, topic_id, partitions))
        return topics, total, failed

    # ListOffsets -----------------------------------------------------------------------

    async def list_offsets(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.LIST_OFFSETS].response
        topics = []
        for topic in request.topics:
            partitions = []
            for wanted in topic.partitions:
                code, offset, timestamp = ErrorCode.NONE, -1, -1
                try:
                    partition_log = self.log_for(topic.name, wanted.partition_index)
                    offset, timestamp = self._offset_for(partition_log, wanted.timestamp)
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
                        leader_epoch=0,
                    )
                )
            topics.append(response.ListOffsetsTopicResponse(name=topic.name, partitions=partitions))
        return response(throttle_time_ms=0, topics=topics)

    @staticmethod
    def _offset_for(partition_log: PartitionLog, timestamp: int) -> tuple[int, int]:
        if timestamp == LATEST:
            return partition_log.high_watermark, -1
        if timestamp == EARLIEST:
            return partition_log.log_start_offset, -1
        if timestamp == MAX_TIMESTAMP:
            best = max(partition_log.segments, key=lambda s: s.max_timestamp)
            if best.max_timestamp == NO_TIMESTAMP:
                return -1, -1
            return best.offset_of_max_timestamp, best.max_timestamp
        found = partition_log.offset_for_timestamp(
            timestamp, upper_offset=partition_log.high_watermark
        )
        return (found[0], found[1]) if found else (-1, -1)

    # Metadata --------------------------------------------------------------------------

    async def metadata(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.METADATA].response
        version = header.api_version
        if request.topics is None or (version == 0 and not request.topics):
            wanted_topics: list[str | uuid.UUID] = sorted(self.topics.topics)
        else:
            wanted_topics = []
            for wanted in request.topics:
                if wanted.name is None and version >= 10:
                    known = self.topics.by_id(wanted.topic_id)
                    wanted_topics.append(known.name if known else wanted.topic_id)
                else:
                    wanted_topics.append(wanted.name)
        allow_create = self.settings.auto_create_topics and (
            version < 4 or request.allow_auto_topic_creation
        )
        topics = [
            self._topic_metadata(response, name, allow_create)
            if isinstance(name, str)
            else response.MetadataResponseTopic(  # an id no topic has (any more)
                error_code=ErrorCode.UNKNOWN_TOPIC_ID,
                name=None,
                topic_id=name,
                is_internal=False,
                partitions=[],
                authorized_operations=None,
            )
            for name in wanted_topics
        ]
        return response(
            throttle_time_ms=0,
            brokers=[
                response.MetadataResponseBroker(
                    node_id=self.settings.node_id, host=self.host, port=self.port, rack=None
                )
            ],
            cluster_id=self.cluster_id,
            controller_id=self.settings.node_id,
            topics=topics,
            authorized_operations=None,
            error_code=0,
        )

    def _topic_metadata(self, response: Any, name: str, allow_create: bool) -> Any:
        topic = self.topics.get(name)
        code = ErrorCode.NONE
        if topic is None:
            try:
                if not allow_create:
                    raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
                topic = self.topics.create(name, self.settings.default_partitions, {}, self.logs)
                log.info("created topic %s with %d partitions on first use", name, topic.partitions)
            except Exception as error:
                code, _ = self._item_error(error, "metadata", f"topic {name!r}")
        node = self.settings.node_id
        partitions = (
            []
            if topic is None
            else [
                response.MetadataResponseTopic.MetadataResponsePartition(
                    error_code=0,
                    partition_index=index,
                    leader_id=node,
                    leader_epoch=0,
                    replica_nodes=[node],
                    isr_nodes=[node],
                    offline_replicas=[],
                )
                for index in range(topic.partitions)
            ]
        )
        return response.MetadataResponseTopic(
            error_code=code,
            name=name,
            topic_id=topic.topic_id if topic else uuid.UUID(int=0),
            is_internal=False,
            partitions=partitions,
            authorized_operations=None,
        )

    async def find_coordinator(self, request: Any, header: RequestHeader) -> Response:
        """No group or transaction coordinator runs yet: COORDINATOR_NOT_AVAILABLE, which
        clients retry. Answering at all matters: librdkafka sends lz4 only to brokers that
        serve FindCoordinator."""
        response = APIS[ApiKey.FIND_COORDINATOR].response
        code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        message = "this broker runs no group or transaction coordinator yet"
        keys = request.coordinator_keys if header.api_version >= 4 else [request.key]
        self.metrics.request_error("find_coordinator", code)
        return response(
            throttle_time_ms=0,
            error_code=code,
            error_message=message,
            node_id=-1,
            host="",
            port=-1,
            coordinators=[
                response.Coordinator(
                    key=key, node_id=-1, host="", port=-1, error_code=code, error_message=message
                )
                for key in keys
            ],
        )

    async def describe_cluster(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.DESCRIBE_CLUSTER].response
        return response(
            throttle_time_ms=0,
            error_code=0,
            error_message=None,
            endpoint_type=1,
            cluster_id=self.cluster_id,
            controller_id=self.settings.node_id,
            brokers=[
                response.DescribeClusterBroker(
                    broker_id=self.settings.node_id, host=self.host, port=self.port, rack=None
                )
            ],
            authorized_operations=None,
        )

    # Topic administration --------------------------------------------------------------

    async def create_topics(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.CREATE_TOPICS].response
        validate_only = header.api_version >= 1 and request.validate_only
        results = []
        for wanted in request.topics:
            code, message, topic_id = ErrorCode.NONE, None, uuid.UUID(int=0)
            partitions = (
                wanted.num_partitions
                if wanted.num_partitions != -1
                else self.settings.default_partitions
            )
            configs = {c.name: c.value for c in wanted.configs}
            try:
                if wanted.assignments:
                    raise KafkaError(
                        ErrorCode.INVALID_REQUEST, "manual replica assignment is not supported"
                    )
                if wanted.replication_factor not in (-1, 1):
                    raise KafkaError(
                        ErrorCode.INVALID_REPLICATION_FACTOR,
                        f"replication factor {wanted.replication_factor}; the cluster has 1 broker",
                    )
                if validate_only:
                    self.topics.validate_new(wanted.name, partitions, configs)
                else:
                    topic_id = self.topics.create(
                        wanted.name, partitions, configs, self.logs
                    ).topic_id
            except Exception as error:
                code, message = self._item_error(error, "create_topics", f"topic {wanted.name!r}")
            results.append(
                response.CreatableTopicResult(
                    name=wanted.name,
                    topic_id=topic_id,
                    error_code=code,
                    error_message=message,
                    topic_config_error_code=0,
                    num_partitions=partitions if code == 0 else -1,
                    replication_factor=1 if code == 0 else -1,
                    configs=[],
                )
            )
        return response(throttle_time_ms=0, topics=results)

    async def delete_topics(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.DELETE_TOPICS].response
        if header.api_version >= 6:
            wanted = [(t.name, t.topic_id) for t in request.topics]
        else:
            wanted = [(name, None) for name in request.topic_names]
        results = []
        for name, topic_id in wanted:
            code, message = ErrorCode.NONE, None
            try:
                if name is None:
                    known = self.topics.by_id(topic_id)
                    if known is None:
                        raise KafkaError(ErrorCode.UNKNOWN_TOPIC_ID, f"no topic with id {topic_id}")
                    name = known.name
                topic_id = self.topics.delete(name, self.logs).topic_id
            except Exception as error:
                code, message = self._item_error(error, "delete_topics", f"topic {name!r}")
            results.append(
                response.DeletableTopicResult(
                    name=name,
                    topic_id=topic_id or uuid.UUID(int=0),
                    error_code=code,
                    error_message=message,
                )
            )
        return response(throttle_time_ms=0, responses=results)

    async def create_partitions(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.CREATE_PARTITIONS].response
        results = []
        for wanted in request.topics:
            code, message = ErrorCode.NONE, None
            try:
                if request.validate_only:
                    self.topics.check_partition_increase(wanted.name, wanted.count)
                else:
                    self.topics.add_partitions(wanted.name, wanted.count, self.logs)
            except Exception as error:
                code, message = self._item_error(
                    error, "create_partitions", f"topic {wanted.name!r}"
                )
            results.append(
                response.CreatePartitionsTopicResult(
                    name=wanted.name, error_code=code, error_message=message
                )
            )
        return response(throttle_time_ms=0, results=results)

    # Configs ---------------------------------------------------------------------------

    async def describe_configs(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.DESCRIBE_CONFIGS].response
        entry = response.DescribeConfigsResult.DescribeConfigsResourceResult
        results = []
        for resource in request.resources:
            code, message, configs = ErrorCode.NONE, None, []
            try:
                values, overrides = self._config_values(
                    resource.resource_type, resource.resource_name
                )
                keys = resource.configuration_keys
                for name, value in sorted(values.items()):
                    if keys is not None and name not in keys:
                        continue
                    source = CONFIG_SOURCE_TOPIC if name in overrides else CONFIG_SOURCE_DEFAULT
                    configs.append(
                        entry(
                            name=name,
                            value=value,
                            read_only=resource.resource_type == BROKER_RESOURCE,
                            config_source=source,
                            is_default=name not in overrides,
                            is_sensitive=False,
                            synonyms=[],
                            config_type=0,
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

    def _config_values(self, resource_type: int, name: str) -> tuple[dict[str, str], set[str]]:
        if resource_type == TOPIC_RESOURCE:
            topic = self.topics.get(name)
            if topic is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
            return self.topics.config_for(name).to_properties(), set(topic.configs)
        if resource_type == BROKER_RESOURCE:
            if name not in ("", str(self.settings.node_id)):
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST, f"this broker is {self.settings.node_id}, not {name}"
                )
            values = {
                f"log.{k}" if not k.startswith("log.") else k: v
                for k, v in self.topics.defaults.to_properties().items()
            }
            values.update(
                {
                    "auto.create.topics.enable": str(self.settings.auto_create_topics).lower(),
                    "num.partitions": str(self.settings.default_partitions),
                    "broker.id": str(self.settings.node_id),
                    "socket.request.max.bytes": str(self.settings.socket_request_max_bytes),
                }
            )
            return values, set()
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, f"resource type {resource_type} is not supported"
        )

    async def incremental_alter_configs(self, request: Any, header: RequestHeader) -> Response:
        response = APIS[ApiKey.INCREMENTAL_ALTER_CONFIGS].response
        results = []
        for resource in request.resources:
            code, message = ErrorCode.NONE, None
            try:
                if resource.resource_type != TOPIC_RESOURCE:
                    raise KafkaError(ErrorCode.INVALID_REQUEST, "only topic configs can be altered")
                topic = self.topics.get(resource.resource_name)
                if topic is None:
                    raise KafkaError(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {resource.resource_name!r}"
                    )
                configs = dict(topic.configs)
                for change in resource.configs:
                    if change.config_operation == SET:
                        configs[change.name] = change.value or ""
                    elif change.config_operation == DELETE:
                        configs.pop(change.name, None)
                    else:
                        raise KafkaError(
                            ErrorCode.INVALID_CONFIG,
                            f"{change.name}: APPEND and SUBTRACT apply to list configs only",
                        )
                LogConfig.from_properties(configs, self.topics.defaults)
                if not request.validate_only:
                    self.topics.set_configs(topic.name, configs, self.logs)
            except Exception as error:
                code, message = self._item_error(
                    error, "incremental_alter_configs", f"resource {resource.resource_name!r}"
                )
            results.append(
                response.AlterConfigsResourceResponse(
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                )
            )
        return response(throttle_time_ms=0, responses=results)


def _up_convert(message_set: bytes) -> bytes:
    """A v2 batch holding the records of a legacy (magic 0/1) message set from an old producer."""
    messages = decode_message_set(message_set)
    if not messages:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "message set holds no whole message")
    now = int(time.time() * 1000)
    records = [
        Record(
            i, m.timestamp if m.timestamp is not None and m.timestamp >= 0 else now, m.key, m.value
        )
        for i, m in enumerate(messages)
    ]
    return build_batch(records)


def _down_convert(data: bytes, magic: int) -> bytes:
    """Whole v2 batches re-encoded as a legacy message set for a fetch below v4."""
    messages = [
        LegacyMessage(r.offset, r.timestamp if magic else None, r.key, r.value)
        for position, header in iter_batches(data)
        if not header.is_control
        for r in decode_records(data, position, header)
    ]
    return (
        encode_message_set(messages, magic=magic, compression=Compression.NONE) if messages else b""
    )
