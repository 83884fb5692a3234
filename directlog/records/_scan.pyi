from typing import Any

from directlog.records.varint import Buffer

def scan_records(
    buffer: Buffer, pos: int, end: int, count: int, dense: bool, /
) -> tuple[int, int]: ...
def check_batch(
    buffer: Buffer, pos: int, end: int, dense: bool, /
) -> tuple[int, int, int, int, int, int, int, int, int, int] | None: ...
def decode_area(
    buffer: Buffer,
    pos: int,
    end: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    fixed_timestamp: int | None,
    record_type: Any,
    header_type: Any,
    /,
) -> list[Any] | None: ...
def legacy_area(
    buffer: Buffer,
    pos: int,
    end: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    fixed_timestamp: int | None,
    magic: int,
    attributes: int,
    relative: bool,
    /,
) -> tuple[bytes, int, int] | None: ...
def legacy_size(buffer: Buffer, pos: int, end: int, count: int, magic: int, /) -> int | None: ...
def record_columns(
    records: Buffer,
    lower: int,
    upper: int,
    headers: bool,
    inflated: dict[int, Buffer],
    /,
) -> tuple[int, tuple[Any, ...] | None] | list[int] | None: ...
