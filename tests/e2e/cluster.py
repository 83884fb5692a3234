"""A whole Directlog cluster as subprocesses for end-to-end tests: a consensus ensemble,
controllers and brokers, on free ports under one work directory.

    with Cluster(tmp_path, brokers=3) as cluster:
        Producer({"bootstrap.servers": cluster.bootstrap})

Timeouts are short (broker sessions of a few seconds) so failover tests finish quickly;
every wait is bounded.

With ``networks`` (tests/e2e/netns.py, members 1..brokers+1), broker N runs in the network
namespace of member N+1 and the consensus member and controllers in that of the last
member, so a test can cut a broker off the controller and the other brokers
(``networks.isolate(N + 1)``) while clients, in the root namespace, still reach it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from confluent_kafka.admin import AdminClient

from tests.e2e.broker import BrokerProcess
from tests.e2e.controller import ControllerProcess
from tests.e2e.ensemble import Ensemble
from tests.e2e.netns import MemberNetworks
from tests.e2e.tiering import TieringProcess
from tests.ports import free_port

T = TypeVar("T")
BROKER_SESSION_MS = 2000
FAST_BROKER = {
    "heartbeat_interval_ms": 250,
    "replica_lag_time_max_ms": 3000,
    "replica_fetch_backoff_ms": 100,
    "housekeeping_interval_ms": 250,
}


class Cluster:
    def __init__(
        self,
        work_dir: Path,
        brokers: int = 1,
        *,
        consensus_members: int = 1,
        controllers: int = 1,
        broker_settings: dict[str, Any] | None = None,
        controller_settings: dict[str, Any] | None = None,
        racks: dict[int, str] | None = None,
        networks: MemberNetworks | None = None,
        tiering: dict[str, Any] | None = None,
    ) -> None:
        """``tiering``: TieringSettings fields (the remote store at least); with them every
        broker has tiered storage on and a tiering service beside it."""
        self.work_dir = Path(work_dir)
        self.networks = networks
        control = brokers + 1  # the namespace member of the consensus member and controllers
        host = networks.address(control) if networks else "127.0.0.1"
        prefix = networks.prefixes[control] if networks else []
        self.ensemble = Ensemble(
            self.work_dir / "consensus",
            size=consensus_members,
            member_hosts=dict.fromkeys(range(1, consensus_members + 1), host),
            command_prefix=dict.fromkeys(range(1, consensus_members + 1), prefix),
        )
        self.controllers = [
            ControllerProcess(
                self.work_dir,
                self.ensemble.hosts,
                controller_id=i,
                settings={
                    "broker_session_timeout_ms": BROKER_SESSION_MS,
                    **(controller_settings or {}),
                },
                host=host,
                command_prefix=prefix,
            )
            for i in range(controllers)
        ]
        self.broker_settings = {
            **FAST_BROKER,
            "offsets_topic_replication_factor": min(brokers, 3),
            "offsets_topic_num_partitions": 10,  # Kafka's 50 cost start-up time in every test
            **(broker_settings or {}),
        }
        self.racks = dict(racks or {})
        self.tiering_settings = dict(tiering) if tiering is not None else None
        self.tierings: dict[int, TieringProcess] = {}
        self.brokers: dict[int, BrokerProcess] = {}
        self._broker_count = brokers
        self.controller_addresses = ""  # known once the controllers listen

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values() if b.running)

    def start(self) -> Cluster:
        try:
            self.ensemble.start()
            self.ensemble.wait_serving()
            for controller in self.controllers:
                controller.start()
            self.controller_addresses = ",".join(c.address for c in self.controllers)
            for node_id in range(self._broker_count):
                self.add_broker(node_id)
            self.wait_live(set(self.brokers))
        except BaseException:
            self.stop()
            raise
        return self

    def add_broker(self, node_id: int) -> BrokerProcess:
        settings = dict(self.broker_settings)
        if node_id in self.racks:
            settings["rack"] = self.racks[node_id]
        if self.tiering_settings is not None:
            settings.update(self._tiered_broker_settings())
        member = node_id + 1
        broker = BrokerProcess(
            self.work_dir / f"broker-{node_id}",
            controllers=self.controller_addresses,
            node_id=node_id,
            settings=settings,
            host=self.networks.address(member) if self.networks else "127.0.0.1",
            command_prefix=self.networks.prefixes[member] if self.networks else (),
        )
        self.brokers[node_id] = broker
        broker.start()
        if self.tiering_settings is not None:
            tiering = TieringProcess(
                self.work_dir / f"tiering-{node_id}",
                broker=f"127.0.0.1:{settings['tiering_port']}",
                settings=self.tiering_settings,
            )
            self.tierings[node_id] = tiering
            tiering.start()
        return broker

    def _tiered_broker_settings(self) -> dict[str, Any]:
        """A broker's side of the tiering settings: the same store, its own gRPC port."""
        tiering = self.tiering_settings
        assert tiering is not None
        shared = {
            f"tiering_{name}": tiering[name]
            for name in ("remote", "s3_endpoint", "s3_region", "s3_access_key", "s3_secret_key")
            if name in tiering
        }
        return {**shared, "remote_log_storage_system_enable": True, "tiering_port": free_port()}

    def wait_live(self, expected: set[int], timeout: float = 30.0) -> None:
        """Until Metadata lists exactly `expected` as the live brokers."""
        wait_for(lambda: self.live_brokers() == expected, timeout, f"live brokers {expected}")

    def live_brokers(self) -> set[int]:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return set(admin.list_topics(timeout=5).brokers)

    def stop(self) -> None:
        for tiering in self.tierings.values():
            tiering.stop()
        for broker in self.brokers.values():
            broker.stop()
        for controller in self.controllers:
            controller.stop()
        self.ensemble.stop()

    def logs(self, lines: int = 60) -> str:
        parts = [f"--- broker {i}\n{b.stderr_tail(lines)}" for i, b in self.brokers.items()]
        parts += [f"--- tiering {i}\n{t.stderr_tail(lines)}" for i, t in self.tierings.items()]
        parts += [
            f"--- controller {c.controller_id}\n{c.stderr_tail(lines)}" for c in self.controllers
        ]
        return "\n".join(parts)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def eventually(check: Callable[[], T], what: str, timeout: float, interval: float = 0.25) -> T:
    """`check()`'s result once it stops failing an assertion; its last failure after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}, after {timeout} s: {error}") from error
        time.sleep(interval)
