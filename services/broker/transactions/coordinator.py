"""The transaction coordinator of one broker: the transactional ids whose
`__transaction_state` partition this broker leads, driven by requests, each state change
durable in that partition before it is answered (docs/transactions.md).

The shape is the group coordinator's (services/broker/internal_topic_coordinator.py): every
transition a request makes (metadata.py) is a record appended to the id's partition of the
compacted `__transaction_state` as its leader, answered once the ISR has it; a new leader of
a partition reads it back and finishes the transactions it finds decided.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.records.batch import Record, build_batch
from services.broker.internal_topic_coordinator import (
    TOO_LARGE,
    InternalTopicCoordinator,
    Keyed,
    LedPartition,
    append_replicated,
    read_partition,
    wall_ms,
)
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

MARKER_RETRY_SECONDS = (0.05, 1.0)  # first and longest wait between marker attempts
_PREPARED = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
# A marker answered so is not retried: the partition is gone, or a newer epoch of the
# producer or of the coordinator is already there (this coordinator was replaced).
_MARKER_FINAL = (
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_PRODUCER_EPOCH,
    ErrorCode.TRANSACTION_COORDINATOR_FENCED,
)


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
    id_expiration_ms: int = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms
    # transaction.remove.expired.transaction.cleanup.interval.ms
    id_removal_interval_ms: int = 3_600_000


class TransactionCoordinator(InternalTopicCoordinator[list[Keyed]]):
    topic = TRANSACTION_STATE_TOPIC
    noun = "transactional ids"

    def __init__(
        self,
        settings: TransactionSettings,
        partition_count: Callable[[], int],
        producer_ids: ProducerIds,
        markers: Markers,
        clock: Callable[[], int] = wall_ms,
    ) -> None:
        super().__init__(partition_count, clock)
        self.settings = settings
        self._producer_ids = producer_ids
        self._markers = markers
        self.transactions: dict[str, Transaction] = {}
        self._next_removal = 0

    # Loading and unloading ----------------------------------------------------------------

    def _read(self, partition: Partition) -> list[Keyed]:
        """Every keyed record of the partition, in order."""
        return [
            (record.offset, record.key, record.value)
            for header, record in read_partition(partition)
            if not header.is_control and record.key is not None
        ]

    def _apply(self, index: int, owned: LedPartition, read: list[Keyed]) -> int:
        latest: dict[str, TxnMetadata | None] = {}
        for log_offset, key, value in read:
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
        return len(read)

    def _dropped(self, index: int, owned: LedPartition) -> None:
        for transactional_id in owned.ids:
            self.transactions.pop(transactional_id, None)

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

    def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: set[tuple[str, int]],
    ) -> dict[tuple[str, int], ErrorCode]:
        """AddPartitionsToTxn v4 with verify_only (KIP-890): whether each partition is in
        the producer's open transaction — NONE, or INVALID_TXN_STATE — as Kafka 3.7 checks
        it: every partition gets the error of a wrong id or epoch, of a decided transaction
        whose markers are going out, or of a coordinator that does not own the id."""
        try:
            txn = self._transaction(transactional_id)
        except KafkaError as error:
            return dict.fromkeys(partitions, error.code)
        current = txn.current
        if current.producer_id != producer_id:
            code = ErrorCode.INVALID_PRODUCER_ID_MAPPING
        elif current.producer_epoch != producer_epoch:
            code = ErrorCode.PRODUCER_FENCED
        elif current.state in _PREPARED:
            code = ErrorCode.CONCURRENT_TRANSACTIONS
        else:
            return {
                tp: ErrorCode.NONE if tp in current.partitions else ErrorCode.INVALID_TXN_STATE
                for tp in partitions
            }
        return dict.fromkeys(partitions, code)

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

    def _tick_seconds(self) -> float:
        return self.settings.abort_check_interval_ms / 1000

    def tick(self) -> None:
        self.abort_expired()
        now = self._clock()
        if now >= self._next_removal:
            self._next_removal = now + self.settings.id_removal_interval_ms
            self.remove_expired_ids()

    def abort_expired(self) -> None:
        """Abort, under a bumped epoch, every loaded transaction open longer than its
        timeout (its producer is fenced and must start again)."""
        now = self._clock()
        for txn in self._loaded():
            target = txn.prepare_expiry_abort(now)
            if target is not None:
                log.info(
                    "%s: transaction open for %d ms, longer than its timeout: aborting",
                    txn.transactional_id,
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

    def remove_expired_ids(self) -> None:
        """Remove every loaded id idle longer than transactional.id.expiration.ms: a
        tombstone in its partition, then the id is forgotten (its next InitProducerId
        starts afresh with a new producer id)."""
        now = self._clock()
        for txn in self._loaded():
            target = txn.prepare_removal(now, self.settings.id_expiration_ms)
            if target is not None:
                self._spawn(self._remove(txn, target))

    def _loaded(self) -> list[Transaction]:
        """The ids of every loaded partition this broker leads."""
        return [
            txn
            for owned in self.owned.values()
            if owned.loaded
            for transactional_id in owned.ids
            if (txn := self.transactions.get(transactional_id)) is not None
        ]

    async def _remove(self, txn: Transaction, target: TxnMetadata) -> None:
        transactional_id = txn.transactional_id
        try:
            await self._write(txn, target)
        except KafkaError as error:
            log.info("%s: expired id not removed: %s", transactional_id, error)
            return
        if self.transactions.get(transactional_id) is txn:
            del self.transactions[transactional_id]
            owned = self.owned.get(self.partition_of(transactional_id))
            if owned is not None:
                owned.ids.discard(transactional_id)
        log.info("%s: transactional id expired and removed", transactional_id)

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
        # Dead is stored as the id's tombstone, which compaction removes in time.
        value = None if metadata.state is TxnState.DEAD else encode_value(metadata)
        record = Record(0, self._clock(), encode_key(transactional_id), value)
        batch = build_batch([record])
        partition = owned.partition
        code, _ = await append_replicated(
            partition,
            lambda: partition.append_as_leader(batch, -1),
            self.settings.append_timeout_ms,
            transactional_id,
        )
        # Kafka answers a too-large state record as UNKNOWN_SERVER_ERROR.
        return ErrorCode.UNKNOWN_SERVER_ERROR if code in TOO_LARGE else code
