"""BranchGRPO through the trainer: `g2rpo train` on the shipped shapes model, two iterations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_testlib import export_weights

from g2rpo.cli import main
from g2rpo.models.shapes import SHIPPED_SHAPES_MODEL
from g2rpo.tasks.shapes import sample_scenes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def _train(tmp_path, capsys, *overrides: str) -> tuple[Path, list[dict]]:
    prompts = tmp_path / "shapes-prompts.txt"
    prompts.write_text("\n".join(s.prompt for s in sample_scenes(8, seed=0)) + "\n")
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--config",
            str(ROOT / "configs" / "shapes-cpu.yaml"),
            "algorithm.strategy=branchgrpo",
            f"model.path={SHIPPED_SHAPES_MODEL}",
            f"data.prompts={prompts}",
            f"output.dir={out}",
            "train.iterations=2",
            "train.prompts_per_iteration=2",
            "train.validation.enabled=false",
            "train.progress=false",
            *overrides,
        ]
    )
    assert code == 0, capsys.readouterr().err[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "iteration" in r and "event" not in r]
    assert [r["iteration"] for r in records] == [0, 1]
    return out, records


def test_g2rpo_train_runs_branchgrpo_on_the_shipped_shapes_model(tmp_path, capsys):
    out, records = _train(tmp_path, capsys)
    # shapes-cpu: T = 6, the uniform split k = r·⌊6/4⌋ = 0, 1, 2, 3, b = 2: widths 1, 2, 4, 8, 16, 16, 16.
    # One forward per node of depths 0..5: 1 + 2 + 4 + 8 + 16 + 16 = 47 per prompt, P = 2; every step
    # trains, one forward per parent node: the same 47; one optimiser step
    for record in records:
        assert record["sampling_forwards"] == record["training_forwards"] == record["training_backwards"] == 2 * 47
        assert record["optimizer_steps"] == 1 and record["grad_norm"] > 0
        assert 0.0 <= record["clip_fraction"] <= 1.0
    start = _transformer_state(SHIPPED_SHAPES_MODEL)
    weights = export_weights(out)
    assert any(not torch.equal(weights[k], start[k]) for k in weights)  # the policy trained


def test_branchgrpo_published_stepping_steps_every_12_edges_with_a_row_per_edge(tmp_path, capsys):
    out, records = _train(tmp_path, capsys, "algorithm.branchgrpo.edges_per_step=12")
    # the same tree: 2 + 4 + 8 + 16 + 16 + 16 = 62 edges per prompt, each its own training row: 124 rows, stepped
    # every 12 shuffled edges: ⌈124 / 12⌉ = 11 optimiser steps; from the second on the ratios leave 1
    for record in records:
        assert record["sampling_forwards"] == 2 * 47
        assert record["training_forwards"] == record["training_backwards"] == 2 * 62
        assert record["optimizer_steps"] == 11 and record["grad_norm"] > 0
    assert any(abs(r["ratio_mean"] - 1.0) > 1e-6 or r["ratio_max"] > 1.0 + 1e-6 for r in records)
    start = _transformer_state(SHIPPED_SHAPES_MODEL)
    weights = export_weights(out)
    assert any(not torch.equal(weights[k], start[k]) for k in weights)


def _transformer_state(path: Path) -> dict[str, torch.Tensor]:
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel.from_pretrained(path, subfolder="transformer", local_files_only=True).state_dict()
