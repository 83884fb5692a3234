"""A kubelet for the chart's rendered pods on this machine's container engine, with the bits
of the StatefulSet controller, kube-dns and kube-proxy that pods need, and no API server.

- Pods come from the StatefulSets: `<set>-<ordinal>`, one PVC per claim template and pod
  (a host directory kept across the pod's restarts); `rollout_restart` deletes and recreates
  them highest ordinal first, each Ready before the next, as `kubectl rollout restart` makes
  the StatefulSet controller do; `scale` adds or removes the highest ordinals.
- Each pod has a loopback address of its own, 127.0.0.x, its status.podIP, and runs on the
  host's network: no bridge exists, and no traffic leaves 127.0.0.0/8.
- Containers start as the kubelet starts them: init containers to completion, then the
  containers, with the rendered command and args and the env as Kubernetes builds it
  (tests/chart/pods.py: downward API, Secret references, `$(VAR)` expansion), the uid,
  groups, read-only root and capabilities of their securityContext, memory limits,
  ConfigMap and Secret volumes as files, emptyDirs and PVCs as host directories shared by
  the pod's containers, restartPolicy Always (the engine's restart policy).
- DNS: every pod's `<pod>.<headless service>.<namespace>.svc.<domain>` (the pods a
  StatefulSet may have, so a pod added by `scale` resolves for the others too), and each
  ClusterIP Service's name resolving to one of its ready pods, as kube-proxy would route a
  connection; given to each container with --add-host when it starts, and written by
  `hosts_file` for processes on the host.
- Probes as the kubelet runs them: the startup probe, then readiness and liveness; httpGet,
  tcpSocket or exec; every periodSeconds after initialDelaySeconds; failureThreshold
  failures in a row turn a container unready (readiness) or restart it (liveness, startup).
- The API server, when given one (tests/chart/apiserver.py, HTTPS on 127.0.0.1): it serves
  every StatefulSet with its current replicas (`scale` sets them first, as `kubectl scale`
  does) and this node; every container gets KUBERNETES_SERVICE_HOST/PORT pointing at it,
  and `projected` volumes get its token, its CA (the `kube-root-ca.crt` ConfigMap every
  namespace has) and the downward API's fields.
- Deleting a pod, or restarting a container after a failed probe: each container's preStop
  hook (exec) runs in it first, within the grace period, then SIGTERM with what is left of
  the grace period (at least 2 s, as the kubelet gives), SIGKILL after that; the
  containers stop in parallel, each after its own hook.
"""

from __future__ import annotations

import base64
import http.client
import random
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chart.apiserver import FakeApiServer
from tests.chart.pods import PodFacts, container_env, expand
from tests.images.engine import docker

Manifest = dict[str, Any]

LABEL = "directlog.test=kube"
FIRST_ADDRESS = 20  # pods get 127.0.0.20 and up; 127.0.0.1 stays the host's
PROBE_TICK = 0.2  # seconds between looks at which probes are due
MINIMUM_GRACE = 2  # seconds the kubelet still gives after a hook that used the grace period
INIT_TIMEOUT = 300.0  # one init container, to completion
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}


def quantity(text: str | int) -> int:
    """A Kubernetes memory quantity (512Mi, 1G, 1073741824) in bytes."""
    match = re.fullmatch(r"([0-9]+)([A-Za-z]*)", str(text))
    assert match and (not match.group(2) or match.group(2) in _UNITS), f"quantity {text!r}"
    return int(match.group(1)) * _UNITS.get(match.group(2), 1)


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@dataclass
class Probe:
    kind: str  # startup, readiness or liveness
    spec: Manifest
    due: float
    failures: int = 0
    successes: int = 0

    def record(self, ok: bool, now: float) -> None:
        self.due = now + float(self.spec.get("periodSeconds", 10))
        self.failures, self.successes = (0, self.successes + 1) if ok else (self.failures + 1, 0)

    @property
    def failed(self) -> bool:
        return self.failures >= int(self.spec.get("failureThreshold", 3))

    @property
    def succeeded(self) -> bool:
        return self.successes >= int(self.spec.get("successThreshold", 1))


@dataclass
class Container:
    spec: Manifest
    id: str = ""
    started: bool = False  # the startup probe succeeded (or there is none)
    ready: bool = False
    restarts: int = 0  # by failed liveness or startup probes
    probes: dict[str, Probe] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def reset(self, now: float) -> None:
        self.started = self.ready = False
        self.probes = {}
        for kind in ("startup", "readiness", "liveness"):
            spec = self.spec.get(f"{kind}Probe")
            if spec is not None:
                self.probes[kind] = Probe(kind, spec, now + spec.get("initialDelaySeconds", 0))


@dataclass(frozen=True)
class HookRun:
    """A preStop hook's run: its exit code (None: still running when the grace period
    ended) and its output (what the kubelet puts in a FailedPreStopHook event)."""

    code: int | None
    output: str


@dataclass(frozen=True)
class Exit:
    """How a container ended: its exit code, whether the kernel killed it for memory, and
    how often the engine restarted it after it exited (restartPolicy Always); its preStop
    hook's run, if it has one."""

    code: int
    oom_killed: bool
    engine_restarts: int
    logs: str = field(default="", compare=False, repr=False)  # the end of its output
    pre_stop: HookRun | None = field(default=None, compare=False, repr=False)


class Pod:
    def __init__(self, node: Node, name: str, owner: Manifest, address: str) -> None:
        self.node = node
        self.name = name
        self.owner = owner
        self.address = address
        template = owner["spec"]["template"]
        self.spec: Manifest = template["spec"]
        self.labels: dict[str, str] = template["metadata"].get("labels", {})
        self.dir = node.root / "pods" / f"{name}-{uuid.uuid4().hex[:6]}"
        self.containers = [Container(spec) for spec in self.spec["containers"]]
        self.facts = PodFacts(
            name,
            node.namespace,
            node_name=node.node_name,
            host_ip="127.0.0.1",
            pod_ip=address,
            secrets={(s, k): v for s, data in node.secrets.items() for k, v in data.items()},
        )
        self._stop = threading.Event()
        self._prober = threading.Thread(target=self._probe_loop, name=f"probes {name}", daemon=True)

    @property
    def ready(self) -> bool:
        return all(c.ready for c in self.containers)

    def container(self, name: str) -> Container:
        [found] = [c for c in self.containers if c.name == name]
        return found

    # Start -------------------------------------------------------------------------------

    def start(self) -> None:
        volumes = self._volumes()
        for spec in self.spec.get("initContainers", []):
            name = self._engine_name(spec["name"])
            options = self._options(spec, volumes)
            done = docker("run", "--name", name, *options, check=False, timeout=INIT_TIMEOUT)
            docker("rm", "--force", name, check=False)
            output = (done.stdout + done.stderr)[-3000:]
            assert done.returncode == 0, f"{self.name}: init container {spec['name']}: {output}"
        now = time.monotonic()
        for container in self.containers:
            options = self._options(container.spec, volumes)
            name = self._engine_name(container.name)
            run = ["run", "--detach", "--restart", "always", "--name", name]
            container.id = docker(*run, *options).stdout.strip()
            self.node.container_ids.add(container.id)
            container.reset(now)
        self._prober.start()

    def _engine_name(self, container: str) -> str:
        self.node.started += 1
        return f"k8s_{container}_{self.name}_{self.node.run}_{self.node.started}"

    def _options(self, spec: Manifest, volumes: dict[str, Path]) -> list[str]:
        """`docker run` options, image and arguments of one container of the pod."""
        # The `kubernetes` Service's variables come first: the kubelet sets them in every
        # container, whatever enableServiceLinks says.
        api = self.node.api.environment() if self.node.api else {}
        env = {**api, **container_env(spec, self.facts)}
        pod_context = self.spec.get("securityContext", {})
        context = {**pod_context, **spec.get("securityContext", {})}
        run = f"directlog.kube.run={self.node.run}"
        options = ["--network", "host", "--label", LABEL, "--label", run]
        if "runAsUser" in context:  # without runAsGroup: the user's group in the image
            group = f":{context['runAsGroup']}" if "runAsGroup" in context else ""
            options += ["--user", f"{context['runAsUser']}{group}"]
        for group in [pod_context.get("fsGroup"), *pod_context.get("supplementalGroups", [])]:
            if group is not None:
                options += ["--group-add", str(group)]
        if context.get("readOnlyRootFilesystem"):
            options.append("--read-only")
        if context.get("allowPrivilegeEscalation") is False:
            options += ["--security-opt", "no-new-privileges"]
        assert not context.get("privileged"), f"{self.name}: privileged containers"
        for capability in context.get("capabilities", {}).get("drop", []):
            options += ["--cap-drop", capability]
        for capability in context.get("capabilities", {}).get("add", []):
            options += ["--cap-add", capability]
        if "memory" in spec.get("resources", {}).get("limits", {}):
            options += ["--memory", str(quantity(spec["resources"]["limits"]["memory"]))]
        for mount in spec.get("volumeMounts", []):
            source = volumes[mount["name"]] / mount.get("subPath", "")
            mode = ":ro" if mount.get("readOnly") else ""
            options += ["--volume", f"{source}:{mount['mountPath']}{mode}"]
        for name, address in self.node.dns():
            options += ["--add-host", f"{name}:{address}"]
        for name, value in env.items():
            options += ["--env", f"{name}={value}"]
        if "workingDir" in spec:
            options += ["--workdir", spec["workingDir"]]
        command = [expand(part, env) for part in spec.get("command", [])]
        args = [expand(part, env) for part in spec.get("args", [])]
        if command:  # command replaces the image's entrypoint (and its CMD), args its CMD
            options += ["--entrypoint", command[0]]
        return [*options, spec["image"], *command[1:], *args]

    def _volumes(self) -> dict[str, Path]:
        """Host directories for the pod's volumes, by name."""
        fs_group = self.spec.get("securityContext", {}).get("fsGroup")
        out: dict[str, Path] = {}
        for volume in self.spec.get("volumes", []):
            name = volume["name"]
            path = self.dir / "volumes" / name
            if "emptyDir" in volume:
                path.mkdir(parents=True)
                path.chmod(0o777)
            elif "configMap" in volume:
                data = self.node.config_maps[volume["configMap"]["name"]]
                _write_items(path, data, volume["configMap"], fs_group)
            elif "secret" in volume:
                data = self.node.secrets[volume["secret"]["secretName"]]
                _write_items(path, data, volume["secret"], fs_group)
            elif "projected" in volume:
                self._project(path, volume["projected"], fs_group)
            elif "persistentVolumeClaim" in volume:
                path = self.node.claim(volume["persistentVolumeClaim"]["claimName"], fs_group)
            else:
                raise NotImplementedError(f"{self.name}: volume {name} of kind {sorted(volume)}")
            out[name] = path
        for template in self.owner["spec"].get("volumeClaimTemplates", []):
            name = template["metadata"]["name"]
            out[name] = self.node.claim(f"{name}-{self.name}", fs_group)
        return out

    def _project(self, path: Path, projected: Manifest, fs_group: int | None) -> None:
        """A projected volume: the ServiceAccount token, ConfigMap and Secret keys and
        downward API fields as files."""
        mode = projected.get("defaultMode", 0o644)
        path.mkdir(parents=True)
        for source in projected["sources"]:
            if "serviceAccountToken" in source:
                assert self.node.api, f"{self.name}: a ServiceAccount token without an API server"
                data = {"token": self.node.api.token}
                items = [{"key": "token", "path": source["serviceAccountToken"]["path"]}]
                _write_items(path, data, {"items": items, "defaultMode": mode}, fs_group)
            elif "configMap" in source or "secret" in source:
                kind = "configMap" if "configMap" in source else "secret"
                name = source[kind]["name"]
                data = (self.node.config_maps if kind == "configMap" else self.node.secrets)[name]
                _write_items(path, data, {"defaultMode": mode, **source[kind]}, fs_group)
            elif "downwardAPI" in source:
                items = source["downwardAPI"]["items"]
                data = {i["path"]: self.facts.field(i["fieldRef"]["fieldPath"]) for i in items}
                keyed = [{"key": i["path"], "path": i["path"]} for i in items]
                _write_items(path, data, {"items": keyed, "defaultMode": mode}, fs_group)
            else:
                raise NotImplementedError(f"{self.name}: projected source {sorted(source)}")

    # Probes ------------------------------------------------------------------------------

    def _probe_loop(self) -> None:
        while not self._stop.wait(PROBE_TICK):
            for container in self.containers:
                self._probe_container(container, time.monotonic())

    def _probe_container(self, container: Container, now: float) -> None:
        probes = container.probes
        if not container.started:
            startup = probes.get("startup")
            if startup is None:
                container.started = True
            elif startup.due <= now:
                startup.record(self._probe(container, startup), now)
                if startup.succeeded:
                    container.started = True
                elif startup.failed:
                    self._restart(container, "startup")
            if not container.started:
                return
        readiness = probes.get("readiness")
        if readiness is None:
            container.ready = True
        elif readiness.due <= now:
            readiness.record(self._probe(container, readiness), now)
            if readiness.succeeded:
                container.ready = True
            elif readiness.failed:
                container.ready = False
        liveness = probes.get("liveness")
        if liveness is not None and liveness.due <= now:
            liveness.record(self._probe(container, liveness), now)
            if liveness.failed:
                self._restart(container, "liveness")

    def _restart(self, container: Container, why: str) -> None:
        """What the kubelet does when a liveness or startup probe fails: stop the container
        within the grace period (its preStop hook first) and start it again, in the same
        pod."""
        grace = int(self.spec.get("terminationGracePeriodSeconds", 30))
        self.node.events.append(f"{self.name}/{container.name}: {why} probe failed, restarting")
        _, left = self._pre_stop(container, grace)
        docker("restart", "--time", str(left), container.id, check=False, timeout=left + 120)
        container.restarts += 1
        container.reset(time.monotonic())

    def _pre_stop(self, container: Container, grace: int) -> tuple[HookRun | None, int]:
        """The container's preStop hook run in it as the kubelet runs it, bounded by the
        grace period; the hook's run and the seconds of grace left for SIGTERM."""
        hook = container.spec.get("lifecycle", {}).get("preStop")
        if hook is None or not container.id:
            return None, grace
        assert set(hook) == {"exec"}, f"{self.name}/{container.name}: preStop {sorted(hook)}"
        started = time.monotonic()
        try:
            done = docker(
                "exec", container.id, *hook["exec"]["command"], check=False, timeout=grace
            )
            run = HookRun(done.returncode, done.stdout + done.stderr)
        except subprocess.TimeoutExpired as expired:
            output = [
                o.decode() if isinstance(o, bytes) else o or ""
                for o in (expired.stdout, expired.stderr)
            ]
            run = HookRun(None, "".join(output))
        if run.code != 0:
            what = f"{self.name}/{container.name}: FailedPreStopHook ({run.code})"
            self.node.events.append(f"{what}: {run.output[-2000:]}")
        # The kubelet counts whole seconds the hook took against the grace period.
        left = max(MINIMUM_GRACE, grace - int(time.monotonic() - started))
        return run, left

    def _probe(self, container: Container, probe: Probe) -> bool:
        spec = probe.spec
        timeout = float(spec.get("timeoutSeconds", 1))
        if "httpGet" in spec:
            get = spec["httpGet"]
            assert get.get("scheme", "HTTP") == "HTTP", f"{self.name}: {get}"
            host, port = get.get("host") or self.address, self._port(container, get["port"])
            connection = http.client.HTTPConnection(host, port, timeout=timeout)
            try:
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders", [])}
                connection.request("GET", get.get("path", "/"), headers=headers)
                return 200 <= connection.getresponse().status < 400
            except OSError:
                return False
            finally:
                connection.close()
        if "tcpSocket" in spec:
            address = spec["tcpSocket"].get("host") or self.address
            port = self._port(container, spec["tcpSocket"]["port"])
            try:
                socket.create_connection((address, port), timeout=timeout).close()
                return True
            except OSError:
                return False
        if "exec" in spec:
            try:
                done = docker(
                    "exec", container.id, *spec["exec"]["command"], check=False, timeout=timeout
                )
            except subprocess.TimeoutExpired:
                return False
            return done.returncode == 0
        raise NotImplementedError(f"{self.name}/{container.name}: probe {sorted(spec)}")

    @staticmethod
    def _port(container: Container, port: int | str) -> int:
        if isinstance(port, int):
            return port
        [number] = [p["containerPort"] for p in container.spec["ports"] if p.get("name") == port]
        return int(number)

    # Stop --------------------------------------------------------------------------------

    def delete(self) -> dict[str, Exit]:
        """SIGTERM to every container at once, SIGKILL to those still running after the
        grace period; how each ended. The pod's volumes go with it, its PVCs stay."""
        self._stop.set()
        if self._prober.is_alive():
            self._prober.join()
        grace = int(self.spec.get("terminationGracePeriodSeconds", 30))
        hooks: dict[str, HookRun | None] = {}

        def stop(container: Container) -> None:
            hooks[container.name], left = self._pre_stop(container, grace)
            docker("stop", "--time", str(left), container.id, check=False, timeout=left + 120)

        stopping = [
            threading.Thread(target=stop, args=(c,), name=f"stop {self.name}/{c.name}")
            for c in self.containers
            if c.id
        ]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()
        exits: dict[str, Exit] = {}
        for container in self.containers:
            if not container.id:
                continue
            status = "{{.State.ExitCode}} {{.State.OOMKilled}} {{.RestartCount}}"
            state = docker("inspect", "--format", status, container.id).stdout.split()
            logs = self.logs(container.name)
            exits[container.name] = Exit(
                int(state[0]),
                state[1] == "true",
                int(state[2]),
                logs,
                hooks.get(container.name),
            )
            docker("rm", "--force", container.id, check=False)
            self.node.container_ids.discard(container.id)
            container.ready = False
        shutil.rmtree(self.dir, ignore_errors=True)
        return exits

    def logs(self, container: str, tail: int = 60) -> str:
        done = docker("logs", "--tail", str(tail), self.container(container).id, check=False)
        return done.stdout + done.stderr


def _write_items(path: Path, data: dict[str, str], source: Manifest, fs_group: int | None) -> None:
    """A ConfigMap's or Secret's keys as files (`items` picks and renames them)."""
    path.mkdir(parents=True, exist_ok=True)
    items = source.get("items") or [{"key": k, "path": k} for k in data]
    for item in items:
        target = path / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data[item["key"]], encoding="utf-8")
        target.chmod(item.get("mode", source.get("defaultMode", 0o644)))
        if fs_group is not None:
            shutil.chown(target, group=fs_group)


class Node:
    """One node running the pods of a rendered release."""

    def __init__(
        self,
        manifests: list[Manifest],
        root: Path,
        *,
        domain: str = "cluster.local",
        spare: int = 1,
        api: FakeApiServer | None = None,
    ) -> None:
        self.root = root
        self.api = api
        self.domain = domain
        self.node_name = socket.gethostname()
        self.run = uuid.uuid4().hex[:8]
        self.started = 0
        self.events: list[str] = []  # probe restarts, for failure messages
        self.container_ids: set[str] = set()
        self.config_maps: dict[str, dict[str, str]] = {}
        self.secrets: dict[str, dict[str, str]] = {}
        self.services: list[Manifest] = []
        self.statefulsets: dict[str, Manifest] = {}
        for m in manifests:
            name = m["metadata"]["name"]
            if m["kind"] == "ConfigMap":
                self.config_maps[name] = dict(m.get("data", {}))
            elif m["kind"] == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in m.get("data", {}).items()}
                self.secrets[name] = {**data, **m.get("stringData", {})}
            elif m["kind"] == "Service":
                self.services.append(m)
            elif m["kind"] == "StatefulSet":
                self.statefulsets[name] = m
        [self.namespace] = {m["metadata"]["namespace"] for m in self.statefulsets.values()}
        self.replicas = {n: int(s["spec"]["replicas"]) for n, s in self.statefulsets.items()}
        self.addresses = self._allocate(spare)
        self.pods: dict[str, Pod] = {}
        if api is not None:
            # What the API server holds: the StatefulSets, this node, and the ConfigMap with
            # the cluster's CA that every namespace gets.
            for name, manifest in self.statefulsets.items():
                api.put_statefulset(self.namespace, name, self.replicas[name], manifest)
            api.put_node(self.node_name, {"kubernetes.io/hostname": self.node_name})
            self.config_maps.setdefault("kube-root-ca.crt", {"ca.crt": api.ca_pem})

    # Addresses and names -------------------------------------------------------------------

    def _allocate(self, spare: int) -> dict[str, str]:
        """A free 127.0.0.x for every pod each StatefulSet may have (replicas + spare): one
        where every port its containers declare can be bound."""
        ports = {
            int(p["containerPort"])
            for s in self.statefulsets.values()
            for c in s["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        names = [f"{n}-{i}" for n, count in self.replicas.items() for i in range(count + spare)]
        out: dict[str, str] = {}
        candidates = (f"127.0.0.{n}" for n in range(FIRST_ADDRESS, 255))
        for name in names:
            out[name] = next(a for a in candidates if _bindable(a, ports))
        return out

    def _owner(self, pod: str) -> Manifest:
        return self.statefulsets[pod.rsplit("-", 1)[0]]

    def dns(self) -> list[tuple[str, str]]:
        """Every name the cluster's DNS would answer now, with its address."""
        out = []
        for service in self.services:
            spec, name = service["spec"], service["metadata"]["name"]
            fqdn = f"{name}.{self.namespace}.svc.{self.domain}"
            selector = spec.get("selector") or {}
            if spec.get("clusterIP") == "None":
                for pod, address in self.addresses.items():
                    owner = self._owner(pod)
                    labels = owner["spec"]["template"]["metadata"].get("labels", {})
                    if owner["spec"].get("serviceName") != name or not _matches(selector, labels):
                        continue
                    running = self.pods.get(pod)
                    if spec.get("publishNotReadyAddresses") or (running and running.ready):
                        out.append((f"{pod}.{fqdn}", address))
            else:
                ready = [
                    p.address
                    for p in self.pods.values()
                    if p.ready and _matches(selector, p.labels)
                ]
                if ready:
                    out.append((fqdn, random.choice(ready)))
        return out

    def hosts_file(self, path: Path) -> Path:
        """This host's /etc/hosts with the cluster's names added, for a process on the host
        that should resolve them as a pod does (bind-mounted over /etc/hosts)."""
        lines = [f"{address}\t{name}" for name, address in self.dns()]
        path.write_text(Path("/etc/hosts").read_text() + "\n".join(lines) + "\n", encoding="utf-8")
        path.chmod(0o644)
        return path

    def claim(self, name: str, fs_group: int | None) -> Path:
        """A PersistentVolumeClaim's volume: made on first use, kept until the end."""
        path = self.root / "claims" / name
        if not path.exists():
            path.mkdir(parents=True)
            if fs_group is None:
                path.chmod(0o777)
            else:  # what the kubelet does for fsGroup: group-owned, setgid, group-writable
                shutil.chown(path, group=fs_group)
                path.chmod(0o2775)
        return path

    # Pods ------------------------------------------------------------------------------------

    def start(self, pod: str) -> Pod:
        assert pod not in self.pods, f"{pod} is running"
        running = self.pods[pod] = Pod(self, pod, self._owner(pod), self.addresses[pod])
        running.start()
        return running

    def delete(self, pod: str) -> dict[str, Exit]:
        return self.pods.pop(pod).delete()

    def install(self, timeout: float) -> None:
        """Every StatefulSet's pods, at once where podManagementPolicy is Parallel, else one
        after another, each Ready before the next; returns once all are Ready."""
        for name, count in self.replicas.items():
            parallel = self.statefulsets[name]["spec"].get("podManagementPolicy") == "Parallel"
            for ordinal in range(count):
                self.start(f"{name}-{ordinal}")
                if not parallel:
                    self.wait_ready([f"{name}-{ordinal}"], timeout)
        self.wait_ready(list(self.pods), timeout)

    def wait_ready(self, pods: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(self.pods[p].ready for p in pods):
            if time.monotonic() > deadline:
                raise AssertionError(f"pods not Ready within {timeout:.0f} s:\n{self.describe()}")
            time.sleep(0.2)

    def rollout_restart(
        self, statefulset: str, timeout: float, ready: Callable[[str], object] = str
    ) -> dict[str, dict[str, Exit]]:
        """`kubectl rollout restart`: each pod deleted and created again, highest ordinal
        first, the next one only once this one is Ready (and `ready(pod)` returned). How
        each old container ended."""
        exits = {}
        for ordinal in reversed(range(self.replicas[statefulset])):
            pod = f"{statefulset}-{ordinal}"
            exits[pod] = self.delete(pod)
            self.start(pod)
            self.wait_ready([pod], timeout)
            ready(pod)
        return exits

    def scale(self, statefulset: str, replicas: int, timeout: float) -> dict[str, dict[str, Exit]]:
        """`kubectl scale`: the StatefulSet's replicas set (in the API server, when there is
        one), then new ordinals started (and Ready), or the highest ones deleted one at a
        time; how the deleted pods' containers ended."""
        current = self.replicas[statefulset]
        if self.api is not None:
            self.api.set_replicas(self.namespace, statefulset, replicas)
        exits = {}
        for ordinal in range(current, replicas):
            self.start(f"{statefulset}-{ordinal}")
        self.wait_ready([f"{statefulset}-{i}" for i in range(current, replicas)], timeout)
        for ordinal in reversed(range(replicas, current)):
            pod = f"{statefulset}-{ordinal}"
            exits[pod] = self.delete(pod)
        self.replicas[statefulset] = replicas
        return exits

    def exec(
        self, pod: str, container: str, *argv: str, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl exec pod -c container -- argv` (not checked)."""
        return docker(
            "exec", self.pods[pod].container(container).id, *argv, check=False, timeout=timeout
        )

    def restarted(self) -> dict[str, int]:
        """Containers of running pods that the engine restarted after they exited, or a
        failed probe had restarted: pod/container -> restarts."""
        containers = {c.id: (pod, c) for pod in self.pods.values() for c in pod.containers}
        out = {}
        if containers:
            inspected = docker("inspect", "--format", "{{.Id}} {{.RestartCount}}", *containers)
            for line in inspected.stdout.splitlines():
                key, count = line.split()
                pod, container = containers[key]
                if int(count) + container.restarts:
                    out[f"{pod.name}/{container.name}"] = int(count) + container.restarts
        return out

    def describe(self) -> str:
        """Each pod's containers, ready or not, with the end of their logs."""
        lines = [*self.events]
        for pod in self.pods.values():
            for c in pod.containers:
                lines.append(
                    f"--- {pod.name}/{c.name} ({pod.address}) ready={c.ready} started={c.started}"
                )
                lines.append(pod.logs(c.name, 15))
        return "\n".join(lines)

    def close(self) -> None:
        """Every container removed (by id), the host directories too."""
        for pod in list(self.pods.values()):
            pod._stop.set()
        mine = f"label=directlog.kube.run={self.run}"
        leftovers = docker("ps", "--all", "--quiet", "--filter", mine, check=False).stdout.split()
        ids = sorted(self.container_ids | set(leftovers))
        if ids:
            docker("rm", "--force", "--volumes", *ids, check=False)
        self.pods.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def _bindable(address: str, ports: set[int]) -> bool:
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((address, port))
            except OSError:
                return False
    return True
