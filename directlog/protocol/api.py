"""The Kafka APIs Directlog serves, request and response headers.

Version ranges are those of Apache Kafka 3.7 for each API served, so clients that infer the
broker's release from ApiVersions (kafka-python) see 3.7, and librdkafka finds Produce and
Fetch from version 0 — and FindCoordinator, without which it refuses to send lz4. The
exceptions are OffsetCommit v0-1 and OffsetFetch v0, which Kafka 4.0 dropped too (KIP-896)
and our schema library cannot decode. APIs Directlog does not serve are not advertised.
"""

from __future__ import annotations

import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from directlog.protocol.produce import decode_produce_request
from directlog.protocol.rdma_access import API_KEY as RDMA_ACCESS_KEY
from directlog.protocol.rdma_access import RdmaAccessRequest, RdmaAccessResponse, decode_request
from directlog.protocol.rdma_consume import API_KEY as RDMA_CONSUME_KEY
from directlog.protocol.rdma_consume import MAX_VERSION as RDMA_CONSUME_MAX_VERSION
from directlog.protocol.rdma_consume import RdmaConsumeRequest, RdmaConsumeResponse
from directlog.protocol.rdma_consume import decode_request as decode_consume_request
from directlog.protocol.rdma_replica import API_KEY as RDMA_REPLICA_KEY
from directlog.protocol.rdma_replica import RdmaReplicaRequest, RdmaReplicaResponse
from directlog.protocol.rdma_replica import decode_request as decode_replica_request
from directlog.protocol.wire import skip_tagged_fields
from directlog.record import record
from directlog.records.errors import CorruptRecordError
from directlog.records.varint import Buffer

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.admin import (
        AlterClientQuotasRequest,
        AlterClientQuotasResponse,
        AlterConfigsRequest,
        AlterConfigsResponse,
        AlterPartitionReassignmentsRequest,
        AlterPartitionReassignmentsResponse,
        AlterUserScramCredentialsRequest,
        AlterUserScramCredentialsResponse,
        CreateAclsRequest,
        CreateAclsResponse,
        CreatePartitionsRequest,
        CreatePartitionsResponse,
        CreateTopicsRequest,
        CreateTopicsResponse,
        DeleteAclsRequest,
        DeleteAclsResponse,
        DeleteGroupsRequest,
        DeleteGroupsResponse,
        DeleteRecordsRequest,
        DeleteRecordsResponse,
        DeleteTopicsRequest,
        DeleteTopicsResponse,
        DescribeAclsRequest,
        DescribeAclsResponse,
        DescribeClientQuotasRequest,
        DescribeClientQuotasResponse,
        DescribeClusterRequest,
        DescribeClusterResponse,
        DescribeConfigsRequest,
        DescribeConfigsResponse,
        DescribeGroupsRequest,
        DescribeGroupsResponse,
        DescribeTransactionsRequest,
        DescribeTransactionsResponse,
        DescribeUserScramCredentialsRequest,
        DescribeUserScramCredentialsResponse,
        ElectLeadersRequest,
        ElectLeadersResponse,
        IncrementalAlterConfigsRequest,
        IncrementalAlterConfigsResponse,
        ListGroupsRequest,
        ListGroupsResponse,
        ListPartitionReassignmentsRequest,
        ListPartitionReassignmentsResponse,
        ListTransactionsRequest,
        ListTransactionsResponse,
    )
    from kafka.protocol.consumer import (
        FetchRequest,
        FetchResponse,
        HeartbeatRequest,
        HeartbeatResponse,
        JoinGroupRequest,
        JoinGroupResponse,
        LeaveGroupRequest,
        LeaveGroupResponse,
        ListOffsetsRequest,
        ListOffsetsResponse,
        OffsetCommitRequest,
        OffsetCommitResponse,
        OffsetDeleteRequest,
        OffsetDeleteResponse,
        OffsetFetchRequest,
        OffsetFetchResponse,
        OffsetForLeaderEpochRequest,
        OffsetForLeaderEpochResponse,
        SyncGroupRequest,
        SyncGroupResponse,
    )
    from kafka.protocol.metadata import (
        ApiVersionsRequest,
        ApiVersionsResponse,
        FindCoordinatorRequest,
        FindCoordinatorResponse,
        MetadataRequest,
        MetadataResponse,
    )
    from kafka.protocol.producer import (
        AddOffsetsToTxnRequest,
        AddOffsetsToTxnResponse,
        AddPartitionsToTxnRequest,
        AddPartitionsToTxnResponse,
        EndTxnRequest,
        EndTxnResponse,
        InitProducerIdRequest,
        InitProducerIdResponse,
        ProduceRequest,
        ProduceResponse,
        TxnOffsetCommitRequest,
        TxnOffsetCommitResponse,
        WriteTxnMarkersRequest,
        WriteTxnMarkersResponse,
    )
    from kafka.protocol.sasl import (
        SaslAuthenticateRequest,
        SaslAuthenticateResponse,
        SaslHandshakeRequest,
        SaslHandshakeResponse,
    )


class ApiKey(IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    SASL_AUTHENTICATE = 36
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    DESCRIBE_CLUSTER = 60
    RDMA_ACCESS = RDMA_ACCESS_KEY  # Directlog's own (docs/formats.md "RDMA access")
    RDMA_CONSUME = RDMA_CONSUME_KEY  # Directlog's own (docs/formats.md "RDMA consume")
    RDMA_REPLICA = RDMA_REPLICA_KEY  # Directlog's own (docs/formats.md "RDMA replication")


_FLEXIBLE: dict[tuple[int, int], bool] = {}  # (api key, version): flexible encoding


@dataclass(frozen=True, slots=True)
class Api:
    key: ApiKey
    request: Any  # kafka-python message classes
    response: Any
    min_version: int
    max_version: int
    decoder: Callable[[memoryview, int], Any] | None = None  # a hand-written hot path

    def flexible(self, version: int) -> bool:
        """Whether `version` uses flexible encoding (tagged fields, compact lengths); asked
        twice per request, so kafka-python's answer is kept."""
        known = _FLEXIBLE.get((self.key, version))
        if known is None:
            known = _FLEXIBLE[(self.key, version)] = bool(self.request.flexible_version_q(version))
        return known

    def decode(self, body: memoryview, version: int) -> Any:
        if self.decoder is not None:
            return self.decoder(body, version)
        return self.request.decode(body, version=version)


APIS: dict[int, Api] = {
    api.key: api
    for api in (
        Api(ApiKey.PRODUCE, ProduceRequest, ProduceResponse, 0, 10, decode_produce_request),
        Api(ApiKey.FETCH, FetchRequest, FetchResponse, 0, 16),
        Api(ApiKey.LIST_OFFSETS, ListOffsetsRequest, ListOffsetsResponse, 0, 8),
        Api(ApiKey.METADATA, MetadataRequest, MetadataResponse, 0, 12),
        Api(ApiKey.OFFSET_COMMIT, OffsetCommitRequest, OffsetCommitResponse, 2, 9),
        Api(ApiKey.OFFSET_FETCH, OffsetFetchRequest, OffsetFetchResponse, 1, 9),
        Api(ApiKey.FIND_COORDINATOR, FindCoordinatorRequest, FindCoordinatorResponse, 0, 4),
        Api(ApiKey.JOIN_GROUP, JoinGroupRequest, JoinGroupResponse, 0, 9),
        Api(ApiKey.HEARTBEAT, HeartbeatRequest, HeartbeatResponse, 0, 4),
        Api(ApiKey.LEAVE_GROUP, LeaveGroupRequest, LeaveGroupResponse, 0, 5),
        Api(ApiKey.SYNC_GROUP, SyncGroupRequest, SyncGroupResponse, 0, 5),
        Api(ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest, DescribeGroupsResponse, 0, 5),
        Api(ApiKey.LIST_GROUPS, ListGroupsRequest, ListGroupsResponse, 0, 4),
        Api(ApiKey.SASL_HANDSHAKE, SaslHandshakeRequest, SaslHandshakeResponse, 0, 1),
        Api(ApiKey.API_VERSIONS, ApiVersionsRequest, ApiVersionsResponse, 0, 3),
        Api(ApiKey.SASL_AUTHENTICATE, SaslAuthenticateRequest, SaslAuthenticateResponse, 0, 2),
        Api(
            ApiKey.OFFSET_FOR_LEADER_EPOCH,
            OffsetForLeaderEpochRequest,
            OffsetForLeaderEpochResponse,
            0,
            4,
        ),
        Api(ApiKey.CREATE_TOPICS, CreateTopicsRequest, CreateTopicsResponse, 0, 7),
        Api(ApiKey.DELETE_TOPICS, DeleteTopicsRequest, DeleteTopicsResponse, 0, 6),
        Api(ApiKey.DELETE_RECORDS, DeleteRecordsRequest, DeleteRecordsResponse, 0, 2),
        Api(ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest, InitProducerIdResponse, 0, 4),
        # v4 is what brokers send each other (KIP-890's verification, batched transactions).
        Api(
            ApiKey.ADD_PARTITIONS_TO_TXN,
            AddPartitionsToTxnRequest,
            AddPartitionsToTxnResponse,
            0,
            4,
        ),
        Api(ApiKey.ADD_OFFSETS_TO_TXN, AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, 0, 3),
        Api(ApiKey.END_TXN, EndTxnRequest, EndTxnResponse, 0, 3),
        Api(ApiKey.TXN_OFFSET_COMMIT, TxnOffsetCommitRequest, TxnOffsetCommitResponse, 0, 3),
        # Our schema library knows WriteTxnMarkers from v1 only (Kafka 4.0 dropped v0).
        Api(ApiKey.WRITE_TXN_MARKERS, WriteTxnMarkersRequest, WriteTxnMarkersResponse, 1, 1),
        Api(ApiKey.DESCRIBE_ACLS, DescribeAclsRequest, DescribeAclsResponse, 0, 3),
        Api(ApiKey.CREATE_ACLS, CreateAclsRequest, CreateAclsResponse, 0, 3),
        Api(ApiKey.DELETE_ACLS, DeleteAclsRequest, DeleteAclsResponse, 0, 3),
        Api(ApiKey.DESCRIBE_CONFIGS, DescribeConfigsRequest, DescribeConfigsResponse, 0, 4),
        Api(ApiKey.ALTER_CONFIGS, AlterConfigsRequest, AlterConfigsResponse, 0, 2),
        Api(ApiKey.CREATE_PARTITIONS, CreatePartitionsRequest, CreatePartitionsResponse, 0, 3),
        Api(ApiKey.DELETE_GROUPS, DeleteGroupsRequest, DeleteGroupsResponse, 0, 2),
        Api(ApiKey.ELECT_LEADERS, ElectLeadersRequest, ElectLeadersResponse, 0, 2),
        Api(
            ApiKey.ALTER_PARTITION_REASSIGNMENTS,
            AlterPartitionReassignmentsRequest,
            AlterPartitionReassignmentsResponse,
            0,
            0,
        ),
        Api(
            ApiKey.LIST_PARTITION_REASSIGNMENTS,
            ListPartitionReassignmentsRequest,
            ListPartitionReassignmentsResponse,
            0,
            0,
        ),
        Api(
            ApiKey.INCREMENTAL_ALTER_CONFIGS,
            IncrementalAlterConfigsRequest,
            IncrementalAlterConfigsResponse,
            0,
            1,
        ),
        Api(ApiKey.OFFSET_DELETE, OffsetDeleteRequest, OffsetDeleteResponse, 0, 0),
        Api(
            ApiKey.DESCRIBE_CLIENT_QUOTAS,
            DescribeClientQuotasRequest,
            DescribeClientQuotasResponse,
            0,
            1,
        ),
        Api(
            ApiKey.ALTER_CLIENT_QUOTAS,
            AlterClientQuotasRequest,
            AlterClientQuotasResponse,
            0,
            1,
        ),
        Api(
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
            DescribeUserScramCredentialsRequest,
            DescribeUserScramCredentialsResponse,
            0,
            0,
        ),
        Api(
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
            AlterUserScramCredentialsRequest,
            AlterUserScramCredentialsResponse,
            0,
            0,
        ),
        Api(ApiKey.DESCRIBE_CLUSTER, DescribeClusterRequest, DescribeClusterResponse, 0, 1),
        Api(
            ApiKey.DESCRIBE_TRANSACTIONS,
            DescribeTransactionsRequest,
            DescribeTransactionsResponse,
            0,
            0,
        ),
        Api(ApiKey.LIST_TRANSACTIONS, ListTransactionsRequest, ListTransactionsResponse, 0, 0),
        Api(ApiKey.RDMA_ACCESS, RdmaAccessRequest, RdmaAccessResponse, 0, 0, decode_request),
        Api(
            ApiKey.RDMA_CONSUME,
            RdmaConsumeRequest,
            RdmaConsumeResponse,
            0,
            RDMA_CONSUME_MAX_VERSION,
            decode_consume_request,
        ),
        Api(
            ApiKey.RDMA_REPLICA,
            RdmaReplicaRequest,
            RdmaReplicaResponse,
            0,
            0,
            decode_replica_request,
        ),
    )
}

_FIXED = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_INT16 = struct.Struct(">h")


@record
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # bytes the header takes; the body follows
    client_host: str = ""  # the peer's address, as Kafka shows it ("/127.0.0.1")

    @property
    def api(self) -> Api | None:
        return APIS.get(self.api_key)


def parse_request_header(frame: Buffer, client_host: str = "") -> RequestHeader:
    """Parse the request header (v1, or v2 with tagged fields for flexible versions).

    Every length is bounded by the frame. For an API or version Directlog does not serve,
    the header is still parsed as v1 so the caller can answer with the correlation id."""
    if len(frame) < _FIXED.size + 2:
        raise CorruptRecordError(f"request of {len(frame)} bytes is shorter than a header")
    api_key, api_version, correlation_id = _FIXED.unpack_from(frame, 0)
    (length,) = _INT16.unpack_from(frame, _FIXED.size)
    position = _FIXED.size + 2
    client_id = None
    if length >= 0:
        if position + length > len(frame):
            raise CorruptRecordError(f"client id of {length} bytes runs past the request")
        client_id = bytes(frame[position : position + length]).decode("utf-8", "replace")
        position += length
    elif length != -1:
        raise CorruptRecordError(f"client id length {length}")
    api = APIS.get(api_key)
    if (
        api is not None
        and api.min_version <= api_version <= api.max_version
        and api.flexible(api_version)
    ):
        position = skip_tagged_fields(frame, position)
    return RequestHeader(api_key, api_version, correlation_id, client_id, position, client_host)


def response_header(header: RequestHeader) -> bytes:
    """Response header v0 (correlation id), or v1 (plus empty tagged fields) for flexible
    versions — except ApiVersions, which always answers with v0 so any client can read it."""
    api = header.api
    flexible = (
        api is not None
        and header.api_key != ApiKey.API_VERSIONS
        and api.min_version <= header.api_version <= api.max_version
        and api.flexible(header.api_version)
    )
    correlation = header.correlation_id.to_bytes(4, "big", signed=True)
    return correlation + b"\x00" if flexible else correlation


def encode_response(header: RequestHeader, response: Any) -> bytes:
    """Header and body of the answer to `header`, without the size prefix."""
    return response_header(header) + bytes(response.encode(version=header.api_version))
