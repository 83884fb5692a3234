"""The TLS channel (directlog/security/channel.py) between two ends of a socket pair."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from directlog.security.certs import CertificateAuthority
from directlog.security.channel import Channel, TlsChannel, TlsHandshakeError
from directlog.security.tls import TlsFiles, client_context, server_context

RECORD = 16 * 1024  # the most plaintext one TLS record carries


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[TlsFiles, TlsFiles]:
    """The server's and a client's files: certificates of one throwaway CA."""
    directory = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority.create("channel-test-ca")
    ca.write(directory / "ca.pem")
    ca.issue("server", hosts=["localhost"]).write(directory / "s.pem", directory / "s.key")
    ca.issue("alice", organization="tenants").write(directory / "c.pem", directory / "c.key")
    return (
        TlsFiles(
            cert_file=directory / "s.pem",
            key_file=directory / "s.key",
            ca_file=directory / "ca.pem",
        ),
        TlsFiles(
            cert_file=directory / "c.pem",
            key_file=directory / "c.key",
            ca_file=directory / "ca.pem",
        ),
    )


def run(test: Callable[[socket.socket, socket.socket], Awaitable[None]]) -> None:
    async def bounded() -> None:
        left, right = socket.socketpair()
        left.setblocking(False)
        right.setblocking(False)
        try:
            await asyncio.wait_for(test(left, right), 30)
        finally:
            left.close()
            right.close()

    asyncio.run(bounded())


async def connected(
    pki: tuple[TlsFiles, TlsFiles], left: socket.socket, right: socket.socket
) -> tuple[TlsChannel, TlsChannel]:
    server_files, client_files = pki
    server = TlsChannel(left, server_context(server_files, "required"), server_side=True)
    client = TlsChannel(
        right, client_context(client_files), server_side=False, server_hostname="localhost"
    )
    await asyncio.gather(server.handshake(), client.handshake())
    return server, client


async def received(channel: Channel, count: int) -> bytes:
    buffer = bytearray(count)
    filled = 0
    while filled < count:
        got = await channel.recv_into(memoryview(buffer)[filled:])
        assert got, f"the peer closed after {filled} of {count} bytes"
        filled += got
    return bytes(buffer)


def test_both_ways_with_the_client_certificate_as_the_peer(
    pki: tuple[TlsFiles, TlsFiles],
) -> None:
    async def test(left: socket.socket, right: socket.socket) -> None:
        server, client = await connected(pki, left, right)
        assert server.peer_subject() == "CN=alice,O=tenants"
        request, answer = os.urandom(100_000), os.urandom(300_000)
        await client.sendall(request)
        assert await received(server, len(request)) == request
        sending = asyncio.ensure_future(server.sendall(answer))  # more than a socket buffer
        assert await received(client, len(answer)) == answer
        await sending

    run(test)


def test_one_receive_takes_every_record_already_here(pki: tuple[TlsFiles, TlsFiles]) -> None:
    async def test(left: socket.socket, right: socket.socket) -> None:
        server, client = await connected(pki, left, right)
        sent = os.urandom(3 * RECORD)
        for start in range(0, len(sent), RECORD):  # a record each
            await client.sendall(sent[start : start + RECORD])
        buffer = bytearray(4 * RECORD)
        assert await server.recv_into(memoryview(buffer)) == len(sent)  # not a record a call
        assert bytes(buffer[: len(sent)]) == sent
        right.shutdown(socket.SHUT_WR)
        assert await server.recv_into(memoryview(buffer)) == 0

    run(test)


def test_a_file_region_sent_encrypted(pki: tuple[TlsFiles, TlsFiles], tmp_path: Path) -> None:
    content = os.urandom(700_000)
    path = tmp_path / "segment"
    path.write_bytes(content)

    async def test(left: socket.socket, right: socket.socket) -> None:
        server, client = await connected(pki, left, right)
        with path.open("rb") as file:
            sending = asyncio.ensure_future(server.sendfile(file.fileno(), 1234, 600_000))
            assert await received(client, 600_000) == content[1234:601_234]
            await sending

    run(test)


@pytest.mark.parametrize("count", [1, 32 * 1024 - 1, 32 * 1024, 32 * 1024 + 1, 1 << 20, 1_300_007])
def test_file_regions_of_every_size_arrive_whole(
    pki: tuple[TlsFiles, TlsFiles], tmp_path: Path, count: int
) -> None:
    """sendfile's chunks grow, then shrink towards the region's end: every size, first and
    last chunks included, arrives whole and in order, and the next answer follows it."""
    content = os.urandom(count + 10)
    path = tmp_path / "segment"
    path.write_bytes(content)

    async def test(left: socket.socket, right: socket.socket) -> None:
        server, client = await connected(pki, left, right)
        with path.open("rb") as file:

            async def answer() -> None:
                await server.sendfile(file.fileno(), 7, count)
                await server.sendall(b"next")

            sending = asyncio.ensure_future(answer())
            assert await received(client, count + 4) == content[7 : 7 + count] + b"next"
            await sending

    run(test)


def test_plaintext_to_a_tls_server_fails_the_handshake(pki: tuple[TlsFiles, TlsFiles]) -> None:
    async def test(left: socket.socket, right: socket.socket) -> None:
        server = TlsChannel(left, server_context(pki[0]), server_side=True)
        right.send(b"\x00\x00\x00\x15\x00\x12\x00\x03" + bytes(17))  # an ApiVersions request
        with pytest.raises(TlsHandshakeError):
            await server.handshake()

    run(test)


def test_an_untrusted_client_certificate_is_refused(
    pki: tuple[TlsFiles, TlsFiles], tmp_path: Path
) -> None:
    stranger = CertificateAuthority.create("another-ca")
    stranger.issue("mallory").write(tmp_path / "m.pem", tmp_path / "m.key")
    files = TlsFiles(
        cert_file=tmp_path / "m.pem", key_file=tmp_path / "m.key", ca_file=pki[0].ca_file
    )

    async def test(left: socket.socket, right: socket.socket) -> None:
        server = TlsChannel(left, server_context(pki[0], "required"), server_side=True)
        client = TlsChannel(
            right, client_context(files), server_side=False, server_hostname="localhost"
        )
        outcomes = await asyncio.gather(
            server.handshake(), client.handshake(), return_exceptions=True
        )
        assert isinstance(outcomes[0], TlsHandshakeError)
        assert "certificate" in str(outcomes[0]).lower()
        # TLS 1.3: the client learns of the refusal only when it next reads
        if outcomes[1] is None:
            with pytest.raises((ConnectionError, ssl.SSLError)):
                await received(client, 1)

    run(test)
