"""A rolling restart under acks=all load, as operators do it: each broker in turn gets
SIGTERM and is started again once every ISR is complete.

With controlled shutdown a stopping broker hands its leaderships over before it exits, so
producers see a leader change (a retry) rather than a session timeout of unavailability, and
the restarted process registers at once instead of waiting for its old session to expire.
The usual replication checks close it: nothing acknowledged lost, replicas byte-identical.
Waits are bounded; nothing asserts on durations.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from directlog.protocol.errors import ErrorCode
from directlog.rpc import controller_pb2 as pb
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.replicated import (
    TIMEOUT,
    TOPIC,
    Load,
    all_in_sync,
    check_no_acknowledged_record_lost,
    check_replicas_identical,
    create_topic,
    read_back,
)

# Well within BrokerProcess's 10 s stop timeout, after which it would SIGKILL.
SHUTDOWN_SETTINGS = {"controlled_shutdown_timeout_ms": 5000}
REFUSED = ("DUPLICATE_BROKER_REGISTRATION", "registration refused")


def leaders(cluster: Cluster) -> dict[int, int]:
    """Partition -> leader, as the running brokers' metadata says."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    found = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
    return {index: int(p.leader) for index, p in found.items()}


def stderr_of_start(broker: BrokerProcess, start: int) -> str:
    """What the broker logged from its `start`-th start on (BrokerProcess marks each)."""
    marker = f"----- broker start {start}:"
    text = broker.stderr_text()
    assert marker in text, f"no stderr section for start {start}"
    return text.split(marker, 1)[1].split(f"----- broker start {start + 1}:", 1)[0]


@pytest.mark.timeout(180)
def test_rolling_restart_under_load_moves_leaders_first_and_loses_nothing(
    tmp_path: Path,
) -> None:
    with Cluster(tmp_path, brokers=3, broker_settings=SHUTDOWN_SETTINGS) as cluster:
        create_topic(cluster)
        moved = 0
        with Load(cluster.bootstrap) as load:
            load.wait_acked(200)
            for node_id in cluster.brokers:
                moved += restart(cluster, node_id)
                load.wait_acked(200)
        assert load.failed == 0, f"{load.failed} sends failed: {load.failures[:3]}"
        assert moved > 0  # at least one restart had leaderships to hand over
        assert all(b.exit_codes == [0] for b in cluster.brokers.values())
        check_controller(cluster)
        stored = read_back(cluster)
        duplicates = check_no_acknowledged_record_lost(load, stored)
        check_replicas_identical(cluster, stored)
        print(f"acknowledged {load.count()}, duplicates {duplicates}, leaderships moved {moved}")


def check_controller(cluster: Cluster) -> None:
    """One controlled shutdown counted per restart, and only current registrations may
    ask: the first incarnation's epoch is over, and an unknown id is refused."""
    controller = cluster.controllers[0]
    assert controller.sample("directlog_controller_controlled_shutdowns_total") == 3
    with controller.channel() as channel:
        stub = controller.stub(channel)
        for broker_id, epoch, error in [
            (0, 1, ErrorCode.STALE_BROKER_EPOCH),
            (7, 1, ErrorCode.BROKER_ID_NOT_REGISTERED),
        ]:
            request = pb.ControlledShutdownRequest(broker_id=broker_id, broker_epoch=epoch)
            reply = stub.ControlledShutdown(request, timeout=10)
            assert (reply.error_code, reply.remaining_leaderships) == (error, 0), reply


def restart(cluster: Cluster, node_id: int) -> int:
    """SIGTERM the broker, check it handed its leaderships over before it exited, start it
    again, check it was let in at once, and wait until every ISR is complete. Returns how
    many leaderships it handed over."""
    broker = cluster.brokers[node_id]
    led = {p for p, leader in leaders(cluster).items() if leader == node_id}
    start = broker.starts
    assert broker.stop() == 0 and not broker.killed, cluster.logs()
    # Its own image showed its partitions led elsewhere before it exited: they moved
    # during its shutdown, not at the end of its session (which the controller would log).
    stopped = stderr_of_start(broker, start)
    assert "controlled shutdown done" in stopped, stopped[-3000:]
    wait_for(
        lambda: all(leaders(cluster)[p] not in (node_id, -1) for p in led),
        TIMEOUT,
        f"the other brokers' images to show broker {node_id}'s partitions moved",
    )
    assert "no heartbeat for the session" not in cluster.controllers[0].stderr_text()
    # Its last heartbeat said it stops: fenced at once, not at the end of its session.
    wait_for(
        lambda: f"broker {node_id} stopped: fenced" in cluster.controllers[0].stderr_text(),
        TIMEOUT,
        f"the controller to fence the stopped broker {node_id}",
    )

    broker.start()
    restarted = stderr_of_start(broker, broker.starts)
    assert not any(line in restarted for line in REFUSED), restarted[-3000:]
    wait_for(lambda: all_in_sync(cluster), TIMEOUT, "every ISR complete again")
    return len(led)
