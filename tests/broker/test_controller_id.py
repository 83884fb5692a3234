"""The controller id Metadata and DescribeCluster give: the answering broker (it hands admin
requests to the controller), unless the brokers listed leave it out — then a listed one, so
a client never routes admin requests to a node id it does not know (kafka-python raises
UnknownBrokerIdError for that)."""

from __future__ import annotations

from types import SimpleNamespace

from services.broker.apis import KafkaApis


def controller_id(node_id: int, listed: list[int]) -> int:
    apis = SimpleNamespace(settings=SimpleNamespace(node_id=node_id))
    live = [(b, "127.0.0.1", 9092 + b, None) for b in listed]
    return KafkaApis._controller_id(apis, live)  # type: ignore[arg-type]


def test_the_answering_broker_when_it_is_listed() -> None:
    assert controller_id(2, [0, 1, 2]) == 2


def test_a_listed_broker_when_the_answering_one_is_not() -> None:
    assert controller_id(2, [0, 1]) == 0  # fenced while it restarts
    assert controller_id(2, [1]) == 1


def test_none_when_no_broker_is_listed() -> None:
    assert controller_id(2, []) == -1
