"""SASL on the Kafka listeners, as Kafka users set it up: SCRAM users created and removed with
the admin clients' SCRAM APIs (KIP-554), then confluent-kafka, kafka-python and kcat logging
in with SCRAM-SHA-512 over SASL_SSL and PLAIN over SASL_PLAINTEXT; wrong passwords refused
with SASL_AUTHENTICATION_FAILED; a removed user cut off at re-authentication (KIP-368); a
connection that has not authenticated allowed only ApiVersions and SASL, in small frames.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from directlog.protocol.client import ClientSecurity, KafkaConnection, SaslLogin
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.test_admin_cli import DIRECTLOG
from tests.e2e.test_tls_listeners import Pki

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
    from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

pytestmark = pytest.mark.timeout(240)

SHA512 = ScramMechanism.SCRAM_SHA_512


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.make(tmp_path_factory.mktemp("pki"))


def sasl_settings(pki: Pki, **extra: Any) -> dict[str, Any]:
    """PLAINTEXT (the harness's bootstrap), SASL_SSL with SCRAM, SASL_PLAINTEXT with PLAIN."""
    return {
        "listeners": [
            {"name": "PLAINTEXT", "port": 0},
            {"name": "SASL_SSL", "port": 0},
            {"name": "SASL_PLAINTEXT", "port": 0, "sasl_enabled_mechanisms": ["PLAIN"]},
        ],
        "ssl": pki.broker_ssl(),
        "sasl_enabled_mechanisms": ["SCRAM-SHA-512", "SCRAM-SHA-256"],
        **extra,
    }


def add_users(bootstrap: str, users: dict[str, str], mechanism: Any = SHA512) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    alterations = [
        UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 4096), password.encode())
        for user, password in users.items()
    ]
    for future in admin.alter_user_scram_credentials(alterations).values():
        future.result(timeout=30)


def scram(pki: Pki, user: str, password: str) -> dict[str, str]:
    return {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": pki.path("ca.pem"),
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
    }


def plain(user: str, password: str) -> dict[str, str]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
    }


def login_error(bootstrap: str, config: dict[str, str]) -> KafkaError | None:
    """None if a client with `config` reads metadata, else the error it was told (the
    login's own error when there was one, as librdkafka reports it to error_cb)."""
    told: list[KafkaError] = []
    admin = AdminClient({"bootstrap.servers": bootstrap, **config, "error_cb": told.append})
    try:
        admin.list_topics(timeout=8)
    except KafkaException as error:
        admin.poll(1)  # serves error_cb
        refused = [e for e in told if e.code() == KafkaError._AUTHENTICATION]
        return refused[0] if refused else error.args[0]
    return None


def test_users_managed_with_the_admin_clients_scram_apis(tmp_path: Path, pki: Pki) -> None:
    with Cluster(tmp_path, brokers=1, broker_settings=sasl_settings(pki)) as cluster:
        bootstrap = cluster.brokers[0].bootstrap
        add_users(bootstrap, {"alice": "alice-secret"})
        add_users(bootstrap, {"alice": "alice-256"}, ScramMechanism.SCRAM_SHA_256)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        described = admin.describe_user_scram_credentials(["alice"])["alice"].result(timeout=20)
        assert sorted((i.mechanism, i.iterations) for i in described.scram_credential_infos) == [
            (ScramMechanism.SCRAM_SHA_256, 4096),
            (ScramMechanism.SCRAM_SHA_512, 4096),
        ]
        with pytest.raises(KafkaException) as missing:
            admin.describe_user_scram_credentials(["nobody"])["nobody"].result(timeout=20)
        assert missing.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND

        # kafka-python's admin client sees the same, and removes one mechanism
        kp = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
        try:
            listed = kp.describe_user_scram_credentials()
            assert "alice" in str(listed)
        finally:
            kp.close()
        deletion = UserScramCredentialDeletion("alice", ScramMechanism.SCRAM_SHA_256)
        admin.alter_user_scram_credentials([deletion])["alice"].result(timeout=20)
        described = admin.describe_user_scram_credentials(["alice"])["alice"].result(timeout=20)
        assert [i.mechanism for i in described.scram_credential_infos] == [SHA512]
        with pytest.raises(KafkaException) as again:
            admin.alter_user_scram_credentials([deletion])["alice"].result(timeout=20)
        assert again.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND
        # too few iterations: UNACCEPTABLE_CREDENTIAL, and nothing changed
        weak = UserScramCredentialUpsertion("bob", ScramCredentialInfo(SHA512, 1000), b"pw")
        with pytest.raises(KafkaException) as unacceptable:
            admin.alter_user_scram_credentials([weak])["bob"].result(timeout=20)
        assert unacceptable.value.args[0].code() == KafkaError.UNACCEPTABLE_CREDENTIAL
        with pytest.raises(KafkaException):
            admin.describe_user_scram_credentials(["bob"])["bob"].result(timeout=20)


def test_clients_log_in_with_scram_and_plain(tmp_path: Path, pki: Pki, clients: Any) -> None:
    with Cluster(tmp_path, brokers=1, broker_settings=sasl_settings(pki)) as cluster:
        broker = cluster.brokers[0]
        add_users(broker.bootstrap, {"alice": "alice-secret", "carol": "carol-secret"})
        clients.create_topic(broker.bootstrap, "logins", partitions=2)
        sasl_ssl, sasl_plain = broker.listeners["SASL_SSL"], broker.listeners["SASL_PLAINTEXT"]

        # confluent-kafka: SCRAM-SHA-512 over SASL_SSL, a group included
        alice = scram(pki, "alice", "alice-secret")
        producer = clients.producer(sasl_ssl, alice)
        clients.produce_all(producer, "logins", [{"value": b"c-%d" % i} for i in range(10)])
        consumer = clients.consumer(sasl_ssl, {**alice, "auto.offset.reset": "earliest"})
        consumer.subscribe(["logins"])
        assert sorted(m.value() for m in clients.consume(consumer, 10)) == sorted(
            b"c-%d" % i for i in range(10)
        )
        # confluent-kafka: PLAIN over SASL_PLAINTEXT, checked against the SCRAM credential
        producer = clients.producer(sasl_plain, plain("carol", "carol-secret"))
        clients.produce_all(producer, "logins", [{"value": b"p-%d" % i} for i in range(5)])

        # kafka-python, both ways
        for address, options in (
            (
                sasl_ssl,
                {
                    "security_protocol": "SASL_SSL",
                    "ssl_cafile": pki.path("ca.pem"),
                    "sasl_mechanism": "SCRAM-SHA-512",
                },
            ),
            (sasl_plain, {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}),
        ):
            login = {"sasl_plain_username": "alice", "sasl_plain_password": "alice-secret"}
            kp_producer = KafkaProducer(bootstrap_servers=address, **options, **login)
            kp_producer.send("logins", b"kp", partition=0).get(timeout=30)
            kp_producer.close()
            kp_consumer = KafkaConsumer(
                "logins",
                bootstrap_servers=address,
                group_id=f"kp-{options['sasl_mechanism']}",
                auto_offset_reset="earliest",
                consumer_timeout_ms=15000,
                **options,
                **login,
            )
            seen = [m.value for m in kp_consumer]
            kp_consumer.close()
            assert b"c-0" in seen and b"p-0" in seen and b"kp" in seen

        # kcat with SCRAM over SASL_SSL
        kcat = ["kcat", "-b", sasl_ssl, *(f"-X{key}={value}" for key, value in alice.items())]
        subprocess.run(
            [*kcat, "-P", "-t", "logins", "-p", "1"],
            input=b"kcat-scram\n",
            check=True,
            timeout=60,
        )
        out = subprocess.run(
            [*kcat, "-C", "-t", "logins", "-p", "1", "-e", "-q"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        assert b"kcat-scram" in out

        # the admin CLI: a properties file as the banner of `make run SECURE=1` prints it,
        # then the variables a pod takes from a Secret
        properties = tmp_path / "client.properties"
        properties.write_text(
            "".join(
                f"{key}={value}\n"
                for key, value in {"bootstrap.servers": sasl_ssl, **alice}.items()
            )
        )
        listed = admin_cli("--command-config", str(properties), "topics", "list")
        assert listed.returncode == 0 and "logins" in listed.stdout, listed.stderr
        kcat_listed = subprocess.run(
            ["kcat", "-F", str(properties), "-L"], capture_output=True, timeout=60, check=True
        )
        assert b'topic "logins"' in kcat_listed.stdout  # the same file serves kcat
        variables = {
            f"DIRECTLOG_CLIENT_{key.upper().replace('.', '_')}": value
            for key, value in plain("carol", "carol-secret").items()
        }
        listed = admin_cli("--bootstrap-server", sasl_plain, "topics", "list", env=variables)
        assert listed.returncode == 0 and "logins" in listed.stdout, listed.stderr
        refused = admin_cli(
            "--bootstrap-server",
            sasl_plain,
            "topics",
            "list",
            env={**variables, "DIRECTLOG_CLIENT_SASL_PASSWORD": "wrong"},
        )
        assert refused.returncode == 1 and "directlog: error:" in refused.stderr


def admin_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`directlog --timeout 20 ARGS`, with `env` added to this process's environment."""
    return subprocess.run(
        [str(DIRECTLOG), "--timeout", "20", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_wrong_passwords_and_unknown_users_are_refused(tmp_path: Path, pki: Pki) -> None:
    with Cluster(tmp_path, brokers=1, broker_settings=sasl_settings(pki)) as cluster:
        broker = cluster.brokers[0]
        add_users(broker.bootstrap, {"alice": "alice-secret"})
        for address, config in (
            (broker.listeners["SASL_SSL"], scram(pki, "alice", "wrong")),
            (broker.listeners["SASL_SSL"], scram(pki, "nobody", "alice-secret")),
            (broker.listeners["SASL_PLAINTEXT"], plain("alice", "wrong")),
        ):
            error = login_error(address, config)
            assert error is not None and error.code() == KafkaError._AUTHENTICATION, error
            assert "Authentication failed" in error.str()
        # a mechanism the listener does not offer
        error = login_error(broker.listeners["SASL_PLAINTEXT"], {
            **plain("alice", "alice-secret"), "sasl.mechanism": "SCRAM-SHA-256"
        })  # fmt: skip
        assert error is not None and "SCRAM-SHA-256" in error.str()
        assert (
            login_error(broker.listeners["SASL_SSL"], scram(pki, "alice", "alice-secret")) is None
        )
        failed = broker.sample("directlog_broker_connections_closed_for_authentication_total")
        assert failed is not None and failed >= 4


@pytest.mark.timeout(120)
@pytest.mark.parametrize("renews", [True, False], ids=["kip-368", "before-kip-368"])
def test_directlogs_own_connections_renew_their_login(
    tmp_path: Path, pki: Pki, renews: bool
) -> None:
    """Directlog's own Kafka connections (replication, the exporter, RDMA grant sessions)
    log in again before their session ends (KIP-368), so one left idle through several
    lifetimes is still logged in; a client that does not renew is cut off at its next
    request after the lifetime."""
    settings = sasl_settings(pki, connections_max_reauth_ms=2000)
    with Cluster(tmp_path, brokers=1, broker_settings=settings) as cluster:
        broker = cluster.brokers[0]
        add_users(broker.bootstrap, {"dave": "dave-secret"})
        host, port = broker.listeners["SASL_PLAINTEXT"].rsplit(":", 1)
        login = SaslLogin("PLAIN", "dave", "dave-secret")
        security = ClientSecurity(sasl=login, client_id="renewing", reauthenticate=renews)

        async def idle_then_ask() -> int:
            connection = await KafkaConnection.connect(host, int(port), 10.0, security)
            try:
                await asyncio.sleep(5)  # two and a half lifetimes, nothing sent
                request = ApiVersionsRequest[3](
                    client_software_name="directlog", client_software_version="1"
                )
                answer = await connection.request(request, ApiVersionsResponse, "renewing")
                return int(answer.error_code)
            finally:
                await connection.close()

        closed = "directlog_broker_connections_closed_for_authentication_total"
        if renews:
            assert asyncio.run(idle_then_ask()) == 0
            assert broker.sample(closed) == 0
        else:
            with pytest.raises(ConnectionError):
                asyncio.run(idle_then_ask())
            assert broker.sample(closed) == 1


def test_a_removed_user_is_cut_off_at_reauthentication(tmp_path: Path, pki: Pki) -> None:
    """With connections.max.reauth.ms the client re-authenticates on its open connection
    before its session ends; once its credential is gone that fails and it is cut off."""
    # Long enough that a client on a loaded machine starts re-authenticating (librdkafka: at
    # 90% of the lifetime) before its session ends.
    settings = sasl_settings(pki, connections_max_reauth_ms=5000)
    with Cluster(tmp_path, brokers=1, broker_settings=settings) as cluster:
        broker = cluster.brokers[0]
        add_users(broker.bootstrap, {"alice": "alice-secret"})
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("reauth", 1)])["reauth"].result(timeout=30)
        errors: list[KafkaError] = []
        producer = Producer(
            {
                "bootstrap.servers": broker.listeners["SASL_SSL"],
                **scram(pki, "alice", "alice-secret"),
                "error_cb": errors.append,
                "message.timeout.ms": 8000,
                "linger.ms": 0,
            }
        )
        delivered: list[Any] = []

        def send() -> None:
            producer.produce("reauth", b"x", on_delivery=lambda e, m: delivered.append(e))
            producer.flush(15)

        for _ in range(6):  # across several session lifetimes: re-authentication works
            send()
            time.sleep(2.5)
        assert delivered and all(e is None for e in delivered), delivered
        # re-authenticated in place (KIP-368): no connection was closed for an expired session
        closed = "directlog_broker_connections_closed_for_authentication_total"
        assert broker.sample(closed) == 0
        deletion = UserScramCredentialDeletion("alice", SHA512)
        admin.alter_user_scram_credentials([deletion])["alice"].result(timeout=20)
        delivered.clear()

        def cut_off() -> bool:
            send()
            producer.poll(0.5)
            return any(e.code() == KafkaError._AUTHENTICATION for e in errors)

        wait_for(cut_off, 60, "the removed user's producer cut off")
        delivered.clear()
        send()  # it cannot log in again: the record is not delivered
        assert len(delivered) == 1 and delivered[0] is not None, delivered


def raw_exchange(address: str, *frames: bytes) -> list[bytes]:
    """Send the frames; the size-prefixed answers the server gives before it closes."""
    host, port = address.rsplit(":", 1)
    answers = []
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for frame in frames:
            sock.sendall(frame)
        buffered = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionError, TimeoutError):
                break
            if not chunk:
                break
            buffered += chunk
        while len(buffered) >= 4:
            size = int.from_bytes(buffered[:4], "big")
            answers.append(buffered[4 : 4 + size])
            buffered = buffered[4 + size :]
    return answers


def framed(request: Any, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="raw")
    return bytes(request.encode(header=True, framed=True))


def test_only_apiversions_and_sasl_before_authentication(tmp_path: Path, pki: Pki) -> None:
    with Cluster(tmp_path, brokers=1, broker_settings=sasl_settings(pki)) as cluster:
        broker = cluster.brokers[0]
        address = broker.listeners["SASL_PLAINTEXT"]
        # ApiVersions is answered; Metadata before authenticating closes the connection
        answers = raw_exchange(
            address, framed(ApiVersionsRequest[0](), 1), framed(MetadataRequest[0]([]), 2)
        )
        assert len(answers) == 1 and answers[0][:4] == (1).to_bytes(4, "big")
        # a frame larger than sasl_server_max_receive_size before authenticating: closed
        assert raw_exchange(address, (10_000_000).to_bytes(4, "big") + b"\0" * 64) == []
        # a PLAIN token with no separators: SASL_AUTHENTICATION_FAILED, then closed
        answers = raw_exchange(
            address,
            framed(SaslHandshakeRequest[1](mechanism="PLAIN"), 3),
            framed(SaslAuthenticateRequest[1](auth_bytes=b"garbage"), 4),
        )
        assert len(answers) == 2
        assert answers[1][:4] == (4).to_bytes(4, "big")
        assert int.from_bytes(answers[1][4:6], "big") == 58  # SASL_AUTHENTICATION_FAILED
        # other clients are not affected
        add_users(broker.bootstrap, {"alice": "alice-secret"})
        assert login_error(address, plain("alice", "alice-secret")) is None


def test_bootstrap_users_log_in_to_a_new_cluster(tmp_path: Path, pki: Pki) -> None:
    """The controller's scram_bootstrap_file creates the first users, as Kafka's
    `kafka-storage format --add-scram` does, and never overwrites one that exists."""
    users = tmp_path / "users"
    users.write_text("# the first admin\nadmin:first-secret\n\nbroker:broker-secret\n")
    settings = {"scram_bootstrap_file": str(users)}
    with Cluster(
        tmp_path / "c", brokers=1, broker_settings=sasl_settings(pki), controller_settings=settings
    ) as cluster:
        broker = cluster.brokers[0]
        sasl_ssl = broker.listeners["SASL_SSL"]
        wait_for(
            lambda: login_error(sasl_ssl, scram(pki, "admin", "first-secret")) is None,
            30,
            "admin logs in",
        )
        sha256 = {**scram(pki, "broker", "broker-secret"), "sasl.mechanism": "SCRAM-SHA-256"}
        assert login_error(sasl_ssl, sha256) is None
        add_users(broker.bootstrap, {"admin": "changed"})  # then a controller takes over again
        cluster.controllers[0].stop()
        cluster.controllers[0].start()
        wait_for(
            lambda: login_error(sasl_ssl, scram(pki, "admin", "changed")) is None,
            60,
            "the changed password kept over the bootstrap file's",
        )
