"""Tiering copies only below the last stable offset: the broker's tiering service reports
it as the bound of what may be copied, so an open transaction's segments stay local."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from directlog.records.batch import Record, build_batch
from directlog.rpc import tiering_pb2 as tpb
from directlog.topic_config import LogConfig
from directlog.topics import TopicPartition
from services.broker.cluster_metadata import PartitionInfo
from services.broker.partition import Partition
from services.broker.storage import PartitionLog
from services.broker.tiered.service import TieringService

pytestmark = pytest.mark.timeout(60)


def test_the_copy_bound_is_the_last_stable_offset(tmp_path: Path) -> None:
    tp = TopicPartition("tiered", 0)
    log = PartitionLog.open(tmp_path / "tiered-0", LogConfig(remote_storage_enable=True))
    partition = Partition(tp, uuid.uuid4(), log, 1, lambda: None, lambda p, i: None)
    partition.become_leader(PartitionInfo(0, (1,), 1, 0, (1,), 0), 0)
    log.append(build_batch([Record(0, 1, b"k", b"plain")]), leader_epoch=0)
    log.append(
        build_batch(
            [Record(0, 2, b"k", b"txn")],
            producer_id=5,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
        ),
        leader_epoch=0,
    )
    log.update_high_watermark(log.log_end_offset)
    replicas: Any = SimpleNamespace(broker_id=1, partitions={tp: partition})
    service = TieringService(replicas, link=None)  # type: ignore[arg-type]

    def bound() -> int:
        reply = asyncio.run(service.ListPartitions(tpb.ListPartitionsRequest(), None))  # type: ignore[arg-type]
        (hosted,) = reply.partitions
        return int(hosted.high_watermark)

    assert (log.high_watermark, bound()) == (2, 1)
    log.append_marker(5, 0, True, 0, leader_epoch=0)
    log.update_high_watermark(log.log_end_offset)
    assert bound() == 3
    log.close()
