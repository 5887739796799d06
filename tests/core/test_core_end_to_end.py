"""A few real G²RPO updates raise the reward of a small velocity model; `g2rpo demo` runs them."""

from __future__ import annotations

import json

import torch

from g2rpo.cli import main
from g2rpo.demo import LATENT_SHAPE, evaluate_ode_reward, run_toy_demo
from g2rpo.strategies._shared import make_grid
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.toy import make_toy_problem


def test_g2rpo_updates_raise_the_mean_reward(tmp_path):
    # Test settings, not the paper's: T = 8, G = 8, AdamW lr 1e-2 (paper: T = 16, G = 12, lr 2e-6 on
    # Flux). The paper's learning rate moves a 6k-parameter model too slowly to see (docs/algorithm.md §6). The
    # ratio clip stays at the reference 1e-4: with one optimiser step per iteration every term is
    # evaluated at the sampling parameters (ratio 1), so ε does not limit the update.
    result = run_toy_demo(
        iterations=15, out_root=tmp_path, lr=1e-2, num_prompts=4, seed=0, progress=False, echo=lambda *_: None
    )
    # The reward is scored on the deterministic ODE sample of one fixed noise, before and after.
    # Measured: −0.39 → −0.25 (best possible 0); asserting a gain of at least 0.05.
    assert result.reward_after > result.reward_before + 0.05
    assert result.history[-1].reward_mean_all > result.history[0].reward_mean_all


def test_seeded_training_is_reproducible(tmp_path):
    runs = [
        run_toy_demo(iterations=3, out_root=tmp_path / str(i), seed=4, progress=False, echo=lambda *_: None)
        for i in range(2)
    ]
    assert [s.as_dict() for s in runs[0].history] == [s.as_dict() for s in runs[1].history]


def test_untrained_evaluation_is_deterministic():
    model, cond, reward = make_toy_problem(num_prompts=2)
    sigmas = make_grid(AlgorithmConfig(num_steps=4), LATENT_SHAPE[0])
    assert evaluate_ode_reward(model, cond, reward, sigmas) == evaluate_ode_reward(model, cond, reward, sigmas)
    assert evaluate_ode_reward(model, cond, reward, sigmas) < 0


def test_cli_demo_runs_and_writes_metrics_and_plot(tmp_path, capsys):
    code = main(
        [
            "demo",
            "--toy",
            "--iterations",
            "2",
            "--out",
            str(tmp_path),
            "--no-progress",
            "--set",
            "g2rpo.granularities=[1,2]",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "sampling forwards" in out and "before" in out and "after" in out
    (run_dir,) = tmp_path.glob("demo-*")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    # T = 8, G = 8, M = {0..3}, Λ = {1, 2}, 4 prompts: anchor 4 + 8·Σ_k (1 + (7−k−1) + (ceil((7−k)/2) − 1))
    #   k=0: 1+6+3 = 10, k=1: 1+5+2 = 8, k=2: 1+4+2 = 7, k=3: 1+3+1 = 5 → 30; per prompt 4 + 240 = 244
    assert first["sampling_forwards"] == 4 * 244
    assert first["training_forwards"] == 4 * 4
    assert (run_dir / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert torch.isfinite(torch.tensor(first["loss"]))


def test_cli_toy_demo_runs_the_iterations_its_docs_say(tmp_path, capsys):
    # docs/core.md: `g2rpo demo --toy` is 30 iterations; the pipeline's --iterations default (40) is another mode's.
    assert main(["demo", "--toy", "--out", str(tmp_path), "--no-progress"]) == 0
    (run_dir,) = tmp_path.glob("demo-*")
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 30
    from g2rpo.cli import build_parser

    assert build_parser().parse_args(["pipeline", "run-local"]).iterations == 40


def test_cli_demo_rejects_bad_settings(tmp_path, capsys):
    assert main(["demo", "--toy", "--iterations", "1", "--out", str(tmp_path), "--set", "group_size=1"]) == 2
    assert "group_size=1" in capsys.readouterr().err
    assert main(["demo", "--toy", "--iterations", "0", "--out", str(tmp_path)]) == 2


def test_demo_never_reuses_a_run_folder(tmp_path):
    from g2rpo.demo import _new_run_dir

    first, second = _new_run_dir(tmp_path, "demo-x"), _new_run_dir(tmp_path, "demo-x")
    assert first != second and first.is_dir() and second.is_dir() and second.name == "demo-x-2"
