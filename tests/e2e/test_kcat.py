"""kcat (Debian's package, with its bundled librdkafka 2.0.2) producing and consuming from the
shell, every codec, keys and record order checked."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.e2e.broker import BrokerProcess
from tests.e2e.conftest import single_broker

KCAT = shutil.which("kcat")  # `make test` installs Debian's kcat when it is missing


def kcat(*args: str, stdin: str | None = None) -> str:
    assert KCAT is not None, "kcat is not installed: run the suite through `make test`"
    done = subprocess.run([KCAT, *args], input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    with single_broker(tmp_path_factory.mktemp("kcat")) as running:
        yield running


@pytest.mark.timeout(120)
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_kcat_round_trip(broker: BrokerProcess, codec: str) -> None:
    topic = f"kcat-{codec}"
    lines = [f"key-{i}:value {i} {'x' * (i % 50)}" for i in range(500)]
    kcat(
        "-P", "-b", broker.bootstrap, "-t", topic, "-K:", "-z", codec, stdin="\n".join(lines) + "\n"
    )
    out = kcat(
        "-C", "-b", broker.bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%o|%k|%s\n"
    )
    assert out.splitlines() == [f"{i}|{line.replace(':', '|', 1)}" for i, line in enumerate(lines)]


@pytest.mark.timeout(60)
def test_kcat_reads_from_an_offset_and_lists_metadata(broker: BrokerProcess) -> None:
    kcat(
        "-P",
        "-b",
        broker.bootstrap,
        "-t",
        "kcat-offsets",
        stdin="".join(f"m{i}\n" for i in range(20)),
    )
    out = kcat(
        "-C", "-b", broker.bootstrap, "-t", "kcat-offsets", "-o", "15", "-e", "-q", "-f", "%o %s\n"
    )
    assert out.splitlines() == [f"{i} m{i}" for i in range(15, 20)]
    listing = json.loads(kcat("-L", "-J", "-b", broker.bootstrap, "-t", "kcat-offsets"))
    topic = next(t for t in listing["topics"] if t["topic"] == "kcat-offsets")
    assert [p["partition"] for p in topic["partitions"]] == [0]
    host, port = broker.bootstrap.split(":")
    assert listing["brokers"] == [{"id": 0, "name": f"{host}:{port}"}]
