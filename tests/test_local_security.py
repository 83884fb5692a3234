"""`make run SECURE=1`'s settings (services/local_security.py) read back by each service's
own settings model, so the secured local cluster cannot drift from what the services take;
its certificates and passwords are made once and kept across restarts."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from confluent_kafka import Producer

from directlog.admin.client_config import parse_properties, read_client_config
from services.broker.settings import BrokerSettings
from services.consensus.settings import ConsensusSettings
from services.controller.settings import ControllerSettings
from services.local_cluster import consensus_config
from services.local_security import LocalSecurity
from services.tiering.settings import TieringSettings

pytestmark = pytest.mark.timeout(60)


def test_made_once_and_kept(tmp_path: Path) -> None:
    first = LocalSecurity.prepare(tmp_path)
    ca, password = first.ca.read_bytes(), first.password("admin")
    again = LocalSecurity.prepare(tmp_path)
    assert again.ca.read_bytes() == ca and again.password("admin") == password
    assert (tmp_path / "admin-password").stat().st_mode & 0o077 == 0
    assert (first.pki / "broker.key").stat().st_mode & 0o077 == 0
    users = (first.pki / "scram-users").read_text().splitlines()
    assert users == [f"admin:{password}", f"broker:{first.password('broker')}"]
    # every certificate chains to the CA and names 127.0.0.1
    context = ssl.create_default_context(cafile=str(first.ca))
    for role in ("broker", "controller", "consensus", "tiering"):
        context.load_cert_chain(first.pki / f"{role}.pem", first.pki / f"{role}.key")


def test_every_service_takes_its_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    security = LocalSecurity.prepare(tmp_path)
    with monkeypatch.context() as env:
        for key, value in security.broker_env(9092).items():
            env.setenv(key, value)
        broker = BrokerSettings.load()
    (listener,) = broker.kafka_listeners()
    assert (listener.name, listener.port, listener.protocol) == ("SASL_SSL", 9092, "SASL_SSL")
    assert broker.authorizer_enabled and broker.super_users == ["User:admin", "User:broker"]
    assert broker.inter_broker_sasl_password is not None
    assert broker.inter_broker_sasl_password.get_secret_value() == security.password("broker")
    assert broker.controller_tls is not None and broker.tiering_tls is not None

    with monkeypatch.context() as env:
        for key, value in security.controller_env().items():
            env.setenv(key, value)
        controller = ControllerSettings.load()
    assert controller.grpc_tls is not None and controller.consensus_tls is not None
    assert controller.consensus_auth is not None and controller.consensus_auth.scheme == "digest"
    assert controller.scram_bootstrap_file == (security.pki / "scram-users").resolve()

    with monkeypatch.context() as env:
        for key, value in security.tiering_env().items():
            env.setenv(key, value)
        tiering = TieringSettings.load()
    assert tiering.broker_tls is not None

    ensemble = ConsensusSettings.load(consensus_config(tmp_path, security))
    assert ensemble.members[1].client is None and ensemble.members[1].secure_client
    assert ensemble.client_tls is not None and ensemble.quorum_tls is not None


def test_the_admins_client_properties_serve_kcat_and_the_cli(tmp_path: Path) -> None:
    """The banner's settings are written to client.properties (owner-only: it holds the
    password) in the form `kcat -F` and `directlog --command-config` read."""
    security = LocalSecurity.prepare(tmp_path)
    banner = security.client_settings("127.0.0.1:9092,127.0.0.1:9093")
    path = security.client_properties
    assert path.stat().st_mode & 0o077 == 0
    assert security.password("admin") not in banner
    assert f"kcat -F {path.resolve()} -L" in banner
    settings, bootstrap = read_client_config(str(path), {})
    assert bootstrap == "127.0.0.1:9092,127.0.0.1:9093"
    assert settings == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "admin",
        "sasl_plain_password": security.password("admin"),
        "ssl_cafile": str(security.ca.resolve()),
    }
    # librdkafka takes every line as it is (kcat -F passes them on the same way)
    Producer(parse_properties(path.read_text(), str(path))).flush(0)
