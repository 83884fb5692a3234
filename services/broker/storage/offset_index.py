"""The `.index` file: sparse map from offset to byte position in the segment's `.log`.

Entry (8 bytes): relative_offset int32 (offset - segment base) | position int32.
One entry is added each time index.interval.bytes of log have been appended since the last,
always at a batch start, so every indexed position is a batch boundary.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right

from services.broker.storage.index_file import IndexFile


class OffsetIndex(IndexFile):
    ENTRY = struct.Struct(">ii")

    def _decode(self, first: int, second: int) -> tuple[int, int]:
        return self.base_offset + first, second

    def _encode(self, key: int, value: int) -> bytes:
        return self.ENTRY.pack(key - self.base_offset, value)

    def _entries_valid(self) -> bool:
        keys, values = self.keys, self.values
        return (not keys or keys[0] >= self.base_offset) and all(
            keys[i] < keys[i + 1] and values[i] < values[i + 1] for i in range(len(keys) - 1)
        )

    def append(self, offset: int, position: int) -> None:
        assert not self.keys or (offset > self.keys[-1] and position > self.values[-1])
        self.append_entry(offset, position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry at or below `offset`, else the segment start."""
        i = self.floor(offset)
        return (self.keys[i], self.values[i]) if i >= 0 else (self.base_offset, 0)

    def lookup_position(self, position: int) -> int:
        """The last indexed batch boundary at or below `position` (0 if none)."""
        i = bisect_right(self.values, position) - 1
        return self.values[i] if i >= 0 else 0

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= offset."""
        self.truncate(bisect_left(self.keys, offset))

    def last_position_within(self, size: int) -> bool:
        """Whether every indexed position lies inside a log of `size` bytes."""
        return not self.values or self.values[-1] < size
