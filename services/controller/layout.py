"""Where the cluster lives in the consensus store, and the bytes of each znode.

Under the root (``/directlog`` by default)::

    cluster_id                  {"cluster_id": "<22 chars>"}            made once
    controller                  ephemeral: {"controller_id", "address", "epoch"}
    controller_epoch            {"epoch": N}; every state write checks its znode version
    broker_epoch                {"last": N}: the last broker epoch handed out
    producer_ids                {"next": N}: the first producer id no block holds yet
    brokers/<id>                {"incarnation_id", "broker_epoch", "listeners", "rack"}
    topics/<topic id>           {"name", "configs", "replicas": [[1, 2, 3], ...]}
    topics/<topic id>/<p>       {"leader", "leader_epoch", "isr", "partition_epoch"}

Topic ids are written as Kafka prints them (URL-safe base64, no padding). A partition has a
state znode only once its state has changed: until then it is in its initial state (first
replica leads, every replica in sync, epochs 0), which the replicas already say. So a topic
of 10,000 partitions is one znode of a few tens of KB, created in one small transaction, and
``partition_epoch > 0`` is exactly "this partition has a state znode".

Everything is JSON: small, readable with any ZooKeeper shell, and tolerant of added keys.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.controller.model import BrokerRegistration, Listener, PartitionState


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
        self.brokers = f"{self.root}/brokers"
        self.topics = f"{self.root}/topics"

    def broker(self, broker_id: int) -> str:
        return f"{self.brokers}/{broker_id}"

    def topic(self, topic_id: bytes) -> str:
        return f"{self.topics}/{uuid_text(topic_id)}"

    def partition(self, topic_id: bytes, partition: int) -> str:
        return f"{self.topic(topic_id)}/{partition}"


def uuid_text(raw: bytes) -> str:
    """Kafka's string form of a Uuid (topic and cluster ids): URL-safe base64 without
    padding, 22 characters."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def topic_id_bytes(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "==")
    if len(raw) != 16:
        raise ValueError(f"not a topic id: {text!r}")
    return raw


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
    return _dump(
        {
            "leader": state.leader,
            "leader_epoch": state.leader_epoch,
            "isr": list(state.isr),
            "partition_epoch": state.partition_epoch,
        }
    )


def decode_partition(replicas: tuple[int, ...], data: bytes) -> PartitionState:
    value = _load(data)
    return PartitionState(
        replicas,
        int(value["leader"]),
        int(value["leader_epoch"]),
        tuple(int(b) for b in value["isr"]),
        int(value["partition_epoch"]),
    )
