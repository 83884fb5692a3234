"""Where a partition's remote data lives in the store (docs/tiering.md "The remote store").

    <topic>-<topic id>/<partition>/segments/<base offset>-<segment id>.log      and beside it
        .index .timeindex .snapshot .leader-epoch-checkpoint .remoteLogIndex .txnindex
    <topic>-<topic id>/<partition>/indexes/<first offset>.remoteLogIndex     rotated index
        files, with their .remoteOffsetIndex and .remoteTimeIndex

Offsets are 20 digits, ids Kafka's 22-character URL-safe base64 form. Each copy attempt has
a segment id of its own, so a copy that is redone never writes over a half-written one, and
the topic id in the prefix keeps a topic deleted and created again apart from the old one.
"""

from __future__ import annotations

import uuid

from directlog.topics import uuid_text

LOG = ".log"
OFFSET_INDEX = ".index"
TIME_INDEX = ".timeindex"
PRODUCER_SNAPSHOT = ".snapshot"
LEADER_EPOCHS = ".leader-epoch-checkpoint"
REMOTE_LOG_INDEX = ".remoteLogIndex"
REMOTE_OFFSET_INDEX = ".remoteOffsetIndex"
REMOTE_TIME_INDEX = ".remoteTimeIndex"
TXN_INDEX = ".txnindex"  # the copy's aborted transactions (txn_index.py)
SEGMENT_SUFFIXES = (LOG, OFFSET_INDEX, TIME_INDEX, PRODUCER_SNAPSHOT, LEADER_EPOCHS)
INDEX_SUFFIXES = (REMOTE_LOG_INDEX, REMOTE_OFFSET_INDEX, REMOTE_TIME_INDEX)


def is_index_file(name: str) -> bool:
    """Whether `name` is one of the remote index files (the tiering service's, in the
    broker's partition directory)."""
    return name.endswith(INDEX_SUFFIXES)


def topic_prefix(topic: str, topic_id: uuid.UUID) -> str:
    return f"{topic}-{uuid_text(topic_id)}"


def partition_prefix(topic: str, topic_id: uuid.UUID, partition: int) -> str:
    return f"{topic_prefix(topic, topic_id)}/{partition}"


def segment_key(prefix: str, base_offset: int, segment_id: uuid.UUID, suffix: str) -> str:
    """An object of one copied segment, under a partition's prefix."""
    return f"{prefix}/segments/{base_offset:020d}-{uuid_text(segment_id)}{suffix}"


def index_key(prefix: str, base_offset: int, suffix: str) -> str:
    """A rotated remote index file, under a partition's prefix."""
    return f"{prefix}/indexes/{base_offset:020d}{suffix}"


def sibling_key(log_key: str, suffix: str) -> str:
    """The object of one copy with `suffix`, from the key of its `.log` object (what a
    remoteLogIndex entry's RDI names)."""
    if not log_key.endswith(LOG):
        raise ValueError(f"{log_key!r} is not a copied segment's .log object")
    return log_key[: -len(LOG)] + suffix
