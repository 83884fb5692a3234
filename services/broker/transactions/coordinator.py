"""The transaction coordinator of one broker: the transactional ids whose
`__transaction_state` partition this broker leads, driven by requests, each state change
durable in that partition before it is answered (docs/transactions.md).

The shape is the group coordinator's: every transition a request makes (metadata.py) is a
record appended to the id's partition of the compacted `__transaction_state` as its leader,
and the answer waits until the ISR has it. When this broker becomes a partition's leader it
reads the partition back (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and serves its ids from
then on; when it stops leading one, those ids are dropped and their requests are told
NOT_COORDINATOR, so clients look the coordinator up again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.records.batch import Record, build_batch, decode_records, iter_batches
from services.broker.error_codes import error_code_for
from services.broker.groups.offsets_topic import partition_for
from services.broker.partition import Partition
from services.broker.transactions.metadata import Transaction, TxnError, TxnMetadata, TxnState
from services.broker.transactions.state_topic import (
    TRANSACTION_STATE_TOPIC,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20  # bytes read at a time when loading a partition
MARKER_RETRY_SECONDS = (0.05, 1.0)  # first and longest wait between marker attempts
_PREPARED = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
# A marker answered so is not retried: the partition is gone, or a newer epoch of the
# producer is already there (only a newer coordinator could have written it).
_MARKER_FINAL = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_PRODUCER_EPOCH)

# How a failed append to __transaction_state is answered (Kafka's mapping in
# TransactionStateManager.appendTransactionToLog).
_STORE_ERRORS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.FENCED_LEADER_EPOCH: ErrorCode.NOT_COORDINATOR,
}


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class ProducerIds(Protocol):
    """What the coordinator needs of ProducerIdAllocator."""

    async def next_id(self) -> int: ...


class Markers(Protocol):
    """What the coordinator needs of MarkerWriter: one attempt at a marker in each
    partition, answered with a code per partition (NONE: in its ISR)."""

    async def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        partitions: set[tuple[str, int]],
    ) -> dict[tuple[str, int], ErrorCode]: ...


@dataclass(frozen=True, slots=True)
class TransactionSettings:
    """Kafka's transaction.* broker settings, with its defaults."""

    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    # transaction.abort.timed.out.transaction.cleanup.interval.ms
    abort_check_interval_ms: int = 10_000
    append_timeout_ms: int = 5000  # how long a state change waits for the ISR


@dataclass(slots=True)
class StatePartition:
    """A `__transaction_state` partition this broker leads, in one leader epoch."""

    partition: Partition
    leader_epoch: int
    loaded: bool = False
    ids: set[str] = field(default_factory=set)


class TransactionCoordinator:
    def __init__(
        self,
        settings: TransactionSettings,
        partition_count: Callable[[], int],
        producer_ids: ProducerIds,
        markers: Markers,
        clock: Callable[[], int] = wall_ms,
    ) -> None:
        self.settings = settings
        self._partition_count = partition_count
        self._producer_ids = producer_ids
        self._markers = markers
        self._clock = clock
        self.transactions: dict[str, Transaction] = {}
        self.owned: dict[int, StatePartition] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None

    # Leadership -----------------------------------------------------------------------------

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
        if partition.tp.topic != TRANSACTION_STATE_TOPIC:
            return
        index = partition.tp.partition
        owned = self.owned.get(index)
        if partition.is_leader:
            if owned is not None and owned.leader_epoch == partition.leader_epoch:
                return
            if owned is not None:
                self._unload(index)
            owned = self.owned[index] = StatePartition(partition, partition.leader_epoch)
            self._spawn(self._load(index, owned))
        elif owned is not None:
            self._unload(index)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load(self, index: int, owned: StatePartition) -> None:
        started = time.monotonic()
        try:
            records = await asyncio.to_thread(_read_partition, owned.partition)
        except Exception:
            log.exception("%s-%d: cannot load transactions", TRANSACTION_STATE_TOPIC, index)
            return
        if self.owned.get(index) is not owned:
            return  # leadership moved on while reading
        latest: dict[str, TxnMetadata | None] = {}
        for log_offset, key, value in records:
            try:
                latest[decode_key(key)] = None if value is None else decode_value(value)
            except Exception as error:  # one bad record must not hide the others
                log.warning(
                    "%s-%d at %d: skipping a record: %s",
                    TRANSACTION_STATE_TOPIC,
                    index,
                    log_offset,
                    error,
                )
        for transactional_id, metadata in latest.items():
            if metadata is not None:
                txn = self.transactions[transactional_id] = Transaction(transactional_id, metadata)
                owned.ids.add(transactional_id)
                if metadata.state in _PREPARED:  # decided, but maybe not every marker written
                    self._spawn(self._finish(txn))
        owned.loaded = True
        log.info(
            "%s-%d: coordinating %d transactional ids (loaded %d records in %.3f s)",
            TRANSACTION_STATE_TOPIC,
            index,
            len(owned.ids),
            len(records),
            time.monotonic() - started,
        )

    def _unload(self, index: int) -> None:
        owned = self.owned.pop(index)
        for transactional_id in owned.ids:
            self.transactions.pop(transactional_id, None)
        if owned.ids:
            log.info(
                "%s-%d: no longer coordinating %d transactional ids",
                TRANSACTION_STATE_TOPIC,
                index,
                len(owned.ids),
            )

    def partition_of(self, transactional_id: str) -> int:
        return partition_for(transactional_id, max(self._partition_count(), 1))

    def _owned(self, transactional_id: str) -> StatePartition:
        """The partition of an id this broker coordinates; raises with the code clients act
        on (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS)."""
        index = self.partition_of(transactional_id)
        owned = self.owned.get(index)
        if owned is None:
            raise KafkaError(
                ErrorCode.NOT_COORDINATOR,
                f"{TRANSACTION_STATE_TOPIC}-{index} is not led by this broker",
            )
        if not owned.loaded:
            raise KafkaError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"{TRANSACTION_STATE_TOPIC}-{index} is loading",
            )
        return owned

    # InitProducerId -------------------------------------------------------------------------

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None
    ) -> tuple[int, int]:
        """InitProducerId with a transactional id: (producer id, epoch), the epoch bumped
        past every earlier producer of the id. Raises KafkaError with the client's code."""
        if not transactional_id:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "the transactional id is empty")
        if not 0 < timeout_ms <= self.settings.max_timeout_ms:
            raise KafkaError(
                ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                f"transaction timeout {timeout_ms} ms is not in 1..{self.settings.max_timeout_ms}"
                " (transaction.max.timeout.ms)",
            )
        self._owned(transactional_id)
        txn = self.transactions.get(transactional_id)
        fresh: int | None = None
        if txn is None or txn.needs_new_producer_id(expected):
            fresh = await self._producer_ids.next_id()
            owned = self._owned(transactional_id)  # leadership may have moved meanwhile
            txn = self.transactions.get(transactional_id)
            if txn is None:
                txn = Transaction.new(transactional_id, fresh, timeout_ms, self._clock())
                self.transactions[transactional_id] = txn
                owned.ids.add(transactional_id)
        try:
            step = txn.prepare_init(timeout_ms, expected, self._clock(), fresh)
        except TxnError as error:
            raise KafkaError(error.code, str(error)) from None
        await self._write(txn, step.target)
        if step.fence:
            self._spawn(self._finish(txn))
            raise KafkaError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"{transactional_id}: its open transaction is being aborted",
            )
        return step.target.producer_id, step.target.producer_epoch

    # Describing (KIP-664) ---------------------------------------------------------------------

    def describe(self, transactional_id: str) -> TxnMetadata:
        """DescribeTransactions: the id's state; raises KafkaError (NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS, TRANSACTIONAL_ID_NOT_FOUND)."""
        self._owned(transactional_id)
        txn = self.transactions.get(transactional_id)
        if txn is None or txn.current.producer_epoch < 0:  # never written
            raise KafkaError(
                ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"no transactional id {transactional_id!r}"
            )
        return txn.current

    def listed(self) -> list[tuple[str, TxnMetadata]]:
        """Every id of the loaded partitions this broker leads, by id."""
        found = [
            (transactional_id, txn.current)
            for owned in self.owned.values()
            if owned.loaded
            for transactional_id in owned.ids
            if (txn := self.transactions.get(transactional_id)) is not None
            and txn.current.producer_epoch >= 0
        ]
        return sorted(found, key=lambda item: item[0])

    def loading(self) -> bool:
        return any(not owned.loaded for owned in self.owned.values())

    # Transactions -----------------------------------------------------------------------------

    def _transaction(self, transactional_id: str) -> Transaction:
        self._owned(transactional_id)
        txn = self.transactions.get(transactional_id)
        if txn is None:
            raise KafkaError(
                ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                f"no producer id for transactional id {transactional_id!r}: InitProducerId first",
            )
        return txn

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: set[tuple[str, int]],
    ) -> None:
        """AddPartitionsToTxn: the partitions are in the open transaction once this returns;
        raises KafkaError with the client's code."""
        txn = self._transaction(transactional_id)
        try:
            target = txn.prepare_add_partitions(
                producer_id, producer_epoch, partitions, self._clock()
            )
        except TxnError as error:
            raise KafkaError(error.code, str(error)) from None
        if target is not None:
            await self._write(txn, target)

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """EndTxn: answered once the decision (PrepareCommit/PrepareAbort) is durable, as
        Kafka does; the markers follow, and until they are all written the id's next
        requests are told CONCURRENT_TRANSACTIONS."""
        txn = self._transaction(transactional_id)
        try:
            target = txn.prepare_end(producer_id, producer_epoch, commit, self._clock())
        except TxnError as error:
            raise KafkaError(error.code, str(error)) from None
        if target is not None:
            await self._write(txn, target)
            self._spawn(self._finish(txn))

    async def _finish(self, txn: Transaction) -> None:
        """Write the decided transaction's markers to all its partitions, retrying until
        each is written (or final), then store it complete. Stops when this broker stops
        coordinating the id: the next coordinator loads it prepared and finishes it."""
        decided = txn.current
        assert decided.state in _PREPARED, decided.state
        commit = decided.state is TxnState.PREPARE_COMMIT
        remaining = set(decided.partitions)
        delay, longest = MARKER_RETRY_SECONDS
        while True:
            owned = self.owned.get(self.partition_of(txn.transactional_id))
            if owned is None or self.transactions.get(txn.transactional_id) is not txn:
                return
            if remaining:
                results = await self._markers.write_markers(
                    decided.producer_id,
                    decided.producer_epoch,
                    commit,
                    owned.leader_epoch,
                    remaining,
                )
                for tp, code in results.items():
                    if code is ErrorCode.NONE or code in _MARKER_FINAL:
                        if code is not ErrorCode.NONE:
                            log.warning(
                                "%s: no marker in %s-%d: %s",
                                txn.transactional_id,
                                *tp,
                                code.name,
                            )
                        remaining.discard(tp)
            if not remaining:
                try:
                    await self._write(txn, txn.prepare_complete(self._clock()))
                    return
                except KafkaError as error:
                    log.info("%s: not stored complete: %s", txn.transactional_id, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)

    # Timeouts -------------------------------------------------------------------------------

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.abort_check_interval_ms / 1000)
            try:
                self.abort_expired()
            except Exception:
                log.exception("transaction timeout check failed")

    def abort_expired(self) -> None:
        """Abort, under a bumped epoch, every loaded transaction open longer than its
        timeout (its producer is fenced and must start again)."""
        now = self._clock()
        for owned in list(self.owned.values()):
            if not owned.loaded:
                continue
            for transactional_id in list(owned.ids):
                txn = self.transactions.get(transactional_id)
                target = txn.prepare_expiry_abort(now) if txn is not None else None
                if txn is not None and target is not None:
                    log.info(
                        "%s: transaction open for %d ms, longer than its timeout: aborting",
                        transactional_id,
                        now - target.start_ms,
                    )
                    self._spawn(self._abort_expired(txn, target))

    async def _abort_expired(self, txn: Transaction, target: TxnMetadata) -> None:
        try:
            await self._write(txn, target)
        except KafkaError as error:
            log.info("%s: expiry abort not stored: %s", txn.transactional_id, error)
            return
        await self._finish(txn)

    async def _write(self, txn: Transaction, target: TxnMetadata) -> None:
        """Store the pending transition and make it current, or abandon it and raise. The
        store runs on even if the request is cancelled, so no transition stays pending."""
        task = asyncio.get_running_loop().create_task(self._store(txn, target))
        code = await asyncio.shield(task)
        if code is not ErrorCode.NONE:
            raise KafkaError(code, f"{txn.transactional_id}: state not stored ({code.name})")

    async def _store(self, txn: Transaction, target: TxnMetadata) -> ErrorCode:
        code = await self._append(txn.transactional_id, target)
        if self.transactions.get(txn.transactional_id) is not txn:
            return ErrorCode.NOT_COORDINATOR  # unloaded while writing: the state is gone
        if code is ErrorCode.NONE:
            txn.complete()
        else:
            txn.abandon()
        return code

    async def _append(self, transactional_id: str, metadata: TxnMetadata) -> ErrorCode:
        """Append an id's record to its partition as leader and wait for the ISR."""
        owned = self.owned.get(self.partition_of(transactional_id))
        if owned is None:
            return ErrorCode.NOT_COORDINATOR
        record = Record(0, self._clock(), encode_key(transactional_id), encode_value(metadata))
        partition = owned.partition
        try:
            appended = partition.append_as_leader(build_batch([record]), -1)
            await partition.wait_replicated(
                appended.last_offset, self.settings.append_timeout_ms / 1000
            )
        except Exception as error:
            code = error_code_for(error)
            if code is ErrorCode.UNKNOWN_SERVER_ERROR:
                log.exception("%s: append to %s failed", transactional_id, partition.tp)
            return _STORE_ERRORS.get(code, ErrorCode.UNKNOWN_SERVER_ERROR)
        return ErrorCode.NONE


def _read_partition(partition: Partition) -> list[tuple[int, bytes, bytes | None]]:
    """Every keyed record of the partition, in order: (offset, key, value)."""
    log_ = partition.log
    offset = log_.log_start_offset
    end = log_.log_end_offset
    out: list[tuple[int, bytes, bytes | None]] = []
    while offset < end:
        read = log_.read(offset, READ_CHUNK, upper_offset=end)
        data = read.records.read()
        if not data:
            break
        for position, header in iter_batches(data):
            if header.is_control:
                continue
            for record in decode_records(data, position, header):
                if record.key is not None:
                    out.append((record.offset, record.key, record.value))
        offset = max(read.next_offset, offset + 1)
    return out
