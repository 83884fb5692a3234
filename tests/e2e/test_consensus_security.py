"""The consensus service's security against real processes and real clients: kazoo over
the TLS client port (with and without client certificates), digest, x509 and SASL
DIGEST-MD5 identities in ACLs, SASL required, ZAB between members over mutual TLS, and
controllers that keep cluster state to their own identity.

Each test makes its own CA and certificates (directlog.security.certs) and its own
ensemble; every wait is bounded and nothing asserts on durations.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.protocol.states import KeeperState
from kazoo.security import ACL, CREATOR_ALL_ACL, Id, Permissions, make_digest_acl_credential

from directlog.rpc import controller_pb2 as pb
from directlog.rpc.controller_pb2_grpc import ControllerStub
from directlog.security.certs import CertificateAuthority
from services.consensus.fourletter import ask
from services.controller.layout import Layout
from tests.e2e.controller import ControllerProcess
from tests.e2e.ensemble import Ensemble, KazooClients, wait_until
from tests.e2e.zk_raw import GET_DATA, RawSession, boolean, buffer, frame, integer, ustring

WAIT = 20.0  # bound of every wait for the ensemble or a controller to get somewhere
CLIENT_DN = "CN=controller,O=directlog"  # the subject of the client certificate, as an x509 id
SASL = 102  # GetSASLRequest's opcode


@dataclass(frozen=True)
class Pki:
    """An ensemble CA with a member and a client certificate, and another CA with a member
    certificate of its own (what a stranger or a rogue member holds)."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def other_ca(self) -> Path:
        return self.dir / "other-ca.pem"

    def files(self, name: str, ca: Path | None = None) -> dict[str, str]:
        """TlsFiles settings of certificate ``name`` (member, client, rogue)."""
        return {
            "cert_file": str(self.dir / f"{name}.pem"),
            "key_file": str(self.dir / f"{name}.key"),
            "ca_file": str(ca or (self.other_ca if name == "rogue" else self.ca)),
        }

    def kazoo_tls(self, *, certificate: bool = True, ca: Path | None = None) -> dict[str, Any]:
        options: dict[str, Any] = {"use_ssl": True, "verify_certs": True, "ca": str(ca or self.ca)}
        if certificate:
            options.update(
                certfile=str(self.dir / "client.pem"), keyfile=str(self.dir / "client.key")
            )
        return options

    def context(self, *, certificate: bool = True, ca: Path | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(ca or self.ca))
        if certificate:
            context.load_cert_chain(self.dir / "client.pem", self.dir / "client.key")
        return context


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    pki = Pki(tmp_path / "pki")
    pki.dir.mkdir()
    ca = CertificateAuthority.create("directlog-test-ca")
    ca.write(pki.ca)
    ca.issue("member", hosts=["127.0.0.1"]).write(pki.dir / "member.pem", pki.dir / "member.key")
    ca.issue("controller", organization="directlog").write(
        pki.dir / "client.pem", pki.dir / "client.key"
    )
    other = CertificateAuthority.create("someone-else")
    other.write(pki.other_ca)
    other.issue("member", hosts=["127.0.0.1"]).write(pki.dir / "rogue.pem", pki.dir / "rogue.key")
    return pki


@pytest.fixture
def zk() -> Iterator[KazooClients]:
    """Starts kazoo clients (``zk(hosts, **options)``), all stopped when the test ends."""
    clients = KazooClients("", start_timeout=WAIT)
    yield clients
    clients.close()


@contextlib.contextmanager
def secured_member(work_dir: Path, pki: Pki, **settings: Any) -> Iterator[Ensemble]:
    """One member serving both the plaintext and the TLS client port."""
    ensemble = Ensemble(
        work_dir,
        size=1,
        secure_client=True,
        settings={"client_tls": pki.files("member"), **settings},
    )
    with ensemble:
        ensemble.start().wait_serving(timeout=WAIT)
        yield ensemble


def refused(hosts: str, **options: Any) -> None:
    """A kazoo client with these options gets no session."""
    client = KazooClient(hosts=hosts, timeout=2.0, **options)
    try:
        with pytest.raises(client.handler.timeout_exception):
            client.start(timeout=3.0)
    finally:
        with contextlib.suppress(Exception):
            client.stop()
        client.close()


def acl_ids(acls: list[ACL]) -> list[tuple[int, str, str]]:
    return [(a.perms, a.id.scheme, a.id.id) for a in acls]


def sasl(user: str, password: str) -> dict[str, str]:
    return {"mechanism": "DIGEST-MD5", "username": user, "password": password}


def closed_after(port: int, data: bytes) -> bytes:
    """Send ``data`` on a new connection and read until the member closes it (a TLS
    alert, if any, is what comes back); a connection left open fails the test."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(data)
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
    return received


def client_hello() -> bytes:
    """The first flight of a TLS client."""
    outgoing = ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(
        ssl.MemoryBIO(), outgoing, server_hostname="127.0.0.1"
    )
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


# -- the TLS client port -------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_kazoo_over_tls_with_and_without_a_client_certificate(
    tmp_path: Path, pki: Pki, zk: KazooClients
) -> None:
    with secured_member(tmp_path, pki, ssl_client_auth="want") as ens:
        with_cert = zk(ens.secure_hosts, **pki.kazoo_tls())
        only_it = [ACL(Permissions.ALL, Id("x509", CLIENT_DN))]
        with_cert.create("/x509", b"for the certificate only", acl=only_it)
        assert with_cert.get("/x509")[0] == b"for the certificate only"
        assert acl_ids(with_cert.get_acls("/x509")[0]) == [(31, "x509", CLIENT_DN)]
        with_cert.create("/creator", b"", acl=CREATOR_ALL_ACL)  # "auth": the x509 id it holds
        assert acl_ids(with_cert.get_acls("/creator")[0]) == [(31, "x509", CLIENT_DN)]

        without_cert = zk(ens.secure_hosts, **pki.kazoo_tls(certificate=False))
        assert without_cert.exists("/x509") is not None
        with pytest.raises(NoAuthError):
            without_cert.get("/x509")
        with pytest.raises(NoAuthError):
            without_cert.set("/x509", b"mine now")
        plaintext = zk(ens.hosts)
        with pytest.raises(NoAuthError):
            plaintext.get("/x509")
        assert with_cert.get("/x509")[0] == b"for the certificate only"
        assert ask(ens.secure_ports[1], "ruok", tls=pki.context(certificate=False)) == "imok"


@pytest.mark.timeout(90)
def test_need_refuses_clients_without_a_certificate_or_trust(
    tmp_path: Path, pki: Pki, zk: KazooClients
) -> None:
    with secured_member(tmp_path, pki) as ens:  # ssl_client_auth "need", ZooKeeper's default
        port = ens.secure_ports[1]
        client = zk(ens.secure_hosts, **pki.kazoo_tls())
        client.create("/needed", b"yes")
        refused(ens.secure_hosts, **pki.kazoo_tls(certificate=False))
        with contextlib.suppress(OSError):  # the member refuses it in the handshake's end
            assert ask(port, "ruok", tls=pki.context(certificate=False)) == ""
        # A client that does not trust the ensemble's CA fails its own handshake.
        with (
            socket.create_connection(("127.0.0.1", port), timeout=WAIT) as raw,
            pytest.raises(ssl.SSLCertVerificationError),
        ):
            pki.context(ca=pki.other_ca).wrap_socket(raw, server_hostname="127.0.0.1")
        refused(ens.secure_hosts, **pki.kazoo_tls(ca=pki.other_ca))
        assert client.get("/needed")[0] == b"yes"
        assert zk(ens.secure_hosts, **pki.kazoo_tls()).get("/needed")[0] == b"yes"


@pytest.mark.timeout(90)
def test_bad_bytes_on_either_port_close_only_their_connection(
    tmp_path: Path, pki: Pki, zk: KazooClients
) -> None:
    with secured_member(tmp_path, pki, ssl_client_auth="want") as ens:
        secure = zk(ens.secure_hosts, **pki.kazoo_tls())
        plaintext = zk(ens.hosts)
        secure.create("/alive", b"0")
        sessions = (secure.client_id, plaintext.client_id)
        connect = frame(integer(0) + bytes(8) + integer(5000) + bytes(8) + buffer(bytes(16)))
        noise = b"\xff" + random.Random(7).randbytes(599)
        for garbage in (noise, connect, b"ruok\r\n"):  # plaintext on the TLS port
            reply = closed_after(ens.secure_ports[1], garbage)
            assert reply[:1] in (b"", b"\x15"), reply  # nothing, or a TLS alert record
        assert closed_after(ens.client_ports[1], client_hello()) == b""  # TLS on plaintext
        for n, client in enumerate((secure, plaintext, secure), start=1):
            client.set("/alive", str(n).encode())
        assert plaintext.get("/alive")[0] == b"3"
        assert (secure.client_id, plaintext.client_id) == sessions  # never reconnected
        assert zk(ens.secure_hosts, **pki.kazoo_tls()).get("/alive")[0] == b"3"


# -- digest and SASL -------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_digest_ids_are_zookeepers_and_acls_hold_over_tls(
    tmp_path: Path, pki: Pki, zk: KazooClients
) -> None:
    with secured_member(tmp_path, pki, ssl_client_auth="none") as ens:
        alice = zk(ens.secure_hosts, **pki.kazoo_tls(certificate=False))
        alice.add_auth("digest", "alice:pw:with:colons")
        alice.create("/alice", b"hers", acl=CREATOR_ALL_ACL)
        expected = make_digest_acl_credential("alice", "pw:with:colons")  # kazoo's own hash
        assert acl_ids(alice.get_acls("/alice")[0]) == [(31, "digest", expected)]
        impostor = zk(ens.secure_hosts, **pki.kazoo_tls(certificate=False))
        impostor.add_auth("digest", "alice:guessed")
        attempts: list[Callable[[], object]] = [
            lambda: impostor.get("/alice"),
            lambda: impostor.set("/alice", b"mine"),
            lambda: impostor.create("/alice/child", b""),
            lambda: impostor.set_acls("/alice", CREATOR_ALL_ACL),
        ]
        for attempt in attempts:
            with pytest.raises(NoAuthError):
                attempt()
        again = zk(ens.hosts, auth_data=[("digest", "alice:pw:with:colons")])
        again.set("/alice", b"still hers")
        assert alice.get("/alice")[0] == b"still hers"


@pytest.mark.timeout(90)
def test_sasl_digest_md5_with_kazoo(tmp_path: Path, pki: Pki, zk: KazooClients) -> None:
    jaas = tmp_path / "jaas.conf"
    jaas.write_text(
        "Server {\n"
        "    org.apache.zookeeper.server.auth.DigestLoginModule required\n"
        '    user_carol="carol-pw";\n'
        "};\n"
    )
    users = {"bob": "bob-pw"}
    with secured_member(
        tmp_path, pki, ssl_client_auth="none", sasl_users=users, sasl_jaas_file=str(jaas)
    ) as ens:
        bob = zk(ens.hosts, sasl_options=sasl("bob", "bob-pw"))
        bob.create("/bob", b"his", acl=CREATOR_ALL_ACL)
        assert acl_ids(bob.get_acls("/bob")[0]) == [(31, "sasl", "bob")]
        bob.create("/carol", b"", acl=[ACL(Permissions.ALL, Id("sasl", "carol"))])
        with pytest.raises(NoAuthError):
            bob.get("/carol")
        tls = pki.kazoo_tls(certificate=False)  # SASL inside TLS too
        carol = zk(ens.secure_hosts, sasl_options=sasl("carol", "carol-pw"), **tls)
        carol.set("/carol", b"hers")
        assert carol.get("/carol")[0] == b"hers"
        with pytest.raises(NoAuthError):
            zk(ens.hosts).get("/bob")

        wrong = KazooClient(hosts=ens.hosts, timeout=5.0, sasl_options=sasl("bob", "guessed"))
        states: list[str] = []  # every state its connection reports, in order
        report = wrong._session_callback

        def record(state: str) -> None:
            states.append(state)
            report(state)

        wrong._session_callback = record
        try:
            wrong.start_async()
            wait_until(lambda: KeeperState.AUTH_FAILED in states, "AUTH_FAILED")
            assert not wrong.connected
        finally:
            with contextlib.suppress(Exception):
                wrong.stop()
            wrong.close()
        wait_until(lambda: "wrong password for 'bob'" in ens.logs(200), "the failure logged")
        assert bob.get("/bob")[0] == b"his"


@pytest.mark.timeout(90)
def test_sasl_required_lets_a_connection_only_authenticate(
    tmp_path: Path, pki: Pki, zk: KazooClients
) -> None:
    users = {"bob": "bob-pw"}
    with secured_member(tmp_path, pki, sasl_users=users, sasl_required=True) as ens:
        port = ens.client_ports[1]
        with RawSession.open(port) as raw:
            raw.send_request(1, GET_DATA, ustring("/") + boolean(False))
            reply = raw.reply()
            assert (reply.xid, reply.err) == (1, -124)  # SESSIONCLOSEDREQUIRESASLAUTH
            assert raw.is_closed_by_server()
        with RawSession.open(port) as raw:
            raw.send_request(1, SASL, buffer(b"username=bob"))  # DIGEST-MD5 starts empty
            reply = raw.reply()
            assert (reply.xid, reply.err) == (1, -124)
            assert raw.is_closed_by_server()
        with RawSession.open(port) as raw:
            raw.send_request(1, SASL, buffer(b""))
            reply = raw.reply()
            assert (reply.xid, reply.err) == (1, 0)
            assert b'realm="zk-sasl-md5"' in reply.body and b'qop="auth"' in reply.body
        bob = zk(ens.hosts, sasl_options=sasl("bob", "bob-pw"))
        bob.create("/after-sasl", b"1")
        assert bob.get("/after-sasl")[0] == b"1"


# -- ZAB over mutual TLS -------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_quorum_tls_elects_and_commits_and_keeps_a_stranger_out(
    tmp_path: Path, pki: Pki, zk: KazooClients
) -> None:
    third = tmp_path / "member-3-tls"
    third.mkdir()
    for suffix in ("pem", "key"):
        shutil.copy(pki.dir / f"rogue.{suffix}", third / f"member.{suffix}")
    shutil.copy(pki.other_ca, third / "ca.pem")
    third_files = {
        "cert_file": str(third / "member.pem"),
        "key_file": str(third / "member.key"),
        "ca_file": str(third / "ca.pem"),
    }
    ensemble = Ensemble(
        tmp_path,
        size=3,
        settings={"quorum_tls": pki.files("member"), "tls_check_interval_ms": 200},
        member_settings={3: {"quorum_tls": third_files}},
    )
    with ensemble as ens:
        ens.start()
        leader = ens.wait_serving([1, 2], timeout=WAIT)
        first, second = zk(ens.host(1)), zk(ens.host(2))
        first.create("/over-tls", b"committed")
        second.sync("/over-tls")
        assert second.get("/over-tls")[0] == b"committed"
        wait_until(lambda: "CERTIFICATE_VERIFY_FAILED" in ens.logs(400), "a refused member 3")
        assert ens.mode(3) == "looking"
        assert ens.stat(leader)["zk_followers"] == "1"

        # Given the ensemble's certificate on disk, member 3 joins without a restart.
        for suffix in ("key", "pem"):
            shutil.copy(pki.dir / f"member.{suffix}", third / f"member.{suffix}")
        shutil.copy(pki.ca, third / "ca.pem")
        ens.wait_serving([1, 2, 3], timeout=WAIT)
        late = zk(ens.host(3))
        late.sync("/over-tls")
        assert late.get("/over-tls")[0] == b"committed"
        late.set("/over-tls", b"by member 3")
        first.sync("/over-tls")
        assert first.get("/over-tls")[0] == b"by member 3"


# -- the controller as a secured client ----------------------------------------------------


def register_broker(controller: ControllerProcess, broker_id: int) -> None:
    request = pb.RegisterBrokerRequest(
        broker_id=broker_id,
        incarnation_id=f"incarnation-{broker_id}",
        listeners=[pb.Listener(name="PLAINTEXT", host="127.0.0.1", port=9000 + broker_id)],
    )
    with grpc.insecure_channel(controller.address) as channel:
        stub = ControllerStub(channel)  # type: ignore[no-untyped-call]

        def registered() -> bool:
            try:
                stub.RegisterBroker(request, timeout=5)
            except grpc.RpcError as exc:
                if exc.code() not in (
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.UNAVAILABLE,
                ):
                    raise
                return False
            return True

        wait_until(registered, f"broker {broker_id} registered")


def znodes(client: KazooClient, root: str) -> list[str]:
    found, todo = [], [root]
    while todo:
        path = todo.pop()
        found.append(path)
        todo += [f"{path}/{child}" for child in client.get_children(path)]
    return sorted(found)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("scheme", ["digest", "sasl"])
def test_a_controller_keeps_cluster_state_to_its_own_identity(
    tmp_path: Path, pki: Pki, zk: KazooClients, scheme: str
) -> None:
    root = "/secured"
    password = "controller-pw"
    with secured_member(tmp_path, pki, sasl_users={"controller": password}) as ens:
        tls = pki.files("client")
        auth = {"scheme": scheme, "username": "controller", "password": password}
        owner = ControllerProcess(
            tmp_path,
            ens.secure_hosts,
            controller_id=1,
            settings={"root": root, "consensus_tls": tls, "consensus_auth": auth},
        )
        intruder = ControllerProcess(
            tmp_path,
            ens.secure_hosts,
            controller_id=2,
            settings={"root": root, "consensus_tls": tls},
        )
        with owner:
            wait_until(lambda: owner.sample("directlog_controller_active") == 1, "owner active")
            register_broker(owner, 1)
            if scheme == "digest":
                admin = zk(
                    ens.secure_hosts,
                    auth_data=[("digest", f"controller:{password}")],
                    **pki.kazoo_tls(),
                )
                only = [(31, "digest", make_digest_acl_credential("controller", password))]
            else:
                admin = zk(
                    ens.secure_hosts, sasl_options=sasl("controller", password), **pki.kazoo_tls()
                )
                only = [(31, "sasl", "controller")]
            paths = Layout(root)
            everything = znodes(admin, root)
            assert {root, paths.controller, paths.controller_epoch, f"{paths.brokers}/1"} <= set(
                everything
            )
            assert {p: acl_ids(admin.get_acls(p)[0]) for p in everything} == {
                p: only for p in everything
            }

            stranger = zk(ens.secure_hosts, **pki.kazoo_tls())  # a valid certificate, no more
            epoch, epoch_stat = admin.get(paths.controller_epoch)
            attempts: list[Callable[[], object]] = [
                lambda: stranger.get(f"{paths.brokers}/1"),
                lambda: stranger.get_children(paths.brokers),
                lambda: stranger.set(paths.controller_epoch, b'{"epoch": 99}'),
                lambda: stranger.create(f"{paths.brokers}/2", b""),
                lambda: stranger.delete(f"{paths.brokers}/1"),
            ]
            for attempt in attempts:
                with pytest.raises(NoAuthError):
                    attempt()

            with intruder:  # a controller without the credentials
                wait_until(lambda: "NoAuthError" in intruder.stderr_text(), "the intruder refused")
                assert intruder.sample("directlog_controller_active") == 0
                assert owner.sample("directlog_controller_active") == 1
            assert admin.get(paths.controller_epoch) == (epoch, epoch_stat)
