"""What a copy of one closed segment ships with it: the remoteLogIndex entries of its data
and the leader epochs of its records, found by walking its batches.

The walk checks every batch's CRC, so a segment damaged on the local disk is never
shipped. Entries cover spans of whole batches of about `span_bytes` each (a batch larger
than that alone), so a remote read fetches one such byte range, not the whole segment.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field

from directlog.records.batch import NO_TIMESTAMP, iter_batches, verify_crc
from directlog.remote.index import IndexEntry
from directlog.remote.rdi import RemoteDataId


class SegmentChangedError(Exception):
    """The local segment is not what the broker said it was (deleted, truncated)."""


@dataclass(slots=True)
class SegmentScan:
    entries: list[IndexEntry] = field(default_factory=list)
    epochs: list[tuple[int, int]] = field(default_factory=list)  # (epoch, first offset)
    start_offset: int = -1  # the first offset shipped (entries start here)
    end_offset: int = -1  # the last offset
    max_timestamp: int = NO_TIMESTAMP


def scan_segment(
    fd: int, size: int, object_uri: str, start_offset: int, span_bytes: int
) -> SegmentScan:
    """Walk the first `size` bytes of the segment open at `fd` (a `.log` file) and make the
    index entries for its batches holding offsets at or after `start_offset` (what an
    earlier copy or a deleted log start leaves out), each pointing into `object_uri`."""
    scan = SegmentScan()
    if size == 0:
        return scan
    if os.fstat(fd).st_size < size:
        raise SegmentChangedError(f"the segment is shorter than {size} bytes")
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
        data = memoryview(mapped)
        try:
            span: _Span | None = None
            walked = 0
            for position, header in iter_batches(data):
                walked = position + header.size
                verify_crc(data, position, header)
                if header.last_offset < start_offset:
                    continue
                if scan.start_offset < 0:
                    scan.start_offset = header.base_offset
                if not scan.epochs or scan.epochs[-1][0] != header.partition_leader_epoch:
                    scan.epochs.append((header.partition_leader_epoch, header.base_offset))
                scan.end_offset = header.last_offset
                scan.max_timestamp = max(scan.max_timestamp, header.max_timestamp)
                if span is not None and walked - span.start > span_bytes:
                    scan.entries.append(span.entry(object_uri))
                    span = None
                if span is None:
                    span = _Span(position, header.base_offset, header.base_timestamp)
                span.end = walked
                span.last_offset = header.last_offset
                span.last_timestamp = max(span.last_timestamp, header.max_timestamp)
            if walked != size:
                raise SegmentChangedError(f"batches end at {walked}, the segment at {size}")
            if span is not None:
                scan.entries.append(span.entry(object_uri))
        finally:
            data.release()
    return scan


@dataclass(slots=True)
class _Span:
    """The batches one index entry covers so far (they lie back to back in the segment)."""

    start: int  # position of the first batch
    first_offset: int
    first_timestamp: int
    end: int = 0  # position after the last batch
    last_offset: int = -1
    last_timestamp: int = NO_TIMESTAMP

    def entry(self, object_uri: str) -> IndexEntry:
        return IndexEntry(
            first_offset=self.first_offset,
            last_offset=self.last_offset,
            first_timestamp=self.first_timestamp,
            last_timestamp=self.last_timestamp,
            rdi=RemoteDataId(object_uri, self.start, self.end - self.start),
        )
