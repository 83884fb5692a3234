"""`python -m services.broker` / `directlog-broker`: run one broker in the foreground.

The broker binds its Kafka port, registers with the controller, and starts answering
clients once it holds the controller's cluster image. SIGTERM or SIGINT first hands its
partitions over (controlled shutdown), then stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import uvloop

from directlog import heap
from directlog.protocol.errors import KafkaError
from directlog.remote.store import RemoteStore
from directlog.rpc import controller_pb2 as pb
from directlog.topic_config import LogConfig
from directlog.waits import within
from services.broker.apis import KafkaApis
from services.broker.authentication import (
    inter_broker_security,
    listener_security,
    session_settings,
    stored_credentials,
)
from services.broker.authorization import Access
from services.broker.cluster_metadata import ClusterImage, SecurityKind
from services.broker.controller_link import ControllerLink
from services.broker.groups.coordinator import CoordinatorSettings, GroupCoordinator
from services.broker.groups.group import GroupLimits
from services.broker.groups.handlers import GroupApis
from services.broker.groups.offsets_topic import OFFSETS_TOPIC
from services.broker.kafka_exporter import KafkaExporterMetrics
from services.broker.metrics import BrokerMetrics
from services.broker.producer_ids import ProducerIdAllocator
from services.broker.quotas import QuotaManager
from services.broker.rdma.consume import RdmaConsume
from services.broker.rdma.produce import RdmaProduce
from services.broker.rdma.replication import RdmaReplication
from services.broker.replica_fetcher import FetchSettings
from services.broker.replica_manager import ReplicaManager
from services.broker.server import KafkaServer
from services.broker.settings import BrokerSettings
from services.broker.storage.log_manager import LogManager
from services.broker.tiered.remote_reads import RemoteReader
from services.broker.tiered.remote_state import RemoteLogState
from services.broker.tiered.service import TieringService
from services.broker.tiered.service import serve as serve_tiering

log = logging.getLogger("directlog.broker")

SHUTDOWN_POLL_SECONDS = 0.02  # how often a controlled shutdown looks at the image
PRODUCER_EXPIRY_CHECK_SECONDS = 600  # Kafka's producer.id.expiration.check.interval.ms
COMPACTION_PASSES_PER_ROUND = 8


class ClusterIdMismatchError(RuntimeError):
    """The data directory belongs to another cluster (Kafka: InconsistentClusterIdException)."""


def check_cluster_id(data_dir: Path, cluster_id: str) -> None:
    """Keep the cluster id in `meta.properties` (Kafka's file); refuse a data directory
    written for another cluster, whose logs the image would otherwise delete as strays."""
    meta = data_dir / "meta.properties"
    if meta.exists():
        for line in meta.read_text(encoding="utf-8").splitlines():
            if line.startswith("cluster.id="):
                found = line.split("=", 1)[1].strip()
                if found != cluster_id:
                    raise ClusterIdMismatchError(
                        f"{data_dir} holds data of cluster {found}, not of {cluster_id}"
                    )
                return
    meta.write_text(f"version=1\ncluster.id={cluster_id}\n", encoding="utf-8")


async def run_broker(settings: BrokerSettings, stop: asyncio.Event) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    defaults = LogConfig.from_properties(settings.log_defaults)
    image = ClusterImage(defaults, settings.inter_broker(), settings.node_id)
    logs = LogManager.open(
        settings.data_dir,
        image.config_for,
        producer_id_expiration_ms=settings.producer_id_expiration_ms,
        configs_pending=True,
        head_segments_dir=settings.rdma_head_segments_dir,
    )
    metrics = BrokerMetrics()
    metrics.watch_logs(logs)
    loop = asyncio.get_running_loop()
    failure: asyncio.Future[None] = loop.create_future()  # a broker that cannot follow
    fetch = FetchSettings(
        settings.node_id,
        settings.replica_fetch_wait_max_ms,
        settings.replica_fetch_max_bytes,
        settings.replica_fetch_backoff_ms,
        inter_broker_security(settings),
    )
    replicas = ReplicaManager(
        settings.node_id, logs, image, fetch, lambda: apis.data_arrived(), metrics
    )
    metrics.watch_replicas(replicas)

    def apply(update: pb.MetadataUpdate) -> None:
        try:
            change = image.apply(update)
            if change is None:
                return
            check_cluster_id(settings.data_dir, image.cluster_id)
            replicas.apply(change)
            apis.image_changed()
        except Exception as error:  # the image must not serve
            if not failure.done():
                failure.set_exception(error)

    link = ControllerLink(
        settings.controllers,
        settings.node_id,
        [],
        settings.rack,
        settings.heartbeat_interval_ms / 1000,
        apply,
        tls=settings.controller_tls,
    )
    metrics_port = metrics.serve(
        settings.host, settings.metrics_port, lambda: readiness(link, image, settings.node_id)
    )
    coordinator = GroupCoordinator(
        coordinator_settings(settings), lambda: _partition_count(image, settings)
    )
    replicas.leadership_listeners.append(coordinator.leadership_changed)
    metrics.watch_groups(coordinator)
    exporter = KafkaExporterMetrics(settings.node_id, image, replicas, coordinator, loop)
    metrics.registry.register(exporter)  # kafka_exporter's names: lag without an exporter
    producer_ids = ProducerIdAllocator(link)
    access = Access.from_settings(settings, image)  # None: the authorizer is off
    apis = KafkaApis(
        settings,
        image,
        replicas,
        link,
        metrics,
        GroupApis(coordinator, image, metrics, access),
        producer_ids,
        access,
    )
    replicas.leadership_listeners.append(apis.transactions.leadership_changed)
    quotas = QuotaManager(
        window_num=settings.quota_window_num, window_seconds=settings.quota_window_size_seconds
    )
    follow_client_quotas(apis, image, quotas)
    replicas.link = link
    if settings.rdma_produce:
        apis.rdma = RdmaProduce(settings, replicas, metrics)
        replicas.leadership_listeners.append(apis.rdma.leadership_changed)
    if settings.rdma_replication:
        apis.rdma_replication = RdmaReplication(settings, replicas, metrics)
        replicas.leadership_listeners.append(apis.rdma_replication.leadership_changed)
    if settings.rdma_consume:
        apis.rdma_reads = RdmaConsume(settings, replicas, metrics)
        replicas.leadership_listeners.append(apis.rdma_reads.leadership_changed)
    recheck_rdma_grants(apis, image, access)
    tiering: grpc.aio.Server | None = None
    tiering_line = ""
    if settings.remote_log_storage_system_enable:
        store = RemoteStore(settings.store_config())
        apis.remote_reads = RemoteReader(
            store,
            settings.remote_log_reader_threads,
            settings.remote_log_reader_max_pending_tasks,
            metrics,
        )
        replicas.remote_state = RemoteLogState(store, link)
        tiering, tiering_port = await serve_tiering(
            TieringService(replicas, link),
            settings.tiering_host,
            settings.tiering_port,
            settings.tiering_tls,
        )
        tiering_line = (
            f"  tiering (gRPC)     {settings.tiering_host}:{tiering_port}, "
            f"remote store {store.root_uri}\n"
        )
    sessions = session_settings(settings, stored_credentials(image.scram_credential))
    server = KafkaServer(apis, metrics, settings.socket_request_max_bytes, sessions)
    listener_lines = ""
    for listener in settings.kafka_listeners():
        bound = server.listen(
            listener.host, listener.port, listener.name, listener_security(settings, listener)
        )
        host = listener.advertised_host or listener.host
        port = listener.advertised_port or bound
        link.listeners.append(pb.Listener(name=listener.name, host=host, port=port))
        listener_lines += (
            f"  listener {listener.name:<9} {listener.host}:{bound}, advertised {host}:{port}"
            f" ({listener.protocol})\n"
        )
    bootstrap = f"{link.listeners[0].host}:{link.listeners[0].port}"
    link.start()
    coordinator.start()
    apis.transactions.start()
    fsyncs = ThreadPoolExecutor(1, thread_name_prefix="housekeeping")
    housekeeping = loop.create_task(_housekeeping(logs, replicas, settings, fsyncs))
    compaction = loop.create_task(_compaction(logs, settings))
    handed_over = False  # a controlled shutdown ran: the controller may fence us at once
    try:
        await _first(link.first_image, stop, failure)
        if not stop.is_set():
            server.serve()
            print(
                f"Directlog broker {settings.node_id} ready\n"
                f"  bootstrap servers  {bootstrap}\n"
                f"{listener_lines}"
                f"  metrics            http://{settings.host}:{metrics_port}/metrics\n"
                f"  controllers        {','.join(settings.controllers)}\n"
                f"  data               {settings.data_dir.resolve()}\n"
                f"{tiering_line}"
                f"  stop with Ctrl-C",
                flush=True,
            )
            heap.settle()
            await _first(stop, stop, failure)
            link.stopping()
            await controlled_shutdown(
                link, image, settings.node_id, settings.controlled_shutdown_timeout_ms / 1000
            )
            handed_over = settings.controlled_shutdown_timeout_ms > 0
    finally:
        log.info("stopping")
        housekeeping.cancel()
        compaction.cancel()
        await coordinator.close()
        await apis.transactions.close()
        if apis.verifier is not None:
            await apis.verifier.close()
        await exporter.close()
        await producer_ids.close()
        await link.close(fence=handed_over)
        await replicas.close()
        await server.close()
        if tiering is not None:
            await tiering.stop(1.0)
        if apis.remote_reads is not None:
            apis.remote_reads.close()
        if apis.rdma is not None:
            await apis.rdma.close()
        if apis.rdma_replication is not None:
            await apis.rdma_replication.close()
        if apis.rdma_reads is not None:
            await apis.rdma_reads.close()
        fsyncs.shutdown(wait=True)  # a flush still running must end before the logs close
        logs.close()
        log.info("stopped cleanly")


def follow_client_quotas(apis: KafkaApis, image: ClusterImage, quotas: QuotaManager) -> None:
    """Enforce the image's client quotas from the moment it takes them; with none
    configured the request path does not consult the manager at all."""

    def changed(kinds: frozenset[SecurityKind]) -> None:
        if SecurityKind.CLIENT_QUOTAS in kinds:
            quotas.configure(image.client_quotas)
            apis.client_quotas = quotas if image.client_quotas else None

    changed(frozenset({SecurityKind.CLIENT_QUOTAS}))
    image.on_security_change.append(changed)


def recheck_rdma_grants(apis: KafkaApis, image: ClusterImage, access: Access | None) -> None:
    """Revoke the RDMA grants whose holders lost their authority the moment the image takes
    an ACL or SCRAM change: produce and consume grants, and the push grants leaders hold
    on this broker's head segments. A grant bypasses the per-request checks and
    re-authentication (docs/security.md, "RDMA grants"). Registered after `access`
    follows the image, so the authorizer already has the new ACLs."""

    def changed(kinds: frozenset[SecurityKind]) -> None:
        if not kinds & {SecurityKind.ACLS, SecurityKind.SCRAM_CREDENTIALS}:
            return
        authorizer = access.authorizer if access is not None else None
        for grants in (apis.rdma, apis.rdma_reads, apis.rdma_replication):
            if grants is not None:
                try:
                    grants.recheck(authorizer)
                except Exception:  # the image is applied: the other grants still count
                    log.exception("RDMA grants not rechecked")

    image.on_security_change.append(changed)


def coordinator_settings(settings: BrokerSettings) -> CoordinatorSettings:
    return CoordinatorSettings(
        GroupLimits(
            settings.group_initial_rebalance_delay_ms,
            settings.group_min_session_timeout_ms,
            settings.group_max_session_timeout_ms,
            settings.group_max_size,
        ),
        settings.offsets_commit_timeout_ms,
        settings.offset_metadata_max_bytes,
        settings.offsets_retention_ms,
        settings.offsets_retention_check_interval_ms,
    )


def _partition_count(image: ClusterImage, settings: BrokerSettings) -> int:
    """Partitions of the offsets topic: as created, or as it will be created."""
    topic = image.topic(OFFSETS_TOPIC)
    return len(topic.partitions) if topic else settings.offsets_topic_num_partitions


def readiness(link: ControllerLink, image: ClusterImage, node_id: int) -> str | None:
    """What /readyz reports: a broker is ready once it is registered, unfenced, holds the
    cluster image and is in the ISR of every partition it replicates that has a leader —
    so a rolling restart moves on to the next broker only when this one has caught up."""
    if link.broker_epoch < 0 or not link.first_image.is_set():
        return "not registered with a controller yet"
    me = image.brokers.get(node_id)
    if me is None or me.fenced:
        return "fenced by the controller"
    behind = sorted(
        f"{topic.name}-{info.partition}"
        for topic, info in image.hosted_by(node_id)
        if info.leader >= 0 and node_id not in info.isr
    )
    if behind:
        shown = ", ".join(behind[:5]) + (", ..." if len(behind) > 5 else "")
        return f"not yet in the ISR of {len(behind)} partitions: {shown}"
    return None


async def controlled_shutdown(
    link: ControllerLink, image: ClusterImage, broker_id: int, timeout: float
) -> None:
    """Before stopping: ask the controller to move this broker's leaderships and ISR
    memberships away, then keep serving until the image shows it leads no partition that
    another live ISR member could lead, for at most ``timeout`` seconds. Followers keep
    fetching from it until the new leaders reach their images, and the controller is
    asked again if a new one takes over meanwhile (the mark lives in its memory). When no
    controller answers it logs one line and returns: the broker stops anyway."""
    if timeout <= 0:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    asked: int | None = None  # the controller epoch asked last
    while True:
        if asked != image.controller_epoch:
            asked = image.controller_epoch
            try:
                remaining = await within(
                    link.controlled_shutdown(), max(deadline - loop.time(), 0.001)
                )
            except (KafkaError, TimeoutError) as error:
                log.warning(
                    "controlled shutdown skipped, stopping anyway: %s",
                    str(error) or "the controller did not answer in time",
                )
                return
            log.info(
                "controlled shutdown: the controller moved what it could; "
                "%d partitions have no other in-sync replica and stay led here",
                remaining,
            )
        movable = _movable_leaderships(image, broker_id)
        if not movable:
            log.info("controlled shutdown done: no partition that another replica can lead")
            return
        if loop.time() >= deadline:
            log.warning(
                "controlled shutdown timed out after %.1f s; still leading %d partitions "
                "with other in-sync replicas",
                timeout,
                movable,
            )
            return
        await asyncio.sleep(SHUTDOWN_POLL_SECONDS)


def _movable_leaderships(image: ClusterImage, broker_id: int) -> int:
    """Partitions this broker leads, per its image, whose ISR has another unfenced member."""
    live = {b.broker_id for b in image.live_brokers()}
    return sum(
        p.leader == broker_id and any(b != broker_id and b in live for b in p.isr)
        for topic in image.topics.values()
        for p in topic.partitions.values()
    )


async def _first(event: asyncio.Event, stop: asyncio.Event, failure: asyncio.Future[None]) -> None:
    """Until `event` or `stop` is set; raises what `failure` holds if it fails first."""
    waits: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(event.wait()),
        asyncio.ensure_future(stop.wait()),
    ]
    try:
        await asyncio.wait([*waits, failure], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    if failure.done():
        failure.result()


async def _housekeeping(
    logs: LogManager, replicas: ReplicaManager, settings: BrokerSettings, fsyncs: Executor
) -> None:
    """flush.ms, retention, checkpoints (fsyncs on their thread), ISR shrinking and
    idempotent producers' expiry, off the request path."""
    loop = asyncio.get_running_loop()
    interval = min(settings.housekeeping_interval_ms, settings.replica_lag_time_max_ms // 2)
    next_producer_expiry = loop.time() + PRODUCER_EXPIRY_CHECK_SECONDS
    while True:
        await asyncio.sleep(interval / 1000)
        try:
            replicas.shrink_isrs(settings.replica_lag_time_max_ms)
            logs.enforce_retention()
            await loop.run_in_executor(fsyncs, logs.flush_due)
            await loop.run_in_executor(fsyncs, logs.checkpoint)
            if loop.time() >= next_producer_expiry:
                next_producer_expiry = loop.time() + PRODUCER_EXPIRY_CHECK_SECONDS
                logs.expire_producers()
        except Exception:
            log.exception("housekeeping round failed")


async def _compaction(logs: LogManager, settings: BrokerSettings) -> None:
    """Compaction passes on a worker thread, apart from housekeeping so a long pass holds
    back neither ISR shrinking nor flushes."""
    while True:
        await asyncio.sleep(settings.housekeeping_interval_ms / 1000)
        try:
            for _ in range(COMPACTION_PASSES_PER_ROUND):  # more may be due: go on at once
                if await asyncio.to_thread(logs.clean_compacted) is None:
                    break
        except Exception:
            log.exception("compaction pass failed")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="directlog-broker", description=__doc__)
    parser.add_argument("--config", type=Path, help="YAML settings file")
    parser.add_argument("--node-id", type=int)
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument("--controllers", help="comma-separated host:port of the controllers")
    parser.add_argument("--rack")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = BrokerSettings.load(
        args.config,
        node_id=args.node_id,
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        metrics_port=args.metrics_port,
        controllers=args.controllers.split(",") if args.controllers else None,
        rack=args.rack,
    )

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await run_broker(settings, stop)

    try:
        uvloop.run(run())
    except ClusterIdMismatchError as error:
        sys.exit(f"directlog-broker: {error}")
