"""The shipped alert rules in a real Prometheus (tests/monitoring/prometheus.py) scraping a
real three-broker cluster under the documented job names: quiet while the cluster is
healthy; a broker killed with SIGKILL fires DirectlogBrokerDown for it,
DirectlogBrokersNotLive and DirectlogUnderReplicatedPartitions for the topic (and not the
under-min-ISR or offline alerts: two of three replicas are left); restarted, every alert
clears.

The rules are the shipped files with one change: every alert's `for:` (minutes in
production, which test_rules.py checks) is rewritten to FOR_IN_TEST in the test's copy, so
an alert fires a few evaluations after its condition holds instead of minutes later.
Expressions, labels and annotations are the shipped ones."""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from services.monitor import JOB_BROKER, JOB_CONSENSUS, JOB_CONTROLLER, RULES_DIR
from tests.e2e.cluster import Cluster, wait_for
from tests.monitoring.prometheus import Prometheus

FOR_IN_TEST = "3s"
TIMEOUT = 90.0
TOPIC = "alerted"
PARTITIONS = 3
DOWN = "DirectlogBrokerDown"
NOT_LIVE = "DirectlogBrokersNotLive"
UNDER_REPLICATED = "DirectlogUnderReplicatedPartitions"
NOT_EXPECTED = ("DirectlogUnderMinIsrPartitions", "DirectlogOfflinePartitions")


def rules_for_test(directory: Path) -> list[Path]:
    """Copies of the shipped rule files whose alerts wait FOR_IN_TEST."""
    directory.mkdir(parents=True, exist_ok=True)
    copies = []
    for path in sorted(RULES_DIR.glob("*.yaml")):
        rules = yaml.safe_load(path.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rule["for"] = FOR_IN_TEST
        copy = directory / path.name
        copy.write_text(yaml.safe_dump(rules, sort_keys=False))
        copies.append(copy)
    return copies


def address(metrics_url: str) -> str:
    """The "host:port" of a metrics URL: the target, and its `instance` label."""
    return metrics_url.split("//", 1)[1].split("/", 1)[0]


def active(prometheus: Prometheus, state: str | None = None) -> set[tuple[str, str]]:
    """(alert name, its instance or topic label) of every alert pending or firing, or only
    of those in `state`."""
    return {
        (a["labels"]["alertname"], a["labels"].get("instance") or a["labels"].get("topic", ""))
        for a in prometheus.alerts()
        if state is None or a["state"] == state
    }


def wait_alerts(
    prometheus: Prometheus, condition: Callable[[], bool], what: str, timeout: float = TIMEOUT
) -> None:
    try:
        wait_for(condition, timeout, what)
    except AssertionError as error:
        raise AssertionError(f"{error}; alerts now: {prometheus.alerts()}") from None


def in_sync(cluster: Cluster) -> bool:
    topics = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10).topics
    partitions = topics[TOPIC].partitions if TOPIC in topics else {}
    return len(partitions) == PARTITIONS and all(
        p.leader >= 0 and sorted(p.isrs) == sorted(p.replicas) == [0, 1, 2]
        for p in partitions.values()
    )


def evaluated_after(prometheus: Prometheus, moment: float) -> bool:
    """Whether every rule group was last evaluated after `moment` (a time.time())."""
    groups = prometheus.api("rules")["groups"]
    return len(groups) == len(list(RULES_DIR.glob("*.yaml"))) and all(
        unix_time(g["lastEvaluation"]) > moment for g in groups
    )


def unix_time(rfc3339: str) -> float:
    """Prometheus' times: UTC, "2024-05-01T10:00:00.123456789Z" (fraction optional)."""
    found = re.fullmatch(r"(.+?)(\.\d+)?Z", rfc3339)
    assert found, rfc3339
    seconds = datetime.datetime.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S")
    return seconds.replace(tzinfo=datetime.UTC).timestamp() + float(found.group(2) or 0)


@pytest.mark.timeout(300)
def test_a_killed_broker_fires_broker_down_and_under_replicated_then_they_clear(
    tmp_path: Path,
) -> None:
    rule_files = rules_for_test(tmp_path / "rules")
    with Cluster(tmp_path / "cluster", brokers=3) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        topic = NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})
        admin.create_topics([topic])[TOPIC].result(TIMEOUT)
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        for i in range(30):
            producer.produce(TOPIC, b"record %d" % i, partition=i % PARTITIONS)
        assert producer.flush(TIMEOUT) == 0
        wait_for(lambda: in_sync(cluster), TIMEOUT, f"{TOPIC}'s ISRs complete")

        ensemble = cluster.ensemble
        jobs = {
            JOB_BROKER: [address(b.metrics_url) for b in cluster.brokers.values()],
            JOB_CONTROLLER: [address(c.metrics_url) for c in cluster.controllers],
            JOB_CONSENSUS: [address(ensemble.metrics_url(m)) for m in ensemble.ids],
        }
        with Prometheus(tmp_path / "prometheus", jobs, rule_files) as prometheus:
            prometheus.wait_up(sum(map(len, jobs.values())))
            # Every target scraped: an alert whose condition holds is pending from the next
            # evaluation on.
            scraped = time.time()
            wait_alerts(
                prometheus,
                lambda: evaluated_after(prometheus, scraped) and not active(prometheus),
                "no alert on a healthy cluster",
            )

            victim = cluster.brokers[2]  # not broker 0, which exports kafka_brokers
            instance = address(victim.metrics_url)
            victim.kill()
            expected = {(DOWN, instance), (NOT_LIVE, ""), (UNDER_REPLICATED, TOPIC)}
            wait_alerts(
                prometheus,
                lambda: expected <= active(prometheus, "firing"),
                f"{sorted(expected)} firing",
            )
            assert not {name for name, _ in active(prometheus)} & set(NOT_EXPECTED)

            victim.start()
            cluster.wait_live({0, 1, 2}, TIMEOUT)
            wait_alerts(
                prometheus,
                lambda: not active(prometheus),
                "every alert cleared",
                timeout=2 * TIMEOUT,
            )
