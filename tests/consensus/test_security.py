"""The consensus service's security pieces without processes: the DIGEST-MD5 server
against RFC 2831's example and against pure-sasl (the client kazoo uses), JAAS users,
the settings that tie TLS and SASL together, ACL schemes, certificate identities, and the
peer transport over mutual TLS on real loopback sockets (asyncio and uvloop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop
from kazoo.security import make_digest_acl_credential
from puresasl.client import SASLClient  # type: ignore[import-untyped]
from pydantic import ValidationError

from directlog.security.certs import CertificateAuthority
from services.consensus.codes import ErrorCode, Perm
from services.consensus.peers import PeerNetwork
from services.consensus.sasl import (
    DigestFields,
    DigestMd5Server,
    SaslError,
    digest_value,
    jaas_users,
    parse_directives,
)
from services.consensus.settings import ConsensusSettings
from services.consensus.tls import names_host, quorum_tls, x509_id
from services.consensus.tree import ACL, Id, KeeperError, digest
from services.consensus.tree.acl import fixup_acl
from services.consensus.zab.messages import Message, Ping

HOST = "127.0.0.1"
DEADLINE = 5.0
MEMBER = {"client": "127.0.0.1:2181", "peer": "127.0.0.1:2881"}
FILES = {"cert_file": "m.pem", "key_file": "m.key", "ca_file": "ca.pem"}


# -- SASL DIGEST-MD5 -----------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_digest_values_match_rfc_2831s_example() -> None:
    fields = DigestFields(
        "chris", "elwood.innosoft.com", "secret", b"OA6MG9tEQGm2hh", b"OA6MHXh6VqTrRk",
        b"00000001", b"auth",
    )  # fmt: skip
    uri = b"imap/elwood.innosoft.com"
    assert digest_value(fields, uri) == b"d388dad90d4bbd760a152321f2143af7"
    assert digest_value(fields, uri, method=b"") == b"ea40f60335c427b5527b84dbabcdfffd"


def pure_sasl(user: str, password: str, service: str = "zookeeper") -> Any:
    """The client kazoo runs, set up as kazoo sets it up for DIGEST-MD5."""
    return SASLClient(
        "zk-sasl-md5", service=service, mechanism="DIGEST-MD5", username=user, password=password
    )


def exchange(server: DigestMd5Server, client: Any) -> None:
    """kazoo's loop: an empty first token, then each challenge answered until complete."""
    challenge = server.step(client.process(None) or b"")
    final = server.step(client.process(challenge))
    assert client.process(final) is None


@pytest.mark.timeout(10)
def test_pure_sasl_authenticates_and_checks_the_servers_rspauth() -> None:
    server = DigestMd5Server({"bob": "bob-pw", "carol": "carol-pw"})
    client = pure_sasl("bob", "bob-pw")
    exchange(server, client)
    assert server.complete and server.user == "bob"
    assert client.complete  # it verified rspauth: the server knew the password too
    with pytest.raises(SaslError, match="already complete"):
        server.step(b"")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("user", "password", "service", "why"),
    [
        ("bob", "guessed", "zookeeper", "wrong password"),
        ("mallory", "bob-pw", "zookeeper", "no user"),
        ("bob", "bob-pw", "kafka", "digest-uri"),
    ],
)
def test_pure_sasl_is_refused(user: str, password: str, service: str, why: str) -> None:
    server = DigestMd5Server({"bob": "bob-pw"})
    client = pure_sasl(user, password, service)
    challenge = server.step(b"")
    with pytest.raises(SaslError, match=why):
        server.step(client.process(challenge))
    assert not server.complete and server.user is None


@pytest.mark.timeout(10)
def test_a_response_made_for_another_challenge_or_replayed_is_refused() -> None:
    first = DigestMd5Server({"bob": "bob-pw"})
    client = pure_sasl("bob", "bob-pw")
    response = client.process(first.step(b""))
    second = DigestMd5Server({"bob": "bob-pw"})
    second.step(b"")
    with pytest.raises(SaslError, match="nonce"):
        second.step(response)
    replayed = response.replace(b"nc=00000001", b"nc=00000002")
    with pytest.raises(SaslError, match="nonce count"):
        first.step(replayed)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("tokens", "why"),
    [
        ([b"username=bob"], "starts with an empty"),
        ([b"", b"username=bob"], "has no nonce"),
        ([b"", b'username="bob",username="eve"'], "twice"),
        ([b"", b'username="bob" nonce'], "malformed"),
        ([b"", b"x" * 5000], "at most"),
        (
            [
                b"",
                b'username="b",nonce="n",cnonce="c",nc=00000001,qop=auth-int,digest-uri="x",response=0',
            ],
            "qop",
        ),
    ],
)
def test_malformed_tokens_are_refused(tokens: list[bytes], why: str) -> None:
    server = DigestMd5Server({"bob": "bob-pw"})
    *before, last = tokens
    for token in before:
        server.step(token)
    with pytest.raises(SaslError, match=why):
        server.step(last)


@pytest.mark.timeout(10)
def test_directives_unquote_and_skip_empty_list_items() -> None:
    token = b' ,realm="zk\\"md5" , nonce=abc,,qop="auth",'
    assert parse_directives(token) == {"realm": b'zk"md5', "nonce": b"abc", "qop": b"auth"}


@pytest.mark.timeout(10)
def test_jaas_users_come_from_the_server_section_only(tmp_path: Path) -> None:
    text = (
        "Client {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
        '  username="bob" password="client-side" user_client="no";\n};\n'
        "Server {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
        '  user_super="admin secret"\n  user_bob="with \\"quotes\\"";\n};\n'
    )
    assert jaas_users(text) == {"super": "admin secret", "bob": 'with "quotes"'}
    with pytest.raises(ValueError, match="Server"):
        jaas_users('Client { user_a="b"; };')
    jaas = tmp_path / "jaas.conf"
    jaas.write_text(text)
    settings = ConsensusSettings.model_validate(
        {
            "members": {1: MEMBER},
            "sasl_jaas_file": jaas,
            "sasl_users": {"bob": "from-settings", "carol": "carol-pw"},
        }
    )
    assert settings.sasl_credentials() == {
        "super": "admin secret",
        "bob": "from-settings",  # the mapping wins over the file
        "carol": "carol-pw",
    }


# -- settings ------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"members": {1: {"peer": "127.0.0.1:2881"}}}, "client or a secure_client"),
        ({"members": {1: {**MEMBER, "secure_client": "127.0.0.1:2281"}}}, "client_tls"),
        (
            {
                "members": {1: {**MEMBER, "secure_client": "127.0.0.1:2281"}},
                "client_tls": {"cert_file": "m.pem", "key_file": "m.key"},
            },
            "needs client_tls.ca_file",
        ),
        (
            {"members": {1: MEMBER}, "quorum_tls": {"cert_file": "m.pem", "key_file": "m.key"}},
            "mutual",
        ),
        ({"members": {1: MEMBER}, "sasl_required": True}, "sasl_users"),
        ({"members": {1: MEMBER}, "ssl_client_auth": "required"}, "ssl_client_auth"),
    ],
)
def test_settings_refuse_what_cannot_run(settings: dict[str, Any], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        ConsensusSettings.model_validate(settings)


@pytest.mark.timeout(10)
def test_settings_of_a_tls_only_member() -> None:
    settings = ConsensusSettings.model_validate(
        {
            "members": {1: {"secure_client": "127.0.0.1:2281", "peer": "127.0.0.1:2881"}},
            "client_tls": {"cert_file": "m.pem", "key_file": "m.key"},
            "ssl_client_auth": "none",
            "quorum_tls": FILES,
        }
    )
    assert settings.members[1].client is None
    assert settings.quorum_hostname_verification and settings.ssl_client_auth == "none"
    defaults = ConsensusSettings.model_validate({"members": {1: MEMBER}})
    assert defaults.ssl_client_auth == "need"  # ZooKeeper's default


# -- ACLs ----------------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("credentials", ["alice:pw", "alice:pw:with:colons", "zoë:pässwörd"])
def test_digest_ids_are_kazoos_and_zookeepers(credentials: str) -> None:
    user, _, password = credentials.partition(":")
    assert digest(credentials) == make_digest_acl_credential(user, password)


@pytest.mark.timeout(10)
def test_the_auth_scheme_expands_to_every_proven_id_and_new_schemes_validate() -> None:
    proven = frozenset(
        {
            Id("digest", "alice:hash="),
            Id("sasl", "bob"),
            Id("x509", "CN=controller,O=directlog"),
            Id("world", "anyone"),
        }
    )
    fixed = fixup_acl((ACL(int(Perm.ALL), Id("auth", "")),), proven)
    assert [a.id.scheme for a in fixed] == ["digest", "sasl", "x509"]
    explicit = (ACL(int(Perm.READ), Id("sasl", "carol")), ACL(31, Id("x509", "CN=x")))
    assert fixup_acl(explicit, frozenset()) == explicit
    for bad in (Id("sasl", ""), Id("x509", ""), Id("ip", "10.0.0.1")):
        with pytest.raises(KeeperError) as refused:
            fixup_acl((ACL(31, bad),), proven)
        assert refused.value.code == ErrorCode.INVALIDACL


# -- certificates --------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_x509_ids_and_host_names_of_certificates() -> None:
    ca = CertificateAuthority.create("ca")
    client = ca.issue("controller", organization="directlog").cert
    assert x509_id(client) == Id("x509", "CN=controller,O=directlog")
    member = ca.issue("m", hosts=["127.0.0.1", "consensus-0.consensus.ns.svc", "*.peers.ns"]).cert
    assert names_host(member, "127.0.0.1") and not names_host(member, "127.0.0.2")
    assert names_host(member, "Consensus-0.consensus.ns.svc.")
    assert names_host(member, "consensus-1.peers.ns")
    assert not names_host(member, "a.b.peers.ns") and not names_host(member, "peers.ns")
    assert not names_host(client, "127.0.0.1")  # no subject alternative names at all


# -- the peer transport over mutual TLS ------------------------------------------------------


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Iterator[Callable[[Coroutine[Any, Any, None]], None]]:
    factory = uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop

    def run(coro: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(asyncio.wait_for(coro, 4 * DEADLINE))

    yield run


class Pki:
    """The ensemble's CA and the files of certificates it (or another CA) issued."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = CertificateAuthority.create("ensemble")
        self.ca.write(directory / "ca.pem")
        self.other = CertificateAuthority.create("stranger")
        self.other.write(directory / "other-ca.pem")

    def files(self, name: str, hosts: list[str], *, foreign: bool = False) -> dict[str, str]:
        issuer = self.other if foreign else self.ca
        issuer.issue(name, hosts=hosts).write(self.dir / f"{name}.pem", self.dir / f"{name}.key")
        ca = "other-ca.pem" if foreign else "ca.pem"
        return {
            "cert_file": str(self.dir / f"{name}.pem"),
            "key_file": str(self.dir / f"{name}.key"),
            "ca_file": str(self.dir / ca),
        }


class TlsMember:
    """A PeerNetwork with quorum TLS from ``files``, recording what it receives."""

    def __init__(self, my_id: int, files: dict[str, str], *, verify_hostname: bool = True):
        settings = ConsensusSettings.model_validate(
            {
                "members": {my_id: MEMBER},
                "quorum_tls": files,
                "quorum_hostname_verification": verify_hostname,
            }
        )
        self.id = my_id
        self.received: list[Message] = []
        self.net = PeerNetwork(
            my_id,
            {},
            self.received.append,
            lambda peer: None,
            retry_interval=0.01,
            max_retry_interval=0.1,
            tls=quorum_tls(settings),
        )
        self.port = 0

    async def start(self) -> TlsMember:
        self.port = await self.net.start(HOST, 0)
        return self


async def wait_until(what: str, check: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def pair(
    dialer: TlsMember, acceptor: TlsMember, dialer_seen_at: str = HOST
) -> tuple[TlsMember, TlsMember]:
    """Start both; ``dialer_seen_at``: the address the acceptor has for the dialer."""
    await dialer.start()
    await acceptor.start()
    dialer.net.set_peers({acceptor.id: (HOST, acceptor.port)})
    acceptor.net.set_peers({dialer.id: (dialer_seen_at, dialer.port)})
    return dialer, acceptor


@pytest.mark.timeout(60)
def test_members_with_the_ensembles_certificates_link_and_deliver(run: Any, tmp_path: Path) -> None:
    pki = Pki(tmp_path)

    async def main() -> None:
        one, two = await pair(
            TlsMember(1, pki.files("one", [HOST])), TlsMember(2, pki.files("two", [HOST]))
        )
        await wait_until(
            "linked", lambda: one.net.connected() == {2} and two.net.connected() == {1}
        )
        for i in range(100):
            one.net.send(2, Ping(1, i))
            two.net.send(1, Ping(2, i))
        await wait_until("delivered", lambda: len(one.received) == len(two.received) == 100)
        assert two.received == [Ping(1, i) for i in range(100)]
        assert one.received == [Ping(2, i) for i in range(100)]
        await one.net.close()
        await two.net.close()

    run(main())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stranger", ["dialer", "acceptor"])
def test_a_member_with_another_cas_certificate_never_links(
    run: Any, tmp_path: Path, stranger: str
) -> None:
    pki = Pki(tmp_path)

    async def main() -> None:
        one_files = pki.files("one", [HOST], foreign=stranger == "dialer")
        two_files = pki.files("two", [HOST], foreign=stranger == "acceptor")
        one, two = await pair(TlsMember(1, one_files), TlsMember(2, two_files))
        await asyncio.sleep(1.0)  # ten dial attempts and more
        assert one.net.connected() == set() and two.net.connected() == set()
        one.net.send(2, Ping(1, 1))
        await asyncio.sleep(0.1)
        assert two.received == []
        await one.net.close()
        await two.net.close()

    run(main())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("verify_hostname", [True, False])
def test_a_certificate_must_name_the_member_it_claims_to_be(
    run: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, verify_hostname: bool
) -> None:
    """Member 1's certificate is the ensemble's, but names 127.0.0.1 while member 2 knows
    member 1 as 127.0.0.2: with hostname verification member 2 refuses it."""
    pki = Pki(tmp_path)
    caplog.set_level(logging.WARNING, logger="services.consensus.peers")

    async def main() -> None:
        one = TlsMember(1, pki.files("one", [HOST]), verify_hostname=verify_hostname)
        two = TlsMember(2, pki.files("two", [HOST]), verify_hostname=verify_hostname)
        await pair(one, two, dialer_seen_at="127.0.0.2")
        if verify_hostname:
            await wait_until("refused", lambda: "does not name 127.0.0.2" in caplog.text)
            await asyncio.sleep(0.3)
            assert one.net.connected() == set() and two.net.connected() == set()
        else:
            await wait_until("linked", lambda: two.net.connected() == {1})
        await one.net.close()
        await two.net.close()

    run(main())
