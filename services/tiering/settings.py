"""The tiering service's settings: defaults that run beside a `make run` broker, overridden
by a YAML file (DIRECTLOG_TIERING_CONFIG or --config), then by DIRECTLOG_TIERING_*
environment variables, then by command-line flags. The remote store's variables
(DIRECTLOG_TIERING_REMOTE, DIRECTLOG_TIERING_S3_*) are the broker's too."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from directlog.remote.store import StoreConfig
from directlog.security.tls import TlsFiles
from directlog.settings import ServiceSettings


class TieringSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="DIRECTLOG_TIERING_", extra="forbid")
    config_env: ClassVar[str] = "DIRECTLOG_TIERING_CONFIG"

    # The broker's BrokerTiering gRPC service (its tiering_host:tiering_port).
    broker: str = "127.0.0.1:9393"
    # Mutual TLS to it (docs/security.md): this sidecar's certificate, which must chain to
    # the broker's tiering_tls.ca_file, and the CA the broker's certificate must chain to.
    # Unset: plaintext gRPC.
    broker_tls: TlsFiles | None = None
    # The name the broker's certificate is checked for, when it does not name the host of
    # `broker` (the sidecar dials 127.0.0.1; the certificate may name the pod's DNS name).
    broker_tls_server_name: str | None = None
    metrics_host: str = "127.0.0.1"  # where /metrics listens
    metrics_port: int = Field(9408, ge=0, le=65535)  # 0 picks a free port
    # The remote store: file:///dir, s3://bucket/prefix or hdfs://host:port/dir.
    remote: str = "file:///var/lib/directlog/remote"
    s3_endpoint: str | None = None  # http(s)://host:port of an S3-compatible server
    s3_region: str | None = None
    s3_access_key: str | None = None  # unset: the AWS SDK's own chain (env, files, IMDS)
    s3_secret_key: str | None = None
    remote_timeout_ms: int = Field(10000, ge=1)  # one store request, at most
    # How often partitions are looked at: copies, remote retention, index rotation by age
    # (Kafka's remote.log.manager.task.interval.ms, 30 s there).
    interval_ms: int = Field(1000, ge=10)
    # How often a follower's remote indexes catch up with the leader's copies.
    follower_sync_interval_ms: int = Field(5000, ge=10)
    # How often topics deleted with remote data are looked for.
    deletion_check_interval_ms: int = Field(10000, ge=10)
    copy_concurrency: int = Field(2, ge=1)  # partitions copied at once
    # Copies are background work: the process lowers its CPU priority by this much at start
    # (os.nice), so on cores it shares with its broker it does not delay produce requests.
    niceness: int = Field(19, ge=0, le=19)
    # One remoteLogIndex entry per span of whole batches of about this many bytes: a remote
    # read fetches one such range, not a whole segment.
    index_span_bytes: int = Field(1 << 20, ge=1)
    # The remote index files rotate (and the rotated set is shipped to the store) at this
    # size of the remoteLogIndex or this age.
    index_rotate_bytes: int = Field(1 << 20, ge=64)
    index_rotate_ms: int = Field(3_600_000, ge=1)

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            self.remote,
            s3_endpoint=self.s3_endpoint,
            s3_region=self.s3_region,
            s3_access_key=self.s3_access_key,
            s3_secret_key=self.s3_secret_key,
            timeout_s=self.remote_timeout_ms / 1000,
        )
