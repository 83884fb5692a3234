"""The secured local cluster of `make run SECURE=1` (docs/security.md, "From zero to a
secured cluster"): what every process of services/local_cluster.py is given so that each of
its connections is authenticated and encrypted.

- A throwaway CA (``<data-dir>/ca.pem``) signs one certificate per kind of process, each
  naming 127.0.0.1 and localhost; the files live in ``<data-dir>/pki``, kept across restarts.
- Brokers serve SASL_SSL with SCRAM-SHA-512 on their usual ports, replicate over it as the
  user ``broker``, and authorize every request against the ACLs; ``admin`` and ``broker``
  are super users, created by the controllers from a bootstrap file on first start. The
  admin's password is in ``<data-dir>/admin-password``.
- Controllers serve gRPC with mutual TLS and reach the ensemble over its TLS client ports,
  with a client certificate and digest credentials that own every znode they create.
- Consensus members serve clients only over TLS (client certificates required) and run ZAB
  between themselves over mutual TLS; tiering sidecars reach their broker with mutual TLS.
- The RDMA datapaths stay off: what they move is not encrypted (RDMA has no TLS), and this
  cluster encrypts every link.
"""

from __future__ import annotations

import json
import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from directlog.security.certs import CertificateAuthority
from directlog.security.tls import TlsFiles, client_context

_ROLES = ("broker", "controller", "consensus", "tiering")


@dataclass(frozen=True)
class LocalSecurity:
    data_dir: Path

    @property
    def pki(self) -> Path:
        return self.data_dir / "pki"

    @property
    def ca(self) -> Path:
        return self.data_dir / "ca.pem"

    def password_file(self, user: str) -> Path:
        return (
            self.data_dir / "admin-password" if user == "admin" else self.pki / f"{user}-password"
        )

    def password(self, user: str) -> str:
        return self.password_file(user).read_text(encoding="utf-8").strip()

    def files(self, role: str) -> TlsFiles:
        return TlsFiles(
            cert_file=(self.pki / f"{role}.pem").resolve(),
            key_file=(self.pki / f"{role}.key").resolve(),
            ca_file=self.ca.resolve(),
        )

    @classmethod
    def prepare(cls, data_dir: Path) -> LocalSecurity:
        """The CA, certificates and passwords, made on first use and kept afterwards."""
        security = cls(data_dir)
        security.pki.mkdir(parents=True, exist_ok=True)
        if not security.ca.exists():
            ca = CertificateAuthority.create("directlog-local-ca")
            for role in _ROLES:
                ca.issue(role, hosts=["127.0.0.1", "localhost"], organization="directlog").write(
                    security.pki / f"{role}.pem", security.pki / f"{role}.key"
                )
            for user in ("admin", "broker", "controller"):
                path = security.password_file(user)
                path.touch(mode=0o600)
                path.write_text(secrets.token_urlsafe(18) + "\n", encoding="utf-8")
            ca.write(security.ca)  # last: its presence says the rest is complete
        users = security.pki / "scram-users"
        users.touch(mode=0o600)
        users.write_text(
            "".join(f"{user}:{security.password(user)}\n" for user in ("admin", "broker")),
            encoding="utf-8",
        )
        return security

    def consensus(self) -> dict[str, Any]:
        """Settings the ensemble file adds (members' secure_client addresses aside)."""
        files = self.files("consensus").model_dump(mode="json", exclude_none=True)
        return {"client_tls": files, "ssl_client_auth": "need", "quorum_tls": files}

    def controller_env(self) -> dict[str, str]:
        return {
            "DIRECTLOG_CONTROLLER_GRPC_TLS": _json(self.files("controller")),
            "DIRECTLOG_CONTROLLER_CONSENSUS_TLS": _json(self.files("controller")),
            "DIRECTLOG_CONTROLLER_CONSENSUS_AUTH": json.dumps(
                {
                    "scheme": "digest",
                    "username": "controller",
                    "password": self.password("controller"),
                }
            ),
            "DIRECTLOG_CONTROLLER_SCRAM_BOOTSTRAP_FILE": str((self.pki / "scram-users").resolve()),
        }

    def broker_env(self, port: int) -> dict[str, str]:
        listener = {"name": "SASL_SSL", "host": "127.0.0.1", "port": port}
        return {
            "DIRECTLOG_LISTENERS": json.dumps([listener]),
            "DIRECTLOG_SSL": _json(self.files("broker")),
            "DIRECTLOG_SASL_ENABLED_MECHANISMS": json.dumps(["SCRAM-SHA-512"]),
            "DIRECTLOG_INTER_BROKER_SASL_MECHANISM": "SCRAM-SHA-512",
            "DIRECTLOG_INTER_BROKER_SASL_USERNAME": "broker",
            "DIRECTLOG_INTER_BROKER_SASL_PASSWORD": self.password("broker"),
            "DIRECTLOG_AUTHORIZER_ENABLED": "true",
            "DIRECTLOG_SUPER_USERS": json.dumps(["User:admin", "User:broker"]),
            "DIRECTLOG_CONTROLLER_TLS": _json(self.files("broker")),
            "DIRECTLOG_TIERING_TLS": _json(self.files("broker")),
        }

    def tiering_env(self) -> dict[str, str]:
        return {"DIRECTLOG_TIERING_BROKER_TLS": _json(self.files("tiering"))}

    def member_probe(self) -> ssl.SSLContext:
        """What the cluster's own checks of the members (four-letter words) connect with."""
        return client_context(self.files("controller"))

    @property
    def client_properties(self) -> Path:
        return self.data_dir / "client.properties"

    def client_settings(self, bootstrap: str) -> str:
        """Write the admin's Kafka client settings to ``client.properties`` (which
        `kcat -F` and `directlog --command-config` read as they are) and return what the
        banner prints: the settings, the password left out, and how to use the file."""
        settings = {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "admin",
            "sasl.password": self.password("admin"),
            "ssl.ca.location": str(self.ca.resolve()),
        }
        self.client_properties.touch(mode=0o600)
        self.client_properties.write_text(
            "".join(f"{key}={value}\n" for key, value in settings.items()), encoding="utf-8"
        )
        settings["sasl.password"] = f"<the contents of {self.password_file('admin').resolve()}>"
        path = self.client_properties.resolve()
        return (
            "".join(f"    {key}={value}\n" for key, value in settings.items())
            + f"  all of them are in {path}:\n"
            + f"    kcat -F {path} -L\n"
            + f"    .venv/bin/directlog --command-config {path} topics list\n"
        )


def _json(files: TlsFiles) -> str:
    return json.dumps(files.model_dump(mode="json", exclude_none=True))
