"""ZAB wire framing: a known answer, round trips of every message type, stream splitting in
arbitrary chunks, and fuzzing that may only ever raise WireError."""

from __future__ import annotations

import dataclasses
import struct
import typing
from enum import Enum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.consensus.zab import messages
from services.consensus.zab.messages import (
    Ack,
    AckEpoch,
    Commit,
    Forward,
    ForwardReply,
    Inform,
    Message,
    NewLeader,
    Notification,
    Proposal,
    ServerState,
    Sync,
    SyncMode,
)
from services.consensus.zab.state import LogEntry, Snapshot
from services.consensus.zab.wire import HEADER_SIZE, FrameDecoder, WireError, encode

MESSAGE_CLASSES: tuple[type[Any], ...] = typing.get_args(messages.Message)
I32_FIELDS = {"sender", "leader", "accepted_leader"}  # server ids; everything else is i64

i32 = st.integers(-(1 << 31), (1 << 31) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
entries = st.builds(LogEntry, zxid=i64, payload=st.binary(max_size=64))


def field_strategy(name: str, hint: object) -> st.SearchStrategy[Any]:
    """A strategy per annotated type; an unknown annotation fails loudly so a new field
    cannot slip past the round-trip tests."""
    if hint is int:
        return i32 if name in I32_FIELDS else i64
    if hint == int | None:
        return st.none() | i64
    if hint is bytes:
        return st.binary(max_size=64)
    if hint is LogEntry:
        return entries
    if hint == tuple[int, ...]:
        return st.lists(i64, max_size=8).map(tuple)
    if hint == tuple[LogEntry, ...]:
        return st.lists(entries, max_size=8).map(tuple)
    if hint == Snapshot | None:
        return st.none() | st.builds(Snapshot, zxid=i64, data=st.binary(max_size=64))
    if isinstance(hint, type) and issubclass(hint, Enum):
        return st.sampled_from(hint)
    raise AssertionError(f"no strategy for {name}: {hint!r}")


def message_strategy(cls: type[Any]) -> st.SearchStrategy[Message]:
    hints = typing.get_type_hints(cls)
    return st.builds(
        cls, **{f.name: field_strategy(f.name, hints[f.name]) for f in dataclasses.fields(cls)}
    )


any_message = st.one_of([message_strategy(cls) for cls in MESSAGE_CLASSES])


def decode_one(frame: bytes) -> Message:
    (msg,) = FrameDecoder().feed(frame)
    return msg


def test_every_message_class_is_covered() -> None:
    # Type codes follow the order of the Message union; test_round_trip checks each one.
    assert len(MESSAGE_CLASSES) == 16


def test_known_answer_notification() -> None:
    msg = Notification(
        sender=3, leader=-1, zxid=0x1_0000_0002, peer_epoch=1, election_epoch=7,
        state=ServerState.LEADING,
    )  # fmt: skip
    # No configuration known: version 0 and two empty id lists.
    body = struct.pack(">iqqqBqII", -1, 0x1_0000_0002, 1, 7, 2, 0, 0, 0)
    assert encode(msg) == struct.pack(">IBi", 5 + len(body), 1, 3) + body


def test_known_answer_optional_and_lists() -> None:
    assert encode(ForwardReply(1, 2, 9, None)) == struct.pack(">IBiqqB", 22, 15, 1, 2, 9, 0)
    assert encode(ForwardReply(1, 2, 9, 5)) == struct.pack(">IBiqqBq", 30, 15, 1, 2, 9, 1, 5)
    sync = Sync(0, 4, SyncMode.TRUNC, 8, (LogEntry(9, b"ab"),))
    body = struct.pack(">qBqIqI", 4, 1, 8, 1, 9, 2) + b"ab" + b"\x00"
    assert encode(sync) == struct.pack(">IBi", 5 + len(body), 5, 0) + body
    snap = Sync(0, 4, SyncMode.SNAP, 0, (), Snapshot(7, b"tree"))
    body = struct.pack(">qBqIBqI", 4, 2, 0, 0, 1, 7, 4) + b"tree"
    assert encode(snap) == struct.pack(">IBi", 5 + len(body), 5, 0) + body


def test_known_answer_per_write_messages() -> None:
    # These take a one-pack path of their own in encode and decode: still the table's bytes.
    body = struct.pack(">qqI", 2, 3, 2) + b"ab"
    assert encode(Proposal(1, 2, LogEntry(3, b"ab"))) == frame(9, body)
    assert encode(Forward(1, 2, 3, b"ab")) == frame(14, body)
    assert encode(Ack(1, 2, 3)) == frame(10, struct.pack(">qq", 2, 3))
    assert encode(Commit(1, 2, 3)) == frame(11, struct.pack(">qq", 2, 3))
    assert decode_one(frame(14, body)) == Forward(1, 2, 3, b"ab")
    assert decode_one(frame(15, struct.pack(">qqBq", 2, 3, 1, 4))) == ForwardReply(1, 2, 3, 4)


def test_known_answer_version_4_messages() -> None:
    # Protocol version 4: the leader's Inform to observers, an observer's state code, and
    # the configuration carried by votes and NEWLEADER.
    assert encode(Inform(1, 2, LogEntry(3, b"ab"))) == frame(
        16, struct.pack(">qqI", 2, 3, 2) + b"ab"
    )
    note = Notification(5, 3, 7, 1, 2, ServerState.OBSERVING, 9, (1, 2), (5,))
    body = struct.pack(">iqqqBqIqqIq", 3, 7, 1, 2, 3, 9, 2, 1, 2, 1, 5)
    assert encode(note) == frame(1, body, sender=5)
    assert decode_one(encode(note)) == note
    leader = NewLeader(1, 4, 10, 9, (1, 2, 3), ())
    assert encode(leader) == frame(6, struct.pack(">qqqIqqqI", 4, 10, 9, 3, 1, 2, 3, 0))


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip(cls: type[Any], data: st.DataObject) -> None:
    msg = data.draw(message_strategy(cls))
    frame = encode(msg)
    assert frame[4] == MESSAGE_CLASSES.index(cls) + 1
    assert struct.unpack_from(">I", frame)[0] == len(frame) - 4
    assert decode_one(frame) == msg


def test_round_trip_edge_values() -> None:
    for msg in (
        AckEpoch(0, 0, 0, 0, ()),
        Sync(0, 0, SyncMode.SNAP, 0, ()),
        Sync(0, 0, SyncMode.DIFF, 0, (LogEntry(0, b""),)),
        ForwardReply(-(1 << 31), (1 << 63) - 1, -(1 << 63), None),
    ):
        assert decode_one(encode(msg)) == msg


@settings(max_examples=100, deadline=None)
@given(msgs=st.lists(any_message, max_size=20), data=st.data())
def test_stream_in_random_chunks(msgs: list[Message], data: st.DataObject) -> None:
    stream = b"".join(encode(m) for m in msgs)
    decoder = FrameDecoder()
    out: list[Message] = []
    pos = 0
    while pos < len(stream):
        n = data.draw(st.integers(1, max(1, len(stream) - pos)))
        out += decoder.feed(stream[pos : pos + n])
        pos += n
    out += decoder.feed(b"")
    assert out == msgs
    assert decoder.buffered == 0


def test_bytewise_feed() -> None:
    msgs: list[Message] = [
        Sync(1, 2, SyncMode.DIFF, 3, (LogEntry(4, b"x" * 10),)),
        ForwardReply(1, 2, 3, 4),
    ]
    decoder = FrameDecoder()
    out = [m for b in b"".join(map(encode, msgs)) for m in decoder.feed(bytes([b]))]
    assert out == msgs


@pytest.mark.parametrize(
    "bad",
    [
        Notification(1 << 31, 0, 0, 0, 0, ServerState.LOOKING),
        Notification(0, 0, 1 << 63, 0, 0, ServerState.LOOKING),
        AckEpoch(0, 0, 0, 0, (1 << 63,)),
        ForwardReply(0, 0, 0, -(1 << 63) - 1),
    ],
)
def test_encode_refuses_out_of_range(bad: Message) -> None:
    with pytest.raises(WireError, match="out of range"):
        encode(bad)


def test_encode_refuses_non_message() -> None:
    with pytest.raises(WireError, match="not a ZAB message"):
        encode(LogEntry(1, b""))  # type: ignore[arg-type]


def frame(type_code: int, body: bytes, sender: int = 1) -> bytes:
    return struct.pack(">IBi", 5 + len(body), type_code, sender) + body


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (frame(0, b""), "unknown message type 0"),
        (frame(200, b""), "unknown message type 200"),
        (struct.pack(">IB", 1, 12), "below the 5-byte header"),
        (frame(12, b"\0" * 7), "Ping.epoch: body too short"),
        (frame(12, b"\0" * 9), "Ping: 1 trailing bytes"),
        (frame(15, struct.pack(">qqB", 0, 0, 2)), "presence byte 2"),
        (frame(15, struct.pack(">qqBq", 0, 0, 0, 5)), "ForwardReply: 8 trailing bytes"),
        (frame(15, struct.pack(">qqB", 0, 0, 1)), "ForwardReply.zxid: body too short"),
        (frame(10, struct.pack(">qqB", 0, 0, 0)), "Ack: 1 trailing bytes"),
        (frame(1, struct.pack(">iqqqB", 0, 0, 0, 0, 4)), "unknown ServerState code 4"),
        (frame(5, struct.pack(">qBqI", 0, 9, 0, 0)), "unknown SyncMode code 9"),
        (frame(4, struct.pack(">qqqI", 0, 0, 0, 2) + b"\0" * 15), "epoch_ends: 2 items"),
        (frame(5, struct.pack(">qBqI", 0, 0, 0, 1) + b"\0" * 11), "entries: 1 items"),
        (frame(14, struct.pack(">qqI", 0, 0, 4) + b"abc"), "payload: 4 items"),
        (frame(9, struct.pack(">qqI", 0, 0, 0xFFFFFFFF)), "entry.payload: 4294967295 items"),
    ],
)
def test_malformed_frames(data: bytes, match: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(WireError, match=match):
        decoder.feed(data)
    with pytest.raises(WireError, match="already failed"):
        decoder.feed(encode(messages.Ping(1, 1)))


def test_oversized_length_refused_before_buffering() -> None:
    decoder = FrameDecoder(max_frame=1024)
    assert decoder.feed(struct.pack(">I", 1024)[:3]) == []
    with pytest.raises(WireError, match="exceeds max_frame 1024"):
        decoder.feed(struct.pack(">I", 1025)[3:])  # refused on the 4th length byte, no body
    assert decoder.buffered == 0
    with pytest.raises(WireError, match="exceeds max_frame"):
        FrameDecoder().feed(b"\xff\xff\xff\xff")


def test_frame_at_max_frame_accepted() -> None:
    msg = messages.Forward(1, 1, 1, b"p" * 100)
    data = encode(msg)
    assert FrameDecoder(max_frame=len(data) - 4).feed(data) == [msg]
    with pytest.raises(WireError):
        FrameDecoder(max_frame=len(data) - 5).feed(data)


def test_max_frame_must_fit_a_header() -> None:
    with pytest.raises(ValueError):
        FrameDecoder(max_frame=4)


def feed_only_wire_errors(data: bytes) -> None:
    decoder = FrameDecoder(max_frame=1 << 16)
    try:
        for m in decoder.feed(data):
            assert type(m) in MESSAGE_CLASSES
    except WireError:
        pass


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=256))
def test_fuzz_random_bytes(data: bytes) -> None:
    feed_only_wire_errors(data)


@settings(max_examples=500, deadline=None)
@given(msg=any_message, data=st.data())
def test_fuzz_mutated_frames(msg: Message, data: st.DataObject) -> None:
    raw = bytearray(encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    mutated = bytes(raw[:cut]) + data.draw(st.binary(max_size=16))
    feed_only_wire_errors(mutated)
    # Also with a well-formed header around a mutated body, so the body decoder gets hit.
    body = bytes(raw[HEADER_SIZE:cut])
    feed_only_wire_errors(frame(raw[4], body))
