"""The rendered containers' commands, run as a kubelet would start them (tests/chart/pods.py),
yield the settings each service is meant to get: node and member ids from the pod ordinal,
every consensus member in the ensemble file, the brokers' listeners, rack and store, the
topics the hook creates, the Spark job's arguments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.broker.settings import BrokerSettings
from services.consensus.settings import ConsensusSettings, parse_address
from services.controller.settings import ControllerSettings
from services.tiering.settings import TieringSettings
from tests.chart.pods import PodFacts, run_container, settings_from_env, unknown_variables
from tests.chart.render import NAMESPACE, SCENARIOS, component, find, one, scenario

pytestmark = pytest.mark.timeout(120)

POD_IP = "10.244.1.5"  # PodFacts' status.podIP


def _container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        c for c in pod_spec["containers"] + pod_spec.get("initContainers", []) if c["name"] == name
    ]
    assert len(found) == 1, f"{len(found)} containers named {name}"
    return found[0]


def _host(kind: str, ordinal: int) -> str:
    return f"{component(kind)}-{ordinal}.{component(kind)}-headless.{NAMESPACE}.svc.cluster.local"


# Brokers ---------------------------------------------------------------------------------

BROKER_SCENARIOS = [
    "default", "external-nodeport", "external-loadbalancer", "rack-topics-hdfs",
    "s3-tiering", "rdma-sriov", "listen-pod-ip",
]  # fmt: skip


def _listen_host(name: str) -> str:
    """Where the scenario's processes listen: 0.0.0.0 by default, else the pod's IP."""
    return POD_IP if SCENARIOS[name].get("listenAddress") == "podIP" else "0.0.0.0"


ZONE = "eu-west-1b"
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"


def _network_status(ordinal: int) -> str:
    """What Multus writes on a pod attached to the SR-IOV network "sriov-rdma" as net1."""
    return json.dumps(
        [
            {"name": "cbr0", "interface": "eth0", "ips": [POD_IP], "default": True},
            {"name": f"{NAMESPACE}/sriov-rdma", "interface": "net1", "ips": [_rdma_ip(ordinal)]},
        ]
    )


def _rdma_ip(ordinal: int) -> str:
    return f"198.51.100.{10 + ordinal}"


def _run_broker(
    name: str, ordinal: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[BrokerSettings, dict[str, str], dict[str, Any]]:
    manifests = scenario(name)
    sts = one(manifests, "StatefulSet", component("broker"))
    spec = sts["spec"]["template"]["spec"]
    facts = PodFacts(
        f"{component('broker')}-{ordinal}",
        NAMESPACE,
        host_ip="192.0.2.10",
        annotations={NETWORK_STATUS: _network_status(ordinal)},
    )
    files = {}
    if any(c["name"] == "rack" for c in spec.get("initContainers", [])):
        files["/var/run/directlog/rack/zone"] = ZONE
    [call] = run_container(_container(spec, "broker"), facts, tmp_path, ["directlog-broker"], files)
    assert call.argv == ["directlog-broker"]
    settings = settings_from_env(monkeypatch, BrokerSettings, call.env)
    return settings, call.env, sts


@pytest.mark.parametrize("name", BROKER_SCENARIOS)
def test_broker_gets_node_id_listeners_and_controllers(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = SCENARIOS[name]
    external = values.get("broker", {}).get("external", {})
    for ordinal in range(3):
        settings, env, sts = _run_broker(name, ordinal, tmp_path / str(ordinal), monkeypatch)
        assert settings.node_id == ordinal
        assert unknown_variables(env, "DIRECTLOG_", BrokerSettings) == set()
        # On a Multus network, RDMA listens and is advertised on that network's address.
        rdma_ip = _rdma_ip(ordinal) if values.get("rdma", {}).get("networks") else None
        assert (settings.rdma_host, settings.rdma_advertised_host) == (rdma_ip, rdma_ip)
        internal = settings.listeners[0]
        listen = _listen_host(name)
        assert (internal.name, internal.host, internal.port) == ("INTERNAL", listen, 9092)
        assert internal.advertised_host == _host("broker", ordinal)
        assert internal.advertised_port == 9092
        assert settings.inter_broker() == "INTERNAL"
        assert settings.host == listen  # metrics (probes, Prometheus) listen on it
        # The admin CLI in the container reaches its broker: on localhost, or by name.
        cli = env.get("DIRECTLOG_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
        by_name = f"{_host('broker', ordinal)}:9092"
        assert cli == ("127.0.0.1:9092" if listen == "0.0.0.0" else by_name)
        assert str(settings.data_dir) == "/var/lib/directlog/data"
        assert settings.controllers == [f"{_host('controller', i)}:9190" for i in range(2)]
        # The advertised name is the pod's through the StatefulSet's headless Service.
        assert sts["spec"]["serviceName"] == f"{component('broker')}-headless"
        if not external.get("enabled"):
            assert len(settings.listeners) == 1
            continue
        assert [listener.name for listener in settings.listeners] == ["INTERNAL", "EXTERNAL"]
        outside = settings.listeners[1]
        assert (outside.host, outside.port) == (listen, 9094)
        hosts = external.get("advertisedHosts", [])
        given = hosts[ordinal] if ordinal < len(hosts) else ""
        if external["type"] == "NodePort":
            assert outside.advertised_port == external["nodePorts"][ordinal]
            assert outside.advertised_host == (given or "192.0.2.10")  # the node's IP
        else:
            assert outside.advertised_port == external["servicePort"]
            assert outside.advertised_host == given


def test_broker_rack_from_the_node_zone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, _, sts = _run_broker("rack-topics-hdfs", 1, tmp_path, monkeypatch)
    assert settings.rack == ZONE
    spec = sts["spec"]["template"]["spec"]
    rack = _container(spec, "rack")
    assert rack["command"][:3] == ["python3", "-m", "directlog.kube.node_zone"]
    output = rack["command"][rack["command"].index("--output") + 1]
    label = rack["command"][rack["command"].index("--label") + 1]
    assert label == "topology.kubernetes.io/zone"
    # The init container writes where the broker reads, on the same emptyDir.
    [rack_mount] = [m for m in rack["volumeMounts"] if output.startswith(m["mountPath"] + "/")]
    broker_mounts = {m["name"]: m["mountPath"] for m in _container(spec, "broker")["volumeMounts"]}
    assert broker_mounts[rack_mount["name"]] == rack_mount["mountPath"]
    assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == rack_mount["name"])


def test_broker_without_zone_file_has_no_rack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sts = one(scenario("rack-topics-hdfs"), "StatefulSet", component("broker"))
    facts = PodFacts(f"{component('broker')}-0", NAMESPACE)
    [call] = run_container(
        _container(sts["spec"]["template"]["spec"], "broker"), facts, tmp_path, ["directlog-broker"]
    )
    assert "DIRECTLOG_RACK" not in call.env


def test_broker_and_sidecar_share_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, _, sts = _run_broker("s3-tiering", 0, tmp_path / "broker", monkeypatch)
    assert broker.remote_log_storage_system_enable
    spec = sts["spec"]["template"]["spec"]
    facts = PodFacts(f"{component('broker')}-0", NAMESPACE)
    [call] = run_container(
        _container(spec, "tiering"), facts, tmp_path / "tiering", ["directlog-tiering"]
    )
    assert unknown_variables(call.env, "DIRECTLOG_TIERING_", TieringSettings) == set()
    tiering = settings_from_env(monkeypatch, TieringSettings, call.env)
    assert tiering.store_config() == broker.store_config()
    assert tiering.remote == "s3://directlog-tiered/prod"
    assert tiering.s3_access_key == "<directlog-s3/access-key>"  # from the Secret
    assert tiering.broker == f"127.0.0.1:{broker.tiering_port}"
    assert broker.tiering_host == "127.0.0.1"
    assert tiering.metrics_host == "0.0.0.0"


def test_sidecar_metrics_on_the_pod_ip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sts = one(scenario("listen-pod-ip"), "StatefulSet", component("broker"))
    facts = PodFacts(f"{component('broker')}-0", NAMESPACE)
    sidecar = _container(sts["spec"]["template"]["spec"], "tiering")
    [call] = run_container(sidecar, facts, tmp_path, ["directlog-tiering"])
    tiering = settings_from_env(monkeypatch, TieringSettings, call.env)
    assert tiering.metrics_host == POD_IP
    assert tiering.broker == "127.0.0.1:9393"  # the broker's side stays on the pod's localhost


# Consensus and controllers ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "consensus-5", "listen-pod-ip"])
def test_consensus_members_from_ordinals(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = scenario(name)
    size = SCENARIOS[name].get("consensus", {}).get("replicaCount", 3)
    sts = one(manifests, "StatefulSet", component("consensus"))
    assert sts["spec"]["replicas"] == size
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    config_map = one(manifests, "ConfigMap", component("consensus"))
    headless = one(manifests, "Service", f"{component('consensus')}-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    spec = sts["spec"]["template"]["spec"]
    container = _container(spec, "consensus")
    # Two more: pods a `kubectl scale` adds name themselves too, to join by reconfig.
    for ordinal in range(size + 2):
        workdir = tmp_path / str(ordinal)
        facts = PodFacts(f"{component('consensus')}-{ordinal}", NAMESPACE)
        files = {"/etc/directlog/consensus.yaml": config_map["data"]["consensus.yaml"]}
        [call] = run_container(container, facts, workdir, ["directlog-consensus"], files)
        assert call.argv[:3] == ["directlog-consensus", "--id", str(ordinal + 1)]
        config = Path(call.argv[call.argv.index("--config") + 1])
        # as ConsensusSettings.load(config) reads it, without leaving the variable behind
        monkeypatch.setenv(ConsensusSettings.config_env, str(config))
        settings = ConsensusSettings()
        assert sorted(settings.members) == list(range(1, max(size, ordinal + 1) + 1))
        for member_id, addresses in settings.members.items():
            own = member_id == ordinal + 1
            host = _listen_host(name) if own else _host("consensus", member_id - 1)
            assert parse_address(addresses.client) == (host, 2181)
            assert parse_address(addresses.peer) == (host, 2888)
            assert addresses.metrics is not None
            assert parse_address(addresses.metrics) == (host, 7181)
        assert str(settings.data_dir) == "/var/lib/directlog/consensus"
        [data] = [m for m in container["volumeMounts"] if m["name"] == "data"]
        assert data["mountPath"] == str(settings.data_dir)


def test_consensus_session_secret_from_a_secret(tmp_path: Path) -> None:
    sts = one(scenario("rack-topics-hdfs"), "StatefulSet", component("consensus"))
    container = _container(sts["spec"]["template"]["spec"], "consensus")
    [entry] = [e for e in container["env"] if e["name"] == "DIRECTLOG_CONSENSUS_SESSION_SECRET"]
    assert entry["valueFrom"]["secretKeyRef"] == {
        "name": "consensus-secret",
        "key": "session-secret",
    }


@pytest.mark.parametrize("name", ["default", "consensus-5", "listen-pod-ip"])
def test_controllers_get_ids_and_the_ensemble(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = scenario(name)
    size = SCENARIOS[name].get("consensus", {}).get("replicaCount", 3)
    sts = one(manifests, "StatefulSet", component("controller"))
    assert sts["spec"]["replicas"] == 2  # active + standby
    container = _container(sts["spec"]["template"]["spec"], "controller")
    for ordinal in range(2):
        facts = PodFacts(f"{component('controller')}-{ordinal}", NAMESPACE)
        [call] = run_container(container, facts, tmp_path / str(ordinal), ["directlog-controller"])
        assert call.argv == ["directlog-controller", "--id", str(ordinal)]
        assert unknown_variables(call.env, "DIRECTLOG_CONTROLLER_", ControllerSettings) == set()
        settings = settings_from_env(
            monkeypatch, ControllerSettings, call.env, controller_id=ordinal
        )
        assert settings.advertised_host == _host("controller", ordinal)
        assert settings.host == _listen_host(name)
        hosts = settings.consensus.split(",")
        assert hosts == [f"{_host('consensus', i)}:2181" for i in range(size)]


# Topics and Spark ------------------------------------------------------------------------


def test_topics_job_runs_the_admin_cli(tmp_path: Path) -> None:
    manifests = scenario("rack-topics-hdfs")
    job = one(manifests, "Job", component("topics"))
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,post-upgrade"
    spec = job["spec"]["template"]["spec"]
    facts = PodFacts("topics-abcde", NAMESPACE)
    calls = run_container(_container(spec, "topics"), facts, tmp_path, ["directlog"])
    bootstrap = f"{component('broker')}.{NAMESPACE}.svc.cluster.local:9092"
    assert [c.argv for c in calls] == [
        [
            "directlog", "--bootstrap-server", bootstrap, "topics", "create", "orders",
            "--partitions", "6", "--replication-factor", "3",
            "--config", "min.insync.replicas=2", "--config", "retention.ms=604800000",
            "--if-not-exists",
        ],
        [
            "directlog", "--bootstrap-server", bootstrap, "topics", "create", "events",
            "--partitions", "1", "--replication-factor", "3", "--if-not-exists",
        ],
    ]  # fmt: skip
    # The admin CLI reads them as meant (its own parser; the broker image ships it).
    from directlog.admin.cli import build_parser

    orders = build_parser().parse_args(calls[0].argv[1:])
    assert (orders.name, orders.partitions, orders.replication_factor) == ("orders", 6, 3)
    assert orders.config == ["min.insync.replicas=2", "retention.ms=604800000"]
    assert orders.if_not_exists is True
    # The bootstrap Service exists and selects the brokers.
    service = one(manifests, "Service", component("broker"))
    assert service["spec"]["ports"][0]["port"] == 9092
    assert find(scenario("default"), "Job") == []  # no topics, no Job


def test_spark_application_arguments_parse_as_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.traffic import job

    app = one(scenario("spark"), "SparkApplication", f"{component('spark')}-traffic")
    seen: list[Any] = []

    class Parsed(Exception):
        pass

    def fake_session(master: str, shuffle_partitions: int) -> None:
        seen.append((master, shuffle_partitions))
        raise Parsed

    original = job.settings_from

    def settings_from(args: Any, checkpoint: str) -> Any:
        seen.append(original(args, checkpoint))
        return seen[-1]

    monkeypatch.setattr(job, "settings_from", settings_from)
    monkeypatch.setattr(job, "session", fake_session)
    with pytest.raises(Parsed):
        job.main(app["spec"]["arguments"])
    settings, (master, shuffle) = seen
    assert settings.bootstrap == f"{component('broker')}.{NAMESPACE}.svc.cluster.local:9092"
    assert settings.checkpoint == "/var/lib/directlog/checkpoint"
    assert master.startswith("k8s://https://kubernetes.default.svc")
    assert shuffle == 2
    spec = app["spec"]
    assert spec["image"] == "directlog/spark:0.1.0"
    assert spec["mainApplicationFile"].endswith("/pipelines/traffic/job.py")
    for role in ("driver", "executor"):
        mounts = {m["name"]: m["mountPath"] for m in spec[role]["volumeMounts"]}
        assert mounts["checkpoint"] == settings.checkpoint
    assert spec["driver"]["serviceAccount"] == component("spark")


def test_spark_submit_runs_the_same_job(tmp_path: Path) -> None:
    manifests = scenario("spark")
    app = one(manifests, "SparkApplication", f"{component('spark')}-traffic")
    script = one(manifests, "ConfigMap", f"{component('spark')}-submit")["data"]["spark-submit.sh"]
    container = {
        "command": ["/bin/sh", "-c", script],
        "env": [{"name": "K8S_API", "value": "https://api.example:6443"}],
    }
    [call] = run_container(
        container, PodFacts("laptop", NAMESPACE), tmp_path, ["spark-submit", "kubectl"]
    )
    argv = call.argv
    assert argv[:5] == [
        "spark-submit",
        "--master",
        "k8s://https://api.example:6443",
        "--deploy-mode",
        "cluster",
    ]
    main_file = argv.index(app["spec"]["mainApplicationFile"])
    assert argv[main_file + 1 :] == app["spec"]["arguments"]
    confs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv[:main_file]) if a == "--conf")
    assert confs["spark.kubernetes.container.image"] == app["spec"]["image"]
    assert confs["spark.kubernetes.namespace"] == NAMESPACE
    assert confs["spark.kubernetes.authenticate.driver.serviceAccountName"] == component("spark")
    assert confs["spark.executor.instances"] == str(app["spec"]["executor"]["instances"])
    assert confs["spark.kubernetes.driver.label.app.kubernetes.io/component"] == "spark"


def test_spark_off_by_default() -> None:
    kinds = {m["kind"] for m in scenario("default")}
    assert "SparkApplication" not in kinds
    assert json.dumps(scenario("default")).count("spark") == 0
    assert yaml.safe_dump(SCENARIOS["spark"])  # the scenario renders (test_manifests checks it)
