"""What the group and the transaction coordinator share: serving the ids (group ids,
transactional ids) kept in the partitions of a compacted internal topic (`__consumer_offsets`,
`__transaction_state`) that this broker leads.

Kafka's design for both: every state change is a record appended to the id's partition as
its leader, answered once the ISR has it. When this broker becomes a partition's leader it
reads the partition back (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and serves its ids from
then on; when it stops leading one, those ids are dropped and their requests are told
NOT_COORDINATOR, so clients look the coordinator up again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.records.batch import BatchHeader, Record, decode_records, iter_batches
from services.broker.error_codes import error_code_for
from services.broker.groups.offsets_topic import partition_for
from services.broker.partition import Partition
from services.broker.storage.log import AppendResult

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20  # bytes read at a time when loading a partition

# How a failed append to a coordinator's partition is answered (Kafka's mapping in
# GroupMetadataManager and TransactionStateManager).
STORE_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.FENCED_LEADER_EPOCH: ErrorCode.NOT_COORDINATOR,
}
TOO_LARGE = (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE)
Keyed = tuple[int, bytes, bytes | None]  # a record of the partition: offset, key, value


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class LedPartition:
    """A partition of the internal topic this broker leads, in one leader epoch."""

    partition: Partition
    leader_epoch: int
    loaded: bool = False
    ids: set[str] = field(default_factory=set)  # the ids served from it


def read_partition(partition: Partition) -> Iterator[tuple[BatchHeader, Record]]:
    """Every record of the partition up to its end when the read starts, control records
    included, with its batch's header, in order."""
    log_ = partition.log
    offset = log_.log_start_offset
    end = log_.log_end_offset
    while offset < end:
        read = log_.read(offset, READ_CHUNK, upper_offset=end)
        data = read.records.read()
        if not data:
            break
        for position, header in iter_batches(data):
            for record in decode_records(data, position, header):
                yield header, record
        offset = max(read.next_offset, offset + 1)


async def append_replicated(
    partition: Partition, append: Callable[[], AppendResult], timeout_ms: int, what: str
) -> tuple[ErrorCode, int]:
    """Run `append` on the leader's partition and wait until the ISR has it: (NONE, first
    offset), or the code a client gets (STORE_ERRORS; a too-large batch keeps its own)."""
    try:
        appended = append()
        await partition.wait_replicated(appended.last_offset, timeout_ms / 1000)
    except Exception as error:
        code = error_code_for(error)
        if code is ErrorCode.UNKNOWN_SERVER_ERROR:
            log.exception("%s: append to %s failed", what, partition.tp)
        return STORE_ERRORS.get(
            code, code if code in TOO_LARGE else ErrorCode.UNKNOWN_SERVER_ERROR
        ), -1
    return ErrorCode.NONE, appended.first_offset


Loaded = TypeVar("Loaded")


class InternalTopicCoordinator(ABC, Generic[Loaded]):
    """Tracks which partitions of `topic` this broker leads, loads each when it starts
    leading it and drops its ids when it stops; subclasses say how a partition is read
    (`_read`, in a thread), how what was read becomes state (`_apply`), what else goes on
    unload (`_dropped`) and what runs every `_tick_seconds` (`tick`)."""

    topic: ClassVar[str]
    noun: ClassVar[str]  # what an id names, for the log: "groups", "transactional ids"

    def __init__(self, partition_count: Callable[[], int], clock: Callable[[], int]) -> None:
        self._partition_count = partition_count
        self._clock = clock
        self.owned: dict[int, LedPartition] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None

    # Lifecycle and leadership -------------------------------------------------------------

    def start(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        for task in list(self._tasks):
            task.cancel()
        for index in list(self.owned):
            self._unload(index)

    def leadership_changed(self, partition: Partition) -> None:
        """ReplicaManager's hook: a hosted partition became leader, follower, or went away."""
        if partition.tp.topic != self.topic:
            return
        index = partition.tp.partition
        owned = self.owned.get(index)
        if partition.is_leader:
            if owned is not None and owned.leader_epoch == partition.leader_epoch:
                return
            if owned is not None:
                self._unload(index)
            owned = self.owned[index] = LedPartition(partition, partition.leader_epoch)
            self._spawn(self._load(index, owned))
        elif owned is not None:
            self._unload(index)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load(self, index: int, owned: LedPartition) -> None:
        started = time.monotonic()
        try:
            read = await asyncio.to_thread(self._read, owned.partition)
        except Exception:
            log.exception("%s-%d: cannot load %s", self.topic, index, self.noun)
            return
        if self.owned.get(index) is not owned:
            return  # leadership moved on while reading
        records = self._apply(index, owned, read)
        owned.loaded = True
        log.info(
            "%s-%d: coordinating %d %s (loaded %d records in %.3f s)",
            self.topic,
            index,
            len(owned.ids),
            self.noun,
            records,
            time.monotonic() - started,
        )

    @abstractmethod
    def _read(self, partition: Partition) -> Loaded:
        """What loading needs of the partition's log (runs in a thread)."""

    @abstractmethod
    def _apply(self, index: int, owned: LedPartition, read: Loaded) -> int:
        """Make what `_read` found the partition's state; the number of records used."""

    def _unload(self, index: int) -> None:
        owned = self.owned.pop(index)
        self._dropped(index, owned)
        if owned.ids:
            log.info(
                "%s-%d: no longer coordinating %d %s", self.topic, index, len(owned.ids), self.noun
            )

    @abstractmethod
    def _dropped(self, index: int, owned: LedPartition) -> None:
        """Forget the state of a partition this broker no longer leads."""

    # Finding an id ------------------------------------------------------------------------

    def partition_of(self, id_: str) -> int:
        return partition_for(id_, max(self._partition_count(), 1))

    def _owned(self, id_: str) -> LedPartition:
        """The partition of an id this broker coordinates; raises with the code clients act
        on (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS)."""
        index = self.partition_of(id_)
        owned = self.owned.get(index)
        if owned is None:
            raise KafkaError(
                ErrorCode.NOT_COORDINATOR, f"{self.topic}-{index} is not led by this broker"
            )
        if not owned.loaded:
            raise KafkaError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, f"{self.topic}-{index} is loading"
            )
        return owned

    def _is_loaded(self, id_: str) -> bool:
        owned = self.owned.get(self.partition_of(id_))
        return owned is not None and owned.loaded

    def loading(self) -> bool:
        return any(not owned.loaded for owned in self.owned.values())

    # Time ---------------------------------------------------------------------------------

    @abstractmethod
    def _tick_seconds(self) -> float: ...

    @abstractmethod
    def tick(self) -> None:
        """The periodic work: deadlines, expiry."""

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self._tick_seconds())
            try:
                self.tick()
            except Exception:
                log.exception("%s coordinator tick failed", self.topic)
