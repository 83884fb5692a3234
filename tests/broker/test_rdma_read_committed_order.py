"""How a read_committed RdmaConsumer decides transactions from the markers it reads
(directlog/client/rdma_consume.py), on generated logs: transactions of several producers
interleaved with each other and with plain records, read in chunks cut anywhere. What it
returns is always a prefix of the committed and plain records in offset order, and all of
them once the log is read; never an aborted record or a marker; and a consumer started at
its ``position`` at any moment returns exactly the rest (how directlog.client.Consumer
goes on after a lost leader)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from directlog.client.rdma_consume import RdmaConsumer
from directlog.records.batch import Record, build_batch
from directlog.records.markers import build_marker

pytestmark = pytest.mark.timeout(120)

PRODUCERS = (11, 12, 13)
# One step of a log: a plain batch, a producer's transactional batch (opening its
# transaction if none is open), or its marker (when one is open): commit or abort.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("plain"), st.just(0), st.integers(1, 3)),
        st.tuples(st.just("txn"), st.sampled_from(PRODUCERS), st.integers(1, 3)),
        st.tuples(st.sampled_from(["commit", "abort"]), st.sampled_from(PRODUCERS), st.just(0)),
    ),
    max_size=40,
)


def make_log(
    plan: list[tuple[str, int, int]], finish: list[bool]
) -> tuple[list[tuple[int, int, bytes]], list[tuple[int, bytes]]]:
    """The batches of ``plan`` as (base offset, next offset, bytes), every transaction left
    open ended at the end (``finish``: commit or not, in producer order), and the
    (offset, value) of the records a read_committed consumer must return."""
    batches: list[tuple[int, int, bytes]] = []
    open_txns: dict[int, list[tuple[int, bytes]]] = {}
    committed: list[tuple[int, bytes]] = []
    offset = 0

    def end(producer: int, commit: bool) -> None:
        nonlocal offset
        records = open_txns.pop(producer)
        if commit:
            committed.extend(records)
        marker = build_marker(producer, 0, commit, 0, offset, 0, 1000)
        batches.append((offset, offset + 1, marker))
        offset += 1

    for kind, producer, count in plan:
        if kind in ("commit", "abort"):
            if producer in open_txns:
                end(producer, kind == "commit")
            continue
        values = [b"%s-%d-%d" % (kind.encode(), producer, offset + i) for i in range(count)]
        records = [Record(offset + i, 1000, None, v) for i, v in enumerate(values)]
        pairs = [(r.offset, v) for r, v in zip(records, values, strict=True)]
        if kind == "txn":
            open_txns.setdefault(producer, []).extend(pairs)
            data = build_batch(records, producer_id=producer, producer_epoch=0, transactional=True)
        else:
            committed.extend(pairs)
            data = build_batch(records)
        batches.append((offset, offset + count, data))
        offset += count
    for producer, commit in zip(PRODUCERS, finish, strict=True):
        if producer in open_txns:
            end(producer, commit)
    return batches, sorted(committed)


class Feed:
    """A read_committed consumer (never started) fed bytes as its READs would land."""

    def __init__(self, offset: int, size: int) -> None:
        self.consumer = RdmaConsumer(
            "127.0.0.1:1", "t", 0, offset, isolation_level="read_committed"
        )
        self.buffer = bytearray(size)
        # What start() would set up: a buffer the READs land in, the segment's length.
        self.consumer._buffer = SimpleNamespace(buf=memoryview(self.buffer))  # type: ignore[assignment]
        self.consumer._length = size

    def read(self, data: bytes) -> list[tuple[int, bytes | None]]:
        """Append ``data`` after the unread bytes, take the whole batches, and return what
        a poll would."""
        consumer = self.consumer
        filled = consumer._filled
        self.buffer[filled : filled + len(data)] = data
        consumer._filled = filled + len(data)
        consumer._take_batches()
        return [(r.offset, r.value) for r in consumer._take_ready()]


@given(
    steps,
    st.lists(st.booleans(), min_size=3, max_size=3),
    st.lists(st.integers(1, 400), max_size=60),
    st.data(),
)
def test_committed_records_in_order_from_any_position(
    plan: list[tuple[str, int, int]],
    finish: list[bool],
    cuts: list[int],
    data: st.DataObject,
) -> None:
    batches, committed = make_log(plan, finish)
    log = b"".join(stored for _, _, stored in batches)
    feed = Feed(0, len(log) + 1)
    returned: list[tuple[int, bytes | None]] = []
    at = 0
    restart_after = data.draw(st.integers(0, len(cuts)))
    restart: int | None = None
    for step, size in enumerate([*cuts, len(log)]):
        returned += feed.read(log[at : at + size])
        at = min(at + size, len(log))
        position = feed.consumer.position
        # Everything before the position was returned (or dropped), nothing after it.
        assert returned == [pair for pair in committed if pair[0] < position]
        if step == restart_after:
            restart = position
    assert returned == committed
    assert feed.consumer._held == [] and feed.consumer._undecided == set()

    # A consumer started at the position the first one had then returns exactly the rest.
    assert restart is not None
    rest = b"".join(stored for _, next_offset, stored in batches if next_offset > restart)
    again = Feed(restart, len(rest) + 1)
    assert again.read(rest) == [pair for pair in committed if pair[0] >= restart]
