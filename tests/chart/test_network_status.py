"""directlog.kube.network_status: the address a broker pod has on the Multus network its
RNIC sits on, read from the network-status annotation Multus writes (and the downward API
hands the container)."""

from __future__ import annotations

import json

import pytest

from directlog.kube.network_status import NetworkStatusError, address_on, main

STATUS = json.dumps(
    [
        {"name": "cbr0", "interface": "eth0", "ips": ["10.244.1.5"], "default": True},
        {"name": "streaming/sriov-rdma", "interface": "net1", "ips": ["198.51.100.7", "fd00::7"]},
        {"name": "other/sriov-rdma", "interface": "net2", "ips": ["198.51.100.8"]},
    ]
)


@pytest.mark.parametrize(
    ("network", "address"),
    [
        ("sriov-rdma", "198.51.100.7"),  # the pod's own namespace
        ("streaming/sriov-rdma", "198.51.100.7"),
        ("other/sriov-rdma", "198.51.100.8"),
        ("sriov-rdma@net1", "198.51.100.7"),  # the networks annotation's interface form
        (" other/sriov-rdma@net2 ", "198.51.100.8"),
    ],
)
def test_the_first_address_of_the_named_attachment(network: str, address: str) -> None:
    assert address_on(STATUS, network, "streaming") == address


@pytest.mark.parametrize(
    ("status", "network", "message"),
    [
        (STATUS, "macvlan", "no attachment to 'macvlan' in network-status"),
        (STATUS, "sriov-rdma@net9", "no attachment to 'sriov-rdma@net9'"),
        ("{not json", "sriov-rdma", "not JSON"),
        ('{"name": "sriov-rdma"}', "sriov-rdma", "not a list"),
        ('[{"name": "streaming/sriov-rdma", "ips": []}]', "sriov-rdma", "has no address"),
    ],
)
def test_what_cannot_be_read_is_refused_with_the_reason(
    status: str, network: str, message: str
) -> None:
    with pytest.raises(NetworkStatusError, match=message):
        address_on(status, network, "streaming")


def test_the_command_prints_the_address_or_fails_saying_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "streaming")
    monkeypatch.setenv("NETWORK_STATUS", STATUS)
    assert main(["--network", "sriov-rdma"]) == 0
    assert capsys.readouterr().out == "198.51.100.7\n"
    assert main(["--network", "nowhere"]) == 1
    assert "no attachment to 'nowhere'" in capsys.readouterr().err
    monkeypatch.setenv("NETWORK_STATUS", "")
    assert main(["--network", "sriov-rdma"]) == 1
    assert "NETWORK_STATUS is empty" in capsys.readouterr().err
