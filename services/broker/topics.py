"""Topics of a single-broker cluster: names, ids, partition counts and configs.

Kept in `<data dir>/topics.json`, rewritten atomically on every change, until the controller
(on the consensus service) owns cluster metadata. Each topic's log config is the broker's
defaults with the topic's own overrides on top, under Kafka's names.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from directlog.durable_files import write_atomically
from directlog.protocol.errors import ErrorCode, KafkaError
from directlog.topics import TopicPartition, topic_name_error
from services.broker.storage import LogConfig
from services.broker.storage.log_manager import LogManager

MAX_PARTITIONS = 10_000


@dataclass(slots=True)
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)


class TopicRegistry:
    def __init__(self, path: Path, defaults: LogConfig) -> None:
        self.path = path
        self.defaults = defaults
        self.topics: dict[str, Topic] = {}
        self._by_id: dict[uuid.UUID, Topic] = {}
        if path.exists():
            for entry in json.loads(path.read_text(encoding="utf-8")):
                self._add(
                    Topic(
                        entry["name"],
                        uuid.UUID(entry["id"]),
                        entry["partitions"],
                        dict(entry["configs"]),
                    )
                )

    def _add(self, topic: Topic) -> None:
        self.topics[topic.name] = topic
        self._by_id[topic.topic_id] = topic

    def config_for(self, name: str) -> LogConfig:
        topic = self.topics.get(name)
        return LogConfig.from_properties(topic.configs if topic else {}, self.defaults)

    def get(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        return self._by_id.get(topic_id)

    def validate_new(self, name: str, partitions: int, configs: Mapping[str, str]) -> LogConfig:
        """Check a topic could be created; raises KafkaError with the code to answer."""
        problem = topic_name_error(name)
        if problem is not None:
            raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if name in self.topics:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise KafkaError(
                ErrorCode.INVALID_PARTITIONS,
                f"{partitions} partitions; between 1 and {MAX_PARTITIONS} allowed",
            )
        return LogConfig.from_properties(configs, self.defaults)

    def create(
        self, name: str, partitions: int, configs: Mapping[str, str], logs: LogManager
    ) -> Topic:
        config = self.validate_new(name, partitions, configs)
        topic = Topic(name, uuid.uuid4(), partitions, dict(configs))
        for index in range(partitions):
            logs.create(TopicPartition(name, index), config)
        self._add(topic)
        self._save()
        return topic

    def delete(self, name: str, logs: LogManager) -> Topic:
        topic = self.topics.pop(name, None)
        if topic is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        del self._by_id[topic.topic_id]
        self._save()
        logs.delete(*(TopicPartition(name, index) for index in range(topic.partitions)))
        return topic

    def check_partition_increase(self, name: str, count: int) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        if count <= topic.partitions:
            raise KafkaError(
                ErrorCode.INVALID_PARTITIONS,
                f"topic {name!r} has {topic.partitions} partitions; {count} is not more",
            )
        if count > MAX_PARTITIONS:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, f"at most {MAX_PARTITIONS} partitions")
        return topic

    def add_partitions(self, name: str, count: int, logs: LogManager) -> None:
        topic = self.check_partition_increase(name, count)
        config = self.config_for(name)
        for index in range(topic.partitions, count):
            logs.create(TopicPartition(name, index), config)
        topic.partitions = count
        self._save()

    def set_configs(self, name: str, configs: dict[str, str], logs: LogManager) -> None:
        """Replace a topic's overrides (already validated) and apply them to its logs."""
        topic = self.topics[name]
        topic.configs = configs
        self._save()
        config = self.config_for(name)
        for index in range(topic.partitions):
            log = logs.get(TopicPartition(name, index))
            if log is not None:
                log.config = config

    def _save(self) -> None:
        entries = [
            {
                "name": t.name,
                "id": str(t.topic_id),
                "partitions": t.partitions,
                "configs": t.configs,
            }
            for t in sorted(self.topics.values(), key=lambda t: t.name)
        ]
        write_atomically(self.path, json.dumps(entries, indent=1).encode())
