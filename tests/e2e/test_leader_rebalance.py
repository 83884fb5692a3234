"""Automatic preferred leader election on a real three-broker cluster: a SIGKILLed broker's
partitions are led by the others while it is away, and once it is back in their ISRs the
controller's periodic check (every 500 ms here, 300 s by default) hands them back to it,
their preferred replica, while a producer keeps sending with acks=all.

Leadership then moves away from a live leader that becomes a follower, so the usual
replication checks close the test: nothing acknowledged lost, replicas byte-identical.
Every broker is asked for its own metadata (a restarted broker's image may lag). Waits are
bounded; nothing asserts on durations.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.replicated import (
    PARTITIONS,
    TIMEOUT,
    Load,
    check_no_acknowledged_record_lost,
    check_replicas_identical,
    create_topic,
    partitions,
    read_back,
)

CHECK_INTERVAL_MS = 500
PREFERRED_ELECTIONS = "directlog_controller_preferred_leader_elections_total"


def leaders_seen(cluster: Cluster) -> list[dict[int, tuple[int, int]]]:
    """Per running broker, its own metadata: partition -> (leader, preferred replica)."""
    seen = []
    for broker in cluster.brokers.values():
        if broker.running:
            found = partitions(broker.bootstrap)
            assert len(found) == PARTITIONS, found
            seen.append({i: (int(p.leader), int(p.replicas[0])) for i, p in found.items()})
    return seen


def all_preferred(cluster: Cluster) -> bool:
    return all(
        leader == preferred
        for image in leaders_seen(cluster)
        for leader, preferred in image.values()
    )


def led_elsewhere(cluster: Cluster, led: set[int], gone: int) -> bool:
    return all(image[p][0] not in (gone, -1) for image in leaders_seen(cluster) for p in led)


@pytest.mark.timeout(120)
def test_a_restarted_broker_leads_its_preferred_partitions_again(tmp_path: Path) -> None:
    settings = {"leader_imbalance_check_interval_ms": CHECK_INTERVAL_MS}
    with Cluster(tmp_path, brokers=3, controller_settings=settings) as cluster:
        create_topic(cluster)
        controller = cluster.controllers[0]
        assert all_preferred(cluster)  # a new partition's first replica leads it
        assert controller.sample(PREFERRED_ELECTIONS) == 0
        victim = leaders_seen(cluster)[0][0][1]
        led = {p for p, (leader, _) in leaders_seen(cluster)[0].items() if leader == victim}

        with Load(cluster.bootstrap) as load:
            load.wait_acked(200)
            cluster.brokers[victim].kill()
            wait_for(
                lambda: led_elsewhere(cluster, led, victim),
                TIMEOUT,
                f"broker {victim}'s partitions {sorted(led)} led by the others",
            )
            assert not all_preferred(cluster)
            load.wait_acked(200)

            cluster.brokers[victim].start()
            wait_for(
                lambda: all_preferred(cluster),
                TIMEOUT,
                "every partition led by its preferred replica again, in every broker's image",
            )
            load.wait_acked(200)

        elections = controller.sample(PREFERRED_ELECTIONS)
        assert elections is not None and elections >= len(led), cluster.logs()
        assert "preferred leader election" in controller.stderr_text()
        assert load.failed == 0, f"{load.failed} sends failed: {load.failures[:3]}"
        stored = read_back(cluster)
        duplicates = check_no_acknowledged_record_lost(load, stored)
        check_replicas_identical(cluster, stored)
        print(
            f"acknowledged {load.count()}, duplicates {duplicates}, "
            f"preferred leader elections {elections:.0f}"
        )
