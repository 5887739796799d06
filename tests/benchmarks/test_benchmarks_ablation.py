"""The ablation benchmark: its summary arithmetic on hand-made curves, and one real smoke run.

No timing or learning is asserted (the numbers live in benchmarks/results/ablation); the smoke run
checks that the command trains real strategies on a (briefly) pretrained shapes model, spends the
same compute budget in every run and writes the JSON, the tables and the plots.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import ablation
from g2rpo.errors import ConfigError


def _run(method: str, seed: int, evals: list[tuple[int, int, float, float]]) -> dict:
    """A run with eval points (iteration, compute, seconds, value of every metric)."""
    points = [
        {"iteration": i, "compute": c, "seconds": s, "decoded_images": 0, **dict.fromkeys(ablation.METRICS, v)}
        for i, c, s, v in evals
    ]
    last = points[-1]
    return {
        "method": method,
        "rewards": "multi",
        "seed": seed,
        "iterations": last["iteration"],
        "compute": last["compute"],
        "seconds": last["seconds"],
        "decoded_images": 10 * last["iteration"],
        "evals": points,
    }


def test_interpolate_reads_the_piecewise_linear_curve():
    points = [{"x": 0, "m": 0.0}, {"x": 10, "m": 1.0}, {"x": 30, "m": 2.0}]
    assert ablation.interpolate(points, "x", 5, "m") == pytest.approx(0.5)
    assert ablation.interpolate(points, "x", 20, "m") == pytest.approx(1.5)
    assert ablation.interpolate(points, "x", -1, "m") == 0.0  # before the first point: the first
    assert ablation.interpolate(points, "x", 99, "m") == 2.0  # after the last: the last


def test_mean_ci_is_the_student_t_interval():
    # values 1, 2, 3: mean 2, s = 1, half-width t(0.975, 2) · 1/√3 = 4.303/1.732 = 2.484
    stats = ablation.mean_ci([1.0, 2.0, 3.0])
    assert stats["mean"] == pytest.approx(2.0)
    assert stats["ci95"] == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)
    assert ablation.mean_ci([5.0]) == {"mean": 5.0, "ci95": 0.0, "n": 1}


def test_summary_reads_each_view_on_its_own_axis():
    # "cheap" spends 100 units per iteration, "dear" 400; both end at the budget 800.
    runs = [_run("cheap", s, [(0, 0, 0.0, 0.0), (2, 200, 2.0, 0.2 + s), (8, 800, 8.0, 0.8 + s)]) for s in (0, 1)] + [
        _run("dear", s, [(0, 0, 0.0, 0.0), (2, 800, 16.0, 0.4 + s)]) for s in (0, 1)
    ]
    summary = ablation.summarise(runs, equal_iteration=2)["multi"]
    metric = ablation.METRICS[0]
    assert summary["budget_compute"] == 800
    # at 2 iterations: cheap 0.2/1.2, dear 0.4/1.4 (means over the two seeds)
    assert summary["equal_iterations"]["cheap"][metric]["mean"] == pytest.approx(0.7)
    assert summary["equal_iterations"]["dear"][metric]["mean"] == pytest.approx(0.9)
    # at 800 units: cheap at its iteration 8 (0.8/1.8), dear at its iteration 2
    assert summary["equal_compute"]["cheap"][metric]["mean"] == pytest.approx(1.3)
    assert summary["equal_compute"]["dear"][metric]["mean"] == pytest.approx(0.9)
    # equal wall time = the faster method's 8 s: dear is read half-way to its 16 s point
    assert summary["wall_seconds"] == 8.0
    assert summary["equal_wall_time"]["dear"][metric]["mean"] == pytest.approx(0.45)
    assert summary["cost"]["dear"]["compute_per_iteration"]["mean"] == 400
    assert summary["cost"]["cheap"]["iterations_for_budget"]["mean"] == 8


def test_a_control_setting_is_scored_and_summarised_on_its_own_reward_too():
    # the texture control trains on shapes_texture, which is not among the metrics every run is scored on
    assert ablation.metrics_for("learned") == ablation.METRICS
    assert ablation.metrics_for("texture") == (*ablation.METRICS, "shapes_texture")
    assert ablation.metrics_for("texture_task")[-1] == "shapes_texture"
    runs = [_run("a", s, [(0, 0, 0.0, 0.0), (2, 200, 2.0, 0.5 + s)]) for s in (0, 1)]
    for run in runs:
        run["rewards"] = "texture"
        for point in run["evals"]:
            point["shapes_texture"] = -0.01 * point["iteration"]
    summary = ablation.summarise(runs, equal_iteration=2)["texture"]
    assert summary["equal_iterations"]["a"]["shapes_texture"]["mean"] == pytest.approx(-0.02)
    assert "shapes_texture" in ablation.markdown({"texture": summary}, 2)


def test_each_method_gets_the_swept_rate_with_the_best_validation_gain():
    def run(method, lr, colour, shape):
        base = dict.fromkeys(ablation.METRICS, 0.5)
        return {"method": method, "lr": lr, "evals": [base, {**base, "shapes_colour": colour, "shapes_shape": shape}]}

    # gains (mean of the two trained rewards): a@1e-4 (0.1 + 0.0)/2 = 0.05, a@3e-4 (0.2 − 0.1)/2 = 0.05
    # (a tie keeps the first), a@1e-3 (0.3 + 0.1)/2 = 0.2; b@1e-4 0.1, b@3e-4 −0.25
    sweep = [run("a", 1e-4, 0.6, 0.5), run("a", 3e-4, 0.7, 0.4), run("a", 1e-3, 0.8, 0.6)]
    sweep += [run("b", 1e-4, 0.7, 0.5), run("b", 3e-4, 0.3, 0.2)]
    chosen = ablation.choose_learning_rates(sweep, "multi")
    assert {m: c["lr"] for m, c in chosen.items()} == {"a": 1e-3, "b": 1e-4}
    assert chosen["a"]["objective"] == pytest.approx(0.2) and chosen["b"]["objective"] == pytest.approx(0.1)


def test_the_sweep_averages_its_seeds_and_says_whether_the_choice_is_interior():
    def run(lr, gain):
        base = dict.fromkeys(ablation.METRICS, 0.5)
        end = {**base, "hps_v21": 0.5 + gain, "clip": 0.5 + gain}
        return {"method": "m", "lr": lr, "evals": [base, end]}

    # seed means: 1e-4 → 0.1, 3e-4 → (0.4 + 0.0)/2 = 0.2, 1e-3 → (0.15 + 0.15)/2 = 0.15: 3e-4, interior
    sweep = [run(1e-4, 0.1), run(1e-4, 0.1), run(3e-4, 0.4), run(3e-4, 0.0), run(1e-3, 0.15), run(1e-3, 0.15)]
    chosen = ablation.choose_learning_rates(sweep, "learned")["m"]
    assert chosen["lr"] == 3e-4 and chosen["interior"] and chosen["seeds"] == 2
    assert chosen["objective"] == pytest.approx(0.2)
    assert chosen["objectives"] == {"0.0001": 0.1, "0.0003": 0.2, "0.001": 0.15}
    at_end = ablation.choose_learning_rates([run(1e-4, 0.1), run(3e-4, 0.3)], "learned")["m"]
    assert at_end["lr"] == 3e-4 and not at_end["interior"]


def test_the_sweep_reads_each_run_at_the_budget_not_past_it():
    # A run dearer per iteration than the budget's pace may go on past it (to the equal-iteration point);
    # the sweep reads the first eval point at or past the budget, as a run that stopped there would end.
    def run(lr, gain_at_budget, gain_later):
        base = {**dict.fromkeys(ablation.METRICS, 0.5), "compute": 0}
        at = {**base, "compute": 100, "hps_v21": 0.5 + gain_at_budget, "clip": 0.5 + gain_at_budget}
        later = {**base, "compute": 150, "hps_v21": 0.5 + gain_later, "clip": 0.5 + gain_later}
        return {"method": "m", "lr": lr, "evals": [base, at, later]}

    sweep = [run(1e-4, 0.2, 0.2), run(3e-4, 0.1, 0.5)]
    assert ablation.choose_learning_rates(sweep, "learned", budget=100)["m"]["lr"] == 1e-4
    assert ablation.choose_learning_rates(sweep, "learned")["m"]["lr"] == 3e-4  # no budget: the last point


def test_power_compares_the_widest_interval_with_the_best_gain():
    def row(mean, ci):
        return {m: {"mean": mean, "ci95": ci, "n": 5} for m in ablation.METRICS}

    views = {
        v: {"x": row(0.8, 0.02), "y": row(0.6, 0.05)} for v in ("equal_iterations", "equal_compute", "equal_wall_time")
    }
    summary = {"multi": {**views, "base": dict.fromkeys(ablation.METRICS, 0.5)}}
    # best gain 0.8 − 0.5 = 0.3; widest half-width 0.05 ≤ 0.3 / 3 = 0.1: powered
    power = ablation.power(summary)["multi/equal_compute/shapes_colour"]
    assert power == {"best_gain": pytest.approx(0.3), "max_ci95": 0.05, "powered": True}
    views["equal_compute"]["y"] = row(0.6, 0.11)  # 0.11 > 0.1: not
    assert ablation.power(summary)["multi/equal_compute/shapes_colour"]["powered"] is False


def test_every_method_is_a_valid_run_config(tmp_path):
    def spec(method: str, num_steps: int) -> ablation.RunSpec:
        model, prompts = str(tmp_path / "model"), str(tmp_path / "p.txt")
        algorithm = tuple({**ablation.SHARED_ALGORITHM, "num_steps": num_steps}.items())
        return ablation.RunSpec(method, "multi", 0, 1.0, 1, 1.0, 1e-4, 2, model, prompts, ("a",), (0,), "", algorithm)

    # BranchGRPO's published split points 0, 3, 6, 9 need a grid of at least 10 steps; every other arm runs at T = 6.
    needs_t16 = {"branchgrpo_published_full"}
    for method in ablation.METHODS:
        config = ablation.run_config(spec(method, 16 if method in needs_t16 else 6), tmp_path / method)
        assert config.algorithm.strategy == ablation.METHODS[method]["strategy"].removesuffix("_no_mgai")
    with pytest.raises(ConfigError, match=r"branch_steps=\[0, 3, 6, 9\].*num_steps is 6"):
        ablation.run_config(spec("branchgrpo_published_full", 6), tmp_path / "t6")


@pytest.mark.integration
def test_quick_ablation_trains_real_strategies_to_one_budget(tmp_path):
    from g2rpo.models.shapes import ShapesPretraining, pretrain_shapes

    model = pretrain_shapes(tmp_path / "shapes", ShapesPretraining(vae_steps=4, flow_steps=4))
    out = tmp_path / "results"
    assert ablation.main(["--quick", "--jobs", "1", "--model", str(model), "--out", str(out)]) == 0
    result = json.loads((out / "ablation.json").read_text())
    runs = {r["method"]: r for r in result["runs"]}
    assert sorted(runs) == ["dancegrpo", "g2rpo"]
    budget = result["budget_compute"]
    # the budget is G²RPO's one iteration; DanceGRPO, cheaper per iteration, runs more of them
    assert budget == result["probe_cost_per_iteration"]["g2rpo"]["compute"]
    assert runs["g2rpo"]["iterations"] == 1
    assert runs["dancegrpo"]["iterations"] == math.ceil(
        budget / result["probe_cost_per_iteration"]["dancegrpo"]["compute"]
    )
    for run in runs.values():
        assert run["compute"] >= budget
        assert run["evals"][0]["iteration"] == 0 and run["evals"][-1]["compute"] == run["compute"]
        assert set(ablation.METRICS) <= set(run["evals"][-1])
        # each iteration's compute is its counted forwards (a backward counts 2)
        it = run["per_iteration"][0]
        assert it["compute"] == it["sampling_forwards"] + it["training_forwards"] + 2 * it["training_backwards"]
    # the shared base model is evaluated once per run on the same prompts and seeds: same scores
    assert runs["g2rpo"]["evals"][0] == runs["dancegrpo"]["evals"][0]
    assert {
        "multi_vs_iteration.png",
        "multi_vs_compute.png",
        "multi_vs_quiet_seconds.png",
        "multi_vs_flops.png",
    } == set(result["plots"])
    # the wall-time view reads each method's seconds per iteration measured alone, per phase too
    assert result["summary"]["multi"]["wall_axis"] == "quiet_seconds"
    for method, run in runs.items():
        probe = result["probe_cost_per_iteration"][method]
        assert set(probe["phases"]) == {"sampling", "decoding", "reward", "training"}
        assert run["quiet_seconds"] == pytest.approx(run["iterations"] * probe["seconds"])
        assert probe["flops"] > 0 and run["flops"] == run["iterations"] * probe["flops"]
    assert result["summary"]["multi"]["budget_flops"] == min(r["flops"] for r in runs.values())
    assert "at equal full FLOPs" in (out / "ablation.md").read_text()
    assert "at equal compute" in (out / "ablation.md").read_text()
    # every finished run is saved on its own: a second invocation trains nothing and summarises the same runs
    saved = sorted((out / "per_run").glob("*.json"))
    assert len(saved) == 2
    stamps = [p.stat().st_mtime_ns for p in saved]
    assert ablation.main(["--quick", "--jobs", "1", "--model", str(model), "--out", str(out)]) == 0
    assert [p.stat().st_mtime_ns for p in sorted((out / "per_run").glob("*.json"))] == stamps
    again = json.loads((out / "ablation.json").read_text())
    assert again["summary"] == result["summary"] and again["runs"] == result["runs"]

    # validation during training (--train-validation): new run keys, and at every reading the trained rewards on
    # training prompts beside the held-out scores; benchmarks.early_stopping replays train.validation on them
    from benchmarks.early_stopping import replay

    argv = ["--quick", "--jobs", "1", "--model", str(model), "--out", str(out), "--train-validation", "2"]
    assert ablation.main(argv) == 0
    assert len(list((out / "per_run").glob("*.json"))) == 4  # the earlier two kept, two more
    validated = {r["method"]: r for r in json.loads((out / "ablation.json").read_text())["runs"]}
    for run in validated.values():
        trained = ablation.REWARD_SETTINGS["multi"]
        assert all(set(trained) <= set(p["validation"]) for p in run["evals"])
        assert run["validation_flops_per_pass"] > 0 and run["validation_seconds_per_pass"] > 0
        stopped = replay(run, trained, patience=None)
        assert stopped["flops"] == run["flops"] + len(run["evals"]) * run["validation_flops_per_pass"]


def test_probe_table_names_the_probes_taken_on_a_busy_machine():
    quiet = {"seconds": 2.5, "phases": {"sampling": 1.0, "training": 1.5}, "load_average": 0.4}
    busy = {"seconds": 9.0, "phases": {"sampling": 3.0, "training": 6.0}, "load_average": 7.7}
    text = ablation.probe_markdown({"mixgrpo": quiet, "dancegrpo": busy})
    assert "| mixgrpo | 2.50 | 1.00 | 1.50 | 0.40 |" in text
    assert "| dancegrpo | 9.00 | 3.00 | 6.00 | 7.70 |" in text
    assert "probes of dancegrpo started at a load average above 1.5" in text and "Delete probes.json" in text
    assert "Warning" not in ablation.probe_markdown({"mixgrpo": quiet})
    old = {"seconds": 1.0, "phases": {"sampling": 1.0}}  # taken before the load average was recorded
    assert "| g2rpo | 1.00 | 1.00 | not recorded |" in ablation.probe_markdown({"g2rpo": old})


def test_a_run_with_an_ema_is_evaluated_on_the_ema_weights_and_gets_its_own_back():
    import torch

    from g2rpo.training.drivers import EMA

    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    ema = EMA({"w": weight}, decay=0.5)
    ema.update({"w": torch.tensor([3.0, 4.0])})  # shadow = 0.5·[1, 2] + 0.5·[3, 4] = [2, 3]
    with ablation.ema_weights(ema, {"w": weight}):
        assert weight.tolist() == [2.0, 3.0]
    assert weight.tolist() == [1.0, 2.0]
    with ablation.ema_weights(None, {"w": weight}):  # no EMA: the trained weights are evaluated
        assert weight.tolist() == [1.0, 2.0]
    assert ablation.METHOD_TRAIN["diffusionnft_published"]["ema"]["enabled"] is True


def test_dense_early_readings_add_eval_points_and_leave_old_run_keys_alone():
    from dataclasses import replace

    spec = ablation.RunSpec(
        "g2rpo", "learned", 3, 689760, 45, 86220.0, 1e-3, 8, "m", "p.txt", ("a", "b"), (0, 1), "w", model_sha256="abc"
    )
    # the key this spec had before early readings existed: a rerun with --early-evals 0 reuses committed runs
    assert ablation.run_key(spec) == "g2rpo-learned-s3-lr0.001-main-684f7e77ac"
    assert ablation.early_points(spec) == []
    dense = replace(spec, early_evals=4, early_fraction=0.2)
    # 4 points over the first 20 % of 689,760 units: 34,488, 68,976, 103,464, 137,952
    assert ablation.early_points(dense) == pytest.approx([34488.0, 68976.0, 103464.0, 137952.0])
    assert ablation.run_key(dense) != ablation.run_key(spec)
