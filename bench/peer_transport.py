"""ZAB peer traffic over our TCP transport against a gRPC bidirectional stream, in one run.

    python -m bench.peer_transport [--quick] [--rounds N] [--messages N] [--window N]

The issue asks for "a compact binary framing (or gRPC streams if it measures as fast)";
this measures both on loopback with the same exchange and the same bytes:

* a leader process streams Proposal messages (128-byte payloads, wire.encode framing) to a
  follower process, pipelined: at most ``--window`` proposals unacknowledged, like the
  leader's max_in_flight (1000 by default);
* the follower decodes each one and answers with an Ack for its zxid; the leader checks
  that every Ack arrives, in zxid order, and sends more as the window opens.

Targets:

* peers_uvloop: services.consensus.peers.PeerNetwork on uvloop in both processes, as the
  service runs.
* peers_asyncio: the same on the standard asyncio loop, for a like-for-like loop with gRPC.
* grpc_asyncio: grpcio's grpc.aio, one bidirectional stream-stream call; each request and
  each response is one ``bytes`` message holding exactly the frame PeerNetwork would write
  (no serializer, no protobuf, so only the transport differs). grpc.aio runs on the
  standard asyncio loop.

The follower is this module started as a subprocess (``--serve TARGET``), so the two sides
have their own interpreter and GIL, sharing this machine's cores. Figures are proposals/s
(one Ack each) and MB/s of Proposal frames one way (157 bytes each: 9-byte header, epoch,
zxid, payload length, 128-byte payload; MB = 10**6 bytes). Each target runs ``--rounds``
times (3, or 1 with ``--quick``) after a warm-up, over one connection; the best round
counts. The output closes with one JSON line, also written to
bench/results/peer_transport.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import uvloop

from bench.processes import save_results
from services.consensus.peers import PeerNetwork
from services.consensus.zab.messages import Ack, Message, Proposal
from services.consensus.zab.state import LogEntry
from services.consensus.zab.wire import FrameDecoder, encode

TARGETS = ("peers_uvloop", "peers_asyncio", "grpc_asyncio")
HOST = "127.0.0.1"
LEADER, FOLLOWER = 1, 2
EPOCH = 7
PAYLOAD = 128
GRPC_METHOD = "/directlog.bench.PeerStream/Exchange"
STARTUP_SECONDS = 20.0


class BenchError(Exception):
    """A transport lost, reordered or corrupted an Ack; its figure is not reported."""


def proposals(count: int, first_zxid: int) -> list[Proposal]:
    payload = bytes(range(PAYLOAD))
    return [
        Proposal(LEADER, EPOCH, LogEntry(zxid, payload))
        for zxid in range(first_zxid, first_zxid + count)
    ]


class Window:
    """Leader-side flow: keeps ``window`` proposals in flight and checks every Ack."""

    def __init__(self, batch: list[Proposal], window: int, send: Callable[[Proposal], None]):
        self.batch = batch
        self.window = window
        self.send = send
        self.sent = 0
        self.acked = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def fill(self) -> None:
        stop = min(len(self.batch), self.acked + self.window)
        while self.sent < stop:
            self.send(self.batch[self.sent])
            self.sent += 1

    def on_ack(self, message: Message) -> None:
        if self.done.done():
            return
        want = self.batch[self.acked].entry.zxid
        if not isinstance(message, Ack) or message.zxid != want or message.epoch != EPOCH:
            self.done.set_exception(BenchError(f"expected Ack of zxid {want}, got {message}"))
            return
        self.acked += 1
        if self.acked == len(self.batch):
            self.done.set_result(None)
        else:
            self.fill()


# --- follower (subprocess) ---------------------------------------------------------------


def ack_for(message: Message) -> Ack:
    if not isinstance(message, Proposal):
        raise BenchError(f"follower expected a Proposal, got {message}")
    return Ack(FOLLOWER, message.epoch, message.entry.zxid)


async def wait_for_stdin_eof() -> None:
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def serve_peers() -> None:
    net: PeerNetwork

    def on_message(message: Message) -> None:
        net.send(LEADER, ack_for(message))

    net = PeerNetwork(FOLLOWER, {LEADER: (HOST, 1)}, on_message, lambda peer: None)
    print(await net.start(HOST, 0), flush=True)
    await wait_for_stdin_eof()
    await net.close()


async def serve_grpc() -> None:
    import grpc

    async def exchange(requests: Any, context: Any) -> Any:
        decoder = FrameDecoder()
        async for frame in requests:
            for message in decoder.feed(frame):
                yield encode(ack_for(message))

    handler = grpc.method_handlers_generic_handler(
        GRPC_METHOD.split("/")[1], {"Exchange": grpc.stream_stream_rpc_method_handler(exchange)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"{HOST}:0")
    await server.start()
    print(port, flush=True)
    await wait_for_stdin_eof()
    await server.stop(None)


# --- leader (this process) ---------------------------------------------------------------


async def lead_peers(port: int, rounds: list[list[Proposal]], window: int) -> list[float]:
    flow: Window | None = None

    def on_message(message: Message) -> None:
        if flow is None:
            raise BenchError(f"unexpected {message}")
        flow.on_ack(message)

    net = PeerNetwork(LEADER, {FOLLOWER: (HOST, port)}, on_message, lambda peer: None)
    await net.start(HOST, 0)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while FOLLOWER not in net.connected():
            if time.monotonic() > deadline:
                raise BenchError("the follower never linked")
            await asyncio.sleep(0.01)
        times = []
        for batch in rounds:
            flow = Window(batch, window, lambda p: net.send(FOLLOWER, p))
            start = time.perf_counter()
            flow.fill()
            await flow.done
            times.append(time.perf_counter() - start)
        return times
    finally:
        await net.close()


async def lead_grpc(port: int, rounds: list[list[Proposal]], window: int) -> list[float]:
    import grpc

    async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
        call = channel.stream_stream(GRPC_METHOD)()
        decoder = FrameDecoder()
        times = []
        for batch in rounds:
            flow = Window(batch, window, lambda p: None)
            opened = asyncio.Event()  # set when an Ack may have opened the window

            async def writer(flow: Window = flow, opened: asyncio.Event = opened) -> None:
                for i, proposal in enumerate(flow.batch):
                    while i - flow.acked >= window:
                        if flow.done.done():
                            return
                        opened.clear()
                        await opened.wait()
                    await call.write(encode(proposal))  # encoded in the timing, as send() does

            async def reader(flow: Window = flow, opened: asyncio.Event = opened) -> None:
                try:
                    while not flow.done.done():
                        reply = await call.read()
                        if reply is grpc.aio.EOF:
                            raise BenchError("the follower closed the stream")
                        for message in decoder.feed(reply):
                            flow.on_ack(message)
                        opened.set()
                finally:
                    opened.set()

            start = time.perf_counter()
            await asyncio.gather(writer(), reader())
            await flow.done
            times.append(time.perf_counter() - start)
        await call.done_writing()
        return times


# --- driving ------------------------------------------------------------------------------


@contextlib.contextmanager
def follower(target: str) -> Iterator[int]:
    """The follower subprocess for ``target``; yields its port, stops it on exit."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.peer_transport", "--serve", target],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            raise BenchError(f"{target} follower did not start (exit code {proc.poll()})")
        yield int(line)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_loop(target: str, main: Coroutine[Any, Any, list[float]]) -> list[float]:
    factory = uvloop.new_event_loop if target.endswith("uvloop") else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def serve(target: str) -> None:
    main = serve_grpc() if target.startswith("grpc") else serve_peers()
    factory = uvloop.new_event_loop if target.endswith("uvloop") else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)


def bench_target(target: str, count: int, rounds: int, window: int) -> dict[str, float]:
    warmup = proposals(min(count, 10_000), 1)
    batches = [warmup] + [proposals(count, 1 + len(warmup) + r * count) for r in range(rounds)]
    lead = lead_grpc if target.startswith("grpc") else lead_peers
    with follower(target) as port:
        times = run_loop(target, lead(port, batches, window))[1:]
    frame = len(encode(batches[1][0]))
    for r, seconds in enumerate(times, 1):
        print(
            f"[{target}] round {r}: {count / seconds:12,.0f} msg/s "
            f"{count * frame / seconds / 1e6:8.1f} MB/s",
            flush=True,
        )
    best = min(times)
    return {"msgs": count / best, "MBps": count * frame / best / 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer messages, one round")
    parser.add_argument("--rounds", type=int, help="rounds per target (best counts)")
    parser.add_argument("--messages", type=int, help="proposals per round")
    parser.add_argument("--window", type=int, default=1000, help="proposals in flight")
    parser.add_argument("--only", action="append", choices=TARGETS, help="repeatable")
    parser.add_argument("--serve", choices=TARGETS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return
    rounds = args.rounds or (1 if args.quick else 3)
    count = args.messages or (20_000 if args.quick else 200_000)
    figures: dict[str, dict[str, float] | None] = {}
    errors: dict[str, str] = {}
    for target in args.only or TARGETS:
        try:
            figures[target] = bench_target(target, count, rounds, args.window)
        except (BenchError, OSError, ImportError, TimeoutError) as exc:
            errors[target] = f"{type(exc).__name__}: {exc}"
            figures[target] = None
            print(f"[{target}] FAILED: {errors[target]}", flush=True)

    def ratio(a: str, b: str) -> float | None:
        fa, fb = figures.get(a), figures.get(b)
        return fa["msgs"] / fb["msgs"] if fa and fb else None

    ratios = {
        "peers_uvloop_vs_grpc": ratio("peers_uvloop", "grpc_asyncio"),
        "peers_asyncio_vs_grpc": ratio("peers_asyncio", "grpc_asyncio"),
    }
    print(f"\n{'target':16}{'msg/s':>14}{'MB/s':>10}")
    for target, fig in figures.items():
        if fig is None:
            print(f"{target:16}{'-':>14}{'-':>10}")
        else:
            print(f"{target:16}{fig['msgs']:14,.0f}{fig['MBps']:10.1f}")
    for name, value in ratios.items():
        print(f"{name:24}{'-' if value is None else f'{value:.2f}x':>6}")
    result = {
        "bench": "peer_transport",
        "figures": figures,
        "ratios": ratios,
        "errors": errors,
        "config": {"messages": count, "rounds": rounds, "window": args.window, "payload": PAYLOAD},
    }
    save_results("peer_transport", result)


if __name__ == "__main__":
    main()
