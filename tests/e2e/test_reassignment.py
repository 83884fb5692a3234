"""Partition reassignment and leader election through Kafka's own admin APIs (KIP-455,
KIP-460), as kafka-python's admin client sends them: replicas move to a target and the old
ones go once the target caught up, with every record still readable; a reassignment that
cannot finish is listed with its adding and removing replicas and can be cancelled; bad
targets are refused with Kafka's error codes and change nothing; a preferred election moves
leadership back."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import TopicPartition
    from kafka import errors as kafka_errors
    from kafka.admin import KafkaAdminClient, NewTopic

pytestmark = pytest.mark.timeout(240)

TOPIC = "moving"


def partition_state(admin: KafkaAdminClient, index: int) -> dict[str, Any]:
    """replicas, isr and leader of the partition, as Metadata answers them."""
    (topic,) = admin.describe_topics([TOPIC])
    found = next(p for p in topic["partitions"] if p["partition_index"] == index)
    return {
        "replicas": found["replica_nodes"],
        "isr": found["isr_nodes"],
        "leader": found["leader_id"],
    }


def ongoing(admin: KafkaAdminClient) -> dict[int, tuple[list[int], list[int], list[int]]]:
    listed = admin.list_partition_reassignments()
    return {
        tp.partition: (r["replicas"], r["adding_replicas"], r["removing_replicas"])
        for tp, r in listed.items()
    }


def test_replicas_move_and_every_record_stays_readable(tmp_path: Path, clients) -> None:
    with Cluster(tmp_path, brokers=3) as cluster:
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
        admin.create_topics([NewTopic(TOPIC, 2, 2)])
        wait_for(lambda: len(partition_state(admin, 0)["isr"]) == 2, 30, "topic ready")
        producer = clients.producer(cluster.bootstrap, {"acks": "all"})
        for i in range(300):
            producer.produce(TOPIC, b"%d" % i, partition=i % 2)
        assert producer.flush(30) == 0

        before = partition_state(admin, 0)["replicas"]
        (newcomer,) = {0, 1, 2} - set(before)
        target = [newcomer, before[1]]  # the leader of the two moves away
        result = admin.alter_partition_reassignments({TopicPartition(TOPIC, 0): target})
        assert result == {TopicPartition(TOPIC, 0): None}
        wait_for(lambda: ongoing(admin) == {}, 60, "the reassignment to finish")
        after = partition_state(admin, 0)
        assert after["replicas"] == target
        assert sorted(after["isr"]) == sorted(target)
        assert after["leader"] in target
        gone = cluster.brokers[before[0]].data_dir / f"{TOPIC}-0"
        wait_for(lambda: not gone.exists(), 30, "the moved-away replica deleted")
        assert (cluster.brokers[newcomer].data_dir / f"{TOPIC}-0").is_dir()

        # Every record readable, from the new replicas
        consumer = clients.consumer(cluster.bootstrap)
        clients.assign_from(consumer, TOPIC, [0, 1])
        values = sorted(int(m.value()) for m in clients.consume(consumer, 300))
        assert values == list(range(300))

        # Preferred election: the first replica leads again after losing leadership.
        preferred = target[0]
        cluster.brokers[preferred].restart()
        cluster.wait_live({0, 1, 2})
        # A client whose metadata is from while the broker was away (fenced as it stopped)
        # may route to a controller id it no longer knows: a fresh one, as after any restart.
        admin.close()
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
        wait_for(
            lambda: sorted(partition_state(admin, 0)["isr"]) == sorted(target), 60, "caught up"
        )
        if partition_state(admin, 0)["leader"] != preferred:
            admin.elect_leaders(0, {TOPIC: [0]})
        assert partition_state(admin, 0)["leader"] == preferred
        # Nothing to do: ELECTION_NOT_NEEDED, which Kafka's clients take as success.
        response = admin.elect_leaders(0, {TOPIC: [0]}, raise_errors=False)
        codes = [
            p.error_code for r in response.replica_election_results for p in r.partition_result
        ]
        assert codes == [kafka_errors.ElectionNotNeededError.errno]
        admin.close()


def test_a_stuck_reassignment_is_listed_and_cancelled(tmp_path: Path, clients) -> None:
    with Cluster(tmp_path, brokers=3) as cluster:
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
        admin.create_topics([NewTopic(TOPIC, 1, 2)])
        wait_for(lambda: len(partition_state(admin, 0)["isr"]) == 2, 30, "topic ready")
        before = partition_state(admin, 0)
        (offline,) = {0, 1, 2} - set(before["replicas"])
        cluster.brokers[offline].stop()  # registered, but cannot catch up
        admin.close()
        # fenced, so Metadata no longer sends clients to it
        cluster.wait_live({0, 1, 2} - {offline})
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
        target = [before["replicas"][0], offline]
        assert admin.alter_partition_reassignments({TopicPartition(TOPIC, 0): target}) == {
            TopicPartition(TOPIC, 0): None
        }
        removed = before["replicas"][1]
        assert ongoing(admin) == {0: ([*target, removed], [offline], [removed])}
        assert partition_state(admin, 0)["replicas"] == [*target, removed]

        result = admin.alter_partition_reassignments({TopicPartition(TOPIC, 0): None})
        assert result == {TopicPartition(TOPIC, 0): None}
        assert ongoing(admin) == {}
        after = partition_state(admin, 0)
        assert (after["replicas"], sorted(after["isr"])) == (
            before["replicas"],
            sorted(before["isr"]),
        )
        # Nothing left to cancel
        again = admin.alter_partition_reassignments({TopicPartition(TOPIC, 0): None})
        assert again == {TopicPartition(TOPIC, 0): kafka_errors.NoReassignmentInProgressError}
        admin.close()


def test_bad_targets_are_refused_and_change_nothing(tmp_path: Path) -> None:
    with Cluster(tmp_path, brokers=2) as cluster:
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
        admin.create_topics([NewTopic(TOPIC, 1, 2)])
        wait_for(lambda: len(partition_state(admin, 0)["isr"]) == 2, 30, "topic ready")
        before = partition_state(admin, 0)
        tp = TopicPartition(TOPIC, 0)
        invalid = kafka_errors.InvalidReplicationAssignmentError
        assert admin.alter_partition_reassignments({tp: [0, 99]}) == {tp: invalid}
        assert admin.alter_partition_reassignments({tp: [1, 1]}) == {tp: invalid}
        missing = TopicPartition(TOPIC, 7)
        assert admin.alter_partition_reassignments({missing: [0, 1]}) == {
            missing: kafka_errors.UnknownTopicOrPartitionError
        }
        assert partition_state(admin, 0) == before
        assert ongoing(admin) == {}
        admin.close()
