"""The tiny-pipeline factory, `g2rpo model init-tiny/check`, and model-directory checks and loading."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.models.loading import (
    FLUX_DEV_LICENCE,
    base_model_record,
    check_model_dir,
    load_pipeline,
    load_text_encoder,
    load_transformer,
    load_vae,
    resolve_model_location,
)

pytestmark = pytest.mark.integration


def _copy(src, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def test_models_init_tiny_cli_round_trip(tmp_path, capsys):
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTokenizer, T5TokenizerFast

    from g2rpo.models.tiny import build_tiny_flux_pipeline

    out = tmp_path / "tiny"
    assert main(["model", "init-tiny", "--output", str(out), "--seed", "3"]) == 0
    assert "wrote tiny FluxPipeline" in capsys.readouterr().out
    pipe = FluxPipeline.from_pretrained(out, local_files_only=True)
    assert isinstance(pipe.transformer, FluxTransformer2DModel)
    assert isinstance(pipe.tokenizer, CLIPTokenizer) and isinstance(pipe.tokenizer_2, T5TokenizerFast)
    # the saved weights are the factory's seed-3 weights, and seed 0 gives other weights
    fresh = build_tiny_flux_pipeline(seed=3)
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        saved, built = getattr(pipe, name).state_dict(), getattr(fresh, name).state_dict()
        assert saved.keys() == built.keys()
        assert all(torch.equal(saved[k], built[k]) for k in saved), name
    other = build_tiny_flux_pipeline(seed=0).transformer.state_dict()
    assert not all(torch.equal(other[k], fresh.transformer.state_dict()[k]) for k in other)
    # tokenizers survive the save: same ids before and after
    text = "a photo of a cat, in oil"
    assert pipe.tokenizer(text).input_ids == fresh.tokenizer(text).input_ids
    assert pipe.tokenizer_2(text).input_ids == fresh.tokenizer_2(text).input_ids
    assert pipe.tokenizer_2.convert_ids_to_tokens(pipe.tokenizer_2("a cat").input_ids) == ["▁a", "▁cat", "</s>"]
    assert pipe.vae.config.scaling_factor == pytest.approx(0.3611) and pipe.vae.config.shift_factor == pytest.approx(
        0.1159
    )
    assert json.loads((out / "g2rpo_tiny.json").read_text())["seed"] == 3


def test_models_init_tiny_refuses_a_non_empty_directory(tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["model", "init-tiny", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and "--overwrite" in err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "keep me"


def test_models_clip_tokenizer_agrees_with_open_clip_on_covered_words():
    import open_clip

    from g2rpo.models.tiny import tiny_clip_tokenizer

    ours = tiny_clip_tokenizer()
    reference = open_clip.get_tokenizer("ViT-B-32")
    # "a", "photo", "of" are within the first 1000 merges, so ids agree with open_clip's full vocab,
    # apart from the special tokens, which sit at the end of each vocabulary.
    ids = ours("a photo of").input_ids
    ref = reference(["a photo of"])[0][: len(ids)].tolist()
    assert ids[1:-1] == ref[1:-1] == [320, 1125, 539]
    assert ours.convert_ids_to_tokens(ids[0]) == "<|startoftext|>" and ids[-1] == ours.eos_token_id


def test_models_check_and_load_the_tiny_model(tiny_flux_dir, capsys):
    index = check_model_dir(tiny_flux_dir)
    assert index["_class_name"] == "FluxPipeline"
    transformer = load_transformer(tiny_flux_dir, dtype="bfloat16")
    assert next(transformer.parameters()).dtype == torch.bfloat16
    vae = load_vae(tiny_flux_dir, dtype="float32")
    assert vae.config.latent_channels == 16
    encoder = load_text_encoder(tiny_flux_dir, dtype="float32")
    assert encoder.max_sequence_length == 32  # the tiny T5 tokenizer's model_max_length
    cond = encoder.encode(["a cat"])
    assert cond.prompt_embeds.shape == (1, 32, 32)
    pipe = load_pipeline(f"file://{tiny_flux_dir}", dtype="float32")
    assert pipe.transformer.config.num_layers == 2
    assert main(["model", "check", str(tiny_flux_dir)]) == 0
    assert '"kind": "tiny"' in capsys.readouterr().out


def test_models_missing_model_directory(tmp_path):
    with pytest.raises(G2RPOError, match="does not exist.*init-tiny"):
        check_model_dir(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(G2RPOError, match="no model_index.json"):
        load_transformer(tmp_path / "empty")


def test_models_partial_model_directory_lists_every_problem(tiny_flux_dir, tmp_path, capsys):
    model = _copy(tiny_flux_dir, tmp_path)
    shutil.rmtree(model / "vae")  # a missing component folder
    (model / "transformer" / "diffusion_pytorch_model.safetensors").unlink()  # missing weights
    (model / "tokenizer_2" / "tokenizer_config.json").unlink()  # missing config
    with pytest.raises(G2RPOError) as info:
        check_model_dir(model)
    msg = str(info.value)
    assert "3 problem(s)" in msg
    assert f"{model / 'vae'}: component folder missing" in msg
    assert f"{model / 'transformer'}: no weights file" in msg
    assert "tokenizer_2/tokenizer_config.json: missing config file" in msg
    # only the asked-for components are required
    check_model_dir(model, ("text_encoder", "text_encoder_2", "scheduler"))
    assert main(["model", "check", str(model)]) == 2
    assert "component folder missing" in capsys.readouterr().err


def test_models_sharded_weights_with_a_missing_shard(tiny_flux_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    model = _copy(tiny_flux_dir, tmp_path)
    folder = model / "transformer"
    weights = load_file(folder / "diffusion_pytorch_model.safetensors")
    (folder / "diffusion_pytorch_model.safetensors").unlink()
    names = sorted(weights)
    half = len(names) // 2
    shards = {"part-1.safetensors": names[:half], "part-2.safetensors": names[half:]}
    for file, keys in shards.items():
        save_file({k: weights[k] for k in keys}, folder / file)
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    check_model_dir(model, ("transformer",))  # complete
    loaded = load_transformer(model, dtype="float32")
    assert torch.equal(loaded.state_dict()[names[0]], weights[names[0]])
    (folder / "part-2.safetensors").unlink()
    with pytest.raises(G2RPOError, match="missing weight shard\\(s\\) part-2.safetensors"):
        check_model_dir(model, ("transformer",))


def test_models_truncated_weights_are_reported_before_loading(tiny_flux_dir, tmp_path):
    # A half-finished download: the file exists but is shorter than its safetensors header says
    # (complete size = 8 + header length + the largest data offset).
    model = _copy(tiny_flux_dir, tmp_path)
    weights = model / "transformer" / "diffusion_pytorch_model.safetensors"
    complete = weights.read_bytes()
    weights.write_bytes(complete[: len(complete) // 2])  # header intact, data cut
    with pytest.raises(G2RPOError) as info:
        check_model_dir(model)
    message = str(info.value)
    assert "transformer/diffusion_pytorch_model.safetensors: truncated or damaged" in message
    assert f"({len(complete) // 2} bytes, its header says {len(complete)})" in message and "download" in message
    weights.write_bytes(complete[:5])  # not even the 8-byte header length
    with pytest.raises(G2RPOError, match="not a readable safetensors file"):
        check_model_dir(model, ("transformer",))
    weights.write_bytes(complete + b"x")  # longer than the header says: damaged too
    with pytest.raises(G2RPOError, match="truncated or damaged"):
        check_model_dir(model, ("transformer",))
    weights.write_bytes(complete)
    check_model_dir(model)  # restored: complete


def test_models_model_index_without_a_component(tiny_flux_dir, tmp_path):
    model = _copy(tiny_flux_dir, tmp_path)
    index = json.loads((model / "model_index.json").read_text())
    del index["transformer"]
    (model / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(G2RPOError, match="no 'transformer' component listed"):
        check_model_dir(model, ("transformer",))


def test_models_locations_and_licence(tiny_flux_dir, tmp_path):
    assert resolve_model_location(f"file://{tmp_path}") == tmp_path
    with pytest.raises(G2RPOError, match="unsupported scheme"):
        resolve_model_location("gs://bucket/flux")
    tiny = base_model_record(tiny_flux_dir)
    assert tiny["kind"] == "tiny" and "not derived from FLUX.1-dev" in tiny["note"]
    model = _copy(tiny_flux_dir, tmp_path)
    (model / "g2rpo_tiny.json").unlink()  # now it reads as a FLUX.1-dev directory
    flux = base_model_record(model)
    assert flux["licence"] == FLUX_DEV_LICENCE and "derivative" in flux["note"]
    assert flux["licence_url"].startswith("https://huggingface.co/black-forest-labs/FLUX.1-dev")


def test_models_load_from_s3_through_the_storage_layer(tiny_flux_dir, tmp_path, s3_env):
    """An s3:// model location is published once, fetched once into the cache (sha256-checked), then loaded."""
    from g2rpo.artifacts.publish import publish_dir

    uri = f"{s3_env.uri}/models/tiny-flux"
    publish_dir(tiny_flux_dir, uri)
    cache = tmp_path / "cache"
    local = resolve_model_location(uri, cache_dir=cache)
    assert local.is_relative_to(cache) and (local / "model_index.json").is_file()
    transformer = load_transformer(uri, dtype="float32", cache_dir=cache)
    reference = load_transformer(tiny_flux_dir, dtype="float32").state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in transformer.state_dict().items())
    assert resolve_model_location(uri, cache_dir=cache) == local  # cached: same folder, no second download
    assert base_model_record(uri, cache_dir=cache)["kind"] == "tiny"
    # a prefix with files but no manifest (an unfinished upload) is refused
    unfinished = f"{s3_env.uri}/models/unfinished"
    s3_env.server.client().put_object(Bucket=s3_env.bucket, Key="models/unfinished/model_index.json", Body=b"{}")
    with pytest.raises(G2RPOError):
        resolve_model_location(unfinished, cache_dir=cache)


def test_models_s3_model_with_wrong_bytes_is_never_loaded(tiny_flux_dir, tmp_path, s3_env, capsys):
    """Same size, other bytes: on the bucket the download is refused; in the cache it is fetched again."""
    from g2rpo.artifacts.publish import publish_dir

    uri = f"{s3_env.uri}/models/tiny-flux"
    publish_dir(tiny_flux_dir, uri)
    cache = tmp_path / "cache"
    local = resolve_model_location(uri, cache_dir=cache)
    weights = next((local / "transformer").glob("*.safetensors"))
    good = weights.read_bytes()
    damaged = bytearray(good)
    damaged[len(good) // 2 : len(good) // 2 + 64] = bytes(
        b ^ 0xFF for b in damaged[len(good) // 2 : len(good) // 2 + 64]
    )
    weights.write_bytes(bytes(damaged))  # damaged on this disk after the download
    capsys.readouterr()
    assert resolve_model_location(uri, cache_dir=cache) == local
    assert "does not match its manifest" in capsys.readouterr().err and weights.read_bytes() == good
    reference = load_transformer(tiny_flux_dir, dtype="float32").state_dict()
    loaded = load_transformer(uri, dtype="float32", cache_dir=cache).state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in loaded.items())
    # changed on the bucket after publishing: refused, and nothing enters a fresh cache
    key = f"models/tiny-flux/{weights.relative_to(local)}"
    s3_env.server.client().put_object(Bucket=s3_env.bucket, Key=key, Body=bytes(damaged))
    with pytest.raises(G2RPOError, match="changed after publishing"):
        load_transformer(uri, dtype="float32", cache_dir=tmp_path / "cache2")
    assert not any((tmp_path / "cache2" / "artifacts").iterdir())
