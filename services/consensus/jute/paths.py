"""Znode path rules of ZooKeeper's PathUtils.validatePath.

Java checks UTF-16 code units; a code point above U+FFFF is a surrogate pair there, which
its \\ud800-\\uf8ff range rejects, so it is rejected here too.
"""

from services.consensus.jute.errors import InvalidPathError


def _forbidden(code: int) -> bool:
    return (
        0x01 <= code <= 0x1F or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xF8FF or code >= 0xFFF0
    )


def validate_path(path: str, sequential: bool = False) -> None:
    """Raise InvalidPathError (BADARGUMENTS) unless `path` is a valid znode path. A
    sequential create validates path + "1", since the server appends a counter."""
    if sequential:
        path += "1"
    if not path:
        raise InvalidPathError("path must not be empty")
    if path[0] != "/":
        raise InvalidPathError(f"path {path!r} must start with /")
    if len(path) == 1:
        return
    if path[-1] == "/":
        raise InvalidPathError(f"path {path!r} must not end with /")
    for index, segment in enumerate(path[1:].split("/")):
        if not segment:
            raise InvalidPathError(f"path {path!r} has an empty node name (segment {index})")
        if segment in (".", ".."):
            raise InvalidPathError(f"path {path!r} is relative (segment {index})")
    for index, char in enumerate(path):
        if char == "\0":
            raise InvalidPathError(f"path {path!r} has a null character at {index}")
        if _forbidden(ord(char)):
            raise InvalidPathError(f"path {path!r} has invalid character U+{ord(char):04X}")
