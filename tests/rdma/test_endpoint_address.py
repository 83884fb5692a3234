"""The address a broker's RDMA listener advertises (its conn_info, which every RdmaAccess,
RdmaConsume and RdmaReplica answer carries): rdma_advertised_host when set, else, as
before it existed, advertised_host, else rdma_host, else host."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from directlog.rdma import QpCaps
from services.broker.rdma.endpoint import RdmaEndpoint
from services.broker.settings import BrokerSettings

pytestmark = pytest.mark.timeout(30)


async def advertised(settings: BrokerSettings) -> tuple[str, str]:
    """(host, providers) of the conn_info of an endpoint made with `settings`."""
    endpoint = RdmaEndpoint(
        "test", settings, 0, QpCaps(max_send_wr=2, max_recv_wr=2), 8, lambda qp: None, print
    )
    try:
        info = endpoint.listener.conn_info
        return info.host, ",".join(info.providers)
    finally:
        await endpoint.close()


@pytest.mark.parametrize(
    ("fields", "host"),
    [
        ({}, "127.0.0.1"),
        ({"rdma_host": "127.0.0.2"}, "127.0.0.2"),
        ({"rdma_host": "127.0.0.2", "advertised_host": "broker-0.kafka"}, "broker-0.kafka"),
        (
            {
                "rdma_host": "127.0.0.2",
                "advertised_host": "broker-0.kafka",
                "rdma_advertised_host": "10.56.0.7",
            },
            "10.56.0.7",
        ),
    ],
)
def test_the_rdma_listener_advertises(tmp_path: Path, fields: dict[str, Any], host: str) -> None:
    settings = BrokerSettings(data_dir=tmp_path, rdma_provider="tcp", **fields)
    assert asyncio.run(advertised(settings)) == (host, "tcp")
