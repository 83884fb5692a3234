"""Typed errors for jute bytes and znode paths.

Each class carries the ZooKeeper error code a server answers with when it answers at all
(a frame that cannot be split is a reason to close the connection instead). Messages name
the field and what was found, because the caller logs them once and moves on.
"""

from typing import ClassVar

from services.consensus.codes import ErrorCode


class JuteError(Exception):
    """Base for every problem with client-supplied protocol bytes or paths.

    `xid` is filled in once the request header has been read, so a server can address its
    error reply to the request that caused it.
    """

    error_code: ClassVar[ErrorCode] = ErrorCode.MARSHALLINGERROR

    def __init__(self, message: str, xid: int | None = None) -> None:
        super().__init__(message)
        self.xid = xid


class TruncatedError(JuteError):
    """A field, or a length it declares, runs past the end of its buffer."""


class LengthLimitError(JuteError):
    """A declared length or count exceeds max_buffer (jute.maxbuffer); refused before any
    allocation."""


class MalformedError(JuteError):
    """Bytes that are all there but cannot be a valid record: a negative length other than
    -1, invalid UTF-8, an unknown op inside a multi, bytes left over after a record."""


class UnknownOpcodeError(JuteError):
    """A request header names an opcode this codec does not decode."""

    error_code = ErrorCode.UNIMPLEMENTED

    def __init__(self, xid: int, opcode: int) -> None:
        super().__init__(f"request xid {xid} has unsupported opcode {opcode}", xid)
        self.opcode = opcode


class InvalidPathError(JuteError):
    """A znode path breaks ZooKeeper's PathUtils rules."""

    error_code = ErrorCode.BADARGUMENTS


class EncodeError(JuteError, ValueError):
    """A value handed to the encoder does not fit its jute type (an int beyond 32 bits)."""
