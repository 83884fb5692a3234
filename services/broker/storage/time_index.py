"""The `.timeindex` file: sparse map from timestamp to the offset where it is first reached.

Entry (12 bytes): timestamp int64 | relative_offset int32. An entry is added with each
offset-index entry when the segment's largest timestamp has grown, and once more when the
segment stops being the head, so the last entry always holds the segment's largest
timestamp. Timestamps and offsets are both non-decreasing.
"""

from __future__ import annotations

import struct
from bisect import bisect_left

from services.broker.storage.index_file import IndexFile


class TimeIndex(IndexFile):
    ENTRY = struct.Struct(">qi")

    def _decode(self, first: int, second: int) -> tuple[int, int]:
        return first, self.base_offset + second

    def _encode(self, key: int, value: int) -> bytes:
        return self.ENTRY.pack(key, value - self.base_offset)

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) if the timestamp is larger than the last entry's."""
        if not self.keys or timestamp > self.keys[-1]:
            assert not self.values or offset >= self.values[-1], "time index offsets went back"
            self.append_entry(timestamp, offset)

    def lookup(self, timestamp: int) -> int | None:
        """Offset of the last entry whose timestamp is <= timestamp, or None."""
        i = self.floor(timestamp)
        return self.values[i] if i >= 0 else None

    @property
    def last_timestamp(self) -> int | None:
        return self.keys[-1] if self.keys else None

    def truncate_to(self, offset: int) -> None:
        """Drop entries that point at offsets >= offset."""
        self.truncate(bisect_left(self.values, offset))
