"""Active or standby: the election loop, and a term as the active controller.

A process campaigns for the controller seat whenever it is free; the winner loads the image
and serves until a write fails, its connection to the ensemble drops, or it stops. Then the
term ends: its streams are cut, its seat is freed if the store can still be reached, and the
process campaigns again, reloading everything if it wins. A term never outlives a failed
write or a lost connection, so its image never drifts from the store.

Besides the RPCs, a term runs two background tasks that commit under it like any change:
the reconciler (fencing and elections, at once) and, when enabled, the leader balancer
(preferred leader elections, every check interval). Ending the term stops both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.rpc.controller_pb2 import MetadataUpdate
from directlog.security.scram import ScramCredential, ScramMechanism
from directlog.waits import wait_event
from services.controller import layout, messages
from services.controller.cluster import Change, ClusterState, Delta, ScramUpsertion
from services.controller.layout import ControllerRecord, Layout
from services.controller.metrics import ControllerMetrics
from services.controller.settings import ControllerSettings
from services.controller.store import Store, StoreError, Won
from services.controller.streams import Subscription

log = logging.getLogger("directlog.controller")

NOT_ACTIVE = "not the active controller"
RETRY_DELAY = 0.05  # between campaigns when the store fails or the seat just emptied
STANDBY_RECHECK = 1.0  # a standby re-reads the seat at least this often, watch or not


class NotActiveError(Exception):
    """This process is not, or no longer, the active controller."""


@dataclass(frozen=True, slots=True)
class LeaderBalance:
    """Automatic preferred leader election (Kafka's auto.leader.rebalance.enable): every
    ``interval`` seconds, partitions go back to their preferred replica for each broker
    whose share of partitions it should lead but does not exceeds ``percentage`` %."""

    interval: float
    percentage: int

    @classmethod
    def from_settings(cls, settings: ControllerSettings) -> LeaderBalance | None:
        """None when ``auto_leader_rebalance`` is off."""
        if not settings.auto_leader_rebalance:
            return None
        return cls(
            settings.leader_imbalance_check_interval_ms / 1000,
            settings.leader_imbalance_per_broker_percentage,
        )


class Term:
    """One stretch as the active controller: its image, its write lock, its streams."""

    def __init__(
        self,
        won: Won,
        state: ClusterState,
        store: Store,
        metrics: ControllerMetrics,
        *,
        clock: Callable[[], float],
        queue_limit: int,
        on_failure: Callable[[str], None],
        leader_balance: LeaderBalance | None = None,
    ) -> None:
        """``leader_balance``: None disables automatic preferred leader election."""
        self.record = won.record
        self.epoch_version = won.epoch_version
        self.state = state
        self.lock = asyncio.Lock()  # one planned change at a time, planned on what is stored
        self.version = 1  # of the metadata image, one more with each update
        self.ended = asyncio.Event()
        self._store = store
        self._metrics = metrics
        self._clock = clock
        self._queue_limit = queue_limit
        self._on_failure = on_failure
        self._subscriptions: set[Subscription] = set()
        self._kick = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._reconcile())]
        if leader_balance is not None:
            self._tasks.append(loop.create_task(self._balance_leaders(leader_balance)))
        metrics.observe(state)

    async def commit(self, change: Change) -> None:
        """Write ``change`` under this term's epoch, then apply and publish it. The caller
        holds ``lock`` and planned ``change`` under it. Raises NotActiveError, having ended
        the term, when the write does not commit."""
        if self.ended.is_set():
            raise NotActiveError(NOT_ACTIVE)
        if not change.ops:
            return
        try:
            await self._store.commit(change.ops, self.epoch_version)
        except StoreError as exc:
            self._on_failure(f"a write failed: {exc}")
            raise NotActiveError(NOT_ACTIVE) from exc
        self.state.apply(change, self._clock())
        self._metrics.committed(change)
        if change.touches_image:
            self.publish(change.delta)

    async def elect(self) -> None:
        """Commit, in chunks, the partition changes the fenced and shutting-down brokers
        call for, then the reassignments whose target caught up, until none is left. The
        caller holds ``lock``."""
        while (change := self.state.elect() or self.state.complete_reassignments()) is not None:
            await self.commit(change)

    async def elect_preferred(self, percentage: int) -> int:
        """Commit, in chunks, the moves back to their preferred replica of the partitions
        of every broker whose imbalance exceeds ``percentage`` % (decided once, before the
        first chunk, so a large move does not stop half way at the threshold). Returns how
        many partitions moved. The caller holds ``lock``."""
        brokers = self.state.imbalanced_brokers(percentage)
        moved = 0
        while (change := self.state.elect_preferred(brokers, self._clock())) is not None:
            await self.commit(change)
            moved += change.preferred_elections
        if moved:
            log.info(
                "preferred leader election: %d partitions back to brokers %s",
                moved,
                sorted(brokers),
            )
        return moved

    async def load_remote(self, keys: Iterable[tuple[bytes, int]]) -> dict[tuple[bytes, int], str]:
        """Read the remote log records of the partitions in ``keys`` (topic id, partition)
        that the image lacks, the reads pipelined. Returns those that could not be read,
        with why: a read that fails (a malformed record, a connection that dropped) fails
        the requests that needed it, not the term, which has changed nothing. Raises
        NotActiveError when the term ended meanwhile. The caller holds ``lock``."""
        missing = self.state.remote_unloaded(keys)
        results = await asyncio.gather(
            *(self._store.load_remote_partition(t, p) for t, p in missing),
            return_exceptions=True,
        )
        failed = {}
        for (topic_id, index), result in zip(missing, results, strict=True):
            if isinstance(result, StoreError):
                log.error(
                    "remote log records of %s-%d: %s", layout.uuid_text(topic_id), index, result
                )
                failed[topic_id, index] = f"the remote log records could not be read: {result}"
            elif isinstance(result, BaseException):
                raise result
            else:
                self.state.remote_loaded(topic_id, index, result)
        if self.ended.is_set():
            raise NotActiveError(NOT_ACTIVE)
        return failed

    async def finish_remote_deletion(self, topic_id: bytes) -> int:
        """Remove a deleted topic's remote log subtree, in as many transactions as it
        takes. Returns how many znodes went. The caller holds ``lock``. Raises KafkaError:
        UNKNOWN_TOPIC_ID or INVALID_REQUEST as ``deleted_remote_topic`` does, and
        UNKNOWN_SERVER_ERROR when the subtree cannot be read."""
        self.state.deleted_remote_topic(topic_id)
        try:
            tree = await self._store.remote_tree(topic_id)
        except StoreError as exc:
            raise KafkaError(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"the remote log records could not be read: {exc}"
            ) from exc
        removed = 0
        for change in self.state.finish_remote_deletion(topic_id, tree):
            await self.commit(change)
            removed += len(change.ops)
        return removed

    def publish(self, delta: Delta) -> None:
        self._metrics.observe(self.state)
        self.version += 1
        update = self._update(delta)
        for subscription in list(self._subscriptions):
            subscription.push(update)
            if subscription.ended is not None:
                self._drop(subscription)
                self._metrics.streams_cut.inc()

    def subscribe(self) -> Subscription:
        """A stream that starts with the whole image as of now."""
        subscription = Subscription(self._queue_limit)
        subscription.push(self._update(None))
        self._subscriptions.add(subscription)
        self._metrics.metadata_streams.set(len(self._subscriptions))
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._drop(subscription)

    def kick(self) -> None:
        """Re-check liveness and leadership now (a broker came back, a config changed)."""
        self._kick.set()

    def end(self) -> None:
        self.ended.set()
        for task in self._tasks:
            task.cancel()
        for subscription in list(self._subscriptions):
            subscription.end(grpc.StatusCode.FAILED_PRECONDITION, NOT_ACTIVE)
            self._drop(subscription)

    def _drop(self, subscription: Subscription) -> None:
        self._subscriptions.discard(subscription)
        self._metrics.metadata_streams.set(len(self._subscriptions))

    def _update(self, delta: Delta | None) -> MetadataUpdate:
        return messages.metadata_update(
            self.state,
            version=self.version,
            controller_id=self.record.controller_id,
            controller_epoch=self.record.epoch,
            delta=delta,
        )

    async def _reconcile(self) -> None:
        """Fence brokers whose session ended and elect leaders until nothing is left to
        do; then sleep until the next session could end or something kicks."""
        try:
            while True:
                async with self.lock:
                    fenced = self.state.fence_expired(self._clock())
                    if fenced:
                        log.warning("fenced brokers %s: no heartbeat for the session", fenced)
                        self.publish(Delta())
                    await self.elect()
                expiry = self.state.next_expiry()
                timeout = self.state.session_timeout
                if expiry is not None:
                    timeout = min(timeout, max(expiry - self._clock(), 0.0) + 0.001)
                await wait_event(self._kick, timeout)
                self._kick.clear()
        except NotActiveError:
            return
        except Exception:
            # Without its reconciler a term would never fence anyone: end it instead.
            log.exception("fencing and elections failed")
            self._on_failure("fencing and elections failed")

    async def _balance_leaders(self, balance: LeaderBalance) -> None:
        """Every ``balance.interval``, preferred leader elections (``elect_preferred``)."""
        while True:
            await asyncio.sleep(balance.interval)
            try:
                async with self.lock:
                    await self.elect_preferred(balance.percentage)
            except NotActiveError:
                return
            except Exception:
                # A bug; whether it struck before a commit or while applying one, the image
                # may not be the store's any more: end the term, as the reconciler does.
                log.exception("preferred leader election failed")
                self._on_failure("preferred leader election failed")
                return


class Controller:
    def __init__(
        self,
        settings: ControllerSettings,
        metrics: ControllerMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        """``clock`` times sessions; ``wall_clock`` (seconds since the epoch) stamps remote
        log records."""
        self.settings = settings
        self.controller_id = settings.controller_id
        self.metrics = metrics
        self.paths = Layout(settings.root)
        self.store = Store(
            settings.consensus,
            self.paths,
            settings.consensus_session_timeout_ms / 1000,
            tls=settings.consensus_tls,
            auth=settings.consensus_auth,
        )
        self.term: Term | None = None
        self.active: ControllerRecord | None = None  # the other process that leads, if known
        self.address = ""
        self.clock = clock
        self.wall_clock = wall_clock
        self._rng = rng or random.Random()
        self._wake = asyncio.Event()
        self._connected = asyncio.Event()
        self._disconnects = 0  # a term won before a disconnect must not start after it
        self._campaign_task: asyncio.Task[None] | None = None

    @property
    def active_address(self) -> str | None:
        """host:port of the active controller, when known."""
        if self.term is not None:
            return self.address
        return None if self.active is None else self.active.address

    def readiness(self) -> str | None:
        """/readyz: active or standby, a controller is ready while its consensus session is
        up (a standby is then able to take over)."""
        return None if self._connected.is_set() else "not connected to the consensus service"

    def start(self, address: str) -> None:
        """Connect and campaign in the background as ``address`` (our gRPC host:port)."""
        self.address = address
        self.store.start(self._on_session)
        self._campaign_task = asyncio.get_running_loop().create_task(self._campaign())

    async def stop(self) -> None:
        if self._campaign_task is not None:
            self._campaign_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._campaign_task
        self.step_down("stopping", planned=True)
        await self.store.stop()

    def step_down(self, reason: str, *, planned: bool = False) -> None:
        """End our term; a ``planned`` end (we are stopping) is no news worth a warning."""
        term, self.term = self.term, None
        if term is None:
            return
        level = logging.INFO if planned else logging.WARNING
        log.log(level, "no longer the active controller (epoch %d): %s", term.record.epoch, reason)
        term.end()
        self.metrics.active.set(0)
        self._wake.set()

    def require_term(self) -> Term:
        if self.term is None:
            raise NotActiveError(NOT_ACTIVE)
        return self.term

    # The election -----------------------------------------------------------------------

    async def _campaign(self) -> None:
        while True:
            await wait_event(self._connected, STANDBY_RECHECK)
            if not self._connected.is_set():
                continue
            self._wake.clear()
            disconnects = self._disconnects
            try:
                await self.store.prepare()
                outcome = await self.store.campaign(
                    self.controller_id, self.address, self._wake.set
                )
                if isinstance(outcome, Won):
                    await self._lead(outcome, disconnects)
                    continue
            except StoreError as exc:
                log.info("campaign failed, trying again: %s", exc)
                await asyncio.sleep(RETRY_DELAY)
                continue
            except Exception:
                # A bug must not leave the process a silent standby forever.
                log.exception("campaign failed unexpectedly, trying again")
                self.step_down("an unexpected error")
                await asyncio.sleep(STANDBY_RECHECK)
                continue
            if outcome is None:
                await asyncio.sleep(RETRY_DELAY)
            else:
                if self.active != outcome:
                    log.info(
                        "standing by: controller %d at %s leads (epoch %d)",
                        outcome.controller_id,
                        outcome.address,
                        outcome.epoch,
                    )
                self.active = outcome
                await wait_event(self._wake, STANDBY_RECHECK)

    async def _lead(self, won: Won, disconnects: int) -> None:
        """Serve one term, from loading the image to stepping down."""
        self.active = None
        try:
            image = await self.store.load()
        except StoreError as exc:
            log.error("won epoch %d but could not load the image: %s", won.record.epoch, exc)
            await self.store.resign(won.epoch_version)
            return
        if disconnects != self._disconnects:
            log.info("cut off from the ensemble while taking over epoch %d", won.record.epoch)
            await self.store.resign(won.epoch_version)
            return
        settings = self.settings
        state = ClusterState(
            image,
            self.paths,
            now=self.clock(),
            session_timeout=settings.broker_session_timeout_ms / 1000,
            default_partitions=settings.num_partitions,
            default_replication_factor=settings.default_replication_factor,
            rng=self._rng,
        )
        term = Term(
            won,
            state,
            self.store,
            self.metrics,
            clock=self.clock,
            queue_limit=settings.metadata_queue_limit,
            on_failure=self.step_down,
            leader_balance=LeaderBalance.from_settings(settings),
        )
        self.term = term
        self.metrics.active.set(1)
        self.metrics.epoch.set(won.record.epoch)
        log.info(
            "active controller, epoch %d: %d brokers, %d topics, %d partitions",
            won.record.epoch,
            len(state.brokers),
            len(state.topics),
            state.partition_count,
        )
        try:
            if settings.scram_bootstrap_file is not None:
                await bootstrap_users(term, settings.scram_bootstrap_file)
            await term.ended.wait()
        except NotActiveError:
            pass  # the term ended on a failed write: stepped down already
        finally:
            self.step_down("stopping", planned=True)
            await self.store.resign(won.epoch_version)

    def _on_session(self, state: str) -> None:
        """kazoo's session events, on the loop. Cut off from the ensemble, this process
        cannot know whether its session still lives or a standby already leads, so it
        stops serving at once; back in the same session, it wins again (its own seat is
        freed first) or follows whoever was quicker."""
        if state == "CONNECTED":
            self._connected.set()
            self._wake.set()
            return
        self._connected.clear()
        self._disconnects += 1
        if state == "SUSPENDED":
            self.step_down("cut off from the consensus ensemble")
        else:
            self.step_down("the consensus session expired")


def read_bootstrap_users(path: Path) -> dict[str, str]:
    """The "user:password" lines of a scram_bootstrap_file (blank lines and # comments
    skipped); ValueError for a line that is neither."""
    users = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, colon, password = line.partition(":")
        if not colon or not user or not password:
            raise ValueError(f"{path}:{number}: not user:password")
        users[user] = password
    return users


async def bootstrap_users(term: Term, path: Path) -> None:
    """Create the bootstrap file's users that have no SCRAM credential yet, with both
    mechanisms, so an operator (and the brokers) can log in to a new cluster."""
    try:
        users = read_bootstrap_users(path)
    except (OSError, ValueError) as exc:
        log.error("scram_bootstrap_file not read, no user created: %s", exc)
        return
    async with term.lock:
        missing = {u: p for u, p in users.items() if not term.state.scram.get(u)}
        upsertions = [
            ScramUpsertion(
                user,
                mechanism,
                credential.salt,
                credential.stored_key,
                credential.server_key,
                credential.iterations,
            )
            for user, password in missing.items()
            for mechanism in ScramMechanism
            for credential in (ScramCredential.from_password(mechanism, password),)
        ]
        if not upsertions:
            return
        results, changes = term.state.alter_scram_credentials(upsertions, [])
        for change in changes:
            await term.commit(change)
    for user, refusal in results:
        if refusal is None:
            log.info("SCRAM user %r created from the bootstrap file", user)
        else:
            log.error("SCRAM user %r of the bootstrap file not created: %s", user, refusal)
