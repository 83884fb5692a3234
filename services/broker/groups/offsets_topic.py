"""The records of `__consumer_offsets`, in Kafka's own formats, and which partition holds a group.

Kafka keeps committed offsets and group metadata in this compacted internal topic, keyed so
that compaction keeps the latest state of each group and each of its partitions; a deleted
offset or group is a tombstone (a null value). Using Kafka's byte formats means Kafka's own
tools can read our topic, and a group's coordinator is the leader of the partition
`partition_for(group)` names, as in Kafka, so every broker finds the same one.

Keys (int16 version first):
- v0/v1 offset commit: group string, topic string, partition int32
- v2 group metadata:   group string
Values (int16 version first):
- offset commit v0: offset int64, metadata string, commit_timestamp int64
                v1: offset, metadata, commit_timestamp, expire_timestamp int64
                v2: offset, metadata, commit_timestamp
                v3: offset, leader_epoch int32, metadata, commit_timestamp (what we write)
- group metadata v0..v3: protocol_type string, generation int32, protocol nullable string,
  leader nullable string, current_state_timestamp int64 (v2+), members array of
  {member_id, group_instance_id nullable (v3+), client_id, client_host,
  rebalance_timeout int32 (v1+), session_timeout int32, subscription bytes, assignment bytes}
Strings are int16-length UTF-8 (-1: null), bytes int32-length, arrays int32-count.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from directlog.records.errors import CorruptRecordError

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's `Utils.abs(groupId.hashCode) % partitions`, with Java's String.hashCode over
    UTF-16 code units, so Directlog and Kafka place a group on the same partition."""
    h = 0
    units = group_id.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return (0 if h == -(1 << 31) else abs(h)) % partitions


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int


@dataclass(frozen=True, slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    state_timestamp: int
    members: list[MemberValue] = field(default_factory=list)


# Encoding ------------------------------------------------------------------------------


def _string(value: str | None) -> bytes:
    if value is None:
        return _INT16.pack(-1)
    raw = value.encode("utf-8")
    if len(raw) > 0x7FFF:
        raise ValueError(f"string of {len(raw)} bytes is too long for an int16 length")
    return _INT16.pack(len(raw)) + raw


def _bytes(value: bytes) -> bytes:
    return _INT32.pack(len(value)) + value


def encode_offset_key(key: OffsetKey) -> bytes:
    return (
        _INT16.pack(OFFSET_COMMIT_KEY_VERSION)
        + _string(key.group)
        + _string(key.topic)
        + _INT32.pack(key.partition)
    )


def encode_group_key(key: GroupKey) -> bytes:
    return _INT16.pack(GROUP_METADATA_KEY_VERSION) + _string(key.group)


def encode_offset_value(value: OffsetValue) -> bytes:
    return (
        _INT16.pack(OFFSET_COMMIT_VALUE_VERSION)
        + _INT64.pack(value.offset)
        + _INT32.pack(value.leader_epoch)
        + _string(value.metadata)
        + _INT64.pack(value.commit_timestamp)
    )


def encode_group_value(value: GroupValue) -> bytes:
    parts = [
        _INT16.pack(GROUP_METADATA_VALUE_VERSION),
        _string(value.protocol_type),
        _INT32.pack(value.generation),
        _string(value.protocol),
        _string(value.leader),
        _INT64.pack(value.state_timestamp),
        _INT32.pack(len(value.members)),
    ]
    for m in value.members:
        parts += [
            _string(m.member_id),
            _string(m.group_instance_id),
            _string(m.client_id),
            _string(m.client_host),
            _INT32.pack(m.rebalance_timeout_ms),
            _INT32.pack(m.session_timeout_ms),
            _bytes(m.subscription),
            _bytes(m.assignment),
        ]
    return b"".join(parts)


# Decoding (bounded: a record from disk is trusted no further than its own length) -------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise CorruptRecordError(f"offsets-topic record ends before {n} more bytes")
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def int16(self) -> int:
        return int(_INT16.unpack(self._take(2))[0])

    def int32(self) -> int:
        return int(_INT32.unpack(self._take(4))[0])

    def int64(self) -> int:
        return int(_INT64.unpack(self._take(8))[0])

    def string(self) -> str | None:
        length = self.int16()
        if length == -1:
            return None
        return self._take(length).decode("utf-8", "replace")

    def text(self) -> str:
        value = self.string()
        if value is None:
            raise CorruptRecordError("null where the offsets-topic format has a string")
        return value

    def bytes_(self) -> bytes:
        length = self.int32()
        return b"" if length == -1 else self._take(length)


def decode_key(data: bytes) -> OffsetKey | GroupKey:
    reader = _Reader(data)
    version = reader.int16()
    if version in (0, 1):
        return OffsetKey(reader.text(), reader.text(), reader.int32())
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupKey(reader.text())
    raise CorruptRecordError(f"unknown __consumer_offsets key version {version}")


def decode_offset_value(data: bytes) -> OffsetValue:
    reader = _Reader(data)
    version = reader.int16()
    if not 0 <= version <= OFFSET_COMMIT_VALUE_VERSION:
        raise CorruptRecordError(f"unknown offset commit value version {version}")
    offset = reader.int64()
    epoch = reader.int32() if version >= 3 else -1
    metadata = reader.string() or ""
    timestamp = reader.int64()
    return OffsetValue(offset, epoch, metadata, timestamp)


def decode_group_value(data: bytes) -> GroupValue:
    reader = _Reader(data)
    version = reader.int16()
    if not 0 <= version <= GROUP_METADATA_VALUE_VERSION:
        raise CorruptRecordError(f"unknown group metadata value version {version}")
    protocol_type = reader.text()
    generation = reader.int32()
    protocol = reader.string()
    leader = reader.string()
    state_timestamp = reader.int64() if version >= 2 else -1
    count = reader.int32()
    if count < 0 or count > len(data):
        raise CorruptRecordError(f"group metadata with {count} members")
    members = []
    for _ in range(count):
        member_id = reader.text()
        instance = reader.string() if version >= 3 else None
        client_id = reader.text()
        client_host = reader.text()
        session = rebalance = 0
        if version >= 1:
            rebalance = reader.int32()
        session = reader.int32()
        if version == 0:
            rebalance = session
        members.append(
            MemberValue(
                member_id,
                instance,
                client_id,
                client_host,
                rebalance,
                session,
                reader.bytes_(),
                reader.bytes_(),
            )
        )
    return GroupValue(protocol_type, generation, protocol, leader, state_timestamp, members)


def subscribed_topics(subscription: bytes) -> set[str] | None:
    """The topics of a ConsumerProtocolSubscription (int16 version, then an array of
    topic names, in every version), or None when the bytes are not one."""
    try:
        reader = _Reader(subscription)
        reader.int16()
        count = reader.int32()
        if count < 0 or count > len(subscription):
            return None
        return {reader.text() for _ in range(count)}
    except (CorruptRecordError, struct.error):
        return None
