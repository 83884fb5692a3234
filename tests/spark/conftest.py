"""Fixtures of the Spark data source tests: one SparkSession for the package (starting
one takes seconds; its first Python worker, seconds more) with DirectlogSource registered,
and a real broker per module, made as tests/e2e makes them.

Spark's Python workers must run this interpreter (the venv's, where directlog and
confluent-kafka are installed), hence PYSPARK_PYTHON before the session starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from directlog.spark import DirectlogSource
from tests.e2e.broker import BrokerProcess
from tests.e2e.conftest import clients, pytest_runtest_makereport, single_broker, topic_name

# Shared with tests/e2e: confluent-kafka clients, per-test topic names, and the broker's
# stderr tail in the report of a failing test.
__all__ = [
    "clients",
    "module_broker",
    "pytest_runtest_makereport",
    "rdma_broker",
    "spark",
    "topic_name",
]


@pytest.fixture(scope="package")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    previous = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    warehouse: Path = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("directlog-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(DirectlogSource)
    try:
        yield session
    finally:
        session.stop()
        _stop_jvm()
        if previous is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = previous


def _stop_jvm() -> None:
    """End the JVM PySpark started (stopping the session leaves it running until this
    Python exits), so later tests see no child of theirs they did not start."""
    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    process = getattr(gateway, "proc", None)
    if process is not None:
        process.stdin.close()  # the JVM exits when its parent's pipe closes
        process.wait(30)
    SparkContext._gateway = None
    SparkContext._jvm = None


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for a module's tests, which keep to topics of their own (topic_name)."""
    with single_broker(tmp_path_factory.mktemp("spark-cluster")) as process:
        yield process


@pytest.fixture(scope="module")
def rdma_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker serving RDMA produce and consume on the shm provider (this machine's)."""
    settings = {"rdma_produce": True, "rdma_consume": True, "rdma_provider": "shm"}
    with single_broker(tmp_path_factory.mktemp("spark-rdma"), settings) as process:
        yield process
