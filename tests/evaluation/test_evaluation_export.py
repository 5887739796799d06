"""A trained export evaluated from its URI in a fresh process scores what the live trainer scores.

The tiny Flux is trained a few iterations by the real Trainer (test settings far from the paper's:
lr 1e-2, T = 3, G = 4, 64×64 images, the weight-free JPEG reward), then

- the live side: ``sample_and_score`` on the trainer's own velocity, VAE, conditioning and reward;
- the export side: ``g2rpo eval`` in a subprocess on the export folder (the base model found
  through the export's base_model.json), read back with ``load_evaluation``.

Both must give the same scores to float tolerance, and differ from the untrained model's (so the
export's trained weights, not the base model's, were the ones evaluated).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from g2rpo.artifacts.manifest import write_dir_manifest
from g2rpo.config import load_config
from g2rpo.core import flux_sigmas
from g2rpo.errors import G2RPOError
from g2rpo.evaluation.artifact import load_evaluation
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.evaluation.sampling import sample_and_score
from g2rpo.steps.evaluate import evaluate
from g2rpo.training.run_config import RunConfig
from g2rpo.training.trainer import Trainer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "configs" / "tiny-prompts.txt"
SEEDS = [0, 3]
STEPS = 3
NUM_PROMPTS = 2


def _run_config(model: Path, out: Path, **train) -> RunConfig:
    return load_config(
        RunConfig,
        None,
        {
            "algorithm": {"num_steps": STEPS, "group_size": 4, "g2rpo": {"granularities": [1, 2]}, "ratio_clip": 0.2},
            "model": {"path": str(model), "height": 64, "width": 64, "base_model_name": "tiny"},
            "data": {"prompts": str(PROMPTS)},
            "rewards": {"models": [{"name": "jpeg_compressibility"}], "batch_size": 64},
            "train": {
                "iterations": 2,
                "prompts_per_iteration": 2,
                "learning_rate": 1e-2,
                "precision": "fp32",
                "gradient_checkpointing": False,
                "device": "cpu",
                "progress": False,
                **train,
            },
            "deepspeed": {"enabled": False},
            "output": {"dir": str(out)},
        },
    )


def _eval_config(**extra) -> EvaluationConfig:
    values = {
        "prompts": str(PROMPTS),
        "num_prompts": NUM_PROMPTS,
        "seeds": SEEDS,
        "num_steps": STEPS,
        "rewards": {"models": [{"name": "jpeg_compressibility"}]},
        "device": "cpu",
        **extra,
    }
    return load_config(EvaluationConfig, None, values)


def _live_scores(trainer: Trainer) -> dict[str, torch.Tensor]:
    """What the live trainer's policy scores on the evaluation set (its own conditioning table)."""
    prompts = trainer.prompt_set.prompts[:NUM_PROMPTS]
    cond = trainer.prompt_set.conditioning_of(range(NUM_PROMPTS))
    rewards = dict(zip(trainer.reward_set.names, trainer.reward_set.models))
    sigmas = flux_sigmas(STEPS, trainer.policy.latent_shape[0])
    return sample_and_score(trainer.policy.velocity, trainer.policy.vae, cond, prompts, SEEDS, rewards, sigmas).scores


@pytest.fixture(scope="module")
def trained(tiny_flux_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("export-run") / "run"
    trainer = Trainer(_run_config(tiny_flux_dir, out))
    summary = trainer.run()
    return trainer, Path(summary.export)


def test_export_evaluated_in_a_fresh_process_equals_the_live_trainer(trained, tiny_flux_dir, tmp_path):
    trainer, export = trained
    output = tmp_path / "export-eval"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    command = [sys.executable, "-m", "g2rpo", "eval", "--model", str(export), "--prompts", str(PROMPTS)]
    command += ["--output", str(output), "--seeds", ",".join(map(str, SEEDS)), "--steps", str(STEPS)]
    command += ["--metrics", "jpeg_compressibility", f"num_prompts={NUM_PROMPTS}", "device=cpu"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "jpeg_compressibility" in done.stdout

    from_export = load_evaluation(str(output))
    live = _live_scores(trainer)
    torch.testing.assert_close(from_export.scores["jpeg_compressibility"], live["jpeg_compressibility"])
    assert json.loads((output / "manifest.json").read_text())["metadata"]["base_model_uri"] == str(tiny_flux_dir)

    untrained = evaluate(str(tiny_flux_dir), _eval_config(), str(tmp_path / "base-eval"))
    assert not torch.equal(untrained.evaluation.scores["jpeg_compressibility"], live["jpeg_compressibility"])


def test_lora_export_equals_the_live_trainer(tiny_flux_dir, tmp_path):
    lora = {"enabled": True, "rank": 4, "alpha": 8.0}
    trainer = Trainer(_run_config(tiny_flux_dir, tmp_path / "run", iterations=1, lora=lora))
    export = Path(trainer.run().export)
    assert (export / "lora").is_dir() and not (export / "transformer").exists()
    result = evaluate(str(export), _eval_config(), str(tmp_path / "eval"), base_model_uri=str(tiny_flux_dir))
    assert result.manifest.metadata["policy_kind"] == "export-lora"
    torch.testing.assert_close(
        result.evaluation.scores["jpeg_compressibility"], _live_scores(trainer)["jpeg_compressibility"]
    )
    torch.testing.assert_close(
        result.evaluation.images,
        sample_and_score(
            trainer.policy.velocity,
            trainer.policy.vae,
            trainer.prompt_set.conditioning_of(range(NUM_PROMPTS)),
            trainer.prompt_set.prompts[:NUM_PROMPTS],
            SEEDS,
            dict(zip(trainer.reward_set.names, trainer.reward_set.models)),
            flux_sigmas(STEPS, trainer.policy.latent_shape[0]),
        ).images,
        atol=0.5 / 255 + 1e-5,  # the result's images are the published 8-bit PNGs
        rtol=0,
    )
    # The adapters moved the images far beyond that tolerance, so a wrong LoRA scale (alpha / rank = 2
    # here) or adapters left unloaded would fail the comparison above.
    base = evaluate(str(tiny_flux_dir), _eval_config(), str(tmp_path / "base-eval"))
    assert float((base.evaluation.images - result.evaluation.images).abs().max()) > 1e-3


def test_an_export_whose_base_model_is_not_here_needs_base_model_uri(trained, tiny_flux_dir, tmp_path):
    _, export = trained
    moved = tmp_path / "export"
    shutil.copytree(export, moved)
    info = json.loads((moved / "base_model.json").read_text())
    info["base_model_record"]["location"] = "/nowhere/tiny-flux"
    (moved / "base_model.json").write_text(json.dumps(info))
    with pytest.raises(G2RPOError, match=r"base_model\.json: size .*manifest says"):  # edited after its export
        evaluate(str(moved), _eval_config(), str(tmp_path / "eval"))
    manifest = json.loads((moved / "manifest.json").read_text())
    (moved / "manifest.json").unlink()  # sealed again, as an export made on a machine with its base elsewhere
    write_dir_manifest(moved, producer=manifest["producer"], metadata=manifest["metadata"])
    with pytest.raises(G2RPOError) as error:
        evaluate(str(moved), _eval_config(), str(tmp_path / "eval"))
    message = str(error.value)
    assert "base_model_uri=None" in message and "/nowhere/tiny-flux" in message and "--base-model" in message
    assert not (tmp_path / "eval" / "manifest.json").exists()  # nothing published (only the resumable state)
    # given explicitly, the same export evaluates
    evaluate(str(moved), _eval_config(), str(tmp_path / "eval"), base_model_uri=str(tiny_flux_dir))
