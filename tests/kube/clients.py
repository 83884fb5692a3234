"""Clients on the host that see the cluster as a pod in it does.

Each client process runs in a mount namespace of its own (`unshare --mount`) with a hosts
file of the cluster's DNS names bind-mounted over /etc/hosts, so it dials the names the
chart gives out: the brokers' bootstrap Service and the `<pod>.<headless service>` names
the INTERNAL listener advertises, the consensus client Service. That checks the addresses
an in-cluster client gets, which is what the chart decides; the other way, an EXTERNAL
listener advertising 127.0.0.x, would check a listener the test itself configured and
leave the in-cluster names unused from outside the pods. The test process itself keeps the
host's /etc/hosts. The admin CLI runs inside a broker container (`kubectl exec`).

    python -m tests.kube.clients roundtrip BOOTSTRAP TOPIC COUNT   # confluent-kafka
    python -m tests.kube.clients znodes CONNECT                     # kazoo
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.chart.render import NAMESPACE
from tests.images.engine import REPO
from tests.kube.kubelet import Node

BOOTSTRAP = f"directlog-broker.{NAMESPACE}.svc.cluster.local:9092"  # the bootstrap Service
ZOOKEEPER = f"directlog-consensus.{NAMESPACE}.svc.cluster.local:2181"  # the client Service
CLIENT_TIMEOUT = 180.0  # one client command on a busy machine; bounds a hang only
KCAT = shutil.which("kcat")  # `make test` installs Debian's kcat when it is missing
# Resolve names from a bind-mounted hosts file, then run the client: $0 is the file.
_ENTER = 'mount --bind "$0" /etc/hosts && exec "$@"'


def in_cluster(node: Node, argv: list[str], scratch: Path) -> list[str]:
    """`argv` as a command that resolves the cluster's names as they are now (a ClusterIP
    Service's name picks one of its ready pods)."""
    hosts = node.hosts_file(scratch / f"hosts-{uuid.uuid4().hex[:8]}")
    return ["unshare", "--mount", "--", "sh", "-c", _ENTER, str(hosts), *argv]


def run(
    node: Node, argv: list[str], scratch: Path, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a client to completion; checked, with its stderr in the failure message."""
    done = subprocess.run(
        in_cluster(node, argv, scratch),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT,
        cwd=REPO,
    )
    assert done.returncode == 0, f"{argv[:3]} failed ({done.returncode}): {done.stderr[-3000:]}"
    return done


def python(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def kcat(node: Node, scratch: Path, *args: str, stdin: str | None = None) -> str:
    assert KCAT is not None, "kcat is not installed: run the suite through `make test`"
    return run(node, [KCAT, *args], scratch, stdin).stdout


def kcat_read(node: Node, scratch: Path, topic: str) -> list[tuple[int, int, str, str]]:
    """Every record of the topic as kcat reads it: (partition, offset, key, value)."""
    out = kcat(node, scratch, *f"-C -b {BOOTSTRAP} -t {topic} -o beginning -e -q".split(),
               "-f", "%p %o %k %s\n")  # fmt: skip
    records = [line.split(" ", 3) for line in out.splitlines()]
    return [(int(p), int(o), k, v) for p, o, k, v in records]


def pod_host(pod: str) -> str:
    """A pod's name through its StatefulSet's headless Service."""
    return f"{pod}.{pod.rsplit('-', 1)[0]}-headless.{NAMESPACE}.svc.cluster.local"


def directlog(node: Node, *args: str, pod: str = "directlog-broker-0", timeout: float = 300) -> str:
    """`kubectl exec POD -c broker -- directlog ARGS`: its stdout (checked)."""
    done = node.exec(pod, "broker", "directlog", *args, timeout=timeout)
    output = done.stdout[-2000:] + done.stderr[-3000:]
    assert done.returncode == 0, f"directlog {' '.join(args)} ({done.returncode}): {output}"
    return done.stdout


Assignment = dict[tuple[str, int], list[int]]


def assignment(node: Node) -> Assignment:
    """Every partition of every topic (internal ones too) with its replicas, as
    `directlog topics describe` lists them."""
    topics = json.loads(directlog(node, "--output", "json", "topics", "describe"))
    return {(t["topic"], p["partition"]): p["replicas"] for t in topics for p in t["partitions"]}


# The programs run in the namespace ------------------------------------------------------


def roundtrip(bootstrap: str, topic: str, count: int) -> dict[str, Any]:
    """Produce `count` numbered values (acks=all) and read the whole topic back."""
    from confluent_kafka import Consumer, KafkaError, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    acked: list[list[Any]] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        acked.append([message.partition(), message.offset(), message.value().decode()])

    for i in range(count):
        producer.produce(topic, value=f"confluent-{i}".encode(), on_delivery=delivered)
    assert producer.flush(60) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"roundtrip-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    consumer.subscribe([topic])
    read: list[list[Any]] = []
    at_end: set[int] = set()
    partitions = len(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
    while len(at_end) < partitions:
        message: Any = consumer.poll(1.0)
        if message is None:
            continue
        if message.error():
            assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
            at_end.add(message.partition())
            continue
        read.append([message.partition(), message.offset(), message.value().decode()])
    consumer.close()
    return {"acked": acked, "read": read}


def znodes(connect: str) -> dict[str, Any]:
    """The cluster's registrations, through kazoo: brokers and the active controller."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=connect, timeout=30)
    client.start(timeout=60)
    try:
        brokers = {
            b: json.loads(client.get(f"/directlog/brokers/{b}")[0])
            for b in client.get_children("/directlog/brokers")
        }
        controller = json.loads(client.get("/directlog/controller")[0])
        path = client.create("/kube-test-", b"written through the Service", sequence=True)
        written = client.get(path)[0].decode()
        client.delete(path)
        return {"brokers": brokers, "controller": controller, "written": written}
    finally:
        client.stop()
        client.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.kube.clients")
    commands = parser.add_subparsers(dest="command", required=True)
    trip = commands.add_parser("roundtrip")
    trip.add_argument("bootstrap")
    trip.add_argument("topic")
    trip.add_argument("count", type=int)
    zk = commands.add_parser("znodes")
    zk.add_argument("connect")
    args = parser.parse_args(argv)
    if args.command == "roundtrip":
        out = roundtrip(args.bootstrap, args.topic, args.count)
    else:
        out = znodes(args.connect)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
