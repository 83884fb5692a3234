"""Typed errors for record data.

Each names one Kafka failure class; the Kafka protocol edge maps them to error codes in one
table (CORRUPT_MESSAGE, INVALID_RECORD, UNSUPPORTED_COMPRESSION_TYPE, ...). Messages say
which field was wrong and what was found, because the caller logs them once and moves on.
"""


class RecordError(Exception):
    """Base for every problem with record bytes supplied by a client or read from disk."""


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
