"""What a command prints: aligned tables for people (`--output table`) or one JSON
document for scripts (`--output json`). Notes (hints, dry-run warnings) follow the tables;
in JSON mode they go to stderr so stdout stays one parseable document."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2  # argparse's own code for bad command lines
EXIT_IN_PROGRESS = 3  # `reassign verify`: not done yet


@dataclass(slots=True)
class Table:
    columns: Sequence[str]
    rows: list[Sequence[object]]
    title: str | None = None


@dataclass(slots=True)
class Report:
    data: object
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    exit_code: int = EXIT_OK
    raw: str | None = None  # printed as is in both modes (a plan file's JSON)
    aside: list[str] = field(default_factory=list)  # always to stderr (beside a raw document)


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(str(v) for v in value) if value else "-"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) if value else "-"
    return str(value)


def format_table(table: Table) -> str:
    rows = [[cell(v) for v in row] for row in table.rows]
    widths = [len(c) for c in table.columns]
    for row in rows:
        widths = [max(w, len(v)) for w, v in zip(widths, row, strict=True)]
    lines = [table.title] if table.title else []
    for row in [list(table.columns), *rows]:
        lines.append("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def render(report: Report, mode: str, out: TextIO, err: TextIO) -> None:
    for line in report.aside:
        err.write(line + "\n")
    if mode == "json":
        if report.raw is not None:
            out.write(report.raw + "\n")
        else:
            out.write(json.dumps(report.data, indent=2, sort_keys=False) + "\n")
        for note in report.notes:
            err.write(note + "\n")
        return
    blocks = [format_table(t) for t in report.tables]
    if report.raw is not None:
        blocks.append(report.raw)
    if blocks:
        out.write("\n\n".join(blocks) + "\n")
    for note in report.notes:
        out.write(note + "\n")
