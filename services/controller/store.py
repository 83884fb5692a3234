"""The consensus store through kazoo: the election, loading the image, fenced commits.

kazoo is threaded; every call here uses its ``*_async`` form and awaits the result through
the event loop (``_wait``), so no store call blocks the loop and none waits forever: each
is bounded by the operation timeout. Its session events and watches arrive on kazoo's
threads and are handed to the loop with ``call_soon_threadsafe``.

A write either commits under the controller epoch this process won, or raises
``StoreError``: the epoch moved (a newer controller), the session ended, or the outcome is
unknown (connection lost mid-request). In every one of those cases the caller's image may
no longer be the store's, so it steps down and reloads if it wins again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError, RolledBackError
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry
from kazoo.security import ACL, Id, Permissions, make_digest_acl

from directlog.security.acl import AclBinding, PatternType, ResourceType
from directlog.security.client_quotas import QuotaEntity
from directlog.security.scram import ScramCredential, ScramMechanism
from directlog.security.tls import TlsFiles
from directlog.waits import within
from services.controller import layout
from services.controller.cluster import Image
from services.controller.layout import ControllerRecord, Create, Delete, Layout, SetData, StoreOp
from services.controller.model import (
    AclResource,
    PartitionState,
    RemotePartition,
    RemoteTopic,
    Topic,
)
from services.controller.settings import ConsensusAuth

log = logging.getLogger("directlog.controller.store")

T = TypeVar("T")
STOP_SECONDS = 3.0  # how long a stopping controller waits for its session to close


class StoreError(Exception):
    """A store call that failed, or a write that did not commit under our epoch."""


@dataclass(frozen=True, slots=True)
class Won:
    """This process is the active controller for ``record.epoch``; every write checks
    that the controller epoch znode is still at ``epoch_version``."""

    record: ControllerRecord
    epoch_version: int


class Store:
    def __init__(
        self,
        hosts: str,
        paths: Layout,
        session_timeout: float,
        *,
        tls: TlsFiles | None = None,
        auth: ConsensusAuth | None = None,
    ) -> None:
        """``tls``: connect to the members' secure client ports, checking their certificates
        and host names against ``tls.ca_file`` (and presenting ``tls.cert_file``). ``auth``:
        authenticate as that identity, and create every znode (the root included) with an
        ACL granting it everything and nobody else anything: the store also holds
        credentials (SCRAM) and only controllers read it, so there is no world READ."""
        self.paths = paths
        self.op_timeout = session_timeout  # past it the session is as good as gone
        security: dict[str, Any] = {}
        if tls is not None:
            key_password = tls.key_password.get_secret_value() if tls.key_password else None
            security.update(
                use_ssl=True,
                verify_certs=True,
                check_hostname=True,
                ca=None if tls.ca_file is None else str(tls.ca_file),
                certfile=None if tls.cert_file is None else str(tls.cert_file),
                keyfile=None if tls.key_file is None else str(tls.key_file),
                keyfile_password=key_password,
            )
        if auth is not None:
            user, password = auth.username, auth.password.get_secret_value()
            if auth.scheme == "digest":
                security["auth_data"] = [("digest", f"{user}:{password}")]
                security["default_acl"] = [make_digest_acl(user, password, all=True)]
            else:
                mechanism = {"mechanism": "DIGEST-MD5", "username": user, "password": password}
                security["sasl_options"] = mechanism
                security["default_acl"] = [ACL(Permissions.ALL, Id("sasl", user))]
        self._client = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=1.0),
            **security,
        )
        self._loop: asyncio.AbstractEventLoop | None = None

    # Session ----------------------------------------------------------------------------

    def start(self, on_state: Callable[[str], None]) -> None:
        """Connect in the background; ``on_state`` gets kazoo's "CONNECTED", "SUSPENDED"
        and "LOST" on the event loop."""
        loop = self._loop = asyncio.get_running_loop()

        def listener(state: KazooState) -> None:
            _call_soon(loop, on_state, str(state))

        self._client.add_listener(listener)
        self._client.start_async()

    async def stop(self) -> None:
        """Close the session (its ephemeral controller znode goes with it), waiting at most
        STOP_SECONDS: kazoo's stop waits up to ten seconds for a connection thread caught
        reconnecting, and a stopping process must not. The wait runs on a daemon thread, so
        one that overruns cannot hold the process at exit; the session then expires."""
        loop = asyncio.get_running_loop()
        stopped: asyncio.Future[None] = loop.create_future()

        def stop_client() -> None:
            try:
                self._client.stop()
                self._client.close()
            finally:
                _call_soon(loop, _settle, stopped)

        threading.Thread(target=stop_client, name="kazoo-stop", daemon=True).start()
        try:
            await within(stopped, STOP_SECONDS)
        except TimeoutError:
            log.warning(
                "the consensus session did not close in %.0f s; it will expire", STOP_SECONDS
            )

    # Election ---------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Create the skeleton znodes that are missing: the first controller ever finds an
        empty store. Creates only, so a stale controller can change nothing here."""
        new_cluster_id = layout.uuid_text(uuid.uuid4().bytes)
        skeleton = [
            (self.paths.brokers, b""),
            # Also for a store written before per-broker configs existed.
            (self.paths.broker_configs, b""),
            (self.paths.topics, b""),
            (self.paths.remote_log, b""),
            (self.paths.controller_epoch, layout.encode_epoch(0)),
            (self.paths.broker_epoch, layout.encode_last_broker_epoch(0)),
            # Also for a store written before producer ids existed: ids then start at 0.
            (self.paths.producer_ids, layout.encode_next_producer_id(0)),
            (self.paths.log_defaults, layout.encode_log_defaults({})),
            (self.paths.cluster_id, layout.encode_cluster_id(new_cluster_id)),
        ]
        for path, data in skeleton:
            if await self._call(self._client.exists_async, path) is None:
                try:
                    await self._call(self._client.create_async, path, data, makepath=True)
                except StoreError as exc:
                    if not isinstance(exc.__cause__, NodeExistsError):
                        raise

    async def campaign(
        self, controller_id: int, address: str, wake: Callable[[], None]
    ) -> Won | ControllerRecord | None:
        """Try to become the active controller: create the ephemeral controller znode and
        bump the controller epoch in one transaction. Returns ``Won``, or the active
        controller (``wake`` is called when its znode changes), or None when the seat is
        free again and the caller should try at once."""
        data, stat = await self._call(self._client.get_async, self.paths.controller_epoch)
        record = ControllerRecord(controller_id, address, _decode(layout.decode_epoch, data) + 1)
        transaction = self._client.transaction()
        transaction.create(self.paths.controller, layout.encode_controller(record), ephemeral=True)
        transaction.set_data(
            self.paths.controller_epoch, layout.encode_epoch(record.epoch), version=stat.version
        )
        results = await self._call(transaction.commit_async)
        if not any(isinstance(r, Exception) for r in results):
            return Won(record, stat.version + 1)
        loop = self._loop
        assert loop is not None

        def watcher(event: object) -> None:
            _call_soon(loop, wake)

        held = await self._call(self._client.exists_async, self.paths.controller, watch=watcher)
        if held is None:
            return None
        try:
            data, _ = await self._call(self._client.get_async, self.paths.controller)
        except StoreError as exc:
            if isinstance(exc.__cause__, NoNodeError):
                return None
            raise
        holder = _decode(layout.decode_controller, data)
        if held.ephemeralOwner == self._session_id():
            # Ours, from a term that ended while the resignation could not reach the store.
            log.info("removing this process's own controller znode of epoch %d", holder.epoch)
            epoch_data, epoch_stat = await self._call(
                self._client.get_async, self.paths.controller_epoch
            )
            if _decode(layout.decode_epoch, epoch_data) == holder.epoch:
                await self.resign(epoch_stat.version)
            return None
        return holder

    async def resign(self, epoch_version: int) -> None:
        """Delete the controller znode if it is still this term's, so a standby takes over
        without waiting for our session to expire. Best effort."""
        transaction = self._client.transaction()
        transaction.check(self.paths.controller_epoch, epoch_version)
        transaction.delete(self.paths.controller)
        try:
            await self._call(transaction.commit_async)
        except StoreError as exc:
            log.info("could not resign (the session will): %s", exc)

    # State ------------------------------------------------------------------------------

    async def load(self) -> Image:
        """The whole image. Called right after winning: no one else writes any more and
        this session sees its own takeover, so the reads are one consistent state."""
        paths = self.paths
        try:
            cluster_data, _ = await self._call(self._client.get_async, paths.cluster_id)
            last_data, _ = await self._call(self._client.get_async, paths.broker_epoch)
            producer_data, _ = await self._call(self._client.get_async, paths.producer_ids)
            defaults_data, _ = await self._call(self._client.get_async, paths.log_defaults)
            broker_ids = sorted(
                int(b) for b in await self._call(self._client.get_children_async, paths.brokers)
            )
            broker_data = await self._gets([paths.broker(b) for b in broker_ids])
            brokers = {
                b: layout.decode_broker(b, data)
                for b, data in zip(broker_ids, broker_data, strict=True)
            }
            configured = sorted(
                int(b)
                for b in await self._call(self._client.get_children_async, paths.broker_configs)
            )
            config_data = await self._gets([paths.broker_config(b) for b in configured])
            broker_configs = {
                b: layout.decode_broker_configs(data)
                for b, data in zip(configured, config_data, strict=True)
            }
            topic_ids = [
                layout.uuid_bytes(name)
                for name in await self._call(self._client.get_children_async, paths.topics)
            ]
            topics = await asyncio.gather(*(self._load_topic(t) for t in topic_ids))
            containers: set[str] = set()
            return Image(
                layout.decode_cluster_id(cluster_data),
                brokers,
                {topic.topic_id: topic for topic in topics},
                layout.decode_last_broker_epoch(last_data),
                layout.decode_next_producer_id(producer_data),
                await self._load_remote_topics(),
                layout.decode_log_defaults(defaults_data),
                broker_configs,
                scram=await self._load_scram(containers),
                acls=await self._load_acls(containers),
                client_quotas=await self._load_client_quotas(containers),
                containers=frozenset(containers),
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise StoreError(f"the store holds a malformed znode: {exc!r}") from exc

    async def _load_scram(
        self, containers: set[str]
    ) -> dict[str, dict[ScramMechanism, ScramCredential]]:
        """Every user's SCRAM credentials; ``containers`` gets the container if it exists."""
        names = await self._children(self.paths.scram)
        if names is None:
            return {}
        containers.add(self.paths.scram)
        users = [layout.decode_name(name) for name in names]
        data = await self._gets([self.paths.scram_user(user) for user in users])
        return {user: layout.decode_scram(d) for user, d in zip(users, data, strict=True)}

    async def _load_acls(self, containers: set[str]) -> dict[AclResource, frozenset[AclBinding]]:
        """Every resource pattern's ACLs, the levels of ``acls`` read one after the other
        and each level's reads pipelined; ``containers`` gets the containers that exist."""
        top = self.paths.acls
        kinds = await self._children(top)
        if kinds is None:
            return {}
        containers.add(top)
        containers.update(f"{top}/{kind}" for kind in kinds)
        pattern_names = await asyncio.gather(*(self._children(f"{top}/{k}") for k in kinds))
        patterns = [
            f"{top}/{kind}/{pattern}"
            for kind, names in zip(kinds, pattern_names, strict=True)
            for pattern in names or ()
        ]
        containers.update(patterns)
        names = await asyncio.gather(*(self._children(path) for path in patterns))
        resources: list[AclResource] = []
        for path, children in zip(patterns, names, strict=True):
            kind, pattern = path.rsplit("/", 2)[1:]
            resources.extend(
                AclResource(ResourceType[kind], PatternType[pattern], layout.decode_name(child))
                for child in children or ()
            )
        data = await self._gets([self.paths.acl_resource(r) for r in resources])
        return {r: layout.decode_acls(r, d) for r, d in zip(resources, data, strict=True)}

    async def _load_client_quotas(
        self, containers: set[str]
    ) -> dict[QuotaEntity, dict[str, float]]:
        """Every quota entity's quotas; ``containers`` gets the container if it exists."""
        names = await self._children(self.paths.client_quotas)
        if names is None:
            return {}
        containers.add(self.paths.client_quotas)
        entities = [layout.decode_quota_entity(name) for name in names]
        data = await self._gets([self.paths.client_quota(e) for e in entities])
        return {e: layout.decode_client_quotas(e, d) for e, d in zip(entities, data, strict=True)}

    async def _children(self, path: str) -> list[str] | None:
        """The names under a znode; None when it does not exist (a security container
        before its first write)."""
        try:
            names: list[str] = await self._call(self._client.get_children_async, path)
        except StoreError as exc:
            if isinstance(exc.__cause__, NoNodeError):
                return None
            raise
        return names

    async def _load_topic(self, topic_id: bytes) -> Topic:
        path = self.paths.topic(topic_id)
        (data, _), children = await asyncio.gather(
            self._call(self._client.get_async, path),
            self._call(self._client.get_children_async, path),
        )
        record = layout.decode_topic(data)
        partitions = [PartitionState.initial(replicas) for replicas in record.replicas]
        indexes = sorted(int(child) for child in children)
        states = await self._gets([self.paths.partition(topic_id, i) for i in indexes])
        for index, state_data in zip(indexes, states, strict=True):
            partitions[index] = layout.decode_partition(record.replicas[index], state_data)
        return Topic(record.name, topic_id, record.configs, tuple(partitions))

    async def _load_remote_topics(self) -> dict[bytes, RemoteTopic]:
        """The topics that have remote log records; their partitions wait until asked for
        (``load_remote_partition``), so a takeover does not read every record there is."""
        names = await self._call(self._client.get_children_async, self.paths.remote_log)
        topic_ids = [layout.uuid_bytes(name) for name in names]
        data = await self._gets([self.paths.remote_topic(t) for t in topic_ids])
        return {t: layout.decode_remote_topic(d) for t, d in zip(topic_ids, data, strict=True)}

    async def load_remote_partition(self, topic_id: bytes, partition: int) -> RemotePartition:
        """A partition's remote log records: none when it has no znode. Only for a caller
        that holds the term's write lock, so that no commit of ours runs meanwhile."""
        path = self.paths.remote_partition(topic_id, partition)
        try:
            names = await self._call(self._client.get_children_async, path)
        except StoreError as exc:
            if isinstance(exc.__cause__, NoNodeError):
                return RemotePartition()
            raise
        try:
            segment_ids = [layout.uuid_bytes(name) for name in names]
            data = await self._gets(
                [path] + [self.paths.remote_segment(topic_id, partition, s) for s in segment_ids]
            )
            segments = [
                layout.decode_remote_segment(s, d)
                for s, d in zip(segment_ids, data[1:], strict=True)
            ]
            return layout.decode_remote_partition(data[0], segments)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise StoreError(f"the store holds a malformed znode under {path}: {exc!r}") from exc

    async def remote_tree(self, topic_id: bytes) -> dict[str, list[str]]:
        """The names under a topic's remote_log znode: partition -> its record znodes."""
        path = self.paths.remote_topic(topic_id)
        partitions = await self._call(self._client.get_children_async, path)
        children = await asyncio.gather(
            *(self._call(self._client.get_children_async, f"{path}/{p}") for p in partitions)
        )
        return dict(zip(partitions, children, strict=True))

    async def _gets(self, paths: Sequence[str]) -> list[bytes]:
        """The data of many znodes, requests pipelined on the one connection."""
        replies = await asyncio.gather(
            *(self._call(self._client.get_async, path) for path in paths)
        )
        return [data for data, _ in replies]

    async def commit(self, ops: Sequence[StoreOp], epoch_version: int) -> None:
        """Apply ``ops`` in one transaction that first checks the controller epoch."""
        transaction = self._client.transaction()
        transaction.check(self.paths.controller_epoch, epoch_version)
        for op in ops:
            if isinstance(op, Create):
                transaction.create(op.path, op.data)
            elif isinstance(op, SetData):
                transaction.set_data(op.path, op.data, version=op.version)
            else:
                assert isinstance(op, Delete)
                transaction.delete(op.path, version=op.version)
        results = await self._call(transaction.commit_async)
        for index, result in enumerate(results):
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                if index == 0:
                    raise StoreError("the controller epoch moved: a newer controller is active")
                raise StoreError(
                    f"transaction refused at {ops[index - 1]}: {type(result).__name__}"
                )

    # kazoo's threads to the loop --------------------------------------------------------

    def _session_id(self) -> int | None:
        client_id = self._client.client_id
        return None if client_id is None else int(client_id[0])

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a kazoo ``*_async`` method and await its result on the loop, within the
        operation timeout; kazoo's exceptions become ``StoreError``."""
        loop = self._loop
        assert loop is not None, "start() first"
        future: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any) -> None:
            if future.done():
                return
            if result.successful():
                future.set_result(result.value)
            else:
                future.set_exception(result.exception)

        def done(result: Any) -> None:
            _call_soon(loop, settle, result)

        try:
            method(*args, **kwargs).rawlink(done)
            return await within(future, self.op_timeout)
        except KazooException as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}") from exc
        except TimeoutError as exc:
            raise StoreError(f"no answer within {self.op_timeout} s") from exc


def _decode(decode: Callable[[bytes], T], data: bytes) -> T:
    try:
        return decode(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"the store holds a malformed znode: {exc!r}") from exc


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    """From a kazoo thread; a loop that has closed (the process is stopping) is ignored."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)
