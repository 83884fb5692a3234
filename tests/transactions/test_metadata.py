"""The transaction state machine (services/broker/transactions/metadata.py) by Kafka's rules:
epoch bumps and fencing on InitProducerId, a transaction's way from Ongoing to
CompleteCommit/CompleteAbort, retries, and at most one transition written at a time."""

from __future__ import annotations

import pytest

from directlog.protocol.errors import ErrorCode
from services.broker.transactions.metadata import (
    EPOCH_EXHAUSTED_AT,
    NO_START,
    Transaction,
    TxnError,
    TxnMetadata,
    TxnState,
)

T0 = 1_700_000_000_000
PID = 4000


def initialised(epoch_bumps: int = 1) -> Transaction:
    """An id after `epoch_bumps` InitProducerIds, each written."""
    txn = Transaction.new("tx", PID, 60_000, T0)
    for _ in range(epoch_bumps):
        txn.prepare_init(60_000, None, T0)
        txn.complete()
    return txn


def ongoing(partitions: set[tuple[str, int]] | None = None, now: int = T0) -> Transaction:
    txn = initialised()
    target = txn.prepare_add_partitions(PID, 0, partitions or {("a", 0), ("b", 1)}, now)
    assert target is not None
    txn.complete()
    return txn


def refused(code: ErrorCode) -> pytest.RaisesExc[TxnError]:
    return pytest.raises(TxnError, check=lambda e: e.code is code)


def test_a_new_id_starts_at_epoch_0_and_each_init_bumps_it() -> None:
    txn = Transaction.new("tx", PID, 60_000, T0)
    assert txn.current.producer_epoch == -1
    step = txn.prepare_init(30_000, None, T0 + 5)
    assert not step.fence
    assert step.target == TxnMetadata(PID, 0, 30_000, TxnState.EMPTY, frozenset(), T0 + 5, NO_START)
    txn.complete()
    again = txn.prepare_init(30_000, None, T0 + 6).target
    assert (again.producer_id, again.producer_epoch) == (PID, 1)


def test_one_transition_at_a_time_and_an_abandoned_one_changes_nothing() -> None:
    txn = initialised()
    txn.prepare_init(60_000, None, T0)
    with refused(ErrorCode.CONCURRENT_TRANSACTIONS):
        txn.prepare_init(60_000, None, T0)
    with refused(ErrorCode.CONCURRENT_TRANSACTIONS):
        txn.prepare_add_partitions(PID, 0, {("a", 0)}, T0)
    txn.abandon()
    assert txn.current.producer_epoch == 0
    assert txn.prepare_init(60_000, None, T0).target.producer_epoch == 1


def test_an_exhausted_epoch_moves_to_a_new_producer_id() -> None:
    txn = Transaction(
        "tx",
        TxnMetadata(PID, EPOCH_EXHAUSTED_AT, 60_000, TxnState.COMPLETE_COMMIT, frozenset(), T0),
    )
    assert txn.needs_new_producer_id(None)
    assert not txn.needs_new_producer_id((PID, EPOCH_EXHAUSTED_AT - 1))
    target = txn.prepare_init(60_000, None, T0, fresh_producer_id=PID + 1).target
    assert (target.producer_id, target.producer_epoch) == (PID + 1, 0)


def test_kip_360_a_producer_naming_its_id_and_epoch() -> None:
    txn = initialised(epoch_bumps=2)  # epoch 1, the one before it 0
    # The current producer bumps its own epoch.
    assert txn.prepare_init(60_000, (PID, 1), T0).target.producer_epoch == 2
    txn.complete()
    # It lost that answer and retries naming epoch 1: it gets epoch 2 again, not 3.
    assert txn.prepare_init(60_000, (PID, 1), T0).target.producer_epoch == 2
    txn.abandon()
    # A zombie naming an older epoch, or another producer id, is fenced.
    with refused(ErrorCode.PRODUCER_FENCED):
        txn.prepare_init(60_000, (PID, 0), T0)
    with refused(ErrorCode.PRODUCER_FENCED):
        txn.prepare_init(60_000, (PID + 7, 2), T0)


def test_init_during_an_open_transaction_aborts_it_under_a_new_epoch() -> None:
    txn = ongoing()
    step = txn.prepare_init(60_000, None, T0 + 1)
    assert step.fence
    assert step.target.state is TxnState.PREPARE_ABORT
    assert step.target.producer_epoch == 1
    assert step.target.partitions == {("a", 0), ("b", 1)}
    txn.complete()
    # The old producer is fenced from its transaction.
    with refused(ErrorCode.PRODUCER_FENCED):
        txn.prepare_end(PID, 0, True, T0 + 2)
    with refused(ErrorCode.CONCURRENT_TRANSACTIONS):
        txn.prepare_init(60_000, None, T0 + 2)  # until the abort completes
    done = txn.prepare_complete(T0 + 3)
    assert (done.state, done.partitions) == (TxnState.COMPLETE_ABORT, frozenset())
    txn.complete()
    assert txn.prepare_init(60_000, None, T0 + 4).target.producer_epoch == 2


def test_partitions_join_and_the_start_time_is_the_first_add() -> None:
    txn = ongoing({("a", 0)}, now=T0 + 10)
    assert txn.current.start_ms == T0 + 10
    assert txn.prepare_add_partitions(PID, 0, {("a", 0)}, T0 + 20) is None  # nothing new
    target = txn.prepare_add_partitions(PID, 0, {("c", 2)}, T0 + 30)
    assert target is not None
    assert target.partitions == {("a", 0), ("c", 2)}
    assert (target.start_ms, target.last_update_ms) == (T0 + 10, T0 + 30)


def test_add_partitions_checks_the_producer() -> None:
    txn = initialised(epoch_bumps=2)
    with refused(ErrorCode.INVALID_PRODUCER_ID_MAPPING):
        txn.prepare_add_partitions(PID + 1, 1, {("a", 0)}, T0)
    with refused(ErrorCode.PRODUCER_FENCED):
        txn.prepare_add_partitions(PID, 0, {("a", 0)}, T0)


@pytest.mark.parametrize("commit", [True, False])
def test_end_prepares_then_completes_and_a_retry_is_answered_without_a_write(
    commit: bool,
) -> None:
    txn = ongoing()
    prepared = txn.prepare_end(PID, 0, commit, T0 + 1)
    assert prepared is not None
    assert prepared.state is (TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT)
    txn.complete()
    with refused(ErrorCode.CONCURRENT_TRANSACTIONS):
        txn.prepare_end(PID, 0, commit, T0 + 2)  # the markers are still going out
    with refused(ErrorCode.INVALID_TXN_STATE):
        txn.prepare_end(PID, 0, not commit, T0 + 2)
    with refused(ErrorCode.CONCURRENT_TRANSACTIONS):
        txn.prepare_add_partitions(PID, 0, {("z", 0)}, T0 + 2)
    completed = txn.prepare_complete(T0 + 3)
    assert completed.state is (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)
    txn.complete()
    assert txn.prepare_end(PID, 0, commit, T0 + 4) is None
    with refused(ErrorCode.INVALID_TXN_STATE):
        txn.prepare_end(PID, 0, not commit, T0 + 4)
    # The next transaction starts from the completed one.
    nxt = txn.prepare_add_partitions(PID, 0, {("a", 0)}, T0 + 5)
    assert nxt is not None and nxt.start_ms == T0 + 5


def test_states_have_kafkas_names() -> None:
    assert [s.kafka_name for s in TxnState] == [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    ]


def test_end_without_a_transaction_is_an_invalid_state() -> None:
    with refused(ErrorCode.INVALID_TXN_STATE):
        initialised().prepare_end(PID, 0, True, T0)


def test_an_expired_transaction_is_aborted_under_a_new_epoch() -> None:
    txn = ongoing(now=T0)
    assert txn.prepare_expiry_abort(T0 + 60_000) is None  # exactly at the timeout: not yet
    target = txn.prepare_expiry_abort(T0 + 60_001)
    assert target is not None
    assert (target.state, target.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    assert txn.prepare_expiry_abort(T0 + 70_000) is None  # already being aborted
