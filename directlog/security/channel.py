"""A connection's byte stream, plain or TLS, behind one small async interface.

The Kafka server and Directlog's own Kafka connections (replica fetchers) read and write
through a `Channel`, so a PLAINTEXT listener keeps its zero-copy path (`recv_into` a
preallocated buffer, `os.sendfile` from segment files) and an SSL one adds only what TLS
needs: `ssl.SSLObject` over memory BIOs, driven by the event loop's socket calls. Record
data sent over TLS is read from the segment file in bounded chunks and encrypted; nothing
else changes above this layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl

from cryptography import x509

_SEND_CHUNK = 256 * 1024  # plaintext bytes encrypted per write: bounds the output buffer
_EDGE_CHUNK = 32 * 1024  # a file region's first and last writes: the peer waits for these
_RECEIVE = 256 * 1024  # ciphertext bytes received per socket read


class TlsHandshakeError(ConnectionError):
    """The peer did not complete a TLS handshake: not TLS, or a certificate refused."""


class Channel:
    """A plain TCP connection (non-blocking socket)."""

    tls = False

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._loop = asyncio.get_running_loop()

    async def recv_into(self, buffer: memoryview) -> int:
        """Bytes received into `buffer`; 0 once the peer closed."""
        return await self._loop.sock_recv_into(self.sock, buffer)

    async def sendall(self, data: bytes | bytearray | memoryview) -> None:
        await self._loop.sock_sendall(self.sock, data)

    async def sendfile(self, fd: int, offset: int, count: int) -> None:
        """`count` bytes of file `fd` from `offset`, straight from the page cache."""
        while count:
            try:
                sent = os.sendfile(self.sock.fileno(), fd, offset, count)
            except BlockingIOError:
                await self._writable()
                continue
            if sent == 0:
                raise ConnectionError("the file ended before the bytes to send did")
            offset += sent
            count -= sent

    async def _writable(self) -> None:
        writable = self._loop.create_future()
        self._loop.add_writer(self.sock, writable.set_result, None)
        try:
            await writable
        finally:
            self._loop.remove_writer(self.sock)

    def peer_subject(self) -> str | None:
        """The subject of the peer's certificate (RFC 4514), or None without one."""
        return None

    def close(self) -> None:
        self.sock.close()


class TlsChannel(Channel):
    """TLS over a plain connection; call `handshake` before anything else."""

    tls = True

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
    ) -> None:
        super().__init__(sock)
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )
        self._raw = bytearray(_RECEIVE)
        self._plain: memoryview | None = None  # file bytes read for sendfile, made once

    async def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    raise TlsHandshakeError("the peer closed during the TLS handshake") from None
            except ssl.SSLError as error:
                await self._flush_quietly()  # the alert tells the peer why
                raise TlsHandshakeError(f"TLS handshake failed: {error.reason or error}") from error
        await self._flush()

    async def recv_into(self, buffer: memoryview) -> int:
        """As much as is already received fits, decrypted record after record: one TLS
        record is at most 16 KiB, and a caller's turn per record costs more than its
        decryption."""
        size, filled = len(buffer), 0
        while filled < size:
            try:
                read: int = self._tls.read(size - filled, buffer[filled:])  # type: ignore[assignment]
            except ssl.SSLWantReadError:
                if filled:
                    break
                if self._outgoing.pending:  # TLS 1.3 answers a key update while reading
                    await self._flush()
                if not await self._fill():
                    return 0
                continue
            except ssl.SSLZeroReturnError:
                break
            except ssl.SSLError as error:
                raise ConnectionError(f"TLS: {error.reason or error}") from error
            if not read:
                break
            filled += read
        return filled

    async def sendall(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), _SEND_CHUNK):
            self._tls.write(view[start : start + _SEND_CHUNK])
            await self._flush()

    async def sendfile(self, fd: int, offset: int, count: int) -> None:
        """The file's bytes read in bounded chunks and encrypted: TLS cannot use sendfile.
        The chunks grow from a small first one and shrink to a small last one: a consumer
        waits for a whole fetch answer, and decrypts each chunk while the next is
        encrypted, so only the first and the last are waited for. One buffer serves every
        call (a connection sends one answer at a time)."""
        if self._plain is None:
            self._plain = memoryview(bytearray(_SEND_CHUNK))
        buffer, step = self._plain, _EDGE_CHUNK
        while count:
            size = min(step, max(count // 2, _EDGE_CHUNK), count)
            read = os.preadv(fd, [buffer[:size]], offset)
            if read == 0:
                raise ConnectionError("the file ended before the bytes to send did")
            self._tls.write(buffer[:read])
            await self._flush()
            offset += read
            count -= read
            step = min(2 * step, _SEND_CHUNK)

    def peer_subject(self) -> str | None:
        der = self._tls.getpeercert(binary_form=True)
        if not der:
            return None
        return x509.load_der_x509_certificate(der).subject.rfc4514_string()

    async def _flush(self) -> None:
        pending = self._outgoing.read()
        if pending:
            await self._loop.sock_sendall(self.sock, pending)

    async def _flush_quietly(self) -> None:
        with contextlib.suppress(OSError):
            await self._flush()

    async def _fill(self) -> bool:
        received = await self._loop.sock_recv_into(self.sock, self._raw)
        if not received:
            self._incoming.write_eof()
            return False
        self._incoming.write(memoryview(self._raw)[:received])
        return True
