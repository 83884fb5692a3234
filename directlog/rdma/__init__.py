"""Directlog's verbs layer: one small API over pyverbs (RNICs, Soft-RoCE), shm (same host)
and tcp (across hosts). See verbs.py for the API and docs/rdma.md for the providers.

    with open_context("auto") as ctx:
        pd = ctx.alloc_pd()
        ...
"""

from __future__ import annotations

from pathlib import Path

from directlog.rdma.pyverbs_provider import device_names
from directlog.rdma.verbs import (
    Access,
    CompletionQueue,
    ConnectError,
    ConnInfo,
    Context,
    Doorbell,
    InvalidWorkRequestError,
    Listener,
    MemoryRegion,
    Opcode,
    ProtectionDomain,
    ProviderUnavailableError,
    QpCaps,
    QpState,
    QueueFullError,
    QueuePair,
    RdmaError,
    RegistrationError,
    Sge,
    WcStatus,
    WorkCompletion,
)

PROVIDERS = ("auto", "shm", "tcp", "pyverbs")

__all__ = [
    "PROVIDERS",
    "Access",
    "CompletionQueue",
    "ConnInfo",
    "ConnectError",
    "Context",
    "Doorbell",
    "InvalidWorkRequestError",
    "Listener",
    "MemoryRegion",
    "Opcode",
    "ProtectionDomain",
    "ProviderUnavailableError",
    "QpCaps",
    "QpState",
    "QueueFullError",
    "QueuePair",
    "RdmaError",
    "RegistrationError",
    "Sge",
    "WcStatus",
    "WorkCompletion",
    "open_context",
    "resolve_provider",
]


def resolve_provider(provider: str) -> str:
    """What ``provider`` opens here: "pyverbs" for auto when an RDMA device exists, else
    "shm+tcp" (shm to peers on this host, tcp to the others)."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown rdma provider {provider!r}: one of {PROVIDERS}")
    if provider == "auto":
        return "pyverbs" if device_names() else "shm+tcp"
    return provider


def open_context(
    provider: str = "auto",
    *,
    region_dir: str | Path | None = None,
    max_regions: int = 1024,
    device: str | None = None,
    port: int = 1,
    gid_index: int = 0,
) -> Context:
    """Open a provider by its config string (auto | shm | tcp | pyverbs).

    ``region_dir`` and ``max_regions`` apply to shm and tcp (where their files live, how
    many regions the table holds); ``device``, ``port`` and ``gid_index`` to pyverbs.
    """
    resolved = resolve_provider(provider)
    if resolved == "pyverbs":
        from directlog.rdma.pyverbs_provider import PyverbsContext

        return PyverbsContext(device, port=port, gid_index=gid_index)
    from directlog.rdma.soft import SoftContext

    transports = tuple(resolved.split("+"))
    return SoftContext(transports, region_dir=region_dir, max_regions=max_regions)
