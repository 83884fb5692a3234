"""The one table mapping Directlog's typed errors to Kafka error codes, at the protocol edge."""

from __future__ import annotations

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.records.errors import (
    CorruptRecordError,
    InvalidRecordError,
    UnsupportedCompressionError,
)
from directlog.topic_config import InvalidConfigError
from services.broker.storage import errors as storage

_TABLE: list[tuple[type[BaseException], ErrorCode]] = [
    (UnsupportedCompressionError, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
    (CorruptRecordError, ErrorCode.CORRUPT_MESSAGE),
    (InvalidRecordError, ErrorCode.INVALID_RECORD),
    (storage.OffsetMovedToTieredStorageError, ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE),
    (storage.OffsetOutOfRangeError, ErrorCode.OFFSET_OUT_OF_RANGE),
    (storage.MessageTooLargeError, ErrorCode.MESSAGE_TOO_LARGE),
    (storage.RecordBatchTooLargeError, ErrorCode.RECORD_LIST_TOO_LARGE),
    (storage.InvalidTimestampError, ErrorCode.INVALID_TIMESTAMP),
    (storage.OutOfOrderSequenceError, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    (storage.InvalidProducerEpochError, ErrorCode.INVALID_PRODUCER_EPOCH),
    (InvalidConfigError, ErrorCode.INVALID_CONFIG),
    (storage.StorageError, ErrorCode.KAFKA_STORAGE_ERROR),
]


def error_code_for(error: BaseException) -> ErrorCode:
    """The Kafka error code for a typed error; UNKNOWN_SERVER_ERROR for anything else."""
    if isinstance(error, KafkaError):
        return error.code
    for kind, code in _TABLE:
        if isinstance(error, kind):
            return code
    return ErrorCode.UNKNOWN_SERVER_ERROR
