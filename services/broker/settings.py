"""The broker's settings: defaults that run on a laptop, overridden by a YAML file
(DIRECTLOG_CONFIG or --config), then by DIRECTLOG_* environment variables, then by
command-line flags."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import SettingsConfigDict

from directlog.remote.store import StoreConfig
from directlog.security.tls import TlsFiles
from directlog.settings import ServiceSettings


class ListenerSettings(BaseModel):
    """One Kafka listener: where it binds and what Metadata tells the clients that come in
    through it (a pod's DNS name inside Kubernetes, a node's address from outside)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Z][A-Z0-9_]*$")  # Kafka's style: INTERNAL, EXTERNAL
    host: str = "127.0.0.1"
    port: int = Field(ge=0, le=65535)  # 0 picks a free port
    advertised_host: str | None = None  # host if unset
    advertised_port: int | None = Field(None, ge=1, le=65535)  # the bound port if unset


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
    data_dir: Path = Path("data")
    metrics_port: int = Field(9308, ge=0, le=65535)  # 0 picks a free port
    rack: str | None = None
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

    def kafka_listeners(self) -> list[ListenerSettings]:
        """The listeners to open, the old single-listener settings as one PLAINTEXT."""
        if self.listeners:
            return list(self.listeners)
        return [
            ListenerSettings(
                name="PLAINTEXT",
                host=self.host,
                port=self.port,
                advertised_host=self.advertised_host,
                advertised_port=None,
            )
        ]

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
