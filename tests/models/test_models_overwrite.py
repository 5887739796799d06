"""--overwrite never deletes what g2rpo did not write: a model folder is replaced only when it is
recognisably a g2rpo model (its marker, nothing but the model's files); anything else is refused
before any work, naming what the folder holds."""

from __future__ import annotations

import os

import pytest

from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.models.shapes import ShapesPretraining, pretrain_shapes
from g2rpo.models.tiny import TINY_MARKER, save_tiny_flux


def _users_folder(tmp_path):
    out = tmp_path / "mine"
    (out / "data").mkdir(parents=True)
    (out / "thesis.tex").write_text("\\section{Results}")
    (out / "data" / "measurements.csv").write_text("t,x\n0,1\n")
    return out


def test_pretrain_shapes_overwrite_refuses_a_users_folder_and_keeps_every_file(tmp_path, capsys):
    out = _users_folder(tmp_path)
    code = main(
        ["model", "pretrain-shapes", "--output", str(out), "--vae-steps", "1", "--flow-steps", "1", "--overwrite"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "data/" in err and "thesis.tex" in err and "g2rpo model folder" in err
    assert (out / "thesis.tex").read_text() == "\\section{Results}"
    assert (out / "data" / "measurements.csv").read_text() == "t,x\n0,1\n"


def test_init_tiny_overwrite_refuses_a_users_folder_and_replaces_its_own(tmp_path, capsys):
    out = _users_folder(tmp_path)
    assert main(["model", "init-tiny", "--output", str(out), "--overwrite"]) == 2
    assert "thesis.tex" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["data", "thesis.tex"]
    # a g2rpo model folder is replaced whole
    model = save_tiny_flux(tmp_path / "model", seed=1)
    (model / "transformer" / "stale.bin").write_bytes(b"old")
    assert save_tiny_flux(model, seed=2, overwrite=True) == model
    assert not (model / "transformer" / "stale.bin").exists()
    # a model folder with a stranger beside it, or without the marker, is not recognisably ours
    (model / "notes.txt").write_text("mine")
    with pytest.raises(G2RPOError, match=r"holds notes\.txt"):
        save_tiny_flux(model, overwrite=True)
    (model / "notes.txt").unlink()
    (model / TINY_MARKER).unlink()
    with pytest.raises(G2RPOError, match=rf"no {TINY_MARKER}"):
        pretrain_shapes(model, ShapesPretraining(vae_steps=1, flow_steps=1), overwrite=True)
    assert (model / "model_index.json").is_file()


def test_data_prep_overwrite_replaces_only_its_own_outputs(tmp_path):
    from g2rpo.data import prepare_prompts

    src = tmp_path / "p.txt"
    src.write_text("".join(f"prompt {i}\n" for i in range(6)), encoding="utf-8")
    users = tmp_path / "users"
    users.mkdir()
    (users / "train.jsonl").write_text('{"my": "own data"}\n')
    with pytest.raises(G2RPOError, match=r"holds train\.jsonl, but it has no readable manifest\.json"):
        prepare_prompts(src, users, test_size=2, overwrite=True)
    assert (users / "train.jsonl").read_text() == '{"my": "own data"}\n'
    ours = tmp_path / "ours"
    prepare_prompts(src, ours, test_size=2)
    assert prepare_prompts(src, ours, test_size=3, overwrite=True).test == 3


def test_embedding_cache_and_export_overwrite_refuse_a_stranger(tmp_path):
    import torch

    from g2rpo.data import write_embedding_cache
    from g2rpo.models.tiny import build_tiny_flux_pipeline
    from g2rpo.training.checkpoint import export_model

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "shard-00000.safetensors").write_bytes(b"half")  # a killed build's leftovers: replaced
    (cache / "README.md").write_text("mine")
    from g2rpo.models.flux import FluxTextEncoder

    encoder = FluxTextEncoder.from_pipeline(build_tiny_flux_pipeline(0))
    with pytest.raises(G2RPOError, match=r"holds README\.md, which a text-embedding cache does not"):
        write_embedding_cache(cache, ["a cat"], encoder, overwrite=True)
    assert (cache / "shard-00000.safetensors").read_bytes() == b"half"
    (cache / "README.md").unlink()
    write_embedding_cache(cache, ["a cat"], encoder, overwrite=True)
    export = tmp_path / "export"
    export.mkdir()
    (export / "results.csv").write_text("1,2\n")
    with pytest.raises(G2RPOError, match=r"holds results\.csv, which a model export does not"):
        export_model(torch.nn.Linear(1, 1), export, base_model="x", config_hash="0", lora=False)
    assert (export / "results.csv").is_file()


def test_a_model_folder_whose_marker_is_not_g2rpos_json_is_not_replaced_and_says_why(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model_index.json").write_text("{}")
    (model / TINY_MARKER).write_bytes('{"producer": "g2rpo.models.tiny"}'.encode("utf-16"))
    with pytest.raises(
        G2RPOError,
        match=rf"is not recognisably a g2rpo model folder \(model marker '.*{TINY_MARKER}' is UTF-16 .*not UTF-8: "
        r"g2rpo writes it whole, so it is not g2rpo's or was changed since\); --overwrite replaces only",
    ):
        save_tiny_flux(model, overwrite=True)  # was "is not readable JSON", the cause unnamed
    (model / TINY_MARKER).unlink()
    os.mkfifo(model / TINY_MARKER)
    with pytest.raises(G2RPOError, match=rf"model marker '.*{TINY_MARKER}' is a FIFO \(named pipe\), not a regular"):
        save_tiny_flux(model, overwrite=True)  # never opened: it would block; was "no g2rpo_tiny.json"
    assert sorted(p.name for p in model.iterdir()) == [TINY_MARKER, "model_index.json"]
