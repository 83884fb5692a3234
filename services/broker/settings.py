"""The broker's settings: defaults that run on a laptop, overridden by a YAML file
(DIRECTLOG_CONFIG or --config), then by DIRECTLOG_* environment variables, then by
command-line flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from directlog.remote.store import StoreConfig
from directlog.security.sasl import MECHANISMS as SASL_MECHANISMS
from directlog.security.tls import ClientAuth, TlsFiles
from directlog.settings import ServiceSettings
from services.broker.replica_selector import Selector

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SECURITY_PROTOCOLS: tuple[str, ...] = get_args(SecurityProtocol)


class ListenerSettings(BaseModel):
    """One Kafka listener: where it binds, what Metadata tells the clients that come in
    through it (a pod's DNS name inside Kubernetes, a node's address from outside), and its
    security protocol (Kafka's listener.security.protocol.map entry)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Z][A-Z0-9_]*$")  # Kafka's style: INTERNAL, EXTERNAL
    host: str = "127.0.0.1"
    port: int = Field(ge=0, le=65535)  # 0 picks a free port
    advertised_host: str | None = None  # host if unset
    advertised_port: int | None = Field(None, ge=1, le=65535)  # the bound port if unset
    # Unset: listener_security_protocol_map's entry, else the name when it is a protocol.
    security_protocol: SecurityProtocol | None = None
    # Kafka's listener.name.<name>.ssl.client.auth / sasl.enabled.mechanisms: unset, the
    # broker-wide setting.
    ssl_client_auth: ClientAuth | None = None
    sasl_enabled_mechanisms: list[str] | None = None

    @property
    def protocol(self) -> SecurityProtocol:
        assert self.security_protocol is not None, "resolved by BrokerSettings"
        return self.security_protocol

    @property
    def uses_ssl(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def parse_kafka_listeners(text: str) -> list[dict[str, Any]]:
    """Kafka's listeners syntax, NAME://host:port[,...] (an empty host: the broker's host
    setting; [ipv6]:port), as listener fields."""
    parsed = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, separator, address = item.partition("://")
        host, colon, port = address.rpartition(":")
        if not separator or not colon or not port.isdigit():
            raise ValueError(f"listener {item!r} is not NAME://host:port")
        entry: dict[str, Any] = {"name": name, "port": int(port)}
        if host:
            entry["host"] = host.strip("[]")
        parsed.append(entry)
    return parsed


class BrokerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="DIRECTLOG_", extra="forbid")
    config_env: ClassVar[str] = "DIRECTLOG_CONFIG"

    node_id: int = Field(0, ge=0)
    host: str = "127.0.0.1"
    port: int = Field(9092, ge=0, le=65535)
    advertised_host: str | None = None  # what Metadata tells clients; host if unset
    # Named listeners (Kafka's listeners / advertised.listeners): a client is answered with
    # every broker's address on the listener its request came in through. Empty: one
    # PLAINTEXT listener on host:port, advertised as advertised_host.
    listeners: list[ListenerSettings] = Field(default_factory=list)
    # The listener replicas fetch through (Kafka's inter.broker.listener.name); the first
    # listener if unset. Every broker of a cluster names the same one.
    inter_broker_listener: str | None = None
    # Security (docs/security.md), under Kafka's names. advertised_listeners, in Kafka's
    # NAME://host:port syntax, sets the listeners' advertised addresses by name;
    # listener_security_protocol_map (NAME:PROTOCOL,... or a mapping) names each listener's
    # protocol where its name is not one.
    advertised_listeners: str | None = None
    listener_security_protocol_map: dict[str, SecurityProtocol] = Field(default_factory=dict)
    # The certificate of SSL and SASL_SSL listeners, and the CAs client certificates must
    # chain to (ssl.keystore / ssl.truststore, PEM); reloaded when the files change.
    ssl: TlsFiles | None = None
    ssl_client_auth: ClientAuth = "none"
    ssl_files_check_interval_ms: int = Field(5000, ge=10)
    sasl_enabled_mechanisms: list[str] = Field(
        default_factory=lambda: ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    )
    sasl_server_max_receive_size: int = Field(524288, ge=256)  # frames before authentication
    connections_max_reauth_ms: int = Field(0, ge=0)  # 0: sessions never expire
    connection_failed_authentication_delay_ms: int = Field(100, ge=0)
    # Client quotas' sampled rates (Kafka's quota.window.num, quota.window.size.seconds):
    # a rate is taken over window_num windows, so a new client may burst through
    # window_num - 1 windows' worth before it is throttled.
    quota_window_num: int = Field(11, ge=1)
    quota_window_size_seconds: float = Field(1.0, gt=0)
    # Authorization (Kafka's authorizer.class.name, super.users, allow.everyone.if.no.acl.found):
    # with the authorizer on, every request is checked against the cluster's ACLs. Super
    # users (User:admin; Kafka's "User:a;User:b" is taken too) may do anything; the brokers'
    # own principal must be one for replication once the authorizer is on.
    authorizer_enabled: bool = False
    super_users: list[str] = Field(default_factory=list)
    allow_everyone_if_no_acl_found: bool = False
    # How this broker authenticates to the others' inter-broker listener when it is SASL
    # (sasl.mechanism.inter.broker.protocol and the broker's own JAAS login).
    inter_broker_sasl_mechanism: str = "SCRAM-SHA-512"
    inter_broker_sasl_username: str | None = None
    inter_broker_sasl_password: SecretStr | None = None
    data_dir: Path = Path("data")
    metrics_port: int = Field(9308, ge=0, le=65535)  # 0 picks a free port
    rack: str | None = None  # Kafka's broker.rack
    # Kafka's replica.selector.class: unset or LeaderSelector, consumers read from leaders;
    # RackAwareReplicaSelector, a consumer with a client.rack reads from a replica in its
    # rack (KIP-392, services/broker/replica_selector.py).
    replica_selector_class: Selector | None = None
    # The controllers, any of them (standbys point to the active one).
    controllers: list[str] = Field(default_factory=lambda: ["127.0.0.1:9190"], min_length=1)
    heartbeat_interval_ms: int = Field(1000, ge=10)
    # On SIGTERM/SIGINT: how long to wait, at most, for the controller to move this broker's
    # leaderships away before stopping (0: stop at once, as after a crash).
    controlled_shutdown_timeout_ms: int = Field(10000, ge=0)
    auto_create_topics: bool = True
    socket_request_max_bytes: int = Field(100 * 1024 * 1024, ge=1024)
    log_defaults: dict[str, str] = Field(default_factory=dict)  # topic configs, Kafka names
    housekeeping_interval_ms: int = Field(1000, ge=10)  # flush.ms and retention checks
    replica_lag_time_max_ms: int = Field(30000, ge=10)  # out of the ISR after this long behind
    replica_fetch_wait_max_ms: int = Field(500, ge=0)
    replica_fetch_max_bytes: int = Field(1024 * 1024, ge=1024)
    replica_fetch_backoff_ms: int = Field(1000, ge=1)
    # Consumer groups (Kafka's offsets.* and group.* settings and defaults). The offsets
    # topic is created on the first FindCoordinator, once this many brokers are registered.
    offsets_topic_num_partitions: int = Field(50, ge=1)
    offsets_topic_replication_factor: int = Field(3, ge=1)
    offsets_topic_segment_bytes: int = Field(100 * 1024 * 1024, ge=1024)
    offsets_commit_timeout_ms: int = Field(5000, ge=1)
    offset_metadata_max_bytes: int = Field(4096, ge=0)
    offsets_retention_ms: int = Field(7 * 24 * 3600 * 1000, ge=1)
    offsets_retention_check_interval_ms: int = Field(600000, ge=1)
    group_initial_rebalance_delay_ms: int = Field(3000, ge=0)
    group_min_session_timeout_ms: int = Field(6000, ge=1)
    group_max_session_timeout_ms: int = Field(1800000, ge=1)
    group_max_size: int = Field((1 << 31) - 1, ge=1)
    # Transactions (Kafka's transaction.* settings and defaults). __transaction_state is
    # created on the first FindCoordinator for a transactional id.
    transaction_state_log_num_partitions: int = Field(50, ge=1)
    transaction_state_log_replication_factor: int = Field(3, ge=1)
    transaction_state_log_segment_bytes: int = Field(100 * 1024 * 1024, ge=1024)
    transaction_max_timeout_ms: int = Field(900000, ge=1)
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = Field(10000, ge=1)
    # An idle transactional id is removed (a tombstone) after this long.
    transactional_id_expiration_ms: int = Field(7 * 24 * 3600 * 1000, ge=1)
    transaction_remove_expired_transaction_cleanup_interval_ms: int = Field(3600000, ge=1)
    # KIP-890: a partition's leader asks the coordinator before it takes the first batch of a
    # producer's transaction (services/broker/transactions/verification.py).
    transaction_partition_verification_enable: bool = True
    # How long a transaction marker waits for its partition's ISR before it is retried.
    transaction_marker_timeout_ms: int = Field(30000, ge=1)
    # Idempotent producers: state of a producer id unseen this long is dropped.
    producer_id_expiration_ms: int = Field(86400000, ge=1)
    # RDMA produce (docs/broker.md "RDMA produce"): grants of preallocated head segments to
    # producers that write batches with WRITE_WITH_IMM. Off by default.
    rdma_produce: bool = False
    rdma_provider: Literal["auto", "shm", "tcp", "pyverbs"] = "auto"
    rdma_host: str | None = None  # where the RDMA listener binds; host if unset
    rdma_port: int = Field(0, ge=0, le=65535)  # 0 picks a free port
    rdma_grant_max_bytes: int = Field(8 * 1024 * 1024, ge=4096)  # zeroed on revocation
    rdma_connect_timeout_ms: int = Field(10000, ge=10)  # a grant unused this long is revoked
    rdma_hole_timeout_ms: int = Field(1000, ge=1)  # writes waiting this long behind a hole
    # After a completion, every RDMA module keeps polling its completion queue this long,
    # one poll per event-loop turn, so a write soon after is taken without a wake-up. For a
    # broker with cores of its own; brokers sharing cores would starve each other.
    rdma_poll_spin_us: int = Field(0, ge=0, le=100_000)
    # RDMA push replication (docs/broker.md "RDMA push replication"): the leader of a
    # preallocated topic writes new batches straight into its followers' head segments
    # with WRITE_WITH_IMM (rdma_provider, rdma_host apply); pull replication stays the
    # fallback. Off by default; leader and followers both need it on.
    rdma_replication: bool = False
    rdma_replication_port: int = Field(0, ge=0, le=65535)  # follower's listener; 0: any free
    rdma_replication_batch_bytes: int = Field(1024, ge=1)  # contiguous batches per write
    rdma_replication_credits: int = Field(16, ge=1, le=1024)  # pushes unanswered, at most
    rdma_replication_timeout_ms: int = Field(5000, ge=10)  # a channel silent this long ends
    # RDMA consume (docs/broker.md "RDMA consume"): segments registered for one-sided reads
    # and per-consumer metadata slots. Uses rdma_provider and rdma_host; off by default.
    rdma_consume: bool = False
    rdma_consume_port: int = Field(0, ge=0, le=65535)  # 0 picks a free port
    rdma_consume_max_consumers: int = Field(256, ge=1, le=4096)  # slot regions at once
    # Where the preallocated head segments RDMA peers write live (docs/broker.md, "Head
    # segments in memory"): a memory-backed directory (tmpfs: a Kubernetes emptyDir
    # with medium Memory), for the pyverbs provider on Linux >= 6.5, which cannot
    # register an ext4/xfs file for remote writes. Sealed segments are written back to
    # data_dir; until then replication and tiering keep their records. Unset: data_dir.
    rdma_head_segments_dir: Path | None = None
    # The address RDMA peers (producers, consumers, leaders pushing) are told to reach
    # this broker's RDMA listeners at: the RDMA NIC's, when it sits on a secondary
    # (SR-IOV/Multus) network. If unset: advertised_host, else rdma_host, else host.
    rdma_advertised_host: str | None = None
    # Mutual TLS of the service links (docs/security.md): what the broker presents to the
    # controllers and checks them against, and what its tiering gRPC server presents to the
    # sidecar and requires of it. Unset: plaintext gRPC.
    controller_tls: TlsFiles | None = None
    tiering_tls: TlsFiles | None = None
    # Tiered storage (docs/tiering.md). Kafka's remote.log.storage.system.enable: topics may
    # set remote.storage.enable only while it is on. The tiering service beside the broker
    # copies their closed segments to the remote store, from which the broker serves reads
    # below the local log start. The store's settings are the tiering service's own
    # (DIRECTLOG_TIERING_REMOTE, ...), so one set of variables configures both.
    remote_log_storage_system_enable: bool = False
    tiering_remote: str | None = None  # file:///dir, s3://bucket/prefix, hdfs://host:port/dir
    tiering_s3_endpoint: str | None = None  # http(s)://host:port of an S3-compatible server
    tiering_s3_region: str | None = None
    tiering_s3_access_key: str | None = None  # unset: the AWS SDK's own chain
    tiering_s3_secret_key: str | None = None
    tiering_remote_timeout_ms: int = Field(10000, ge=1)  # one store request, at most
    # Where the broker serves its tiering service (gRPC, proto/tiering.proto): localhost in a
    # pod. 0 picks a free port (printed in the banner).
    tiering_host: str = "127.0.0.1"
    tiering_port: int = Field(9393, ge=0, le=65535)
    remote_fetch_max_wait_ms: int = Field(500, ge=1)  # then a fetch answers without the read
    remote_log_reader_threads: int = Field(10, ge=1)
    remote_log_reader_max_pending_tasks: int = Field(100, ge=1)
    remote_list_offsets_request_timeout_ms: int = Field(30000, ge=1)

    # Fetches of consumers older than the v2 record format (Fetch v0-3) are converted while
    # they are sent, this many bytes of batches at a time (KIP-283); 0 converts each answer
    # whole before sending it, as brokers did before (docs/broker.md, "Old consumers").
    down_conversion_chunk_bytes: int = Field(128 * 1024, ge=0)

    @field_validator("listeners", mode="before")
    @classmethod
    def _kafka_listeners_syntax(cls, value: Any) -> Any:
        return parse_kafka_listeners(value) if isinstance(value, str) else value

    @field_validator("super_users", mode="before")
    @classmethod
    def _kafka_super_users_syntax(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [user.strip() for user in value.split(";") if user.strip()]
        return value

    @field_validator("listener_security_protocol_map", mode="before")
    @classmethod
    def _kafka_map_syntax(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        pairs = [item.strip().split(":", 1) for item in value.split(",") if item.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"listener_security_protocol_map {value!r} is not NAME:PROTOCOL,...")
        return {name.strip(): protocol.strip() for name, protocol in pairs}

    @model_validator(mode="after")
    def _listeners_consistent(self) -> Self:
        names = [listener.name for listener in self.listeners]
        if len(set(names)) != len(names):
            raise ValueError(f"listener names must differ: {names}")
        if self.inter_broker_listener is not None and self.inter_broker_listener not in (
            names or ["PLAINTEXT"]
        ):
            raise ValueError(
                f"inter_broker_listener {self.inter_broker_listener!r} is not a listener "
                f"(listeners: {', '.join(names or ['PLAINTEXT'])})"
            )
        return self

    @model_validator(mode="after")
    def _listener_security(self) -> Self:
        """Every listener's protocol resolved, advertised_listeners applied, and what a
        protocol needs present (a certificate for SSL, mechanisms for SASL)."""
        advertised = {
            entry["name"]: entry for entry in parse_kafka_listeners(self.advertised_listeners or "")
        }
        listeners = self.listeners or [
            ListenerSettings(
                name="PLAINTEXT",
                host=self.host,
                port=self.port,
                advertised_host=self.advertised_host,
                advertised_port=None,
            )
        ]
        unknown = advertised.keys() - {listener.name for listener in listeners}
        if unknown:
            raise ValueError(f"advertised_listeners names no listener: {sorted(unknown)}")
        for listener in listeners:
            if listener.name in advertised:
                listener.advertised_host = advertised[listener.name].get("host")
                listener.advertised_port = advertised[listener.name]["port"]
            if listener.security_protocol is None:
                protocol = self.listener_security_protocol_map.get(listener.name, listener.name)
                if protocol not in SECURITY_PROTOCOLS:
                    raise ValueError(
                        f"listener {listener.name} has no security protocol: name one in "
                        f"listener_security_protocol_map ({', '.join(SECURITY_PROTOCOLS)})"
                    )
                listener.security_protocol = protocol  # type: ignore[assignment]
            if listener.uses_ssl and (self.ssl is None or self.ssl.cert_file is None):
                raise ValueError(f"listener {listener.name} is {listener.protocol}: set ssl")
            if self.client_auth(listener) != "none" and (self.ssl is None or not self.ssl.ca_file):
                raise ValueError(f"ssl_client_auth of {listener.name} needs ssl.ca_file")
            if listener.uses_sasl:
                unsupported = set(self.sasl_mechanisms(listener)) - set(SASL_MECHANISMS)
                if unsupported or not self.sasl_mechanisms(listener):
                    raise ValueError(
                        f"listener {listener.name}: SASL mechanisms must be some of "
                        f"{', '.join(SASL_MECHANISMS)}, not {sorted(unsupported) or 'none'}"
                    )
        self.listeners = listeners
        inter_broker = next(x for x in listeners if x.name == self.inter_broker())
        if inter_broker.uses_sasl and not (
            self.inter_broker_sasl_username and self.inter_broker_sasl_password
        ):
            raise ValueError(
                f"the inter-broker listener {inter_broker.name} is {inter_broker.protocol}: set "
                "inter_broker_sasl_username and inter_broker_sasl_password"
            )
        if inter_broker.uses_sasl and self.inter_broker_sasl_mechanism not in self.sasl_mechanisms(
            inter_broker
        ):
            raise ValueError(
                f"inter_broker_sasl_mechanism {self.inter_broker_sasl_mechanism} is not enabled "
                f"on {inter_broker.name}"
            )
        return self

    def client_auth(self, listener: ListenerSettings) -> ClientAuth:
        return listener.ssl_client_auth or self.ssl_client_auth

    def sasl_mechanisms(self, listener: ListenerSettings) -> list[str]:
        if listener.sasl_enabled_mechanisms is not None:
            return listener.sasl_enabled_mechanisms
        return self.sasl_enabled_mechanisms

    def kafka_listeners(self) -> list[ListenerSettings]:
        """The listeners to open (the old single-listener settings became one PLAINTEXT)."""
        return list(self.listeners)

    def inter_broker(self) -> str:
        return self.inter_broker_listener or self.kafka_listeners()[0].name

    @model_validator(mode="after")
    def _head_segments_dir_apart(self) -> Self:
        heads = self.rdma_head_segments_dir
        if heads is not None:
            data, heads = self.data_dir.resolve(), heads.resolve()
            if heads == data or data in heads.parents:
                raise ValueError(f"rdma_head_segments_dir {heads} must lie outside data_dir {data}")
        return self

    @model_validator(mode="after")
    def _remote_store_named(self) -> Self:
        if self.remote_log_storage_system_enable and not self.tiering_remote:
            raise ValueError("remote_log_storage_system_enable needs tiering_remote, the store")
        return self

    def store_config(self) -> StoreConfig:
        assert self.tiering_remote, "tiered storage is off"
        return StoreConfig(
            self.tiering_remote,
            s3_endpoint=self.tiering_s3_endpoint,
            s3_region=self.tiering_s3_region,
            s3_access_key=self.tiering_s3_access_key,
            s3_secret_key=self.tiering_s3_secret_key,
            timeout_s=self.tiering_remote_timeout_ms / 1000,
        )
