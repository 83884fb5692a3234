"""ZooKeeper's four-letter words on the client port: ``ruok``, ``srvr``, ``stat``, ``mntr``,
``envi``, ``isro``, in the formats ZooKeeper's own tools and monitoring scripts parse."""

from __future__ import annotations

import os
import platform
import re
import socket
import ssl
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.consensus.connections import ClientServer
    from services.consensus.member import Member

VERSION = "3.8.0-directlog-0.1.0, built on directlog"
FOUR_LETTER_WORDS = frozenset({b"ruok", b"srvr", b"stat", b"mntr", b"envi", b"isro"})
NOT_SERVING = "This ZooKeeper instance is not currently serving requests\n"


def ask(
    port: int,
    word: str,
    host: str = "127.0.0.1",
    timeout: float = 2.0,
    tls: ssl.SSLContext | None = None,
) -> str:
    """Send ``word`` to a member's client port (ours or ZooKeeper's) and read the answer;
    with ``tls``, to its secure client port."""
    with socket.create_connection((host, port), timeout=timeout) as raw:
        sock = raw if tls is None else tls.wrap_socket(raw, server_hostname=host)
        sock.sendall(word.encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def mode_of(
    port: int, host: str = "127.0.0.1", timeout: float = 2.0, tls: ssl.SSLContext | None = None
) -> str | None:
    """``Mode:`` from ``srvr`` (leader, follower, standalone, read-only), or None while the
    member on ``port`` (a TLS client port with ``tls``) does not serve or does not answer."""
    try:
        answer = ask(port, "srvr", host, timeout, tls)
        found = re.search(r"^Mode: ([\w-]+)", answer, re.MULTILINE)
    except OSError:
        return None
    return found.group(1) if found else None


def answer(word: bytes, member: Member, server: ClientServer) -> str:
    if word == b"ruok":
        return "imok"
    if word == b"envi":
        return _envi(member)
    if word == b"mntr":
        return _mntr(member, server)
    if word == b"isro":
        # ZooKeeper's IsroCommand, no newline: kazoo's read-only clients ask it to find a
        # read-write member and compare the answer with b"rw".
        return "ro" if member.read_only else "rw" if member.serving else "null"
    if not member.serving and not member.read_only:
        return NOT_SERVING
    lines = [f"Zookeeper version: {VERSION}"]
    if word == b"stat":
        lines.append("Clients:")
        for conn in sorted(server.connections, key=lambda c: c.peer):
            sid = conn.session.session_id if conn.session else 0
            lines.append(f" /{conn.peer}[1](queued={len(conn.queue)},sid={sid:#x})")
        lines.append("")
    lines += _summary(member, server)
    return "\n".join(lines) + "\n"


def _summary(member: Member, server: ClientServer) -> list[str]:
    lat = server.latency
    avg = lat.total / lat.count if lat.count else 0.0
    return [
        f"Latency min/avg/max: {lat.min:.0f}/{avg:.4f}/{lat.max:.0f}",
        f"Received: {server.received}",
        f"Sent: {server.sent}",
        f"Connections: {len(server.connections)}",
        f"Outstanding: {member.outstanding}",
        f"Zxid: {member.applied_zxid:#x}",
        f"Mode: {member.mode}",
        f"Node count: {len(member.tree.nodes)}",
    ]


def _mntr(member: Member, server: ClientServer) -> str:
    lat = server.latency
    tree = member.tree
    pairs: list[tuple[str, object]] = [
        ("zk_version", VERSION),
        ("zk_server_state", member.mode),
        ("zk_avg_latency", f"{lat.total / lat.count if lat.count else 0.0:.4f}"),
        ("zk_max_latency", f"{lat.max:.0f}"),
        ("zk_min_latency", f"{lat.min:.0f}"),
        ("zk_packets_received", server.received),
        ("zk_packets_sent", server.sent),
        ("zk_num_alive_connections", len(server.connections)),
        ("zk_outstanding_requests", member.outstanding),
        ("zk_znode_count", len(tree.nodes)),
        ("zk_watch_count", len(tree.watches.registrations())),
        ("zk_ephemerals_count", sum(len(p) for p in tree.ephemerals.values())),
        ("zk_approximate_data_size", tree.data_size),
        ("zk_open_file_descriptor_count", _open_fds()),
        ("zk_last_zxid", f"{member.node.last_zxid:#x}"),
        ("zk_epoch", member.node.epoch),
        ("zk_global_sessions", len(tree.sessions)),
    ]
    if member.mode == "leader":
        pairs.append(("zk_followers", len(member.peers.connected())))
    return "".join(f"{k}\t{v}\n" for k, v in pairs)


def _envi(member: Member) -> str:
    pairs = [
        ("zookeeper.version", VERSION),
        ("host.name", socket.gethostname()),
        ("python.version", sys.version.split()[0]),
        ("python.implementation", platform.python_implementation()),
        ("os.name", platform.system()),
        ("os.arch", platform.machine()),
        ("os.version", platform.release()),
        ("user.dir", os.getcwd()),
        ("directlog.member.id", member.id),
        ("directlog.data.dir", member.data_dir.directory.resolve()),
    ]
    return "Environment:\n" + "".join(f"{k}={v}\n" for k, v in pairs)


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1
