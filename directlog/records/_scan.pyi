from directlog.records.varint import Buffer

def scan_records(
    buffer: Buffer, pos: int, end: int, count: int, dense: bool, /
) -> tuple[int, int]: ...
def check_batch(
    buffer: Buffer, pos: int, end: int, dense: bool, /
) -> tuple[int, int, int, int, int, int, int, int, int, int] | None: ...
