"""Mutual TLS on the service links (docs/security.md, "Service links (gRPC)"): brokers to
the controllers and the tiering sidecar to its broker, over real processes.

Every test makes its own certificate authority. A cluster with TLS on both links creates,
produces, tiers and reads back, and survives the loss of its active controller; a broker
with a certificate of another CA, with none, or with no TLS at all, is refused while the
cluster serves on; certificates renewed on disk are what the next connection sees.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from cryptography import x509

from directlog.rpc import controller_pb2 as pb
from directlog.rpc import tiering_pb2 as tpb
from directlog.rpc.controller_pb2_grpc import ControllerStub
from directlog.rpc.tiering_pb2_grpc import BrokerTieringStub
from directlog.security.certs import Certificate, CertificateAuthority
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import FAST_BROKER, Cluster, eventually, wait_for
from tests.e2e.records import recent_base_timestamp
from tests.e2e.service_process import ServiceProcess
from tests.e2e.tiered import (
    TIERING,
    create_tiered_topic,
    produce,
    read_confluent,
    tiering_settings,
    values,
    wait_tiered,
)
from tests.e2e.tiering import TieringProcess

pytestmark = pytest.mark.timeout(240)

WAIT = 60.0
LOOPBACK = ["127.0.0.1", "localhost"]


@dataclass
class Pki:
    """A CA and the files of one test's certificates, as settings want them."""

    directory: Path
    ca: CertificateAuthority

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    def issue(self, name: str, *, hosts: list[str] | None = None) -> Certificate:
        """A certificate for `name` written to <name>.pem and <name>.key (replacing any)."""
        certificate = self.ca.issue(name, hosts=hosts or [])
        certificate.write(self.directory / f"{name}.pem", self.directory / f"{name}.key")
        return certificate

    def files(self, name: str | None, ca_file: Path | None = None) -> dict[str, str]:
        """TlsFiles fields: the certificate `name` (none if None) and the CA to trust."""
        fields = {"ca_file": str(ca_file or self.ca_file)}
        if name is not None:
            fields |= {
                "cert_file": str(self.directory / f"{name}.pem"),
                "key_file": str(self.directory / f"{name}.key"),
            }
        return fields


def make_pki(directory: Path, name: str) -> Pki:
    directory.mkdir(parents=True)
    pki = Pki(directory, CertificateAuthority.create(name))
    pki.ca.write(pki.ca_file)
    return pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """The cluster's CA with certificates for the controllers (their gRPC servers), the
    brokers (as clients of the controllers, and as servers of their sidecars) and the
    sidecars."""
    pki = make_pki(tmp_path / "pki", "directlog-test-ca")
    pki.issue("controller", hosts=LOOPBACK)
    pki.issue("broker")
    pki.issue("broker-tiering", hosts=LOOPBACK)
    pki.issue("tiering")
    return pki


def tls_cluster(tmp_path: Path, pki: Pki, **options: Any) -> Cluster:
    """A cluster whose controllers and tiering links take only mutual TLS."""
    return Cluster(
        tmp_path,
        controller_settings={"grpc_tls": pki.files("controller")},
        broker_settings={
            "controller_tls": pki.files("broker"),
            "tiering_tls": pki.files("broker-tiering"),
        },
        tiering=tiering_settings("file", tmp_path, None, broker_tls=pki.files("tiering")),
        **options,
    )


def served_serial(port: int, ca_file: Path) -> int:
    """The serial number of the certificate a new TLS connection to the port is served,
    checked against `ca_file` (under TLS 1.3 the client sees it before the server asks for
    the client's certificate)."""
    pem = ssl.get_server_certificate(("127.0.0.1", port), ca_certs=str(ca_file), timeout=10)
    return x509.load_pem_x509_certificate(pem.encode()).serial_number


def plaintext_call_fails(address: str, call: str) -> grpc.StatusCode:
    """The status of one plaintext unary call to a TLS port."""
    with grpc.insecure_channel(address) as channel:
        try:
            if call == "controller":
                stub: Any = ControllerStub(channel)  # type: ignore[no-untyped-call]
                stub.Heartbeat(pb.HeartbeatRequest(broker_id=0, broker_epoch=0), timeout=10)
            else:
                stub = BrokerTieringStub(channel)  # type: ignore[no-untyped-call]
                stub.ListPartitions(tpb.ListPartitionsRequest(), timeout=10)
        except grpc.RpcError as error:
            return error.code()
    raise AssertionError(f"a plaintext call to {address} was answered")


def active_hint(address: str, pki: Pki) -> str:
    """What a standby at `address` answers a broker that calls it over mutual TLS: the
    active controller's address, in its trailing metadata."""
    credentials = grpc.ssl_channel_credentials(
        pki.ca_file.read_bytes(),
        (pki.directory / "broker.key").read_bytes(),
        (pki.directory / "broker.pem").read_bytes(),
    )
    with grpc.secure_channel(address, credentials) as channel:
        stub = ControllerStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.Heartbeat(pb.HeartbeatRequest(broker_id=0, broker_epoch=0), timeout=10)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
            hints = [
                str(m.value) for m in error.trailing_metadata() if m.key == "active-controller"
            ]
            assert len(hints) == 1, error
            return hints[0]
    raise AssertionError(f"the standby at {address} answered")


def active_controller(cluster: Cluster) -> int:
    active = [
        i
        for i, controller in enumerate(cluster.controllers)
        if controller.running and controller.sample("directlog_controller_active") == 1
    ]
    assert len(active) == 1, active
    return active[0]


def produce_and_read(cluster: Cluster, topic: str, count: int, seed: int) -> None:
    """A new topic (replicated on every broker) written and read back byte for byte."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    replicas = len(cluster.brokers)
    admin.create_topics([NewTopic(topic, 1, replicas)])[topic].result(WAIT)
    sent = values(count, seed)
    produce(cluster.bootstrap, topic, sent, recent_base_timestamp())
    got = read_confluent(cluster.bootstrap, topic, count)
    assert [(offset, value) for offset, value, _ in got] == list(enumerate(sent))


class RefusedBroker(BrokerProcess):
    """A broker the controllers refuse: it never prints its banner, so it counts as
    started once its log says why TLS failed (`expected`)."""

    def __init__(self, work_dir: Path, expected: str, **options: Any) -> None:
        super().__init__(work_dir, **options)
        self.expected = expected

    def banner_read(self, banner: str) -> bool:
        return self.expected in self.stderr_text()

    def retried_thrice(self) -> bool:
        return self.stderr_text().count("no active controller among") >= 3


def test_a_cluster_works_end_to_end_over_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    sent = values(2500, seed=27)
    base = recent_base_timestamp()
    with tls_cluster(tmp_path, pki, brokers=2, controllers=2) as cluster:
        for controller in cluster.controllers:  # TLS only, with the controller's certificate
            assert plaintext_call_fails(controller.address, "controller") == (
                grpc.StatusCode.UNAVAILABLE
            )
            serial = served_serial(controller.port, pki.ca_file)
            assert serial == _serial(pki.directory / "controller.pem")
        for broker in cluster.brokers.values():
            port = int(broker.settings["tiering_port"])
            assert plaintext_call_fails(f"127.0.0.1:{port}", "tiering") == (
                grpc.StatusCode.UNAVAILABLE
            )
            assert served_serial(port, pki.ca_file) == _serial(pki.directory / "broker-tiering.pem")

        create_tiered_topic(cluster, "orders", replicas=2)
        produce(cluster.bootstrap, "orders", sent, base)
        for node_id in cluster.brokers:  # the sidecars copied, through their brokers
            wait_tiered(cluster, node_id, "orders", at_least=len(sent) // 2)
        got = read_confluent(cluster.bootstrap, "orders", len(sent))
        assert [(offset, value) for offset, value, _ in got] == list(enumerate(sent))
        for tiering in cluster.tierings.values():
            assert "TLS to the broker" not in tiering.stderr_text()

        # A standby names the active controller, whose certificate names that address.
        active = active_controller(cluster)
        standby = cluster.controllers[1 - active]
        assert active_hint(standby.address, pki) == cluster.controllers[active].address

        # The standby takes over; the brokers reach it over TLS too.
        cluster.controllers[active].stop()
        eventually(lambda: active_controller(cluster), "a standby took over", WAIT)
        cluster.wait_live({0, 1}, timeout=WAIT)
        produce_and_read(cluster, "after-failover", 200, seed=28)
        for broker in cluster.brokers.values():
            assert "TLS to the controller" not in broker.stderr_text()


def test_brokers_without_a_trusted_certificate_cannot_register(tmp_path: Path, pki: Pki) -> None:
    stranger = make_pki(tmp_path / "stranger-pki", "some-other-ca")
    stranger.issue("outsider")  # it trusts the cluster's CA for the servers' certificates
    refused = "closed the connection after the TLS handshake"
    with tls_cluster(tmp_path, pki) as cluster:
        outsiders = {
            1: (stranger.files("outsider", ca_file=pki.ca_file), refused),  # another CA's
            2: (pki.files(None), refused),  # no certificate at all
            3: (None, "requires TLS and this link is plaintext: set controller_tls"),
        }
        sidecar = TieringProcess(  # beside broker 0, with another CA's certificate
            tmp_path / "outsider-tiering",
            broker=f"127.0.0.1:{cluster.brokers[0].settings['tiering_port']}",
            settings={
                **TIERING,
                "remote": f"file://{tmp_path}/remote",
                "broker_tls": stranger.files("outsider", ca_file=pki.ca_file),
            },
        )
        started: list[ServiceProcess] = [sidecar]
        try:
            brokers = []
            for node_id, (tls, expected) in outsiders.items():
                settings: dict[str, Any] = {**FAST_BROKER, "offsets_topic_replication_factor": 1}
                if tls is not None:
                    settings["controller_tls"] = tls
                broker = RefusedBroker(
                    tmp_path / f"outsider-{node_id}",
                    expected,
                    controllers=cluster.controller_addresses,
                    node_id=node_id,
                    settings=settings,
                )
                brokers.append(broker)
                started.append(broker)
                broker.start()
            sidecar.start()

            for broker in brokers:  # retrying, one warning a try, and still running
                wait_for(broker.retried_thrice, WAIT, f"broker {broker.node_id} retrying")
                assert broker.running
                assert broker.stderr_text().count(broker.expected) == 1  # once, not per try
            controller = cluster.controllers[0]
            assert controller.sample("directlog_controller_registered_brokers") == 1
            log = controller.stderr_text()
            assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in log  # gRPC's own handshake report
            assert re.search(r"Handshake failed.*CERTIFICATE_VERIFY_FAILED", log)
            assert cluster.live_brokers() == {0}

            wait_for(
                lambda: f"TLS to the broker at {sidecar.broker} failed" in sidecar.stderr_text(),
                WAIT,
                f"the sidecar refused\n{sidecar.stderr_tail()}",
            )
            assert refused in sidecar.stderr_text() and sidecar.running
            produce_and_read(cluster, "still-serving", 300, seed=29)
        finally:
            for process in started:
                process.stop()


def test_renewed_certificates_serve_the_next_connection(tmp_path: Path, pki: Pki) -> None:
    with tls_cluster(tmp_path, pki) as cluster:
        controller = cluster.controllers[0]
        broker = cluster.brokers[0]
        tiering_port = int(broker.settings["tiering_port"])
        assert served_serial(controller.port, pki.ca_file) == _serial(
            pki.directory / "controller.pem"
        )

        # Servers: the next handshake gets the renewed certificate, no restart.
        renewed_controller = pki.issue("controller", hosts=LOOPBACK).cert.serial_number
        renewed_broker = pki.issue("broker-tiering", hosts=LOOPBACK).cert.serial_number
        assert served_serial(controller.port, pki.ca_file) == renewed_controller
        assert served_serial(tiering_port, pki.ca_file) == renewed_broker
        # Half a renewal (a new key, the certificate not yet written) is not served.
        next_pair = pki.ca.issue("controller", hosts=LOOPBACK)
        (pki.directory / "controller.key").write_bytes(next_pair.key_pem())
        assert served_serial(controller.port, pki.ca_file) == renewed_controller
        assert "do not load, kept" in controller.stderr_text()
        (pki.directory / "controller.pem").write_bytes(next_pair.cert_pem())
        assert served_serial(controller.port, pki.ca_file) == next_pair.cert.serial_number
        produce_and_read(cluster, "after-server-renewal", 200, seed=30)

        # Clients: a broker whose certificate is replaced by one the controllers do not
        # trust reconnects with it and is refused; given a good one again, it comes back.
        stranger = make_pki(tmp_path / "stranger-pki", "some-other-ca")
        stranger.ca.issue("broker").write(
            pki.directory / "broker.pem", pki.directory / "broker.key"
        )
        wait_for(
            lambda: "TLS to the controller" in broker.stderr_text(),
            WAIT,
            f"the broker refused with its new certificate\n{broker.stderr_tail()}",
        )
        fenced = "directlog_controller_fenced_brokers"
        wait_for(lambda: controller.sample(fenced) == 1, WAIT, "the broker fenced")
        pki.issue("broker")
        wait_for(lambda: controller.sample(fenced) == 0, WAIT, "the broker back")
        cluster.wait_live({0}, timeout=WAIT)
        produce_and_read(cluster, "after-client-renewal", 200, seed=31)
        assert broker.running and cluster.tierings[0].running


def _serial(cert_file: Path) -> int:
    return x509.load_pem_x509_certificate(cert_file.read_bytes()).serial_number
