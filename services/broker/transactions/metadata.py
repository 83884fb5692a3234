"""One transactional id's state at its coordinator, as a state machine without I/O (KIP-98).

`TxnMetadata` is what `__transaction_state` stores for an id. A `Transaction` holds the
stored metadata and at most one transition being written: each `prepare_*` call checks a
request against the current state by Kafka's rules, and either raises TxnError with the
code the client gets or returns the metadata to write and marks it pending; the caller
writes it to the log and calls `complete` (or `abandon` when the write failed). While a
transition is pending every other request is answered CONCURRENT_TRANSACTIONS, which
clients retry, so the stored state only ever moves along the table `_VALID_FROM`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import IntEnum

from directlog.protocol.errors import ErrorCode

NO_PRODUCER_EPOCH = -1
NO_START = -1  # start_ms when no transaction is open
EPOCH_EXHAUSTED_AT = 0x7FFF - 1  # Kafka's isEpochExhausted: an epoch this high is the last


class TxnState(IntEnum):
    """Kafka's TransactionState, by the ids `__transaction_state` stores."""

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use (KIP-664): "Ongoing"."""
        return "".join(word.capitalize() for word in self.name.split("_"))

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7


_DONE = frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})
# For each state, the states it may be entered from (Kafka's validPreviousStates).
_VALID_FROM: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: _DONE,
    TxnState.ONGOING: _DONE | {TxnState.ONGOING},
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: _DONE,
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
}


class TxnError(Exception):
    """A request the state refuses, with the Kafka error code that answers it."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """A transactional id's record in `__transaction_state` (TransactionLogValue)."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]]
    last_update_ms: int
    start_ms: int = NO_START

    @property
    def epoch_exhausted(self) -> bool:
        return self.producer_epoch >= EPOCH_EXHAUSTED_AT


@dataclass(frozen=True, slots=True)
class InitStep:
    """What InitProducerId writes. `fence`: the id had a transaction open, which this write
    aborts under a bumped epoch; the client is told CONCURRENT_TRANSACTIONS and retries
    once the abort is complete."""

    target: TxnMetadata
    fence: bool


class Transaction:
    """A transactional id this broker coordinates."""

    def __init__(self, transactional_id: str, current: TxnMetadata) -> None:
        self.transactional_id = transactional_id
        self.current = current
        self.pending: TxnMetadata | None = None
        # The epoch before the last bump, not stored (as in Kafka): a producer that retries
        # InitProducerId after losing the answer to a bump names it and gets the same epoch.
        self.last_epoch = NO_PRODUCER_EPOCH

    @classmethod
    def new(cls, transactional_id: str, producer_id: int, timeout_ms: int, now: int) -> Transaction:
        """A first InitProducerId's id: epoch -1 until the first bump to 0 is written."""
        return cls(
            transactional_id,
            TxnMetadata(
                producer_id, NO_PRODUCER_EPOCH, timeout_ms, TxnState.EMPTY, frozenset(), now
            ),
        )

    # Writing transitions ------------------------------------------------------------------

    def _begin(self, target: TxnMetadata) -> TxnMetadata:
        if self.pending is not None:
            raise TxnError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"{self.transactional_id}: a change to {self.pending.state.name} is being written",
            )
        assert self.current.state in _VALID_FROM[target.state], (
            f"{self.transactional_id}: {self.current.state.name} -> {target.state.name}"
        )
        self.pending = target
        return target

    def complete(self) -> TxnMetadata:
        """The pending transition is in the log (and in its ISR): it is the state now."""
        assert self.pending is not None
        if self.pending.producer_epoch != self.current.producer_epoch:
            self.last_epoch = self.current.producer_epoch
        self.current, self.pending = self.pending, None
        return self.current

    def abandon(self) -> None:
        """The pending transition could not be written: the state stays as it was."""
        self.pending = None

    # InitProducerId ------------------------------------------------------------------------

    def needs_new_producer_id(self, expected: tuple[int, int] | None) -> bool:
        """Whether prepare_init will need a fresh producer id: the epoch is used up."""
        current = self.current
        return (
            current.state in _DONE
            and current.epoch_exhausted
            and (expected is None or expected[1] == current.producer_epoch)
        )

    def prepare_init(
        self,
        timeout_ms: int,
        expected: tuple[int, int] | None,
        now: int,
        fresh_producer_id: int | None = None,
    ) -> InitStep:
        """InitProducerId: bump the epoch, fencing every older producer of this id.
        `expected`: the (producer id, epoch) a v3+ producer says it has (KIP-360);
        `fresh_producer_id` must be given when needs_new_producer_id."""
        current = self.current
        if self.pending is not None:
            self._begin(current)  # raises CONCURRENT_TRANSACTIONS
        if expected is not None and not self._knows(expected):
            raise TxnError(
                ErrorCode.PRODUCER_FENCED,
                f"{self.transactional_id}: producer id {expected[0]} is not this id's "
                f"{current.producer_id}",
            )
        state = current.state
        if state in _DONE:
            if self.needs_new_producer_id(expected):
                assert fresh_producer_id is not None, "the epoch is exhausted: a new id is needed"
                producer_id, epoch = fresh_producer_id, 0
            else:
                producer_id, epoch = current.producer_id, self._bumped(expected)
            target = TxnMetadata(
                producer_id, epoch, timeout_ms, TxnState.EMPTY, frozenset(), now, NO_START
            )
            return InitStep(self._begin(target), fence=False)
        if state is TxnState.ONGOING:
            return InitStep(self._begin(self._fenced(now)), fence=True)
        raise TxnError(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"{self.transactional_id}: its transaction is {state.name}; retry once it completes",
        )

    def _knows(self, expected: tuple[int, int]) -> bool:
        """Kafka's isValidProducerId: the id is new, or the producer names its current
        producer id (the epoch is checked by the bump)."""
        return self.current.producer_epoch == NO_PRODUCER_EPOCH or expected[0] == (
            self.current.producer_id
        )

    def _bumped(self, expected: tuple[int, int] | None) -> int:
        current = self.current.producer_epoch
        if expected is None or current == NO_PRODUCER_EPOCH or expected[1] == current:
            return current + 1
        if expected[1] == self.last_epoch:
            return current  # a retry of the bump whose answer was lost
        raise TxnError(
            ErrorCode.PRODUCER_FENCED,
            f"{self.transactional_id}: epoch {expected[1]} is not the current {current}",
        )

    def _fenced(self, now: int) -> TxnMetadata:
        """The open transaction aborted under the next epoch, which fences its producer."""
        current = self.current
        epoch = current.producer_epoch + (0 if current.epoch_exhausted else 1)
        return replace(
            current, producer_epoch=epoch, state=TxnState.PREPARE_ABORT, last_update_ms=now
        )

    # Transactions ---------------------------------------------------------------------------

    def _check_producer(self, producer_id: int, epoch: int) -> None:
        current = self.current
        if producer_id != current.producer_id:
            raise TxnError(
                ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                f"{self.transactional_id} has producer id {current.producer_id}, not {producer_id}",
            )
        if epoch != current.producer_epoch:
            raise TxnError(
                ErrorCode.PRODUCER_FENCED,
                f"{self.transactional_id}: epoch {epoch} is fenced by {current.producer_epoch}",
            )

    def prepare_add_partitions(
        self, producer_id: int, epoch: int, partitions: set[tuple[str, int]], now: int
    ) -> TxnMetadata | None:
        """AddPartitionsToTxn (and AddOffsetsToTxn, whose partition is the group's in
        `__consumer_offsets`): the transaction is open with these partitions in it. None:
        they are in it already, nothing to write."""
        self._check_producer(producer_id, epoch)
        if self.pending is not None:
            self._begin(self.current)  # raises CONCURRENT_TRANSACTIONS
        current = self.current
        if current.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            raise TxnError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"{self.transactional_id}: its last transaction is still completing",
            )
        if current.state not in _VALID_FROM[TxnState.ONGOING]:
            raise TxnError(
                ErrorCode.INVALID_TXN_STATE,
                f"{self.transactional_id}: no partitions can join in {current.state.name}",
            )
        if current.state is TxnState.ONGOING and partitions <= current.partitions:
            return None
        start = current.start_ms if current.state is TxnState.ONGOING else now
        target = replace(
            current,
            state=TxnState.ONGOING,
            partitions=current.partitions | partitions,
            last_update_ms=now,
            start_ms=start,
        )
        return self._begin(target)

    def prepare_end(
        self, producer_id: int, epoch: int, commit: bool, now: int
    ) -> TxnMetadata | None:
        """EndTxn: PrepareCommit or PrepareAbort, after which the markers go out. None: the
        transaction already ended so (a retry), nothing to write."""
        self._check_producer(producer_id, epoch)
        if self.pending is not None:
            self._begin(self.current)  # raises CONCURRENT_TRANSACTIONS
        state = self.current.state
        wanted = "commit" if commit else "abort"
        if state is TxnState.ONGOING:
            target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            return self._begin(replace(self.current, state=target, last_update_ms=now))
        done, preparing = (
            (TxnState.COMPLETE_COMMIT, TxnState.PREPARE_COMMIT)
            if commit
            else (TxnState.COMPLETE_ABORT, TxnState.PREPARE_ABORT)
        )
        if state is done:
            return None
        if state is preparing:
            raise TxnError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"{self.transactional_id}: the {wanted} is being completed",
            )
        raise TxnError(
            ErrorCode.INVALID_TXN_STATE,
            f"{self.transactional_id}: cannot {wanted} in {state.name}",
        )

    def prepare_complete(self, now: int) -> TxnMetadata:
        """Every marker is written: CompleteCommit or CompleteAbort, partitions cleared."""
        state = self.current.state
        assert state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT), state
        target = (
            TxnState.COMPLETE_COMMIT
            if state is TxnState.PREPARE_COMMIT
            else TxnState.COMPLETE_ABORT
        )
        return self._begin(
            replace(self.current, state=target, partitions=frozenset(), last_update_ms=now)
        )

    def prepare_expiry_abort(self, now: int) -> TxnMetadata | None:
        """A transaction open longer than its timeout is aborted under a bumped epoch, so
        its producer is fenced (KIP-360); None when this one is not due."""
        current = self.current
        if (
            self.pending is not None
            or current.state is not TxnState.ONGOING
            or current.start_ms + current.timeout_ms >= now
        ):
            return None
        return self._begin(self._fenced(now))

    def prepare_removal(self, now: int, expiration_ms: int) -> TxnMetadata | None:
        """transactional.id.expiration.ms: an id with no transaction in flight (Empty,
        CompleteCommit, CompleteAbort) not written for that long goes Dead, stored as its
        tombstone; None when this one is not due."""
        current = self.current
        if (
            self.pending is not None
            or current.state not in _DONE
            or current.last_update_ms > now - expiration_ms
        ):
            return None
        return self._begin(replace(current, state=TxnState.DEAD, last_update_ms=now))
