"""Reward hacking on the shapes task, caught by validation during training: the last checkpoint breaks
the shapes gates' held-out tolerance and an earlier validated one, within it, is exported instead.

On the shipped shapes model (g2rpo/models/shapes_flux), trained on the exact shapes_colour + shapes_shape
(configs/shapes-cpu.yaml's settings otherwise; the demo itself trains on the learned pair), at lr 1.5e-3
(at 1e-3 no validation of a 60-iteration run breached) and 4 prompts per iteration, so that the hacking
shows within 36 iterations: the JPEG compressibility, never trained on, falls by more than the gates'
0.25 bits per pixel (measured here: from iteration 18 on, -3.211 at 0 to -3.736 at 36), while the
trained rewards' objective still rises. Which validations breach, and which one is best, is the
trajectory's and may differ on another CPU; the test asserts the rule on the recorded curve, and only
the last checkpoint's breach (twice the tolerance here) as an outcome.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from g2rpo.artifacts.promotion import MetricGate, decide, load_gates
from g2rpo.artifacts.scores import EvalScores, ScoreItem
from g2rpo.config import load_config
from g2rpo.models.shapes import SHIPPED_SHAPES_MODEL
from g2rpo.rewards.shapes import IN_DOMAIN, OUT_OF_DOMAIN
from g2rpo.tasks.shapes import sample_scenes
from g2rpo.training.run_config import RunConfig
from g2rpo.training.trainer import train_from_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # ~35 s on 2 CPU cores

ROOT = Path(__file__).resolve().parents[2]


TOLERANCE = {"shapes_position": 0.05, "shapes_background": 0.05, "jpeg_compressibility": 0.25}  # the shapes gates'


def _as_scores(means: dict[str, float]) -> EvalScores:
    """One item holding the validation means: the gates' paired Δ is then the difference of means."""
    return EvalScores(prompt_set="validation", seeds=[0], items=[ScoreItem(prompt_id="mean", seed=0, scores=means)])


def test_shapes_run_exports_the_validated_checkpoint_the_held_out_gates_accept(tmp_path):
    prompts = tmp_path / "shapes-prompts.txt"
    prompts.write_text("\n".join(s.prompt for s in sample_scenes(16, seed=0)) + "\n")
    # The demo's config with the exact rewards trained and the held-out tolerances on the rest.
    settings = yaml.safe_load((ROOT / "configs" / "shapes-cpu.yaml").read_text(encoding="utf-8"))
    settings["rewards"]["models"] = [{"name": m, "weight": float(m in IN_DOMAIN)} for m in (*IN_DOMAIN, *OUT_OF_DOMAIN)]
    settings["train"]["validation"]["max_regression"] = TOLERANCE
    (tmp_path / "shapes-exact.yaml").write_text(yaml.safe_dump(settings), encoding="utf-8")
    config = load_config(
        RunConfig,
        tmp_path / "shapes-exact.yaml",
        [
            f"model.path={SHIPPED_SHAPES_MODEL}",
            f"data.prompts={prompts}",
            f"output.dir={tmp_path / 'run'}",
            "train.iterations=36",
            "train.learning_rate=1.5e-3",
            "train.prompts_per_iteration=4",
            "train.progress=false",
            "train.validation.every=6",
            "train.validation.stop_after_breaches=null",
        ],
    )
    summary = train_from_config(config).validation
    curve = {point.iteration: point for point in summary.curve}
    assert list(curve) == [0, 6, 12, 18, 24, 30, 36]
    # The hacking: the last checkpoint breaches the JPEG tolerance (and only it), and some earlier
    # validation stays within every tolerance.
    assert curve[36].breached == ["jpeg_compressibility"]
    within = [i for i in curve if i and not curve[i].breached]
    assert within, [curve[i].breached for i in curve]
    # The export is the best non-breaching validation of the recorded curve (the earliest of equal objectives).
    chosen = summary.selected_iteration
    assert summary.within_tolerance and not curve[chosen].breached
    assert chosen == max(within, key=lambda i: (curve[i].objective, -i))
    # The objective alone would not be safe: a breached checkpoint scores at least as high on the trained
    # rewards as the chosen one (measured here: 1.559 at 30 and 1.513 at 36 against 1.502 at 12).
    best_objective = max((i for i in curve if i), key=lambda i: curve[i].objective)
    assert curve[best_objective].breached, {i: (curve[i].objective, curve[i].breached) for i in curve}

    # The shapes gates themselves (their held-out tolerances; this run's trained rewards in domain), with the
    # run's first validation as the champion: the last checkpoint's held-out regression gate fails, the
    # chosen one's all pass.
    shipped, _ = load_gates(ROOT / "configs" / "shapes-gates.yaml")
    assert {m: shipped.metrics[m].max_regression for m in OUT_OF_DOMAIN} == TOLERANCE
    in_domain = {m: MetricGate(direction="higher", domain="in", min_improvement=0.005) for m in IN_DOMAIN}
    gates = shipped.model_copy(update={"metrics": {**in_domain, **{m: shipped.metrics[m] for m in OUT_OF_DOMAIN}}})
    baseline = _as_scores(curve[0].means)
    held_out = {m for m, gate in gates.metrics.items() if gate.domain == "out"}

    def held_out_failures(iteration: int) -> list[str]:
        decision = decide(_as_scores(curve[iteration].means), baseline, gates)
        return [r.metric for r in decision.results if r.metric in held_out and not r.passed]

    assert held_out_failures(36) == ["jpeg_compressibility"]
    assert held_out_failures(chosen) == []
    exported = json.loads((tmp_path / "run" / "export" / "base_model.json").read_text())
    assert exported["selected_iteration"] == chosen and exported["iterations"] == 36
    breached = [i for i in curve if curve[i].breached]
    assert f"beyond it: iterations {breached}" in exported["selection_reason"]
