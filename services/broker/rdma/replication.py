"""RDMA push replication (KafkaDirect §4.3.2, docs/broker.md "RDMA push replication"): the
leader of a preallocated partition writes new batches straight into its followers' head
segments; pull replication stays the fallback whenever a push channel is not healthy.

This module holds what both ends share on one broker: an RdmaEndpoint (endpoint.py:
provider context, protection domain, completion queue, the follower's listener and the
threads feeding the event loop, which owns every channel). The leader's end lives in
replica_leader.py, the follower's in replica_follower.py.
"""

from __future__ import annotations

import asyncio
import logging

from directlog.protocol.api import RequestHeader
from directlog.protocol.rdma_replica import RdmaReplicaRequest, RdmaReplicaResponse
from directlog.rdma import QpCaps, QueuePair, WorkCompletion
from directlog.rdma.verbs import MAX_WR
from services.broker.authorizer import Authorizer
from services.broker.error_codes import error_code_for
from services.broker.metrics import BrokerMetrics
from services.broker.partition import Partition
from services.broker.rdma.endpoint import RdmaEndpoint
from services.broker.rdma.replica_follower import ReplicaFollower
from services.broker.rdma.replica_leader import SEND_SLACK, ReplicaLeader
from services.broker.replica_manager import ReplicaManager
from services.broker.settings import BrokerSettings

log = logging.getLogger(__name__)

MAX_QUEUE_PAIRS = 128  # channels (both ends together) the completion queue has room for


class RdmaReplication:
    """Both ends of push replication on this broker, and the RdmaReplica handler."""

    def __init__(
        self, settings: BrokerSettings, replicas: ReplicaManager, metrics: BrokerMetrics
    ) -> None:
        self._loop = asyncio.get_running_loop()
        credits = settings.rdma_replication_credits
        self._endpoint = RdmaEndpoint(
            "RDMA replication",
            settings,
            settings.rdma_replication_port,
            QpCaps(max_send_wr=SEND_SLACK * credits, max_recv_wr=credits),
            min(MAX_WR, MAX_QUEUE_PAIRS * (SEND_SLACK + 1) * credits),
            self._accepted,
            self._completed,
        )
        pd, listener = self._endpoint.pd, self._endpoint.listener
        self.follower = ReplicaFollower(settings, replicas, pd, listener)
        self.leader = ReplicaLeader(
            settings, replicas, pd, self._endpoint.cq, listener.conn_info.providers, metrics
        )
        self._interval = settings.replica_fetch_backoff_ms / 1000
        self._maintenance = self._loop.create_task(self._maintain())

    async def handle(self, request: RdmaReplicaRequest, header: RequestHeader) -> list[bytes]:
        """RdmaReplica (API key 10002): a leader asks for a grant of our head segment."""
        try:
            answer = self.follower.grant(request)
        except Exception as error:
            code = error_code_for(error)
            log.info("%s-%d: push grant refused: %s", request.topic, request.partition, error)
            answer = RdmaReplicaResponse(code, str(error))
        return [answer.encode()]

    def recheck(self, authorizer: Authorizer | None) -> None:
        """End the push grants this broker made whose holders (leaders' sessions) lost their
        authority (replica_follower.py); their partitions are pulled again."""
        self.follower.recheck(authorizer)

    def leadership_changed(self, partition: Partition) -> None:
        self.follower.leadership_changed(partition)
        self.leader.leadership_changed(partition)

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                self.leader.maintain()
            except Exception:
                log.exception("push replication maintenance failed")

    # On the loop -----------------------------------------------------------------------

    def _accepted(self, qp: QueuePair) -> None:
        self.follower.accepted(qp)

    def _completed(self, wc: WorkCompletion) -> None:
        if self.follower.owns(wc.qp_num):
            self.follower.completed(wc)
        else:
            self.leader.completed(wc)

    async def close(self) -> None:
        """End every channel (followers pull again), stop the threads, close the provider."""
        self._maintenance.cancel()
        await self.leader.close()
        self.follower.close()
        await self._endpoint.close()
