"""Manifests: atomic publish, verified downloads, the digest-keyed cache, GC of unpublished prefixes."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timedelta, timezone

import pytest

from g2rpo.errors import G2RPOError
from g2rpo.manifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    download_dir,
    fetch_to_cache,
    gc,
    has_manifest,
    publish_dir,
    read_manifest,
    unique_prefix,
    verify,
    write_manifest,
)
from g2rpo.storage import open_store

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
    assert (out / "transformer" / "model.safetensors").read_bytes() == (src / "transformer" / "model.safetensors").read_bytes()
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
    now = datetime.now(timezone.utc)

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
