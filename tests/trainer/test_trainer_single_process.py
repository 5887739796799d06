"""Single-process training of the tiny Flux model (real diffusers classes) through the Trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_testlib import export_weights, probe_reward, tiny_overrides

from g2rpo.config import load_config
from g2rpo.errors import G2RPOError
from g2rpo.training.run_config import RunConfig
from g2rpo.training.trainer import Trainer
from tests.tiny_flux_fixture import make_tiny_flux

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_flux(tmp_path_factory.mktemp("trainer_tiny_flux"))


def _trainer(model: Path, out: Path, **extra) -> Trainer:
    return Trainer(load_config(RunConfig, None, tiny_overrides(model, out, **extra)))


def test_training_raises_mean_reward_seeded(tiny_model, tmp_path):
    # Test settings (see trainer_testlib): lr 1e-2, ratio clip 0.2, T=4, G=4 — far from the
    # paper's — so that 10 iterations visibly move a 135k-parameter model. The probe rolls out all
    # 8 prompts with the same draws before and after (a paired comparison). Measured: about
    # -7.27 → -6.5 bits/pixel (less negative = more compressible); 0.2 is a wide margin.
    trainer = _trainer(
        tiny_model,
        tmp_path / "run",
        **{
            "train.iterations": 10,
            "train.prompts_per_iteration": 4,
            "train.checkpoint_every": 100,
            "output.export": False,
        },
    ).setup()
    before = probe_reward(trainer)
    records = [trainer.step() for _ in range(10)]
    after = probe_reward(trainer)
    assert after > before + 0.2, (before, after)
    # the step record carries what metrics need
    last = records[-1]
    assert last.stats.optimizer_steps == 1
    assert last.stats.training_forwards == 4 * 2  # P = 4 prompts × |M| = ceil(4/2) = 2 shared-velocity forwards
    assert last.grad_norm is not None and last.grad_norm > 0
    assert set(last.seconds) == {"sampling", "decoding", "reward", "training"}


def test_run_writes_metrics_checkpoints_and_export(tiny_model, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setenv("G2RPO_PROGRESS_INTERVAL_S", "3600")  # a slow machine still gets first and last only
    summary = _trainer(tiny_model, out, **{"train.iterations": 3, "train.progress": True}).run()
    assert summary.iterations == 3 and summary.backend == "torch"
    # stderr is not a terminal here, as in a pod: the bar is two whole lines, no carriage returns
    # (transformers' own loading bars are quieted by the CLI: test_trainer_resume)
    err = capsys.readouterr().err
    bars = [line for line in err.split("\n") if "g2rpo train" in line]
    assert len(bars) == 2 and all(line.startswith("g2rpo train") for line in bars), bars
    assert "0/3" in bars[0] and "3/3" in bars[1] and "reward=" in bars[1], bars
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in lines] == [0, 1, 2]
    record = lines[0]
    for key in (
        "reward_mean",
        "advantage_mean",
        "advantage_std",
        "loss",
        "clip_fraction",
        "grad_norm",
        "lr",
        "sampling_forwards",
        "training_forwards",
        "seconds",
        "dropped_groups",
        "reward_names",
    ):
        assert key in record, key
    assert record["reward_names"] == ["jpeg_compressibility"]
    assert len(record["reward_mean"]) == 1 and len(record["reward_mean"][0]) == 2  # 1 reward model × 2 strides
    assert record["lr"] == pytest.approx(1e-2)
    # checkpoints at 2 (every 2) and 3 (the end); the export loads with diffusers
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["iter-000002", "iter-000003"]
    from diffusers import FluxTransformer2DModel

    exported = FluxTransformer2DModel.from_pretrained(out / "export" / "transformer", local_files_only=True)
    start = FluxTransformer2DModel.from_pretrained(tiny_model, subfolder="transformer", local_files_only=True)
    weights = export_weights(out)
    moved = sum(not torch.equal(weights[k], start.state_dict()[k]) for k in weights)
    assert moved > 0
    assert torch.equal(exported.state_dict()["proj_out.weight"], weights["proj_out.weight"])
    info = json.loads((out / "export" / "base_model.json").read_text())
    assert info["base_model"] == "tiny" and info["contents"] == "transformer" and info["license"]["name"]
    assert (out / "export" / "manifest.json").is_file()


def test_lora_trains_adapters_only_and_exports_them(tiny_model, tmp_path):
    out = tmp_path / "run"
    trainer = _trainer(
        tiny_model,
        out,
        **{"train.iterations": 2, "train.lora.enabled": True, "train.lora.rank": 4, "train.lora.alpha": 4.0},
    ).setup()
    trainable = [n for n, p in trainer.policy.velocity.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base_before = {n: p.detach().clone() for n, p in trainer.policy.velocity.named_parameters() if not p.requires_grad}
    lora_before = {n: p.detach().clone() for n, p in trainer.policy.velocity.named_parameters() if p.requires_grad}
    trainer.run()
    after = dict(trainer.policy.velocity.named_parameters())
    assert all(torch.equal(after[n], t) for n, t in base_before.items())
    assert any(not torch.equal(after[n], t) for n, t in lora_before.items())
    files = sorted(p.name for p in (out / "export" / "lora").iterdir())
    assert "adapter_config.json" in files and any(f.endswith(".safetensors") for f in files)
    assert not (out / "export" / "transformer").exists()  # the adapters alone
    info = json.loads((out / "export" / "base_model.json").read_text())  # + the base model and its licence
    assert info["base_model"] == "tiny" and info["contents"] == "lora-adapters" and info["license"]["name"]


def test_lora_adapters_start_from_the_run_seed(tiny_model, tmp_path):
    # peft draws lora_A from the global torch RNG; the trainer seeds that draw from train.seed, so
    # two runs of one seed start alike whatever the global RNG holds, and another seed differs.
    def adapters(seed: int, name: str) -> dict[str, torch.Tensor]:
        torch.manual_seed(1000 + len(name))  # a different global RNG state for each call
        trainer = _trainer(tiny_model, tmp_path / name, **{"train.lora.enabled": True, "train.seed": seed}).setup()
        return {n: p.detach().clone() for n, p in trainer.policy.velocity.named_parameters() if "lora_A" in n}

    first, again, other = adapters(0, "a"), adapters(0, "bb"), adapters(1, "ccc")
    assert first and first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert all(not torch.equal(first[n], other[n]) for n in first)


def test_lora_on_missing_module_names_close_matches(tiny_model, tmp_path):
    trainer = _trainer(
        tiny_model, tmp_path / "run", **{"train.lora.enabled": True, "train.lora.target_modules": ["to_qq"]}
    )
    with pytest.raises(G2RPOError) as info:
        trainer.setup()
    assert "to_qq" in str(info.value) and "to_q" in str(info.value)
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_lora_on_a_module_that_is_not_a_linear_layer_is_refused(tiny_model, tmp_path):
    # norm1 exists in every block but is an AdaLayerNormZero (peft would fail with a traceback);
    # its Linear, norm1.linear, is a valid target.
    trainer = _trainer(
        tiny_model, tmp_path / "run", **{"train.lora.enabled": True, "train.lora.target_modules": ["to_q", "norm1"]}
    )
    with pytest.raises(G2RPOError) as info:
        trainer.setup()
    message = str(info.value)
    assert "train.lora.target_modules" in message and "'norm1' matches AdaLayerNormZero modules" in message
    assert "norm1.linear" in message and "'to_q' matches" not in message  # the fix; to_q is not blamed
    assert not (tmp_path / "run").exists()
    ok = _trainer(
        tiny_model, tmp_path / "ok", **{"train.lora.enabled": True, "train.lora.target_modules": ["norm1.linear"]}
    ).setup()
    assert any("norm1.linear.lora_A" in n for n, p in ok.policy.velocity.named_parameters() if p.requires_grad)


def test_ema_tracks_weights_and_is_exported(tiny_model, tmp_path):
    out = tmp_path / "run"
    trainer = _trainer(
        tiny_model,
        out,
        **{
            "train.iterations": 2,
            "train.ema.enabled": True,
            "train.ema.decay": 0.5,
            "output.export_ema": True,
            "train.checkpoint_every": 100,
        },
    ).setup()
    start = {n: p.detach().clone() for n, p in trainer.learner.trainable().items()}
    trainer.step()
    theta1 = {n: p.detach().clone() for n, p in trainer.learner.trainable().items()}
    # one update with d = 0.5: ema = 0.5·θ0 + 0.5·θ1
    name = "transformer.proj_out.weight"
    assert torch.allclose(trainer.learner.ema.shadow[name], 0.5 * start[name] + 0.5 * theta1[name])
    trainer.step()
    expected = trainer.learner.ema.shadow["transformer.proj_out.weight"].clone()
    trainer.run()  # nothing left to train: saves, exports the EMA weights
    assert torch.equal(export_weights(out)["proj_out.weight"], expected)


def test_ema_warmup_is_the_published_schedule_and_its_count_is_checkpointed():
    from g2rpo.training.drivers import EMA

    ema = EMA({"w": torch.zeros(1)}, decay=0.9, warmup=True)
    ones = {"w": torch.ones(1)}
    ema.update(ones)  # s = 1: d = 2/11, θ_ema = 9/11
    assert ema.shadow["w"].item() == pytest.approx(9 / 11)
    ema.update(ones)  # s = 2: d = 3/12 = 0.25
    assert ema.shadow["w"].item() == pytest.approx(0.25 * 9 / 11 + 0.75)
    assert [min((1 + s) / (10 + s), 0.9) for s in (8, 80, 81)] == [0.5, 81 / 90, 0.9]  # the cap from s = 81 on
    state = ema.state_dict()
    resumed = EMA({"w": torch.zeros(1)}, decay=0.9, warmup=True)
    resumed.load_state_dict(state)
    assert resumed.updates == 2 and resumed.current_decay() == pytest.approx(4 / 13)  # the third update's
    plain = EMA({"w": torch.zeros(1)}, decay=0.9)
    plain.update(ones)
    assert plain.shadow["w"].item() == pytest.approx(0.1) and plain.current_decay() == 0.9
    without_count = {"w": torch.zeros(1)}  # an EMA saved before the count was kept
    with pytest.raises(G2RPOError, match="train.ema.warmup needs"):
        EMA({"w": torch.zeros(1)}, decay=0.9, warmup=True).load_state_dict(without_count)
    plain.load_state_dict(without_count)
    assert plain.updates == 0


def test_world_size_that_does_not_divide_the_work_is_refused():
    from g2rpo.training.distributed import prompts_per_rank, rank_prompt_indices

    assert prompts_per_rank(8, 2) == 4
    with pytest.raises(G2RPOError, match="multiple of the world size 3"):
        prompts_per_rank(8, 3)
    # ranks take disjoint contiguous shares of the same global batch
    shares = [rank_prompt_indices(0, 5, 8, 20, r, 2) for r in range(2)]
    assert len(set(shares[0]) | set(shares[1])) == 8


def test_global_batch_depends_only_on_seed_and_iteration():
    from g2rpo.training.distributed import global_prompt_indices

    # 5 prompts, 2 per iteration: iterations 0,1 use positions 0..3 of epoch 0's permutation,
    # iteration 2 positions 4 (epoch 0) and 0 (epoch 1); each epoch is a permutation of 0..4.
    stream = [i for it in range(5) for i in global_prompt_indices(7, it, 2, 5)]
    assert sorted(stream[:5]) == list(range(5)) and sorted(stream[5:10]) == list(range(5))
    assert global_prompt_indices(7, 3, 2, 5) == global_prompt_indices(7, 3, 2, 5)


def test_training_from_the_embedding_cache_equals_start_up_encoding(tiny_model, tmp_path):
    # The cache stores the text encoders' outputs bit-exactly, so a run that reads it trains the
    # same weights as a run that encodes the prompts itself at start-up.
    from trainer_testlib import PROMPTS

    from g2rpo.data import dedupe_prompts, read_prompt_file, write_embedding_cache
    from g2rpo.models.loading import load_text_encoder

    prompts, _ = dedupe_prompts(read_prompt_file(PROMPTS))
    cache = tmp_path / "embeddings"
    write_embedding_cache(cache, prompts, load_text_encoder(tiny_model, dtype="float32"), shard_rows=3)
    weights = {}
    for name, extra in (("encoded", {}), ("cached", {"data.embeddings": str(cache), "data.prompts": ""})):
        out = tmp_path / name
        _trainer(tiny_model, out, **{"train.iterations": 2, "train.checkpoint_every": 100, **extra}).run()
        weights[name] = export_weights(out)
    assert all(torch.equal(weights["encoded"][k], weights["cached"][k]) for k in weights["encoded"])


def test_cache_with_other_prompts_than_the_prompt_file_is_refused(tiny_model, tmp_path):
    from g2rpo.data import write_embedding_cache
    from g2rpo.models.loading import load_text_encoder

    cache = tmp_path / "embeddings"
    write_embedding_cache(cache, ["a cat", "a dog"], load_text_encoder(tiny_model, dtype="float32"))
    trainer = _trainer(tiny_model, tmp_path / "run", **{"data.embeddings": str(cache)})
    with pytest.raises(G2RPOError, match="holds other prompts"):
        trainer.setup()


def test_cache_built_for_another_model_is_refused_before_training(tiny_model, tmp_path):
    # The cache holds the tiny model's 32-wide T5 embeddings; this transformer takes 64 (as a
    # cache built for FLUX.1-dev, 4096 wide, would not fit a tiny model). Without the check the
    # first forward fails with a bare matmul shape error.
    import shutil

    from diffusers import FluxTransformer2DModel
    from trainer_testlib import PROMPTS

    from g2rpo.data import dedupe_prompts, read_prompt_file, write_embedding_cache
    from g2rpo.models.loading import load_text_encoder

    wide = tmp_path / "wide-model"
    shutil.copytree(tiny_model, wide)
    config = {
        k: v for k, v in FluxTransformer2DModel.load_config(wide / "transformer").items() if not k.startswith("_")
    }
    shutil.rmtree(wide / "transformer")
    FluxTransformer2DModel(**{**config, "joint_attention_dim": 64}).save_pretrained(wide / "transformer")
    prompts, _ = dedupe_prompts(read_prompt_file(PROMPTS))
    cache = tmp_path / "embeddings"
    write_embedding_cache(cache, prompts, load_text_encoder(tiny_model, dtype="float32"))
    out = tmp_path / "run"
    trainer = _trainer(wide, out, **{"data.embeddings": str(cache)})
    with pytest.raises(G2RPOError) as info:
        trainer.setup()
    message = str(info.value)
    assert f"data.embeddings={str(cache)!r}" in message
    assert "T5 sequence width 32, the transformer takes 64" in message and "CLIP pooled" not in message
    assert "g2rpo data prep --model" in message
    assert not out.exists()  # refused before anything is written


def test_gradient_checkpointing_changes_memory_not_the_result(tiny_model, tmp_path):
    weights = {}
    for flag in (False, True):
        out = tmp_path / f"ckpt-{flag}"
        trainer = _trainer(tiny_model, out, **{"train.iterations": 1, "train.gradient_checkpointing": flag}).setup()
        assert trainer.policy.transformer.is_gradient_checkpointing is flag
        trainer.run()
        weights[flag] = export_weights(out)
    assert all(torch.allclose(weights[False][k], weights[True][k], rtol=0, atol=1e-6) for k in weights[False])
