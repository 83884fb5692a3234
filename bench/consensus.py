"""The same ZooKeeper client workload against our consensus ensemble and Apache ZooKeeper 3.8,
side by side in one run.

    python -m bench.consensus [--only ours|zookeeper ...] [--seconds S] [--rounds N]
                              [--force-sync yes|no] [--window W] [--warmup S] [--keep]

Ensembles (each selectable with `--only`, which may be repeated; both by default), three
members each on 127.0.0.1, free ports, a temporary data directory on the same disk
(`--dir`, default the system temp dir), the same fsync setting (`--force-sync`, default yes):

* zookeeper: the Debian package `zookeeper` (3.8.0), each member started by hand as
  `java -Xmx1000m -cp zookeeper.jar:slf4j-log4j12.jar:log4j-1.2.jar
  org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg`, logging to a file in its data
  directory (log4j FileAppender, nothing on the console). zoo.cfg keeps ZooKeeper's defaults
  and the values of the sample config the package ships (tickTime=2000, initLimit=10,
  syncLimit=5); the heap is zkServer.sh's default (1000 MB). Set on top of that, only what
  the benchmark needs: `forceSync` (matches ours), `4lw.commands.whitelist=*` (for `srvr`),
  `admin.enableServer=false` (its Jetty would take port 8080 in all three members),
  `clientPortAddress=127.0.0.1`, and the `server.N` lines. tickTime stays 2000: ZooKeeper
  notices a SIGKILLed leader by the closed TCP connections, not by missed ticks, and its
  election (FastLeaderElection's 200 ms finalize wait, then sync with the new leader) is
  not counted in ticks, so the default is the honest comparison. globalOutstandingLimit
  stays at its 1000: the pipelined workloads keep at most 2 * window (512) requests of
  clients at a member.
* ours: `python -m services.consensus --id N --config FILE`, FILE the YAML of
  services/consensus/settings.py (members, data_dir, force_sync); every other setting is
  our default (tick_ms=100).

Workloads, all through bench/zk_load.py (asyncio + uvloop on the repository's jute codec;
kazoo is too slow to load a server), on znodes /bench/wK holding 100-byte values. Clients
of one-client workloads connect to a follower (found with `srvr`); the K-th of several
clients connects to the K-th member (sorted by id) modulo 3.

* seq_write_p50_ms, seq_write_p99_ms: one client, one setData outstanding, for `--seconds`;
  latency percentiles per round, the median round counts.
* writes_1client_per_s, writes_4clients_per_s: pipelined setData (version -1) with
  `--window` requests outstanding per client, from 1 and from 4 client processes, for
  `--seconds`; every reply checked (err 0, xids in order); the best round counts.
* reads_4clients_per_s: the same with getData, 4 processes spread over the members.
* failover_s: a client writes sequentially to a follower; the leader (found with `srvr`)
  is killed with SIGKILL, and the figure is the time from the signal until a write is
  acknowledged that was sent after the leader had been reaped (so the old leader cannot
  have committed it). The client reconnects on connection loss, every 20 ms, cycling
  through the two survivors and resuming its session. The killed member is restarted and
  the ensemble waits for three members in service before the next round; the median
  round counts.

Before the measured rounds, `--warmup` seconds of pipelined writes and then of reads
(4 clients, untimed) let ZooKeeper's JIT compile its hot paths; without them the first
round of every ZooKeeper figure comes out 30-50 % low. Rounds are interleaved (one round
of every workload, then the next), so a burst of load from elsewhere on the machine hurts
one round of each rather than every round of one.

The client is shown not to be the limit: `bound_writes_1client_per_s` is the pipelined
1-client rate against a no-op server (a process answering every request at once with a
canned reply), tens of times what either ensemble serves; every pipelined figure is
printed with the CPU used by the client processes, by the three members (and by the
busiest one: a single-threaded leader is saturated at 1.0) and by everything else on the
machine, from /proc. The machine has two cores: three members and the clients share them,
so an ensemble is at its limit when servers + client reach about 2.0 cores, or its
busiest member 1.0 if it is single-threaded. Other processes on the machine lower every
figure; the run warns when they already keep more than a quarter of a core busy before
it starts ("other" in every line shows them during the run).

The output closes with one JSON line, {"ratios": ..., "ours": ..., "zookeeper": ...} and
the diagnostics; ratios are ours/zookeeper (throughput: higher is better, latency and
failover: lower is better). The same JSON is written to bench/results/consensus.json.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from bench.processes import (
    CLOCK_TICKS,
    STOP_SECONDS,
    cpu_seconds,
    free_ports,
    log_tail,
    save_results,
    stop,
)
from bench.zk_load import Job, Outcome, ensure_nodes, noop_server_main, worker_main
from services.consensus.fourletter import mode_of

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("zookeeper", "ours")
MEMBERS = 3
VALUE = b"v" * 100
FIGURES = (
    "seq_write_p50_ms",
    "seq_write_p99_ms",
    "writes_1client_per_s",
    "writes_4clients_per_s",
    "reads_4clients_per_s",
    "failover_s",
)
# ZooKeeper 3.8 on this machine class with a compiled client, fsync on (from the issue):
# printed beside the measured ZooKeeper figures to show whether this run's are sane.
ZOOKEEPER_ANCHORS: Figures = {
    "seq_write_p50_ms": 0.8,
    "writes_1client_per_s": 7_900,
    "writes_4clients_per_s": 12_000,
    "failover_s": 1.8,
}
LOWER_IS_BETTER = ("seq_write_p50_ms", "seq_write_p99_ms", "failover_s")
STARTUP_SECONDS = 60.0
FAILOVER_LIMIT_SECONDS = 30.0
ZK_JARS = (
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/slf4j-log4j12.jar",
    "/usr/share/java/log4j-1.2.jar",
)
ZK_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

Figures = dict[str, float | None]


class BenchError(Exception):
    """An ensemble or a workload did not do what it must; its figure is not reported."""


# --- processes and ports -------------------------------------------------------------------


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent busy (user, nice, system, irq, softirq)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / CLOCK_TICKS


def background_cores(seconds: float = 1.0) -> float:
    """Cores kept busy by whatever runs on the machine now (before any ensemble starts)."""
    before = machine_busy_seconds()
    time.sleep(seconds)
    return (machine_busy_seconds() - before) / seconds


@dataclass
class Member:
    id: int
    client_port: int
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.client_port)


@dataclass
class Ensemble:
    name: str
    members: dict[int, Member]
    env: dict[str, str] | None = None
    cpu_marks: dict[int, float] = field(default_factory=dict)

    def start(self, member_id: int) -> None:
        member = self.members[member_id]
        with member.log.open("ab") as out:
            member.proc = subprocess.Popen(
                member.argv,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop_all(self) -> None:
        for member in self.members.values():
            if member.proc is not None:
                stop(member.proc)

    def kill(self, member_id: int) -> None:
        proc = self.members[member_id].proc
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(STOP_SECONDS)

    def check_alive(self) -> None:
        for member in self.members.values():
            if member.proc is not None and member.proc.poll() is not None:
                raise BenchError(
                    f"{self.name} member {member.id} exited with status "
                    f"{member.proc.returncode}\n{log_tail(member.log)}"
                )

    def modes(self) -> dict[int, str | None]:
        return {i: mode_of(m.client_port) for i, m in self.members.items()}

    def wait_serving(self, seconds: float = STARTUP_SECONDS) -> dict[int, str]:
        """Until every member answers srvr with a Mode and exactly one is the leader."""
        deadline = time.monotonic() + seconds
        while True:
            self.check_alive()
            modes = self.modes()
            if all(modes.values()) and list(modes.values()).count("leader") == 1:
                return {i: m for i, m in modes.items() if m}
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: members not serving after {seconds:.0f} s: {modes}")
            time.sleep(0.1)

    def leader(self) -> int:
        modes = self.wait_serving()
        return next(i for i, m in modes.items() if m == "leader")

    def followers(self) -> list[Member]:
        modes = self.wait_serving()
        return [self.members[i] for i in sorted(modes) if modes[i] != "leader"]

    def cpu(self) -> dict[int, float]:
        """CPU seconds each running member has used."""
        return {i: cpu_seconds(m.proc.pid) for i, m in self.members.items() if m.proc}


@contextlib.contextmanager
def running(ensemble: Ensemble) -> Iterator[Ensemble]:
    try:
        for member_id in ensemble.members:
            ensemble.start(member_id)
        ensemble.wait_serving()
        yield ensemble
    finally:
        ensemble.stop_all()


def zookeeper_ensemble(workdir: Path, force_sync: bool) -> Ensemble:
    """Three ZooKeeper 3.8 members: zoo.cfg, myid and log4j.properties in a dir each."""
    java = shutil.which("java")
    missing = [jar for jar in ZK_JARS if not Path(jar).is_file()]
    if java is None or missing:
        raise BenchError(
            f"ZooKeeper not installed (java={java}, missing {missing}): "
            "apt-get install -y zookeeper"
        )
    ports = free_ports(3 * MEMBERS)
    servers = [
        f"server.{i}=127.0.0.1:{ports[MEMBERS + i - 1]}:{ports[2 * MEMBERS + i - 1]}"
        for i in range(1, MEMBERS + 1)
    ]
    members = {}
    for i in range(1, MEMBERS + 1):
        home = workdir / "zookeeper" / str(i)
        home.mkdir(parents=True)
        (home / "myid").write_text(f"{i}\n")
        cfg = [
            "tickTime=2000",
            "initLimit=10",
            "syncLimit=5",
            f"dataDir={home}",
            f"clientPort={ports[i - 1]}",
            "clientPortAddress=127.0.0.1",
            f"forceSync={'yes' if force_sync else 'no'}",
            "4lw.commands.whitelist=*",
            "admin.enableServer=false",
            *servers,
        ]
        (home / "zoo.cfg").write_text("\n".join(cfg) + "\n")
        log = home / "zookeeper.log"
        (home / "log4j.properties").write_text(
            "log4j.rootLogger=INFO, FILE\n"
            "log4j.appender.FILE=org.apache.log4j.FileAppender\n"
            f"log4j.appender.FILE.File={log}\n"
            "log4j.appender.FILE.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1} - %m%n\n"
        )
        argv = [java, "-Xmx1000m", f"-Dlog4j.configuration=file:{home / 'log4j.properties'}"]
        argv += [f"-Dzookeeper.log.dir={home}", "-cp", ":".join(ZK_JARS), ZK_MAIN]
        argv.append(str(home / "zoo.cfg"))
        # The process's own stdout/stderr (JVM warnings) go to a file beside the log.
        members[i] = Member(i, ports[i - 1], argv, home / "console.log")
    return Ensemble("zookeeper", members)


def ours_ensemble(workdir: Path, force_sync: bool) -> Ensemble:
    """Three `python -m services.consensus` members sharing one YAML file."""
    if not (ROOT / "services" / "consensus" / "__main__.py").is_file():
        raise BenchError("services/consensus/__main__.py does not exist yet")
    home = workdir / "ours"
    home.mkdir()
    ports = free_ports(3 * MEMBERS)
    lines = ["members:"]
    for i in range(1, MEMBERS + 1):
        client, peer, metrics = ports[i - 1], ports[MEMBERS + i - 1], ports[2 * MEMBERS + i - 1]
        lines.append(
            f'  {i}: {{client: "127.0.0.1:{client}", peer: "127.0.0.1:{peer}", '
            f'metrics: "127.0.0.1:{metrics}"}}'
        )
    lines += [f"data_dir: {home / 'consensus'}", f"force_sync: {str(force_sync).lower()}"]
    config = home / "consensus.yaml"
    config.write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIRECTLOG_CONSENSUS_")}
    members = {
        i: Member(
            i,
            ports[i - 1],
            [sys.executable, "-m", "services.consensus", "--id", str(i), "--config", str(config)],
            home / f"member-{i}.log",
        )
        for i in range(1, MEMBERS + 1)
    }
    return Ensemble("ours", members, env=env)


# --- running workers -----------------------------------------------------------------------


@dataclass
class Run:
    outcomes: list[Outcome]
    seconds: float  # wall time between the start barrier and the last result
    server_cores: float  # CPU the members used over that time, in cores
    busiest_member_cores: float  # the member that used most (a leader on one core: 1.0)
    client_cores: float  # CPU the client processes used, in cores
    machine_cores: float  # CPU the whole machine used, in cores

    @property
    def other_cores(self) -> float:
        """CPU used by neither the members nor the clients (the benchmark itself, and any
        other process on the machine: a busy neighbour makes every figure lower)."""
        return max(0.0, self.machine_cores - self.server_cores - self.client_cores)

    @property
    def ops(self) -> int:
        return sum(o.ops for o in self.outcomes)

    @property
    def rate(self) -> float:
        return sum(o.ops / o.seconds for o in self.outcomes if o.seconds)


def run_workers(
    jobs: list[Job],
    ensemble: Ensemble | None,
    during: Callable[[Any], None] | None = None,
) -> Run:
    """Start one worker process per job, release them together, collect their outcomes.
    `during(kill_times)` runs in this process once they are released; kill_times is a
    shared array of two doubles the failover worker reads."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(len(jobs) + 1)
    kill_times = ctx.Array("d", 2)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=worker_main, args=(job, start, kill_times, results), daemon=True)
        for job in jobs
    ]
    limit = max(job.seconds for job in jobs) + 60.0
    try:
        for proc in procs:
            proc.start()
        with contextlib.suppress(threading.BrokenBarrierError):
            start.wait(timeout=30)  # when a worker fails to connect, its outcome says why
        server_cpu = ensemble.cpu() if ensemble else {}
        machine_cpu = machine_busy_seconds()
        wall = time.perf_counter()
        if during is not None and not start.broken:
            during(kill_times)
        try:
            outcomes = [results.get(timeout=limit) for _ in jobs]
        except queue.Empty:
            raise BenchError(f"a worker did not report within {limit:.0f} s") from None
        seconds = time.perf_counter() - wall
        used = ensemble.cpu() if ensemble else {}
        member_cores = [(used[i] - server_cpu.get(i, 0.0)) / seconds for i in used]
        machine_cores = (machine_busy_seconds() - machine_cpu) / seconds
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    failed = [o.error for o in outcomes if o.error]
    if failed:
        raise BenchError("; ".join(failed))
    client_cores = sum(o.cpu_seconds for o in outcomes) / seconds
    return Run(
        outcomes,
        seconds,
        sum(member_cores),
        max(member_cores, default=0.0),
        client_cores,
        machine_cores,
    )


def percentile(values: list[int], fraction: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))])


# --- workloads -----------------------------------------------------------------------------


def node(k: int) -> str:
    return f"/bench/w{k}"


def spread(ensemble: Ensemble, count: int) -> list[tuple[str, int]]:
    members = [ensemble.members[i] for i in sorted(ensemble.members)]
    return [members[k % len(members)].address for k in range(count)]


def pipelined(kind: str, addresses: list[tuple[str, int]], args: argparse.Namespace) -> list[Job]:
    return [
        Job(kind, [address], node(k), VALUE, args.seconds, args.window)
        for k, address in enumerate(addresses)
    ]


def bench_ensemble(
    ensemble: Ensemble, args: argparse.Namespace
) -> tuple[Figures, dict[str, Any], list[str]]:
    """Every workload, `args.rounds` times, against one running ensemble."""
    name = ensemble.name
    figures: Figures = dict.fromkeys(FIGURES)
    diagnostics: dict[str, Any] = {}
    errors: list[str] = []
    leader = ensemble.leader()
    follower = ensemble.followers()[0]
    print(f"[{name}] serving: {ensemble.modes()}", flush=True)
    ensure_nodes(*follower.address, ["/bench", *(node(k) for k in range(4))], VALUE)

    def attempt(figure: str, work: Callable[..., None], *params: Any) -> None:
        if any(e.startswith(f"{figure}:") for e in errors):
            return  # failed once: not again
        try:
            work(*params)
        except Exception as exc:  # any failure of the ensemble under test is reported
            errors.append(f"{figure}: {type(exc).__name__}: {exc}")
            print(f"[{name}] {figure}: FAILED: {exc}", flush=True)

    if args.warmup > 0:  # untimed: the JVM's JIT and both servers' caches settle first
        warm = argparse.Namespace(**{**vars(args), "seconds": args.warmup})

        def warm_up(kind: str) -> None:
            run_workers(pipelined(kind, spread(ensemble, 4), warm), ensemble)

        for kind in ("write", "read"):
            attempt("warmup", warm_up, kind)
        print(
            f"[{name}] warmed up ({2 * args.warmup:.0f} s of pipelined writes and reads)",
            flush=True,
        )

    p50s: list[float] = []
    p99s: list[float] = []

    def sequential(rnd: int) -> None:
        run = run_workers([Job("seq", [follower.address], node(0), VALUE, args.seconds)], ensemble)
        lat = run.outcomes[0].latencies_us
        if not lat:
            raise BenchError("no write acknowledged")
        p50, p99 = percentile(lat, 0.50) / 1000, percentile(lat, 0.99) / 1000
        p50s.append(p50)
        p99s.append(p99)
        print(
            f"[{name}] sequential setData      round {rnd}: p50 {p50:7.3f} ms  "
            f"p99 {p99:7.3f} ms  ({len(lat)} writes)",
            flush=True,
        )

    def throughput(figure: str, kind: str, addresses: list[tuple[str, int]], rnd: int) -> None:
        run = run_workers(pipelined(kind, addresses, args), ensemble)
        cores = (
            f"cores: servers {run.server_cores:4.2f} (busiest {run.busiest_member_cores:4.2f}) "
            f"client {run.client_cores:4.2f} "
            f"other {run.other_cores:4.2f}"
        )
        print(f"[{name}] {figure:24} round {rnd}: {run.rate:10,.0f}/s  {cores}", flush=True)
        if (figures[figure] or 0.0) < run.rate:
            figures[figure] = run.rate
            diagnostics[figure] = {
                "client_cores": round(run.client_cores, 3),
                "server_cores": round(run.server_cores, 3),
                "busiest_member_cores": round(run.busiest_member_cores, 3),
                "other_cores": round(run.other_cores, 3),
                "client_cpu_us_per_op": round(
                    1e6 * sum(o.cpu_seconds for o in run.outcomes) / max(run.ops, 1), 2
                ),
            }

    spread4 = spread(ensemble, 4)
    for rnd in range(1, args.rounds + 1):
        attempt("seq_write_p50_ms", sequential, rnd)
        write1 = ("writes_1client_per_s", "write", [follower.address], rnd)
        attempt("writes_1client_per_s", throughput, *write1)
        attempt("writes_4clients_per_s", throughput, "writes_4clients_per_s", "write", spread4, rnd)
        attempt("reads_4clients_per_s", throughput, "reads_4clients_per_s", "read", spread4, rnd)
        ensemble.check_alive()
    if p50s:
        figures["seq_write_p50_ms"] = statistics.median(p50s)
        figures["seq_write_p99_ms"] = statistics.median(p99s)
        diagnostics["seq_write_p50_rounds_ms"] = p50s

    failovers: list[float] = []

    def failover(rnd: int) -> None:
        leader = ensemble.leader()
        survivors = [m.address for m in ensemble.followers()]
        job = Job("failover", survivors, node(0), VALUE, FAILOVER_LIMIT_SECONDS)

        def kill_leader(kill_times: Any) -> None:
            time.sleep(1.0)  # the client is writing steadily
            killed = time.monotonic()
            ensemble.kill(leader)  # SIGKILL, then reaped: certainly dead after this
            kill_times[:] = [killed, time.monotonic()]

        run = run_workers([job], None, during=kill_leader)
        outcome = run.outcomes[0]
        assert outcome.failover_seconds is not None
        failovers.append(outcome.failover_seconds)
        print(
            f"[{name}] failover (killed {leader})   round {rnd}: "
            f"{outcome.failover_seconds:7.3f} s  ({outcome.reconnects} connection losses, "
            f"{outcome.connect_attempts} connection attempts)",
            flush=True,
        )
        ensemble.start(leader)
        ensemble.wait_serving()

    for rnd in range(1, args.rounds + 1):
        attempt("failover_s", failover, rnd)
    if failovers:
        figures["failover_s"] = statistics.median(failovers)
        diagnostics["failover_rounds_s"] = [round(f, 3) for f in failovers]
    diagnostics["first_leader"] = leader
    return figures, diagnostics, errors


def client_bound(args: argparse.Namespace) -> tuple[float | None, dict[str, Any]]:
    """The 1-client pipelined setData rate against a no-op server in its own process."""
    ctx = multiprocessing.get_context("spawn")
    (port,) = free_ports(1)
    done = ctx.Event()
    server = ctx.Process(target=noop_server_main, args=(port, done), daemon=True)
    server.start()
    best: float | None = None
    info: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchError("no-op server did not start") from None
                time.sleep(0.05)
        for rnd in range(1, args.rounds + 1):
            job = Job("write", [("127.0.0.1", port)], node(0), VALUE, args.seconds, args.window)
            run = run_workers([job], None)
            print(
                f"[client] no-op server, 1 client  round {rnd}: {run.rate:10,.0f}/s  "
                f"client {run.client_cores:4.2f} cores",
                flush=True,
            )
            if best is None or run.rate > best:
                best = run.rate
                info = {
                    "client_cores": round(run.client_cores, 3),
                    "client_cpu_us_per_op": round(1e6 * run.outcomes[0].cpu_seconds / run.ops, 2),
                }
    finally:
        done.set()
        server.join(5)
        if server.is_alive():
            server.terminate()
            server.join(5)
        if server.is_alive():
            server.kill()
            server.join()
    return best, info


# --- report --------------------------------------------------------------------------------


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def cell(value: float | None, decimals: int) -> str:
    return f"{'-':>14}" if value is None else f"{value:14,.{decimals}f}"


def print_report(ours: Figures, zookeeper: Figures, rel: Figures) -> None:
    print(f"\n{'figure':26}{'ours':>14}{'zookeeper':>14}{'ours/zk':>14}  goal  {'zk anchor':>10}")
    for f in FIGURES:
        decimals = 3 if f in LOWER_IS_BETTER else 0
        goal = "<= 1.0" if f in LOWER_IS_BETTER else ">= 1.0"
        figures = cell(ours[f], decimals) + cell(zookeeper[f], decimals) + cell(rel[f], 3)
        anchor = ZOOKEEPER_ANCHORS.get(f)
        print(f"{f:26}{figures}  {goal}  {'' if anchor is None else f'{anchor:10,.{decimals}f}'}")


# --- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", action="append", choices=TARGETS, help="repeatable")
    parser.add_argument("--seconds", type=float, default=5.0, help="per workload round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per workload")
    parser.add_argument(
        "--warmup", type=float, default=5.0, help="untimed seconds of writes, then reads, first"
    )
    parser.add_argument("--force-sync", choices=("yes", "no"), default="yes")
    parser.add_argument("--window", type=int, default=256, help="outstanding requests/client")
    parser.add_argument("--dir", help="where the temporary data directories go")
    parser.add_argument("--keep", action="store_true", help="keep data dirs and logs after")
    args = parser.parse_args(argv)
    args.only = args.only or list(TARGETS)
    return args


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through every `finally`: nothing left running


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    force_sync = args.force_sync == "yes"
    results: dict[str, Figures] = {t: dict.fromkeys(FIGURES) for t in TARGETS}
    diagnostics: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    busy = background_cores()
    diagnostics["background_cores_at_start"] = round(busy, 3)
    if busy > 0.25:
        print(
            f"WARNING: other processes keep {busy:.2f} of {os.cpu_count()} cores busy; "
            "every figure below is lowered by them",
            flush=True,
        )
    bound, diagnostics["client"] = client_bound(args)
    diagnostics["client"]["bound_writes_1client_per_s"] = bound
    builders = {"zookeeper": zookeeper_ensemble, "ours": ours_ensemble}
    workdir = Path(tempfile.mkdtemp(prefix="bench-consensus-", dir=args.dir))
    try:
        for target in TARGETS:
            if target not in args.only:
                continue
            try:
                ensemble = builders[target](workdir, force_sync)
                with running(ensemble):
                    results[target], diagnostics[target], errors[target] = bench_ensemble(
                        ensemble, args
                    )
            except Exception as exc:  # the ensemble would not start, or died: report, go on
                errors.setdefault(target, []).append(f"ensemble: {type(exc).__name__}: {exc}")
                print(f"[{target}] ENSEMBLE FAILED: {exc}", flush=True)
    finally:
        if args.keep:
            print(f"data directories and logs kept in {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    ours, zookeeper = results["ours"], results["zookeeper"]
    rel: Figures = {f: ratio(ours[f], zookeeper[f]) for f in FIGURES}
    print_report(ours, zookeeper, rel)
    if bound is not None:
        print(f"client bound (no-op server, 1 client): {bound:,.0f} writes/s")
    result = {
        "ratios": rel,
        "ours": ours,
        "zookeeper": zookeeper,
        "bench": "consensus",
        "zookeeper_anchors": ZOOKEEPER_ANCHORS,
        "diagnostics": diagnostics,
        "errors": {k: v for k, v in errors.items() if v},
        "settings": {
            "seconds": args.seconds,
            "rounds": args.rounds,
            "window": args.window,
            "force_sync": force_sync,
            "members": MEMBERS,
            "value_bytes": len(VALUE),
        },
    }
    save_results("consensus", result)


if __name__ == "__main__":
    main()
