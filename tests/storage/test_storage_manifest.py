"""Manifests: atomic publish, verified downloads, the digest-keyed cache, GC of unpublished prefixes."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from datetime import UTC, datetime, timedelta

import pytest

from g2rpo.artifacts.cache import download_dir, fetch_to_cache
from g2rpo.artifacts.gc import gc
from g2rpo.artifacts.manifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    has_manifest,
    mismatches,
    read_manifest,
    verify,
    write_dir_manifest,
    write_manifest,
)
from g2rpo.artifacts.publish import publish_dir, unique_prefix
from g2rpo.artifacts.storage import FileStore, open_store, sha256_file
from g2rpo.errors import G2RPOError

pytestmark = pytest.mark.integration


def _artifact(tmp_path, name="ckpt"):
    src = tmp_path / name
    (src / "transformer").mkdir(parents=True)
    (src / "transformer" / "model.safetensors").write_bytes(os.urandom(2048))
    (src / "config.json").write_text('{"layers": 2}')
    return src


def test_storage_publish_writes_manifest_last_with_digests(root_uri, tmp_path):
    src = _artifact(tmp_path)
    uri = f"{root_uri}/{unique_prefix('ckpt')}"
    manifest = publish_dir(src, uri, producer="test-producer", config_hash="abc123", metadata={"step": 7})
    store = open_store(uri)
    assert sorted(i.key for i in store.list()) == ["config.json", MANIFEST_NAME, "transformer/model.safetensors"]
    raw = json.loads(store.get_bytes(MANIFEST_NAME)[0])
    assert raw["schema_version"] == 1 and raw["producer"] == "test-producer" and raw["config_hash"] == "abc123"
    assert raw["metadata"] == {"step": 7}
    expected = {
        "config.json": hashlib.sha256(b'{"layers": 2}').hexdigest(),
        "transformer/model.safetensors": hashlib.sha256(
            (src / "transformer" / "model.safetensors").read_bytes()
        ).hexdigest(),
    }
    assert {f["path"]: f["sha256"] for f in raw["files"]} == expected
    assert {f["path"]: f["size"] for f in raw["files"]} == {"config.json": 13, "transformer/model.safetensors": 2048}
    assert read_manifest(store) == manifest
    assert verify(store, deep=True) == manifest
    # Artifacts are immutable: a second publish to the same prefix is refused.
    with pytest.raises(G2RPOError, match="already published"):
        publish_dir(src, uri)
    with pytest.raises(G2RPOError, match="already published"):
        write_manifest(store, "", manifest.files, "x")


def test_storage_download_verifies_every_digest(root_uri, tmp_path):
    src = _artifact(tmp_path)
    uri = f"{root_uri}/art"
    publish_dir(src, uri)
    out = tmp_path / "out"
    download_dir(uri, out)
    assert (out / "transformer" / "model.safetensors").read_bytes() == (
        src / "transformer" / "model.safetensors"
    ).read_bytes()
    assert (out / MANIFEST_NAME).is_file()
    # Same size, different bytes: only the sha256 can tell.
    store = open_store(uri)
    store.put_bytes("config.json", b'{"layers": 9}')
    with pytest.raises(G2RPOError, match="changed after publishing"):
        download_dir(uri, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()
    with pytest.raises(G2RPOError, match="config.json: sha256"):
        verify(store, deep=True)
    verify(store)  # sizes alone still match: the shallow check cannot see it (by design)


def test_storage_artifact_without_manifest_is_absent(root_uri):
    store = open_store(f"{root_uri}/half")
    store.put_bytes("model.bin", b"partial")
    assert not has_manifest(store)
    with pytest.raises(G2RPOError, match="upload never finished"):
        read_manifest(store)
    with pytest.raises(G2RPOError, match="upload never finished"):
        fetch_to_cache(store.uri)


def test_storage_fetch_to_cache_downloads_once(s3_env, tmp_path):
    src = _artifact(tmp_path)
    uri = f"{s3_env.uri}/exports/m1"
    publish_dir(src, uri)
    cache = tmp_path / "cache"
    first = fetch_to_cache(uri, cache)
    digest = hashlib.sha256(open_store(uri).get_bytes(MANIFEST_NAME)[0]).hexdigest()
    assert first == cache / "artifacts" / digest
    assert (first / "config.json").read_text() == '{"layers": 2}'
    # Remove the remote data file: a second fetch must be served from the cache, not re-downloaded.
    open_store(uri).delete("transformer/model.safetensors")
    assert fetch_to_cache(uri, cache) == first
    assert (first / "transformer" / "model.safetensors").stat().st_size == 2048
    # A different artifact (different manifest) is a miss, and a corrupted one is refused and leaves no entry.
    uri2 = f"{s3_env.uri}/exports/m2"
    publish_dir(_artifact(tmp_path, "other"), uri2)
    open_store(uri2).put_bytes("config.json", b'{"layers": 3}')
    with pytest.raises(G2RPOError, match="changed after publishing"):
        fetch_to_cache(uri2, cache)
    assert sorted(p.name for p in (cache / "artifacts").iterdir()) == [digest]


def test_storage_fetch_to_cache_local_is_in_place(tmp_path):
    src = _artifact(tmp_path)
    uri = str(tmp_path / "store" / "m")
    publish_dir(src, uri)
    assert fetch_to_cache(uri, tmp_path / "cache") == (tmp_path / "store" / "m").absolute()
    assert not (tmp_path / "cache").exists()


def test_storage_gc_removes_only_old_unpublished_prefixes(root_uri, tmp_path):
    root = open_store(root_uri)
    publish_dir(_artifact(tmp_path, "a"), f"{root_uri}/done")
    # A crashed publish: marker and one file, no manifest.
    root.put_bytes(f"crashed/{MARKER_NAME}", b"{}")
    root.put_bytes("crashed/model.bin", b"x" * 100)
    # Another one, which a protected URI points into.
    root.put_bytes(f"guarded/{MARKER_NAME}", b"{}")
    root.put_bytes("guarded/model.bin", b"y" * 10)
    # A plain object that was never part of a publish.
    root.put_bytes("notes.txt", b"keep me")
    now = datetime.now(UTC)

    report = gc(root_uri, timedelta(hours=1), now=now)
    assert report.removed == [] and len(report.kept_recent) == 2  # too young
    later = now + timedelta(hours=2)
    report = gc(root_uri, timedelta(hours=1), now=later, dry_run=True, protected=[f"{root_uri}/guarded"])
    assert report.removed == [root.uri_for("crashed")] and report.bytes_freed == 102
    assert root.exists("crashed/model.bin")  # dry run
    report = gc(root_uri, timedelta(hours=1), now=later, protected=[f"{root_uri}/guarded"])
    assert report.kept_protected == [root.uri_for("guarded")]
    keys = [i.key for i in root.list()]
    assert not any(k.startswith("crashed/") for k in keys)
    assert "guarded/model.bin" in keys and "notes.txt" in keys
    assert f"done/{MANIFEST_NAME}" in keys and "done/config.json" in keys


def test_storage_publish_refuses_manifest_for_a_file_removed_meanwhile(root_uri, tmp_path, monkeypatch):
    # Another actor (here: a delete, as a GC with too short an --older-than would do) removes a file
    # that was already uploaded while the publish is still uploading the next one.
    src = _artifact(tmp_path)
    uri = f"{root_uri}/racing"
    store_cls = type(open_store(uri))
    real_put_file = store_cls.put_file

    def put_file_then_lose_config(self, key, path, *, callback=None):
        real_put_file(self, key, path, callback=callback)
        if key == "transformer/model.safetensors":  # the last file (sorted order)
            self.delete("config.json")

    monkeypatch.setattr(store_cls, "put_file", put_file_then_lose_config)
    with pytest.raises(G2RPOError, match=r"1 file\(s\) .* vanished or changed during the publish \(e.g. config.json\)"):
        publish_dir(src, uri)
    monkeypatch.setattr(store_cls, "put_file", real_put_file)
    assert not has_manifest(open_store(uri))
    publish_dir(src, uri)  # the same call succeeds once nobody interferes
    verify(open_store(uri), deep=True)


def test_storage_gc_spares_a_prefix_with_a_multipart_upload_in_flight(s3_env):
    # The marker is old, but a big file is still being uploaded in parts (invisible to listings).
    import time

    store = open_store(f"{s3_env.uri}/root")
    store.put_bytes(f"busy/{MARKER_NAME}", b"{}")
    marker_time = store.head(f"busy/{MARKER_NAME}").modified
    client = s3_env.server.client()
    # Server timestamps have 1 s resolution: wait until the upload starts ≥ 2 s after the marker.
    upload = None
    for _ in range(100):
        upload = client.create_multipart_upload(Bucket=s3_env.bucket, Key="root/busy/model.bin")
        initiated = store.incomplete_uploads()[-1][2]
        if (initiated - marker_time).total_seconds() >= 2:
            break
        client.abort_multipart_upload(Bucket=s3_env.bucket, Key="root/busy/model.bin", UploadId=upload["UploadId"])
        time.sleep(0.5)
    assert [k for k, _, _ in store.incomplete_uploads()] == ["busy/model.bin"]
    # 1 s after the upload started, with a 1.5 s cutoff: the marker (≥ 3 s old) alone would be collected.
    report = gc(store.uri, timedelta(seconds=1.5), now=initiated + timedelta(seconds=1))
    assert report.kept_recent == [store.uri_for("busy")] and report.removed == [] and report.uploads_aborted == []
    assert store.exists(f"busy/{MARKER_NAME}") and len(store.incomplete_uploads()) == 1
    # An hour later it is abandoned: the prefix goes and the upload's parts are aborted.
    report = gc(store.uri, timedelta(seconds=1.5), now=initiated + timedelta(hours=1))
    assert report.removed == [store.uri_for("busy")] and report.uploads_aborted == [store.uri_for("busy/model.bin")]
    assert store.list() == [] and store.incomplete_uploads() == []


def test_storage_second_publish_to_a_claimed_prefix_is_refused_up_front(root_uri, tmp_path, monkeypatch):
    # Publish A is paused inside its upload (the real store's put_file, held on an event); publish B
    # to the same prefix must be refused before it uploads anything, and A then publishes its own files.
    a, b = _artifact(tmp_path, "a"), _artifact(tmp_path, "b")
    uri = f"{root_uri}/shared"
    store_cls = type(open_store(uri))
    real_put_file = store_cls.put_file
    inside, release = threading.Event(), threading.Event()
    uploads: list[str] = []

    def put_file_paused(self, key, path, *, callback=None):
        uploads.append(str(path))
        inside.set()
        assert release.wait(30)
        return real_put_file(self, key, path, callback=callback)

    monkeypatch.setattr(store_cls, "put_file", put_file_paused)
    result: dict = {}
    first = threading.Thread(target=lambda: result.setdefault("a", publish_dir(a, uri)))
    first.start()
    assert inside.wait(30)
    uploads_before = list(uploads)
    try:
        with pytest.raises(G2RPOError, match=r"is being published by .*pid .*: two publishes to one prefix") as err:
            publish_dir(b, uri)
        assert "unique_prefix" in str(err.value) and "storage gc" in str(err.value)
        assert uploads == uploads_before  # B uploaded nothing
    finally:
        release.set()
        first.join(30)
    monkeypatch.setattr(store_cls, "put_file", real_put_file)
    assert "a" in result
    out = tmp_path / "back"
    download_dir(uri, out)
    for rel in ("config.json", "transformer/model.safetensors"):
        assert (out / rel).read_bytes() == (a / rel).read_bytes()
    assert not open_store(uri).exists(MARKER_NAME)


def test_storage_failed_publish_releases_its_claim_for_a_retry(root_uri, tmp_path, monkeypatch):
    src = _artifact(tmp_path)
    uri = f"{root_uri}/retry"
    store_cls = type(open_store(uri))
    real_put_file = store_cls.put_file

    def put_file_failing(self, key, path, *, callback=None):
        raise G2RPOError(f"upload of {key} failed: connection reset")

    monkeypatch.setattr(store_cls, "put_file", put_file_failing)
    with pytest.raises(G2RPOError, match="run the same publish again to retry"):
        publish_dir(src, uri)
    monkeypatch.setattr(store_cls, "put_file", real_put_file)
    assert not open_store(uri).exists(MARKER_NAME)
    publish_dir(src, uri)
    verify(open_store(uri), deep=True)


def test_storage_sha256_file_reads_in_chunks(tmp_path):
    data = os.urandom(10_000)
    (tmp_path / "blob").write_bytes(data)
    # a chunk that does not divide the size: the digest is the whole file's, the size every byte
    assert sha256_file(tmp_path / "blob", chunk=4096) == (10_000, hashlib.sha256(data).hexdigest())
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == (0, hashlib.sha256(b"").hexdigest())


def test_storage_write_dir_manifest_seals_a_local_folder(tmp_path):
    src = _artifact(tmp_path)
    (src / "notes.txt").write_text("not part of the artifact")
    manifest = write_dir_manifest(
        src, producer="p 1", metadata={"kind": "k"}, names=["config.json", "transformer/model.safetensors"]
    )
    store = FileStore(src)
    assert read_manifest(store) == manifest and [f.path for f in manifest.files] == [
        "config.json",
        "transformer/model.safetensors",
    ]
    assert manifest.total_size == 13 + 2048 and mismatches(store, manifest, deep=True) == []
    with pytest.raises(G2RPOError, match="already published"):  # create-only, like every manifest
        write_dir_manifest(src, producer="p 1")
    with pytest.raises(G2RPOError, match="names=.*missing.bin.*not a file"):
        write_dir_manifest(tmp_path, producer="p", names=["missing.bin"])
    blob = src / "transformer" / "model.safetensors"
    flipped = bytearray(blob.read_bytes())
    flipped[100] ^= 1
    blob.write_bytes(bytes(flipped))
    assert mismatches(store, manifest) == []  # sizes only
    assert mismatches(store, manifest, deep=True) == [
        f"transformer/model.safetensors: sha256 {sha256_file(blob)[1][:12]}…, manifest says "
        f"{manifest.files[1].sha256[:12]}…"
    ]
    (src / "config.json").unlink()
    assert mismatches(store, manifest) == ["config.json: missing"]


def test_storage_publish_of_a_sealed_folder_publishes_what_its_manifest_lists_after_verifying_it(
    root_uri, tmp_path, monkeypatch
):
    # A folder g2rpo wrote (an export, the shipped models) has its own manifest.json: `storage put` of it used
    # to fail with "'manifest.json' is reserved for g2rpo; rename the file".
    monkeypatch.setenv("G2RPO_CACHE_DIR", str(tmp_path / "cache"))  # verify_local's record of verified files
    src = _artifact(tmp_path)
    (src / "notes.txt").write_text("not part of the artifact")
    write_dir_manifest(src, producer="p 1", names=["config.json", "transformer/model.safetensors"])
    published = publish_dir(src, f"{root_uri}/sealed")
    assert [f.path for f in published.files] == ["config.json", "transformer/model.safetensors"]
    fetched = fetch_to_cache(f"{root_uri}/sealed", cache_dir=tmp_path / "fetched")
    assert (fetched / "config.json").read_text() == '{"layers": 2}' and not (fetched / "notes.txt").exists()
    blob = src / "transformer" / "model.safetensors"
    flipped = bytearray(blob.read_bytes())
    flipped[7] ^= 1
    blob.write_bytes(bytes(flipped))
    with pytest.raises(G2RPOError, match="(?s)folder to publish .*does not match.*model.safetensors: sha256"):
        publish_dir(src, f"{root_uri}/damaged")
    assert not has_manifest(open_store(f"{root_uri}/damaged"))
