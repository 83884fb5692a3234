"""The pyverbs provider: it imports without pyverbs or a device, ``auto`` falls back to the
software providers here, and where pyverbs imports (Debian's python3-pyverbs) the work
requests and QP attributes it builds are real pyverbs objects with the right fields."""

from __future__ import annotations

import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from directlog.rdma import Opcode, ProviderUnavailableError, open_context, resolve_provider
from directlog.rdma.pyverbs_provider import (
    RNR_TIMER_MS,
    Endpoint,
    PyverbsContext,
    build_init_attr,
    build_rts_attr,
    build_send_wr,
    device_names,
    load_pyverbs,
    rnr_timer_code,
)

pytestmark = pytest.mark.timeout(30)


def test_importing_the_package_does_not_import_pyverbs() -> None:
    code = "import sys, directlog.rdma; print('pyverbs' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_auto_falls_back_to_the_software_providers_without_a_device() -> None:
    if device_names():
        pytest.skip("this machine has an RDMA device")
    assert resolve_provider("auto") == "shm+tcp"
    with open_context("auto") as ctx:
        assert ctx.provider == "shm+tcp"
    with pytest.raises(ProviderUnavailableError):
        open_context("pyverbs")
    with pytest.raises(ProviderUnavailableError):
        PyverbsContext("rxe0")


def test_unknown_provider_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown rdma provider"):
        open_context("infiniband")


def test_rnr_timer_code_covers_the_timeout() -> None:
    for seconds in (0.001, 0.2, 1.0, 3.0):
        code = rnr_timer_code(seconds)
        assert RNR_TIMER_MS[code] * 7 >= seconds * 1000 or code == 0
    assert rnr_timer_code(1000.0) == 0  # the longest encoding


@pytest.fixture
def pv() -> SimpleNamespace:
    loaded = load_pyverbs()
    if loaded is None:
        pytest.fail("pyverbs is not installed (make test installs Debian's python3-pyverbs)")
    return loaded


def test_send_work_requests_map_onto_pyverbs(pv: SimpleNamespace) -> None:
    e = pv.enums
    wr = build_send_wr(
        pv, nic_wr_id=7, opcode=Opcode.WRITE_WITH_IMM, sge=(0x1000, 64, 5),
        remote_addr=0x2000, rkey=9, imm=0x01020304,
    )  # fmt: skip
    assert (wr.wr_id, wr.opcode, wr.num_sge) == (7, e.IBV_WR_RDMA_WRITE_WITH_IMM, 1)
    assert wr.send_flags == e.IBV_SEND_SIGNALED
    assert wr.imm_data == socket.htonl(0x01020304)
    for opcode, expected in [
        (Opcode.WRITE, e.IBV_WR_RDMA_WRITE),
        (Opcode.READ, e.IBV_WR_RDMA_READ),
        (Opcode.FETCH_AND_ADD, e.IBV_WR_ATOMIC_FETCH_AND_ADD),
        (Opcode.COMPARE_AND_SWAP, e.IBV_WR_ATOMIC_CMP_AND_SWP),
    ]:
        built = build_send_wr(
            pv, nic_wr_id=1, opcode=opcode, sge=(0x1000, 8, 5), remote_addr=0x2000, rkey=9,
            compare_add=3, swap=4,
        )  # fmt: skip
        assert built.opcode == expected


def test_rts_attributes_map_onto_pyverbs(pv: SimpleNamespace) -> None:
    remote = Endpoint(qp_num=17, psn=1234, gid="fe80:0000:0000:0000:0000:0000:0000:0001", lid=3)
    attr = build_rts_attr(
        pv, port=1, gid_index=0, mtu=pv.enums.IBV_MTU_1024, local_psn=99, remote=remote,
        rnr_timeout=1.0, max_rd_atomic=4,
    )  # fmt: skip
    assert (attr.dest_qp_num, attr.rq_psn, attr.sq_psn) == (17, 1234, 99)
    assert attr.qp_access_flags == 15
    assert (attr.max_rd_atomic, attr.max_dest_rd_atomic) == (4, 4)
    assert attr.min_rnr_timer == rnr_timer_code(1.0)
    assert build_init_attr(pv, 1).qp_access_flags == 15


def test_endpoint_exchange_round_trips() -> None:
    endpoint = Endpoint(qp_num=17, psn=1234, gid="fe80::1", lid=3)
    left, right = socket.socketpair()
    with left, right:
        left.sendall(endpoint.encode())
        assert Endpoint.receive(right) == endpoint
