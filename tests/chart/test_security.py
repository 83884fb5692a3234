"""The chart's `security` values (deploy/helm/directlog/README.md, "Security").

Rendered with TLS, SASL, ACLs and mutual TLS on, every container's command runs as a kubelet
would start it (tests/chart/pods.py) and its settings load through the service's own
settings class. Certificates issued as the README says, put where the Secrets are mounted,
load into the services' TLS contexts and complete handshakes under the names each client
dials; a renewed Secret reaches them through the whole-volume mount. The chart's own Kafka
clients (the topics Job, the drain hook, the admin CLI in a broker container, the lag
metrics) log in to the listener they dial. Values the schema or the templates refuse are
refused, and with nothing turned on the render is what it was.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from directlog.admin.client_config import ENV_PREFIX as CLIENT_PREFIX
from directlog.kube import scale_down
from directlog.security import grpc_tls
from directlog.security.certs import Certificate, CertificateAuthority
from directlog.security.channel import TlsChannel, TlsHandshakeError
from directlog.security.tls import ReloadingContext, TlsFiles, client_context, server_context
from services.broker.authentication import inter_broker_security, listener_security
from services.broker.settings import BrokerSettings, ListenerSettings
from services.consensus.settings import ConsensusSettings, parse_address
from services.consensus.tls import names_host
from services.controller.settings import ControllerSettings
from services.tiering.settings import TieringSettings
from tests.chart.apiserver import FakeApiServer, statefulset_path
from tests.chart.pods import (
    Exec,
    PodFacts,
    container_env,
    run_container,
    settings_from_env,
    unknown_variables,
)
from tests.chart.render import (
    CHART,
    NAMESPACE,
    NEWEST_KUBERNETES,
    OLDEST_KUBERNETES,
    RELEASE,
    HelmError,
    Manifest,
    component,
    find,
    one,
    run_helm,
    schema_refusal,
    template,
)

pytestmark = pytest.mark.timeout(120)

HANDSHAKE_TIMEOUT = 10.0  # seconds for one in-memory TLS handshake
ADMIN_TIMEOUT = 30  # seconds for one admin client run against a recording client
DOMAIN = f"{NAMESPACE}.svc.cluster.local"
SECRETS_DIR = "/var/run/secrets/directlog"

# Secret names and passwords of the scenarios (PodFacts hands them to the containers).
KAFKA_TLS, BROKER_LINK, CONTROLLER_LINK, CONSENSUS_LINK = (
    "kafka-tls", "broker-link-tls", "controller-link-tls", "consensus-link-tls",
)  # fmt: skip
BROKER_USER, SCRAM_USERS, CONSENSUS_AUTH, TOPICS_USER = (
    "broker-user", "scram-users", "consensus-auth", "topics-user",
)  # fmt: skip
BROKER_PASSWORD = "br0ker-pw"
CONSENSUS_PASSWORD = 'a "quoted" pass\\word: with $(DOLLARS) and \u00fc'  # JSON and shell alike
TOPICS_PASSWORD = "t0pics-pw"
SECRET_VALUES = {
    (BROKER_USER, "password"): BROKER_PASSWORD,
    (CONSENSUS_AUTH, "password"): CONSENSUS_PASSWORD,
    (TOPICS_USER, "pw"): TOPICS_PASSWORD,
}
EXTERNAL_HOSTS = ["b0.kafka.example.com", "b1.kafka.example.com", "b2.kafka.example.com"]
BROKER_SUBJECT = "CN=directlog-broker,O=directlog"

SCENARIOS: dict[str, dict[str, Any]] = {
    # What `make run SECURE=1` does, on Kubernetes: SASL_SSL with SCRAM-SHA-512 for clients,
    # replication on its own SASL_SSL listener, an mTLS EXTERNAL listener, ACLs, the first
    # users from a Secret, mutual TLS between the services, controllers owning their znodes.
    "secured": {
        "security": {
            "tls": {"existingSecret": KAFKA_TLS},
            "listeners": {
                "internal": {"protocol": "SASL_SSL"},
                "external": {"protocol": "SSL", "sslClientAuth": "required"},
                "interBroker": {
                    "enabled": True, "protocol": "SASL_SSL", "saslMechanisms": ["SCRAM-SHA-512"],
                },
            },
            "sasl": {
                "enabledMechanisms": ["SCRAM-SHA-256", "SCRAM-SHA-512"],
                "interBroker": {"existingSecret": BROKER_USER},
                "bootstrapUsers": {"existingSecret": SCRAM_USERS},
            },
            "authorization": {"enabled": True, "superUsers": ["User:admin"]},
            "serviceLinks": {
                "enabled": True,
                "broker": {"existingSecret": BROKER_LINK},
                "controller": {"existingSecret": CONTROLLER_LINK},
                "consensus": {"existingSecret": CONSENSUS_LINK},
            },
            "consensusAuth": {"enabled": True, "existingSecret": CONSENSUS_AUTH},
        },
        "broker": {
            "external": {
                "enabled": True, "type": "LoadBalancer", "advertisedHosts": EXTERNAL_HOSTS,
            }
        },
        "tiering": {"enabled": True, "remote": "file:///mnt/remote"},
        "topics": [{"name": "orders", "partitions": 6, "replicationFactor": 3}],
    },
    # TLS only: client certificates required, brokers replicating on INTERNAL as their
    # certificate's subject (the topics Job presents it too), every process on the pod's IP.
    "mtls": {
        "listenAddress": "podIP",
        "security": {
            "tls": {"existingSecret": KAFKA_TLS, "clientAuth": "required"},
            "listeners": {"internal": {"protocol": "SSL"}},
            "authorization": {"enabled": True, "superUsers": [f"User:{BROKER_SUBJECT}"]},
        },
        "topics": [{"name": "events"}],
    },
    # SASL without TLS on INTERNAL (a service mesh encrypts); the chart's admin clients log
    # in with PLAIN as a user of their own.
    "sasl-plaintext": {
        "security": {
            "listeners": {"internal": {"protocol": "SASL_PLAINTEXT"}},
            "sasl": {
                "enabledMechanisms": ["PLAIN", "SCRAM-SHA-512"],
                "interBroker": {"existingSecret": BROKER_USER},
                "admin": {
                    "mechanism": "PLAIN", "username": "ops", "existingSecret": TOPICS_USER,
                    "passwordKey": "pw",
                },
            },
        },
        "topics": [{"name": "events"}],
    },
    # Only clients from outside log in; inside, everything stays as it was.
    "external-only": {
        "security": {
            "tls": {"existingSecret": KAFKA_TLS},
            "listeners": {"external": {"protocol": "SASL_SSL"}},
        },
        "broker": {
            "external": {"enabled": True, "nodePorts": [31090, 31091, 31092]},
        },
    },
}  # fmt: skip


@cache
def _rendered(name: str, kube_version: str) -> str:
    return json.dumps(template(SCENARIOS[name], kube_version))


def _scenario(name: str, kube_version: str = NEWEST_KUBERNETES) -> list[Manifest]:
    manifests: list[Manifest] = json.loads(_rendered(name, kube_version))
    return manifests


def _security(name: str) -> dict[str, Any]:
    values: dict[str, Any] = SCENARIOS[name].get("security", {})
    return values


def _pod_spec(manifests: list[Manifest], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(manifests, kind, name)["spec"]["template"]["spec"]
    return spec


def _container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in spec["containers"] if c["name"] == name]
    assert len(found) == 1, f"{len(found)} containers named {name}"
    return found[0]


def _host(kind: str, ordinal: int) -> str:
    return f"{component(kind)}-{ordinal}.{component(kind)}-headless.{DOMAIN}"


BOOTSTRAP = f"{component('broker')}.{DOMAIN}"


def _local(env: dict[str, str], mounts: dict[str, Path]) -> dict[str, str]:
    """The environment with the container's mount paths turned into the test's directories
    (in one pass: a local directory may itself start with a mount path, /tmp)."""
    paths = sorted(mounts, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(p.rstrip("/") + "/") for p in paths))
    return {
        name: pattern.sub(lambda m: f"{mounts[m.group(0).rstrip('/')]}/", value)
        for name, value in env.items()
    }


def _within_read_only_mount(path: Path | None, container: dict[str, Any]) -> str:
    """The name of the read-only volume `path` lies in (the test fails if none)."""
    assert path is not None
    for mount in container["volumeMounts"]:
        if str(path).startswith(mount["mountPath"].rstrip("/") + "/"):
            assert mount.get("readOnly") is True, mount
            assert "subPath" not in mount, mount
            name: str = mount["name"]
            return name
    raise AssertionError(f"{path} is in no mount of {container['name']}")


def _secret_of(spec: dict[str, Any], volume: str) -> str:
    [found] = [v for v in spec["volumes"] if v["name"] == volume]
    name: str = found["secret"]["secretName"]
    return name


# Certificates, as README.md's "Security" tells to issue them -------------------------------


@cache
def _ca() -> CertificateAuthority:
    return CertificateAuthority.create("directlog-test-ca")


@cache
def _certificate(secret: str) -> Certificate:
    def headless(kind: str) -> str:
        return f"*.{component(kind)}-headless.{DOMAIN}"

    common_name, hosts = {
        KAFKA_TLS: ("directlog-broker", [headless("broker"), BOOTSTRAP, *EXTERNAL_HOSTS]),
        BROKER_LINK: ("directlog-broker", [headless("broker")]),
        CONTROLLER_LINK: ("directlog-controller", [headless("controller")]),
        CONSENSUS_LINK: ("directlog-consensus", [headless("consensus")]),
    }[secret]
    return _ca().issue(common_name, hosts=hosts, organization="directlog")


def _write_secret(directory: Path, files: dict[str, bytes], generation: int = 0) -> None:
    """A Secret volume as the kubelet writes it: the files in a timestamped directory,
    `..data` pointing at it, each key a symlink through `..data`; a new generation swaps
    `..data` in one rename, as an update of the Secret does."""
    target = directory / f"..2030_01_01_00_00_0{generation}.000000000"
    target.mkdir(parents=True)
    for key, data in files.items():
        (target / key).write_bytes(data)
        stamp = 1_900_000_000 + generation  # a later write, whatever the clock's resolution
        os.utime(target / key, (stamp, stamp))
    (directory / "..data_tmp").symlink_to(target.name)
    (directory / "..data_tmp").rename(directory / "..data")
    for key in files:
        if not (directory / key).is_symlink():
            (directory / key).symlink_to(f"..data/{key}")


def _tls_secret(secret: str) -> dict[str, bytes]:
    certificate = _certificate(secret)
    return {
        "tls.crt": certificate.cert_pem(),
        "tls.key": certificate.key_pem(),
        "ca.crt": _ca().cert_pem(),
    }


def _run(
    spec: dict[str, Any],
    container: str,
    pod: str,
    workdir: Path,
    programs: list[str],
    files: dict[str, str] | None = None,
) -> Exec:
    """The container's command run as a kubelet would start it (its one exec), with every
    TLS Secret it mounts written, as the README's certificates, where the run mapped it."""
    facts = PodFacts(pod, NAMESPACE, secrets=dict(SECRET_VALUES))
    [call] = run_container(_container(spec, container), facts, workdir, programs, files)
    volumes = {m["mountPath"]: m["name"] for m in _container(spec, container)["volumeMounts"]}
    for mount_path, local in call.mounts.items():
        if volumes[mount_path] in ("kafka-tls", "link-tls"):
            _write_secret(local, _tls_secret(_secret_of(spec, volumes[mount_path])))
    return call


async def _handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, hostname: str
) -> tuple[str | None, str | None]:
    """A TLS handshake between the two contexts through the brokers' own TlsChannel, over a
    socket pair; the subjects each side saw of the other (RFC 4514)."""
    left, right = socket.socketpair()
    for sock in (left, right):
        sock.setblocking(False)
    try:
        server_end = TlsChannel(left, server, server_side=True)
        client_end = TlsChannel(right, client, server_side=False, server_hostname=hostname)
        await asyncio.wait_for(
            asyncio.gather(server_end.handshake(), client_end.handshake()), HANDSHAKE_TIMEOUT
        )
        return server_end.peer_subject(), client_end.peer_subject()
    finally:
        left.close()
        right.close()


def _shake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> tuple[Any, Any]:
    return asyncio.run(_handshake(server, client, hostname))


# Every object valid, the chart lints -----------------------------------------------------


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, NEWEST_KUBERNETES])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_object_is_valid(name: str, version: str) -> None:
    failures = []
    for manifest in _scenario(name, version):
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            failures.append(f"{manifest['kind']}/{manifest['metadata']['name']}: {error}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_lint_strict(name: str) -> None:
    run_helm("lint", "--strict", str(CHART), values=SCENARIOS[name])


# Brokers ---------------------------------------------------------------------------------


def _run_broker(name: str, ordinal: int, workdir: Path) -> tuple[Exec, dict[str, Any]]:
    spec = _pod_spec(_scenario(name), "StatefulSet", component("broker"))
    pod = f"{component('broker')}-{ordinal}"
    call = _run(spec, "broker", pod, workdir, ["directlog-broker"])
    assert call.argv == ["directlog-broker"]
    return call, spec


def _listener(settings: BrokerSettings, name: str) -> ListenerSettings:
    [found] = [x for x in settings.listeners if x.name == name]
    return found


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_broker_listeners_and_security_settings(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    security = _security(name)
    given = security.get("listeners", {})
    pod_ip = SCENARIOS[name].get("listenAddress") == "podIP"
    for ordinal in range(3):
        call, spec = _run_broker(name, ordinal, tmp_path / str(ordinal))
        assert unknown_variables(call.env, "DIRECTLOG_", BrokerSettings) == set()
        settings: BrokerSettings = settings_from_env(monkeypatch, BrokerSettings, call.env)
        broker = _container(spec, "broker")
        listen = "10.244.1.5" if pod_ip else "0.0.0.0"
        own = _host("broker", ordinal)
        internal = _listener(settings, "INTERNAL")
        assert internal.protocol == given.get("internal", {}).get("protocol", "PLAINTEXT")
        assert (internal.host, internal.port, internal.advertised_host) == (listen, 9092, own)
        names = [x.name for x in settings.listeners]
        if "EXTERNAL" in names:
            external = _listener(settings, "EXTERNAL")
            assert external.protocol == given["external"]["protocol"]
            assert external.ssl_client_auth == (given["external"].get("sslClientAuth") or None)
        inter_broker = given.get("interBroker", {})
        if inter_broker.get("enabled"):
            replication = _listener(settings, "REPLICATION")
            assert settings.inter_broker() == "REPLICATION"
            assert replication.protocol == inter_broker["protocol"]
            assert (replication.host, replication.port) == (listen, 9091)
            assert (replication.advertised_host, replication.advertised_port) == (own, 9091)
            assert settings.sasl_mechanisms(replication) == inter_broker["saslMechanisms"]
            assert "replication" in {p["name"] for p in broker["ports"]}
        else:
            assert settings.inter_broker() == "INTERNAL"
        # The brokers' own certificate, from the whole Secret mounted read-only.
        if any(x.uses_ssl for x in settings.listeners):
            assert settings.ssl is not None
            for path in settings.ssl.paths():
                assert _secret_of(spec, _within_read_only_mount(path, broker)) == KAFKA_TLS
            assert settings.ssl_client_auth == security["tls"].get("clientAuth", "none")
        else:
            assert settings.ssl is None
            assert "kafka-tls" not in {v["name"] for v in spec["volumes"]}
        # Brokers log in to each other with the password from its Secret.
        if next(x for x in settings.listeners if x.name == settings.inter_broker()).uses_sasl:
            assert settings.inter_broker_sasl_username == "broker"
            assert settings.inter_broker_sasl_password is not None
            assert settings.inter_broker_sasl_password.get_secret_value() == BROKER_PASSWORD
        else:
            assert settings.inter_broker_sasl_password is None
        authorization = security.get("authorization", {})
        assert settings.authorizer_enabled is authorization.get("enabled", False)
        if settings.authorizer_enabled:
            # Replication keeps working: the brokers' user on a SASL inter-broker listener
            # is a super user.
            expected = set(authorization["superUsers"])
            if settings.inter_broker_sasl_username:
                expected.add("User:broker")
            assert set(settings.super_users) == expected
        else:
            assert settings.super_users == []


def test_lag_metrics_and_replicas_log_in_on_the_inter_broker_listener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The brokers' replica fetchers and lag metrics (kafka_exporter.LeaderEndOffsets) use
    inter_broker_security: TLS with the mounted CA and the SCRAM login of the Secret."""
    call, _ = _run_broker("secured", 0, tmp_path)
    env = _local(call.env, call.mounts)
    settings: BrokerSettings = settings_from_env(monkeypatch, BrokerSettings, env)
    client = inter_broker_security(settings)
    assert client is not None and client.tls is not None and client.sasl is not None
    assert (client.sasl.mechanism, client.sasl.username) == ("SCRAM-SHA-512", "broker")
    assert client.sasl.password == BROKER_PASSWORD
    replication = listener_security(settings, _listener(settings, "REPLICATION"))
    assert replication.tls is not None
    _shake(replication.tls.current(), client.tls, _host("broker", 2))


def test_kafka_certificate_serves_every_name_clients_dial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the README's certificate in the Secret, each TLS listener's context loads and
    completes handshakes for the bootstrap Service, every broker's advertised name and the
    EXTERNAL hosts; EXTERNAL requires a client certificate, INTERNAL does not."""
    call, _ = _run_broker("secured", 0, tmp_path)
    env = _local(call.env, call.mounts)
    settings: BrokerSettings = settings_from_env(monkeypatch, BrokerSettings, env)
    assert settings.ssl is not None
    ca_only = client_context(TlsFiles(ca_file=settings.ssl.ca_file))
    internal = listener_security(settings, _listener(settings, "INTERNAL"))
    external = listener_security(settings, _listener(settings, "EXTERNAL"))
    assert internal.tls is not None and external.tls is not None
    assert internal.sasl_mechanisms == ("SCRAM-SHA-256", "SCRAM-SHA-512")
    for host in [BOOTSTRAP, *(_host("broker", i) for i in range(3))]:
        assert _shake(internal.tls.current(), ca_only, host) == (None, BROKER_SUBJECT)
    with pytest.raises(TlsHandshakeError):  # a name the certificate does not carry
        _shake(internal.tls.current(), ca_only, f"{component('broker')}-0.elsewhere.{DOMAIN}")
    with pytest.raises(TlsHandshakeError):  # no client certificate: refused
        _shake(external.tls.current(), ca_only, EXTERNAL_HOSTS[1])
    alice = _ca().issue("alice", organization="acme")
    (tmp_path / "alice.pem").write_bytes(alice.cert_pem())
    (tmp_path / "alice.key").write_bytes(alice.key_pem())
    client = client_context(
        TlsFiles(
            cert_file=tmp_path / "alice.pem",
            key_file=tmp_path / "alice.key",
            ca_file=settings.ssl.ca_file,
        )
    )
    assert _shake(external.tls.current(), client, EXTERNAL_HOSTS[1])[0] == "CN=alice,O=acme"


def test_brokers_replicate_as_their_certificate_subject(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SSL between brokers, client certificates required: the broker presents its own
    certificate, whose subject is the super user the values name."""
    call, _ = _run_broker("mtls", 0, tmp_path)
    env = _local(call.env, call.mounts)
    settings: BrokerSettings = settings_from_env(monkeypatch, BrokerSettings, env)
    assert settings.inter_broker() == "INTERNAL"
    client = inter_broker_security(settings)
    assert client is not None and client.tls is not None and client.sasl is None
    internal = listener_security(settings, _listener(settings, "INTERNAL"))
    assert internal.tls is not None
    subject, _ = _shake(internal.tls.current(), client.tls, _host("broker", 1))
    assert f"User:{subject}" in settings.super_users


def test_renewed_secret_reaches_the_listener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The brokers read the Secret's own names, symlinks through ..data: when the kubelet
    swaps ..data for a renewed Secret, the listener serves the new certificate to new
    connections (a subPath mount would have kept the old file)."""
    call, _ = _run_broker("secured", 0, tmp_path)
    env = _local(call.env, call.mounts)
    settings: BrokerSettings = settings_from_env(monkeypatch, BrokerSettings, env)
    files = settings.ssl
    assert files is not None and files.cert_file is not None
    now = [0.0]
    context = ReloadingContext(
        files,
        lambda: server_context(files, settings.ssl_client_auth),
        settings.ssl_files_check_interval_ms / 1000,
        clock=lambda: now[0],
    )
    ca_only = client_context(TlsFiles(ca_file=files.ca_file))
    assert _shake(context.current(), ca_only, BOOTSTRAP)[1] == BROKER_SUBJECT
    renewed = _ca().issue("directlog-broker", hosts=[BOOTSTRAP], organization="renewed")
    _write_secret(
        call.mounts[f"{SECRETS_DIR}/kafka-tls"],
        {"tls.crt": renewed.cert_pem(), "tls.key": renewed.key_pem(), "ca.crt": _ca().cert_pem()},
        generation=1,
    )
    # Files are checked at most every interval; then new connections get the renewal.
    assert _shake(context.current(), ca_only, BOOTSTRAP)[1] == BROKER_SUBJECT
    now[0] += settings.ssl_files_check_interval_ms / 1000
    assert _shake(context.current(), ca_only, BOOTSTRAP)[1] == "CN=directlog-broker,O=renewed"
    assert context.reloads == 1


# Service links: controllers, tiering sidecar, consensus ------------------------------------


def _run_controller(name: str, ordinal: int, workdir: Path) -> tuple[Exec, dict[str, Any]]:
    spec = _pod_spec(_scenario(name), "StatefulSet", component("controller"))
    pod = f"{component('controller')}-{ordinal}"
    call = _run(spec, "controller", pod, workdir, ["directlog-controller"])
    assert call.argv == ["directlog-controller", "--id", str(ordinal)]
    return call, spec


def _run_member(name: str, ordinal: int, workdir: Path) -> tuple[Exec, dict[str, Any], Path]:
    manifests = _scenario(name)
    spec = _pod_spec(manifests, "StatefulSet", component("consensus"))
    data = one(manifests, "ConfigMap", component("consensus"))["data"]["consensus.yaml"]
    pod = f"{component('consensus')}-{ordinal}"
    call = _run(
        spec,
        "consensus",
        pod,
        workdir,
        ["directlog-consensus"],
        {"/etc/directlog/consensus.yaml": data},
    )
    return call, spec, Path(call.argv[call.argv.index("--config") + 1])


def test_controller_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for ordinal in range(2):
        call, spec = _run_controller("secured", ordinal, tmp_path / str(ordinal))
        assert unknown_variables(call.env, "DIRECTLOG_CONTROLLER_", ControllerSettings) == set()
        assert "CONSENSUS_AUTH_PASSWORD" not in call.env  # only in the settings variable
        settings: ControllerSettings = settings_from_env(
            monkeypatch, ControllerSettings, call.env, controller_id=ordinal
        )
        controller = _container(spec, "controller")
        # Digest credentials from the Secret, whatever characters the password holds.
        auth = settings.consensus_auth
        assert auth is not None
        assert (auth.scheme, auth.username) == ("digest", "controller")
        assert auth.password.get_secret_value() == CONSENSUS_PASSWORD
        # Mutual TLS: the gRPC server's and the ensemble client's files, one Secret.
        assert settings.grpc_tls is not None and settings.consensus_tls is not None
        for path in [*settings.grpc_tls.paths(), *settings.consensus_tls.paths()]:
            volume = _within_read_only_mount(path, controller)
            assert _secret_of(spec, volume) == CONTROLLER_LINK
        # The ensemble on its TLS client port only.
        assert settings.consensus.split(",") == [f"{_host('consensus', i)}:2281" for i in range(3)]
        # The first SCRAM users, from their Secret.
        users = settings.scram_bootstrap_file
        assert users is not None and users.name == "users"
        assert _secret_of(spec, _within_read_only_mount(users, controller)) == SCRAM_USERS


def test_controller_without_consensus_auth_runs_as_before() -> None:
    spec = _pod_spec(_scenario("mtls"), "StatefulSet", component("controller"))
    controller = _container(spec, "controller")
    assert controller["command"] == [
        "/bin/sh", "-c", 'exec directlog-controller --id "${POD_NAME##*-}"',
    ]  # fmt: skip
    names = {e["name"] for e in controller["env"]}
    assert not {n for n in names if "TLS" in n or "AUTH" in n or "SCRAM" in n}
    assert [v["name"] for v in spec["volumes"]] == ["tmp"]


def test_consensus_members_serve_tls_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for ordinal in range(3):
        _, spec, config = _run_member("secured", ordinal, tmp_path / str(ordinal))
        member = _container(spec, "consensus")
        for name in list(os.environ):
            if name.startswith("DIRECTLOG_"):
                monkeypatch.delenv(name)
        settings = ConsensusSettings.load(config)
        for member_id, addresses in settings.members.items():
            host = "0.0.0.0" if member_id == ordinal + 1 else _host("consensus", member_id - 1)
            assert addresses.client is None  # no plaintext client port
            assert addresses.secure_client is not None
            assert parse_address(addresses.secure_client) == (host, 2281)
            assert parse_address(addresses.peer) == (host, 2888)
        assert settings.ssl_client_auth == "need"
        assert settings.client_tls is not None and settings.quorum_tls is not None
        for path in [*settings.client_tls.paths(), *settings.quorum_tls.paths()]:
            volume = _within_read_only_mount(path, member)
            assert _secret_of(spec, volume) == CONSENSUS_LINK
        assert {p["name"]: p["containerPort"] for p in member["ports"]} == {
            "client-tls": 2281, "peer": 2888, "metrics": 7181,
        }  # fmt: skip


def test_tiering_sidecar_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _pod_spec(_scenario("secured"), "StatefulSet", component("broker"))
    call = _run(spec, "tiering", f"{component('broker')}-2", tmp_path, ["directlog-tiering"])
    assert unknown_variables(call.env, "DIRECTLOG_TIERING_", TieringSettings) == set()
    settings: TieringSettings = settings_from_env(monkeypatch, TieringSettings, call.env)
    assert settings.broker == "127.0.0.1:9393"
    assert settings.broker_tls_server_name == _host("broker", 2)
    assert settings.broker_tls is not None
    sidecar = _container(spec, "tiering")
    for path in settings.broker_tls.paths():
        assert _secret_of(spec, _within_read_only_mount(path, sidecar)) == BROKER_LINK


def test_service_link_certificates_serve_the_names_dialed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's certificates, in the rendered mounts: brokers reach every controller
    and their sidecars reach them, controllers reach every member, members reach each
    other, all with client certificates required; the gRPC servers' files load."""
    broker_call, broker_spec = _run_broker("secured", 2, tmp_path / "broker")
    broker: BrokerSettings = settings_from_env(
        monkeypatch, BrokerSettings, _local(broker_call.env, broker_call.mounts)
    )
    sidecar_call = _run(
        broker_spec, "tiering", f"{component('broker')}-2", tmp_path / "tiering",
        ["directlog-tiering"],
    )  # fmt: skip
    sidecar: TieringSettings = settings_from_env(
        monkeypatch, TieringSettings, _local(sidecar_call.env, sidecar_call.mounts)
    )
    controller_call, _ = _run_controller("secured", 0, tmp_path / "controller")
    controller: ControllerSettings = settings_from_env(
        monkeypatch, ControllerSettings, _local(controller_call.env, controller_call.mounts)
    )
    member_call, _, config = _run_member("secured", 0, tmp_path / "member")
    local_config = tmp_path / "member.yaml"
    local_config.write_text(
        _local({"c": config.read_text()}, member_call.mounts)["c"], encoding="utf-8"
    )
    for name in list(os.environ):
        if name.startswith("DIRECTLOG_"):
            monkeypatch.delenv(name)
    member = ConsensusSettings.load(local_config)

    assert broker.controller_tls and broker.tiering_tls and sidecar.broker_tls
    assert controller.grpc_tls and controller.consensus_tls
    assert member.client_tls and member.quorum_tls
    grpc_tls.server_credentials(controller.grpc_tls)  # the files load as gRPC takes them
    grpc_tls.server_credentials(broker.tiering_tls)
    links = [
        # (server's files, client's files, the host the client dials)
        (controller.grpc_tls, broker.controller_tls, address)
        for address in (a.rpartition(":")[0] for a in broker.controllers)
    ]
    links.append((broker.tiering_tls, sidecar.broker_tls, sidecar.broker_tls_server_name or ""))
    links += [
        (member.client_tls, controller.consensus_tls, address.rpartition(":")[0])
        for address in controller.consensus.split(",")
    ]
    peer = member.members[2].peer.rpartition(":")[0]
    links.append((member.quorum_tls, member.quorum_tls, peer))
    # A member accepting a link checks that the dialer's certificate names the address it
    # has for the member the dialer says it is (docs/consensus.md, "ZAB over mutual TLS").
    for other in (2, 3):
        host = member.members[other].peer.rpartition(":")[0]
        assert names_host(_certificate(CONSENSUS_LINK).cert, host), host
    for server, client, host in links:
        subject, _ = _shake(server_context(server, "required"), client_context(client), host)
        assert subject is not None and subject.startswith("CN=")


# Mounts ------------------------------------------------------------------------------------


def _secret_mounts(manifests: list[Manifest]) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(workload, mount, Secret name) of every Secret volume mount."""
    for workload in manifests:
        if workload["kind"] not in ("StatefulSet", "Job"):
            continue
        spec = workload["spec"]["template"]["spec"]
        secrets = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
        mounted = set()
        for container in spec["containers"] + spec.get("initContainers", []):
            for mount in container.get("volumeMounts", []):
                if mount["name"] in secrets:
                    mounted.add(mount["name"])
                    yield (
                        f"{workload['metadata']['name']}/{container['name']}",
                        mount,
                        secrets[mount["name"]]["secretName"],
                    )
        assert mounted == set(secrets), f"{workload['metadata']['name']}: unmounted Secrets"


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_secrets_are_mounted_whole_and_read_only(name: str) -> None:
    expected: set[str] = set()
    security = _security(name)
    if security.get("tls", {}).get("existingSecret"):
        expected.add(KAFKA_TLS)
    if security.get("serviceLinks", {}).get("enabled"):
        expected |= {BROKER_LINK, CONTROLLER_LINK, CONSENSUS_LINK}
    if security.get("sasl", {}).get("bootstrapUsers", {}).get("existingSecret"):
        expected.add(SCRAM_USERS)
    found = set()
    for where, mount, secret in _secret_mounts(_scenario(name)):
        assert mount.get("readOnly") is True, where
        assert "subPath" not in mount and "subPathExpr" not in mount, where
        assert mount["mountPath"].startswith(SECRETS_DIR + "/"), where
        found.add(secret)
    assert found == expected


# The chart's admin clients -----------------------------------------------------------------

# Runs what a container execs (ARGV, JSON: `directlog ARGS`, the images' console script, or
# `python3 -m MODULE ARGS`) with kafka-python's KafkaAdminClient connecting through a client
# that records the configuration the admin client was given and refuses to connect.
RECORDING_RUN = """
import json, os, runpy, sys
from importlib import metadata
import kafka, kafka.errors

def recording_client(**config):
    with open(os.environ["SEEN"], "w", encoding="utf-8") as out:
        json.dump({k: v for k, v in config.items() if isinstance(v, (str, int, list))}, out)
    raise kafka.errors.KafkaError("recorded, not connected")

kafka.KafkaAdminClient.DEFAULT_CONFIG["kafka_client"] = recording_client
argv = json.loads(os.environ["ARGV"])
if argv[0] == "python3":
    assert argv[1] == "-m", argv
    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
else:
    [script] = metadata.entry_points(group="console_scripts", name=argv[0])
    sys.argv = argv
    sys.exit(script.load()())
"""


def _admin_run(
    argv: list[str], env: dict[str, str], tmp_path: Path
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """What KafkaAdminClient was configured with when `argv` ran with this environment and
    nothing else (the container's), and the run, which then fails: nothing to connect to."""
    seen = tmp_path / "seen.json"
    done = subprocess.run(
        [sys.executable, "-c", RECORDING_RUN],
        env={
            **env,
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "SEEN": str(seen),
            "ARGV": json.dumps(argv),
        },
        capture_output=True,
        text=True,
        timeout=ADMIN_TIMEOUT,
    )
    assert seen.exists(), f"{argv} constructed no KafkaAdminClient: {done.stderr}"
    config: dict[str, Any] = json.loads(seen.read_text(encoding="utf-8"))
    return config, done


def _check_login(
    name: str,
    config: dict[str, Any],
    spec: dict[str, Any],
    container: dict[str, Any],
    login: tuple[str, str, str] | None,
    certificate: bool,
) -> None:
    """The admin client's settings are INTERNAL's, with its login, and its files are the
    mounted Secret's."""
    protocol = _security(name)["listeners"]["internal"]["protocol"]
    assert config["security_protocol"] == protocol
    if login is not None:
        assert login[0] in _security(name)["sasl"]["enabledMechanisms"]  # INTERNAL offers it
        assert (
            config["sasl_mechanism"],
            config["sasl_plain_username"],
            config["sasl_plain_password"],
        ) == login
    else:
        assert config.get("sasl_mechanism") is None
    keys = ["ssl_cafile", *(["ssl_certfile", "ssl_keyfile"] if certificate else [])]
    for key in keys if "SSL" in protocol else []:
        path = Path(config[key])
        assert _secret_of(spec, _within_read_only_mount(path, container)) == KAFKA_TLS
    if not certificate:
        assert config.get("ssl_certfile") is None


LOGINS = [
    ("secured", ("SCRAM-SHA-512", "broker", BROKER_PASSWORD), False),  # the brokers' user
    ("sasl-plaintext", ("PLAIN", "ops", TOPICS_PASSWORD), False),  # security.sasl.admin
    ("mtls", None, True),  # the brokers' certificate
]


def test_directlog_is_the_admin_cli() -> None:
    """`directlog` in the images is this package's console script: the recording run
    starts it the same way."""
    [script] = metadata.entry_points(group="console_scripts", name="directlog")
    assert script.value == "directlog.admin.cli:main"


@pytest.mark.parametrize(("name", "login", "certificate"), LOGINS)
def test_topics_job_logs_in(
    name: str, login: tuple[str, str, str] | None, certificate: bool, tmp_path: Path
) -> None:
    """The Job's command, run as the kubelet would, runs `directlog` itself, which gives
    kafka-python's admin client INTERNAL's settings from the Job's DIRECTLOG_CLIENT_*."""
    spec = _pod_spec(_scenario(name), "Job", component("topics"))
    job = _container(spec, "topics")
    facts = PodFacts("topics-abcde", NAMESPACE, secrets=dict(SECRET_VALUES))
    [call] = run_container(job, facts, tmp_path / "run", ["directlog"])
    assert call.argv[:6] == [
        "directlog", "--bootstrap-server", f"{BOOTSTRAP}:9092",
        "topics", "create", SCENARIOS[name]["topics"][0]["name"],
    ]  # fmt: skip
    config, done = _admin_run(call.argv, call.env, tmp_path)
    assert done.returncode == 1, done.stderr  # the CLI's error exit
    assert "directlog: error: cannot reach the cluster" in done.stderr, done.stderr
    assert config["bootstrap_servers"] == [f"{BOOTSTRAP}:9092"]
    assert config["client_id"] == "directlog-admin"
    _check_login(name, config, spec, job, login, certificate)
    tls = "SSL" in _security(name)["listeners"]["internal"]["protocol"]
    assert [v["name"] for v in spec["volumes"]] == ["tmp", *(["kafka-tls"] if tls else [])]
    for volume in (v for v in spec["volumes"] if v["name"] == "kafka-tls" and not certificate):
        # the CA only: the brokers' key stays out of the Job
        assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]


def _broker_pod(name: str, ordinal: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The broker pod's spec, its broker container, and that container's environment as
    the kubelet gives it to `kubectl exec` and to the preStop hook."""
    spec = _pod_spec(_scenario(name), "StatefulSet", component("broker"))
    broker = _container(spec, "broker")
    facts = PodFacts(f"{component('broker')}-{ordinal}", NAMESPACE, secrets=dict(SECRET_VALUES))
    return spec, broker, container_env(broker, facts)


@pytest.mark.parametrize(("name", "login", "certificate"), LOGINS)
def test_admin_cli_in_a_broker_logs_in(
    name: str, login: tuple[str, str, str] | None, certificate: bool, tmp_path: Path
) -> None:
    """`kubectl exec <broker> -- directlog topics list`, no wrapper: the CLI reaches its own
    broker by the name its certificate carries, with INTERNAL's settings."""
    spec, broker, env = _broker_pod(name, 1)
    own = f"{_host('broker', 1)}:9092"
    assert env["DIRECTLOG_BOOTSTRAP_SERVERS"] == own
    config, done = _admin_run(["directlog", "topics", "list"], env, tmp_path)
    assert done.returncode == 1, done.stderr
    assert f"directlog: error: cannot reach the cluster at {own}" in done.stderr, done.stderr
    assert config["bootstrap_servers"] == [own]
    assert config["client_id"] == "directlog-admin"
    _check_login(name, config, spec, broker, login, certificate)


@pytest.mark.parametrize(("name", "login", "certificate"), LOGINS)
def test_drain_hook_logs_in(
    name: str, login: tuple[str, str, str] | None, certificate: bool, tmp_path: Path
) -> None:
    """The preStop hook, run as the kubelet runs it in a broker scaled away (the test API
    server's StatefulSet has 1 replica, this is broker 1): its drain's admin session
    reaches the broker's own name with INTERNAL's settings."""
    spec, broker, env = _broker_pod(name, 1)
    hook = broker["lifecycle"]["preStop"]["exec"]["command"]
    assert hook == ["python3", "-m", "directlog.kube.scale_down", "--timeout", "300"]
    own = f"{_host('broker', 1)}:9092"
    with FakeApiServer(tmp_path / "api") as api:
        api.put_statefulset(NAMESPACE, component("broker"), replicas=1)
        # The token volume's files, and the broker's log, where the run maps them.
        account = api.write_service_account(tmp_path / "serviceaccount", NAMESPACE)
        mapped = ["--service-account-dir", str(account), "--log-file", str(tmp_path / "log")]
        config, done = _admin_run([*hook, *mapped], {**env, **api.environment()}, tmp_path)
        path = statefulset_path(NAMESPACE, component("broker"))
        assert api.requests == [(path, f"Bearer {api.token}")]
    assert done.returncode == scale_down.EXIT_NOT_DRAINED, done.stderr
    assert "broker 1 is leaving (StatefulSet directlog-broker scaled to 1)" in done.stderr
    assert f"drain of broker 1 failed: cannot reach the cluster at {own}" in done.stderr
    assert config["bootstrap_servers"] == [own]
    assert config["client_id"] == "directlog-admin"
    _check_login(name, config, spec, broker, login, certificate)


@pytest.mark.parametrize("name", [name for name, _, _ in LOGINS])
def test_client_variables_leave_the_broker_alone(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker container's DIRECTLOG_CLIENT_* (for the CLI and the hook) share the
    brokers' DIRECTLOG_ prefix: its settings ignore them, and are what they are without."""
    call, _ = _run_broker(name, 0, tmp_path)
    client = {n for n in call.env if n.startswith(CLIENT_PREFIX)}
    assert "DIRECTLOG_CLIENT_SECURITY_PROTOCOL" in client
    given: BrokerSettings = settings_from_env(monkeypatch, BrokerSettings, call.env)
    without = {n: v for n, v in call.env.items() if n not in client}
    assert given == settings_from_env(monkeypatch, BrokerSettings, without)


def test_admin_clients_unchanged_without_security() -> None:
    values = {"topics": [{"name": "orders"}]}
    manifests = template(values)
    job = _container(_pod_spec(manifests, "Job", component("topics")), "topics")
    assert "python3" not in job["command"][-1]
    assert [e["name"] for e in job["env"]] == ["BOOTSTRAP"]
    broker = _container(_pod_spec(manifests, "StatefulSet", component("broker")), "broker")
    hook = broker["lifecycle"]["preStop"]["exec"]["command"]
    assert hook == ["python3", "-m", "directlog.kube.scale_down", "--timeout", "300"]
    assert not [e for e in broker["env"] if e["name"].startswith(CLIENT_PREFIX)]
    external_only = _container(
        _pod_spec(template({**SCENARIOS["external-only"], **values}), "Job", component("topics")),
        "topics",
    )
    assert external_only == job  # INTERNAL is PLAINTEXT there


# NetworkPolicies, Services, notes ----------------------------------------------------------


def _ingress_ports(policy: Manifest) -> dict[int, list[Any]]:
    """Each port the policy opens, with the `from` of every rule that opens it (None: any)."""
    opened: dict[int, list[Any]] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule.get("ports", []):
            opened.setdefault(port["port"], []).append(rule.get("from"))
    return opened


def _components(peers: list[Any] | None) -> set[str]:
    assert peers is not None
    return {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in peers}


def test_network_policies_follow_the_secured_ports() -> None:
    manifests = _scenario("secured")
    consensus = _ingress_ports(one(manifests, "NetworkPolicy", component("consensus")))
    assert 2181 not in consensus  # TLS only
    assert [_components(p) for p in consensus[2281]] == [
        {"broker", "controller"},
        {"consensus"},
    ]
    broker = _ingress_ports(one(manifests, "NetworkPolicy", component("broker")))
    assert broker[9092] == [None] and broker[9094] == [None]  # clients: anyone
    assert [_components(p) for p in broker[9091]] == [{"broker"}]  # replication: brokers
    headless = one(manifests, "Service", f"{component('broker')}-headless")
    assert {"name": "replication", "port": 9091, "targetPort": "replication"} in headless["spec"][
        "ports"
    ]
    for service in (f"{component('consensus')}-headless", component("consensus")):
        ports = one(manifests, "Service", service)["spec"]["ports"]
        assert {"name": "client-tls", "port": 2281, "targetPort": "client-tls"} in ports
        assert 2181 not in {p["port"] for p in ports}


def _notes(values: dict[str, Any]) -> str:
    out = run_helm(
        "install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE, values=values
    )
    return out.split("NOTES:")[1]


def test_notes_tell_clients_how_to_connect() -> None:
    notes = _notes(SCENARIOS["secured"])
    for line in (
        f"bootstrap.servers={BOOTSTRAP}:9092",
        "security.protocol=SASL_SSL",
        "sasl.mechanism=SCRAM-SHA-512",
        "ssl.ca.location=ca.crt",
        f"kubectl -n {NAMESPACE} get secret {KAFKA_TLS} -o jsonpath='{{.data.ca\\.crt}}'",
        "listener REPLICATION: SASL_SSL, client certificates none, SASL SCRAM-SHA-512 "
        "(inter-broker)",
        "listener EXTERNAL: SSL, client certificates required",
        "super users: User:admin, User:broker",
        f"(ZooKeeper protocol, TLS) {component('consensus')}:2281",
    ):
        assert line in notes, notes
    # The exec example logs in, as the brokers' user, with the image's own `directlog`.
    [exec_line] = [line for line in notes.splitlines() if "topics create demo" in line]
    assert exec_line.split()[0] == "directlog"
    assert "(its DIRECTLOG_CLIENT_* variables), as broker:" in notes
    assert "  directlog --command-config client.properties topics list" in notes
    assert "NOTE:" not in notes.split("Security:")[1].split("From outside")[0]


def test_notes_warn_of_anonymous_clients_under_the_authorizer() -> None:
    values = {"security": {"authorization": {"enabled": True, "superUsers": ["User:ANONYMOUS"]}}}
    notes = _notes(values)
    assert "NOTE: INTERNAL is PLAINTEXT: its clients are User:ANONYMOUS" in notes, notes
    assert "replication needs it a super user" in notes


# Refused values ----------------------------------------------------------------------------

BAD_VALUES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("unknown protocol", {"security": {"listeners": {"internal": {"protocol": "TLS"}}}},
     ["/security/listeners/internal/protocol", "SASL_SSL"]),
    ("lower-case protocol", {"security": {"listeners": {"external": {"protocol": "sasl_ssl"}}}},
     ["/security/listeners/external/protocol"]),
    ("unknown mechanism", {"security": {"sasl": {"enabledMechanisms": ["GSSAPI"]}}},
     ["/security/sasl/enabledMechanisms/0"]),
    ("no mechanism", {"security": {"sasl": {"enabledMechanisms": []}}},
     ["/security/sasl/enabledMechanisms"]),
    ("ZooKeeper's client auth", {"security": {"tls": {"clientAuth": "need"}}},
     ["/security/tls/clientAuth"]),
    ("listener client auth",
     {"security": {"listeners": {"interBroker": {"sslClientAuth": "want"}}}},
     ["/security/listeners/interBroker/sslClientAuth"]),
    ("unknown security key", {"security": {"acls": []}}, ["/security", "acls"]),
    ("unknown tls key", {"security": {"tls": {"secretName": "x"}}},
     ["/security/tls", "secretName"]),
    ("principal without a type", {"security": {"authorization": {"superUsers": ["admin"]}}},
     ["/security/authorization/superUsers/0"]),
    ("links without Secrets", {"security": {"serviceLinks": {"enabled": True}}},
     ["/security/serviceLinks/broker/existingSecret",
      "/security/serviceLinks/consensus/existingSecret"]),
    ("consensus auth without a Secret", {"security": {"consensusAuth": {"enabled": True}}},
     ["/security/consensusAuth/existingSecret"]),
    ("digest user with a colon",
     {"security": {"consensusAuth": {"username": "a:b"}}}, ["/security/consensusAuth/username"]),
    ("admin mechanism", {"security": {"sasl": {"admin": {"mechanism": "OAUTHBEARER"}}}},
     ["/security/sasl/admin/mechanism"]),
    ("unknown Job key", {"topicsJob": {"sasl": {}}}, ["/topicsJob", "sasl"]),
    ("TLS client port", {"consensus": {"ports": {"secureClient": 0}}},
     ["/consensus/ports/secureClient"]),
    ("replication port", {"broker": {"ports": {"interBroker": 70000}}},
     ["/broker/ports/interBroker"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("values", "expected"), [pytest.param(v, e, id=name) for name, v, e in BAD_VALUES]
)
def test_schema_refuses(values: dict[str, Any], expected: list[str]) -> None:
    message = schema_refusal(values)
    for part in expected:
        assert part in message, message


SASL_INTERNAL = {"listeners": {"internal": {"protocol": "SASL_PLAINTEXT"}}}
BROKER_LOGIN = {"sasl": {"interBroker": {"existingSecret": BROKER_USER}}}

TEMPLATE_CHECKS: list[tuple[str, dict[str, Any], str]] = [
    ("TLS without a certificate",
     {"security": {"listeners": {"internal": {"protocol": "SSL"}}}},
     "the INTERNAL listener is SSL: set security.tls.existingSecret"),
    ("TLS on EXTERNAL without a certificate",
     {"security": {"listeners": {"external": {"protocol": "SASL_SSL"}}},
      "broker": {"external": {"enabled": True, "nodePorts": [1, 2, 3]}}},
     "the EXTERNAL listener is SASL_SSL: set security.tls.existingSecret"),
    ("SASL replication without a password", {"security": SASL_INTERNAL},
     "the inter-broker listener INTERNAL is SASL_PLAINTEXT: set "
     "security.sasl.interBroker.existingSecret"),
    ("inter-broker mechanism off",
     {"security": {**SASL_INTERNAL, "sasl": {"enabledMechanisms": ["PLAIN"],
                                             "interBroker": {"existingSecret": BROKER_USER}}}},
     "security.sasl.interBroker.mechanism SCRAM-SHA-512 is not enabled on the inter-broker "
     "listener INTERNAL (PLAIN)"),
    ("admin clients without a login",
     {"security": {**SASL_INTERNAL, "listeners": {"internal": {"protocol": "SASL_PLAINTEXT"},
                                                  "interBroker": {"enabled": True}}}},
     "the INTERNAL listener is SASL_PLAINTEXT: the chart's admin clients (the topics Job, the "
     "scale-down drain hook) log in as security.sasl.admin"),
    ("admin mechanism off",
     {"security": {**SASL_INTERNAL, "sasl": {
         "interBroker": {"existingSecret": BROKER_USER},
         "admin": {"username": "ops", "existingSecret": "ops", "mechanism": "PLAIN"}}}},
     "the admin clients' SASL mechanism PLAIN is not enabled on the INTERNAL listener"),
    ("Spark on a SASL listener",
     {"security": {**SASL_INTERNAL, **BROKER_LOGIN}, "spark": {"enabled": True}},
     "spark.enabled with the INTERNAL listener SASL_PLAINTEXT"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("values", "expected"), [pytest.param(v, e, id=name) for name, v, e in TEMPLATE_CHECKS]
)
def test_template_refuses(values: dict[str, Any], expected: str) -> None:
    with pytest.raises(HelmError) as raised:
        template(values)
    assert expected in str(raised.value), str(raised.value)


def test_authorizer_adds_only_the_brokers_own_user() -> None:
    """Nothing else is made a super user behind the values' back: a PLAINTEXT listener's
    User:ANONYMOUS, an SSL listener's certificate subjects are the values' to name."""
    values = {"security": {"authorization": {"enabled": True, "superUsers": ["User:ops"]}}}
    spec = _pod_spec(template(values), "StatefulSet", component("broker"))
    env = {e["name"]: e.get("value") for e in _container(spec, "broker")["env"]}
    assert json.loads(env["DIRECTLOG_SUPER_USERS"]) == ["User:ops"]
    assert env["DIRECTLOG_AUTHORIZER_ENABLED"] == "true"
    assert env["DIRECTLOG_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"


# Nothing turned on: nothing changes --------------------------------------------------------

# Every security value given, none of them turned on.
UNUSED: dict[str, Any] = {
    "security": {
        "tls": {"existingSecret": KAFKA_TLS, "clientAuth": "required"},
        "listeners": {
            "internal": {"protocol": "PLAINTEXT", "sslClientAuth": "required",
                         "saslMechanisms": ["PLAIN"]},
            "external": {"protocol": "SASL_SSL"},  # no EXTERNAL listener without broker.external
            "interBroker": {"enabled": False, "protocol": "SSL"},
        },
        "sasl": {"enabledMechanisms": ["PLAIN"],
                 "interBroker": {"mechanism": "PLAIN", "username": "b", "existingSecret": "s"},
                 "admin": {"mechanism": "PLAIN", "username": "t", "existingSecret": "t"}},
        "authorization": {"enabled": False, "superUsers": ["User:admin"],
                          "allowEveryoneIfNoAclFound": True},
        "serviceLinks": {"enabled": False, "broker": {"existingSecret": "b"},
                         "controller": {"existingSecret": "c"},
                         "consensus": {"existingSecret": "z"}},
        "consensusAuth": {"enabled": False, "existingSecret": "z"},
    },
    "broker": {"ports": {"interBroker": 9191}},
    "consensus": {"ports": {"secureClient": 3281}},
}  # fmt: skip

SECURITY_VARIABLES = {
    "DIRECTLOG_SSL", "DIRECTLOG_SSL_CLIENT_AUTH", "DIRECTLOG_SASL_ENABLED_MECHANISMS",
    "DIRECTLOG_INTER_BROKER_SASL_MECHANISM", "DIRECTLOG_INTER_BROKER_SASL_USERNAME",
    "DIRECTLOG_INTER_BROKER_SASL_PASSWORD", "DIRECTLOG_AUTHORIZER_ENABLED",
    "DIRECTLOG_SUPER_USERS", "DIRECTLOG_ALLOW_EVERYONE_IF_NO_ACL_FOUND",
    "DIRECTLOG_CONTROLLER_TLS", "DIRECTLOG_TIERING_TLS", "DIRECTLOG_TIERING_BROKER_TLS",
    "DIRECTLOG_CONTROLLER_GRPC_TLS", "DIRECTLOG_CONTROLLER_CONSENSUS_TLS",
    "DIRECTLOG_CONTROLLER_SCRAM_BOOTSTRAP_FILE", "CONSENSUS_AUTH_PASSWORD",
    "DIRECTLOG_CLIENT_SECURITY_PROTOCOL",
}  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [{}, {"tiering": {"enabled": True, "remote": "file:///mnt/remote"}, "topics": [{"name": "a"}]}],
    ids=["default", "tiering-topics"],
)
def test_unused_security_values_change_nothing(extra: dict[str, Any]) -> None:
    """Security renders only what is turned on: values that turn nothing on leave every
    object, and the notes, as they were."""
    unused = {**UNUSED, **extra, "broker": {**UNUSED["broker"], **extra.get("broker", {})}}
    assert template(unused) == template(extra)
    assert _notes(unused) == _notes(extra)


def test_default_render_has_no_security() -> None:
    manifests = template(
        {"topics": [{"name": "a"}], "tiering": {"enabled": True, "remote": "file:///x"}}
    )
    text = json.dumps(manifests)
    for name in SECURITY_VARIABLES:
        assert f'"{name}"' not in text, name
    assert SECRETS_DIR not in text
    assert not [v for m in manifests for v in _volumes(m) if "secret" in v]
    spec = _pod_spec(manifests, "StatefulSet", component("broker"))
    script = _container(spec, "broker")["command"][-1]
    assert '"security_protocol":"PLAINTEXT"' in script
    assert "REPLICATION" not in script
    env = {e["name"]: e.get("value") for e in _container(spec, "broker")["env"]}
    assert env["DIRECTLOG_INTER_BROKER_LISTENER"] == "INTERNAL"
    config = one(manifests, "ConfigMap", component("consensus"))["data"]["consensus.yaml"]
    assert "tls" not in config
    member = _container(_pod_spec(manifests, "StatefulSet", component("consensus")), "consensus")
    assert "{client:" in member["command"][-1] and "secure_client" not in member["command"][-1]
    assert find(manifests, "Secret") == []


def _volumes(manifest: Manifest) -> list[dict[str, Any]]:
    if manifest["kind"] not in ("StatefulSet", "Job", "Deployment", "DaemonSet"):
        return []
    volumes: list[dict[str, Any]] = manifest["spec"]["template"]["spec"].get("volumes", [])
    return volumes
