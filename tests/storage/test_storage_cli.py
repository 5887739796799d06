"""`g2rpo storage ...` through g2rpo.cli.main, against a local folder and against S3."""

from __future__ import annotations

import json
import os

import pytest

from g2rpo.artifacts.manifest import MANIFEST_NAME, MARKER_NAME
from g2rpo.artifacts.storage import open_store
from g2rpo.cli import main

pytestmark = pytest.mark.integration


def test_storage_cli_put_get_ls_verify(root_uri, tmp_path, capsys):
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(os.urandom(100))
    (src / "cfg.json").write_text("{}")
    assert main(["storage", "put", str(src), f"{root_uri}/ckpt-1", "--config-hash", "h1"]) == 0
    assert "published 2 file(s), 102 bytes" in capsys.readouterr().out
    assert json.loads(open_store(f"{root_uri}/ckpt-1").get_bytes(MANIFEST_NAME)[0])["config_hash"] == "h1"

    assert main(["storage", "put", str(src), f"{root_uri}/runs/model", "--unique"]) == 0
    published = capsys.readouterr().out.strip().rsplit(" → ", 1)[1]
    assert published.startswith(f"{root_uri}/runs/model-") and published != f"{root_uri}/runs/model"
    assert main(["storage", "verify", published]) == 0

    single = tmp_path / "prompts.txt"
    single.write_text("a cat\na dog\n")
    assert main(["storage", "put", str(single), f"{root_uri}/prompts/p.txt"]) == 0

    assert main(["storage", "ls", root_uri]) == 0
    listing = capsys.readouterr().out
    for key in ("ckpt-1/sub/w.bin", "ckpt-1/cfg.json", f"ckpt-1/{MANIFEST_NAME}", "prompts/p.txt", "runs/model-"):
        assert key in listing

    assert main(["storage", "get", f"{root_uri}/ckpt-1", str(tmp_path / "back")]) == 0
    assert (tmp_path / "back" / "sub" / "w.bin").read_bytes() == (src / "sub" / "w.bin").read_bytes()
    assert main(["storage", "get", f"{root_uri}/prompts/p.txt", str(tmp_path / "p.txt")]) == 0
    assert (tmp_path / "p.txt").read_text() == "a cat\na dog\n"

    assert main(["storage", "verify", f"{root_uri}/ckpt-1", "--deep"]) == 0
    open_store(f"{root_uri}/ckpt-1").put_bytes("cfg.json", b"[]")  # same size, other bytes
    capsys.readouterr()
    assert main(["storage", "verify", f"{root_uri}/ckpt-1", "--deep"]) == 2
    assert "cfg.json: sha256" in capsys.readouterr().err


def test_storage_cli_errors_are_clear(tmp_path, capsys):
    assert main(["storage", "put", str(tmp_path / "missing"), str(tmp_path / "dest")]) == 2
    assert "source=" in capsys.readouterr().err
    assert main(["storage", "gc", str(tmp_path), "--older-than", "soon"]) == 2
    assert "--older-than='soon'" in capsys.readouterr().err
    assert main(["storage", "put", __file__, "s3://bucket/a/../b"]) == 2
    assert "'..' segments are not allowed" in capsys.readouterr().err


def test_storage_cli_gc(root_uri, capsys):
    store = open_store(root_uri)
    store.put_bytes(f"dead/{MARKER_NAME}", b"{}")
    store.put_bytes("dead/x.bin", b"12345")
    assert main(["storage", "gc", root_uri, "--older-than", "1h"]) == 0
    assert "removed 0 unpublished prefix(es)" in capsys.readouterr().out
    assert store.exists("dead/x.bin")
    assert main(["storage", "gc", root_uri, "--older-than", "0s", "--dry-run"]) == 0
    assert f"would remove {store.uri_for('dead')}" in capsys.readouterr().out
    assert main(["storage", "gc", root_uri, "--older-than", "0s"]) == 0
    assert "removed 1 unpublished prefix(es), 7 bytes" in capsys.readouterr().out
    assert store.list() == []


def test_storage_cli_unique_needs_a_name_below_the_bucket(s3_env, tmp_path, capsys):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "w.bin").write_bytes(b"123")
    # It used to publish to the *bucket* 's3://<bucket>-<time>-<hex>'.
    assert main(["storage", "put", str(src), s3_env.uri, "--unique"]) == 2
    assert "name the artifact below the bucket" in capsys.readouterr().err
    assert open_store(s3_env.uri).list() == []
    assert main(["storage", "put", str(src), f"{s3_env.uri}/exports/model/", "--unique"]) == 0
    published = capsys.readouterr().out.strip().rsplit(" → ", 1)[1]
    assert published.startswith(f"{s3_env.uri}/exports/model-")
    assert [i.key.split("/", 1)[1] for i in open_store(f"{s3_env.uri}/exports").list()] == [MANIFEST_NAME, "w.bin"]


def test_storage_cli_refuses_to_lose_or_ignore(tmp_path, capsys):
    store_root = tmp_path / "store"
    single = tmp_path / "p.txt"
    single.write_text("remote")
    assert main(["storage", "put", str(single), f"{store_root}/p.txt"]) == 0
    # --unique names a fresh artifact prefix; for a single object it would be silently ignored.
    assert main(["storage", "put", str(single), f"{store_root}/q.txt", "--unique"]) == 2
    assert "--unique=True: only applies to a folder" in capsys.readouterr().err
    assert main(["storage", "put", str(single), f"{store_root}/q.txt", "--config-hash", "h1"]) == 2
    assert "--config-hash='h1': only applies to a folder" in capsys.readouterr().err
    assert not (store_root / "q.txt").exists()
    # A download never overwrites a local file that is already there.
    local = tmp_path / "mine.txt"
    local.write_text("local work")
    assert main(["storage", "get", f"{store_root}/p.txt", str(local)]) == 2
    assert f"dest='{local}': already exists" in capsys.readouterr().err
    assert local.read_text() == "local work"
    # An object URI with a trailing '/' names a prefix, not an object.
    assert main(["storage", "put", str(single), f"{store_root}/dir/"]) == 2
    assert "names a folder/prefix" in capsys.readouterr().err
    assert not (store_root / "dir").exists()


def test_storage_cli_endpoint_must_be_a_url(monkeypatch, capsys):
    # botocore raises a bare ValueError (a traceback) for an endpoint without a scheme.
    assert main(["storage", "ls", "s3://bucket", "--endpoint-url", "127.0.0.1:9000"]) == 2
    assert "--endpoint-url='127.0.0.1:9000': give a URL like http://" in capsys.readouterr().err
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "127.0.0.1:9000")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    assert main(["storage", "ls", "s3://bucket"]) == 2
    assert "AWS_ENDPOINT_URL_S3='127.0.0.1:9000': give a URL like http://" in capsys.readouterr().err
