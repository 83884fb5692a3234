"""Build every Directlog image, in dependency order, tagged with the project version.

    python3 deploy/images/build.py            # make images
    python3 deploy/images/build.py broker     # the shared stages, then only these
    BASE_IMAGE=debian:bookworm-slim python3 deploy/images/build.py

1. The engine: deploy/images/engine.sh (Debian's docker.io, started when not running).
2. The base: BASE_IMAGE when given; else deploy/images/base.sh's debootstrap image, made
   once (no registry is reachable here).
3. deploy/images/Containerfile's stages python, spark-packages and runtime, tagged
   directlog/STAGE:VERSION, then services/*/Containerfile and pipelines/Containerfile from
   them (each takes the stages as build arguments: RUNTIME_IMAGE, ...).

apt and pip inside the builds reach the registries through the host's network (no bridge
exists) with the host's CA bundle and pip index settings, passed as BuildKit secrets: they
are mounted for the RUN steps that need them and never stored in a layer. Layer caching
makes a build with nothing changed take seconds. Stdlib only: it runs on the host's python3.
Each build's log goes to build/images/NAME.log.
"""

from __future__ import annotations

import argparse
import configparser
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LOGS = REPO / "build" / "images"
DOCKER = os.environ.get("DOCKER", "/usr/bin/docker")
OFFLINE_BASE = "directlog/debian-base:bookworm"

# name: Containerfile, each built from the shared stages.
IMAGES = {
    "broker": "services/broker/Containerfile",
    "controller": "services/controller/Containerfile",
    "consensus": "services/consensus/Containerfile",
    "tiering": "services/tiering/Containerfile",
    "spark": "pipelines/Containerfile",
}

# The shared Containerfile's stages the images are built from, tagged directlog/STAGE:VERSION.
STAGES = ("python", "spark-packages", "runtime")

# pip settings worth passing into a build: where packages come from and how to reach it.
PIP_KEYS = ("index-url", "extra-index-url", "trusted-host", "find-links", "proxy", "timeout")
PIP_URL_KEYS = ("index-url", "extra-index-url", "find-links")


def version() -> str:
    with open(REPO / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def pip_settings() -> dict[str, str]:
    """The host's pip settings, as pip reads them: config files (site, then user, then
    PIP_CONFIG_FILE), then PIP_* variables. Local paths and file: URLs are dropped, since the
    build cannot see the host's disk."""
    files = [
        Path("/etc/xdg/pip/pip.conf"),
        Path("/etc/pip.conf"),
        Path.home() / ".pip" / "pip.conf",
        Path.home() / ".config" / "pip" / "pip.conf",
    ]
    if os.environ.get("PIP_CONFIG_FILE"):
        files.append(Path(os.environ["PIP_CONFIG_FILE"]))
    config = configparser.ConfigParser(interpolation=None)
    config.read([f for f in files if f.is_file()])
    settings: dict[str, str] = {}
    for section in ("global", "install"):
        if config.has_section(section):
            settings.update({k: v for k, v in config.items(section) if k in PIP_KEYS})
    for key in PIP_KEYS:
        value = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if value:
            settings[key] = value
    if "timeout" not in settings and os.environ.get("PIP_DEFAULT_TIMEOUT"):
        settings["timeout"] = os.environ["PIP_DEFAULT_TIMEOUT"]
    for key in PIP_URL_KEYS:
        if key in settings:
            urls = [u for u in settings[key].split() if u.startswith(("http://", "https://"))]
            settings[key] = " ".join(urls)
    return {k: v for k, v in settings.items() if v}


def ca_bundle() -> Path:
    """The CA bundle the host's pip and apt trust (its registries may sit behind a proxy that
    re-signs them), which the builds need too."""
    candidates = [os.environ.get(name) for name in ("DIRECTLOG_BUILD_CA", "PIP_CERT")]
    candidates += [os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    sys.exit("build.py: no CA bundle found (set DIRECTLOG_BUILD_CA)")


def run_script(name: str, env: dict[str, str]) -> None:
    subprocess.run(["bash", str(HERE / name)], check=True, env=env)


def build(name: str, args: list[str], secrets: list[str], env: dict[str, str]) -> None:
    """One `docker build` from the repository root; its output to build/images/NAME.log."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"{name}.log"
    command = [DOCKER, "build", "--network", "host", "--progress", "plain", *secrets, *args]
    command.append(str(REPO))
    started = time.monotonic()
    with open(log, "w") as out:
        out.write(" ".join(command) + "\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    took = time.monotonic() - started
    if done.returncode != 0:
        sys.stderr.write(log.read_text(errors="replace")[-6000:])
        sys.exit(f"build.py: {name} failed after {took:.0f} s (log: {log})")
    print(f"build.py: {name} built in {took:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images", nargs="*", metavar="IMAGE", help=f"{', '.join(IMAGES)}")
    images = parser.parse_args().images or list(IMAGES)
    if unknown := set(images) - set(IMAGES):
        parser.error(f"unknown images: {', '.join(sorted(unknown))}")
    tag = version()
    env = dict(os.environ, DOCKER=DOCKER, DOCKER_BUILDKIT="1")
    started = time.monotonic()
    run_script("engine.sh", env)
    base = os.environ.get("BASE_IMAGE")
    if not base:
        base = OFFLINE_BASE
        run_script("base.sh", dict(env, BASE_TAG=base))
    proxies = [
        arg
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
        for variant in (name, name.lower())
        if os.environ.get(variant)
        for arg in ("--build-arg", variant)
    ]
    with tempfile.TemporaryDirectory(prefix="directlog-images-") as secrets_dir:
        pip_conf = Path(secrets_dir) / "pip.conf"
        lines = ["[global]", *(f"{k} = {v}" for k, v in sorted(pip_settings().items()))]
        pip_conf.write_text("\n".join(lines) + "\n")
        secrets = ["--secret", f"id=ca,src={ca_bundle()}", "--secret", f"id=pipconf,src={pip_conf}"]
        stages = {stage: f"directlog/{stage}:{tag}" for stage in STAGES}
        for stage, stage_tag in stages.items():
            build(
                stage,
                [
                    *("-f", str(HERE / "Containerfile"), "--target", stage, "-t", stage_tag),
                    *("--build-arg", f"BASE_IMAGE={base}", *proxies),
                ],
                secrets,
                env,
            )
        stage_args = [
            arg
            for stage, stage_tag in stages.items()
            for arg in ("--build-arg", f"{stage.upper().replace('-', '_')}_IMAGE={stage_tag}")
        ]
        for name in images:
            build(
                name,
                [
                    *("-f", str(REPO / IMAGES[name]), "-t", f"directlog/{name}:{tag}"),
                    *stage_args,
                    *proxies,
                    # the labels every image shares, here rather than in each Containerfile
                    *("--label", f"org.opencontainers.image.version={tag}"),
                    *("--label", f"org.opencontainers.image.base.name={stages['runtime']}"),
                ],
                secrets,
                env,
            )
    # Images of ours that a rebuild left untagged; other images and the layer cache stay.
    subprocess.run(
        [
            DOCKER,
            "image",
            "prune",
            "--force",
            "--filter",
            "label=org.opencontainers.image.vendor=Directlog",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    took = time.monotonic() - started
    print(f"build.py: {len(images)} images and {len(STAGES)} stages, tag {tag}, in {took:.0f} s")


if __name__ == "__main__":
    main()
