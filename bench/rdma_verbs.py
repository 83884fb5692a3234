"""The verbs layer's own costs: shm against tcp against the machine's memcpy, in one run.

    python -m bench.rdma_verbs [--quick]

The target is this module started as a subprocess (``--serve PROVIDER``): it registers a
region, accepts one QP and then only waits, so for shm its CPU does nothing and for tcp
its progress thread serves every op. This process connects and measures, per provider:

* latency of an 8-byte WRITE and an 8-byte READ: post one, wait for its completion
  (a blocking poll), repeat; the median over ``--ops`` ops;
* bandwidth of 64 KiB WRITEs, up to 32 in flight, over ``--mib`` MiB.

The limit is memcpy in this process on the same buffers (a memoryview slice assignment,
which is what shm does for each op): 8 bytes (its per-call cost bounds an op's latency from
below) and 64 KiB chunks (bandwidth). Figures: microseconds, MB/s (10**6 bytes); ratios say
how far each provider is from the limit and how far tcp is from shm. The output closes
with one JSON line, also written to bench/results/rdma_verbs.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from bench.processes import save_results
from directlog.rdma import Access, CompletionQueue, QpCaps, open_context

REGION = 8 << 20
CHUNK = 64 << 10
IN_FLIGHT = 32
ALL_RIGHTS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


def serve(provider: str) -> None:
    with open_context(provider) as ctx:
        pd = ctx.alloc_pd()
        cq = ctx.create_cq()
        region = pd.allocate(REGION, ALL_RIGHTS)
        listener = pd.listen(cq, QpCaps(max_send_wr=IN_FLIGHT, max_recv_wr=IN_FLIGHT))
        print(json.dumps([listener.conn_info.encode(), region.addr, region.rkey]), flush=True)
        listener.accept(timeout=30)
        sys.stdin.read()


def wait(cq: CompletionQueue, count: int = 1) -> None:
    done = 0
    while done < count:
        for completion in cq.poll(count - done, timeout=10.0):
            assert completion.ok, completion
            done += 1


def latency_us(cq: CompletionQueue, post: Callable[[int], None], ops: int) -> float:
    samples = []
    for wr_id in range(ops):
        start = time.perf_counter()
        post(wr_id)
        wait(cq)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def measure(provider: str, ops: int, mib: int) -> dict[str, float]:
    target = subprocess.Popen(
        [sys.executable, "-m", "bench.rdma_verbs", "--serve", provider],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert target.stdout is not None
        info, addr, rkey = json.loads(target.stdout.readline())
        with open_context(provider) as ctx:
            pd = ctx.alloc_pd()
            cq = ctx.create_cq()
            qp = pd.connect(info, cq, QpCaps(max_send_wr=IN_FLIGHT, max_recv_wr=1))
            local = pd.allocate(REGION, Access.LOCAL_WRITE)
            word = local.sge(0, 8)
            for at in range(0, REGION, CHUNK):  # first touches fault pages in: not timed
                qp.post_write(at, local.sge(at, CHUNK), addr + at, rkey)
                wait(cq)
            latency_us(cq, lambda i: qp.post_write(i, word, addr, rkey), ops // 10)  # warm-up
            write = latency_us(cq, lambda i: qp.post_write(i, word, addr, rkey), ops)
            read = latency_us(cq, lambda i: qp.post_read(i, word, addr, rkey), ops)
            chunks = mib * (1 << 20) // CHUNK
            slots = REGION // CHUNK
            start = time.perf_counter()
            for i in range(chunks):
                if i >= IN_FLIGHT:
                    wait(cq)
                at = (i % slots) * CHUNK
                qp.post_write(i, local.sge(at, CHUNK), addr + at, rkey)
            wait(cq, min(chunks, IN_FLIGHT))
            elapsed = time.perf_counter() - start
            return {
                "write8_us": write,
                "read8_us": read,
                "write64k_MBps": chunks * CHUNK / elapsed / 1e6,
            }
    finally:
        if target.stdin is not None:
            target.stdin.close()
        target.wait(timeout=10)


def memcpy_limit(ops: int, mib: int) -> dict[str, float]:
    source = bytearray(REGION)
    target = bytearray(REGION)
    src, dst = memoryview(source), memoryview(target)
    samples = []
    for _ in range(ops):
        start = time.perf_counter()
        dst[0:8] = src[0:8]
        samples.append(time.perf_counter() - start)
    chunks = mib * (1 << 20) // CHUNK
    slots = REGION // CHUNK
    start = time.perf_counter()
    for i in range(chunks):
        at = (i % slots) * CHUNK
        dst[at : at + CHUNK] = src[at : at + CHUNK]
    elapsed = time.perf_counter() - start
    return {
        "copy8_us": statistics.median(samples) * 1e6,
        "copy64k_MBps": chunks * CHUNK / elapsed / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="fewer ops and bytes")
    parser.add_argument("--ops", type=int, default=None, help="latency samples per figure")
    parser.add_argument("--mib", type=int, default=None, help="MiB written for bandwidth")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    ops = args.ops or (500 if args.quick else 5000)
    mib = args.mib or (64 if args.quick else 512)
    limit = memcpy_limit(ops, mib)
    shm = measure("shm", ops, mib)
    tcp = measure("tcp", ops, mib)
    print(f"{'':8}{'8 B WRITE us':>14}{'8 B READ us':>14}{'64 KiB WRITE MB/s':>20}")
    print(
        f"{'memcpy':8}{limit['copy8_us']:14.2f}{limit['copy8_us']:14.2f}{limit['copy64k_MBps']:20.0f}"
    )
    for name, figures in (("shm", shm), ("tcp", tcp)):
        print(
            f"{name:8}{figures['write8_us']:14.2f}{figures['read8_us']:14.2f}"
            f"{figures['write64k_MBps']:20.0f}"
        )
    result = {
        "memcpy": limit,
        "shm": shm,
        "tcp": tcp,
        "tcp_over_shm_write8_latency": tcp["write8_us"] / shm["write8_us"],
        "tcp_over_shm_read8_latency": tcp["read8_us"] / shm["read8_us"],
        "shm_over_tcp_write64k_bandwidth": shm["write64k_MBps"] / tcp["write64k_MBps"],
        "shm_write64k_vs_memcpy": shm["write64k_MBps"] / limit["copy64k_MBps"],
        "tcp_write64k_vs_memcpy": tcp["write64k_MBps"] / limit["copy64k_MBps"],
    }
    for key, value in result.items():
        if isinstance(value, float):
            print(f"{key}: {value:.3f}")
    save_results("rdma_verbs", result)


if __name__ == "__main__":
    main()
