"""Builders shared by the step tests: tiny run configs, published exports, per-prompt scores."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from g2rpo.artifacts.publish import publish_dir, unique_prefix
from g2rpo.artifacts.scores import EvalScores, ScoreItem
from g2rpo.config import load_config
from g2rpo.training.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "configs" / "tiny-prompts.txt"


def tiny_run_config(model_dir: Path, out_dir: Path, **sections: dict[str, Any]) -> RunConfig:
    """configs/tiny-cpu.yaml on the tiny Flux, 2 iterations of 2 prompts, no progress bars.

    Test settings, far from the paper's (docs/algorithm.md §6): T = 4, G = 4, 64×64, the JPEG reward.
    """
    overrides: dict[str, Any] = {
        "model": {"path": str(model_dir)},
        "data": {"prompts": str(PROMPTS)},
        "train": {"iterations": 2, "prompts_per_iteration": 2, "progress": False, "checkpoint_every": 10},
        "output": {"dir": str(out_dir)},
    }
    for name, values in sections.items():
        overrides[name] = {**overrides.get(name, {}), **values}
    return load_config(RunConfig, REPO / "configs" / "tiny-cpu.yaml", overrides)


def publish_fake_export(root: str, tmp_path: Path, name: str) -> str:
    """A published artifact in an export's layout (random bytes for weights: registering reads only
    its manifest)."""
    src = tmp_path / f"export-{name}"
    (src / "transformer").mkdir(parents=True, exist_ok=True)
    (src / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(os.urandom(512))
    (src / "base_model.json").write_text('{"base": "tiny"}')
    uri = f"{root}/exports/{unique_prefix(name)}"
    publish_dir(src, uri, producer="test", config_hash="cfg-" + name)
    return uri


def make_scores(per_metric: dict[str, float], offsets: list[float] | None = None) -> EvalScores:
    """Scores of 4 prompts × 2 seeds: ``per_metric[m]`` plus the item's offset (0 by default)."""
    items = []
    for k, (prompt, seed) in enumerate((f"p{i}", s) for i in range(4) for s in (0, 1)):
        offset = offsets[k] if offsets else 0.0
        items.append(ScoreItem(prompt_id=prompt, seed=seed, scores={m: v + offset for m, v in per_metric.items()}))
    return EvalScores(prompt_set="steps-test", seeds=[0, 1], items=items)
