"""Zxids: ``(epoch << 32) | counter``, so numeric order is (epoch, counter) order."""

COUNTER_BITS = 32
COUNTER_MASK = (1 << COUNTER_BITS) - 1


def make_zxid(epoch: int, counter: int) -> int:
    assert 0 <= epoch < (1 << 32), epoch
    assert 0 <= counter <= COUNTER_MASK, counter
    return (epoch << COUNTER_BITS) | counter


def zxid_epoch(zxid: int) -> int:
    return zxid >> COUNTER_BITS


def zxid_counter(zxid: int) -> int:
    return zxid & COUNTER_MASK
