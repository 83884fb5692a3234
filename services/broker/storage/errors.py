"""Typed errors of the partition log. The Kafka protocol edge maps each to its error code."""

from directlog.records.errors import RecordError


class StorageError(Exception):
    """An I/O failure on the log directory. Kafka: KAFKA_STORAGE_ERROR."""


class OffsetOutOfRangeError(Exception):
    """A read below the log start offset or above the log end offset. Kafka: OFFSET_OUT_OF_RANGE."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(f"offset {offset} outside the log [{log_start_offset}, {log_end_offset}]")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class OffsetMovedToTieredStorageError(OffsetOutOfRangeError):
    """A read below the local log start of a tiered log, whose records are in the remote store
    (KIP-405). Consumers read them from there; a follower gets
    OFFSET_MOVED_TO_TIERED_STORAGE."""

    def __init__(self, offset: int, log_start_offset: int, local_log_start_offset: int) -> None:
        super().__init__(offset, log_start_offset, local_log_start_offset)
        self.args = (
            f"offset {offset} is in the remote store: the log starts at {log_start_offset}, "
            f"its local part at {local_log_start_offset}",
        )
        self.local_log_start_offset = local_log_start_offset


class MessageTooLargeError(Exception):
    """A batch larger than max.message.bytes. Kafka: MESSAGE_TOO_LARGE."""


class RecordBatchTooLargeError(Exception):
    """An append larger than segment.bytes, which no segment could hold.
    Kafka: RECORD_LIST_TOO_LARGE."""


class InvalidTimestampError(RecordError):
    """A record timestamp outside the window the topic accepts. Kafka: INVALID_TIMESTAMP."""


class ReservationStateError(Exception):
    """The reserve/commit protocol was used out of order: a commit that is not the oldest
    pending reservation, an append while reservations are pending, a reservation that does
    not fit the head segment. The datapath above must serialize; nothing was written."""


class OutOfOrderSequenceError(Exception):
    """An idempotent producer's batch does not follow its last one: a sequence gap, or a new
    epoch that does not start at 0. Kafka: OUT_OF_ORDER_SEQUENCE_NUMBER."""


class InvalidProducerEpochError(Exception):
    """A batch from an older epoch of its producer id than the partition has seen: a
    producer fenced by a newer instance. Kafka: INVALID_PRODUCER_EPOCH."""
