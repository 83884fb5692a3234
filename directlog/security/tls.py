"""TLS from PEM files, for every Directlog endpoint and client.

`TlsFiles` is the one settings shape every service uses (Kafka's PEM keystore and
truststore: ssl.keystore.certificate.chain / ssl.keystore.key / ssl.truststore.certificates,
as files). `ReloadingContext` rebuilds a context when its files change on disk, so a
certificate that cert-manager renews in a mounted Secret takes effect for new connections
without a restart; a half-written pair fails to load and the previous context stays.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

log = logging.getLogger(__name__)

ClientAuth = Literal["none", "requested", "required"]  # Kafka's ssl.client.auth
_VERIFY = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TlsFiles(BaseModel):
    """A certificate chain and its key (what this end presents) and the CA certificates it
    trusts (to check the other end), all PEM."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cert_file: Path | None = None
    key_file: Path | None = None
    key_password: SecretStr | None = None
    ca_file: Path | None = None

    @model_validator(mode="after")
    def _pair(self) -> TlsFiles:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self

    def paths(self) -> list[Path]:
        return [p for p in (self.cert_file, self.key_file, self.ca_file) if p is not None]

    def _load_chain(self, context: ssl.SSLContext) -> None:
        if self.cert_file is not None:
            password = self.key_password.get_secret_value() if self.key_password else None
            context.load_cert_chain(self.cert_file, self.key_file, password=password)


def server_context(files: TlsFiles, client_auth: ClientAuth = "none") -> ssl.SSLContext:
    """A server's context: its certificate, and with `client_auth` other than "none" the
    CA that client certificates must chain to."""
    if files.cert_file is None:
        raise ValueError("a TLS server needs cert_file and key_file")
    if client_auth != "none" and files.ca_file is None:
        raise ValueError(f"ssl client auth {client_auth!r} needs ca_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    files._load_chain(context)
    if files.ca_file is not None:
        context.load_verify_locations(cafile=files.ca_file)
    context.verify_mode = _VERIFY[client_auth]
    return context


def client_context(files: TlsFiles, *, check_hostname: bool = True) -> ssl.SSLContext:
    """A client's context: servers checked against ca_file (the system's CAs if unset),
    and its own certificate presented when it has one (mutual TLS)."""
    context = ssl.create_default_context(cafile=files.ca_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = check_hostname
    files._load_chain(context)
    return context


class ReloadingContext:
    """`current()` is the context built from the files as they were at the last check;
    the files' modification times are checked at most every `interval` seconds."""

    def __init__(
        self,
        files: TlsFiles,
        build: Callable[[], ssl.SSLContext],
        interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.files = files
        self._build = build
        self._interval = interval
        self._clock = clock
        self._stamp = self._stamps()
        self._context = build()
        self._checked = clock()
        self.reloads = 0  # times a change was loaded

    def _stamps(self) -> tuple[int, ...]:
        return tuple(p.stat().st_mtime_ns if p.exists() else -1 for p in self.files.paths())

    def current(self) -> ssl.SSLContext:
        now = self._clock()
        if now - self._checked >= self._interval:
            self._checked = now
            stamp = self._stamps()
            if stamp != self._stamp:
                try:
                    self._context = self._build()
                except (OSError, ssl.SSLError, ValueError) as error:
                    log.warning("TLS files %s changed but do not load, kept: %s", self.files, error)
                else:
                    self._stamp = stamp
                    self.reloads += 1
                    log.info("TLS files reloaded: %s", ", ".join(map(str, self.files.paths())))
        return self._context
