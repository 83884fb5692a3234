"""What the rendered objects say to each other: Services, PodDisruptionBudgets,
NetworkPolicies, PodMonitors and ServiceMonitors select pods and Services that exist in the
render; probes and ports name ports the containers declare; the tiering sidecar shares the
broker's log volume; pods run restricted; RDMA pods get their device, memory and capability."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.monitor import JOBS
from tests.chart.render import CHART, NAMESPACE, RELEASE, SCENARIOS, component, find, one, scenario

pytestmark = pytest.mark.timeout(120)

WORKLOADS = ("StatefulSet", "Deployment", "DaemonSet", "Job")
DIRECTLOG_COMPONENTS = {"broker", "controller", "consensus", "topics"}


def _pods(manifests: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod template) of every workload."""
    for m in manifests:
        if m["kind"] in WORKLOADS:
            yield m, m["spec"]["template"]


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels / matchExpressions, or a plain map) against labels."""
    match_labels = selector.get("matchLabels", {}) if _is_label_selector(selector) else selector
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expression in selector.get("matchExpressions", []) if _is_label_selector(selector) else []:
        key, op, values = expression["key"], expression["operator"], expression.get("values", [])
        if (op == "In" and labels.get(key) not in values) or (
            op == "NotIn" and labels.get(key) in values
        ):
            return False
        if (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def _is_label_selector(selector: dict[str, Any]) -> bool:
    return set(selector) <= {"matchLabels", "matchExpressions"}


def _instances(manifests: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The pods the workloads make, as far as labels go: a StatefulSet's pods also carry
    their name and index (labels its controller adds)."""
    for workload, template in _pods(manifests):
        if workload["kind"] != "StatefulSet":
            yield template
            continue
        for ordinal in range(workload["spec"]["replicas"]):
            pod = json.loads(json.dumps(template))
            pod["metadata"]["labels"] |= {
                "statefulset.kubernetes.io/pod-name": f"{workload['metadata']['name']}-{ordinal}",
                "apps.kubernetes.io/pod-index": str(ordinal),
            }
            yield pod


def _selected(manifests: list[dict[str, Any]], selector: dict[str, Any]) -> list[dict[str, Any]]:
    """Pods the selector matches; one per workload (a StatefulSet's pods differ only in
    their name and index labels) unless those are selected."""
    found = [p for p in _instances(manifests) if _matches(selector, p["metadata"]["labels"])]
    unique: dict[str, dict[str, Any]] = {}
    for pod in found:
        labels = dict(pod["metadata"]["labels"])
        if not any(k in json.dumps(selector) for k in ("pod-name", "pod-index")):
            labels.pop("statefulset.kubernetes.io/pod-name", None)
            labels.pop("apps.kubernetes.io/pod-index", None)
        unique.setdefault(json.dumps(labels, sort_keys=True), pod)
    return list(unique.values())


def _ports(template: dict[str, Any]) -> dict[str, int]:
    spec = template["spec"]
    return {
        p["name"]: p["containerPort"]
        for c in spec["containers"] + spec.get("initContainers", [])
        for p in c.get("ports", [])
        if "name" in p
    }


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_probes_point_at_declared_ports(name: str) -> None:
    for workload, template in _pods(scenario(name)):
        for container in template["spec"]["containers"]:
            declared = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe not in container:
                    continue
                port = container[probe]["httpGet"]["port"]
                assert port in declared or port in declared.values(), (
                    f"{workload['metadata']['name']}/{container['name']} {probe} port {port} "
                    f"is not one of {declared}"
                )
                path = container[probe]["httpGet"]["path"]
                assert path == ("/readyz" if probe == "readinessProbe" else "/healthz")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_services_select_pods_with_their_ports(name: str) -> None:
    manifests = scenario(name)
    for service in find(manifests, "Service"):
        pods = _selected(manifests, service["spec"]["selector"])
        assert pods, f"Service {service['metadata']['name']} selects no pod"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for pod in pods:
                ports = _ports(pod)
                assert target in ports or target in ports.values(), (
                    f"Service {service['metadata']['name']} port {target} not in {ports}"
                )


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_disruption_budgets_select_their_pods(name: str) -> None:
    manifests = scenario(name)
    budgets = find(manifests, "PodDisruptionBudget")
    assert {b["metadata"]["name"] for b in budgets} == {
        component(c) for c in ("broker", "controller", "consensus")
    }
    for budget in budgets:
        [pod] = _selected(manifests, budget["spec"]["selector"])
        kind = budget["metadata"]["name"].removeprefix(f"{RELEASE}-")
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == kind


def _policy(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return one(manifests, "NetworkPolicy", component(kind))


def _allowed(manifests: list[dict[str, Any]], policy: dict[str, Any], port: int) -> set[str] | None:
    """Components whose pods may reach `port` of the policy's pods (None: anyone)."""
    allowed: set[str] = set()
    for rule in policy["spec"]["ingress"]:
        if port not in [p["port"] for p in rule.get("ports", [])]:
            continue
        if "from" not in rule:
            return None
        for peer in rule["from"]:
            if "podSelector" in peer and "namespaceSelector" not in peer:
                pods = _selected(manifests, peer["podSelector"])
                allowed |= {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods}
            else:
                allowed.add(json.dumps(peer, sort_keys=True))
    return allowed


PROMETHEUS = json.dumps(
    {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    },
    sort_keys=True,
)


@pytest.mark.parametrize(
    "name", ["default", "metrics", "rdma-sriov", "external-nodeport", "rack-topics-hdfs"]
)
def test_network_policies(name: str) -> None:
    manifests = scenario(name)
    for kind in ("consensus", "controller", "broker"):
        policy = _policy(manifests, kind)
        [pod] = _selected(manifests, policy["spec"]["podSelector"])
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == kind
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    consensus, controller, broker = (
        _policy(manifests, k) for k in ("consensus", "controller", "broker")
    )
    # Only brokers and controllers (and the members themselves) reach the ensemble.
    assert _allowed(manifests, consensus, 2181) == {"broker", "controller", "consensus"}
    assert _allowed(manifests, consensus, 2888) == {"consensus"}
    # Only brokers reach the controllers' gRPC.
    assert _allowed(manifests, controller, 9190) == {"broker"}
    # Clients reach the brokers: anyone, or the configured peers plus brokers, the topics
    # Job and Spark.
    clients = SCENARIOS[name].get("networkPolicy", {}).get("clientsFrom")
    if clients:
        assert _allowed(manifests, broker, 9092) == {
            "broker",
            *(json.dumps(c, sort_keys=True) for c in clients),
        } | ({"topics"} if SCENARIOS[name].get("topics") else set())
    else:
        assert _allowed(manifests, broker, 9092) is None
    # Prometheus reaches every metrics port the pods declare, and nothing else does.
    for kind, policy in (("consensus", consensus), ("controller", controller), ("broker", broker)):
        [pod] = _selected(manifests, policy["spec"]["podSelector"])
        for port_name, port in _ports(pod).items():
            if port_name.endswith("metrics"):
                assert _allowed(manifests, policy, port) == {PROMETHEUS}, (kind, port_name)
    # RDMA connection set-up and the EXTERNAL listener are open like the Kafka port.
    [pod] = _selected(manifests, broker["spec"]["podSelector"])
    for port_name, port in _ports(pod).items():
        if port_name.startswith("rdma") or port_name == "external":
            assert _allowed(manifests, broker, port) == _allowed(manifests, broker, 9092)


def test_network_policies_can_be_turned_off() -> None:
    from tests.chart.render import template

    assert find(template({"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


def _relabel(endpoint: dict[str, Any], target: str) -> dict[str, Any]:
    rules: list[dict[str, Any]] = [
        r for r in endpoint["relabelings"] if r.get("targetLabel") == target
    ]
    assert len(rules) == 1, f"{len(rules)} relabelings to {target}"
    return rules[0]


def test_pod_monitors_select_pods_and_ports_that_exist() -> None:
    manifests = scenario("metrics")
    jobs: set[str] = set()
    for monitor in find(manifests, "PodMonitor"):
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        pods = _selected(manifests, monitor["spec"]["selector"])
        assert len(pods) == 1, monitor["metadata"]["name"]
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["port"] in _ports(pods[0])
            assert endpoint["path"] == "/metrics"
            jobs.add(_relabel(endpoint, "job")["replacement"])
            assert _relabel(endpoint, "namespace")["sourceLabels"] == [
                "__meta_kubernetes_namespace"
            ]
            assert _relabel(endpoint, "kubernetes_pod_name")["sourceLabels"] == [
                "__meta_kubernetes_pod_name"
            ]
            # Strimzi's dashboard: pod names start with "<strimzi_io_cluster>-".
            cluster = _relabel(endpoint, "strimzi_io_cluster")["replacement"]
            assert all(
                t["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE for t in pods
            )
            assert f"{cluster}-broker-0" == f"{component('broker')}-0"
    assert jobs == set(JOBS)  # every job the rules and dashboards select


def test_service_monitors_select_one_service_each() -> None:
    manifests = scenario("metrics")
    jobs: set[str] = set()
    for monitor in find(manifests, "ServiceMonitor"):
        services = [
            s for s in find(manifests, "Service")
            if _matches(monitor["spec"]["selector"], s["metadata"]["labels"])
        ]  # fmt: skip
        assert len(services) == 1, monitor["metadata"]["name"]
        [service] = services
        assert service["spec"]["clusterIP"] == "None"  # every pod an endpoint
        port_names = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in port_names
            jobs.add(_relabel(endpoint, "job")["replacement"])
    assert jobs == set(JOBS)


def test_exporter_series_get_one_instance() -> None:
    """services/broker/kafka_exporter.py's rule, on the brokers' endpoint only."""
    manifests = scenario("metrics")
    monitor = one(manifests, "PodMonitor", component("broker"))
    broker, tiering = monitor["spec"]["podMetricsEndpoints"]
    [rule] = broker["metricRelabelings"]
    assert rule["regex"] == "kafka_(brokers|broker_info|topic_.+|consumergroup_.+)"
    assert (rule["targetLabel"], rule["replacement"]) == ("instance", "directlog")
    assert "metricRelabelings" not in tiering


def test_prometheus_rule_holds_the_rule_files() -> None:
    [rule] = find(scenario("metrics"), "PrometheusRule")
    expected = []
    for path in sorted((CHART / "rules").glob("*.yaml")):
        expected += yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    got = rule["spec"]["groups"]
    capacity = [
        r
        for g in got
        for r in g["rules"]
        if r.get("record") == "directlog:broker_log_capacity_bytes"
    ]
    assert [r["expr"] for r in capacity] == [f"vector({100 * 2**30 * 9 // 10})"]  # 90% of 100Gi
    for group in expected:
        for r in group["rules"]:
            if r.get("record") == "directlog:broker_log_capacity_bytes":
                r["expr"] = capacity[0]["expr"]
    assert got == expected
    assert "{{ $labels.instance }}" in json.dumps(got)  # Prometheus' templates kept as they are


def test_dashboards_as_configmaps() -> None:
    manifests = scenario("metrics")
    files = {p.name: p.read_text(encoding="utf-8") for p in (CHART / "dashboards").glob("*.json")}
    maps = [
        m for m in find(manifests, "ConfigMap") if "grafana_dashboard" in m["metadata"]["labels"]
    ]
    assert {k for m in maps for k in m["data"]} == set(files)
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        [(name, text)] = m["data"].items()
        assert json.loads(text) == json.loads(files[name])
    assert not [
        m
        for m in find(scenario("default"), "ConfigMap")
        if "grafana_dashboard" in m["metadata"]["labels"]
    ]


@pytest.mark.parametrize("name", ["metrics", "s3-tiering", "rack-topics-hdfs"])
def test_tiering_sidecar_shares_the_log_volume(name: str) -> None:
    sts = one(scenario(name), "StatefulSet", component("broker"))
    containers = {c["name"]: c for c in sts["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"broker", "tiering"}
    [broker_data] = [m for m in containers["broker"]["volumeMounts"] if m["name"] == "data"]
    [tiering_data] = [m for m in containers["tiering"]["volumeMounts"] if m["name"] == "data"]
    assert broker_data == tiering_data  # same claim, same path: the broker names files by it
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]


def test_no_sidecar_without_tiering() -> None:
    sts = one(scenario("default"), "StatefulSet", component("broker"))
    assert [c["name"] for c in sts["spec"]["template"]["spec"]["containers"]] == ["broker"]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_grace_period_covers_controlled_shutdown(name: str) -> None:
    sts = one(scenario(name), "StatefulSet", component("broker"))
    [broker] = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "broker"]
    [timeout] = [
        e["value"] for e in broker["env"] if e["name"] == "DIRECTLOG_CONTROLLED_SHUTDOWN_TIMEOUT_MS"
    ]
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] * 1000 > int(timeout)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_directlog_pods_run_restricted(name: str) -> None:
    rdma = SCENARIOS[name].get("rdma", {}).get("enabled", False)
    for workload, template in _pods(scenario(name)):
        labels = template["metadata"]["labels"]
        if labels.get("app.kubernetes.io/component") not in DIRECTLOG_COMPONENTS:
            continue  # device plugins and rxe: privileged by nature
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"] + spec.get("initContainers", []):
            ctx = container["securityContext"]
            assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 10001
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["readOnlyRootFilesystem"] is True
            assert ctx["capabilities"]["drop"] == ["ALL"]
            ipc_lock = rdma and container["name"] == "broker"
            assert ctx["capabilities"].get("add", []) == (["IPC_LOCK"] if ipc_lock else [])
            assert "/tmp" in {m["mountPath"] for m in container.get("volumeMounts", [])} or (
                container["name"] == "rack"
            ), f"{workload['metadata']['name']}/{container['name']} has no writable /tmp"
            assert container["resources"]["requests"], container["name"]


@pytest.mark.parametrize(
    ("name", "resource", "network"),
    [
        ("rdma-shared-plugin", "rdma/rdma_shared_device_a", None),
        ("rdma-sriov", "intel.com/mlnx_sriov_rdma", "sriov-rdma"),
        ("rdma-rxe", "rdma/rxe", None),
    ],
)
def test_rdma_brokers(name: str, resource: str, network: str | None) -> None:
    manifests = scenario(name)
    sts = one(manifests, "StatefulSet", component("broker"))
    template = sts["spec"]["template"]
    [broker] = [c for c in template["spec"]["containers"] if c["name"] == "broker"]
    assert broker["resources"]["limits"][resource] == 1
    assert broker["resources"]["requests"][resource] == 1
    assert template["metadata"].get("annotations", {}).get("k8s.v1.cni.cncf.io/networks") == network
    env = {e["name"]: e.get("value") for e in broker["env"]}
    assert env["DIRECTLOG_RDMA_PROVIDER"] == "pyverbs"
    for switch in ("PRODUCE", "CONSUME", "REPLICATION"):
        assert env[f"DIRECTLOG_RDMA_{switch}"] == "true"
    heads = env["DIRECTLOG_RDMA_HEAD_SEGMENTS_DIR"]
    [mount] = [m for m in broker["volumeMounts"] if m["mountPath"] == heads]
    [volume] = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    assert volume["emptyDir"]["sizeLimit"] == "2Gi"
    declared = _ports(template)
    for setting in (
        "DIRECTLOG_RDMA_PORT",
        "DIRECTLOG_RDMA_CONSUME_PORT",
        "DIRECTLOG_RDMA_REPLICATION_PORT",
    ):
        assert int(env[setting]) in declared.values()  # fixed ports, so policies can open them


def test_rdma_device_plugins_and_rxe() -> None:
    shared = scenario("rdma-shared-plugin")
    [config] = [
        m for m in find(shared, "ConfigMap") if m["metadata"]["name"] == component("rdma-shared-dp")
    ]
    [entry] = json.loads(config["data"]["config.json"])["configList"]
    assert (
        f"{entry['resourcePrefix']}/{entry['resourceName']}"
        == SCENARIOS["rdma-shared-plugin"]["rdma"]["resourceName"]
    )
    sriov = scenario("rdma-sriov")
    [config] = [
        m for m in find(sriov, "ConfigMap") if m["metadata"]["name"] == component("sriov-dp")
    ]
    [entry] = json.loads(config["data"]["config.json"])["resourceList"]
    assert f"{entry['resourcePrefix']}/{entry['resourceName']}" == "intel.com/mlnx_sriov_rdma"
    assert entry["selectors"]["isRdma"] is True
    rxe = one(scenario("rdma-rxe"), "DaemonSet", component("rxe"))
    spec = rxe["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    [container] = spec["containers"]
    assert container["securityContext"]["privileged"] is True
    assert "rdma link add rxe0 type rxe netdev eth0" in container["command"][-1]
    for name in ("default", "s3-tiering"):
        assert not find(scenario(name), "DaemonSet")


def test_rack_lookup_rbac() -> None:
    manifests = scenario("rack-topics-hdfs")
    sts = one(manifests, "StatefulSet", component("broker"))
    spec = sts["spec"]["template"]["spec"]
    account = spec["serviceAccountName"]
    assert one(manifests, "ServiceAccount", account)
    [role] = find(manifests, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    [binding] = find(manifests, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    # Only the init container and the broker (its scale-down hook) get the token, at the
    # in-cluster path node_zone and scale_down read; not the tiering sidecar.
    assert _token_mounts(spec) == {"rack", "broker"}
    assert not find(scenario("default"), "ClusterRole")


SERVICE_ACCOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def _token_mounts(spec: dict[str, Any]) -> set[str]:
    return {
        c["name"] for c in spec["containers"] + spec.get("initContainers", [])
        for m in c.get("volumeMounts", [])
        if m["mountPath"] == SERVICE_ACCOUNT_PATH
    }  # fmt: skip


@pytest.mark.parametrize("name", ["default", "metrics", "rack-topics-hdfs", "listen-pod-ip"])
def test_scale_down_drain_hook_and_rbac(name: str) -> None:
    """The preStop hook runs directlog.kube.scale_down with what it reads: the pod's name,
    the StatefulSet's name, the ServiceAccount's token; a Role lets it get that
    StatefulSet and nothing else; the grace period covers the drain and the controlled
    shutdown after it."""
    from directlog.kube import scale_down

    manifests = scenario(name)
    sts = one(manifests, "StatefulSet", component("broker"))
    spec = sts["spec"]["template"]["spec"]
    [broker] = [c for c in spec["containers"] if c["name"] == "broker"]
    command = broker["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:3] == ["python3", "-m", "directlog.kube.scale_down"]
    args = scale_down.build_parser().parse_args(command[3:])
    assert args.timeout == 300
    assert [c["name"] for c in spec["containers"] if "lifecycle" in c] == ["broker"]
    env = {e["name"]: e for e in broker["env"]}
    assert env["STATEFULSET_NAME"]["value"] == sts["metadata"]["name"]
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "DIRECTLOG_ADVERTISED_HOST" in env and "DIRECTLOG_PORT" in env
    assert SERVICE_ACCOUNT_PATH in {m["mountPath"] for m in broker["volumeMounts"]}
    assert "broker" in _token_mounts(spec) and "tiering" not in _token_mounts(spec)
    [volume] = [v for v in spec["volumes"] if v["name"] == "kube-api-access"]
    sources = volume["projected"]["sources"]
    assert [sorted(s) for s in sources] == [["serviceAccountToken"], ["configMap"], ["downwardAPI"]]
    assert spec["automountServiceAccountToken"] is False
    # RBAC: get on this StatefulSet only, for the account the pods run as.
    account = spec["serviceAccountName"]
    assert one(manifests, "ServiceAccount", account)
    role = one(manifests, "Role", f"{component('broker')}-scale-down")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["statefulsets"],
         "resourceNames": [sts["metadata"]["name"]], "verbs": ["get"]}
    ]  # fmt: skip
    binding = one(manifests, "RoleBinding", f"{component('broker')}-scale-down")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]
    }  # fmt: skip
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    # 10 s of controlled shutdown, 30 s extra, 300 s of drain.
    assert spec["terminationGracePeriodSeconds"] == 10 + 30 + 300


def test_scale_down_drain_off() -> None:
    manifests = scenario("scale-down-drain-off")
    sts = one(manifests, "StatefulSet", component("broker"))
    spec = sts["spec"]["template"]["spec"]
    assert not [c for c in spec["containers"] if "lifecycle" in c]
    assert _token_mounts(spec) == set()
    assert not [v for v in spec["volumes"] if v["name"] == "kube-api-access"]
    assert not find(manifests, "Role") and not find(manifests, "RoleBinding")
    assert not find(manifests, "ServiceAccount")  # an existing one, by name
    assert spec["serviceAccountName"] == "brokers"
    assert spec["terminationGracePeriodSeconds"] == 10 + 30
    [broker] = [c for c in spec["containers"] if c["name"] == "broker"]
    assert "STATEFULSET_NAME" not in {e["name"] for e in broker["env"]}


def test_scale_down_role_binds_the_account_in_use() -> None:
    """With no ServiceAccount created and none named, the pods run as the namespace's
    default account: the Role is bound to that one."""
    from tests.chart.render import template

    manifests = template({"broker": {"serviceAccount": {"create": False}}})
    sts = one(manifests, "StatefulSet", component("broker"))
    assert "serviceAccountName" not in sts["spec"]["template"]["spec"]
    binding = one(manifests, "RoleBinding", f"{component('broker')}-scale-down")
    assert binding["subjects"][0]["name"] == "default"
    named = template({"broker": {"serviceAccount": {"create": False, "name": "brokers"}}})
    binding = one(named, "RoleBinding", f"{component('broker')}-scale-down")
    assert binding["subjects"][0]["name"] == "brokers"


def test_external_services_one_per_broker() -> None:
    for name in ("external-nodeport", "external-loadbalancer"):
        manifests = scenario(name)
        external = SCENARIOS[name]["broker"]["external"]
        services = [
            s for s in find(manifests, "Service") if s["spec"].get("type") == external["type"]
        ]
        assert len(services) == 3
        for ordinal, service in enumerate(services):
            pods = _selected(manifests, service["spec"]["selector"])
            assert (
                service["spec"]["selector"]["statefulset.kubernetes.io/pod-name"]
                == f"{component('broker')}-{ordinal}"
            )
            assert len(pods) == 1  # one broker pod, by its name
            [port] = service["spec"]["ports"]
            assert port["targetPort"] == "external"
            if external["type"] == "NodePort":
                assert port["nodePort"] == external["nodePorts"][ordinal]
            else:
                assert port["port"] == external["servicePort"]
                assert service["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]


def test_images_and_tags() -> None:
    manifests = scenario("spark") + scenario("s3-tiering")
    images = {c["image"] for _, t in _pods(manifests) for c in t["spec"]["containers"]}
    assert images >= {
        "directlog/broker:0.1.0", "directlog/controller:0.1.0", "directlog/consensus:0.1.0",
        "directlog/tiering:0.1.0",
    }  # fmt: skip
    from tests.chart.render import template

    registry = template(
        {"image": {"registry": "registry.example:5000", "tag": "0.1.1", "pullSecrets": ["regcred"]}}
    )
    for _, t in _pods(registry):
        for c in t["spec"]["containers"]:
            assert c["image"].startswith("registry.example:5000/directlog/") and c[
                "image"
            ].endswith(":0.1.1")
        assert t["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_notes_name_the_bootstrap_address() -> None:
    from tests.chart.render import run_helm

    out = run_helm("install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE)
    assert f"{component('broker')}.{NAMESPACE}.svc.cluster.local:9092" in out.split("NOTES:")[1]


def test_chart_files_are_shipped_without_rule_tests(tmp_path: Path) -> None:
    from tests.chart.render import run_helm

    run_helm("package", str(CHART), "--destination", str(tmp_path))
    import tarfile

    [package] = tmp_path.glob("directlog-*.tgz")
    with tarfile.open(package) as archive:
        names = archive.getnames()
    assert "directlog/rules/brokers.yaml" in names
    assert "directlog/dashboards/directlog-cluster.json" in names
    assert not [n for n in names if n.startswith("directlog/rules/tests/")]
