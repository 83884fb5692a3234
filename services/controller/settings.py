"""The controller's settings: defaults that run on a laptop against `make run`'s ensemble,
overridden by a YAML file (DIRECTLOG_CONTROLLER_CONFIG or --config), then by
DIRECTLOG_CONTROLLER_* environment variables, then by command-line flags."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from directlog.settings import ServiceSettings
from services.controller.cluster import MAX_PARTITIONS
from services.controller.layout import Layout


class ControllerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="DIRECTLOG_CONTROLLER_", extra="forbid")
    config_env: ClassVar[str] = "DIRECTLOG_CONTROLLER_CONFIG"

    controller_id: int = Field(0, ge=0)
    host: str = "127.0.0.1"
    port: int = Field(9190, ge=0, le=65535)  # gRPC; 0 picks a free port
    advertised_host: str | None = None  # what brokers are told to dial; host if unset
    metrics_port: int = Field(9390, ge=0, le=65535)  # 0 picks a free port
    consensus: str = "127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183"  # ZooKeeper connect string
    root: str = "/directlog"  # every znode of the cluster lives under it
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
