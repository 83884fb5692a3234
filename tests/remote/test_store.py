"""The remote store over pyarrow.fs, against a local directory and a real S3 HTTP server."""

import os

import pytest

from directlog.remote.store import (
    OutsideStoreError,
    RemoteObjectMissingError,
    RemoteStorageError,
    RemoteStore,
    StoreConfig,
)


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path, s3):
    if request.param == "file":
        return RemoteStore(StoreConfig(f"file://{tmp_path}/remote"))
    prefix = request.node.name.replace("[", "-").replace("]", "")
    return RemoteStore(StoreConfig(f"s3://{s3.bucket}/{prefix}", **s3.settings, timeout_s=2))


def test_objects_are_written_read_listed_and_deleted(store, tmp_path):
    assert store.write("t-x/0/segments/a.log", [b"hello ", memoryview(b"world")]) == 11
    local = tmp_path / "local.bin"
    local.write_bytes(bytes(range(256)) * 100)
    fd = os.open(local, os.O_RDONLY)
    try:
        assert store.write_file("t-x/0/segments/b.log", fd, 20_000) == 20_000
    finally:
        os.close(fd)
    assert store.read("t-x/0/segments/a.log", 6, 5) == b"world"
    assert store.read_all("t-x/0/segments/a.log") == b"hello world"
    assert store.read("t-x/0/segments/b.log", 256, 256) == bytes(range(256))
    assert store.size("t-x/0/segments/b.log") == 20_000
    assert [(o.key, o.size) for o in store.list("t-x")] == [
        ("t-x/0/segments/a.log", 11),
        ("t-x/0/segments/b.log", 20_000),
    ]
    assert [o.key for o in store.list("")] == [o.key for o in store.list("t-x")]
    store.delete(["t-x/0/segments/a.log", "t-x/0/segments/never.log"])
    assert [o.key for o in store.list("t-x")] == ["t-x/0/segments/b.log"]
    store.delete_prefix("t-x")
    assert store.list("t-x") == [] and store.list("nothing/here") == []
    store.delete_prefix("t-x")  # again: nothing left is no error


def test_missing_and_short_objects_are_errors(store):
    store.write("k/one", [b"12345"])
    with pytest.raises(RemoteObjectMissingError):
        store.read("k/two", 0, 1)
    with pytest.raises(RemoteObjectMissingError):
        store.size("k/two")
    with pytest.raises(RemoteStorageError, match="truncated"):
        store.read("k/one", 2, 10)


def test_uris_name_objects_under_the_root_only(store):
    uri = store.uri_of("a/b.log")
    assert uri == store.root_uri + "/a/b.log" and store.key_of(uri) == "a/b.log"
    for outside in (
        "s3://elsewhere/a/b.log",
        store.root_uri + "x/a.log",
        store.root_uri + "/../other/a.log",
        store.root_uri + "/a//b",
        "file:///etc/passwd",
    ):
        with pytest.raises(OutsideStoreError):
            store.key_of(outside)


@pytest.mark.parametrize(
    "uri",
    [
        "ftp://host/x",
        "file://host/x",
        "file:relative/x",
        "s3:///no-bucket",
        "s3://b/p?x=1",
        "hdfs:///no-host",
    ],
)
def test_bad_store_uris_are_refused(uri):
    with pytest.raises(ValueError):
        RemoteStore(StoreConfig(uri))


def test_an_unreachable_server_is_an_error_not_a_hang(s3):
    store = RemoteStore(
        StoreConfig(f"s3://{s3.bucket}/outage", **s3.settings, timeout_s=1, attempts=1)
    )
    store.write("k", [b"data"])
    with s3.outage():
        with pytest.raises(RemoteStorageError):
            store.read("k", 0, 4)
        with pytest.raises(RemoteStorageError):
            store.write("k2", [b"data"])
    assert store.read("k", 0, 4) == b"data"
