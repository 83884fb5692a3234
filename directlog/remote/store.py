"""The remote store: one code path over pyarrow.fs for ``file://``, ``s3://`` and ``hdfs://``.

Objects are addressed by keys, '/'-separated paths under the store's root URI
(``s3://bucket/prefix`` + ``/`` + key). Every call blocks; brokers and tiering services call
from worker threads. Failures come out as two errors: RemoteObjectMissingError for an
object that is not there, RemoteStorageError for everything else (unreachable, refused,
timed out, a short read): retriable by nature, never a hang, since connect and request
timeouts and a bounded number of retries are set on the file system.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from directlog.records.varint import Buffer

WRITE_CHUNK = 8 << 20  # bytes read from a local file per write to the store


class RemoteStorageError(Exception):
    """The store failed or could not be reached; trying again later may succeed."""


class RemoteObjectMissingError(RemoteStorageError):
    """No object under that key."""


class OutsideStoreError(ValueError):
    """A URI that does not name an object under this store's root."""


@dataclass(frozen=True, slots=True)
class StoreConfig:
    uri: str  # file:///abs/dir, s3://bucket/prefix, hdfs://host:port/path
    s3_endpoint: str | None = None  # http://host:port of an S3-compatible server
    s3_region: str | None = None
    s3_access_key: str | None = None  # None: the AWS SDK's own chain (env, files, IMDS)
    s3_secret_key: str | None = None
    timeout_s: float = 10.0  # connect and request timeouts
    attempts: int = 3  # tries of one S3 request before it fails


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int


class RemoteStore:
    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        parts = urlsplit(config.uri)
        self.scheme = parts.scheme
        if parts.query or parts.fragment:
            raise ValueError(f"remote store URI {config.uri!r}: no query or fragment allowed")
        path = parts.path.rstrip("/")
        if self.scheme == "file":
            if parts.netloc or not path.startswith("/"):
                raise ValueError(f"remote store URI {config.uri!r}: file:///absolute/path")
            self.fs: pafs.FileSystem = pafs.LocalFileSystem()
            self._root = path
        elif self.scheme == "s3":
            if not parts.netloc:
                raise ValueError(f"remote store URI {config.uri!r}: s3://bucket[/prefix]")
            self.fs = _s3(config)
            self._root = parts.netloc + path
        elif self.scheme == "hdfs":
            if not parts.hostname:
                raise ValueError(f"remote store URI {config.uri!r}: hdfs://host:port/path")
            self.fs = pafs.HadoopFileSystem(parts.hostname, parts.port or 8020)
            self._root = path
        else:
            raise ValueError(f"remote store URI {config.uri!r}: file://, s3:// or hdfs:// only")
        self.root_uri = f"{self.scheme}://{parts.netloc}{path}"

    # Names -------------------------------------------------------------------------------

    def uri_of(self, key: str) -> str:
        return f"{self.root_uri}/{_checked_key(key)}"

    def key_of(self, uri: str) -> str:
        """The key of an object URI; OutsideStoreError unless it lies under the root."""
        prefix = self.root_uri + "/"
        if not uri.startswith(prefix):
            raise OutsideStoreError(f"{uri!r} is not under the remote store {self.root_uri}")
        try:
            return _checked_key(uri[len(prefix) :])
        except ValueError as exc:
            raise OutsideStoreError(str(exc)) from exc

    def _path(self, key: str) -> str:
        return f"{self._root}/{_checked_key(key)}"

    # Objects -----------------------------------------------------------------------------

    def write(self, key: str, chunks: Iterable[Buffer]) -> int:
        """Write an object from `chunks` (replacing any under that key); returns its size.
        On S3 the object appears whole when this returns; on a file system a crash can
        leave a partial one, which the copy protocol (docs/tiering.md) never lets a reader
        reach."""
        path = self._path(key)
        written = 0
        with _translated(key):
            if self.scheme != "s3":
                self.fs.create_dir(posixpath.dirname(path), recursive=True)
            with self.fs.open_output_stream(path) as out:
                for chunk in chunks:
                    out.write(chunk)
                    written += memoryview(chunk).nbytes
        return written

    def write_file(self, key: str, fd: int, size: int) -> int:
        """Write the first `size` bytes of the open file `fd` as an object."""

        def chunks() -> Iterable[bytes]:
            position = 0
            while position < size:
                chunk = os.pread(fd, min(WRITE_CHUNK, size - position), position)
                if not chunk:
                    raise RemoteStorageError(f"{key}: the local file ended at {position}")
                position += len(chunk)
                yield chunk

        return self.write(key, chunks())

    def read(self, key: str, position: int, length: int) -> memoryview:
        """`length` bytes at `position`, as a view of pyarrow's buffer (no copy); an object
        too short for them is an error."""
        with _translated(key), self.fs.open_input_file(self._path(key)) as source:
            source.seek(position)
            data = memoryview(source.read_buffer(length))
        if data.nbytes != length:
            raise RemoteStorageError(
                f"{key}: {data.nbytes} bytes at {position}, expected {length} (truncated object)"
            )
        return data.cast("B")

    def read_all(self, key: str) -> bytes:
        with _translated(key), self.fs.open_input_stream(self._path(key)) as source:
            return bytes(source.readall())

    def size(self, key: str) -> int:
        with _translated(key):
            info = self.fs.get_file_info(self._path(key))
        if info.type != pafs.FileType.File:
            raise RemoteObjectMissingError(f"no object {key}")
        return int(info.size)

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under `prefix` (a key path; "": the whole store), with its size,
        sorted by key."""
        path = self._path(prefix) if prefix else self._root
        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        with _translated(prefix):
            infos = self.fs.get_file_info(selector)
        start = len(self._root) + 1
        return sorted(
            (ObjectInfo(info.path[start:], int(info.size)) for info in infos if info.is_file),
            key=lambda found: found.key,
        )

    def delete(self, keys: Iterable[str]) -> None:
        """Delete objects; one already gone is no error."""
        for key in keys:
            try:
                with _translated(key):
                    self.fs.delete_file(self._path(key))
            except RemoteObjectMissingError:
                pass

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under `prefix`, and the prefix's directory where one exists."""
        path = self._path(prefix)
        with _translated(prefix):
            info = self.fs.get_file_info(path)
            if info.type == pafs.FileType.Directory:
                self.fs.delete_dir(path)
        for leftover in self.list(prefix):  # S3 lists what a directory delete may not cover
            self.delete([leftover.key])


def _s3(config: StoreConfig) -> pafs.S3FileSystem:
    scheme, endpoint = None, None
    if config.s3_endpoint:
        parts = urlsplit(config.s3_endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"S3 endpoint {config.s3_endpoint!r}: http(s)://host:port")
        scheme, endpoint = parts.scheme, parts.netloc
    return pafs.S3FileSystem(
        access_key=config.s3_access_key,
        secret_key=config.s3_secret_key,
        region=config.s3_region,
        scheme=scheme,
        endpoint_override=endpoint,
        connect_timeout=config.timeout_s,
        request_timeout=config.timeout_s,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=config.attempts),
    )


def _checked_key(key: str) -> str:
    parts = key.split("/")
    if not key or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"bad object key {key!r}")
    return key


@contextmanager
def _translated(key: str) -> Iterator[None]:
    """pyarrow's errors as the store's: missing objects apart, everything else retriable."""
    try:
        yield
    except FileNotFoundError as error:
        raise RemoteObjectMissingError(f"no object {key}") from error
    except RemoteStorageError:
        raise
    except OSError as error:
        raise RemoteStorageError(f"{key}: {error}") from error
