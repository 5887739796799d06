"""benchmarks.cost_to_target on hand-made runs: the target, first-reach costs, ratios and the paired bootstrap."""

from __future__ import annotations

import math

import pytest

from benchmarks.cost_to_target import cost_to_target, first_reach, main, markdown, mean_curve


def _run(method: str, seed: int, points: list[tuple[float, float]]) -> dict:
    # an eval curve of shapes_colour against flops (and the same numbers as seconds / 10)
    return {
        "method": method,
        "rewards": "learned",
        "seed": seed,
        "evals": [{"flops": x, "quiet_seconds": x / 10, "shapes_colour": y} for x, y in points],
    }


def _result() -> dict:
    # reference "slow" ends at 0.8 (mean of 0.7 and 0.9) at cost 100; "fast" reaches 0.8 halfway between 10 and 20;
    # "never" tops out at 0.6
    runs = [
        _run("slow", 0, [(0, 0.5), (50, 0.6), (100, 0.7)]),
        _run("slow", 1, [(0, 0.5), (50, 0.8), (100, 0.9)]),
        _run("fast", 0, [(0, 0.5), (10, 0.7), (20, 0.9), (40, 0.9)]),
        _run("fast", 1, [(0, 0.5), (10, 0.7), (20, 0.9), (40, 0.9)]),
        _run("never", 0, [(0, 0.5), (100, 0.6)]),
        _run("never", 1, [(0, 0.5), (100, 0.6)]),
    ]
    return {"runs": runs, "summary": {"learned": {}}}


def test_first_reach_interpolates_and_says_never():
    curve = [(0.0, 0.5), (10.0, 0.7), (20.0, 0.9)]
    assert first_reach(curve, 0.8) == pytest.approx(15.0)
    assert first_reach(curve, 0.4) == 0.0
    assert first_reach(curve, 0.95) == math.inf
    # the mean of two seeds' curves at every reading point of either, up to the least end
    runs = [_run("a", 0, [(0, 0.0), (10, 1.0)]), _run("a", 1, [(0, 0.0), (5, 1.0), (20, 1.0)])]
    assert mean_curve(runs, "flops", "shapes_colour") == [(0, 0.0), (5, 0.75), (10, 1.0)]


def test_cost_to_target_reads_the_reference_end_as_the_target(tmp_path):
    table = cost_to_target(_result(), "learned", "slow", ["shapes_colour"], resamples=200)
    entry = table["axes"]["flops"]["shapes_colour"]
    assert entry["target"] == pytest.approx(0.8) and entry["reference_cost"] == 100
    rows = entry["methods"]
    assert rows["fast"]["cost"] == pytest.approx(15.0) and rows["fast"]["ratio"] == pytest.approx(0.15)
    assert rows["slow"]["ratio"] == pytest.approx(1.0)
    assert rows["never"]["cost"] == math.inf and rows["never"]["reached_share"] == 0.0
    # every resample of "fast" (identical seeds) reaches the target; its interval holds the point estimate
    lo, hi = rows["fast"]["ratio_ci95"]
    assert rows["fast"]["reached_share"] == 1.0 and lo <= 0.15 <= hi
    assert table["axes"]["quiet_seconds"]["shapes_colour"]["methods"]["fast"]["cost"] == pytest.approx(1.5)
    assert "never" in markdown(table, "cmd")


def test_main_writes_json_with_never_as_null(tmp_path):
    import json

    path = tmp_path / "ablation.json"
    path.write_text(json.dumps(_result()))
    assert main([str(path), "--reference", "slow", "--metrics", "shapes_colour", "--resamples", "50"]) == 0
    written = json.loads((tmp_path / "cost_to_target.json").read_text())
    assert written["axes"]["flops"]["shapes_colour"]["methods"]["never"]["cost"] is None
    assert (tmp_path / "cost_to_target.md").is_file()


def test_the_reference_can_come_from_another_file_trained_alike(tmp_path, capsys):
    import json

    def ablation(runs):
        settings = {
            "algorithm": {"num_steps": 6}, "prompts_per_iteration": 4, "heldout_prompts": ["a"], "eval_seeds": 4,
            "reward_settings": {"learned": {}},
        }  # fmt: skip
        return {"command": "x", "settings": settings, "model": {"sha256_of_weights": "abc"}, "runs": runs,
                "summary": {"learned": {}}}  # fmt: skip

    # "fast" re-run alone to 20 with dense readings; "slow", the reference, in its own long file
    short = ablation([r for r in _result()["runs"] if r["method"] == "fast"])
    long = ablation([r for r in _result()["runs"] if r["method"] == "slow"])
    (tmp_path / "short.json").write_text(json.dumps(short))
    (tmp_path / "long.json").write_text(json.dumps(long))
    argv = [str(tmp_path / "short.json"), "--metrics", "shapes_colour", "--resamples", "20", "--reference", "slow"]
    assert main([*argv, "--reference-from", str(tmp_path / "long.json")]) == 0
    written = json.loads((tmp_path / "cost_to_target.json").read_text())
    assert written["axes"]["flops"]["shapes_colour"]["methods"]["fast"]["ratio"] == pytest.approx(0.15)
    assert "The reference's runs are those of" in (tmp_path / "cost_to_target.md").read_text()
    # trained otherwise: refused, naming the field
    long["settings"]["heldout_prompts"] = ["b"]
    (tmp_path / "long.json").write_text(json.dumps(long))
    assert main([*argv, "--reference-from", str(tmp_path / "long.json")]) == 2
    assert "its held-out prompts differ" in capsys.readouterr().err
