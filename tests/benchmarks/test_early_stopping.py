"""benchmarks/early_stopping.py on hand-made runs: train.validation's own rule replayed, the exported reading, the
cost of the validations, and the paired comparison with a reference's final reward."""

from __future__ import annotations

import json

import pytest

from benchmarks.early_stopping import early_stopping, main, replay

TRAINED = ["hps_v21", "clip"]


def _run(method, seed, readings, validation_flops=1000, per_iteration_flops=100):
    """Readings (iteration, validation objective half per trained reward, exact score), 1 s an iteration."""
    evals = [
        {
            "iteration": i, "flops": i * per_iteration_flops, "quiet_seconds": float(i),
            "shapes_colour": exact + seed / 100, "shapes_shape": exact,
            "validation": {"hps_v21": v / 2, "clip": v / 2},
        }
        for i, v, exact in readings
    ]  # fmt: skip
    return {
        "method": method, "rewards": "learned", "seed": seed, "evals": evals,
        "validation_flops_per_pass": validation_flops, "validation_seconds_per_pass": 0.5,
    }  # fmt: skip


# peaks at iteration 20 on validation (and on the exact rewards), then drifts down
PEAKED = [(0, 0.0, 0.5), (10, 0.5, 0.7), (20, 0.8, 0.9), (30, 0.7, 0.8), (40, 0.6, 0.7), (50, 0.65, 0.6)]


def test_replay_stops_after_patience_readings_without_improvement_and_exports_the_best():
    run = _run("mix", 0, PEAKED)
    stopped = replay(run, TRAINED, patience=2)
    # best 0.8 at iteration 20; 30 and 40 do not improve: two validations without improvement -> stop at 40
    assert stopped["stopped_at"] == 40 and stopped["stopped_early"] and stopped["exported"] == 20
    assert stopped["scores"]["shapes_colour"] == pytest.approx(0.9)
    # training FLOPs at the stop plus five validation passes (0, 10, 20, 30, 40)
    assert stopped["flops"] == 40 * 100 + 5 * 1000 and stopped["validations"] == 5
    assert stopped["seconds"] == pytest.approx(40 + 5 * 0.5)
    never = replay(run, TRAINED, patience=None)
    assert never["stopped_at"] == 50 and not never["stopped_early"] and never["exported"] == 20
    # patience 3 sees 50 (0.65 < 0.8) as the third without improvement: stops at the run's last reading anyway
    assert replay(run, TRAINED, patience=3)["stopped_at"] == 50


def test_early_stopping_compares_the_exported_models_with_the_reference_end():
    runs = [_run("mix", s, PEAKED) for s in (0, 1)]
    # the reference ends at shapes_colour 0.85 (+ seed / 100 -> 0.855 mean), shape 0.85 at 10,000 FLOPs
    refs = [_run("ref", s, [(0, 0.0, 0.5), (100, 1.0, 0.85)]) for s in (0, 1)]
    table = early_stopping({"runs": runs}, {"runs": refs}, "mix", "ref", [2, None], "learned", resamples=50)
    assert table["seeds"] == [0, 1]
    assert table["targets"]["shapes_colour"]["level"] == pytest.approx(0.855)
    row = table["patience"]["2"]
    # exported at 20: colour 0.905 mean, shape 0.9 -> +0.05 over the target on both; cost 9000 of 10000 FLOPs
    assert row["shapes_colour"]["gap_to_target"] == pytest.approx(0.05)
    assert row["shapes_shape"]["gap_to_target"] == pytest.approx(0.05) and row["shapes_shape"]["reaches_share"] == 1
    assert row["shapes_colour"]["flops_ratio"] == pytest.approx(9000 / 10000)
    assert table["patience"]["never"]["shapes_colour"]["flops_ratio"] == pytest.approx((5000 + 6000) / 10000)


def test_runs_without_validation_readings_are_refused_with_the_fix(tmp_path, capsys):
    bare = _run("mix", 0, PEAKED)
    del bare["validation_flops_per_pass"]
    refs = [_run("ref", 0, [(0, 0.0, 0.5), (100, 1.0, 0.85)])]
    path = tmp_path / "ablation.json"
    path.write_text(json.dumps({"runs": [bare, *refs], "summary": {"learned": {}}}))
    assert main([str(path), "--method", "mix", "--reference", "ref", "--resamples", "10"]) == 2
    assert "--train-validation N" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(path), "--patience", "0"])


def test_a_target_file_trained_otherwise_is_refused(tmp_path, capsys):
    settings = {"algorithm": {"num_steps": 16}, "prompts_per_iteration": 8, "heldout_prompts": ["a"], "eval_seeds": 4,
                "reward_settings": {"learned": {}}}  # fmt: skip
    ours = {"command": "x", "settings": settings, "model": {"sha256_of_weights": "abc"}, "summary": {"learned": {}},
            "runs": [_run("mix", 0, PEAKED)]}  # fmt: skip
    theirs = {**ours, "settings": {**settings, "algorithm": {"num_steps": 6}},
              "runs": [_run("ref", 0, [(0, 0.0, 0.5), (100, 1.0, 0.85)])]}  # fmt: skip
    (tmp_path / "ours.json").write_text(json.dumps(ours))
    (tmp_path / "theirs.json").write_text(json.dumps(theirs))
    argv = [str(tmp_path / "ours.json"), "--method", "mix", "--reference", "ref", "--resamples", "10"]
    assert main([*argv, "--target", str(tmp_path / "theirs.json")]) == 2
    assert "its shared algorithm settings differ" in capsys.readouterr().err
    theirs["settings"] = settings  # trained alike: read
    (tmp_path / "theirs.json").write_text(json.dumps(theirs))
    assert main([*argv, "--target", str(tmp_path / "theirs.json")]) == 0
    assert (tmp_path / "early_stopping.md").is_file()
