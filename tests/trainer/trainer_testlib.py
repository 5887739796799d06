"""Shared helpers of the trainer tests: tiny run configs, a paired reward probe, subprocess runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from g2rpo.faults import ARM_ENV, FAULT_ENV, fault_env

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "configs" / "tiny-prompts.txt"


# Test settings, far from the paper's (docs/algorithm.md §6): lr 1e-2 (paper 2e-6), ratio clip 0.2 (reference
# 1e-4), T = 4, G = 4, Λ = {1, 2}, 64×64 images, the exact JPEG-compressibility reward. The
# paper's settings move a 135k-parameter model too little to see in a few iterations.
def tiny_overrides(model_dir: Path, out_dir: Path, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "algorithm": {
            "num_steps": 4,
            "group_size": 4,
            "ratio_clip": 0.2,
            "micro_batch": 64,
            "g2rpo": {"granularities": [1, 2]},
        },
        "model": {"path": str(model_dir), "height": 64, "width": 64, "base_model_name": "tiny"},
        "data": {"prompts": str(PROMPTS)},
        "rewards": {"models": [{"name": "jpeg_compressibility"}], "batch_size": 64},
        "train": {
            "iterations": 4,
            "prompts_per_iteration": 2,
            "seed": 0,
            "learning_rate": 1e-2,
            "precision": "fp32",
            "gradient_checkpointing": False,
            "device": "cpu",
            "checkpoint_every": 2,
            "progress": False,
            "deterministic": True,
        },
        # DeepSpeed allocates whole reduction buckets (default 5e8 elements = 2 GB fp32): keep them
        # tiny for a 135k-parameter model on the CPU.
        "deepspeed": {"enabled": False, "reduce_bucket_size": 1_000_000},
        "output": {"dir": str(out_dir)},
    }
    for dotted, value in extra.items():
        node = config
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return config


def as_cli(config: dict[str, Any], prefix: str = "") -> list[str]:
    """Flatten a nested dict into key=value overrides (values as YAML flow)."""
    import yaml

    out = []
    for key, value in config.items():
        if isinstance(value, dict) and key != "extra":
            out += as_cli(value, f"{prefix}{key}.")
        else:
            out.append(
                f"{prefix}{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
            )
    return out


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO),
        TORCH_EXTENSIONS_DIR=str(REPO / ".cache" / "torch_extensions"),  # DeepSpeed's comm op is JIT-built once
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.pop(FAULT_ENV, None)
    env.pop(ARM_ENV, None)
    # The CLI decides it from its stderr; an in-process `main()` of an earlier test may have set it here.
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    return env


def run_train(
    config: dict[str, Any], *, fault: str | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -m g2rpo train`` with the config given as overrides (an empty YAML file as base);
    ``fault``: the fail point to arm; ``env``: more environment variables."""
    out = Path(config["output"]["dir"])
    out.parent.mkdir(parents=True, exist_ok=True)
    base = out.parent / f"{out.name}-base.yaml"
    base.write_text("{}\n")
    environment = {**subprocess_env(), **(env or {})}
    if fault:
        environment.update(fault_env(fault))
    return subprocess.run(
        [sys.executable, "-m", "g2rpo", "train", "--config", str(base), *as_cli(config)],
        env=environment,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def export_weights(out_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out_dir / "export" / "transformer" / "diffusion_pytorch_model.safetensors"))


@torch.no_grad()
def probe_reward(trainer: Any, seed: int = 1234) -> float:
    """Mean reward of a fixed rollout (same draws every call) of all prompts under the current policy.

    A paired probe: before and after training the noise is identical, so a difference is the
    policy's doing, not the draw's.
    """
    from g2rpo.models.flux import decode_latents
    from g2rpo.seeding import Draws

    n = len(trainer.prompt_set.prompts)
    indices = list(range(n))
    cond = trainer.prompt_set.conditioning_of(indices)
    rollout = trainer.learner.strategy.rollout(
        trainer.learner.driver.policy, cond, Draws(seed, 0, tuple(indices)), trainer.policy.latent_shape
    )
    images = decode_latents(trainer.policy.vae, rollout.final_latents, 64, 64, micro_batch=64)
    texts = [trainer.prompt_set.prompts[int(p)] for p in rollout.final_prompt]
    return float(trainer._score(images, texts).mean())
