"""The alert rules the Helm chart ships (deploy/helm/directlog/rules/*.yaml) pass promtool's
checks and their unit tests (rules/tests/*_test.yaml: series in, alerts out, each alert seen
firing and not firing), select series only by the scrape job names every scrape
configuration uses (services/monitor.py), and wait long enough before they fire to be worth
waking someone for."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.monitor import JOBS, RULES_DIR

RULE_FILES = sorted(RULES_DIR.glob("*.yaml"))
TEST_FILES = sorted((RULES_DIR / "tests").glob("*_test.yaml"))
PROMTOOL = shutil.which("promtool")  # `make test` installs Debian's prometheus, with promtool
SEVERITIES = {"critical", "warning"}
MIN_FOR_SECONDS = 60
DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def promtool(*args: str | Path) -> str:
    assert PROMTOOL is not None, "promtool is not installed: run the suite through `make test`"
    done = subprocess.run(
        [PROMTOOL, *map(str, args)],
        cwd=RULES_DIR / "tests",
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(map(str, args))}:\n{output}"
    return output


def alerts() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def seconds(duration: str) -> int:
    found = DURATION.match(duration)
    assert found and duration, f"duration {duration!r}"
    hours, minutes, secs = (int(part or 0) for part in found.groups())
    return hours * 3600 + minutes * 60 + secs


def test_there_are_rules_and_tests() -> None:
    assert {p.name for p in RULE_FILES} >= {
        "brokers.yaml",
        "controllers.yaml",
        "consensus.yaml",
        "tiering.yaml",
    }
    assert {p.name for p in TEST_FILES} == {f"{p.stem}_test.yaml" for p in RULE_FILES}


def test_promtool_checks_the_rules() -> None:
    output = promtool("check", "rules", *RULE_FILES)
    assert output.count("SUCCESS") == len(RULE_FILES), output


def test_promtool_unit_tests_pass() -> None:
    output = promtool("test", "rules", *TEST_FILES)
    assert "FAILED" not in output, output


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested not firing"


@pytest.mark.parametrize("rule", alerts(), ids=lambda rule: rule["alert"])
def test_an_alert_says_what_and_how_bad_and_waits(rule: dict[str, Any]) -> None:
    assert rule["alert"].startswith("Directlog")
    assert rule["labels"]["severity"] in SEVERITIES
    assert {"summary", "description"} <= set(rule["annotations"])
    assert seconds(rule["for"]) >= MIN_FOR_SECONDS, "a blip is not worth an alert"


def test_rules_select_series_by_the_documented_job_names() -> None:
    found: set[str] = set()
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                found |= set(re.findall(r'job\s*=~?\s*"([^"]*)"', rule["expr"]))
    assert found == set(JOBS)
