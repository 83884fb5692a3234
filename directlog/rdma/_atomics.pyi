import mmap

_Buffer = bytes | bytearray | memoryview | mmap.mmap

def fetch_add(buffer: _Buffer, offset: int, value: int, /) -> int: ...
def compare_exchange(buffer: _Buffer, offset: int, expected: int, desired: int, /) -> int: ...
def load(buffer: _Buffer, offset: int, /) -> int: ...
def store(buffer: _Buffer, offset: int, value: int, /) -> None: ...
def address(buffer: _Buffer, /) -> int: ...

COPIED: int
NOT_ADMITTED: int
RACED: int

def guarded_copy(
    table: _Buffer,
    entry: int,
    ctl: int,
    dst: _Buffer,
    dst_offset: int,
    src: _Buffer,
    src_offset: int,
    length: int,
    /,
) -> int: ...
