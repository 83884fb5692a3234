"""A verbs peer in its own process, for the tests that need two processes or a death.

python -m tests.rdma.peer serve PROVIDER SIZE
    register SIZE bytes (all rights), listen, print {"info", "addr", "rkey"} as one JSON
    line, accept one QP, post receives, then wait to be killed or for stdin to close.
python -m tests.rdma.peer faa PROVIDER INFO ADDR RKEY COUNT
    FETCH_AND_ADD 1 on the word, COUNT times; print the old values as a JSON list.
python -m tests.rdma.peer write-loop PROVIDER INFO ADDR RKEY imm|plain
    WRITE (or WRITE_WITH_IMM) an increasing 8-byte counter to ADDR until an op fails;
    print one line "ready" after the first success, then the final status name.
"""

from __future__ import annotations

import json
import struct
import sys

from directlog.rdma import Access, CompletionQueue, WorkCompletion, open_context

ALL_RIGHTS = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC


def serve(provider: str, size: int) -> None:
    with open_context(provider) as ctx:
        pd = ctx.alloc_pd()
        cq = ctx.create_cq()
        region = pd.allocate(size, ALL_RIGHTS)
        listener = pd.listen(cq)
        info = {"info": listener.conn_info.encode(), "addr": region.addr, "rkey": region.rkey}
        print(json.dumps(info), flush=True)
        qp = listener.accept(timeout=30)
        for wr_id in range(32):
            qp.post_recv(wr_id)
        sys.stdin.read()


def _one(cq: CompletionQueue) -> WorkCompletion:
    completions = cq.poll(1, timeout=10.0)
    if not completions:
        raise SystemExit("no completion within 10 s")
    return completions[0]


def faa(provider: str, info: str, addr: int, rkey: int, count: int) -> None:
    with open_context(provider) as ctx:
        pd = ctx.alloc_pd()
        cq = ctx.create_cq()
        qp = pd.connect(info, cq)
        local = pd.allocate(8, Access.LOCAL_WRITE)
        olds = []
        for wr_id in range(count):
            qp.post_fetch_and_add(wr_id, local.sge(), addr, rkey, 1)
            completion = _one(cq)
            if not completion.ok:
                raise SystemExit(f"FETCH_AND_ADD failed: {completion}")
            olds.append(struct.unpack("=Q", local.buf)[0])
        print(json.dumps(olds), flush=True)


def write_loop(provider: str, info: str, addr: int, rkey: int, imm: bool) -> None:
    with open_context(provider) as ctx:
        pd = ctx.alloc_pd()
        cq = ctx.create_cq()
        qp = pd.connect(info, cq)
        local = pd.allocate(8, Access.LOCAL_WRITE)
        counter = 0
        while True:
            counter += 1
            struct.pack_into("=Q", local.buf, 0, counter)
            if imm:
                qp.post_write_with_imm(counter, local.sge(), addr, rkey, counter & 0xFFFFFFFF)
            else:
                qp.post_write(counter, local.sge(), addr, rkey)
            completion = _one(cq)
            if not completion.ok:
                print(completion.status.name, flush=True)
                return
            if counter == 1:
                print("ready", flush=True)


def main(argv: list[str]) -> None:
    command, provider, *rest = argv
    if command == "serve":
        serve(provider, int(rest[0]))
    elif command == "faa":
        faa(provider, rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
    elif command == "write-loop":
        write_loop(provider, rest[0], int(rest[1]), int(rest[2]), rest[3] == "imm")
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
