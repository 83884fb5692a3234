"""The broker's copy of the cluster image: brokers, topics, partition leaders and ISRs.

The active controller streams it (WatchMetadata): a full image, then one delta per committed
change. Everything a broker answers about the cluster — Metadata, DescribeCluster, which
partitions it leads or follows — comes from here; nothing about the cluster is decided on a
broker.

A topic's log settings are layered as Kafka layers them: built-in defaults, the broker's
static ``log_defaults``, the cluster-wide defaults set through the controller (Kafka's
dynamic broker defaults), this broker's own defaults set through the controller (Kafka's
per-broker dynamic configs, ``log.retention.ms`` on broker resource "<id>"), then the
topic's overrides (``config_for``). Every broker's own dynamic configs (those defaults and
the replication throttle rates) come with every update.

The security metadata — SCRAM credentials, ACLs, client quotas — comes whole in a full image
and, in a delta, only when it changed (a kind's ``has_`` flag unset: keep what is here). The
broker's authenticator, authorizer and quota manager read it from here and learn of a change
through ``on_security_change``: each callback is called, after the update is applied, with
the kinds whose content changed (a kind sent again unchanged, as in every full image, is no
change). A callback must not raise: the image has been applied already.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from directlog.broker_config import CLUSTER_DEFAULT, log_overrides
from directlog.rpc import controller_pb2 as pb
from directlog.security import acl_messages
from directlog.security.acl import (
    AclBinding,
)
from directlog.security.client_quotas import QuotaEntity
from directlog.topic_config import InvalidConfigError, LogConfig
from directlog.topics import TopicPartition

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: int
    host: str  # on the inter-broker listener, where replicas fetch from
    port: int
    rack: str | None
    fenced: bool
    listeners: dict[str, tuple[str, int]] = field(default_factory=dict)  # name: host, port

    def address(self, listener: str) -> tuple[str, int] | None:
        """Where a client that came in through `listener` reaches this broker; a broker
        without that listener is not there for it (as Kafka leaves it out of Metadata)."""
        return self.listeners.get(listener) if listener else (self.host, self.port)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int
    adding: tuple[int, ...] = ()  # a reassignment in progress (KIP-455)
    removing: tuple[int, ...] = ()

    @classmethod
    def from_proto(cls, state: pb.PartitionState) -> PartitionInfo:
        return cls(
            state.partition,
            tuple(state.replicas),
            state.leader,
            state.leader_epoch,
            tuple(state.isr),
            state.partition_epoch,
            tuple(state.adding_replicas),
            tuple(state.removing_replicas),
        )


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    configs: dict[str, str]
    partitions: dict[int, PartitionInfo] = field(default_factory=dict)


class SecurityKind(enum.Enum):
    """A kind of security metadata, as ``on_security_change`` callbacks are told."""

    SCRAM_CREDENTIALS = "scram_credentials"
    ACLS = "acls"
    CLIENT_QUOTAS = "client_quotas"


@dataclass(slots=True)
class ImageChange:
    """What one update changed, for the replica manager to act on."""

    full: bool
    partitions: list[tuple[TopicInfo, PartitionInfo]]  # new or changed
    deleted: list[TopicInfo]
    reconfigured: list[TopicInfo]  # every topic when the cluster-wide defaults changed
    created: list[TopicInfo] = field(default_factory=list)  # new here, by topic id


class ClusterImage:
    def __init__(
        self,
        static_defaults: LogConfig,
        inter_broker_listener: str = "PLAINTEXT",
        node_id: int = CLUSTER_DEFAULT,
    ) -> None:
        self.inter_broker_listener = inter_broker_listener
        self.node_id = node_id  # whose per-broker defaults apply here
        self.static_defaults = static_defaults  # the broker's log_defaults setting
        self.dynamic_defaults: dict[str, str] = {}  # the cluster-wide ones, Kafka topic names
        self.broker_defaults: dict[str, str] = {}  # this broker's own, Kafka topic names
        self.log_defaults = static_defaults  # every layer: a topic without overrides
        self.version = -1
        self.cluster_id = ""
        self.controller_id = -1
        self.controller_epoch = -1
        self.brokers: dict[int, BrokerInfo] = {}
        # Every broker's dynamic configs (the replication throttle rates), Kafka names.
        self.broker_configs: dict[int, dict[str, str]] = {}
        self.topics: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        self._scram: dict[str, dict[int, pb.ScramCredential]] = {}  # user, then mechanism
        self._acls: frozenset[AclBinding] = frozenset()
        self._client_quotas: dict[QuotaEntity, dict[str, float]] = {}
        # Called with the kinds of security metadata an update changed (module docstring).
        self.on_security_change: list[Callable[[frozenset[SecurityKind]], None]] = []

    # Applying updates ------------------------------------------------------------------

    def apply(self, update: pb.MetadataUpdate) -> ImageChange | None:
        """Apply one update; None when it comes from a deposed controller (older epoch)."""
        if update.controller_epoch < self.controller_epoch:
            return None
        self.version = update.version
        self.cluster_id = update.cluster_id or self.cluster_id
        self.controller_id = update.controller_id
        self.controller_epoch = update.controller_epoch
        self.brokers = {
            b.broker_id: _broker_info(b, self.inter_broker_listener) for b in update.brokers
        }
        self.broker_configs = {c.broker_id: dict(c.configs) for c in update.broker_configs}
        change = ImageChange(update.full, [], [], [])
        if update.full:
            wanted = {uuid.UUID(bytes=t.topic_id) for t in update.topics}
            change.deleted = [t for t in self.topics.values() if t.topic_id not in wanted]
            for gone in change.deleted:
                self._remove(gone)
        for deleted_id in update.deleted_topic_ids:
            gone_topic = self._by_id.get(uuid.UUID(bytes=deleted_id))
            if gone_topic is not None:
                self._remove(gone_topic)
                change.deleted.append(gone_topic)
        for state in update.topics:
            topic = self._merge_topic(state, change)
            for partition_state in state.partitions:
                info = PartitionInfo.from_proto(partition_state)
                if topic.partitions.get(info.partition) != info or update.full:
                    topic.partitions[info.partition] = info
                    change.partitions.append((topic, info))
        defaults = dict(update.log_defaults)
        own = log_overrides(self.broker_configs.get(self.node_id, {}))
        if defaults != self.dynamic_defaults or own != self.broker_defaults:
            self._set_defaults(defaults, own, change)
        security = self._apply_security(update)
        if security:
            for callback in self.on_security_change:
                callback(security)
        return change

    def _apply_security(self, update: pb.MetadataUpdate) -> frozenset[SecurityKind]:
        """Take the kinds of security metadata the update carries; returns those that
        changed."""
        changed = set()
        if update.has_scram_credentials:
            scram: dict[str, dict[int, pb.ScramCredential]] = {}
            for credential in update.scram_credentials:
                scram.setdefault(credential.user, {})[credential.mechanism] = credential
            if scram != self._scram:
                self._scram = scram
                changed.add(SecurityKind.SCRAM_CREDENTIALS)
        if update.has_acls:
            acls = frozenset(acl_messages.binding(message) for message in update.acls)
            if acls != self._acls:
                self._acls = acls
                changed.add(SecurityKind.ACLS)
        if update.has_client_quotas:
            quotas = {quota_entity(q.entity): dict(q.values) for q in update.client_quotas}
            if quotas != self._client_quotas:
                self._client_quotas = quotas
                changed.add(SecurityKind.CLIENT_QUOTAS)
        return frozenset(changed)

    def _set_defaults(
        self, defaults: dict[str, str], own: dict[str, str], change: ImageChange
    ) -> None:
        """New cluster-wide or per-broker defaults, which every topic sees. The controller
        checked them against every topic but cannot know this broker's static log_defaults:
        defaults that do not combine with those are refused here and the previous ones kept,
        as a Kafka broker keeps its config when a dynamic update fails on it."""
        try:
            self.log_defaults = LogConfig.from_properties({**defaults, **own}, self.static_defaults)
        except InvalidConfigError as exc:
            log.error(
                "dynamic log defaults %s (this broker's: %s) refused, old ones kept: %s",
                defaults,
                own,
                exc,
            )
            return
        self.dynamic_defaults = defaults
        self.broker_defaults = own
        change.reconfigured = list(self.topics.values())

    def _merge_topic(self, state: pb.TopicState, change: ImageChange) -> TopicInfo:
        topic_id = uuid.UUID(bytes=state.topic_id)
        configs = dict(state.configs)
        known = self._by_id.get(topic_id)
        if known is None:
            stale = self.topics.get(state.name)
            if stale is not None:  # deleted and created again under the same name
                self._remove(stale)
                change.deleted.append(stale)
            known = TopicInfo(state.name, topic_id, configs)
            self.topics[state.name] = known
            self._by_id[topic_id] = known
            change.created.append(known)
        elif known.configs != configs:
            known.configs = configs
            change.reconfigured.append(known)
        return known

    def _remove(self, topic: TopicInfo) -> None:
        self.topics.pop(topic.name, None)
        self._by_id.pop(topic.topic_id, None)

    # Questions -------------------------------------------------------------------------

    def topic(self, name: str) -> TopicInfo | None:
        return self.topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._by_id.get(topic_id)

    def partition(self, tp: TopicPartition) -> PartitionInfo | None:
        topic = self.topics.get(tp.topic)
        return topic.partitions.get(tp.partition) if topic is not None else None

    def configs_of_broker(self, broker_id: int) -> dict[str, str]:
        """Broker ``broker_id``'s dynamic configs (empty: none set); CLUSTER_DEFAULT's: the
        cluster-wide ones."""
        return self.broker_configs.get(broker_id, {})

    def configs_in_effect(self, broker_id: int) -> dict[str, str]:
        """Broker ``broker_id``'s dynamic configs over the cluster-wide ones, as its
        replication throttles read them (no copy unless both are set)."""
        default = self.broker_configs.get(CLUSTER_DEFAULT)
        own = self.broker_configs.get(broker_id, {})
        return {**default, **own} if default else own

    def scram_credential(self, user: str, mechanism: int) -> pb.ScramCredential | None:
        """The user's credential for a mechanism (Kafka's ScramMechanism number)."""
        return self._scram.get(user, {}).get(mechanism)

    def scram_users(self) -> dict[str, list[pb.ScramCredential]]:
        """Every user that has a credential, with its credentials by mechanism number
        (DescribeUserScramCredentials)."""
        return {
            user: [credentials[m] for m in sorted(credentials)]
            for user, credentials in self._scram.items()
        }

    @property
    def acls(self) -> frozenset[AclBinding]:
        """Every ACL of the cluster (the value is replaced, never changed, on a change)."""
        return self._acls

    @property
    def client_quotas(self) -> dict[QuotaEntity, dict[str, float]]:
        """Every quota entity's quotas (the value is replaced on a change: do not
        modify it)."""
        return self._client_quotas

    def live_brokers(self) -> list[BrokerInfo]:
        return sorted((b for b in self.brokers.values() if not b.fenced), key=lambda b: b.broker_id)

    def config_for(self, name: str) -> LogConfig:
        topic = self.topics.get(name)
        return LogConfig.from_properties(topic.configs if topic else {}, self.log_defaults)

    def hosted_by(self, broker_id: int) -> Iterator[tuple[TopicInfo, PartitionInfo]]:
        for topic in self.topics.values():
            for info in topic.partitions.values():
                if broker_id in info.replicas:
                    yield topic, info


def quota_entity(components: Iterable[pb.QuotaEntityComponent]) -> QuotaEntity:
    return QuotaEntity(
        tuple((c.entity_type, c.name if c.HasField("name") else None) for c in components)
    )


def _broker_info(broker: pb.Broker, inter_broker_listener: str) -> BrokerInfo:
    listeners = {x.name: (x.host, x.port) for x in broker.listeners}
    host, port = listeners.get(inter_broker_listener, ("", -1))
    return BrokerInfo(broker.broker_id, host, port, broker.rack or None, broker.fenced, listeners)
