"""A cache folder that cannot be written (issue 43): with an ``s3://`` model, ``eval`` and ``train``
ended in ``OSError: [Errno 30] Read-only file system`` from ``fetch_to_cache``. The folder and the
setting that moves it are named, before any work, and a full one leaves no partial entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from g2rpo.artifacts.cache import fetch_to_cache
from g2rpo.artifacts.publish import publish_dir
from g2rpo.artifacts.storage import open_store
from g2rpo.cli import main
from g2rpo.errors import G2RPOError

PROMPTS = Path(__file__).resolve().parents[2] / "configs" / "tiny-prompts.txt"


def _artifact(tmp_path, size: int) -> Path:
    folder = tmp_path / "artifact"
    folder.mkdir()
    (folder / "config.json").write_text('{"layers": 2}')
    (folder / "weights.bin").write_bytes(b"\1" * size)
    return folder


def test_a_read_only_cache_dir_is_named_with_its_setting(s3_env, tmp_path, read_only_dir):
    uri = f"{s3_env.uri}/exports/m1"
    publish_dir(_artifact(tmp_path, 1024), uri)
    cache = read_only_dir / "cache"
    with pytest.raises(G2RPOError) as info:
        fetch_to_cache(uri, cache, setting="rewards.cache_dir")
    assert f"rewards.cache_dir={str(cache)!r}: cannot be created: {read_only_dir} is not writable" in str(info.value)


def test_a_read_only_default_cache_names_g2rpo_cache_dir(s3_env, tmp_path, read_only_dir, monkeypatch):
    uri = f"{s3_env.uri}/exports/m1"
    publish_dir(_artifact(tmp_path, 1024), uri)
    monkeypatch.setenv("G2RPO_CACHE_DIR", str(read_only_dir))
    with pytest.raises(G2RPOError, match=rf"G2RPO_CACHE_DIR='{read_only_dir}': is not writable \(read-only\)"):
        fetch_to_cache(uri)


def test_a_full_cache_names_the_setting_and_leaves_no_partial_entry(s3_env, tmp_path, small_disk):
    uri = f"{s3_env.uri}/exports/big"
    publish_dir(_artifact(tmp_path, 3 * 2**20), uri)  # 3 MiB into a 2 MiB cache
    with pytest.raises(G2RPOError) as info:
        fetch_to_cache(uri, small_disk / "cache")
    message = str(info.value)
    assert "no space left on the device" in message and "MiB free on" in message, message
    assert "the cache folder moves with cache_dir" in message
    assert [p.name for p in (small_disk / "cache" / "artifacts").iterdir()] == []  # no staging, no entry


def test_eval_of_an_s3_model_with_a_read_only_cache_stops_before_any_work(
    s3_env, tiny_flux_dir, tmp_path, read_only_dir, monkeypatch, capsys
):
    uri = f"{s3_env.uri}/models/tiny"
    publish_dir(tiny_flux_dir, uri)
    monkeypatch.setenv("G2RPO_CACHE_DIR", str(read_only_dir / "g2rpo"))
    output = tmp_path / "eval"
    argv = ["eval", "--model", uri, "--prompts", str(PROMPTS), "--output", str(output), "--seeds", "0", "device=cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"G2RPO_CACHE_DIR='{read_only_dir / 'g2rpo'}': cannot be created" in err and "Traceback" not in err, err
    assert not (output / "_partial").exists()


def test_train_from_an_s3_model_with_a_read_only_cache_stops_before_any_work(
    s3_env, tiny_flux_dir, tmp_path, read_only_dir, monkeypatch, capsys
):
    uri = f"{s3_env.uri}/models/tiny"
    publish_dir(tiny_flux_dir, uri)
    open_store(f"{s3_env.uri}/data").put_file("prompts.txt", PROMPTS)
    monkeypatch.setenv("G2RPO_CACHE_DIR", str(read_only_dir))
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    out = tmp_path / "run"
    overrides = [f"model.path={uri}", f"data.prompts={PROMPTS}", f"output.dir={out}", "train.device=cpu"]
    overrides += ["train.precision=fp32", "model.height=64", "model.width=64"]
    assert main(["train", "--config", str(config), *overrides]) == 2
    err = capsys.readouterr().err
    assert f"G2RPO_CACHE_DIR='{read_only_dir}': is not writable (read-only)" in err and "Traceback" not in err, err
    assert not (out / "checkpoints").exists()
