"""What security costs a broker: SASL_SSL against PLAINTEXT, logins, ACL checks (issue 27).

    python -m bench.security [--quick] [--rounds N] [--no-pin]

Three measurements, each side by side in one run, on Directlog clusters of one broker
(tests/e2e/cluster.py: consensus member, controller and broker as subprocesses on loopback)
whose broker serves PLAINTEXT, SASL_SSL and SASL_PLAINTEXT listeners at once, with
SCRAM-SHA-512 users (4096 iterations, Kafka's default) and a certificate of a throwaway CA
(directlog.security.certs), so that PLAINTEXT and SASL_SSL meet the same process in the
same state:

1. Throughput, through confluent-kafka with acks=1: a producer (`linger.ms=5`; at 32 KiB
   a 32 MiB queue, as bench.broker) writes a fresh one-partition topic, then a consumer
   (`assign()` from the start, no group) reads it all back, over PLAINTEXT and over
   SASL_SSL as a SCRAM user, for 200-byte and 32 KiB records. The two protocols alternate
   in order round after round; the best round of each counts. Goal: SASL_SSL at least 0.7x
   PLAINTEXT at 32 KiB, producing and consuming.
2. Logins: clients (asyncio, `directlog.protocol.client.KafkaConnection`, a few at once)
   that each connect, do a full TLS handshake (no session resumption) and the
   SaslHandshake + SCRAM-SHA-512 exchange, ask ApiVersions and close, over and over,
   against the anchor of plain TCP connections doing connect + ApiVersions on the
   PLAINTEXT listener. Reported: connections a second, the CPU per connection of each side,
   and the connections a second one broker core would serve at that CPU (the client's
   SCRAM computes a 4096-round PBKDF2 per login, so the client bounds the rate here).
3. The authorizer: a second cluster, the same but with `authorizer_enabled` and 10,000
   random ACLs of other principals (literal and prefixed, topics and groups, some next to
   the bench's own topic names) plus one ALLOW of WRITE on the bench topics' prefix for the
   bench's user, and a super user of its own. The same workloads go over SASL_PLAINTEXT, in
   short runs that take turns round after round, from three sides: "acl", the bench's user
   on the authorizer's broker, decided by its ACLs; "super", the super user on that same
   broker and topic, let through before the ACLs or their cache are asked (one set lookup:
   nearly a broker without checks, in the same process, heap and log); "off", the bench's
   user on the first cluster's broker, which has no authorizer at all. The workloads: a
   producer sending every 200-byte record in its own Produce request
   (`batch.num.messages=1`, `linger.ms=0`, acks=1), then Metadata requests for the topic
   one at a time on one connection. Per request: the client's time, the broker's CPU (its
   process CPU-time clock, over the requests it counted) and its own latency (its
   histogram: queueing included for the pipelined Produce requests). What the authorizer
   adds is the median, over rounds, of the difference acl - super within a round, with half
   its interquartile range as the spread. Goal, judged on that same-broker figure: under 5%
   of the broker's CPU per request of the "acl" side, up to the upper end of the median's
   95% confidence interval (distribution-free, from the order statistics), so that a run
   too noisy to tell does not pass. acl - off is printed too, unjudged: it
   compares two processes, whose differences (heaps, caches, start order) no pairing
   cancels. A user without ACLs must be refused the topic by the authorizer and not by the
   other broker, or the bench fails. Next to it, in this process, the µs per authorization
   check as a request handler makes it (`Access.allowed`) with the same ACLs: cached (the
   same question again), uncached (a name never asked before) and for the super user. This
   part runs first, while both clusters are equally fresh.

Placement, as in bench.broker: the 32 KiB throughputs, the logins and the authorizer
workloads run with this process (Python and librdkafka's threads) on the first half of
the CPUs and the clusters' processes on the other half, one core a side here, as on two
machines; the 200-byte throughputs, bound by the Python client that takes more than a core,
are left to the scheduler. `--no-pin` leaves all to the scheduler. The output ends with a
summary table, the goals and one JSON line of every figure, also written to
bench/results/security.json (MB = 10**6 bytes).
"""

from __future__ import annotations

import asyncio
import ctypes
import math
import os
import random
import statistics
import tempfile
import time
import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AclBinding as KafkaAcl  # type: ignore[attr-defined]
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)
from confluent_kafka.admin import ResourceType as KafkaResourceType  # type: ignore[attr-defined]

from bench.broker import (
    PRODUCE_BIG,
    PRODUCTION_TIMEOUTS,
    BenchError,
    Placement,
    consume,
    create_topic,
    delete_topic,
    produce,
    wait_for_topic,
)
from bench.processes import keep_freed_heap, print_goals, save_results, sized_options
from directlog.protocol.client import ClientSecurity, KafkaConnection, SaslLogin
from directlog.security.acl import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    operations_for,
)
from directlog.security.certs import CertificateAuthority
from directlog.security.tls import TlsFiles, client_context
from services.broker.authentication import NO_SASL, PLAINTEXT, SESSION, Session
from services.broker.authorization import Access
from services.broker.authorizer import Authorizer
from tests.e2e.broker import BrokerProcess
from tests.e2e.cluster import Cluster

with warnings.catch_warnings():  # kafka-python loads its schemas through deprecated APIs
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.metadata import (
        ApiVersionsRequest,
        ApiVersionsResponse,
        MetadataRequest,
        MetadataResponse,
    )

MECHANISM = "SCRAM-SHA-512"
USER, OUTSIDER, SUPER_USER, PASSWORD = "bench", "outsider", "bench-root", "bench-secret"
PRINCIPAL, SUPER_PRINCIPAL = f"User:{USER}", f"User:{SUPER_USER}"
ITERATIONS = 4096
CLIENT_ID = "bench-security"
LISTENERS = ("PLAINTEXT", "SASL_SSL", "SASL_PLAINTEXT")
PROTOCOLS = ("PLAINTEXT", "SASL_SSL")  # compared in part 1
SIDES = ("off", "super", "acl")  # part 3: no authorizer; a super user; decided by ACLs
TOPIC_SUFFIXES = ("off", "on")  # part 3's topics: on the broker without, with the authorizer
RECORD_SIZES = {"200B": 200, "32KiB": 32 * 1024}
DISTINCT_VALUES = 64  # values cycled through, so a run's records need no memory of their own
PRODUCE_SMALL = {"linger.ms": 5}
PRODUCE_ONE = {"linger.ms": 0, "batch.num.messages": 1}  # a Produce request per record
TIME_LIMIT = 180.0  # seconds for one produce or consume
LOGIN_CONCURRENCY = 4
ACL_COUNT = 10_000
ACL_BATCH = 1000  # ACLs per CreateAcls request
BENCH_TOPICS = "bench-authz-"  # the prefix the bench's user may WRITE (and so DESCRIBE)
TOPIC_AUTHORIZATION_FAILED = 29
LATENCY = "directlog_broker_request_latency_seconds"  # the broker's histogram, by API
# The logins' figures: connections a second, CPU per connection, what a broker core serves
LOGIN_FIGURES = ("per_s", "broker_cpu_ms", "client_cpu_ms", "per_broker_core_s")
# µs per request of the authorizer runs: what the client waited (per record for the pipelined
# producer), the broker's CPU, the broker's own latency (queueing included when pipelined)
AUTHORIZER_FIGURES = tuple(
    f"{api}_{what}"
    for api, client in (("produce", "us"), ("metadata", "round_trip_us"))
    for what in (client, "broker_cpu_us", "broker_latency_us")
)
# What the "acl" side adds, against each baseline side; the first is the judged one
COMPARISONS = {"added": "super", "added_vs_off": "off"}
CHECKS = ("cached", "uncached", "super")  # the in-process Access.allowed figures
THROUGHPUT_GOAL = 0.7
AUTHORIZER_GOAL = 0.05
WARMUP_ROUNDS = 2
SEED = 27


@dataclass(frozen=True)
class Sizes:
    records: dict[str, int]  # per record size: records produced, then read, per round
    rounds: int  # of the throughputs and the logins
    login_seconds: float  # per login run
    authorizer_rounds: int  # authorizer runs per side and workload
    produce_block: int  # records (so Produce requests) per authorizer run
    metadata_block: int  # Metadata requests per authorizer run
    authorize_calls: int  # in-process, per figure


FULL = Sizes(
    records={"200B": 2_000_000, "32KiB": 60_000},
    rounds=3,
    login_seconds=5.0,
    authorizer_rounds=30,
    produce_block=10_000,
    metadata_block=1000,
    authorize_calls=300_000,
)
QUICK = Sizes(
    records={"200B": 600_000, "32KiB": 30_000},
    rounds=2,
    login_seconds=2.0,
    authorizer_rounds=24,
    produce_block=5000,
    metadata_block=500,
    authorize_calls=100_000,
)


# --- setup ---------------------------------------------------------------------------------


def make_pki(directory: Path) -> TlsFiles:
    """A throwaway CA and the broker's certificate for 127.0.0.1."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority.create("directlog-bench-ca")
    ca.write(directory / "ca.pem")
    ca.issue("broker", hosts=["127.0.0.1", "localhost"]).write(
        directory / "broker.pem", directory / "broker.key"
    )
    return TlsFiles(
        cert_file=directory / "broker.pem",
        key_file=directory / "broker.key",
        ca_file=directory / "ca.pem",
    )


def broker_settings(pki: TlsFiles, authorizer: bool) -> dict[str, Any]:
    """Every listener the bench uses on one broker. With the authorizer, the PLAINTEXT
    listener's User:ANONYMOUS is a super user: the harness and this bench's admin calls
    go through it; so does part 3's super user."""
    settings: dict[str, Any] = {
        **PRODUCTION_TIMEOUTS,
        "listeners": [{"name": name, "port": 0} for name in LISTENERS],
        "ssl": {name: str(path) for name, path in pki.model_dump(exclude_none=True).items()},
        "sasl_enabled_mechanisms": [MECHANISM],
    }
    if authorizer:
        settings |= {"authorizer_enabled": True, "super_users": ["User:ANONYMOUS", SUPER_PRINCIPAL]}
    return settings


def client_config(protocol: str, pki: TlsFiles, user: str = USER) -> dict[str, str]:
    """confluent-kafka's settings for a listener: nothing for PLAINTEXT, else `user`'s SCRAM
    login."""
    if protocol == "PLAINTEXT":
        return {}
    config = {
        "security.protocol": protocol,
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": PASSWORD,
    }
    if protocol == "SASL_SSL":
        config["ssl.ca.location"] = str(pki.ca_file)
    return config


def add_users(broker: BrokerProcess, *users: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    credential = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, ITERATIONS)
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(user, credential, PASSWORD.encode()) for user in users
    ]
    for future in admin.alter_user_scram_credentials(upserts).values():
        future.result(timeout=30)


def server_pids(*clusters: Cluster) -> tuple[int, ...]:
    """Every process of the clusters: what runs on the server side's CPUs."""
    pids = []
    for cluster in clusters:
        services = [*cluster.brokers.values(), *cluster.controllers]
        pids += [s.process.pid for s in services if s.process is not None]
        pids += [p.pid for p in cluster.ensemble.processes.values()]
    return tuple(pids)


def broker_pid(broker: BrokerProcess) -> int:
    assert broker.process is not None
    return broker.process.pid


class CpuClock:
    """A process's CPU time through its POSIX CPU-time clock (clock_getcpuclockid): to the
    nanosecond, where /proc counts 10 ms ticks, too coarse for a few µs per request."""

    def __init__(self, pid: int) -> None:
        clock = ctypes.c_int()
        error = ctypes.CDLL("libc.so.6").clock_getcpuclockid(pid, ctypes.byref(clock))
        if error:
            raise OSError(error, f"no CPU-time clock for process {pid}")
        self._clock = clock.value

    def seconds(self) -> float:
        return time.clock_gettime(self._clock)


def split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


# --- 1. throughput -------------------------------------------------------------------------


def cycled(size: int, count: int) -> list[bytes]:
    """`count` records of `size` bytes, DISTINCT_VALUES distinct ones (an index prefix over
    random padding) in turn."""
    pad = os.urandom(size - 12)
    values = [b"%012d" % i + pad for i in range(DISTINCT_VALUES)]
    return [values[i % DISTINCT_VALUES] for i in range(count)]


def bench_throughput(
    cluster: Cluster, pki: TlsFiles, sizes: Sizes, placement: Placement | None
) -> dict[str, float]:
    """Best msg/s of each direction, record size and protocol, with the cores busy then."""
    broker = cluster.brokers[0]
    pid = broker_pid(broker)
    best: dict[str, float] = {}
    for label, size in RECORD_SIZES.items():
        records = cycled(size, sizes.records[label])
        settings = PRODUCE_BIG if size > 1024 else PRODUCE_SMALL
        for round_ in range(sizes.rounds):
            for protocol in PROTOCOLS if round_ % 2 == 0 else PROTOCOLS[::-1]:
                topic = f"bench-{label}-{protocol}-{round_}".lower()
                create_topic(broker.bootstrap, topic)
                address, config = broker.listeners[protocol], client_config(protocol, pki)
                placed: AbstractContextManager[None] = (
                    placement.apply(server_pids(cluster))
                    if placement is not None and size > 1024
                    else nullcontext()
                )
                with placed:
                    produced = produce(
                        address, topic, records, {**config, **settings}, TIME_LIMIT, pid
                    )
                    consumed = consume(address, topic, records, TIME_LIMIT, pid, config)
                for direction, seconds, cores in (
                    ("produce", produced.seconds, produced.cores),
                    ("consume", consumed.seconds, consumed.cores),
                ):
                    key = f"{direction}_{label}_{protocol}"
                    rate = len(records) / seconds
                    print(
                        f"[throughput] {key:28} round {round_}: {rate:10,.0f} msg/s "
                        f"{rate * size / 1e6:8.1f} MB/s  cores client {cores[0]:.2f} "
                        f"broker {cores[1]:.2f}",
                        flush=True,
                    )
                    if rate > best.get(f"{key}_msgs", 0.0):
                        best[f"{key}_msgs"] = rate
                        best[f"{key}_MBps"] = rate * size / 1e6
                        best[f"{key}_client_cores"] = cores[0]
                        best[f"{key}_broker_cores"] = cores[1]
                refused = delete_topic(broker.bootstrap, topic)
                if refused:
                    print(f"[throughput] {topic} kept: {refused}", flush=True)
    return best


# --- 2. logins -----------------------------------------------------------------------------


async def connections(
    address: str, security: ClientSecurity | None, seconds: float, concurrency: int
) -> int:
    """Connections that were opened (and logged in, as `security` asks), asked ApiVersions
    and closed by `concurrency` clients, each one after the other, for `seconds`."""
    host, port = split(address)
    deadline = time.perf_counter() + seconds
    done = 0

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            connection = await KafkaConnection.connect(host, port, 10.0, security)
            try:
                answer = await connection.request(
                    ApiVersionsRequest[1](), ApiVersionsResponse, CLIENT_ID
                )
            finally:
                await connection.close()
            if answer.error_code:
                raise BenchError(f"ApiVersions answered error {answer.error_code}")
            done += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return done


def bench_logins(
    cluster: Cluster, pki: TlsFiles, sizes: Sizes, placement: Placement | None
) -> dict[str, float]:
    """Best connections/s of plain TCP and of TLS + SCRAM, with the CPU each cost."""
    broker = cluster.brokers[0]
    clock = CpuClock(broker_pid(broker))
    secure = ClientSecurity(
        tls=client_context(TlsFiles(ca_file=pki.ca_file)),
        sasl=SaslLogin(MECHANISM, USER, PASSWORD),
        client_id=CLIENT_ID,
    )
    kinds = {"plain": ("PLAINTEXT", None), "scram": ("SASL_SSL", secure)}
    best: dict[str, float] = {}
    placed = placement.apply(server_pids(cluster)) if placement else nullcontext()
    with placed:
        for round_ in range(sizes.rounds):
            for kind in list(kinds) if round_ % 2 == 0 else list(kinds)[::-1]:
                listener, security = kinds[kind]
                client, server = time.process_time(), clock.seconds()
                start = time.perf_counter()
                count = asyncio.run(
                    connections(
                        broker.listeners[listener], security, sizes.login_seconds, LOGIN_CONCURRENCY
                    )
                )
                seconds = time.perf_counter() - start
                client_ms = (time.process_time() - client) / count * 1e3
                broker_ms = (clock.seconds() - server) / count * 1e3
                rate = count / seconds
                print(
                    f"[logins] {kind:5} round {round_}: {rate:8,.0f} connections/s  CPU per "
                    f"connection: broker {broker_ms:.3f} ms, client {client_ms:.3f} ms",
                    flush=True,
                )
                if rate > best.get(f"logins_{kind}_per_s", 0.0):
                    best[f"logins_{kind}_per_s"] = rate
                    best[f"logins_{kind}_broker_cpu_ms"] = broker_ms
                    best[f"logins_{kind}_client_cpu_ms"] = client_ms
    return best


# --- 3. the authorizer ---------------------------------------------------------------------


def random_acls(count: int, rng: random.Random) -> list[AclBinding]:
    """`count` distinct ACLs of other principals, as a large site's might look: topics and
    groups named by team and service, literal and prefixed, mostly ALLOW, some for one host.
    A tenth name topics beside the bench's own (every prefix of their names among them),
    so a decision about a bench topic walks past grants it must weigh."""
    # what requests check on each type (KIP-430's sets), and ALL
    topic_operations = [*sorted(operations_for(ResourceType.TOPIC)), Operation.ALL]
    group_operations = [*sorted(operations_for(ResourceType.GROUP)), Operation.ALL]
    acls: set[AclBinding] = set()
    while len(acls) < count:
        pattern = PatternType.PREFIXED if rng.random() < 0.3 else PatternType.LITERAL
        near = rng.random() < 0.1
        if near and pattern == PatternType.PREFIXED:
            name = BENCH_TOPICS[: rng.randint(1, len(BENCH_TOPICS))]
        elif near:
            name = f"{BENCH_TOPICS}{rng.choice(TOPIC_SUFFIXES)}-{rng.randrange(100)}"
        else:
            name = f"team{rng.randrange(50)}.service{rng.randrange(200)}"
            name += "." if pattern == PatternType.PREFIXED else f".events-{rng.randrange(20)}"
        group = not near and rng.random() < 0.25
        acls.add(
            AclBinding(
                ResourceType.GROUP if group else ResourceType.TOPIC,
                name,
                pattern,
                f"User:service-{rng.randrange(2000)}",
                "*" if rng.random() < 0.8 else f"10.0.{rng.randrange(256)}.{rng.randrange(256)}",
                rng.choice(group_operations if group else topic_operations),
                Permission.DENY if rng.random() < 0.1 else Permission.ALLOW,
            )
        )
    return sorted(acls)


BENCH_ACL = AclBinding(
    ResourceType.TOPIC,
    BENCH_TOPICS,
    PatternType.PREFIXED,
    PRINCIPAL,
    "*",
    Operation.WRITE,
    Permission.ALLOW,
)


def confluent(binding: AclBinding) -> KafkaAcl:
    return KafkaAcl(
        KafkaResourceType[binding.resource_type.name],
        binding.resource_name,
        ResourcePatternType[binding.pattern_type.name],
        binding.principal,
        binding.host,
        AclOperation[binding.operation.name],
        AclPermissionType[binding.permission.name],
    )


def create_acls(broker: BrokerProcess, acls: list[AclBinding]) -> float:
    """Create the ACLs through the PLAINTEXT listener (a super user); the seconds it took.
    Each answer comes once the broker decides by its ACLs."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    start = time.perf_counter()
    for first in range(0, len(acls), ACL_BATCH):
        batch = [confluent(binding) for binding in acls[first : first + ACL_BATCH]]
        for future in admin.create_acls(batch, request_timeout=60).values():
            future.result(timeout=90)
    return time.perf_counter() - start


@dataclass(frozen=True)
class Side:
    """One side of the comparison ("off", "super" or "acl"): a broker, its topic and the
    user who sends the requests."""

    name: str
    broker: BrokerProcess
    clock: CpuClock
    topic: str
    user: str

    @property
    def address(self) -> str:
        return self.broker.listeners["SASL_PLAINTEXT"]


class Window:
    """What a broker did between its opening and `close` for one API: the requests it
    answered, and per request µs of its CPU (all of it, spread over those requests) and of
    its own latency (its histogram). The metrics are scraped outside the CPU window."""

    def __init__(self, side: Side, api: str) -> None:
        self._side, self._api = side, api
        self._scraped = self._scrape()
        self._cpu = side.clock.seconds()

    def _scrape(self) -> tuple[float, float]:
        return (
            self._side.broker.total(f"{LATENCY}_count", api=self._api),
            self._side.broker.total(f"{LATENCY}_sum", api=self._api),
        )

    def close(self) -> tuple[int, float, float]:
        cpu = self._side.clock.seconds() - self._cpu
        count, total = (b - a for a, b in zip(self._scraped, self._scrape(), strict=True))
        if count < 1:
            raise BenchError(f"{self._side.name}: the broker answered no {self._api} request")
        return int(count), cpu / count * 1e6, total / count * 1e6


def one_by_one(side: Side, pki: TlsFiles) -> Producer:
    """A producer for the side's topic, logged in as the side's user, that sends every record
    in its own Produce request."""
    config = {**client_config("SASL_PLAINTEXT", pki, side.user), **PRODUCE_ONE}
    producer = Producer({"bootstrap.servers": side.address, "acks": 1, **config})
    wait_for_topic(producer, side.topic)
    return producer


def produce_block(side: Side, producer: Producer, records: list[bytes]) -> dict[str, Any]:
    """`records` produced to partition 0 and all acknowledged without error, at consecutive
    offsets; per record the wall time, and per Produce request the broker's CPU and latency."""
    offsets: list[int] = []
    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        (failures.append(str(error)) if error else offsets.append(message.offset()))

    window = Window(side, "produce")
    start = time.perf_counter()
    for value in records:
        while True:
            try:
                producer.produce(side.topic, value, partition=0, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.005)
        producer.poll(0)
    left = producer.flush(TIME_LIMIT)
    seconds = time.perf_counter() - start
    requests, cpu_us, latency_us = window.close()
    if left or failures or len(offsets) != len(records):
        raise BenchError(f"{side.name}: {len(offsets)}/{len(records)} acknowledged, {failures[:1]}")
    if max(offsets) - min(offsets) + 1 != len(records) or requests < len(records):
        raise BenchError(f"{side.name}: {requests} Produce requests, offsets not consecutive")
    return {
        "side": side.name,
        "produce_us": seconds / len(records) * 1e6,
        "produce_broker_cpu_us": cpu_us,
        "produce_broker_latency_us": latency_us,
    }


async def logged_in(address: str, user: str) -> KafkaConnection:
    """A connection to a SASL_PLAINTEXT listener, logged in as `user`."""
    host, port = split(address)
    login = ClientSecurity(sasl=SaslLogin(MECHANISM, user, PASSWORD), client_id=CLIENT_ID)
    return await KafkaConnection.connect(host, port, 10.0, login)


async def metadata_error(connection: KafkaConnection, topic: str) -> int:
    """The error code a Metadata request for `topic` is answered with (0: none)."""
    answer = await connection.request(
        MetadataRequest[1](topics=[topic]), MetadataResponse, CLIENT_ID
    )
    ((error, *_),) = answer.topics
    return int(error)


async def topic_error(side: Side, user: str) -> int:
    """What a Metadata request for the side's topic answers `user` with."""
    connection = await logged_in(side.address, user)
    try:
        return await metadata_error(connection, side.topic)
    finally:
        await connection.close()


async def metadata_blocks(turns: list[Side], requests: int) -> list[dict[str, Any]]:
    """A run of `requests` Metadata requests for the side's topic per turn, one at a time on
    one connection per side logged in as its user; each run's round trip per request and the
    broker's CPU and latency per request."""
    connections = {side.name: await logged_in(side.address, side.user) for side in turns}
    runs = []
    try:
        for side in turns:
            connection = connections[side.name]
            window = Window(side, "metadata")
            start = time.perf_counter()
            for _ in range(requests):
                if error := await metadata_error(connection, side.topic):
                    raise BenchError(f"{side.name}: Metadata for {side.topic}: error {error}")
            seconds = time.perf_counter() - start
            _, cpu_us, latency_us = window.close()
            runs.append(
                {
                    "side": side.name,
                    "metadata_round_trip_us": seconds / requests * 1e6,
                    "metadata_broker_cpu_us": cpu_us,
                    "metadata_broker_latency_us": latency_us,
                }
            )
    finally:
        for connection in connections.values():
            await connection.close()
    return runs


def turn_order(sides: list[Side], rounds: int) -> list[Side]:
    """Every side once per round, in an order that rotates from round to round and runs
    backwards every other cycle of rotations, so each side runs before and after each other
    side as often, and a slow spell of the machine falls on all of them alike."""
    turns: list[Side] = []
    for round_ in range(rounds):
        shift = round_ % len(sides)
        order = sides[shift:] + sides[:shift]
        turns += order[::-1] if round_ // len(sides) % 2 else order
    return turns


def bench_authorizer(
    open_: Cluster,
    guarded: Cluster,
    pki: TlsFiles,
    acls: list[AclBinding],
    sizes: Sizes,
    placement: Placement | None,
) -> tuple[dict[str, float], dict[str, dict[str, list[float]]]]:
    """The workloads from each side ("off": the broker without the authorizer; "super" and
    "acl": the one with it, as its super user and as the bench's user), in short runs
    that take turns round after round; the setup's figures and every counted run's figures
    per side, in round order."""
    plain, secured = open_.brokers[0], guarded.brokers[0]
    plain_clock, secured_clock = CpuClock(broker_pid(plain)), CpuClock(broker_pid(secured))
    on_topic = BENCH_TOPICS + TOPIC_SUFFIXES[1]
    sides = [
        Side("off", plain, plain_clock, BENCH_TOPICS + TOPIC_SUFFIXES[0], USER),
        Side("super", secured, secured_clock, on_topic, SUPER_USER),
        Side("acl", secured, secured_clock, on_topic, USER),
    ]
    add_users(secured, USER, OUTSIDER, SUPER_USER)
    add_users(plain, OUTSIDER)
    setup = {"acls": float(len(acls)), "create_acls_s": create_acls(secured, acls)}
    print(f"[authorizer] {len(acls):,} ACLs created in {setup['create_acls_s']:.1f} s", flush=True)
    for side in sides[:2]:  # one per broker
        create_topic(side.broker.bootstrap, side.topic)
        refused = asyncio.run(topic_error(side, OUTSIDER)) == TOPIC_AUTHORIZATION_FAILED
        if refused != (side.broker is secured):
            answered = "refused" if refused else "shown"
            raise BenchError(f"{side.broker.bootstrap}: the topic was {answered} to {OUTSIDER}")
    records = cycled(RECORD_SIZES["200B"], sizes.produce_block)
    turns = turn_order(sides, WARMUP_ROUNDS + sizes.authorizer_rounds)
    counted = len(sides) * WARMUP_ROUNDS  # the first rounds of each workload warm up
    runs: dict[str, dict[str, list[float]]] = {side.name: {} for side in sides}
    placed = placement.apply(server_pids(open_, guarded)) if placement else nullcontext()
    with placed:
        producers = {side.name: one_by_one(side, pki) for side in sides}
        measured = [produce_block(side, producers[side.name], records) for side in turns]
        measured = measured[counted:]
        measured += asyncio.run(metadata_blocks(turns, sizes.metadata_block))[counted:]
    for run_ in measured:
        side_runs = runs[str(run_.pop("side"))]
        for key, value in run_.items():
            side_runs.setdefault(key, []).append(value)
    for side in sides:
        print(
            f"[authorizer] {side.name:5}: "
            + "  ".join(
                f"{key} {statistics.median(values):,.1f}" for key, values in runs[side.name].items()
            ),
            flush=True,
        )
    return setup, runs


def authorize_costs(acls: list[AclBinding], calls: int) -> dict[str, float]:
    """µs per authorization check in this process with the bench's ACLs, made as the
    broker's Produce handler makes it (`Access.allowed`, for the connection being served):
    the same question again (a cache hit, what every request after a connection's first
    asks), one about a name never asked before (a miss: the index walked, the answer
    cached), and the super user's (let through before any ACL)."""
    authorizer = Authorizer(["User:ANONYMOUS", SUPER_PRINCIPAL])
    start = time.perf_counter()
    authorizer.update(acls)
    update_ms = (time.perf_counter() - start) * 1e3
    access = Access(authorizer)
    name = BENCH_TOPICS + TOPIC_SUFFIXES[1]

    def session(principal: str) -> None:
        SESSION.set(
            Session(
                PLAINTEXT,
                NO_SASL,
                tls_subject=principal.removeprefix("User:"),
                client_host="127.0.0.1",
            )
        )

    def per_call(names: list[str]) -> float:
        start = time.perf_counter()
        for asked in names:
            access.allowed(Operation.WRITE, ResourceType.TOPIC, asked)
        return (time.perf_counter() - start) / len(names) * 1e6

    def decided(principal: str) -> bool:
        session(principal)
        return access.allowed(Operation.WRITE, ResourceType.TOPIC, name)

    if not (decided(PRINCIPAL) and decided(SUPER_PRINCIPAL) and not decided(f"User:{OUTSIDER}")):
        raise BenchError("the in-process authorizer decides otherwise than the broker")
    same = [name] * calls
    session(SUPER_PRINCIPAL)
    super_us = per_call(same)
    session(PRINCIPAL)
    return {
        "authorize_cached_us": per_call(same),
        "authorize_uncached_us": per_call([f"{BENCH_TOPICS}new-{i}" for i in range(calls)]),
        "authorize_super_us": super_us,
        "authorizer_update_ms": update_ms,
    }


# --- report --------------------------------------------------------------------------------


def median_bounds(values: list[float]) -> tuple[float, float]:
    """A 95% confidence interval of the median of `values`, free of any assumption about
    their distribution: the order statistics 0.98 sqrt(n) places either side of the middle
    (the sign test's interval, in its normal approximation)."""
    ordered, reach = sorted(values), 0.98 * math.sqrt(len(values))
    low = max(0, math.floor(len(values) / 2 - reach) - 1)
    high = min(len(values) - 1, math.ceil(len(values) / 2 + 1 + reach) - 1)
    return ordered[low], ordered[high]


def summarize_authorizer(runs: dict[str, dict[str, list[float]]]) -> dict[str, float]:
    """For every time per request: each side's median over its runs; and for each baseline
    of COMPARISONS, what the "acl" side adds to it: the median over rounds of the
    difference within a round (the runs of a round are next to each other in time, so slow
    spells of the machine cancel out), half the differences' interquartile range as their
    spread, the median's 95% confidence interval, and the median and the interval's upper
    end as shares of the "acl" side's median."""
    figures: dict[str, float] = {}
    for key in AUTHORIZER_FIGURES:
        for side in SIDES:
            figures[f"authz_{side}_{key}"] = statistics.median(runs[side][key])
        for name, baseline in COMPARISONS.items():
            differences = [
                b - a for a, b in zip(runs[baseline][key], runs["acl"][key], strict=True)
            ]
            low, added, high = statistics.quantiles(differences)
            bounds = median_bounds(differences)
            figures[f"authz_{key}_{name}"] = added
            figures[f"authz_{key}_{name}_spread"] = (high - low) / 2
            figures[f"authz_{key}_{name}_low"], figures[f"authz_{key}_{name}_high"] = bounds
            figures[f"authz_{key}_{name}_share"] = added / figures[f"authz_acl_{key}"]
            figures[f"authz_{key}_{name}_high_share"] = bounds[1] / figures[f"authz_acl_{key}"]
    return figures


def ratios(figures: dict[str, float]) -> dict[str, float]:
    """SASL_SSL over PLAINTEXT, TLS + SCRAM over plain connections, and the in-process
    checks' cost over the broker's CPU per request decided by ACLs."""
    out = {
        f"{key}_ratio": figures[f"{key}_SASL_SSL_msgs"] / figures[f"{key}_PLAINTEXT_msgs"]
        for key in (f"{d}_{label}" for d in ("produce", "consume") for label in RECORD_SIZES)
    }
    for kind in ("plain", "scram"):  # the connections one core of the broker would serve
        out[f"logins_{kind}_per_broker_core_s"] = 1e3 / figures[f"logins_{kind}_broker_cpu_ms"]
    logins = figures | out
    for what in LOGIN_FIGURES:
        out[f"logins_{what}_ratio"] = (
            logins[f"logins_scram_{what}"] / logins[f"logins_plain_{what}"]
        )
    for api in ("produce", "metadata"):
        for check in CHECKS:
            out[f"authorize_{check}_share_of_{api}_cpu"] = (
                figures[f"authorize_{check}_us"] / figures[f"authz_acl_{api}_broker_cpu_us"]
            )
    return out


def print_tables(figures: dict[str, float]) -> None:
    print(f"\n{'throughput, acks=1':22}{'PLAINTEXT':>28}{'SASL_SSL':>28}{'ratio':>8}")
    for direction in ("produce", "consume"):
        for label in RECORD_SIZES:
            key = f"{direction}_{label}"
            cells = "".join(
                f"{figures[f'{key}_{p}_msgs']:12,.0f}/s {figures[f'{key}_{p}_MBps']:8,.1f} MB/s"
                for p in PROTOCOLS
            )
            print(f"{key:22}{cells}{figures[f'{key}_ratio']:8.3f}")
    print(f"\n{'connections':22}{'TCP+ApiVersions':>28}{'TLS+SCRAM+ApiVersions':>28}{'ratio':>8}")
    for what in LOGIN_FIGURES:
        plain, secure = figures[f"logins_plain_{what}"], figures[f"logins_scram_{what}"]
        print(f"{what:22}{plain:28,.3f}{secure:28,.3f}{figures[f'logins_{what}_ratio']:8.3f}")
    print(f"\n{'authorizer, µs/request':28}" + "".join(f"{side:>10}" for side in SIDES))
    for key in AUTHORIZER_FIGURES:
        print(f"{key:28}" + "".join(f"{figures[f'authz_{side}_{key}']:10,.1f}" for side in SIDES))
    print(
        f"\n{'what acl adds, µs/request':28}{'to':>6}{'median':>10}{'± half IQR':>12}"
        f"{'95% interval of the median':>28}{'share':>8}{'(at its end)':>14}"
    )
    for key in AUTHORIZER_FIGURES:
        for name, baseline in COMPARISONS.items():
            added = f"authz_{key}_{name}"
            print(
                f"{key:28}{baseline:>6}{figures[added]:10,.2f}{figures[f'{added}_spread']:12,.2f}"
                f"{figures[f'{added}_low']:15,.2f}{figures[f'{added}_high']:13,.2f}"
                f"{figures[f'{added}_share']:8.1%}{figures[f'{added}_high_share']:14.1%}"
                + ("   judged" if name == "added" and "broker_cpu" in key else "")
            )
    print(
        f"{ACL_COUNT:,} ACLs. Judged: acl - super, one broker process deciding by its ACLs "
        "against letting its super user through, up to the end of the median's interval; "
        "acl - off compares two processes."
    )
    checks = ", ".join(
        f"{figures[f'authorize_{check}_us']:.2f} µs {check} "
        f"({figures[f'authorize_{check}_share_of_produce_cpu']:.1%} of a Produce request's "
        f"broker CPU, {figures[f'authorize_{check}_share_of_metadata_cpu']:.1%} of a "
        "Metadata one's)"
        for check in CHECKS
    )
    print(
        f"in-process Access.allowed: {checks}; "
        f"{ACL_COUNT:,} ACLs indexed in {figures['authorizer_update_ms']:.0f} ms"
    )


def goals(figures: dict[str, float]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for direction in ("produce", "consume"):
        value = figures[f"{direction}_32KiB_ratio"]
        out[f"{direction}_32KiB_sasl_ssl_vs_plaintext"] = {
            "value": round(value, 3),
            "goal": f">= {THROUGHPUT_GOAL}",
            "met": value >= THROUGHPUT_GOAL,
        }
    for api in ("produce", "metadata"):  # judged on the interval, so noise cannot pass it
        added = f"authz_{api}_broker_cpu_us_added"
        upper = figures[f"{added}_high_share"]
        out[f"authorizer_share_of_broker_cpu_per_{api}_request"] = {
            "value": round(figures[f"{added}_share"], 4),
            "upper": round(upper, 4),
            "goal": f"< {AUTHORIZER_GOAL} up to the 95% interval's end: {upper:.4f}",
            "met": upper < AUTHORIZER_GOAL,
        }
    return out


# --- main ----------------------------------------------------------------------------------


def run(sizes: Sizes, placement: Placement | None) -> dict[str, Any]:
    """The authorizer first, while both clusters are equally fresh; then the throughputs
    and the logins on the first one alone."""
    figures: dict[str, float] = {}
    acls = [*random_acls(ACL_COUNT, random.Random(SEED)), BENCH_ACL]
    with tempfile.TemporaryDirectory(prefix="bench-security-") as name:
        work = Path(name)
        pki = make_pki(work / "pki")
        with Cluster(work / "off", broker_settings=broker_settings(pki, False)) as open_:
            add_users(open_.brokers[0], USER)
            with Cluster(work / "on", broker_settings=broker_settings(pki, True)) as guarded:
                setup, runs = bench_authorizer(open_, guarded, pki, acls, sizes, placement)
            figures |= bench_throughput(open_, pki, sizes, placement)
            figures |= bench_logins(open_, pki, sizes, placement)
    figures |= setup | summarize_authorizer(runs) | authorize_costs(acls, sizes.authorize_calls)
    figures |= ratios(figures)
    print_tables(figures)
    met = goals(figures)
    print()
    print_goals(met)
    return {
        "bench": "security",
        "figures": {k: round(v, 4) for k, v in figures.items()},
        "goals": met,
        "authorizer_runs": runs,
        "sizes": vars(sizes),
        "placement": None
        if placement is None
        else {"client_cpus": sorted(placement.client), "server_cpus": sorted(placement.server)},
    }


def main(argv: list[str] | None = None) -> None:
    sizes, pin = sized_options("bench.security", __doc__, QUICK, FULL, argv)
    keep_freed_heap()
    save_results("security", run(sizes, Placement.split(pin)))


if __name__ == "__main__":
    main()
