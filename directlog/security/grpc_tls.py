"""Mutual TLS on the gRPC service links (broker → controller, tiering sidecar → broker),
from the same `TlsFiles` the Kafka listeners use.

gRPC takes PEM bytes, not an `ssl.SSLContext`, so the files are read here: an encrypted key
is decrypted in memory (gRPC has no key password), and a certificate whose key does not
match (a renewal caught half-written) is refused, the previous pair staying in use.

- Servers (`add_port`) require a client certificate chaining to ca_file. The certificate
  configuration is fetched again by gRPC before every TLS handshake, and is re-read when
  the files' sizes or modification times changed, so a renewed certificate (cert-manager
  rewriting a mounted Secret) serves the next connection without a restart.
- Clients (`Channels`) read the files when a channel is made; `outdated(channel)` says the
  files changed since, and the link then makes a new channel: its next connection presents
  the new certificate and trusts the new CA.

gRPC reports a server that refused the client's certificate only as "Socket closed". A
failed call on a channel from `Channels` therefore logs one line saying why TLS failed,
after a probe of the server with Python's ssl when gRPC did not say, once per address until
a call there succeeds again; the caller logs its retries as before.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from pydantic import AfterValidator

from directlog.security.tls import TlsFiles, client_context

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 3.0  # seconds for the diagnosis handshake and the server's first frame
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_GRPC_TLS_WORDS = ("handshake", "ssl", "tls", "certificate", "hostname verification")


@dataclass(frozen=True, slots=True)
class _Pem:
    """What gRPC is given: an unencrypted PKCS#8 key, its chain, the trusted CAs."""

    key: bytes | None
    chain: bytes | None
    ca: bytes | None


def _stamp(files: TlsFiles) -> tuple[tuple[int, int], ...]:
    stamps = []
    for path in files.paths():
        try:
            stat = path.stat()
        except OSError:
            stamps.append((-1, -1))
        else:
            stamps.append((stat.st_mtime_ns, stat.st_size))
    return tuple(stamps)


def _read(files: TlsFiles) -> _Pem:
    """The files as gRPC takes them; raises when they do not load together."""
    ca = files.ca_file.read_bytes() if files.ca_file is not None else None
    if ca is not None:
        x509.load_pem_x509_certificates(ca)  # raises on a file that holds no certificate
    if files.cert_file is None or files.key_file is None:
        return _Pem(None, None, ca)
    chain = files.cert_file.read_bytes()
    password = files.key_password.get_secret_value().encode() if files.key_password else None
    key: PrivateKeyTypes = serialization.load_pem_private_key(files.key_file.read_bytes(), password)
    leaf = x509.load_pem_x509_certificates(chain)[0]
    raw = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    if leaf.public_key().public_bytes(*raw) != key.public_key().public_bytes(*raw):
        raise ValueError(f"{files.key_file} is not the key of {files.cert_file}")
    plain = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return _Pem(plain, chain, ca)


class _Loaded:
    """The files' contents as last loaded; `refresh()` loads them again if they changed.
    Thread-safe: gRPC calls a server's fetcher from its own threads."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._stamp = self._refused = _stamp(files)
        self.pem = _read(files)  # a bad file at start is a configuration error: raise
        self.generation = 0

    def refresh(self) -> bool:
        """True when a change was loaded; a change that does not load is logged once and
        the previous contents kept until the files change again."""
        with self._lock:
            stamp = _stamp(self.files)
            if stamp in (self._stamp, self._refused):
                return False
            try:
                pem = _read(self.files)
            except (OSError, ValueError, TypeError, UnsupportedAlgorithm) as error:
                self._refused = stamp
                log.warning("TLS files %s changed but do not load, kept: %s", self.files, error)
                return False
            self._stamp, self.pem = stamp, pem
            self.generation += 1
            log.info("TLS files reloaded: %s", ", ".join(map(str, self.files.paths())))
            return True


# Servers -----------------------------------------------------------------------------------


def check_server_files(files: TlsFiles) -> TlsFiles:
    """A mutual-TLS server needs its certificate and the CA its clients' chain to."""
    if files.cert_file is None or files.ca_file is None:
        raise ValueError(
            "a mutual-TLS gRPC server needs cert_file and key_file (its certificate) and "
            "ca_file (the CA client certificates must chain to)"
        )
    return files


# A settings field holding a mutual-TLS server's files, checked when the settings load.
ServerTlsFiles = Annotated[TlsFiles, AfterValidator(check_server_files)]


def _configuration(pem: _Pem) -> grpc.ServerCertificateConfiguration:
    assert pem.key is not None and pem.chain is not None
    return grpc.ssl_server_certificate_configuration([(pem.key, pem.chain)], pem.ca)


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Credentials that require a client certificate chaining to ca_file, and serve each
    new handshake the certificate on disk at that moment."""
    loaded = _Loaded(check_server_files(files))

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        return _configuration(loaded.pem) if loaded.refresh() else None  # None: unchanged

    return grpc.dynamic_ssl_server_credentials(
        _configuration(loaded.pem),
        fetch,  # type: ignore[arg-type]  # the stubs omit the None that gRPC documents
        require_client_authentication=True,
    )


def add_port(server: grpc.aio.Server, address: str, files: TlsFiles | None) -> int:
    """Bind `address` (host:port) plain or, with `files`, with mutual TLS; the port bound,
    0 when it cannot be."""
    if files is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, server_credentials(files))


# Clients -----------------------------------------------------------------------------------


class Channels:
    """The channels of one link to servers of one kind, plain or with mutual TLS.

    ``peer`` names the server in log lines ("controller"); ``setting`` is the setting that
    holds `files` ("controller_tls"), named when TLS fails. ``server_name``: the name the
    server's certificate must carry when it is not the host dialed (gRPC's
    grpc.ssl_target_name_override), e.g. a sidecar dialing 127.0.0.1 whose broker's
    certificate names the pod's DNS name.
    """

    def __init__(
        self,
        files: TlsFiles | None,
        *,
        peer: str,
        setting: str,
        server_name: str | None = None,
    ) -> None:
        self.files = files
        self.peer = peer
        self.setting = setting
        self.server_name = server_name
        self._loaded = _Loaded(files) if files is not None else None
        self._made: weakref.WeakKeyDictionary[grpc.aio.Channel, int] = weakref.WeakKeyDictionary()
        self._diagnosed: set[str] = set()  # addresses whose TLS failure was looked into
        self._probes: set[asyncio.Task[None]] = set()

    def open(self, address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """A new channel to `address` (host:port) with the files as they are now."""
        interceptors = [_Outcomes(self, address)]
        if self._loaded is None:
            return grpc.aio.insecure_channel(address, list(options), interceptors=interceptors)
        self._loaded.refresh()
        pem = self._loaded.pem
        credentials = grpc.ssl_channel_credentials(pem.ca, pem.key, pem.chain)
        settings = list(options)
        if self.server_name:
            settings.append(("grpc.ssl_target_name_override", self.server_name))
        channel = grpc.aio.secure_channel(address, credentials, settings, interceptors=interceptors)
        self._made[channel] = self._loaded.generation
        return channel

    def outdated(self, channel: grpc.aio.Channel) -> bool:
        """The TLS files changed (and load) since `channel` was made: make a new one."""
        if self._loaded is None:
            return False
        self._loaded.refresh()
        return self._made.get(channel, self._loaded.generation) != self._loaded.generation

    # Failures ------------------------------------------------------------------------------

    def _succeeded(self, address: str) -> None:
        self._diagnosed.discard(address)

    def _failed(self, address: str, error: grpc.aio.AioRpcError) -> None:
        if error.code() != grpc.StatusCode.UNAVAILABLE or address in self._diagnosed:
            return
        details = error.details() or ""
        if self.files is not None and any(w in details.lower() for w in _GRPC_TLS_WORDS):
            self._diagnosed.add(address)
            log.warning(
                "TLS to the %s at %s failed: %s (check %s)",
                self.peer,
                address,
                details,
                self.setting,
            )
        elif "socket closed" in details.lower():
            # The server may have dropped the handshake; only a probe tells.
            self._diagnosed.add(address)
            probe = asyncio.get_running_loop().create_task(self._diagnose(address))
            self._probes.add(probe)
            probe.add_done_callback(self._probes.discard)

    async def _diagnose(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        if not port.isdigit():
            return
        if self.files is None:
            found = await _probe(host, int(port), _unverified(), None)
            if found is not None and found.handshake:
                log.warning(
                    "the %s at %s requires TLS and this link is plaintext: set %s",
                    self.peer,
                    address,
                    self.setting,
                )
            return
        try:
            found = await _probe(
                host, int(port), client_context(self.files), self.server_name or host
            )
        except (OSError, ssl.SSLError, ValueError) as error:  # the files do not load
            found = _Probe(handshake=False, problem=str(error))
        if found is not None and found.problem:
            log.warning(
                "TLS to the %s at %s failed: %s (check %s)",
                self.peer,
                address,
                found.problem,
                self.setting,
            )


class _Outcomes(grpc.aio.UnaryUnaryClientInterceptor):
    """Tells its `Channels` how each unary call on one channel ended."""

    def __init__(self, channels: Channels, address: str) -> None:
        self._channels = channels
        self._address = address

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        call = await continuation(client_call_details, request)
        try:
            await call
        except grpc.aio.AioRpcError as error:
            self._channels._failed(self._address, error)
        else:
            self._channels._succeeded(self._address)
        return call  # the caller awaits it again: the same reply, or the same error


def _unverified() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@dataclass(frozen=True, slots=True)
class _Probe:
    handshake: bool  # a TLS handshake completed
    problem: str  # why the server would not serve such a connection; "" if it would


async def _probe(
    host: str, port: int, context: ssl.SSLContext, server_name: str | None
) -> _Probe | None:
    """What a gRPC server at host:port makes of a TLS connection made with `context`, or
    None when it cannot be reached. Under TLS 1.3 the client finishes its handshake first;
    a server that then refuses the client's certificate closes the connection without a
    word, where one that accepts it sends its first HTTP/2 frame."""
    context.set_alpn_protocols(["h2"])
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=context, server_hostname=server_name or host
            )
            try:
                writer.write(_HTTP2_PREFACE)
                first = await reader.read(1)
            finally:
                writer.close()
    except ssl.SSLError as error:
        return _Probe(handshake=False, problem=str(error))
    except (OSError, TimeoutError):
        return None
    if first:
        return _Probe(handshake=True, problem="")
    return _Probe(
        handshake=True,
        problem="the server closed the connection after the TLS handshake: it refused this "
        "end's certificate (none, or one that does not chain to the server's ca_file)",
    )
