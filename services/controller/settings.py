"""The controller's settings: defaults that run on a laptop against `make run`'s ensemble,
overridden by a YAML file (DIRECTLOG_CONTROLLER_CONFIG or --config), then by
DIRECTLOG_CONTROLLER_* environment variables, then by command-line flags."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from directlog.security.grpc_tls import ServerTlsFiles
from directlog.security.tls import TlsFiles
from directlog.settings import ServiceSettings
from services.controller.cluster import MAX_PARTITIONS
from services.controller.layout import Layout


class ConsensusAuth(BaseModel):
    """Who the controller is to the consensus ensemble (docs/consensus.md, "Security"):
    ``digest`` authenticates with ``addauth digest username:password``, ``sasl`` with SASL
    DIGEST-MD5 as a user of the members' sasl_users. Every znode the controller creates is
    then writable and readable by that identity only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scheme: Literal["digest", "sasl"]
    username: str = Field(min_length=1)
    password: SecretStr

    @model_validator(mode="after")
    def _digest_user(self) -> ConsensusAuth:
        if self.scheme == "digest" and ":" in self.username:
            raise ValueError("a digest username cannot hold ':' (it ends the username)")
        return self


class ControllerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="DIRECTLOG_CONTROLLER_", extra="forbid")
    config_env: ClassVar[str] = "DIRECTLOG_CONTROLLER_CONFIG"

    controller_id: int = Field(0, ge=0)
    host: str = "127.0.0.1"
    port: int = Field(9190, ge=0, le=65535)  # gRPC; 0 picks a free port
    advertised_host: str | None = None  # what brokers are told to dial; host if unset
    # Mutual TLS on the gRPC port (docs/security.md): the controller's certificate, which
    # must name the hosts brokers dial (their controllers entries and advertised_host),
    # and the CA broker certificates must chain to. Unset: plaintext gRPC.
    grpc_tls: ServerTlsFiles | None = None
    metrics_port: int = Field(9390, ge=0, le=65535)  # 0 picks a free port
    consensus: str = "127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183"  # ZooKeeper connect string
    root: str = "/directlog"  # every znode of the cluster lives under it
    consensus_tls: TlsFiles | None = None  # TLS to the members' secure_client ports
    consensus_auth: ConsensusAuth | None = None  # unset: znodes open to all (world:anyone)
    # SASL/SCRAM users to create when a controller takes over and they have no credential
    # yet, one "user:password" a line (what `kafka-storage format --add-scram` does for a
    # new Kafka cluster): the first admin, the brokers' own user. Never overwritten.
    scram_bootstrap_file: Path | None = None
    broker_session_timeout_ms: int = Field(9000, ge=10)  # no heartbeat for this long: fenced
    consensus_session_timeout_ms: int = Field(6000, ge=100)
    default_replication_factor: int = Field(1, ge=1)  # CreateTopics with -1
    num_partitions: int = Field(1, ge=1, le=MAX_PARTITIONS)  # CreateTopics with -1
    metadata_queue_limit: int = Field(1000, ge=1)  # unread updates before a stream is cut
    # Preferred leader election every interval for brokers whose share of partitions they
    # should lead but do not exceeds the percentage (Kafka's auto.leader.rebalance.enable,
    # leader.imbalance.check.interval.seconds, leader.imbalance.per.broker.percentage).
    auto_leader_rebalance: bool = True
    leader_imbalance_check_interval_ms: int = Field(300_000, ge=10)
    leader_imbalance_per_broker_percentage: int = Field(10, ge=0, le=100)

    @field_validator("root")
    @classmethod
    def _root(cls, root: str) -> str:
        Layout(root)
        return root
