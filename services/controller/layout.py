"""Where the cluster lives in the consensus store, and the bytes of each znode.

Under the root (``/directlog`` by default)::

    cluster_id                  {"cluster_id": "<22 chars>"}            made once
    controller                  ephemeral: {"controller_id", "address", "epoch"}
    controller_epoch            {"epoch": N}; every state write checks its znode version
    broker_epoch                {"last": N}: the last broker epoch handed out
    producer_ids                {"next": N}: the first producer id no block holds yet
    log_defaults                {"configs": {...}}: the cluster-wide defaults of topic configs
    brokers/<id>                {"incarnation_id", "broker_epoch", "listeners", "rack"}
    broker_configs/<id>         {"configs": {...}}: one broker's dynamic configs, made with
                                 its first one and deleted with its last
    topics/<topic id>           {"name", "configs", "replicas": [[1, 2, 3], ...]}
    topics/<topic id>/<p>       {"leader", "leader_epoch", "isr", "partition_epoch",
                                 "replicas", "adding", "removing"}
    remote_log                  the remote log metadata of tiered storage (KIP-405)
    remote_log/<topic id>       {"name", "deleted"}: made with the topic's first record
    remote_log/<topic id>/<p>   {"version", "next_offset"}: made with the partition's first
    remote_log/<topic id>/<p>/<segment id>   one record: {"state", "base_offset", ...}
    scram/<user>                {"credentials": {"SCRAM-SHA-256": {"salt", "stored_key",
                                 "server_key", "iterations"}, ...}}: one user's SCRAM
                                 credentials, made with the first and deleted with the last
    acls/<type>/<pattern>/<name>   {"acls": [[principal, host, operation, permission], ...]}:
                                 the ACLs of one resource pattern (acls/TOPIC/PREFIXED/orders-),
                                 made with the first and deleted with the last
    client_quotas/<entity>      {"quotas": {"producer_byte_rate": 1048576.0, ...}}: one quota
                                 entity's quotas (client-id=app,user=alice; user=<default>),
                                 made with the first and deleted with the last

Topic ids are written as Kafka prints them (URL-safe base64, no padding). A partition has a
state znode only once its state has changed: until then it is in its initial state (first
replica leads, every replica in sync, epochs 0), which the replicas already say. Its
``replicas``, when there, replace the topic znode's (a reassignment changed them); ``adding``
and ``removing`` are those of a reassignment in progress (KIP-455). So a topic
of 10,000 partitions is one znode of a few tens of KB, created in one small transaction, and
``partition_epoch > 0`` is exactly "this partition has a state znode".

A remote log partition znode's data is set in every transaction that changes one of its
records, ``version`` one more each time, so its znode version is always ``version - 1``.
Records of a deleted topic stay (``"deleted": true``) until its remote objects are gone.
Segment ids are written like topic ids.

``log_defaults`` holds Kafka's dynamic broker defaults of the log settings under their topic
config names (``retention.ms``, which brokers show as ``log.retention.ms``); a topic's
``configs`` are its overrides of them.

``broker_configs/<id>`` holds Kafka's per-broker dynamic configs of broker ``<id>`` (the
replication throttle rates, directlog/broker_config.py), apart from its registration, which
every start of the broker rewrites; an id may have configs before it ever registers.
``broker_configs/-1`` holds the cluster-wide ones (Kafka's default entity), which a broker's
own override.

``scram/<user>`` holds salted keys only (base64), never a password. A user name may hold
any character, ``/`` included, so it is written percent-encoded (``encode_name``), as are
resource names: one znode whatever the name, and an ordinary name reads as it is in a
ZooKeeper shell, which base64 would hide. The security containers (``scram``, ``acls``,
``acls/TOPIC``, ...) are made by the first write under them, in its transaction, so a store
written before they existed needs nothing done to it.

ACLs are kept by resource pattern, as Kafka kept them in ZooKeeper (/kafka-acl/Topic/name):
creating an ACL rewrites only its resource's znode, so 10,000 ACLs spread over resources
are as many small znodes, and a store of them loads with pipelined reads. Resource types,
pattern types, operations and permissions are written by their Kafka names. An entry is a
list rather than an object to keep a busy resource's znode small (``ACL_ZNODE_BYTES``).

A quota entity's znode is named by its components in type order, ``type=name`` joined by
commas, names percent-encoded and a default entity's name ``<default>`` as kafka-configs.sh
prints it (percent-encoding writes a real name ``<default>`` as ``%3Cdefault%3E``).

Everything is JSON: small, readable with any ZooKeeper shell, and tolerant of added keys.
"""

from __future__ import annotations

import base64
import binascii
import json
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from directlog import topics
from directlog.broker_config import validate_broker_configs
from directlog.protocol.errors import KafkaError
from directlog.security.acl import AclBinding, Operation, Permission, validate_binding
from directlog.security.client_quotas import QuotaEntity, validate_alteration
from directlog.security.scram import ScramCredential, ScramMechanism
from directlog.topic_config import LogConfig
from services.controller.model import (
    AclResource,
    BrokerRegistration,
    Listener,
    PartitionState,
    RemotePartition,
    RemoteSegment,
    RemoteSegmentState,
    RemoteTopic,
)


@dataclass(frozen=True, slots=True)
class Create:
    path: str
    data: bytes


@dataclass(frozen=True, slots=True)
class SetData:
    path: str
    data: bytes
    version: int = -1  # -1: any version


@dataclass(frozen=True, slots=True)
class Delete:
    path: str
    version: int = -1


StoreOp = Create | SetData | Delete

PRODUCER_ID_LIMIT = 2**63  # producer ids are int64s from 0 up to, not including, this
# The data of one resource's ACLs znode: ZooKeeper refuses a znode past jute.maxbuffer
# (1 MiB by default), and CreateAcls refuses to grow one past this (some 12,000 ACLs).
ACL_ZNODE_BYTES = 512 * 1024


@dataclass(frozen=True, slots=True)
class ControllerRecord:
    """What the ephemeral ``controller`` znode says about the active controller."""

    controller_id: int
    address: str
    epoch: int


class Layout:
    def __init__(self, root: str) -> None:
        if not root.startswith("/") or (root != "/" and root.endswith("/")):
            raise ValueError(f"root must be an absolute znode path, got {root!r}")
        self.root = root.rstrip("/")
        self.cluster_id = f"{self.root}/cluster_id"
        self.controller = f"{self.root}/controller"
        self.controller_epoch = f"{self.root}/controller_epoch"
        self.broker_epoch = f"{self.root}/broker_epoch"
        self.producer_ids = f"{self.root}/producer_ids"
        self.log_defaults = f"{self.root}/log_defaults"
        self.brokers = f"{self.root}/brokers"
        self.broker_configs = f"{self.root}/broker_configs"
        self.topics = f"{self.root}/topics"
        self.remote_log = f"{self.root}/remote_log"
        self.scram = f"{self.root}/scram"
        self.acls = f"{self.root}/acls"
        self.client_quotas = f"{self.root}/client_quotas"

    def broker(self, broker_id: int) -> str:
        return f"{self.brokers}/{broker_id}"

    def broker_config(self, broker_id: int) -> str:
        return f"{self.broker_configs}/{broker_id}"

    def topic(self, topic_id: bytes) -> str:
        return f"{self.topics}/{uuid_text(topic_id)}"

    def partition(self, topic_id: bytes, partition: int) -> str:
        return f"{self.topic(topic_id)}/{partition}"

    def remote_topic(self, topic_id: bytes) -> str:
        return f"{self.remote_log}/{uuid_text(topic_id)}"

    def remote_partition(self, topic_id: bytes, partition: int) -> str:
        return f"{self.remote_topic(topic_id)}/{partition}"

    def remote_segment(self, topic_id: bytes, partition: int, segment_id: bytes) -> str:
        return f"{self.remote_partition(topic_id, partition)}/{uuid_text(segment_id)}"

    def scram_user(self, user: str) -> str:
        return f"{self.scram}/{encode_name(user)}"

    def acl_resource(self, resource: AclResource) -> str:
        kind, pattern, name = resource
        return f"{self.acls}/{kind.name}/{pattern.name}/{encode_name(name)}"

    def client_quota(self, entity: QuotaEntity) -> str:
        return f"{self.client_quotas}/{encode_quota_entity(entity)}"

    def containers(self, path: str) -> list[str]:
        """The znodes between the root and ``path``, outermost first: those a Create of
        ``path`` needs."""
        assert path.startswith(self.root + "/"), path
        parts = path[len(self.root) + 1 :].split("/")[:-1]
        return [f"{self.root}/{'/'.join(parts[: i + 1])}" for i in range(len(parts))]


def uuid_text(raw: bytes) -> str:
    """Kafka's string form of a Uuid (topic, cluster and remote segment ids) from its 16
    bytes as the store and the protos carry them."""
    return topics.uuid_text(uuid.UUID(bytes=raw))


def uuid_bytes(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "==")
    if len(raw) != 16:
        raise ValueError(f"not a 16-byte id: {text!r}")
    return raw


def encode_name(name: str) -> str:
    """A name (a user, a resource, a quota entity's) as one znode name: its UTF-8
    percent-encoded outside RFC 3986's unreserved characters, and the dots of ``.`` and
    ``..`` too, the two such names ZooKeeper refuses. Empty names are refused before they
    get here."""
    if not name:
        raise ValueError("an empty name has no znode")
    text = urllib.parse.quote(name, safe="")
    return "%2E" * len(text) if text in (".", "..") else text


def decode_name(text: str) -> str:
    """The name ``encode_name`` wrote; refuses any other spelling of it, so a znode
    nothing here can have made stops a takeover."""
    name = urllib.parse.unquote(text, errors="strict")
    if not name or encode_name(name) != text:
        raise ValueError(f"not an encoded name: {text!r}")
    return name


DEFAULT_NAME = "<default>"  # a quota entity's default name, as kafka-configs.sh prints it


def encode_quota_entity(entity: QuotaEntity) -> str:
    return ",".join(
        f"{encode_name(kind)}={DEFAULT_NAME if name is None else encode_name(name)}"
        for kind, name in entity.components
    )


def decode_quota_entity(text: str) -> QuotaEntity:
    """The entity ``encode_quota_entity`` wrote, and only in that spelling."""
    components = []
    for part in text.split(","):
        kind, equals, name = part.partition("=")
        if not equals:
            raise ValueError(f"not a quota entity: {text!r}")
        components.append((decode_name(kind), None if name == DEFAULT_NAME else decode_name(name)))
    try:
        entity = QuotaEntity(tuple(components))
    except KafkaError as exc:
        raise ValueError(f"quota entity {text!r}: {exc}") from exc
    if encode_quota_entity(entity) != text:
        raise ValueError(f"not a quota entity as written here: {text!r}")
    return entity


def _dump(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _load(data: bytes) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("znode data is not a JSON object")
    return value


def encode_cluster_id(cluster_id: str) -> bytes:
    return _dump({"cluster_id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    return str(_load(data)["cluster_id"])


def encode_controller(record: ControllerRecord) -> bytes:
    return _dump(
        {"controller_id": record.controller_id, "address": record.address, "epoch": record.epoch}
    )


def decode_controller(data: bytes) -> ControllerRecord:
    value = _load(data)
    return ControllerRecord(int(value["controller_id"]), str(value["address"]), int(value["epoch"]))


def encode_epoch(epoch: int) -> bytes:
    return _dump({"epoch": epoch})


def decode_epoch(data: bytes) -> int:
    return int(_load(data)["epoch"])


def encode_last_broker_epoch(epoch: int) -> bytes:
    return _dump({"last": epoch})


def decode_last_broker_epoch(data: bytes) -> int:
    return int(_load(data)["last"])


def encode_next_producer_id(producer_id: int) -> bytes:
    return _dump({"next": producer_id})


def decode_next_producer_id(data: bytes) -> int:
    """Refuses a value no allocation can have written (below 0, past 2**63), so a
    damaged znode stops a takeover instead of handing out ids twice."""
    value = int(_load(data)["next"])
    if not 0 <= value <= PRODUCER_ID_LIMIT:
        raise ValueError(f"next producer id {value} is out of range")
    return value


def encode_log_defaults(configs: Mapping[str, str]) -> bytes:
    return _dump({"configs": dict(configs)})


def decode_log_defaults(data: bytes) -> dict[str, str]:
    """Refuses defaults no AlterLogDefaults can have written, so a damaged znode stops a
    takeover instead of reaching every broker."""
    configs = {str(k): str(v) for k, v in _load(data)["configs"].items()}
    LogConfig.from_properties(configs)  # InvalidConfigError is a ValueError
    return configs


def encode_broker_configs(configs: Mapping[str, str]) -> bytes:
    return _dump({"configs": dict(configs)})


def decode_broker_configs(data: bytes) -> dict[str, str]:
    """Refuses configs no AlterBrokerConfigs can have written, so a damaged znode stops a
    takeover instead of reaching every broker."""
    configs = {str(k): str(v) for k, v in _load(data)["configs"].items()}
    return validate_broker_configs(configs)  # InvalidBrokerConfigError is a ValueError


def encode_broker(broker: BrokerRegistration) -> bytes:
    return _dump(
        {
            "incarnation_id": broker.incarnation_id,
            "broker_epoch": broker.broker_epoch,
            "listeners": [
                {"name": item.name, "host": item.host, "port": item.port}
                for item in broker.listeners
            ],
            "rack": broker.rack,
        }
    )


def decode_broker(broker_id: int, data: bytes) -> BrokerRegistration:
    value = _load(data)
    listeners = tuple(
        Listener(str(item["name"]), str(item["host"]), int(item["port"]))
        for item in value["listeners"]
    )
    rack = value.get("rack")
    return BrokerRegistration(
        broker_id,
        str(value["incarnation_id"]),
        int(value["broker_epoch"]),
        listeners,
        None if rack is None else str(rack),
    )


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic znode: what never changes after creation but its configs and length."""

    name: str
    configs: dict[str, str]
    replicas: list[tuple[int, ...]]


def encode_topic(name: str, configs: Mapping[str, str], replicas: list[tuple[int, ...]]) -> bytes:
    return _dump({"name": name, "configs": dict(configs), "replicas": [list(r) for r in replicas]})


def decode_topic(data: bytes) -> TopicRecord:
    value = _load(data)
    return TopicRecord(
        str(value["name"]),
        {str(k): str(v) for k, v in value["configs"].items()},
        [tuple(int(b) for b in r) for r in value["replicas"]],
    )


def encode_partition(state: PartitionState) -> bytes:
    value: dict[str, Any] = {
        "leader": state.leader,
        "leader_epoch": state.leader_epoch,
        "isr": list(state.isr),
        "partition_epoch": state.partition_epoch,
        "replicas": list(state.replicas),
    }
    if state.reassigning:
        value["adding"], value["removing"] = list(state.adding), list(state.removing)
    return _dump(value)


def decode_partition(replicas: tuple[int, ...], data: bytes) -> PartitionState:
    """``replicas``: the topic znode's, in force unless the partition znode has its own."""
    value = _load(data)

    def brokers(key: str, default: tuple[int, ...] = ()) -> tuple[int, ...]:
        return tuple(int(b) for b in value[key]) if key in value else default

    return PartitionState(
        brokers("replicas", replicas),
        int(value["leader"]),
        int(value["leader_epoch"]),
        brokers("isr"),
        int(value["partition_epoch"]),
        brokers("adding"),
        brokers("removing"),
    )


def encode_remote_topic(topic: RemoteTopic) -> bytes:
    return _dump({"name": topic.name, "deleted": topic.deleted})


def decode_remote_topic(data: bytes) -> RemoteTopic:
    value = _load(data)
    deleted = value["deleted"]
    if not isinstance(deleted, bool):
        raise ValueError(f"deleted is not true or false: {deleted!r}")
    return RemoteTopic(str(value["name"]), deleted)


def encode_remote_partition(version: int, next_offset: int) -> bytes:
    return _dump({"version": version, "next_offset": next_offset})


def decode_remote_partition(data: bytes, segments: Iterable[RemoteSegment]) -> RemotePartition:
    """The partition znode with the records under it."""
    value = _load(data)
    version, next_offset = int(value["version"]), int(value["next_offset"])
    if version < 1 or next_offset < -1:
        raise ValueError(f"remote log partition version {version}, next offset {next_offset}")
    return RemotePartition(version, next_offset, {s.segment_id: s for s in segments})


def encode_remote_segment(segment: RemoteSegment) -> bytes:
    """Every field but the segment id, which names the znode."""
    return _dump(
        {
            "state": segment.state.name,
            "base_offset": segment.base_offset,
            "start_offset": segment.start_offset,
            "end_offset": segment.end_offset,
            "max_timestamp": segment.max_timestamp,
            "size_bytes": segment.size_bytes,
            "leader_epoch": segment.leader_epoch,
            "broker_id": segment.broker_id,
            "epochs": [list(pair) for pair in segment.epochs],
            "event_time_ms": segment.event_time_ms,
        }
    )


def decode_remote_segment(segment_id: bytes, data: bytes) -> RemoteSegment:
    value = _load(data)
    epochs = tuple((int(epoch), int(offset)) for epoch, offset in value["epochs"])
    return RemoteSegment(
        segment_id,
        RemoteSegmentState[value["state"]],
        int(value["base_offset"]),
        int(value["start_offset"]),
        int(value["end_offset"]),
        int(value["max_timestamp"]),
        int(value["size_bytes"]),
        int(value["leader_epoch"]),
        int(value["broker_id"]),
        epochs,
        int(value["event_time_ms"]),
    )


def encode_scram(credentials: Iterable[ScramCredential]) -> bytes:
    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return _dump(
        {
            "credentials": {
                c.mechanism.mechanism_name: {
                    "salt": b64(c.salt),
                    "stored_key": b64(c.stored_key),
                    "server_key": b64(c.server_key),
                    "iterations": c.iterations,
                }
                for c in credentials
            }
        }
    )


def decode_scram(data: bytes) -> dict[ScramMechanism, ScramCredential]:
    """Refuses credentials no AlterUserScramCredentials can have written (an unknown
    mechanism, keys of the wrong size, iterations out of bounds, none at all): a
    ScramCredential checks itself."""
    credentials = {}
    for name, value in _load(data)["credentials"].items():
        mechanism = ScramMechanism.from_name(name)
        try:
            credentials[mechanism] = ScramCredential(
                mechanism,
                base64.b64decode(value["salt"], validate=True),
                base64.b64decode(value["stored_key"], validate=True),
                base64.b64decode(value["server_key"], validate=True),
                int(value["iterations"]),
            )
        except binascii.Error as exc:
            raise ValueError(f"{name}: {exc}") from exc
    if not credentials:
        raise ValueError("a scram znode without credentials")
    return credentials


def acl_entry(binding: AclBinding) -> list[str]:
    return [binding.principal, binding.host, binding.operation.name, binding.permission.name]


def acl_entry_bytes(binding: AclBinding) -> int:
    """What ``binding`` adds to its resource's znode data."""
    return len(json.dumps(acl_entry(binding), separators=(",", ":"))) + 1  # and a comma


def encode_acls(bindings: Iterable[AclBinding]) -> bytes:
    return _dump({"acls": sorted(acl_entry(b) for b in bindings)})


def decode_acls(resource: AclResource, data: bytes) -> frozenset[AclBinding]:
    """Refuses ACLs no CreateAcls can have written (``validate_binding``), or none."""
    bindings = set()
    for principal, host, operation, permission in _load(data)["acls"]:
        binding = AclBinding(
            resource.resource_type,
            resource.name,
            resource.pattern_type,
            str(principal),
            str(host),
            Operation[operation],
            Permission[permission],
        )
        try:
            validate_binding(binding)
        except KafkaError as exc:
            raise ValueError(f"{resource}: {exc}") from exc
        bindings.add(binding)
    if not bindings:
        raise ValueError(f"{resource}: an ACL znode without ACLs")
    return frozenset(bindings)


def encode_client_quotas(values: Mapping[str, float]) -> bytes:
    return _dump({"quotas": dict(values)})


def decode_client_quotas(entity: QuotaEntity, data: bytes) -> dict[str, float]:
    """Refuses quotas no AlterClientQuotas can have written (``validate_alteration``), or
    none."""
    values = {str(k): float(v) for k, v in _load(data)["quotas"].items()}
    try:
        validate_alteration(entity, list(values.items()))
    except KafkaError as exc:
        raise ValueError(f"{entity}: {exc}") from exc
    if not values:
        raise ValueError(f"{entity}: a client quota znode without quotas")
    return values
