"""The Store interface, the same tests on file:// and on a real S3 server (SeaweedFS, SigV4)."""

from __future__ import annotations

import hashlib
import os

import pytest

from g2rpo.artifacts.storage import MiB, ObjectNotFound, S3Settings, WriteConflict, locate, open_store
from g2rpo.errors import G2RPOError

pytestmark = pytest.mark.integration


def test_storage_put_get_list_exists_delete(root_uri, tmp_path):
    store = open_store(root_uri)
    store.put_bytes("a/x.txt", b"hello")
    store.put_bytes("a/b/y.bin", b"\x00\x01")
    store.put_bytes("z.txt", b"zz")
    assert store.get_bytes("a/x.txt")[0] == b"hello"
    assert store.exists("a/x.txt") and not store.exists("a/nope")
    assert [i.key for i in store.list()] == ["a/b/y.bin", "a/x.txt", "z.txt"]
    assert [(i.key, i.size) for i in store.list("a")] == [("a/b/y.bin", 2), ("a/x.txt", 5)]
    # "a" is a directory-like prefix: "ab..." keys are not under it.
    store.put_bytes("ab.txt", b"!")
    assert "ab.txt" not in [i.key for i in store.list("a")]
    store.delete("a/x.txt")
    store.delete("a/x.txt")  # deleting an absent key is not an error
    assert not store.exists("a/x.txt")
    with pytest.raises(ObjectNotFound, match="a/x.txt does not exist"):
        store.get_bytes("a/x.txt")
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3000))
    store.put_file("files/src.bin", src)
    store.get_file("files/src.bin", tmp_path / "out" / "copy.bin")
    assert (tmp_path / "out" / "copy.bin").read_bytes() == src.read_bytes()


def test_storage_conditional_writes(root_uri):
    store = open_store(root_uri)
    etag1 = store.put_bytes("state.json", b'{"r": 1}', if_none_match=True)
    with pytest.raises(WriteConflict, match="already exists"):
        store.put_bytes("state.json", b'{"r": 2}', if_none_match=True)
    assert store.get_bytes("state.json") == (b'{"r": 1}', etag1)
    etag2 = store.put_bytes("state.json", b'{"r": 2}', if_match=etag1)
    assert etag2 != etag1
    # The first etag is stale now: a writer that read revision 1 cannot overwrite revision 2.
    with pytest.raises(WriteConflict, match="changed since it was read"):
        store.put_bytes("state.json", b'{"r": 3, "lost": true}', if_match=etag1)
    assert store.get_bytes("state.json") == (b'{"r": 2}', etag2)


@pytest.mark.parametrize("checksums", ["when_supported", "when_required"])
def test_storage_multipart_upload_round_trip(s3_env, tmp_path, checksums):
    # 12 MiB + 1 byte with 5 MiB parts and a 5 MiB threshold: ceil(12.000001 / 5) = 3 parts.
    settings = S3Settings(multipart_threshold=5 * MiB, min_part_size=5 * MiB, max_concurrency=2, checksums=checksums)
    data = os.urandom(12 * MiB + 1)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    store, key = locate(f"{s3_env.uri}/big/big.bin", settings)
    store.put_file(key, src)
    info = store.head(key)
    assert info.size == len(data)
    # S3 etags of multipart objects are md5(concatenated part md5s) + "-<parts>".
    assert info.etag.strip('"').endswith("-3")
    store.get_file(key, tmp_path / "back.bin")
    assert hashlib.sha256((tmp_path / "back.bin").read_bytes()).digest() == hashlib.sha256(data).digest()


def test_storage_wrong_credentials_refused(s3_env, monkeypatch):
    good = open_store(s3_env.uri)
    good.put_bytes("secret.txt", b"s")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    bad = open_store(s3_env.uri)
    with pytest.raises(G2RPOError, match="refused by the server"):
        bad.get_bytes("secret.txt")
    with pytest.raises(G2RPOError, match="refused by the server"):
        bad.put_bytes("evil.txt", b"x")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unknown-key")
    with pytest.raises(G2RPOError, match="refused by the server"):
        open_store(s3_env.uri).list()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_env.server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_env.server.secret_key)
    assert [i.key for i in open_store(s3_env.uri).list()] == ["secret.txt"]


def test_storage_anonymous_request_refused(s3_env):
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    anon = boto3.client(
        "s3",
        endpoint_url=s3_env.server.endpoint_url,
        region_name="us-east-1",
        config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}),
    )
    with pytest.raises(ClientError) as err:
        anon.list_objects_v2(Bucket=s3_env.bucket)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_storage_missing_bucket_is_a_clear_error(s3_env):
    # (SeaweedFS creates a bucket on a first PUT by an Admin identity, so this reads.)
    with pytest.raises(G2RPOError, match="bucket does not exist"):
        open_store("s3://no-such-bucket-here").list()


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_storage_botocore_retries_make_exactly_max_attempts(max_attempts, monkeypatch):
    # Nothing listens on this loopback port: every attempt is refused at once, and botocore's own
    # retry handler (standard mode) decides to try again; g2rpo has no retry loop of its own.
    # (botocore's "max_attempts" key counts retries only: S3Settings.max_attempts maps to "total_max_attempts".)
    import socket

    from g2rpo.artifacts.storage import S3Store, make_s3_client

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    settings = S3Settings(
        endpoint_url=f"http://127.0.0.1:{port}", region="us-east-1", max_attempts=max_attempts, connect_timeout=1
    )
    client = make_s3_client(settings)
    sent = []
    client.meta.events.register("before-send.s3.GetObject", lambda request, **_: sent.append(request.url))
    try:
        with pytest.raises(G2RPOError, match="cannot reach the S3 endpoint after retries"):
            S3Store("bucket", "", settings).get_bytes("x")
    finally:
        client.meta.events.unregister("before-send.s3.GetObject")
    assert len(sent) == max_attempts
    assert sent[0] == f"http://127.0.0.1:{port}/bucket/x"  # path-style addressing


def test_storage_get_bytes_refuses_an_object_over_max_bytes_before_reading_it(root_uri):
    store = open_store(root_uri)
    store.put_bytes("big.json", b"x" * 5000)
    assert store.get_bytes("big.json", max_bytes=5000)[0] == b"x" * 5000
    with pytest.raises(G2RPOError, match=r"big\.json is 5,000 bytes, over the 4,999-byte limit .*check the URI"):
        store.get_bytes("big.json", max_bytes=4999)


def test_storage_a_fifo_in_a_file_store_is_named_not_opened(tmp_path):
    store = open_store(str(tmp_path / "store"))
    store.put_bytes("a/record.json", b"{}")
    os.mkfifo(tmp_path / "store" / "a" / "pipe.json")
    with pytest.raises(G2RPOError, match=r"pipe\.json is a FIFO \(named pipe\), not a stored object"):
        store.get_bytes("a/pipe.json")
