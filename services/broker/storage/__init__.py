"""The broker's storage engine: partition logs of segment files, and the log directory."""

from directlog.topic_config import InvalidConfigError, LogConfig
from services.broker.storage.errors import (
    InvalidTimestampError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
    ReservationStateError,
    StorageError,
)
from services.broker.storage.leader_epochs import EpochEntry, LeaderEpochCache
from services.broker.storage.log import AppendResult, LogRead, PartitionLog, Reservation
from services.broker.storage.log_file import FileSlice

__all__ = [
    "AppendResult",
    "EpochEntry",
    "FileSlice",
    "InvalidConfigError",
    "InvalidTimestampError",
    "LeaderEpochCache",
    "LogConfig",
    "LogRead",
    "MessageTooLargeError",
    "OffsetOutOfRangeError",
    "PartitionLog",
    "RecordBatchTooLargeError",
    "Reservation",
    "ReservationStateError",
    "StorageError",
]
