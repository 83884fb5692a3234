"""Typed errors for record data.

Each names one Kafka failure class; the Kafka protocol edge maps them to error codes in one
table (CORRUPT_MESSAGE, INVALID_RECORD, UNSUPPORTED_COMPRESSION_TYPE, ...). Messages say
which field was wrong and what was found, because the caller logs them once and moves on.
"""

from __future__ import annotations

from collections.abc import Sequence


class RecordError(Exception):
    """Base for every problem with record bytes supplied by a client or read from disk.

    ``record_errors`` names the records at fault when a rule refused single records of a
    batch: (index in the batch, why), which Produce v8+ answers as KIP-467's record_errors
    so that a producer can tell the bad records from the rest of their batch."""

    def __init__(self, message: str, record_errors: Sequence[tuple[int, str]] = ()) -> None:
        super().__init__(message)
        self.record_errors = tuple(record_errors)


class CorruptRecordError(RecordError):
    """Bytes fail an integrity check: CRC mismatch, a length beyond its buffer, a truncated
    field. Kafka: CORRUPT_MESSAGE."""


class UnsupportedMagicError(CorruptRecordError):
    """A batch or message carries a magic byte this codec does not know."""


class InvalidRecordError(RecordError):
    """Intact bytes whose content breaks a rule: negative counts, offset deltas out of order,
    a record count that disagrees with the header. Kafka: INVALID_RECORD."""


class UnsupportedCompressionError(RecordError):
    """A codec id outside 0..4, or one the message format cannot carry (zstd below magic 2).
    Kafka: UNSUPPORTED_COMPRESSION_TYPE."""
