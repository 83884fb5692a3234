"""Record ZooKeeper writes made under faults and check them against every member's tree.

A ``Writer`` thread creates uniquely named znodes with known data through its own kazoo
client and sorts each attempt by what the client learned: acknowledged (the call returned),
unknown (connection lost or no answer: it may or may not have been applied), or refused
(a definite error from the server: nothing applied). ``read_member`` reads a prefix from
one member alone after a ``sync``; ``check_history`` then asserts the Jepsen-style
properties: no acknowledged write lost or altered, nothing present that nobody wrote, and
every member holding the same nodes with the same data.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

log = logging.getLogger("e2e.zk_history")

# Outcomes a client cannot tell apart from "applied, but the answer was lost".
UNKNOWN_OUTCOME = (
    ConnectionLoss,
    ConnectionClosedError,
    SessionExpiredError,
    OperationTimeoutError,
    KazooTimeoutError,
)


def kazoo_client(hosts: str, session_timeout: float = 6.0, **kwargs: Any) -> KazooClient:
    """A client that keeps reconnecting (no retry limit) and tries ``hosts`` in order."""
    return KazooClient(
        hosts=hosts,
        timeout=session_timeout,
        randomize_hosts=False,
        connection_retry={"max_tries": -1, "delay": 0.05, "max_delay": 0.5},
        **kwargs,
    )


@contextmanager
def connected(hosts: str, start_timeout: float = 15.0, **kwargs: Any) -> Iterator[KazooClient]:
    client = kazoo_client(hosts, **kwargs)
    client.start(timeout=start_timeout)
    try:
        yield client
    finally:
        with suppress(Exception):
            client.stop()
        with suppress(Exception):
            client.close()


@dataclass(slots=True)
class Attempt:
    path: str
    data: bytes
    finished: float  # time.monotonic() when the outcome was known


@dataclass
class Writer:
    """Creates ``<prefix>/<name>-<n>`` with data ``<name>:<n>`` until stopped."""

    hosts: str
    prefix: str
    name: str
    call_timeout: float = 10.0
    acked: list[Attempt] = field(default_factory=list)
    unknown: list[Attempt] = field(default_factory=list)
    refused: list[tuple[Attempt, str]] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Writer:
        self._thread = threading.Thread(target=self._run, name=f"writer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"writer {self.name} did not stop in {timeout}s"
        if self.error is not None:
            raise AssertionError(f"writer {self.name} failed") from self.error

    def _run(self) -> None:
        try:
            with connected(self.hosts) as client:
                n = 0
                while not self._stop.is_set():
                    n += 1
                    path = f"{self.prefix}/{self.name}-{n:06d}"
                    data = f"{self.name}:{n}".encode()
                    self._attempt(client, path, data)
        except BaseException as e:  # reported by stop()
            self.error = e

    def _attempt(self, client: KazooClient, path: str, data: bytes) -> None:
        try:
            client.create_async(path, data).get(timeout=self.call_timeout)
        except UNKNOWN_OUTCOME:
            self.unknown.append(Attempt(path, data, time.monotonic()))
            time.sleep(0.02)  # let the client notice the break before the next attempt
        except KazooException as e:
            self.refused.append((Attempt(path, data, time.monotonic()), type(e).__name__))
            time.sleep(0.02)
        else:
            self.acked.append(Attempt(path, data, time.monotonic()))


@dataclass
class History:
    acked: dict[str, bytes] = field(default_factory=dict)
    unknown: dict[str, bytes] = field(default_factory=dict)
    refused: dict[str, bytes] = field(default_factory=dict)

    def add_writer(self, writer: Writer) -> None:
        self.acked.update((a.path, a.data) for a in writer.acked)
        self.unknown.update((a.path, a.data) for a in writer.unknown)
        self.refused.update((a.path, a.data) for a, _ in writer.refused)

    def add_acked(self, items: Mapping[str, bytes]) -> None:
        self.acked.update(items)


def create_all(client: KazooClient, items: Mapping[str, bytes], timeout: float = 30.0) -> None:
    """Create every path with its data, pipelined; each must be acknowledged."""
    results = [(path, client.create_async(path, data)) for path, data in items.items()]
    for path, result in results:
        assert result.get(timeout=timeout) == path


def read_member(
    host: str, prefix: str, timeout: float = 20.0, sync: bool = True
) -> dict[str, bytes]:
    """Every child of ``prefix`` with its data, read from the member at ``host`` alone
    after a ``sync`` (so a follower has caught up with the leader first)."""
    with connected(host, start_timeout=timeout) as client:
        if sync:
            client.sync_async(prefix).get(timeout=timeout)
        children = client.get_children_async(prefix).get(timeout=timeout)
        pending = [(c, client.get_async(f"{prefix}/{c}")) for c in children]
        tree: dict[str, bytes] = {}
        for child, result in pending:
            with suppress(NoNodeError):
                data, _ = result.get(timeout=timeout)
                tree[f"{prefix}/{child}"] = data
        return tree


def check_history(history: History, trees: Mapping[int, dict[str, bytes]]) -> None:
    """Assert that every member's tree holds each acknowledged write with its data, holds
    only writes someone attempted (unknown outcomes may be there or not), and that all
    members agree."""
    assert history.acked, "no write was acknowledged: the test did not test anything"
    for member, tree in trees.items():
        lost = sorted(p for p in history.acked if p not in tree)
        assert not lost, f"member {member} lost {len(lost)} acknowledged writes: {lost[:10]}"
        altered = sorted(p for p, d in tree.items() if p in history.acked and history.acked[p] != d)
        assert not altered, f"member {member} altered acknowledged writes: {altered[:10]}"
        attempted = {**history.unknown, **history.acked}
        phantom = sorted(p for p in tree if p not in attempted)
        assert not phantom, (
            f"member {member} holds writes nobody made or that failed: {phantom[:10]}"
        )
        wrong = sorted(
            p for p, d in tree.items() if p in history.unknown and history.unknown[p] != d
        )
        assert not wrong, f"member {member} holds unknown-outcome writes with other data: {wrong}"
    first, *rest = trees.items()
    for member, tree in rest:
        only_there = sorted(set(tree) ^ set(first[1]))
        assert tree == first[1], (
            f"members {first[0]} and {member} differ: {len(only_there)} paths on one side "
            f"only, e.g. {only_there[:10]}"
        )
