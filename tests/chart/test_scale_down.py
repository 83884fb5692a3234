"""directlog.kube.scale_down, the broker's preStop hook, against the test API server
(tests/chart/apiserver.py): a restart is told from a scale-down by the StatefulSet's
replicas, an API that cannot be read counts as a restart, and a drain that is refused or
runs out of time exits non-zero saying why. The drain itself is replaced here; against real
brokers it runs in tests/kube/test_scale_down_hook.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from directlog.admin.brokers import DrainRefused
from directlog.admin.output import Report
from directlog.admin.reassignment import WaitTimeout
from directlog.admin.session import AdminError
from directlog.kube import scale_down
from tests.chart.apiserver import FakeApiServer, statefulset_path

pytestmark = pytest.mark.timeout(60)

NAMESPACE = "streaming"
STATEFULSET = "directlog-broker"


@dataclass
class Drains:
    calls: list[dict[str, Any]] = field(default_factory=list)
    error: Exception | None = None


@dataclass
class Hook:
    api: FakeApiServer
    account: Path
    drains: Drains

    def run(self, pod: str, *args: str) -> int:
        return scale_down.main(
            ["--pod", pod, "--service-account-dir", str(self.account), "--log-file", "",
             "--timeout", "20", *args]
        )  # fmt: skip


@pytest.fixture
def hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hook]:
    drains = Drains()

    def fake_drain(
        broker: int, replicas: int, bootstrap: str, deadline: float, request_timeout: float
    ) -> Report:
        drains.calls.append(
            {"broker": broker, "replicas": replicas, "bootstrap": bootstrap,
             "deadline": deadline, "request_timeout": request_timeout}
        )  # fmt: skip
        if drains.error is not None:
            raise drains.error
        return Report({}, notes=[f"Broker {broker} holds no replicas any more."])

    monkeypatch.setattr(scale_down, "drain_broker", fake_drain)
    for name in ("POD_NAMESPACE", "DIRECTLOG_BOOTSTRAP_SERVERS", "DIRECTLOG_ADVERTISED_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STATEFULSET_NAME", STATEFULSET)
    monkeypatch.setenv("DIRECTLOG_PORT", "9092")
    with FakeApiServer(tmp_path / "api") as api:
        api.put_statefulset(NAMESPACE, STATEFULSET, replicas=3)
        account = api.write_service_account(tmp_path / "serviceaccount", NAMESPACE)
        for name, value in api.environment().items():
            monkeypatch.setenv(name, value)
        yield Hook(api, account, drains)


def test_a_restart_is_not_drained(hook: Hook, capsys: pytest.CaptureFixture[str]) -> None:
    for ordinal in range(3):
        assert hook.run(f"{STATEFULSET}-{ordinal}") == 0
    assert hook.drains.calls == []
    assert "broker 2 stays (StatefulSet directlog-broker has 3 replicas)" in capsys.readouterr().err
    path = statefulset_path(NAMESPACE, STATEFULSET)
    assert hook.api.requests == [(path, f"Bearer {hook.api.token}")] * 3


def test_a_leaving_broker_is_drained_with_its_own_listener(
    hook: Hook, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook.api.set_replicas(NAMESPACE, STATEFULSET, 2)
    monkeypatch.setenv(
        "DIRECTLOG_ADVERTISED_HOST", "directlog-broker-2.directlog-broker-headless.streaming.svc"
    )
    assert hook.run(f"{STATEFULSET}-2") == 0
    [call] = hook.drains.calls
    assert (call["broker"], call["replicas"]) == (2, 2)
    assert call["bootstrap"] == "directlog-broker-2.directlog-broker-headless.streaming.svc:9092"
    err = capsys.readouterr().err
    assert "broker 2 is leaving (StatefulSet directlog-broker scaled to 2)" in err
    assert "broker 2 drained" in err
    # With listenAddress podIP the chart sets DIRECTLOG_BOOTSTRAP_SERVERS: that one wins.
    monkeypatch.setenv("DIRECTLOG_BOOTSTRAP_SERVERS", "10.244.1.5:9092")
    assert hook.run(f"{STATEFULSET}-3") == 0
    assert [c["broker"] for c in hook.drains.calls] == [2, 3]
    assert hook.drains.calls[1]["bootstrap"] == "10.244.1.5:9092"


def test_the_drain_ends_before_the_timeout(hook: Hook) -> None:
    import time

    hook.api.set_replicas(NAMESPACE, STATEFULSET, 2)
    before = time.monotonic()
    assert hook.run(f"{STATEFULSET}-2", "--timeout", "40") == 0
    [call] = hook.drains.calls
    # The deadline leaves room for the last request, all within the hook's timeout.
    assert call["deadline"] + call["request_timeout"] <= before + 40 + 1


def test_a_refused_drain_exits_non_zero_saying_why(
    hook: Hook, capsys: pytest.CaptureFixture[str]
) -> None:
    hook.api.set_replicas(NAMESPACE, STATEFULSET, 2)
    hook.drains.error = DrainRefused(
        "cannot drain broker 2: only 2 other live broker(s), fewer than the replicas of "
        "orders-0 (replication factor 3); nothing was submitted"
    )
    assert hook.run(f"{STATEFULSET}-2") == scale_down.EXIT_NOT_DRAINED
    err = capsys.readouterr().err
    assert "drain of broker 2 refused: cannot drain broker 2" in err
    assert "orders-0 (replication factor 3)" in err
    assert "under-replicated" in err and "directlog brokers list" in err


def test_a_drain_out_of_time_exits_non_zero_saying_why(
    hook: Hook, capsys: pytest.CaptureFixture[str]
) -> None:
    hook.api.set_replicas(NAMESPACE, STATEFULSET, 2)
    hook.drains.error = WaitTimeout("3 of 5 partition(s) had their target replicas")
    assert hook.run(f"{STATEFULSET}-2") == scale_down.EXIT_NOT_DRAINED
    err = capsys.readouterr().err
    assert "drain of broker 2 not done within 20 s: 3 of 5 partition(s)" in err
    assert "directlog reassign list" in err and "under-replicated" in err


def test_a_failed_drain_exits_non_zero(hook: Hook, capsys: pytest.CaptureFixture[str]) -> None:
    hook.api.set_replicas(NAMESPACE, STATEFULSET, 1)
    hook.drains.error = AdminError("cannot reach the cluster at 127.0.0.1:9092: NoBrokersAvailable")
    assert hook.run(f"{STATEFULSET}-2") == scale_down.EXIT_NOT_DRAINED
    assert "drain of broker 2 failed: cannot reach the cluster" in capsys.readouterr().err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_api_counts_as_a_restart(
    hook: Hook, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scale_down, "API_TIMEOUT", 1.5)
    monkeypatch.setattr(scale_down, "RETRY_SECONDS", 0.2)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(_closed_port()))
    assert hook.run(f"{STATEFULSET}-3") == 0
    assert hook.drains.calls == []
    err = capsys.readouterr().err
    assert "cannot read the StatefulSet directlog-broker" in err
    assert "treated as a restart, broker 3 is not drained" in err


def test_no_permission_counts_as_a_restart_without_retrying(
    hook: Hook, capsys: pytest.CaptureFixture[str]
) -> None:
    hook.api.state.forbidden.add(statefulset_path(NAMESPACE, STATEFULSET))
    assert hook.run(f"{STATEFULSET}-3") == 0
    assert hook.drains.calls == []
    assert "HTTP 403" in capsys.readouterr().err
    assert len(hook.api.requests) == 1


def test_outside_a_pod_counts_as_a_restart(
    hook: Hook, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert hook.run(f"{STATEFULSET}-3") == 0
    assert hook.drains.calls == []
    assert "not in a pod?" in capsys.readouterr().err


def test_a_briefly_unavailable_api_is_retried(hook: Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scale_down, "RETRY_SECONDS", 0.05)
    hook.api.set_replicas(NAMESPACE, STATEFULSET, 3)
    hook.api.state.failures_left = 2
    assert hook.run(f"{STATEFULSET}-3") == 0
    assert [c["broker"] for c in hook.drains.calls] == [3]
    assert len(hook.api.requests) == 3


def test_a_deleted_statefulset_is_not_drained_for(
    hook: Hook, capsys: pytest.CaptureFixture[str]
) -> None:
    hook.api.remove(statefulset_path(NAMESPACE, STATEFULSET))
    assert hook.run(f"{STATEFULSET}-1") == 0
    assert "does not exist (uninstalled?): broker 1 is not drained" in capsys.readouterr().err
    hook.api.put_statefulset(NAMESPACE, STATEFULSET, replicas=0)
    assert hook.run(f"{STATEFULSET}-1") == 0
    assert "scaled to 0" in capsys.readouterr().err
    hook.api.put_statefulset(
        NAMESPACE, STATEFULSET, 1, {"metadata": {"deletionTimestamp": "2025-01-01T00:00:00Z"}}
    )
    assert hook.run(f"{STATEFULSET}-1") == 0
    assert "is being deleted" in capsys.readouterr().err
    assert hook.drains.calls == []


def test_the_namespace_comes_from_the_service_account(hook: Hook) -> None:
    hook.api.put_statefulset("other", STATEFULSET, replicas=1)
    assert hook.run(f"{STATEFULSET}-2", "--namespace", "other") == 0
    assert hook.api.requests[-1][0] == statefulset_path("other", STATEFULSET)
    assert hook.run(f"{STATEFULSET}-2") == 0
    assert hook.api.requests[-1][0] == statefulset_path(NAMESPACE, STATEFULSET)
    assert [c["replicas"] for c in hook.drains.calls] == [1]  # it stays in streaming


def test_bad_environment(
    hook: Hook, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hook.run("broker") == scale_down.EXIT_USAGE
    assert "does not end in -<ordinal>" in capsys.readouterr().err
    monkeypatch.delenv("STATEFULSET_NAME")
    assert hook.run(f"{STATEFULSET}-1") == scale_down.EXIT_USAGE
    assert "STATEFULSET_NAME" in capsys.readouterr().err
