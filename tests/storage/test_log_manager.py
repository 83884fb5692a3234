"""The log directory: checkpoint files in Kafka's format, the clean-shutdown marker, the
directory lock, and the periodic duties (flush.ms, retention)."""

from __future__ import annotations

import logging
import os

import pytest

from directlog.topics import TopicPartition
from services.broker.storage import LogConfig, StorageError
from services.broker.storage.checkpoint import OffsetCheckpointFile
from services.broker.storage.log_manager import (
    CLEAN_SHUTDOWN_FILE,
    HIGH_WATERMARK_CHECKPOINT,
    LOG_START_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    LogManager,
    parse_log_dir_name,
)
from tests.storage.helpers import batch, read_all

ORDERS = TopicPartition("orders", 0)
AUDIT = TopicPartition("audit.log-v2", 3)


def test_close_writes_checkpoints_and_marks_a_clean_shutdown(tmp_path, clock):
    manager = LogManager.open(tmp_path, clock=clock)
    orders, audit = manager.create(ORDERS), manager.create(AUDIT)
    for i in range(3):
        orders.append(batch([b"o%d" % i, b"x"]))
    audit.append(batch([b"a"]))
    orders.update_high_watermark(4)
    manager.close()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert (tmp_path / RECOVERY_POINT_CHECKPOINT).read_text() == (
        "0\n2\naudit.log-v2 3 1\norders 0 6\n"
    )
    assert (
        tmp_path / HIGH_WATERMARK_CHECKPOINT
    ).read_text() == "0\n2\naudit.log-v2 3 0\norders 0 4\n"
    assert (tmp_path / LOG_START_CHECKPOINT).read_text() == "0\n2\naudit.log-v2 3 0\norders 0 0\n"

    reopened = LogManager.open(tmp_path, clock=clock)
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()  # a crash from now on is unclean
    assert set(reopened.logs) == {ORDERS, AUDIT}
    log = reopened.get(ORDERS)
    assert (log.log_end_offset, log.high_watermark, log.recovery_point) == (6, 4, 6)
    assert [r.value for r in read_all(log)][::2] == [b"o0", b"o1", b"o2"]
    reopened.close()


def test_a_moved_log_start_is_checkpointed_and_kept_across_a_crash(tmp_path, clock):
    manager = LogManager.open(tmp_path, clock=clock)
    orders = manager.create(ORDERS)
    for i in range(5):
        orders.append(batch([b"o%d" % i]))
    orders.update_high_watermark(5)
    orders.flush()
    orders.advance_log_start(3)
    manager.checkpoint_log_starts()
    assert (tmp_path / LOG_START_CHECKPOINT).read_text() == "0\n1\norders 0 3\n"
    # No close: the next open recovers, and still serves nothing below offset 3.
    os.close(manager._lock_fd)  # the crash: the directory lock goes with the process
    reopened = LogManager.open(tmp_path, clock=clock)
    log = reopened.get(ORDERS)
    assert (log.log_start_offset, log.log_end_offset) == (3, 5)
    assert [r.value for r in read_all(log, 3)] == [b"o3", b"o4"]
    reopened.close()


def test_a_directory_has_one_owner(tmp_path):
    manager = LogManager.open(tmp_path)
    with pytest.raises(StorageError, match="in use"):
        LogManager.open(tmp_path)
    manager.close()
    LogManager.open(tmp_path).close()


def test_topic_configs_come_from_the_callback(tmp_path):
    configs = {"small": LogConfig(segment_bytes=4096)}
    manager = LogManager.open(tmp_path, lambda topic: configs.get(topic, LogConfig()))
    assert manager.create(TopicPartition("small", 0)).config.segment_bytes == 4096
    assert manager.create(TopicPartition("other", 0)).config.segment_bytes == 1 << 30
    with pytest.raises(ValueError, match="characters"):
        manager.create(TopicPartition("bad/name", 0))
    manager.close()


def test_flush_due_and_retention_rounds(tmp_path, clock):
    config = LogConfig(flush_ms=1000, segment_bytes=600, retention_ms=5000)
    manager = LogManager.open(tmp_path, lambda topic: config, clock=clock)
    log = manager.create(ORDERS)
    for _ in range(10):
        log.append(batch([b"v" * 100], ts=clock.now))
    assert manager.flush_due() == 0
    clock.advance(1000)
    assert manager.flush_due() == 1
    assert OffsetCheckpointFile(tmp_path / RECOVERY_POINT_CHECKPOINT).read() == {ORDERS: 10}
    log.update_high_watermark(10)
    clock.advance(10_000)
    assert manager.enforce_retention() >= 2
    start = OffsetCheckpointFile(tmp_path / LOG_START_CHECKPOINT).read()[ORDERS]
    assert start == log.log_start_offset > 0
    manager.close()


def test_deleting_a_partition_removes_its_directory(tmp_path):
    manager = LogManager.open(tmp_path)
    manager.create(ORDERS).append(batch([b"x"]))
    manager.delete(ORDERS)
    assert not (tmp_path / "orders-0").exists()
    assert manager.get(ORDERS) is None
    manager.close()


def test_malformed_checkpoints_are_ignored_safely(tmp_path, caplog):
    manager = LogManager.open(tmp_path)
    manager.create(ORDERS).append(batch([b"x", b"y"]))
    manager.close()
    (tmp_path / RECOVERY_POINT_CHECKPOINT).write_text("0\n5\norders 0 2\n")
    (tmp_path / CLEAN_SHUTDOWN_FILE).unlink()
    with caplog.at_level(logging.WARNING):
        reopened = LogManager.open(tmp_path)
    assert "malformed checkpoint" in caplog.text
    assert reopened.get(ORDERS).log_end_offset == 2  # recovered from the start instead
    reopened.close()


def test_checkpoint_round_trip_is_atomic(tmp_path):
    checkpoint = OffsetCheckpointFile(tmp_path / "cp")
    checkpoint.write({ORDERS: 5, AUDIT: 7})
    assert checkpoint.read() == {ORDERS: 5, AUDIT: 7}
    assert not list(tmp_path.glob("*.tmp"))
    assert OffsetCheckpointFile(tmp_path / "missing").read() == {}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("orders-0", ORDERS),
        ("audit.log-v2-3", AUDIT),
        ("orders", None),
        ("orders-x", None),
        ("-1", None),
        ("bad name-1", None),
    ],
)
def test_log_directory_names(name, expected):
    assert parse_log_dir_name(name) == expected
