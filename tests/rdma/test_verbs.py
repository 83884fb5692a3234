"""The provider-neutral verbs suite, run on shm and on tcp (the ``provider`` fixture).

Both ends live in this process unless a test needs two processes (concurrent atomics) or a
death (a peer killed mid-stream); those start tests/rdma/peer.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import mmap
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from directlog.rdma import (
    Access,
    ConnInfo,
    InvalidWorkRequestError,
    Opcode,
    QpCaps,
    QpState,
    QueueFullError,
    RdmaError,
    RegistrationError,
    WcStatus,
    open_context,
)
from directlog.rdma.progress import wait_readable
from tests.rdma.conftest import ALL_RIGHTS, Pair, connect, drain, make_pair, one

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]


def fill(pair: Pair, offset: int, data: bytes) -> None:
    pair.local.buf[offset : offset + len(data)] = data


@pytest.mark.parametrize("size", [0, 1, 7, 8, 100, 4095, 4096, 4097, 65536, 1 << 20, 3 << 20])
def test_write_then_read_round_trip(pair: Pair, size: int) -> None:
    rng = random.Random(size)
    data = rng.randbytes(size)
    at = rng.randrange(0, pair.target.length - size + 1)
    fill(pair, 0, data)
    pair.qp.post_write(1, pair.local.sge(0, size), pair.target.addr + at, pair.target.rkey)
    written = one(pair.user_cq)
    assert (written.wr_id, written.status, written.opcode) == (1, WcStatus.SUCCESS, Opcode.WRITE)
    assert bytes(pair.target.buf[at : at + size]) == data

    back = pair.local.length - size
    pair.qp.post_read(2, pair.local.sge(back, size), pair.target.addr + at, pair.target.rkey)
    read = one(pair.user_cq)
    assert (read.wr_id, read.status, read.opcode, read.byte_len) == (
        2, WcStatus.SUCCESS, Opcode.READ, size,
    )  # fmt: skip
    assert bytes(pair.local.buf[back : back + size]) == data


def test_many_pipelined_ops_complete_in_order(pair: Pair) -> None:
    rng = random.Random(7)
    expected = []
    for wr_id in range(60):
        size = rng.choice([1, 8, 300, 5000])
        at = wr_id * 8192
        data = rng.randbytes(size)
        fill(pair, at, data)
        pair.qp.post_write(wr_id, pair.local.sge(at, size), pair.target.addr + at, pair.target.rkey)
        expected.append((at, data))
    completions = drain(pair.user_cq, 60)
    assert [c.wr_id for c in completions] == list(range(60))
    assert all(c.ok for c in completions)
    for at, data in expected:
        assert bytes(pair.target.buf[at : at + len(data)]) == data


def test_write_with_imm_delivers_immediates_in_order_after_the_data(pair: Pair) -> None:
    count = 40
    for wr_id in range(count):
        pair.owner_qp.post_recv(1000 + wr_id)
    for i in range(count):
        struct.pack_into("=Q", pair.local.buf, 8 * i, i + 1)
        pair.qp.post_write_with_imm(
            i, pair.local.sge(8 * i, 8), pair.target.addr + 8 * i, pair.target.rkey, 0xABC00000 + i
        )
    sent = drain(pair.user_cq, count)
    assert [(c.wr_id, c.opcode, c.ok) for c in sent] == [
        (i, Opcode.WRITE_WITH_IMM, True) for i in range(count)
    ]
    for i, received in enumerate(drain(pair.owner_cq, count)):
        assert received.opcode is Opcode.RECV_RDMA_WITH_IMM
        assert (received.wr_id, received.imm_data, received.byte_len) == (
            1000 + i,
            0xABC00000 + i,
            8,
        )
        assert received.qp_num == pair.owner_qp.qp_num
        # The data of the write this completion announces is in place.
        assert struct.unpack_from("=Q", pair.target.buf, 8 * i)[0] == i + 1


def test_write_with_imm_waits_for_a_late_receive(provider: str) -> None:
    """The target posts its receive 0.1 s after the write (shm's post waits for it, tcp's
    target parks the write)."""
    pair = make_pair(provider)
    try:
        fill(pair, 0, b"late")
        poster = threading.Timer(0.1, pair.owner_qp.post_recv, args=(5,))
        poster.start()
        pair.qp.post_write_with_imm(1, pair.local.sge(0, 4), pair.target.addr, pair.target.rkey, 9)
        poster.join()
        received = one(pair.owner_cq)
        assert (received.wr_id, received.imm_data, received.ok) == (5, 9, True)
        assert one(pair.user_cq).ok
    finally:
        pair.user.close()
        pair.owner.close()


def test_write_with_imm_without_receive_fails_rnr(provider: str) -> None:
    pair = make_pair(provider, user_caps=QpCaps(rnr_timeout=0.2))
    try:
        started = time.monotonic()
        pair.qp.post_write_with_imm(1, pair.local.sge(0, 4), pair.target.addr, pair.target.rkey, 1)
        failed = one(pair.user_cq)
        assert failed.status is WcStatus.RNR_RETRY_EXC_ERR
        assert time.monotonic() - started >= 0.15
        assert pair.qp.state is QpState.ERROR
    finally:
        pair.user.close()
        pair.owner.close()


def test_compare_and_swap(pair: Pair) -> None:
    struct.pack_into("=Q", pair.target.buf, 64, 41)
    word = pair.target.addr + 64
    pair.qp.post_compare_and_swap(1, pair.local.sge(0, 8), word, pair.target.rkey, 40, 99)
    assert one(pair.user_cq).ok
    assert struct.unpack_from("=Q", pair.local.buf, 0)[0] == 41  # the old value, no swap
    assert struct.unpack_from("=Q", pair.target.buf, 64)[0] == 41
    pair.qp.post_compare_and_swap(2, pair.local.sge(8, 8), word, pair.target.rkey, 41, 2**64 - 1)
    swapped = one(pair.user_cq)
    assert (swapped.ok, swapped.opcode, swapped.byte_len) == (True, Opcode.COMPARE_AND_SWAP, 8)
    assert struct.unpack_from("=Q", pair.local.buf, 8)[0] == 41
    assert struct.unpack_from("=Q", pair.target.buf, 64)[0] == 2**64 - 1


def test_fetch_and_add_wraps_modulo_2_64(pair: Pair) -> None:
    struct.pack_into("=Q", pair.target.buf, 0, 2**64 - 2)
    pair.qp.post_fetch_and_add(1, pair.local.sge(0, 8), pair.target.addr, pair.target.rkey, 5)
    assert one(pair.user_cq).ok
    assert struct.unpack_from("=Q", pair.local.buf, 0)[0] == 2**64 - 2
    assert struct.unpack_from("=Q", pair.target.buf, 0)[0] == 3


def run_peer(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.rdma.peer", *map(str, args)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(60)
def test_fetch_and_add_from_two_processes_is_unique_and_gap_free(provider: str) -> None:
    count = 300
    with open_context(provider) as owner:
        pd = owner.alloc_pd()
        cq = owner.create_cq()
        word = pd.allocate(4096, ALL_RIGHTS)
        listener = pd.listen(cq)
        peers = [
            run_peer("faa", provider, listener.conn_info.encode(), word.addr, word.rkey, count)
            for _ in range(2)
        ]
        qps = [listener.accept(timeout=20) for _ in peers]
        olds: list[int] = []
        for peer in peers:
            out, _ = peer.communicate(timeout=40)
            assert peer.returncode == 0
            olds += json.loads(out)
        assert sorted(olds) == list(range(2 * count))
        assert struct.unpack_from("=Q", word.buf, 0)[0] == 2 * count
        assert all(qp.state is not QpState.CLOSED for qp in qps)


REMOTE_READ_ONLY = Access.LOCAL_WRITE | Access.REMOTE_READ


@pytest.mark.parametrize(
    "case",
    ["no_remote_write", "past_the_end", "before_the_start", "unknown_rkey", "deregistered"],
)
def test_refused_write_completes_with_error_and_leaves_memory_untouched(
    provider: str, case: str, tmp_path: Path
) -> None:
    pair = make_pair(provider)
    try:
        segment = tmp_path / "segment"
        segment.write_bytes(b"\xee" * 8192)
        access = REMOTE_READ_ONLY if case == "no_remote_write" else ALL_RIGHTS
        region = pair.owner_pd.register_file(segment, 4096, access, offset=4096)
        addr, rkey, size = region.addr, region.rkey, 64
        if case == "past_the_end":
            addr += 4096 - 32
        elif case == "before_the_start":
            addr -= 8
        elif case == "unknown_rkey":
            rkey ^= 0x5A5A0000
        elif case == "deregistered":
            region.deregister()
        fill(pair, 0, b"\x11" * size)
        pair.qp.post_write(1, pair.local.sge(0, size), addr, rkey)
        refused = one(pair.user_cq)
        assert (refused.wr_id, refused.status) == (1, WcStatus.REM_ACCESS_ERR)
        assert pair.qp.state is QpState.ERROR
        assert segment.read_bytes() == b"\xee" * 8192
    finally:
        pair.user.close()
        pair.owner.close()


@pytest.mark.parametrize(
    ("access", "op", "status"),
    [
        (Access.LOCAL_WRITE | Access.REMOTE_WRITE, "read", WcStatus.REM_ACCESS_ERR),
        (REMOTE_READ_ONLY, "faa", WcStatus.REM_ACCESS_ERR),
        (ALL_RIGHTS, "misaligned_faa", WcStatus.REM_INV_REQ_ERR),
        (ALL_RIGHTS, "cas_past_the_end", WcStatus.REM_ACCESS_ERR),
    ],
)
def test_refused_read_and_atomics(provider: str, access: Access, op: str, status: WcStatus) -> None:
    pair = make_pair(provider)
    try:
        region = pair.owner_pd.allocate(4096, access)
        region.buf[:16] = b"\x42" * 16
        fill(pair, 0, b"\x00" * 16)
        sge = pair.local.sge(0, 8)
        if op == "read":
            pair.qp.post_read(1, pair.local.sge(0, 16), region.addr, region.rkey)
        elif op == "faa":
            pair.qp.post_fetch_and_add(1, sge, region.addr, region.rkey, 1)
        elif op == "misaligned_faa":
            pair.qp.post_fetch_and_add(1, sge, region.addr + 4, region.rkey, 1)
        else:
            pair.qp.post_compare_and_swap(1, sge, region.addr + 4092, region.rkey, 0, 1)
        assert one(pair.user_cq).status is status
        assert bytes(region.buf[:16]) == b"\x42" * 16
        assert bytes(pair.local.buf[:16]) == b"\x00" * 16
    finally:
        pair.user.close()
        pair.owner.close()


def test_local_protection_errors(pair: Pair) -> None:
    readonly = pair.user_pd.allocate(64, Access.REMOTE_READ)
    pair.qp.post_read(1, readonly.sge(0, 8), pair.target.addr, pair.target.rkey)
    assert one(pair.user_cq).status is WcStatus.LOC_PROT_ERR
    assert pair.qp.state is QpState.ERROR


def test_error_flushes_later_ops_and_the_peers_receives(pair: Pair) -> None:
    for wr_id in range(3):
        pair.owner_qp.post_recv(100 + wr_id)
    fill(pair, 0, b"ok")
    pair.qp.post_write(1, pair.local.sge(0, 2), pair.target.addr, pair.target.rkey)
    pair.qp.post_write(2, pair.local.sge(0, 2), pair.target.addr, pair.target.rkey + 1)
    pair.qp.post_write(3, pair.local.sge(0, 2), pair.target.addr + 100, pair.target.rkey)
    pair.qp.post_read(4, pair.local.sge(0, 2), pair.target.addr, pair.target.rkey)
    statuses = [(c.wr_id, c.status) for c in drain(pair.user_cq, 4)]
    assert statuses == [
        (1, WcStatus.SUCCESS),
        (2, WcStatus.REM_ACCESS_ERR),
        (3, WcStatus.WR_FLUSH_ERR),
        (4, WcStatus.WR_FLUSH_ERR),
    ]
    assert bytes(pair.target.buf[100:102]) == b"\x00\x00"
    pair.qp.post_write(5, pair.local.sge(0, 2), pair.target.addr, pair.target.rkey)
    assert one(pair.user_cq).status is WcStatus.WR_FLUSH_ERR
    flushed = drain(pair.owner_cq, 3)
    assert [(c.wr_id, c.status) for c in flushed] == [
        (100 + i, WcStatus.WR_FLUSH_ERR) for i in range(3)
    ]
    assert pair.owner_qp.state is QpState.ERROR
    pair.owner_qp.post_recv(200)
    assert one(pair.owner_cq).status is WcStatus.WR_FLUSH_ERR


def test_writes_landing_after_the_target_failed_are_not_completed(pair: Pair) -> None:
    """The target's QP failed on an op of its own; the peer, not knowing yet, keeps
    writing with immediates into receives that were flushed: they complete nowhere."""
    for wr_id in range(3):
        pair.owner_qp.post_recv(100 + wr_id)
    pair.owner_qp.post_read(9, pair.target.sge(0, 8), pair.local.addr, pair.local.rkey + 99)
    fill(pair, 0, b"late")
    for wr_id in range(3):
        try:
            pair.qp.post_write_with_imm(
                wr_id, pair.local.sge(0, 4), pair.target.addr, pair.target.rkey, wr_id
            )
        except RdmaError:
            break  # the disconnect already reached this end
    # Each receive completes once: with a write that landed before the failure (tcp's
    # READ fails a round trip later), else flushed; in either queue order.
    completions = {c.wr_id: c.status for c in drain(pair.owner_cq, 4)}
    assert completions.pop(9) is WcStatus.REM_ACCESS_ERR
    assert sorted(completions) == [100, 101, 102]
    assert set(completions.values()) <= {WcStatus.SUCCESS, WcStatus.WR_FLUSH_ERR}
    assert pair.owner_cq.poll(8, timeout=0.2) == []
    assert pair.owner_qp.state is QpState.ERROR


def test_doorbell_turns_readable_on_each_completion(pair: Pair) -> None:
    """What an event loop waits on instead of a thread in poll()."""
    doorbell = pair.owner_cq.doorbell()
    assert doorbell is not None
    fd = doorbell.fd
    assert wait_readable([fd], 0) == set()
    pair.owner_qp.post_recv(7)
    fill(pair, 0, b"ring")
    pair.qp.post_write_with_imm(1, pair.local.sge(0, 4), pair.target.addr, pair.target.rkey, 5)
    assert wait_readable([fd], 5) == {fd}
    doorbell.heard()
    (completion,) = pair.owner_cq.poll(4)
    assert (completion.wr_id, completion.imm_data) == (7, 5)
    assert wait_readable([fd], 0) == set()


def test_armed_doorbell_rings_only_while_armed(pair: Pair) -> None:
    """armed(): a waiter's doorbell that costs posters nothing once the wait is over."""
    pair.owner_qp.post_recv(1)
    pair.owner_qp.post_recv(2)
    with pair.owner_cq.armed() as bell:
        assert bell is not None
        assert wait_readable([bell.fd], 0) == set()
        pair.qp.post_write_with_imm(1, pair.local.sge(0, 1), pair.target.addr, pair.target.rkey, 3)
        assert wait_readable([bell.fd], 5) == {bell.fd}
        bell.heard()
        fd = bell.fd
    pair.qp.post_write_with_imm(2, pair.local.sge(0, 1), pair.target.addr, pair.target.rkey, 4)
    drain(pair.user_cq, 2)
    assert wait_readable([fd], 0.2) == set()
    assert [c.imm_data for c in drain(pair.owner_cq, 2)] == [3, 4]


class NoThreads(concurrent.futures.ThreadPoolExecutor):
    def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("poll_async handed the wait to a thread")


def test_poll_async_waits_on_the_event_loop_without_a_thread(pair: Pair) -> None:
    """poll_async: an empty wait ends at its timeout; a completion added meanwhile (by the
    peer, from another thread) ends it at once; the loop never hands the wait to a thread."""
    pair.owner_qp.post_recv(9)

    def post_later() -> None:
        time.sleep(0.1)
        pair.qp.post_write_with_imm(1, pair.local.sge(0, 1), pair.target.addr, pair.target.rkey, 6)

    async def run() -> tuple[float, list[int | None], float]:
        asyncio.get_running_loop().set_default_executor(NoThreads())
        started = time.monotonic()
        assert await pair.owner_cq.poll_async(4, 0.2) == []
        empty = time.monotonic() - started
        poster = threading.Thread(target=post_later)
        poster.start()
        started = time.monotonic()
        found = await pair.owner_cq.poll_async(4, 10.0)
        waited = time.monotonic() - started
        poster.join()
        return empty, [c.imm_data for c in found], waited

    empty, found, waited = asyncio.run(run())
    assert empty >= 0.19
    assert found == [6] and waited < 5.0


def test_send_queue_is_bounded(provider: str) -> None:
    pair = make_pair(provider, user_caps=QpCaps(max_send_wr=4, max_recv_wr=2))
    try:
        for wr_id in range(4):
            pair.qp.post_write(wr_id, pair.local.sge(0, 8), pair.target.addr, pair.target.rkey)
        with pytest.raises(QueueFullError):
            pair.qp.post_write(9, pair.local.sge(0, 8), pair.target.addr, pair.target.rkey)
        assert one(pair.user_cq).wr_id == 0
        pair.qp.post_write(4, pair.local.sge(0, 8), pair.target.addr, pair.target.rkey)
        assert [c.wr_id for c in drain(pair.user_cq, 4)] == [1, 2, 3, 4]
        pair.qp.post_recv(1)
        pair.qp.post_recv(2)
        with pytest.raises(QueueFullError):
            pair.qp.post_recv(3)
    finally:
        pair.user.close()
        pair.owner.close()


def test_cq_depth_bounds_the_queue_pairs_on_it(provider: str) -> None:
    with open_context(provider) as owner, open_context(provider) as user:
        owner_pd, user_pd = owner.alloc_pd(), user.alloc_pd()
        small = user.create_cq(depth=100)
        owner_cq = owner.create_cq()
        connect(
            owner_pd, owner_cq, user_pd, small, user_caps=QpCaps(max_send_wr=50, max_recv_wr=40)
        )
        listener = owner_pd.listen(owner_cq)
        with pytest.raises(QueueFullError):
            user_pd.connect(listener.conn_info, small, QpCaps(max_send_wr=10, max_recv_wr=1))
        accepted = threading.Thread(target=listener.accept, kwargs={"timeout": 5})
        accepted.start()
        user_pd.connect(listener.conn_info, small, QpCaps(max_send_wr=9, max_recv_wr=1))
        accepted.join()


def test_bad_work_requests_raise(pair: Pair) -> None:
    sge = pair.local.sge(0, 8)
    with pytest.raises(InvalidWorkRequestError):
        pair.qp.post_write_with_imm(1, sge, pair.target.addr, pair.target.rkey, 1 << 32)
    with pytest.raises(InvalidWorkRequestError):
        pair.qp.post_fetch_and_add(1, pair.local.sge(0, 4), pair.target.addr, pair.target.rkey, 1)
    with pytest.raises(InvalidWorkRequestError):
        pair.qp.post_write(-1, sge, pair.target.addr, pair.target.rkey)
    big = QpCaps().max_message + 1
    with pytest.raises(InvalidWorkRequestError):
        pair.qp.post_write(1, pair.local.sge(0, big), pair.target.addr, pair.target.rkey)
    pair.qp.close()
    with pytest.raises(InvalidWorkRequestError):
        pair.qp.post_write(1, sge, pair.target.addr, pair.target.rkey)


def test_registration_checks(provider: str, tmp_path: Path) -> None:
    with open_context(provider) as ctx:
        pd = ctx.alloc_pd()
        segment = tmp_path / "short"
        segment.write_bytes(b"\0" * 100)
        with pytest.raises(RegistrationError):
            pd.register_file(segment, 200, Access.LOCAL_WRITE)
        with pytest.raises(RegistrationError):
            pd.allocate(64, Access.REMOTE_WRITE)


def test_region_over_the_callers_mapping_shares_its_pages(pair: Pair, tmp_path: Path) -> None:
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(b"\0" * 65536)
    with segment.open("r+b") as file:
        mapping = mmap.mmap(file.fileno(), 0)
    region = pair.owner_pd.register_file(segment, 16384, ALL_RIGHTS, offset=8192, mapping=mapping)
    with pytest.raises(BufferError):
        mapping.close()  # pinned while registered
    fill(pair, 0, b"records")
    pair.qp.post_write(1, pair.local.sge(0, 7), region.addr + 10, region.rkey)
    assert one(pair.user_cq).ok
    assert mapping[8192 + 10 : 8192 + 17] == b"records"
    mapping.flush()
    assert segment.read_bytes()[8202:8209] == b"records"
    region.deregister()
    mapping.close()


def test_blocking_poll_waits_and_wakes(pair: Pair) -> None:
    started = time.monotonic()
    assert pair.owner_cq.poll(4, timeout=0.2) == []
    assert time.monotonic() - started >= 0.19
    pair.owner_qp.post_recv(1)

    def later() -> None:
        time.sleep(0.2)
        pair.qp.post_write_with_imm(1, pair.local.sge(0, 1), pair.target.addr, pair.target.rkey, 3)

    thread = threading.Thread(target=later)
    thread.start()
    found = pair.owner_cq.poll(4, timeout=None)
    thread.join()
    assert [(c.wr_id, c.imm_data) for c in found] == [(1, 3)]


@contextmanager
def serving_peer(provider: str) -> Iterator[tuple[subprocess.Popen[str], dict[str, object]]]:
    peer = run_peer("serve", provider, 1 << 20)
    try:
        assert peer.stdout is not None
        yield peer, json.loads(peer.stdout.readline())
    finally:
        peer.kill()
        peer.wait()


def test_survivor_fails_cleanly_when_the_target_process_dies(provider: str) -> None:
    with serving_peer(provider) as (peer, served), open_context(provider) as ctx:
        pd = ctx.alloc_pd()
        cq = ctx.create_cq()
        qp = pd.connect(str(served["info"]), cq)
        local = pd.allocate(4096, Access.LOCAL_WRITE)
        addr, rkey = int(str(served["addr"])), int(str(served["rkey"]))
        for wr_id in range(20):
            qp.post_write(wr_id, local.sge(0, 512), addr, rkey)
            assert one(cq).ok
        os.kill(peer.pid, signal.SIGKILL)
        peer.wait()
        deadline = time.monotonic() + 10
        statuses = []
        while time.monotonic() < deadline:
            qp.post_write(99, local.sge(0, 512), addr, rkey)
            statuses.append(one(cq).status)
            if statuses[-1] is not WcStatus.SUCCESS:
                break
            time.sleep(0.01)
        assert statuses[-1] in (WcStatus.RETRY_EXC_ERR, WcStatus.WR_FLUSH_ERR)
        assert qp.state is QpState.ERROR


def test_target_flushes_receives_when_the_writer_dies(provider: str) -> None:
    with open_context(provider) as ctx:
        pd = ctx.alloc_pd()
        cq = ctx.create_cq()
        region = pd.allocate(4096, ALL_RIGHTS)
        listener = pd.listen(cq)
        info = listener.conn_info.encode()
        writer = run_peer("write-loop", provider, info, region.addr, region.rkey, "imm")
        try:
            qp = listener.accept(timeout=20)
            for wr_id in range(16):
                qp.post_recv(wr_id)
            assert writer.stdout is not None
            received = 0
            while received < 50:
                completion = one(cq)
                assert completion.ok, (received, completion)
                received += 1
                qp.post_recv(100 + received)
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait()
            statuses: set[WcStatus] = set()
            while qp.state is QpState.RTS or not statuses & {WcStatus.WR_FLUSH_ERR}:
                completion = one(cq)
                statuses.add(completion.status)
            assert qp.state is QpState.ERROR
            assert struct.unpack_from("=Q", region.buf, 0)[0] >= 50
        finally:
            writer.kill()
            writer.wait()


def test_deregistration_revokes_a_writer_in_another_process(provider: str) -> None:
    with open_context(provider) as ctx:
        pd = ctx.alloc_pd()
        cq = ctx.create_cq()
        region = pd.allocate(4096, ALL_RIGHTS)
        keep = memoryview(region.buf)  # outlives deregistration: we watch the pages
        listener = pd.listen(cq)
        info = listener.conn_info.encode()
        writer = run_peer("write-loop", provider, info, region.addr, region.rkey, "plain")
        try:
            listener.accept(timeout=20)
            assert writer.stdout is not None
            assert writer.stdout.readline().strip() == "ready"
            region.deregister()
            after = bytes(keep[:8])
            assert writer.stdout.readline().strip() == "REM_ACCESS_ERR"
            assert bytes(keep[:8]) == after
        finally:
            writer.kill()
            writer.wait()
            keep.release()


def test_a_killed_process_leaves_no_directory_behind(tmp_path: Path) -> None:
    peer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from directlog.rdma import open_context; "
            f"ctx = open_context('shm', region_dir={str(tmp_path)!r}); "
            "print(ctx.directory, flush=True); time.sleep(60)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert peer.stdout is not None
    left = Path(peer.stdout.readline().strip())
    peer.kill()
    peer.wait()
    assert left.exists()
    with open_context("shm", region_dir=tmp_path):
        assert not left.exists()


def test_conn_info_round_trip_and_bounds() -> None:
    info = ConnInfo(("shm", "tcp"), "10.0.0.5", 7000, "/dev/shm/x/listen.sock", "boot")
    assert ConnInfo.decode(info.encode()) == info
    assert ConnInfo.decode(info.encode().encode()) == info
    for bad in ["", "[]", '{"providers": []}', '{"providers": ["tcp"], "port": 70000}', "x" * 5000]:
        with pytest.raises(ValueError):
            ConnInfo.decode(bad)


def test_auto_reaches_a_tcp_only_listener_over_tcp() -> None:
    with open_context("tcp") as owner, open_context("shm") as shm_only:
        pd = owner.alloc_pd()
        listener = pd.listen(owner.create_cq())
        assert listener.conn_info.providers == ("tcp",)
        with pytest.raises(Exception, match="no common transport"):
            shm_only.alloc_pd().connect(listener.conn_info, shm_only.create_cq(), timeout=1)
    auto_pair = make_pair("auto")
    try:
        assert auto_pair.qp.provider == "shm"  # same host
    finally:
        auto_pair.user.close()
        auto_pair.owner.close()


def test_connecting_and_waiting_work_with_descriptors_above_1023(provider: str) -> None:
    """A broker holding many segment files and connections hands the providers descriptors
    past select()'s limit of 1023: accepting and waiting for completions must not care."""
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        made = make_pair(provider)
        try:
            assert made.user_cq.poll(1, timeout=0.05) == []  # a wait that times out
            made.target.buf[:5] = b"hello"
            made.qp.post_read(9, made.local.sge(0, 5), made.target.addr, made.target.rkey)
            read = one(made.user_cq)  # a wait that a completion ends
            assert (read.wr_id, read.status) == (9, WcStatus.SUCCESS)
            assert bytes(made.local.buf[:5]) == b"hello"
        finally:
            made.user.close()
            made.owner.close()
    finally:
        for fd in fillers:
            os.close(fd)
