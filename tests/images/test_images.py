"""What the images hold: who they run as, their console scripts, the broker's RDMA stack,
the compiled extensions, no compiler and nothing of the build host's secrets; and a broker
container that Kafka clients can talk to."""

from __future__ import annotations

import json
import socket
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.images.conftest import BUILD_TIMEOUT
from tests.images.engine import IMAGES, REPO, SERVICES, Container, docker, image, run
from tests.ports import free_port

# The first test builds the images (session fixture), so every test may take that long.
pytestmark = [pytest.mark.usefixtures("images"), pytest.mark.timeout(BUILD_TIMEOUT + 300)]

UID = "10001"
PIP_FILES = "/etc/pip.conf /etc/xdg/pip/pip.conf /root/.pip/pip.conf /root/.config/pip/pip.conf"
SCRIPTS = {name: f"directlog-{name}" for name in SERVICES}


def image_config(name: str) -> dict[str, Any]:
    inspected = docker("image", "inspect", "--format", "{{json .Config}}", image(name))
    config: dict[str, Any] = json.loads(inspected.stdout)
    return config


@pytest.mark.parametrize("name", IMAGES)
def test_runs_as_fixed_non_root_user(name: str) -> None:
    config = json.loads(
        docker("image", "inspect", "--format", "{{json .Config}}", image(name)).stdout
    )
    assert config["User"] == f"{UID}:{UID}"  # numeric, so runAsNonRoot can check it
    done = run(name, "-c", "id -u; id -g; pwd; stat -c %u .", entrypoint="sh")
    assert done.returncode == 0, done.stderr
    uid, gid, workdir, owner = done.stdout.split()
    assert (uid, gid, owner) == (UID, UID, UID)
    assert workdir == ("/opt/spark/work-dir" if name == "spark" else "/var/lib/directlog")


@pytest.mark.parametrize("name", IMAGES)
def test_labels_and_exposed_ports(name: str) -> None:
    config = json.loads(
        docker("image", "inspect", "--format", "{{json .Config}}", image(name)).stdout
    )
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == f"directlog-{name}"
    assert labels["org.opencontainers.image.version"] == image(name).rpartition(":")[2]
    expected = {
        "broker": {"9092/tcp", "9308/tcp"},
        "controller": {"9190/tcp", "9390/tcp"},
        "consensus": {"2181/tcp", "2888/tcp", "3888/tcp", "7181/tcp"},
        "tiering": {"9408/tcp"},
        "spark": set(),
    }[name]
    assert expected <= set(config.get("ExposedPorts") or {})


@pytest.mark.parametrize("name", SERVICES)
def test_entrypoint_is_the_console_script(name: str) -> None:
    done = run(name, "--help")  # through the image's ENTRYPOINT
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {SCRIPTS[name]}")


def test_spark_image_runs_the_traffic_job() -> None:
    done = run("spark", "python", "-m", "pipelines.traffic.job", "--help")
    assert done.returncode == 0, done.stderr
    assert "--bootstrap" in done.stdout


def test_spark_image_runs_a_local_spark_session() -> None:
    script = (
        "from pyspark.sql import SparkSession\n"
        "import directlog.spark\n"
        "spark = SparkSession.builder.master('local[1]').getOrCreate()\n"
        "print('rows', spark.range(5).count())\n"
        "spark.stop()\n"
    )
    done = docker(
        *("run", "--rm", "--network", "none", "--env", "SPARK_LOCAL_IP=127.0.0.1"),
        *(image("spark"), "python", "-c", script),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows 5" in done.stdout
    layout = run(
        "spark",
        "-c",
        "test -x $SPARK_HOME/bin/spark-submit && ls $SPARK_HOME/jars",
        entrypoint="sh",
    )
    assert layout.returncode == 0, layout.stderr
    assert any(jar.startswith("spark-kubernetes_") for jar in layout.stdout.split())


@pytest.mark.parametrize("name", IMAGES)
def test_admin_cli_on_the_path(name: str) -> None:
    done = run(name, "-c", "command -v directlog", entrypoint="sh")
    assert done.stdout.strip() == "/opt/directlog/bin/directlog", done.stderr
    if (REPO / "directlog" / "admin" / "cli.py").exists():
        done = run(name, "--help", entrypoint="directlog")
        assert done.returncode == 0, done.stderr


def test_broker_image_has_pyverbs() -> None:
    done = run(
        "broker",
        "-c",
        "import pyverbs.device, directlog.rdma.pyverbs_provider; print(pyverbs.device.__file__)",
        entrypoint="python",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("/opt/directlog/lib/python3.11/site-packages/pyverbs/")
    libs = run(
        "broker", "-c", "ls /usr/lib/*/libibverbs.so.1 /usr/lib/*/libibverbs", entrypoint="sh"
    )
    assert libs.returncode == 0, libs.stderr


@pytest.mark.parametrize("name", IMAGES)
def test_c_extensions_import(name: str) -> None:
    done = run(
        name,
        "-c",
        "import directlog.records._scan as s, directlog.rdma._atomics as a;"
        " print(s.__file__, a.__file__)",
        entrypoint="python",
    )
    assert done.returncode == 0, done.stderr
    assert all(path.endswith(".so") for path in done.stdout.split())


@pytest.mark.parametrize("name", IMAGES)
def test_no_compiler_in_runtime_images(name: str) -> None:
    script = (
        "for tool in gcc cc c++ g++ cpp x86_64-linux-gnu-gcc-12 clang; do"
        " command -v $tool; done; ls /usr/include/python3.11/Python.h 2>/dev/null;"
        " dpkg-query -W -f '${Package} ${Status}\\n' gcc-12 python3.11-dev libc6-dev 2>/dev/null"
        " | grep ' installed$'; true"
    )
    done = run(name, "-c", script, entrypoint="sh")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def _host_only_certificates() -> list[str]:
    """One base64 line of each certificate the build host trusts beyond Debian's roots
    (a re-signing proxy's, say): what must not leak into an image from the build secrets."""
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if not bundle.exists():
        return []
    debian = set()
    for crt in Path("/usr/share/ca-certificates").rglob("*.crt"):
        debian.update(_pem_bodies(crt.read_text(errors="replace")))
    return [body[64:128] for body in _pem_bodies(bundle.read_text()) if body not in debian]


def _pem_bodies(text: str) -> list[str]:
    parts = text.split("-----BEGIN CERTIFICATE-----")[1:]
    return ["".join(p.split("-----END CERTIFICATE-----")[0].split()) for p in parts]


@pytest.mark.parametrize("name", IMAGES)
def test_build_secrets_not_kept(name: str) -> None:
    config = json.loads(
        docker("image", "inspect", "--format", "{{json .Config}}", image(name)).stdout
    )
    assert not [e for e in config["Env"] if e.startswith(("PIP_", "REQUESTS_CA", "SSL_CERT"))]
    pip_files = "/etc/pip.conf /etc/xdg/pip/pip.conf /root/.pip/pip.conf /root/.config/pip/pip.conf"
    done = run(
        name, "-c", f"ls -d /run/secrets/* {pip_files} 2>/dev/null; true", entrypoint="sh", user="0"
    )
    assert done.stdout.strip() == ""
    # Certificates are written across lines of 64 characters, so a 64-character line is found
    # by a fixed-string search wherever a bundle copy of it landed.
    lines = _host_only_certificates()
    if lines:
        patterns = [arg for line in lines for arg in ("-e", line)]
        done = run(
            name,
            *(
                "-rlIF",
                *patterns,
                "/",
                "--exclude-dir=proc",
                "--exclude-dir=sys",
                "--exclude-dir=dev",
            ),
            entrypoint="grep",
            user="0",
        )
        assert done.returncode == 1, f"host certificates found in {done.stdout}{done.stderr}"


def _api_versions(host: str, port: int) -> tuple[int, set[int]]:
    """A Kafka ApiVersions v0 request, by hand: the answer's error code and API keys."""
    client_id = b"directlog-images-test"
    body = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _read(s, 4))[0]
        answer = _read(s, size)
    correlation, error, count = struct.unpack_from(">ihi", answer)
    assert correlation == 7
    keys = {struct.unpack_from(">hhh", answer, 10 + 6 * i)[0] for i in range(count)}
    return error, keys


def _read(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, "connection closed mid-answer"
        data += chunk
    return data


@pytest.fixture
def config_dir() -> Iterator[Path]:
    """Files the containers read (uid 10001): a directory anyone may read, removed after."""
    with tempfile.TemporaryDirectory(prefix="directlog-images-") as name:
        path = Path(name)
        path.chmod(0o755)
        yield path


def test_broker_container_answers_api_versions(config_dir: Path) -> None:
    """consensus, controller and broker, each from its image, on 127.0.0.1 free ports."""
    client, peer, consensus_metrics = free_port(), free_port(), free_port()
    controller_port, controller_metrics = free_port(), free_port()
    kafka, broker_metrics = free_port(), free_port()
    ensemble = {
        "members": {
            1: {
                "client": f"127.0.0.1:{client}",
                "peer": f"127.0.0.1:{peer}",
                "metrics": f"127.0.0.1:{consensus_metrics}",
            }
        },
        "data_dir": "/var/lib/directlog/consensus",
    }
    (config_dir / "ensemble.yaml").write_text(yaml.safe_dump(ensemble))
    (config_dir / "ensemble.yaml").chmod(0o644)
    volume = [(config_dir, "/etc/directlog")]
    with (
        Container(
            "consensus",
            ["--id", "1", "--config", "/etc/directlog/ensemble.yaml"],
            ready="ready",
            volumes=volume,
        ),
        Container(
            "controller",
            [
                *("--host", "127.0.0.1", "--port", str(controller_port)),
                *("--metrics-port", str(controller_metrics), "--consensus", f"127.0.0.1:{client}"),
            ],
            ready="ready",
        ),
        Container(
            "broker",
            [
                *("--node-id", "0", "--host", "127.0.0.1", "--port", str(kafka)),
                *("--metrics-port", str(broker_metrics)),
                *("--controllers", f"127.0.0.1:{controller_port}"),
            ],
            ready="Directlog broker 0 ready",
        ) as broker,
    ):
        error, keys = _api_versions("127.0.0.1", kafka)
        assert error == 0
        assert {0, 1, 3, 18} <= keys  # Produce, Fetch, Metadata, ApiVersions
        name = broker.name
    gone = docker("ps", "--all", "--quiet", "--filter", f"name={name}").stdout
    assert gone.strip() == ""
