"""Named listeners (Kafka's listeners and advertised.listeners), as a Kubernetes pod has
them: INTERNAL for replicas and in-cluster clients, EXTERNAL advertised under another name.
A client is answered with every broker's address on the listener it came in through —
Metadata, FindCoordinator, DescribeCluster — and replicas fetch through the inter-broker
listener, whichever listener comes first."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.broker.settings import BrokerSettings
from tests.e2e.cluster import Cluster

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.admin import KafkaAdminClient

pytestmark = pytest.mark.timeout(180)

LISTENERS = [
    # EXTERNAL first: replication must still go through INTERNAL, the named one.
    {"name": "EXTERNAL", "host": "127.0.0.1", "port": 0, "advertised_host": "localhost"},
    {"name": "INTERNAL", "host": "127.0.0.1", "port": 0},
]


def described_brokers(bootstrap: str) -> dict[int, str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    return {b["broker_id"]: f"{b['host']}:{b['port']}" for b in cluster["brokers"]}


def test_clients_see_the_addresses_of_the_listener_they_use(tmp_path: Path, clients) -> None:
    settings = {
        "listeners": LISTENERS,
        "inter_broker_listener": "INTERNAL",
        "listener_security_protocol_map": "EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT",
    }
    with Cluster(tmp_path, brokers=2, broker_settings=settings) as cluster:
        internal = {i: b.listeners["INTERNAL"] for i, b in cluster.brokers.items()}
        external = {i: b.listeners["EXTERNAL"] for i, b in cluster.brokers.items()}
        assert all(a.startswith("127.0.0.1:") for a in internal.values()), internal
        assert all(a.startswith("localhost:") for a in external.values()), external
        assert described_brokers(internal[0]) == internal
        assert described_brokers(external[1]) == external

        # acks=all through EXTERNAL: the follower replicates through INTERNAL
        clients.create_topic(internal[0], "both-ways", partitions=2)
        bootstrap = ",".join(external.values())
        producer = clients.producer(bootstrap, {"acks": "all"})
        for i in range(50):
            producer.produce("both-ways", b"%d" % i, partition=i % 2)
        assert producer.flush(30) == 0
        # a group through EXTERNAL: its coordinator is found at its EXTERNAL address
        consumer = clients.consumer(
            bootstrap, {"group.id": "outside", "auto.offset.reset": "earliest"}
        )
        consumer.subscribe(["both-ways"])
        values = clients.consume(consumer, 50)
        assert sorted(int(m.value()) for m in values) == list(range(50))
        committed = consumer.commit(message=values[-1], asynchronous=False)
        assert committed is not None and committed[0].error is None
        metadata = consumer.list_topics("both-ways", timeout=20)
        assert {f"{b.host}:{b.port}" for b in metadata.brokers.values()} == set(external.values())


def test_listener_settings_that_contradict_are_refused() -> None:
    twice = [{"name": "INTERNAL", "port": 9092}, {"name": "INTERNAL", "port": 9093}]
    with pytest.raises(ValidationError, match="listener names must differ"):
        BrokerSettings(listeners=twice)
    plain = {"listener_security_protocol_map": {"EXTERNAL": "PLAINTEXT", "INTERNAL": "PLAINTEXT"}}
    with pytest.raises(ValidationError, match="inter_broker_listener 'REPLICATION' is not a"):
        BrokerSettings(listeners=LISTENERS, inter_broker_listener="REPLICATION", **plain)
    with pytest.raises(ValidationError, match="listener EXTERNAL has no security protocol"):
        BrokerSettings(listeners=LISTENERS)  # Kafka's rule: a name that is no protocol is mapped
    with pytest.raises(ValidationError, match="String should match pattern"):
        BrokerSettings(listeners=[{"name": "in side", "port": 9092}])
    default = BrokerSettings(port=9999, advertised_host="broker-0.local")
    (only,) = default.kafka_listeners()
    assert (only.name, only.port, only.advertised_host) == ("PLAINTEXT", 9999, "broker-0.local")
    assert default.inter_broker() == "PLAINTEXT"
    assert BrokerSettings(listeners=LISTENERS, **plain).inter_broker() == "EXTERNAL"
