"""The ensemble's dynamic configuration in ZooKeeper's text format, and its file.

ZooKeeper names a server ``server.<id>=<host>:<quorum port>:<election port>[:<role>]
[;[<client host>:]<client port>]`` and ends a configuration with ``version=<hex>`` (the
zxid of the reconfig that made it, 0 for the static one). Our members carry ZAB and
leader election on ONE peer address (settings.py's ``peer``), so the mapping is:

- written: ``server.N=<peer host>:<peer port>:<peer port>:<role>;<client host>:<client port>``
  (the peer port twice: quorum and election are that one port);
- read (reconfig's joining servers and new members): the quorum and election ports must
  be the same port, or the server string is refused (a member listening on one port could
  not be reached on another); the role defaults to participant; the client address is
  required (ZooKeeper requires one) and its host defaults to 0.0.0.0, as ZooKeeper's does.

Metrics and secure-client addresses are not part of ZooKeeper's format: a member named by
a reconfig has none here unless the static file gave it one.

A member keeps the configuration it last made active in ``zoo.cfg.dynamic.<hex version>``
in its data directory (ZooKeeper's dynamic file, next to the static one it started with);
at start the newest such file wins over the static ``members`` when its version is newer.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from directlog.record import record
from services.consensus.settings import MemberAddresses, parse_address

FILE_PREFIX = "zoo.cfg.dynamic."
_KEY = re.compile(r"server\.(\d+)")


class ConfigFormatError(ValueError):
    """A server string or configuration that does not parse (ZooKeeper: BADARGUMENTS)."""


@record
class DynamicConfig:
    version: int
    members: dict[int, MemberAddresses]

    @property
    def voters(self) -> tuple[int, ...]:
        return tuple(sorted(i for i, m in self.members.items() if m.role == "participant"))

    @property
    def observers(self) -> tuple[int, ...]:
        return tuple(sorted(i for i, m in self.members.items() if m.role == "observer"))

    def text(self) -> str:
        """ZooKeeper's ``QuorumVerifier.toString()`` layout: what getConfig returns."""
        lines = [f"server.{i}={server_string(self.members[i])}" for i in sorted(self.members)]
        return "\n".join([*lines, f"version={self.version:x}"])


def server_string(member: MemberAddresses) -> str:
    host, port = parse_address(member.peer)
    text = f"{host}:{port}:{port}:{member.role}"
    if member.client is not None:
        text += f";{member.client}"
    return text


def parse_server(key: str, value: str) -> tuple[int, MemberAddresses]:
    """One ``server.N`` entry; ConfigFormatError names what is wrong."""
    found = _KEY.fullmatch(key.strip())
    if found is None:
        raise ConfigFormatError(f"{key!r} is not server.<id>")
    member_id = int(found.group(1))
    if not 1 <= member_id <= 255:
        raise ConfigFormatError(f"server id {member_id} is not in 1..255")
    spec, sep, client = value.strip().partition(";")
    if not sep or not client:
        raise ConfigFormatError(f"server.{member_id}: no client port after ';'")
    parts = spec.split(":")
    role = parts.pop() if len(parts) == 4 else "participant"
    if len(parts) != 3 or role not in ("participant", "observer"):
        raise ConfigFormatError(f"server.{member_id}: expected host:port:port[:role]")
    host, quorum_port, election_port = parts
    if quorum_port != election_port:
        raise ConfigFormatError(
            f"server.{member_id}: quorum port {quorum_port} and election port "
            f"{election_port} differ; a member takes both on one peer port"
        )
    if ":" not in client:
        client = f"0.0.0.0:{client}"
    try:
        member = MemberAddresses(
            peer=f"{host}:{quorum_port}",
            client=client,
            role="observer" if role == "observer" else "participant",
        )
    except ValueError as exc:
        raise ConfigFormatError(f"server.{member_id}: {exc}") from None
    return member_id, member


def parse_config(text: str) -> DynamicConfig:
    """A whole configuration, entries separated by newlines or commas (reconfig's
    ``newMembers`` and our files); a ``version=`` entry sets the version."""
    members: dict[int, MemberAddresses] = {}
    version = 0
    for raw in re.split(r"[\n,]", text):
        entry = raw.strip()
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        if not sep:
            raise ConfigFormatError(f"{entry!r} is not key=value")
        if key.strip() == "version":
            try:
                version = int(value.strip(), 16)
            except ValueError:
                raise ConfigFormatError(f"bad version {value!r}") from None
            continue
        member_id, member = parse_server(key, value)
        if member_id in members:
            raise ConfigFormatError(f"server.{member_id} is named twice")
        members[member_id] = member
    check_addresses(members)
    return DynamicConfig(version, members)


def check_addresses(members: dict[int, MemberAddresses]) -> None:
    """No two members on one peer or client address (ZooKeeper's checkAddressDuplicate)."""
    seen: dict[str, int] = {}
    for member_id, member in sorted(members.items()):
        for address in (member.peer, member.client):
            if address is None:
                continue
            other = seen.setdefault(address, member_id)
            if other != member_id:
                raise ConfigFormatError(f"server.{member_id} and server.{other} share {address}")


def next_members(
    active: DynamicConfig, joining: str, leaving: str, new_members: str
) -> dict[int, MemberAddresses]:
    """The members a reconfig asks for: ``new_members`` as a whole, or the active ones
    less ``leaving`` plus ``joining``. Duplicate or unknown ids, malformed server strings
    and shared addresses raise (BADARGUMENTS)."""
    if new_members.strip():
        if joining.strip() or leaving.strip():
            raise ConfigFormatError("newMembers with joining or leaving servers")
        return parse_config(new_members).members
    leaves = [s.strip() for s in leaving.split(",") if s.strip()]
    joins = [s.strip() for s in joining.split(",") if s.strip()]
    if not leaves and not joins:
        raise ConfigFormatError("no joining, leaving or new members")
    members = dict(active.members)
    left: set[int] = set()
    for text in leaves:
        member_id = int(text)
        if member_id in left:
            raise ConfigFormatError(f"server {member_id} leaves twice")
        if member_id not in members:
            raise ConfigFormatError(f"server {member_id} is not in the configuration")
        left.add(member_id)
        del members[member_id]
    joined: set[int] = set()
    for text in joins:
        key, sep, value = text.partition("=")
        if not sep:
            raise ConfigFormatError(f"{text!r} is not server.<id>=<spec>")
        member_id, member = parse_server(key, value)
        if member_id in joined:
            raise ConfigFormatError(f"server {member_id} joins twice")
        joined.add(member_id)
        members[member_id] = member
    check_addresses(members)
    return members


def save(directory: Path, config: DynamicConfig) -> Path:
    """Write ``config`` durably as the newest dynamic file and drop the older ones."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{FILE_PREFIX}{config.version:x}"
    temporary = path.with_suffix(".tmp")
    with open(temporary, "w") as out:
        out.write(config.text() + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    for older in directory.glob(f"{FILE_PREFIX}*"):
        if older != path and not older.name.endswith(".tmp"):
            older.unlink(missing_ok=True)
    return path


def load(directory: Path) -> DynamicConfig | None:
    """The newest dynamic file in ``directory``, if any."""
    newest: DynamicConfig | None = None
    for path in directory.glob(f"{FILE_PREFIX}*"):
        if path.name.endswith(".tmp"):
            continue
        config = parse_config(path.read_text())
        if newest is None or config.version > newest.version:
            newest = config
    return newest
