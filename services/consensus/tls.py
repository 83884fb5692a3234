"""TLS of a member: its secure client port (ZooKeeper's secureClientPort) and its links to
the other members (sslQuorum), both on asyncio's TLS transports.

asyncio takes one context per listener, so ``following`` gives it a context whose SNI
callback hands every new handshake the ``ReloadingContext``'s current one: a renewed
certificate or CA on disk takes effect for new connections without a restart, as on the
broker's listeners. Plaintext listeners get no context and run exactly as before.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass

from cryptography import x509

from directlog.security.tls import ClientAuth, ReloadingContext, client_context, server_context
from services.consensus.jute.records import Id
from services.consensus.settings import ConsensusSettings

HANDSHAKE_TIMEOUT = 10.0  # seconds a client gets to finish its TLS handshake

# ZooKeeper's ssl.clientAuth values, as directlog.security.tls names them (Kafka's).
_CLIENT_AUTH: dict[str, ClientAuth] = {"none": "none", "want": "requested", "need": "required"}


def following(reloading: ReloadingContext) -> ssl.SSLContext:
    """A server context for asyncio that switches each handshake to ``reloading``'s
    current context (certificate, key and CA), checked for changes as it says."""
    base = reloading.current()

    def switch(sslobj: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        current = reloading.current()
        if current is not context:
            sslobj.context = current

    base.sni_callback = switch
    return base


def client_port_context(settings: ConsensusSettings) -> ssl.SSLContext:
    """The secure client port's context: ``client_tls``, client certificates as
    ``ssl_client_auth`` says (ZooKeeper's ssl.clientAuth: none, want, need)."""
    files = settings.client_tls
    assert files is not None, "checked by ConsensusSettings"
    client_auth = _CLIENT_AUTH[settings.ssl_client_auth]
    return following(
        ReloadingContext(
            files,
            lambda: server_context(files, client_auth),
            settings.tls_check_interval_ms / 1000,
        )
    )


@dataclass(frozen=True, slots=True)
class QuorumTls:
    """Mutual TLS between members: ``server`` accepts only peers whose certificate chains
    to the ensemble CA, ``client`` (current one per dial) checks the dialed member's."""

    server: ssl.SSLContext
    client: ReloadingContext
    check_hostname: bool


def quorum_tls(settings: ConsensusSettings) -> QuorumTls | None:
    files = settings.quorum_tls
    if files is None:
        return None
    interval = settings.tls_check_interval_ms / 1000
    verify = settings.quorum_hostname_verification
    return QuorumTls(
        following(ReloadingContext(files, lambda: server_context(files, "required"), interval)),
        ReloadingContext(files, lambda: client_context(files, check_hostname=verify), interval),
        verify,
    )


def peer_certificate(ssl_object: ssl.SSLObject | None) -> x509.Certificate | None:
    """The certificate the other end presented and the handshake verified, if any."""
    if ssl_object is None or ssl_object.context.verify_mode == ssl.CERT_NONE:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der) if der else None


def x509_id(certificate: x509.Certificate) -> Id:
    """ZooKeeper's X509AuthenticationProvider id: the subject DN, most specific attribute
    first (``CN=controller,O=directlog``), as Java's X500Principal.getName() prints it."""
    return Id("x509", certificate.subject.rfc4514_string())


def names_host(certificate: x509.Certificate, host: str) -> bool:
    """Whether the certificate's subject alternative names cover ``host`` (an IP address,
    or a DNS name, ``*.`` wildcards matching one leftmost label), as a dialer checks."""
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return address in names.get_values_for_type(x509.IPAddress)
    wanted = host.lower().rstrip(".")
    for name in names.get_values_for_type(x509.DNSName):
        pattern = name.lower().rstrip(".")
        if pattern == wanted:
            return True
        if pattern.startswith("*.") and wanted.partition(".")[2] == pattern[2:]:
            return True
    return False
