"""ACLs: the world, digest, sasl and x509 schemes, creation-time fixup, permission checks.

The digest scheme stores `user:base64(sha1("user:password"))`; a session proves the id by
`addauth digest user:password`, which `digest_auth_id` turns into the same string. A
session that completed SASL holds `sasl:<user>`, and one whose TLS client certificate the
secure port verified holds `x509:<subject DN>`. Auth ids are per-connection state on the
server a client talks to, so they travel with each request (in `Session`) and are never
part of the replicated tree.
"""

from __future__ import annotations

import base64
import hashlib

from services.consensus.codes import ErrorCode, Perm
from services.consensus.jute.records import ACL, Id
from services.consensus.tree.errors import KeeperError

ANYONE = Id("world", "anyone")
# A session that proved the configured super digest: every ACL lets it through.
SUPER = Id("super", "")
# The schemes whose ids a session proves; ZooKeeper's `auth` ACL expands to these.
AUTHENTICATED_SCHEMES = frozenset({"digest", "sasl", "x509"})
OPEN_ACL_UNSAFE: tuple[ACL, ...] = (ACL(int(Perm.ALL), ANYONE),)
READ_ACL_UNSAFE: tuple[ACL, ...] = (ACL(int(Perm.READ), ANYONE),)


def digest(user_password: str) -> str:
    """The stored digest id for `user:password`."""
    user, sep, _ = user_password.partition(":")
    if not sep:
        raise ValueError("digest credentials must be user:password")
    sha = hashlib.sha1(user_password.encode()).digest()
    return f"{user}:{base64.b64encode(sha).decode()}"


def digest_auth_id(user_password: str) -> Id:
    """The auth id an `addauth digest user:password` grants a session."""
    return Id("digest", digest(user_password))


def _valid_id(ident: Id) -> bool:
    if ident.scheme == "world":
        return ident.id == "anyone"
    if ident.scheme == "digest":
        return len(ident.id.split(":")) == 2
    return ident.scheme in AUTHENTICATED_SCHEMES and bool(ident.id)


def fixup_acl(acl: tuple[ACL, ...], auth: frozenset[Id]) -> tuple[ACL, ...]:
    """Validate an ACL for create/setACL; expands the `auth` scheme, drops duplicates.

    Order is kept (first occurrence wins) so every member stores the same list.
    """
    if not acl:
        raise KeeperError(ErrorCode.INVALIDACL)
    out: list[ACL] = []
    for entry in acl:
        if entry.perms & ~int(Perm.ALL) or entry.perms < 0:
            raise KeeperError(ErrorCode.INVALIDACL)
        if entry.id.scheme == "auth":
            granted = sorted(i for i in auth if i.scheme in AUTHENTICATED_SCHEMES)
            if not granted:
                raise KeeperError(ErrorCode.INVALIDACL)
            expanded = [ACL(entry.perms, i) for i in granted]
        elif _valid_id(entry.id):
            expanded = [entry]
        else:
            raise KeeperError(ErrorCode.INVALIDACL)
        out.extend(e for e in expanded if e not in out)
    return tuple(out)


def check_acl(acl: tuple[ACL, ...], perm: Perm, auth: frozenset[Id], path: str = "") -> None:
    """Raise NOAUTH unless some entry grants `perm` to anyone or to one of `auth`."""
    if not acl or SUPER in auth:
        return
    bits = int(perm)  # int & IntFlag would run the enum's Python-level __rand__
    for entry in acl:
        if not entry.perms & bits:
            continue
        if entry.id == ANYONE or entry.id in auth:
            return
    raise KeeperError(ErrorCode.NOAUTH, path)
