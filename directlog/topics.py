"""Topic names and topic-partition identifiers, as Kafka defines them."""

from __future__ import annotations

import base64
import re
import uuid
from typing import NamedTuple

MAX_TOPIC_NAME = 249
NO_LEADER = -1  # a partition's leader when none is alive (Kafka's metadata says -1)
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def topic_name_error(name: str) -> str | None:
    """Why `name` is not a legal Kafka topic name, or None if it is."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name cannot be {name!r}"
    if len(name) > MAX_TOPIC_NAME:
        return f"topic name is {len(name)} characters, the limit is {MAX_TOPIC_NAME}"
    if not _LEGAL.fullmatch(name):
        return f"topic name {name!r} has characters outside [a-zA-Z0-9._-]"
    return None


def uuid_text(value: uuid.UUID) -> str:
    """Kafka's Uuid.toString (topic ids, cluster ids, remote segment ids): the 16 bytes in
    URL-safe base64 without padding, 22 characters."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode("ascii")
