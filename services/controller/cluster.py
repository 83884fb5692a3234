"""The controller's decisions, without I/O: given the cluster image and a request or a
liveness event, what to write to the store and what the brokers are told.

Every method that changes the cluster returns a ``Change`` (the store ops and the delta) and
leaves the image alone; the caller commits the ops in one fenced transaction and only then
calls ``apply``. So a change that fails to commit leaves no trace, and tests drive every
rule here with plain values and a fake clock.

Broker liveness lives only here, in memory (``heartbeat``, ``fence_expired`` and
``begin_controlled_shutdown`` change it directly, nothing is stored): a new active controller
starts with every registered broker alive for one session timeout, and none shutting down.
Only a broker heard from since then (a heartbeat or a registration) is handed a leadership
that is not forced (``elect_preferred``): the others may be dead and not yet fenced.

Remote log metadata (KIP-405) is cached in part: which topics have records is loaded with
the image, a partition's records only when a request first needs them (the caller reads
them from the store and hands them to ``remote_loaded``). From then on this controller's own
commits keep them current: it is the only writer while its term lasts.

Topic configs are validated over the cluster-wide defaults (``log_defaults``, Kafka's dynamic
broker defaults), the layer below a topic's overrides that this controller knows; a broker's
static ``log_defaults`` lie below both.

The security metadata (SCRAM credentials, ACLs, client quotas) is one znode per user, per
resource pattern, per quota entity, so a change writes only what it touches. A request that
needs more than one transaction holds is planned as several changes, committed in order;
only the last one's delta names the kind, so brokers see the request's outcome at once (a
failover half way leaves the earlier ones committed, and the next controller's full images
carry them).
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from directlog.broker_config import (
    CLUSTER_DEFAULT,
    InvalidBrokerConfigError,
    log_overrides,
    validate_broker_configs,
)
from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.security.acl import AclBinding, AclBindingFilter, validate_binding, validate_filter
from directlog.security.client_quotas import QuotaEntity, validate_alteration
from directlog.security.scram import MAX_ITERATIONS, MIN_ITERATIONS, ScramCredential, ScramMechanism
from directlog.topic_config import (
    LIST_CONFIGS,
    TOPIC_ONLY_CONFIGS,
    InvalidConfigError,
    LogConfig,
    altered_list,
    default_name,
    flag,
)
from directlog.topics import NO_LEADER, topic_name_error
from services.controller import layout
from services.controller.assignment import assign_replicas
from services.controller.layout import Create, Delete, Layout, SetData, StoreOp
from services.controller.model import (
    AclResource,
    BrokerRegistration,
    Listener,
    PartitionState,
    RemotePartition,
    RemoteSegment,
    RemoteSegmentState,
    RemoteTopic,
    Topic,
)

MAX_PARTITIONS = 10_000
PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's: a broker asks again after this many InitProducerIds
DEFAULT = -1  # partitions / replication factor: the controller's default
STORE_OPS_LIMIT = 500  # ops per transaction when a change is split into several
# Znode paths and data per transaction when a change is split: ZooKeeper refuses a request
# past jute.maxbuffer (1 MiB by default), and a refused commit ends the term.
TRANSACTION_BYTES = 768 * 1024
NO_RECORDS = RemotePartition()

# The moves a remote log record may make (UpdateRemoteLogSegment); DELETE_FINISHED removes it.
REMOTE_MOVES: Mapping[RemoteSegmentState, frozenset[RemoteSegmentState]] = {
    RemoteSegmentState.COPY_STARTED: frozenset(
        {RemoteSegmentState.COPY_FINISHED, RemoteSegmentState.DELETE_STARTED}
    ),
    RemoteSegmentState.COPY_FINISHED: frozenset({RemoteSegmentState.DELETE_STARTED}),
    RemoteSegmentState.DELETE_STARTED: frozenset({RemoteSegmentState.DELETE_FINISHED}),
    RemoteSegmentState.DELETE_FINISHED: frozenset(),
}
PREFERRED, UNCLEAN = 0, 1  # Kafka's ElectionType
NO_CHANGES: Mapping[str, str] = {}
# IncrementalAlterConfigs' APPENDs and SUBTRACTs of list configs: name -> comma-separated
# values, each.
ListChanges = tuple[Mapping[str, str], Mapping[str, str]]
KIP_950_MESSAGE = (
    "It is invalid to disable remote storage without deleting remote data. If you want to "
    "keep the remote data and turn to read only, set remote.log.copy.disable=true. If you "
    "want to disable remote storage and delete all remote data, set "
    "remote.storage.enable=false and remote.log.delete.on.disable=true"
)


@dataclass(frozen=True, slots=True)
class Delta:
    """What a change touched, for the metadata streams: per topic id, the partitions that
    changed (None: the whole topic, it is new), and the topics deleted."""

    topics: Mapping[bytes, frozenset[int] | None] = field(default_factory=dict)
    deleted_topic_ids: tuple[bytes, ...] = ()
    # The kinds of security metadata that changed: brokers are sent each whole, and only
    # when it changed.
    scram_credentials: bool = False
    acls: bool = False
    client_quotas: bool = False


@dataclass(frozen=True, slots=True)
class Change:
    """Store ops to commit in one transaction, and the image records they write."""

    ops: tuple[StoreOp, ...]
    delta: Delta = field(default_factory=Delta)
    brokers: tuple[BrokerRegistration, ...] = ()
    topics: tuple[Topic, ...] = ()  # new or replaced, whole
    last_broker_epoch: int | None = None
    next_producer_id: int | None = None
    leader_elections: int = 0  # partitions that got a new leader (not -1)
    unclean_elections: int = 0  # of which from outside the ISR
    preferred_elections: int = 0  # of which back to the preferred replica (rebalance)
    isr_changes: int = 0
    # Remote log metadata, no part of the brokers' image. A topic None: its subtree is gone.
    remote_topics: Mapping[bytes, RemoteTopic | None] = field(default_factory=dict)
    remote_partitions: Mapping[tuple[bytes, int], RemotePartition] = field(default_factory=dict)
    log_defaults: Mapping[str, str] | None = None  # the cluster-wide defaults, whole
    # Per-broker dynamic configs, each changed broker's whole (empty: it has none left).
    broker_configs: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    # SCRAM credentials, each changed user's whole (empty: none left).
    scram: Mapping[str, Mapping[ScramMechanism, ScramCredential]] = field(default_factory=dict)
    # ACLs, each changed resource pattern's whole (empty: none left).
    acls: Mapping[AclResource, frozenset[AclBinding]] = field(default_factory=dict)
    # Client quotas, each changed entity's whole (empty: none left).
    client_quotas: Mapping[QuotaEntity, Mapping[str, float]] = field(default_factory=dict)
    containers: tuple[str, ...] = ()  # security container znodes the ops create

    @property
    def touches_image(self) -> bool:
        """Whether the brokers' image changes: the producer id counter and the remote log
        metadata are no part of it, so changing them needs no metadata update; nor does the
        part of a security change split into several that is not its last."""
        return bool(
            self.brokers
            or self.topics
            or self.delta.topics
            or self.delta.deleted_topic_ids
            or self.log_defaults is not None
            or bool(self.broker_configs)
            or self.delta.scram_credentials
            or self.delta.acls
            or self.delta.client_quotas
        )


K = TypeVar("K")
V = TypeVar(
    "V", Mapping[ScramMechanism, ScramCredential], frozenset[AclBinding], Mapping[str, float]
)


@dataclass(frozen=True, slots=True)
class Rewrite(Generic[K, V]):
    """One transaction of a security change: its ops, whether it is the change's last, the
    keys whose znodes it writes with their new values, the containers it creates."""

    ops: tuple[StoreOp, ...]
    last: bool
    values: dict[K, V]
    containers: tuple[str, ...]


# One AlterClientQuotas entry: its entity's (type, name or None for the default) pairs and
# its (key, value or None to remove it) ops, unchecked.
QuotaAlteration = tuple[Sequence[tuple[str, str | None]], Sequence[tuple[str, float | None]]]


@dataclass(frozen=True, slots=True)
class ScramUpsertion:
    """One credential to set, as AlterUserScramCredentials carries it (unchecked)."""

    user: str
    mechanism: int
    salt: bytes = field(repr=False)
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int

    def credential(self) -> ScramCredential:
        """The credential, checked as Kafka checks an upsertion (its messages), then as a
        stored credential must be (keys of the mechanism's digest size, a salt); raises
        KafkaError."""
        mechanism = _scram_mechanism(self.user, self.mechanism)
        if self.iterations < MIN_ITERATIONS:
            raise KafkaError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations")
        if self.iterations > MAX_ITERATIONS:
            raise KafkaError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations")
        try:
            return ScramCredential(
                mechanism, self.salt, self.stored_key, self.server_key, self.iterations
            )
        except ValueError as exc:
            raise KafkaError(
                ErrorCode.UNACCEPTABLE_CREDENTIAL, f"user {self.user!r}: {exc}"
            ) from exc


@dataclass(frozen=True, slots=True)
class IsrChange:
    """One partition of an AlterPartition request."""

    topic_id: bytes
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class IsrResult:
    topic_id: bytes
    partition: int
    error: ErrorCode
    state: PartitionState | None  # in force once the change commits; None: no such partition


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """One partition's answer to an ElectLeaders or AlterPartitionReassignments."""

    topic: str
    partition: int
    error: ErrorCode
    message: str | None


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """Producer ids ``first`` to ``first + count - 1``, one broker's to hand out."""

    first: int
    count: int

    @property
    def end(self) -> int:
        return self.first + self.count


@dataclass(frozen=True, slots=True)
class Image:
    """What the store holds, as loaded by a controller that takes over."""

    cluster_id: str
    brokers: Mapping[int, BrokerRegistration]
    topics: Mapping[bytes, Topic]
    last_broker_epoch: int
    next_producer_id: int
    remote_topics: Mapping[bytes, RemoteTopic] = field(default_factory=dict)
    log_defaults: Mapping[str, str] = field(default_factory=dict)
    broker_configs: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    scram: Mapping[str, Mapping[ScramMechanism, ScramCredential]] = field(default_factory=dict)
    acls: Mapping[AclResource, frozenset[AclBinding]] = field(default_factory=dict)
    client_quotas: Mapping[QuotaEntity, Mapping[str, float]] = field(default_factory=dict)
    # The security container znodes that exist (``scram``, ...): the first write under a
    # missing one creates it.
    containers: frozenset[str] = frozenset()


class ClusterState:
    def __init__(
        self,
        image: Image,
        paths: Layout,
        *,
        now: float,
        session_timeout: float,
        default_partitions: int = 1,
        default_replication_factor: int = 1,
        rng: random.Random | None = None,
    ) -> None:
        self.cluster_id = image.cluster_id
        self.brokers = dict(image.brokers)
        self.topics = dict(image.topics)
        self.topic_ids = {topic.name: topic_id for topic_id, topic in self.topics.items()}
        self.last_broker_epoch = image.last_broker_epoch
        self.next_producer_id = image.next_producer_id
        self.remote_topics = dict(image.remote_topics)
        self.log_defaults = dict(image.log_defaults)
        # Per-broker dynamic configs by broker id; a broker without any is not here.
        self.broker_configs = {b: dict(c) for b, c in image.broker_configs.items() if c}
        # SCRAM credentials by user then mechanism; a user without any is not here.
        self.scram = {u: dict(c) for u, c in image.scram.items() if c}
        # ACLs by resource pattern; a pattern without any is not here.
        self.acls = {r: b for r, b in image.acls.items() if b}
        # Client quotas by entity; an entity without any is not here.
        self.client_quotas = {e: dict(v) for e, v in image.client_quotas.items() if v}
        self.containers = set(image.containers)
        # The records of the partitions loaded so far, by topic id then partition.
        self.remote_partitions: dict[bytes, dict[int, RemotePartition]] = {}
        self.paths = paths
        self.session_timeout = session_timeout
        self.default_partitions = default_partitions
        self.default_replication_factor = default_replication_factor
        self.rng = rng or random.Random()
        # Every registration counts as alive from the takeover: its broker heartbeats to
        # the old controller until it finds this one.
        self.last_seen = dict.fromkeys(self.brokers, now)
        self.loaded_at = now
        self.fenced: set[int] = set()
        # Alive brokers in controlled shutdown: never new leaders or ISR members, and no
        # obstacle to a new incarnation of their id. A registration (a new session) or
        # fencing ends it.
        self.shutting_down: set[int] = set()
        self.partition_count = sum(len(t.partitions) for t in self.topics.values())
        self.offline_count = sum(_offline(t) for t in self.topics.values())

    # Brokers ----------------------------------------------------------------------------

    def register_broker(
        self,
        broker_id: int,
        incarnation_id: str,
        listeners: Sequence[Listener],
        rack: str | None,
        now: float,
    ) -> Change:
        """A new broker epoch for the broker. Refused while another incarnation of the id is
        alive and not shutting down: that is a second process with the same id, or a
        restart that came back before its old session ended (the broker retries until it
        has). One that shut down in a controlled way gives its id up at once."""
        if broker_id < 0:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"broker id {broker_id} is negative")
        if not incarnation_id:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "incarnation id is empty")
        if not listeners:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "a broker needs at least one listener")
        for listener in listeners:
            if not listener.name or not listener.host or not 0 < listener.port <= 65535:
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"bad listener {listener}")
        old = self.brokers.get(broker_id)
        if (
            old is not None
            and old.incarnation_id != incarnation_id
            and self.alive(broker_id, now)
            and broker_id not in self.shutting_down
        ):
            raise KafkaError(
                ErrorCode.DUPLICATE_BROKER_REGISTRATION,
                f"broker {broker_id} is registered by incarnation {old.incarnation_id}, "
                "whose session has not expired",
            )
        epoch = self.last_broker_epoch + 1
        registration = BrokerRegistration(
            broker_id, incarnation_id, epoch, tuple(listeners), rack or None
        )
        path, data = self.paths.broker(broker_id), layout.encode_broker(registration)
        ops: tuple[StoreOp, ...] = (
            SetData(self.paths.broker_epoch, layout.encode_last_broker_epoch(epoch)),
            Create(path, data) if old is None else SetData(path, data),
        )
        return Change(ops, brokers=(registration,), last_broker_epoch=epoch)

    def heartbeat(self, broker_id: int, broker_epoch: int, now: float) -> ErrorCode:
        error = self.broker_error(broker_id, broker_epoch)
        if error is ErrorCode.NONE:
            self.last_seen[broker_id] = now
        return error

    def broker_error(self, broker_id: int, broker_epoch: int) -> ErrorCode:
        """Whether ``broker_epoch`` is the broker's current one. A fenced broker's is not:
        its session ended, and it registers again to come back."""
        registration = self.brokers.get(broker_id)
        if registration is None:
            return ErrorCode.BROKER_ID_NOT_REGISTERED
        if registration.broker_epoch != broker_epoch or broker_id in self.fenced:
            return ErrorCode.STALE_BROKER_EPOCH
        return ErrorCode.NONE

    def alive(self, broker_id: int, now: float) -> bool:
        return broker_id not in self.fenced and (
            now - self.last_seen.get(broker_id, float("-inf")) <= self.session_timeout
        )

    def fence_stopped(self, broker_id: int, broker_epoch: int) -> bool:
        """Fence a broker that says it stops (in memory; ``elect`` then moves what it still
        held). False when it is not current: a stale or fenced incarnation changes nothing."""
        if self.broker_error(broker_id, broker_epoch) is not ErrorCode.NONE:
            return False
        self.fenced.add(broker_id)
        self.shutting_down.discard(broker_id)
        return True

    def fence_expired(self, now: float) -> list[int]:
        """Fence the brokers whose session timed out (in memory; ``elect`` then moves their
        partitions). Returns them."""
        expired = sorted(b for b in self.brokers if b not in self.fenced and not self.alive(b, now))
        self.fenced.update(expired)
        self.shutting_down.difference_update(expired)
        return expired

    def next_expiry(self) -> float | None:
        """When the next unfenced broker's session ends, if any."""
        live = [seen for b, seen in self.last_seen.items() if b not in self.fenced]
        return min(live) + self.session_timeout if live else None

    def unfenced(self) -> dict[int, str | None]:
        """Brokers new replicas may go to, with their racks: neither fenced nor shutting
        down (a new partition's first replica leads it)."""
        return {
            b: r.rack
            for b, r in sorted(self.brokers.items())
            if b not in self.fenced and b not in self.shutting_down
        }

    def begin_controlled_shutdown(self, broker_id: int, broker_epoch: int) -> bool:
        """Mark the broker as shutting down (in memory; ``elect`` then moves its leaderships
        and ISR memberships). True the first time, False when it already was; raises
        STALE_BROKER_EPOCH or BROKER_ID_NOT_REGISTERED for a broker that is not current."""
        error = self.broker_error(broker_id, broker_epoch)
        if error is not ErrorCode.NONE:
            raise KafkaError(
                error, f"broker {broker_id} epoch {broker_epoch}: {error.name}, nothing to move"
            )
        if broker_id in self.shutting_down:
            return False
        self.shutting_down.add(broker_id)
        return True

    def leaderships(self, broker_id: int) -> int:
        """Partitions the broker leads."""
        return sum(
            p.leader == broker_id for topic in self.topics.values() for p in topic.partitions
        )

    # Leadership -------------------------------------------------------------------------

    def elect(self, limit: int = 500) -> Change | None:
        """Up to ``limit`` partition changes the fenced and shutting-down sets call for, or
        None when there are none: those brokers leave ISRs (the last member stays),
        partitions whose leader is fenced, missing, or shutting down with another ISR member
        get the first eligible ISR replica in replica order, or with unclean election
        enabled the first eligible replica. A shutting-down broker that is the last ISR
        member keeps leading: nothing else can. Applying the result makes those partitions
        need nothing more, so calling until None reaches a fixed point."""
        updates: dict[bytes, dict[int, PartitionState]] = {}
        found = 0
        ineligible = frozenset(self.fenced | self.shutting_down)
        for topic_id, topic in self.topics.items():
            unclean = self._in_force(topic.configs, "unclean.leader.election.enable")
            for index, state in enumerate(topic.partitions):
                new = self._reelected(state, unclean, ineligible)
                if new is not None:
                    updates.setdefault(topic_id, {})[index] = new
                    found += 1
                    if found == limit:
                        return self._partition_change(updates)
        return self._partition_change(updates) if updates else None

    def _reelected(
        self, state: PartitionState, unclean: bool, ineligible: frozenset[int]
    ) -> PartitionState | None:
        """The state ``state`` should move to, or None. ``ineligible``: the fenced and the
        shutting-down brokers; of those, only the fenced lose a leadership they hold
        alone."""
        isr = tuple(b for b in state.isr if b not in ineligible)
        if not isr:
            # Kafka keeps the last ISR member: it holds every committed record, so it is
            # the one to lead again when it comes back (or, shutting down, to lead on
            # until it goes).
            isr = (state.leader,) if state.leader in state.isr else state.isr[:1]
        leader = state.leader
        if leader == NO_LEADER or leader in self.fenced or leader not in isr:
            leader = next(
                (b for b in state.replicas if b in isr and b not in ineligible), NO_LEADER
            )
            if leader == NO_LEADER and unclean:
                live = [b for b in state.replicas if b not in ineligible]
                if live:
                    leader, isr = live[0], (live[0],)
        if leader == state.leader and isr == state.isr:
            return None
        leader_epoch = state.leader_epoch + (leader != state.leader)
        return replace(
            state,
            leader=leader,
            leader_epoch=leader_epoch,
            isr=isr,
            partition_epoch=state.partition_epoch + 1,
        )

    # Preferred leaders ------------------------------------------------------------------

    def leader_imbalance(self) -> dict[int, tuple[int, int]]:
        """Per preferred replica (the first of a partition's replicas): how many of the
        partitions it should lead are led by another broker or by none, and how many it
        should lead. Kafka's imbalance ratio is the first over the second."""
        counts: dict[int, list[int]] = {}
        for topic in self.topics.values():
            for state in topic.partitions:
                count = counts.setdefault(state.replicas[0], [0, 0])
                count[0] += state.leader != state.replicas[0]
                count[1] += 1
        return {b: (other, total) for b, (other, total) in sorted(counts.items())}

    def imbalanced_brokers(self, percentage: int) -> frozenset[int]:
        """The preferred replicas whose imbalance ratio exceeds ``percentage`` % (Kafka's
        leader.imbalance.per.broker.percentage): ``elect_preferred`` then moves every
        partition it can back to them, not just enough to get under the threshold."""
        assert 0 <= percentage <= 100, percentage
        return frozenset(
            b
            for b, (other, total) in self.leader_imbalance().items()
            if other * 100 > percentage * total
        )

    def can_take_leadership(self, broker_id: int, now: float) -> bool:
        """Whether the broker may be given a leadership nothing forces on it: registered,
        alive, not shutting down, and heard from since this controller took over (until
        its first heartbeat to us a broker is only presumed alive: it may be dead and not
        yet fenced)."""
        return (
            broker_id in self.brokers
            and broker_id not in self.shutting_down
            and self.alive(broker_id, now)
            and self.last_seen[broker_id] > self.loaded_at
        )

    def elect_preferred(
        self, brokers: Collection[int], now: float, limit: int = 500
    ) -> Change | None:
        """Up to ``limit`` partitions whose preferred replica is one of ``brokers`` (as
        ``imbalanced_brokers`` gives them) and does not lead them, moved back to it, or None
        when there are none: where it is in the ISR and can take a leadership
        (``can_take_leadership``). leader_epoch and partition_epoch + 1, the ISR as it is.
        Applying the result makes those partitions led by their preferred replica, so
        calling until None reaches a fixed point."""
        able = {b for b in brokers if self.can_take_leadership(b, now)}
        candidates = (
            (topic_id, index, state)
            for topic_id, topic in self.topics.items()
            for index, state in enumerate(topic.partitions)
            if state.replicas[0] in able
            and state.leader != state.replicas[0]
            and state.replicas[0] in state.isr
        )
        updates: dict[bytes, dict[int, PartitionState]] = {}
        for topic_id, index, state in itertools.islice(candidates, limit):
            updates.setdefault(topic_id, {})[index] = replace(
                state,
                leader=state.replicas[0],
                leader_epoch=state.leader_epoch + 1,
                partition_epoch=state.partition_epoch + 1,
            )
        if not updates:
            return None
        change = self._partition_change(updates)
        assert change.unclean_elections == 0, change
        return replace(change, preferred_elections=change.leader_elections)

    def elect_leaders(
        self, election_type: int, partitions: Iterable[tuple[str, int]] | None, now: float
    ) -> tuple[list[PartitionResult], Change]:
        """Kafka's ElectLeaders. Preferred (0): the first replica leads where it is in the
        ISR and able to lead; unclean (1): a partition without a leader gets the first live
        replica, even out of the ISR. ``partitions`` None: every partition, and only those
        that changed are reported (as Kafka does); named ones are each answered, those that
        need nothing with ELECTION_NOT_NEEDED."""
        if election_type not in (PREFERRED, UNCLEAN):
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"unknown election type {election_type}")
        named = partitions is not None
        wanted = (
            list(partitions)
            if partitions is not None
            else [(t.name, i) for t in self.topics.values() for i in range(len(t.partitions))]
        )
        updates: dict[bytes, dict[int, PartitionState]] = {}
        results = []
        for name, index in wanted:
            found = self._find_partition(name, index)
            if isinstance(found, PartitionResult):
                results.append(found)
                continue
            topic_id, state = found
            if election_type == PREFERRED:
                new, error = self._preferred(state, now)
            else:
                new, error = self._unclean(state)
            if new is not None:
                updates.setdefault(topic_id, {})[index] = new
            if named or new is not None:
                results.append(PartitionResult(name, index, *error))
        return results, self._partition_change(updates)

    def _preferred(
        self, state: PartitionState, now: float
    ) -> tuple[PartitionState | None, tuple[ErrorCode, str | None]]:
        preferred = state.replicas[0]
        if state.leader == preferred:
            return None, (ErrorCode.ELECTION_NOT_NEEDED, f"broker {preferred} leads already")
        if preferred not in state.isr or not self.can_take_leadership(preferred, now):
            why = "not in the ISR" if preferred not in state.isr else "not able to lead now"
            return None, (
                ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                f"the preferred replica {preferred} is {why}",
            )
        new = replace(
            state,
            leader=preferred,
            leader_epoch=state.leader_epoch + 1,
            partition_epoch=state.partition_epoch + 1,
        )
        return new, (ErrorCode.NONE, None)

    def _unclean(
        self, state: PartitionState
    ) -> tuple[PartitionState | None, tuple[ErrorCode, str | None]]:
        if state.leader != NO_LEADER:
            return None, (ErrorCode.ELECTION_NOT_NEEDED, f"broker {state.leader} leads")
        ineligible = self.fenced | self.shutting_down
        live = [b for b in state.replicas if b in self.brokers and b not in ineligible]
        if not live:
            return None, (ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "no replica is alive")
        new = replace(
            state,
            leader=live[0],
            leader_epoch=state.leader_epoch + 1,
            isr=(live[0],),
            partition_epoch=state.partition_epoch + 1,
        )
        return new, (ErrorCode.NONE, None)

    def _find_partition(
        self, name: str, index: int
    ) -> tuple[bytes, PartitionState] | PartitionResult:
        topic_id = self.topic_ids.get(name)
        topic = self.topics.get(topic_id) if topic_id is not None else None
        if topic_id is None or topic is None or not 0 <= index < len(topic.partitions):
            return PartitionResult(
                name,
                index,
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"no partition {index} of topic {name!r}",
            )
        return topic_id, topic.partitions[index]

    # Reassignments (KIP-455) ------------------------------------------------------------

    def reassign(
        self, reassignments: Iterable[tuple[str, int, tuple[int, ...] | None]]
    ) -> tuple[list[PartitionResult], Change]:
        """Kafka's AlterPartitionReassignments: each partition moves towards its target
        (None: back to its original replicas, cancelling the reassignment in progress).
        The replicas become the target then the replicas to remove; the new ones catch up
        as followers, and once the whole target is in the ISR ``complete_reassignments``
        drops the others. A target that names an unknown broker, a broker twice or none is
        refused whole (INVALID_REPLICA_ASSIGNMENT), as is a cancel with nothing to cancel."""
        updates: dict[bytes, dict[int, PartitionState]] = {}
        results = []
        for name, index, target in reassignments:
            found = self._find_partition(name, index)
            if isinstance(found, PartitionResult):
                results.append(found)
                continue
            topic_id, state = found
            state = updates.get(topic_id, {}).get(index, state)
            try:
                new = self._reassigned(state, target)
            except KafkaError as error:
                results.append(PartitionResult(name, index, error.code, str(error)))
                continue
            if new is not None:
                updates.setdefault(topic_id, {})[index] = new
            results.append(PartitionResult(name, index, ErrorCode.NONE, None))
        return results, self._partition_change(updates)

    def _reassigned(
        self, state: PartitionState, target: tuple[int, ...] | None
    ) -> PartitionState | None:
        if target is None:
            if not state.reassigning:
                raise KafkaError(
                    ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "no reassignment is in progress"
                )
            target = state.original
        if not target:
            raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "the replica list is empty")
        if len(set(target)) != len(target):
            raise KafkaError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"replicas {list(target)} name a broker twice"
            )
        unknown = sorted(b for b in target if b not in self.brokers)
        if unknown:
            raise KafkaError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"replicas {list(target)} name brokers that are not registered: {unknown}",
            )
        original = state.original
        if target == state.replicas and not state.reassigning:
            return None
        removing = tuple(b for b in original if b not in target)
        replicas = target + removing
        # A cancel (or a new target) may drop replicas that were being added: they leave the
        # ISR, and lead no more.
        isr = tuple(b for b in state.isr if b in replicas)
        leader, leader_epoch = state.leader, state.leader_epoch
        if leader != NO_LEADER and leader not in replicas:
            leader = self._able_leader(replicas, isr)
            leader_epoch += 1
        moving = replace(
            state,
            replicas=replicas,
            leader=leader,
            leader_epoch=leader_epoch,
            isr=isr,
            adding=tuple(b for b in target if b not in original),
            removing=removing,
            partition_epoch=state.partition_epoch + 1,
        )
        finished = self._finished(moving)
        # One write, one epoch: the znode's version stays partition_epoch - 1.
        return (
            moving
            if finished is None
            else replace(finished, partition_epoch=moving.partition_epoch)
        )

    def _able_leader(self, replicas: Sequence[int], isr: Collection[int]) -> int:
        """The first of ``replicas`` in ``isr`` that is neither fenced nor shutting down."""
        ineligible = self.fenced | self.shutting_down
        return next((b for b in replicas if b in isr and b not in ineligible), NO_LEADER)

    def complete_reassignments(self, limit: int = 500) -> Change | None:
        """Up to ``limit`` reassignments whose whole target is in the ISR, finished, or
        None when there are none: the replicas become the target, the removed ones leave
        the ISR, and a leader outside the target hands over to the first target replica in
        the ISR."""
        updates: dict[bytes, dict[int, PartitionState]] = {}
        found = 0
        for topic_id, topic in self.topics.items():
            for index, state in enumerate(topic.partitions):
                if state.reassigning and (new := self._finished(state)) is not None:
                    updates.setdefault(topic_id, {})[index] = new
                    found += 1
                    if found == limit:
                        return self._partition_change(updates)
        return self._partition_change(updates) if updates else None

    def _finished(self, state: PartitionState) -> PartitionState | None:
        target = state.target
        if not set(target) <= set(state.isr):
            return None
        leader, leader_epoch = state.leader, state.leader_epoch
        if leader not in target:
            leader = self._able_leader(target, state.isr)
            leader_epoch += 1
        return replace(
            state,
            replicas=target,
            leader=leader,
            leader_epoch=leader_epoch,
            isr=tuple(b for b in state.isr if b in target),
            partition_epoch=state.partition_epoch + 1,
            adding=(),
            removing=(),
        )

    def alter_partition(
        self, broker_id: int, broker_epoch: int, changes: Iterable[IsrChange]
    ) -> tuple[list[IsrResult], Change]:
        """ISR changes asked by a partition leader, each checked against the state it was
        based on; the ones that pass are committed together."""
        if self.broker_error(broker_id, broker_epoch) is not ErrorCode.NONE:
            raise KafkaError(
                ErrorCode.STALE_BROKER_EPOCH,
                f"broker {broker_id} epoch {broker_epoch} is not current",
            )
        updates: dict[bytes, dict[int, PartitionState]] = {}
        results = []
        for change in changes:
            topic = self.topics.get(change.topic_id)
            if topic is None:
                results.append(
                    IsrResult(change.topic_id, change.partition, ErrorCode.UNKNOWN_TOPIC_ID, None)
                )
                continue
            if not 0 <= change.partition < len(topic.partitions):
                results.append(
                    IsrResult(
                        change.topic_id,
                        change.partition,
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        None,
                    )
                )
                continue
            pending = updates.get(change.topic_id, {})
            state = pending.get(change.partition, topic.partitions[change.partition])
            error = self._isr_error(broker_id, state, change)
            if error is ErrorCode.NONE and change.new_isr != state.isr:
                state = replace(
                    state, isr=change.new_isr, partition_epoch=state.partition_epoch + 1
                )
                updates.setdefault(change.topic_id, {})[change.partition] = state
            results.append(IsrResult(change.topic_id, change.partition, error, state))
        return results, self._partition_change(updates)

    def _isr_error(self, broker_id: int, state: PartitionState, change: IsrChange) -> ErrorCode:
        if state.leader != broker_id:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if change.leader_epoch != state.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        if change.partition_epoch != state.partition_epoch:
            return ErrorCode.INVALID_UPDATE_VERSION
        if len(set(change.new_isr)) != len(change.new_isr):
            return ErrorCode.INVALID_REQUEST
        if broker_id not in change.new_isr or any(
            b not in state.replicas
            or b in self.fenced
            or (b in self.shutting_down and b not in state.isr)
            for b in change.new_isr
        ):
            return ErrorCode.INELIGIBLE_REPLICA
        return ErrorCode.NONE

    def _partition_change(self, updates: Mapping[bytes, Mapping[int, PartitionState]]) -> Change:
        ops: list[StoreOp] = []
        topics = []
        elections = unclean = isr_changes = 0
        for topic_id, changed in updates.items():
            topic = self.topics[topic_id]
            partitions = list(topic.partitions)
            for index, new in sorted(changed.items()):
                old = partitions[index]
                path, data = self.paths.partition(topic_id, index), layout.encode_partition(new)
                # A partition's znode exists once its state has changed; each change is one
                # setData, so its version is always partition_epoch - 1.
                if old.partition_epoch == 0:
                    ops.append(Create(path, data))
                else:
                    ops.append(SetData(path, data, version=old.partition_epoch - 1))
                if new.leader not in (old.leader, NO_LEADER):
                    elections += 1
                    unclean += new.leader not in old.isr
                isr_changes += new.isr != old.isr
                partitions[index] = new
            topics.append(replace(topic, partitions=tuple(partitions)))
        return Change(
            tuple(ops),
            Delta({t: frozenset(c) for t, c in updates.items()}),
            topics=tuple(topics),
            leader_elections=elections,
            unclean_elections=unclean,
            isr_changes=isr_changes,
        )

    # Topics -----------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        manual: Sequence[tuple[int, Sequence[int]]] = (),
    ) -> Change:
        """``manual``: Kafka's manual replica assignment, (partition, replicas) pairs, with
        ``partitions`` and ``replication_factor`` DEFAULT. Its partitions start in the
        initial state, a fenced or shutting-down replica included: the caller then
        ``elect``s, which moves them out of the ISRs and leaderships (Kafka creates them
        without), so a new partition is led by its first replica that is live."""
        error = topic_name_error(name)
        if error is not None:
            raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, error)
        if name in self.topic_ids:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if manual:
            assignment = self._manual_topic_assignment(partitions, replication_factor, manual)
            _validate_configs(configs, self._defaults())
            return self._created_topic(name, configs, assignment)
        if partitions == DEFAULT:
            partitions = self.default_partitions
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise KafkaError(
                ErrorCode.INVALID_PARTITIONS,
                f"{partitions} partitions: a topic has 1 to {MAX_PARTITIONS}",
            )
        if replication_factor == DEFAULT:
            replication_factor = self.default_replication_factor
        brokers = self.unfenced()
        if not 1 <= replication_factor <= len(brokers):
            raise KafkaError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {replication_factor}: "
                f"{len(brokers)} brokers are registered and unfenced",
            )
        _validate_configs(configs, self._defaults())
        count = len(brokers)
        assignment = assign_replicas(
            brokers,
            partitions,
            replication_factor,
            start_index=self.rng.randrange(count),
            replica_shift=self.rng.randrange(count),
        )
        return self._created_topic(name, configs, assignment)

    def _created_topic(
        self, name: str, configs: Mapping[str, str], assignment: Sequence[tuple[int, ...]]
    ) -> Change:
        topic_id = self._new_topic_id()
        topic = Topic(
            name, topic_id, dict(configs), tuple(PartitionState.initial(r) for r in assignment)
        )
        data = layout.encode_topic(name, configs, list(assignment))
        return Change(
            (Create(self.paths.topic(topic_id), data),),
            Delta({topic_id: None}),
            topics=(topic,),
        )

    def _manual_topic_assignment(
        self,
        partitions: int,
        replication_factor: int,
        manual: Sequence[tuple[int, Sequence[int]]],
    ) -> list[tuple[int, ...]]:
        """A CreateTopics manual assignment checked as Kafka's ReplicationControlManager
        checks it, in its order and words; the replicas by partition."""
        for count, what in (
            (replication_factor, "replication factor"),
            (partitions, "numPartitions"),
        ):
            if count != DEFAULT:
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST,
                    f"A manual partition assignment was specified, but {what} was not set to -1.",
                )
        by_partition: dict[int, tuple[int, ...]] = {}
        expected: int | None = None
        for index, replicas in manual:
            if index in by_partition:
                raise KafkaError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"Found multiple manual partition assignments for partition {index}",
                )
            by_partition[index] = self._manual_replicas(index, replicas, expected)
            expected = len(replicas)
        if sorted(by_partition) != list(range(len(by_partition))):
            raise KafkaError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "partitions should be a consecutive 0-based integer sequence",
            )
        if len(by_partition) > MAX_PARTITIONS:
            raise KafkaError(
                ErrorCode.INVALID_PARTITIONS,
                f"{len(by_partition)} partitions: a topic has 1 to {MAX_PARTITIONS}",
            )
        return [by_partition[index] for index in range(len(by_partition))]

    def _manual_replicas(
        self, partition: int, replicas: Sequence[int], expected: int | None
    ) -> tuple[int, ...]:
        """One partition's replicas from a manual assignment, checked as Kafka's
        validateManualPartitionAssignment does (every broker registered, none twice, as many
        as ``expected``), and with a replica that may lead (INVALID_REPLICA_ASSIGNMENT)."""

        def refuse(why: str) -> KafkaError:
            return KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, why)

        if not replicas:
            raise refuse("The manual partition assignment includes an empty replica list.")
        previous = None
        for broker in sorted(replicas):
            if broker not in self.brokers:
                raise refuse(
                    f"The manual partition assignment includes broker {broker}, but no such "
                    "broker is registered."
                )
            if broker == previous:
                raise refuse(
                    f"The manual partition assignment includes the broker {broker} more than once."
                )
            previous = broker
        if expected is not None and len(replicas) != expected:
            raise refuse(
                f"The manual partition assignment includes a partition with {len(replicas)} "
                "replica(s), but this is not consistent with previous partitions, which have "
                f"{expected} replica(s)."
            )
        eligible = self.unfenced()
        if not any(broker in eligible for broker in replicas):
            raise refuse(
                "All brokers specified in the manual partition assignment for partition "
                f"{partition} are fenced or in controlled shutdown."
            )
        return tuple(replicas)

    def _new_topic_id(self) -> bytes:
        while True:  # 122 random bits: a second round is all but impossible
            topic_id = uuid.UUID(bytes=self.rng.randbytes(16), version=4).bytes
            # A deleted topic's id stays in use until its remote records are gone.
            if topic_id not in self.topics and topic_id not in self.remote_topics:
                return topic_id

    def find_topic(self, name: str = "", topic_id: bytes = b"") -> Topic:
        """By id when one is given, else by name."""
        if topic_id:
            topic = self.topics.get(topic_id)
            if topic is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_ID, "no topic has this id")
            return topic
        known = self.topic_ids.get(name)
        if known is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        return self.topics[known]

    def delete_topic(self, name: str = "", topic_id: bytes = b"") -> Change:
        """Its remote log records, if any, stay, marked deleted, until a tiering service has
        deleted its remote objects (``finish_remote_deletion``)."""
        topic = self.find_topic(name, topic_id)
        ops: list[StoreOp] = [
            Delete(self.paths.partition(topic.topic_id, index), version=state.partition_epoch - 1)
            for index, state in enumerate(topic.partitions)
            if state.partition_epoch > 0
        ]
        ops.append(Delete(self.paths.topic(topic.topic_id)))
        remote_topics: dict[bytes, RemoteTopic | None] = {}
        if topic.topic_id in self.remote_topics:
            marked = RemoteTopic(topic.name, deleted=True)
            ops.append(
                SetData(self.paths.remote_topic(topic.topic_id), layout.encode_remote_topic(marked))
            )
            remote_topics[topic.topic_id] = marked
        return Change(
            tuple(ops), Delta(deleted_topic_ids=(topic.topic_id,)), remote_topics=remote_topics
        )

    def create_partitions(
        self, name: str, count: int, manual: Sequence[Sequence[int]] | None = None
    ) -> Change:
        """``manual``: Kafka's manual assignment of the new partitions, one replica list
        each, checked as ``create_topic`` checks its own, the topic's replica count expected
        (the caller ``elect``s after, likewise)."""
        topic = self.find_topic(name)
        current = len(topic.partitions)
        if count <= current:
            raise KafkaError(
                ErrorCode.INVALID_PARTITIONS,
                f"topic {name!r} has {current} partitions; the new count must be more",
            )
        if count > MAX_PARTITIONS:
            raise KafkaError(
                ErrorCode.INVALID_PARTITIONS, f"{count} partitions: the limit is {MAX_PARTITIONS}"
            )
        replication_factor = topic.replication_factor
        if manual is not None:
            added = self._manual_partitions(current, count - current, replication_factor, manual)
        else:
            added = self._placed_partitions(topic, count - current, replication_factor)
        partitions = topic.partitions + tuple(PartitionState.initial(r) for r in added)
        new = replace(topic, partitions=partitions)
        data = layout.encode_topic(name, topic.configs, [p.replicas for p in partitions])
        return Change(
            (SetData(self.paths.topic(topic.topic_id), data),),
            Delta({topic.topic_id: frozenset(range(current, count))}),
            topics=(new,),
        )

    def _placed_partitions(
        self, topic: Topic, additional: int, replication_factor: int
    ) -> list[tuple[int, ...]]:
        brokers = self.unfenced()
        if replication_factor > len(brokers):
            raise KafkaError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {replication_factor}: "
                f"{len(brokers)} brokers are registered and unfenced",
            )
        # Kafka continues from partition 0's leader, so new leaders follow the old ones.
        first_leader = topic.partitions[0].replicas[0]
        start = next((i for i, b in enumerate(brokers) if b >= first_leader), 0)
        return assign_replicas(
            brokers,
            additional,
            replication_factor,
            start_index=start,
            replica_shift=start,
            first_partition=len(topic.partitions),
        )

    def _manual_partitions(
        self,
        current: int,
        additional: int,
        replication_factor: int,
        manual: Sequence[Sequence[int]],
    ) -> list[tuple[int, ...]]:
        """A CreatePartitions manual assignment checked as Kafka checks it."""
        if len(manual) != additional:
            raise KafkaError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"Attempted to add {additional} additional partition(s), but only "
                f"{len(manual)} assignment(s) were specified.",
            )
        return [
            self._manual_replicas(current + i, replicas, replication_factor)
            for i, replicas in enumerate(manual)
        ]

    def alter_configs(
        self,
        name: str,
        set_configs: Mapping[str, str],
        delete: Iterable[str],
        *,
        replace_all: bool = False,
        lists: ListChanges = (NO_CHANGES, NO_CHANGES),
    ) -> Change:
        """Incremental: set some overrides, delete others (a missing one is no error), append
        to or subtract from list ones (``lists``); or, with `replace_all` (Kafka's legacy
        AlterConfigs), make `set_configs` the only ones."""
        topic = self.find_topic(name)
        configs = _altered(topic.configs, set_configs, delete, replace_all, lists)
        self._check_topic(topic, configs, self._defaults())
        if configs == topic.configs:
            return Change(())
        data = layout.encode_topic(name, configs, [p.replicas for p in topic.partitions])
        return Change(
            (SetData(self.paths.topic(topic.topic_id), data),),
            Delta({topic.topic_id: frozenset()}),
            topics=(replace(topic, configs=configs),),
        )

    def alter_log_defaults(
        self,
        set_configs: Mapping[str, str],
        delete: Iterable[str],
        *,
        replace_all: bool = False,
        lists: ListChanges = (NO_CHANGES, NO_CHANGES),
    ) -> Change:
        """The cluster-wide defaults of topic configs (Kafka's dynamic broker defaults, which
        brokers name ``default_name(name)``: ``log.<name>`` mostly), altered as
        ``alter_configs`` alters a topic's overrides. INVALID_CONFIG when a topic's
        overrides would not combine with the result, which brokers could then not apply."""
        defaults = _altered(self.log_defaults, set_configs, delete, replace_all, lists)
        for name in (*set_configs, *lists[0], *lists[1]):  # each value set, as it is set
            raw = defaults[name]
            if name in TOPIC_ONLY_CONFIGS:
                raise KafkaError(
                    ErrorCode.INVALID_CONFIG, f"{name} is a topic config with no broker default"
                )
            try:
                LogConfig.from_properties({name: raw})
            except InvalidConfigError as exc:
                raise KafkaError(
                    ErrorCode.INVALID_CONFIG,
                    f"Invalid value {raw!r} for configuration {default_name(name)}: {exc}",
                ) from exc
        config = _validate_configs(defaults)
        for topic in self.topics.values():
            try:
                self._check_topic(topic, topic.configs, config)
            except KafkaError as exc:
                raise KafkaError(exc.code, f"topic {topic.name!r}: {exc}") from exc
        if defaults == self.log_defaults:
            return Change(())
        op = SetData(self.paths.log_defaults, layout.encode_log_defaults(defaults))
        return Change((op,), log_defaults=defaults)

    def alter_broker_configs(
        self,
        broker_id: int,
        set_configs: Mapping[str, str],
        delete: Iterable[str],
        *,
        replace_all: bool = False,
    ) -> Change:
        """One broker's dynamic configs (Kafka's per-broker dynamic configs: the replication
        throttle rates and its defaults of topic configs), altered as ``alter_configs``
        alters a topic's overrides. Any id >= 0, registered or not: Kafka keeps a broker's
        configs apart from its registration; CLUSTER_DEFAULT (-1): the cluster-wide rates.
        INVALID_CONFIG for a config that is not a supported dynamic broker one, a bad value,
        or defaults some topic's overrides would not combine with."""
        if broker_id < CLUSTER_DEFAULT:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"broker id {broker_id} is negative")
        current = self.broker_configs.get(broker_id, {})
        configs = _altered(current, set_configs, delete, replace_all)
        try:
            validate_broker_configs(set_configs)
        except InvalidBrokerConfigError as exc:
            raise KafkaError(ErrorCode.INVALID_CONFIG, str(exc)) from exc
        overrides = log_overrides(configs)
        if overrides:
            config = _validate_configs({**self.log_defaults, **overrides})
            for topic in self.topics.values():
                try:
                    self._check_topic(topic, topic.configs, config)
                except KafkaError as exc:
                    raise KafkaError(exc.code, f"topic {topic.name!r}: {exc}") from exc
        if configs == current:
            return Change(())
        path = self.paths.broker_config(broker_id)
        data = layout.encode_broker_configs(configs)
        op: StoreOp
        if not configs:
            op = Delete(path)
        elif current:
            op = SetData(path, data)
        else:
            op = Create(path, data)
        return Change((op,), broker_configs={broker_id: configs})

    # Security metadata -----------------------------------------------------------------

    def alter_scram_credentials(
        self, upsertions: Sequence[ScramUpsertion], deletions: Sequence[tuple[str, int]]
    ) -> tuple[list[tuple[str, KafkaError | None]], list[Change]]:
        """Kafka's AlterUserScramCredentials as its controller plans it: deletions
        (user, mechanism) read first, then upsertions; each user and mechanism at most once
        per request (DUPLICATE_RESOURCE, and none of that user's changes) — one request may
        set both mechanisms of a user, as `kafka-configs --add-config
        'SCRAM-SHA-256=[...],SCRAM-SHA-512=[...]'` does. A user's first refusal is the one
        it gets. Returns one result per user named, in the order first named, and the
        changes to commit in order."""
        refused: dict[str, KafkaError] = {}
        actions: dict[str, dict[ScramMechanism, ScramCredential | None]] = {}  # None: delete
        named: dict[str, None] = {}

        def refuse(user: str, refusal: KafkaError) -> None:
            refused[user] = refusal
            actions.pop(user, None)

        def twice(user: str, mechanism: ScramMechanism) -> KafkaError:
            return KafkaError(
                ErrorCode.DUPLICATE_RESOURCE,
                f"user {user!r}: its {mechanism.mechanism_name} credential cannot be altered "
                "twice in one request",
            )

        for user, number in deletions:
            named.setdefault(user)
            if user in refused:
                continue
            try:
                mechanism = _scram_mechanism(user, number)
                if mechanism in actions.get(user, {}):
                    raise twice(user, mechanism)
                if mechanism not in self.scram.get(user, {}):
                    raise KafkaError(
                        ErrorCode.RESOURCE_NOT_FOUND,
                        f"user {user!r} has no {mechanism.mechanism_name} credential to delete",
                    )
            except KafkaError as refusal:
                refuse(user, refusal)
                continue
            actions.setdefault(user, {})[mechanism] = None
        for upsertion in upsertions:
            user = upsertion.user
            named.setdefault(user)
            if user in refused:
                continue
            try:
                credential = upsertion.credential()
                if credential.mechanism in actions.get(user, {}):
                    raise twice(user, credential.mechanism)
            except KafkaError as refusal:
                refuse(user, refusal)
                continue
            actions.setdefault(user, {})[credential.mechanism] = credential
        wanted: dict[str, dict[ScramMechanism, ScramCredential]] = {}
        for user, planned in actions.items():
            held = dict(self.scram.get(user, {}))
            for mechanism, replacement in planned.items():
                if replacement is None:
                    del held[mechanism]
                else:
                    held[mechanism] = replacement
            wanted[user] = held
        rewrites = self._rewrites(
            wanted, self.scram, self.paths.scram_user, lambda c: layout.encode_scram(c.values())
        )
        changes = [
            Change(r.ops, Delta(scram_credentials=r.last), scram=r.values, containers=r.containers)
            for r in rewrites
        ]
        return [(user, refused.get(user)) for user in named], changes

    def create_acls(
        self, bindings: Sequence[AclBinding]
    ) -> tuple[list[KafkaError | None], list[Change]]:
        """Kafka's CreateAcls: each binding checked on its own (INVALID_REQUEST, as
        ``validate_binding`` says), one that exists already a success that writes nothing.
        Also POLICY_VIOLATION for one that would grow its resource's znode past
        ACL_ZNODE_BYTES, which the store could not hold. Returns one result per binding and
        the changes to commit in order: one znode write per resource pattern touched."""
        results: list[KafkaError | None] = []
        wanted: dict[AclResource, set[AclBinding]] = {}
        sizes: dict[AclResource, int] = {}
        for binding in bindings:
            try:
                validate_binding(binding)
            except KafkaError as exc:
                results.append(exc)
                continue
            resource = _acl_resource(binding)
            if resource not in wanted:
                current = self.acls.get(resource, frozenset())
                wanted[resource] = set(current)
                sizes[resource] = len(layout.encode_acls(current))
            if binding not in wanted[resource]:
                size = sizes[resource] + layout.acl_entry_bytes(binding)
                if size > layout.ACL_ZNODE_BYTES:
                    results.append(
                        KafkaError(
                            ErrorCode.POLICY_VIOLATION,
                            f"{resource.resource_type.name} {resource.pattern_type.name} "
                            f"{resource.name!r} has as many ACLs as one znode holds "
                            f"({layout.ACL_ZNODE_BYTES} bytes)",
                        )
                    )
                    continue
                wanted[resource].add(binding)
                sizes[resource] = size
            results.append(None)
        return results, self._acl_changes(wanted)

    def delete_acls(
        self, filters: Sequence[AclBindingFilter]
    ) -> tuple[list[tuple[KafkaError | None, list[AclBinding]]], list[Change]]:
        """Kafka's DeleteAcls: per filter, INVALID_REQUEST for one ``validate_filter``
        refuses, else every stored binding it matches (sorted), deleted. A binding two
        filters match is listed by both and deleted once."""
        results: list[tuple[KafkaError | None, list[AclBinding]]] = []
        removed: set[AclBinding] = set()
        for acl_filter in filters:
            try:
                validate_filter(acl_filter)
            except KafkaError as exc:
                results.append((exc, []))
                continue
            matched = sorted(
                binding
                for bindings in self.acls.values()
                for binding in bindings
                if acl_filter.matches(binding)
            )
            removed.update(matched)
            results.append((None, matched))
        wanted: dict[AclResource, set[AclBinding]] = {}
        for binding in removed:
            resource = _acl_resource(binding)
            wanted.setdefault(resource, set(self.acls[resource])).discard(binding)
        return results, self._acl_changes(wanted)

    def _acl_changes(self, wanted: Mapping[AclResource, set[AclBinding]]) -> list[Change]:
        """The changes that make each resource's ACLs those ``wanted``."""
        rewrites = self._rewrites(
            {r: frozenset(b) for r, b in wanted.items()},
            self.acls,
            self.paths.acl_resource,
            layout.encode_acls,
        )
        return [
            Change(r.ops, Delta(acls=r.last), acls=r.values, containers=r.containers)
            for r in rewrites
        ]

    def alter_client_quotas(
        self, alterations: Sequence[QuotaAlteration]
    ) -> tuple[list[KafkaError | None], list[Change]]:
        """Kafka's AlterClientQuotas: each alteration checked on its own (INVALID_REQUEST,
        as ``QuotaEntity`` and ``validate_alteration`` say, or for an entity an earlier
        alteration of the request named); removing a key that is not set does nothing.
        Returns one result per alteration and the changes to commit in order: one znode
        write per entity whose quotas change."""
        results: list[KafkaError | None] = []
        named: set[QuotaEntity] = set()
        wanted: dict[QuotaEntity, dict[str, float]] = {}
        for components, ops in alterations:
            try:
                entity = QuotaEntity(tuple(components))
                if entity in named:
                    raise KafkaError(
                        ErrorCode.INVALID_REQUEST, f"Ignoring duplicate entity {entity}"
                    )
                named.add(entity)
                changes = validate_alteration(entity, ops)
            except KafkaError as exc:
                results.append(exc)
                continue
            values = dict(self.client_quotas.get(entity, {}))
            for key, value in changes.items():
                if value is None:
                    values.pop(key, None)
                else:
                    values[key] = value
            wanted[entity] = values
            results.append(None)
        rewrites = self._rewrites(
            wanted, self.client_quotas, self.paths.client_quota, layout.encode_client_quotas
        )
        return results, [
            Change(
                r.ops, Delta(client_quotas=r.last), client_quotas=r.values, containers=r.containers
            )
            for r in rewrites
        ]

    def _rewrites(
        self,
        wanted: Mapping[K, V],
        stored: Mapping[K, V],
        path: Callable[[K], str],
        encode: Callable[[V], bytes],
    ) -> list[Rewrite[K, V]]:
        """The transactions, in order, that make each key's znode (``path``) hold its
        ``wanted`` value where that differs from the ``stored`` one; an empty value deletes
        the znode. A Create is preceded by the containers it needs that do not exist yet.
        Each holds at most STORE_OPS_LIMIT ops and TRANSACTION_BYTES."""
        ops: list[StoreOp] = []
        keys: dict[str, K] = {}
        made: set[str] = set()
        for key, value in wanted.items():
            if value == stored.get(key) or (not value and key not in stored):
                continue  # unchanged
            where = path(key)
            keys[where] = key
            if not value:
                ops.append(Delete(where))
            elif key in stored:
                ops.append(SetData(where, encode(value)))
            else:
                for parent in self.paths.containers(where):
                    if parent not in self.containers and parent not in made:
                        made.add(parent)
                        ops.append(Create(parent, b""))
                ops.append(Create(where, encode(value)))
        chunks: list[list[StoreOp]] = []
        size = 0
        for op in ops:
            cost = len(op.path) + (0 if isinstance(op, Delete) else len(op.data))
            if not chunks or len(chunks[-1]) >= STORE_OPS_LIMIT or size + cost > TRANSACTION_BYTES:
                chunks.append([])
                size = 0
            chunks[-1].append(op)
            size += cost
        return [
            Rewrite(
                tuple(chunk),
                i == len(chunks) - 1,
                {keys[op.path]: wanted[keys[op.path]] for op in chunk if op.path in keys},
                tuple(op.path for op in chunk if op.path in made),
            )
            for i, chunk in enumerate(chunks)
        ]

    def _defaults(self) -> LogConfig:
        """What a topic without overrides gets, as far as this controller knows."""
        return LogConfig.from_properties(self.log_defaults)

    def _in_force(self, configs: Mapping[str, str], name: str) -> bool:
        """A boolean config of a topic with the overrides ``configs``: its override, else the
        cluster-wide default, read alone (``flag``)."""
        return flag(configs if name in configs else self.log_defaults, name)

    def _check_topic(self, topic: Topic, configs: Mapping[str, str], defaults: LogConfig) -> None:
        """Whether ``topic`` may have the overrides ``configs`` over ``defaults`` (either may
        be new): valid together, and, as in Kafka 3.9 (KIP-950), remote storage in force now
        turned off only with its remote data deleted; INVALID_CONFIG otherwise."""
        config = _validate_configs(configs, defaults)
        if (
            self._in_force(topic.configs, "remote.storage.enable")
            and not config.remote_storage_enable
            and not config.remote_log_delete_on_disable
        ):
            raise KafkaError(ErrorCode.INVALID_CONFIG, KIP_950_MESSAGE)

    # Producer ids -----------------------------------------------------------------------

    def allocate_producer_ids(
        self, broker_id: int, broker_epoch: int
    ) -> tuple[ProducerIdBlock, Change]:
        """The next PRODUCER_ID_BLOCK_SIZE producer ids, for a current broker (Kafka KIP-730).
        Blocks follow each other from id 0, so none overlaps another as long as each
        commits before the next is planned. Raises STALE_BROKER_EPOCH or
        BROKER_ID_NOT_REGISTERED as a heartbeat answers, and UNKNOWN_SERVER_ERROR, as
        Kafka does, once no whole block is left below 2**63."""
        error = self.broker_error(broker_id, broker_epoch)
        if error is not ErrorCode.NONE:
            raise KafkaError(
                error, f"broker {broker_id} epoch {broker_epoch}: {error.name}, register again"
            )
        block = ProducerIdBlock(self.next_producer_id, PRODUCER_ID_BLOCK_SIZE)
        if block.end > layout.PRODUCER_ID_LIMIT:
            raise KafkaError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"producer ids exhausted: the next block would end past 2**63 - 1 "
                f"(next id {block.first})",
            )
        op = SetData(self.paths.producer_ids, layout.encode_next_producer_id(block.end))
        return block, Change((op,), next_producer_id=block.end)

    # Remote log metadata (KIP-405) ------------------------------------------------------

    def remote_unloaded(self, keys: Iterable[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
        """The partitions among ``keys`` (topic id, partition) whose records must be read
        from the store before ``remote_partition`` can answer: those of a live topic that has
        records and not loaded yet. The others need no read (no topic, no such partition, or
        a topic without records)."""
        unloaded = set()
        for topic_id, index in keys:
            topic = self.topics.get(topic_id)
            if (
                topic is not None
                and 0 <= index < len(topic.partitions)
                and topic_id in self.remote_topics
                and index not in self.remote_partitions.get(topic_id, {})
            ):
                unloaded.add((topic_id, index))
        return sorted(unloaded)

    def remote_loaded(self, topic_id: bytes, index: int, records: RemotePartition) -> None:
        """Records read from the store by a caller that holds the write lock (no commit
        could change them meanwhile)."""
        assert topic_id in self.topics and topic_id in self.remote_topics, topic_id.hex()
        self.remote_partitions.setdefault(topic_id, {})[index] = records

    def remote_partition(self, topic_id: bytes, index: int) -> RemotePartition:
        """The records of a partition of a live topic; raises UNKNOWN_TOPIC_ID (also for a
        deleted topic) or UNKNOWN_TOPIC_OR_PARTITION. ``remote_unloaded`` says which must be
        loaded first."""
        topic = self.topics.get(topic_id)
        if topic is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_ID, "no topic has this id")
        if not 0 <= index < len(topic.partitions):
            raise KafkaError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic.name!r} has no partition {index}",
            )
        if topic_id not in self.remote_topics:
            return NO_RECORDS
        return self.remote_partitions[topic_id][index]

    def update_remote_segment(
        self,
        broker_id: int,
        broker_epoch: int,
        topic_id: bytes,
        index: int,
        leader_epoch: int,
        segment: RemoteSegment,
        now_ms: int,
    ) -> tuple[RemotePartition, Change]:
        """Record a new copy (COPY_STARTED) or move a record on (``REMOTE_MOVES``), for the
        partition's leader in its current leader epoch only: a deposed leader's late copy
        must never become visible. Returns the partition's records after the change; the
        current state repeated, or DELETE_FINISHED of a record already removed (a retry),
        changes nothing. Raises STALE_BROKER_EPOCH,
        BROKER_ID_NOT_REGISTERED, UNKNOWN_TOPIC_ID, UNKNOWN_TOPIC_OR_PARTITION,
        NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, or
        INVALID_REQUEST for a record or a move the rules refuse."""
        error = self.broker_error(broker_id, broker_epoch)
        if error is not ErrorCode.NONE:
            raise KafkaError(
                error, f"broker {broker_id} epoch {broker_epoch}: {error.name}, register again"
            )
        current = self.remote_partition(topic_id, index)
        state = self.topics[topic_id].partitions[index]
        if state.leader != broker_id:
            raise KafkaError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"broker {broker_id} does not lead partition {index} (leader {state.leader})",
            )
        if leader_epoch != state.leader_epoch:
            raise KafkaError(
                ErrorCode.FENCED_LEADER_EPOCH
                if leader_epoch < state.leader_epoch
                else ErrorCode.UNKNOWN_LEADER_EPOCH,
                f"leader epoch {leader_epoch}, the partition's is {state.leader_epoch}",
            )
        if len(segment.segment_id) != 16:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"a segment id is 16 bytes, not {len(segment.segment_id)}",
            )
        old = current.segments.get(segment.segment_id)
        if (old is not None and old.state is segment.state) or (
            old is None and segment.state is RemoteSegmentState.DELETE_FINISHED
        ):
            return current, Change(())  # a retry: done already (or removed already)
        next_offset = current.next_offset
        if old is None:
            new = replace(
                segment, leader_epoch=leader_epoch, broker_id=broker_id, event_time_ms=now_ms
            )
            _check_new_segment(new, next_offset)
        elif segment.state not in REMOTE_MOVES[old.state]:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"segment {layout.uuid_text(old.segment_id)} is {old.state.name}: it cannot "
                f"move to {segment.state.name}",
            )
        elif segment.state is RemoteSegmentState.COPY_FINISHED:
            if old.start_offset < next_offset:
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST,
                    f"start offset {old.start_offset} is below the next offset {next_offset}: "
                    "a finished copy holds it already",
                )
            if segment.size_bytes < 0:
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"size {segment.size_bytes} < 0")
            new = replace(
                old,
                state=segment.state,
                max_timestamp=segment.max_timestamp,
                size_bytes=segment.size_bytes,
                epochs=segment.epochs,
                event_time_ms=now_ms,
            )
            next_offset = old.end_offset + 1
        else:
            new = replace(old, state=segment.state, event_time_ms=now_ms)
        return self._remote_change(topic_id, index, current, old, new, next_offset)

    def _remote_change(
        self,
        topic_id: bytes,
        index: int,
        current: RemotePartition,
        old: RemoteSegment | None,
        new: RemoteSegment,
        next_offset: int,
    ) -> tuple[RemotePartition, Change]:
        """One record created, changed or removed (DELETE_FINISHED), with the partition
        znode's version bumped in the same transaction, checked like a partition state's."""
        segments = dict(current.segments)
        if new.state is RemoteSegmentState.DELETE_FINISHED:
            del segments[new.segment_id]
        else:
            segments[new.segment_id] = new
        records = RemotePartition(current.version + 1, next_offset, segments)
        ops: list[StoreOp] = []
        remote_topics: dict[bytes, RemoteTopic | None] = {}
        if topic_id not in self.remote_topics:
            remote = remote_topics[topic_id] = RemoteTopic(self.topics[topic_id].name)
            ops.append(
                Create(self.paths.remote_topic(topic_id), layout.encode_remote_topic(remote))
            )
        path = self.paths.remote_partition(topic_id, index)
        data = layout.encode_remote_partition(records.version, records.next_offset)
        if current.version == 0:
            ops.append(Create(path, data))
        else:
            ops.append(SetData(path, data, version=current.version - 1))
        path = self.paths.remote_segment(topic_id, index, new.segment_id)
        if old is None:
            ops.append(Create(path, layout.encode_remote_segment(new)))
        elif new.state is RemoteSegmentState.DELETE_FINISHED:
            ops.append(Delete(path))
        else:
            ops.append(SetData(path, layout.encode_remote_segment(new)))
        change = Change(
            tuple(ops),
            remote_topics=remote_topics,
            remote_partitions={(topic_id, index): records},
        )
        return records, change

    def remote_deletions(self) -> list[tuple[bytes, str]]:
        """(topic id, name) of every deleted topic whose remote records are not gone yet."""
        return sorted(
            ((t, remote.name) for t, remote in self.remote_topics.items() if remote.deleted),
            key=lambda item: (item[1], item[0]),
        )

    def deleted_remote_topic(self, topic_id: bytes) -> RemoteTopic:
        """A deleted topic whose remote records may be removed; raises UNKNOWN_TOPIC_ID (no
        records, or removed already) or INVALID_REQUEST (the topic is not deleted)."""
        remote = self.remote_topics.get(topic_id)
        if remote is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_ID, "no remote log records for this id")
        if not remote.deleted:
            raise KafkaError(
                ErrorCode.INVALID_REQUEST,
                f"topic {remote.name!r} is not deleted: its remote records stay",
            )
        return remote

    def finish_remote_deletion(
        self, topic_id: bytes, tree: Mapping[str, Sequence[str]], limit: int = STORE_OPS_LIMIT
    ) -> list[Change]:
        """The transactions that remove a deleted topic's ``remote_log`` subtree, ``tree``
        as read from the store (partition znode name -> its record znode names), to commit
        in order: deepest first, at most ``limit`` ops each, the topic znode last, so a
        deletion cut short leaves a marked topic to finish again. Names are taken as they
        are, so nothing malformed can keep a subtree alive."""
        self.deleted_remote_topic(topic_id)
        top = self.paths.remote_topic(topic_id)
        deletes = [Delete(f"{top}/{p}/{s}") for p, names in sorted(tree.items()) for s in names]
        deletes.extend(Delete(f"{top}/{p}") for p in sorted(tree))
        deletes.append(Delete(top))
        chunks = [tuple(deletes[i : i + limit]) for i in range(0, len(deletes), limit)]
        return [Change(ops) for ops in chunks[:-1]] + [
            Change(chunks[-1], remote_topics={topic_id: None})
        ]

    # Applying a committed change --------------------------------------------------------

    def apply(self, change: Change, now: float) -> None:
        """Make the image what the store now holds. A broker that registered is alive, and
        not shutting down (a new session, most often a new incarnation)."""
        for registration in change.brokers:
            self.brokers[registration.broker_id] = registration
            self.last_seen[registration.broker_id] = now
            self.fenced.discard(registration.broker_id)
            self.shutting_down.discard(registration.broker_id)
        if change.last_broker_epoch is not None:
            self.last_broker_epoch = change.last_broker_epoch
        if change.next_producer_id is not None:
            self.next_producer_id = change.next_producer_id
        if change.log_defaults is not None:
            self.log_defaults = dict(change.log_defaults)
        for broker_id, configs in change.broker_configs.items():
            if configs:
                self.broker_configs[broker_id] = dict(configs)
            else:
                self.broker_configs.pop(broker_id, None)
        self.containers.update(change.containers)
        for user, credentials in change.scram.items():
            if credentials:
                self.scram[user] = dict(credentials)
            else:
                self.scram.pop(user, None)
        for resource, bindings in change.acls.items():
            if bindings:
                self.acls[resource] = bindings
            else:
                self.acls.pop(resource, None)
        for entity, values in change.client_quotas.items():
            if values:
                self.client_quotas[entity] = dict(values)
            else:
                self.client_quotas.pop(entity, None)
        for topic_id in change.delta.deleted_topic_ids:
            self._forget(self.topics.pop(topic_id))
        for topic_id, remote in change.remote_topics.items():
            if remote is None:
                del self.remote_topics[topic_id]
            else:
                self.remote_topics[topic_id] = remote
            if remote is None or remote.deleted:
                # Nothing reads a deleted topic's records again: no need to keep them.
                self.remote_partitions.pop(topic_id, None)
        for (topic_id, index), records in change.remote_partitions.items():
            self.remote_partitions.setdefault(topic_id, {})[index] = records
        for topic in change.topics:
            old = self.topics.get(topic.topic_id)
            if old is not None:
                self._forget(old)
            self.topics[topic.topic_id] = topic
            self.topic_ids[topic.name] = topic.topic_id
            self.partition_count += len(topic.partitions)
            self.offline_count += _offline(topic)

    def _forget(self, topic: Topic) -> None:
        del self.topic_ids[topic.name]
        self.partition_count -= len(topic.partitions)
        self.offline_count -= _offline(topic)


def _scram_mechanism(user: str, number: int) -> ScramMechanism:
    """Kafka's first two checks of a user's change, in its order."""
    if not user:
        raise KafkaError(ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
    try:
        return ScramMechanism(number)
    except ValueError as exc:
        raise KafkaError(
            ErrorCode.UNSUPPORTED_SASL_MECHANISM, f"user {user!r}: unknown SCRAM mechanism {number}"
        ) from exc


def _acl_resource(binding: AclBinding) -> AclResource:
    return AclResource(binding.resource_type, binding.pattern_type, binding.resource_name)


def _offline(topic: Topic) -> int:
    return sum(p.leader == NO_LEADER for p in topic.partitions)


def _check_new_segment(segment: RemoteSegment, next_offset: int) -> None:
    """What a new record must be: a copy just started, of offsets no finished copy holds."""
    why = None
    if segment.state is not RemoteSegmentState.COPY_STARTED:
        why = f"a new record starts in COPY_STARTED, not {segment.state.name}"
    elif not 0 <= segment.base_offset <= segment.start_offset <= segment.end_offset:
        why = (
            f"offsets base {segment.base_offset}, start {segment.start_offset}, end "
            f"{segment.end_offset}: want 0 <= base <= start <= end"
        )
    elif segment.start_offset < next_offset:
        why = (
            f"start offset {segment.start_offset} is below the next offset {next_offset}: "
            "a finished copy holds it already"
        )
    elif segment.size_bytes < 0:
        why = f"size {segment.size_bytes} < 0"
    if why is not None:
        raise KafkaError(
            ErrorCode.INVALID_REQUEST, f"segment {layout.uuid_text(segment.segment_id)}: {why}"
        )


def _altered(
    current: Mapping[str, str],
    set_configs: Mapping[str, str],
    delete: Iterable[str],
    replace_all: bool,
    lists: ListChanges = (NO_CHANGES, NO_CHANGES),
) -> dict[str, str]:
    """``current`` with ``set_configs`` set and ``delete`` removed (a missing one is no
    error); with ``replace_all``, ``set_configs`` alone. ``lists``: the APPENDs and the
    SUBTRACTs of IncrementalAlterConfigs, which become the value they make (``altered_list``)
    set; INVALID_CONFIG, in Kafka's controller's words, for a config that is not a list."""
    delete = set(delete)
    append, subtract = lists
    named = [*set_configs, *delete, *append, *subtract]
    twice = sorted({name for name in named if named.count(name) > 1})
    if twice or (replace_all and (delete or append or subtract)):
        raise KafkaError(
            ErrorCode.INVALID_REQUEST,
            f"more than one operation on: {', '.join(twice)}"
            if twice
            else "a replacement deletes nothing by name",
        )
    configs = {} if replace_all else {k: v for k, v in current.items() if k not in delete}
    configs.update(set_configs)
    for values, is_subtract in ((append, False), (subtract, True)):
        for name, value in values.items():
            if name not in LIST_CONFIGS:
                operation = "SUBTRACT" if is_subtract else "APPEND"
                raise KafkaError(
                    ErrorCode.INVALID_CONFIG,
                    f"Can't {operation} to key {name} because its type is not LIST.",
                )
            configs[name] = altered_list(name, current.get(name), value, subtract=is_subtract)
    return configs


def _validate_configs(configs: Mapping[str, str], base: LogConfig | None = None) -> LogConfig:
    try:
        return LogConfig.from_properties(configs, base)
    except InvalidConfigError as exc:
        raise KafkaError(ErrorCode.INVALID_CONFIG, str(exc)) from exc
