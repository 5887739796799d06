"""benchmarks/join.py: two ablations trained apart read as one, and refused when their runs are not comparable."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks import ablation
from benchmarks.join import JoinError, join, main


def _run(method: str, seed: int, per_iteration: int, end_value: float) -> dict:
    """Two eval points; FLOPs and probe seconds attached as benchmarks.ablation attaches them."""

    def point(i: int, value: float) -> dict:
        return {
            "iteration": i, "compute": i * per_iteration, "seconds": float(i), "quiet_seconds": float(i),
            "flops": i * per_iteration * 1000, "decoded_images": 0, **dict.fromkeys(ablation.METRICS, value),
        }  # fmt: skip

    last = 800 // per_iteration
    return {
        "method": method, "rewards": "multi", "seed": seed, "iterations": last, "compute": 800,
        "seconds": float(last), "quiet_seconds": float(last), "flops": 800_000, "decoded_images": 0,
        "evals": [point(0, 0.0), point(last, end_value + seed)],
    }  # fmt: skip


def _ablation(methods: dict[str, int], command: str) -> dict:
    runs = [_run(m, s, per, 0.5 if m != "late" else 0.7) for m, per in methods.items() for s in (0, 1)]
    return {
        "command": command,
        "settings": {
            "iterations": 2,
            "algorithm": {"num_steps": 6},
            "prompts_per_iteration": 4,
            "evals": 4,
            "heldout_prompts": ["a red square"],
            "eval_seeds": 4,
            "reward_settings": {"multi": {}},
            "methods": {m: {} for m in methods},
        },  # fmt: skip
        "learning_rates": {"multi": {m: {"lr": 1e-3, "objective": None} for m in methods}},
        "model": {"sha256_of_weights": "abc"},
        "probe_cost_per_iteration": {
            m: {"compute": per, "seconds": 1.0, "phases": {}, "load_average": 0.1} for m, per in methods.items()
        },
        "budget_compute": 800,
        "runs": runs,
    }


def test_two_ablations_join_into_one_summary_of_every_method(tmp_path):
    first = _ablation({"cheap": 100, "dear": 400}, "python -m benchmarks.ablation --methods cheap,dear")
    later = _ablation({"late": 200}, "python -m benchmarks.ablation --methods late")
    joined = join([first, later], ["first", "later"])
    summary = joined["summary"]["multi"]
    assert set(summary["equal_compute"]) == {"cheap", "dear", "late"}
    # at the budget every run is at its end: late 0.7 and 1.7 over its two seeds
    assert summary["equal_compute"]["late"][ablation.METRICS[0]]["mean"] == pytest.approx(1.2)
    assert joined["learning_rates"]["multi"].keys() == {"cheap", "dear", "late"}
    assert [s["methods"] for s in joined["joined_from"]] == [["cheap", "dear"], ["late"]]
    # the command writes both files; nothing is copied
    for name, data in (("a", first), ("b", later)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ablation.json").write_text(json.dumps(data))
    argv = [str(tmp_path / "a" / "ablation.json"), str(tmp_path / "b" / "ablation.json"), "--out", str(tmp_path / "c")]
    assert main(argv) == 0
    assert json.loads((tmp_path / "c" / "ablation.json").read_text())["seeds_summarised"] == [0, 1]
    assert "late" in (tmp_path / "c" / "ablation.md").read_text()


def test_runs_trained_otherwise_or_twice_are_refused(tmp_path, capsys):
    first = _ablation({"cheap": 100}, "python -m benchmarks.ablation --methods cheap --budget 800")
    other = copy.deepcopy(_ablation({"late": 200}, "x"))
    other["budget_compute"] = 1600
    with pytest.raises(JoinError, match=r"later: its compute budget differ from first's \(1600 against 800\)"):
        join([first, other], ["first", "later"])
    other = _ablation({"late": 200}, "x")
    other["model"]["sha256_of_weights"] = "def"
    with pytest.raises(JoinError, match="model weights .* rerun it with first's arguments .*--budget 800"):
        join([first, other], ["first", "later"])
    with pytest.raises(JoinError, match="method cheap is in both first and again: its seeds would count twice"):
        join([first, _ablation({"cheap": 100}, "x")], ["first", "again"])
    bare = _ablation({"late": 200}, "x")
    for run in bare["runs"]:
        del run["flops"]
    with pytest.raises(JoinError, match=r"run late seed 0 carries no \['flops'\]"):
        join([first, bare], ["first", "bare"])
    (tmp_path / "a.json").write_text(json.dumps(first))
    assert main([str(tmp_path / "a.json"), "--out", str(tmp_path / "c")]) == 2
    assert "give two or more" in capsys.readouterr().err
