"""Snapshot encoding of the replicated state: last zxid, live sessions, every znode.

Format, version 2, big-endian:

    header  magic b"DLZT" | u16 format version (2) | u16 flags (0) | u32 body length
            | u32 CRC-32 (zlib) of the body
    body    i64 last_zxid
            u32 session count, then per session in id order: i64 id, i32 timeout_ms
            u32 node count, then per node in path order (so parents precede children):
                str path | i64 czxid | i64 mzxid | i64 ctime | i64 mtime | i32 version
                | i32 cversion | i32 aversion | i64 ephemeral_owner | i64 pzxid
                | u32 data length, data | u32 ACL count, then per entry: i32 perms,
                str scheme, str id
    str     u32 length, UTF-8 bytes

A data length of 0xFFFFFFFF (-1 as an i32, as jute writes null) is null data, with no
bytes after it; version 1, written before null data was kept, is the same format without
that value (its nodes all hold bytes), and is still read.

The body is canonical (sorted, derived fields left out), so its SHA-256 doubles as the
tree digest. Watches and auth ids are per-server, not replicated, and are not included.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping

from services.consensus.jute.records import ACL, Id
from services.consensus.tree.errors import CorruptSnapshotError
from services.consensus.tree.model import parent_of, validate_path
from services.consensus.tree.node import Node

MAGIC = b"DLZT"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
NULL_LENGTH = 0xFFFF_FFFF  # u32 data length of null data (version 2)
_HEADER = struct.Struct(">4sHHII")
_Q = struct.Struct(">q")
_I = struct.Struct(">I")
_SESSION = struct.Struct(">qi")
_STAT = struct.Struct(">qqqqiiiqq")
_PERMS = struct.Struct(">i")
_NULL = _I.pack(NULL_LENGTH)


def _str(out: list[bytes], text: str) -> None:
    raw = text.encode()
    out.append(_I.pack(len(raw)))
    out.append(raw)


def encode_body(last_zxid: int, sessions: Mapping[int, int], nodes: Mapping[str, Node]) -> bytes:
    out: list[bytes] = [_Q.pack(last_zxid), _I.pack(len(sessions))]
    out.extend(_SESSION.pack(sid, sessions[sid]) for sid in sorted(sessions))
    out.append(_I.pack(len(nodes)))
    for path in sorted(nodes):
        n = nodes[path]
        _str(out, path)
        out.append(
            _STAT.pack(
                n.czxid,
                n.mzxid,
                n.ctime,
                n.mtime,
                n.version,
                n.cversion,
                n.aversion,
                n.ephemeral_owner,
                n.pzxid,
            )
        )
        if n.data is None:
            out.append(_NULL)
        else:
            out.append(_I.pack(len(n.data)))
            out.append(n.data)
        out.append(_I.pack(len(n.acl)))
        for entry in n.acl:
            out.append(_PERMS.pack(entry.perms))
            _str(out, entry.id.scheme)
            _str(out, entry.id.id)
    return b"".join(out)


def encode(last_zxid: int, sessions: Mapping[int, int], nodes: Mapping[str, Node]) -> bytes:
    body = encode_body(last_zxid, sessions, nodes)
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(body), zlib.crc32(body))
    return header + body


class _Reader:
    def __init__(self, body: bytes) -> None:
        self._buf = memoryview(body)
        self._pos = 0

    def take(self, n: int) -> bytes:
        if self._pos + n > len(self._buf):
            raise CorruptSnapshotError("snapshot body truncated")
        chunk = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        return chunk

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        values: tuple[int, ...] = fmt.unpack(self.take(fmt.size))
        return values

    def u32(self) -> int:
        return self.unpack(_I)[0]

    def text(self) -> str:
        try:
            return self.take(self.u32()).decode()
        except UnicodeDecodeError as exc:
            raise CorruptSnapshotError("bad UTF-8 in snapshot") from exc

    def done(self) -> bool:
        return self._pos == len(self._buf)


def decode(blob: bytes) -> tuple[int, dict[int, int], dict[str, Node]]:
    """Parse and check a snapshot; children links are rebuilt from the paths."""
    if len(blob) < _HEADER.size:
        raise CorruptSnapshotError("snapshot shorter than its header")
    magic, version, flags, length, crc = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise CorruptSnapshotError(f"bad magic {magic!r}")
    if version not in READABLE_VERSIONS or flags != 0:
        raise CorruptSnapshotError(f"unsupported snapshot version {version} flags {flags}")
    body = blob[_HEADER.size :]
    if len(body) != length:
        raise CorruptSnapshotError(f"body is {len(body)} bytes, header says {length}")
    if zlib.crc32(body) != crc:
        raise CorruptSnapshotError("snapshot checksum mismatch")
    r = _Reader(body)
    (last_zxid,) = r.unpack(_Q)
    sessions: dict[int, int] = {}
    for _ in range(r.u32()):
        sid, timeout = r.unpack(_SESSION)
        sessions[sid] = timeout
    nodes: dict[str, Node] = {}
    for _ in range(r.u32()):
        path = r.text()
        czxid, mzxid, ctime, mtime, ver, cver, aver, owner, pzxid = r.unpack(_STAT)
        data_length = r.u32()
        data = None if data_length == NULL_LENGTH and version >= 2 else r.take(data_length)
        acl = []
        for _ in range(r.u32()):
            (perms,) = r.unpack(_PERMS)
            acl.append(ACL(perms, Id(r.text(), r.text())))
        try:
            validate_path(path)
        except ValueError:
            raise CorruptSnapshotError(f"bad node path {path!r}") from None
        if path in nodes:
            raise CorruptSnapshotError(f"duplicate node {path}")
        node = Node(data, tuple(acl), czxid, mzxid, ctime, mtime, ver, cver, aver, owner, pzxid)
        if path != "/":
            parent = nodes.get(parent_of(path))
            if parent is None:
                raise CorruptSnapshotError(f"node {path} has no parent")
            parent.children.add(path[path.rindex("/") + 1 :])
        nodes[path] = node
    if not r.done():
        raise CorruptSnapshotError("trailing bytes after snapshot body")
    if "/" not in nodes:
        raise CorruptSnapshotError("snapshot has no root")
    return last_zxid, sessions, nodes
