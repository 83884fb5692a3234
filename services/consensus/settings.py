"""Settings of one consensus member: the ensemble file every member shares, plus its id.

The YAML file names every member's addresses, so the same file starts the whole ensemble::

    members:
      1: {client: "127.0.0.1:2181", peer: "127.0.0.1:2881", metrics: "127.0.0.1:7181"}
      2: {client: "127.0.0.1:2182", peer: "127.0.0.1:2882", metrics: "127.0.0.1:7182"}
      3: {client: "127.0.0.1:2183", peer: "127.0.0.1:2883", metrics: "127.0.0.1:7183"}
      4: {client: "127.0.0.1:2184", peer: "127.0.0.1:2884", role: observer}
    data_dir: data/consensus      # member N keeps its files in <data_dir>/<N>
    quorum: majority              # or "all": every member acks each proposal
    force_sync: true              # fsync the transaction log before acking (ZooKeeper's forceSync)

A member may also serve clients over TLS (``secure_client``, ZooKeeper's secureClientPort,
with ``client_tls``), leave the plaintext ``client`` address out, run ZAB between members
over mutual TLS (``quorum_tls``, ZooKeeper's sslQuorum) and authenticate clients with SASL
DIGEST-MD5 (``sasl_users`` / ``sasl_jaas_file``); docs/consensus.md, "Security".

A member with ``role: observer`` (ZooKeeper's ``peerType=observer`` and ``:observer`` on
its ``server.N`` line) syncs with the leader, serves reads and watches and forwards writes,
but never votes nor counts in a quorum; the voters (``participant``, the default) alone
make the quorums.

Every other key has a default that runs on a laptop; ``DIRECTLOG_CONSENSUS_*`` environment
variables override the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from directlog.security.tls import TlsFiles
from directlog.settings import ServiceSettings
from services.consensus.sasl import jaas_users


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected host:port, got {text!r}")
    return host, int(port)


class MemberAddresses(BaseModel):
    model_config = {"extra": "forbid"}

    client: str | None = None  # ZooKeeper client protocol and four-letter words, plaintext
    secure_client: str | None = None  # the same over TLS (ZooKeeper's secureClientPort)
    peer: str  # ZAB traffic between members
    metrics: str | None = None  # Prometheus /metrics; none when unset
    role: Literal["participant", "observer"] = "participant"  # ZooKeeper's server.N role

    @field_validator("client", "secure_client", "peer", "metrics")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            parse_address(value)
        return value

    @model_validator(mode="after")
    def _serves_clients(self) -> MemberAddresses:
        if self.client is None and self.secure_client is None:
            raise ValueError("a member needs a client or a secure_client address")
        return self


class ConsensusSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="DIRECTLOG_CONSENSUS_", extra="forbid")
    config_env: ClassVar[str] = "DIRECTLOG_CONSENSUS_CONFIG"

    members: dict[int, MemberAddresses]
    data_dir: Path = Path("data/consensus")
    quorum: Literal["majority", "all"] = "majority"
    force_sync: bool = True
    tick_ms: int = Field(100, ge=5)  # ZooKeeper's tickTime, smaller: failover is ticks
    election_ticks: int = Field(10, ge=3)  # leader silence before a new election
    heartbeat_ticks: int = Field(2, ge=1)
    min_session_timeout_ms: int | None = None  # 10 ticks when unset: sessions are seen
    # by the leader once per heartbeat, so a shorter timeout would expire live sessions
    max_session_timeout_ms: int = Field(60_000, ge=1)
    log_segment_bytes: int = Field(64 * 1024 * 1024, ge=4096)  # preallocated per log file
    snap_count: int = Field(10_000, ge=10)  # transactions between snapshots
    snap_retain_count: int = Field(3, ge=1)  # snapshots kept (ZooKeeper's autopurge)
    max_buffer: int = Field(1024 * 1024, ge=1024)  # jute.maxbuffer
    max_client_connections: int = Field(1000, ge=1)
    poll_spin_us: int = Field(500, ge=0)  # after work, poll this long before sleeping
    session_secret: str = "directlog"  # session passwords are an HMAC of the id with it
    # Security (docs/consensus.md, "Security"); ZooKeeper's names in the comments.
    client_tls: TlsFiles | None = None  # ssl.keyStore/ssl.trustStore of secure_client ports
    ssl_client_auth: Literal["none", "want", "need"] = "need"  # ssl.clientAuth
    quorum_tls: TlsFiles | None = None  # sslQuorum=true with ssl.quorum.keyStore/trustStore
    quorum_hostname_verification: bool = True  # ssl.quorum.hostnameVerification
    tls_check_interval_ms: int = Field(5000, ge=10)  # changed PEM files load within this
    sasl_users: dict[str, SecretStr] = Field(default_factory=dict)  # JAAS user_<name>="pw"
    sasl_jaas_file: Path | None = None  # or ZooKeeper's own JAAS file, its Server section
    sasl_required: bool = False  # zookeeper.sessionRequireClientSASLAuth
    # Cut off from the quorum, serve read-only sessions from the local tree (ZooKeeper's
    # readonlymode.enabled; docs/consensus.md, "Read-only mode").
    read_only_mode: bool = False
    # Let super users change the membership with reconfig (ZooKeeper's reconfigEnabled;
    # dynamic_config.py). ``super_digest`` is ZooKeeper's superDigest, "super:<base64
    # sha1 of super:password>": a session that adds that digest auth is a super user.
    reconfig_enabled: bool = False
    super_digest: SecretStr | None = None

    @field_validator("members")
    @classmethod
    def _ids(cls, members: dict[int, MemberAddresses]) -> dict[int, MemberAddresses]:
        if not members:
            raise ValueError("at least one member is needed")
        if any(not 1 <= i <= 255 for i in members):
            raise ValueError("member ids must be 1..255 (they prefix session ids)")
        if all(m.role == "observer" for m in members.values()):
            raise ValueError("at least one member must be a participant (a voter)")
        return members

    @model_validator(mode="after")
    def _ticks(self) -> ConsensusSettings:
        if self.heartbeat_ticks >= self.election_ticks:
            raise ValueError("heartbeat_ticks must be below election_ticks")
        if self.min_session_timeout >= self.max_session_timeout_ms:
            raise ValueError("min session timeout must be below the max")
        return self

    @model_validator(mode="after")
    def _security(self) -> ConsensusSettings:
        if any(m.secure_client for m in self.members.values()):
            if self.client_tls is None or self.client_tls.cert_file is None:
                raise ValueError("secure_client addresses need client_tls with cert_file")
            if self.ssl_client_auth != "none" and self.client_tls.ca_file is None:
                raise ValueError(f"ssl_client_auth {self.ssl_client_auth} needs client_tls.ca_file")
        quorum = self.quorum_tls
        if quorum is not None and (quorum.cert_file is None or quorum.ca_file is None):
            raise ValueError("quorum_tls is mutual: it needs cert_file, key_file and ca_file")
        if self.sasl_required and not self.sasl_users and self.sasl_jaas_file is None:
            raise ValueError("sasl_required needs sasl_users or sasl_jaas_file")
        return self

    @property
    def voters(self) -> list[int]:
        """The participants' ids: they elect the leader and make every quorum."""
        return sorted(i for i, m in self.members.items() if m.role == "participant")

    @property
    def observers(self) -> list[int]:
        return sorted(i for i, m in self.members.items() if m.role == "observer")

    @property
    def min_session_timeout(self) -> int:
        return self.min_session_timeout_ms or 10 * self.tick_ms

    def sasl_credentials(self) -> dict[str, str]:
        """The SASL users: ``sasl_jaas_file``'s, then ``sasl_users`` (which win)."""
        users = jaas_users(self.sasl_jaas_file.read_text()) if self.sasl_jaas_file else {}
        users.update((name, pw.get_secret_value()) for name, pw in self.sasl_users.items())
        return users

    def member_dir(self, member_id: int) -> Path:
        return self.data_dir / str(member_id)

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> Self:
        """The ensemble file is required: it names every member."""
        if config_file is None or not config_file.is_file():
            raise FileNotFoundError(f"no consensus config at {config_file}")
        return super().load(config_file, **overrides)
