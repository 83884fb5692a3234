"""Connected queue pairs on each software provider, both ends in this process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from directlog.rdma import (
    Access,
    CompletionQueue,
    Context,
    MemoryRegion,
    ProtectionDomain,
    QpCaps,
    QueuePair,
    WorkCompletion,
    open_context,
)

PROVIDERS = ["shm", "tcp"]
ALL_RIGHTS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
REGION = 4 << 20


@dataclass
class Pair:
    """The owner registered ``target`` and accepted; the user connected, with ``local``."""

    owner: Context
    user: Context
    owner_pd: ProtectionDomain
    user_pd: ProtectionDomain
    owner_cq: CompletionQueue
    user_cq: CompletionQueue
    owner_qp: QueuePair
    qp: QueuePair
    target: MemoryRegion
    local: MemoryRegion


def connect(
    owner_pd: ProtectionDomain,
    owner_cq: CompletionQueue,
    user_pd: ProtectionDomain,
    user_cq: CompletionQueue,
    owner_caps: QpCaps | None = None,
    user_caps: QpCaps | None = None,
) -> tuple[QueuePair, QueuePair]:
    """(owner's QP, user's QP), the owner accepting on a thread of its own."""
    listener = owner_pd.listen(owner_cq, owner_caps)
    accepted: list[QueuePair] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept(timeout=10)))
    thread.start()
    try:
        qp = user_pd.connect(listener.conn_info.encode(), user_cq, user_caps)
    finally:
        thread.join(timeout=10)
        listener.close()
    assert accepted, "the listener accepted nothing"
    return accepted[0], qp


def make_pair(
    provider: str, owner_caps: QpCaps | None = None, user_caps: QpCaps | None = None
) -> Pair:
    owner = open_context(provider)
    user = open_context(provider)
    owner_pd, user_pd = owner.alloc_pd(), user.alloc_pd()
    owner_cq, user_cq = owner.create_cq(512), user.create_cq(512)
    target = owner_pd.allocate(REGION, ALL_RIGHTS)
    local = user_pd.allocate(REGION, Access.LOCAL_WRITE)
    owner_qp, qp = connect(owner_pd, owner_cq, user_pd, user_cq, owner_caps, user_caps)
    return Pair(owner, user, owner_pd, user_pd, owner_cq, user_cq, owner_qp, qp, target, local)


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def pair(provider: str) -> Iterator[Pair]:
    made = make_pair(provider)
    yield made
    made.user.close()
    made.owner.close()


def one(cq: CompletionQueue, timeout: float = 5.0) -> WorkCompletion:
    """The next completion; fails the test rather than hang."""
    found = cq.poll(1, timeout=timeout)
    assert found, f"no completion within {timeout} s"
    return found[0]


def drain(cq: CompletionQueue, count: int, timeout: float = 5.0) -> list[WorkCompletion]:
    found: list[WorkCompletion] = []
    while len(found) < count:
        more = cq.poll(count - len(found), timeout=timeout)
        assert more, f"{len(found)} of {count} completions within {timeout} s"
        found += more
    return found
