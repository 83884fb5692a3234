"""Offset checkpoint files of a log directory, in Kafka's text format:

    0                      <- format version
    2                      <- number of entries
    orders 0 1042          <- topic, partition, offset
    orders 1 977

Written atomically (temporary file, fsync, rename, fsync of the directory), so a crash
leaves either the old or the new file, never a mix.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from directlog.durable_files import write_atomically
from directlog.topics import TopicPartition

log = logging.getLogger(__name__)

VERSION = 0


class OffsetCheckpointFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        lines = [str(VERSION), str(len(offsets))]
        lines += [f"{tp.topic} {tp.partition} {offset}" for tp, offset in sorted(offsets.items())]
        write_atomically(self.path, ("\n".join(lines) + "\n").encode())

    def read(self) -> dict[TopicPartition, int]:
        """The entries, or {} if the file is missing or malformed. Every use of these
        offsets is safe when they are absent: recovery then scans more, log start falls
        back to the first segment, the high watermark to the log start."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            return _parse(text)
        except ValueError as exc:
            log.warning("ignoring malformed checkpoint %s: %s", self.path, exc)
            return {}


def _parse(text: str) -> dict[TopicPartition, int]:
    lines = text.splitlines()
    if len(lines) < 2 or lines[0].strip() != str(VERSION):
        raise ValueError("missing or unknown version line")
    count = int(lines[1])
    entries = lines[2:]
    if count != len(entries):
        raise ValueError(f"header says {count} entries, file has {len(entries)}")
    offsets = {}
    for line in entries:
        topic, partition, offset = line.split(" ")
        offsets[TopicPartition(topic, int(partition))] = int(offset)
    return offsets
