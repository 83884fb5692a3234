"""Running a rendered container's command the way a kubelet would start it, without a
cluster: the env as Kubernetes builds it (downward API fields, Secret references,
`$(VAR)` expansion of earlier entries), the command run by /bin/sh with the container's
mount paths mapped to temporary directories, and the program it finally execs replaced by
a stub that records its arguments and environment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from directlog.admin.client_config import ENV_PREFIX as CLIENT_PREFIX

RUN_TIMEOUT = 30  # seconds for one container command

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion: $(VAR) of a variable defined earlier, $$ for $; anything
    else stays as it is."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _REFERENCE.sub(replace, text)


@dataclass
class PodFacts:
    """What the downward API and Secrets give the container."""

    pod_name: str
    namespace: str
    node_name: str = "node-a"
    host_ip: str = "10.0.0.7"
    pod_ip: str = "10.244.1.5"
    secrets: dict[tuple[str, str], str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    def field(self, path: str) -> str:
        if path.startswith("metadata.annotations['") and path.endswith("']"):
            return self.annotations.get(path[len("metadata.annotations['") : -2], "")
        return {
            "metadata.name": self.pod_name,
            "metadata.namespace": self.namespace,
            "spec.nodeName": self.node_name,
            "status.hostIP": self.host_ip,
            "status.podIP": self.pod_ip,
        }[path]


def container_env(container: dict[str, Any], facts: PodFacts) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        name = entry["name"]
        if "value" in entry:
            env[name] = expand(str(entry["value"]), env)
        elif "fieldRef" in entry["valueFrom"]:
            env[name] = facts.field(entry["valueFrom"]["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[name] = facts.secrets.get(
                (ref["name"], ref["key"]), f"<{ref['name']}/{ref['key']}>"
            )
        else:
            raise AssertionError(f"env {name}: unexpected source {entry['valueFrom']}")
    return env


@dataclass
class Exec:
    """What the container's command finally ran: its argv, its environment, and the
    mount paths as mapped for the run."""

    argv: list[str]
    env: dict[str, str]
    mounts: dict[str, Path]


STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_RECORD"], "a", encoding="utf-8") as out:
    out.write(json.dumps({{"argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
                           "env": dict(os.environ)}}) + "\\n")
for path in sys.argv[1:]:
    if os.path.isfile(path):  # keep a copy of files it was given (a config), by name
        with open(path, encoding="utf-8") as given, open(os.environ["STUB_RECORD"] + "."
                + os.path.basename(path), "w", encoding="utf-8") as copy:
            copy.write(given.read())
sys.exit(int(os.environ.get("STUB_EXIT", "0")))
"""


def run_container(
    container: dict[str, Any],
    facts: PodFacts,
    workdir: Path,
    programs: list[str],
    files: dict[str, str] | None = None,
) -> list[Exec]:
    """Run the container's command with `programs` stubbed; every stub call, in order.
    `files` puts text at paths inside the container's mounts before the run."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for program in programs:
        stub = bin_dir / program
        stub.write_text(STUB.format(python=sys.executable), encoding="utf-8")
        stub.chmod(0o755)
    # The images' python3 has directlog installed: so has this interpreter.
    python = bin_dir / "python3"
    if not python.exists():
        python.symlink_to(sys.executable)
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        local = workdir / "mounts" / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        mounts[mount["mountPath"]] = local
    for path, text in (files or {}).items():
        target = _mapped(path, mounts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    command = [*container.get("command", []), *container.get("args", [])]
    env = container_env(container, facts)
    command = [_map_paths(expand(part, env), mounts) for part in command]
    record = workdir / "record.jsonl"
    done = subprocess.run(
        command,
        env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_RECORD": str(record)},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert done.returncode == 0, f"{command} failed ({done.returncode}): {done.stderr}"
    if not record.exists():
        return []
    calls = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    for call in calls:
        for key in ("PATH", "STUB_RECORD", "PWD", "SHLVL", "_"):
            call["env"].pop(key, None)
    return [Exec(c["argv"], c["env"], mounts) for c in calls]


def recorded_file(workdir: Path, name: str) -> str:
    return (workdir / f"record.jsonl.{name}").read_text(encoding="utf-8")


def _mapped(path: str, mounts: dict[str, Path]) -> Path:
    for mount_path in sorted(mounts, key=len, reverse=True):
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            return mounts[mount_path] / os.path.relpath(path, mount_path)
    raise AssertionError(f"{path} is in no mount of the container ({sorted(mounts)})")


def _map_paths(text: str, mounts: dict[str, Path]) -> str:
    """Every mount path in `text` replaced by its local directory, in one pass (a mapped
    path is never mapped again)."""
    if not mounts:
        return text
    paths = sorted(mounts, key=len, reverse=True)
    pattern = "|".join(re.escape(p) for p in paths)
    return re.sub(f"({pattern})(?=/|$|[^A-Za-z0-9_.-])", lambda m: str(mounts[m.group(1)]), text)


def settings_from_env(
    monkeypatch: pytest.MonkeyPatch, cls: type[Any], env: dict[str, str], **overrides: Any
) -> Any:
    """`cls` (a service's settings) as the service builds it from this environment and
    nothing else."""
    for name in list(os.environ):
        if name.startswith("DIRECTLOG_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return cls(**overrides)


def unknown_variables(env: dict[str, str], prefix: str, cls: type[Any]) -> set[str]:
    """Variables with the service's prefix that name none of its settings, leaving out the
    admin CLI's (DIRECTLOG_CLIENT_*, DIRECTLOG_BOOTSTRAP_SERVERS), which a broker container
    carries for `directlog` and the drain hook."""
    known = {prefix + name.upper() for name in cls.model_fields} | {cls.config_env}
    cli = {n for n in env if n.startswith(CLIENT_PREFIX)} | {"DIRECTLOG_BOOTSTRAP_SERVERS"}
    return {n for n in env if n.startswith(prefix) and n not in known} - cli
