"""A throwaway certificate authority and the certificates it signs, as PEM files.

`make run SECURE=1` writes one for the local cluster (data/ca.pem) and the tests make one
per test; a production site brings its own (cert-manager on Kubernetes). Keys are P-256 EC,
certificates SHA-256 signed, valid for `days` from five minutes ago (clock skew).

    ca = CertificateAuthority.create("directlog-local-ca")
    ca.write(directory / "ca.pem")
    broker = ca.issue("broker-0", hosts=["127.0.0.1", "localhost"])
    broker.write(directory / "broker.pem", directory / "broker.key")
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class Certificate:
    """A certificate with its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self, password: bytes | None = None) -> bytes:
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(password)
            if password
            else serialization.NoEncryption()
        )
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )

    def write(self, cert_path: Path, key_path: Path, password: bytes | None = None) -> None:
        """The certificate and its key (owner-only), each to its file; the key first, so a
        reader that watches the certificate never pairs it with the previous key."""
        _write_private(key_path, self.key_pem(password))
        cert_path.write_bytes(self.cert_pem())


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    own: Certificate

    @classmethod
    def create(cls, name: str, days: int = 365) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(Certificate(cert, key))

    def cert_pem(self) -> bytes:
        return self.own.cert_pem()

    def write(self, path: Path) -> None:
        path.write_bytes(self.cert_pem())

    def issue(
        self,
        common_name: str,
        *,
        hosts: Sequence[str] = (),
        organization: str | None = None,
        days: int = 365,
        not_after: datetime.datetime | None = None,
    ) -> Certificate:
        """A certificate for both ends of TLS (serverAuth and clientAuth) naming `hosts`
        (DNS names or IP addresses) as subject alternative names. Its subject is
        CN=<common_name>[,O=<organization>], which is what an SSL listener takes as the
        client's principal (User:CN=...)."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:  # most general first, so RFC 4514 prints CN=...,O=...
            attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.own.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(not_after or now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.own.key.public_key()),
                critical=False,
            )
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(host) for host in hosts]),
                critical=False,
            )
        return Certificate(builder.sign(self.own.key, hashes.SHA256()), key)


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not cert_sign,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)
