"""The aborted-transaction filter decides batch by batch, as Kafka's read_committed consumers
do: a producer's transactional batches from its aborted transaction's first offset up to its
ABORT marker go; its later transactions, other producers' batches and plain ones stay;
markers always go."""

from __future__ import annotations

from directlog.records.batch import Record, build_batch, iter_batches
from directlog.records.markers import AbortedFilter, build_marker


def batch(offset: int, producer_id: int, transactional: bool = True) -> bytes:
    return build_batch(
        [Record(offset, 1_700_000_000_000, b"k", b"%d" % offset)],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=offset,
        transactional=transactional,
    )


def marker(offset: int, producer_id: int, commit: bool) -> bytes:
    return build_marker(producer_id, 0, commit, 0, offset, 0, 1_700_000_000_000)


def test_batches_of_aborted_transactions_and_markers_are_dropped() -> None:
    log = b"".join(
        [
            batch(0, 1),  # producer 1's first transaction: aborted
            batch(1, 2),  # producer 2's: committed
            batch(2, 3, transactional=False),  # idempotent, no transaction
            batch(3, 1),
            marker(4, 1, commit=False),
            marker(5, 2, commit=True),
            batch(6, 1),  # producer 1 again, committed this time
            batch(7, 2),  # producer 2's next: aborted, marker past this read
        ]
    )
    drop = AbortedFilter([(2, 7), (1, 0)])  # as a Fetch lists them, any order
    kept = [h.base_offset for at, h in iter_batches(log) if not drop.drops(log, at, h)]
    assert kept == [1, 2, 6]


def test_without_aborted_transactions_only_markers_go() -> None:
    log = batch(0, 1) + marker(1, 1, commit=False) + batch(2, 1)
    drop = AbortedFilter([])
    assert [h.base_offset for at, h in iter_batches(log) if not drop.drops(log, at, h)] == [0, 2]
