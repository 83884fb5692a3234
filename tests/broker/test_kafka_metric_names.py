"""The Kafka-named series of the broker, controller and tiering metrics without processes: what
the request path's counts turn into, the event loop's idle ratios from fake clocks, and
exposition text that Prometheus' own parsers (text and OpenMetrics) read back whatever the
label values hold. tests/e2e/test_kafka_metric_names.py checks the values in a real cluster."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from directlog.protocol.errors import ErrorCode
from directlog.protocol.produce import PartitionResult
from services.broker.fetch_response import PartitionData
from services.broker.metrics import BrokerMetrics, LoopLoad
from services.controller.metrics import ControllerMetrics
from services.tiering.metrics import TieringMetrics

BTM = "kafka_server_brokertopicmetrics_"
ODD = 'a "quoted"\\ name\nwith a newline, é and 日本'  # no topic is named so; a label may be


def parsed(registry: CollectorRegistry) -> list[Sample]:
    """The registry's samples as Prometheus reads them, both formats agreeing (counters'
    _created samples aside)."""

    def read(families: Iterable[Metric]) -> list[Sample]:
        return [s for f in families for s in f.samples if not s.name.endswith("_created")]

    def key(sample: Sample) -> tuple[str, tuple[tuple[str, str], ...], float]:
        return sample.name, tuple(sorted(sample.labels.items())), sample.value

    text = read(text_string_to_metric_families(generate_latest(registry).decode()))
    openmetrics = read(parse_openmetrics(generate_openmetrics(registry).decode()))
    assert sorted(map(key, text)) == sorted(map(key, openmetrics))
    return text


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_produce_and_fetch_counts_become_kafkas_broker_topic_metrics() -> None:
    metrics = BrokerMetrics()
    metrics.produced("orders", records=10, size=700)
    metrics.produce_answered(
        "orders",
        [
            PartitionResult(0, ErrorCode.NONE),
            PartitionResult(1, ErrorCode.NOT_LEADER_OR_FOLLOWER),  # expected: not failed
            PartitionResult(2, ErrorCode.NOT_ENOUGH_REPLICAS),  # failed
            PartitionResult(3, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),  # not counted at all
        ],
    )
    metrics.produce_answered("nothing", [PartitionResult(0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)])
    consumer = PartitionData(0, ErrorCode.NONE, records=b"x" * 300, offsets=4)
    moved = PartitionData(1, ErrorCode.OFFSET_OUT_OF_RANGE)
    broken = PartitionData(2, ErrorCode.UNKNOWN_SERVER_ERROR)
    metrics.fetch_answered("orders", [consumer, moved, broken], follower=False)
    metrics.fetch_answered("orders", [PartitionData(0, 0, records=b"y" * 50, offsets=1)], True)
    samples = parsed(metrics.registry)

    expected = {
        "messagesin": 10,
        "bytesin": 700,
        "totalproducerequests": 3,
        "failedproducerequests": 1,
        "totalfetchrequests": 4,
        "failedfetchrequests": 1,
        "bytesout": 300,  # the consumer's only
    }
    for name, want in expected.items():
        assert value(samples, f"{BTM}{name}_total", topic="orders") == want, name
        assert value(samples, f"{BTM}{name}_total") == want, name  # all topics: no label
    assert value(samples, BTM + "replicationbytesout_total") == 50
    assert value(samples, BTM + "messagesin_total", topic="nothing") is None  # no series
    assert value(samples, "directlog_broker_bytes_out_total", topic="orders") == 350
    assert value(samples, "directlog_broker_records_out_total", topic="orders") == 5
    assert value(samples, "directlog_broker_bytes_in_total", topic="orders") == 700
    assert value(samples, "directlog_broker_records_in_total", topic="orders") == 10


def test_remote_reads_connections_and_replication_in() -> None:
    metrics = BrokerMetrics()
    metrics.remote_fetch_requests.labels("tiered").inc(3)
    metrics.remote_fetch_bytes.labels("tiered").inc(4096)
    metrics.remote_fetch_errors.labels("tiered").inc()
    metrics.replica_pulled_bytes.labels("orders", "0").inc(100)
    metrics.replica_pulled_bytes.labels("orders", "1").inc(20)
    metrics.replication_pushed_bytes.labels("orders").inc(7)
    for _ in range(3):
        metrics.connection_opened()
    metrics.connection_closed()
    samples = parsed(metrics.registry)
    assert value(samples, BTM + "remotefetchrequests_total", topic="tiered") == 4
    assert value(samples, BTM + "remotefetchbytes_total", topic="tiered") == 4096
    assert value(samples, BTM + "remotefetcherrors_total", topic="tiered") == 1
    assert value(samples, BTM + "replicationbytesin_total") == 120
    assert value(samples, BTM + "replicationbytesout_total") == 7
    key = {"listener": "PLAINTEXT", "networkProcessor": "0"}
    prefix = "kafka_server_socket_server_metrics_"
    assert value(samples, prefix + "connection_count", **key) == 2
    assert value(samples, prefix + "connection_creation_total", **key) == 3
    assert value(samples, prefix + "connection_close_total", **key) == 1
    assert value(samples, "directlog_broker_open_connections") == 2


def test_label_values_of_any_characters_give_valid_exposition_text() -> None:
    broker = BrokerMetrics()
    broker.produced(ODD, records=2, size=64)
    broker.remote_fetch_bytes.labels(ODD).inc(5)
    tiering = TieringMetrics()
    tiering.copied_bytes.labels(ODD).inc(9)
    tiering.observe(
        ODD, 0, leader=True, lag_segments=1, lag_bytes=2, remote_segments=3, remote_bytes=4,
        remote_records=5,
    )  # fmt: skip
    samples = parsed(broker.registry)
    assert value(samples, BTM + "bytesin_total", topic=ODD) == 64
    assert value(samples, BTM + "remotefetchbytes_total", topic=ODD) == 5
    samples = parsed(tiering.registry)
    assert value(samples, BTM + "remotecopybytes_total", topic=ODD) == 9
    assert value(samples, BTM + "remotelogmetadatacount", topic=ODD) == 5
    parsed(ControllerMetrics().registry)


def test_kafka_remote_copy_gauges_count_only_partitions_led_here() -> None:
    metrics = TieringMetrics()
    common = {"lag_segments": 2, "lag_bytes": 2000, "remote_segments": 3, "remote_bytes": 900}
    metrics.observe("t", 0, leader=True, remote_records=4, **common)
    metrics.observe("t", 1, leader=True, remote_records=3, **common)
    metrics.observe("t", 2, leader=False, remote_records=3, **common)  # its leader reports it
    metrics.copy_requests.labels("t").inc(2)
    metrics.copied_bytes.labels("t").inc(1800)
    samples = parsed(metrics.registry)
    assert value(samples, BTM + "remotecopylagbytes", topic="t") == 4000
    assert value(samples, BTM + "remotecopylagsegments", topic="t") == 4
    assert value(samples, BTM + "remotelogsizebytes", topic="t") == 1800
    assert value(samples, BTM + "remotelogmetadatacount", topic="t") == 7
    assert value(samples, BTM + "remotelogsizebytes") == 1800  # all topics
    assert value(samples, BTM + "remotecopyrequests_total", topic="t") == 2
    assert value(samples, BTM + "remotecopyerrors_total", topic="t") == 0  # 0, not absent
    # ours keep every hosted partition
    assert value(samples, "directlog_tiering_copy_lag_bytes", topic="t", partition="2") == 2000

    metrics.forget("t", 0)
    metrics.observe("t", 1, leader=False, remote_records=3, **common)  # leadership moved
    samples = parsed(metrics.registry)
    assert value(samples, BTM + "remotecopylagbytes", topic="t") is None
    assert value(samples, BTM + "remotecopylagbytes") == 0


def test_a_controller_that_never_led_reports_zero() -> None:
    samples = parsed(ControllerMetrics().registry)
    for name in (
        "activecontrollercount",
        "offlinepartitionscount",
        "globalpartitioncount",
        "globaltopiccount",
        "preferredreplicaimbalancecount",
    ):
        assert value(samples, f"kafka_controller_kafkacontroller_{name}") == 0, name
    assert value(samples, "kafka_controller_controllerstats_uncleanleaderelections_total") == 0


class FakeClocks:
    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 0.0

    def run(self, seconds: float, busy: float) -> None:
        """`seconds` pass, `busy` of them on a CPU."""
        self.wall += seconds
        self.cpu += busy


def test_loop_idle_ratios_over_a_recent_window_and_since_start() -> None:
    clocks = FakeClocks()
    load = LoopLoad(lambda: clocks.cpu, lambda: clocks.wall)
    clocks.run(60, busy=6)
    now, mean_idle, recent_idle = load.read()
    assert now.cpu == 6
    assert mean_idle == recent_idle == 0.9
    clocks.run(30, busy=30)  # a busy half minute
    _, mean_idle, recent_idle = load.read()
    assert recent_idle == 0.0  # the window starts at the last reading 30 s ago
    assert abs(mean_idle - (1 - 36 / 90)) < 1e-9
    for _ in range(12):  # scraped every 5 s, idle: the busy stretch leaves the window
        clocks.run(5, busy=0)
        _, mean_idle, recent_idle = load.read()
    assert recent_idle == 1.0
    assert abs(mean_idle - (1 - 36 / 150)) < 1e-9
    assert len(load._readings) <= LoopLoad.WINDOW / LoopLoad.STEP + 2
