"""Builders shared by the registry tests: per-prompt scores, published exports, registered versions."""

from __future__ import annotations

import os
from pathlib import Path

from g2rpo.artifacts.promotion import Gates, MetricGate, eval_record_from_scores
from g2rpo.artifacts.publish import publish_dir, unique_prefix
from g2rpo.artifacts.registry import BaseModelRef, EvalScores, Registry, ScoreItem
from g2rpo.steps.promote import base_model_floors

PROMPTS = [f"p{i}" for i in range(8)]
SEEDS = [0, 1]


def make_scores(
    per_metric: dict[str, float],
    noise: dict[str, list[float]] | None = None,
    prompt_set: str = "test-prompts-v1",
    seeds=SEEDS,
) -> EvalScores:
    """Every (prompt, seed) gets ``per_metric[m]`` plus an optional per-item offset ``noise[m][k]``."""
    items = []
    k = 0
    for prompt in PROMPTS:
        for seed in seeds:
            scores = {}
            for metric, value in per_metric.items():
                offset = noise[metric][k] if noise and metric in noise else 0.0
                scores[metric] = value + offset
            items.append(ScoreItem(prompt_id=prompt, seed=seed, scores=scores))
            k += 1
    return EvalScores(prompt_set=prompt_set, seeds=list(seeds), items=items)


def publish_export(root: str, tmp_path: Path, name: str) -> str:
    src = tmp_path / f"export-{name}"
    (src / "transformer").mkdir(parents=True, exist_ok=True)
    (src / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(os.urandom(512))
    (src / "base_model.json").write_text('{"base": "black-forest-labs/FLUX.1-dev"}')
    uri = f"{root}/exports/{unique_prefix(name)}"
    publish_dir(src, uri, producer="test-trainer", config_hash="cfg-" + name)
    return uri


def register_version(
    registry: Registry, model: str, root: str, tmp_path: Path, scores: EvalScores, run: str = "run-1"
) -> int:
    export_uri = publish_export(root, tmp_path, run)
    scores_uri, scores_sha = registry.publish_scores(model, scores)
    record = registry.register(
        model,
        export_uri=export_uri,
        eval_record=eval_record_from_scores(scores, scores_uri, scores_sha),
        source_run=run,
        config_hash="cfg-" + run,
        base_model=BaseModelRef(name="black-forest-labs/FLUX.1-dev", licence="flux-1-dev-non-commercial-license"),
    )
    return record.version


def floor_gates(means: dict[str, float], min_improvement: float = 0.0) -> Gates:
    """Every metric of ``means`` trained (in-domain), higher is better, with the base-model floors of
    :func:`g2rpo.steps.promote.base_model_floors`: at least ``means[m] + min_improvement``."""
    gates = Gates(
        metrics={m: MetricGate(direction="higher", domain="in", min_improvement=min_improvement) for m in means}
    )
    return base_model_floors(gates, means)
