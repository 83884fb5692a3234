"""Producer id blocks (AllocateProducerIds) without a store: consecutive and disjoint blocks,
the counter carried through the store layout to the next controller, and the brokers and
states that are refused."""

from __future__ import annotations

import pytest

from directlog.protocol.errors import ErrorCode, KafkaError
from services.controller import layout
from services.controller.cluster import (
    PRODUCER_ID_BLOCK_SIZE,
    Change,
    ClusterState,
    Image,
    ProducerIdBlock,
)
from services.controller.layout import SetData
from tests.controller.clusters import (
    LISTENERS,
    PATHS,
    TIMEOUT,
    commit,
    empty_state,
    fence,
    register,
    with_topic,
)

pytestmark = pytest.mark.timeout(30)


def allocate(state: ClusterState, broker_id: int, epoch: int) -> ProducerIdBlock:
    block, change = state.allocate_producer_ids(broker_id, epoch)
    commit(state, change)
    return block


class FakeStore:
    """The counter znode as Store.prepare creates it, changed by committed setData ops."""

    def __init__(self) -> None:
        self.data = {PATHS.producer_ids: layout.encode_next_producer_id(0)}

    def commit(self, change: Change) -> None:
        for op in change.ops:
            assert isinstance(op, SetData) and op.path in self.data, op
            self.data[op.path] = op.data

    def load(self, state: ClusterState) -> ClusterState:
        """A new controller's state: ``state``'s brokers and topics, and the counter read
        from the store as Store.load reads it."""
        image = Image(
            state.cluster_id,
            state.brokers,
            state.topics,
            state.last_broker_epoch,
            layout.decode_next_producer_id(self.data[PATHS.producer_ids]),
        )
        return ClusterState(image, PATHS, now=0.0, session_timeout=TIMEOUT)


def test_blocks_are_consecutive_and_disjoint_from_zero() -> None:
    state = empty_state()
    epochs = {b: register(state, b) for b in (1, 2)}
    blocks = [allocate(state, b, epochs[b]) for b in (1, 2, 1, 1, 2)]
    assert [(b.first, b.count) for b in blocks] == [
        (i * PRODUCER_ID_BLOCK_SIZE, PRODUCER_ID_BLOCK_SIZE) for i in range(5)
    ]
    assert PRODUCER_ID_BLOCK_SIZE == 1000  # Kafka's


def test_a_block_is_one_fenced_counter_write_and_no_metadata_update() -> None:
    state = empty_state()
    epoch = register(state, 1)
    block, change = state.allocate_producer_ids(1, epoch)
    assert block == ProducerIdBlock(0, 1000)
    assert change.ops == (SetData("/directlog/producer_ids", b'{"next":1000}'),)
    assert not change.touches_image  # brokers' images do not change
    # Until it commits nothing moves: planned again, the same block (a failed commit
    # leaves no trace, and the block was never handed out).
    assert state.allocate_producer_ids(1, epoch)[0] == block
    commit(state, change)
    assert state.next_producer_id == 1000
    assert state.allocate_producer_ids(1, epoch)[0] == ProducerIdBlock(1000, 1000)


def test_every_change_of_the_image_still_touches_it() -> None:
    state, _ = with_topic([(1, 2), (2, 1)], brokers=2)
    changes = [
        state.register_broker(3, "incarnation-3", LISTENERS, None, 0.0),
        state.create_topic("new", 1, 1, {}),
        state.alter_configs("t", {"retention.ms": "1000"}, ()),
        state.create_partitions("t", 3),
        state.delete_topic("t"),
    ]
    assert all(change.touches_image for change in changes)
    (fenced,) = fence(state, 1)
    assert fenced.touches_image


def test_the_counter_survives_a_reload_from_the_store() -> None:
    store = FakeStore()
    state = empty_state()
    epoch = register(state, 1)
    before = []
    for _ in range(3):
        block, change = state.allocate_producer_ids(1, epoch)
        store.commit(change)
        commit(state, change)
        before.append(block)
    # A change planned but never committed (the term ended) is not in the store.
    state.allocate_producer_ids(1, epoch)
    successor = store.load(state)
    block, change = successor.allocate_producer_ids(1, epoch)
    assert block.first == before[-1].end == 3000
    store.commit(change)
    commit(successor, change)
    assert store.load(successor).next_producer_id == 4000


def test_stale_and_unknown_brokers_are_refused_without_a_change() -> None:
    state = empty_state()
    epoch = register(state, 1)
    cases = [
        (1, epoch + 1, ErrorCode.STALE_BROKER_EPOCH),
        (1, epoch - 1, ErrorCode.STALE_BROKER_EPOCH),
        (9, epoch, ErrorCode.BROKER_ID_NOT_REGISTERED),
    ]
    for broker_id, broker_epoch, expected in cases:
        with pytest.raises(KafkaError) as refused:
            state.allocate_producer_ids(broker_id, broker_epoch)
        assert refused.value.code is expected
        assert expected.name in str(refused.value)
    assert state.next_producer_id == 0


def test_a_fenced_broker_is_stale_until_it_registers_again() -> None:
    state, _ = with_topic([(1, 2)], brokers=2)
    fence(state, 1)
    with pytest.raises(KafkaError) as refused:
        state.allocate_producer_ids(1, 1)
    assert refused.value.code is ErrorCode.STALE_BROKER_EPOCH
    assert allocate(state, 1, register(state, 1)).first == 0


def test_ids_end_below_two_to_the_63() -> None:
    last_first = 2**63 - PRODUCER_ID_BLOCK_SIZE
    image = Image("c", {}, {}, 0, last_first)
    state = ClusterState(image, PATHS, now=0.0, session_timeout=TIMEOUT)
    epoch = register(state, 1)
    block = allocate(state, 1, epoch)
    assert (block.first, block.end - 1) == (last_first, 2**63 - 1)
    with pytest.raises(KafkaError) as refused:
        state.allocate_producer_ids(1, epoch)
    assert refused.value.code is ErrorCode.UNKNOWN_SERVER_ERROR
    assert "exhausted" in str(refused.value)
    assert state.next_producer_id == 2**63


@pytest.mark.parametrize("data", [b'{"next":-1}', b'{"next":9223372036854775809}', b"{}"])
def test_a_damaged_counter_stops_a_takeover(data: bytes) -> None:
    with pytest.raises((ValueError, KeyError)):
        layout.decode_next_producer_id(data)
