"""Damaged weights are never used: every consumer of a model folder (model check, train, eval)
checks it against its manifest, byte for byte; the check is cached by file identity, and a file
changed since (even with its old mtime put back) is hashed again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from g2rpo.artifacts import cache as cache_module
from g2rpo.artifacts.cache import verify_local
from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.models.shapes import SHIPPED_SHAPES_MODEL

REPO = Path(__file__).resolve().parents[2]
WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the weights' data, not the header: only a sha256 sees it
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the old mtime put back


@pytest.fixture
def damaged(tmp_path, monkeypatch):
    monkeypatch.setenv("G2RPO_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "shapes-copy"
    shutil.copytree(SHIPPED_SHAPES_MODEL, copy)
    _flip_last_byte(copy / WEIGHTS)
    return copy


def test_model_check_refuses_damaged_weights(damaged, capsys):
    assert main(["model", "check", str(damaged)]) == 2
    err = capsys.readouterr().err
    assert "does not match its manifest.json" in err and f"{WEIGHTS}: sha256" in err
    # the text encoders alone are intact: a consumer of those is not refused for the transformer
    assert main(["model", "check", str(damaged), "--components", "tokenizer,text_encoder"]) == 0
    assert "every file matches its manifest.json" in capsys.readouterr().out


def test_train_refuses_damaged_weights_before_any_work(damaged, tmp_path, capsys):
    out = tmp_path / "run"
    overrides = [
        f"model.path={damaged}",
        "model.create_tiny=false",
        f"output.dir={out}",
        "train.iterations=1",
        "train.checkpoint_every=1",
        f"data.prompts={REPO / 'configs' / 'tiny-prompts.txt'}",
    ]
    assert main(["train", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), *overrides]) == 2
    err = capsys.readouterr().err
    assert "model.path" in err and f"{WEIGHTS}: sha256" in err
    assert not (out / "export").exists() and not (out / "checkpoints").exists()


def test_eval_refuses_damaged_weights(damaged, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle\n", encoding="utf-8")
    code = main(
        ["eval", "--model", str(damaged), "--prompts", str(prompts), "--output", str(tmp_path / "ev"), "device=cpu"]
    )
    assert code == 2
    assert f"{WEIGHTS}: sha256" in capsys.readouterr().err
    assert not (tmp_path / "ev" / "manifest.json").exists()


def test_verification_is_cached_by_file_identity(tmp_path, monkeypatch):
    monkeypatch.setenv("G2RPO_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "m"
    shutil.copytree(SHIPPED_SHAPES_MODEL, copy)
    hashed: list[str] = []
    real = cache_module.sha256_file
    monkeypatch.setattr(cache_module, "sha256_file", lambda p: (hashed.append(Path(p).name), real(p))[1])
    assert verify_local(copy) is not None
    assert len(hashed) == 15  # every file of the manifest, read once
    hashed.clear()
    verify_local(copy)
    assert hashed == []  # same identities: nothing read again
    _flip_last_byte(copy / WEIGHTS)  # same size, same mtime: the ctime (and so the identity) changed
    with pytest.raises(G2RPOError, match=rf"{WEIGHTS}: sha256"):
        verify_local(copy)
    assert hashed == ["diffusion_pytorch_model.safetensors"]
    # a folder without a manifest is not verifiable: None, and nothing read
    assert verify_local(tmp_path) is None


@pytest.mark.parametrize("record", [b"[]", b'{"root": "x", "files": ', b'{"manifest": "m", "files": [1]}', None])
def test_a_damaged_verification_record_costs_a_re_hash_and_is_written_anew(tmp_path, monkeypatch, record):
    monkeypatch.setenv("G2RPO_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "m"
    shutil.copytree(SHIPPED_SHAPES_MODEL, copy)
    verify_local(copy)
    (path,) = (tmp_path / "cache" / "verified").iterdir()
    if record is None:  # a directory where the record belongs
        path.unlink()
        path.mkdir()
    else:
        path.write_bytes(record)
    hashed: list[str] = []
    real = cache_module.sha256_file
    monkeypatch.setattr(cache_module, "sha256_file", lambda p: (hashed.append(Path(p).name), real(p))[1])
    assert verify_local(copy) is not None
    assert len(hashed) == 15  # read around: every file hashed again
    if record is not None:
        hashed.clear()
        verify_local(copy)
        assert hashed == []  # the record was written anew


def test_a_manifest_that_is_not_utf8_json_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("G2RPO_CACHE_DIR", str(tmp_path / "cache"))
    copy = tmp_path / "m"
    shutil.copytree(SHIPPED_SHAPES_MODEL, copy)
    manifest = copy / "manifest.json"
    manifest.write_bytes(manifest.read_text(encoding="utf-8").encode("utf-16"))  # json.loads would take it
    with pytest.raises(G2RPOError, match=r"manifest\.json is UTF-16 .*the artifact is corrupt: republish it"):
        verify_local(copy)
    manifest.write_text("[]")
    with pytest.raises(G2RPOError, match=r"manifest\.json holds an array where an object belongs"):
        verify_local(copy)
