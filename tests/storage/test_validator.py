"""plan_append with its C check (check_batch) against the same function with the check
always declining, so that every batch takes the Python path: for any buffer, config and
mode the two must return the same plan or raise the same error with the same message."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import event, given, settings
from hypothesis import strategies as st

from directlog.records.batch import (
    ATTRIBUTES_AT,
    CRC_AT,
    HEADER_SIZE,
    Record,
    TimestampType,
    build_batch,
)
from directlog.records.compression import Compression
from directlog.records.errors import InvalidRecordError, RecordError
from directlog.topic_config import LogConfig
from services.broker.storage import validator
from services.broker.storage.errors import InvalidTimestampError, MessageTooLargeError
from services.broker.storage.validator import AppendPlan, plan_append
from tests.storage.helpers import T0


def outcome(
    buf: bytes, config: LogConfig, assign_offsets: bool, next_offset: int
) -> AppendPlan | tuple[type[Exception], str]:
    try:
        return plan_append(
            buf,
            next_offset=next_offset,
            leader_epoch=7,
            config=config,
            now_ms=T0,
            assign_offsets=assign_offsets,
        )
    except (RecordError, MessageTooLargeError, InvalidTimestampError) as exc:
        return type(exc), str(exc)


def both_ways(
    buf: bytes, config: LogConfig, assign_offsets: bool, next_offset: int
) -> AppendPlan | tuple[type[Exception], str]:
    fast = outcome(buf, config, assign_offsets, next_offset)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(validator, "check_batch", lambda *_: None)
        slow = outcome(buf, config, assign_offsets, next_offset)
    assert fast == slow
    return fast


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    count = draw(st.integers(1, 4))
    base = draw(st.sampled_from([0, 0, 5, 1 << 40]))
    gap = draw(st.sampled_from([1, 1, 1, 3]))
    first = T0 + draw(st.sampled_from([0, -10, 10, -(1 << 20), 1 << 20]))
    records = [
        Record(
            base + gap * i,
            first + draw(st.integers(-50, 50)),
            draw(st.none() | st.binary(max_size=8)),
            draw(st.binary(max_size=40)),
        )
        for i in range(count)
    ]
    raw = bytearray(
        build_batch(
            records,
            compression=draw(st.sampled_from([Compression.NONE] * 3 + [Compression.LZ4])),
            timestamp_type=draw(st.sampled_from(list(TimestampType))),
            control=draw(st.sampled_from([False] * 5 + [True])),
            partition_leader_epoch=draw(st.integers(-1, 3)),
        )
    )
    if draw(st.integers(0, 4)) == 0:  # a max timestamp that disagrees with the records
        struct.pack_into(">q", raw, 35, draw(st.integers(T0 - 100, T0 + 100)))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(raw) - 1))
        raw[at] ^= draw(st.integers(1, 255))
    if draw(st.booleans()):
        length = struct.unpack_from(">i", raw, 8)[0]
        stop = min(len(raw), max(ATTRIBUTES_AT, 12 + length))
        struct.pack_into(">I", raw, CRC_AT, crc32c(raw[ATTRIBUTES_AT:stop]))
    return bytes(raw)


configs = st.builds(
    LogConfig,
    max_message_bytes=st.sampled_from([1 << 20, 1 << 20, 150]),
    message_timestamp_type=st.sampled_from(list(TimestampType)),
    message_timestamp_before_max_ms=st.sampled_from([1 << 62, 30, 1 << 30]),
    message_timestamp_after_max_ms=st.sampled_from([1 << 62, 30, 1 << 30]),
)


@given(
    st.lists(batches(), min_size=1, max_size=3),
    configs,
    st.booleans(),
    st.sampled_from([0, 5, 1 << 41]),
    st.binary(max_size=HEADER_SIZE + 4),
)
@settings(max_examples=500, deadline=None)
def test_the_c_check_never_changes_a_plan_or_an_error(
    parts: list[bytes],
    config: LogConfig,
    assign_offsets: bool,
    next_offset: int,
    tail: bytes,
) -> None:
    buf = b"".join(parts)
    result = both_ways(buf, config, assign_offsets, next_offset)
    event("planned" if isinstance(result, AppendPlan) else f"refused: {result[0].__name__}")
    both_ways(buf + tail, config, assign_offsets, next_offset)


def test_a_sound_batch_is_planned_by_the_c_check(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = build_batch([Record(i, T0 + i, None, b"v") for i in range(3)])
    calls: list[int] = []
    check = validator.check_batch

    def counting(*args: object) -> object:
        result = check(*args)  # type: ignore[arg-type]
        calls.append(result is not None)
        return result

    monkeypatch.setattr(validator, "check_batch", counting)
    plan = outcome(raw + raw, LogConfig(), True, 10)
    assert isinstance(plan, AppendPlan)
    assert calls == [True, True]
    assert (plan.first_offset, plan.last_offset, plan.records, plan.size) == (
        10,
        15,
        6,
        2 * len(raw),
    )
    assert [b.base_offset for b in plan.batches] == [10, 13]


def damaged(raw: bytes) -> bytes:
    """`raw` with its last byte flipped, so that its CRC no longer matches."""
    return raw[:-1] + bytes([raw[-1] ^ 1])


def test_rules_apply_in_their_order_on_both_paths() -> None:
    """Too large comes before the CRC, the CRC before the producer rules and the framing."""
    big = build_batch([Record(0, T0, None, b"v" * 200)])
    result = both_ways(damaged(big), LogConfig(max_message_bytes=100), True, 0)
    assert isinstance(result, tuple) and result[0] is MessageTooLargeError
    control = build_batch([Record(0, T0, None, b"v")], control=True)
    result = both_ways(damaged(control), LogConfig(), True, 0)
    assert isinstance(result, tuple) and "CRC32C" in result[1]
    result = both_ways(control, LogConfig(), True, 0)
    assert result == (InvalidRecordError, "producers may not write control batches")
    gap = build_batch([Record(0, T0, None, b"a"), Record(2, T0, None, b"b")])
    result = both_ways(gap, LogConfig(), True, 0)
    assert result == (InvalidRecordError, "last offset delta 2 disagrees with 2 records")
    assert isinstance(both_ways(gap, LogConfig(), False, 0), AppendPlan)


def test_records_without_a_timestamp_are_not_checked_against_the_clock() -> None:
    """Old producers' messages up-converted keep NO_TIMESTAMP (-1); as Kafka, the
    message.timestamp.before.max.ms check applies to the stamped records only."""
    config = LogConfig(message_timestamp_before_max_ms=3_600_000)
    unstamped = build_batch([Record(0, -1, None, b"a"), Record(1, -1, None, b"b")])
    plan = both_ways(unstamped, config, True, 0)
    assert isinstance(plan, AppendPlan) and plan.max_timestamp == -1
    mixed = build_batch([Record(0, -1, None, b"a"), Record(1, T0 - 1000, None, b"b")])
    plan = both_ways(mixed, config, True, 0)
    assert isinstance(plan, AppendPlan) and plan.max_timestamp == T0 - 1000
    old = T0 - 7_200_000
    stale = build_batch([Record(0, -1, None, b"a"), Record(1, old, None, b"b")])
    result = both_ways(stale, config, True, 0)
    assert isinstance(result, tuple) and result[0] is InvalidTimestampError
    assert f"timestamp {old} is more than" in result[1]


def test_the_deprecated_difference_bound_applies_while_before_and_after_are_unset() -> None:
    """Kafka 3.7: message.timestamp.difference.max.ms bounds both ways unless
    message.timestamp.before.max.ms / after.max.ms are set."""
    config = LogConfig.from_properties({"message.timestamp.difference.max.ms": "1000"})
    for timestamp in (T0 - 2000, T0 + 2000):
        result = both_ways(build_batch([Record(0, timestamp, None, b"a")]), config, True, 0)
        assert isinstance(result, tuple) and result[0] is InvalidTimestampError
    within = build_batch([Record(0, T0 - 500, None, b"a"), Record(1, T0 + 500, None, b"b")])
    assert isinstance(both_ways(within, config, True, 0), AppendPlan)
    wider = LogConfig.from_properties(
        {"message.timestamp.difference.max.ms": "1000", "message.timestamp.before.max.ms": "5000"}
    )
    late = build_batch([Record(0, T0 - 2000, None, b"a")])
    assert isinstance(both_ways(late, wider, True, 0), AppendPlan)
    early = build_batch([Record(0, T0 + 2000, None, b"a")])
    result = both_ways(early, wider, True, 0)
    assert isinstance(result, tuple) and result[0] is InvalidTimestampError


def test_records_a_rule_refuses_are_named_by_their_index_in_the_batch() -> None:
    """KIP-467: the whole batch is refused, naming each record at fault and why."""
    config = LogConfig.from_properties({"message.timestamp.before.max.ms": "1000"})
    batch = build_batch(
        [
            Record(0, T0, b"k", b"fresh"),
            Record(1, T0 - 5000, b"k", b"stale"),
            Record(2, -1, b"k", b"no timestamp"),
            Record(3, T0 - 9000, b"k", b"staler"),
        ]
    )
    with pytest.raises(InvalidTimestampError, match=r"^record 1: .*\(and 1 more records\)") as late:
        plan_append(
            batch, next_offset=0, leader_epoch=7, config=config, now_ms=T0, assign_offsets=True
        )
    assert [index for index, _ in late.value.record_errors] == [1, 3]
    assert (
        "timestamp 1699999991000 is more than message.timestamp.before.max.ms (1000)"
        in (late.value.record_errors[1][1])
    )
    compact = LogConfig.from_properties({"cleanup.policy": "compact"})
    keyless = build_batch([Record(0, T0, None, b"a"), Record(1, T0, b"k", b"b")])
    with pytest.raises(InvalidRecordError) as refused:
        plan_append(
            keyless, next_offset=0, leader_epoch=7, config=compact, now_ms=T0, assign_offsets=True
        )
    assert refused.value.record_errors == (
        (0, "Compacted topic cannot accept message without key"),
    )
