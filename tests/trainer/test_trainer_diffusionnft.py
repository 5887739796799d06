"""DiffusionNFT through the trainer: `g2rpo train` on the shipped shapes model, its old policy in every
checkpoint and an exact resume from it, and the published default (KL to the LoRA base) on the tiny Flux."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_testlib import export_weights, tiny_overrides

from g2rpo.cli import main
from g2rpo.config import load_config
from g2rpo.models.shapes import SHIPPED_SHAPES_MODEL
from g2rpo.tasks.shapes import sample_scenes
from g2rpo.training.run_config import RunConfig
from g2rpo.training.trainer import Trainer
from tests.tiny_flux_fixture import make_tiny_flux

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_flux(tmp_path_factory.mktemp("nft_tiny_flux"))


def test_g2rpo_train_runs_diffusionnft_on_the_shipped_shapes_model(tmp_path, capsys):
    prompts = tmp_path / "shapes-prompts.txt"
    prompts.write_text("\n".join(s.prompt for s in sample_scenes(8, seed=0)) + "\n")
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--config",
            str(ROOT / "configs" / "shapes-cpu.yaml"),
            "algorithm.strategy=diffusionnft",
            "algorithm.diffusionnft.kl_beta=0",  # the shapes model trains in full: no LoRA base as the reference
            f"model.path={SHIPPED_SHAPES_MODEL}",
            f"data.prompts={prompts}",
            f"output.dir={out}",
            "train.iterations=2",
            "train.prompts_per_iteration=2",
            "train.validation.enabled=false",
            "train.progress=false",
        ]
    )
    assert code == 0, capsys.readouterr().err[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "iteration" in r and "event" not in r]
    assert [r["iteration"] for r in records] == [0, 1]
    # shapes-cpu: T = 6, G = 6, S = int(0.99·6) = 5, P = 2: ODE 2·6·6 + old policy 2·6·5 sampling forwards,
    # 2·6·5 training forwards, one optimiser step, no importance ratio
    for record in records:
        assert record["sampling_forwards"] == 2 * 6 * 6 + 2 * 6 * 5
        assert record["training_forwards"] == record["training_backwards"] == 2 * 6 * 5
        assert record["optimizer_steps"] == 1 and record["clip_fraction"] is None
        assert record["grad_norm"] > 0
    state = torch.load(out / "checkpoints" / "iter-000002" / "strategy.pt", weights_only=True)
    assert state["iteration"] == 1  # brought up to iteration 1's rollout, the last one
    assert state["old_policy"] and all(t.dtype == torch.float32 for t in state["old_policy"].values())
    start = load_tiny_transformer_state(SHIPPED_SHAPES_MODEL)
    weights = export_weights(out)
    assert any(not torch.equal(weights[k], start[k]) for k in weights)  # the policy trained


def load_tiny_transformer_state(path: Path) -> dict[str, torch.Tensor]:
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel.from_pretrained(path, subfolder="transformer", local_files_only=True).state_dict()


def _nft(model: Path, out: Path, iterations: int, **extra) -> RunConfig:
    overrides = tiny_overrides(
        model,
        out,
        **{
            "algorithm.strategy": "diffusionnft",
            "algorithm.diffusionnft": {"kl_beta": 0.0, "old_decay_rate": 0.2},  # a fast schedule moves θ_old visibly
            "train.iterations": iterations,
            "train.checkpoint_every": 2,
            **extra,
        },
    )
    return load_config(RunConfig, None, overrides)


def test_a_resumed_run_continues_the_old_policy_and_the_weights_bit_for_bit(tiny_model, tmp_path):
    straight = Trainer(_nft(tiny_model, tmp_path / "straight", 3)).setup()
    for _ in range(3):
        straight.step()
    first = Trainer(_nft(tiny_model, tmp_path / "resumed", 2)).setup()
    for _ in range(2):
        first.step()
    assert (tmp_path / "resumed" / "checkpoints" / "iter-000002" / "strategy.pt").is_file()
    resumed = Trainer(_nft(tiny_model, tmp_path / "resumed", 3)).setup()  # train.resume=auto: from iteration 2
    assert resumed.iteration == 2 and resumed.learner.strategy.old.iteration == 1
    resumed.step()  # its rollout moves θ_old from the checkpoint's copy
    a, b = straight.learner.strategy.state_dict(), resumed.learner.strategy.state_dict()
    assert a["iteration"] == b["iteration"] == 2
    assert all(torch.equal(a["old_policy"][n], b["old_policy"][n]) for n in a["old_policy"])
    theta_a, theta_b = straight.learner.driver.trainable_state(), resumed.learner.driver.trainable_state()
    assert all(torch.equal(theta_a[n], theta_b[n]) for n in theta_a)
    # θ_old lags θ: d = min(0.2·n, 0.5) of the old copy is kept at each update
    assert any(not torch.equal(a["old_policy"][n], theta_a[n].float()) for n in theta_a)


def test_the_published_default_trains_lora_with_the_kl_to_the_base(tiny_model, tmp_path):
    config = load_config(
        RunConfig,
        None,
        tiny_overrides(
            tiny_model,
            tmp_path / "run",
            **{
                "algorithm.strategy": "diffusionnft",  # kl_beta 1e-4, the published default
                "train.iterations": 1,
                "train.lora.enabled": True,
                "train.lora.rank": 4,
                "train.lora.alpha": 4.0,
                "output.export": False,
            },
        ),
    )
    trainer = Trainer(config).setup()
    record = trainer.step()
    # T = 4, G = 4, S = 3, P = 2: ODE + old policy + reference forwards
    assert record.stats.sampling_forwards == 2 * 4 * 4 + 2 * 2 * 4 * 3
    assert record.stats.training_forwards == 2 * 4 * 3
    assert set(trainer.learner.strategy.old.tensors) == {
        n for n, p in trainer.policy.velocity.named_parameters() if p.requires_grad
    } and all("lora_" in n for n in trainer.learner.strategy.old.tensors)
