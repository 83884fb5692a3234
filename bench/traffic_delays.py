"""The traffic pipeline's event delay, TCP against RDMA consume (the KafkaDirect paper's §5.4).

    python -m bench.traffic_delays [--quick] [--rounds N]

Issue 24's second benchmark. A three-broker Directlog cluster (tests/e2e/cluster.py) with
RDMA consume served on the shm provider, and one local[2] SparkSession running the traffic
pipeline (pipelines/traffic: `run`, as `python -m pipelines.traffic` does) over and over:

* workloads: constant (the paper's 400 events/s) and bursts (400/s worth every 5 s),
  20 s of publishing each (10 s with --quick);
* replication 1 and 3: the pipeline's four topics made once per replication factor,
  2 partitions, preallocated (RDMA consume reads a head segment only where it is);
* datapath: the job's two sources read with TCP fetches, or with `rdma.consume=true`
  (directlog.spark: one-sided RDMA reads of the leaders' segments).

A run's delay per event is the pipeline's own: from the event's creation (the sensor's
clock) to the wall clock when the Spark task that read it had its row (job.py, step 4).
Each run starts a fresh query from the topics' ends; the two datapaths of one workload and
replication factor run back to back, their order alternating from round to round, so they
share the machine's noise. Two untimed runs (one per datapath) first start Spark's Python
workers. A run must read every event it published, and an RDMA run must show the brokers'
RDMA consume slot writes growing (the records came over RDMA), or the bench fails.

Printed per configuration: the delay percentiles of each datapath over its rounds and the
ratio of TCP's to RDMA's mean and median (the paper: 3.3x lower average with RDMA). The
output closes with one JSON line of every figure, also written to
bench/results/traffic_delays.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.processes import print_goals, save_results
from pipelines.traffic.__main__ import RunResult, run
from pipelines.traffic.delays import Delay, summary
from pipelines.traffic.events import Plan, Workload, events_in
from pipelines.traffic.job import JobSettings, session
from pipelines.traffic.sensors import close_producer, make_producer, wall_ms
from pipelines.traffic.topics import ensure_topics
from tests.e2e.cluster import Cluster

BROKERS = 3
PARTITIONS = 2
RATE = 400.0  # events a second, both topics (the paper's)
BURST_EVERY = 5.0
REPLICATIONS = (1, 3)
DATAPATHS = ("tcp", "rdma")
SLOT_WRITES = "directlog_broker_rdma_consume_slot_writes_total"
REQUESTS = "directlog_broker_requests_total"
PAPER_RATIO = 3.3


class BenchError(Exception):
    pass


@dataclass(frozen=True)
class Sizes:
    seconds: float
    rounds: int


FULL = Sizes(20.0, 2)
QUICK = Sizes(10.0, 1)


def topics(replication: int) -> JobSettings:
    """The pipeline's topics for one replication factor (the bootstrap and checkpoint are
    filled in per run)."""
    suffix = f"-rf{replication}"
    return JobSettings(
        bootstrap="",
        checkpoint="",
        counts_topic=f"traffic-counts{suffix}",
        speeds_topic=f"traffic-speeds{suffix}",
        aggregates_topic=f"traffic-aggregates{suffix}",
        delays_topic=f"traffic-delays{suffix}",
    )


def plan(workload: Workload, seconds: float) -> Plan:
    return Plan(
        base_ms=wall_ms(),
        events=events_in(seconds, RATE),
        rate=RATE,
        workload=workload,
        burst_every=BURST_EVERY,
    )


def slot_writes(cluster: Cluster, settings: JobSettings) -> float:
    """The brokers' RDMA consume slot writes for the job's two input topics."""
    return sum(
        broker.total(SLOT_WRITES, topic=topic)
        for broker in cluster.brokers.values()
        for topic in (settings.counts_topic, settings.speeds_topic)
    )


def requests(cluster: Cluster, api: str) -> float:
    """Requests of one API the brokers answered (rdma_consume: RDMA consumers' segment
    grants and releases; fetch: TCP fetches, the job's and the run's own read-back)."""
    return sum(broker.total(REQUESTS, api=api) for broker in cluster.brokers.values())


def one_run(
    spark: Any, cluster: Cluster, settings: JobSettings, workload: Workload, seconds: float
) -> tuple[RunResult, dict[str, float]]:
    """One pipeline run from the topics' ends, checked: every event read, over RDMA when
    the settings ask for it; and the requests of each kind the brokers answered meanwhile."""
    producer = make_producer(cluster.bootstrap)
    checkpoint = tempfile.mkdtemp(prefix="bench-traffic-")
    writes = slot_writes(cluster, settings)
    before = {api: requests(cluster, api) for api in ("fetch", "rdma_consume", "list_offsets")}
    try:
        result = run(
            spark, replace(settings, checkpoint=checkpoint), plan(workload, seconds), producer
        )
    finally:
        close_producer(producer)
        shutil.rmtree(checkpoint, ignore_errors=True)
    if len(result.delays) != result.published.events:
        raise BenchError(f"the job read {len(result.delays)} of {result.published.events} events")
    if settings.rdma_consume and slot_writes(cluster, settings) <= writes:
        raise BenchError("an rdma.consume run moved no RDMA consume slot: it read over TCP")
    return result, {api: requests(cluster, api) - n for api, n in before.items()}


def run_all(sizes: Sizes) -> dict[str, Any]:
    started = time.monotonic()
    load_start = os.getloadavg()
    delays: dict[tuple[str, int, str], list[Delay]] = {}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-traffic-") as work:
        settings = {"rdma_consume": True, "rdma_provider": "shm"}
        with Cluster(Path(work), brokers=BROKERS, broker_settings=settings) as cluster:
            base = {rf: replace(topics(rf), bootstrap=cluster.bootstrap) for rf in REPLICATIONS}
            for rf, job in base.items():
                ensure_topics(
                    cluster.bootstrap,
                    [job.counts_topic, job.speeds_topic, job.aggregates_topic, job.delays_topic],
                    PARTITIONS,
                    rf,
                    {"preallocate": "true"},
                )
            spark = session("local[2]", 2)
            try:
                for datapath in DATAPATHS:  # untimed: Spark starts its Python workers
                    job = replace(base[1], rdma_consume=datapath == "rdma")
                    one_run(spark, cluster, job, Workload.CONSTANT, 4.0)
                for round_ in range(sizes.rounds):
                    for workload in Workload:
                        for rf in REPLICATIONS:
                            order = DATAPATHS if round_ % 2 == 0 else DATAPATHS[::-1]
                            for datapath in order:
                                job = replace(base[rf], rdma_consume=datapath == "rdma")
                                result, answered = one_run(
                                    spark, cluster, job, workload, sizes.seconds
                                )
                                key = (str(workload), rf, datapath)
                                delays.setdefault(key, []).extend(result.delays)
                                figures = summary(result.delays)
                                runs.append(
                                    {
                                        "round": round_,
                                        "workload": str(workload),
                                        "replication": rf,
                                        "datapath": datapath,
                                        "events": result.published.events,
                                        "behind_ms": round(result.published.behind_ms, 1),
                                        "micro_batches": result.micro_batches,
                                        "requests": answered,
                                        "delay_ms": figures,
                                    }
                                )
                                print(
                                    f"round {round_} {workload:>8} rf{rf} {datapath:>4}: "
                                    f"{result.published.events} events, "
                                    f"{result.micro_batches} micro-batches, requests "
                                    f"{answered}, delay ms " + _text(figures),
                                    flush=True,
                                )
            finally:
                spark.stop()
    return summarize(delays, runs, sizes, load_start, time.monotonic() - started)


def _text(figures: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.0f}" for k, v in figures.items() if k != "count")


def summarize(
    delays: dict[tuple[str, int, str], list[Delay]],
    runs: list[dict[str, Any]],
    sizes: Sizes,
    load_start: tuple[float, float, float],
    seconds: float,
) -> dict[str, Any]:
    configurations: dict[str, Any] = {}
    for workload in Workload:
        for rf in REPLICATIONS:
            tcp = summary(delays[(str(workload), rf, "tcp")])
            rdma = summary(delays[(str(workload), rf, "rdma")])
            configurations[f"{workload}-rf{rf}"] = {
                "tcp_delay_ms": tcp,
                "rdma_delay_ms": rdma,
                "mean_ratio": round(tcp["mean"] / rdma["mean"], 3),
                "median_ratio": round(tcp["p50"] / max(rdma["p50"], 1), 3),
            }
    return {
        "setup": {
            "brokers": BROKERS,
            "partitions": PARTITIONS,
            "rate": RATE,
            "burst_every_s": BURST_EVERY,
            "publish_seconds": sizes.seconds,
            "rounds": sizes.rounds,
            "spark_master": "local[2]",
            "rdma_provider": "shm",
            "cpus": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "seconds": round(seconds, 1),
        },
        "configurations": configurations,
        "runs": runs,
        "reference": {
            "mean_ratio": {
                "goal": f"the paper's {PAPER_RATIO}x lower average with RDMA (reported, "
                "not a target of this machine)",
                "value": [c["mean_ratio"] for c in configurations.values()],
                "met": all(c["mean_ratio"] >= PAPER_RATIO for c in configurations.values()),
            }
        },
    }


def report(figures: dict[str, Any]) -> None:
    setup = figures["setup"]
    print(
        f"\n{setup['rate']:g} events/s, {setup['publish_seconds']:g} s a run, "
        f"{setup['rounds']} round(s), {setup['partitions']} partitions, {setup['brokers']} "
        f"brokers, Spark {setup['spark_master']}, {setup['cpus']} CPUs"
    )
    print("delay from creation to the job's read, ms, over the rounds:")
    for name, entry in figures["configurations"].items():
        print(f"  {name:>13}  tcp: {_text(entry['tcp_delay_ms'])}")
        print(f"  {'':>13} rdma: {_text(entry['rdma_delay_ms'])}")
        print(f"  {'':>13} tcp/rdma: mean {entry['mean_ratio']}, median {entry['median_ratio']}")
    print_goals(figures["reference"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.traffic_delays", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="10 s runs, 1 round")
    parser.add_argument("--rounds", type=int, help="rounds of every configuration (2; 1 quick)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.rounds:
        sizes = Sizes(sizes.seconds, args.rounds)
    figures = run_all(sizes)
    report(figures)
    save_results("traffic_delays", figures)


if __name__ == "__main__":
    main()
