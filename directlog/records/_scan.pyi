from directlog.records.varint import Buffer

def scan_records(
    buffer: Buffer, pos: int, end: int, count: int, dense: bool, /
) -> tuple[int, int]: ...
