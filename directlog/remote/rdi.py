"""Remote data identifiers (KIP-405's RDI): where a span of remote log data lives.

An RDI is the object's URI and a byte range, written as UTF-8 text in HTTP's range syntax:
``s3://bucket/prefix/orders-<id>/0/segments/00000000000000000000-<id>.log#bytes=0-1048575``
(first and last byte, inclusive). The same form serves ``file://`` and ``hdfs://`` objects.
"""

from __future__ import annotations

from dataclasses import dataclass

RANGE_MARK = "#bytes="
MAX_RDI_BYTES = 4096  # an RDI longer than this is malformed (remoteLogIndex entries are small)


class InvalidRdiError(ValueError):
    """Bytes that are not an RDI."""


@dataclass(frozen=True, slots=True)
class RemoteDataId:
    uri: str
    position: int
    length: int

    def __post_init__(self) -> None:
        if not self.uri or RANGE_MARK in self.uri:
            raise InvalidRdiError(f"bad object URI {self.uri!r}")
        if self.position < 0 or self.length <= 0:
            raise InvalidRdiError(f"bad byte range at {self.position}, length {self.length}")

    @property
    def end(self) -> int:
        """The position after the range's last byte."""
        return self.position + self.length

    def encode(self) -> bytes:
        return f"{self.uri}{RANGE_MARK}{self.position}-{self.end - 1}".encode()

    @classmethod
    def decode(cls, raw: bytes) -> RemoteDataId:
        if len(raw) > MAX_RDI_BYTES:
            raise InvalidRdiError(f"an RDI of {len(raw)} bytes")
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            raise InvalidRdiError("an RDI that is not UTF-8") from exc
        uri, mark, span = text.rpartition(RANGE_MARK)
        first, dash, last = span.partition("-")
        if not mark or not dash or not first.isdigit() or not last.isdigit():
            raise InvalidRdiError(f"no byte range in {text!r}")
        return cls(uri, int(first), int(last) - int(first) + 1)
