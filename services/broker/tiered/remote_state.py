"""What a follower needs from the remote store to restart its log where its leader's local
log starts (KIP-405's OFFSET_MOVED_TO_TIERED_STORAGE path).

The leader keeps the records below its local log start only in the remote store, so a
follower that needs them (a new or wiped replica) does not fetch them: it finds, among the
partition's finished remote copies (the controller's remote log metadata), the one holding
the offset just before the leader's local log start, and restarts empty right after that
copy's last record, with the leader epochs and the idempotent producers' state the copy's
`.leader-epoch-checkpoint` and `.snapshot` objects recorded there. It then fetches only
what follows, all of which the leader has locally.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.remote import layout
from directlog.remote.store import RemoteObjectMissingError, RemoteStore
from directlog.rpc import controller_pb2 as pb
from directlog.topics import TopicPartition
from services.broker.controller_link import ControllerLink
from services.broker.storage.leader_epochs import EpochEntry, parse_checkpoint


@dataclass(frozen=True, slots=True)
class RemoteStart:
    offset: int  # where the follower's log restarts
    epochs: list[EpochEntry]  # leader epochs of the records before it
    producer_snapshot: bytes | None  # the producers' state there (None: none recorded)


class RemoteLogState:
    def __init__(self, store: RemoteStore, link: ControllerLink) -> None:
        self.store = store
        self.link = link

    async def start_for(
        self, tp: TopicPartition, topic_id: uuid.UUID, leader_local_start: int
    ) -> RemoteStart:
        """Where to restart a follower whose leader's local log starts at
        `leader_local_start`. Raises KafkaError (retriable) when the metadata or the store
        cannot be reached, or the metadata is not yet known."""
        reply = await self.link.call(
            lambda stub: stub.ListRemoteLogSegments,
            pb.ListRemoteLogSegmentsRequest(
                partitions=[
                    pb.PartitionVersion(
                        topic_id=topic_id.bytes, partition=tp.partition, known_version=-1
                    )
                ]
            ),
        )
        if len(reply.partitions) != 1 or reply.partitions[0].error_code != ErrorCode.NONE:
            code = reply.partitions[0].error_code if reply.partitions else ErrorCode.NONE
            raise KafkaError(
                ErrorCode(code) if code else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"{tp}: no remote log metadata",
            )
        before = leader_local_start - 1
        holding = [
            s
            for s in reply.partitions[0].segments
            if s.state == pb.COPY_FINISHED and s.start_offset <= before <= s.end_offset
        ]
        if not holding:
            return RemoteStart(leader_local_start, [], None)  # nothing remote below it
        segment = holding[0]
        prefix = layout.partition_prefix(tp.topic, topic_id, tp.partition)
        segment_id = uuid.UUID(bytes=segment.segment_id)
        epochs_key = layout.segment_key(
            prefix, segment.base_offset, segment_id, layout.LEADER_EPOCHS
        )
        snapshot_key = layout.segment_key(
            prefix, segment.base_offset, segment_id, layout.PRODUCER_SNAPSHOT
        )
        epochs_data, snapshot = await asyncio.gather(
            asyncio.to_thread(self.store.read_all, epochs_key),
            asyncio.to_thread(self._optional, snapshot_key),
        )
        try:
            epochs = parse_checkpoint(epochs_data.decode("ascii"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise KafkaError(
                ErrorCode.KAFKA_STORAGE_ERROR, f"{tp}: remote {epochs_key} unreadable: {exc}"
            ) from exc
        end = segment.end_offset + 1
        return RemoteStart(end, [e for e in epochs if e.start_offset < end], snapshot)

    def _optional(self, key: str) -> bytes | None:
        try:
            return self.store.read_all(key)
        except RemoteObjectMissingError:
            return None
