"""Kafka legacy message sets (magic 0 and 1), read and written for old clients.

One entry: ``offset int64 | size int32 | crc uint32 | magic int8 | attributes int8 |
[timestamp int64, magic 1] | key bytes | value bytes``, where ``size`` counts from the CRC
to the end and the CRC-32 (IEEE) covers magic to the end. A compressed entry is a wrapper
whose value holds a whole compressed message set; see ``docs/formats.md``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

from directlog.records.compression import Compression, compress, decompress
from directlog.records.errors import (
    CorruptRecordError,
    InvalidRecordError,
    UnsupportedCompressionError,
    UnsupportedMagicError,
)

_ENTRY_HEADER = struct.Struct(">qi")  # offset, size
_BODY_HEADER = struct.Struct(">IbB")  # crc, magic, attributes
_TIMESTAMP = struct.Struct(">q")
_LENGTH = struct.Struct(">i")
_MIN_SIZE = {0: 14, 1: 22}  # crc + magic + attributes + [timestamp] + two length fields
LOG_APPEND_TIME_BIT = 0x08  # attributes of a magic 1 message whose timestamp is the append time
_NO_TIMESTAMP = -1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(slots=True, frozen=True)
class LegacyMessage:
    """One message with its absolute offset. ``timestamp`` is None for magic 0; for magic 1
    it is -1 when the producer sent none. ``timestamp_type``: 0 CreateTime, 1
    LogAppendTime."""

    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    timestamp_type: int = 0


def encode_message_set(
    messages: Sequence[LegacyMessage], *, magic: int, compression: Compression = Compression.NONE
) -> bytes:
    """Encode ``messages`` as a magic 0 or 1 message set.

    Uncompressed, each message is one entry at its own offset. Compressed, the whole set
    goes into one wrapper at the last message's offset; inner offsets are absolute for
    magic 0 and relative to the first message for magic 1 (0..n-1 when the offsets are
    consecutive, gaps kept otherwise, as Kafka does). A magic-1 wrapper carries the largest
    inner timestamp and the messages' common timestamp type. Magic 0 has no timestamps, so
    theirs are dropped. A missing magic-1 timestamp is written as -1.
    """
    if magic not in _MIN_SIZE:
        raise UnsupportedMagicError(f"legacy message sets have magic 0 or 1, not {magic}")
    codec = Compression(compression)
    if codec is Compression.ZSTD:
        raise UnsupportedCompressionError("zstd needs magic 2; legacy message sets cannot use it")
    for message in messages:
        _validate(message)
    if not messages:
        return b""
    if codec is Compression.NONE:
        return b"".join(
            _entry(
                m.offset,
                magic,
                _type_bits(m.timestamp_type, magic),
                _timestamp_of(m),
                m.key,
                m.value,
            )
            for m in messages
        )

    offsets = [m.offset for m in messages]
    if any(later <= earlier for earlier, later in pairwise(offsets)):
        raise ValueError("offsets in a compressed message set must strictly increase")
    types = {m.timestamp_type for m in messages}
    if magic == 1 and len(types) > 1:
        raise ValueError("messages in one compressed set must share a timestamp type")
    timestamp_type = types.pop()
    type_bits = _type_bits(timestamp_type, magic)
    base = 0 if magic == 0 else offsets[0]
    inner = b"".join(
        _entry(m.offset - base, magic, type_bits, _timestamp_of(m), m.key, m.value)
        for m in messages
    )
    wrapper_timestamp = max(_timestamp_of(m) for m in messages)
    return wrap(inner, offsets[-1], magic, codec, wrapper_timestamp, timestamp_type)


def wrap(
    inner: bytes,
    last_offset: int,
    magic: int,
    codec: Compression,
    timestamp: int,
    timestamp_type: int,
) -> bytes:
    """The wrapper entry holding the message set `inner` compressed with `codec`: at the
    offset of its last message, with the largest inner `timestamp` (magic 1) and their
    common timestamp type."""
    attributes = int(codec) | _type_bits(timestamp_type, magic)
    return _entry(
        last_offset, magic, attributes, timestamp, None, compress(codec, inner, magic=magic)
    )


def decode_message_set(
    buf: bytes | memoryview, *, max_decompressed: int = 64 * 1024 * 1024
) -> list[LegacyMessage]:
    """Decode a magic 0/1 message set, flattening compressed wrappers into messages with
    absolute offsets.

    A trailing partial entry (fewer bytes left than its header or declared size) ends the
    set without error: fetch responses are cut at a byte limit and may end mid-entry, and
    Kafka clients drop that tail the same way. Inside a compressed wrapper the inner set must
    be complete. ``max_decompressed`` bounds the total bytes inflated by all wrappers.
    """
    if max_decompressed < 0:
        raise ValueError(f"max_decompressed must be >= 0, got {max_decompressed}")
    budget = max_decompressed
    messages: list[LegacyMessage] = []
    for raw in _entries(memoryview(buf).cast("B"), nested=False):
        codec = Compression.from_attributes(raw.attributes)
        if codec is Compression.NONE:
            messages.append(_plain(raw, raw.attributes))
            continue
        if raw.value is None:
            raise InvalidRecordError(f"compressed wrapper at offset {raw.offset} has a null value")
        inner_bytes = decompress(codec, raw.value, max_size=budget, magic=raw.magic)
        budget -= len(inner_bytes)
        messages.extend(_unwrap(raw, inner_bytes))
    return messages


class _RawEntry(NamedTuple):
    offset: int
    magic: int
    attributes: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None


def _validate(message: LegacyMessage) -> None:
    for name, number in (("offset", message.offset), ("timestamp", message.timestamp)):
        if number is not None and not _INT64_MIN <= number <= _INT64_MAX:
            raise ValueError(f"message {name} {number} does not fit in an int64")
    if message.timestamp_type not in (0, 1):
        raise ValueError(f"timestamp_type must be 0 or 1, got {message.timestamp_type}")


def _type_bits(timestamp_type: int, magic: int) -> int:
    return LOG_APPEND_TIME_BIT if magic == 1 and timestamp_type == 1 else 0


def _timestamp_of(message: LegacyMessage) -> int:
    return _NO_TIMESTAMP if message.timestamp is None else message.timestamp


def _entry(
    offset: int,
    magic: int,
    attributes: int,
    timestamp: int,
    key: bytes | None,
    value: bytes | None,
) -> bytes:
    body = bytearray((magic, attributes))
    if magic == 1:
        body += _TIMESTAMP.pack(timestamp)
    for field in (key, value):
        if field is None:
            body += _LENGTH.pack(-1)
        else:
            body += _LENGTH.pack(len(field))
            body += field
    crc = zlib.crc32(body)
    return _ENTRY_HEADER.pack(offset, 4 + len(body)) + crc.to_bytes(4, "big") + body


def _entries(view: memoryview, *, nested: bool) -> Iterator[_RawEntry]:
    """Walk entries, checking every length before use. At the top level a short tail is a
    partial entry and ends the walk; inside a wrapper it is corruption."""
    pos = 0
    while pos < len(view):
        if len(view) - pos < _ENTRY_HEADER.size:
            if nested:
                raise CorruptRecordError(f"inner message set ends mid-header at byte {pos}")
            return
        offset, size = _ENTRY_HEADER.unpack_from(view, pos)
        if size < _MIN_SIZE[0]:
            raise CorruptRecordError(
                f"message size {size} at offset {offset} is below the minimum {_MIN_SIZE[0]}"
            )
        start = pos + _ENTRY_HEADER.size
        if size > len(view) - start:
            if nested:
                raise CorruptRecordError(
                    f"inner message size {size} at offset {offset} runs past the "
                    f"{len(view) - start} bytes left"
                )
            return
        yield _parse(offset, view[start : start + size])
        pos = start + size


def _parse(offset: int, body: memoryview) -> _RawEntry:
    stored_crc, magic, attributes = _BODY_HEADER.unpack_from(body, 0)
    if magic not in _MIN_SIZE:
        raise UnsupportedMagicError(f"message at offset {offset} has magic {magic}, not 0 or 1")
    if len(body) < _MIN_SIZE[magic]:
        raise CorruptRecordError(
            f"message size {len(body)} at offset {offset} is below the magic {magic} "
            f"minimum {_MIN_SIZE[magic]}"
        )
    computed_crc = zlib.crc32(body[4:])
    if computed_crc != stored_crc:
        raise CorruptRecordError(
            f"message at offset {offset}: stored CRC {stored_crc:#010x} != computed "
            f"{computed_crc:#010x}"
        )
    pos = _BODY_HEADER.size
    timestamp = None
    if magic == 1:
        (timestamp,) = _TIMESTAMP.unpack_from(body, pos)
        pos += _TIMESTAMP.size
    key, pos = _read_bytes(body, pos, "key", offset)
    value, pos = _read_bytes(body, pos, "value", offset)
    if pos != len(body):
        raise CorruptRecordError(
            f"message at offset {offset} has {len(body) - pos} bytes after its value"
        )
    return _RawEntry(offset, magic, attributes, timestamp, key, value)


def _read_bytes(body: memoryview, pos: int, field: str, offset: int) -> tuple[bytes | None, int]:
    if len(body) - pos < _LENGTH.size:
        raise CorruptRecordError(f"message at offset {offset}: {field} length is truncated")
    (length,) = _LENGTH.unpack_from(body, pos)
    pos += _LENGTH.size
    if length == -1:
        return None, pos
    if length < -1 or length > len(body) - pos:
        raise CorruptRecordError(
            f"message at offset {offset}: {field} length {length} with {len(body) - pos} bytes left"
        )
    return bytes(body[pos : pos + length]), pos + length


def _plain(raw: _RawEntry, type_attributes: int) -> LegacyMessage:
    """A message whose timestamp type comes from ``type_attributes`` (its own, or its
    wrapper's); magic 0 has neither timestamp nor type."""
    if raw.magic == 0:
        return LegacyMessage(raw.offset, None, raw.key, raw.value)
    timestamp_type = 1 if type_attributes & LOG_APPEND_TIME_BIT else 0
    return LegacyMessage(raw.offset, raw.timestamp, raw.key, raw.value, timestamp_type)


def _unwrap(wrapper: _RawEntry, inner_bytes: bytes) -> list[LegacyMessage]:
    inner = list(_entries(memoryview(inner_bytes), nested=True))
    if not inner:
        raise InvalidRecordError(f"compressed wrapper at offset {wrapper.offset} holds no messages")
    for raw in inner:
        if raw.magic != wrapper.magic:
            raise InvalidRecordError(
                f"inner message has magic {raw.magic} inside a magic {wrapper.magic} wrapper "
                f"at offset {wrapper.offset}"
            )
        if Compression.from_attributes(raw.attributes) is not Compression.NONE:
            raise InvalidRecordError(
                f"compressed wrapper at offset {wrapper.offset} nests another compressed message"
            )
    if wrapper.magic == 0:
        return [_plain(raw, 0) for raw in inner]
    last_relative = inner[-1].offset
    log_append = bool(wrapper.attributes & LOG_APPEND_TIME_BIT)
    messages = []
    for raw in inner:
        absolute = wrapper.offset - (last_relative - raw.offset)
        timestamp = wrapper.timestamp if log_append else raw.timestamp
        messages.append(
            LegacyMessage(absolute, timestamp, raw.key, raw.value, 1 if log_append else 0)
        )
    return messages
