"""SASL DIGEST-MD5 (RFC 2831) on the server side, as ZooKeeper runs it, without I/O.

A client sends GetSASLRequest tokens (opcode 102) after its ConnectResponse; each is fed to
``DigestMd5Server.step`` and the token it returns goes back in a SetSASLResponse. DIGEST-MD5
takes two round trips: the client's empty initial token gets the challenge (a nonce, realm
``zk-sasl-md5``, qop ``auth``), its digest-response gets ``rspauth`` and completes the
exchange. The realm and the digest-uri ``zookeeper/zk-sasl-md5`` are the ones ZooKeeper's
server and every ZooKeeper client (Java, kazoo through pure-sasl) hardcode for DIGEST-MD5.

Only qop ``auth`` is offered: after authentication the connection carries plain ZooKeeper
frames (TLS, not SASL's integrity layer, protects them). The users are ZooKeeper's JAAS
``user_<name>="password"`` entries; ``jaas_users`` reads them from ZooKeeper's own file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

MECHANISM: Final = "DIGEST-MD5"
REALM: Final = "zk-sasl-md5"
DIGEST_URI: Final = "zookeeper/" + REALM
MAX_TOKEN: Final = 4096  # a digest-response is a few hundred bytes

_DIRECTIVE = re.compile(rb'\s*([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,"\s]*))\s*(?:,|$)')
_ESCAPE = re.compile(rb"\\(.)")
_JAAS_SECTION = re.compile(r"(?ms)^\s*Server\s*\{(.*?)\}\s*;")
_JAAS_USER = re.compile(r'\buser_([^\s=]+)\s*=\s*"((?:[^"\\]|\\.)*)"')


class SaslError(Exception):
    """The exchange failed: a malformed token, an unknown user or a wrong password."""


def _md5(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


def _hex(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).hexdigest().encode()


def _text_bytes(text: str) -> bytes:
    """RFC 2831 2.1.2.1: user names and passwords are hashed as ISO 8859-1 when they fit."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8")


def parse_directives(token: bytes) -> dict[str, bytes]:
    """``name=value`` and ``name="quoted value"`` pairs separated by commas; a name given
    twice, or anything that is not such a list, is a SaslError."""
    found: dict[str, bytes] = {}
    at = 0
    while True:
        while at < len(token) and token[at] in b" \t,":  # RFC 2831 lists allow empty items
            at += 1
        if at == len(token):
            return found
        match = _DIRECTIVE.match(token, at)
        if match is None or match.end() == at:
            raise SaslError(f"malformed directive at byte {at}")
        name = match.group(1).decode("ascii").lower()
        if name in found:
            raise SaslError(f"directive {name} given twice")
        quoted = match.group(2)
        found[name] = _ESCAPE.sub(rb"\1", quoted) if quoted is not None else match.group(3)
        at = match.end()


@dataclass(frozen=True, slots=True)
class DigestFields:
    """What both ends hash (RFC 2831 2.1.2.1)."""

    username: str
    realm: str
    password: str
    nonce: bytes
    cnonce: bytes
    nc: bytes
    qop: bytes


def digest_value(
    f: DigestFields, uri: bytes, authzid: str | None = None, method: bytes = b"AUTHENTICATE"
) -> bytes:
    """The client's ``response`` (method AUTHENTICATE) or the server's ``rspauth`` (empty
    method), lowercase hex, with md5-sess as ZooKeeper's peers use it."""
    secret = _md5(b":".join(map(_text_bytes, (f.username, f.realm, f.password))))
    a1 = b":".join((secret, f.nonce, f.cnonce))
    if authzid is not None:
        a1 += b":" + authzid.encode("utf-8")
    a2 = method + b":" + uri
    return _hex(b":".join((_hex(a1), f.nonce, f.nc, f.cnonce, f.qop, _hex(a2))))


class DigestMd5Server:
    """One connection's DIGEST-MD5 exchange. ``step`` answers each client token; once
    ``complete``, ``user`` is the authenticated name (the session's ``sasl:<user>`` id)."""

    def __init__(
        self,
        users: Mapping[str, str],
        make_nonce: Callable[[], bytes] = lambda: base64.b64encode(os.urandom(24)),
    ) -> None:
        self._users = users
        self._nonce = make_nonce()
        self._challenged = False
        self.complete = False
        self.user: str | None = None

    def step(self, token: bytes) -> bytes:
        if self.complete:
            raise SaslError("the exchange is already complete")
        if len(token) > MAX_TOKEN:
            raise SaslError(f"a {len(token)}-byte token (at most {MAX_TOKEN})")
        if not self._challenged:
            if token:
                raise SaslError("DIGEST-MD5 starts with an empty client token")
            self._challenged = True
            return (
                b'realm="' + REALM.encode() + b'",nonce="' + self._nonce + b'",'
                b'qop="auth",charset=utf-8,algorithm=md5-sess'
            )
        return self._respond(parse_directives(token))

    def _respond(self, d: dict[str, bytes]) -> bytes:
        for name in ("username", "nonce", "cnonce", "nc", "digest-uri", "response"):
            if name not in d:
                raise SaslError(f"the digest-response has no {name}")
        charset = "utf-8" if d.get("charset", b"").lower() == b"utf-8" else "latin-1"
        try:
            username = d["username"].decode(charset)
            realm = d.get("realm", b"").decode(charset)
            authzid = d["authzid"].decode(charset) if "authzid" in d else None
        except UnicodeDecodeError as exc:
            raise SaslError(f"undecodable {charset} text: {exc}") from None
        qop = d.get("qop", b"auth")
        if qop != b"auth":
            raise SaslError(f"qop {qop!r} was not offered")
        if d["nonce"] != self._nonce:
            raise SaslError("the nonce is not the one this server sent")
        if d["nc"] != b"00000001":
            raise SaslError(f"nonce count {d['nc']!r} on a fresh nonce")
        if "realm" in d and realm != REALM:
            raise SaslError(f"realm {realm!r} was not offered")
        if d["digest-uri"] != DIGEST_URI.encode():
            raise SaslError(f"digest-uri {d['digest-uri']!r}, expected {DIGEST_URI}")
        password = self._users.get(username)
        if password is None:
            raise SaslError(f"no user {username!r}")
        fields = DigestFields(username, realm, password, d["nonce"], d["cnonce"], d["nc"], qop)
        uri = d["digest-uri"]
        if not hmac.compare_digest(digest_value(fields, uri, authzid), d["response"].lower()):
            raise SaslError(f"wrong password for {username!r}")
        self.complete = True
        self.user = username  # ZooKeeper authorizes the authentication id, not authzid
        return b"rspauth=" + digest_value(fields, uri, authzid, method=b"")


def jaas_users(text: str) -> dict[str, str]:
    """The ``user_<name>="password"`` entries of a JAAS file's ``Server`` section, the
    section ZooKeeper's DigestLoginModule reads its users from."""
    section = _JAAS_SECTION.search(text)
    if section is None:
        raise ValueError("the JAAS file has no Server { ... }; section")
    return {
        name: re.sub(r"\\(.)", r"\1", password)
        for name, password in _JAAS_USER.findall(section.group(1))
    }
