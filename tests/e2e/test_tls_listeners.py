"""SSL listeners as Kafka users configure them: PEM certificates, client certificates with
ssl.client.auth, replicas fetching over TLS, certificates renewed on disk taken without a
restart, and what is not TLS on a TLS port (and the reverse) closing only that connection.

Each client is one that users run: confluent-kafka, kafka-python and kcat, with their own
TLS settings (security.protocol=SSL, ssl.ca.location / ssl_cafile, ...).
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography import x509

from directlog.security.certs import CertificateAuthority
from tests.e2e.cluster import Cluster, wait_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.protocol.metadata import ApiVersionsRequest

pytestmark = pytest.mark.timeout(180)


@dataclass(frozen=True)
class Pki:
    """A CA, the brokers' certificate, a client's, and a client certificate of another CA."""

    directory: Path

    def path(self, name: str) -> str:
        return str(self.directory / name)

    @classmethod
    def make(cls, directory: Path) -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        ca = CertificateAuthority.create("directlog-test-ca")
        ca.write(directory / "ca.pem")
        ca.issue("broker", hosts=["127.0.0.1", "localhost"]).write(
            directory / "broker.pem", directory / "broker.key"
        )
        ca.issue("alice", organization="acme").write(
            directory / "alice.pem", directory / "alice.key"
        )
        CertificateAuthority.create("somebody-else").issue("mallory").write(
            directory / "mallory.pem", directory / "mallory.key"
        )
        return cls(directory)

    def broker_ssl(self) -> dict[str, str]:
        return {
            "cert_file": self.path("broker.pem"),
            "key_file": self.path("broker.key"),
            "ca_file": self.path("ca.pem"),
        }

    def librdkafka(self, client: str | None = "alice") -> dict[str, str]:
        config = {"security.protocol": "SSL", "ssl.ca.location": self.path("ca.pem")}
        if client:
            config["ssl.certificate.location"] = self.path(f"{client}.pem")
            config["ssl.key.location"] = self.path(f"{client}.key")
        return config


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.make(tmp_path_factory.mktemp("pki"))


def tls_settings(pki: Pki, client_auth: str = "required", **extra: Any) -> dict[str, Any]:
    """A PLAINTEXT listener first (the harness creates topics through it) and an SSL one."""
    return {
        "listeners": [{"name": "PLAINTEXT", "port": 0}, {"name": "SSL", "port": 0}],
        "ssl": pki.broker_ssl(),
        "ssl_client_auth": client_auth,
        **extra,
    }


def round_trip(clients: Any, bootstrap: str, config: dict[str, str], topic: str) -> list[bytes]:
    producer = clients.producer(bootstrap, config)
    clients.produce_all(producer, topic, [{"value": b"tls-%d" % i} for i in range(20)])
    consumer = clients.consumer(bootstrap, {**config, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])  # a group: FindCoordinator, JoinGroup, SyncGroup over TLS
    return [m.value() for m in clients.consume(consumer, 20)]


def test_clients_produce_consume_and_join_groups_over_tls(
    tmp_path: Path, pki: Pki, clients: Any
) -> None:
    with Cluster(tmp_path, brokers=1, broker_settings=tls_settings(pki)) as cluster:
        broker = cluster.brokers[0]
        ssl_address = broker.listeners["SSL"]
        clients.create_topic(broker.bootstrap, "secret", partitions=2)
        # confluent-kafka (librdkafka) with a client certificate
        values = round_trip(clients, ssl_address, pki.librdkafka(), "secret")
        assert sorted(values) == sorted(b"tls-%d" % i for i in range(20))

        # kafka-python
        producer = KafkaProducer(
            bootstrap_servers=ssl_address,
            security_protocol="SSL",
            ssl_cafile=pki.path("ca.pem"),
            ssl_certfile=pki.path("alice.pem"),
            ssl_keyfile=pki.path("alice.key"),
        )
        for i in range(10):
            producer.send("secret", b"kp-%d" % i, partition=0)
        producer.flush(30)
        producer.close()
        consumer = KafkaConsumer(
            "secret",
            bootstrap_servers=ssl_address,
            security_protocol="SSL",
            ssl_cafile=pki.path("ca.pem"),
            ssl_certfile=pki.path("alice.pem"),
            ssl_keyfile=pki.path("alice.key"),
            group_id="kafka-python-tls",
            auto_offset_reset="earliest",
            consumer_timeout_ms=15000,
        )
        seen = [m.value for m in consumer]
        consumer.close()
        assert {b"kp-%d" % i for i in range(10)} <= set(seen)
        assert len(seen) == 30

        # kcat
        kcat = ["kcat", "-b", ssl_address, *kcat_ssl(pki)]
        subprocess.run(
            [*kcat, "-P", "-t", "secret", "-p", "1"],
            input=b"kcat-1\nkcat-2\n",
            check=True,
            timeout=60,
        )
        out = subprocess.run(
            [*kcat, "-C", "-t", "secret", "-p", "1", "-o", "beginning", "-e", "-q"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.split(b"\n")
        assert b"kcat-1" in out and b"kcat-2" in out


def kcat_ssl(pki: Pki) -> list[str]:
    options = []
    for key, value in pki.librdkafka().items():
        options += ["-X", f"{key}={value}"]
    return options


def metadata_error(bootstrap: str, config: dict[str, str]) -> str | None:
    """None if a client with `config` reads metadata, else why it could not."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **config})
    try:
        admin.list_topics(timeout=5)
    except KafkaException as error:
        return str(error)
    return None


def test_client_certificates_are_required_and_checked(
    tmp_path: Path, pki: Pki, clients: Any
) -> None:
    with Cluster(tmp_path, brokers=1, broker_settings=tls_settings(pki)) as cluster:
        ssl_address = cluster.brokers[0].listeners["SSL"]
        assert metadata_error(ssl_address, pki.librdkafka("alice")) is None
        assert metadata_error(ssl_address, pki.librdkafka(None)) is not None  # no certificate
        assert metadata_error(ssl_address, pki.librdkafka("mallory")) is not None  # other CA
        # a client that does not trust the broker's CA refuses it
        untrusting = {**pki.librdkafka("alice"), "ssl.ca.location": pki.path("mallory.pem")}
        assert metadata_error(ssl_address, untrusting) is not None
        # and the broker goes on serving the others
        assert metadata_error(ssl_address, pki.librdkafka("alice")) is None
        assert metadata_error(cluster.brokers[0].bootstrap, {}) is None


def test_requested_client_auth_takes_clients_with_and_without_certificates(
    tmp_path: Path, pki: Pki
) -> None:
    settings = tls_settings(pki, client_auth="requested")
    with Cluster(tmp_path, brokers=1, broker_settings=settings) as cluster:
        ssl_address = cluster.brokers[0].listeners["SSL"]
        assert metadata_error(ssl_address, pki.librdkafka("alice")) is None
        assert metadata_error(ssl_address, pki.librdkafka(None)) is None
        assert metadata_error(ssl_address, pki.librdkafka("mallory")) is not None


def test_replicas_fetch_over_a_tls_inter_broker_listener(
    tmp_path: Path, pki: Pki, clients: Any
) -> None:
    """Both brokers' replica fetchers connect to each other's SSL listener, presenting the
    broker certificate (client auth required), so acks=all completes only through TLS."""
    settings = tls_settings(pki, inter_broker_listener="SSL")
    with Cluster(tmp_path, brokers=2, broker_settings=settings) as cluster:
        admin = clients.admin(cluster.brokers[0].bootstrap)
        config = {"min.insync.replicas": "2"}
        futures = admin.create_topics([NewTopic("replicated", 2, 2, config=config)])
        futures["replicated"].result(timeout=30)
        ssl_bootstrap = ",".join(b.listeners["SSL"] for b in cluster.brokers.values())
        producer = clients.producer(ssl_bootstrap, {**pki.librdkafka(), "acks": "all"})
        reports = clients.produce_all(
            producer, "replicated", [{"value": b"%d" % i, "partition": i % 2} for i in range(40)]
        )
        assert [error for error, _ in reports if error is not None] == []


def served_serial(address: str) -> int:
    host, port = address.rsplit(":", 1)
    pem = ssl.get_server_certificate((host, int(port)), timeout=10)
    return x509.load_pem_x509_certificate(pem.encode()).serial_number


def test_a_certificate_renewed_on_disk_is_served_to_new_connections(
    tmp_path: Path, pki: Pki
) -> None:
    directory = tmp_path / "pki"
    own = Pki.make(directory)
    settings = tls_settings(own, client_auth="none", ssl_files_check_interval_ms=100)
    with Cluster(tmp_path / "cluster", brokers=1, broker_settings=settings) as cluster:
        ssl_address = cluster.brokers[0].listeners["SSL"]
        before = served_serial(ssl_address)
        ca = CertificateAuthority.create("renewed-ca")
        renewed = ca.issue("broker", hosts=["127.0.0.1"])
        renewed.write(directory / "broker.pem", directory / "broker.key")
        wait_for(
            lambda: served_serial(ssl_address) == renewed.cert.serial_number,
            30,
            "the renewed certificate served",
        )
        assert before != renewed.cert.serial_number
        # a pair that does not load (a key without its certificate) keeps the last good one
        (directory / "broker.pem").write_text("not a certificate")
        time.sleep(0.5)
        assert served_serial(ssl_address) == renewed.cert.serial_number


def exchange(address: str, payload: bytes) -> bytes:
    """What the server answers `payload` with before closing (b"" if it closes at once)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(payload)
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return received
            received += chunk


def test_tls_on_the_plaintext_port_and_plaintext_on_the_tls_port_close_that_connection(
    tmp_path: Path, pki: Pki
) -> None:
    settings = tls_settings(pki, client_auth="none")
    with Cluster(tmp_path, brokers=1, broker_settings=settings) as cluster:
        broker = cluster.brokers[0]
        # a TLS ClientHello to the plaintext listener: its first bytes read as a huge frame
        context = ssl.create_default_context(cafile=pki.path("ca.pem"))
        with (
            pytest.raises((ssl.SSLError, ConnectionError, OSError)),
            socket.create_connection(("127.0.0.1", broker.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            pass
        # a Kafka ApiVersions request to the TLS listener: no handshake, closed
        request = ApiVersionsRequest[0]()
        request.with_header(correlation_id=7, client_id="plaintext")
        answer = exchange(broker.listeners["SSL"], bytes(request.encode(header=True, framed=True)))
        assert b"\x00\x00\x00\x07" not in answer[:8]  # no Kafka answer to correlation id 7
        # others are still served, on both listeners
        assert metadata_error(broker.bootstrap, {}) is None
        assert metadata_error(broker.listeners["SSL"], pki.librdkafka(None)) is None
        closed = broker.sample("directlog_broker_connections_closed_for_bad_input_total")
        assert closed is not None and closed >= 2
