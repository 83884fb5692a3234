"""Durable small files, shared by every service that keeps state on disk.

``write_atomically`` writes a temporary file, fsyncs it, renames it over the target and
fsyncs the directory: a crash leaves either the old or the new file, never a mix, and the
directory fsync makes the rename itself durable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

TMP_SUFFIX = ".tmp"


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's fsync makes renames and creations durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + TMP_SUFFIX)
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    fsync_path(path.parent)


def remove_temporaries(directory: Path, owned: Callable[[str], bool] = lambda name: True) -> None:
    """Delete leftovers of writes a crash interrupted before their rename: those whose
    target name `owned` says the caller writes. Two processes share a partition directory
    (the broker and its tiering sidecar); one must not delete a file the other is writing
    right now."""
    for leftover in directory.glob("*" + TMP_SUFFIX):
        if owned(leftover.name.removesuffix(TMP_SUFFIX)):
            leftover.unlink(missing_ok=True)
