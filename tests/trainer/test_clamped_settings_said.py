"""Strategy settings the step grid cannot honour are said, once, when they are clamped (issue 43):
``mixgrpo.window_size`` above what the grid allows and a ``dancegrpo.train_fraction`` that rounds to
0 steps were clamped (as the reference code clamps them) without a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_testlib import run_train, tiny_overrides

from g2rpo.cli import main
from g2rpo.config import load_config
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.dancegrpo import DanceGRPO
from g2rpo.strategies.mixgrpo import window_steps

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


def _algorithm(**values) -> AlgorithmConfig:
    return load_config(AlgorithmConfig, None, values)


def test_a_window_larger_than_the_grid_is_said_with_what_runs():
    config = _algorithm(strategy="mixgrpo", num_steps=6, mixgrpo={"window_size": 8})
    # T = 6: window indices stay below T − 2 = 4, so at most 4 of the 8 steps run (the window at iteration 0).
    assert window_steps(0, 6, 8) == [0, 1, 2, 3]
    (line,) = config.settings.clamped(config)
    assert line.startswith("mixgrpo.window_size=8: the grid of num_steps=6 holds at most T − 2 = 4 window step(s)")
    assert "use window_size ≤ 4" in line
    fits = _algorithm(strategy="mixgrpo", num_steps=6, mixgrpo={"window_size": 4})
    assert fits.settings.clamped(fits) == []


def test_a_train_fraction_that_rounds_to_no_step_is_said():
    config = _algorithm(strategy="dancegrpo", num_steps=16, dancegrpo={"train_fraction": 0.05})
    # int(0.05 × 15) = int(0.75) = 0, clamped to 1 step per trajectory.
    assert DanceGRPO(config).trained_per_trajectory == 1
    (line,) = config.settings.clamped(config)
    assert line == (
        "dancegrpo.train_fraction=0.05: int(0.05 × (T − 1 = 15)) = 0 steps; each trajectory trains 1 step, as "
        "DanceGRPO's code does (use train_fraction ≥ 0.0667 to say what runs)"
    )
    config = _algorithm(strategy="dancegrpo", num_steps=16, dancegrpo={"train_fraction": 0.07})  # int(1.05) = 1
    assert config.settings.clamped(config) == []


@pytest.mark.parametrize("strategy", ["flowgrpo", "diffusionnft"])
def test_the_other_train_fractions_are_said_too(strategy):
    config = _algorithm(strategy=strategy, num_steps=8, **{strategy: {"train_fraction": 0.1}})  # int(0.8) = 0
    (line,) = config.settings.clamped(config)
    assert line.startswith(f"{strategy}.train_fraction=0.1: int(0.1 × (T = 8)) = 0 ")


def test_validate_says_a_clamped_setting_and_passes(tiny_flux_dir, capsys):
    argv = ["validate", "--config", str(CONFIG), f"model.path={tiny_flux_dir}", "model.create_tiny=false"]
    argv += ["algorithm.strategy=mixgrpo", "algorithm.num_steps=6", "algorithm.mixgrpo.window_size=8"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "note: algorithm.mixgrpo.window_size=8: the grid of num_steps=6" in captured.err, captured.err
    assert captured.out.startswith("ok: ")


def test_a_run_says_it_once_and_records_it(tiny_flux_dir, tmp_path):
    out = tmp_path / "run"
    config = tiny_overrides(tiny_flux_dir, out, **{"train.iterations": 1, "train.checkpoint_every": 100})
    config["algorithm"] = {**config["algorithm"], "strategy": "dancegrpo", "dancegrpo": {"train_fraction": 0.05}}
    done = run_train(config)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "dancegrpo.train_fraction=0.05" in line]
    assert said == [said[0]] and said[0].startswith("g2rpo train: algorithm.dancegrpo.train_fraction=0.05: "), said
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    clamped = [e for e in events if e.get("event") == "clamped"]
    assert len(clamped) == 1 and clamped[0]["settings"][0].startswith("algorithm.dancegrpo.train_fraction=0.05")
